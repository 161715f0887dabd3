#!/usr/bin/python3
"""stokerctl against the real coordinator daemon: job create, jobs list,
job show, --json output that parses with the right fields, exit codes (2 for
an unknown job, 1 for usage errors, 3 for a wrong state, 4 when the
coordinator is unreachable), one-line errors on stderr, job scale, and
job pause|resume|stop|delete.

Usage: test_stokerctl.py COORDINATOR_BINARY STOKERCTL_BINARY
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

COORD, CTL = sys.argv[1], sys.argv[2]


def start_daemon(root):
    ready = os.path.join(root, "ready")
    proc = subprocess.Popen(
        [
            COORD,
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            os.path.join(root, "data"),
            "--ready-file",
            ready,
            "--log-level",
            "warn",
        ]
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        assert proc.poll() is None, f"coordinator exited with {proc.returncode}"
        if os.path.exists(ready):
            with open(ready) as f:
                addr = f.readline().strip()
            if addr:
                return proc, addr
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("coordinator not ready after 30 s")


class Ctl:
    def __init__(self, addr):
        self.addr = addr

    def run(self, *args, json_out=False, addr=None):
        argv = [CTL, "--coordinator", addr or self.addr, "--timeout", "5s"]
        if json_out:
            argv.append("--json")
        p = subprocess.run(argv + list(args), capture_output=True, text=True, timeout=30)
        return p.returncode, p.stdout, p.stderr

    def ok(self, *args, json_out=False):
        rc, out, err = self.run(*args, json_out=json_out)
        assert rc == 0, f"stokerctl {' '.join(args)}: exit {rc}, stderr {err!r}"
        return out

    def json(self, *args):
        out = self.ok(*args, json_out=True)
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def fails(self, code, *args, json_out=False):
        rc, _, err = self.run(*args, json_out=json_out)
        assert rc == code, f"stokerctl {' '.join(args)}: exit {rc}, want {code} (stderr {err!r})"
        lines = err.strip("\n").split("\n")
        assert len(lines) == 1 and lines[0].startswith("stokerctl: "), (
            f"stokerctl {' '.join(args)}: stderr is not one 'stokerctl: ' line: {err!r}"
        )
        return lines[0]


def test_create_list_show(c):
    out = c.ok(
        "job",
        "create",
        "demo",
        "--min",
        "1",
        "--max",
        "4",
        "--heartbeat",
        "200ms",
        "--misses",
        "5",
        "--last-call",
        "300ms",
        "--label",
        "team=nlp",
        "--dataset",
        "file:///data/corpus",
    )
    assert "demo" in out and "WAITING" in out, out
    [job] = c.json("job", "create", "other", "--min", "2", "--max", "2")
    assert job["name"] == "other" and job["state"] == "WAITING", job
    assert job["spec"]["min_ranks"] == 2 and job["spec"]["max_ranks"] == 2, job

    table = c.ok("jobs", "list")
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["NAME", "STATE"], table
    assert [line.split()[0] for line in lines[1:]] == ["demo", "other"], table

    jobs = c.json("jobs", "list")
    assert [j["name"] for j in jobs] == ["demo", "other"], jobs
    jobs = c.json("jobs", "list", "--label", "team=nlp")
    assert [j["name"] for j in jobs] == ["demo"], jobs

    [job] = c.json("job", "show", "demo")
    assert job["name"] == "demo" and job["state"] == "WAITING", job
    assert job["generation"] == 1 and job["world_size"] == 0, job
    spec = job["spec"]
    assert spec["min_ranks"] == 1 and spec["max_ranks"] == 4, spec
    assert spec["heartbeat_interval_ms"] == 200 and spec["heartbeat_misses"] == 5, spec
    assert spec["last_call_ms"] == 300, spec
    assert spec["labels"] == {"team": "nlp"}, spec
    assert spec["dataset"] == "file:///data/corpus", spec
    assert job["members"] == [], job
    text = c.ok("job", "show", "demo")
    assert "demo" in text and "team=nlp" in text, text


def test_errors(c):
    msg = c.fails(2, "job", "show", "nope")
    assert "nope" in msg, msg
    c.fails(2, "job", "show", "nope", json_out=True)
    c.fails(2, "job", "pause", "nope")
    c.fails(2, "job", "delete", "nope")
    c.fails(2, "job", "scale", "nope", "2")
    c.fails(1, "job", "create", "x1", "--min", "1")  # --max missing
    c.fails(1, "job", "create", "Bad Name", "--min", "1", "--max", "1")
    c.fails(1, "job", "frobnicate", "demo")
    c.fails(1, "jobs", "list", "--no-such-flag")
    c.fails(1, "job", "scale", "demo", "9")  # above max_ranks
    c.fails(3, "job", "create", "demo", "--min", "1", "--max", "1")  # exists
    rc, _, err = c.run()
    assert rc == 1, (rc, err)
    # Nothing above created anything.
    assert [j["name"] for j in c.json("jobs", "list")] == ["demo", "other"]


def test_lifecycle(c):
    [job] = c.json("job", "scale", "demo", "2")
    assert job["target_ranks"] == 2, job
    seq = int(job["target_seq"])  # The SCALED event's: which scale set the target.
    assert seq > 0, job
    [job] = c.json("job", "show", "demo")
    assert job["target_ranks"] == 2 and int(job["target_seq"]) == seq, job
    assert f"target 2 set by event {seq}," in c.ok("job", "show", "demo")
    [job] = c.json("job", "pause", "demo")
    assert job["state"] in ("PAUSING", "PAUSED"), job
    [job] = c.json("job", "resume", "demo")
    assert job["state"] == "WAITING", job
    c.fails(3, "job", "delete", "demo")  # not stopped
    [job] = c.json("job", "stop", "demo")
    assert job["state"] == "STOPPED", job
    c.fails(3, "job", "resume", "demo")  # terminal
    c.ok("job", "delete", "demo")
    c.fails(2, "job", "show", "demo")
    c.ok("job", "delete", "other", "--force")
    assert c.json("jobs", "list") == []


def test_unreachable(c):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    rc, _, err = c.run("jobs", "list", addr=f"127.0.0.1:{port}")
    assert rc == 4, (rc, err)
    assert err.count("\n") == 1 and err.startswith("stokerctl: "), err


def main():
    root = tempfile.mkdtemp(prefix="stoker-it-")
    proc = None
    try:
        proc, addr = start_daemon(root)
        c = Ctl(addr)
        for t in (test_create_list_show, test_errors, test_lifecycle, test_unreachable):
            t(c)
            print("ok", t.__name__)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0, f"coordinator exit status {proc.returncode}"
    finally:
        if proc and proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

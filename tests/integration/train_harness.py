"""What the stoker-train integration tests share: the three daemons on
loopback in a temporary workspace, a small text corpus, coordinator jobs,
ranks launched with their logs in the workspace, and waiting for them.

Every test takes the same arguments (COORDINATOR DATALOADER CHECKPOINT
STOKER_TRAIN STOKERCTL binaries, see meson.build) as `bins`.
"""

import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COORDINATOR, DATALOADER, CHECKPOINT, TRAIN, CTL = range(5)


def start(binary, work, name, *extra, listen="127.0.0.1:0"):
    """One daemon on an ephemeral port (or at listen), state under
    work/name; (process, address). A dataloader serves the corpus made
    under work. Started again with the same name, it keeps its state."""
    ready = os.path.join(work, name + ".addr")
    with contextlib.suppress(FileNotFoundError):
        os.remove(ready)
    if name.startswith("dataloader"):
        extra = ("--data-root", work, *extra)
    p = subprocess.Popen(
        [
            binary,
            "--listen",
            listen,
            "--data-dir",
            os.path.join(work, name),
            "--ready-file",
            ready,
            "--log-level",
            "warn",
            *extra,
        ]
    )
    for _ in range(600):
        if os.path.exists(ready) and os.path.getsize(ready) > 0:
            return p, Path(ready).read_text().strip()
        if p.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit(f"{name} did not start")


def services(bins, work, running, coordinator_extra=()):
    """The three daemons (the checkpoint service reporting to the
    coordinator), appended to running; the environment that names them."""
    p, caddr = start(bins[COORDINATOR], work, "coordinator", *coordinator_extra)
    running.append(p)
    p, daddr = start(bins[DATALOADER], work, "dataloader")
    running.append(p)
    p, kaddr = start(bins[CHECKPOINT], work, "checkpoint", "--coordinator", caddr)
    running.append(p)
    return dict(
        os.environ,
        STOKER_COORDINATOR=caddr,
        STOKER_DATALOADER=daddr,
        STOKER_CHECKPOINT=kaddr,
        OMP_NUM_THREADS="1",
    )


def corpus(work):
    """Four text files of random sentences from a small vocabulary, in
    paragraphs (the text reader's documents); the directory."""
    d = os.path.join(work, "corpus")
    os.makedirs(d)
    rnd = random.Random(7)
    words = [
        "stoker",
        "shard",
        "ring",
        "gather",
        "loss",
        "step",
        "token",
        "the",
        "a",
        "checkpoint",
        "rank",
        "model",
        "batch",
        "of",
        "and",
        "to",
        "train",
    ]
    for i in range(4):
        with open(os.path.join(d, f"part-{i}.txt"), "w") as f:
            for k in range(1500):
                f.write(" ".join(rnd.choice(words) for _ in range(12)) + ".\n")
                if k % 4 == 3:
                    f.write("\n")
    return d


def create_job(ctl, env, job, min_ranks, max_ranks, heartbeat, last_call, misses=None):
    """`stokerctl job create` with the membership settings given."""
    args = [ctl, "job", "create", job, "--min", str(min_ranks), "--max", str(max_ranks)]
    args += ["--heartbeat", heartbeat, "--last-call", last_call]
    if misses is not None:
        args += ["--misses", str(misses)]
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)


def job_json(ctl, env, job):
    out = subprocess.run(
        [ctl, "--json", "job", "show", job], env=env, check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out)


def launch(train, env, work, job, members, extra):
    """One stoker-train per member, logging to work/JOB-MEMBER.log."""
    procs = {}
    for m in members:
        # The child holds its own descriptor of the log once started.
        with open(os.path.join(work, f"{job}-{m}.log"), "w") as log:
            procs[m] = subprocess.Popen(
                [train, "--job", job, "--member", m, *extra],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    return procs


def wait_all(procs, timeout):
    end = time.time() + timeout
    for m, p in procs.items():
        rc = p.wait(timeout=max(1, end - time.time()))
        assert rc == 0, f"{m} exited {rc}"


@contextlib.contextmanager
def workspace(prefix):
    """A temporary directory and a list for the processes started in it: on
    failure the tail of every *.log there is printed; in every case the
    processes still running are killed and the directory is removed."""
    work = tempfile.mkdtemp(prefix=prefix)
    procs = []
    try:
        yield work, procs
    except BaseException:
        for f in sorted(os.listdir(work)):
            if f.endswith(".log"):
                sys.stderr.write(f"--- {f}\n" + Path(work, f).read_text()[-3000:])
        raise
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


def wait_for(what, cond, timeout):
    """cond() once it is truthy, polled every 0.1 s; fails naming what after
    timeout seconds."""
    end = time.time() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.time() < end, f"timed out waiting for {what}"
        time.sleep(0.1)

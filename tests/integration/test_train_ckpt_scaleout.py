#!/usr/bin/env python3
"""Checkpoint replicas behind one DNS name, scaled out under a running job
(issue 26, part 3: `kubectl scale statefulset/checkpoint` from 1 to 2 while
a job trains).

The ranks know one target, dns://127.0.0.1:PORT/checkpoint.stoker.test:P,
answered by the test's name server (dns_stub.py): first replica A alone
(127.0.0.2:P). Two stoker-train ranks checkpoint every 2 steps; once their
first checkpoint committed, replica B starts at 127.0.0.3:P (the same store,
--shared-storage) and the name resolves to both. The ranks' client keeps its
channel and its resolution as long as they work: B gets their Begins only
when they resolve the name again.

- With --max-connection-age 1s on both replicas, B must commit some of the
  running job's checkpoints before it ends (every replica sends its
  connections away after a second, the client reconnects and resolves again,
  round robin then spreads Begins over A and B), and the job trains to its
  end with every checkpoint listed.
- With --max-connection-age 0 (never), B commits none of them in the same
  run: the scale-out is not seen, which is what the age is for.

Usage: test_train_ckpt_scaleout.py COORDINATOR DATALOADER CHECKPOINT STOKER_TRAIN STOKERCTL
"""

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dns_stub import NameServer
from train_harness import (
    CHECKPOINT,
    corpus,
    create_job,
    launch,
    services,
    start,
    wait_all,
    workspace,
)

STEPS, EVERY = 80, 2
NAME = "checkpoint.stoker.test"
COMMITS = re.compile(r"^stoker_checkpoint_commits_total (\d+)", re.M)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def commits(port):
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = COMMITS.search(body)
    return int(m[1]) if m else 0


def replica(bins, work, env, store, name, host, port, age):
    mport = free_port()
    p, addr = start(
        bins[CHECKPOINT],
        work,
        name,
        "--storage",
        f"file://{store}",
        "--advertise-host",
        host,
        "--shared-storage",
        "--max-connection-age",
        age,
        "--metrics-listen",
        f"127.0.0.1:{mport}",
        "--coordinator",
        env["STOKER_COORDINATOR"],
        listen=f"{host}:{port}",
    )
    return p, addr, mport


def scale_out(bins, work, env, data, ns, age):
    """Job `job` through A, B added after its first commit; B's commits of it."""
    job = f"age{age}"
    store = os.path.join(work, f"store-{job}")
    os.makedirs(store)
    a, addr, a_metrics = replica(bins, work, env, store, f"{job}-a", "127.0.0.2", 0, age)
    port = addr.rsplit(":", 1)[1]
    ns.set(NAME, "127.0.0.2")
    env = dict(env, STOKER_CHECKPOINT=f"{ns.authority()}{NAME}:{port}")
    create_job(bins[4], env, job, 2, 2, "300ms", "500ms", misses=20)
    flags = ["--corpus", data, "--steps", str(STEPS), "--checkpoint-every", str(EVERY)]
    ranks = launch(bins[3], env, work, job, [f"{job}0", f"{job}1"], flags)
    end = time.time() + 120
    while commits(a_metrics) == 0:
        assert time.time() < end, "no checkpoint committed"
        assert all(p.poll() is None for p in ranks.values()), "a rank ended early"
        time.sleep(0.05)
    b, _, b_metrics = replica(bins, work, env, store, f"{job}-b", "127.0.0.3", port, age)
    ns.set(NAME, "127.0.0.2", "127.0.0.3")
    assert all(p.poll() is None for p in ranks.values()), "the ranks were done before the scale"
    wait_all(ranks, 300)
    got = commits(b_metrics), commits(a_metrics)
    listed = json.loads(
        subprocess.run(
            [bins[4], "--checkpoint", addr, "--json", "checkpoint", "list", job],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    steps = sorted(c["step"] for c in listed.get("checkpoints", listed))
    assert steps == list(range(EVERY, STEPS + 1, EVERY)), f"{job}: listed {steps}"
    for p in (a, b):
        p.terminate()
        assert p.wait(timeout=60) == 0
    return got


def main():
    bins = sys.argv[1:6]
    with workspace("stoker-train-ckpt-scaleout.") as (work, daemons):
        env = services(bins, work, daemons)  # Its checkpoint service stays unused.
        data = corpus(work)
        ns = NameServer()
        b, a = scale_out(bins, work, env, data, ns, "1s")
        assert b > 0, f"with a 1 s max connection age the new replica committed nothing ({a} on A)"
        print(
            f"max-connection-age 1s: the running job's checkpoints went to the new replica too "
            f"(B {b}, A {a} commits)"
        )
        b, a = scale_out(bins, work, env, data, ns, "0")
        assert b == 0, f"without a max connection age the new replica committed {b} (A {a})"
        print(f"max-connection-age 0: the running job never saw the new replica (A {a} commits)")
        ns.close()
    print("ok")


if __name__ == "__main__":
    main()

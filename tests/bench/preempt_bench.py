#!/usr/bin/env python3
"""The time a preempted training job needs to stage (issue 23, part 2): what
a training pod's terminationGracePeriodSeconds must cover
(deploy/k8s/README.md, "Grace period of training pods").

The example job's shape (deploy/k8s/overlays/example/train-job.yaml): 4
stoker-train ranks of the default model, heartbeat 1 s, 3 misses, with the
three daemons on loopback. Each round trains until every rank is past step
3, then gives a notice: a rank's SIGTERM (as the kubelet sends on eviction)
or an outside PreemptJob (`stokerctl job preempt`, as the queue controller
does); every rank must exit 75. The figure is the coordinator's: from the
notice to every rank staged and gone (rank 0 once its detached commit was
accepted), read from the job's PAUSED event. The baseline it is set against
is the grace the example Jobs give (60 s): grace_fraction = figure / grace.

    preempt_bench.py COORDINATOR DATALOADER CHECKPOINT STOKER_TRAIN STOKERCTL [ROUNDS]

One JSON line per round and one summary line.
"""

import json
import os
import re
import signal
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "deploy", "local"))
from test_train_preempt import events  # noqa: E402
from train_harness import (  # noqa: E402
    corpus,
    create_job,
    job_json,
    launch,
    services,
    wait_for,
    workspace,
)

GRACE_S = 60  # The example Jobs' terminationGracePeriodSeconds.
MEMBERS = ["r0", "r1", "r2", "r3"]


def training(ctl, env, job):
    ms = job_json(ctl, env, job).get("members") or []
    return len(ms) == len(MEMBERS) and all(m.get("step", 0) >= 3 for m in ms)


def one_round(bins, env, work, running, data, job, how):
    ctl = bins[4]
    create_job(ctl, env, job, len(MEMBERS), len(MEMBERS), "1s", "2s", misses=3)
    args = ["--corpus", data, "--steps", "200", "--checkpoint-every", "0"]
    procs = launch(bins[3], env, work, job, MEMBERS, args)
    running.extend(procs.values())
    wait_for("every rank training", lambda: training(ctl, env, job), 180)
    if how == "sigterm":
        procs["r1"].send_signal(signal.SIGTERM)
    else:
        subprocess.run(
            [ctl, "job", "preempt", job, "--reason", "bench"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    codes = [p.wait(timeout=120) for p in procs.values()]
    assert codes == [75] * len(MEMBERS), codes
    paused = [e for e in events(ctl, env, job) if e["type"] == "PAUSED"]
    ms = int(re.search(r"left (\d+) ms after the notice", paused[-1]["message"])[1])
    return ms


def main():
    bins = sys.argv[1:6]
    rounds = int(sys.argv[6]) if len(sys.argv) > 6 else 3
    figures = {"sigterm": [], "notice": []}
    with workspace("stoker-bench-preempt.") as (work, running):
        env = services(bins, work, running)
        data = corpus(work)
        for i in range(rounds):
            for how in ("sigterm", "notice"):
                ms = one_round(bins, env, work, running, data, f"p{i}{how[0]}", how)
                figures[how].append(ms)
                line = {"bench": "trainer", "part": "preempt", "how": how, "ranks": len(MEMBERS)}
                line.update(notice_to_staged_ms=ms, grace_fraction=round(ms / 1000 / GRACE_S, 4))
                print(json.dumps(line), flush=True)
    worst = max(max(v) for v in figures.values())
    summary = {"bench": "trainer", "part": "preempt", "ranks": len(MEMBERS), "rounds": rounds}
    summary.update(
        sigterm_max_ms=max(figures["sigterm"]),
        notice_max_ms=max(figures["notice"]),
        grace_s=GRACE_S,
        grace_fraction=round(worst / 1000 / GRACE_S, 4),
    )
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

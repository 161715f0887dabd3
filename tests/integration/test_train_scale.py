#!/usr/bin/env python3
"""Operator scale-down of a training job, with the real binaries on loopback.

Three stoker-train ranks train the tiny GPT in bf16 mixed precision with no
periodic checkpoint due during the test. The operator scales the job to two
ranks (stokerctl job scale): the coordinator answers CHECKPOINT_NOW, the
ranks agree on a step through the vote in the step's all-reduce and save a
checkpoint there, the coordinator opens a new round once it is committed,
two ranks restore it at world size 2 and go on, and the third, left without
a seat, exits 0 saying it is not needed. Nothing here waits on a guess of
how long a step takes: every wait is for an outcome, with a generous deadline
(the coordinator waits up to 1000 heartbeats for the checkpoint).

Usage: test_train_scale.py COORDINATOR DATALOADER CHECKPOINT STOKER_TRAIN STOKERCTL
"""

import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_harness import corpus, create_job, job_json, launch, services, wait_for, workspace

EVERY = 50000  # The periodic interval: never reached here.
MEMBERS = ["s0", "s1", "s2"]


def log(work, m):
    return open(os.path.join(work, f"sc-{m}.log")).read()


def all_training(ctl, env):
    j = job_json(ctl, env, "sc")
    ms = j.get("members") or []
    return j.get("world_size") == 3 and len(ms) == 3 and all(m.get("step", 0) >= 2 for m in ms)


def exited(procs):
    return [m for m, p in procs.items() if p.poll() is not None]


def scale_down(bins, env, work, data):
    ctl, train = bins[4], bins[3]
    create_job(ctl, env, "sc", 2, 3, "300ms", "1s", misses=20)
    procs = launch(
        train,
        env,
        work,
        "sc",
        MEMBERS,
        [
            "--corpus",
            data,
            "--steps",
            str(2 * EVERY),
            "--checkpoint-every",
            str(EVERY),
            "--mixed-precision",
            "bf16",
        ],
    )
    wait_for("three ranks training", lambda: all_training(ctl, env), 120)
    assert (job_json(ctl, env, "sc").get("latest_checkpoint") or {}).get("step", 0) == 0
    subprocess.run([ctl, "job", "scale", "sc", "2"], env=env, check=True, stdout=subprocess.DEVNULL)
    gone = wait_for("the surplus rank to exit", lambda: exited(procs), 240)
    assert len(gone) == 1, f"{gone} exited"
    surplus = gone[0]
    assert procs[surplus].wait() == 0, f"{surplus} exited {procs[surplus].returncode}"
    assert "not needed" in log(work, surplus), log(work, surplus)[-2000:]  # Join or heartbeat.
    return procs, surplus


def check_checkpoint(ctl, env, work, procs, surplus):
    step = (job_json(ctl, env, "sc").get("latest_checkpoint") or {}).get("step", 0)
    assert step > 0 and step % EVERY != 0, f"checkpoint at step {step}"
    for m in MEMBERS:  # Every rank, the surplus one included, saved at that step.
        assert f"checkpoint now at step {step} " in log(work, m), f"{m} did not save at {step}"
    survivors = [m for m in MEMBERS if m != surplus]
    want = f"restored step {step} at world size 2"
    wait_for("the survivors to restore", lambda: all(want in log(work, m) for m in survivors), 120)
    j = wait_for(
        "two ranks training past the checkpoint",
        lambda: (
            lambda j: (
                j
                if j.get("world_size") == 2
                and all(x.get("step", 0) > step for x in j.get("members") or [])
                else None
            )
        )(job_json(ctl, env, "sc")),
        120,
    )
    assert len(j["members"]) == 2
    print(
        f"scaled 3 -> 2: checkpoint now at step {step}, {surplus} left, "
        f"{' and '.join(survivors)} restored at world size 2"
    )
    return survivors


def stop_all(ctl, env, work, procs, survivors):
    subprocess.run([ctl, "job", "stop", "sc"], env=env, check=True, stdout=subprocess.DEVNULL)
    for m in survivors:
        rc = procs[m].wait(timeout=120)
        assert rc == 0, f"{m} exited {rc}"
        # STOP from its own heartbeat, maybe after a collective its peer's STOP broke.
        assert re.search(r"\] STOP \(generation \d+: job stopped\)", log(work, m)), m


def main():
    bins = sys.argv[1:6]
    with workspace("stoker-train-scale.") as (work, running):
        env = services(bins, work, running, ("--scale-timeout-beats", "1000"))
        data = corpus(work)
        procs, surplus = scale_down(bins, env, work, data)
        running.extend(procs.values())
        survivors = check_checkpoint(bins[4], env, work, procs, surplus)
        stop_all(bins[4], env, work, procs, survivors)
    print("ok")


if __name__ == "__main__":
    main()

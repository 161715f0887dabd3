#!/usr/bin/env python3
"""stoker-train through three checkpoint replicas behind one address, two
of them stopped mid-run (issue 26: a scale from 3 to 1, as
`kubectl scale statefulset/checkpoint --replicas=1` does).

The replicas (`--advertise-host 127.0.0.1 --shared-storage`, one store,
each its own journal) are named to the ranks by one gRPC target,
`ipv4:A,B,C` (what a headless Service's name gives: one channel, calls
spread over the addresses). Two ranks train the tiny GPT for 8 steps,
checkpointing every 2 (each staging held 400 ms by the trainer's test flag,
so the run lasts); once the first checkpoint committed, while the ranks
still train, replicas B and C get SIGTERM at once. They must exit 0 (each finishes the attempt it
owns, refusing new ones), the ranks must finish without an error (their
next Begin goes to A), every checkpoint 2..8 must be listed by A, and
training must be unchanged (parameters bit-identical to a run without
checkpoints). Then, with A alone, two fresh ranks restore each checkpoint
and train on to step 8: bit-identical again, so no committed checkpoint
was lost or damaged, whichever replica committed it.

Usage: test_train_replicas.py COORDINATOR DATALOADER CHECKPOINT STOKER_TRAIN STOKERCTL
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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

STEPS, EVERY = 8, 2


def train(bins, env, work, job, data, extra, during=None):
    """Two ranks of job to STEPS; during(procs) runs while they train.
    Returns the final parameters."""
    create_job(bins[4], env, job, 2, 2, "300ms", "500ms", misses=20)
    out = os.path.join(work, f"{job}.bin")
    procs = launch(
        bins[3],
        env,
        work,
        job,
        [f"{job}0", f"{job}1"],
        ["--corpus", data, "--steps", str(STEPS), "--dump-params", out, *extra],
    )
    if during:
        during(procs)
    wait_all(procs, 180)
    return Path(out).read_bytes()


def main():
    bins = sys.argv[1:6]
    with workspace("stoker-train-replicas.") as (work, daemons):
        env = services(bins, work, daemons)  # Its checkpoint service stays unused.
        store = os.path.join(work, "store")
        os.makedirs(store)
        reps = []
        for i in range(3):
            p, addr = start(
                bins[CHECKPOINT],
                work,
                f"replica{i}",
                "--storage",
                f"file://{store}",
                "--advertise-host",
                "127.0.0.1",
                "--shared-storage",
                "--shutdown-grace",
                "30s",
                "--coordinator",
                env["STOKER_COORDINATOR"],
            )
            daemons.append(p)
            reps.append((p, addr))
        env = dict(env, STOKER_CHECKPOINT="ipv4:" + ",".join(a for _, a in reps))
        data = corpus(work)
        plain = train(bins, env, work, "plain", data, ["--checkpoint-every", "0"])

        def scale_in(procs):
            logs = [Path(work, f"rep-rep{i}.log") for i in range(2)]
            end = time.time() + 120
            while not any(
                "checkpoint committed at step" in p.read_text() for p in logs if p.exists()
            ):
                assert time.time() < end, "no checkpoint committed"
                assert all(p.poll() is None for p in procs.values()), "a rank ended early"
                time.sleep(0.05)
            committed = sum(p.read_text().count("checkpoint committed at step") for p in logs)
            assert committed < STEPS // EVERY, "the ranks were done before the scale"
            assert all(p.poll() is None for p in procs.values()), "the ranks were done"
            t0 = time.time()
            for p, _ in reps[1:]:
                p.terminate()
            for p, addr in reps[1:]:
                rc = p.wait(timeout=60)
                assert rc == 0, f"replica {addr} exited {rc}"
            print(f"replicas 1 and 2 stopped mid-run, exit 0 after {time.time() - t0:.1f} s")

        # Staging held 2 x 200 ms a checkpoint (the trainer's test flag; training
        # unchanged): the scale lands while the ranks still train.
        flags = ["--checkpoint-every", str(EVERY), "--ckpt-stage-test", "slow:200"]
        got = train(bins, env, work, "rep", data, flags, scale_in)
        assert got == plain, "training through the replicas changed the parameters"
        one = reps[0][1]
        listed = json.loads(
            subprocess.run(
                [bins[4], "--checkpoint", one, "--json", "checkpoint", "list", "rep"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
        )
        steps = sorted(c["step"] for c in listed.get("checkpoints", listed))
        assert steps == list(range(EVERY, STEPS + 1, EVERY)), f"replica 0 lists {steps}"
        env = dict(env, STOKER_CHECKPOINT=one)
        for step in steps[:-1]:
            resumed = train(
                bins,
                env,
                work,
                f"from{step}",
                data,
                ["--data-job", "rep", "--restore-from", str(step), "--checkpoint-every", "0"],
            )
            assert resumed == plain, f"restored from step {step} on replica 0: params differ"
        print(f"checkpoints {steps} listed and restored bit-exactly by the one replica left")
    print("ok")


if __name__ == "__main__":
    main()

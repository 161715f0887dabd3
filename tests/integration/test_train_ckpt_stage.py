#!/usr/bin/env python3
"""stoker-train's background checkpoints hold exactly the state of their step.

stoker-train stages a checkpoint's shards straight from the live FSDP
shards while the next step's forward and backward run, and fences before
that step's optimizer update. Two ranks train the tiny GPT for 6 steps,
checkpointing every 2, under each interleaving the trainer's test flag
forces: `slow:200` (the staging thread waits until the next update is at
the fence, then sleeps 200 ms before its first and its middle tensor, so
that update must wait for it, whatever the speed of the machine; the log
must show it waited at least that long) and `early` (staging done before the next step starts); a
third run checkpoints never. All three must end with bit-identical
parameters (checkpointing changes nothing). Then, for each checkpointed
run and each of its checkpoints at steps 2 and 4, two fresh ranks restore
that checkpoint and train on to step 6: their parameters must equal the
uninterrupted run's bit for bit, which holds only if the checkpoint holds
the parameters and the Adam moments of exactly its step (a moment from the
next step's update would change every later step).

Usage: test_train_ckpt_stage.py COORDINATOR DATALOADER CHECKPOINT STOKER_TRAIN STOKERCTL
"""

import os
import re
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_harness import corpus, create_job, launch, services, wait_all, workspace

STEPS, EVERY = 6, 2
MODES = {
    "slow": ["--ckpt-stage-test", "slow:200"],
    "early": ["--ckpt-stage-test", "early"],
    "none": [],
}


def train(bins, env, work, job, data, extra):
    train_bin, ctl = bins[3], bins[4]
    create_job(ctl, env, job, 2, 2, "300ms", "500ms", misses=20)
    out = os.path.join(work, f"{job}.bin")
    procs = launch(
        train_bin,
        env,
        work,
        job,
        [f"{job}0", f"{job}1"],
        ["--corpus", data, "--steps", str(STEPS), "--dump-params", out, *extra],
    )
    wait_all(procs, 120)
    logs = "".join(Path(work, f"{job}-{job}{i}.log").read_text() for i in range(2))
    return Path(out).read_bytes(), logs  # Either member may be rank 0.


def main():
    bins = sys.argv[1:6]
    with workspace("stoker-train-ckpt-stage.") as (work, daemons):
        env = services(bins, work, daemons)
        data = corpus(work)
        final, logs = {}, {}
        for mode, flags in MODES.items():
            every = str(EVERY) if flags else "0"
            final[mode], logs[mode] = train(
                bins, env, work, mode, data, ["--checkpoint-every", every, *flags]
            )
            assert len(final[mode]) > 0
        assert final["slow"] == final["none"], "a slow background checkpoint changed training"
        assert final["early"] == final["none"], "a checkpoint changed training"
        waits = {
            int(s): int(us)
            for s, us in re.findall(
                r"checkpoint at step (\d+) staged; the next update waited (\d+) us", logs["slow"]
            )
        }
        assert sorted(waits) == [2, 4], f"fence waits logged: {waits}"
        assert all(us >= 200000 for us in waits.values()), f"the fence did not wait: {waits}"
        print(f"slow staging: the updates after steps 2 and 4 waited {waits} us")
        for mode in ("slow", "early"):
            for step in (2, 4):
                job = f"{mode}-from{step}"
                got, _ = train(
                    bins,
                    env,
                    work,
                    job,
                    data,
                    ["--data-job", mode, "--restore-from", str(step), "--checkpoint-every", "0"],
                )
                assert got == final["none"], f"{mode}: resumed from step {step}, params differ"
        print(
            f"restored from steps 2 and 4 and trained on: {len(final['none']) // 4} parameters"
            " bit-identical to the uninterrupted run"
        )
    print("ok")


if __name__ == "__main__":
    main()

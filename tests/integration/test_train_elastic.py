#!/usr/bin/env python3
"""Elastic end-to-end training with the real binaries on loopback.

Four stoker-train ranks train the tiny GPT and checkpoint every 10 steps;
one is killed with SIGKILL; the survivors restart at three ranks from the
last committed checkpoint and finish. Checks: the survivors restored and
finished, the loss decreased overall, Explain over every step trained shows
no data served twice or skipped, and restoring the final checkpoint at two
ranks gives bit-identical parameters (every unit gathered and compared).
The job ends FINISHED in the generation that finished (each rank leaves
finished after its last step).

Usage: test_train_elastic.py COORDINATOR DATALOADER CHECKPOINT STOKER_TRAIN STOKERCTL
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "local")
)
import summary  # The main job's Explain check and log parser.
from train_harness import corpus, create_job, job_json, launch, services, wait_all, workspace

STEPS, EVERY = 80, 10


def elastic_run(bins, env, work, data):
    train, ctl = bins[3], bins[4]
    create_job(ctl, env, "el", 2, 4, "500ms", "1s", misses=6)
    final = os.path.join(work, "final.bin")
    procs = launch(
        train,
        env,
        work,
        "el",
        [f"r{i}" for i in range(4)],
        [
            "--corpus",
            data,
            "--steps",
            str(STEPS),
            "--checkpoint-every",
            str(EVERY),
            "--dump-params",
            final,
        ],
    )
    end = time.time() + 60
    while True:
        j = job_json(ctl, env, "el")
        if (j.get("latest_checkpoint") or {}).get("step", 0) >= EVERY:
            break
        assert time.time() < end, "no checkpoint in time"
        time.sleep(0.05)
    procs["r2"].send_signal(signal.SIGKILL)
    procs["r2"].wait()
    del procs["r2"]
    wait_all(procs, 120)
    # Every survivor trained its last step and left finished: the job ended
    # in the generation that trained (the first to finish opened no round).
    j = job_json(ctl, env, "el")
    assert j["state"] == "FINISHED" and j["reason"].startswith("finished: 3 members"), j
    return final


def check_logs(work):
    text = "".join(Path(work, f"el-r{i}.log").read_text() for i in range(4))
    restored = re.findall(r"restored step (\d+) at world size 3", text)
    assert len(restored) == 3, "the three survivors did not restore at world size 3"
    # A survivor says what failed when its peer died: the collective, its
    # neighbours and the reason, never a stale message of an earlier call.
    failures = re.findall(r"generation 1 failed at step \d+: (.*)", text)
    assert failures, "no survivor reported the failure of generation 1"
    for why in failures:
        assert why.strip() and "no dataloader job" not in why and not why.endswith("()"), why
    assert any("collectives: ring" in w and "(this is rank" in w for w in failures), failures
    steps = summary.read_logs(text)
    assert sorted(steps) == list(range(1, STEPS + 1)), "not every step was logged"
    assert {v[2] for v in steps.values()} == {3, 4}
    losses = [v[0] for v in steps.values()]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"loss {first:.3f} -> {last:.3f}; restored at step {restored[0]}")
    assert last < first - 0.5, "the loss did not decrease"
    check_heldout(text, int(restored[0]))


def check_heldout(text, restored):
    """The held-out loss is logged every 10 steps and falls; at the restored
    step it is logged twice, at 4 ranks before the kill and at 3 after the
    restore: the same held-out set at any world size and the same restored
    parameters give the same loss."""
    rows = re.findall(r"eval step (\d+) loss ([0-9.]+) world (\d+)", text)
    evals = {(int(s), int(w)): float(v) for s, v, w in rows}
    by_step = {s: v for (s, _), v in sorted(evals.items(), key=lambda kv: kv[0][1])}
    assert sorted(by_step) == list(range(10, STEPS + 1, 10)), f"held-out steps: {sorted(by_step)}"
    print(f"held-out loss {by_step[10]:.3f} -> {by_step[STEPS]:.3f}")
    assert by_step[STEPS] < by_step[10] - 0.3, "the held-out loss did not fall"
    before, after = evals.get((restored, 4)), evals.get((restored, 3))
    assert before is not None and after is not None, f"no held-out loss at step {restored}: {rows}"
    assert abs(after - before) <= 1e-4 * before, f"held-out loss {before} at 4 ranks, {after} at 3"


def check_generations(ctl, env):
    """`checkpoint list` names the generation that wrote each checkpoint
    (the trainer tells the service at Begin): generation 1 before the kill,
    2 after the restore, never 0 (unknown), never going back."""
    out = subprocess.run(
        [ctl, "--json", "checkpoint", "list", "el"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = sorted((c["step"], c["generation"]) for c in json.loads(out)["checkpoints"])
    gens = [g for _, g in rows]
    assert gens and 0 not in gens, f"checkpoints without a generation: {rows}"
    assert {1, 2} <= set(gens) and gens == sorted(gens), f"generations by step: {rows}"
    print(f"checkpoint generations by step: {rows}")


def verify_at_two(bins, env, work, data):
    train, ctl = bins[3], bins[4]
    create_job(ctl, env, "verify", 2, 2, "200ms", "500ms")
    out = os.path.join(work, "two.bin")
    procs = launch(
        train,
        env,
        work,
        "verify",
        ["v0", "v1"],
        [
            "--data-job",
            "el",
            "--corpus",
            data,
            "--steps",
            str(STEPS),
            "--restore-from",
            str(STEPS),
            "--dump-params",
            out,
        ],
    )
    wait_all(procs, 60)
    a, b = Path(work, "final.bin").read_bytes(), Path(out).read_bytes()
    assert len(a) > 0 and a == b, "parameters restored at 2 ranks differ"
    print(f"restored at 2 ranks: {len(a) // 4} parameters bit-identical")


def main():
    bins = sys.argv[1:6]
    with workspace("stoker-train-elastic.") as (work, daemons):
        env = services(bins, work, daemons)
        os.environ.update(env)
        data = corpus(work)
        elastic_run(bins, env, work, data)
        check_logs(work)
        assert summary.check_no_repeats(bins[4], "el", STEPS), "data repeated or skipped"
        check_generations(bins[4], env)
        verify_at_two(bins, env, work, data)
    print("ok")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Growing and shrinking a training job at a step boundary (ScaleJob), with
the real binaries on loopback.

Two stoker-train ranks train the tiny GPT with no periodic checkpoint due.
The operator (a shrink/grow controller, later) scales the job to three ranks
and a third rank starts: the coordinator answers CHECKPOINT_NOW with
resizing, every rank saves at the same step S1 and trains no step past it,
the third rank's Join parks for the resize's round instead of opening one
without a checkpoint, and three ranks restore S1. Then the job is scaled
back to two: every rank saves at S2, two restore it, the third exits 0 (not
needed). The two finish the run.

Checks: each rank voted to stop once per resize it lived through, r1
included, which hears each CHECKPOINT_NOW 1.5 s late (--hear-late-test),
after r0's vote stopped it: what it heard must not stop the next generation
(without that, r1 votes again at the next generation's first step and the
job stops where no resize asked; tried); the job's log holds one GROWN
(world 3, step S1) and one SHRUNK (world 2, step S2) event, which
stokerctl job watch says as "grown to 3 ranks at step S1" and "shrunk to 2
ranks at step S2"; every step 1..STEPS was trained exactly once (logged
once: none lost, none trained twice), at world sizes 2, 3, 2 in that order; the loss at every
step equals, within 1e-4 relative, an uninterrupted two-rank run's; Explain
over every step shows no sample served twice or skipped; the job FINISHED.
Without the resize handshake the ranks train on past S1 and S2 and repeat
those steps after the restore (tried: the step count check fails).

Usage: test_train_resize.py COORDINATOR DATALOADER CHECKPOINT STOKER_TRAIN STOKERCTL
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "local")
)
import summary  # The main job's Explain check, log parser and loss comparison.
from train_harness import (
    corpus,
    create_job,
    job_json,
    launch,
    services,
    wait_all,
    wait_for,
    workspace,
)

STEPS = 150
MEMBERS = ["r0", "r1", "r2"]
STEP_LINE = re.compile(r"\] step (\d+) loss ")


def train_args(data):
    return ["--corpus", data, "--steps", str(STEPS), "--checkpoint-every", "0"]


def text(work, job, members):
    return "".join(Path(work, f"{job}-{m}.log").read_text() for m in members)


def scale(ctl, env, job, n):
    subprocess.run(
        [ctl, "job", "scale", job, str(n)], env=env, check=True, stdout=subprocess.DEVNULL
    )


def training_at(ctl, env, job, world, past):
    """The job runs at world ranks, each past step past."""
    j = job_json(ctl, env, job)
    ms = j.get("members") or []
    return (
        j.get("world_size") == world
        and len(ms) == world
        and all(m.get("step", 0) > past for m in ms)
        and j
    )


def saved_at(work, job, members, past):
    """The step every member saved its resize checkpoint at, after past."""
    steps = set()
    for m in members:
        found = [
            int(s)
            for s in re.findall(r"checkpoint now at step (\d+) ", text(work, job, [m]))
            if int(s) > past
        ]
        assert len(found) == 1, f"{m}: resize checkpoints after {past}: {found}"
        steps |= set(found)
    assert len(steps) == 1, f"the ranks saved at different steps: {steps}"
    return steps.pop()


def resize_run(bins, env, work, data, running):
    ctl, train = bins[4], bins[3]
    # Last call 5 s: the resize's round waits for r1, which rejoins late too.
    create_job(ctl, env, "rs", 2, 3, "300ms", "5s", misses=20)
    # r1 hears each resize's CHECKPOINT_NOW 1.5 s late, after r0's vote has
    # stopped it (on the cluster: heartbeats of 1 s against steps of 100 ms).
    procs = launch(train, env, work, "rs", MEMBERS[:1], train_args(data))
    procs.update(
        launch(
            train, env, work, "rs", MEMBERS[1:2], [*train_args(data), "--hear-late-test", "1500"]
        )
    )
    running.extend(procs.values())
    wait_for("two ranks training", lambda: training_at(ctl, env, "rs", 2, 2), 120)
    scale(ctl, env, "rs", 3)
    third = launch(train, env, work, "rs", MEMBERS[2:], train_args(data))
    running.extend(third.values())
    procs.update(third)
    wait_for("three ranks training", lambda: training_at(ctl, env, "rs", 3, 0), 120)
    s1 = saved_at(work, "rs", MEMBERS[:2], 0)
    wait_for("three ranks past the resize", lambda: training_at(ctl, env, "rs", 3, s1 + 2), 120)
    scale(ctl, env, "rs", 2)
    gone = wait_for(
        "the surplus rank to exit",
        lambda: [m for m, p in procs.items() if p.poll() is not None],
        120,
    )
    assert len(gone) == 1 and procs[gone[0]].wait() == 0, f"{gone} exited"
    assert "not needed" in text(work, "rs", gone), text(work, "rs", gone)[-2000:]
    s2 = saved_at(work, "rs", MEMBERS, s1)
    del procs[gone[0]]
    wait_all(procs, 240)
    j = job_json(ctl, env, "rs")
    assert j["state"] == "FINISHED", j
    print(f"rs: 2 -> 3 at step {s1}, 3 -> 2 at step {s2} ({gone[0]} left), finished")
    return s1, s2


def watched(ctl, env, job, *flags):
    """What stokerctl job watch printed in its first 3 s (it runs until Ctrl-C)."""
    try:
        subprocess.run([ctl, *flags, "job", "watch", job], env=env, capture_output=True, timeout=3)
    except subprocess.TimeoutExpired as e:
        return (e.stdout or b"").decode().splitlines()
    raise AssertionError("stokerctl job watch ended by itself")


def check_resize_events(ctl, env, s1, s2):
    """One GROWN at S1 to 3 ranks, then one SHRUNK at S2 to 2, in the job's log."""
    evs = [json.loads(line) for line in watched(ctl, env, "rs", "--json") if line.strip()]
    sized = [
        (e["type"], e["world_size"], e["step"]) for e in evs if e["type"] in ("GROWN", "SHRUNK")
    ]
    assert sized == [("GROWN", 3, s1), ("SHRUNK", 2, s2)], f"resize events: {sized}"
    lines = watched(ctl, env, "rs")
    for want in (f"grown to 3 ranks at step {s1}", f"shrunk to 2 ranks at step {s2}"):
        assert sum(line.endswith(want) for line in lines) == 1, f"no {want!r} in {lines}"
    print(f"rs: events GROWN to 3 at step {s1}, SHRUNK to 2 at step {s2}")


def check(bins, env, work, ref, s1, s2):
    check_resize_events(bins[4], env, s1, s2)
    all_text = text(work, "rs", MEMBERS)
    # One stop vote per resize a rank lived through: a CHECKPOINT_NOW heard
    # after the vote it asked for must not carry into the next generation
    # (a stale vote there stops the job at a step no resize asked for, and
    # it waits for a round nobody opens).
    for m, resizes in zip(MEMBERS, (2, 2, 1), strict=True):
        votes = text(work, "rs", [m]).count("then stop: no step past it")
        assert votes == resizes, f"{m}: {votes} stop votes for {resizes} resizes"
    assert all_text.count(f"restored step {s1} at world size 3") == 3, "three did not restore S1"
    assert all_text.count(f"restored step {s2} at world size 2") == 2, "two did not restore S2"
    logged = [int(s) for s in STEP_LINE.findall(all_text)]
    assert sorted(logged) == list(range(1, STEPS + 1)), (
        f"steps trained more than once or never: {sorted(logged)}"
    )
    steps = summary.read_logs(all_text)
    worlds = [steps[s][2] for s in sorted(steps)]
    assert worlds == [2] * s1 + [3] * (s2 - s1) + [2] * (STEPS - s2), "world sizes by step"
    worst = summary.compare(steps, ref, 0)
    assert worst <= summary.TOLERANCE, f"loss differs from the uninterrupted run by {worst:.2e}"
    assert summary.check_no_repeats(bins[4], "rs", STEPS), "data repeated or skipped"
    print(f"every step trained once; loss within {worst:.1e} of the uninterrupted run")


def main():
    bins = sys.argv[1:6]
    with workspace("stoker-train-resize.") as (work, running):
        env = services(bins, work, running, ("--scale-timeout-beats", "1000"))
        os.environ.update(env)  # summary.explain reads STOKER_DATALOADER.
        data = corpus(work)
        create_job(bins[4], env, "ref", 2, 2, "300ms", "1s")
        ref_procs = launch(bins[3], env, work, "ref", MEMBERS[:2], train_args(data))
        running.extend(ref_procs.values())
        wait_all(ref_procs, 240)
        ref = summary.read_logs(text(work, "ref", MEMBERS[:2]))
        s1, s2 = resize_run(bins, env, work, data, running)
        check(bins, env, work, ref, s1, s2)
    print("ok")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A submitted job shrunk in place (ScaleJobRequest.in_place, issue 23), with
the real binaries on loopback: 3 -> 2 (r2 removed), then another job
4 -> 2 (r1 and r3 removed: the ranks whose pods go need not be the last).

Three stoker-train ranks of a submitted job (its pods a queue controller's)
train the tiny GPT with no periodic checkpoint due. The queue controller
shrinks it to two as it does on the cluster: `stokerctl job scale --in-place`
(ScaleJob with in_place), then SIGTERM to the rank whose pod the Job deletes
(r2). r2's SIGTERM is no preemption notice: every rank checkpoints at one
step S (the stop vote), r2 stages its shards, leaves with S and exits 75,
and r0 and r1 never exit: they wait for the round, rejoin in their
processes and restore S at world size 2.

The same for four ranks shrunk to two with r1 and r3 removed: r0 and r2
rejoin as ranks 0 and 1. Checks, for each: the kept ranks (r0 and r1 above)
run until the last step and exit 0 (no exit 75, no
"pausing" in their logs) and each rejoined once; r2 exits 75 after staging
the checkpoint of S; the job's log holds one SHRUNK (world 2, step S, "in
place"), no PREEMPTED and no PAUSED; every step 1..STEPS was trained exactly
once, at the first world up to S and 2 after; the loss at every step equals, within
1e-4 relative, an uninterrupted two-rank run's; Explain shows no sample
served twice or skipped; the job FINISHED. Without the coordinator's shrink
in place, r2's SIGTERM pauses the whole job and r0 and r1 exit 75 (tried:
"kept ranks exited: {'r0': 75, 'r1': 75}").

Usage: test_train_shrink.py COORDINATOR DATALOADER CHECKPOINT STOKER_TRAIN STOKERCTL
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "deploy", "local")
)
import summary  # The main job's Explain check, log parser and loss comparison.
from test_train_preempt import events
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

STEPS = 100
RESUMABLE = 75
STEP_LINE = re.compile(r"\] step (\d+) loss ")


def train_args(data):
    return ["--corpus", data, "--steps", str(STEPS), "--checkpoint-every", "0"]


def text(work, job, members):
    return "".join(Path(work, f"{job}-{m}.log").read_text() for m in members)


def submit(ctl, env, job, n):
    """A submitted job of 2..n ranks: nothing starts its ranks but this test."""
    args = [ctl, "job", "submit", job, "--template", "llm", "--queue", "team-a"]
    args += ["--min", "2", "--max", str(n), "--heartbeat", "300ms", "--last-call", "5s"]
    args += ["--misses", "20"]
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)


def training_at(ctl, env, job, world, past):
    j = job_json(ctl, env, job)
    ms = j.get("members") or []
    return (
        j.get("world_size") == world
        and len(ms) == world
        and all(m.get("step", 0) > past for m in ms)
    )


def shrink_run(bins, env, work, data, running, job, members, removed):
    """Trains len(members) ranks, shrinks to 2 in place with SIGTERM to the
    removed ones; the step S they all saved at."""
    ctl, train = bins[4], bins[3]
    submit(ctl, env, job, len(members))
    procs = launch(train, env, work, job, members, train_args(data))
    running.extend(procs.values())
    wait_for(
        f"{len(members)} ranks training", lambda: training_at(ctl, env, job, len(members), 3), 120
    )
    subprocess.run(
        [ctl, "job", "scale", job, "2", "--in-place"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    for m in removed:  # The Job deletes their pods.
        procs[m].send_signal(signal.SIGTERM)
    saved = set()
    for m in removed:
        rc = procs.pop(m).wait(timeout=120)
        assert rc == RESUMABLE, f"{m} exited {rc}, not {RESUMABLE}"
        gone = text(work, job, [m])
        found = re.search(r"stopped at step (\d+) after staging its checkpoint", gone)
        assert found and "SIGTERM at step" in gone, gone[-2000:]
        saved.add(int(found[1]))
    assert len(saved) == 1, f"the removed ranks saved at different steps: {saved}"
    step = saved.pop()

    def kept_training():
        exited = {m: p.poll() for m, p in procs.items() if p.poll() is not None}
        assert not exited, f"kept ranks exited: {exited}"
        return training_at(ctl, env, job, 2, step)

    wait_for("the kept ranks training at 2", kept_training, 120)
    wait_all(procs, 240)
    j = job_json(ctl, env, job)
    assert j["state"] == "FINISHED", j
    print(f"{job}: {len(members)} -> 2 in place at step {step} ({removed} removed), finished")
    return step


def check(bins, env, work, ref, job, members, removed, step):
    ctl = bins[4]
    evs = events(ctl, env, job)
    types = [e["type"] for e in evs]
    assert "PREEMPTED" not in types and "PAUSED" not in types, f"events: {types}"
    sized = [(e["type"], e["world_size"], e["step"], e["message"]) for e in evs]
    sized = [s for s in sized if s[0] in ("SHRUNK", "GROWN")]
    n = len(members)
    want = f"shrunk from {n} to 2 ranks at step {step} (in place)"
    assert sized == [("SHRUNK", 2, step, want)], f"resize events: {sized}"
    kept = [m for m in members if m not in removed]
    for m in kept:
        t = text(work, job, [m])
        assert "pausing" not in t and f"exit {RESUMABLE}" not in t, t[-2000:]
        assert t.count("rejoining (the job is resizing)") == 1, t[-2000:]
    all_text = text(work, job, members)
    assert all_text.count(f"restored step {step} at world size 2") == 2, "two did not restore S"
    logged = [int(s) for s in STEP_LINE.findall(all_text)]
    assert sorted(logged) == list(range(1, STEPS + 1)), (
        f"steps trained more than once or never: {sorted(logged)}"
    )
    steps = summary.read_logs(all_text)
    worlds = [steps[s][2] for s in sorted(steps)]
    assert worlds == [n] * step + [2] * (STEPS - step), "world sizes by step"
    worst = summary.compare(steps, ref, 0)
    assert worst <= summary.TOLERANCE, f"loss differs from the uninterrupted run by {worst:.2e}"
    assert summary.check_no_repeats(ctl, job, STEPS), "data repeated or skipped"
    print(f"{job}: every step trained once; loss within {worst:.1e} of the uninterrupted run")


def main():
    bins = sys.argv[1:6]
    with workspace("stoker-train-shrink.") as (work, running):
        env = services(bins, work, running, ("--scale-timeout-beats", "1000"))
        os.environ.update(env)  # summary.explain reads STOKER_DATALOADER.
        data = corpus(work)
        create_job(bins[4], env, "ref", 2, 2, "300ms", "1s")
        ref_procs = launch(bins[3], env, work, "ref", ["r0", "r1"], train_args(data))
        running.extend(ref_procs.values())
        wait_all(ref_procs, 240)
        ref = summary.read_logs(text(work, "ref", ["r0", "r1"]))
        # 3 -> 2, the last rank removed; 4 -> 2, ranks 1 and 3 removed (an
        # Indexed Job deletes its highest indexes, which need not be the
        # last ranks): the round seats the kept ones, in their order.
        for job, members, removed in (
            ("sh", ["r0", "r1", "r2"], ["r2"]),
            ("sh4", ["r0", "r1", "r2", "r3"], ["r1", "r3"]),
        ):
            step = shrink_run(bins, env, work, data, running, job, members, removed)
            check(bins, env, work, ref, job, members, removed, step)
    print("ok")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Lossless eviction of a training job, with the real binaries on loopback.

Two stoker-train ranks train the tiny GPT with no periodic checkpoint due.
A preemption notice reaches the job mid-run, in one of two ways:

- sigterm: one rank gets SIGTERM (as a pod Kueue evicts does); at its next
  step boundary it tells the coordinator (a heartbeat with terminating) and
  votes to stop in the step's all-reduce;
- notice: an outside party calls PreemptJob (`stokerctl job preempt`, as a
  queue controller would), twice: the second changes nothing;
- pause: an operator's `stokerctl job pause`, whose stop is resumable too
  (exit 75), but whose job waits for `stokerctl job resume` (a rank parked
  in Join meanwhile exits 75 at once on SIGTERM, and is started again).

Either way every rank checkpoints at the same step S and trains no step past
it, stages its shards and exits 75 (resumable, never 0: a Kubernetes Job
would count 0 as a completed index); the checkpoint commits, the job is
PAUSED with the reason, and its events hold one PREEMPTED. Started again
(no ResumeJob), the ranks resume by themselves at exactly step S (RESUMED
at S), train to the end and exit 0, the job FINISHED. No step is lost (the
first run's last step is S), Explain over every step shows no sample served
twice or skipped, and the loss at every step after S equals, within 1e-4
relative, the loss of an uninterrupted run of the same job.

A baseline's trainer (--on-sigterm exit, as one that saves nothing on
SIGTERM): the rank given SIGTERM exits 143 at once, saving nothing and
telling the coordinator nothing (no checkpoint, no PREEMPTED).

The same notice while a periodic checkpoint is on its way and the ranks'
heartbeats lag their steps (see CROSSING): the checkpoint committed during
the pause is not taken for the ranks' own, and a STOP that crossed steps
makes them checkpoint, then stop; either way every step is trained once.

Usage: test_train_preempt.py COORDINATOR DATALOADER CHECKPOINT STOKER_TRAIN STOKERCTL
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
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

STEPS = 60
RESUMABLE = 75
MEMBERS = ["r0", "r1"]
RUNNING = []  # The workspace's process list: ranks left running are killed at the end.


def train_args(data):
    return ["--corpus", data, "--steps", str(STEPS), "--checkpoint-every", "0"]


def run_log(work, job, m):
    return Path(work, f"{job}-{m}.log").read_text()


def steps_logged(work, job):
    """(loss, tokens/s, world) per step, as rank 0 logged them (whichever
    member rank 0 was)."""
    return summary.read_logs("".join(run_log(work, job, m) for m in MEMBERS))


def events(ctl, env, job):
    """The job's stored events (stokerctl job watch, interrupted once the
    ones stored are out: the last of them is the job's last_event_seq)."""
    last = job_json(ctl, env, job)["last_event_seq"]
    p = subprocess.Popen(
        [ctl, "--json", "job", "watch", job], env=env, stdout=subprocess.PIPE, text=True
    )
    out = []
    for line in p.stdout:
        out.append(json.loads(line))
        if out[-1]["seq"] >= last:
            break
    p.send_signal(signal.SIGINT)
    p.wait(timeout=10)
    return out


def reference(bins, env, work, data):
    """An uninterrupted run of the same job: its loss per step."""
    create_job(bins[4], env, "ref", 2, 2, "300ms", "1s")
    wait_all(launch(bins[3], env, work, "ref", MEMBERS, train_args(data)), 240)
    return steps_logged(work, "ref")


def preempt(bins, env, work, data, job, how, extra=(), heartbeat="300ms", after_beat=False):
    """Trains until both ranks are past step 3, gives the notice (with
    after_beat: just after both ranks' heartbeats, so that their next is a
    whole interval away), and waits for both ranks to exit 75; returns the
    checkpoint step S."""
    ctl, train = bins[4], bins[3]
    create_job(ctl, env, job, 2, 2, heartbeat, "1s", misses=20)
    procs = launch(train, env, work, job, MEMBERS, [*train_args(data), *extra])
    RUNNING.extend(procs.values())
    wait_for(
        "both ranks training",
        lambda: (lambda ms: len(ms) == 2 and all(m.get("step", 0) >= 3 for m in ms))(
            job_json(ctl, env, job).get("members") or []
        ),
        120,
    )
    if after_beat:
        wait_for(
            "both ranks' heartbeats just in",
            lambda: (lambda ms: len(ms) == 2 and all(fresh(m) for m in ms))(
                job_json(ctl, env, job).get("members") or []
            ),
            60,
        )
    if how == "sigterm":
        procs["r1"].send_signal(signal.SIGTERM)
    elif how == "pause":
        subprocess.run([ctl, "job", "pause", job], env=env, check=True, stdout=subprocess.DEVNULL)
    else:
        for _ in range(2):  # The second notice changes nothing.
            subprocess.run(
                [ctl, "job", "preempt", job, "--reason", "kueue: evicted by a job of priority 100"],
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
    for m, p in procs.items():
        rc = p.wait(timeout=120)
        assert rc == RESUMABLE, f"{job} {m} exited {rc}, not {RESUMABLE}"
    logs = {m: run_log(work, job, m) for m in MEMBERS}
    saved = {m: re.findall(r"checkpoint now at step (\d+) .*then stop", t) for m, t in logs.items()}
    assert all(len(v) == 1 for v in saved.values()), saved
    step = int(saved["r0"][0])
    assert saved["r1"] == [str(step)], f"the ranks saved at different steps: {saved}"
    for text in logs.values():
        assert f"stopped at step {step} after staging its checkpoint" in text, text[-2000:]
    # Rank 0 (whichever member it is) did not wait for the upload and the
    # manifest: its commit of the last checkpoint was detached (accepted once
    # decided); the service committed it after the ranks were gone (below).
    both = "".join(logs.values())
    assert f"checkpoint commit accepted at step {step} (detached" in both, both[-3000:]
    assert f"checkpoint committed at step {step}" not in both, both[-3000:]
    trained = steps_logged(work, job)
    assert sorted(trained) == list(range(1, step + 1)), f"trained {sorted(trained)}, saved {step}"
    if how == "sigterm":
        assert "SIGTERM at step" in logs["r1"], logs["r1"][-2000:]
        took = re.search(r"exit 75, (\d+) ms after SIGTERM", logs["r1"])
        assert took, logs["r1"][-2000:]
        print(f"{job}: the SIGTERM'd rank had staged its checkpoint {took[1]} ms after the signal")
    j = wait_for(
        "the checkpoint to commit and the job to pause",
        lambda: (
            lambda j: (
                j
                if j["state"] == "PAUSED" and (j.get("latest_checkpoint") or {}).get("step") == step
                else None
            )
        )(job_json(ctl, env, job)),
        60,
    )
    preempted = [e for e in events(ctl, env, job) if e["type"] == "PREEMPTED"]
    if how == "pause":
        assert j["reason"] == "paused" and not preempted, (j["reason"], preempted)
    else:
        want = "member r1 is terminating" if how == "sigterm" else "kueue: evicted"
        assert j["reason"].startswith("preempted (") and want in j["reason"], j["reason"]
        assert len(preempted) == 1 and want in preempted[0]["message"], preempted
        # The coordinator measured notice -> every rank staged and gone: the
        # figure terminationGracePeriodSeconds is set from (deploy/k8s).
        paused = [e for e in events(ctl, env, job) if e["type"] == "PAUSED"]
        staged = re.search(
            r"staged its checkpoint and left (\d+) ms after the notice", paused[-1]["message"]
        )
        assert staged, paused
        print(
            json.dumps(
                {
                    "bench": "preempt_stage",
                    "how": how,
                    "ranks": len(MEMBERS),
                    "notice_to_staged_ms": int(staged[1]),
                }
            )
        )
    print(
        f"{job}: {how} -> both ranks saved at step {step} and exited {RESUMABLE}; "
        f"PAUSED: {j['reason']}"
    )
    return step


# The windows of a pause's STOP (issue 23): periodic checkpoints every 2
# steps, each staged slowly (--ckpt-stage-test slow:600, so one is always on
# its way when the notice comes and commits during the pause), and
# heartbeats that carry the step 3 steps behind the one trained
# (--heartbeat-test: a heartbeat whose reply comes back 3 steps late). That
# checkpoint C is past every step reported at the notice, and the ranks'
# heartbeats say C or less while they train C + 1 and C + 2.
# - lag: the ranks' agreed stop step is held back as well, so the
#   coordinator takes C as the pause's checkpoint and answers STOP, naming
#   C, to ranks past it: each votes to stop, all checkpoint at one step S and
#   leave with S (their seats kept until then). Heartbeats every 3 s and the
#   notice just after one: the first answer to the notice is that STOP (a
#   checkpoint committed meanwhile), not CHECKPOINT_NOW.
# - stale: the stop step goes at once; C, below it, is not the pause's.
# Before 2026-11-29 both lost steps: C was the pause's, the STOP ended the
# ranks' seats (the generation) while they staged S, or stopped a rank at
# once past C, and the job resumed from C, training C + 1.. S twice.
CROSSING = ["--checkpoint-every", "2", "--ckpt-stage-test", "slow:600"]


def fresh(member):
    """The member's last heartbeat came in the last 300 ms."""
    return time.time() * 1000 - int(member.get("last_heartbeat_ms", 0)) < 300


def crossed(ctl, env, work, job, hb, step):
    """The window was there: a checkpoint below the ranks' stop step
    committed after the notice; under lag the coordinator took it for the
    pause's and its STOP found a rank past it, which checkpointed first."""
    evs = events(ctl, env, job)
    notice = next(e["seq"] for e in evs if e["type"] == "PREEMPTED")
    during = [int(e.get("step", 0)) for e in evs if e["type"] == "CHECKPOINT" and e["seq"] > notice]
    assert any(c < step for c in during), (
        f"{job}: no checkpoint below {step} in the pause: {during}"
    )
    logs = "".join(run_log(work, job, m) for m in MEMBERS)
    crossing = re.findall(r"STOP at step (\d+), past the pause's checkpoint of step (\d+)", logs)
    if hb.startswith("lag:"):
        assert crossing, f"{job}: no STOP crossed a step: {logs[-3000:]}"
    print(f"{job}: {hb}: checkpoints {during} committed in the pause; STOP crossings {crossing}")


def sigterm_exit(bins, env, work, data):
    """--on-sigterm exit: the rank given SIGTERM exits 143 within a second or
    two, logs no notice and saves nothing; the job is not paused."""
    ctl, train = bins[4], bins[3]
    job = "pd"
    create_job(ctl, env, job, 2, 2, "300ms", "1s", misses=20)
    procs = launch(train, env, work, job, MEMBERS, [*train_args(data), "--on-sigterm", "exit"])
    RUNNING.extend(procs.values())
    wait_for(
        "both ranks training",
        lambda: (lambda ms: len(ms) == 2 and all(m.get("step", 0) >= 3 for m in ms))(
            job_json(ctl, env, job).get("members") or []
        ),
        120,
    )
    t0 = time.monotonic()
    procs["r1"].send_signal(signal.SIGTERM)
    rc = procs["r1"].wait(timeout=30)
    took = time.monotonic() - t0
    assert rc == 143, f"--on-sigterm exit: the rank exited {rc}, not 143"
    assert took < 5, f"--on-sigterm exit: the rank took {took:.1f} s to exit"
    procs["r0"].kill()
    procs["r0"].wait(timeout=30)
    log = run_log(work, job, "r1")
    assert "SIGTERM at step" not in log and "checkpoint now" not in log, log[-2000:]
    j = job_json(ctl, env, job)
    assert j["state"] != "PAUSED" and not (j.get("latest_checkpoint") or {}).get("step"), j
    assert not [e for e in events(ctl, env, job) if e["type"] == "PREEMPTED"]
    print(f"{job}: --on-sigterm exit -> exit 143 {took:.2f} s after SIGTERM, nothing saved")


def resume(bins, env, work, data, job, step, ref, how):
    """The ranks come back: the job resumes at step (after a preemption by
    itself, after an operator's pause on `job resume`), trains to the end."""
    ctl, train = bins[4], bins[3]
    first = "".join(run_log(work, job, m) for m in MEMBERS)
    procs = launch(train, env, work, job, MEMBERS, train_args(data))
    RUNNING.extend(procs.values())
    if how == "pause":
        time.sleep(3)  # Joined and parked: a paused job waits for its operator.
        assert job_json(ctl, env, job)["state"] == "PAUSED"
        assert "restored" not in "".join(run_log(work, job, m) for m in MEMBERS)
        # A rank parked in Join has nothing to save: SIGTERM exits 75 at once.
        procs["r1"].send_signal(signal.SIGTERM)
        assert procs["r1"].wait(timeout=30) == RESUMABLE, "a parked rank's SIGTERM"
        procs.update(launch(train, env, work, job, ["r1"], train_args(data)))
        RUNNING.append(procs["r1"])
        subprocess.run([ctl, "job", "resume", job], env=env, check=True, stdout=subprocess.DEVNULL)
    wait_all(procs, 240)
    second = "".join(run_log(work, job, m) for m in MEMBERS)
    assert second.count(f"restored step {step} at world size 2") == 2, second[-2000:]
    j = job_json(ctl, env, job)
    assert j["state"] == "FINISHED", j
    resumed = [e for e in events(ctl, env, job) if e["type"] == "RESUMED"]
    assert len(resumed) == 1 and int(resumed[0].get("step", 0)) == step, resumed
    steps = summary.read_logs(first + second)
    assert sorted(steps) == list(range(1, STEPS + 1)), f"steps logged: {sorted(steps)}"
    worst = summary.compare(steps, ref, step)
    assert worst <= summary.TOLERANCE, f"loss after the resume differs by {worst:.2e}"
    assert summary.check_no_repeats(ctl, job, STEPS), "data repeated or skipped"
    print(f"{job}: resumed at step {step} (RESUMED {step}), finished; loss within {worst:.1e}")


def main():
    bins = sys.argv[1:6]
    with workspace("stoker-train-preempt.") as (work, running):
        global RUNNING
        RUNNING = running
        env = services(bins, work, running)
        os.environ.update(env)  # summary.explain reads STOKER_DATALOADER.
        data = corpus(work)
        sigterm_exit(bins, env, work, data)
        ref = reference(bins, env, work, data)
        for job, how in (("pa", "sigterm"), ("pb", "notice"), ("pc", "pause")):
            step = preempt(bins, env, work, data, job, how)
            resume(bins, env, work, data, job, step, ref, how)
        for job, hb, beat in (("pe", "lag:3", "3s"), ("pf", "stale:3", "500ms")):
            extra = [*CROSSING, "--heartbeat-test", hb]
            step = preempt(bins, env, work, data, job, "notice", extra, beat, after_beat=True)
            crossed(bins[4], env, work, job, hb, step)
            resume(bins, env, work, data, job, step, ref, "notice")
    print("ok")


if __name__ == "__main__":
    main()

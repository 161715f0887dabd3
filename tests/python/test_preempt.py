"""Preemption seen from a Python training loop, against the real coordinator:
a rank that catches SIGTERM (``TrainingMonitor.catch_sigterm``) tells the
coordinator at its next poll (a preemption notice for the whole job), every
rank then hears CHECKPOINT_NOW with ``pausing``, leaves with the step it
saved, and the job is PAUSED with one PREEMPTED event; ``Jobs.preempt`` gives
the same notice from outside, once; the ranks' Join resumes the job at the
saved step (RESUMED). Then the same under torchrun with train_gpt.py: a SIGTERM
to an agent pauses the job at one step, every process exits 75, and the
resumed job trains every step once, with an uninterrupted run's losses."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time

from test_elastic import LINE, Agents, uninterrupted_losses

from stoker.elastic import RESUMABLE_EXIT, TrainingMonitor
from stoker.jobs import JobEvent, Jobs
from stoker.membership import CHECKPOINT_NOW, STOP, Member, Membership
from stoker.v1 import common_pb2
from stoker.v1 import coordinator_pb2 as pb


def wait_action(monitor: TrainingMonitor, want: str, timeout: float = 20.0) -> str:
    end = time.time() + timeout
    while time.time() < end:
        for action, reason in monitor.poll():
            if action == want:
                return reason
        time.sleep(0.02)
    raise AssertionError(f"no {want} within {timeout} s")


def two_ranks(addr: str, job: str) -> list[Member]:
    members = [Member(job, addr, member_id=f"m{i}") for i in range(2)]
    threads = [threading.Thread(target=m.join) for m in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return members


def events(jobs: Jobs, job: str) -> list[JobEvent]:
    """The job's stored events (the watch ends after 1 s without one)."""
    return list(jobs.watch(job, idle_timeout=1.0))


def test_sigterm_is_a_notice_and_the_job_resumes_on_join(daemons) -> None:
    addr = daemons["coordinator"].addr
    jobs = Jobs(addr)
    jobs.create("py-pre", 2, 2, heartbeat_interval_ms=100, heartbeat_misses=50, last_call_ms=200)
    members = two_ranks(addr, "py-pre")
    monitors = [TrainingMonitor(member=m) for m in members]
    monitors[1].catch_sigterm()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # as the kubelet does
        assert monitors[1].terminating
        for mon in monitors:
            mon.report(step=7)
        wait_action(monitors[1], CHECKPOINT_NOW)  # its poll told the coordinator
        reason = wait_action(monitors[0], CHECKPOINT_NOW)
        assert monitors[0].pausing and monitors[1].pausing, reason
        assert jobs.show("py-pre").state == "PAUSING"
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for mon in monitors:
            mon.close()
    for m in members:  # staged step 8, exit RESUMABLE_EXIT
        m.leave(checkpoint_step=8)
    job = jobs.show("py-pre")
    assert job.state == "PAUSED" and "member m1 is terminating" in job.reason, job
    preempted = [e for e in events(jobs, "py-pre") if e.type == "PREEMPTED"]
    assert len(preempted) == 1, preempted
    assert RESUMABLE_EXIT == 75
    # The checkpoint service commits step 8 after the ranks are gone; the
    # ranks come back and Join: no ResumeJob, and they restore step 8.
    jobs.preempt("py-pre", "again")  # a later notice changes nothing
    back = [Member("py-pre", addr, member_id=f"m{i}") for i in range(2)]
    got: list[Membership] = []
    threads = [threading.Thread(target=lambda m=m: got.append(m.join(timeout=30))) for m in back]
    for t in threads:
        t.start()
    time.sleep(0.5)
    assert not got, "the round closed before the staged checkpoint was reported"
    back[0].conn.unary(  # what the checkpoint service does once committed
        "/stoker.v1.Coordinator/ReportCheckpoint",
        pb.ReportCheckpointRequest(job="py-pre", step=8, uri="file:///ckpt/8"),
        common_pb2.Empty,
    )
    for t in threads:
        t.join()
    assert [g.latest_checkpoint_step for g in got] == [8, 8]
    resumed = [e for e in events(jobs, "py-pre") if e.type == "RESUMED"]
    assert len(resumed) == 1 and resumed[0].step == 8, resumed
    assert len([e for e in events(jobs, "py-pre") if e.type == "PREEMPTED"]) == 1
    for m in back:
        m.leave()


def test_an_outside_notice_reaches_every_rank(daemons) -> None:
    addr = daemons["coordinator"].addr
    jobs = Jobs(addr)
    jobs.create("py-out", 2, 2, heartbeat_interval_ms=100, heartbeat_misses=50, last_call_ms=200)
    members = two_ranks(addr, "py-out")
    monitors = [TrainingMonitor(member=m) for m in members]
    try:
        assert not any(mon.pausing for mon in monitors)
        jobs.preempt("py-out", "kueue: evicted")
        for mon in monitors:
            wait_action(mon, CHECKPOINT_NOW)
            assert mon.pausing
    finally:
        for mon in monitors:
            mon.close()
    for m in members:
        m.leave(checkpoint_step=3)
    job = jobs.show("py-out")
    assert job.state == "PAUSED" and "kueue: evicted" in job.reason, job


def report_checkpoint(member: Member, job: str, step: int) -> None:
    """What the checkpoint service does once a checkpoint is committed."""
    member.conn.unary(
        "/stoker.v1.Coordinator/ReportCheckpoint",
        pb.ReportCheckpointRequest(job=job, step=step, uri=f"file:///ckpt/{step}"),
        common_pb2.Empty,
    )


def test_the_pause_checkpoint_covers_the_ranks_stop_step(daemons) -> None:
    """Heartbeats lag the ranks: at the notice they had reported 9; they
    agree to stop at 12 (``report_stop``) while a periodic save of 11 (begun
    after their last report) commits. It is not the pause's: the rank whose
    heartbeat still says 11 hears no STOP until 12 is reported, and that STOP
    names 12 (``stop_checkpoint_step``). Without the stop step the
    coordinator took 11 and told that rank STOP with step 12 unsaved."""
    addr = daemons["coordinator"].addr
    jobs = Jobs(addr)
    jobs.create("py-stop", 2, 2, heartbeat_interval_ms=100, heartbeat_misses=50, last_call_ms=200)
    members = two_ranks(addr, "py-stop")
    monitors = [TrainingMonitor(member=m) for m in members]
    try:
        for mon in monitors:
            mon.report(step=9)
        time.sleep(0.3)  # a heartbeat each at step 9
        jobs.preempt("py-stop", "kueue: evicted")
        for mon in monitors:
            wait_action(mon, CHECKPOINT_NOW)
        monitors[0].report(step=12)
        monitors[0].report_stop(12)  # the ranks' vote
        monitors[1].report(step=11)  # its heartbeat lags
        time.sleep(0.3)
        report_checkpoint(members[0], "py-stop", 11)
        time.sleep(0.5)  # five heartbeats each
        assert STOP not in [a for mon in monitors for a, _ in mon.poll()]
        assert jobs.show("py-stop").state == "PAUSING"
        report_checkpoint(members[0], "py-stop", 12)
        monitors[1].report(step=12)
        monitors[1].report_stop(12)
        wait_action(monitors[1], STOP)
        assert members[1].stop_checkpoint_step == 12
    finally:
        for mon in monitors:
            mon.close()
    for m in members:
        m.leave(checkpoint_step=12)
    job = jobs.show("py-stop")
    assert job.state == "PAUSED", job
    paused = [e for e in events(jobs, "py-stop") if e.type == "PAUSED"]
    assert paused[-1].step == 12, paused


def losses(logs: list[pathlib.Path]) -> dict[int, float]:
    """Rank 0's ``step S loss L`` lines of these agents' logs."""
    text = "".join(p.read_text(errors="replace") for p in logs)
    return {int(s): float(loss) for s, loss, _ in LINE.findall(text)}


def test_a_sigterm_to_a_torchrun_agent_pauses_the_job_and_it_resumes_losing_no_step(
    daemons, tmp_path
) -> None:
    """train_gpt.py under torchrun: the eviction's SIGTERM to one agent
    (torchrun, the pod's main process) is a preemption notice; every rank
    saves at one step and exits 75, both agents leave with that step and
    exit 75 themselves (no worker restarted), the job is PAUSED with one
    PREEMPTED event. New agents resume it from that step: every step trained
    once, with the losses of a run that was never interrupted."""
    spec = ["--min", "2", "--max", "2", "--heartbeat", "300ms", "--misses", "10"]
    spec += ["--last-call", "1s"]
    steps = 24
    uninterrupted = uninterrupted_losses(daemons, tmp_path, "pt-ref", spec, "2", steps)

    (tmp_path / "pre").mkdir()
    a = Agents(daemons, tmp_path / "pre", "pt-pre")
    a.ctl("job", "create", "pt-pre", *spec)
    try:
        a.start(2, "2", steps=steps, every=1000)
        a.wait_log(r"^step [4-9] loss .* world 2$", 240)
        os.kill(a.procs[1].pid, signal.SIGTERM)  # as the kubelet does
        paused = int(a.wait_log(r"^paused at step (\d+)", 120).group(1))
        codes = [p.wait(timeout=120) for p in a.procs]
        assert codes == [RESUMABLE_EXIT, RESUMABLE_EXIT], (codes, a.text()[-3000:])
        assert "Stopping worker group" not in a.text(), a.text()[-3000:]
        # Rank 0 committed the last checkpoint detached: it left once the
        # service decided the commit, which it finished after the ranks.
        assert f"checkpoint step {paused} commit accepted (detached)" in a.text(), a.text()[-3000:]
        before = losses(a.logs)
        jobs = Jobs(a.env["STOKER_COORDINATOR"])
        job = jobs.show("pt-pre")
        assert job.state == "PAUSED", job
        assert len([e for e in events(jobs, "pt-pre") if e.type == "PREEMPTED"]) == 1

        a.start(2, "2", steps=steps, every=1000)  # the pods come back
        restored = int(a.wait_log(r"^restored step (\d+) at world 2$", 240).group(1))
        for p in a.procs[2:]:
            assert p.wait(timeout=300) == 0, a.text()[-3000:]
        after = losses(a.logs[2:])
    finally:
        a.close()
    assert restored == paused and sorted(before) == list(range(1, paused + 1)), sorted(before)
    assert sorted(after) == list(range(paused + 1, steps + 1)), sorted(after)
    assert {**before, **after} == uninterrupted

"""Preemption seen from a Python training loop, against the real coordinator:
a rank that catches SIGTERM (``TrainingMonitor.catch_sigterm``) tells the
coordinator at its next poll (a preemption notice for the whole job), every
rank then hears CHECKPOINT_NOW with ``pausing``, leaves with the step it
saved, and the job is PAUSED with one PREEMPTED event; ``Jobs.preempt`` gives
the same notice from outside, once; the ranks' Join resumes the job at the
saved step (RESUMED)."""

from __future__ import annotations

import os
import signal
import threading
import time

from stoker.elastic import RESUMABLE_EXIT, TrainingMonitor
from stoker.jobs import JobEvent, Jobs
from stoker.membership import CHECKPOINT_NOW, Member, Membership
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

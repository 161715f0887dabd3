"""Submitting jobs to a cluster queue and watching them, against the real
coordinator and stokerctl (issue 23, part 4): ``Jobs.submit`` and ``stokerctl
job submit`` record a submission (bad names and arguments refused naming the
field, nothing created); the queue controller's reports (``Jobs.report_queue``,
as the controller sends them) become the job's ``queue`` and one QUEUED,
ADMITTED or REJECTED event per change of state (REJECTED also counted on
/metrics); a user's resize of a submitted job, with the controller's part as
stoker.kueue does it, logs SCALED, PREEMPTED, SHRUNK, RESUMED, SCALED,
GROWN; the controller's shrink in place (``Jobs.scale(in_place=True)``, the
removed rank's SIGTERM no notice) logs SHRUNK and no PREEMPTED;
``Jobs.watch`` yields them, ``describe`` and ``stokerctl job watch`` say
them in the same words, ``stokerctl job show`` prints the queue, its
JSON equals ``Job.as_dict()``; a team's token submits and reports only
within its scope, and only to the queues and at the priorities its line of
the token table grants."""

from __future__ import annotations

import json
import pathlib
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable

import grpc
import pytest
from conftest import Daemon, binary

from stoker import Jobs, Security, StokerError
from stoker.membership import Member, Membership
from stoker.queue import ADMITTED, QUEUE_EVENTS, QUEUED, REJECTED, describe
from stoker.v1 import common_pb2
from stoker.v1 import coordinator_pb2 as pb


def ctl(addr: str, *args: str, json_out: bool = False) -> subprocess.CompletedProcess[str]:
    argv = [str(binary("stokerctl")), "--coordinator", addr, "--timeout", "10s"]
    if json_out:
        argv.append("--json")
    return subprocess.run(argv + list(args), capture_output=True, text=True, timeout=30)


def ctl_json(addr: str, *args: str) -> dict[str, object]:
    p = ctl(addr, *args, json_out=True)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.splitlines()[0])  # type: ignore[no-any-return]


def watch_lines(addr: str, name: str) -> list[str]:
    """What ``stokerctl job watch`` printed in its first 3 s (it runs until Ctrl-C)."""
    argv = [str(binary("stokerctl")), "--coordinator", addr, "job", "watch", name]
    try:
        subprocess.run(argv, capture_output=True, text=True, timeout=3)
    except subprocess.TimeoutExpired as e:
        out = e.stdout
        return (out.decode() if isinstance(out, bytes) else out or "").splitlines()
    raise AssertionError("stokerctl job watch ended by itself")


def events(jobs: Jobs, name: str) -> list[tuple[str, str]]:
    return [(e.type, describe(e)) for e in jobs.watch(name, idle_timeout=0.5)]


def test_submit_and_watch(daemons: dict[str, Daemon]) -> None:
    addr = daemons["coordinator"].addr
    with Jobs(addr) as jobs:
        job = jobs.submit(
            "llm", "llm-7b", 2, 4, queue="team-a", priority="high", args=["--lr", "3e-4"]
        )
        assert job.spec is not None and job.spec.submission is not None
        assert job.spec.submission.template == "llm-7b"
        assert job.spec.submission.args == ("--lr", "3e-4")
        assert job.queue is None  # not yet seen by the controller
        assert job.as_dict() == ctl_json(addr, "job", "show", "llm")

        job = jobs.report_queue("llm", "QUEUED", workload="job-llm-x1", position=2)
        assert job.queue is not None and job.queue.state == "QUEUED"
        assert job.queue.position == 2 and job.queue.updated_ms > 0
        jobs.report_queue("llm", "QUEUED", workload="job-llm-x1", position=1)  # no event
        job = jobs.report_queue(
            "llm", "ADMITTED", workload="job-llm-x1", cluster_queue="cq-gpu", admitted_ranks=4
        )
        assert job.queue is not None and job.queue.admitted_ranks == 4
        assert jobs.show("llm").reason == "admitted 4 ranks by cq-gpu"  # why it waits

        seen = [x for x in events(jobs, "llm") if x[0] in (QUEUED, ADMITTED)]
        assert seen == [
            (QUEUED, "queued in team-a at position 2"),
            (ADMITTED, "admitted 4 ranks by cq-gpu"),
        ]
        # stokerctl says the same, and its JSON is the Python object's.
        lines = watch_lines(addr, "llm")
        assert any(line.endswith("QUEUED  gen=1  queued in team-a at position 2") for line in lines)
        assert any(line.endswith("ADMITTED  gen=1  admitted 4 ranks by cq-gpu") for line in lines)
        shown = ctl(addr, "job", "show", "llm").stdout
        assert "queue team-a, priority high, template llm-7b" in shown
        assert "ADMITTED, 4 ranks admitted, cluster queue cq-gpu, workload job-llm-x1" in shown
        assert jobs.show("llm").as_dict() == ctl_json(addr, "job", "show", "llm")
        assert jobs.resize("llm", 2).target_ranks == 2
        assert jobs.stop("llm").state == "STOPPED"


def test_refused(daemons: dict[str, Daemon]) -> None:
    addr = daemons["coordinator"].addr
    with Jobs(addr) as jobs:
        for kwargs, field in [
            ({"queue": "Team-A"}, "submission.queue"),
            ({"priority": "a b"}, "submission.priority"),
            ({"args": ["x"] * 65}, "submission.args"),
            ({"args": ["y" * 1025]}, "submission.args[0]"),
        ]:
            with pytest.raises(StokerError) as e:
                jobs.submit("bad", "llm", 1, 2, **kwargs)  # type: ignore[arg-type]
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
            assert field in e.value.details, e.value.details
        with pytest.raises(StokerError) as e:
            jobs.submit("bad", "", 1, 2)
        assert "submission.template" in e.value.details
        with pytest.raises(StokerError) as e:
            jobs.show("bad")
        assert e.value.code == grpc.StatusCode.NOT_FOUND  # nothing was created

        jobs.create("plain", 1, 2)
        with pytest.raises(StokerError) as e:
            jobs.report_queue("plain", "QUEUED")
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        jobs.submit("ok", "llm", 1, 2)
        with pytest.raises(StokerError) as e:
            jobs.report_queue("ok", "ADMITTED", admitted_ranks=3)  # over max_ranks
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "status.admitted_ranks" in e.value.details
        with pytest.raises(StokerError) as e:
            jobs.report_queue("ok", "SOMEWHERE")
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert jobs.show("ok").queue is None
        for ranks, field in [(3, "max_ranks 2"), (0, "min_ranks 1")]:  # a resize out of range
            with pytest.raises(StokerError) as e:
                jobs.resize("ok", ranks)
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert f"ranks {ranks} is" in e.value.details and field in e.value.details
            p = ctl(addr, "job", "resize", "ok", str(ranks))  # 0: stokerctl refuses it itself
            assert p.returncode != 0 and (field if ranks else "rank count") in p.stderr, p.stderr
        assert jobs.show("ok").target_ranks == 0
        assert [t for t, _ in events(jobs, "ok")] == ["CREATED"]


def test_stokerctl_submit(daemons: dict[str, Daemon]) -> None:
    addr = daemons["coordinator"].addr
    p = ctl(
        addr,
        "job",
        "submit",
        "ctl-job",
        "--template",
        "llm",
        "--min",
        "1",
        "--max",
        "2",
        "--queue",
        "team-a",
        "--",
        "--lr",
        "1e-3",
        "--",
    )
    assert p.returncode == 0, p.stderr
    assert 'job "ctl-job" submitted to queue team-a, template llm' in p.stdout
    with Jobs(addr) as jobs:
        sub = jobs.show("ctl-job").spec.submission  # type: ignore[union-attr]
        assert sub is not None and sub.args == ("--lr", "1e-3", "--")
    p = ctl(addr, "job", "submit", "x", "--min", "1", "--max", "2")
    assert p.returncode == 1 and "--template" in p.stderr
    p = ctl(addr, "job", "submit", "x", "--template", "Bad", "--min", "1", "--max", "2")
    assert p.returncode == 1 and "submission.template" in p.stderr, p.stderr
    p = ctl(addr, "job", "resize", "ctl-job", "2")
    assert p.returncode == 0, p.stderr


def test_scope(tmp_path: pathlib.Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("op-token\na-token team-a-*\n")
    d = Daemon("coordinator", tmp_path, "--token-file", str(tokens))
    try:
        with Jobs(d.addr, security=Security(token="a-token")) as team:
            team.submit("team-a-llm", "llm", 1, 2)
            with pytest.raises(StokerError) as e:
                team.submit("team-b-llm", "llm", 1, 2)
            assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
            with Jobs(d.addr, security=Security(token="op-token")) as op:
                op.submit("team-b-llm", "llm", 1, 2)
                op.report_queue("team-a-llm", "QUEUED", position=0)
            with pytest.raises(StokerError) as e:
                team.report_queue("team-b-llm", "QUEUED", position=0)
            assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
            got = team.show("team-a-llm").queue
            assert got is not None and got.state == "QUEUED"
    finally:
        d.stop()


def test_strings_not_utf8_refused(tmp_path: pathlib.Path) -> None:
    """A request whose string is not UTF-8 (which protobuf-c would take as
    it is) is INVALID_ARGUMENT and changes nothing. Before, a team's PreemptJob
    with such a reason put it into its job's reason and events, and every
    Python reader of a listing holding that job failed to parse it: the
    operator's ListJobs, and so the queue controller of every team."""
    tokens = tmp_path / "tokens"
    tokens.write_text("op-token\na-token team-a-*\n")
    d = Daemon("coordinator", tmp_path, "--token-file", str(tokens))
    try:
        with Jobs(d.addr, security=Security(token="a-token")) as team:
            team.submit("team-a-llm", "llm", 1, 2)
        # Python cannot build such a message: the reason's bytes are appended by hand.
        raw = pb.PreemptJobRequest(job="team-a-llm").SerializeToString() + b"\x12\x02\xc3("
        with grpc.insecure_channel(d.addr) as ch:
            preempt = ch.unary_unary("/stoker.v1.Coordinator/PreemptJob")
            with pytest.raises(grpc.RpcError) as e:
                preempt(raw, metadata=[("authorization", "Bearer a-token")], timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "reason" in str(e.value.details()) and "UTF-8" in str(e.value.details())
        with Jobs(d.addr, security=Security(token="op-token")) as op:
            (job,) = op.list()
            assert job.state != "PAUSED" and "preempt" not in job.reason
    finally:
        d.stop()


def join_all(addr: str, job: str, ids: list[str]) -> list[Member]:
    members = [Member(job, addr, member_id=i) for i in ids]
    got: list[Membership] = []
    threads = [threading.Thread(target=lambda m=m: got.append(m.join(timeout=30))) for m in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(ids)
    return members


def test_evicted_and_readmitted_smaller(daemons: dict[str, Daemon]) -> None:
    """The life a queue controller reports: queued, admitted at 2, evicted
    (PreemptJob: the ranks stage step 8 and leave), queued again, admitted
    at 1: the one rank back resumes at step 8 and the log says it shrank."""
    addr = daemons["coordinator"].addr
    with Jobs(addr) as jobs:
        jobs.submit(
            "life", "llm", 1, 2, heartbeat_interval_ms=100, heartbeat_misses=50, last_call_ms=200
        )
        jobs.report_queue("life", "QUEUED", position=0)
        jobs.report_queue("life", "ADMITTED", admitted_ranks=2)
        members = join_all(addr, "life", ["m0", "m1"])
        jobs.preempt("life", "kueue: evicted")
        for m in members:
            m.leave(checkpoint_step=8)
        jobs.report_queue("life", "EVICTED", message="Preempted to accommodate a workload")
        jobs.report_queue("life", "QUEUED", position=0)
        job = jobs.report_queue("life", "ADMITTED", admitted_ranks=1)
        assert job.state == "PAUSED" and job.queue is not None and job.queue.admitted_ranks == 1
        back = Member("life", addr, member_id="m0")
        got: list[Membership] = []
        t = threading.Thread(target=lambda: got.append(back.join(timeout=30)))
        t.start()
        back.conn.unary(  # the checkpoint service, once step 8 is committed
            "/stoker.v1.Coordinator/ReportCheckpoint",
            pb.ReportCheckpointRequest(job="life", step=8, uri="file:///ckpt/8"),
            common_pb2.Empty,
        )
        t.join()
        assert got and got[0].latest_checkpoint_step == 8
        said = [(e.type, describe(e)) for e in jobs.watch("life", idle_timeout=0.5)]
        assert [x for x in said if x[0] in QUEUE_EVENTS] == [
            ("QUEUED", "queued in the default queue at position 0"),
            ("ADMITTED", "admitted 2 ranks"),
            ("PREEMPTED", "preempted at step 0: kueue: evicted"),
            ("QUEUED", "queued in the default queue at position 0"),
            ("ADMITTED", "admitted 1 rank"),
            ("SHRUNK", "shrunk to 1 rank at step 8"),
            ("RESUMED", "resumed at step 8: resumed after preemption (kueue: evicted) at step 8"),
        ], said
        back.leave()


def test_shrunk_in_place(daemons: dict[str, Daemon]) -> None:
    """The queue controller's shrink (issue 23): ``Jobs.scale(in_place=True)``
    while the removed rank's pod is deleted: its SIGTERM (terminating) is no
    preemption notice; both ranks are told the resize's CHECKPOINT_NOW
    (resizing, not pausing), the removed one leaves with the step, and the
    kept one rejoins at 1 from that checkpoint; the log says SHRUNK, never
    PREEMPTED or PAUSED."""
    addr = daemons["coordinator"].addr
    with Jobs(addr) as jobs:
        jobs.submit(
            "ip", "llm", 1, 2, heartbeat_interval_ms=100, heartbeat_misses=50, last_call_ms=200
        )
        m0, m1 = join_all(addr, "ip", ["m0", "m1"])
        job = jobs.scale("ip", 1, in_place=True)
        assert job.state == "RUNNING" and "shrinking in place" in job.reason, job.reason
        m1.notify_terminating()
        for m in (m0, m1):
            assert m.heartbeat()[0] == "CHECKPOINT_NOW"
            assert m.resizing and not m.pausing
            m.report_stop(8)
            m.heartbeat()
        m1.leave(checkpoint_step=8)
        assert jobs.show("ip").state == "RUNNING"
        m0.conn.unary(  # the checkpoint service, once step 8 is committed
            "/stoker.v1.Coordinator/ReportCheckpoint",
            pb.ReportCheckpointRequest(job="ip", step=8, uri="file:///ckpt/8"),
            common_pb2.Empty,
        )
        assert m0.heartbeat()[0] == "RESTART"
        back = Member("ip", addr, member_id="m0")
        got = back.join(timeout=30)
        assert (got.world_size, got.latest_checkpoint_step) == (1, 8)
        said = [(e.type, describe(e)) for e in jobs.watch("ip", idle_timeout=0.5)]
        types = [t for t, _ in said]
        assert "PREEMPTED" not in types and "PAUSED" not in types, said
        assert ("SHRUNK", "shrunk to 1 rank at step 8") in said, said
        back.leave()


POLICY = """op-token
a-token team-a-*  queues=team-a,shared  priorities=low,normal
b-token team-b-*  queues=team-b         priorities=*
c-token team-c-*
o2-token *        queues=shared
"""


def refused(call: Callable[[], object], field: str, name: str) -> str:
    with pytest.raises(StokerError) as e:
        call()
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED, e.value
    assert f"{field} {name}:" in e.value.details, e.value.details
    return e.value.details


def test_tenant_queue_and_priority_policy(tmp_path: pathlib.Path) -> None:
    """Each team submits only to the queues and at the priorities its line of
    the token file grants (queues=, priorities=): a submission outside them is
    PERMISSION_DENIED naming the field and creates nothing (no job, no event);
    within them it is recorded as sent, with the team's first queue when it
    names none. A team's line without a grant allows only the defaults; an
    operator's token, anything unless its line grants less; stokerctl says
    the refusal; SIGHUP re-reads the grants."""
    tokens = tmp_path / "tokens"
    tokens.write_text(POLICY)
    d = Daemon("coordinator", tmp_path, "--token-file", str(tokens))
    try:
        a = Jobs(d.addr, security=Security(token="a-token"))
        b = Jobs(d.addr, security=Security(token="b-token"))
        c = Jobs(d.addr, security=Security(token="c-token"))
        op = Jobs(d.addr, security=Security(token="op-token"))
        # A into B's queue, at a priority it was not granted, or both.
        why = refused(
            lambda: a.submit("team-a-x", "llm", 1, 2, queue="team-b"), "submission.queue", "team-b"
        )
        assert "team-a,shared" in why, why
        refused(
            lambda: a.submit("team-a-x", "llm", 1, 2, priority="high"),
            "submission.priority",
            "high",
        )
        refused(
            lambda: a.submit("team-a-x", "llm", 1, 2, queue="shared", priority="high"),
            "submission.priority",
            "high",
        )
        # B may take any priority but only its own queue.
        refused(
            lambda: b.submit("team-b-x", "llm", 1, 2, queue="team-a"), "submission.queue", "team-a"
        )
        # C has no grant: the defaults only.
        refused(
            lambda: c.submit("team-c-x", "llm", 1, 2, queue="team-c"), "submission.queue", "team-c"
        )
        refused(
            lambda: c.submit("team-c-x", "llm", 1, 2, priority="low"), "submission.priority", "low"
        )
        # Nothing was created, so no event was logged: no job at all, and the
        # same names are free for submissions within the policy.
        assert op.list() == []
        with pytest.raises(StokerError) as e:
            op.show("team-a-x")
        assert e.value.code == grpc.StatusCode.NOT_FOUND

        got = a.submit("team-a-x", "llm", 1, 2, queue="shared", priority="normal")
        assert got.spec is not None and got.spec.submission is not None
        assert (got.spec.submission.queue, got.spec.submission.priority) == ("shared", "normal")
        got = a.submit("team-a-y", "llm", 1, 2)  # no queue named: the team's first
        assert got.spec is not None and got.spec.submission is not None
        assert (got.spec.submission.queue, got.spec.submission.priority) == ("team-a", "")
        b.submit("team-b-x", "llm", 1, 2, queue="team-b", priority="high")
        got = c.submit("team-c-x", "llm", 1, 2)  # defaults: the controller's queue
        assert got.spec is not None and got.spec.submission is not None
        assert got.spec.submission.queue == ""
        op.submit("op-x", "llm", 1, 2, queue="team-b", priority="high")
        assert sorted(j.spec.name for j in op.list() if j.spec) == [
            "op-x",
            "team-a-x",
            "team-a-y",
            "team-b-x",
            "team-c-x",
        ]
        assert [t for t, _ in events(op, "team-a-x")] == ["CREATED"]

        # stokerctl says the refusal; within the policy it submits.
        tok = tmp_path / "a.token"
        tok.write_text("a-token\n")
        p = ctl(
            d.addr,
            "--token-file",
            str(tok),
            "job",
            "submit",
            "team-a-z",
            "--template",
            "llm",
            "--min",
            "1",
            "--max",
            "2",
            "--queue",
            "team-b",
        )
        assert p.returncode != 0, p.stdout
        assert "submission.queue team-b:" in p.stderr and "team-a,shared" in p.stderr, p.stderr
        p = ctl(
            d.addr,
            "--token-file",
            str(tok),
            "job",
            "submit",
            "team-a-z",
            "--template",
            "llm",
            "--min",
            "1",
            "--max",
            "2",
            "--priority",
            "high",
        )
        assert p.returncode != 0 and "submission.priority high:" in p.stderr, p.stderr
        p = ctl(
            d.addr,
            "--token-file",
            str(tok),
            "job",
            "submit",
            "team-a-z",
            "--template",
            "llm",
            "--min",
            "1",
            "--max",
            "2",
            "--priority",
            "low",
        )
        assert p.returncode == 0, p.stderr
        assert 'job "team-a-z" submitted to queue team-a' in p.stdout, p.stdout
        # An operator's line that grants queues is bound by them too.
        with Jobs(d.addr, security=Security(token="o2-token")) as o2:
            refused(
                lambda: o2.submit("op-y", "llm", 1, 2, queue="team-b"), "submission.queue", "team-b"
            )
            o2.submit("op-y", "llm", 1, 2, queue="shared", priority="high")

        # SIGHUP re-reads the grants: team C may now name its own queue.
        tokens.write_text(POLICY.replace("c-token team-c-*", "c-token team-c-* queues=team-c"))
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        until = time.monotonic() + 10
        while True:
            try:
                got = c.submit("team-c-y", "llm", 1, 2, queue="team-c")
                break
            except StokerError as e:
                assert e.code == grpc.StatusCode.PERMISSION_DENIED, e
                assert time.monotonic() < until, "the new grant was not read"
                time.sleep(0.05)
        assert got.spec is not None and got.spec.submission is not None
        assert got.spec.submission.queue == "team-c"
        for j in (a, b, c, op):
            j.close()
    finally:
        d.stop()


@pytest.mark.parametrize(
    "line",
    [
        "a-token team-a-* queues=Team-A",
        "a-token team-a-* queues=team-a,",
        "a-token team-a-* queues=a queues=b",
        "a-token team-a-* colour=red",
        "a-token team-a-* queues=a team-b-*",
    ],
)
def test_a_bad_grant_is_refused_with_its_line(tmp_path: pathlib.Path, line: str) -> None:
    bad = tmp_path / "tokens"
    bad.write_text(f"op-token\n{line}\n")
    with pytest.raises(Exception):  # noqa: B017 (the daemon does not start)
        Daemon("coordinator", tmp_path, "--token-file", str(bad))
    log = (tmp_path / "coordinator.log").read_text()
    assert "line 2" in log, log


def test_the_other_daemons_read_the_same_table(tmp_path: pathlib.Path) -> None:
    """The Secret's one table serves the three daemons: grants load there
    too (only the coordinator reads them)."""
    tokens = tmp_path / "tokens"
    tokens.write_text(POLICY)
    for name in ("dataloader", "checkpoint"):
        Daemon(name, tmp_path, "--token-file", str(tokens)).stop()


def test_a_users_resize_as_the_controller_applies_it(daemons: dict[str, Daemon]) -> None:
    """A user's resize of a submitted job, with the queue controller's part
    done as stoker.kueue does it: ``resize`` down sets the target and nothing
    else; the controller's PreemptJob (its reason from decide.user_resize)
    stops the ranks at step 8, the one rank its smaller Job keeps resumes
    alone: SHRUNK and RESUMED. ``resize`` up: the job runs on at 1 until the
    new rank the grown Job starts has joined, then checkpoints (step 12) and
    grows: GROWN. Every step of it in the job's log, as describe and
    stokerctl job watch say it."""
    decide = pytest.importorskip("stoker.kueue.decide")
    addr = daemons["coordinator"].addr
    with Jobs(addr) as jobs:
        jobs.submit(
            "rz", "llm", 1, 2, heartbeat_interval_ms=100, heartbeat_misses=50, last_call_ms=200
        )
        members = join_all(addr, "rz", ["m0", "m1"])
        job = jobs.resize("rz", 1)
        assert (job.state, job.world_size, job.target_ranks) == ("RUNNING", 2, 1)
        assert members[0].heartbeat()[0] == "CONTINUE"  # no checkpoint, no round
        running = decide.Running(
            job="rz", stoker_job="rz", workload="w", cluster_queue="cq", priority=0,
            created="", count=2, min_ranks=1, max_ranks=2, wanted=2, elastic=True,
            per_pod={}, submitted=True, target=1, set_target=0,
        )  # fmt: skip
        rz = decide.user_resize(running)
        assert rz is not None and rz.to == 1
        jobs.preempt("rz", rz.reason)  # the controller; then its Job drops index 1
        for m in members:
            m.leave(checkpoint_step=8)
        back = Member("rz", addr, member_id="m0")
        got: list[Membership] = []
        t = threading.Thread(target=lambda: got.append(back.join(timeout=30)))
        t.start()
        report_step(back, "rz", 8)
        t.join()
        assert got and got[0].world_size == 1 and got[0].latest_checkpoint_step == 8

        job = jobs.resize("rz", 2)
        assert (job.state, job.world_size, job.target_ranks) == ("RUNNING", 1, 2)
        assert back.heartbeat()[0] == "CONTINUE"
        new = Member("rz", addr, member_id="m1")
        grown: list[Membership] = []
        t = threading.Thread(target=lambda: grown.append(new.join(timeout=30)))
        t.start()  # joins and parks: now the job checkpoints first
        deadline = time.monotonic() + 10
        while back.heartbeat()[0] != "CHECKPOINT_NOW" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert jobs.show("rz").world_size == 1 and not grown
        back.report_stop(12)  # the step its ranks agreed to stop at
        back.heartbeat()
        report_step(back, "rz", 12)
        assert back.heartbeat()[0] == "RESTART"
        again: list[Membership] = []
        t2 = threading.Thread(target=lambda: again.append(back.join(timeout=30)))
        t2.start()
        t.join()
        t2.join()
        assert grown[0].world_size == 2 and grown[0].latest_checkpoint_step == 12

        said = [(e.type, describe(e)) for e in jobs.watch("rz", idle_timeout=0.5)]
        kinds = QUEUE_EVENTS | {"SCALED"}
        target = "(its queue controller resizes the workload)"
        assert [x for x in said if x[0] in kinds] == [
            ("SCALED", f"target 1 ranks {target}"),
            ("PREEMPTED", f"preempted at step 0: {rz.reason}"),
            ("SHRUNK", "shrunk to 1 rank at step 8"),
            ("RESUMED", f"resumed at step 8: resumed after preemption ({rz.reason}) at step 8"),
            ("SCALED", f"target 2 ranks {target}"),
            ("GROWN", "grown to 2 ranks at step 12"),
        ], said
        lines = watch_lines(addr, "rz")
        grew = [line for line in lines if "  GROWN  " in line]
        assert len(grew) == 1 and grew[0].endswith("grown to 2 ranks at step 12"), lines
        back.leave()
        new.leave()


def report_step(m: Member, job: str, step: int) -> None:
    """As the checkpoint service reports a committed step."""
    m.conn.unary(
        "/stoker.v1.Coordinator/ReportCheckpoint",
        pb.ReportCheckpointRequest(job=job, step=step, uri=f"file:///ckpt/{step}"),
        common_pb2.Empty,
    )


def test_rejected_is_an_event_watched_and_counted(tmp_path: pathlib.Path) -> None:
    """A REJECTED report logs one REJECTED event saying why: Jobs.watch and
    describe, stokerctl job watch, and stoker_job_events_total{type}."""
    metrics = f"127.0.0.1:{free_port()}"
    coord = Daemon("coordinator", tmp_path, "--metrics-listen", metrics)
    try:
        with Jobs(coord.addr) as jobs:
            jobs.submit("rej", "nosuch", 1, 2)
            why = "stoker-template-nosuch: Not Found"
            jobs.report_queue("rej", "REJECTED", message=why)
            jobs.report_queue("rej", "REJECTED", message=why)  # the same: no second event
            said = [x for x in events(jobs, "rej") if x[0] == REJECTED]
            assert said == [(REJECTED, f"rejected by the queue controller: {why}")]
            lines = watch_lines(coord.addr, "rej")
            assert any(
                line.endswith(f"REJECTED  gen=1  rejected by the queue controller: {why}")
                for line in lines
            ), lines
        want = 'stoker_job_events_total{type="REJECTED"} 1'
        deadline = time.monotonic() + 10
        while want not in (text := scrape(metrics)) and time.monotonic() < deadline:
            time.sleep(0.2)  # the counters are copied once a second
        assert want in text
    finally:
        coord.stop()


def scrape(addr: str) -> str:
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        return str(r.read().decode())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])

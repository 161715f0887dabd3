"""stoker.jobs against the real daemons: create, list (label selectors),
show and the operator actions change the job as the coordinator says; watch
yields the event log in order and ends when closed; errors carry the gRPC
status and come within the timeout when a service is down or hung; and every
result's as_dict() equals the object ``stokerctl --json`` prints for it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
import warnings
from typing import Any

import grpc
import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import Daemon, binary

from stoker import Jobs, StokerError
from stoker.checkpoint import StokerWriter
from stoker.connection import Connection
from stoker.data import StokerDataset
from stoker.jobs import ChunkEntry, DatasetSpec, Job, JobEvent, Loader
from stoker.v1 import checkpoint_pb2 as ckpt_pb
from stoker.v1 import common_pb2
from stoker.v1 import coordinator_pb2 as coord_pb
from stoker.v1 import dataloader_pb2 as dl_pb

COORDINATOR = "/stoker.v1.Coordinator/"


def ctl(*args: str) -> list[dict[str, Any]]:
    """Runs ``stokerctl --json ARGS``; its objects, one per output line."""
    out = subprocess.run(
        [str(binary("stokerctl")), "--json", *args], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def join_one(addr: str, job: str) -> None:
    """Joins one rank (closing a 1-rank round) and heartbeats figures, so
    that the job has a member with every field set."""
    conn = Connection(addr)
    joined = conn.unary(
        COORDINATOR + "Join",
        coord_pb.JoinRequest(job=job, member_id="rank-a", address="127.0.0.1:9", host="h0"),
        coord_pb.JoinResponse,
    )
    conn.unary(
        COORDINATOR + "Heartbeat",
        coord_pb.HeartbeatRequest(
            job=job,
            member_id="rank-a",
            generation=joined.generation,
            step=17,
            tokens_per_s=1234.567,
            loss=2.71828,
            health=coord_pb.RANK_HEALTH_DEGRADED,
            message="slow disk",
        ),
        coord_pb.HeartbeatResponse,
    )


def save_checkpoint(addr: str, job: str, step: int) -> None:
    """One process's DCP save through StokerWriter (no process group)."""
    state = {
        "model.w": torch.arange(12, dtype=torch.float32).reshape(4, 3),
        "model.b": torch.ones(5, dtype=torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
        "extra": {"next_step": 7},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming ... a single process"
        dcp.save(state, storage_writer=StokerWriter(job, addr), checkpoint_id=step, no_dist=True)


# ---- jobs ------------------------------------------------------------------------


def test_create_list_and_show_with_labels(daemons):
    jobs = Jobs(daemons["coordinator"].addr)
    a = jobs.create(
        "alpha",
        1,
        4,
        heartbeat_interval_ms=2000,
        labels={"team": "research", "tier": "gold"},
        dataset="file:///data/web",
        checkpoint_storage="s3://bucket/ckpt",
        checkpoint_every_steps=100,
    )
    jobs.create("beta", 2, 2, labels={"team": "research"})
    jobs.create("gamma", 1, 1)
    assert a.name == "alpha" and a.state == "WAITING" and a.generation == 1
    assert a.spec is not None
    assert a.spec.labels == {"team": "research", "tier": "gold"}
    assert (a.spec.dataset, a.spec.checkpoint_storage) == ("file:///data/web", "s3://bucket/ckpt")
    assert a.spec.heartbeat_interval_ms == 2000
    assert a.spec.heartbeat_misses == 3  # The coordinator's default, filled in.
    assert a.spec.checkpoint_every_steps == 100

    assert sorted(j.name for j in jobs.list()) == ["alpha", "beta", "gamma"]
    assert sorted(j.name for j in jobs.list({"team": "research"})) == ["alpha", "beta"]
    assert [j.name for j in jobs.list({"team": "research", "tier": "gold"})] == ["alpha"]
    assert jobs.list({"team": "nobody"}) == []
    assert jobs.show("alpha") == jobs.get("alpha") == a
    assert hash(a) == hash(jobs.show("alpha"))


def test_actions_change_the_state(daemons):
    with Jobs(daemons["coordinator"].addr) as jobs:
        jobs.create("act", 1, 4)
        scaled = jobs.scale("act", 2)
        assert scaled.target_ranks == 2 and scaled.state == "WAITING"
        # Which scale set the target: its SCALED event's seq, new each time.
        again = jobs.scale("act", 2)
        assert 0 < scaled.target_seq < again.target_seq == jobs.show("act").target_seq
        paused = jobs.pause("act")
        assert paused.state == "PAUSED"
        assert jobs.show("act").state == "PAUSED"
        resumed = jobs.resume("act")
        assert resumed.state == "WAITING" and resumed.reason == "resumed"
        stopped = jobs.stop("act", force=True)
        assert stopped.state == "STOPPED"
        assert stopped.last_event_seq > resumed.last_event_seq > paused.last_event_seq
        jobs.delete("act")
        assert jobs.list() == []
        with pytest.raises(StokerError) as e:
            jobs.show("act")
        assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_a_running_job_has_its_member(daemons):
    addr = daemons["coordinator"].addr
    jobs = Jobs(addr)
    jobs.create("run", 1, 1, heartbeat_interval_ms=60000)
    join_one(addr, "run")
    job = jobs.show("run")
    assert job.state == "RUNNING" and job.world_size == 1
    (m,) = job.members
    assert (m.member_id, m.rank, m.host, m.step) == ("rank-a", 0, "h0", 17)
    assert (m.health, m.message, m.loss) == ("DEGRADED", "slow disk", 2.71828)
    assert job.step == 17


def test_watch_yields_the_log_in_order_and_stops_when_closed(daemons):
    jobs = Jobs(daemons["coordinator"].addr)
    jobs.create("w", 1, 4)
    jobs.pause("w")
    jobs.resume("w")
    with jobs.watch("w", idle_timeout=10) as watch:
        events = [next(watch) for _ in range(3)]
        assert [e.type for e in events] == ["CREATED", "PAUSED", "RESUMED"]
        assert [e.seq for e in events] == [1, 2, 3] and watch.last_seq == 3
        assert all(e.job == "w" for e in events)

        # A live event, then close() from another thread ends a blocked next().
        jobs.stop("w", force=True)
        assert next(watch).type == "STOPPED"
        closer = threading.Timer(0.3, watch.close)
        closer.start()
        started = time.monotonic()
        assert list(watch) == []
        assert time.monotonic() - started < 5
    # after_seq skips what was seen; idle_timeout ends a quiet watch.
    started = time.monotonic()
    rest = list(jobs.watch("w", after_seq=2, idle_timeout=0.5))
    assert [e.type for e in rest] == ["RESUMED", "STOPPED"]
    assert time.monotonic() - started < 5


def test_watch_ends_when_the_job_is_deleted(daemons):
    jobs = Jobs(daemons["coordinator"].addr)
    jobs.create("gone", 1, 1)
    watch = jobs.watch("gone", idle_timeout=10)  # (never hangs the suite)
    assert next(watch).type == "CREATED"
    threading.Timer(0.2, jobs.delete, ("gone", True)).start()
    assert [e.type for e in watch] == ["DELETED"]


def test_errors_carry_the_status(daemons):
    jobs = Jobs(daemons["coordinator"].addr)
    for call in (
        lambda: jobs.show("nope"),
        lambda: jobs.pause("nope"),
        lambda: jobs.delete("nope"),
        lambda: next(jobs.watch("nope")),
    ):
        with pytest.raises(StokerError) as e:
            call()
        assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value
    for call in (
        lambda: jobs.create("Bad/Name", 1, 1),
        lambda: jobs.show("Bad/Name"),
        lambda: jobs.create("ok", 3, 2),
        lambda: jobs.create("ok", -1, 2),  # Refused before sending.
        lambda: jobs.create("ok", 1, 1, labels={"k": 5}),  # type: ignore
    ):
        with pytest.raises(StokerError) as e:
            call()
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, e.value
    jobs.create("dup", 1, 1)
    with pytest.raises(StokerError) as e:
        jobs.create("dup", 1, 1)
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS


def test_no_address_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("STOKER_COORDINATOR", raising=False)
    with pytest.raises(StokerError) as e:
        Jobs().list()
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "STOKER_COORDINATOR" in e.value.details


def test_a_service_down_fails_within_the_timeout():
    with socket.socket() as s:  # A port nothing listens on.
        s.bind(("127.0.0.1", 0))
        addr = f"127.0.0.1:{s.getsockname()[1]}"
    jobs = Jobs(addr, addr, addr, timeout=1.5)
    for call in (
        jobs.list,
        lambda: jobs.create("x", 1, 1),
        lambda: jobs.loader("x"),
        lambda: jobs.checkpoints("x"),
        lambda: next(jobs.watch("x")),
    ):
        started = time.monotonic()
        with pytest.raises(StokerError) as e:
            call()
        assert e.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        assert time.monotonic() - started < 5


def test_a_hung_service_fails_within_the_timeout(daemons):
    d = daemons["coordinator"]
    jobs = Jobs(d.addr, timeout=1.0)
    jobs.create("h", 1, 1)
    assert d.proc is not None
    d.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(StokerError) as e:
            jobs.show("h")
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 4
        started = time.monotonic()
        assert list(jobs.watch("h", idle_timeout=1.0)) == []
        assert time.monotonic() - started < 4
    finally:
        d.proc.send_signal(signal.SIGCONT)
    assert jobs.show("h").name == "h"


def test_values_outside_the_enums_and_absent_messages_render_as_stokerctl():
    job = Job.from_proto(coord_pb.Job(state=99, members=[coord_pb.Member(health=7)]))
    assert (job.name, job.state, job.spec, job.latest_checkpoint) == ("", "UNKNOWN(99)", None, None)
    assert job.members[0].health == "UNKNOWN(7)"
    assert job.as_dict()["spec"] is None and job.as_dict()["latest_checkpoint"] is None
    event = JobEvent.from_proto(coord_pb.JobEvent(type=coord_pb.JOB_EVENT_ROUND_OPENED))
    assert event.type == "ROUND_OPENED"
    chunk = ChunkEntry.from_proto(ckpt_pb.ChunkEntry(dtype=ckpt_pb.DTYPE_U64))
    assert chunk.as_dict()["dtype"] == "U64"
    assert chunk.as_dict()["box"] == {"offsets": [], "sizes": []}
    loader = Loader.from_proto(dl_pb.LoaderInfo(committed_step=-1))
    assert loader.as_dict() == {"job": "", "committed_step": -1}


# ---- the same objects as stokerctl --json ---------------------------------------------


def test_job_and_job_list_equal_stokerctl(daemons):
    addr = daemons["coordinator"].addr
    jobs = Jobs(addr)
    jobs.create(
        "full",
        1,
        1,
        heartbeat_interval_ms=60000,
        last_call_ms=1500,
        labels={"team": "research", "run": "7"},
        dataset="file:///data/web",
        checkpoint_storage="file:///ckpt",
        checkpoint_every_steps=50,
    )
    join_one(addr, "full")
    jobs.create("idle", 2, 3, labels={"team": "infra"})
    jobs.scale("idle", 2)

    assert jobs.show("full").as_dict() == ctl("--coordinator", addr, "job", "show", "full")[0]
    assert jobs.show("idle").as_dict() == ctl("--coordinator", addr, "job", "show", "idle")[0]
    assert [j.as_dict() for j in jobs.list()] == ctl("--coordinator", addr, "jobs", "list")
    assert [j.as_dict() for j in jobs.list({"team": "infra"})] == ctl(
        "--coordinator", addr, "jobs", "list", "--label", "team=infra"
    )
    # The actions answer the job as stokerctl prints it after the same action.
    (paused,) = ctl("--coordinator", addr, "job", "pause", "idle")
    assert paused == jobs.show("idle").as_dict()
    assert jobs.resume("idle").as_dict() == ctl("--coordinator", addr, "job", "show", "idle")[0]


def test_events_equal_stokerctl(daemons):
    addr = daemons["coordinator"].addr
    jobs = Jobs(addr)
    jobs.create("ev", 1, 1, heartbeat_interval_ms=60000)
    join_one(addr, "ev")
    jobs.stop("ev", force=True)
    ours = [e.as_dict() for e in jobs.watch("ev", idle_timeout=0.5)]
    proc = subprocess.Popen(
        [str(binary("stokerctl")), "--json", "--coordinator", addr, "job", "watch", "ev"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    watchdog = threading.Timer(20, proc.kill)  # A short read fails; it never hangs.
    watchdog.start()
    try:
        theirs = [json.loads(proc.stdout.readline()) for _ in ours]
    finally:
        watchdog.cancel()
        proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=10) == 0
    assert [e["type"] for e in ours] == [
        "CREATED",
        "MEMBER_JOINED",
        "ROUND_CLOSED",
        "HEALTH",  # The heartbeat's DEGRADED.
        "STOPPED",
    ]
    assert ours == theirs


def test_loader_equals_stokerctl(daemons):
    addr = daemons["dataloader"].addr
    (created,) = ctl(
        "--dataloader",
        addr,
        "loader",
        "create",
        "ld",
        "--dataset",
        "web=synthetic:400:5:90:3:llmc@0.7",
        "--dataset",
        "code=synthetic:50:5:90:3@0.3",
        "--seq-len",
        "32",
        "--global-batch",
        "12",
        "--lanes",
        "4",
        "--seed",
        "7",
        "--bos",
        "4",
        "--eos",
        "5",
        "--max-doc-tokens",
        "64",
        "--block-tokens",
        "512",
    )
    jobs = Jobs(dataloader=addr)
    fresh = jobs.loader("ld")
    assert fresh.spec is not None
    # --block-tokens: the llm.c dataset's unit size, kept by the job.
    assert [d.block_tokens for d in fresh.spec.datasets] == [512, 0]
    assert fresh.as_dict() == created == ctl("--dataloader", addr, "loader", "show", "ld")[0]
    assert fresh.committed_step == -1 and (fresh.part, fresh.parts) == (0, 0)
    assert fresh.spec is not None and fresh.spec.seq_len == 32 and fresh.spec.add_eos
    assert [(d.name, d.format, d.weight) for d in fresh.spec.datasets] == [
        ("web", "llmc", 0.7),
        ("code", "", 0.3),
    ]
    ctl("--dataloader", addr, "loader", "commit", "ld", "3")
    committed = jobs.loader("ld")
    assert committed.committed_step == 3
    assert committed.as_dict() == ctl("--dataloader", addr, "loader", "show", "ld")[0]

    with pytest.raises(StokerError) as e:
        jobs.loader("nope")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_loader_list_and_delete_equal_stokerctl(daemons):
    addr = daemons["dataloader"].addr
    for job in ("la", "lb"):
        ctl(
            "--dataloader",
            addr,
            "loader",
            "create",
            job,
            "--dataset",
            "w=synthetic:40:5:90:3",
            "--seq-len",
            "16",
            "--global-batch",
            "4",
        )
    jobs = Jobs(dataloader=addr)
    listed = [ld.as_dict() for ld in jobs.loaders()]
    (theirs,) = ctl("--dataloader", addr, "loader", "list")
    assert [d["job"] for d in listed] == ["la", "lb"]
    assert listed == theirs
    jobs.delete_loader("la")
    assert [ld.job for ld in jobs.loaders()] == ["lb"]
    with pytest.raises(StokerError) as e:
        jobs.loader("la")
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(StokerError) as e:
        jobs.delete_loader("la")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_a_loader_that_failed_to_load_shows_as_stokerctl_shows_it():
    info = dl_pb.LoaderInfo(
        spec=dl_pb.LoaderSpec(job="gone"), committed_step=4, failed=True, failure="no dataset"
    )
    ld = Loader.from_proto(info)
    assert ld.failed and ld.failure == "no dataset"
    assert ld.as_dict() == {
        "job": "gone",
        "committed_step": 4,
        "failed": True,
        "failure": "no dataset",
    }


def test_a_scaled_out_loader_equals_stokerctl(tmp_path):
    for i in (0, 1):
        (tmp_path / f"p{i}").mkdir()
    parts = [Daemon("dataloader", tmp_path / f"p{i}", "--part", f"{i}/2") for i in (0, 1)]
    try:
        addrs = ",".join(d.addr for d in parts)
        ctl(
            "--dataloader",
            addrs,
            "loader",
            "create",
            "so",
            "--dataset",
            "web=synthetic:400:5:90:3:llmc",
            "--seq-len",
            "32",
            "--global-batch",
            "12",
            "--lanes",
            "4",
        )
        # Part 1 alone commits further: the combined view shows the older step.
        ctl("--dataloader", addrs, "loader", "commit", "so", "2")
        ctl("--dataloader", parts[1].addr, "loader", "commit", "so", "5")
        jobs = Jobs(dataloader=addrs)
        combined = jobs.loader("so")
        assert combined.committed_step == 2 and (combined.part, combined.parts) == (0, 2)
        assert [p.committed_step for p in jobs.loader_parts("so")] == [2, 5]
        assert [p.part for p in jobs.loader_parts("so")] == [0, 1]
        assert combined.as_dict() == ctl("--dataloader", addrs, "loader", "show", "so")[0]
        parts[1].kill()
        with pytest.raises(StokerError) as e:
            Jobs(dataloader=addrs, timeout=1.0).loader("so")
        assert "part 1 of 2" in e.value.details
    finally:
        for d in parts:
            d.stop()


def test_checkpoints_equal_stokerctl(daemons):
    coord = daemons["coordinator"].addr
    addr = daemons["checkpoint"].addr  # Reports its commits to the coordinator.
    jobs = Jobs(coord, checkpoint=addr)
    jobs.create("ck", 1, 1, heartbeat_interval_ms=60000)
    assert len(jobs.checkpoints("ck")) == 0
    assert (
        jobs.checkpoints("ck").as_dict() == ctl("--checkpoint", addr, "checkpoint", "list", "ck")[0]
    )
    save_checkpoint(addr, "ck", 10)
    save_checkpoint(addr, "ck", 20)

    listed = jobs.checkpoints("ck")
    assert sorted(c.step for c in listed) == [10, 20]
    assert listed.latest is not None and listed.latest.step == 20
    assert listed.as_dict() == ctl("--checkpoint", addr, "checkpoint", "list", "ck")[0]

    m = jobs.checkpoint("ck", 20)
    assert m.as_dict() == ctl("--checkpoint", addr, "checkpoint", "show", "ck", "20")[0]
    tensors = m.tensors()
    assert (tensors["model.w"].dtype, tensors["model.w"].global_shape) == ("F32", (4, 3))
    assert (tensors["model.b"].dtype, tensors["model.b"].nbytes) == ("BF16", 10)
    assert tensors["mask"].dtype == "BOOL"
    assert tensors["model.w"].chunks[0].box.sizes == (4, 3)
    assert m.world == 1 and m.nbytes == sum(o.size for o in m.objects) > 0

    report = jobs.verify("ck", 20)
    assert report.ok and report.objects == len(m.objects) and report.bytes == m.nbytes
    assert report.as_dict() == ctl("--checkpoint", addr, "checkpoint", "verify", "ck", "20")[0]

    # The coordinator recorded the newest commit as the job's latest.
    job = jobs.show("ck")
    assert job.latest_checkpoint is not None and job.latest_checkpoint.step == 20
    assert job.as_dict() == ctl("--coordinator", coord, "job", "show", "ck")[0]

    with pytest.raises(StokerError) as e:
        jobs.checkpoint("ck", 15)
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_abort_checkpoint_ends_an_open_attempt(daemons):
    addr = daemons["checkpoint"].addr
    jobs = Jobs(checkpoint=addr)
    conn = Connection(addr)
    begun = conn.unary(
        "/stoker.v1.Checkpoint/Begin",
        ckpt_pb.BeginRequest(job="ab", step=5, world=1),
        ckpt_pb.BeginResponse,
    )
    jobs.abort_checkpoint(begun.attempt, reason="operator said so")
    jobs.abort_checkpoint(begun.attempt)  # Already aborted: fine.
    with pytest.raises(StokerError) as e:
        conn.unary(
            "/stoker.v1.Checkpoint/Commit",
            ckpt_pb.CommitCheckpointRequest(attempt=begun.attempt),
            common_pb2.CheckpointRef,
        )
    assert e.value.code in (grpc.StatusCode.ABORTED, grpc.StatusCode.FAILED_PRECONDITION)
    assert len(jobs.checkpoints("ab")) == 0
    with pytest.raises(StokerError) as e:
        jobs.abort_checkpoint("0123456789abcdef0123456789abcdef")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_create_loader_from_python_equals_stokerctl_and_serves(daemons, tmp_path):
    """Jobs.create_loader (issue 26, part 6): a job created from Python is
    the job stokerctl creates from the same flags, and StokerDataset reads it;
    the data-root rule and bad values answer as documented."""
    addr = daemons["dataloader"].addr  # its --data-root is tmp_path
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"paragraph {i} of a small corpus.\n\n" for i in range(6000)))
    jobs = Jobs(dataloader=addr)
    made = jobs.create_loader(
        "py",
        [
            DatasetSpec("t", f"file://{corpus}", "text", 0.75, tokenizer="bytes"),
            DatasetSpec("s", "synthetic:80:5:90:3", weight=0.25),
        ],
        seq_len=16,
        global_batch=4,
        seed=3,
        lanes=2,
        eos_id=10,
    )
    ctl(
        "--dataloader",
        addr,
        "loader",
        "create",
        "cli",
        "--dataset",
        f"t=file://{corpus}:text@0.75",
        "--dataset",
        "s=synthetic:80:5:90:3@0.25",
        "--seq-len",
        "16",
        "--global-batch",
        "4",
        "--seed",
        "3",
        "--lanes",
        "2",
        "--eos",
        "10",
    )
    (theirs,) = ctl("--dataloader", addr, "loader", "show", "cli")
    ours = made.as_dict()
    assert ours == jobs.loader("py").as_dict()
    # stokerctl's --dataset has no tokenizer (the text reader's default is bytes).
    for d in (*ours["datasets"], *theirs["datasets"]):
        d.pop("tokenizer")
    assert {**ours, "job": "cli"} == theirs
    assert made.spec is not None and made.spec.lanes == 2 and made.spec.add_eos

    batches = [
        b for b in StokerDataset("py", address=addr, steps=2, rank=0, world_size=1, timeout=20)
    ]
    same = StokerDataset("cli", address=addr, steps=2, rank=0, world_size=1, timeout=20)
    for (x, y), (cx, cy) in zip(batches, same, strict=True):
        assert x.shape == (4, 16) and torch.equal(x, cx) and torch.equal(y, cy)

    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("not under the data root\n\n" * 50)
    try:
        with pytest.raises(StokerError) as e:
            jobs.create_loader("out", [DatasetSpec("o", str(outside), "text")], 16, 4)
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED, e.value
    finally:
        outside.unlink()
    with pytest.raises(StokerError) as e:
        jobs.create_loader("bad", [DatasetSpec("t", str(corpus), "jsonl")], 16, 4)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "jsonl" in e.value.details
    with pytest.raises(StokerError) as e:
        jobs.create_loader("py", [DatasetSpec("t", str(corpus), "text")], 16, 4)
    assert e.value.code == grpc.StatusCode.ALREADY_EXISTS, e.value
    kept = jobs.create_loader("py", [DatasetSpec("t", str(corpus), "text")], 16, 4, exist_ok=True)
    assert kept.spec == made.spec  # the existing job, as it was (lanes 2, two datasets)
    assert sorted(ld.job for ld in jobs.loaders()) == ["cli", "py"]

"""StokerStore against the real coordinator: the torch.distributed.Store
semantics (set, get, add, compare_set, wait with timeouts, delete_key,
num_keys, check), fencing by generation, and a 3-process gloo all_reduce
whose process group was built over it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from datetime import timedelta

import grpc
import pytest
import torch.distributed as dist
from conftest import HERE

from stoker import StokerError
from stoker.membership import Member, Progress
from stoker.rendezvous import ensure_job
from stoker.store import StokerStore, coordinator_key
from stoker.v1 import coordinator_pb2 as coord_pb


def joined_store(addr: str, job: str = "st") -> StokerStore:
    ensure_job(Member(job, addr).conn, job, 1, 1, {"last_call_ms": 100})
    m = Member(job, addr).join(timeout=30)
    return StokerStore(job, m.generation, addr, timeout=timedelta(seconds=5))


def test_the_rendezvous_job_names_its_storage(daemons):
    addr = daemons["coordinator"].addr
    conf = {"dataset": "file:///data/corpus", "checkpoint_storage": "s3://ckpt/demo"}
    conn = Member("rs", addr).conn
    ensure_job(conn, "rs", 1, 2, conf)
    job = conn.unary(
        "/stoker.v1.Coordinator/GetJob", coord_pb.GetJobRequest(job="rs"), coord_pb.Job
    )
    assert job.spec.dataset.uri == "file:///data/corpus"
    assert job.spec.checkpoint_storage.uri == "s3://ckpt/demo"
    ensure_job(conn, "rs", 1, 2, {"dataset": "file:///elsewhere"})  # exists: kept
    job = conn.unary(
        "/stoker.v1.Coordinator/GetJob", coord_pb.GetJobRequest(job="rs"), coord_pb.Job
    )
    assert job.spec.dataset.uri == "file:///data/corpus"


def test_store_semantics(daemons):
    s = joined_store(daemons["coordinator"].addr)
    assert s.num_keys() == 0
    s.set("a", "x")
    s.set("b", b"\x00\xffbin")
    assert s.get("a") == b"x" and s.get("b") == b"\x00\xffbin"
    assert s.add("ctr", 3) == 3 and s.add("ctr", -1) == 2 and s.get("ctr") == b"2"
    assert s.compare_set("c", "", "first") == b"first"
    assert s.compare_set("c", "wrong", "second") == b"first"
    assert s.compare_set("c", "first", "second") == b"second"
    assert s.compare_set("absent", "exp", "des") == b"exp"
    assert s.check(["a", "b"]) and not s.check(["a", "absent"])
    assert s.num_keys() == 4
    assert s.delete_key("a") and not s.delete_key("a")
    assert s.num_keys() == 3
    # Keys outside the coordinator's alphabet still work.
    s.set("weird key|with space", "v")
    assert s.get("weird key|with space") == b"v"
    assert coordinator_key("weird key|with space").startswith("sha256:")
    with pytest.raises(StokerError) as e:
        s.add("b", 1)  # not a decimal counter
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_get_and_wait_park_until_set_and_time_out(daemons):
    s = joined_store(daemons["coordinator"].addr)
    threading.Timer(0.3, lambda: s.set("later", "v")).start()
    t0 = time.monotonic()
    assert s.get("later") == b"v"
    assert 0.2 < time.monotonic() - t0 < 4
    s.wait(["later"])
    t0 = time.monotonic()
    with pytest.raises(dist.DistStoreError):
        s.wait(["never"], timedelta(seconds=0.5))
    assert time.monotonic() - t0 < 3
    s.set_timeout(timedelta(seconds=0.3))
    with pytest.raises(StokerError) as e:
        s.get("never")
    assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_a_stale_generation_is_fenced(daemons):
    addr = daemons["coordinator"].addr
    s = joined_store(addr)
    stale = StokerStore("st", s.generation + 1, addr)
    with pytest.raises(StokerError) as e:
        stale.set("k", "v")
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(StokerError) as e:
        StokerStore("nojob", 1, addr).set("k", "v")
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_three_process_gloo_all_reduce_over_the_store(daemons):
    addr = daemons["coordinator"].addr
    ensure_job(Member("ar", addr).conn, "ar", 3, 3, {"last_call_ms": 100})
    members = [Member("ar", addr) for _ in range(3)]
    ships: list = [None] * 3
    threads = [
        threading.Thread(target=lambda i=i: ships.__setitem__(i, members[i].join(30)))
        for i in range(3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert {m.world_size for m in ships} == {3} and sorted(m.rank for m in ships) == [0, 1, 2]
    gen = ships[0].generation
    # The members heartbeat while the ranks start (importing torch can take
    # longer than the lease on a loaded host, which would end the generation).
    for m in members:
        m.start_heartbeats(Progress, lambda action, reason: None)
    procs = [
        subprocess.Popen(
            [sys.executable, str(HERE / "store_rank.py"), addr, "ar", str(gen), str(r), "3"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(3)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for m in members:
        m.stop_heartbeats()
    for r, p in enumerate(procs):
        assert p.returncode == 0, outs[r][-2000:]
        assert "sum=6" in outs[r], outs[r]

"""Every listing answers in pages (services/common/page.h, AIP-158) and the
clients follow them: 200 coordinator jobs of 64 labels with 256-byte values
(about 4.2 MiB, more than a client's default 4 MiB message) list whole
through stoker.jobs and ``stokerctl jobs list``, each exactly once by name,
while one raw ListJobs page stops below the byte bound with a token; 230
dataloader jobs list whole past the default page of 100; a token the
service did not give is INVALID_ARGUMENT. A job's members come in pages too
(GetJob's first, then ListMembers): with a coordinator that answers 7 members
a message, the 50 members of a job show whole, each once, through
``Jobs.show``/``Jobs.list`` and ``stokerctl job show``/``jobs list`` (text
and --json, the C client's stk_job_get and stk_job_list)."""

from __future__ import annotations

import json
import pathlib
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from conftest import Daemon, binary

from stoker import Jobs, StokerError
from stoker.connection import Connection
from stoker.v1 import coordinator_pb2 as coord_pb
from stoker.v1 import dataloader_pb2 as dl_pb

COORDINATOR = "/stoker.v1.Coordinator/"
DATALOADER = "/stoker.v1.Dataloader/"


def ctl(*args: str) -> list[dict[str, Any]]:
    """Runs ``stokerctl --json ARGS``; its objects, one per output line."""
    out = subprocess.run(
        [str(binary("stokerctl")), "--json", *args], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_fat_jobs_list_whole_in_pages(daemons):
    addr = daemons["coordinator"].addr
    jobs = Jobs(addr)
    labels = {f"label-{i:02d}": "v" * 256 for i in range(64)}
    names = [f"fat-{i:03d}" for i in range(200)]
    for name in reversed(names):
        jobs.create(name, 1, 1, labels=labels)

    assert [j.name for j in jobs.list()] == names
    assert [d["name"] for d in ctl("--coordinator", addr, "jobs", "list")] == names

    conn = Connection(addr)
    first = conn.unary(
        COORDINATOR + "ListJobs",
        coord_pb.ListJobsRequest(page_size=1000),
        coord_pb.ListJobsResponse,
    )
    assert 1 <= len(first.jobs) < 200 and first.next_page_token
    assert first.ByteSize() < 4 << 20
    with pytest.raises(StokerError) as e:
        conn.unary(
            COORDINATOR + "ListJobs",
            coord_pb.ListJobsRequest(page_token="fat-010"),
            coord_pb.ListJobsResponse,
        )
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "page_token" in e.value.details


def test_many_loaders_list_whole_in_pages(daemons):
    addr = daemons["dataloader"].addr
    conn = Connection(addr)
    names = [f"ld-{i:03d}" for i in range(230)]
    for name in reversed(names):
        spec = dl_pb.LoaderSpec(
            job=name,
            seq_len=8,
            global_batch=4,
            lanes=2,
            logical_shards=4,
            datasets=[dl_pb.DatasetSpec(name="w", weight=1.0)],
        )
        spec.datasets[0].source.uri = "synthetic:40:5:90:3"
        conn.unary(
            DATALOADER + "CreateLoader", dl_pb.CreateLoaderRequest(spec=spec), dl_pb.LoaderInfo
        )
    first = conn.unary(
        DATALOADER + "ListLoaders", dl_pb.ListLoadersRequest(), dl_pb.ListLoadersResponse
    )
    assert len(first.loaders) == 100 and first.next_page_token
    assert [ld.job for ld in Jobs(dataloader=addr).loaders()] == names
    (listed,) = ctl("--dataloader", addr, "loader", "list")
    assert [d["job"] for d in listed] == names


def test_fat_loaders_list_whole_in_pages(daemons):
    """100 loaders of 256 datasets with 128-character names (about 45 KiB
    each, 4.5 MiB in all: one reply would pass the client's 4 MiB)."""
    addr = daemons["dataloader"].addr
    conn = Connection(addr)
    names = [f"fat-{i:03d}" for i in range(100)]
    for name in names:
        spec = dl_pb.LoaderSpec(job=name, seq_len=8, global_batch=4, lanes=2, logical_shards=4)
        for d in range(256):
            ds = spec.datasets.add(name=f"ds{d:05d}-" + "x" * 120, weight=1.0)
            ds.source.uri = "synthetic:16:8:16:7"
        conn.unary(
            DATALOADER + "CreateLoader", dl_pb.CreateLoaderRequest(spec=spec), dl_pb.LoaderInfo
        )
    first = conn.unary(
        DATALOADER + "ListLoaders",
        dl_pb.ListLoadersRequest(page_size=1000),
        dl_pb.ListLoadersResponse,
    )
    assert 1 <= len(first.loaders) < 100 and first.next_page_token
    assert [ld.job for ld in Jobs(dataloader=addr).loaders()] == names


def test_members_show_whole_in_pages(tmp_path: pathlib.Path) -> None:
    coord = Daemon("coordinator", tmp_path, "--members-per-page", "7")
    try:
        addr = coord.addr
        jobs = Jobs(addr)
        n = 50
        # Long leases: no member heartbeats in this test.
        jobs.create("wide", n, n, heartbeat_interval_ms=600000)
        conn = Connection(addr)

        def join(i: int) -> Any:
            req = coord_pb.JoinRequest(
                job="wide", member_id=f"m{i}", address=f"10.0.0.{i}:29500", host=f"node-{i}"
            )
            return conn.unary(COORDINATOR + "Join", req, coord_pb.JoinResponse, timeout=60)

        with ThreadPoolExecutor(n) as ex:
            ranks = sorted(r.rank for r in ex.map(join, range(n)))
        assert ranks == list(range(n))
        everyone = {f"m{i}" for i in range(n)}

        raw = conn.unary(COORDINATOR + "GetJob", coord_pb.GetJobRequest(job="wide"), coord_pb.Job)
        assert [m.rank for m in raw.members] == list(range(7))  # what an older client sees
        assert raw.member_count == n and raw.next_members_page_token
        assert raw.world_size == n  # how a client without the new fields learns more exist

        job = jobs.show("wide")
        assert [m.rank for m in job.members] == list(range(n))
        assert {m.member_id for m in job.members} == everyone
        assert job.next_members_page_token == "" and job.member_count == n
        (listed,) = jobs.list()
        assert [m.rank for m in listed.members] == list(range(n))

        shown = ctl("--coordinator", addr, "job", "show", "wide")[0]
        assert [m["rank"] for m in shown["members"]] == list(range(n))
        assert {m["member_id"] for m in shown["members"]} == everyone
        assert shown["next_members_page_token"] == "" and shown["member_count"] == n
        assert ctl("--coordinator", addr, "jobs", "list")[0]["members"] == shown["members"]

        text = subprocess.run(
            [str(binary("stokerctl")), "--coordinator", addr, "job", "show", "wide"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert text.returncode == 0, text.stderr
        assert f"Members ({n}):" in text.stdout
        rows = [line.split() for line in text.stdout.splitlines() if " node-" in line]
        assert [int(r[0]) for r in rows] == list(range(n))  # each member's row once
        assert {r[1] for r in rows} == everyone

        with pytest.raises(StokerError) as e:
            conn.unary(
                COORDINATOR + "ListMembers",
                coord_pb.ListMembersRequest(job="wide", page_token="p1.6d2e31"),
                coord_pb.ListMembersResponse,
            )
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        coord.stop()

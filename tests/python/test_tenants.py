"""Scoped tokens (issue 25, item 2) at the three real daemons: one token file
holds an operator's token and one token per team, each limited to the job
names with its prefix. A team reaches only its own jobs, loaders, attempts
and checkpoints: anything else answers PERMISSION_DENIED naming the rule and
changes nothing; listings hold only the caller's jobs; a method that names no
job is for operators unless its handler checks the scope; SIGHUP re-reads
the table."""

from __future__ import annotations

import json
import pathlib
import signal
import socket
import statistics
import subprocess
import threading
import time
import urllib.request
from typing import Any

import grpc
import pytest
from conftest import Daemon, binary

from stoker import Jobs, Security, StokerError
from stoker.v1 import checkpoint_pb2 as ck
from stoker.v1 import common_pb2
from stoker.v1 import coordinator_pb2 as co
from stoker.v1 import dataloader_pb2 as dl

TOKENS = """# one line a token, then its scope
op-token
a-token team-a-*
b-token   team-b-*   # trailing comments are fine
"""


def start(name: str, tmp_path: pathlib.Path, text: str = TOKENS) -> Daemon:
    tokens = tmp_path / f"{name}-tokens"
    tokens.write_text(text)
    return Daemon(name, tmp_path, "--token-file", str(tokens))


def caller(addr: str, token: str) -> Any:
    """call(service, method, request, reply type) with token; returns the
    reply or the grpc.RpcError."""
    channel = grpc.insecure_channel(addr)

    def call(service: str, method: str, req: Any, reply: Any) -> Any:
        stub = channel.unary_unary(
            f"/stoker.v1.{service}/{method}",
            request_serializer=type(req).SerializeToString,
            response_deserializer=reply.FromString,
        )
        try:
            return stub(req, metadata=[("authorization", f"Bearer {token}")], timeout=20)
        except grpc.RpcError as e:
            return e

    call.channel = channel  # type: ignore[attr-defined]
    return call


def denied(answer: Any, scope: str) -> None:
    assert isinstance(answer, grpc.RpcError), answer
    assert answer.code() == grpc.StatusCode.PERMISSION_DENIED, answer
    assert f"'{scope}'" in answer.details(), answer.details()


def job_spec(name: str) -> co.JobSpec:
    return co.JobSpec(name=name, min_ranks=1, max_ranks=2)


def test_coordinator_confines_each_team_to_its_jobs(tmp_path):
    d = start("coordinator", tmp_path)
    try:
        op, a, b = (caller(d.addr, t) for t in ("op-token", "a-token", "b-token"))
        for who, name in ((a, "team-a-1"), (b, "team-b-1"), (op, "ops-1")):
            got = who("Coordinator", "CreateJob", co.CreateJobRequest(spec=job_spec(name)), co.Job)
            assert not isinstance(got, grpc.RpcError), got
        denied(
            a("Coordinator", "CreateJob", co.CreateJobRequest(spec=job_spec("team-b-2")), co.Job),
            "team-a-*",
        )
        for method, req, reply in (
            ("GetJob", co.GetJobRequest(job="team-b-1"), co.Job),
            ("StopJob", co.JobActionRequest(job="team-b-1"), co.Job),
            ("DeleteJob", co.JobActionRequest(job="team-b-1"), common_pb2.Empty),
            ("KvSet", co.KvSetRequest(job="team-b-1", key="k", value=b"v"), common_pb2.Empty),
        ):
            denied(a("Coordinator", method, req, reply), "team-a-*")
        job = op("Coordinator", "GetJob", co.GetJobRequest(job="team-b-1"), co.Job)
        assert job.state != co.JOB_STATE_STOPPED, job  # nothing changed
        names = {
            who: sorted(
                j.spec.name
                for j in who(
                    "Coordinator", "ListJobs", co.ListJobsRequest(), co.ListJobsResponse
                ).jobs
            )
            for who in (op, a, b)
        }
        assert names[a] == ["team-a-1"] and names[b] == ["team-b-1"], names
        assert names[op] == ["ops-1", "team-a-1", "team-b-1"], names

        # SIGHUP: team A's token now covers team-x-* only.
        (tmp_path / "coordinator-tokens").write_text(TOKENS.replace("team-a-*", "team-x-*"))
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        until = time.monotonic() + 10
        while time.monotonic() < until:
            got = a("Coordinator", "GetJob", co.GetJobRequest(job="team-a-1"), co.Job)
            if isinstance(got, grpc.RpcError):
                break
            time.sleep(0.05)
        denied(got, "team-x-*")
    finally:
        d.stop()


def test_a_bad_token_table_is_refused_with_its_line(tmp_path):
    bad = tmp_path / "bad-tokens"
    bad.write_text("op-token\na-token team a\n")
    with pytest.raises(Exception):  # noqa: B017 (the daemon does not start)
        Daemon("coordinator", tmp_path, "--token-file", str(bad))
    log = (tmp_path / "coordinator.log").read_text()
    assert "line 2" in log, log


def loader_spec(root: pathlib.Path, job: str) -> dl.LoaderSpec:
    text = root / "corpus.txt"
    if not text.exists():
        text.write_text("some words for a loader\n" * 200)
    ds = dl.DatasetSpec(
        name="d",
        weight=1.0,
        format=dl.DATASET_FORMAT_TEXT,
        tokenizer="bytes",
        source=common_pb2.StorageRef(uri=f"file://{text}"),
    )
    return dl.LoaderSpec(job=job, seq_len=8, global_batch=2, lanes=1, datasets=[ds])


def test_dataloader_confines_each_team_to_its_loaders(tmp_path):
    d = start("dataloader", tmp_path)
    try:
        op, a, b = (caller(d.addr, t) for t in ("op-token", "a-token", "b-token"))
        for who, job in ((a, "team-a-l"), (b, "team-b-l")):
            got = who(
                "Dataloader",
                "CreateLoader",
                dl.CreateLoaderRequest(spec=loader_spec(tmp_path, job)),
                dl.LoaderInfo,
            )
            assert not isinstance(got, grpc.RpcError), got
        denied(
            a(
                "Dataloader",
                "CreateLoader",
                dl.CreateLoaderRequest(spec=loader_spec(tmp_path, "team-b-2")),
                dl.LoaderInfo,
            ),
            "team-a-*",
        )
        denied(
            a(
                "Dataloader",
                "DeleteLoader",
                dl.DeleteLoaderRequest(job="team-b-l"),
                common_pb2.Empty,
            ),
            "team-a-*",
        )
        denied(
            a("Dataloader", "GetBatch", dl.GetBatchRequest(job="team-b-l", step=0), dl.Batch),
            "team-a-*",
        )
        listed = {
            who: sorted(
                x.spec.job
                for x in who(
                    "Dataloader", "ListLoaders", dl.ListLoadersRequest(), dl.ListLoadersResponse
                ).loaders
            )
            for who in (op, a, b)
        }
        assert listed[a] == ["team-a-l"] and listed[b] == ["team-b-l"], listed
        assert listed[op] == ["team-a-l", "team-b-l"], listed
    finally:
        d.stop()


def chunk(attempt: str, data: bytes = b"abcd") -> ck.WriteChunk:
    return ck.WriteChunk(
        attempt=attempt,
        rank=0,
        tensor="w",
        dtype=ck.DTYPE_U8,
        global_shape=[len(data)],
        box=ck.Box(offsets=[0], sizes=[len(data)]),
        data=data,
        last=True,
    )


def write(call: Any, token: str, attempt: str) -> Any:
    stub = call.channel.stream_unary(
        "/stoker.v1.Checkpoint/Write",
        request_serializer=ck.WriteChunk.SerializeToString,
        response_deserializer=ck.WriteResponse.FromString,
    )
    try:
        return stub(
            iter([chunk(attempt)]), metadata=[("authorization", f"Bearer {token}")], timeout=20
        )
    except grpc.RpcError as e:
        return e


def test_checkpoint_service_confines_each_team_to_its_attempts(tmp_path):
    d = start("checkpoint", tmp_path)
    try:
        op, a, b = (caller(d.addr, t) for t in ("op-token", "a-token", "b-token"))
        begun = b(
            "Checkpoint",
            "Begin",
            ck.BeginRequest(job="team-b-ck", step=1, world=1),
            ck.BeginResponse,
        )
        assert not isinstance(begun, grpc.RpcError), begun
        attempt = begun.attempt
        denied(
            a(
                "Checkpoint",
                "Begin",
                ck.BeginRequest(job="team-b-ck", step=2, world=1),
                ck.BeginResponse,
            ),
            "team-a-*",
        )
        denied(write(a, "a-token", attempt), "team-a-*")
        denied(
            a("Checkpoint", "Abort", ck.AbortCheckpointRequest(attempt=attempt), common_pb2.Empty),
            "team-a-*",
        )
        denied(
            a(
                "Checkpoint",
                "Commit",
                ck.CommitCheckpointRequest(attempt=attempt),
                common_pb2.CheckpointRef,
            ),
            "team-a-*",
        )
        # Team B's attempt was not touched: it takes its data and commits.
        assert not isinstance(write(b, "b-token", attempt), grpc.RpcError)
        ref = b(
            "Checkpoint",
            "Commit",
            ck.CommitCheckpointRequest(attempt=attempt),
            common_pb2.CheckpointRef,
        )
        assert not isinstance(ref, grpc.RpcError), ref
        denied(
            a(
                "Checkpoint",
                "List",
                ck.ListCheckpointsRequest(job="team-b-ck"),
                ck.ListCheckpointsResponse,
            ),
            "team-a-*",
        )
        steps = b(
            "Checkpoint",
            "List",
            ck.ListCheckpointsRequest(job="team-b-ck"),
            ck.ListCheckpointsResponse,
        )
        assert [c.step for c in steps.checkpoints] == [1], steps
        info = a("Checkpoint", "GetStagingInfo", ck.StagingInfoRequest(), ck.StagingInfo)
        assert not isinstance(info, grpc.RpcError), info  # names no job: any token
        assert not isinstance(
            op(
                "Checkpoint",
                "List",
                ck.ListCheckpointsRequest(job="team-b-ck"),
                ck.ListCheckpointsResponse,
            ),
            grpc.RpcError,
        )
    finally:
        d.stop()


def test_a_scope_refusal_reaches_the_user_whole(tmp_path):
    """The service's PERMISSION_DENIED message, naming the caller's scope and
    the rule, reaches a user of the stoker package (StokerError's text) and
    of stokerctl (its error line, exit 5) unchanged (issue 26, part 6)."""
    d = start("coordinator", tmp_path)
    try:
        op = Jobs(d.addr, security=Security(token="op-token"))
        op.create("team-b-1", 1, 2)
        team_a = Jobs(d.addr, security=Security(token="a-token"))
        rule = (
            "this token covers only jobs named 'team-a-*' (its scope in the server's token "
            "file); job 'team-b-1' is outside it"
        )
        with pytest.raises(StokerError) as e:
            team_a.show("team-b-1")
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert e.value.details == rule, e.value.details
        assert str(e.value) == f"/stoker.v1.Coordinator/GetJob: PERMISSION_DENIED: {rule}"
        token = tmp_path / "a-token"
        token.write_text("a-token\n")
        ctl = [str(binary("stokerctl")), "--coordinator", d.addr, "--token-file", str(token)]
        out = subprocess.run(
            [*ctl, "job", "show", "team-b-1"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 5, out
        assert out.stderr == f"stokerctl: job show: {rule} (PERMISSION_DENIED)\n", out.stderr
    finally:
        d.stop()


def long_line_spec(job: str, seq_len: int) -> dl.LoaderSpec:
    ds = dl.DatasetSpec(
        name="s",
        weight=1.0,
        format=dl.DATASET_FORMAT_LLMC,
        source=common_pb2.StorageRef(uri="synthetic:100000:500:4000:3"),
    )
    return dl.LoaderSpec(
        job=job, seq_len=seq_len, global_batch=1, lanes=1, logical_shards=1, datasets=[ds]
    )


def greedy_beside_small(
    tmp_path: pathlib.Path, slice_tokens: int
) -> tuple[list[float], list[float], float]:
    """Team A's 4 jobs each ask 32,000 lines of 32,768 tokens ahead (1G
    tokens, just within --max-replay-tokens), again and again, on a
    dataloader of 2 workers, while team B's small job asks its next batch.
    Returns the latencies of A's calls and of B's (seconds), and the replay
    slices the daemon reports as yielded."""
    tokens = tmp_path / "dataloader-tokens"
    tokens.write_text(TOKENS)
    metrics = f"127.0.0.1:{free_port()}"
    d = Daemon(
        "dataloader",
        tmp_path,
        "--token-file",
        str(tokens),
        "--worker-threads",
        "2",
        "--replay-slice-tokens",
        str(slice_tokens),
        "--metrics-listen",
        metrics,
    )
    try:
        a, b = caller(d.addr, "a-token"), caller(d.addr, "b-token")
        jobs = [f"team-a-{i}" for i in range(4)]
        for job in jobs:
            got = a(
                "Dataloader",
                "CreateLoader",
                dl.CreateLoaderRequest(spec=long_line_spec(job, 32767)),
                dl.LoaderInfo,
            )
            assert not isinstance(got, grpc.RpcError), got
        got = b(
            "Dataloader",
            "CreateLoader",
            dl.CreateLoaderRequest(spec=loader_spec(tmp_path, "team-b-small")),
            dl.LoaderInfo,
        )
        assert not isinstance(got, grpc.RpcError), got
        a_seconds: list[float] = []
        stop = threading.Event()

        def greedy(job: str) -> None:
            step = 0
            while not stop.is_set():
                step += 32000
                t0 = time.monotonic()
                got = a(
                    "Dataloader",
                    "GetBatch",
                    dl.GetBatchRequest(job=job, step=step, world=1),
                    dl.Batch,
                )
                assert not isinstance(got, grpc.RpcError), got
                a_seconds.append(time.monotonic() - t0)

        threads = [threading.Thread(target=greedy, args=(job,)) for job in jobs]
        for t in threads:
            t.start()
        b_seconds: list[float] = []
        try:
            while len(a_seconds) < 2:  # A holds every worker
                time.sleep(0.05)
            for step in range(40):
                t0 = time.monotonic()
                got = b(
                    "Dataloader",
                    "GetBatch",
                    dl.GetBatchRequest(job="team-b-small", step=step, world=1),
                    dl.Batch,
                )
                assert not isinstance(got, grpc.RpcError), got
                b_seconds.append(time.monotonic() - t0)
                time.sleep(0.02)  # B's trainer computes between batches
        finally:
            stop.set()
            for t in threads:
                t.join()
        yields = scrape(metrics, "stoker_dataloader_replay_slices_yielded_total")
        return a_seconds, b_seconds, yields["stoker_dataloader_replay_slices_yielded_total"]
    finally:
        d.stop()


def test_a_long_replay_gives_its_worker_back_between_slices(tmp_path):
    """Issue 25, item 8: A's far-ahead calls each replay 1G tokens (about a
    second of a worker); without slices B's call waits for one of them to
    end. With slices of 4M tokens, B waits at most about a slice: every B
    call ends within a quarter of A's median call, however loaded the
    machine (both scale with it)."""
    a_seconds, b_seconds, yields = greedy_beside_small(tmp_path, 1 << 22)
    print(
        f"A: {len(a_seconds)} calls, median {statistics.median(a_seconds):.3f} s; "
        f"B: {len(b_seconds)} calls, median {statistics.median(b_seconds):.4f} s, "
        f"max {max(b_seconds):.4f} s"
    )
    assert len(b_seconds) == 40
    assert max(b_seconds) < statistics.median(a_seconds) / 4, (a_seconds, b_seconds)
    # Each of A's calls gave its worker back after every 4M of its 1G tokens.
    assert yields >= len(a_seconds) * 240, (yields, len(a_seconds))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(addr: str, prefix: str = "stoker_budget_") -> dict[str, float]:
    """The samples of a daemon's /metrics whose series start with prefix."""
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix)
    }


def test_budget_usage_per_tenant_on_metrics_and_get_usage(tmp_path):
    """Issue 25 (closing paragraph): the coordinator's key-value budget per
    tenant and job against its limits, on /metrics (every tenant) and
    through GetUsage (the caller's jobs only), with the values the budget
    itself enforces: each entry costs key + value + 64 bytes, and the set
    that would pass the per-job limit is refused."""
    tokens = tmp_path / "coordinator-tokens"
    tokens.write_text(TOKENS)
    metrics = f"127.0.0.1:{free_port()}"
    d = Daemon(
        "coordinator",
        tmp_path,
        "--token-file",
        str(tokens),
        "--metrics-listen",
        metrics,
        "--kv-bytes-per-job",
        "64KiB",
        "--kv-bytes",
        "1MiB",
    )
    try:
        op, a, b = (caller(d.addr, t) for t in ("op-token", "a-token", "b-token"))
        for who, name in ((a, "team-a-1"), (b, "team-b-1")):
            got = who("Coordinator", "CreateJob", co.CreateJobRequest(spec=job_spec(name)), co.Job)
            assert not isinstance(got, grpc.RpcError), got
        value = b"x" * 20000
        for i in range(3):
            got = a(
                "Coordinator",
                "KvSet",
                co.KvSetRequest(job="team-a-1", generation=1, key=f"k{i}", value=value),
                common_pb2.Empty,
            )
            assert not isinstance(got, grpc.RpcError), got
        a_used = 3 * (2 + 20000 + 64)
        refused = a(
            "Coordinator",
            "KvSet",
            co.KvSetRequest(job="team-a-1", generation=1, key="k3", value=value),
            common_pb2.Empty,
        )
        assert isinstance(refused, grpc.RpcError), refused
        assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, refused
        got = b(
            "Coordinator",
            "KvSet",
            co.KvSetRequest(job="team-b-1", generation=1, key="only", value=b"y" * 5000),
            common_pb2.Empty,
        )
        assert not isinstance(got, grpc.RpcError), got
        b_used = 4 + 5000 + 64

        m = scrape(metrics)
        assert m['stoker_budget_limit_bytes{budget="kv",per="job"}'] == 64 * 1024, m
        assert m['stoker_budget_limit_bytes{budget="kv",per="all"}'] == 1024 * 1024, m
        assert m['stoker_budget_used_bytes{budget="kv"}'] == a_used + b_used, m
        key = 'stoker_budget_job_used_bytes{budget="kv",tenant="team-a-*",job="team-a-1"}'
        assert m[key] == a_used, m
        assert m['stoker_budget_tenant_used_bytes{budget="kv",tenant="team-a-*"}'] == a_used, m
        assert m['stoker_budget_tenant_used_bytes{budget="kv",tenant="team-b-*"}'] == b_used, m

        def usage(who: Any) -> dict[str, tuple[str, int]]:
            report = who("Usage", "GetUsage", common_pb2.GetUsageRequest(), common_pb2.UsageReport)
            assert not isinstance(report, grpc.RpcError), report
            (kv,) = report.budgets
            assert (kv.budget, kv.limit_per_job_bytes, kv.limit_bytes) == ("kv", 65536, 1 << 20)
            assert kv.used_bytes == a_used + b_used  # the budget as a whole: every tenant's
            return {j.job: (j.tenant, j.used_bytes) for j in kv.jobs}

        assert usage(a) == {"team-a-1": ("team-a-*", a_used)}
        assert usage(b) == {"team-b-1": ("team-b-*", b_used)}
        assert usage(op) == {"team-a-1": ("team-a-*", a_used), "team-b-1": ("team-b-*", b_used)}

        # stokerctl usage: the same figures, for the caller's jobs only.
        def stokerctl(token: str, *args: str) -> str:
            (tmp_path / "ctl-token").write_text(token + "\n")
            out = subprocess.run(
                [
                    str(binary("stokerctl")),
                    *("--coordinator", d.addr, "--token-file", str(tmp_path / "ctl-token")),
                    *("usage", *args),
                ],
                capture_output=True,
                text=True,
                timeout=30,
            )
            assert out.returncode == 0, out.stderr
            return out.stdout

        (line,) = stokerctl("a-token", "--json").splitlines()
        got = json.loads(line)
        assert got["budget"] == "kv" and got["used_bytes"] == a_used + b_used, got
        assert (got["limit_bytes"], got["limit_per_job_bytes"]) == (1 << 20, 65536), got
        assert got["jobs"] == [{"job": "team-a-1", "tenant": "team-a-*", "used_bytes": a_used}]
        table = [line.split() for line in stokerctl("b-token").splitlines()]
        assert table[0] == ["SERVICE", "BUDGET", "TENANT", "JOB", "USED", "LIMIT"], table
        assert ["coordinator", "kv", "team-b-*", "team-b-1", "4.9", "KiB", "64.0", "KiB"] in table
        assert ["coordinator", "kv", "team-b-*", "(tenant)", "4.9", "KiB", "1.0", "MiB"] in table
        assert not any("team-a-1" in r for r in table), table
    finally:
        d.stop()


def test_stream_budget_per_tenant_on_metrics_and_get_usage(tmp_path):
    """The dataloader's stream budget: a team's stream that its client does
    not read holds its prefetch depth of generated batches (4 x 32,768
    tokens x 4 bytes), shown against --stream-bytes-per-job for its tenant
    and job, to that team alone through GetUsage."""
    tokens = tmp_path / "dataloader-tokens"
    tokens.write_text(TOKENS)
    metrics = f"127.0.0.1:{free_port()}"
    d = Daemon(
        "dataloader",
        tmp_path,
        "--token-file",
        str(tokens),
        "--metrics-listen",
        metrics,
        "--stream-bytes-per-job",
        "8MiB",
        "--stream-bytes",
        "64MiB",
    )
    try:
        a, b = caller(d.addr, "a-token"), caller(d.addr, "b-token")
        spec = long_line_spec("team-a-s", 32767)
        got = a("Dataloader", "CreateLoader", dl.CreateLoaderRequest(spec=spec), dl.LoaderInfo)
        assert not isinstance(got, grpc.RpcError), got
        stream = a.channel.unary_stream(  # type: ignore[attr-defined]
            "/stoker.v1.Dataloader/StreamBatches",
            request_serializer=dl.StreamBatchesRequest.SerializeToString,
            response_deserializer=dl.Batch.FromString,
        )
        req = dl.StreamBatchesRequest(job="team-a-s", world=1, prefetch=4, count=1000)
        unread = stream(req, metadata=[("authorization", "Bearer a-token")], timeout=60)
        held = 4 * 32768 * 4
        key = 'stoker_budget_job_used_bytes{budget="stream",tenant="team-a-*",job="team-a-s"}'
        until = time.monotonic() + 20
        while scrape(metrics).get(key) != held and time.monotonic() < until:
            time.sleep(0.1)
        m = scrape(metrics)
        assert m.get(key) == held, m
        assert m['stoker_budget_tenant_used_bytes{budget="stream",tenant="team-a-*"}'] == held, m
        assert m['stoker_budget_used_bytes{budget="stream"}'] == held, m
        assert m['stoker_budget_limit_bytes{budget="stream",per="job"}'] == 8 << 20, m
        assert m['stoker_budget_limit_bytes{budget="stream",per="all"}'] == 64 << 20, m
        for who, jobs in ((a, [("team-a-s", "team-a-*", held)]), (b, [])):
            report = who("Usage", "GetUsage", common_pb2.GetUsageRequest(), common_pb2.UsageReport)
            (stream_budget,) = report.budgets
            assert stream_budget.budget == "stream" and stream_budget.used_bytes == held
            assert [(j.job, j.tenant, j.used_bytes) for j in stream_budget.jobs] == jobs
        unread.cancel()
    finally:
        d.stop()


def test_budget_series_per_tenant_are_bounded(tmp_path):
    """105 teams each holding key-value bytes: the first 100 tenants by name
    get a series of their own, the other 5 are summed as tenant="other", and
    the tenants' series still add up to the whole."""
    teams = [f"t{i:03d}" for i in range(105)]
    tokens = tmp_path / "coordinator-tokens"
    tokens.write_text("op-token\n" + "".join(f"tok-{t} {t}-*\n" for t in teams))
    metrics = f"127.0.0.1:{free_port()}"
    d = Daemon("coordinator", tmp_path, "--token-file", str(tokens), "--metrics-listen", metrics)
    try:
        op = caller(d.addr, "op-token")
        for t in teams:
            job = f"{t}-j"
            got = op("Coordinator", "CreateJob", co.CreateJobRequest(spec=job_spec(job)), co.Job)
            assert not isinstance(got, grpc.RpcError), got
            got = op(
                "Coordinator",
                "KvSet",
                co.KvSetRequest(job=job, generation=1, key="k", value=b"v" * 100),
                common_pb2.Empty,
            )
            assert not isinstance(got, grpc.RpcError), got
        m = scrape(metrics)
        per = 1 + 100 + 64
        tenants = {
            k: v
            for k, v in m.items()
            if k.startswith('stoker_budget_tenant_used_bytes{budget="kv"')
        }
        assert len(tenants) == 101, sorted(tenants)
        assert tenants['stoker_budget_tenant_used_bytes{budget="kv",tenant="t000-*"}'] == per
        assert 'stoker_budget_tenant_used_bytes{budget="kv",tenant="t100-*"}' not in tenants
        assert tenants['stoker_budget_tenant_used_bytes{budget="kv",tenant="other"}'] == 5 * per
        assert sum(tenants.values()) == m['stoker_budget_used_bytes{budget="kv"}'] == 105 * per
    finally:
        d.stop()


def test_staging_budget_per_tenant_on_metrics_and_get_usage(tmp_path):
    """The checkpoint service's staging budget: a team's attempt fed 100,000
    bytes by a Write stream that stays open (its rank not finished) holds
    them, shown for its tenant and job against --staging-budget, to that
    team alone through GetUsage; the read budget is listed with its limits."""
    tokens = tmp_path / "checkpoint-tokens"
    tokens.write_text(TOKENS)
    metrics = f"127.0.0.1:{free_port()}"
    d = Daemon(
        "checkpoint",
        tmp_path,
        "--token-file",
        str(tokens),
        "--metrics-listen",
        metrics,
        "--staging-budget",
        "64MiB",
    )
    fed = threading.Event()
    done = threading.Event()
    data = chunk("", b"x" * 100000)

    def chunks() -> Any:
        yield data
        fed.set()
        done.wait(20)

    try:
        a, b = caller(d.addr, "a-token"), caller(d.addr, "b-token")
        begun = a(
            "Checkpoint",
            "Begin",
            ck.BeginRequest(job="team-a-ck", step=1, world=1),
            ck.BeginResponse,
        )
        assert not isinstance(begun, grpc.RpcError), begun
        data.attempt = begun.attempt
        data.last = False
        stub = a.channel.stream_unary(  # type: ignore[attr-defined]
            "/stoker.v1.Checkpoint/Write",
            request_serializer=ck.WriteChunk.SerializeToString,
            response_deserializer=ck.WriteResponse.FromString,
        )
        open_write = stub.future(
            chunks(), metadata=[("authorization", "Bearer a-token")], timeout=30
        )
        assert fed.wait(10)
        key = 'stoker_budget_job_used_bytes{budget="staging",tenant="team-a-*",job="team-a-ck"}'
        until = time.monotonic() + 10
        while scrape(metrics).get(key) != 100000 and time.monotonic() < until:
            time.sleep(0.05)
        m = scrape(metrics)
        assert m.get(key) == 100000, m
        assert m['stoker_budget_tenant_used_bytes{budget="staging",tenant="team-a-*"}'] == 100000
        assert m['stoker_budget_used_bytes{budget="staging"}'] == 100000, m
        assert m['stoker_budget_limit_bytes{budget="staging",per="all"}'] == 64 << 20, m
        assert 'stoker_budget_limit_bytes{budget="staging",per="job"}' not in m, m
        assert m['stoker_budget_limit_bytes{budget="read",per="job"}'] == 256 << 20, m
        for who, jobs in ((a, [("team-a-ck", "team-a-*", 100000)]), (b, [])):
            report = who("Usage", "GetUsage", common_pb2.GetUsageRequest(), common_pb2.UsageReport)
            staging, read = report.budgets
            assert (staging.budget, staging.used_bytes, staging.limit_per_job_bytes) == (
                "staging",
                100000,
                0,
            )
            assert [(j.job, j.tenant, j.used_bytes) for j in staging.jobs] == jobs
            assert (read.budget, read.limit_per_job_bytes, list(read.jobs)) == (
                "read",
                256 << 20,
                [],
            )
        done.set()
        open_write.cancel()
    finally:
        done.set()
        d.stop()

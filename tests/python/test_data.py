"""stoker.data against the real dataloader daemon: determinism, the
shared-memory and gRPC transports agree, exact resume through
StatefulDataLoader, rescale 4 -> 3 with the same global batches, reconnect
across a kill -9 of the daemon, document starts, and clear errors. Every
test runs twice: streams received by libstoker-client (stoker._native) and
by gRPC Python (STOKER_CLIENT_LIBRARY=off)."""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
import torch
from conftest import ROOT, Daemon
from torchdata.stateful_dataloader import StatefulDataLoader

from stoker import StokerError
from stoker.connection import Connection
from stoker.data import StokerDataset
from stoker.v1 import common_pb2
from stoker.v1 import dataloader_pb2 as pb

sys.path.insert(0, str(ROOT / "tests" / "integration"))
from dns_stub import NameServer  # The tests' name server.

SEQ = 32
GLOBAL_BATCH = 12


@pytest.fixture(autouse=True, params=["libstoker-client", "grpcio"])
def receiver(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which client receives the dataset's streams (shown in its repr)."""
    if request.param == "grpcio":
        monkeypatch.setenv("STOKER_CLIENT_LIBRARY", "off")
    return str(request.param)


def create_loader(addr: str, job: str = "pt", docs: int = 400) -> None:
    spec = pb.LoaderSpec(
        job=job,
        seq_len=SEQ,
        global_batch=GLOBAL_BATCH,
        seed=7,
        logical_shards=64,
        lanes=4,
        datasets=[
            pb.DatasetSpec(
                name="synth",
                weight=1.0,
                format=pb.DATASET_FORMAT_LLMC,
                source=common_pb2.StorageRef(uri=f"synthetic:{docs}:5:90:3"),
            )
        ],
    )
    Connection(addr).unary(
        "/stoker.v1.Dataloader/CreateLoader", pb.CreateLoaderRequest(spec=spec), pb.LoaderInfo
    )


def take(ds: StokerDataset, n: int) -> list[tuple[torch.Tensor, ...]]:
    out = []
    for sample in ds:
        out.append(sample)
        if len(out) == n:
            break
    return out


def global_batch(addr: str, step: int, world: int) -> torch.Tensor:
    """The lines of every rank at step, in rank order: [GLOBAL_BATCH, SEQ + 1]."""
    parts = []
    for r in range(world):
        ds = StokerDataset(
            "pt", address=addr, rank=r, world_size=world, start_step=step, steps=1, transport="grpc"
        )
        ((inputs, targets),) = list(ds)
        parts.append(torch.cat([inputs, targets[:, -1:]], dim=1))
    return torch.cat(parts)


def test_batches_are_the_ranks_slices_shifted_by_one(daemons):
    addr = daemons["dataloader"].addr
    create_loader(addr)
    ds = StokerDataset("pt", address=addr, rank=1, world_size=4, steps=3)
    samples = list(ds)
    assert len(samples) == 3
    for inputs, targets in samples:
        assert inputs.dtype == torch.int64 and targets.dtype == torch.int64
        assert inputs.shape == (GLOBAL_BATCH // 4, SEQ) == targets.shape
        assert torch.equal(inputs[:, 1:], targets[:, :-1])
    # Every token comes from the synthetic corpus: (doc << 12) | position.
    tokens = torch.cat([s[0] for s in samples])
    assert int((tokens >> 12).max()) < 400 and int((tokens & 0xFFF).max()) < 90


def test_same_bytes_on_every_read_and_through_both_transports(daemons, receiver):
    addr = daemons["dataloader"].addr
    create_loader(addr)
    shm = StokerDataset("pt", address=addr, rank=0, world_size=2, steps=6, transport="auto")
    a = list(shm)
    assert f"transport=shm ({receiver})" in repr(shm), repr(shm)
    grpc_ds = StokerDataset("pt", address=addr, rank=0, world_size=2, steps=6, transport="grpc")
    b = list(grpc_ds)
    assert f"transport=grpc ({receiver})" in repr(grpc_ds), repr(grpc_ds)
    c = list(StokerDataset("pt", address=addr, rank=0, world_size=2, steps=6))
    assert len(a) == len(b) == len(c) == 6
    for x, y, z in zip(a, b, c, strict=True):
        assert torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and torch.equal(x[0], z[0])


def test_a_ring_slot_is_reused_only_after_the_sample_was_copied(daemons):
    # More steps than the ring has slots (2 x prefetch + 2): the daemon
    # must wait for releases, and every sample must still hold its own step.
    addr = daemons["dataloader"].addr
    create_loader(addr)
    ds = StokerDataset("pt", address=addr, rank=0, world_size=1, steps=20, prefetch=1)
    held = list(ds)
    assert "transport=shm" in repr(ds)
    for step in (0, 7, 19):
        assert torch.equal(held[step][0], global_batch(addr, step, 1)[:, :-1])


def in_ring(t: torch.Tensor) -> bool:
    """Whether t's memory is the daemon's ring file (mapped, its name
    removed), i.e. a view, not a copy."""
    ptr = t.data_ptr()
    with open("/proc/self/maps", encoding="utf-8") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= ptr < hi:
                return len(fields) == 6 and "/ring-" in fields[5] and "(deleted)" in fields[5]
    return False


def test_shm_delivers_every_batch_through_the_ring_from_the_first(daemons, receiver, tmp_path):
    """transport="shm" (issue 26, part 6): every batch of every stream is a
    view of the daemon's ring, the first ones included (they came inline
    while the first batch sized the ring); a daemon that makes no ring fails
    the stream at its first batch instead of serving it over gRPC."""
    addr = daemons["dataloader"].addr
    create_loader(addr)
    for start in (0, 5):  # each stream is a new ring
        ds = StokerDataset(
            "pt", address=addr, rank=0, world_size=1, start_step=start, steps=8, transport="shm"
        )
        seen = []
        for inputs, _ in ds:
            seen.append((ds.transport_in_use, in_ring(inputs)))
            del inputs, _
        assert seen == [(f"shm ({receiver})", True)] * 8, seen

    (tmp_path / "no-shm").mkdir()
    d = Daemon("dataloader", tmp_path / "no-shm", "--shm-dir", "")
    try:
        create_loader(d.addr)
        with pytest.raises(StokerError) as e:
            list(StokerDataset("pt", address=d.addr, steps=3, transport="shm"))
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION, e.value
        assert "sent step 0 inline" in e.value.details, e.value.details
        ds = StokerDataset("pt", address=d.addr, steps=3, transport="auto")
        assert len(list(ds)) == 3 and ds.transport_in_use == f"grpc ({receiver})"
    finally:
        d.stop()


def test_ring_samples_are_views_lent_until_freed_and_never_overwritten(daemons):
    # prefetch 1: a ring of 4 slots, of which the dataset lends at most 2 as
    # tensors; kept ones are passed over by the daemon, never written.
    addr = daemons["dataloader"].addr
    create_loader(addr)
    ref = list(StokerDataset("pt", address=addr, rank=0, world_size=1, steps=40, transport="grpc"))
    it = iter(StokerDataset("pt", address=addr, rank=0, world_size=1, steps=40, prefetch=1))
    kept = [next(it), next(it)]  # Steps 0 and 1: views of two slots (step 0 sized the ring).
    assert all(in_ring(s[0]) and s[0].dtype == torch.int64 for s in kept)
    for step in range(2, 20):  # Half the ring is lent: copies, and the stream goes on.
        sample = next(it)
        assert not in_ring(sample[0])
        assert torch.equal(sample[0], ref[step][0]) and torch.equal(sample[1], ref[step][1])
    for step, s in zip((0, 1), kept, strict=True):
        assert torch.equal(s[0], ref[step][0]) and torch.equal(s[1], ref[step][1])
    del kept, s, sample  # Their slots go back to the daemon: views again.
    for step in range(20, 40):
        sample = next(it)
        assert in_ring(sample[0]), step
        assert torch.equal(sample[0], ref[step][0]) and torch.equal(sample[1], ref[step][1])


def test_a_ring_token_width_other_than_4_or_8_is_refused(daemons):
    addr = daemons["dataloader"].addr
    create_loader(addr)
    for width in (1, 2, 16):
        req = pb.StreamBatchesRequest(
            job="pt", rank=0, world=1, shm_nonce=os.urandom(16), shm_token_bytes=width
        )
        stream = Connection(addr).server_stream(
            "/stoker.v1.Dataloader/StreamBatches", req, pb.Batch
        )
        with pytest.raises(StokerError) as e:
            next(iter(stream))
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "shm_token_bytes must be 4 or 8" in str(e.value)


def test_resume_through_stateful_dataloader_is_exact(daemons):
    addr = daemons["dataloader"].addr
    create_loader(addr)
    whole = [s[0] for s in take(StokerDataset("pt", address=addr, rank=0, world_size=2), 10)]

    loader = StatefulDataLoader(
        StokerDataset("pt", address=addr, rank=0, world_size=2), batch_size=None
    )
    it = iter(loader)
    first = [next(it)[0] for _ in range(4)]
    state = loader.state_dict()
    del it, loader

    resumed = StatefulDataLoader(
        StokerDataset("pt", address=addr, rank=0, world_size=2), batch_size=None
    )
    resumed.load_state_dict(state)
    it = iter(resumed)
    rest = [next(it)[0] for _ in range(6)]
    for got, want in zip(first + rest, whole, strict=True):
        assert torch.equal(got, want)


def test_rescale_4_to_3_serves_the_same_global_batches(daemons):
    addr = daemons["dataloader"].addr
    create_loader(addr)
    # Four ranks run 3 steps and save their state; three ranks resume from it.
    states = []
    for r in range(4):
        ds = StokerDataset("pt", address=addr, rank=r, world_size=4)
        take(ds, 3)
        states.append(ds.state_dict())
    assert {s["next_step"] for s in states} == {3}
    resumed = []
    for r in range(3):
        ds = StokerDataset("pt", address=addr, rank=r, world_size=3)
        ds.load_state_dict(states[0])
        resumed.append(take(ds, 2))
    for i, step in enumerate((3, 4)):
        at3 = torch.cat([torch.cat([s[i][0], s[i][1][:, -1:]], dim=1) for s in resumed])
        assert torch.equal(at3, global_batch(addr, step, 4))
        assert torch.equal(at3, global_batch(addr, step, 1))


def test_reconnects_across_a_kill_of_the_daemon(daemons):
    d = daemons["dataloader"]
    create_loader(d.addr)
    want = [s[0] for s in take(StokerDataset("pt", address=d.addr, rank=0, world_size=1), 8)]
    got = []
    for i, (inputs, _) in enumerate(
        StokerDataset("pt", address=d.addr, rank=0, world_size=1, steps=8, timeout=30)
    ):
        got.append(inputs)
        if i == 3:
            d.restart()  # SIGKILL, then the same port and data dir
    assert len(got) == 8
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


def test_follows_a_daemon_back_at_a_new_address_under_its_name(daemons, tmp_path):
    """A rolling update on Kubernetes: the dataloader stops (SIGTERM) and its
    pod comes back on its volume at a new IP under the same DNS name. The
    name server is the test's (dns_stub.py; the dataset's address
    dns://127.0.0.1:PORT/NAME:P makes gRPC's resolver ask it). The stream
    goes on from the next step with the same batches, and within seconds:
    gRPC's own pace (DNS asked again at most every 30 s, reconnects backed off
    for up to 2 minutes) would stall it half a minute and more."""
    ns = NameServer()
    old = Daemon("dataloader", tmp_path, listen="127.0.0.2:0")
    try:
        port = old.addr.rsplit(":", 1)[1]
        ns.set("dl.stoker.test", "127.0.0.2")
        addr = f"{ns.authority()}dl.stoker.test:{port}"
        create_loader(addr)
        # More steps than the stream prefetches: the restart is waited for.
        want = [s[0] for s in take(StokerDataset("pt", address=addr, rank=0, world_size=1), 24)]
        got, stall = [], 0.0
        ds = StokerDataset("pt", address=addr, rank=0, world_size=1, steps=24, timeout=60)
        for i, (inputs, _) in enumerate(ds):
            got.append(inputs)
            if i == 3:
                assert old.proc is not None
                old.proc.terminate()
                old.proc.wait(timeout=30)
                ns.set("dl.stoker.test", "127.0.0.3")
                old = Daemon("dataloader", tmp_path, listen=f"127.0.0.3:{port}")
                t0 = time.monotonic()
        stall = time.monotonic() - t0
        assert len(got) == 24
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
        assert stall < 10, f"{stall:.1f} s to the first batch from the new address"
    finally:
        old.kill()
        ns.close()


def test_document_starts_mark_position_zero_of_each_document(daemons):
    addr = daemons["dataloader"].addr
    create_loader(addr)
    ds = StokerDataset("pt", address=addr, rank=0, world_size=1, steps=2, doc_starts=True)
    for inputs, targets, starts in ds:
        full = torch.cat([inputs, targets[:, -1:]], dim=1)
        want = (full & 0xFFF) == 0
        mask = torch.zeros_like(want)
        mask[starts[:, 0], starts[:, 1]] = True
        assert starts.shape[1] == 2 and len(starts) > 0
        assert torch.equal(mask, want)


def test_errors_carry_the_status(daemons):
    addr = daemons["dataloader"].addr
    create_loader(addr)
    with pytest.raises(StokerError) as e:
        list(StokerDataset("nope", address=addr, rank=0, world_size=1, steps=1))
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "nope" in str(e.value)
    # Errors pickle whole: DCP carries a rank's exception to the others.
    again = pickle.loads(pickle.dumps(e.value))
    assert (again.code, again.details, str(again)) == (e.value.code, e.value.details, str(e.value))
    with pytest.raises(StokerError) as e:
        list(StokerDataset("pt", address=addr, rank=4, world_size=4, steps=1))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(StokerError) as e:
        StokerDataset("pt", address=addr, transport="carrier-pigeon")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    # A name with a NUL byte is refused by the service, not cut to "pt".
    with pytest.raises(StokerError) as e:
        Connection(addr).unary(
            "/stoker.v1.Dataloader/GetBatch",
            pb.GetBatchRequest(job="pt\x00x", step=0, rank=0, world=1),
            pb.Batch,
        )
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "NUL" in e.value.details
    ds = StokerDataset("pt", address=addr)
    with pytest.raises(StokerError) as e:
        ds.load_state_dict({"version": 1, "job": "other", "next_step": 3})
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "other" in str(e.value)


def test_a_service_that_is_down_fails_within_the_timeout(daemons):
    d = daemons["dataloader"]
    create_loader(d.addr)
    d.kill()
    t0 = time.monotonic()
    with pytest.raises(StokerError) as e:
        list(StokerDataset("pt", address=d.addr, rank=0, world_size=1, steps=1, timeout=2))
    assert e.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert time.monotonic() - t0 < 10


def test_import_state_targets_the_requests_job(daemons):
    """ImportState of job b's blob under job a's name is INVALID_ARGUMENT and
    changes neither job (the request's job is the target, not the blob's)."""
    addr = daemons["dataloader"].addr
    create_loader(addr, "a")
    create_loader(addr, "b", docs=300)
    conn = Connection(addr)
    svc = "/stoker.v1.Dataloader/"
    conn.unary(svc + "Commit", pb.CommitRequest(job="b", step=2), common_pb2.Empty)
    blob = conn.unary(svc + "ExportState", pb.ExportStateRequest(job="b", step=2), pb.LoaderState)
    before = {
        j: conn.unary(svc + "GetLoader", pb.GetLoaderRequest(job=j), pb.LoaderInfo)
        for j in ("a", "b")
    }
    with pytest.raises(StokerError) as e:
        conn.unary(
            svc + "ImportState", pb.LoaderState(job="a", step=2, state=blob.state), pb.LoaderInfo
        )
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "job b, not a" in e.value.details
    for j in ("a", "b"):
        after = conn.unary(svc + "GetLoader", pb.GetLoaderRequest(job=j), pb.LoaderInfo)
        assert after.spec == before[j].spec and after.committed_step == before[j].committed_step
    # Into its own job the same blob imports.
    conn.unary(
        svc + "ImportState", pb.LoaderState(job="b", step=2, state=blob.state), pb.LoaderInfo
    )


def make_create(addr: str) -> Callable[[str, str, int], StokerError]:
    """A CreateLoader of one dataset at path that must fail: its error."""
    conn = Connection(addr)

    def create(job: str, path: str, fmt: int) -> StokerError:
        spec = pb.LoaderSpec(
            job=job,
            seq_len=8,
            global_batch=2,
            datasets=[
                pb.DatasetSpec(
                    name="d",
                    weight=1.0,
                    format=fmt,
                    tokenizer="bytes",
                    source=common_pb2.StorageRef(uri=f"file://{path}"),
                )
            ],
        )
        with pytest.raises(StokerError) as e:
            conn.unary(
                "/stoker.v1.Dataloader/CreateLoader",
                pb.CreateLoaderRequest(spec=spec),
                pb.LoaderInfo,
                timeout=10,
            )
        return e.value

    return create


def test_data_roots_bound_what_clients_read(daemons, tmp_path):
    """The daemon serves files under its --data-root only: /etc/passwd, a
    ".." walk out of the root, a link inside the root to a file outside, and
    the tokenizer's vocabulary path (at CreateLoader, and at UpdateMixture
    switching a job's tokenizer: the same answer) all answer
    PERMISSION_DENIED naming the rule; a link out answers the same whether or
    not its target exists (no existence oracle); a daemon started with no
    root serves no file at all."""
    create = make_create(daemons["dataloader"].addr)
    (tmp_path / "escape.txt").symlink_to("/etc/passwd")
    (tmp_path / "ghost.txt").symlink_to("/etc/no-such-file-here")
    (tmp_path / "ghostdir").symlink_to("/no/such/dir")
    (tmp_path / "ok.txt").write_text("inside the root\n" * 100)
    outside = {
        "/etc/passwd": "outside the data roots",
        f"{tmp_path}/../../etc/passwd": "outside the data roots",
        str(tmp_path / "escape.txt"): "a link leads out of the data roots",
        str(tmp_path / "ghost.txt"): "a link leads out of the data roots",
        str(tmp_path / "ghostdir" / "x.txt"): "a link leads out of the data roots",
    }
    for i, (path, why) in enumerate(outside.items()):
        err = create(f"out{i}", path, pb.DATASET_FORMAT_TEXT)
        assert err.code == grpc.StatusCode.PERMISSION_DENIED, (path, err)
        assert why in str(err) and "--data-root" in str(err), err
    spec = pb.DatasetSpec(
        name="d",
        weight=1.0,
        format=pb.DATASET_FORMAT_TEXT,
        tokenizer="gpt2:/etc/passwd,/etc/group",
        source=common_pb2.StorageRef(uri=f"file://{tmp_path}/ok.txt"),
    )
    with pytest.raises(StokerError) as e:
        Connection(daemons["dataloader"].addr).unary(
            "/stoker.v1.Dataloader/CreateLoader",
            pb.CreateLoaderRequest(
                spec=pb.LoaderSpec(job="vocab", seq_len=8, global_batch=2, datasets=[spec])
            ),
            pb.LoaderInfo,
            timeout=10,
        )
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED, e.value
    # UpdateMixture switching a job's tokenizer to that vocabulary: the same answer.
    conn = Connection(daemons["dataloader"].addr)
    ok = pb.DatasetSpec(
        name="d",
        weight=1.0,
        format=pb.DATASET_FORMAT_TEXT,
        source=common_pb2.StorageRef(uri=f"file://{tmp_path}/ok.txt"),
    )
    conn.unary(
        "/stoker.v1.Dataloader/CreateLoader",
        pb.CreateLoaderRequest(
            spec=pb.LoaderSpec(job="vocab", seq_len=8, global_batch=2, lanes=1, datasets=[ok])
        ),
        pb.LoaderInfo,
        timeout=10,
    )
    with pytest.raises(StokerError) as u:
        conn.unary(
            "/stoker.v1.Dataloader/UpdateMixture",
            pb.UpdateMixtureRequest(job="vocab", from_step=3, datasets=[spec]),
            pb.LoaderInfo,
            timeout=10,
        )
    assert u.value.code == grpc.StatusCode.PERMISSION_DENIED, u.value
    same = str(e.value).replace("CreateLoader", "UpdateMixture")  # the method's name apart
    assert str(u.value) == same, (u.value, e.value)
    (tmp_path / "bare").mkdir()
    bare = Daemon("dataloader", tmp_path / "bare", data_roots=[])
    try:
        err = make_create(bare.addr)("bare", str(tmp_path / "ok.txt"), pb.DATASET_FORMAT_TEXT)
        assert err.code == grpc.StatusCode.PERMISSION_DENIED, err
        assert "started without --data-root" in str(err), err
    finally:
        bare.stop()


def test_bad_dataset_paths_are_the_clients_error_and_park_no_worker(daemons, tmp_path):
    """A directory named like an index, a missing file and a FIFO answer
    INVALID_ARGUMENT or NOT_FOUND (never INTERNAL); /dev/null is outside the
    data roots; opening a FIFO, eight times at once, parks no worker: the
    daemon still serves."""
    (tmp_path / "dir.idx").mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    addr = daemons["dataloader"].addr
    create = make_create(addr)
    want = {
        ("/dev/null", pb.DATASET_FORMAT_TEXT): grpc.StatusCode.PERMISSION_DENIED,
        ("/dev/null", pb.DATASET_FORMAT_LLMC): grpc.StatusCode.PERMISSION_DENIED,
        (str(tmp_path / "dir"), pb.DATASET_FORMAT_MEGATRON): grpc.StatusCode.INVALID_ARGUMENT,
        (str(tmp_path / "missing.txt"), pb.DATASET_FORMAT_TEXT): grpc.StatusCode.NOT_FOUND,
        (str(fifo), pb.DATASET_FORMAT_TEXT): grpc.StatusCode.INVALID_ARGUMENT,
    }
    for i, ((path, fmt), code) in enumerate(want.items()):
        err = create(f"bad{i}", path, fmt)
        assert err.code == code, (path, err)
    with ThreadPoolExecutor(8) as pool:
        errs = list(
            pool.map(lambda i: create(f"fifo{i}", str(fifo), pb.DATASET_FORMAT_LLMC), range(8))
        )
    assert all(e.code == grpc.StatusCode.INVALID_ARGUMENT for e in errs), errs
    t0 = time.monotonic()
    create_loader(addr)
    assert len(list(StokerDataset("pt", address=addr, rank=0, world_size=1, steps=2))) == 2
    assert time.monotonic() - t0 < 10


def test_a_slow_reader_still_gets_every_batch_through_the_ring(daemons):
    """With the ring kept full by a reader slower than the daemon, batches
    still come through shared memory (a full-ring probe once reset the slot
    size, sending the batches after it inline)."""
    from stoker._ring import Ring

    addr = daemons["dataloader"].addr
    create_loader(addr)
    nonce = os.urandom(16)
    req = pb.StreamBatchesRequest(
        job="pt", from_step=0, rank=0, world=1, prefetch=2, shm_nonce=nonce
    )
    stream = Connection(addr).server_stream("/stoker.v1.Dataloader/StreamBatches", req, pb.Batch)
    ring, inline, seen = None, 0, 0
    for msg in stream:
        for b in (msg, *msg.more):
            if b.shm_path:
                ring = Ring(b.shm_path, nonce)
            if b.shm_seq == 0:
                inline += 1
            else:
                assert ring is not None
                assert torch.equal(
                    torch.from_numpy(ring.view(b.shm_seq, b.lines * b.line_tokens).astype("int64")),
                    global_batch(addr, b.step, 1).reshape(-1),
                )
                time.sleep(0.02)  # slower than the daemon: the ring stays full
                ring.release(b.shm_seq)
            seen += 1
        if seen >= 40:
            break
    stream.cancel()
    # The batches generated before the first one sized the ring (at most the
    # prefetch) go inline; every later one through the ring (29 of 40 did not).
    assert inline <= 2, f"{inline} of {seen} batches inline"

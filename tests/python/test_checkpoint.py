"""stoker.checkpoint against the real checkpoint daemon: DCP save at 4 ranks
and load at 3, 2 and 1 bit-exactly (DTensors resharded by the service),
async_save, the manifest as the service and stokerctl see it, and clear
errors for bad input."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

import grpc
import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import Daemon, binary
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from stoker import Jobs, StokerError, _segmap
from stoker.checkpoint import (
    METADATA_TENSOR,
    RPC,
    StokerReader,
    StokerWriter,
    _read_pieces,
    service_error,
    storage_name,
)
from stoker.connection import Connection, Security
from stoker.v1 import checkpoint_pb2 as ckpt_pb
from stoker.v1 import common_pb2

HERE = pathlib.Path(__file__).resolve().parent


def run_ranks(
    mode: str, addr: str, job: str, step: int, world: int, tmp: pathlib.Path, **env: str
) -> list[pathlib.Path]:
    """Runs dcp_rank.py as `world` processes; each save or load reports how
    its bytes went (shared memory or gRPC), checked against STOKER_CKPT_SHM."""
    init = tmp / f"pg-{mode}-{step}-{world}"
    outs = [tmp / f"{mode}-{step}-{world}-{r}.pt" for r in range(world)]
    env = dict(os.environ, OMP_NUM_THREADS="1", **env)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(HERE / "dcp_rank.py"),
                mode,
                addr,
                job,
                str(step),
                str(r),
                str(world),
                str(init),
                str(outs[r]),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    logs = [p.communicate(timeout=240)[0].decode() for p in procs]
    exit_code = -signal.SIGKILL if mode == "async_save_kill" else 0
    for r, p in enumerate(procs):
        assert p.returncode == exit_code, f"rank {r} of {mode} at {world}:\n{logs[r][-3000:]}"
        if exit_code == 0:
            want = "grpc" if env.get("STOKER_CKPT_SHM") == "off" else "shm"
            assert f"transport={want}" in logs[r], logs[r][-2000:]
    return outs


def expected() -> dict[str, object]:
    sys.path.insert(0, str(HERE))
    from dcp_rank import full_state

    return full_state()


def assert_bit_exact(path: pathlib.Path) -> None:
    got = torch.load(path, weights_only=False)
    for k, want in expected().items():
        if isinstance(want, torch.Tensor):
            g = got[k]
            assert g.dtype == want.dtype and g.shape == want.shape, k
            assert torch.equal(
                g.view(torch.uint8) if g.dim() else g,
                want.view(torch.uint8) if want.dim() else want,
            ), k
        else:
            assert got[k] == want, k


def read_files(addr: str) -> list[str]:
    """The read files left in the service's shared-memory directory."""
    info = Connection(addr).unary(
        "/stoker.v1.Checkpoint/GetStagingInfo", ckpt_pb.StagingInfoRequest(), ckpt_pb.StagingInfo
    )
    assert info.shm_dir and info.shm_read_max_bytes > 4096
    return [n for n in os.listdir(info.shm_dir) if n.startswith("read-")]


def wait_committed(addr: str, job: str, step: int) -> None:
    reader = StokerReader(job, addr)
    deadline = time.monotonic() + 60
    while True:
        try:
            if reader.latest_step() == step:
                return
        except StokerError as e:
            assert e.code == grpc.StatusCode.NOT_FOUND
        assert time.monotonic() < deadline, "the checkpoint never committed"
        time.sleep(0.1)


def test_save_at_4_loads_at_3_2_1_bit_exactly(daemons, tmp_path):
    """Loads come through read files in the service's shared memory (the
    ranks report transport=shm), which are gone afterwards."""
    addr = daemons["checkpoint"].addr
    run_ranks("save", addr, "dcp", 10, 4, tmp_path)
    for world in (3, 2, 1):
        outs = run_ranks("load", addr, "dcp", 10, world, tmp_path)
        for out in outs:
            assert_bit_exact(out)
    assert read_files(addr) == []


def test_loads_inline_when_shared_memory_is_off(daemons, tmp_path):
    addr = daemons["checkpoint"].addr
    run_ranks("save", addr, "dcp", 11, 4, tmp_path)
    for world in (3, 2, 1):
        for out in run_ranks("load", addr, "dcp", 11, world, tmp_path, STOKER_CKPT_SHM="off"):
            assert_bit_exact(out)


def test_loads_through_small_read_files_in_parts(daemons, tmp_path):
    """A read file smaller than the wanted boxes: boxes cut into parts, one
    Read call per file's worth, the file reused; still bit-exact."""
    addr = daemons["checkpoint"].addr
    run_ranks("save", addr, "dcp", 12, 4, tmp_path)
    for world in (3, 1):
        for out in run_ranks(
            "load", addr, "dcp", 12, world, tmp_path, STOKER_CKPT_SHM_READ_BYTES=str(4096 + 40)
        ):
            assert_bit_exact(out)
    assert read_files(addr) == []


def test_bytes_over_grpc_when_shared_memory_is_off(daemons, tmp_path):
    addr = daemons["checkpoint"].addr
    run_ranks("save", addr, "dcp", 40, 2, tmp_path, STOKER_CKPT_SHM="off")
    for out in run_ranks("load", addr, "dcp", 40, 1, tmp_path):
        assert_bit_exact(out)


def test_async_save_commits_and_loads(daemons, tmp_path):
    addr = daemons["checkpoint"].addr
    run_ranks("async_save", addr, "dcp", 20, 2, tmp_path)  # staged by the service
    run_ranks("async_save_copy", addr, "dcp", 21, 2, tmp_path)  # DCP's CPU copy first
    reader = StokerReader("dcp", addr)
    assert reader.latest_step() == 21
    for step in (20, 21):
        for out in run_ranks("load", addr, "dcp", step, 3, tmp_path):
            assert_bit_exact(out)


def test_async_save_returns_once_the_service_has_the_bytes(daemons, tmp_path):
    # Every rank exits (os._exit) the moment async_save returns: the bytes
    # are the service's by then, so the checkpoint commits without them.
    addr = daemons["checkpoint"].addr
    run_ranks("async_save_exit", addr, "dcp", 25, 3, tmp_path)
    wait_committed(addr, "dcp", 25)
    for out in run_ranks("load", addr, "dcp", 25, 2, tmp_path):
        assert_bit_exact(out)


def test_async_save_survives_kill_9_of_every_rank_once_it_returned(daemons, tmp_path):
    # Every rank SIGKILLs itself the moment async_save returns (its
    # background half, DCP's save that waits for the commit, dies with it):
    # each rank's bytes and rank 0's metadata are the service's by then.
    addr = daemons["checkpoint"].addr
    run_ranks("async_save_kill", addr, "dcp", 26, 4, tmp_path)
    wait_committed(addr, "dcp", 26)
    for out in run_ranks("load", addr, "dcp", 26, 3, tmp_path):
        assert_bit_exact(out)


def test_async_save_stages_with_one_collective_and_writes_replicated_items_once(daemons, tmp_path):
    # DCP's save runs four object collectives (plans gathered and scattered,
    # results gathered, outcome broadcast); the writer's staging runs one.
    addr = daemons["checkpoint"].addr
    for r, out in enumerate(run_ranks("async_save_count", addr, "dcp", 27, 4, tmp_path)):
        assert json.loads(out.read_text()) == ["all_gather_object"], f"rank {r}"
    manifest = StokerReader("dcp", addr, step=27).manifest()
    chunks: dict[str, list[Any]] = {}
    for c in manifest.chunks:
        chunks.setdefault(c.tensor, []).append(c)
    # Every rank holds the plain tensors: each is stored once, whole.
    for name in ("model.scale", "optim.step", "model.mask"):
        assert len(chunks[name]) == 1, name
    assert len(chunks["model.embed.weight"]) == 4  # 37 rows over 4 ranks
    doc = json.loads(StokerReader("dcp", addr, step=27).read_blob(METADATA_TENSOR))
    assert doc["entries"]["model.scale"]["chunks"] == [{"offsets": [0], "sizes": [5]}]
    assert len(doc["entries"]["model.embed.weight"]["chunks"]) == 4
    assert doc["planner_data"]["extra.dataset.next_step"] == ["extra", "dataset", "next_step"]
    for out in run_ranks("load", addr, "dcp", 27, 3, tmp_path):
        assert_bit_exact(out)


def test_manifest_holds_every_item_as_a_stoker_chunk(daemons, tmp_path):
    addr = daemons["checkpoint"].addr
    run_ranks("save", addr, "dcp", 30, 2, tmp_path)
    reader = StokerReader("dcp", addr, step=30)
    manifest = reader.manifest()
    assert manifest.world == 2
    names = {c.tensor for c in manifest.chunks}
    assert {"model.embed.weight", "model.scale", "optim.step", METADATA_TENSOR} <= names
    # The embedding is sharded 37 rows over 2 ranks: two boxes of 19 and 18 rows.
    boxes = sorted(
        (tuple(c.box.offsets), tuple(c.box.sizes))
        for c in manifest.chunks
        if c.tensor == "model.embed.weight"
    )
    assert boxes == [((0, 0), (19, 16)), ((19, 0), (18, 16))]
    doc = json.loads(reader.read_blob(METADATA_TENSOR))
    assert doc["entries"]["model.block.0.weight"]["dtype"] == "bfloat16"
    assert doc["entries"]["extra.note"]["kind"] == "bytes"
    assert doc["planner_data"]["extra.dataset.next_step"] == ["extra", "dataset", "next_step"]

    ctl = subprocess.run(
        [
            str(binary("stokerctl")),
            "--checkpoint",
            addr,
            "--json",
            "checkpoint",
            "show",
            "dcp",
            "30",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert ctl.returncode == 0, ctl.stderr
    shown = json.loads(ctl.stdout)
    text = json.dumps(shown)
    assert "model.embed.weight" in text and "BF16" in text and "BOOL" in text, text[:2000]


def test_a_load_of_many_boxes_comes_in_few_messages(daemons, tmp_path, monkeypatch):
    """The reader asks for several pieces per message (pack_pieces): every
    chunk's box of a checkpoint comes in one message. A request without the
    field (a client from before it) gets one message per box, the same
    pieces (issue 26, part 2)."""
    addr = daemons["checkpoint"].addr
    run_ranks("save", addr, "dcp", 31, 1, tmp_path)
    reader = StokerReader("dcp", addr, step=31)
    wanted = [ckpt_pb.ChunkEntry(tensor=c.tensor, box=c.box) for c in reader.manifest().chunks]
    assert len(wanted) >= 8

    def read(pack: bool) -> list[ckpt_pb.ReadChunk]:
        req = ckpt_pb.ReadRequest(job="dcp", step=31, wanted=wanted, pack_pieces=pack)
        return list(
            reader.conn.server_stream(RPC.Read.path, req, RPC.Read.response_type, timeout=60)
        )

    def key(p: tuple[ckpt_pb.ReadChunk, Any]) -> tuple[str, list[int], bytes]:
        return p[0].tensor, list(p[0].box.offsets), bytes(p[1])

    one = read(False)
    assert len(one) == len(wanted) and not any(m.pieces for m in one)
    packed = read(True)
    assert len(packed) == 1 and not packed[0].tensor and len(packed[0].pieces) == len(wanted)
    assert [key(p) for p in _read_pieces(packed)] == [key((m, m.data)) for m in one]

    asked = []
    stream = reader.conn.server_stream

    def spy(method: str, req: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append((req.pack_pieces, req.pack_data))
        return stream(method, req, *args, **kwargs)

    monkeypatch.setattr(reader.conn, "server_stream", spy)
    assert [key(p) for p in reader._read(wanted)] == [key((m, m.data)) for m in one]
    assert asked == [(True, True)]


def test_a_load_takes_its_bytes_from_one_field_per_message(daemons, tmp_path):
    """The reader asks for its pieces' bytes in one field of each message
    (pack_data): a resharded read (saved at 2 ranks, read in thirds of every
    tensor) gives the same pieces and bytes as the form without it, which
    a request without pack_data still gets; pack_data without pack_pieces
    is refused (issue 26, part 2)."""
    addr = daemons["checkpoint"].addr
    run_ranks("save", addr, "dcpform", 5, 2, tmp_path)
    reader = StokerReader("dcpform", addr, step=5)
    wanted = []
    for c in reader.manifest().chunks:
        shape = list(c.global_shape)
        if len(shape) != 2 or shape[0] < 3 or c.box.offsets[0] != 0:
            continue
        for k in range(3):
            lo, hi = shape[0] * k // 3, shape[0] * (k + 1) // 3
            box = ckpt_pb.Box(offsets=[lo, 0], sizes=[hi - lo, shape[1]])
            wanted.append(ckpt_pb.ChunkEntry(tensor=c.tensor, box=box))
    assert len(wanted) >= 6

    def read(pack_data: bool) -> list[ckpt_pb.ReadChunk]:
        req = ckpt_pb.ReadRequest(
            job="dcpform", step=5, wanted=wanted, pack_pieces=True, pack_data=pack_data
        )
        return list(
            reader.conn.server_stream(RPC.Read.path, req, RPC.Read.response_type, timeout=60)
        )

    old, new = read(False), read(True)
    assert all(p.data_length == 0 and not m.packed_data for m in old for p in m.pieces)
    assert all(not p.data for m in new for p in m.pieces)
    assert sum(len(m.packed_data) for m in new) == sum(len(p.data) for m in old for p in m.pieces)
    got_old = [(p.tensor, list(p.box.offsets), bytes(d)) for p, d in _read_pieces(old)]
    got_new = [(p.tensor, list(p.box.offsets), bytes(d)) for p, d in _read_pieces(new)]
    assert got_new == got_old and len(got_new) >= len(wanted)

    bad = ckpt_pb.ReadRequest(job="dcpform", step=5, wanted=wanted, pack_data=True)
    with pytest.raises(StokerError) as e:
        list(reader.conn.server_stream(RPC.Read.path, bad, RPC.Read.response_type, timeout=60))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "pack_data needs pack_pieces" in str(e.value)


def test_names_outside_the_services_alphabet_are_mapped_and_kept():
    assert storage_name("model.layers.0.weight") == "model.layers.0.weight"
    odd = storage_name("model.blocks:0/attn weight")
    assert odd.startswith("x/") and " " not in odd and ":" not in odd
    assert storage_name("a..b") != storage_name("a._b")


def test_bad_input_raises_with_the_status(daemons):
    addr = daemons["checkpoint"].addr
    with pytest.raises(StokerError) as e:
        StokerReader("nojob", addr, step=5).manifest()
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(StokerError) as e:
        StokerReader("nojob", addr).latest_step()
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(StokerError) as e:
        StokerWriter("dcp", addr).reset("not-a-step")
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(StokerError) as e:
        StokerWriter("Bad/Job", addr, step=1).prepare_global_plan([])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_a_load_that_cannot_start_raises_the_services_error_itself(tmp_path):
    """dcp.load of a checkpoint the service cannot give (no such step, a
    token outside its scope) raises the StokerError with the service's
    message and status, not DCP's CheckpointException (a BaseException
    whose failures hold only an AssertionError's text) (issue 26, part 6)."""
    tokens = tmp_path / "tokens"
    tokens.write_text("op-token\na-token team-a-*\n")
    d = Daemon("checkpoint", tmp_path, "--token-file", str(tokens))
    try:
        op = Security(token="op-token")
        state = {"w": torch.arange(6, dtype=torch.float32)}
        dcp.save(
            state,
            storage_writer=StokerWriter("team-b-1", d.addr, security=op),
            checkpoint_id=4,
            no_dist=True,
        )
        got = {"w": torch.zeros(6)}
        with pytest.raises(StokerError) as e:
            dcp.load(
                got,
                storage_reader=StokerReader("team-b-1", d.addr, security=op),
                checkpoint_id=5,
                no_dist=True,
            )
        assert e.value.code == grpc.StatusCode.NOT_FOUND, e.value
        assert "step 5" in str(e.value), str(e.value)
        team_a = StokerReader("team-b-1", d.addr, security=Security(token="a-token"))
        with pytest.raises(StokerError) as e:
            dcp.load(got, storage_reader=team_a, checkpoint_id=4, no_dist=True)
        assert e.value.code == grpc.StatusCode.PERMISSION_DENIED, e.value
        assert "'team-a-*'" in str(e.value) and "'team-b-1'" in str(e.value), str(e.value)
        assert not torch.any(got["w"])  # nothing was read
        dcp.load(
            got,
            storage_reader=StokerReader("team-b-1", d.addr, security=op),
            checkpoint_id=4,
            no_dist=True,
        )
        assert torch.equal(got["w"], state["w"])
    finally:
        d.stop()


def test_a_c_trainer_checkpoint_is_read_from_python(daemons, tmp_path):
    """One format, two clients: two stoker-train ranks (C) write checkpoints;
    Python lists them, reads the manifest, and loads every parameter shard
    through DCP at world size 1; the bytes equal the C trainer's own dump."""
    env = dict(
        os.environ,
        STOKER_COORDINATOR=daemons["coordinator"].addr,
        STOKER_DATALOADER=daemons["dataloader"].addr,
        STOKER_CHECKPOINT=daemons["checkpoint"].addr,
        OMP_NUM_THREADS="1",
    )
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    licences = sorted(pathlib.Path("/usr/share/common-licenses").glob("*"))
    for i in range(4):
        (corpus / f"part-{i}.txt").write_text(
            "".join(p.read_text(errors="replace") for p in licences[i::4] if p.is_file())
        )
    ctl = [str(binary("stokerctl")), "--coordinator", env["STOKER_COORDINATOR"]]
    subprocess.run(
        [*ctl, "job", "create", "cj", "--min", "2", "--max", "2", "--last-call", "200ms"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    dump = tmp_path / "params.f32"
    ranks = [
        subprocess.Popen(
            [
                str(binary("stoker-train")),
                "--job",
                "cj",
                "--member",
                f"r{r}",
                "--corpus",
                str(corpus),
                "--steps",
                "6",
                "--checkpoint-every",
                "3",
                "--dump-params",
                str(dump),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    for p in ranks:
        out = p.communicate(timeout=240)[0].decode()
        assert p.returncode == 0, out[-3000:]

    reader = StokerReader("cj", env["STOKER_CHECKPOINT"])
    assert reader.latest_step() == 6
    reader.reset(None)
    metadata = reader.read_metadata()
    params = sorted(
        (n for n in metadata.state_dict_metadata if n.endswith("/param")),
        key=lambda n: int(n.removeprefix("unit").split("/")[0]),
    )
    assert params and "trainer/state" in metadata.state_dict_metadata
    state = {n: torch.zeros(metadata.state_dict_metadata[n].size) for n in params}
    state["trainer/state"] = torch.zeros(
        metadata.state_dict_metadata["trainer/state"].size, dtype=torch.uint8
    )
    loader = StokerReader("cj", env["STOKER_CHECKPOINT"])
    dcp.load(state, storage_reader=loader, checkpoint_id=6, no_dist=True)
    assert loader.transport == "shm"
    assert read_files(env["STOKER_CHECKPOINT"]) == []
    assert int.from_bytes(bytes(state["trainer/state"][:8].tolist()), "little") == 6
    want = torch.frombuffer(bytearray(dump.read_bytes()), dtype=torch.float32)
    got = torch.cat([state[n] for n in params])
    # Units are padded to a multiple of the world size: the padding is zero.
    assert got.numel() >= want.numel()
    at = 0
    for n in params:
        t = state[n]
        real = t[: min(t.numel(), want.numel() - at)]
        assert torch.equal(real, want[at : at + real.numel()]), n
        at += real.numel()
    assert at == want.numel()


def test_a_dtype_without_a_checkpoint_type_is_refused_before_anything_is_sent(daemons):
    addr = daemons["checkpoint"].addr
    state = {"ok": torch.ones(4), "z": torch.ones(3, dtype=torch.complex64)}
    # DCP gathers each rank's exception (and its trace) in a CheckpointException.
    with pytest.raises(CheckpointException) as e:
        dcp.save(state, storage_writer=StokerWriter("bad", addr), checkpoint_id=1, no_dist=True)
    err, _ = e.value.failures[0]
    assert isinstance(err, StokerError), repr(err)
    assert service_error(e.value) is err and service_error(err) is err
    assert service_error(RuntimeError("x")) is None
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT and "complex64" in err.details
    with pytest.raises(StokerError) as nf:
        StokerReader("bad", addr).latest_step()
    assert nf.value.code == grpc.StatusCode.NOT_FOUND  # nothing was begun or committed


class _FailingPlanner(DefaultSavePlanner):
    """Fails while the writer resolves one item: a rank's write breaking
    after the attempt began (out of memory, a tensor it cannot read)."""

    def resolve_data(self, write_item: Any) -> Any:
        if write_item.index.fqn == "broken":
            raise RuntimeError("cannot read tensor 'broken'")
        return super().resolve_data(write_item)


def test_a_rank_whose_write_fails_aborts_the_attempt_at_once(daemons):
    addr = daemons["checkpoint"].addr
    writer = StokerWriter("wf", addr)
    state = {"a": torch.ones(8), "broken": torch.zeros(4)}
    with pytest.raises(CheckpointException):
        dcp.save(
            state,
            storage_writer=writer,
            planner=_FailingPlanner(),
            checkpoint_id=3,
            no_dist=True,
        )
    # Aborted now, not after the service's idle timeout: a commit is refused
    # at once with the rank's reason (it would wait minutes otherwise).
    conn = Connection(addr, timeout=10)
    t0 = time.monotonic()
    with pytest.raises(StokerError) as e:
        conn.unary(
            "/stoker.v1.Checkpoint/Commit",
            ckpt_pb.CommitCheckpointRequest(attempt=writer._attempt),
            common_pb2.CheckpointRef,
        )
    assert e.value.code != grpc.StatusCode.DEADLINE_EXCEEDED, e.value
    assert "cannot read tensor 'broken'" in e.value.details, e.value.details
    assert time.monotonic() - t0 < 5


def test_a_later_save_copies_into_the_segment_files_this_process_kept_mapped(daemons):
    # The first save's segment goes back to the service's pool once it is
    # uploaded; the second save claims that file again and copies into the
    # mapping it kept (no pwrite, no page faults). Its smaller tensor must
    # still load exactly: the file is cut to the bytes of this save.
    addr = daemons["checkpoint"].addr
    g = torch.Generator().manual_seed(7)
    first = {"w": torch.randn(4096, 64, generator=g)}
    second = {"w": torch.randn(1000, 64, generator=g), "b": torch.arange(5)}
    before = _segmap.reused
    dcp.save(first, storage_writer=StokerWriter("segmap", addr), checkpoint_id=1, no_dist=True)
    dcp.save(second, storage_writer=StokerWriter("segmap", addr), checkpoint_id=2, no_dist=True)
    assert _segmap.reused > before
    loaded = {"w": torch.zeros(1000, 64), "b": torch.zeros(5, dtype=torch.int64)}
    dcp.load(loaded, storage_reader=StokerReader("segmap", addr), checkpoint_id=2, no_dist=True)
    assert torch.equal(loaded["w"], second["w"]) and torch.equal(loaded["b"], second["b"])


def test_the_writers_generation_is_listed_with_each_checkpoint(daemons, monkeypatch):
    # The generation comes from the argument, else from STOKER_GENERATION
    # (the Stoker rendezvous sets it for torchrun's workers); the service
    # lists it beside each checkpoint. A bad variable is refused at once.
    addr = daemons["checkpoint"].addr
    state = {"w": torch.arange(10.0)}
    dcp.save(
        state,
        storage_writer=StokerWriter("gens", addr, generation=7),
        checkpoint_id=1,
        no_dist=True,
    )
    monkeypatch.setenv("STOKER_GENERATION", "9")
    dcp.save(state, storage_writer=StokerWriter("gens", addr), checkpoint_id=2, no_dist=True)
    listed = Jobs(checkpoint=addr).checkpoints("gens")
    assert [(c.step, c.generation) for c in listed] == [(1, 7), (2, 9)]
    monkeypatch.setenv("STOKER_GENERATION", "two")
    with pytest.raises(StokerError) as e:
        StokerWriter("gens", addr)
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and "STOKER_GENERATION" in str(e.value)


def test_an_idle_attempt_is_aborted_and_logged_once(tmp_path):
    """The idle timeout's abort leaves one line in the daemon's log (job,
    step, attempt, reason), not only a metric."""
    d = Daemon("checkpoint", tmp_path, "--attempt-idle-timeout", "200ms")
    try:
        attempt = StokerWriter("idle", d.addr, step=7).begin(2)  # no rank ever writes
        log = tmp_path / "checkpoint.log"
        deadline = time.monotonic() + 20
        while "checkpoint.aborted" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
        time.sleep(0.5)  # a second line would come with the next sweeps
        lines = [x for x in log.read_text().splitlines() if "checkpoint.aborted" in x]
    finally:
        d.stop()
    assert len(lines) == 1, lines
    assert f"job=idle step=7 attempt={attempt}: " in lines[0] and "abandoned" in lines[0], lines


def test_replicas_behind_one_address_save_and_load_through_their_owners(tmp_path):
    """Three checkpoint replicas over one store, the ranks given only the one
    gRPC target naming all three (as a headless Service's name resolves):
    Begin lands on any replica, every rank's bytes go through the shared
    memory of the replica that owns the attempt (the handle names it), loads
    read through the directory of the replica that answered (StagingInfo
    names it); after one replica stopped, the next save and load go to the
    others (issue 26)."""
    store = tmp_path / "store"
    store.mkdir()
    reps = []
    for i in range(3):
        root = tmp_path / f"r{i}"
        root.mkdir()
        reps.append(
            Daemon(
                "checkpoint",
                root,
                "--storage",
                f"file://{store}",
                "--advertise-host",
                "127.0.0.1",
                "--shared-storage",
            )
        )
    one = "ipv4:" + ",".join(d.addr for d in reps)
    try:
        run_ranks("save", one, "rep", 10, 2, tmp_path)
        for out in run_ranks("load", one, "rep", 10, 1, tmp_path):
            assert_bit_exact(out)
        reps[0].stop()
        assert reps[0].proc is not None and reps[0].proc.returncode == 0
        run_ranks("save", one, "rep", 11, 2, tmp_path)
        for out in run_ranks("load", one, "rep", 11, 1, tmp_path):
            assert_bit_exact(out)
        for d in reps[1:]:
            assert StokerReader("rep", d.addr).latest_step() == 11
        # A save and a load close their channels (to the target and to the
        # owning replica) when they are over, leaving none for the
        # interpreter's exit: a rank torn down there with channels open
        # once aborted ("terminate called without an active exception").
        writer, reader = StokerWriter("rep", one), StokerReader("rep", one)
        state = {"w": torch.arange(6.0)}
        dcp.save(state, storage_writer=writer, checkpoint_id=12, no_dist=True)
        assert writer.last_commit is not None and not writer.conn.is_open
        dcp.load(state, storage_reader=reader, checkpoint_id=12, no_dist=True)
        assert reader.transport == "shm" and not reader.conn.is_open
    finally:
        for d in reps:
            d.stop()

"""stoker.data's receive through libstoker-client (stoker._native) against
the real dataloader daemon: it is used when the library is found and yields
exactly what gRPC Python yields, tokens in the ring in place; the ring slot
of a batch goes back when its last tensor is freed; a missing library falls
back to gRPC Python; the C client's failures surface as StokerError with
the gRPC status and message; a daemon that stops answering ends the stream
with DEADLINE_EXCEEDED within the timeout, on both receivers."""

from __future__ import annotations

import gc
import os
import signal

import grpc
import pytest
import torch
from conftest import Daemon
from test_data import create_loader, in_ring

from stoker import StokerError, _native
from stoker.connection import Security
from stoker.data import StokerDataset

NATIVE = "(libstoker-client)"


def test_the_library_is_used_and_yields_the_bytes_of_grpc_python(daemons, monkeypatch):
    addr = daemons["dataloader"].addr
    create_loader(addr)

    def read(transport: str) -> tuple[str, list[tuple[torch.Tensor, ...]]]:
        ds = StokerDataset(
            "pt",
            address=addr,
            rank=1,
            world_size=2,
            steps=8,
            doc_starts=True,
            transport=transport,
            prefetch=1,
        )
        samples = list(ds)
        return repr(ds), samples  # The transport in use, once there is one.

    native_repr, native = read("auto")
    assert f"transport=shm {NATIVE}" in native_repr, native_repr
    # Every batch comes through the ring, step 0 (which sized it) too: views
    # until the trainer holds half of the ring's 4 (prefetch 1), then copies.
    assert [in_ring(s[0]) for s in native] == [True, True] + [False] * 6
    native_inline_repr, native_inline = read("grpc")
    assert f"transport=grpc {NATIVE}" in native_inline_repr
    monkeypatch.setenv("STOKER_CLIENT_LIBRARY", "off")
    python_repr, python = read("auto")
    assert "transport=shm (grpcio)" in python_repr, python_repr
    for a, b, c in zip(native, native_inline, python, strict=True):
        for x, y, z in zip(a, b, c, strict=True):  # inputs, targets, doc_starts
            assert x.dtype == torch.int64 and torch.equal(x, y) and torch.equal(x, z)


def test_a_missing_library_falls_back_to_grpc_python(daemons, monkeypatch):
    addr = daemons["dataloader"].addr
    create_loader(addr)
    monkeypatch.setenv("STOKER_CLIENT_LIBRARY", "/nonexistent/libstoker-client.so")
    ds = StokerDataset("pt", address=addr, rank=0, world_size=1, steps=3, prefetch=1)
    assert len(list(ds)) == 3
    assert "transport=shm (grpcio)" in repr(ds), repr(ds)


def test_a_slot_goes_back_when_the_last_tensor_over_it_is_freed(daemons):
    addr = daemons["dataloader"].addr
    create_loader(addr)
    lib = _native.library()
    assert lib is not None
    stream = _native.NativeStream(
        lib, addr, Security(), "pt", 0, 0, 1, 1, _native.SHM_REQUIRE, 20.0
    )
    try:
        kept = []
        for step in (0, 1, 2):  # The first too: it sized the ring, and went through it.
            got, tokens, lines, line_tokens, _, slots = stream.next(20.0, False)
            assert got == step and slots == 4  # prefetch 1: 2 x 1 + 2 slots
            t = torch.from_numpy(tokens).view(lines, line_tokens)
            kept.append((t[:, :-1], t[:, 1:]))  # inputs and targets over one slot
            del tokens, t
            assert stream.lent == len(kept)
        inputs = kept.pop()[0]
        gc.collect()
        assert stream.lent == 3  # The slot's inputs tensor is still alive.
        del inputs
        assert stream.lent == 2
        kept.clear()
        assert stream.lent == 0
        # With every slot free again the stream goes on through the ring.
        for step in range(3, 11):
            got, tokens, *_, slots = stream.next(20.0, False)
            assert got == step and slots == 4 and stream.lent == 1
            del tokens
    finally:
        stream.close()


def test_errors_of_the_c_client_carry_the_grpc_status(daemons, tmp_path):
    addr = daemons["dataloader"].addr
    create_loader(addr)
    ds = StokerDataset("nope", address=addr, rank=0, world_size=1, steps=1)
    with pytest.raises(StokerError) as e:
        list(ds)
    assert e.value.code == grpc.StatusCode.NOT_FOUND and "nope" in e.value.details
    assert e.value.method == "/stoker.v1.Dataloader/StreamBatches"
    # A ring this process cannot open (the daemon's directory moved away,
    # as from another host): "shm" refuses, "auto" falls back to inline.
    (tmp_path / "second").mkdir()
    d = Daemon("dataloader", tmp_path / "second", "--shm-dir", str(tmp_path / "shm"))
    try:
        create_loader(d.addr)
        os.rename(tmp_path / "shm", tmp_path / "elsewhere")
        with pytest.raises(StokerError) as e:
            list(StokerDataset("pt", address=d.addr, steps=6, prefetch=1, transport="shm"))
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION, e.value
        assert "shared-memory transport required" in e.value.details
        ds = StokerDataset("pt", address=d.addr, steps=6, prefetch=1)
        assert len(list(ds)) == 6
        assert f"transport=grpc {NATIVE}" in repr(ds), repr(ds)
    finally:
        d.stop()


@pytest.mark.parametrize("receiver", ["libstoker-client", "grpcio"])
def test_a_daemon_that_stops_answering_ends_the_stream_within_the_timeout(
    daemons, monkeypatch, receiver
):
    if receiver == "grpcio":
        monkeypatch.setenv("STOKER_CLIENT_LIBRARY", "off")
    d = daemons["dataloader"]
    create_loader(d.addr)
    it = iter(StokerDataset("pt", address=d.addr, rank=0, world_size=1, prefetch=1, timeout=1))
    next(it)
    assert d.proc is not None
    d.proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(StokerError) as e:
            for _ in range(50):  # What was prefetched comes first.
                next(it)
        assert e.value.code == grpc.StatusCode.DEADLINE_EXCEEDED, e.value
        assert "no batch within 1 s" in e.value.details
    finally:
        d.proc.send_signal(signal.SIGCONT)

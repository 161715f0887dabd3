"""``stoker.data``: the Stoker dataloader as a PyTorch dataset.

:class:`StokerDataset` is an ``IterableDataset`` that yields this rank's slice
of each training step, ``(inputs, targets)``, two int64 tensors
``[lines, seq_len]`` (targets are inputs shifted by one token), plus the
document starts when asked. A batch is a pure function of (job, step, rank,
world size) on the service, so the dataset's whole state is the next step:
``state_dict()`` / ``load_state_dict()`` follow torchdata's
``StatefulDataLoader`` protocol, and a state saved at one world size resumes
at another with the same global batches (the service's rescale guarantee).

Transport: batches stream with ``StreamBatches`` (the service prefetches).
A trainer on the daemon's host gets the tokens through the daemon's
shared-memory ring instead of the socket, written there as int64: the
yielded tensors are views of the ring's memory (no copy and no conversion),
and the slot goes back to the daemon when the last tensor over it is freed.
A trainer that keeps many batches alive gets copies instead once it holds
half the ring, so the stream never waits on it. Elsewhere the tokens come
inline over gRPC as uint32 and are converted. ``transport="auto"`` picks by
trying the ring. The stream is received by libstoker-client when it is
found (``stoker._native``: the C client's threads receive and run the ring
protocol, Python wraps the tokens), else by gRPC Python with this module's
own ring reader (``stoker._ring``); the ``repr`` shows both choices, e.g.
``transport=shm (libstoker-client)``. A scaled-out loader (several part
addresses), and each of several DataLoader workers, reads with ``GetBatch``
(gRPC Python) and assembles here.

Legend: L = lines of the rank's slice, T = seq_len, tokens per line T + 1.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc
import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import IterableDataset, get_worker_info

from stoker import _native
from stoker._proto import Service
from stoker._ring import NONCE_BYTES, Ring, RingError
from stoker.connection import Connection, Security, address_from_env
from stoker.errors import StokerError, invalid_argument
from stoker.v1 import dataloader_pb2 as pb

RPC = Service(pb, "Dataloader")  # the RPCs, by name, from the descriptor
STATE_VERSION = 1
TRANSPORTS = ("auto", "shm", "grpc")

Sample = tuple[torch.Tensor, ...]
T = TypeVar("T")
NATIVE = "libstoker-client"


def resolve_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: torch.distributed when initialised, else the
    arguments, else torchrun's RANK / WORLD_SIZE, else 0 of 1."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        r, w = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        r = rank if rank is not None else int(os.environ.get("RANK", "0"))
        w = world_size if world_size is not None else int(os.environ.get("WORLD_SIZE", "1"))
    if w < 1 or not 0 <= r < w:
        raise invalid_argument(f"rank {r} is out of range for world size {w}")
    return r, w


class StokerDataset(IterableDataset[Sample]):
    """This rank's batches of a dataloader job, step after step.

    Args:
        job: the dataloader job, created with
            ``stoker.jobs.Jobs().create_loader(...)`` or ``stokerctl loader create``.
        address: ``HOST:PORT`` of the dataloader, or a comma-separated list of
            the parts of a scaled-out one; default ``STOKER_DATALOADER``.
        rank, world_size: used when torch.distributed is not initialised
            (else torchrun's ``RANK`` / ``WORLD_SIZE``).
        start_step: the first step served (``load_state_dict`` overrides it).
        steps: how many steps to serve; None: without end.
        doc_starts: also yield an int64 ``[n, 2]`` tensor of (line, position)
            where a document starts in ``inputs`` (for document masking).
        transport: ``"auto"`` (shared memory when on the daemon's host),
            ``"shm"`` or ``"grpc"``. ``"shm"``: every batch through the ring,
            from each stream's first; a stream whose ring cannot be opened
            (another host) or that the daemon serves without one (its
            shm-dir off, a batch over its shm-ring-max, tmpfs full) fails
            with FAILED_PRECONDITION. Only a batch larger than the ring's
            slots (the shape grew at a mixture's step) still comes inline.
        prefetch: batches the service prepares ahead of the trainer.
        timeout: seconds a call may take, and how long the dataset keeps
            reconnecting to a restarting service before it gives up.

    Yields per step: ``inputs [L, T]`` and ``targets [L, T]`` int64 (and
    ``doc_starts``). Use it with ``batch_size=None``: an item is a batch.
    """

    def __init__(
        self,
        job: str,
        *,
        address: str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        start_step: int = 0,
        steps: int | None = None,
        doc_starts: bool = False,
        transport: str = "auto",
        prefetch: int = 4,
        timeout: float = 60.0,
        security: Security | None = None,
    ) -> None:
        super().__init__()
        if not job:
            raise invalid_argument("job must be a non-empty name")
        if transport not in TRANSPORTS:
            raise invalid_argument(f"transport must be one of {TRANSPORTS}, not {transport!r}")
        if start_step < 0 or (steps is not None and steps < 0) or prefetch < 0:
            raise invalid_argument("start_step, steps and prefetch must be >= 0")
        addr = address_from_env("STOKER_DATALOADER", address)
        self.job = job
        self.parts = [
            Connection(a.strip(), security, timeout) for a in addr.split(",") if a.strip()
        ]
        self._rank_arg, self._world_arg = rank, world_size
        self.start_step = start_step
        self.steps = steps
        self.doc_starts = doc_starts
        self.transport = transport
        self.prefetch = prefetch
        self.timeout = timeout
        self._next_step = start_step
        self._in_use = "not started"

    # ---- the StatefulDataLoader protocol ----------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The position: the next step this dataset yields. Plain types only,
        so it travels in a DCP checkpoint as it is."""
        rank, world = resolve_rank_world(self._rank_arg, self._world_arg)
        return {
            "version": STATE_VERSION,
            "job": self.job,
            "next_step": self._next_step,
            "rank": rank,
            "world_size": world,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resumes at the saved step, at this process's rank and world size
        (which may differ from the saved ones: the global batches are the same)."""
        if state.get("version") != STATE_VERSION:
            raise invalid_argument(
                f"dataset state version {state.get('version')!r} is not {STATE_VERSION}"
            )
        if state.get("job") != self.job:
            raise invalid_argument(
                f"dataset state of job {state.get('job')!r} loaded into job {self.job!r}"
            )
        step = state.get("next_step")
        if not isinstance(step, int) or step < 0:
            raise invalid_argument(f"dataset state has no valid next_step: {step!r}")
        self._next_step = step

    # ---- service calls -------------------------------------------------------

    def info(self) -> pb.LoaderInfo:
        """The job's spec and committed step (``GetLoader``)."""
        info: pb.LoaderInfo = self.parts[0].unary(
            RPC.GetLoader.path,
            pb.GetLoaderRequest(job=self.job),
            RPC.GetLoader.response_type,
            retry=True,
        )
        return info

    def commit(self, step: int) -> None:
        """Makes the service state at ``step`` durable (call it when a
        checkpoint of that step is committed)."""
        for part in self.parts:
            part.unary(
                RPC.Commit.path,
                pb.CommitRequest(job=self.job, step=step),
                RPC.Commit.response_type,
                retry=True,
            )

    @property
    def transport_in_use(self) -> str:
        """How the last batch yielded came (what the repr shows):
        ``"shm (libstoker-client)"``, ``"grpc (grpcio)"``, ..., or ``"not started"``."""
        return self._in_use

    def __repr__(self) -> str:
        addrs = ",".join(p.address for p in self.parts)
        return (
            f"StokerDataset(job={self.job!r}, address={addrs!r}, "
            f"next_step={self._next_step}, transport={self._in_use})"
        )

    # ---- iteration -------------------------------------------------------------

    def __iter__(self) -> Iterator[Sample]:
        rank, world = resolve_rank_world(self._rank_arg, self._world_arg)
        worker = get_worker_info()
        end = None if self.steps is None else self.start_step + self.steps
        if worker is not None and worker.num_workers > 1:
            # DataLoader workers take steps round-robin, which the loader's
            # in-order output turns back into step order.
            yield from self._strided(rank, world, worker.id, worker.num_workers, end)
        elif len(self.parts) > 1:
            yield from self._strided(rank, world, 0, 1, end)
        else:
            yield from self._streamed(rank, world, end)

    def _sample(
        self, tokens: NDArray[Any], lines: int, line_tokens: int, starts: NDArray[Any] | None
    ) -> Sample:
        """Tokens are uint32 (converted here) or int64 (used as they are:
        a ring slot's memory, or a copy of it)."""
        if tokens.dtype != np.int64:
            tokens = tokens.astype(np.int64)
        t = torch.from_numpy(tokens.reshape(lines, line_tokens))
        out: tuple[torch.Tensor, ...] = (t[:, :-1], t[:, 1:])
        if self.doc_starts:
            s = np.empty((0, 2), np.int64) if starts is None else starts
            out = (*out, torch.from_numpy(s))
        return out

    def _streamed(self, rank: int, world: int, end: int | None) -> Iterator[Sample]:
        lib = _native.library() if get_worker_info() is None else None
        stream: _BatchStream | _NativeBatchStream = (
            _BatchStream(self, rank, world)
            if lib is None
            else _NativeBatchStream(self, rank, world, lib)
        )
        try:
            while end is None or self._next_step < end:
                tokens, lines, line_tokens, starts = stream.next(self._next_step)
                sample = self._sample(tokens, lines, line_tokens, starts)
                stream.release()
                self._in_use = stream.transport
                self._next_step += 1
                yield sample
        finally:
            stream.close()

    def _strided(
        self, rank: int, world: int, worker: int, workers: int, end: int | None
    ) -> Iterator[Sample]:
        self._in_use = "grpc (GetBatch" + (
            f", {len(self.parts)} parts)" if len(self.parts) > 1 else ")"
        )
        step = self._next_step + ((worker - self._next_step) % workers)
        while end is None or step < end:
            tokens, lines, line_tokens, starts = self._get_assembled(step, rank, world)
            sample = self._sample(tokens, lines, line_tokens, starts)
            step += workers
            self._next_step = step
            yield sample

    def _get_assembled(
        self, step: int, rank: int, world: int
    ) -> tuple[NDArray[Any], int, int, NDArray[Any] | None]:
        req = pb.GetBatchRequest(job=self.job, step=step, rank=rank, world=world)
        batches = [
            p.unary(RPC.GetBatch.path, req, RPC.GetBatch.response_type, retry=True)
            for p in self.parts
        ]
        if len(batches) == 1 and batches[0].parts <= 1:
            b = batches[0]
            return (_tokens(b), b.lines, b.line_tokens, _starts(b.doc_starts, b.line_tokens))
        return assemble(batches)


def _tokens(b: pb.Batch) -> NDArray[Any]:
    want = b.lines * b.line_tokens * 4
    if len(b.tokens) != want:
        raise StokerError(
            grpc.StatusCode.DATA_LOSS,
            f"batch of step {b.step}: {len(b.tokens)} token bytes, "
            f"{b.lines} x {b.line_tokens} lines need {want}",
        )
    return np.frombuffer(b.tokens, dtype="<u4")


def _starts(flat: Any, line_tokens: int) -> NDArray[Any]:
    """(line, position) pairs from flat indices into [lines, line_tokens]."""
    a = np.asarray(flat, dtype=np.int64)
    return (
        np.stack([a // line_tokens, a % line_tokens], axis=1)
        if a.size
        else np.empty((0, 2), np.int64)
    )


def assemble(batches: list[pb.Batch]) -> tuple[NDArray[Any], int, int, NDArray[Any]]:
    """Joins the partial batches of every part of a scaled-out loader into
    the rank's whole slice (line i of part p is line positions[i])."""
    first = batches[0]
    lines, line_tokens = first.slice_lines, first.line_tokens
    out = np.zeros((lines, line_tokens), np.uint32)
    filled = np.zeros(lines, bool)
    starts = []
    for b in batches:
        if b.parts != len(batches) or b.slice_lines != lines or b.line_tokens != line_tokens:
            raise StokerError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"step {b.step}: part {b.part}/{b.parts} does not match the "
                f"{len(batches)} addresses given",
            )
        pos = np.asarray(b.positions, np.int64)
        if len(pos) != b.lines or (pos.size and (pos.max() >= lines or filled[pos].any())):
            raise StokerError(
                grpc.StatusCode.DATA_LOSS, f"step {b.step}: part {b.part} sent bad line positions"
            )
        out[pos] = _tokens(b).reshape(b.lines, line_tokens)
        filled[pos] = True
        s = _starts(b.doc_starts, line_tokens)
        if s.size:
            s[:, 0] = pos[s[:, 0]]
            starts.append(s)
    if not filled.all():
        raise StokerError(
            grpc.StatusCode.DATA_LOSS, f"step {first.step}: the parts left lines unfilled"
        )
    all_starts = np.concatenate(starts) if starts else np.empty((0, 2), np.int64)
    order = np.lexsort((all_starts[:, 1], all_starts[:, 0]))
    return out.reshape(-1), lines, line_tokens, all_starts[order]


class _BatchStream:
    """One StreamBatches call from a step on, through the ring when the
    daemon shares this host; reopened from the next step after a failure
    (UNAVAILABLE: a restarting daemon) until the dataset's timeout."""

    def __init__(self, ds: StokerDataset, rank: int, world: int) -> None:
        self.ds = ds
        self.rank, self.world = rank, world
        self.conn = ds.parts[0]
        self.use_shm = ds.transport in ("auto", "shm")
        self.transport = "grpc (grpcio)"
        self.ring: Ring | None = None
        self.nonce = b""
        self.call: Any = None
        self.queue: list[pb.Batch] = []
        self.expect = -1
        self.held_seq = 0  # A slot to release once the sample is built (copied out).
        self.lent = _Lent()  # Slots whose memory yielded tensors still use.
        self.watchdog = _Watchdog(ds.timeout)

    def _open(self, step: int) -> None:
        self.close_call()
        self.nonce = os.urandom(NONCE_BYTES) if self.use_shm else b""
        # No count even when the dataset ends: a stream that ended removes
        # its ring, maybe before this client attached to it. The call is
        # cancelled instead once the last step is in.
        req = pb.StreamBatchesRequest(
            job=self.ds.job,
            from_step=step,
            rank=self.rank,
            world=self.world,
            prefetch=self.ds.prefetch,
            shm_nonce=self.nonce,
            shm_token_bytes=8 if self.use_shm else 0,
        )
        self.call = self.conn.server_stream(
            RPC.StreamBatches.path, req, RPC.StreamBatches.response_type
        )
        self.queue = []
        self.expect = step

    def next(self, step: int) -> tuple[NDArray[Any], int, int, NDArray[Any] | None]:
        return _reopening(self.ds, lambda: self._next(step), self.close_call)

    def _next(self, step: int) -> tuple[NDArray[Any], int, int, NDArray[Any] | None]:
        if self.call is None or self.expect != step:
            self._open(step)
        b = self._receive()
        if b.step != step:
            raise StokerError(
                grpc.StatusCode.DATA_LOSS, f"stream sent step {b.step}, expected {step}"
            )
        self.expect = step + 1
        return self._payload(b)

    def _receive(self) -> pb.Batch:
        if not self.queue:
            # A stream has no deadline (it lives as long as training), so the
            # stream's watchdog bounds the wait for each message instead.
            self.watchdog.arm(self.call)
            try:
                msg = next(self.call)
            except StopIteration:
                if self.watchdog.fired:
                    raise StokerError(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"no batch within {self.ds.timeout:g} s",
                        RPC.StreamBatches.path,
                    ) from None
                raise StokerError(
                    grpc.StatusCode.UNAVAILABLE,
                    "the batch stream ended early",
                    RPC.StreamBatches.path,
                ) from None
            finally:
                self.watchdog.disarm()
            self.queue = [msg, *msg.more]
        return self.queue.pop(0)

    def _payload(self, b: pb.Batch) -> tuple[NDArray[Any], int, int, NDArray[Any] | None]:
        starts = _starts(b.doc_starts, b.line_tokens) if self.ds.doc_starts else None
        if b.shm_seq == 0:
            if self.ds.transport == "shm" and self.ring is None:
                raise _no_ring(b.step)
            self.transport = "grpc (grpcio)"
            return _tokens(b), b.lines, b.line_tokens, starts
        if b.shm_path:
            self._attach(b.shm_path)
        if self.ring is None:
            raise StokerError(
                grpc.StatusCode.DATA_LOSS, f"step {b.step} is in a ring this stream never named"
            )
        self.transport = "shm (grpcio)"
        view = self.ring.view(b.shm_seq, b.lines * b.line_tokens, np.int64)
        if self.lent.count >= self.ring.slots // 2:
            # The trainer keeps batches: a copy, so the daemon is not kept waiting.
            self.held_seq = b.shm_seq
            return view.copy(), b.lines, b.line_tokens, starts
        self.lent.lend(view, self.ring, b.shm_seq)
        return view, b.lines, b.line_tokens, starts

    def _attach(self, path: str) -> None:
        if self.ring is not None:
            self.ring.close()
        try:
            self.ring = Ring(path, self.nonce)
            self.transport = "shm (grpcio)"
        except RingError as e:
            if self.ds.transport == "shm":
                raise StokerError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"shared-memory transport asked for, but {e}",
                ) from None
            # Not the daemon's host: ask again for bytes inline.
            self.use_shm = False
            self.ring = None
            raise StokerError(grpc.StatusCode.UNAVAILABLE, str(e)) from None

    def release(self) -> None:
        """The sample was copied out: the slot may be reused."""
        if self.held_seq and self.ring is not None:
            self.ring.release(self.held_seq)
        self.held_seq = 0

    def close_call(self) -> None:
        if self.call is not None:
            self.call.cancel()
            self.call = None
        self.release()
        if self.ring is not None:
            self.ring.close()
            self.ring = None

    def close(self) -> None:
        self.close_call()
        self.watchdog.close()


def _no_ring(step: int) -> StokerError:
    """transport="shm", and the stream's first batch came inline: the daemon
    makes no ring for it."""
    return StokerError(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"shared-memory transport asked for, but the dataloader sent step {step} inline "
        "(its shm-dir is off, the batch is over its shm-ring-max, or its tmpfs is full)",
        RPC.StreamBatches.path,
    )


def _reopening(ds: StokerDataset, attempt: Callable[[], T], reset: Callable[[], None]) -> T:
    """attempt() until it succeeds; after a failure, reset() and, if it was
    UNAVAILABLE (a restarting daemon), again with backoff until the
    dataset's timeout."""
    deadline = time.monotonic() + ds.timeout
    delay = 0.05
    while True:
        try:
            return attempt()
        except StokerError as e:
            reset()
            if e.code != grpc.StatusCode.UNAVAILABLE or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


class _NativeBatchStream:
    """The StreamBatches of a step on through libstoker-client: the C
    client receives, maps the ring and checks the stream; this wraps each
    batch's int64 tokens (a view of its ring slot, lent until the last
    tensor over it is freed) and reopens from the next step after
    UNAVAILABLE until the dataset's timeout. The C stream falls back to
    inline bytes by itself where the ring is not on this host."""

    def __init__(self, ds: StokerDataset, rank: int, world: int, lib: Any) -> None:
        self.ds = ds
        self.rank, self.world = rank, world
        self.lib = lib
        self.stream: _native.NativeStream | None = None
        self.expect = -1
        self.ring_seen = False
        self.transport = f"grpc ({NATIVE})"

    def _open(self, step: int) -> _native.NativeStream:
        self.close()
        conn = self.ds.parts[0]
        self.stream = _native.NativeStream(
            self.lib,
            conn.address,
            conn.security,
            self.ds.job,
            step,
            self.rank,
            self.world,
            self.ds.prefetch,
            _native.SHM_MODES[self.ds.transport],
            self.ds.timeout,
        )
        self.expect = step
        self.ring_seen = False  # A batch of this stream came through the ring.
        return self.stream

    def next(self, step: int) -> tuple[NDArray[Any], int, int, NDArray[Any] | None]:
        return _reopening(self.ds, lambda: self._next(step), self.close)

    def _next(self, step: int) -> tuple[NDArray[Any], int, int, NDArray[Any] | None]:
        stream = (
            self.stream if self.stream is not None and self.expect == step else self._open(step)
        )
        got, tokens, lines, line_tokens, flat, slots = stream.next(
            self.ds.timeout, self.ds.doc_starts
        )
        if got != step:
            raise StokerError(grpc.StatusCode.DATA_LOSS, f"stream sent step {got}, expected {step}")
        self.expect = step + 1
        if not slots and self.ds.transport == "shm" and not self.ring_seen:
            raise _no_ring(got)
        self.transport = f"{'shm' if slots else 'grpc'} ({NATIVE})"
        if slots:
            self.ring_seen = True
            if stream.lent > slots // 2:
                # The trainer keeps batches: a copy (the view's slot goes
                # back at once), so the daemon is not kept waiting.
                tokens = tokens.copy()
        starts = None if flat is None else _starts(flat, line_tokens)
        return tokens, lines, line_tokens, starts

    def release(self) -> None:
        """Nothing to do: a copied-out slot went back when its view was dropped."""

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None


class _Lent:
    """Counts the ring slots lent out as tensors: each is released to the
    daemon by a finalizer when the last array (and so tensor) over its
    memory is freed, on whichever thread frees it."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def lend(self, view: NDArray[Any], ring: Ring, seq: int) -> None:
        with self._lock:
            self.count += 1
        weakref.finalize(view, self._returned, ring, seq)

    def _returned(self, ring: Ring, seq: int) -> None:
        ring.release(seq)
        with self._lock:
            self.count -= 1


class _Watchdog:
    """Cancels a call that has not delivered within `seconds` of being
    armed; one thread per stream, armed and disarmed around each message.

    Arming only stores a deadline: it never wakes the thread (a wake-up per
    message costs two thread switches and the GIL hand-offs with them). The
    thread sleeps `seconds` at a time while disarmed, and every deadline is
    `seconds` after it was set, so it is always later than the sleeping
    thread's next wake-up, which then waits out the rest precisely."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.fired = False
        self._cv = threading.Condition()
        self._call: Any = None
        self._deadline: float | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    def arm(self, call: Any) -> None:
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, daemon=True, name="stoker-stream-watchdog"
                )
                self._thread.start()
            self._call = call
            self.fired = False
            self._deadline = time.monotonic() + self.seconds

    def disarm(self) -> None:
        with self._cv:
            self._deadline = None
            self._call = None

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()

    def _run(self) -> None:
        with self._cv:
            while not self._closed:
                if self._deadline is None:
                    self._cv.wait(self.seconds)
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cv.wait(left)
                    continue
                self.fired = True
                self._deadline = None
                if self._call is not None:
                    self._call.cancel()

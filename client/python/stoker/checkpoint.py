"""``stoker.checkpoint``: the Stoker checkpoint service as
``torch.distributed.checkpoint`` (DCP) storage.

``dcp.save(state_dict, storage_writer=StokerWriter(job), checkpoint_id=step)``
and ``dcp.load(state_dict, storage_reader=StokerReader(job), checkpoint_id=step)``
(``dcp.async_save`` too). Every DCP write item becomes a Stoker chunk: the
item's fully qualified name is the tensor name, its chunk offsets and sizes
are the box, so the service checks coverage at commit and serves any box at
load: a checkpoint saved by N ranks loads at any other world size, and the
service, not this process, intersects the boxes. Byte items (RNG state, the
dataset's ``state_dict``, step counters: whatever DCP pickles) are 1-D
``DTYPE_BYTES`` tensors.

How a save maps onto the service:
1. the coordinator rank calls ``Begin(job, step, world)`` in
   ``prepare_global_plan`` and hands the attempt to every rank's plan, with
   a JSON description of the state dict for rank 0 to store beside it
   (``__dcp__/metadata.json``: each name's torch dtype and shape, and DCP's
   flattening of nested state dicts; plain JSON, never a pickle);
2. each rank streams its items with one ``Write`` call: the bytes through
   the service's shared-memory segments when it runs on this host
   (``stoker._segments``), else inline (boxes larger than a message or a
   segment are cut into runs of rows);
3. the coordinator's ``finish`` calls ``Commit``, which answers once every
   rank's bytes are durable and the manifest is written.

``dcp.async_save`` with ``StokerWriter(job, step=s)`` returns once the
service holds every byte of the rank (the writer is its own ``AsyncStager``,
see below and ``stoker._staged_save``): at once while the service's staging
budget has room for them, else after uploads made that room.

Errors: a load given a ``checkpoint_id`` fetches the manifest when DCP
calls ``reset``, before DCP's own error handling, so a checkpoint the
service cannot give raises its :class:`StokerError` out of ``dcp.load``.
A failure later (while planning, writing or reading) reaches the caller
the way DCP reports it, as a ``CheckpointException`` holding each failed
rank's exception; :func:`service_error` returns the StokerError in it. A
load without ``checkpoint_id`` reads the metadata inside DCP's handling,
which keeps only its message (in an AssertionError): pass the step.

A checkpoint without that JSON (the C trainer's) is described from its
manifest alone: its tensors load like any DCP checkpoint's, its blobs as
``uint8`` tensors.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import re
import warnings
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import grpc
import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from stoker._proto import Service
from stoker._segments import ShmStaging
from stoker._shm_read import DATA as SHM_READ_DATA
from stoker._shm_read import ShmReadFile, read_directory
from stoker._staged_save import stage_on_service
from stoker.connection import Connection, Security, address_from_env
from stoker.elastic import ENV_GENERATION
from stoker.errors import StokerError, invalid_argument
from stoker.v1 import checkpoint_pb2 as pb

RPC = Service(pb, "Checkpoint")  # the RPCs, by name, from the descriptor
METADATA_TENSOR = "__dcp__/metadata.json"
METADATA_VERSION = 1
# Largest chunk per message; the daemons accept 64 MiB messages.
DEFAULT_CHUNK_BYTES = 4 << 20

# torch dtype <-> the service's DType (element sizes agree).
_TO_PB = {
    torch.float32: pb.DTYPE_F32,
    torch.bfloat16: pb.DTYPE_BF16,
    torch.float16: pb.DTYPE_F16,
    torch.int64: pb.DTYPE_I64,
    torch.uint8: pb.DTYPE_U8,
    torch.float64: pb.DTYPE_F64,
    torch.int32: pb.DTYPE_I32,
    torch.int16: pb.DTYPE_I16,
    torch.int8: pb.DTYPE_I8,
    torch.bool: pb.DTYPE_BOOL,
    torch.uint16: pb.DTYPE_U16,
    torch.uint32: pb.DTYPE_U32,
    torch.uint64: pb.DTYPE_U64,
}
_FROM_PB = {v: k for k, v in _TO_PB.items()} | {pb.DTYPE_BYTES: torch.uint8}
_NAME_CHARS = re.compile(r"[^A-Za-z0-9._/-]")


def parse_step(checkpoint_id: str | os.PathLike[str] | int | None, default: int | None) -> int:
    """The step a DCP checkpoint_id names: ``120``, ``"120"`` or ``"step-120"``."""
    if checkpoint_id is None:
        if default is None:
            raise invalid_argument("no checkpoint step: pass checkpoint_id= or step=")
        return default
    text = os.fspath(checkpoint_id) if not isinstance(checkpoint_id, int) else str(checkpoint_id)
    m = re.fullmatch(r"(?:step-)?(\d{1,12})", text.rsplit("/", 1)[-1])
    if not m:
        raise invalid_argument(f"checkpoint_id {text!r} is not a step (120 or step-120)")
    return int(m.group(1))


def service_error(exc: BaseException) -> StokerError | None:
    """The :class:`StokerError` behind a failed ``dcp.save`` / ``dcp.load``:
    ``exc`` itself, or the first rank's among the failures of DCP's
    ``CheckpointException`` (a ``BaseException``: ``except Exception`` does
    not catch it, and its text is every rank's traceback), else None."""
    if isinstance(exc, StokerError):
        return exc
    for failure in sorted(getattr(exc, "failures", {}).items()):
        err = failure[1][0]
        if isinstance(err, StokerError):
            return err
    return None


def storage_name(fqn: str) -> str:
    """The service's tensor name for a DCP name: the same where it is a valid
    name ([A-Za-z0-9._/-], no empty, '.' or '..' segment), else a cleaned name
    with a checksum of the original (the JSON records the mapping)."""
    segments = fqn.split("/")
    if (
        fqn
        and not _NAME_CHARS.search(fqn)
        and len(fqn) <= 400
        and all(s not in ("", ".", "..") and ".." not in s for s in segments)
    ):
        return fqn
    clean = _NAME_CHARS.sub("_", fqn).replace("/", "_").replace("..", "_.")[:360].strip(".")
    return f"x/{clean or 'name'}-{zlib.crc32(fqn.encode()):08x}"


# ---- writing -----------------------------------------------------------------


@dataclass
class _RankPlan:
    """What the coordinator hands each rank in SavePlan.storage_data."""

    attempt: str
    rank: int
    metadata_json: bytes | None  # rank 0 only


class StokerWriter(StorageWriter):
    """DCP ``StorageWriter`` onto the checkpoint service.

    Args:
        job: the checkpoint job name ([a-z0-9._-]).
        address: ``HOST:PORT`` of the service; default ``STOKER_CHECKPOINT``.
        step: the step when ``dcp.save`` gets no ``checkpoint_id``.
        chunk_bytes: largest chunk per message.
        timeout: seconds for each call (Begin, Commit; Write as a whole).
        process_group: the group ``async_save``'s staging (``step=`` given)
            runs its one collective on: the group given to ``dcp.async_save``
            (e.g. a gloo group beside NCCL); None: the default group. Its
            rank 0 begins the attempt. ``dcp.save`` uses DCP's own group.
        generation: the coordinator generation of the ranks saving, which
            ``stokerctl checkpoint list`` shows beside the checkpoint;
            default: ``STOKER_GENERATION``, which the Stoker rendezvous sets
            for torchrun's workers (0 when unknown).
        detach: commit detached (the job's last save before its ranks exit,
            on a preemption notice): ``finish`` returns once the service has
            decided the commit (every rank's bytes staged and validated, the
            decision journaled), not once the manifest is written; the
            service commits after the ranks are gone, and the checkpoint is
            visible (List, restore, the coordinator) only then. Storage
            refusing the uploads, or the service dying before every byte is
            uploaded, aborts it instead (the service logs why).
    """

    def __init__(
        self,
        job: str,
        address: str | None = None,
        *,
        step: int | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        timeout: float = 600.0,
        security: Security | None = None,
        process_group: Any = None,
        generation: int | None = None,
        detach: bool = False,
    ) -> None:
        super().__init__()
        if chunk_bytes < 1:
            raise invalid_argument("chunk_bytes must be positive")
        if generation is None:
            text = os.environ.get(ENV_GENERATION, "") or "0"
            if not text.isdigit():
                raise invalid_argument(f"{ENV_GENERATION}={text!r} is not a generation")
            generation = int(text)
        if generation < 0:
            raise invalid_argument(f"generation {generation} is negative")
        self.generation = generation
        self.detach = detach
        self.job = job
        self.conn = Connection(
            address_from_env("STOKER_CHECKPOINT", address), security, timeout, spread=True
        )
        self.default_step = step
        self.step: int | None = step
        self.chunk_bytes = chunk_bytes
        self.process_group = process_group
        self._commit_only = False  # after stage(): the background save only commits
        self._fallback: DefaultStager | None = None
        self.is_coordinator = False
        self._attempt = ""  # Of the save in progress (coordinator only).
        self.transport = "not used"  # "shm" or "grpc": how this rank's bytes went
        self.last_commit: Any = None  # CheckpointRef of the last finish()

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        step = parse_step(checkpoint_id, self.default_step)
        if self._commit_only and step != self.step:
            self._commit_only = False
            raise invalid_argument(f"checkpoint_id {step} is not the staged step {self.step}")
        self.step = step

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            parse_step(checkpoint_id, None)
        except StokerError:
            return False
        return True

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=f"stoker:{self.job}/{self.step}")

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Refuses, before anything is sent, a tensor whose dtype the
        service has no type for (complex, float8)."""
        for item in plan.items:
            td = item.tensor_data
            if td is not None and td.properties.dtype not in _TO_PB:
                known = ", ".join(sorted(str(d).removeprefix("torch.") for d in _TO_PB))
                raise invalid_argument(
                    f"{item.index.fqn}: dtype {td.properties.dtype} has no checkpoint type "
                    f"(supported: {known})"
                )
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        if self._commit_only:
            return plans  # stage() wrote everything under its own attempt
        attempt = self.begin(len(plans))
        doc = describe_plans(plans)
        return [
            replace(p, storage_data=_RankPlan(attempt, i, doc if i == 0 else None))
            for i, p in enumerate(plans)
        ]

    def begin(self, world: int) -> str:
        """Begins an attempt at self.step for world ranks (coordinator only);
        returns its handle, ``ID`` or ``ID@OWNER`` when the service runs as
        replicas (every call of the attempt then goes to the owner). A
        draining replica's UNAVAILABLE is retried: another one answers."""
        begun = self.conn.unary(
            RPC.Begin.path,
            pb.BeginRequest(
                job=self.job,
                step=parse_step(None, self.step),
                world=world,
                generation=self.generation,
            ),
            pb.BeginResponse,
            retry=True,
        )
        owner = str(begun.owner)
        self._attempt = f"{begun.attempt}@{owner}" if owner else str(begun.attempt)
        return self._attempt

    def _route(self, handle: str) -> tuple[str, Connection]:
        """The attempt id a handle names and the connection to its owner."""
        attempt, _, owner = handle.partition("@")
        return attempt, self.conn.peer(owner) if owner else self.conn

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """This rank's Write stream. A rank other than the coordinator is
        done with the service then and closes its channels (see ``close``)."""
        try:
            return self._write_data(plan, planner)
        finally:
            if not self.is_coordinator:
                self.conn.close()

    def _write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        if self._commit_only:
            self._commit_only = False  # (the coordinator commits in finish)
            fut_done: Future[list[WriteResult]] = Future()
            fut_done.set_result([])
            return fut_done
        handle: _RankPlan = plan.storage_data
        attempt, conn = self._route(handle.attempt)
        rp = replace(handle, attempt=attempt)
        results: list[WriteResult] = []
        failed: list[BaseException] = []

        def messages() -> Iterator[pb.WriteChunk]:
            # grpc consumes this on its own thread and reports a failure in
            # it only as CANCELLED: keep the real exception to raise it here.
            try:
                yield from self._messages(conn, rp, plan.items, planner, results)
            except BaseException as e:
                failed.append(e)
                raise

        try:
            conn.client_stream(RPC.Write.path, messages(), RPC.Write.response_type)
        except StokerError as e:
            self._abort(handle.attempt, failed[0] if failed else e)
            if failed:
                raise failed[0] from None
            raise
        except BaseException as e:
            self._abort(handle.attempt, e)
            raise
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def _messages(
        self,
        conn: Connection,
        rp: _RankPlan,
        items: list[WriteItem],
        planner: SavePlanner,
        results: list[WriteResult],
    ) -> Iterator[pb.WriteChunk]:
        staging = ShmStaging.open(conn, rp.attempt, rp.rank)
        self.transport = "shm" if staging else "grpc"
        limit = staging.cap if staging else self.chunk_bytes
        try:
            for item in items:
                fqn = item.index.fqn
                if item.type == WriteItemType.BYTE_IO:
                    blob = planner.resolve_data(item)
                    data = blob.getvalue() if isinstance(blob, io.BytesIO) else bytes(blob)
                    yield from self._blob(rp, storage_name(fqn), data, limit, staging)
                    results.append(WriteResult(item.index, len(data), None))
                    continue
                td = item.tensor_data
                assert td is not None
                resolved = planner.resolve_data(item)
                assert isinstance(resolved, torch.Tensor)
                tensor = resolved.detach().to("cpu").contiguous()
                for offsets, piece in _pieces(tensor, list(td.chunk.offsets), limit):
                    msg = pb.WriteChunk(
                        attempt=rp.attempt,
                        rank=rp.rank,
                        tensor=storage_name(fqn),
                        dtype=_TO_PB[tensor.dtype],
                        global_shape=list(td.size),
                        box=pb.Box(offsets=offsets, sizes=list(piece.shape)),
                    )
                    yield from self._emit(msg, _raw(piece), staging)
                nbytes = tensor.numel() * tensor.element_size()
                results.append(WriteResult(item.index, nbytes, None))
            if rp.metadata_json is not None:
                yield from self._blob(rp, METADATA_TENSOR, rp.metadata_json, limit, staging)
            if staging is not None:
                yield from staging.flush()
        except BaseException:
            if staging is not None:
                staging.discard()
            raise
        yield pb.WriteChunk(attempt=rp.attempt, rank=rp.rank, last=True)

    def _abort(self, handle: str, why: BaseException) -> None:
        """This rank cannot write its part: ends the attempt at once (the
        other ranks' writes fail, its staging is freed) rather than leaving
        it to the service's idle timeout. Best effort: the save's own error
        is what the caller sees."""
        reason = f"rank's write failed: {type(why).__name__}: {why}"[:500]
        attempt, conn = self._route(handle)
        with contextlib.suppress(StokerError):
            conn.unary(
                RPC.Abort.path,
                pb.AbortCheckpointRequest(attempt=attempt, reason=reason),
                RPC.Abort.response_type,
            )

    @staticmethod
    def _emit(msg: pb.WriteChunk, raw: Any, staging: ShmStaging | None) -> Iterator[pb.WriteChunk]:
        """A chunk's bytes into a segment (metadata only on the wire) or inline."""
        if staging is not None:
            yield from staging.add(msg, raw, memoryview(raw).nbytes)
        else:
            msg.data = bytes(raw)
            yield msg

    def _blob(
        self, rp: _RankPlan, name: str, data: bytes, limit: int, staging: ShmStaging | None
    ) -> Iterator[pb.WriteChunk]:
        if not data:
            return  # An empty blob has no box; the JSON still names it.
        for off in range(0, len(data), limit):
            piece = data[off : off + limit]
            msg = pb.WriteChunk(
                attempt=rp.attempt,
                rank=rp.rank,
                tensor=name,
                dtype=pb.DTYPE_BYTES,
                global_shape=[len(data)],
                box=pb.Box(offsets=[off], sizes=[len(piece)]),
            )
            yield from self._emit(msg, piece, staging)

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Commits: answers once every rank's bytes are durable and the
        manifest is written (with ``detach``: once the commit is decided),
        or raises why the attempt failed."""
        self._commit_only = False
        attempt, conn = self._route(self._attempt)
        try:
            self.last_commit = conn.unary(
                RPC.Commit.path,
                pb.CommitCheckpointRequest(attempt=attempt, detach=self.detach),
                RPC.Commit.response_type,
            )
        finally:
            self.conn.close()  # the save is over (see close)

    # ---- dcp.async_save: returns once the service has the bytes -------------
    # StokerWriter is its own AsyncStager. With a step given to the writer,
    # stage() plans and runs this rank's Write stream in the training thread
    # with one collective (stoker._staged_save) and returns when the service
    # answered "staged" (bytes in its memory or in shared-memory segments it
    # owns): async_save returns then, and the service commits by itself once
    # every byte is durable, even if the trainer dies. The background half of
    # async_save only waits for that commit. Without a step (checkpoint_id
    # known only later) staging falls back to DCP's own CPU copy and the
    # bytes move in the background.

    _synchronize_after_execute = False

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        if self.default_step is None:
            if self._fallback is None:
                self._fallback = DefaultStager(StagingOptions(False, False, False, False))
            staged = self._fallback.stage(state_dict)
            assert isinstance(staged, dict)
            return staged
        self.step = self.default_step
        stage_on_service(self, state_dict, self.process_group)
        self._commit_only = True
        return {}

    def synchronize_staging(self) -> None:
        """Staging is synchronous: nothing to wait for."""

    def close(self) -> None:
        """Closes the writer's channels (to the service and to the replica
        that owned an attempt) and DCP's stager when one was made. A save
        closes the channels itself when it is over (a rank's Write stream,
        the coordinator's Commit), so that none is left for the
        interpreter's exit to tear down under gRPC's threads; a later save
        opens them again."""
        self.conn.close()
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None


def _raw(t: torch.Tensor) -> Any:
    """The tensor's bytes as a buffer (a view where it is contiguous)."""
    flat = t.reshape(-1) if t.dim() else t.reshape(1)
    return flat.contiguous().view(torch.uint8).numpy()


def _pieces(
    t: torch.Tensor, offsets: list[int], max_bytes: int
) -> Iterator[tuple[list[int], torch.Tensor]]:
    """Cuts a box into sub-boxes of at most max_bytes (runs of whole rows,
    recursing into a dimension only when one of its rows is too large);
    zero-element boxes are skipped (nothing to store)."""
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return
    if nbytes <= max_bytes or t.dim() == 0:
        yield offsets, t
        return
    d = next(i for i, n in enumerate(t.shape) if n > 1)
    row = nbytes // t.shape[d]
    step = max(1, max_bytes // row)
    for start in range(0, t.shape[d], step):
        n = min(step, t.shape[d] - start)
        sub_off = list(offsets)
        sub_off[d] += start
        yield from _pieces(t.narrow(d, start, n), sub_off, max_bytes)


def describe_plans(plans: list[SavePlan]) -> bytes:
    """The JSON stored as __dcp__/metadata.json: per DCP name its storage
    name and kind; for tensors the torch dtype, global shape and the
    chunks as DCP planned them; DCP's flattening (planner_data) when plain."""
    entries: dict[str, dict[str, Any]] = {}
    for plan in plans:
        for item in plan.items:
            fqn = item.index.fqn
            e = entries.setdefault(fqn, {"name": storage_name(fqn)})
            if item.type == WriteItemType.BYTE_IO:
                e["kind"] = "bytes"
                continue
            td = item.tensor_data
            assert td is not None
            e["kind"] = "tensor"
            e["dtype"] = str(td.properties.dtype).removeprefix("torch.")
            e["shape"] = list(td.size)
            e.setdefault("chunks", []).append(
                {"offsets": list(td.chunk.offsets), "sizes": list(td.chunk.sizes)}
            )
    mappings: dict[str, Any] = {}
    for plan in plans:
        if isinstance(plan.planner_data, dict):
            mappings.update(plan.planner_data)
    try:
        planner_data = json.loads(json.dumps({k: list(v) for k, v in mappings.items()}))
    except (TypeError, ValueError):
        planner_data = None
    doc = {"version": METADATA_VERSION, "entries": entries, "planner_data": planner_data}
    return json.dumps(doc, sort_keys=True).encode()


# ---- reading -----------------------------------------------------------------


def _box_contains(
    outer_off: list[int], outer_size: list[int], off: list[int], size: list[int]
) -> bool:
    return all(
        o <= a and a + n <= o + m
        for o, m, a, n in zip(outer_off, outer_size, off, size, strict=True)
    )


class StokerReader(StorageReader):
    """DCP ``StorageReader`` onto the checkpoint service.

    Args:
        job: the checkpoint job name.
        address: ``HOST:PORT`` of the service; default ``STOKER_CHECKPOINT``.
        step: the step when ``dcp.load`` gets no ``checkpoint_id``; None and
            no checkpoint_id: the newest committed checkpoint of the job.
    """

    def __init__(
        self,
        job: str,
        address: str | None = None,
        *,
        step: int | None = None,
        timeout: float = 600.0,
        security: Security | None = None,
    ) -> None:
        super().__init__()
        self.job = job
        self.conn = Connection(
            address_from_env("STOKER_CHECKPOINT", address), security, timeout, spread=True
        )
        self.default_step = step
        self.step: int | None = step
        self.names: dict[str, str] = {}  # DCP name -> storage name
        self.dtypes: dict[str, torch.dtype] = {}  # storage name -> element type
        self.blob_sizes: dict[str, int] = {}  # storage name -> bytes
        # How the last read_data's bytes came: "shm" (a read file) or "grpc".
        self.transport = "grpc"
        self._manifest: pb.Manifest | None = None  # Of self.step, until the next reset.

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """Names the checkpoint to read and, given a ``checkpoint_id``, fetches
        its manifest at once. ``dcp.load`` calls this before its own error
        handling, so a checkpoint that cannot be read (no such step, outside
        the token's scope, the service down) raises the service's
        :class:`StokerError` out of ``dcp.load`` as it is, rather than inside
        DCP's ``CheckpointException`` (a ``BaseException``)."""
        self._manifest = None
        self.step = (
            None
            if checkpoint_id is None and self.default_step is None
            else parse_step(checkpoint_id, self.default_step)
        )
        if checkpoint_id is not None:
            self._manifest = self.manifest()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return StokerWriter.validate_checkpoint_id(checkpoint_id)

    def latest_step(self) -> int:
        """The newest committed step of the job (NOT_FOUND when there is none)."""
        listed = self.conn.unary_pages(
            RPC.List.path,
            pb.ListCheckpointsRequest(job=self.job),
            RPC.List.response_type,
            "checkpoints",
        )
        if not listed:
            raise StokerError(
                grpc.StatusCode.NOT_FOUND, f"job {self.job!r} has no committed checkpoint"
            )
        return int(max(c.step for c in listed))

    def manifest(self) -> pb.Manifest:
        """The stored manifest of the checkpoint being read."""
        if self._manifest is not None:
            return self._manifest
        if self.step is None:
            self.step = self.latest_step()
        m: pb.Manifest = self.conn.unary(
            RPC.GetManifest.path,
            pb.GetManifestRequest(job=self.job, step=self.step),
            RPC.GetManifest.response_type,
            retry=True,
        )
        self._manifest = m  # Until the next reset.
        return m

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        manifest = self.manifest()
        chunks: dict[str, list[pb.ChunkEntry]] = defaultdict(list)
        for c in manifest.chunks:
            chunks[c.tensor].append(c)
        for name, cs in chunks.items():
            self.dtypes[name] = _FROM_PB.get(cs[0].dtype, torch.uint8)
            if cs[0].dtype == pb.DTYPE_BYTES:
                self.blob_sizes[name] = int(cs[0].global_shape[0])
        if METADATA_TENSOR in chunks:
            doc = json.loads(self.read_blob(METADATA_TENSOR, chunks[METADATA_TENSOR]))
            return self._from_json(doc)
        return self._from_manifest(chunks)

    def _from_json(self, doc: dict[str, Any]) -> Metadata:
        if doc.get("version") != METADATA_VERSION:
            raise StokerError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"checkpoint metadata version {doc.get('version')!r} is not {METADATA_VERSION}",
            )
        md: dict[str, Any] = {}
        for fqn, e in doc["entries"].items():
            self.names[fqn] = e["name"]
            if e["kind"] == "bytes":
                md[fqn] = BytesStorageMetadata()
                continue
            dtype = getattr(torch, e["dtype"])
            self.dtypes[e["name"]] = dtype
            md[fqn] = TensorStorageMetadata(
                properties=TensorProperties(dtype=dtype),
                size=torch.Size(e["shape"]),
                chunks=[
                    ChunkStorageMetadata(
                        offsets=torch.Size(c["offsets"]), sizes=torch.Size(c["sizes"])
                    )
                    for c in e["chunks"]
                ],
            )
        pd = doc.get("planner_data")
        planner_data = {k: tuple(v) for k, v in pd.items()} if isinstance(pd, dict) else None
        return Metadata(
            state_dict_metadata=md,
            planner_data=planner_data,
            storage_meta=StorageMeta(checkpoint_id=f"stoker:{self.job}/{self.step}"),
        )

    def _from_manifest(self, chunks: dict[str, list[pb.ChunkEntry]]) -> Metadata:
        """A checkpoint written without DCP (the C trainer): every stored
        tensor as it is, blobs as uint8 tensors."""
        md: dict[str, Any] = {}
        for name, cs in chunks.items():
            self.names[name] = name
            md[name] = TensorStorageMetadata(
                properties=TensorProperties(dtype=self.dtypes[name]),
                size=torch.Size(cs[0].global_shape),
                chunks=[
                    ChunkStorageMetadata(
                        offsets=torch.Size(c.box.offsets), sizes=torch.Size(c.box.sizes)
                    )
                    for c in cs
                ],
            )
        return Metadata(
            state_dict_metadata=md,
            storage_meta=StorageMeta(checkpoint_id=f"stoker:{self.job}/{self.step}"),
        )

    def read_blob(self, name: str, chunks: list[pb.ChunkEntry] | None = None) -> bytes:
        """The whole of a 1-D tensor or blob, as bytes."""
        if chunks is None:
            chunks = [c for c in self.manifest().chunks if c.tensor == name]
        if not chunks:
            raise StokerError(grpc.StatusCode.NOT_FOUND, f"no tensor {name!r} in the checkpoint")
        size = int(chunks[0].global_shape[0])
        out = bytearray(size)
        want = pb.ChunkEntry(tensor=name, box=pb.Box(offsets=[0], sizes=[size]))
        for piece, data in self._read([want]):
            off = piece.box.offsets[0]
            out[off : off + len(data)] = data
        return bytes(out)

    def _blob_size(self, name: str) -> int:
        if not self.blob_sizes:
            for c in self.manifest().chunks:
                if c.dtype == pb.DTYPE_BYTES:
                    self.blob_sizes[c.tensor] = int(c.global_shape[0])
        return self.blob_sizes.get(name, 0)

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if not self.names:  # metadata read on another rank and broadcast
            for fqn, m in metadata.state_dict_metadata.items():
                self.names[fqn] = storage_name(fqn)
                if isinstance(m, TensorStorageMetadata):
                    self.dtypes[self.names[fqn]] = m.properties.dtype
        if self.step is None and metadata.storage_meta is not None:
            self.step = parse_step(str(metadata.storage_meta.checkpoint_id), None)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _read(
        self, wanted: list[pb.ChunkEntry], shm: ShmReadFile | None = None, replica: str = ""
    ) -> Iterator[tuple[pb.ReadChunk, bytes | memoryview]]:
        """A Read call's pieces with their bytes, in order: to any replica
        inline, to replica (the one whose directory holds the read file)
        through shared memory. The service sends several pieces per message
        (pack_pieces: a restore of many small boxes is a few messages, not
        one per box) and, inline, their bytes in the message's one field
        (pack_data: the service sends them as assembled, without a copy)."""
        assert self.step is not None
        req = pb.ReadRequest(
            job=self.job, step=self.step, wanted=wanted, pack_pieces=True, pack_data=shm is None
        )
        if shm is not None:
            req.shm_name, req.shm_nonce = shm.name, shm.nonce
        conn = self.conn.peer(replica) if replica else self.conn
        return _read_pieces(
            conn.server_stream(RPC.Read.path, req, RPC.Read.response_type, timeout=conn.timeout)
        )

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Every item of the plan in one Read call (the service coalesces the
        ranged reads and streams sub-boxes): through a shared-memory file on
        the service's host (``stoker._shm_read``), else inline, where each
        piece lands in place. The load is over then: the channels close."""
        try:
            return self._read_data(plan, planner)
        finally:
            self.close()

    def close(self) -> None:
        """Closes the reader's channels (to the service and to the replica
        whose directory a read used); a later call opens them again."""
        self.conn.close()

    def _read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        wants = []
        for item in plan.items:
            name = self.names.get(item.storage_index.fqn, storage_name(item.storage_index.fqn))
            w = _Want.of(item, name)
            if item.type == LoadItemType.BYTE_IO:
                # DCP asks for a blob with length 0: "all of it".
                w.sizes = [self._blob_size(name)]
            else:
                w.target = planner.resolve_tensor(item).detach()
            if w.nbytes(self.dtypes.get(name, torch.uint8)) == 0:
                self._complete(w, planner)
                continue
            wants.append(w)
        shm = read_directory(self.conn) if wants else None
        self.transport = "grpc"
        if shm is None or not self._read_shm(wants, planner, *shm):
            self._read_inline(wants, planner)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read_inline(self, wants: list[_Want], planner: LoadPlanner) -> None:
        pending: dict[str, list[_Want]] = defaultdict(list)
        wanted = []
        for w in wants:
            pending[w.name].append(w)
            box = pb.Box(offsets=w.offsets, sizes=w.sizes)
            wanted.append(pb.ChunkEntry(tensor=w.name, box=box))
        if wanted:
            for piece, data in self._read(wanted):
                self._place(piece, data, pending, planner)
        _no_bytes([w for ws in pending.values() for w in ws])

    def _read_shm(
        self, wants: list[_Want], planner: LoadPlanner, d: str, cap: int, replica: str
    ) -> bool:
        """The wants through read files of at most cap bytes (a Read call per
        file's worth, the file reused); False when no file could be made."""
        room = cap - SHM_READ_DATA
        groups: list[list[_Part]] = [[]]
        used = 0
        for w in wants:
            for part in _parts(w, self.dtypes.get(w.name, torch.uint8), room):
                if used + part.nbytes > room and groups[-1]:
                    groups.append([])
                    used = 0
                part.start = SHM_READ_DATA + used
                groups[-1].append(part)
                used += part.nbytes
        size = SHM_READ_DATA + max(sum(p.nbytes for p in g) for g in groups)
        try:
            f = ShmReadFile(d, size)
        except OSError:
            return False  # e.g. the shm directory is full or not ours
        self.transport = "shm"
        try:
            for g in groups:
                self._read_group(f, g, planner, replica)
        finally:
            f.close()
        return True

    def _read_group(
        self, f: ShmReadFile, parts: list[_Part], planner: LoadPlanner, replica: str
    ) -> None:
        """One Read call into f; each part is copied out (and its want
        completed) as soon as the pieces before its end arrived, in order."""
        wanted = [
            pb.ChunkEntry(tensor=p.want.name, box=pb.Box(offsets=p.offsets, sizes=p.sizes))
            for p in parts
        ]
        at, done = SHM_READ_DATA, 0
        for piece, data in self._read(wanted, f, replica):
            n = piece.shm_length or len(data)
            if piece.shm_length == 0:
                f.write(at, data)  # inline after all (e.g. an empty piece)
            elif piece.shm_offset != at or at + n > f.size:
                raise StokerError(
                    grpc.StatusCode.INTERNAL,
                    f"shm read piece at {piece.shm_offset} (+{n}), expected at {at}",
                )
            at += n
            while done < len(parts) and parts[done].start + parts[done].nbytes <= at:
                p = parts[done]
                done += 1
                p.copy_out(f, self.dtypes.get(p.want.name, torch.uint8))
                if p.want.done:
                    self._complete(p.want, planner)
        _no_bytes([p.want for p in parts[done:]])

    def _place(
        self,
        piece: pb.ReadChunk,
        data: bytes | memoryview,
        pending: dict[str, list[_Want]],
        planner: LoadPlanner,
    ) -> None:
        off, size = list(piece.box.offsets), list(piece.box.sizes)
        dtype = self.dtypes.get(piece.tensor, torch.uint8)
        for w in [
            w for w in pending.get(piece.tensor, []) if _box_contains(w.offsets, w.sizes, off, size)
        ]:
            w.place(off, size, data, dtype)
            if w.done:
                pending[piece.tensor].remove(w)
                self._complete(w, planner)

    @staticmethod
    def _complete(w: _Want, planner: LoadPlanner) -> None:
        if w.item.type == LoadItemType.BYTE_IO:
            planner.load_bytes(w.item, io.BytesIO(bytes(w.blob)))
        else:
            assert w.target is not None
            planner.commit_tensor(w.item, w.target)


def _read_pieces(
    messages: Iterable[pb.ReadChunk],
) -> Iterator[tuple[pb.ReadChunk, bytes | memoryview]]:
    """The pieces of a Read's messages with their bytes: each message lists
    its pieces, or is one piece itself (a service that predates
    pack_pieces); a piece's bytes are its own data, or (pack_data) its run
    of the message's packed_data, handed out without a copy."""
    for m in messages:
        if not m.pieces:
            yield m, m.data
            continue
        packed = memoryview(m.packed_data)
        for p in m.pieces:
            if p.pieces:
                raise StokerError(grpc.StatusCode.INTERNAL, "a read piece lists pieces of its own")
            if p.data_length == 0:
                yield p, p.data
                continue
            end = p.data_offset + p.data_length
            if p.data or end > len(packed):
                raise StokerError(
                    grpc.StatusCode.INTERNAL,
                    f"a read piece of {p.tensor!r} lies outside its message's bytes",
                )
            yield p, packed[p.data_offset : end]


def _no_bytes(left: list[_Want]) -> None:
    if left:
        names = sorted({w.item.storage_index.fqn for w in left})
        raise StokerError(grpc.StatusCode.DATA_LOSS, f"the service sent no bytes for {names[:5]}")


class _Part:
    """A box of one want read through a shared-memory file at start (the
    whole want unless it is larger than the file)."""

    def __init__(self, want: _Want, offsets: list[int], sizes: list[int], nbytes: int) -> None:
        self.want, self.offsets, self.sizes, self.nbytes = want, offsets, sizes, nbytes
        self.start = 0

    def copy_out(self, f: ShmReadFile, dtype: torch.dtype) -> None:
        w = self.want
        if w.item.type == LoadItemType.BYTE_IO:
            if not w.blob:
                w.blob = bytearray(w.total)
            at = self.offsets[0] - w.offsets[0]
            w.blob[at : at + self.nbytes] = f.map[self.start : self.start + self.nbytes]
        else:
            assert w.target is not None
            src = f.tensor(self.start, self.nbytes).view(dtype)
            region = w.target
            for d, (o, n) in enumerate(zip(self.offsets, self.sizes, strict=True)):
                region = region.narrow(d, o - w.offsets[d], n)
            region.copy_(src.reshape(self.sizes) if region.dim() else src.reshape(()))
            del src
        w.placed += self.nbytes


def _parts(w: _Want, dtype: torch.dtype, limit: int) -> list[_Part]:
    """w's box cut into boxes of at most limit bytes: runs of one dim's
    indices with all later dims whole (1 wide in earlier dims), as the
    service cuts pieces."""
    elem = 1 if w.item.type == LoadItemType.BYTE_IO else dtype.itemsize
    if w.total <= limit or not w.sizes:
        return [_Part(w, list(w.offsets), list(w.sizes), w.total)]
    d, row = len(w.sizes) - 1, elem
    while d > 0 and row * w.sizes[d] <= limit:
        row *= w.sizes[d]
        d -= 1
    rows = max(1, limit // row)
    parts = []
    for outer in itertools.product(*(range(n) for n in w.sizes[:d])):
        for r in range(0, w.sizes[d], rows):
            k = min(rows, w.sizes[d] - r)
            offsets = [o + i for o, i in zip(w.offsets, outer, strict=False)]
            offsets += [w.offsets[d] + r, *w.offsets[d + 1 :]]
            sizes = [1] * d + [k, *w.sizes[d + 1 :]]
            parts.append(_Part(w, offsets, sizes, row * k))
    return parts


class _Want:
    """One read item: a box of a stored tensor (global coordinates) and where
    its bytes go: a blob buffer or the planner's destination tensor."""

    def __init__(self, item: ReadItem, name: str, offsets: list[int], sizes: list[int]) -> None:
        self.item = item
        self.name = name
        self.offsets = offsets
        self.sizes = sizes
        self.blob = bytearray()
        self.target: torch.Tensor | None = None
        self.placed = 0
        self.total = 0

    @classmethod
    def of(cls, item: ReadItem, name: str) -> _Want:
        base = list(item.storage_index.offset or [0] * len(item.storage_offsets))
        offsets = [b + o for b, o in zip(base, item.storage_offsets, strict=True)]
        return cls(item, name, offsets, list(item.lengths))

    def nbytes(self, dtype: torch.dtype) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        self.total = n * (1 if self.item.type == LoadItemType.BYTE_IO else dtype.itemsize)
        return self.total

    @property
    def done(self) -> bool:
        return self.placed >= self.total

    def place(
        self, off: list[int], size: list[int], data: bytes | memoryview, dtype: torch.dtype
    ) -> None:
        if self.item.type == LoadItemType.BYTE_IO:
            if not self.blob:
                self.blob = bytearray(self.total)
            start = off[0] - self.offsets[0]
            self.blob[start : start + len(data)] = data
        else:
            assert self.target is not None
            with warnings.catch_warnings():  # read-only bytes: copy_ only reads them
                warnings.simplefilter("ignore", UserWarning)
                src = torch.frombuffer(data, dtype=torch.uint8).view(dtype)
            region = self.target
            for d, (o, n) in enumerate(zip(off, size, strict=True)):
                region = region.narrow(d, o - self.offsets[d], n)
            if region.dim() == 0:
                region.copy_(src.reshape(()))
            else:
                region.copy_(src.reshape(size))
        self.placed += len(data)

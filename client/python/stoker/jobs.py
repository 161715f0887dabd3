"""``stoker.jobs``: what an operator does with stokerctl, from Python.

Notebooks and tooling want the job list, a job's state and members, its
event log, its loader and its checkpoints as Python values, and the operator
actions (create, scale, pause, resume, stop, delete) as calls. :class:`Jobs`
offers them over the three services; every result is a plain frozen
dataclass (never a protobuf message) and every failed call raises
:class:`~stoker.errors.StokerError` with the gRPC status.

Each result's ``as_dict()`` is the JSON object ``stokerctl --json`` prints for
the same thing, key for key and value for value (enums by their short proto
names, ``"WAITING"``, ``"F32"``; times as Unix milliseconds), so a script can
move between the two without a second schema. ``dataclasses.asdict(x)`` gives
every field instead, including those stokerctl leaves out.

=====================================  ===========================================
``Jobs``                               ``stokerctl --json``
=====================================  ===========================================
``list(label_selector)``               ``jobs list --label K=V`` (one line per job)
``show(name)`` / ``create`` / actions  ``job show|create|scale|pause|resume|stop``
``watch(name, after_seq)``             ``job watch NAME --after SEQ``
``create_loader(job, datasets, ...)``  ``loader create JOB --dataset ...``
``loader(job)``                        ``loader show JOB``
``checkpoints(job)``                   ``checkpoint list JOB``
``checkpoint(job, step)``              ``checkpoint show JOB STEP``
``verify(job, step)``                  ``checkpoint verify JOB STEP``
=====================================  ===========================================
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import TracebackType
from typing import Any, TypeVar

import grpc

from stoker.connection import (
    CHECKPOINT,
    COORDINATOR,
    DATALOADER,
    Connection,
    Security,
    address_from_env,
)
from stoker.errors import StokerError, invalid_argument
from stoker.queue import QueueStatus, Submission, status_proto
from stoker.v1 import checkpoint_pb2 as ckpt_pb
from stoker.v1 import common_pb2
from stoker.v1 import coordinator_pb2 as coord_pb
from stoker.v1 import dataloader_pb2 as dl_pb

# stokerctl's default per-call deadline (--timeout), seconds.
DEFAULT_TIMEOUT_S = 10.0

T = TypeVar("T")


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    """The proto name of ``value`` without ``prefix`` ("JOB_STATE_RUNNING" ->
    "RUNNING"); "UNKNOWN(7)" outside the enum, as stokerctl prints it."""
    try:
        name: str = enum.Name(value)
    except ValueError:
        return f"UNKNOWN({value})"
    return name.removeprefix(prefix)


# stokerctl's dataset format names (its --dataset syntax): "" when unset,
# "?" outside the enum.
_FORMAT_NAMES: dict[int, str] = {
    dl_pb.DATASET_FORMAT_MEGATRON: "megatron",
    dl_pb.DATASET_FORMAT_LLMC: "llmc",
    dl_pb.DATASET_FORMAT_TEXT: "text",
}


_FORMAT_VALUES: dict[str, int] = {"": 0, **{v: k for k, v in _FORMAT_NAMES.items()}}


def _format_name(value: int) -> str:
    return "" if value == 0 else _FORMAT_NAMES.get(value, "?")


def _json(value: Any) -> Any:
    """A field as stokerctl prints it: nested results as their objects,
    tuples as arrays, None as null."""
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return dict(value)
    return value


def _fields_json(obj: Any) -> dict[str, Any]:
    """Every field of a result, in order: the ``as_dict()`` of the results
    whose stokerctl object holds exactly their fields."""
    return {f.name: _json(getattr(obj, f.name)) for f in fields(obj)}


# ---- the coordinator's objects ---------------------------------------------------


@dataclass(frozen=True)
class CheckpointRef:
    """A committed checkpoint, as the coordinator records it (a job's latest)
    or the checkpoint service lists it.

    step: the training step; uri: where its manifest lives;
    committed_at_ms: Unix time in milliseconds; generation: the generation
    that wrote it (0 from the checkpoint service's own list).
    """

    step: int
    uri: str
    committed_at_ms: int
    generation: int

    @classmethod
    def from_proto(cls, m: common_pb2.CheckpointRef) -> CheckpointRef:
        return cls(m.step, m.uri, m.committed_at_ms, m.generation)

    def as_dict(self) -> dict[str, Any]:
        return _fields_json(self)


@dataclass(frozen=True)
class JobSpec:
    """What a job was created with. Zero durations and counts are the
    coordinator's defaults; the coordinator answers with the values it uses.

    name: [a-z0-9][a-z0-9._-]{0,62}. min_ranks, max_ranks: the world sizes a
    rendezvous round may close at. heartbeat_interval_ms, heartbeat_misses: a
    rank is lost after this many missed intervals. last_call_ms: how long a
    round with at least min_ranks stays open for more. join_timeout_ms: how
    long a Join may park. labels: free key/value pairs (select jobs by them).
    dataset, checkpoint_storage: storage URIs ("" when unset).
    checkpoint_every_steps: ask ranks for a checkpoint every this many steps
    (0: the trainer decides). submission: set for a job submitted to a
    cluster queue (:meth:`Jobs.submit`), else None.
    """

    name: str
    min_ranks: int
    max_ranks: int
    heartbeat_interval_ms: int
    heartbeat_misses: int
    last_call_ms: int
    join_timeout_ms: int
    labels: dict[str, str] = field(hash=False)
    dataset: str
    checkpoint_storage: str
    checkpoint_every_steps: int
    submission: Submission | None = None

    @classmethod
    def from_proto(cls, m: coord_pb.JobSpec) -> JobSpec:
        return cls(
            name=m.name,
            min_ranks=m.min_ranks,
            max_ranks=m.max_ranks,
            heartbeat_interval_ms=m.heartbeat_interval_ms,
            heartbeat_misses=m.heartbeat_misses,
            last_call_ms=m.last_call_ms,
            join_timeout_ms=m.join_timeout_ms,
            labels=dict(m.labels),
            dataset=m.dataset.uri,
            checkpoint_storage=m.checkpoint_storage.uri,
            checkpoint_every_steps=m.checkpoint_every_steps,
            submission=(Submission.from_proto(m.submission) if m.HasField("submission") else None),
        )

    def as_dict(self) -> dict[str, Any]:
        return _fields_json(self)


@dataclass(frozen=True)
class Member:
    """A rank of the current generation with its last reported figures.

    rank: its rank in the generation; address: where peers reach it; host:
    its machine; last_heartbeat_ms: Unix ms (0 before the first heartbeat);
    step, tokens_per_s, loss: from its last heartbeat; health: "OK",
    "DEGRADED", "FAILING" or "UNSPECIFIED"; message: free text with it.
    """

    member_id: str
    rank: int
    address: str
    host: str
    last_heartbeat_ms: int
    step: int
    tokens_per_s: float
    loss: float
    health: str
    message: str

    @classmethod
    def from_proto(cls, m: coord_pb.Member) -> Member:
        return cls(
            member_id=m.member_id,
            rank=m.rank,
            address=m.address,
            host=m.host,
            last_heartbeat_ms=m.last_heartbeat_ms,
            step=m.step,
            tokens_per_s=m.tokens_per_s,
            loss=m.loss,
            health=_enum_name(coord_pb.RankHealth, m.health, "RANK_HEALTH_"),
            message=m.message,
        )

    def as_dict(self) -> dict[str, Any]:
        return _fields_json(self)


@dataclass(frozen=True)
class Job:
    """A job as the coordinator holds it.

    state: "WAITING" (a rendezvous round is open), "RUNNING", "PAUSING",
    "PAUSED", "STOPPED" or "FINISHED" (every member left finished); reason:
    why it is in that state. generation: the
    number of the current (or last) rendezvous round; world_size: its ranks
    (0 while waiting); target_ranks: set by scale (0: up to max_ranks);
    waiting: joins parked in the open round. members: the current
    generation's, by rank. latest_checkpoint: None when the coordinator sent
    none (a ref with step 0 means no checkpoint yet). Times are Unix ms;
    last_event_seq: the newest event (``watch(after_seq=...)``). queue: a
    submitted job's place in its cluster's queue, the queue controller's last
    report (None before the first, and for jobs not submitted).
    """

    name: str
    state: str
    reason: str
    generation: int
    world_size: int
    target_ranks: int
    waiting: int
    spec: JobSpec | None
    members: tuple[Member, ...]
    latest_checkpoint: CheckpointRef | None
    created_at_ms: int
    updated_at_ms: int
    last_event_seq: int
    queue: QueueStatus | None = None

    @classmethod
    def from_proto(cls, m: coord_pb.Job) -> Job:
        has_spec = m.HasField("spec")
        return cls(
            name=m.spec.name if has_spec else "",
            state=_enum_name(coord_pb.JobState, m.state, "JOB_STATE_"),
            reason=m.reason,
            generation=m.generation,
            world_size=m.world_size,
            target_ranks=m.target_ranks,
            waiting=m.waiting,
            spec=JobSpec.from_proto(m.spec) if has_spec else None,
            members=tuple(Member.from_proto(x) for x in m.members),
            latest_checkpoint=(
                CheckpointRef.from_proto(m.latest_checkpoint)
                if m.HasField("latest_checkpoint")
                else None
            ),
            created_at_ms=m.created_at_ms,
            updated_at_ms=m.updated_at_ms,
            last_event_seq=m.last_event_seq,
            queue=QueueStatus.from_proto(m.queue) if m.HasField("queue") else None,
        )

    @property
    def step(self) -> int:
        """The highest step any member reported (stokerctl's STEP column)."""
        return max((x.step for x in self.members), default=0)

    def as_dict(self) -> dict[str, Any]:
        return _fields_json(self)


@dataclass(frozen=True)
class JobEvent:
    """One entry of a job's event log.

    seq: its number in the job's log (ascending); time_ms: Unix ms; type:
    "CREATED", "MEMBER_JOINED", "ROUND_CLOSED", "ROUND_OPENED",
    "MEMBER_LOST", "MEMBER_LEFT", "SCALED", "PAUSED", "RESUMED", "STOPPED",
    "DELETED", "CHECKPOINT", "HEALTH", "COORDINATOR_RESTARTED", "FINISHED" or
    "PREEMPTED" (a preemption notice: message the reason, step where it came),
    or a submitted job's "QUEUED", "ADMITTED", "SHRUNK", "GROWN" (see
    :mod:`stoker.queue`; ``stoker.queue.describe(event)`` says it in words);
    the other fields are set where the type has them (0 or "" otherwise).
    """

    seq: int
    time_ms: int
    job: str
    type: str
    generation: int
    member_id: str
    world_size: int
    step: int
    message: str

    @classmethod
    def from_proto(cls, m: coord_pb.JobEvent) -> JobEvent:
        return cls(
            seq=m.seq,
            time_ms=m.time_ms,
            job=m.job,
            type=_enum_name(coord_pb.JobEventType, m.type, "JOB_EVENT_"),
            generation=m.generation,
            member_id=m.member_id,
            world_size=m.world_size,
            step=m.step,
            message=m.message,
        )

    def as_dict(self) -> dict[str, Any]:
        return _fields_json(self)


# ---- the dataloader's ---------------------------------------------------------------


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset of a loader's mixture (read from a loader, or given to
    :meth:`Jobs.create_loader`).

    uri: its source, read by the dataloader daemon: ``file:///PATH`` or
    ``/PATH`` (a file or directory under one of the daemon's ``--data-root``
    directories, else PERMISSION_DENIED) or
    ``synthetic:N_DOCS:MIN_LEN:MAX_LEN:SEED``; format: "megatron", "llmc",
    "text" or "" (unset: only for synthetic sources); weight: its share of
    the mixture (relative); tokenizer: "bytes", "gpt2:<vocab>,<merges>" or
    "" (pre-tokenized); block_tokens, block_bytes: the llm.c and text unit
    sizes (0: the reader's default, 32768 tokens and 64 KiB).
    """

    name: str
    uri: str
    format: str = ""
    weight: float = 1.0
    tokenizer: str = ""
    block_tokens: int = 0
    block_bytes: int = 0

    @classmethod
    def from_proto(cls, m: dl_pb.DatasetSpec) -> DatasetSpec:
        return cls(
            name=m.name,
            uri=m.source.uri,
            format=_format_name(m.format),
            weight=m.weight,
            tokenizer=m.tokenizer,
            block_tokens=m.block_tokens,
            block_bytes=m.block_bytes,
        )

    def to_proto(self) -> dl_pb.DatasetSpec:
        """The ``DatasetSpec`` message; a bad value is INVALID_ARGUMENT."""
        fmt = _FORMAT_VALUES.get(self.format)
        if fmt is None:
            raise invalid_argument(
                f"dataset {self.name!r}: format {self.format!r} is none of {sorted(_FORMAT_VALUES)}"
            )
        return _request(
            dl_pb.DatasetSpec,
            f"dataset {self.name!r}",
            name=self.name,
            source=common_pb2.StorageRef(uri=self.uri),
            format=fmt,
            weight=self.weight,
            tokenizer=self.tokenizer,
            block_tokens=self.block_tokens,
            block_bytes=self.block_bytes,
        )

    def as_dict(self) -> dict[str, Any]:
        """stokerctl's object: without block_tokens and block_bytes."""
        return {
            "name": self.name,
            "uri": self.uri,
            "format": self.format,
            "weight": self.weight,
            "tokenizer": self.tokenizer,
        }


@dataclass(frozen=True)
class LoaderSpec:
    """The shape of a loader's batches.

    seq_len: tokens per line (a line holds seq_len + 1); global_batch: lines
    per step over all ranks; seed: of the shuffle; logical_shards, lanes:
    the rescalable sharding, the job's over all ranks (not per rank);
    add_bos / bos_id, add_eos / eos_id: special tokens around documents;
    max_doc_tokens: longer documents are cut (0: never).
    """

    job: str
    datasets: tuple[DatasetSpec, ...]
    seq_len: int
    global_batch: int
    seed: int
    logical_shards: int
    lanes: int
    add_bos: bool
    add_eos: bool
    max_doc_tokens: int
    bos_id: int
    eos_id: int

    @classmethod
    def from_proto(cls, m: dl_pb.LoaderSpec) -> LoaderSpec:
        return cls(
            job=m.job,
            datasets=tuple(DatasetSpec.from_proto(d) for d in m.datasets),
            seq_len=m.seq_len,
            global_batch=m.global_batch,
            seed=m.seed,
            logical_shards=m.logical_shards,
            lanes=m.lanes,
            add_bos=m.add_bos,
            add_eos=m.add_eos,
            max_doc_tokens=m.max_doc_tokens,
            bos_id=m.bos_id,
            eos_id=m.eos_id,
        )


@dataclass(frozen=True)
class Loader:
    """A dataloader job (``GetLoader``).

    committed_step: the newest step whose loader state is durable (-1:
    none); over a scaled-out loader the oldest of its parts' (the step every
    part can resume from). part, parts: the scale-out of the process that
    answered (0 and 0: one process serves the whole job). spec: None when
    the service sent none. lane_lines_generated: lines each lane generated
    since the process opened the job (summed over the parts). failed,
    failure: the job could not be loaded (a dataset gone at the daemon's
    start, data lost under it) and why; its calls fail until it is deleted
    or its data comes back.
    """

    job: str
    committed_step: int
    spec: LoaderSpec | None
    part: int
    parts: int
    lane_lines_generated: tuple[int, ...]
    failed: bool = False
    failure: str = ""

    @classmethod
    def from_proto(cls, m: dl_pb.LoaderInfo) -> Loader:
        has_spec = m.HasField("spec")
        return cls(
            job=m.spec.job if has_spec else "",
            committed_step=m.committed_step,
            spec=LoaderSpec.from_proto(m.spec) if has_spec else None,
            part=m.part,
            parts=m.parts,
            lane_lines_generated=tuple(m.lane_lines_generated),
            failed=m.failed,
            failure=m.failure,
        )

    def as_dict(self) -> dict[str, Any]:
        """stokerctl's object: the spec's fields at the top level, without
        part, parts and lane_lines_generated (a job that failed to load has
        only its name, committed step and why)."""
        out: dict[str, Any] = {"job": self.job, "committed_step": self.committed_step}
        if self.failed:
            out.update(failed=True, failure=self.failure)
        s = self.spec
        if s is None or not s.datasets:
            return out
        out.update(
            seq_len=s.seq_len,
            global_batch=s.global_batch,
            seed=s.seed,
            logical_shards=s.logical_shards,
            lanes=s.lanes,
            add_bos=s.add_bos,
            add_eos=s.add_eos,
            bos_id=s.bos_id,
            eos_id=s.eos_id,
            max_doc_tokens=s.max_doc_tokens,
            datasets=[d.as_dict() for d in s.datasets],
        )
        return out


def _combine_parts(infos: list[Loader]) -> Loader:
    """One view of every part of a scaled-out loader, as stokerctl shows it:
    part 0's spec, the oldest committed step, every lane's lines."""
    first = infos[0]
    lanes = max(len(i.lane_lines_generated) for i in infos)
    lines = [0] * lanes
    for info in infos:
        for c, n in enumerate(info.lane_lines_generated):
            lines[c] += n
    return Loader(
        job=first.job,
        committed_step=min(i.committed_step for i in infos),
        spec=first.spec,
        part=first.part,
        parts=first.parts,
        lane_lines_generated=tuple(lines),
    )


# ---- the checkpoint service's ----------------------------------------------------------


@dataclass(frozen=True)
class Checkpoints:
    """The committed checkpoints of a job, in the service's order (a
    sequence of :class:`CheckpointRef`; empty when the job has none)."""

    job: str
    checkpoints: tuple[CheckpointRef, ...]

    def __iter__(self) -> Iterator[CheckpointRef]:
        return iter(self.checkpoints)

    def __len__(self) -> int:
        return len(self.checkpoints)

    def __getitem__(self, i: int) -> CheckpointRef:
        return self.checkpoints[i]

    @property
    def latest(self) -> CheckpointRef | None:
        """The checkpoint of the highest step, None when there is none."""
        return max(self.checkpoints, key=lambda c: c.step, default=None)

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job, "checkpoints": [c.as_dict() for c in self.checkpoints]}


@dataclass(frozen=True)
class Box:
    """A box of a tensor: per dimension its first index and its extent (elements)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return _fields_json(self)


@dataclass(frozen=True)
class ChunkEntry:
    """One stored chunk: the box of a tensor whose row-major bytes are at
    object_offset in object, length bytes (box elements x dtype size).

    dtype: "F32", "BF16", "F16", "I64", "U8", "BYTES" (an opaque blob), ...
    global_shape: the whole tensor's, elements per dimension.
    """

    tensor: str
    dtype: str
    global_shape: tuple[int, ...]
    box: Box
    object: str
    object_offset: int
    length: int

    @classmethod
    def from_proto(cls, m: ckpt_pb.ChunkEntry) -> ChunkEntry:
        return cls(
            tensor=m.tensor,
            dtype=_enum_name(ckpt_pb.DType, m.dtype, "DTYPE_"),
            global_shape=tuple(m.global_shape),
            box=Box(tuple(m.box.offsets), tuple(m.box.sizes)),
            object=m.object,
            object_offset=m.object_offset,
            length=m.length,
        )

    def as_dict(self) -> dict[str, Any]:
        return _fields_json(self)


@dataclass(frozen=True)
class ObjectEntry:
    """One stored object: key relative to the checkpoint's attempt directory,
    size in bytes, and the CRC32C of each block (crc_block_bytes each)."""

    key: str
    size: int
    block_crc32c: tuple[int, ...]

    @classmethod
    def from_proto(cls, m: ckpt_pb.ObjectEntry) -> ObjectEntry:
        return cls(m.key, m.size, tuple(m.block_crc32c))

    def as_dict(self) -> dict[str, Any]:
        return _fields_json(self)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a checkpoint, summed over its chunks (a row of
    ``stokerctl checkpoint show``): nbytes is the bytes of its chunks,
    objects the keys of the objects they lie in."""

    name: str
    dtype: str
    global_shape: tuple[int, ...]
    chunks: tuple[ChunkEntry, ...]
    objects: tuple[str, ...]
    nbytes: int


@dataclass(frozen=True)
class Manifest:
    """A committed checkpoint's manifest (``GetManifest``).

    world: the ranks that wrote it; attempt: its attempt id; format_version:
    1; crc_block_bytes: the block size of the CRCs (1 MiB); created_at_ms:
    Unix ms. chunks and objects as stored; ``tensors()`` groups the chunks.
    """

    job: str
    step: int
    world: int
    attempt: str
    format_version: int
    crc_block_bytes: int
    created_at_ms: int
    objects: tuple[ObjectEntry, ...]
    chunks: tuple[ChunkEntry, ...]

    @classmethod
    def from_proto(cls, m: ckpt_pb.Manifest) -> Manifest:
        return cls(
            job=m.job,
            step=m.step,
            world=m.world,
            attempt=m.attempt,
            format_version=m.format_version,
            crc_block_bytes=m.crc_block_bytes,
            created_at_ms=m.created_at_ms,
            objects=tuple(ObjectEntry.from_proto(o) for o in m.objects),
            chunks=tuple(ChunkEntry.from_proto(c) for c in m.chunks),
        )

    @property
    def nbytes(self) -> int:
        """Bytes stored: the sum of the objects' sizes."""
        return sum(o.size for o in self.objects)

    def tensors(self) -> dict[str, TensorInfo]:
        """Per tensor name, in order of first appearance: its dtype and
        global shape (of its first chunk), chunks, objects and bytes."""
        grouped: dict[str, list[ChunkEntry]] = {}
        for c in self.chunks:
            grouped.setdefault(c.tensor, []).append(c)
        return {
            name: TensorInfo(
                name=name,
                dtype=cs[0].dtype,
                global_shape=cs[0].global_shape,
                chunks=tuple(cs),
                objects=tuple(dict.fromkeys(c.object for c in cs)),
                nbytes=sum(c.length for c in cs),
            )
            for name, cs in grouped.items()
        }

    def as_dict(self) -> dict[str, Any]:
        return _fields_json(self)


@dataclass(frozen=True)
class VerifyReport:
    """What re-reading every byte of a checkpoint found: objects, bytes and
    CRC blocks read, and one line per bad object or block (ok: none)."""

    job: str
    step: int
    objects: int
    bytes: int
    blocks: int
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "step": self.step,
            "ok": self.ok,
            "objects": self.objects,
            "bytes": self.bytes,
            "blocks": self.blocks,
            "problems": list(self.problems),
        }


# ---- watching ----------------------------------------------------------------------------


class JobWatch:
    """A job's events as they come (``WatchJob``): first the kept log after
    ``after_seq``, then live events, until the job is deleted, ``close()``
    is called (from any thread; a ``with`` block calls it), or, with
    ``idle_timeout``, no event came for that many seconds. Each of those
    ends the iteration quietly; a failure (unknown job, service down)
    raises StokerError from ``next()``. ``last_seq`` is the newest event
    seen: pass it as ``after_seq`` to go on after a failure."""

    def __init__(self, stream: Any, after_seq: int, idle_timeout: float | None) -> None:
        self._stream = stream
        self._idle_timeout = idle_timeout
        self.last_seq = after_seq
        self.closed = False

    def __iter__(self) -> JobWatch:
        return self

    def __next__(self) -> JobEvent:
        if self.closed:
            raise StopIteration
        timer = None
        if self._idle_timeout is not None:
            timer = threading.Timer(self._idle_timeout, self.close)
            timer.daemon = True
            timer.start()
        try:
            msg = next(self._stream)
        except StopIteration:
            self.closed = True
            raise
        finally:
            if timer is not None:
                timer.cancel()
        ev = JobEvent.from_proto(msg)
        self.last_seq = ev.seq
        return ev

    def close(self) -> None:
        """Cancels the stream; the iteration ends (a blocked ``next()`` too)."""
        self.closed = True
        self._stream.cancel()

    def __enter__(self) -> JobWatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# ---- the client ------------------------------------------------------------------------------


def _each_part(conns: Sequence[Connection], call: Callable[[Connection], T]) -> list[T]:
    """call on every dataloader part in part order; over several parts a
    failure names its part ("dataloader part I of N: ..."), the code kept."""
    out = []
    for i, conn in enumerate(conns):
        try:
            out.append(call(conn))
        except StokerError as e:
            if len(conns) == 1:
                raise
            raise StokerError(
                e.code, f"dataloader part {i} of {len(conns)}: {e.details}", e.method
            ) from None
    return out


def _request(make: Callable[..., T], what: str, **values: Any) -> T:
    """Builds a request message; a value of the wrong type or range is
    INVALID_ARGUMENT before anything is sent."""
    try:
        return make(**values)
    except (TypeError, ValueError) as e:
        raise invalid_argument(f"{what}: {e}") from None


class Jobs:
    """The operator's calls to the Stoker services.

    Args:
        coordinator: ``HOST:PORT`` of the coordinator; default ``STOKER_COORDINATOR``.
        dataloader: ``HOST:PORT`` of the dataloader, or the comma-separated
            parts of a scaled-out one; default ``STOKER_DATALOADER``.
        checkpoint: ``HOST:PORT`` of the checkpoint service; default ``STOKER_CHECKPOINT``.
        timeout: seconds each call may take (stokerctl's ``--timeout``);
            reads are retried while the service is unavailable, up to it.
        security: TLS and token options (default: from the environment).

    Each address is looked up when its service is first called, so a client
    that only manages jobs needs only the coordinator's. Use it as a context
    manager or call ``close()`` to close the channels.
    """

    def __init__(
        self,
        coordinator: str | None = None,
        dataloader: str | None = None,
        checkpoint: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        security: Security | None = None,
    ) -> None:
        self._addresses = {
            "STOKER_COORDINATOR": coordinator,
            "STOKER_DATALOADER": dataloader,
            "STOKER_CHECKPOINT": checkpoint,
        }
        self.timeout = timeout
        self.security = security
        self._conns: dict[str, builtins.list[Connection]] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        given = ", ".join(f"{k}={v!r}" for k, v in self._addresses.items() if v)
        return f"Jobs({given})"

    def _connections(self, env: str) -> builtins.list[Connection]:
        with self._lock:
            if env not in self._conns:
                addr = address_from_env(env, self._addresses[env])
                parts = [a.strip() for a in addr.split(",") if a.strip()]
                self._conns[env] = [Connection(a, self.security, self.timeout) for a in parts]
            return self._conns[env]

    def _coordinator(self) -> Connection:
        return self._connections("STOKER_COORDINATOR")[0]

    def _checkpoint(self) -> Connection:
        return self._connections("STOKER_CHECKPOINT")[0]

    def close(self) -> None:
        """Closes every channel opened (a later call opens them again)."""
        with self._lock:
            conns, self._conns = self._conns, {}
        for cs in conns.values():
            for c in cs:
                c.close()

    def __enter__(self) -> Jobs:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ---- jobs ----------------------------------------------------------------------

    def _job_call(self, method: str, request: Any, retry: bool = False) -> Job:
        reply = self._coordinator().unary(COORDINATOR + method, request, coord_pb.Job, retry=retry)
        return Job.from_proto(reply)

    def create(
        self,
        name: str,
        min_ranks: int,
        max_ranks: int,
        *,
        heartbeat_interval_ms: int = 0,
        heartbeat_misses: int = 0,
        last_call_ms: int = 0,
        join_timeout_ms: int = 0,
        labels: Mapping[str, str] | None = None,
        dataset: str = "",
        checkpoint_storage: str = "",
        checkpoint_every_steps: int = 0,
    ) -> Job:
        """Creates a job (``stokerctl job create``); 0 durations and counts
        take the coordinator's defaults (5000 ms interval, 3 misses, 30000
        ms last call, 600000 ms join timeout). dataset, checkpoint_storage:
        storage URIs, "" for none. ALREADY_EXISTS when the name is taken."""
        spec = _request(
            coord_pb.JobSpec,
            "job spec",
            name=name,
            min_ranks=min_ranks,
            max_ranks=max_ranks,
            heartbeat_interval_ms=heartbeat_interval_ms,
            heartbeat_misses=heartbeat_misses,
            last_call_ms=last_call_ms,
            join_timeout_ms=join_timeout_ms,
            labels=dict(labels or {}),
            checkpoint_every_steps=checkpoint_every_steps,
        )
        if dataset:
            spec.dataset.uri = dataset
        if checkpoint_storage:
            spec.checkpoint_storage.uri = checkpoint_storage
        return self._job_call("CreateJob", coord_pb.CreateJobRequest(spec=spec))

    def show(self, name: str) -> Job:
        """The job now (``stokerctl job show``); NOT_FOUND when there is none."""
        return self._job_call("GetJob", _request(coord_pb.GetJobRequest, "job", job=name), True)

    get = show

    def scale(self, name: str, ranks: int, skip_checkpoint: bool = False) -> Job:
        """Asks the job to restart at ``ranks`` ranks (min_ranks <= ranks <=
        max_ranks), after a checkpoint unless ``skip_checkpoint``."""
        req = _request(
            coord_pb.ScaleJobRequest,
            "scale",
            job=name,
            ranks=ranks,
            skip_checkpoint=skip_checkpoint,
        )
        return self._job_call("ScaleJob", req)

    def _action(self, method: str, name: str, force: bool) -> Job:
        req = _request(coord_pb.JobActionRequest, method, job=name, force=force)
        return self._job_call(method, req)

    def pause(self, name: str, force: bool = False) -> Job:
        """Checkpoint, then stop the ranks; resumable. ``force``: do not ask
        for a checkpoint first."""
        return self._action("PauseJob", name, force)

    def resume(self, name: str) -> Job:
        """Opens a rendezvous round for a paused job."""
        return self._action("ResumeJob", name, False)

    def preempt(self, name: str, reason: str = "") -> Job:
        """A preemption notice for the whole job (``stokerctl job preempt``;
        a queue controller evicting it): every rank checkpoints at one step
        and stops resumably, the job is PAUSED and resumes by itself when its
        ranks join again. A second notice changes nothing."""
        req = _request(coord_pb.PreemptJobRequest, "preempt", job=name, reason=reason)
        return self._job_call("PreemptJob", req)

    def stop(self, name: str, force: bool = False) -> Job:
        """Ends the job for good (every member is told STOP), after a
        checkpoint unless ``force``."""
        return self._action("StopJob", name, force)

    def delete(self, name: str, force: bool = False) -> None:
        """Deletes the job and its events; ``force``: even while ranks are members."""
        req = _request(coord_pb.JobActionRequest, "DeleteJob", job=name, force=force)
        self._coordinator().unary(COORDINATOR + "DeleteJob", req, common_pb2.Empty)

    def watch(
        self, name: str, after_seq: int = 0, *, idle_timeout: float | None = None
    ) -> JobWatch:
        """The job's events with seq > after_seq, then live ones (``stokerctl
        job watch``); see :class:`JobWatch`. ``idle_timeout``: seconds
        without an event after which the iteration ends (None: wait as long
        as the job lives)."""
        req = _request(coord_pb.WatchJobRequest, "watch", job=name, after_seq=after_seq)
        stream = self._coordinator().server_stream(COORDINATOR + "WatchJob", req, coord_pb.JobEvent)
        return JobWatch(stream, after_seq, idle_timeout)

    def list(self, label_selector: Mapping[str, str] | None = None) -> builtins.list[Job]:
        """Every job whose labels include all of ``label_selector``
        (``stokerctl jobs list --label K=V``), by name, every page followed."""
        req = _request(
            coord_pb.ListJobsRequest, "label_selector", label_selector=dict(label_selector or {})
        )
        jobs = self._coordinator().unary_pages(
            COORDINATOR + "ListJobs", req, coord_pb.ListJobsResponse, "jobs"
        )
        return [Job.from_proto(j) for j in jobs]

    # ---- loaders ---------------------------------------------------------------------

    def create_loader(
        self,
        job: str,
        datasets: Sequence[DatasetSpec],
        seq_len: int,
        global_batch: int,
        *,
        seed: int = 0,
        logical_shards: int = 0,
        lanes: int = 0,
        bos_id: int | None = None,
        eos_id: int | None = None,
        max_doc_tokens: int = 0,
        exist_ok: bool = False,
    ) -> Loader:
        """Creates the dataloader job ``job`` (``stokerctl loader create``,
        ``CreateLoader``) on every part, in part order (a failure names the
        part when there are several), and returns it as :meth:`loader` would.

        datasets: the mixture, e.g. ``DatasetSpec("web",
        "file:///data/web", "megatron", 0.7)`` (each URI is read by the
        daemon, under its ``--data-root``). seq_len: tokens per line;
        global_batch: lines per step over all ranks. logical_shards, lanes:
        the job's, over all ranks, fixed for its life (0: the service's
        256 and 8; lanes <= logical_shards, and a scaled-out loader has at
        most ``lanes`` parts). bos_id / eos_id: a token put before / after
        each document (None: none). max_doc_tokens: longer documents are
        cut (0: never). ALREADY_EXISTS when the job exists, unless
        ``exist_ok``: then a part that has the job keeps it as it is (its
        spec is not compared) and the others get it, as when several ranks
        or a restarted run create it. A bad spec is INVALID_ARGUMENT, a path
        outside the data roots PERMISSION_DENIED.
        """
        if isinstance(datasets, DatasetSpec):
            datasets = [datasets]
        spec = _request(
            dl_pb.LoaderSpec,
            "loader spec",
            job=job,
            datasets=[d.to_proto() for d in datasets],
            seq_len=seq_len,
            global_batch=global_batch,
            seed=seed,
            logical_shards=logical_shards,
            lanes=lanes,
            add_bos=bos_id is not None,
            bos_id=bos_id or 0,
            add_eos=eos_id is not None,
            eos_id=eos_id or 0,
            max_doc_tokens=max_doc_tokens,
        )
        req = dl_pb.CreateLoaderRequest(spec=spec)

        def create(conn: Connection) -> Loader:
            try:
                reply = conn.unary(DATALOADER + "CreateLoader", req, dl_pb.LoaderInfo)
            except StokerError as e:
                if not exist_ok or e.code != grpc.StatusCode.ALREADY_EXISTS:
                    raise
                get = dl_pb.GetLoaderRequest(job=job)
                reply = conn.unary(DATALOADER + "GetLoader", get, dl_pb.LoaderInfo, retry=True)
            return Loader.from_proto(reply)

        return _combine_parts(_each_part(self._connections("STOKER_DATALOADER"), create))

    def loader_parts(self, job: str) -> builtins.list[Loader]:
        """``GetLoader`` of every dataloader address given, in part order (a
        failure names the part when there are several)."""
        req = _request(dl_pb.GetLoaderRequest, "job", job=job)
        return _each_part(
            self._connections("STOKER_DATALOADER"),
            lambda conn: Loader.from_proto(
                conn.unary(DATALOADER + "GetLoader", req, dl_pb.LoaderInfo, retry=True)
            ),
        )

    def loaders(self) -> builtins.list[Loader]:
        """Every job of every dataloader address given (``stokerctl loader
        list``), part by part, each process's by name; failed ones included."""
        conns = self._connections("STOKER_DATALOADER")
        out: builtins.list[Loader] = []
        for conn in conns:
            infos = conn.unary_pages(
                DATALOADER + "ListLoaders",
                dl_pb.ListLoadersRequest(),
                dl_pb.ListLoadersResponse,
                "loaders",
            )
            out.extend(Loader.from_proto(m) for m in infos)
        return out

    def delete_loader(self, job: str) -> None:
        """Removes the job and what it stored from every part, in part order
        (``stokerctl loader delete``); a failure names the part when there
        are several. NOT_FOUND when no part knows the job."""
        req = _request(dl_pb.DeleteLoaderRequest, "job", job=job)
        _each_part(
            self._connections("STOKER_DATALOADER"),
            lambda conn: conn.unary(DATALOADER + "DeleteLoader", req, common_pb2.Empty),
        )

    def loader(self, job: str) -> Loader:
        """The dataloader job (``stokerctl loader show``): its spec and
        committed step; over a scaled-out loader part 0's spec with the
        oldest committed step of the parts."""
        return _combine_parts(self.loader_parts(job))

    # ---- checkpoints -----------------------------------------------------------------------

    def checkpoints(self, job: str) -> Checkpoints:
        """The job's committed checkpoints (``stokerctl checkpoint list``),
        by step, every page followed."""
        refs = self._checkpoint().unary_pages(
            CHECKPOINT + "List",
            _request(ckpt_pb.ListCheckpointsRequest, "job", job=job),
            ckpt_pb.ListCheckpointsResponse,
            "checkpoints",
        )
        return Checkpoints(job, tuple(CheckpointRef.from_proto(c) for c in refs))

    def checkpoint(self, job: str, step: int) -> Manifest:
        """The manifest of the checkpoint at ``step`` (``stokerctl checkpoint
        show``); NOT_FOUND when there is none."""
        reply = self._checkpoint().unary(
            CHECKPOINT + "GetManifest",
            _request(ckpt_pb.GetManifestRequest, "step", job=job, step=step),
            ckpt_pb.Manifest,
            retry=True,
        )
        return Manifest.from_proto(reply)

    def abort_checkpoint(self, attempt: str, reason: str = "") -> None:
        """Ends an open checkpoint attempt (``stokerctl checkpoint abort``):
        its writers fail with ABORTED naming ``reason``, its staging is freed
        and what it uploaded is deleted. Aborting one already aborted is fine;
        NOT_FOUND for an attempt the service does not know,
        FAILED_PRECONDITION once it commits."""
        self._checkpoint().unary(
            CHECKPOINT + "Abort",
            _request(ckpt_pb.AbortCheckpointRequest, "attempt", attempt=attempt, reason=reason),
            common_pb2.Empty,
        )

    def verify(self, job: str, step: int) -> VerifyReport:
        """Re-reads every byte of the checkpoint and checks every block CRC
        on the service (``stokerctl checkpoint verify``). Bad blocks are in
        the report's ``problems``, not an error; it can take as long as
        reading the checkpoint, within the client's timeout."""
        reply = self._checkpoint().unary(
            CHECKPOINT + "Verify",
            _request(ckpt_pb.VerifyCheckpointRequest, "step", job=job, step=step),
            ckpt_pb.VerifyCheckpointResponse,
            retry=True,
        )
        return VerifyReport(
            job=job,
            step=step,
            objects=reply.objects,
            bytes=reply.bytes,
            blocks=reply.blocks,
            problems=tuple(reply.problems),
        )

    # ---- submitted jobs (stoker.queue) ----------------------------------------------

    def submit(
        self,
        name: str,
        template: str,
        min_ranks: int,
        max_ranks: int,
        *,
        queue: str = "",
        priority: str = "",
        args: Sequence[str] = (),
        labels: Mapping[str, str] | None = None,
        checkpoint_storage: str = "",
        **spec: int,
    ) -> Job:
        """Submits a job to a cluster queue (``stokerctl job submit``): creates
        it as :meth:`create` does, with a :class:`~stoker.queue.Submission`;
        the queue controller starts its ranks from ``template`` in ``queue``
        at ``priority`` ("" : the defaults) with ``args`` appended to the
        trainer's command (at most 64, each at most 1024 bytes). Follow it
        with :meth:`watch` (QUEUED, ADMITTED, ...) and the returned job's
        ``queue``. spec: create's other counts and durations
        (heartbeat_interval_ms, checkpoint_every_steps, ...). A bad name or
        argument is INVALID_ARGUMENT naming the field; nothing is created."""
        sub = _request(
            coord_pb.Submission,
            "submission",
            queue=queue,
            priority=priority,
            template=template,
            args=list(args),
        )
        req = _request(
            coord_pb.JobSpec,
            "job spec",
            name=name,
            min_ranks=min_ranks,
            max_ranks=max_ranks,
            labels=dict(labels or {}),
            submission=sub,
            **spec,
        )
        if checkpoint_storage:
            req.checkpoint_storage.uri = checkpoint_storage
        return self._job_call("CreateJob", coord_pb.CreateJobRequest(spec=req))

    def resize(self, name: str, ranks: int, skip_checkpoint: bool = False) -> Job:
        """:meth:`scale` by the name ``stokerctl job resize`` uses: checkpoint,
        then go on at ``ranks`` ranks (a submitted job's queue controller
        resizes its workload to match; SHRUNK or GROWN is logged)."""
        return self.scale(name, ranks, skip_checkpoint)

    def report_queue(self, name: str, state: str, **status: Any) -> Job:
        """The queue controller's report on a submitted job (``ReportQueue``):
        state "QUEUED", "ADMITTED", "EVICTED", "FINISHED" or "REJECTED", and
        the :class:`~stoker.queue.QueueStatus` fields (workload,
        cluster_queue, position, admitted_ranks, message, updated_ms). A change
        of state logs QUEUED or ADMITTED once. FAILED_PRECONDITION for a job
        not submitted; INVALID_ARGUMENT naming a bad field."""
        try:
            st = status_proto(state, **status)
        except (TypeError, ValueError) as e:
            raise invalid_argument(f"queue status: {e}") from None
        req = _request(coord_pb.ReportQueueRequest, "report", job=name, status=st)
        return self._job_call("ReportQueue", req)

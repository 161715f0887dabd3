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
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar

import grpc

from stoker._proto import GIVEN, Method, Mirror, derived, enum_name, method, mirror, to_message
from stoker.connection import Connection, Security, address_from_env
from stoker.errors import StokerError, invalid_argument
from stoker.queue import QueueStatus, Submission, status_proto
from stoker.v1 import checkpoint_pb2 as ckpt_pb
from stoker.v1 import common_pb2
from stoker.v1 import coordinator_pb2 as coord_pb
from stoker.v1 import dataloader_pb2 as dl_pb

# stokerctl's default per-call deadline (--timeout), seconds.
DEFAULT_TIMEOUT_S = 10.0

# Times a job is read again when its generation changes while its member
# pages are followed (as stk_job_get in the C client).
_MEMBER_READS = 5

T = TypeVar("T")

# The RPCs the verbs call: path, request and response types come from the
# descriptors (stoker._proto); a new verb names its RPC here once.
CREATE_JOB = method(coord_pb, "Coordinator", "CreateJob")
GET_JOB = method(coord_pb, "Coordinator", "GetJob")
LIST_JOBS = method(coord_pb, "Coordinator", "ListJobs")
LIST_MEMBERS = method(coord_pb, "Coordinator", "ListMembers")
WATCH_JOB = method(coord_pb, "Coordinator", "WatchJob")
SCALE_JOB = method(coord_pb, "Coordinator", "ScaleJob")
PAUSE_JOB = method(coord_pb, "Coordinator", "PauseJob")
RESUME_JOB = method(coord_pb, "Coordinator", "ResumeJob")
PREEMPT_JOB = method(coord_pb, "Coordinator", "PreemptJob")
STOP_JOB = method(coord_pb, "Coordinator", "StopJob")
DELETE_JOB = method(coord_pb, "Coordinator", "DeleteJob")
CREATE_LOADER = method(dl_pb, "Dataloader", "CreateLoader")
GET_LOADER = method(dl_pb, "Dataloader", "GetLoader")
LIST_LOADERS = method(dl_pb, "Dataloader", "ListLoaders")
DELETE_LOADER = method(dl_pb, "Dataloader", "DeleteLoader")
LIST_CHECKPOINTS = method(ckpt_pb, "Checkpoint", "List")
GET_MANIFEST = method(ckpt_pb, "Checkpoint", "GetManifest")
ABORT_CHECKPOINT = method(ckpt_pb, "Checkpoint", "Abort")
VERIFY_CHECKPOINT = method(ckpt_pb, "Checkpoint", "Verify")
REPORT_QUEUE = method(coord_pb, "Coordinator", "ReportQueue")


# stokerctl's dataset format names (its --dataset syntax): the enum's short
# names in lower case ("megatron"); "" when unset, "?" outside the enum.
_FORMAT_NAMES: dict[int, str] = {
    v.number: enum_name(dl_pb.DatasetFormat.DESCRIPTOR, v.number).lower()
    for v in dl_pb.DatasetFormat.DESCRIPTOR.values
    if v.number
}
_FORMAT_VALUES: dict[str, int] = {"": 0, **{v: k for k, v in _FORMAT_NAMES.items()}}


def _format_name(m: dl_pb.DatasetSpec) -> str:
    return "" if m.format == 0 else _FORMAT_NAMES.get(m.format, "?")


class _Result(Mirror):
    """A result mirrored from a message; ``as_dict()`` is stokerctl's
    object, by default every field in order (:meth:`Mirror.as_dict`; the
    classes whose stokerctl object differs say how)."""


# ---- the coordinator's objects ---------------------------------------------------


@mirror(common_pb2.CheckpointRef)
@dataclass(frozen=True)
class CheckpointRef(_Result):
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


@mirror(coord_pb.JobSpec)
@dataclass(frozen=True)
class JobSpec(_Result):
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


@mirror(coord_pb.Member)
@dataclass(frozen=True)
class Member(_Result):
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


@mirror(coord_pb.Job)
@dataclass(frozen=True)
class Job(_Result):
    """A job as the coordinator holds it.

    state: "WAITING" (a rendezvous round is open), "RUNNING", "PAUSING",
    "PAUSED", "STOPPED" or "FINISHED" (every member left finished); reason:
    why it is in that state. generation: the
    number of the current (or last) rendezvous round; world_size: its ranks
    (0 while waiting); target_ranks: set by scale (0: up to max_ranks);
    target_seq: which scale set it, the seq of the SCALED event it logged (a
    new one at every scale, even to the same ranks; 0: none yet), so a
    queue controller tells its own setting from a user's;
    waiting: joins parked in the open round. members: the current
    generation's, by rank. latest_checkpoint: None when the coordinator sent
    none (a ref with step 0 means no checkpoint yet). Times are Unix ms;
    last_event_seq: the newest event (``watch(after_seq=...)``). queue: a
    submitted job's place in its cluster's queue, the queue controller's last
    report (None before the first, and for jobs not submitted).
    member_count: the generation's members in all. The coordinator answers
    members in pages (ListMembers); ``Jobs.show`` and ``Jobs.list`` follow
    them, so members holds every one and next_members_page_token is "".
    The Jobs the operator actions answer hold the first page (a
    non-empty token says more follow).
    """

    name: str = field(metadata=derived(lambda m: m.spec.name))
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
    next_members_page_token: str = ""
    member_count: int = 0
    target_seq: int = 0

    @property
    def step(self) -> int:
        """The highest step any member reported (stokerctl's STEP column)."""
        return max((x.step for x in self.members), default=0)


@mirror(coord_pb.JobEvent)
@dataclass(frozen=True)
class JobEvent(_Result):
    """One entry of a job's event log.

    seq: its number in the job's log (ascending); time_ms: Unix ms; type:
    "CREATED", "MEMBER_JOINED", "ROUND_CLOSED", "ROUND_OPENED",
    "MEMBER_LOST", "MEMBER_LEFT", "SCALED", "PAUSED", "RESUMED", "STOPPED",
    "DELETED", "CHECKPOINT", "HEALTH", "COORDINATOR_RESTARTED", "FINISHED" or
    "PREEMPTED" (a preemption notice: message the reason, step where it came),
    or a submitted job's "QUEUED", "ADMITTED", "REJECTED", "SHRUNK", "GROWN" (see
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


# ---- the dataloader's ---------------------------------------------------------------


@mirror(dl_pb.DatasetSpec)
@dataclass(frozen=True)
class DatasetSpec(_Result):
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
    uri: str = field(metadata=derived(lambda m: m.source.uri, covers="source"))
    format: str = field(default="", metadata=derived(_format_name, covers="format"))
    weight: float = 1.0
    tokenizer: str = ""
    block_tokens: int = 0
    block_bytes: int = 0

    def to_proto(self) -> dl_pb.DatasetSpec:
        """The ``DatasetSpec`` message; a bad value is INVALID_ARGUMENT."""
        fmt = _FORMAT_VALUES.get(self.format)
        if fmt is None:
            raise invalid_argument(
                f"dataset {self.name!r}: format {self.format!r} is none of {sorted(_FORMAT_VALUES)}"
            )
        return to_message(
            dl_pb.DatasetSpec,
            name=self.name,
            source=self.uri,
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


@mirror(dl_pb.LoaderSpec)
@dataclass(frozen=True)
class LoaderSpec(_Result):
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


@mirror(dl_pb.LoaderInfo)
@dataclass(frozen=True)
class Loader(_Result):
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

    job: str = field(metadata=derived(lambda m: m.spec.job))
    committed_step: int
    spec: LoaderSpec | None
    part: int
    parts: int
    lane_lines_generated: tuple[int, ...]
    failed: bool = False
    failure: str = ""

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


@mirror(ckpt_pb.Box)
@dataclass(frozen=True)
class Box(_Result):
    """A box of a tensor: per dimension its first index and its extent (elements)."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@mirror(ckpt_pb.ChunkEntry)
@dataclass(frozen=True)
class ChunkEntry(_Result):
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


@mirror(ckpt_pb.ObjectEntry)
@dataclass(frozen=True)
class ObjectEntry(_Result):
    """One stored object: key relative to the checkpoint's attempt directory,
    size in bytes, and the CRC32C of each block (crc_block_bytes each)."""

    key: str
    size: int
    block_crc32c: tuple[int, ...]


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


@mirror(ckpt_pb.Manifest)
@dataclass(frozen=True)
class Manifest(_Result):
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


@mirror(ckpt_pb.VerifyCheckpointResponse)
@dataclass(frozen=True)
class VerifyReport(_Result):
    """What re-reading every byte of a checkpoint found: objects, bytes and
    CRC blocks read, and one line per bad object or block (ok: none)."""

    job: str = field(metadata=GIVEN)
    step: int = field(metadata=GIVEN)
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

    def _job(self, m: Method[Any, Any], retry: bool = False, **request: Any) -> Job:
        return Job.from_proto(m.call(self._coordinator(), retry, **request))

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
        spec = to_message(
            coord_pb.JobSpec,
            name=name,
            min_ranks=min_ranks,
            max_ranks=max_ranks,
            heartbeat_interval_ms=heartbeat_interval_ms,
            heartbeat_misses=heartbeat_misses,
            last_call_ms=last_call_ms,
            join_timeout_ms=join_timeout_ms,
            labels=dict(labels or {}),
            dataset=dataset,
            checkpoint_storage=checkpoint_storage,
            checkpoint_every_steps=checkpoint_every_steps,
        )
        return self._job(CREATE_JOB, spec=spec)

    def show(self, name: str) -> Job:
        """The job now (``stokerctl job show``) with every member of its
        generation, all member pages followed; NOT_FOUND when there is none.
        Read again when the generation changes meanwhile (a page never mixes
        two), ABORTED after 5 reads."""
        for reads in range(1, _MEMBER_READS + 1):
            m = GET_JOB.call(self._coordinator(), True, job=name)
            try:
                return Job.from_proto(self._all_members(m))
            except StokerError as e:
                if e.code != grpc.StatusCode.ABORTED or reads == _MEMBER_READS:
                    raise
        raise AssertionError("unreachable")

    get = show

    def scale(
        self, name: str, ranks: int, skip_checkpoint: bool = False, in_place: bool = False
    ) -> Job:
        """Asks the job to restart at ``ranks`` ranks (min_ranks <= ranks <=
        max_ranks), after a checkpoint unless ``skip_checkpoint``. ``in_place``
        (a running submitted job scaled down while its queue controller
        deletes the removed ranks' pods): the kept ranks checkpoint with the
        removed ones and rejoin without restarting, and the removed ranks'
        SIGTERM is no preemption notice (ScaleJobRequest.in_place)."""
        return self._job(
            SCALE_JOB, job=name, ranks=ranks, skip_checkpoint=skip_checkpoint, in_place=in_place
        )

    def pause(self, name: str, force: bool = False) -> Job:
        """Checkpoint, then stop the ranks; resumable. ``force``: do not ask
        for a checkpoint first."""
        return self._job(PAUSE_JOB, job=name, force=force)

    def resume(self, name: str) -> Job:
        """Opens a rendezvous round for a paused job."""
        return self._job(RESUME_JOB, job=name)

    def preempt(self, name: str, reason: str = "") -> Job:
        """A preemption notice for the whole job (``stokerctl job preempt``;
        a queue controller evicting it): every rank checkpoints at one step
        and stops resumably, the job is PAUSED and resumes by itself when its
        ranks join again. A second notice changes nothing."""
        return self._job(PREEMPT_JOB, job=name, reason=reason)

    def stop(self, name: str, force: bool = False) -> Job:
        """Ends the job for good (every member is told STOP), after a
        checkpoint unless ``force``."""
        return self._job(STOP_JOB, job=name, force=force)

    def delete(self, name: str, force: bool = False) -> None:
        """Deletes the job and its events; ``force``: even while ranks are members."""
        DELETE_JOB.call(self._coordinator(), job=name, force=force)

    def watch(
        self, name: str, after_seq: int = 0, *, idle_timeout: float | None = None
    ) -> JobWatch:
        """The job's events with seq > after_seq, then live ones (``stokerctl
        job watch``); see :class:`JobWatch`. ``idle_timeout``: seconds
        without an event after which the iteration ends (None: wait as long
        as the job lives)."""
        stream = WATCH_JOB.stream(self._coordinator(), job=name, after_seq=after_seq)
        return JobWatch(stream, after_seq, idle_timeout)

    def list(self, label_selector: Mapping[str, str] | None = None) -> builtins.list[Job]:
        """Every job whose labels include all of ``label_selector``
        (``stokerctl jobs list --label K=V``), by name, every page followed."""
        selector = dict(label_selector or {})
        jobs = LIST_JOBS.pages(self._coordinator(), "jobs", label_selector=selector)
        out = []
        for j in jobs:
            try:
                out.append(Job.from_proto(self._all_members(j)))
            except StokerError as e:
                if e.code != grpc.StatusCode.ABORTED:
                    raise
                out.append(self.show(j.spec.name))  # a new generation since the listing
        return out

    def _all_members(self, m: coord_pb.Job) -> coord_pb.Job:
        """m with the member pages after its first (ListMembers from its
        next_members_page_token) appended. ABORTED (StokerError) when the
        generation changed meanwhile: the token names its generation."""
        if m.next_members_page_token:
            rest = LIST_MEMBERS.pages(
                self._coordinator(),
                "members",
                job=m.spec.name,
                page_token=m.next_members_page_token,
            )
            m.members.extend(rest)
            m.next_members_page_token = ""
        return m

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
        spec = to_message(
            dl_pb.LoaderSpec,
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

        def create(conn: Connection) -> Loader:
            try:
                reply = CREATE_LOADER.call(conn, spec=spec)
            except StokerError as e:
                if not exist_ok or e.code != grpc.StatusCode.ALREADY_EXISTS:
                    raise
                return self._get_loader(conn, job)
            return Loader.from_proto(reply)

        return _combine_parts(_each_part(self._connections("STOKER_DATALOADER"), create))

    def loader_parts(self, job: str) -> builtins.list[Loader]:
        """``GetLoader`` of every dataloader address given, in part order (a
        failure names the part when there are several)."""
        return _each_part(
            self._connections("STOKER_DATALOADER"), lambda conn: self._get_loader(conn, job)
        )

    @staticmethod
    def _get_loader(conn: Connection, job: str) -> Loader:
        return Loader.from_proto(GET_LOADER.call(conn, True, job=job))

    def loaders(self) -> builtins.list[Loader]:
        """Every job of every dataloader address given (``stokerctl loader
        list``), part by part, each process's by name; failed ones included."""
        conns = self._connections("STOKER_DATALOADER")
        out: builtins.list[Loader] = []
        for conn in conns:
            infos = LIST_LOADERS.pages(conn, "loaders")
            out.extend(Loader.from_proto(m) for m in infos)
        return out

    def delete_loader(self, job: str) -> None:
        """Removes the job and what it stored from every part, in part order
        (``stokerctl loader delete``); a failure names the part when there
        are several. NOT_FOUND when no part knows the job."""
        _each_part(
            self._connections("STOKER_DATALOADER"), lambda conn: DELETE_LOADER.call(conn, job=job)
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
        refs = LIST_CHECKPOINTS.pages(self._checkpoint(), "checkpoints", job=job)
        return Checkpoints(job, tuple(CheckpointRef.from_proto(c) for c in refs))

    def checkpoint(self, job: str, step: int) -> Manifest:
        """The manifest of the checkpoint at ``step`` (``stokerctl checkpoint
        show``); NOT_FOUND when there is none."""
        return Manifest.from_proto(GET_MANIFEST.call(self._checkpoint(), True, job=job, step=step))

    def abort_checkpoint(self, attempt: str, reason: str = "") -> None:
        """Ends an open checkpoint attempt (``stokerctl checkpoint abort``):
        its writers fail with ABORTED naming ``reason``, its staging is freed
        and what it uploaded is deleted. Aborting one already aborted is fine;
        NOT_FOUND for an attempt the service does not know,
        FAILED_PRECONDITION once it commits."""
        ABORT_CHECKPOINT.call(self._checkpoint(), attempt=attempt, reason=reason)

    def verify(self, job: str, step: int) -> VerifyReport:
        """Re-reads every byte of the checkpoint and checks every block CRC
        on the service (``stokerctl checkpoint verify``). Bad blocks are in
        the report's ``problems``, not an error; it can take as long as
        reading the checkpoint, within the client's timeout."""
        reply = VERIFY_CHECKPOINT.call(self._checkpoint(), True, job=job, step=step)
        return VerifyReport.from_proto(reply, job=job, step=step)

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
        argument is INVALID_ARGUMENT naming the field; a queue or priority the
        caller's token does not grant (its token-table line's ``queues=``,
        ``priorities=``) is PERMISSION_DENIED naming the field; nothing is
        created either way. A team token granted queues that names none is
        submitted to the first (the returned job's ``spec.submission``)."""
        sub = to_message(
            coord_pb.Submission,
            queue=queue,
            priority=priority,
            template=template,
            args=list(args),
        )
        req = to_message(
            coord_pb.JobSpec,
            name=name,
            min_ranks=min_ranks,
            max_ranks=max_ranks,
            labels=dict(labels or {}),
            submission=sub,
            checkpoint_storage=checkpoint_storage,
            **spec,
        )
        return self._job(CREATE_JOB, spec=req)

    def resize(self, name: str, ranks: int, skip_checkpoint: bool = False) -> Job:
        """:meth:`scale` by the name ``stokerctl job resize`` uses: checkpoint,
        then go on at ``ranks`` ranks. A submitted job's queue controller
        applies it to its workload: down with PreemptJob (checkpoint, stop)
        and fewer pods, up with a new workload slice, the job growing once
        the new ranks joined; the log says SCALED, then PREEMPTED and SHRUNK,
        or ADMITTED and GROWN. ``ranks`` beyond max_ranks or below min_ranks:
        INVALID_ARGUMENT naming both, nothing changed."""
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
        return self._job(REPORT_QUEUE, job=name, status=st)

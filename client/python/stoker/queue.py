"""``stoker.queue``: jobs submitted to a cluster queue, as Python values.

A job submitted with :meth:`stoker.jobs.Jobs.submit` (``stokerctl job submit``) carries a
:class:`Submission` in its spec: the queue, priority class and workload template the queue
controller (deploy/k8s) starts its ranks from, and the trainer's extra arguments. The
controller reports what the cluster says of it (:meth:`~stoker.jobs.Jobs.report_queue`,
``ReportQueue``): the job's :class:`QueueStatus`. Users follow both in the job's event log
(:meth:`~stoker.jobs.Jobs.watch`), where these event types say what happened:

==============  ================================================================
``QUEUED``      waiting for admission; message "queued in Q at position N"
``ADMITTED``    quota reserved; world_size the admitted ranks
``PREEMPTED``   evicted (or another preemption notice); step where it came
``SHRUNK``      a round closed at fewer ranks; world_size the new world, step
                the checkpoint it resumes from
``GROWN``       the same at more ranks
``RESUMED``     a preempted job trains again; step the checkpoint it restores
``REJECTED``    the controller could not make a workload of it (a missing or
                bad template, a Job the cluster refused); message says why
==============  ================================================================

:func:`describe` renders one event as ``stokerctl job watch`` does. No Kubernetes
credentials are needed: everything goes through the coordinator, under its token scopes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stoker._proto import Mirror, mirror
from stoker.v1 import coordinator_pb2 as coord_pb

# The event types of a submitted job's life (JobEvent.type).
QUEUED = "QUEUED"
ADMITTED = "ADMITTED"
PREEMPTED = "PREEMPTED"
SHRUNK = "SHRUNK"
GROWN = "GROWN"
RESUMED = "RESUMED"
REJECTED = "REJECTED"
QUEUE_EVENTS = frozenset({QUEUED, ADMITTED, PREEMPTED, SHRUNK, GROWN, RESUMED, REJECTED})

# QueueStatus.state values.
QUEUE_STATES = ("UNSPECIFIED", "QUEUED", "ADMITTED", "EVICTED", "FINISHED", "REJECTED")


@mirror(coord_pb.Submission)
@dataclass(frozen=True)
class Submission(Mirror):
    """Where a submitted job runs (JobSpec.submission).

    queue: the queue's name (a Kueue LocalQueue; "" the controller's default); priority: a
    priority class ("" the queue's default); template: the workload template the controller
    knows by this name; args: extra arguments appended to the template's trainer command.
    """

    queue: str
    priority: str
    template: str
    args: tuple[str, ...]


@mirror(coord_pb.QueueStatus)
@dataclass(frozen=True)
class QueueStatus(Mirror):
    """The queue controller's last report on a submitted job (Job.queue).

    state: "QUEUED", "ADMITTED", "EVICTED", "FINISHED" or "REJECTED"; workload: its name in
    the cluster (a Kueue Workload); cluster_queue: the cluster-wide queue; position: 0-based
    among the queue's pending workloads (-1 unknown); admitted_ranks: ranks the admission
    covers; message: the cluster's last word on it; updated_ms: Unix ms of the report.
    """

    state: str
    workload: str
    cluster_queue: str
    position: int
    admitted_ranks: int
    message: str
    updated_ms: int


def status_proto(
    state: str,
    *,
    workload: str = "",
    cluster_queue: str = "",
    position: int = -1,
    admitted_ranks: int = 0,
    message: str = "",
    updated_ms: int = 0,
) -> coord_pb.QueueStatus:
    """A QueueStatus message from its fields; state by name ("QUEUED", ...). An unknown state
    raises ValueError."""
    if state not in QUEUE_STATES[1:]:
        raise ValueError(f"state must be one of {', '.join(QUEUE_STATES[1:])}, not {state!r}")
    return coord_pb.QueueStatus(
        state=coord_pb.QueueState.Value("QUEUE_STATE_" + state),
        workload=workload,
        cluster_queue=cluster_queue,
        position=position,
        admitted_ranks=admitted_ranks,
        message=message,
        updated_ms=updated_ms,
    )


def describe(event: Any) -> str:
    """What a job event says, as ``stokerctl job watch`` renders the queue and resize events
    ("admitted 4 ranks", "shrunk to 2 ranks at step 300"); other events: their message (or
    their type in lower case)."""
    t, msg, step = event.type, event.message, event.step
    if t == QUEUED:
        return str(msg or "queued")
    if t == ADMITTED:
        by = msg[msg.index(" by ") :] if msg.startswith("admitted ") and " by " in msg else ""
        return f"admitted {_ranks(event.world_size)}{by}"
    if t == PREEMPTED:
        return f"preempted at step {step}" + (f": {msg}" if msg else "")
    if t in (SHRUNK, GROWN):
        return f"{t.lower()} to {_ranks(event.world_size)} at step {step}"
    if t == RESUMED:
        return f"resumed at step {step}" + (f": {msg}" if msg else "")
    if t == REJECTED:
        return str(msg or "rejected by the queue controller")
    return str(msg or t.lower())


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"

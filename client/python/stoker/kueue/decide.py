"""What the queue controller does next, from what it sees: pure functions
over Kubernetes objects as the API server returns them (camelCase dicts, as
``kubectl get -o json`` prints them), and over the coordinator's job view.
Nothing here calls anything, so every decision is tested on recorded objects.

The cluster's ClusterQueue preempts nothing by itself (``withinClusterQueue:
Never``, deploy/k8s/components/kueue-controller/README.md): a pending workload
that does not fit waits, and :func:`plan` says how Stoker makes room for it,
cheapest first:

1. **Shrink** elastic Stoker jobs of lower priority that run above their
   ``min_ranks``: as few ranks as cover what the pending workload needs beyond
   the free quota, lowest priority (then newest) first.
2. **Evict** (checkpoint first) lower-priority Stoker jobs whole, lowest
   priority (then newest) first, when shrinking cannot free enough.

and when nothing waits, **grow** an elastic job below the size it wants
(:func:`wanted_ranks`: its ``max_ranks``, or what a user's resize asked) by
what the free quota holds, at once rather than a rank at a time (every
growth is a checkpoint and a new round of all ranks, so one step costs less
than several; a workload that arrives later gets the ranks back by a
shrink), and **scale** the coordinator's job to the ranks its Job now runs
(:func:`scale_up`).

A grow is a new workload slice that Kueue admits only when the quota holds
it; until then the old slice keeps the job's admitted pods. Such a job
(``Running.slice_count``) stays in the plan at its admitted size: it
shrinks like any other (fewer pods: Kueue sets the pending slice to them,
and admits it at once as the old slice's replacement, which needs no
quota), it is never grown again, and its slice is **withdrawn**
(:class:`Withdraw`: the Job's pods back to the admitted count) when a
workload of higher or equal priority waits in its ClusterQueue that does
not fit beside it: Kueue orders its queue by priority, then age, so a slice
made before an equal-priority workload arrived would take the quota that
workload waits for, and one made before a higher-priority workload arrived
would take what frees while that one still does not fit (a grow now, a
shrink next). An eviction of such a job is a withdrawal first (Kueue v0.17
finishes an evicted old slice and leaves the Job running on its pending
one); once the slice is gone, the next plan evicts. A withdrawn grow is
asked again, as any grow, when nothing waits and the quota holds it.

A user's resize of a submitted job (``ScaleJob``, ``stokerctl job resize``)
sets the coordinator's target and nothing else; :func:`user_resize` sees it
(a setting of the target the controller did not make itself: the
coordinator's ``Job.target_seq``, the seq of the SCALED event of the
ScaleJob that set it, unlike the one the controller recorded,
``TARGET_SEQ_ANNOTATION``) and the controller applies it as it shrinks and
grows (:class:`Resize`).

Units: quantities are :class:`decimal.Decimal` in the resource's base unit
(cores, bytes), parsed by the Kubernetes client's ``parse_quantity``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

# The Job's pod label that names its Stoker job (deploy/k8s/overlays/example).
JOB_LABEL = "stoker.io/job"
# Kueue's labels and annotations (v0.17) the controller reads.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
ELASTIC_ANNOTATION = "kueue.x-k8s.io/elastic-job"
# On a workload slice that asks for a grown Job's pods (it replaces the
# admitted one once admitted).
SLICE_ANNOTATION = "kueue.x-k8s.io/workload-slice-replacement-for"
# The controller's own annotations on a Job: the ranks a user's resize asked
# for (it grows back to this; absent: to max_ranks), the coordinator target
# the controller set or applied last, and which setting of it that was (the
# coordinator's Job.target_seq: a setting with another seq is a user's).
WANTED_ANNOTATION = "stoker.io/ranks-wanted"
TARGET_ANNOTATION = "stoker.io/ranks-target"
TARGET_SEQ_ANNOTATION = "stoker.io/ranks-target-seq"
# On a Workload the controller deactivated to evict its job after the job's
# checkpoint: the controller activates it again once its pods are gone.
YIELDED_ANNOTATION = "stoker.io/yielded"

Resources = dict[str, Decimal]
Obj = Mapping[str, Any]


def conditions(obj: Obj) -> dict[str, Obj]:
    """The object's status conditions by type."""
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def is_true(obj: Obj, kind: str) -> bool:
    return conditions(obj).get(kind, {}).get("status") == "True"


def stoker_job_of(job: Obj) -> str | None:
    """The Stoker job a batch/v1 Job runs (its pod template's label), or None."""
    labels = ((job.get("spec") or {}).get("template", {}).get("metadata") or {}).get("labels")
    value = (labels or {}).get(JOB_LABEL)
    return str(value) if value else None


def pod_requests(pod_spec: Obj) -> Resources:
    """What Kueue counts for one pod: per resource, the larger of the sum over
    the containers and the largest init container (no overhead)."""
    total: Resources = {}
    for c in pod_spec.get("containers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[k] = total.get(k, Decimal(0)) + parse_quantity(v)
    for c in pod_spec.get("initContainers") or []:
        for k, v in ((c.get("resources") or {}).get("requests") or {}).items():
            total[k] = max(total.get(k, Decimal(0)), parse_quantity(v))
    return total


def workload_requests(wl: Obj) -> Resources:
    """The quota a Workload asks: every pod set's count times its pod's requests."""
    total: Resources = {}
    for ps in wl.get("spec", {}).get("podSets") or []:
        per_pod = pod_requests(ps.get("template", {}).get("spec", {}))
        for k, v in per_pod.items():
            total[k] = total.get(k, Decimal(0)) + v * int(ps.get("count", 1))
    return total


def cluster_queue_free(cq: Obj) -> Resources:
    """Nominal quota minus what is reserved, per resource, over every flavor
    (borrowing from a cohort is not counted)."""
    free: Resources = {}
    for group in cq.get("spec", {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for r in flavor.get("resources") or []:
                free[r["name"]] = free.get(r["name"], Decimal(0)) + parse_quantity(
                    r["nominalQuota"]
                )
    for flavor in (cq.get("status") or {}).get("flavorsReservation") or []:
        for r in flavor.get("resources") or []:
            free[r["name"]] = free.get(r["name"], Decimal(0)) - parse_quantity(r["total"])
    return free


def owner_job(wl: Obj) -> str:
    """The name of the batch/v1 Job that owns a Workload ("" when none)."""
    for o in wl.get("metadata", {}).get("ownerReferences") or []:
        if o.get("kind") == "Job":
            return str(o.get("name", ""))
    return ""


def current_workload(job_name: str, workloads: Iterable[Obj]) -> Obj | None:
    """The newest unfinished Workload of a Job (an elastic Job has at most two:
    the admitted slice and a pending one that replaces it)."""
    mine = [w for w in workloads if owner_job(w) == job_name and not is_true(w, "Finished")]
    mine.sort(key=lambda w: str(w["metadata"].get("creationTimestamp", "")))
    return mine[-1] if mine else None


def eviction_notice(wl: Obj) -> str | None:
    """Why Kueue is taking the Workload's admission away, or None: its Evicted
    or Preempted condition, the first sign from the cluster's side."""
    c = conditions(wl)
    for kind in ("Evicted", "Preempted"):
        cond = c.get(kind)
        if cond and cond.get("status") == "True":
            return f"kueue: workload {wl['metadata']['name']} {kind} ({cond.get('reason', '')})"
    return None


def job_count(job: Obj) -> int:
    """The pods Kueue counts for a Job: min(parallelism, completions)."""
    spec = job.get("spec", {})
    p = int(spec.get("parallelism", 1))
    c = spec.get("completions")
    return min(p, int(c)) if c is not None else p


@dataclass(frozen=True)
class Running:
    """A Stoker job that holds quota: its Job, Workload and sizes.

    count: pods admitted (the admitted Workload's count); min_ranks,
    max_ranks: the coordinator's; wanted: what it grows back to; per_pod: one
    rank's requests; priority: its Workload's. submitted: a submitted job
    (JobSpec.submission); target: the coordinator's target_ranks (0: none);
    target_seq: which ScaleJob set it (Job.target_seq, 0: none or a
    coordinator without it); set_target, set_seq: the target and its seq
    the controller set or applied last (TARGET_ANNOTATION,
    TARGET_SEQ_ANNOTATION; 0: none). slice_count: the pods a workload slice
    Kueue has not admitted yet asks for (a grow waiting for quota; 0: none).
    """

    job: str
    stoker_job: str
    workload: str
    cluster_queue: str
    priority: int
    created: str
    count: int
    min_ranks: int
    max_ranks: int
    wanted: int
    elastic: bool
    per_pod: Resources
    submitted: bool = False
    target: int = 0
    set_target: int = 0
    target_seq: int = 0
    set_seq: int = 0
    slice_count: int = 0

    @property
    def can_give(self) -> int:
        return max(0, self.count - self.min_ranks) if self.elastic else 0

    @property
    def growing(self) -> bool:
        """A grow's slice waits for Kueue's admission."""
        return self.slice_count > self.count


@dataclass(frozen=True)
class Pending:
    """A workload waiting for quota (anyone's)."""

    workload: str
    job: str
    cluster_queue: str
    priority: int
    created: str
    needs: Resources


@dataclass(frozen=True)
class Shrink:
    job: Running
    to: int
    reason: str


@dataclass(frozen=True)
class Evict:
    job: Running
    reason: str


@dataclass(frozen=True)
class Grow:
    job: Running
    to: int


@dataclass(frozen=True)
class Withdraw:
    """A pending grow slice taken back: the Job's pods back to the admitted
    count (Kueue sets the slice to it and replaces the old slice with it)."""

    job: Running
    reason: str


@dataclass(frozen=True)
class Resize:
    """A user's resize to apply: ``to`` below the count: checkpoint, then
    fewer pods; above: more pods (a new workload slice); equal: only
    recorded (what the job grows back to)."""

    job: Running
    to: int
    reason: str


Action = Shrink | Evict | Grow | Withdraw | Resize


def wanted_ranks(annotations: Mapping[str, str], max_ranks: int) -> int:
    """The ranks a Job grows toward: what a user's resize asked
    (WANTED_ANNOTATION), else max_ranks; never past max_ranks."""
    try:
        wanted = int(annotations.get(WANTED_ANNOTATION, max_ranks))
    except ValueError:
        wanted = max_ranks
    return max(1, min(wanted, max_ranks))


def resize_to(
    target: int,
    target_seq: int,
    set_target: int,
    set_seq: int,
    min_ranks: int,
    max_ranks: int,
) -> int | None:
    """The size a user's resize asks, or None: the coordinator's ``target``
    (0: none) when the controller did not set it itself, within
    min_ranks..max_ranks. Which setting is the controller's is exact by the
    seq of the ScaleJob that made it (``target_seq`` against the
    ``set_seq`` the controller recorded), so a user's resize to the very
    size the controller set last is the user's; only when either seq is
    unknown (a coordinator or a Job annotated before target_seq) the sizes
    are compared."""
    if target <= 0:
        return None
    if target_seq and set_seq:
        if target_seq == set_seq:
            return None
    elif target == set_target:
        return None
    return max(min_ranks, min(target, max_ranks))


def user_resize(r: Running) -> Resize | None:
    """A submitted job's resize by its user, to apply, or None."""
    if not r.submitted:
        return None
    to = resize_to(r.target, r.target_seq, r.set_target, r.set_seq, r.min_ranks, r.max_ranks)
    if to is None:
        return None
    if to < r.count:
        why = f"resize {r.count} -> {to} asked by the user: checkpoint, then restart at {to} ranks"
    elif to > r.count:
        why = f"resize {r.count} -> {to} asked by the user: a workload slice for {to} ranks"
    elif r.slice_count:
        why = (
            f"resize to {to} asked by the user: already {to} ranks; the pending workload "
            f"slice for {r.slice_count} withdrawn"
        )
    else:
        why = f"resize to {to} asked by the user: already {to} ranks"
    return Resize(r, to, why)


def shortfall(needs: Resources, free: Resources) -> Resources:
    """What is missing per resource (only the positive parts)."""
    out = {k: v - free.get(k, Decimal(0)) for k, v in needs.items()}
    return {k: v for k, v in out.items() if v > 0}


def ranks_covering(short: Resources, per_pod: Resources) -> int | None:
    """The fewest pods of ``per_pod`` whose requests cover ``short``; None when
    a short resource is one the pod does not request."""
    k = 0
    for name, v in short.items():
        p = per_pod.get(name, Decimal(0))
        if p <= 0:
            return None
        k = max(k, math.ceil(v / p))
    return k


def plan(pending: Iterable[Pending], running: Iterable[Running], free: Resources) -> list[Action]:
    """What to do for the first pending workload (highest priority, then
    oldest) that does not fit, in one ClusterQueue's view: shrinks if they can
    free enough, else evictions (of a job whose grow slice is pending: its
    withdrawal first), else nothing; besides, withdraw the pending grow
    slices that a waiting workload of higher or equal priority does not fit
    beside. When nothing waits, grow the jobs below what they want by what
    is free (not one whose slice is pending)."""
    waiting = sorted(pending, key=lambda p: (-p.priority, p.created))
    jobs = list(running)
    acts: list[Action] = []
    for p in waiting:
        short = shortfall(p.needs, free)
        if not short:
            continue  # Fits: Kueue admits it in its next cycle.
        lower = sorted(
            (r for r in jobs if r.priority < p.priority and r.cluster_queue == p.cluster_queue),
            key=lambda r: r.created,
            reverse=True,
        )
        lower.sort(key=lambda r: r.priority)  # Lowest priority, then newest, first.
        shrinks = _shrinks(p, lower, short)
        if shrinks is not None:
            acts = list(shrinks)  # Fewer pods: a pending slice goes with them.
        else:
            acts = [_evict_or_withdraw(e) for e in _evictions(p, lower, short)]
        break  # Otherwise nothing of ours can make room; it waits as Kueue decides.
    if not waiting:
        return list(_grows(jobs, free))
    acted = {a.job.job for a in acts}
    # Someone waits: no grow takes what they may need.
    return acts + [w for w in _withdrawals(jobs, waiting, free) if w.job.job not in acted]


def _evict_or_withdraw(e: Evict) -> Evict | Withdraw:
    if not e.job.slice_count:
        return e
    return Withdraw(e.job, f"{e.reason}: its pending workload slice withdrawn first")


def _withdrawals(jobs: list[Running], waiting: list[Pending], free: Resources) -> list[Withdraw]:
    """The pending grow slices that a waiting workload of higher or equal
    priority in the same ClusterQueue does not fit beside."""
    out = []
    for r in jobs:
        if not r.growing:
            continue
        extra = r.slice_count - r.count
        left = {n: free.get(n, Decimal(0)) - v * extra for n, v in r.per_pod.items()}
        left = {**free, **left}
        for p in waiting:
            if p.priority < r.priority or p.cluster_queue != r.cluster_queue:
                continue
            if shortfall(p.needs, left):
                why = (
                    f"grow {r.count} -> {r.slice_count} withdrawn: workload {p.workload} "
                    f"(priority {p.priority}) waits for the quota it would take"
                )
                out.append(Withdraw(r, why))
                break
    return out


def _shrinks(p: Pending, lower: list[Running], short: Resources) -> list[Shrink] | None:
    out: list[Shrink] = []
    left = dict(short)
    for r in lower:
        if r.can_give == 0:
            continue
        k = ranks_covering(left, r.per_pod)
        if k is None:
            continue
        give = min(k, r.can_give)
        out.append(Shrink(r, r.count - give, f"yielding {give} rank(s) to workload {p.workload}"))
        left = {n: v - r.per_pod.get(n, Decimal(0)) * give for n, v in left.items()}
        left = {n: v for n, v in left.items() if v > 0}
        if not left:
            return out
    return None


def _evictions(p: Pending, lower: list[Running], short: Resources) -> list[Evict]:
    out: list[Evict] = []
    left = dict(short)
    for r in lower:
        out.append(Evict(r, f"preempted by workload {p.workload} (no yield possible)"))
        left = {n: v - r.per_pod.get(n, Decimal(0)) * r.count for n, v in left.items()}
        left = {n: v for n, v in left.items() if v > 0}
        if not left:
            return out
    return []


def _grows(jobs: list[Running], free: Resources) -> Iterable[Grow]:
    left = dict(free)
    for r in sorted(jobs, key=lambda r: (-r.priority, r.created)):
        want = min(r.wanted, r.max_ranks) - r.count  # To max_ranks, or what a user asked.
        if want <= 0 or not r.elastic or r.slice_count:
            continue  # (A slice pending: Kueue admits it when the quota frees.)
        fits = min(
            (int(left.get(n, Decimal(0)) // v) for n, v in r.per_pod.items() if v > 0),
            default=want,
        )
        k = min(want, fits)
        if k > 0:
            yield Grow(r, r.count + k)
            left = {n: v - r.per_pod.get(n, Decimal(0)) * k for n, v in left.items()}


def scale_up(
    admitted_pods: int, ready_pods: int, state: str, world: int, target: int, max_ranks: int
) -> int | None:
    """The ranks to ScaleJob the coordinator's job to, or None: when every pod
    the Job's admission covers is Ready and the job runs a smaller world (the
    new ranks joined and park as spares), scale it up to them (the coordinator
    checkpoints at a step boundary, then closes a round with them). state,
    world, target, max_ranks: the coordinator's ``Job`` (state "RUNNING",
    world_size, target_ranks, spec.max_ranks)."""
    want = min(admitted_pods, max_ranks or admitted_pods)
    if state != "RUNNING" or world == 0:
        return None
    if ready_pods < admitted_pods or want <= world or target == want:
        return None
    return want

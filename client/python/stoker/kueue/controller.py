"""The queue controller's loop: watch the namespace's Jobs and Kueue
Workloads, decide (:mod:`stoker.kueue.decide`), act through the Kubernetes
API (the official client) and the coordinator (:class:`stoker.jobs.Jobs`).

One reconcile reads everything it needs afresh (the Jobs, the Workloads, the
ClusterQueues they use) and acts on what it sees, so a missed watch event or
a restart of the controller loses nothing: the watches only wake the loop
early, and it also runs every ``interval_s``. What it does, in this order:

1. **Notices.** A Stoker job whose Workload Kueue marks Evicted or Preempted
   (or whose Job is suspended while pods run) gets ``PreemptJob`` at once: its
   ranks checkpoint at a step boundary and stop, before or while their pods get
   SIGTERM (the coordinator takes the first sign and ignores the rest).
2. **Reactivation.** A Workload the controller deactivated to evict its job
   (below) is activated again once the Job's pods are gone: it queues again.
3. **A user's resize** of a submitted job (``ScaleJob`` / ``stokerctl job
   resize`` set the coordinator's target; :func:`decide.user_resize`): down
   as a shrink below (``PreemptJob``, fewer pods), up as a grow (more pods, a
   new workload slice; the coordinator scales once the new ranks joined),
   and recorded on the Job (``stoker.io/ranks-wanted``: it grows back to
   that, not to max_ranks). A queued (suspended) Job just gets the new size.
4. **Plan and act** per ClusterQueue (:func:`decide.plan`): shrink =
   ``PreemptJob`` (checkpoint, stop), ``ScaleJob`` to the smaller size (only
   the target: the job is pausing), and lower the Job's ``parallelism`` and
   ``completions`` together (Kueue shrinks the admitted Workload in place and
   releases the quota; the Job controller deletes the highest indexes; the
   others exit 75, come back and resume the job smaller from that checkpoint);
   evict = ``PreemptJob`` and ``spec.active: false`` on the Workload; grow =
   the coordinator's target set to the ranks it runs (so the new ranks park
   as spares), then ``parallelism`` and ``completions`` raised (a new
   workload slice) toward max_ranks or what a user asked; withdraw = a grow's
   slice that still waits for quota taken back (``parallelism`` and
   ``completions`` back to the admitted count) when a workload of higher or
   equal priority waits for that quota. A job whose slice waits is planned
   at its admitted size (:mod:`stoker.kueue.decide` says why).
5. **Scale up** the coordinator's job once a grown Job's new pods are Ready
   (``ScaleJob``: checkpoint at a step boundary, a round with the new ranks).
   Every target the controller sets is recorded on the Job with the seq its
   ScaleJob answered (``stoker.io/ranks-target``,
   ``stoker.io/ranks-target-seq``), so any other setting is a user's.
6. **Submitted jobs** (``JobSpec.submission``): create the Job of one that has
   none from its template (:mod:`stoker.kueue.submit`) and report its place in
   the queue to the coordinator (``ReportQueue``) whenever it changes: queued
   with its position (Kueue's visibility API), admitted with its ranks,
   evicted, finished; rejected when the template cannot make a Job.

Why a shrink is a checkpoint-and-restart and not ``ScaleJob`` down: the Job
controller removes the highest completion indexes, while a ScaleJob's round
keeps the previous generation's ranks in their rendezvous order (arrival), so
the ranks it drops are not the pods the Job deletes, and a dropped rank exits
0, which an Indexed Job counts as a completed index for good.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import grpc
import yaml
from kubernetes import client, watch

from stoker.errors import StokerError
from stoker.jobs import Job, Jobs
from stoker.kueue import decide, submit

log = logging.getLogger("stoker.kueue")

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
MERGE = "application/merge-patch+json"
# How long a ClusterQueue is left alone after an action, so that Kueue and
# the Job controller act on it before the next plan (seconds).
SETTLE_S = 15.0
# A failed watch lists again after a wait that doubles from WATCH_BACKOFF_S
# up to WATCH_BACKOFF_MAX_S, and starts over once an event came (seconds).
WATCH_BACKOFF_S = 1.0
WATCH_BACKOFF_MAX_S = 30.0


class Controller:
    """The controller of one namespace. ``jobs`` reaches the coordinator."""

    def __init__(
        self,
        namespace: str,
        jobs: Jobs,
        api: client.ApiClient | None = None,
        interval_s: float = 2.0,
        default_queue: str = "stoker",
    ) -> None:
        self.namespace = namespace
        self.default_queue = default_queue
        self.jobs = jobs
        self.api = api or client.ApiClient()
        self.batch = client.BatchV1Api(self.api)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.interval_s = interval_s
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._noticed: set[tuple[str, str]] = set()
        self._settle: dict[str, float] = {}  # ClusterQueue -> monotonic time.
        self._scaled: dict[str, tuple[int, float]] = {}  # Job -> (ranks, when).
        self._reported: dict[str, tuple[Any, ...]] = {}  # Stoker job -> last report.

    # ---- the loop ------------------------------------------------------------------

    def run(self) -> None:
        """Reconciles until :meth:`stop`; the watches wake it early."""
        for what, lister in (
            ("jobs", self._list_jobs_call),
            ("workloads", self._list_workloads_call),
        ):
            threading.Thread(target=self._watch, args=(what, lister), daemon=True).start()
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.reconcile()
            except Exception:
                log.exception("reconcile failed; trying again")
            self._wake.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _watch(self, what: str, lister: Callable[..., Any]) -> None:
        follow(what, lister, self._wake.set, self._stop.is_set, self._stop.wait)

    def _list_jobs_call(self, **kw: Any) -> Any:
        return self.batch.list_namespaced_job(self.namespace, **kw)

    def _list_workloads_call(self, **kw: Any) -> Any:
        return self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "workloads", **kw
        )

    # ---- one pass ------------------------------------------------------------------

    def reconcile(self) -> None:
        jobs = [self._dict(j) for j in self.batch.list_namespaced_job(self.namespace).items]
        wls: list[dict[str, Any]] = self._list_workloads_call()["items"]
        stoker = {j["metadata"]["name"]: j for j in jobs if decide.stoker_job_of(j)}
        self.notices(stoker, wls)
        self.reactivate(stoker, wls)
        self.queued_resizes(stoker, wls)
        running = self.running(stoker, wls)
        for r in running:  # A user's resize first; its queue settles after it.
            rz = decide.user_resize(r)
            if rz is not None:
                self.act(rz, stoker[r.job])
                self._settle[r.cluster_queue] = time.monotonic() + SETTLE_S
        pending = self.pending(wls)
        # Only a ClusterQueue where a Stoker job holds quota has anything to
        # shrink, evict or grow.
        for cq in sorted({r.cluster_queue for r in running if r.cluster_queue}):
            if time.monotonic() < self._settle.get(cq, 0.0):
                continue
            try:
                obj = self.custom.get_cluster_custom_object(GROUP, VERSION, "clusterqueues", cq)
            except client.ApiException as e:  # Not ours to read (RBAC names the queues).
                log.warning("clusterqueue %s: %s", cq, e.reason)
                continue
            free = decide.cluster_queue_free(obj)
            actions = decide.plan(
                [p for p in pending if p.cluster_queue == cq],
                [r for r in running if r.cluster_queue == cq],
                free,
            )
            for a in actions:
                self.act(a, stoker[a.job.job])
            if actions:
                self._settle[cq] = time.monotonic() + SETTLE_S
        self.scale_ups(stoker, wls)
        self.submissions(jobs, wls)

    def notices(self, stoker: Mapping[str, Any], wls: list[dict[str, Any]]) -> None:
        """PreemptJob for every Stoker job Kueue is evicting, once per eviction."""
        for name, job in stoker.items():
            wl = _evicted(name, wls) or decide.current_workload(name, wls) or {}
            why = decide.eviction_notice(wl) if wl else None
            cond = decide.conditions(wl).get("Evicted", {})
            key = (wl.get("metadata", {}).get("uid", name), str(cond.get("lastTransitionTime")))
            if (
                why is None
                and job["spec"].get("suspend")
                and (job.get("status") or {}).get("active")
            ):
                why = f"kueue: job {name} suspended with pods running"
                key = (job["metadata"]["uid"], "suspended")
            if why is None or key in self._noticed:
                continue
            self._noticed.add(key)
            self._preempt(self._stoker_job(job), why)

    def reactivate(self, stoker: Mapping[str, Any], wls: list[dict[str, Any]]) -> None:
        """Queues again a Workload the controller deactivated, once its pods are gone."""
        for wl in wls:
            ann = wl["metadata"].get("annotations") or {}
            job = stoker.get(decide.owner_job(wl))
            if ann.get(decide.YIELDED_ANNOTATION) != "true" or job is None:
                continue
            if wl["spec"].get("active", True) or not job["spec"].get("suspend"):
                continue
            if (job.get("status") or {}).get("active"):
                continue
            log.info("workload %s: pods gone; queued again", wl["metadata"]["name"])
            self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                "workloads",
                wl["metadata"]["name"],
                {
                    "metadata": {"annotations": {decide.YIELDED_ANNOTATION: None}},
                    "spec": {"active": True},
                },
                _content_type=MERGE,
            )

    def running(self, stoker: Mapping[str, Any], wls: list[dict[str, Any]]) -> list[decide.Running]:
        """The Stoker jobs holding quota, with their coordinator's sizes."""
        out = []
        for name, job in stoker.items():
            mine = [
                w for w in wls if decide.owner_job(w) == name and not decide.is_true(w, "Finished")
            ]
            held = [w for w in mine if decide.is_true(w, "QuotaReserved")]
            if not held or job["spec"].get("suspend"):
                continue  # Not admitted: it waits as any workload.
            held.sort(key=lambda w: str(w["metadata"].get("creationTimestamp", "")))
            wl = held[-1]
            ps = wl["spec"]["podSets"][0]
            count = int(ps.get("count", 1))
            # A grow's slice Kueue has not admitted: planned at the admitted
            # size, its slice withdrawn when others need the quota.
            waits = [w for w in mine if w not in held]
            slice_count = int(waits[-1]["spec"]["podSets"][0].get("count", 1)) if waits else 0
            coord = self._show(self._stoker_job(job))
            if coord is None or coord.spec is None:
                continue
            ann = job["metadata"].get("annotations") or {}
            out.append(
                decide.Running(
                    job=name,
                    stoker_job=self._stoker_job(job),
                    workload=wl["metadata"]["name"],
                    cluster_queue=(wl["status"].get("admission") or {}).get("clusterQueue", ""),
                    priority=int(wl["spec"].get("priority", 0)),
                    created=str(wl["metadata"].get("creationTimestamp", "")),
                    count=count,
                    min_ranks=coord.spec.min_ranks,
                    max_ranks=coord.spec.max_ranks,
                    wanted=decide.wanted_ranks(ann, coord.spec.max_ranks),
                    elastic=ann.get(decide.ELASTIC_ANNOTATION) == "true"
                    and coord.spec.min_ranks < coord.spec.max_ranks,
                    per_pod=decide.pod_requests(ps["template"]["spec"]),
                    submitted=coord.spec.submission is not None,
                    target=coord.target_ranks,
                    set_target=_int(ann.get(decide.TARGET_ANNOTATION)),
                    target_seq=coord.target_seq,
                    set_seq=_int(ann.get(decide.TARGET_SEQ_ANNOTATION)),
                    slice_count=slice_count,
                )
            )
        return out

    def pending(self, wls: list[dict[str, Any]]) -> list[decide.Pending]:
        """Workloads waiting for quota (not a slice of a job that runs already)."""
        out = []
        queues: dict[str, str] = {}
        for wl in wls:
            ann = wl["metadata"].get("annotations") or {}
            if decide.is_true(wl, "QuotaReserved") or decide.is_true(wl, "Finished"):
                continue
            if (
                not wl["spec"].get("active", True)
                or "kueue.x-k8s.io/workload-slice-replacement-for" in ann
            ):
                continue
            lq = wl["spec"].get("queueName", "")
            if lq not in queues:
                queues[lq] = self._cluster_queue_of(lq)
            out.append(
                decide.Pending(
                    workload=wl["metadata"]["name"],
                    job=decide.owner_job(wl),
                    cluster_queue=queues[lq],
                    priority=int(wl["spec"].get("priority", 0)),
                    created=str(wl["metadata"].get("creationTimestamp", "")),
                    needs=decide.workload_requests(wl),
                )
            )
        return out

    def queued_resizes(self, stoker: Mapping[str, Any], wls: list[dict[str, Any]]) -> None:
        """A user's resize of a submitted job not admitted yet: the suspended
        Job gets the new size (Kueue makes its Workload anew)."""
        for name, job in stoker.items():
            if not job["spec"].get("suspend") or (job.get("status") or {}).get("active"):
                continue
            wl = decide.current_workload(name, wls)
            if wl is not None and decide.is_true(wl, "QuotaReserved"):
                continue
            ann = job["metadata"].get("annotations") or {}
            coord = self._show(self._stoker_job(job))
            if coord is None or coord.spec is None or coord.spec.submission is None:
                continue
            to = decide.resize_to(
                coord.target_ranks,
                coord.target_seq,
                _int(ann.get(decide.TARGET_ANNOTATION)),
                _int(ann.get(decide.TARGET_SEQ_ANNOTATION)),
                coord.spec.min_ranks,
                coord.spec.max_ranks,
            )
            if to is None:
                continue
            log.info("resize queued %s -> %d (asked by the user)", name, to)
            self._resize(name, to, _applied(to, coord.target_seq))

    def act(self, a: decide.Action, job: Mapping[str, Any]) -> None:
        name = a.job.job
        if isinstance(a, decide.Resize):
            log.info("resize %s %d -> %d: %s", name, a.job.count, a.to, a.reason)
            marks = _applied(a.to, a.job.target_seq)
            if a.to < a.job.count:  # As a shrink: checkpoint, stop, fewer pods.
                self._preempt(a.job.stoker_job, a.reason)
            if a.to == a.job.count and not a.job.slice_count:
                self._annotate(name, marks)
            else:  # Up: a new slice (or the pending one's size); down: fewer pods.
                self._resize(name, a.to, marks)
        elif isinstance(a, decide.Withdraw):
            log.info("withdraw %s: %s", name, a.reason)
            self._resize(name, a.job.count, {})
        elif isinstance(a, decide.Shrink):
            log.info("shrink %s %d -> %d in place: %s", name, a.job.count, a.to, a.reason)
            # In place (issue 23): ScaleJob with in_place first, then fewer
            # pods (the Job deletes the highest indexes: SIGTERM), so that
            # the ranks whose pods go are the ones removed, not a preemption
            # notice: every rank checkpoints at one step, they leave, and the
            # kept ranks rejoin at the smaller size in their processes. Pods
            # first lost that race on the cluster: a deleted rank's SIGTERM
            # reached the coordinator before the ScaleJob and the job paused
            # (nothing lost, every pod restarted). If ScaleJob fails, the
            # pods go anyway and their SIGTERM pauses the job as before.
            marks = self._set_target(a.job.stoker_job, a.to, in_place=True)
            self._resize(name, a.to, marks or {decide.TARGET_ANNOTATION: str(a.to)})
        elif isinstance(a, decide.Evict):
            log.info("evict %s: %s", name, a.reason)
            # Deactivated first, as a shrink: the SIGTERM its pods get is a
            # notice too, and PreemptJob right after names the reason.
            self.custom.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                self.namespace,
                "workloads",
                a.job.workload,
                {
                    "metadata": {"annotations": {decide.YIELDED_ANNOTATION: "true"}},
                    "spec": {"active": False},
                },
                _content_type=MERGE,
            )
            self._preempt(a.job.stoker_job, a.reason)
        else:
            log.info("grow %s %d -> %d", name, a.job.count, a.to)
            # The new ranks must park as spares until ScaleJob (scale_ups),
            # not open a round at once (which restores an older checkpoint):
            # the target first becomes the ranks it runs.
            marks = {}
            if a.job.target != a.job.count:
                marks = self._set_target(a.job.stoker_job, a.job.count)
            self._resize(name, a.to, marks)

    def scale_ups(self, stoker: Mapping[str, Any], wls: list[dict[str, Any]]) -> None:
        """ScaleJob up a job whose grown Job's pods are all Ready."""
        for name, job in stoker.items():
            mine = [
                w for w in wls if decide.owner_job(w) == name and not decide.is_true(w, "Finished")
            ]
            if len(mine) != 1 or not decide.is_true(mine[0], "Admitted"):
                continue
            if job["spec"].get("suspend"):
                continue
            count = int(mine[0]["spec"]["podSets"][0].get("count", 1))
            ready = int((job.get("status") or {}).get("ready") or 0)
            if ready < count:
                continue
            coord = self._show(self._stoker_job(job))
            if coord is None or coord.spec is None:
                continue
            n = decide.scale_up(
                count,
                ready,
                coord.state,
                coord.world_size,
                coord.target_ranks,
                coord.spec.max_ranks,
            )
            last = self._scaled.get(name)
            if n is None or (last and last[0] == n and time.monotonic() - last[1] < 60):
                continue
            log.info("scale %s: world %d -> %d (its pods are Ready)", name, coord.world_size, n)
            marks = self._set_target(self._stoker_job(job), n)
            if marks:
                self._scaled[name] = (n, time.monotonic())
                self._annotate(name, marks)

    def submissions(self, jobs: list[dict[str, Any]], wls: list[dict[str, Any]]) -> None:
        """Creates the Job of each submitted job that has none; reports each
        one's queue state when it changed."""
        by_label = {decide.stoker_job_of(j): j for j in jobs}
        positions: dict[str, dict[str, int]] = {}
        for cj in self._coordinator_jobs():
            assert cj.spec is not None and cj.spec.submission is not None
            sub = cj.spec.submission
            name = cj.spec.name
            job = by_label.get(name)
            if job is None:
                if cj.state in ("STOPPED", "FINISHED"):
                    continue
                job = self._create_submitted(cj)
                if job is None:
                    continue
            lq = job["metadata"].get("labels", {}).get(decide.QUEUE_LABEL, "")
            if lq not in positions:
                positions[lq] = self._positions(lq)
            wl = decide.current_workload(job["metadata"]["name"], wls)
            pos = positions[lq].get(wl["metadata"]["name"], -1) if wl else -1
            state, wname, cq, pos, ranks, msg = submit.queue_status(job, wls, pos)
            if not state:
                continue
            self._report(name, state, wname, cq or sub.queue, pos, ranks, msg)

    def _coordinator_jobs(self) -> list[Job]:
        try:
            return [j for j in self.jobs.list() if j.spec and j.spec.submission]
        except StokerError as e:
            log.warning("coordinator: ListJobs: %s", e)
            return []

    def _create_submitted(self, cj: Job) -> dict[str, Any] | None:
        assert cj.spec is not None and cj.spec.submission is not None
        sub = cj.spec.submission
        name = cj.spec.name
        cm_name = submit.template_configmap(sub.template)
        try:
            cm = self.core.read_namespaced_config_map(cm_name, self.namespace)
            template = yaml.safe_load((cm.data or {}).get(submit.TEMPLATE_KEY, "") or "{}")
            if not isinstance(template, dict):
                raise ValueError("the template is not a batch/v1 Job")
            why = submit.template_refusal(
                cm.metadata.annotations, template, name
            ) or submit.submission_refusal(
                cm.metadata.annotations, sub.queue or self.default_queue, sub.priority
            )
            if why is not None:
                raise ValueError(why)
            ranks = min(cj.spec.max_ranks, cj.target_ranks or cj.spec.max_ranks)
            body = submit.job_from_template(
                template,
                name,
                cj.spec.min_ranks,
                cj.spec.max_ranks,
                ranks,
                sub.queue or self.default_queue,
                sub.priority,
                list(sub.args),
            )
            created = self.batch.create_namespaced_job(self.namespace, body)
        except client.ApiException as e:
            self._report(name, "REJECTED", "", "", -1, 0, f"{cm_name}: {e.reason}: {e.body}"[:1000])
            return None
        except (ValueError, yaml.YAMLError) as e:
            self._report(name, "REJECTED", "", "", -1, 0, f"{cm_name}: {e}"[:1000])
            return None
        log.info(
            "submitted job %s: Job %s created from %s", name, body["metadata"]["name"], cm_name
        )
        return self._dict(created)

    def _positions(self, local_queue: str) -> dict[str, int]:
        """Pending workloads of a LocalQueue by name -> 0-based position
        (Kueue's visibility API; {} when it cannot be read)."""
        if not local_queue:
            return {}
        try:
            out = self.api.call_api(
                "/apis/visibility.kueue.x-k8s.io/v1beta2/namespaces/{namespace}/localqueues/"
                "{name}/pendingworkloads",
                "GET",
                path_params={"namespace": self.namespace, "name": local_queue},
                response_types_map={200: "object"},
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
            )
        except client.ApiException as e:
            log.warning("pending workloads of %s: %s", local_queue, e.reason)
            return {}
        return {
            str(w["metadata"]["name"]): int(w.get("positionInLocalQueue", -1))
            for w in (out or {}).get("items") or []
        }

    def _report(
        self, name: str, state: str, wl: str, cq: str, pos: int, ranks: int, msg: str
    ) -> None:
        key = (state, wl, cq, pos, ranks, msg)
        if self._reported.get(name) == key:
            return
        try:
            self.jobs.report_queue(
                name,
                state,
                workload=wl,
                cluster_queue=cq,
                position=pos,
                admitted_ranks=ranks,
                message=msg[:1000],
                updated_ms=int(time.time() * 1000),
            )
            self._reported[name] = key
            log.info("ReportQueue %s: %s %s pos %d ranks %d", name, state, wl, pos, ranks)
        except StokerError as e:
            log.warning("ReportQueue %s: %s", name, e)

    # ---- helpers ---------------------------------------------------------------------

    def _dict(self, obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = self.api.sanitize_for_serialization(obj)
        return out

    @staticmethod
    def _stoker_job(job: Mapping[str, Any]) -> str:
        return decide.stoker_job_of(job) or ""

    def _show(self, name: str) -> Job | None:
        try:
            return self.jobs.show(name)
        except StokerError as e:  # NOT_FOUND: its first rank has not created it yet.
            quiet = e.code == grpc.StatusCode.NOT_FOUND
            log.log(logging.DEBUG if quiet else logging.WARNING, "coordinator: job %s: %s", name, e)
            return None

    def _preempt(self, name: str, reason: str) -> None:
        log.info("PreemptJob %s: %s", name, reason)
        try:
            self.jobs.preempt(name, reason[:1024])
        except StokerError as e:  # Stopped or gone: nothing to save.
            log.warning("PreemptJob %s: %s", name, e)

    def _scale(self, name: str, ranks: int, in_place: bool = False) -> Job | None:
        try:
            return self.jobs.scale(name, ranks, in_place=in_place)
        except StokerError as e:
            log.warning("ScaleJob %s to %d: %s", name, ranks, e)
            return None

    def _set_target(self, name: str, ranks: int, in_place: bool = False) -> dict[str, str]:
        """ScaleJob to ``ranks`` (``in_place``: a shrink whose removed pods
        are being deleted, ScaleJobRequest.in_place); the Job's annotations
        that record it as the controller's setting (the seq its answer gave),
        {} when it failed."""
        job = self._scale(name, ranks, in_place)
        marks = {decide.TARGET_ANNOTATION: str(ranks)} if job is not None else {}
        if job is not None and job.target_seq:
            marks[decide.TARGET_SEQ_ANNOTATION] = str(job.target_seq)
        return marks

    def _resize(self, job: str, n: int, annotations: dict[str, str]) -> None:
        body: dict[str, Any] = {"spec": {"parallelism": n, "completions": n}}
        if annotations:
            body["metadata"] = {"annotations": annotations}
        self.batch.patch_namespaced_job(job, self.namespace, body, _content_type=MERGE)

    def _annotate(self, job: str, annotations: dict[str, str]) -> None:
        body = {"metadata": {"annotations": annotations}}
        self.batch.patch_namespaced_job(job, self.namespace, body, _content_type=MERGE)

    def _cluster_queue_of(self, local_queue: str) -> str:
        try:
            lq = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "localqueues", local_queue
            )
        except client.ApiException as e:
            log.warning("localqueue %s: %s", local_queue, e.reason)
            return ""
        return str(lq["spec"].get("clusterQueue", ""))


def _applied(to: int, seq: int) -> dict[str, str]:
    """The annotations of a user's resize to ``to`` the controller applied:
    the size it grows back to, and the coordinator's setting (its seq) as
    seen, so that only a later one is a user's again."""
    marks = {decide.WANTED_ANNOTATION: str(to), decide.TARGET_ANNOTATION: str(to)}
    if seq:
        marks[decide.TARGET_SEQ_ANNOTATION] = str(seq)
    return marks


def _evicted(job: str, wls: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Job's unfinished Workload that Kueue evicts, or None: the admitted
    slice when a grow's slice is pending, not only the newest."""
    for wl in wls:
        if decide.owner_job(wl) != job or decide.is_true(wl, "Finished"):
            continue
        if decide.eviction_notice(wl):
            return wl
    return None


def _int(value: str | None) -> int:
    """An annotation's count (0 when absent or not a number)."""
    try:
        return int(value) if value else 0
    except ValueError:
        return 0


def follow(
    what: str,
    lister: Callable[..., Any],
    wake: Callable[[], Any],
    stopped: Callable[[], bool],
    sleep: Callable[[float], Any] = time.sleep,
    timeout_s: int = 60,
) -> None:
    """Lists, then watches from the list's resourceVersion, calling ``wake``
    for each change, until ``stopped()``; as the client library's
    ``Watch.stream`` asks: when the watch fails (410 Gone: the version
    expired; 504 "Too large resource version": the API server's watch cache
    is behind the version its list gave; or the connection broke) list again
    and watch from the new list's version, after a backoff. A watch the
    server ends (``timeout_s``) goes on from the last version seen (events
    and bookmarks)."""
    version = ""
    delay = WATCH_BACKOFF_S
    while not stopped():
        try:
            if not version:
                version = _list_version(lister())
                wake()  # What changed before the list is in it.
            w = watch.Watch()
            for ev in w.stream(
                lister,
                resource_version=version,
                timeout_seconds=timeout_s,
                allow_watch_bookmarks=True,
            ):
                raw = ev.get("raw_object") or {}
                version = str((raw.get("metadata") or {}).get("resourceVersion") or version)
                if ev.get("type") != "BOOKMARK":
                    wake()
                delay = WATCH_BACKOFF_S
                if stopped():
                    return
            continue  # The server's timeout: on from the last version.
        except client.ApiException as e:
            log.info("watch %s: %s %s; listing again in %.0f s", what, e.status, e.reason, delay)
        except Exception as e:  # The API server went away.
            log.info("watch %s: %s; listing again in %.0f s", what, e, delay)
        version = ""
        sleep(delay)
        delay = min(2 * delay, WATCH_BACKOFF_MAX_S)


def _list_version(listed: Any) -> str:
    """The resourceVersion of a list (a model of the client's or a dict)."""
    if isinstance(listed, Mapping):
        return str((listed.get("metadata") or {}).get("resourceVersion") or "")
    return str(getattr(listed.metadata, "resource_version", "") or "")

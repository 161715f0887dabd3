"""Submitted jobs (``JobSpec.submission``): the Kubernetes Job the controller
creates for one, from its template, and the queue state it reports back to
the coordinator (``ReportQueue``). Pure functions over dicts, as in
:mod:`stoker.kueue.decide`.

A template is the ConfigMap ``stoker-template-<template>`` of the
controller's namespace, key ``job.yaml``: a ``batch/v1`` Indexed Job as an
operator would apply it (the example's ``train-demo``: its trainer container,
the team label ``stoker.io/team`` and its token Secret, requests, the
``podFailurePolicy`` that ignores exit 75). The controller fills in what is the
job's own: the Job's name, the label ``stoker.io/job`` on the pod template,
``STOKER_JOB`` in every container, the queue and priority labels, the size
(``parallelism`` = ``completions`` = the ranks it starts with), the elastic
annotation when ``min_ranks < max_ranks``, ``suspend: true`` (Kueue admits it),
and the submission's ``args`` appended to the ``args`` of the container named
``train`` (else the first): a template whose command is
``sh -c 'exec stoker-train ... "$@"' sh`` passes them on.

A template is a team's (:func:`template_refusal`): its pods carry the team's
token Secret (``stoker.io/team: TEAM``, ``deploy/k8s/components/token``), and
the controller creates Jobs with the operator's rights, for any coordinator
job that names the template. So it makes a Job from a team's template only
for a job of that team: a name starting with the ConfigMap's annotation
``stoker.io/job-prefix``, or else with ``TEAM-`` (the team's token scope by
the component's convention). Otherwise a team could run its arguments in
another team's pods, with that team's token.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from stoker.kueue import decide

# The ConfigMap key that holds a template's Job.
TEMPLATE_KEY = "job.yaml"
# The template ConfigMap's annotation naming the jobs that may use it (a
# job-name prefix, "*" for every job); without it, a template whose pods
# carry TEAM_LABEL serves the jobs named TEAM-...
PREFIX_ANNOTATION = "stoker.io/job-prefix"
# The pod label that names a team, and so its token Secret.
TEAM_LABEL = "stoker.io/team"


def template_configmap(template: str) -> str:
    return f"stoker-template-{template or 'default'}"


def job_name(stoker_job: str) -> str:
    """The Kubernetes name of a Stoker job's Job: a DNS subdomain, so "_"
    becomes "-" (Stoker names are [a-z0-9][a-z0-9._-]{0,62})."""
    return stoker_job.replace("_", "-")


def job_from_template(
    template: Mapping[str, Any],
    stoker_job: str,
    min_ranks: int,
    max_ranks: int,
    ranks: int,
    queue: str,
    priority: str,
    args: Sequence[str],
) -> dict[str, Any]:
    """The Job for a submitted job, from its template (left unchanged)."""
    if template.get("apiVersion") != "batch/v1" or template.get("kind") != "Job":
        raise ValueError("the template is not a batch/v1 Job")
    job: dict[str, Any] = copy.deepcopy(dict(template))
    meta = job.setdefault("metadata", {})
    meta["name"] = job_name(stoker_job)
    for k in ("namespace", "resourceVersion", "uid", "creationTimestamp", "generateName"):
        meta.pop(k, None)
    labels = meta.setdefault("labels", {})
    labels[decide.QUEUE_LABEL] = queue
    labels[decide.JOB_LABEL] = stoker_job
    if priority:
        labels[decide.PRIORITY_LABEL] = priority
    annotations = meta.setdefault("annotations", {})
    if min_ranks < max_ranks:
        annotations[decide.ELASTIC_ANNOTATION] = "true"
    spec = job.setdefault("spec", {})
    spec.update(completionMode="Indexed", parallelism=ranks, completions=ranks, suspend=True)
    pod = spec.setdefault("template", {})
    pod.setdefault("metadata", {}).setdefault("labels", {})[decide.JOB_LABEL] = stoker_job
    pod_spec = pod.setdefault("spec", {})
    containers = pod_spec.get("containers") or []
    if not containers:
        raise ValueError("the template's Job has no container")
    for c in list(pod_spec.get("initContainers") or []) + containers:
        env = [e for e in c.get("env") or [] if e.get("name") != "STOKER_JOB"]
        c["env"] = [{"name": "STOKER_JOB", "value": stoker_job}, *env]
    if args:
        train = next((c for c in containers if c.get("name") == "train"), containers[0])
        train["args"] = [*(train.get("args") or []), *args]
    return job


def template_refusal(
    annotations: Mapping[str, str] | None, template: Mapping[str, Any], stoker_job: str
) -> str | None:
    """Why the job ``stoker_job`` may not use this template (its ConfigMap's
    annotations, its Job), or None when it may: the job's name must start with
    the ConfigMap's :data:`PREFIX_ANNOTATION` ("*": any job), or, without one,
    with ``TEAM-`` for the team its pods name (:data:`TEAM_LABEL`). A template
    of no team and no prefix (no token of a team in it) serves every job."""
    prefix = (annotations or {}).get(PREFIX_ANNOTATION)
    if prefix is None:
        pod_labels = (
            ((template.get("spec") or {}).get("template") or {}).get("metadata") or {}
        ).get("labels") or {}
        team = pod_labels.get(TEAM_LABEL)
        if not team:
            return None
        prefix = f"{team}-"
    if prefix == "*" or stoker_job.startswith(prefix):
        return None
    return f"the template serves only jobs named {prefix}*, not {stoker_job}"


def queue_status(
    job: Mapping[str, Any] | None, workloads: Sequence[Mapping[str, Any]], position: int
) -> tuple[str, str, str, int, int, str]:
    """(state, workload, cluster_queue, position, admitted_ranks, message) of
    a submitted job's Job as Kueue sees it, state as QueueState's short names
    ("QUEUED", "ADMITTED", "EVICTED", "FINISHED"; "" while nothing is there)."""
    if job is None:
        return ("", "", "", -1, 0, "")
    name = job["metadata"]["name"]
    conds = decide.conditions(job)
    for kind in ("Complete", "Failed"):
        if conds.get(kind, {}).get("status") == "True":
            return ("FINISHED", "", "", -1, 0, f"job {kind.lower()}")
    wl = decide.current_workload(name, workloads)
    if wl is None:
        return ("", "", "", -1, 0, "")
    wname = wl["metadata"]["name"]
    wconds = decide.conditions(wl)
    cq = str(((wl.get("status") or {}).get("admission") or {}).get("clusterQueue", ""))
    if decide.is_true(wl, "Finished"):
        return ("FINISHED", wname, cq, -1, 0, wconds["Finished"].get("message", ""))
    why = decide.eviction_notice(wl)
    if why is not None:
        return ("EVICTED", wname, cq, -1, 0, why)
    if decide.is_true(wl, "QuotaReserved"):
        count = sum(int(ps.get("count", 1)) for ps in wl["spec"].get("podSets") or [])
        return ("ADMITTED", wname, cq, -1, count, "")
    msg = str(wconds.get("QuotaReserved", {}).get("message", ""))
    return ("QUEUED", wname, cq, position, 0, msg)


# The template ConfigMap's annotations that bound what its jobs may ask for
# (names separated by ","; "*": anything): the Kueue LocalQueues and the
# WorkloadPriorityClasses. Without one, the template bounds nothing and the
# coordinator's token grants are the only check (queues=, priorities=).
QUEUES_ANNOTATION = "stoker.io/queues"
PRIORITIES_ANNOTATION = "stoker.io/priorities"


def submission_refusal(
    annotations: Mapping[str, str] | None, queue: str, priority: str
) -> str | None:
    """Why a job of this template may not be labelled with ``queue`` (the
    submission's, or the controller's default) and ``priority`` ("" : the
    default, always allowed), or None when it may: each must be in the
    ConfigMap's :data:`QUEUES_ANNOTATION` and :data:`PRIORITIES_ANNOTATION`
    when set. Defence in depth behind the coordinator, which refuses a
    submission outside its token's grants: a team's template, with the team's
    token in its pods, never runs in another team's queue or above the team's
    priorities even if a token's line grants too much."""
    ann = annotations or {}
    for key, name, what in (
        (QUEUES_ANNOTATION, queue, "queue"),
        (PRIORITIES_ANNOTATION, priority, "priority"),
    ):
        allowed = ann.get(key)
        if allowed is None or (what == "priority" and not name):
            continue
        names = [n.strip() for n in allowed.split(",") if n.strip()]
        if "*" not in names and name not in names:
            shown = ",".join(names) or "none"
            return f"the template allows no {what} {name} ({key}: {shown})"
    return None

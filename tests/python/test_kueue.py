"""The queue controller's decisions (stoker.kueue.decide) on Kubernetes objects
shaped as Kueue v0.17 and the API server return them: quota arithmetic, the
first sign of an eviction, shrink before evict, grow back, scale up. The loop
that acts on them runs on the real cluster (tests/k8s/run)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

pytest.importorskip("kubernetes")

from stoker.kueue import decide, submit


def pod(cpu: str, mem: str, init: tuple[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "train", "resources": {"requests": {"cpu": cpu, "memory": mem}}}]
    }
    if init:
        spec["initContainers"] = [
            {"name": "create-job", "resources": {"requests": {"cpu": init[0], "memory": init[1]}}}
        ]
    return spec


def workload(
    name: str,
    job: str,
    count: int,
    priority: int,
    conds: dict[str, str] | None = None,
    created: str = "2026-11-28T20:00:00Z",
) -> dict[str, Any]:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job}],
        },
        "spec": {
            "queueName": "stoker",
            "priority": priority,
            "podSets": [{"name": "main", "count": count, "template": {"spec": pod("50m", "64Mi")}}],
        },
        "status": {
            "admission": {"clusterQueue": "stoker"},
            "conditions": [
                {"type": t, "status": s, "reason": t, "lastTransitionTime": created}
                for t, s in (conds or {}).items()
            ],
        },
    }


def cluster_queue(cpu: str, mem: str, used_cpu: str, used_mem: str) -> dict[str, Any]:
    return {
        "spec": {
            "resourceGroups": [
                {
                    "coveredResources": ["cpu", "memory"],
                    "flavors": [
                        {
                            "name": "stoker-default",
                            "resources": [
                                {"name": "cpu", "nominalQuota": cpu},
                                {"name": "memory", "nominalQuota": mem},
                            ],
                        }
                    ],
                }
            ]
        },
        "status": {
            "flavorsReservation": [
                {
                    "name": "stoker-default",
                    "resources": [
                        {"name": "cpu", "total": used_cpu, "borrowed": "0"},
                        {"name": "memory", "total": used_mem, "borrowed": "0"},
                    ],
                }
            ]
        },
    }


PER_POD = {"cpu": Decimal("0.050"), "memory": Decimal(64 << 20)}


def running(
    name: str, count: int, lo: int = 2, hi: int = 4, prio: int = 100, **kw: Any
) -> decide.Running:
    values: dict[str, Any] = dict(
        job=name,
        stoker_job=f"team-a-{name}",
        workload=f"job-{name}-1",
        cluster_queue="stoker",
        priority=prio,
        created="2026-11-28T20:00:00Z",
        count=count,
        min_ranks=lo,
        max_ranks=hi,
        wanted=hi,
        elastic=True,
        per_pod=PER_POD,
    )
    values.update(kw)
    return decide.Running(**values)


def high(count: int = 2, prio: int = 1000) -> decide.Pending:
    return decide.Pending(
        workload="job-high-1",
        job="high",
        cluster_queue="stoker",
        priority=prio,
        created="2026-11-28T20:05:00Z",
        needs={"cpu": Decimal("0.050") * count, "memory": Decimal(64 << 20) * count},
    )


def test_requests_and_free_quota() -> None:
    # Kueue counts the larger of the containers' sum and the largest init container.
    assert decide.pod_requests(pod("50m", "64Mi", init=("100m", "16Mi"))) == {
        "cpu": Decimal("0.1"),
        "memory": Decimal(64 << 20),
    }
    assert decide.workload_requests(workload("w", "low", 4, 100))["cpu"] == Decimal("0.2")
    free = decide.cluster_queue_free(cluster_queue("250m", "320Mi", "200m", "256Mi"))
    assert free == {"cpu": Decimal("0.05"), "memory": Decimal(64 << 20)}
    # A queue that has reserved nothing yet has no status.reservation.
    assert decide.cluster_queue_free({"spec": cluster_queue("1", "1Gi", "0", "0")["spec"]}) == {
        "cpu": Decimal(1),
        "memory": Decimal(1 << 30),
    }


def test_eviction_notice_is_the_evicted_or_preempted_condition() -> None:
    assert decide.eviction_notice(workload("w", "low", 4, 100, {"Admitted": "True"})) is None
    assert decide.eviction_notice(workload("w", "low", 4, 100, {"Evicted": "False"})) is None
    why = decide.eviction_notice(workload("w", "low", 4, 100, {"Evicted": "True"}))
    assert why is not None and "Evicted" in why and "w" in why
    assert decide.eviction_notice(workload("w", "low", 4, 100, {"Preempted": "True"}))


def test_current_workload_is_the_newest_unfinished_slice() -> None:
    old = workload("job-low-1", "low", 2, 100, {"Finished": "True"}, "2026-11-28T20:00:00Z")
    new = workload("job-low-2", "low", 4, 100, {"Admitted": "True"}, "2026-11-28T20:01:00Z")
    other = workload("job-high-1", "high", 2, 1000, {}, "2026-11-28T20:02:00Z")
    got = decide.current_workload("low", [new, old, other])
    assert got is not None and got["metadata"]["name"] == "job-low-2"
    assert decide.current_workload("gone", [old]) is None
    assert decide.job_count({"spec": {"parallelism": 4, "completions": 3}}) == 3


def test_shrink_the_fewest_ranks_that_make_room() -> None:
    # Quota 250m: L at 4 (200m) leaves 50m; H needs 100m: the 50m free and
    # one rank of L cover it.
    free = {"cpu": Decimal("0.05"), "memory": Decimal(64 << 20)}
    acts = decide.plan([high(2)], [running("low", 4)], free)
    assert [type(a) for a in acts] == [decide.Shrink]
    assert isinstance(acts[0], decide.Shrink) and acts[0].to == 3
    # With no free quota, two ranks.
    acts = decide.plan([high(2)], [running("low", 4)], {"cpu": Decimal(0), "memory": Decimal(0)})
    assert isinstance(acts[0], decide.Shrink) and acts[0].to == 2
    assert "job-high-1" in acts[0].reason


def test_a_workload_that_fits_needs_nothing() -> None:
    free = {"cpu": Decimal("0.1"), "memory": Decimal(128 << 20)}
    assert decide.plan([high(2)], [running("low", 2)], free) == []


def test_never_below_min_ranks_then_evict() -> None:
    none = {"cpu": Decimal(0), "memory": Decimal(0)}
    # L at its minimum cannot yield: it is evicted (checkpoint first).
    acts = decide.plan([high(2)], [running("low", 2)], none)
    assert [type(a) for a in acts] == [decide.Evict]
    # Not elastic: evicted too.
    acts = decide.plan([high(2)], [running("low", 4, elastic=False)], none)
    assert [type(a) for a in acts] == [decide.Evict]
    # Three needed, L can give two: shrinking cannot make room, so evict.
    acts = decide.plan([high(3)], [running("low", 4)], none)
    assert [type(a) for a in acts] == [decide.Evict]


def test_only_lower_priority_of_the_same_queue_yields() -> None:
    none = {"cpu": Decimal(0), "memory": Decimal(0)}
    assert decide.plan([high(2, prio=100)], [running("low", 4)], none) == []
    assert decide.plan([high(2)], [running("low", 4, cluster_queue="other")], none) == []


def test_lowest_priority_then_newest_yields_first() -> None:
    none = {"cpu": Decimal(0), "memory": Decimal(0)}
    a = running("a", 4, prio=100, created="2026-11-28T20:00:00Z")
    b = running("b", 4, prio=100, created="2026-11-28T20:01:00Z")
    c = running("c", 4, prio=50, created="2026-11-28T19:00:00Z")
    acts = decide.plan([high(2)], [a, b, c], none)
    assert [a.job.job for a in acts] == ["c"]
    acts = decide.plan([high(2)], [a, b], none)
    assert [a.job.job for a in acts] == ["b"]
    # Four needed: two from each, lowest priority first.
    acts = decide.plan([high(4)], [a, c], none)
    assert [(x.job.job, getattr(x, "to", None)) for x in acts] == [("c", 2), ("a", 2)]


def test_grow_back_by_what_fits_when_nothing_waits() -> None:
    free = {"cpu": Decimal("0.1"), "memory": Decimal(128 << 20)}
    acts = decide.plan([], [running("low", 2)], free)
    assert len(acts) == 1 and isinstance(acts[0], decide.Grow) and acts[0].to == 4
    # One rank's worth free: one more rank.
    acts = decide.plan(
        [], [running("low", 2)], {"cpu": Decimal("0.06"), "memory": Decimal(1 << 30)}
    )
    assert isinstance(acts[0], decide.Grow) and acts[0].to == 3
    # Never past what it asked for, nor past max_ranks.
    assert decide.plan([], [running("low", 3, wanted=3)], free) == []
    assert decide.plan([], [running("low", 4, hi=4, wanted=6)], free) == []
    # Someone waiting (whom L need not yield to) holds growth back.
    assert decide.plan([high(4, prio=100)], [running("low", 2)], free) == []


def test_scale_up_once_the_new_pods_are_ready() -> None:
    assert decide.scale_up(4, 4, "RUNNING", 2, 0, 4) == 4
    assert decide.scale_up(4, 3, "RUNNING", 2, 0, 4) is None  # a pod not Ready yet
    assert decide.scale_up(4, 4, "RUNNING", 4, 0, 4) is None  # already there
    assert decide.scale_up(4, 4, "RUNNING", 2, 4, 4) is None  # asked already
    assert decide.scale_up(4, 4, "PAUSED", 2, 0, 4) is None
    assert decide.scale_up(6, 6, "RUNNING", 2, 0, 4) == 4  # never past max_ranks


TEMPLATE: dict[str, Any] = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "template", "namespace": "elsewhere", "labels": {"team": "a"}},
    "spec": {
        "completionMode": "Indexed",
        "parallelism": 1,
        "completions": 1,
        "template": {
            "metadata": {"labels": {"stoker.io/team": "team-a"}},
            "spec": {
                "initContainers": [{"name": "create-job", "env": [{"name": "X", "value": "1"}]}],
                "containers": [
                    {"name": "sidecar"},
                    {
                        "name": "train",
                        "args": ["--steps", "10"],
                        "env": [{"name": "STOKER_JOB", "value": "from-the-template"}],
                    },
                ],
            },
        },
    },
}


def test_submitted_job_from_its_template() -> None:
    job = submit.job_from_template(
        TEMPLATE, "team-a_big", 2, 4, 4, "stoker", "stoker-high", ["--lr", "3e-4"]
    )
    assert job["metadata"]["name"] == "team-a-big"
    assert "namespace" not in job["metadata"]
    assert job["metadata"]["labels"] == {
        "team": "a",
        "kueue.x-k8s.io/queue-name": "stoker",
        "kueue.x-k8s.io/priority-class": "stoker-high",
        "stoker.io/job": "team-a_big",
    }
    assert job["metadata"]["annotations"] == {"kueue.x-k8s.io/elastic-job": "true"}
    spec = job["spec"]
    assert (spec["parallelism"], spec["completions"], spec["suspend"]) == (4, 4, True)
    pod = spec["template"]
    assert pod["metadata"]["labels"] == {"stoker.io/team": "team-a", "stoker.io/job": "team-a_big"}
    assert decide.stoker_job_of(job) == "team-a_big"
    init, side, train = pod["spec"]["initContainers"][0], *pod["spec"]["containers"]
    for c in (init, side, train):
        assert c["env"][0] == {"name": "STOKER_JOB", "value": "team-a_big"}
        assert [e["name"] for e in c["env"]].count("STOKER_JOB") == 1
    assert train["args"] == ["--steps", "10", "--lr", "3e-4"]
    assert "args" not in side
    # The template itself is left as it was.
    assert TEMPLATE["metadata"]["name"] == "template"
    assert TEMPLATE["spec"]["template"]["spec"]["containers"][1]["args"] == ["--steps", "10"]
    # A fixed-size job is not elastic; no priority keeps the queue's default.
    fixed = submit.job_from_template(TEMPLATE, "team-a-2", 2, 2, 2, "stoker", "", [])
    assert "kueue.x-k8s.io/elastic-job" not in fixed["metadata"].get("annotations", {})
    assert "kueue.x-k8s.io/priority-class" not in fixed["metadata"]["labels"]


def test_a_template_that_is_not_a_job_is_refused() -> None:
    with pytest.raises(ValueError, match="not a batch/v1 Job"):
        submit.job_from_template({"kind": "Pod"}, "j", 1, 1, 1, "stoker", "", [])
    empty = {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": {}}}}
    with pytest.raises(ValueError, match="no container"):
        submit.job_from_template(empty, "j", 1, 1, 1, "stoker", "", [])


def test_queue_status_follows_the_workload() -> None:
    job = {"metadata": {"name": "big"}, "status": {}}
    assert submit.queue_status(None, [], 3)[0] == ""
    assert submit.queue_status(job, [], 3)[0] == ""
    waiting = workload("job-big-1", "big", 4, 100, {"QuotaReserved": "False"})
    waiting["status"]["conditions"][0]["message"] = "insufficient unused quota"
    state, wl, _, pos, ranks, msg = submit.queue_status(job, [waiting], 3)
    assert (state, wl, pos, ranks, msg) == (
        "QUEUED",
        "job-big-1",
        3,
        0,
        "insufficient unused quota",
    )
    admitted = workload("job-big-1", "big", 4, 100, {"QuotaReserved": "True", "Admitted": "True"})
    assert submit.queue_status(job, [admitted], 3)[:5] == ("ADMITTED", "job-big-1", "stoker", -1, 4)
    evicted = workload("job-big-1", "big", 4, 100, {"QuotaReserved": "True", "Evicted": "True"})
    assert submit.queue_status(job, [evicted], 3)[0] == "EVICTED"
    done = {
        "metadata": {"name": "big"},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    assert submit.queue_status(done, [admitted], 3)[0] == "FINISHED"


def test_a_template_serves_only_its_teams_jobs() -> None:
    """A team's template (its pods name the team, so its token Secret) makes
    Jobs only for that team's jobs (TEAM-...), or for those the ConfigMap's
    stoker.io/job-prefix names; a template of no team serves every job."""
    assert submit.template_refusal(None, TEMPLATE, "team-a-big") is None
    why = submit.template_refusal(None, TEMPLATE, "team-b-big")
    assert why is not None and "team-a-*" in why
    assert submit.template_refusal(None, TEMPLATE, "team-ab") is not None
    shared = {submit.PREFIX_ANNOTATION: "*"}
    assert submit.template_refusal(shared, TEMPLATE, "team-b-big") is None
    pinned = {submit.PREFIX_ANNOTATION: "team-b-"}
    assert submit.template_refusal(pinned, TEMPLATE, "team-b-big") is None
    assert submit.template_refusal(pinned, TEMPLATE, "team-a-big") is not None
    no_team = {"apiVersion": "batch/v1", "kind": "Job", "spec": {"template": {"spec": {}}}}
    assert submit.template_refusal(None, no_team, "anyone") is None


class _Recorder:
    def __init__(self, **results: Any) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.results = results

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kw: Any) -> Any:
            self.calls.append((name, args, kw))
            return self.results.get(name)

        return call


def test_the_controller_refuses_another_teams_template() -> None:
    """A team-b job naming team-a's template gets no Job (which would run its
    arguments in team-a's pods with team-a's token): REJECTED, saying why."""
    import types

    import yaml
    from kubernetes import client

    from stoker.jobs import Job
    from stoker.kueue.controller import Controller
    from stoker.v1 import coordinator_pb2 as pb

    cm = types.SimpleNamespace(
        data={submit.TEMPLATE_KEY: yaml.safe_dump(TEMPLATE)},
        metadata=types.SimpleNamespace(annotations=None),
    )
    for name, allowed in (("team-b-steal", False), ("team-a-mine", True)):
        jobs = _Recorder()
        ctl = Controller("ns", jobs, api=client.ApiClient())  # type: ignore[arg-type]
        ctl.core = _Recorder(read_namespaced_config_map=cm)  # type: ignore[assignment]
        ctl.batch = _Recorder(create_namespaced_job={"metadata": {"name": name}})  # type: ignore[assignment]
        ctl.api = _Recorder(sanitize_for_serialization={"metadata": {"name": name}})  # type: ignore[assignment]
        spec = pb.JobSpec(
            name=name,
            min_ranks=1,
            max_ranks=2,
            submission=pb.Submission(template="demo", args=["--job", "team-a-prod"]),
        )
        ctl._create_submitted(Job.from_proto(pb.Job(spec=spec)))
        created = [c for c in ctl.batch.calls if c[0] == "create_namespaced_job"]  # type: ignore[attr-defined]
        reports = [c for c in jobs.calls if c[0] == "report_queue"]
        if allowed:
            assert len(created) == 1 and not reports
        else:
            assert not created
            assert len(reports) == 1 and reports[0][1] == (name, "REJECTED")
            assert "team-a-*" in reports[0][2]["message"]


def test_a_template_bounds_its_jobs_queues_and_priorities() -> None:
    """The ConfigMap's stoker.io/queues and stoker.io/priorities bound what
    a job of the template may be labelled with ("*": anything; no priority,
    the default, always); without them the template bounds nothing."""
    ann = {submit.QUEUES_ANNOTATION: "team-a, shared", submit.PRIORITIES_ANNOTATION: "low"}
    assert submit.submission_refusal(ann, "team-a", "") is None
    assert submit.submission_refusal(ann, "shared", "low") is None
    why = submit.submission_refusal(ann, "team-b", "")
    assert why is not None and "queue team-b" in why and "team-a,shared" in why
    why = submit.submission_refusal(ann, "team-a", "high")
    assert why is not None and "priority high" in why
    assert submit.submission_refusal({submit.QUEUES_ANNOTATION: "*"}, "any", "high") is None
    assert submit.submission_refusal({submit.QUEUES_ANNOTATION: ""}, "team-a", "") is not None
    assert submit.submission_refusal(None, "team-b", "high") is None


def test_the_controller_refuses_a_queue_or_priority_its_template_does_not_allow() -> None:
    """Defence in depth behind the coordinator's token grants: a submission
    into a queue or at a priority the template's annotations do not allow
    gets no Job, REJECTED saying why; one within them gets its Job labelled
    with them (no queue named: the controller's default queue, checked too)."""
    import types

    import yaml
    from kubernetes import client

    from stoker.jobs import Job
    from stoker.kueue import decide
    from stoker.kueue.controller import Controller
    from stoker.v1 import coordinator_pb2 as pb

    cm = types.SimpleNamespace(
        data={submit.TEMPLATE_KEY: yaml.safe_dump(TEMPLATE)},
        metadata=types.SimpleNamespace(
            annotations={submit.QUEUES_ANNOTATION: "team-a", submit.PRIORITIES_ANNOTATION: "low"}
        ),
    )
    for queue, priority, why in (
        ("team-b", "", "queue team-b"),
        ("team-a", "high", "priority high"),
        ("", "", "queue stoker"),  # the controller's default queue is not team-a's
        ("team-a", "low", None),
    ):
        jobs = _Recorder()
        ctl = Controller("ns", jobs, api=client.ApiClient())  # type: ignore[arg-type]
        ctl.core = _Recorder(read_namespaced_config_map=cm)  # type: ignore[assignment]
        ctl.batch = _Recorder(create_namespaced_job={"metadata": {"name": "team-a-x"}})  # type: ignore[assignment]
        ctl.api = _Recorder(sanitize_for_serialization={"metadata": {"name": "team-a-x"}})  # type: ignore[assignment]
        sub = pb.Submission(template="demo", queue=queue, priority=priority)
        spec = pb.JobSpec(name="team-a-x", min_ranks=1, max_ranks=2, submission=sub)
        ctl._create_submitted(Job.from_proto(pb.Job(spec=spec)))
        created = [c for c in ctl.batch.calls if c[0] == "create_namespaced_job"]  # type: ignore[attr-defined]
        reports = [c for c in jobs.calls if c[0] == "report_queue"]
        if why is None:
            assert len(created) == 1 and not reports
            labels = created[0][1][1]["metadata"]["labels"]
            assert labels[decide.QUEUE_LABEL] == "team-a"
            assert labels[decide.PRIORITY_LABEL] == "low"
        else:
            assert not created
            assert len(reports) == 1 and reports[0][1] == ("team-a-x", "REJECTED")
            assert why in reports[0][2]["message"], reports[0][2]["message"]

"""The queue controller's decisions (stoker.kueue.decide) on Kubernetes objects
shaped as Kueue v0.17 and the API server return them: quota arithmetic, the
first sign of an eviction, shrink before evict, grow toward max_ranks, scale
up, a user's resize of a submitted job (told by the seq of the ScaleJob that
set the target), a grow whose slice waits for quota (shrunk, withdrawn,
never grown twice); the controller's calls for each action and whole
reconciles (on fakes of the API and the coordinator), and its watches on the
API server's streamed answers (504 "Too large resource version": list again,
with backoff). The loop that acts on them runs on the real cluster
(tests/k8s/run)."""

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


def test_an_elastic_job_grows_toward_max_ranks_not_only_back() -> None:
    # No user resize: the job wants max_ranks, whatever size it started or
    # shrank from (the controller no longer records the size it shrank from).
    assert decide.wanted_ranks({}, 6) == 6
    assert decide.wanted_ranks({decide.WANTED_ANNOTATION: "3"}, 6) == 3  # a user asked 3
    assert decide.wanted_ranks({decide.WANTED_ANNOTATION: "9"}, 6) == 6
    assert decide.wanted_ranks({decide.WANTED_ANNOTATION: "x"}, 6) == 6
    # Started at 2 of 2..6, four ranks' worth free, nothing waits: 6 at once
    # (one slice, one checkpoint and round), not 3 then 4 then ...
    free = {"cpu": Decimal("0.2"), "memory": Decimal(1 << 30)}
    acts = decide.plan([], [running("low", 2, hi=6, wanted=decide.wanted_ranks({}, 6))], free)
    assert [(type(a), getattr(a, "to", None)) for a in acts] == [(decide.Grow, 6)]
    # Two ranks' worth: as far as it fits.
    free = {"cpu": Decimal("0.1"), "memory": Decimal(1 << 30)}
    acts = decide.plan([], [running("low", 2, hi=6, wanted=6)], free)
    assert [getattr(a, "to", None) for a in acts] == [4]
    # A user's resize to 3 caps it there.
    acts = decide.plan([], [running("low", 2, hi=6, wanted=3)], free)
    assert [getattr(a, "to", None) for a in acts] == [3]


def test_a_users_resize_is_a_target_the_controller_did_not_set() -> None:
    sub = dict(submitted=True)
    assert decide.user_resize(running("j", 4, target=2)) is None  # not submitted
    assert decide.user_resize(running("j", 4, target=0, **sub)) is None  # none asked
    assert decide.user_resize(running("j", 4, target=2, set_target=2, **sub)) is None  # ours
    down = decide.user_resize(running("j", 4, target=2, set_target=4, **sub))
    assert down is not None and down.to == 2
    assert down.reason == "resize 4 -> 2 asked by the user: checkpoint, then restart at 2 ranks"
    up = decide.user_resize(running("j", 2, target=4, **sub))
    assert up is not None and up.to == 4 and "a workload slice for 4 ranks" in up.reason
    same = decide.user_resize(running("j", 3, target=3, **sub))
    assert same is not None and same.to == 3  # only recorded: it grows back to 3
    # Within min..max whatever the coordinator holds (it refuses others).
    assert decide.resize_to(9, 0, 0, 0, 2, 4) == 4 and decide.resize_to(1, 0, 0, 0, 2, 4) == 2


def test_a_users_resize_to_the_size_the_controller_set_is_the_users() -> None:
    """Which setting of the coordinator's target is the controller's is told
    by the seq of the ScaleJob that made it (Job.target_seq), not by its
    size: after the controller shrank the job to 2 (its ScaleJob answered
    seq 12), the user's "stay at 2" (seq 17) is the user's, recorded so the
    job does not grow back to max_ranks."""
    sub = dict(submitted=True, set_target=2, set_seq=12)
    stay = decide.user_resize(running("j", 2, target=2, target_seq=17, **sub))
    assert stay is not None and stay.to == 2 and stay.reason.startswith("resize to 2 asked")
    # The controller's own setting, whatever sizes the annotations hold.
    assert decide.user_resize(running("j", 2, target=2, target_seq=12, **sub)) is None
    assert decide.user_resize(running("j", 3, target=3, target_seq=12, **sub)) is None
    # Another size with another seq: the user's, as before.
    down = decide.user_resize(running("j", 4, target=3, target_seq=17, **sub))
    assert down is not None and down.to == 3
    # A seq unknown on either side (a coordinator, or a Job annotated, from
    # before target_seq): the sizes are compared.
    assert decide.user_resize(running("j", 2, target=2, target_seq=0, **sub)) is None
    old = dict(submitted=True, set_target=2, set_seq=0)
    assert decide.user_resize(running("j", 2, target=2, target_seq=17, **old)) is None
    assert decide.user_resize(running("j", 2, target=3, target_seq=17, **old)) is not None


NONE = {"cpu": Decimal(0), "memory": Decimal(0)}


def pods(n: int) -> dict[str, Decimal]:
    """The quota of n ranks (PER_POD each)."""
    return {k: v * n for k, v in PER_POD.items()}


def test_a_pending_grow_is_withdrawn_for_a_workload_of_higher_or_equal_priority() -> None:
    """A grow's slice that waits for quota is taken back when a workload of
    the same or a higher priority waits in the ClusterQueue and does not fit
    beside it (Kueue would give the slice what frees first, by age at equal
    priority); a lower-priority one, or one that fits beside it, leaves it."""
    growing = running("low", 2, slice_count=4)  # 2 admitted, a slice for 4 waits
    assert growing.growing and growing.can_give == 0
    acts = decide.plan([high(2, prio=100)], [growing], NONE)
    assert [type(a) for a in acts] == [decide.Withdraw]
    assert "grow 2 -> 4 withdrawn: workload job-high-1 (priority 100)" in acts[0].reason
    assert [type(a) for a in decide.plan([high(2, prio=1000)], [growing], NONE)] == [
        decide.Withdraw
    ]  # Higher: low at its min is evicted, its slice withdrawn first.
    assert decide.plan([high(2, prio=50)], [growing], NONE) == []
    # Fits in the free quota but not beside the slice's two more ranks.
    assert [type(a) for a in decide.plan([high(1, prio=100)], [growing], pods(2))] == [
        decide.Withdraw
    ]
    assert decide.plan([high(1, prio=100)], [growing], pods(3)) == []  # Fits beside it.
    other = running("low", 2, slice_count=4, cluster_queue="other")
    assert decide.plan([high(2, prio=100)], [other], NONE) == []
    # Withdrawn (or shrunk) and not replaced yet: nothing more to take back.
    assert decide.plan([high(2, prio=100)], [running("low", 2, slice_count=2)], NONE) == []


def test_a_job_whose_grow_waits_still_shrinks_and_is_not_grown_again() -> None:
    # Shrunk for a higher priority at its admitted size: fewer pods, which
    # takes the slice with them (no separate withdrawal).
    growing = running("low", 4, hi=6, slice_count=6)
    acts = decide.plan([high(1)], [growing], NONE)
    assert [(type(a), getattr(a, "to", None)) for a in acts] == [(decide.Shrink, 3)]
    # Nothing waits: its slice waits for Kueue, no second grow.
    assert decide.plan([], [growing], pods(8)) == []
    assert decide.plan([], [running("low", 4, hi=6)], pods(8)) != []


def test_evicting_a_job_whose_grow_waits_withdraws_its_slice_first() -> None:
    """Kueue v0.17 finishes an evicted old slice and leaves the Job running
    on its pending one, so the eviction waits for the withdrawal."""
    acts = decide.plan([high(2)], [running("low", 2, slice_count=4)], NONE)
    assert [type(a) for a in acts] == [decide.Withdraw]
    assert "preempted by workload job-high-1" in acts[0].reason
    assert "withdrawn first" in acts[0].reason
    # Withdrawn, Kueue has not replaced the slice yet: still not evicted.
    acts = decide.plan([high(2)], [running("low", 2, slice_count=2)], NONE)
    assert [type(a) for a in acts] == [decide.Withdraw]
    # Replaced: one admitted Workload; evicted now.
    assert [type(a) for a in decide.plan([high(2)], [running("low", 2)], NONE)] == [decide.Evict]


class FakeBatch:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def patch_namespaced_job(self, name: str, ns: str, body: Any, **kw: Any) -> None:
        self.calls.append(("patch", name, repr(body)))


class FakeJobs:
    """The coordinator: ScaleJob answers the next event seq as target_seq."""

    def __init__(self, calls: list[tuple[str, ...]], seq: int = 40) -> None:
        self.calls = calls
        self.seq = seq
        self.shown: dict[str, Any] = {}

    def preempt(self, name: str, reason: str = "") -> None:
        self.calls.append(("preempt", name, reason))

    def scale(self, name: str, ranks: int, in_place: bool = False) -> Any:
        import types

        self.calls.append(("scale", name, str(ranks)) + (("in_place",) if in_place else ()))
        self.seq += 1
        return types.SimpleNamespace(target_ranks=ranks, target_seq=self.seq)

    def show(self, name: str) -> Any:
        return self.shown[name]

    def list(self) -> list[Any]:
        return []


def controller() -> tuple[Any, list[tuple[str, ...]]]:
    from kubernetes import client

    from stoker.kueue.controller import Controller

    batch = FakeBatch()
    c = Controller("ns", FakeJobs(batch.calls), api=client.ApiClient())  # type: ignore[arg-type]
    c.batch = batch  # type: ignore[assignment]
    return c, batch.calls


def marks(to: int, seq: int = 0) -> dict[str, str]:
    out = {decide.WANTED_ANNOTATION: str(to), decide.TARGET_ANNOTATION: str(to)}
    if seq:
        out[decide.TARGET_SEQ_ANNOTATION] = str(seq)
    return out


def test_a_users_resize_is_applied_as_the_controllers_shrink_and_grow() -> None:
    c, calls = controller()
    sub = dict(submitted=True)
    # Down: checkpoint-then-stop first, then fewer pods, the size recorded.
    rz = decide.user_resize(running("j", 4, target=2, **sub))
    assert rz is not None
    c.act(rz, {})
    body = {"spec": {"parallelism": 2, "completions": 2}, "metadata": {"annotations": marks(2)}}
    assert calls == [("preempt", "team-a-j", rz.reason), ("patch", "j", repr(body))]
    # Up: no preemption; more pods (a new slice), the size recorded; the
    # coordinator's target is already the user's.
    calls.clear()
    rz = decide.user_resize(running("j", 2, target=4, **sub))
    assert rz is not None
    c.act(rz, {})
    body = {"spec": {"parallelism": 4, "completions": 4}, "metadata": {"annotations": marks(4)}}
    assert calls == [("patch", "j", repr(body))]
    # The size it runs: recorded only, with the seq of the user's setting.
    calls.clear()
    rz = decide.user_resize(running("j", 3, target=3, target_seq=17, **sub))
    assert rz is not None
    c.act(rz, {})
    assert calls == [("patch", "j", repr({"metadata": {"annotations": marks(3, 17)}}))]
    # The size it runs while a grow's slice waits: the slice withdrawn too.
    calls.clear()
    rz = decide.user_resize(running("j", 2, target=2, target_seq=18, slice_count=4, **sub))
    assert rz is not None and "slice for 4 withdrawn" in rz.reason
    c.act(rz, {})
    body = {"spec": {"parallelism": 2, "completions": 2}, "metadata": {"annotations": marks(2, 18)}}
    assert calls == [("patch", "j", repr(body))]


def test_a_withdrawal_lowers_the_pods_to_the_admitted_count_only() -> None:
    c, calls = controller()
    c.act(decide.Withdraw(running("j", 2, slice_count=4), "someone waits"), {})
    assert calls == [("patch", "j", repr({"spec": {"parallelism": 2, "completions": 2}}))]


def test_the_controllers_own_targets_are_recorded_so_they_are_not_a_users() -> None:
    c, calls = controller()
    # Shrink in place (issue 23): ScaleJob in place first (so the deleted
    # pods' SIGTERM is the shrink's, not a notice), then fewer pods with the
    # target and its seq; no PreemptJob, so the kept ranks resize in their
    # processes.
    c.act(decide.Shrink(running("j", 4), 2, "yielding"), {})
    body = {
        "spec": {"parallelism": 2, "completions": 2},
        "metadata": {
            "annotations": {decide.TARGET_ANNOTATION: "2", decide.TARGET_SEQ_ANNOTATION: "41"}
        },
    }
    assert calls == [("scale", "team-a-j", "2", "in_place"), ("patch", "j", repr(body))]
    # Grow from 2 to 4 of a job whose target is not 2: the target first
    # becomes 2 (new ranks park as spares until ScaleJob), then more pods.
    calls.clear()
    c.act(decide.Grow(running("j", 2, target=0), 4), {})
    body = {
        "spec": {"parallelism": 4, "completions": 4},
        "metadata": {
            "annotations": {decide.TARGET_ANNOTATION: "2", decide.TARGET_SEQ_ANNOTATION: "42"}
        },
    }
    assert calls == [("scale", "team-a-j", "2"), ("patch", "j", repr(body))]
    calls.clear()
    c.act(decide.Grow(running("j", 2, target=2), 4), {})  # already: pods only
    assert calls == [("patch", "j", repr({"spec": {"parallelism": 4, "completions": 4}}))]


def test_an_eviction_deactivates_the_workload_then_names_its_reason() -> None:
    """Deactivated first (Kueue evicts at once; the SIGTERM its pods get is
    a notice too), then PreemptJob with the reason the events show."""
    c, calls = controller()

    class Custom:
        def patch_namespaced_custom_object(self, *a: Any, **kw: Any) -> None:
            calls.append(("deactivate", a[4], repr(a[5])))

    c.custom = Custom()
    c.act(decide.Evict(running("j", 2), "no yield fits"), {})
    assert [x[0] for x in calls] == ["deactivate", "preempt"], calls
    assert "'active': False" in calls[0][2] and calls[1] == ("preempt", "team-a-j", "no yield fits")


class FakeKube:
    """The API server's Jobs, Workloads and ClusterQueue, as lists and gets
    answer them; patches recorded."""

    def __init__(self, jobs: list[Any], wls: list[Any], cq: Any, calls: list[Any]) -> None:
        self.jobs, self.wls, self.cq, self.calls = jobs, wls, cq, calls

    def list_namespaced_job(self, ns: str, **kw: Any) -> Any:
        import types

        return types.SimpleNamespace(items=self.jobs)

    def patch_namespaced_job(self, name: str, ns: str, body: Any, **kw: Any) -> None:
        self.calls.append(("patch", name, repr(body)))

    def list_namespaced_custom_object(self, *a: Any, **kw: Any) -> Any:
        return {"items": self.wls}

    def get_cluster_custom_object(self, *a: Any) -> Any:
        return self.cq

    def get_namespaced_custom_object(self, *a: Any) -> Any:
        return {"spec": {"clusterQueue": "stoker"}}

    def patch_namespaced_custom_object(self, *a: Any, **kw: Any) -> None:
        self.calls.append(("patch-workload", a[4], repr(a[5])))


def batch_job(name: str, parallelism: int, ann: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-job-{name}",
            "annotations": {decide.ELASTIC_ANNOTATION: "true", **ann},
        },
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": {"metadata": {"labels": {decide.JOB_LABEL: f"team-a-{name}"}}},
        },
        "status": {"active": parallelism, "ready": 2},
    }


def coordinator_job(name: str, target: int, seq: int) -> Any:
    from stoker.jobs import Job
    from stoker.v1 import coordinator_pb2 as pb

    spec = pb.JobSpec(name=name, min_ranks=1, max_ranks=4, submission=pb.Submission())
    m = pb.Job(spec=spec, state=pb.JOB_STATE_RUNNING, world_size=2, target_ranks=target)
    m.target_seq = seq
    return Job.from_proto(m)


def reconciled(ann: dict[str, str], target: int, seq: int, slice_for: int, waiting: Any) -> Any:
    """One reconcile of the controller over a Kueue-shaped namespace: the
    submitted elastic job low (1..4 ranks, priority 100) admitted at 2 in a
    ClusterQueue of 4 ranks' quota that another workload fills (2); with
    slice_for, a grow's slice for that many pods waits for quota; waiting:
    another pending workload. Answers the calls the controller made."""
    from kubernetes import client

    from stoker.kueue.controller import Controller

    calls: list[Any] = []
    admitted = {"QuotaReserved": "True", "Admitted": "True"}
    wls = [workload("job-low-1", "low", 2, 100, admitted, "2026-11-28T20:00:00Z")]
    wls.append(workload("job-other-1", "other", 2, 100, admitted, "2026-11-28T20:00:00Z"))
    if slice_for:
        s = workload("job-low-2", "low", slice_for, 100, {"QuotaReserved": "False"})
        s["metadata"]["creationTimestamp"] = "2026-11-28T20:03:00Z"
        s["metadata"]["annotations"] = {decide.SLICE_ANNOTATION: "ns/job-low-1"}
        wls.append(s)
    if waiting is not None:
        wls.append(waiting)
    kube = FakeKube(
        [batch_job("low", slice_for or 2, ann)],
        wls,
        cluster_queue("200m", "256Mi", "200m", "256Mi"),
        calls,
    )
    jobs = FakeJobs(calls)
    jobs.shown["team-a-low"] = coordinator_job("team-a-low", target, seq)
    c = Controller("ns", jobs, api=client.ApiClient())  # type: ignore[arg-type]
    c.batch = c.custom = kube  # type: ignore[assignment]
    c.reconcile()
    return calls


def test_the_controller_sees_a_users_resize_to_the_size_it_set_by_its_seq() -> None:
    """On the Job: the controller set 2 with the ScaleJob that answered seq
    12. The coordinator's target 2 of seq 12 is the controller's: nothing
    done. Of seq 17 (the user's resize to 2, "stay at 2"): recorded as what
    the job grows back to, so it does not grow toward max_ranks."""
    ann = {decide.TARGET_ANNOTATION: "2", decide.TARGET_SEQ_ANNOTATION: "12"}
    assert reconciled(ann, 2, 12, 0, None) == []
    body = {"metadata": {"annotations": marks(2, 17)}}
    assert reconciled(ann, 2, 17, 0, None) == [("patch", "low", repr(body))]


def test_the_controller_withdraws_a_pending_grow_for_an_equal_priority_workload() -> None:
    """The grow's slice (4 pods) waits: the other workload holds the
    quota. An equal-priority workload that arrived since waits too: the
    slice is withdrawn (the Job back to its 2 admitted pods) rather than
    taking the quota first when it frees; a lower-priority one leaves it."""
    ann = {decide.TARGET_ANNOTATION: "2", decide.TARGET_SEQ_ANNOTATION: "12"}
    mid = workload("job-mid-1", "mid", 2, 100, {}, "2026-11-28T20:05:00Z")
    mid["status"] = {"conditions": []}
    calls = reconciled(ann, 2, 12, 4, mid)
    assert calls == [("patch", "low", repr({"spec": {"parallelism": 2, "completions": 2}}))]
    mid["spec"]["priority"] = 50
    assert reconciled(ann, 2, 12, 4, mid) == []
    # Nothing waits: the slice is Kueue's to admit when the quota frees.
    assert reconciled(ann, 2, 12, 4, None) == []


def test_the_controller_shrinks_a_job_whose_grow_waits() -> None:
    """A higher-priority workload that needs one rank: the job is shrunk in
    place at its admitted size (fewer pods, then the target), not left alone."""
    ann = {decide.TARGET_ANNOTATION: "2", decide.TARGET_SEQ_ANNOTATION: "12"}
    top = workload("job-top-1", "top", 1, 1000, {}, "2026-11-28T20:05:00Z")
    top["status"] = {"conditions": []}
    calls = reconciled(ann, 2, 12, 4, top)
    body = {
        "spec": {"parallelism": 1, "completions": 1},
        "metadata": {
            "annotations": {decide.TARGET_ANNOTATION: "1", decide.TARGET_SEQ_ANNOTATION: "41"}
        },
    }
    assert calls == [("scale", "team-a-low", "1", "in_place"), ("patch", "low", repr(body))]


# A watch's answers as the API server streams them: the Status of a watch
# from a version its watch cache has not reached yet (HTTP 504, what the
# controller's watches kept getting on the cluster), an event, a bookmark.
TOO_LARGE = {
    "type": "ERROR",
    "object": {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Too large resource version: 1200, current: 1187",
        "reason": "Timeout",
        "details": {
            "causes": [
                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
            ],
            "retryAfterSeconds": 1,
        },
        "code": 504,
    },
}
ADDED = {
    "type": "ADDED",
    "object": {"kind": "Job", "metadata": {"name": "low", "resourceVersion": "1211"}},
}
BOOKMARK = {"type": "BOOKMARK", "object": {"kind": "Job", "metadata": {"resourceVersion": "1215"}}}


class Streamed:
    """A watch's HTTP response as the client library reads it."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        import json

        self.body = [(json.dumps(e) + "\n").encode() for e in events]

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        return iter(self.body)

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


def test_a_watch_answered_too_large_resource_version_lists_again_with_backoff() -> None:
    from stoker.kueue.controller import follow

    lists = iter(["1200", "1210"])
    watches = iter([[TOO_LARGE], [ADDED, BOOKMARK], [TOO_LARGE], [TOO_LARGE]])
    calls: list[str] = []
    sleeps: list[float] = []
    wakes: list[int] = []

    def lister(**kw: Any) -> Any:
        if not kw.get("watch"):
            calls.append("list")
            return {"metadata": {"resourceVersion": next(lists, "1300")}, "items": []}
        assert kw["allow_watch_bookmarks"] and kw["timeout_seconds"] == 60
        calls.append(f"watch@{kw['resource_version']}")
        return Streamed(next(watches))

    follow("jobs", lister, lambda: wakes.append(1), lambda: len(calls) >= 7, sleeps.append)
    assert calls == [
        "list",  # version 1200
        "watch@1200",  # 504 Too large: list again after 1 s
        "list",  # 1210
        "watch@1210",  # an event (1211), a bookmark (1215), the server's end
        "watch@1215",  # on from the bookmark; 504: backoff starts over at 1 s
        "list",
        "watch@1300",  # 504 again: 2 s
    ]
    assert sleeps == [1.0, 1.0, 2.0]
    assert len(wakes) == 4  # each list and the one event, not the bookmark


def test_watch_backoff_is_capped() -> None:
    from stoker.kueue import controller

    sleeps: list[float] = []

    def lister(**kw: Any) -> Any:
        if not kw.get("watch"):
            return {"metadata": {"resourceVersion": "1"}}
        return Streamed([TOO_LARGE])

    controller.follow("wl", lister, lambda: None, lambda: len(sleeps) >= 8, sleeps.append)
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]

"""What stoker derives from the protos' descriptors (stoker._proto): the
RPCs the operator verbs call resolve against the services, every result
class mirrors every field of its message or names it as left out (a field
added to a proto and not to its class fails here, not at import), and
from_proto converts each kind of field (enum, repeated, map, optional
sub-message, StorageRef) as stokerctl renders it, with no daemon running."""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from stoker import _proto, jobs, queue
from stoker.errors import StokerError
from stoker.v1 import checkpoint_pb2 as ckpt_pb
from stoker.v1 import common_pb2
from stoker.v1 import coordinator_pb2 as coord_pb
from stoker.v1 import dataloader_pb2 as dl_pb

PB_MODULES = {"Coordinator": coord_pb, "Dataloader": dl_pb, "Checkpoint": ckpt_pb}


def test_every_verb_method_is_the_services_own():
    methods = [v for v in vars(jobs).values() if isinstance(v, _proto.Method)]
    assert len(methods) >= 18
    for m in methods:
        _, service, name = m.path.split("/")
        sd = PB_MODULES[service.removeprefix("stoker.v1.")].DESCRIPTOR.services_by_name
        md = sd[service.removeprefix("stoker.v1.")].methods_by_name[name]
        assert m.request_type.DESCRIPTOR.full_name == md.input_type.full_name
        assert m.response_type.DESCRIPTOR.full_name == md.output_type.full_name
    assert jobs.GET_JOB.path == "/stoker.v1.Coordinator/GetJob"
    assert jobs.WATCH_JOB.server_streaming and not jobs.GET_JOB.server_streaming


def test_a_method_the_proto_lacks_fails_at_once():
    with pytest.raises(KeyError):
        _proto.method(coord_pb, "Coordinator", "GetJobs")


def test_a_bad_request_value_is_invalid_argument_before_sending():
    with pytest.raises(StokerError) as e:
        jobs.SCALE_JOB.request(job="a", ranks=-1)  # uint32
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "ScaleJobRequest" in e.value.details


def test_every_result_class_mirrors_its_whole_message():
    mirrored = {
        cls: _proto.mirrored(cls)
        for module in (jobs, queue)
        for cls in vars(module).values()
        if isinstance(cls, type) and _proto.mirrored(cls)
    }
    # A field added to one of these protos: one annotated line in its class
    # (stoker/README.md), or its name in the class's omit.
    assert {c.__name__: _proto.unmirrored(c) for c in mirrored} == {
        c.__name__: [] for c in mirrored
    }
    assert set(mirrored.values()) >= {
        "stoker.v1.Job",
        "stoker.v1.JobSpec",
        "stoker.v1.Member",
        "stoker.v1.JobEvent",
        "stoker.v1.LoaderInfo",
        "stoker.v1.Manifest",
    }


def test_a_proto_field_missing_from_its_class_is_reported_not_raised():
    @_proto.mirror(coord_pb.JobEvent)
    @dataclasses.dataclass(frozen=True)
    class Short(_proto.Mirror):
        seq: int
        time_ms: int
        job: str
        type: str
        generation: int
        member_id: str
        world_size: int
        step: int

    assert _proto.unmirrored(Short) == ["message"]
    assert Short.from_proto(coord_pb.JobEvent(seq=2, message="x")).seq == 2

    @_proto.mirror(coord_pb.JobEvent, omit=("message",))
    @dataclasses.dataclass(frozen=True)
    class Named(_proto.Mirror):
        seq: int
        time_ms: int
        job: str
        type: str
        generation: int
        member_id: str
        world_size: int
        step: int

    assert _proto.unmirrored(Named) == []
    ev = Named.from_proto(coord_pb.JobEvent(seq=4, type=coord_pb.JOB_EVENT_SCALED, message="x"))
    assert (ev.seq, ev.type) == (4, "SCALED")


def test_a_class_field_the_message_lacks_fails_at_import():
    with pytest.raises(TypeError, match=r"has no \['colour'\]"):

        @_proto.mirror(ckpt_pb.Box)
        @dataclasses.dataclass(frozen=True)
        class Odd(_proto.Mirror):
            offsets: tuple[int, ...]
            sizes: tuple[int, ...]
            colour: str


def test_from_proto_converts_each_kind_of_field():
    m = coord_pb.Job(
        spec=coord_pb.JobSpec(
            name="j",
            min_ranks=1,
            max_ranks=2,
            labels={"team": "a"},
            dataset=common_pb2.StorageRef(uri="file:///d"),
        ),
        state=coord_pb.JOB_STATE_RUNNING,
        members=[coord_pb.Member(rank=1, health=coord_pb.RANK_HEALTH_DEGRADED, loss=2.5)],
        latest_checkpoint=common_pb2.CheckpointRef(step=9, uri="u"),
    )
    job = jobs.Job.from_proto(m)
    assert (job.name, job.state) == ("j", "RUNNING")
    assert job.spec is not None and job.spec.labels == {"team": "a"}
    assert (job.spec.dataset, job.spec.checkpoint_storage) == ("file:///d", "")
    assert job.members == (jobs.Member("", 1, "", "", 0, 0, 0.0, 2.5, "DEGRADED", ""),)
    assert job.latest_checkpoint == jobs.CheckpointRef(9, "u", 0, 0)
    assert jobs.Job.from_proto(coord_pb.Job()).latest_checkpoint is None

    ds = jobs.DatasetSpec.from_proto(
        dl_pb.DatasetSpec(
            name="w", source=common_pb2.StorageRef(uri="/x"), format=dl_pb.DATASET_FORMAT_LLMC
        )
    )
    assert (ds.uri, ds.format) == ("/x", "llmc")
    assert jobs.DatasetSpec.from_proto(dl_pb.DatasetSpec(format=77)).format == "?"
    assert ds.to_proto().source.uri == "/x" and ds.to_proto().format == dl_pb.DATASET_FORMAT_LLMC

    chunk = jobs.ChunkEntry.from_proto(
        ckpt_pb.ChunkEntry(tensor="t", box=ckpt_pb.Box(offsets=[0, 2], sizes=[3, 4]))
    )
    assert chunk.box == jobs.Box((0, 2), (3, 4)) and chunk.dtype == "UNSPECIFIED"
    report = jobs.VerifyReport.from_proto(
        ckpt_pb.VerifyCheckpointResponse(objects=2, problems=["bad"]), job="j", step=3
    )
    assert (report.job, report.step, report.objects, report.problems) == ("j", 3, 2, ("bad",))


def test_enum_prefixes_come_from_the_zero_value():
    assert _proto.enum_prefix(coord_pb.JobEventType.DESCRIPTOR) == "JOB_EVENT_"
    assert _proto.enum_prefix(ckpt_pb.DType.DESCRIPTOR) == "DTYPE_"
    assert _proto.enum_prefix(coord_pb.HeartbeatAction.DESCRIPTOR) == "HEARTBEAT_ACTION_"
    assert jobs._FORMAT_VALUES == {"": 0, "megatron": 1, "llmc": 2, "text": 3}


def test_the_generic_as_dict_gives_what_the_queue_classes_hand_copies_gave():
    # The dicts Submission.as_dict and QueueStatus.as_dict built field by
    # field before Mirror.as_dict replaced them (args a list, not a tuple).
    sub = queue.Submission.from_proto(
        coord_pb.Submission(queue="team-a", priority="high", template="demo", args=["--x", "1"])
    )
    assert sub.as_dict() == {
        "queue": "team-a",
        "priority": "high",
        "template": "demo",
        "args": ["--x", "1"],
    }
    assert type(sub.as_dict()["args"]) is list
    st = queue.QueueStatus.from_proto(
        queue.status_proto(
            "ADMITTED",
            workload="wl",
            cluster_queue="cq",
            position=-1,
            admitted_ranks=4,
            message="m",
            updated_ms=7,
        )
    )
    assert st.as_dict() == {
        "state": "ADMITTED",
        "workload": "wl",
        "cluster_queue": "cq",
        "position": -1,
        "admitted_ranks": 4,
        "message": "m",
        "updated_ms": 7,
    }
    assert list(st.as_dict()) == [f.name for f in dataclasses.fields(st)]
    # Nested: a JobSpec's submission is its dict, an absent one None.
    spec = jobs.JobSpec.from_proto(coord_pb.JobSpec(name="j", min_ranks=1, max_ranks=2))
    assert spec.as_dict()["submission"] is None
    spec = jobs.JobSpec.from_proto(
        coord_pb.JobSpec(
            name="j", min_ranks=1, max_ranks=2, submission=coord_pb.Submission(args=["a"])
        )
    )
    assert spec.as_dict()["submission"] == {
        "queue": "",
        "priority": "",
        "template": "",
        "args": ["a"],
    }

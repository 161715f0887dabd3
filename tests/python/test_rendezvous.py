"""torchrun's rendezvous handler (stoker.rendezvous) against the real
coordinator: driven by hand, what the agent hands its workers across
restarts (each answer to one worker generation, once); under torchrun, a
job whose agents all finish ends FINISHED, with no error at the exit
barrier."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import grpc
import pytest
from conftest import binary

from stoker import elastic
from stoker.connection import Connection
from stoker.errors import StokerError
from stoker.jobs import Jobs
from stoker.membership import CHECKPOINT_NOW, RESTART, Member, Progress
from stoker.rendezvous import StokerRendezvousHandler, ensure_job
from stoker.store import StokerStore
from stoker.v1 import common_pb2
from stoker.v1 import coordinator_pb2 as pb


def wait_for(cond: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


def join_and_beat(m: Member) -> None:
    m.join(timeout=20)
    m.start_heartbeats(Progress, lambda action, reason: None)


def test_a_worker_after_a_restart_gets_no_earlier_answer(daemons):
    addr = daemons["coordinator"].addr
    conn = Connection(addr)
    conf = {"heartbeat_interval_ms": 50, "heartbeat_misses": 40, "last_call_ms": 50}
    ensure_job(conn, "once", 1, 2, conf)
    conn.close()
    agent = StokerRendezvousHandler("once", addr)
    other = Member("once", addr)
    try:
        agent.next_rendezvous()  # generation 1, world 1
        first = elastic.TrainingMonitor.from_env()
        # A second node arrives: the job grows at a step boundary, so the
        # agent's heartbeat hears CHECKPOINT_NOW (a resize), then RESTART
        # (these workers checkpoint nothing: at the resize's deadline), and
        # writes both for the running workers.
        joined = threading.Thread(target=join_and_beat, args=(other,))
        joined.start()
        heard: list[tuple[str, str]] = []
        wait_for(lambda: bool(heard.extend(first.poll())) or RESTART in [a for a, _ in heard])
        assert [a for a, _ in heard] == [CHECKPOINT_NOW, RESTART]
        assert first.poll() == []
        agent.next_rendezvous()  # what torchrun does before it starts new workers
        joined.join()
        second = elastic.TrainingMonitor.from_env()
        # The new workers start after that RESTART: it is not theirs.
        assert second.poll() == []
        # A later answer reaches them once.
        elastic.append_action(agent.control_dir, agent._seq + 1, "CHECKPOINT_NOW", "asked")
        assert second.poll() == [("CHECKPOINT_NOW", "asked")]
        assert second.poll() == []
    finally:
        other.leave()
        agent.shutdown()


def test_a_job_whose_agents_all_finish_ends(daemons, tmp_path):
    """Two torchrun agents whose workers succeed, one a second later: the
    first to finish leaves as finished, which opens no generation under the
    other's exit barrier, and the job ends FINISHED."""
    addr = daemons["coordinator"].addr
    worker = tmp_path / "worker.py"
    worker.write_text("import os, time\ntime.sleep(float(os.environ['NAP']))\n")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    argv = [torchrun, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=stoker"]
    argv += [f"--rdzv-endpoint={addr}", "--rdzv-id=done", "--monitor-interval=0.1"]
    # A 3 s lease: one lost on a loaded machine (300 ms, 100 ms heartbeats
    # missed three times) opened a generation under the exit barrier.
    argv += ["--rdzv-conf=heartbeat_interval_ms=100,heartbeat_misses=30,last_call_ms=100"]
    argv += ["--no-python", sys.executable, str(worker)]
    agents = [
        subprocess.Popen(
            argv,
            env=dict(os.environ, NAP=nap, OMP_NUM_THREADS="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for nap in ("0", "1.5")
    ]
    logs = [p.communicate(timeout=120)[0].decode(errors="replace") for p in agents]
    for p, log in zip(agents, logs, strict=True):
        assert p.returncode == 0, log[-3000:]
        assert "Error waiting on exit barrier" not in log, log[-3000:]
    ctl = [str(binary("stokerctl")), "--coordinator", addr, "--json"]
    job = json.loads(subprocess.run([*ctl, "job", "show", "done"], capture_output=True).stdout)
    assert job["state"] == "FINISHED" and job["generation"] == 1, job
    assert job["reason"].startswith("finished"), job
    shown = subprocess.run([*ctl[:-1], "job", "show", "done"], capture_output=True, text=True)
    assert "FINISHED" in shown.stdout, shown.stdout


RANK_SCRIPT = """
import datetime, torch, torch.distributed as dist
from stoker import elastic
elastic.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
t = torch.tensor([float(dist.get_rank()) + 1.0])
dist.all_reduce(t)
print(f"sum={t.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_workers_of_one_generation_meet_whatever_their_agents_restart_counts(daemons):
    """torchrun counts a restart after a failed worker but not one after a
    membership change (TORCHELASTIC_RESTART_COUNT), so when a node is lost
    one survivor's worker may fail on the dead peer (count 1) while the
    other's agent hears RESTART first (count 0). Both workers start in the
    same generation and must still form their process group: before, each
    looked for the other under pg/<its own count> and waited forever."""
    addr = daemons["coordinator"].addr
    conn = Connection(addr)
    ensure_job(conn, "counts", 2, 2, {"last_call_ms": 100})
    conn.close()
    members = [Member("counts", addr) for _ in range(2)]
    threads = [threading.Thread(target=join_and_beat, args=(m,)) for m in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ships = [m.membership for m in members]
    assert ships[0].generation == ships[1].generation, ships
    procs = []
    for m, restarts in zip(ships, ("1", "0"), strict=True):
        env = dict(
            os.environ,
            STOKER_COORDINATOR=addr,
            RANK=str(m.rank),
            WORLD_SIZE="2",
            TORCHELASTIC_RESTART_COUNT=restarts,
            OMP_NUM_THREADS="1",
        )
        env[elastic.ENV_JOB] = "counts"
        env[elastic.ENV_GENERATION] = str(m.generation)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", RANK_SCRIPT],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=120)[0] for p in procs]
    for m in members:
        m.leave()
    for p, out in zip(procs, outs, strict=True):
        assert p.returncode == 0 and "sum=3" in out, out[-2000:]


def test_a_round_that_ends_before_the_agents_store_answers_is_joined_again(daemons):
    """The generation an agent joined ends before its first store call (a
    member lost or added right after the close): the store answers
    FAILED_PRECONDITION, which torch's agent does not survive, so
    next_rendezvous joins the next round and returns that one."""
    addr = daemons["coordinator"].addr
    conn = Connection(addr)
    # The last call outlasts the agent's way from the failed store call to
    # its next Join, so the second node's round waits for it.
    conf = {"heartbeat_interval_ms": 50, "heartbeat_misses": 40, "last_call_ms": 3000}
    ensure_job(conn, "stale", 1, 2, conf)
    conn.close()
    agent = StokerRendezvousHandler("stale", addr)
    other = Member("stale", addr)
    joined = threading.Thread(target=join_and_beat, args=(other,))
    real_join = agent.member.join
    gens: list[int] = []

    def join_then_lose_the_round(timeout: float = 600.0):
        m = real_join(timeout=timeout)
        gens.append(m.generation)
        if len(gens) == 1:  # a second node arrives before the agent's store call
            joined.start()
            fenced = StokerStore("stale", m.generation, addr)

            def ended() -> bool:
                try:
                    fenced.set("probe", b"")
                except StokerError as e:
                    return e.code == grpc.StatusCode.FAILED_PRECONDITION
                return False

            wait_for(ended)
        return m

    agent.member.join = join_then_lose_the_round  # type: ignore[method-assign]
    try:
        info = agent.next_rendezvous()
        joined.join()
        assert len(gens) == 2 and gens[1] > gens[0], gens
        assert info.world_size == 2 and other.membership is not None
        assert other.membership.generation == gens[1]
        assert info.bootstrap_store_info is not None
        assert info.bootstrap_store_info.master_port > 0
    finally:
        other.leave()
        agent.shutdown()


def test_workers_that_stop_resumably_end_the_agent_with_75(daemons):
    """The job pausing (a preemption), a worker saves and calls
    exit_resumably: its agent leaves with that step and ends with 75, at
    torch's restart (next_rendezvous) as at its end (shutdown), and the job
    is PAUSED waiting for that step."""
    addr = daemons["coordinator"].addr
    conn = Connection(addr)
    conf = {"heartbeat_interval_ms": 50, "heartbeat_misses": 40, "last_call_ms": 50}
    ensure_job(conn, "pause", 1, 1, conf)
    conn.close()
    jobs = Jobs(addr)
    for end in ("next_rendezvous", "shutdown"):
        agent = StokerRendezvousHandler("pause", addr)
        try:
            agent.next_rendezvous()
            worker = elastic.TrainingMonitor.from_env()
            jobs.preempt("pause", "kueue: evicted")
            heard: list[tuple[str, str]] = []
            wait_for(lambda h=heard, w=worker: bool(h.extend(w.poll()) or h))
            assert heard[0][0] == "CHECKPOINT_NOW" and worker.pausing, heard
            with pytest.raises(SystemExit) as e:
                worker.exit_resumably(6)
            assert e.value.code == elastic.RESUMABLE_EXIT
            with pytest.raises(SystemExit) as e:
                getattr(agent, end)()
            assert e.value.code == elastic.RESUMABLE_EXIT
            assert agent.member.membership is None  # it left
            assert jobs.show("pause").state == "PAUSED"
        finally:
            agent.shutdown()
        # The checkpoint service reports step 6 committed; the next agent's
        # Join resumes the job.
        Connection(addr).unary(
            "/stoker.v1.Coordinator/ReportCheckpoint",
            pb.ReportCheckpointRequest(job="pause", step=6, uri="file:///ckpt/6"),
            common_pb2.Empty,
        )


def test_a_shrink_in_place_ends_the_removed_agent_with_75_and_keeps_the_other(daemons):
    """Two agents driven by hand, the job shrunk in place to one
    (``Jobs.scale(in_place=True)``) and the agent at rank 1 sent SIGTERM
    (its pod deleted): its workers see ``terminating``; both nodes' workers
    hear the resize's CHECKPOINT_NOW (``resizing``, not ``pausing``) and
    stop at step 6; ``await_new_round`` ends the removed node's worker with
    75, and its agent, at torch's restart, leaves with step 6 and exits 75.
    The job never pauses: once step 6 is reported the kept node's worker
    hears RESTART, its agent's next round is at world 1 restoring step 6
    (SHRUNK "in place"), and a late heartbeat of the removed agent, still
    saying terminating, changes nothing. An agent that got SIGTERM whose
    workers left no step joins no round: it leaves and exits 75."""
    addr = daemons["coordinator"].addr
    conn = Connection(addr)
    conf = {"heartbeat_interval_ms": 50, "heartbeat_misses": 40, "last_call_ms": 5000}
    ensure_job(conn, "shr", 1, 2, conf)
    conn.close()
    jobs = Jobs(addr)
    agents = [StokerRendezvousHandler("shr", addr) for _ in range(2)]
    try:
        rounds = [threading.Thread(target=h.next_rendezvous) for h in agents]
        for t in rounds:
            t.start()
        for t in rounds:
            t.join()
        ranks = [h.member.membership.rank for h in agents if h.member.membership]
        kept, removed = agents if ranks == [0, 1] else agents[::-1]
        workers = {h: elastic.TrainingMonitor(control_dir=h.control_dir) for h in agents}
        jobs.scale("shr", 1, in_place=True)
        removed._on_sigterm(signal.SIGTERM, None)  # as the kubelet does: a pod deleted
        assert workers[removed].terminating and not workers[kept].terminating
        for h in agents:
            heard: list[tuple[str, str]] = []
            wait_for(lambda h=h, s=heard: bool(s.extend(workers[h].poll()) or s))
            assert heard[0][0] == CHECKPOINT_NOW, heard
            assert workers[h].resizing and not workers[h].pausing
            workers[h].report_stop(6)
        with pytest.raises(SystemExit) as e:
            workers[removed].await_new_round(6)
        assert e.value.code == elastic.RESUMABLE_EXIT
        with pytest.raises(SystemExit) as e:
            removed.next_rendezvous()  # torch restarts failed workers: the agent ends
        assert e.value.code == elastic.RESUMABLE_EXIT
        assert removed.member.membership is None  # it left
        Connection(addr).unary(
            "/stoker.v1.Coordinator/ReportCheckpoint",
            pb.ReportCheckpointRequest(job="shr", step=6, uri="file:///ckpt/6"),
            common_pb2.Empty,
        )
        heard = []
        wait_for(
            lambda: bool(heard.extend(workers[kept].poll())) or RESTART in [a for a, _ in heard]
        )
        assert kept.num_nodes_waiting() == 1
        info = kept.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        assert kept.member.membership and kept.member.membership.latest_checkpoint_step == 6
        late = pb.HeartbeatRequest(
            job="shr", member_id=removed.member.member_id, generation=1, terminating=True
        )
        Connection(addr).unary("/stoker.v1.Coordinator/Heartbeat", late, pb.HeartbeatResponse)
        job = jobs.show("shr")
        assert (job.state, job.world_size) == ("RUNNING", 1), job
        evs = list(jobs.watch("shr", idle_timeout=0.5))
        types = [e.type for e in evs]
        assert "PREEMPTED" not in types and "PAUSED" not in types, types
        shrunk = [e.message for e in evs if e.type == "SHRUNK"]
        assert shrunk == ["shrunk from 2 to 1 rank at step 6 (in place)"], shrunk
        # The kept agent's SIGTERM now (its workers stopped with no step):
        # it leaves instead of joining, and ends with 75.
        kept._on_sigterm(signal.SIGTERM, None)
        with pytest.raises(SystemExit) as e:
            kept.next_rendezvous()
        assert e.value.code == elastic.RESUMABLE_EXIT
        assert kept.member.membership is None
    finally:
        for h in agents:
            h.shutdown()


AGENT_IN_JOIN = """
import sys
from stoker.rendezvous import StokerRendezvousHandler
h = StokerRendezvousHandler(sys.argv[1], sys.argv[2])
h.catch_sigterm()
h.next_rendezvous()
print("joined", flush=True)
"""


def test_a_sigterm_while_parked_in_join_ends_the_agent_with_75(daemons):
    """An agent parked in Join (a round short of its ranks) and sent SIGTERM
    (its pod deleted, e.g. by a shrink in place after its workers stopped)
    exits 75 at once: nothing of its node is unsaved, and a Job that deleted
    the pod does not count its index completed; its parked Join goes with
    it."""
    addr = daemons["coordinator"].addr
    conn = Connection(addr)
    ensure_job(conn, "parked", 2, 2, {"heartbeat_interval_ms": 100})
    conn.close()
    jobs = Jobs(addr)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT_IN_JOIN, "parked", addr],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: jobs.show("parked").waiting == 1, 60)
        agent.send_signal(signal.SIGTERM)  # as the kubelet does
        out, _ = agent.communicate(timeout=10)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == elastic.RESUMABLE_EXIT, out
    assert "joined" not in out, out
    wait_for(lambda: jobs.show("parked").waiting == 0, 10)

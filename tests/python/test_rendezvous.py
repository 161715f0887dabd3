"""torchrun's rendezvous handler (stoker.rendezvous) against the real
coordinator: driven by hand, what the agent hands its workers across
restarts (each answer to one worker generation, once); under torchrun, a
job whose agents all finish ends FINISHED, with no error at the exit
barrier."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from conftest import binary

from stoker import elastic
from stoker.connection import Connection
from stoker.membership import RESTART, Member, Progress
from stoker.rendezvous import StokerRendezvousHandler, ensure_job


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
        # A second node arrives: the agent's heartbeat hears RESTART and
        # writes it for the running workers.
        joined = threading.Thread(target=join_and_beat, args=(other,))
        joined.start()
        heard: list[tuple[str, str]] = []
        wait_for(lambda: bool(heard.extend(first.poll()) or heard))
        assert [a for a, _ in heard] == [RESTART]
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
    argv += ["--rdzv-conf=heartbeat_interval_ms=100,last_call_ms=100"]
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

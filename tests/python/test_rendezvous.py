"""torchrun's rendezvous handler (stoker.rendezvous) driven by hand against
the real coordinator, without torchrun: what the agent hands its workers
across restarts (each answer to one worker generation, once)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

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

"""Membership of a coordinator job: ``Member`` joins (parking until the
rendezvous round closes), heartbeats with step, loss and tokens/s, and
leaves. ``Member.start_heartbeats`` runs the heartbeats on a background
thread and hands the coordinator's answers (CHECKPOINT_NOW, STOP, RESTART)
to a callback.

Who is the member: a process that is a rank of its own (a plain script, or
torchrun's agent for its node, see ``stoker.rendezvous``).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from stoker._proto import Service
from stoker.connection import Connection, Security, address_from_env
from stoker.errors import StokerError
from stoker.v1 import coordinator_pb2 as pb

RPC = Service(pb, "Coordinator")  # the RPCs, by name, from the descriptor

# Heartbeat answers, by the names the proto and stokerctl use.
CONTINUE, RESTART, CHECKPOINT_NOW, STOP = "CONTINUE", "RESTART", "CHECKPOINT_NOW", "STOP"
_ACTIONS = {
    pb.HEARTBEAT_ACTION_CONTINUE: CONTINUE,
    pb.HEARTBEAT_ACTION_RESTART: RESTART,
    pb.HEARTBEAT_ACTION_CHECKPOINT_NOW: CHECKPOINT_NOW,
    pb.HEARTBEAT_ACTION_STOP: STOP,
}


@dataclass(frozen=True)
class Membership:
    """A closed rendezvous round, as this member sees it."""

    job: str
    member_id: str
    generation: int
    rank: int
    world_size: int
    heartbeat_interval_ms: int
    heartbeat_timeout_ms: int
    latest_checkpoint_step: int  # 0: none committed yet


@dataclass(frozen=True)
class Progress:
    """What a heartbeat reports: the step reached, its loss, tokens/s."""

    step: int = 0
    loss: float = 0.0
    tokens_per_s: float = 0.0


def default_member_id() -> str:
    """Unique per process for the job's life: host, pid and a random tail."""
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())
    return f"{host[:60]}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Member:
    """One member of ``job`` on the coordinator at ``address``.

    Args:
        job: the coordinator job (it must exist; see ``stoker.jobs``).
        member_id: unique per process; default host-pid-random.
        peer_address: where peers reach this member (shown by stokerctl).
    """

    def __init__(
        self,
        job: str,
        address: str | None = None,
        *,
        member_id: str | None = None,
        peer_address: str = "",
        security: Security | None = None,
    ) -> None:
        self.job = job
        self.member_id = member_id or default_member_id()
        self.peer_address = peer_address
        self.conn = Connection(
            address_from_env("STOKER_COORDINATOR", address), security, timeout=30.0
        )
        self.membership: Membership | None = None
        # A preemption notice (notify_terminating), sent with every heartbeat.
        self.terminating = False
        # What the last answer other than CONTINUE said: the job is pausing
        # (PauseJob or a preemption: checkpoint, then stop, exit 75) or being
        # resized (ScaleJob: checkpoint, then wait for RESTART).
        self.pausing = False
        self.resizing = False
        # The step this rank and its peers agreed to stop at (report_stop),
        # sent with every heartbeat of the membership; 0: none.
        self.stop_step = 0
        # With the last STOP while the job pauses: the checkpoint the pause
        # took (HeartbeatResponse.checkpoint_step); 0: none, or forced.
        self.stop_checkpoint_step = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def join(self, timeout: float = 600.0) -> Membership:
        """Parks until the round closes; answers generation, rank and world size."""
        req = pb.JoinRequest(
            job=self.job,
            member_id=self.member_id,
            address=self.peer_address,
            host=socket.gethostname(),
        )
        r = self.conn.unary(RPC.Join.path, req, RPC.Join.response_type, timeout=timeout, retry=True)
        self.stop_step = self.stop_checkpoint_step = 0
        self.membership = Membership(
            job=self.job,
            member_id=self.member_id,
            generation=int(r.generation),
            rank=int(r.rank),
            world_size=int(r.world_size),
            heartbeat_interval_ms=int(r.heartbeat_interval_ms),
            heartbeat_timeout_ms=int(r.heartbeat_timeout_ms),
            latest_checkpoint_step=int(r.latest_checkpoint.step)
            if r.HasField("latest_checkpoint")
            else 0,
        )
        return self.membership

    def heartbeat(self, progress: Progress = Progress()) -> tuple[str, int, str]:
        """One heartbeat: (action, the job's generation, reason)."""
        m = self._current()
        req = pb.HeartbeatRequest(
            job=self.job,
            member_id=self.member_id,
            generation=m.generation,
            step=progress.step,
            loss=progress.loss,
            tokens_per_s=progress.tokens_per_s,
            health=pb.RANK_HEALTH_OK,
            terminating=self.terminating,
            stop_step=self.stop_step,
        )
        r = self.conn.unary(RPC.Heartbeat.path, req, RPC.Heartbeat.response_type, retry=True)
        action = _ACTIONS.get(r.action, CONTINUE)
        if action != CONTINUE:
            self.pausing, self.resizing = bool(r.pausing), bool(r.resizing)
        if action == STOP:
            self.stop_checkpoint_step = int(r.checkpoint_step) if r.pausing else 0
        return action, int(r.generation), r.reason

    def notify_terminating(self) -> None:
        """This process is about to be terminated (it got SIGTERM: its pod is
        being evicted): every later heartbeat says so, the next one at once.
        The coordinator takes it as a preemption notice for the whole job and
        answers CHECKPOINT_NOW with ``pausing`` to every rank, unless the job is
        being shrunk in place and this rank is one of those removed
        (``Jobs.scale(in_place=True)``): then the ranks resize (``resizing``),
        and this one leaves with the checkpoint step while the others rejoin."""
        self.terminating = True
        self._wake.set()

    def report_stop(self, step: int) -> None:
        """This rank and its peers agreed to stop at ``step`` (they checkpoint
        it, stage it and leave with it): every later heartbeat says so, the
        next one at once. While the job pauses the coordinator takes no
        checkpoint below it as the pause's and tells no rank STOP below it."""
        if step > self.stop_step:
            self.stop_step = step
            self._wake.set()

    def leave(self, finished: bool = False, checkpoint_step: int = 0) -> None:
        """A clean exit: the job re-rendezvous without this member. With
        ``finished`` the member's work is done: the others train on in the
        same generation, and the job ends (state FINISHED) once every member
        finished. With ``checkpoint_step`` (the job is pausing) the member
        stops after staging its shards of that checkpoint: the job's next
        round waits until it is committed, so every rank restores it."""
        self.stop_heartbeats()
        if self.membership is None:
            return
        req = pb.LeaveRequest(
            job=self.job,
            member_id=self.member_id,
            generation=self.membership.generation,
            finished=finished,
            checkpoint_step=checkpoint_step,
        )
        try:
            self.conn.unary(RPC.Leave.path, req, RPC.Leave.response_type, timeout=10.0)
        except StokerError as e:
            if e.code not in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                raise
        self.membership = None

    def _current(self) -> Membership:
        if self.membership is None:
            raise StokerError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{self.member_id} has not joined job {self.job}",
            )
        return self.membership

    def start_heartbeats(
        self, progress: Callable[[], Progress], on_action: Callable[[str, str], None]
    ) -> None:
        """Heartbeats every interval on a daemon thread, reporting
        ``progress()``; every answer other than CONTINUE goes to
        ``on_action(action, reason)`` (RESTART also when the job's generation
        moved on). The first heartbeat goes at once, the next every interval;
        a failing one is retried at the next interval; one that finds the
        job gone reports STOP. notify_terminating() wakes it for a heartbeat
        at once."""
        self.stop_heartbeats()
        m = self._current()
        self._stop = threading.Event()
        # The first beat goes at once: the lease runs from the round's
        # close, and a first beat one interval later left a loaded host
        # only the rest of it.
        self._wake.set()
        interval = max(m.heartbeat_interval_ms, 50) / 1000.0

        def loop(stop: threading.Event) -> None:
            while True:
                self._wake.wait(interval)
                self._wake.clear()
                if stop.is_set():
                    return
                try:
                    action, gen, reason = self.heartbeat(progress())
                except StokerError as e:
                    if e.code == grpc.StatusCode.NOT_FOUND:
                        on_action(STOP, f"job {self.job} is gone")
                        return
                    continue
                if action == CONTINUE and gen != m.generation:
                    action, reason = RESTART, f"generation {gen} replaced {m.generation}"
                if action != CONTINUE and not stop.is_set():  # (not after stop_heartbeats)
                    on_action(action, reason)

        self._thread = threading.Thread(
            target=loop, args=(self._stop,), daemon=True, name=f"stoker-heartbeat-{self.member_id}"
        )
        self._thread.start()

    def stop_heartbeats(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None

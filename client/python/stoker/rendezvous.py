"""The Stoker rendezvous backend for torchrun:
``torchrun --rdzv-backend=stoker --rdzv-endpoint=COORDINATOR --rdzv-id=JOB
--nnodes=MIN:MAX ...``.

torchrun finds it by name through the ``torchrun.handlers`` entry point this
package declares (no wrapper command is needed). Each agent is one member of
the coordinator job ``JOB`` (created with MIN..MAX ranks when it does not
exist): ``next_rendezvous`` joins and parks until the coordinator closes the
round, so a coordinator generation is a torchrun rendezvous round, the
member's rank is the node rank and the round's world size the node count.
The agent then heartbeats on a background thread (reporting its workers'
progress, see ``stoker.elastic``); when a heartbeat learns that a node was
lost or added (RESTART, a newer generation), ``num_nodes_waiting`` turns
positive and torchrun restarts its workers, which rejoin at the new size.
At the end torchrun calls ``shutdown``: an agent whose workers succeeded
(it checked in to torch's exit barrier, which torch enters only then) leaves
as finished, so the others' exit barrier goes on in the same generation and
the job ends FINISHED once every agent finished; any other agent leaves
plainly and the job re-rendezvous without it. A node the job takes no more
(its Join refused: the job stopped or finished, or scaled down without it)
says why on one line and exits 0, as stoker-train does, and an exit barrier
whose generation ended under it passes alone (nobody is left to wait for).

Preemption (issue 23): the agent's first SIGTERM (an eviction signals the
pod's main process, torchrun) is a preemption notice on the next heartbeat
rather than torch's immediate stop of the workers; the workers save at one
step and exit 75 (``TrainingMonitor.exit_resumably``), and the agent leaves
with that step and exits 75 instead of restarting them.

A shrink in place (``Jobs.scale(..., in_place=True)``, issue 23): the queue
controller deletes the pods of the nodes removed, so their agents get
SIGTERM right after ScaleJob. The coordinator takes such a SIGTERM as a
removal, not a notice: every node hears the resize's CHECKPOINT_NOW, the
workers stop at one step and save it (``TrainingMonitor.await_new_round``);
the workers of a node whose agent got SIGTERM exit 75 and their agent leaves
with the step and exits 75 (an index the Job no longer wants is then not
counted completed: the podFailurePolicy ignores 75); the kept agents never
exit: they hear RESTART, torchrun starts new workers, and they restore the
step at the smaller world. An agent that got SIGTERM never joins a round
again: it leaves and exits 75 where it would rejoin, and a SIGTERM while it
is parked in Join ends it with 75 at once (nothing of its own to save).

``rdzv_conf`` keys (all optional). Fields of the job's spec, used only when
this agent creates the job (an existing job keeps its own; 0 or absent: the
coordinator's default): ``heartbeat_interval_ms``, ``heartbeat_misses``,
``last_call_ms``, ``join_timeout_ms`` (how long the coordinator parks a Join
of this job before it answers DEADLINE_EXCEEDED, for every member; default
600000), ``dataset`` and ``checkpoint_storage`` (storage URIs, shown by
``stokerctl job show``). For this agent alone, whoever created the job:
``join_timeout`` (seconds this agent waits for each Join's answer, its
client deadline, retries included; default 600). A Join ends at the earlier
of the two.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn

import grpc
from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.rendezvous import (
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
)

from stoker import elastic
from stoker._proto import Service
from stoker.connection import Connection
from stoker.errors import StokerError
from stoker.membership import CHECKPOINT_NOW, RESTART, STOP, Member, Progress
from stoker.store import StokerStore
from stoker.v1 import coordinator_pb2 as pb

RPC = Service(pb, "Coordinator")  # the RPCs, by name, from the descriptor

# torchrun's agent checks in to its exit barrier (store_util.barrier under
# this prefix, on the rendezvous store) only when its workers succeeded.
try:
    from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID
except ImportError:  # pragma: no cover (the name of torch 2.x)
    _TERMINAL_STATE_SYNC_ID = "torchelastic/agent/terminal_state"
EXIT_BARRIER_KEY = _TERMINAL_STATE_SYNC_ID + "/num_members"
# The signals torch's agent turns into SignalException (stopping the workers
# at once), as launch_agent hands them to the process context.
SIGNALS_ENV = "TORCHELASTIC_SIGNALS_TO_HANDLE"
# Rounds next_rendezvous joins in a row when each ends before its store
# answered (see there); a job that stopped fails the next Join itself.
STALE_REJOINS = 5


class AgentStore(StokerStore):
    """The rendezvous Store handed to torchrun's agent: calls
    ``on_exit_barrier()`` when the agent checks in to its exit barrier, and
    passes that barrier alone when its generation already ended (the node
    was scaled away, the job stopped): it waits for nobody then."""

    def __init__(
        self,
        job: str,
        generation: int,
        address: str | None,
        on_exit_barrier: Callable[[], None],
        timeout: timedelta = timedelta(seconds=300),
    ) -> None:
        super().__init__(job, generation, address, timeout=timeout)
        self._on_exit_barrier = on_exit_barrier
        self._exit_barrier_alone = False

    def add(self, key: str, value: int) -> int:
        if key != EXIT_BARRIER_KEY:
            return super().add(key, value)
        self._on_exit_barrier()
        try:
            return super().add(key, value)
        except StokerError as e:
            if e.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            # The generation ended under the barrier (this node scaled away
            # and told STOP, the job stopped): nobody is left to wait for,
            # and torch would log the error as an ERROR with a traceback.
            self._exit_barrier_alone = True
            print(
                f"stoker: job {self.job}: exit barrier of generation {self.generation} "
                f"passed alone: {e.details}",
                file=sys.stderr,
            )
            return 0  # (not the world size: the barrier sets no key)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        if self._exit_barrier_alone and all(k.startswith(_TERMINAL_STATE_SYNC_ID) for k in keys):
            return
        super().wait(keys, timeout)


def ensure_job(
    conn: Connection, job: str, min_nodes: int, max_nodes: int, conf: dict[str, Any]
) -> None:
    """Creates the job unless it exists (a job made by an operator wins)."""
    spec = pb.JobSpec(
        name=job,
        min_ranks=min_nodes,
        max_ranks=max_nodes,
        heartbeat_interval_ms=int(conf.get("heartbeat_interval_ms", 0)),
        heartbeat_misses=int(conf.get("heartbeat_misses", 0)),
        last_call_ms=int(conf.get("last_call_ms", 0)),
        join_timeout_ms=int(conf.get("join_timeout_ms", 0)),
    )
    if conf.get("dataset"):
        spec.dataset.uri = str(conf["dataset"])
    if conf.get("checkpoint_storage"):
        spec.checkpoint_storage.uri = str(conf["checkpoint_storage"])
    try:
        create = RPC.CreateJob
        conn.unary(create.path, pb.CreateJobRequest(spec=spec), create.response_type, retry=True)
    except StokerError as e:
        if e.code != grpc.StatusCode.ALREADY_EXISTS:
            raise


class StokerRendezvousHandler(RendezvousHandler):
    """torchrun's view of one agent's membership in a coordinator job."""

    def __init__(
        self,
        job: str,
        coordinator: str,
        *,
        local_addr: str | None = None,
        join_timeout: float = 600.0,
    ) -> None:
        self.job = job
        self.coordinator = coordinator
        self.local_addr = local_addr
        self.join_timeout = join_timeout
        self.member = Member(job, coordinator)
        self.control_dir = tempfile.mkdtemp(prefix="stoker-agent-")
        self._lock = threading.Lock()
        self._changed = False  # a heartbeat saw RESTART or a newer generation
        self._closed = False
        self._finished = False  # the agent entered its exit barrier
        self._seq = 0
        self._sigterm = False  # the agent got SIGTERM (catch_sigterm)
        self._joining = False  # parked in a Join (the main thread)

    def get_backend(self) -> str:
        return "stoker"

    @property
    def use_agent_store(self) -> bool:
        return False

    def next_rendezvous(self) -> RendezvousInfo:
        # torch restarts workers that failed, and 75 is a failure to it: a
        # resumable stop ends the agent instead (see _leave_resumably).
        self._leave_resumably()
        if self._sigterm:  # its pod is being deleted: no round of its own
            self._leave_terminated()
        if self._closed:
            from torch.distributed.elastic.rendezvous import RendezvousClosedError

            raise RendezvousClosedError(f"job {self.job} is stopped")
        # The round may end again before this agent's first store call: a
        # member lost right after the close (a node that dies at start, or
        # heartbeats that a loaded host delayed past their lease) ends the
        # generation and its keys, and the store answers FAILED_PRECONDITION.
        # torch would end the agent on that error; join the next round.
        for attempt in range(1, STALE_REJOINS + 1):
            info = self._join_once(last=attempt == STALE_REJOINS)
            if info is not None:
                return info
        raise AssertionError("unreachable")

    def _join_once(self, last: bool) -> RendezvousInfo | None:
        """One Join, then the bootstrap keys (MASTER_ADDR and MASTER_PORT)
        in the round's store; None when that round ended first (unless
        ``last``: then its error)."""
        self.member.stop_heartbeats()
        with self._lock:  # (a RESTART heard before this Join is answered by it)
            self._changed = False
        self._joining = True  # (a SIGTERM now ends the agent: _on_sigterm)
        try:
            m = self.member.join(timeout=self.join_timeout)
        except StokerError as e:
            if e.code != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            self._leave_not_wanted(e.details)  # stopped, finished, or scaled down without it
        finally:
            self._joining = False
        # Workers inherit the agent's environment: they find their
        # generation's store and their control directory here.
        for name in os.listdir(self.control_dir):
            if name.startswith("progress-") or name in (
                elastic.RESUMABLE_FILE,
                elastic.STOP_FILE,
                elastic.RESIZING_FILE,
            ):
                os.unlink(os.path.join(self.control_dir, name))
        with self._lock:  # the answers so far belong to earlier workers
            seen = self._seq
        os.environ.update(
            {
                "STOKER_COORDINATOR": self.coordinator,
                elastic.ENV_JOB: self.job,
                elastic.ENV_GENERATION: str(m.generation),
                elastic.ENV_MEMBER: m.member_id,
                elastic.ENV_CONTROL_DIR: self.control_dir,
                elastic.ENV_ACTIONS_AFTER: str(seen),
            }
        )
        self.member.start_heartbeats(self._progress, self._on_action)
        store = AgentStore(self.job, m.generation, self.coordinator, self._workers_succeeded)
        try:
            bootstrap = RendezvousStoreInfo.build(m.rank, store, self.local_addr)
        except StokerError as e:
            if e.code != grpc.StatusCode.FAILED_PRECONDITION or last:
                raise
            return None
        return RendezvousInfo(store, m.rank, m.world_size, bootstrap)

    def catch_sigterm(self) -> None:
        """Makes the agent's first SIGTERM a preemption notice (call it from
        the main thread, before torch starts the workers; ``create_handler``
        does). A pod is evicted by a SIGTERM to its main process, torchrun,
        whose own handler would stop the workers at once and lose the steps
        since the last checkpoint. Instead the notice rides on the next
        heartbeat (at once), the coordinator answers CHECKPOINT_NOW with
        ``pausing`` to every agent, every worker saves at one step and exits
        75, and the agents leave with that step and exit 75
        (``_leave_resumably``). While the job shrinks in place and this
        node is one it removes, the coordinator answers a resize instead:
        the workers stop at one step, this node's exit 75 after saving it,
        and so does the agent, while the kept nodes rejoin. A SIGTERM while
        parked in Join exits 75 at once. A second SIGTERM is torch's again:
        the workers are stopped and the agent ends. Outside the main thread
        this does nothing."""
        if threading.current_thread() is not threading.main_thread():
            return
        names = os.environ.get(SIGNALS_ENV, "SIGTERM,SIGINT,SIGHUP,SIGQUIT").split(",")
        os.environ[SIGNALS_ENV] = ",".join(n for n in names if n.strip() != "SIGTERM")
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: object) -> None:
        if self._sigterm:
            raise SignalException(
                f"Process {os.getpid()} got signal: {signal.SIGTERM!r} again",
                sigval=signal.SIGTERM,
            )
        self._sigterm = True
        if self._joining:
            # Parked in Join: no worker runs and nothing of this node is
            # unsaved; the Join ends with the process (its call cancelled).
            raise SystemExit(elastic.RESUMABLE_EXIT)
        # The workers see it (TrainingMonitor.terminating): at their next
        # stop step they stop resumably, this node being the one removed.
        with contextlib.suppress(OSError):  # (gone once the agent left)
            elastic.mark_terminating(self.control_dir)
        self.member.notify_terminating()

    def _progress(self) -> Progress:
        """The workers' progress; a worker's SIGTERM and its ranks' agreed
        stop step ride on the heartbeat."""
        if not self.member.terminating and elastic.worker_terminating(self.control_dir):
            self.member.terminating = True
        self.member.report_stop(elastic.stop_step(self.control_dir))  # rides this heartbeat
        return elastic.read_progress(self.control_dir)

    def _on_action(self, action: str, reason: str) -> None:
        if self.member.pausing:
            elastic.mark_pausing(self.control_dir)
        if self.member.resizing and action == CHECKPOINT_NOW:
            elastic.mark_resizing(self.control_dir)
        with self._lock:
            self._seq += 1
            seq = self._seq
            if action == RESTART:
                self._changed = True
            if action == STOP:
                self._closed = True
        elastic.append_action(self.control_dir, seq, action, reason)

    def _workers_succeeded(self) -> None:
        self._finished = True

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        with self._lock:
            return 1 if self._changed and not self._closed else 0

    def get_run_id(self) -> str:
        return self.job

    def shutdown(self) -> bool:
        """Leaves the job: finished when the workers succeeded; with the
        staged step, exiting 75, when they stopped resumably."""
        self._leave_resumably()
        try:
            self.member.leave(finished=self._finished)
        except StokerError:
            return False
        finally:
            shutil.rmtree(self.control_dir, ignore_errors=True)
        return True

    def _leave_resumably(self) -> None:
        """When a worker stopped resumably (the job is pausing and it staged
        the step it names, ``TrainingMonitor.exit_resumably``): leaves the
        job with that step, so its next round waits for the commit, and ends
        the agent with :data:`~stoker.elastic.RESUMABLE_EXIT` (75), never
        restarting the workers. torch calls here before a restart (the
        workers failed with restarts left) and at its end (none left); the
        SystemExit passes torch's handlers (they catch Exception) to
        torchrun's exit status, so a Kubernetes podFailurePolicy that
        ignores 75 applies to the pod."""
        step = elastic.resumable_step(self.control_dir)
        if step is None:
            return
        self._closed = True
        try:
            self.member.leave(checkpoint_step=step)
        finally:
            shutil.rmtree(self.control_dir, ignore_errors=True)
        raise SystemExit(elastic.RESUMABLE_EXIT)

    def _leave_not_wanted(self, why: str) -> NoReturn:
        """The job refused this node's Join with FAILED_PRECONDITION: it
        was stopped or finished, or scaled down and this node is not needed
        (a paused job parks a Join instead). The agent says why on one line,
        leaves and exits 0 with nothing to restart, as stoker-train does
        ("not needed any more"). The error ended it with a traceback and
        exit status 1 before, which a Kubernetes Job counts as a failed
        pod. A node a shrink in place removes got SIGTERM and exits 75
        before it joins (``_leave_terminated``)."""
        print(f"stoker: job {self.job} takes this node no more: {why}; leaving", file=sys.stderr)
        self._leave_and_exit(0)

    def _leave_terminated(self) -> NoReturn:
        """The agent got SIGTERM and its workers ended without a resumable
        stop (torch stopped them for a round, or they failed): its pod is
        being deleted, so it joins no round; it leaves and exits
        :data:`~stoker.elastic.RESUMABLE_EXIT` (75), so a Job that deleted it
        does not count its index completed."""
        self._leave_and_exit(elastic.RESUMABLE_EXIT)

    def _leave_and_exit(self, status: int) -> NoReturn:
        """Leaves the job for good (an error is fine: the coordinator
        learns it from the lease, or the node held no seat) and ends the
        agent with status, past torch's handlers (they catch Exception)."""
        self._closed = True
        with contextlib.suppress(StokerError):
            self.member.leave()
        shutil.rmtree(self.control_dir, ignore_errors=True)
        raise SystemExit(status)


def create_handler(params: RendezvousParameters) -> StokerRendezvousHandler:
    """torchrun's factory: the job is ``--rdzv-id``, the coordinator
    ``--rdzv-endpoint``, MIN:MAX of ``--nnodes`` bound the job's ranks."""
    conf = dict(params.config)
    conn = Connection(params.endpoint)
    ensure_job(conn, params.run_id, params.min_nodes, params.max_nodes, conf)
    conn.close()
    handler = StokerRendezvousHandler(
        params.run_id,
        params.endpoint,
        local_addr=params.local_addr,
        join_timeout=float(conf.get("join_timeout", 600)),
    )
    handler.catch_sigterm()
    return handler

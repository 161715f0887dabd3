"""``stoker.elastic``: the coordinator as PyTorch's rendezvous, seen from a
training process.

- :func:`init_process_group` joins the process group of the current
  generation through a :class:`~stoker.store.StokerStore` (under torchrun
  with ``--rdzv-backend=stoker``, from the environment the agent set).
- :class:`TrainingMonitor` carries the loop's step, loss and tokens/s to the
  coordinator's heartbeats and brings back CHECKPOINT_NOW, STOP and RESTART;
  with ``catch_sigterm()`` a SIGTERM (the pod evicted) becomes a preemption
  notice for the whole job, and ``pausing`` says that a CHECKPOINT_NOW is
  the last before a resumable stop: save, then exit :data:`RESUMABLE_EXIT`
  (75), never 0, which a Kubernetes Job would count as a completed index.
  ``resizing`` says that a CHECKPOINT_NOW is a resize's (ScaleJob): every
  rank stops at one step, saves it and calls :meth:`TrainingMonitor.
  await_new_round`, which ends a rank whose node got SIGTERM (a shrink in
  place removes it: its pod is being deleted) with 75 and keeps the others
  until the new round (under torchrun: until the agent starts new workers).

Under torchrun the member of the job is the node's agent (its rendezvous
handler, ``stoker.rendezvous``, heartbeats on a background thread); workers
talk to it through a control directory the agent names in
``STOKER_CONTROL_DIR``: each local worker writes ``progress-<local rank>.json``
(replaced atomically), the agent appends the coordinator's answers to
``actions`` (one line each: ``seq action reason``, seq counting up over the
agent's life). The file outlives a restart of the workers, so the agent also
names in ``STOKER_ACTIONS_AFTER`` the last seq it had written when it started
them: a worker's monitor hands out only later lines, each once, and an answer
reaches the one worker generation that was running when it came. A process
that is a member itself (no torchrun) gets the same monitor over its own
``Member``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from datetime import timedelta
from typing import NoReturn

import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore

from stoker.membership import CONTINUE, RESTART, STOP, Member, Progress
from stoker.store import StokerStore

ENV_JOB = "STOKER_JOB"
ENV_GENERATION = "STOKER_GENERATION"
ENV_MEMBER = "STOKER_MEMBER"
ENV_CONTROL_DIR = "STOKER_CONTROL_DIR"
ENV_ACTIONS_AFTER = "STOKER_ACTIONS_AFTER"
ACTIONS_FILE = "actions"
# A process of the node got SIGTERM: a worker (the agent tells the
# coordinator) or the agent itself (its workers stop resumably at the next
# stop step: a shrink in place removes the node, or the job pauses).
TERMINATING_FILE = "terminating"
PAUSING_FILE = "pausing"  # the agent heard that the job is pausing
RESIZING_FILE = "resizing"  # the agent heard a resize's CHECKPOINT_NOW (this round)
RESUMABLE_FILE = "resumable"  # a worker stopped resumably after staging this step
STOP_FILE = "stop"  # the step a worker's ranks agreed to stop at (report_stop)
# Exit status of a resumable stop (EX_TEMPFAIL): the job is paused or
# preempted, or a shrink in place removed this rank, and it saved its
# checkpoint; start it again to resume (or to grow the job back).
RESUMABLE_EXIT = 75
# How long await_new_round waits for the coordinator's verdict (as the C
# trainer's wait after a stop); then the process fails and torchrun restarts
# its workers on a new round.
NEW_ROUND_WAIT_S = 120.0
_LIVE_STORES: list[StokerStore] = []


def worker_store(timeout: timedelta = timedelta(seconds=300)) -> StokerStore:
    """The Store of this worker's generation, from the agent's environment."""
    job, gen = os.environ.get(ENV_JOB), os.environ.get(ENV_GENERATION)
    if not job or not gen:
        raise RuntimeError(
            f"{ENV_JOB} / {ENV_GENERATION} are not set: run under torchrun "
            "--rdzv-backend=stoker, or build a StokerStore yourself"
        )
    return StokerStore(job, int(gen), timeout=timeout)


def init_process_group(
    backend: str = "gloo", timeout: timedelta = timedelta(seconds=300)
) -> StokerStore:
    """``torch.distributed.init_process_group`` over the coordinator's KV,
    with torchrun's RANK and WORLD_SIZE. Keys go under ``pg/``, apart from
    the agents' own keys in the same generation. Nothing else may tell
    workers of different restarts apart: every restart is a new generation
    (the agents rejoin), whose keys start empty, while torchrun's
    ``TORCHELASTIC_RESTART_COUNT`` differs between agents of one generation
    (it counts restarts after a failed worker, not those after a membership
    change), so workers that looked for each other under it never met."""
    store = worker_store(timeout)
    _LIVE_STORES.append(store)  # see stoker.store: C++ needs the Python object
    prefixed = PrefixStore("pg", store)
    dist.init_process_group(
        backend,
        store=prefixed,
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=timeout,
    )
    return store


class TrainingMonitor:
    """The training loop's line to the coordinator.

    ``report(step, loss, tokens_per_s)`` after each step (cheap: a small
    file replaced, or a field set); ``poll()`` returns the answers that came
    since the last poll, oldest first, as ``(action, reason)`` pairs. With a
    control directory, lines of the actions file whose seq is at most
    ``actions_after`` (answers to earlier worker generations) are skipped.
    """

    def __init__(
        self,
        control_dir: str | None = None,
        member: Member | None = None,
        actions_after: int = 0,
    ) -> None:
        self._dir = control_dir
        self._member = member
        self._offset = 0
        self._seen = actions_after  # the last seq handed out (or skipped)
        self._lock = threading.Lock()
        self._pending: list[tuple[str, str]] = []
        self._progress = Progress()
        self._sigterm = False
        self._told = False
        if member is not None:
            member.start_heartbeats(lambda: self._progress, self._queue)

    @classmethod
    def from_env(cls) -> TrainingMonitor:
        """The monitor torchrun's Stoker agent set up for this worker."""
        d = os.environ.get(ENV_CONTROL_DIR)
        if not d:
            raise RuntimeError(f"{ENV_CONTROL_DIR} is not set: not a worker of a Stoker agent")
        return cls(control_dir=d, actions_after=int(os.environ.get(ENV_ACTIONS_AFTER) or 0))

    def _queue(self, action: str, reason: str) -> None:
        with self._lock:
            self._pending.append((action, reason))

    def report(self, step: int, loss: float = 0.0, tokens_per_s: float = 0.0) -> None:
        self._progress = Progress(step, loss, tokens_per_s)
        if self._dir is None:
            return
        local = os.environ.get("LOCAL_RANK", "0")
        path = os.path.join(self._dir, f"progress-{local}.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"step": step, "loss": loss, "tokens_per_s": tokens_per_s}, f)
        os.replace(tmp, path)

    def catch_sigterm(self) -> None:
        """Installs a SIGTERM handler (call it from the main thread) that
        only notes the signal; the next ``poll()`` (a step boundary) tells
        the coordinator, a preemption notice for the whole job, and every
        rank then hears CHECKPOINT_NOW with :attr:`pausing`."""

        def handler(signum: int, frame: object) -> None:
            self._sigterm = True

        signal.signal(signal.SIGTERM, handler)

    @property
    def terminating(self) -> bool:
        """This process got SIGTERM (``catch_sigterm``), or, under torchrun,
        a process of its node did (the agent: the pod's main process, which
        Kubernetes signals when it deletes the pod)."""
        if self._sigterm:
            return True
        return self._dir is not None and worker_terminating(self._dir)

    @property
    def pausing(self) -> bool:
        """The job is pausing or paused (an operator's pause, a preemption):
        a CHECKPOINT_NOW is the generation's last (save, then stop) and a stop
        is resumable (exit :data:`RESUMABLE_EXIT`). A rank that got SIGTERM
        itself stops resumably too."""
        if self._sigterm:
            return True
        if self._member is not None:
            return self._member.pausing
        return self._dir is not None and os.path.exists(os.path.join(self._dir, PAUSING_FILE))

    @property
    def resizing(self) -> bool:
        """This generation's CHECKPOINT_NOW is a resize's (ScaleJob): the
        job's next round opens on that checkpoint once every rank said the
        step it stops at (:meth:`report_stop`); a rank that never says one
        waits for the scale's deadline instead."""
        if self._member is not None:
            return self._member.resizing
        return self._dir is not None and os.path.exists(os.path.join(self._dir, RESIZING_FILE))

    def poll(self) -> list[tuple[str, str]]:
        if self._sigterm and not self._told:
            self._told = True
            self._tell_terminating()
        if self._dir is not None:
            self._read_actions()
        with self._lock:
            out, self._pending = self._pending, []
        return out

    def _read_actions(self) -> None:
        path = os.path.join(self._dir or "", ACTIONS_FILE)
        try:
            if os.path.getsize(path) <= self._offset:
                return
            with open(path, encoding="utf-8") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind("\n") + 1  # only whole lines
        self._offset += len(data[:end].encode())
        for line in data[:end].splitlines():
            seq, action, reason = ([*line.split(" ", 2), "", ""])[:3]
            if not seq.isdigit() or int(seq) <= self._seen:
                continue  # an earlier generation's answer, or a torn line
            self._seen = int(seq)
            if action and action != CONTINUE:
                self._queue(action, reason)

    def _tell_terminating(self) -> None:
        if self._member is not None:
            self._member.notify_terminating()
        elif self._dir is not None:  # the agent sends it with its next heartbeat
            with open(os.path.join(self._dir, TERMINATING_FILE), "w", encoding="utf-8") as f:
                f.write(os.environ.get("LOCAL_RANK", "0") + "\n")

    def report_stop(self, step: int) -> None:
        """Every rank agreed to stop at ``step`` (a checkpoint-then-stop: the
        job is pausing, or a resize's CHECKPOINT_NOW, :attr:`resizing`): the
        coordinator hears it with the next heartbeat (at
        once for a member; the agent's next one under torchrun), so that a
        checkpoint below ``step`` committing meanwhile (a periodic save on
        its way when the notice came) is not taken for the pause's, and no
        rank is told STOP below it. Call it as soon as the ranks agreed,
        before saving."""
        if self._member is not None:
            self._member.report_stop(step)
        elif self._dir is not None:
            self._write_step(STOP_FILE, step)

    def exit_resumably(self, step: int) -> NoReturn:
        """Ends this process with :data:`RESUMABLE_EXIT` once the job's last
        checkpoint (``step``) is staged: the job is pausing (a CHECKPOINT_NOW
        while :attr:`pausing`). The member leaves with that step, so the
        job's next round waits until it is committed and every rank restores
        it: this process's own ``Leave``, or, under torchrun, the agent's,
        which finds the step in the control directory, leaves with it
        instead of restarting its workers and exits 75 itself. Save that
        checkpoint with ``StokerWriter(..., detach=True)``: its commit is
        then accepted once every rank's bytes are staged, and the service
        finishes it after the processes are gone (no wait for the upload
        within the pod's grace period)."""
        if self._member is not None:
            self._member.leave(checkpoint_step=step)
        elif self._dir is not None:
            self._write_step(RESUMABLE_FILE, step)
        raise SystemExit(RESUMABLE_EXIT)

    def await_new_round(self, step: int, timeout: float = NEW_ROUND_WAIT_S) -> str:
        """After a resize's stop (:attr:`resizing`): every rank stopped at
        ``step`` and its checkpoint is staged (committed, on the rank that
        commits). Call it on every rank, with no collective left in flight
        (destroy the process group first). The verdict:

        - this rank's node got SIGTERM (:attr:`terminating`: a shrink in
          place removes it, its pod is being deleted), or the job is pausing:
          :meth:`exit_resumably` with ``step`` (exit 75), so the job's next
          round opens without it and a Kubernetes Job does not count its
          index completed;
        - RESTART (the new round is open): under torchrun the agent stops
          this worker and starts new ones at the round's world size, which
          restore ``step``, so this waits to be stopped; a process that is a
          member itself gets RESTART back and rejoins;
        - STOP (the job was stopped): returns STOP.

        With no verdict in ``timeout`` seconds the process exits 1: torchrun
        counts a failure and restarts its workers on a new round."""
        deadline = time.monotonic() + timeout
        restart = False
        while time.monotonic() < deadline:
            actions = [a for a, _ in self.poll()]
            if self.terminating or self.pausing:
                self.exit_resumably(step)
            if STOP in actions:
                return STOP
            if RESTART in actions:
                if self._dir is None:
                    return RESTART
                restart = True  # the agent stops this worker next
            time.sleep(0.05)
        why = "the agent did not restart it" if restart else "no new round"
        raise SystemExit(f"stopped at step {step} for a resize: {why} in {timeout:.0f} s")

    def _write_step(self, name: str, step: int) -> None:
        """The agent's control file ``name`` holding ``step``, replaced whole."""
        assert self._dir is not None
        path = os.path.join(self._dir, name)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(f"{step}\n")
        os.replace(tmp, path)

    def close(self) -> None:
        if self._member is not None:
            self._member.stop_heartbeats()


def read_progress(control_dir: str) -> Progress:
    """The node's progress from its workers' files: the lowest step, the
    mean loss and the summed tokens/s (what the agent's heartbeat sends)."""
    steps, losses, tps = [], [], 0.0
    for name in os.listdir(control_dir):
        if not (name.startswith("progress-") and name.endswith(".json")):
            continue
        try:
            with open(os.path.join(control_dir, name), encoding="utf-8") as f:
                p = json.load(f)
        except (OSError, ValueError):
            continue  # being replaced, or a worker that died mid-write
        steps.append(int(p.get("step", 0)))
        losses.append(float(p.get("loss", 0.0)))
        tps += float(p.get("tokens_per_s", 0.0))
    if not steps:
        return Progress()
    return Progress(min(steps), sum(losses) / len(losses), tps)


def worker_terminating(control_dir: str) -> bool:
    """Whether a worker of the node got SIGTERM (the agent's side of
    ``TrainingMonitor.catch_sigterm``)."""
    return os.path.exists(os.path.join(control_dir, TERMINATING_FILE))


def resumable_step(control_dir: str) -> int | None:
    """The step a worker of the node staged before it stopped resumably
    (``TrainingMonitor.exit_resumably``), or None."""
    try:
        with open(os.path.join(control_dir, RESUMABLE_FILE), encoding="utf-8") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    return int(text) if text.isdigit() else None


def stop_step(control_dir: str) -> int:
    """The step the node's workers agreed to stop at
    (``TrainingMonitor.report_stop``), or 0 (the agent's side)."""
    try:
        with open(os.path.join(control_dir, STOP_FILE), encoding="utf-8") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return 0
    return int(text) if text.isdigit() else 0


def mark_terminating(control_dir: str) -> None:
    """The agent got SIGTERM: its workers' ``TrainingMonitor.terminating``."""
    open(os.path.join(control_dir, TERMINATING_FILE), "w", encoding="utf-8").close()


def mark_pausing(control_dir: str) -> None:
    """The agent's side of ``TrainingMonitor.pausing``: written before the
    action line that said so."""
    open(os.path.join(control_dir, PAUSING_FILE), "w", encoding="utf-8").close()


def mark_resizing(control_dir: str) -> None:
    """The agent's side of ``TrainingMonitor.resizing``: written before the
    action line that said so, removed when the agent joins the next round."""
    open(os.path.join(control_dir, RESIZING_FILE), "w", encoding="utf-8").close()


def append_action(control_dir: str, seq: int, action: str, reason: str) -> None:
    """The agent's side of ``poll``: one line per coordinator answer; seq
    counts up from 1 over the agent's life."""
    line = f"{seq} {action} {' '.join(reason.split())}\n"
    with open(os.path.join(control_dir, ACTIONS_FILE), "a", encoding="utf-8") as f:
        f.write(line)

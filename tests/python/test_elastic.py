"""The PyTorch trainer (trainer/python/train_gpt.py) under torchrun with the
Stoker rendezvous, against the three real daemons: a node lost (agent and
worker killed with SIGKILL) makes the survivors re-rendezvous at a smaller
world size and restore the last checkpoint, after which every step matches
the steps the bigger world had trained; the coordinator's CHECKPOINT_NOW and
STOP reach the training loop; heartbeats carry step and loss to `job show`."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, Daemon, binary

from stoker.elastic import RESUMABLE_EXIT
from stoker.jobs import Jobs

sys.path.insert(0, str(ROOT / "deploy/local"))
import summary  # the main job's Explain check

LINE = re.compile(r"^step (\d+) loss (\S+) tokens/s \S+ world (\d+)$", re.M)


def corpus(tmp: pathlib.Path) -> pathlib.Path:
    """About 300 KB of licence text in 4 files: enough 4 KiB units for
    every lane of the loader."""
    d = tmp / "corpus"
    d.mkdir()
    texts = [
        p.read_text(errors="replace")
        for p in sorted(pathlib.Path("/usr/share/common-licenses").glob("*"))
        if p.is_file()
    ]
    for i in range(4):
        (d / f"part-{i}.txt").write_text("".join(texts[i::4]))
    return d


class Agents:
    """torchrun agents, each in its own process group (a node)."""

    def __init__(self, daemons, tmp: pathlib.Path, job: str) -> None:
        self.tmp, self.job = tmp, job
        self.env = dict(
            os.environ,
            OMP_NUM_THREADS="1",
            STOKER_COORDINATOR=daemons["coordinator"].addr,
            STOKER_DATALOADER=daemons["dataloader"].addr,
            STOKER_CHECKPOINT=daemons["checkpoint"].addr,
        )
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[pathlib.Path] = []
        self.corpus = corpus(tmp)

    def ctl(self, *args: str) -> str:
        out = subprocess.run(
            [str(binary("stokerctl")), "--coordinator", self.env["STOKER_COORDINATOR"], *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def job_show(self) -> dict:
        return json.loads(self.ctl("--json", "job", "show", self.job))

    def start(self, n: int, nnodes: str, steps: int, every: int) -> None:
        argv = [str(ROOT / ".venv/bin/torchrun"), f"--nnodes={nnodes}", "--nproc-per-node=1"]
        argv += ["--rdzv-backend=stoker", f"--rdzv-endpoint={self.env['STOKER_COORDINATOR']}"]
        argv += [f"--rdzv-id={self.job}", "--max-restarts=3", "--monitor-interval=0.2"]
        argv += [str(ROOT / "trainer/python/train_gpt.py"), "--job", self.job]
        argv += ["--corpus", str(self.corpus), "--steps", str(steps)]
        argv += ["--checkpoint-every", str(every), "--seq-len", "32", "--global-batch", "6"]
        argv += ["--channels", "32"]
        for _ in range(n):
            log = self.tmp / f"agent-{len(self.logs)}.log"
            self.logs.append(log)
            with open(log, "wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        env=self.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def text(self) -> str:
        return "".join(p.read_text(errors="replace") for p in self.logs if p.exists())

    def wait_log(self, pattern: str, seconds: float) -> re.Match[str]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            m = re.search(pattern, self.text(), re.M)
            if m:
                return m
            assert any(p.poll() is None for p in self.procs), self.text()[-3000:]
            time.sleep(0.2)
        self.dump_stacks()
        raise AssertionError(
            f"no {pattern!r} in {seconds} s:\n{self.text()[-6000:]}\n{self.coordinator_view()}"
        )

    def dump_stacks(self) -> None:
        """SIGUSR1 to every live worker: train_gpt.py prints each of its
        threads' stacks to the agent's log (where a hang hangs)."""
        for p in self.procs:
            if p.poll() is not None:
                continue
            workers = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True, text=True)
            for w in workers.stdout.split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(w), signal.SIGUSR1)
        time.sleep(1.0)

    def coordinator_view(self) -> str:
        """The job as the coordinator holds it (state, generation, reason,
        members, joins waiting): what a hang in a re-rendezvous leaves behind
        the agents' last lines."""
        try:
            return "coordinator:\n" + self.ctl("job", "show", self.job)
        except (AssertionError, subprocess.SubprocessError) as e:
            return f"(coordinator view unavailable: {e})"

    def kill_node(self, i: int) -> None:
        """SIGKILL to the agent's process group and to each worker's: torch
        starts every worker in a session of its own."""
        pid = self.procs[i].pid
        workers = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
        os.killpg(pid, signal.SIGKILL)
        for w in workers.stdout.split():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(w), signal.SIGKILL)
        self.procs[i].wait()

    def wait_all(self, seconds: float, skip: tuple[int, ...] = ()) -> None:
        for i, p in enumerate(self.procs):
            if i not in skip:
                assert p.wait(timeout=seconds) == 0, self.text()[-4000:]

    def close(self) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is None:
                self.kill_node(i)


def test_a_lost_node_restores_at_the_smaller_world_and_trains_on(daemons, tmp_path):
    a = Agents(daemons, tmp_path, "el")
    a.ctl(
        "job",
        "create",
        "el",
        "--min",
        "2",
        "--max",
        "3",
        "--heartbeat",
        "300ms",
        "--misses",
        "3",
        "--last-call",
        "1s",
    )
    try:
        a.start(3, "2:3", steps=40, every=10)
        a.wait_log(r"^checkpoint step 10 committed", 240)
        # Killed between checkpoints (by step 11 to 13, far from 20): the
        # survivors restore step 10 and train again steps world 3 trained.
        a.wait_log(r"^step 1[1-3] loss .* world 3$", 60)
        a.kill_node(2)
        m = a.wait_log(r"^restored step (\d+) at world 2$", 240)
        restored = int(m.group(1))
        a.wait_all(300, skip=(2,))
    finally:
        a.close()
    runs: dict[int, dict[int, float]] = {}
    for step, loss, world in LINE.findall(a.text()):
        runs.setdefault(int(world), {})[int(step)] = float(loss)
    assert restored >= 10 and max(runs[2]) == 40, sorted(runs[2])
    # Steps trained at both sizes (the ones retrained after the restore) must
    # give the same loss. They are absent when a loaded host trained on past
    # the next checkpoint (step 20) before the kill landed, so that the
    # survivors restore the step world 3 ended at; the restore point and the
    # steps after it are checked below either way.
    again = [s for s in runs[2] if s in runs[3]]
    for s in again:
        assert abs(runs[2][s] - runs[3][s]) <= 1e-4 * abs(runs[3][s]), (s, runs[2][s], runs[3][s])
    assert min(runs[2]) == restored + 1


def test_checkpoint_now_and_stop_reach_the_loop(daemons, tmp_path):
    a = Agents(daemons, tmp_path, "ctl")
    # The coordinator asks for a checkpoint every 6 steps; the trainer's own
    # period (1000) never comes.
    a.ctl(
        "job",
        "create",
        "ctl",
        "--min",
        "1",
        "--max",
        "1",
        "--heartbeat",
        "200ms",
        "--last-call",
        "100ms",
        "--checkpoint-every",
        "6",
    )
    try:
        a.start(1, "1", steps=100000, every=1000)
        a.wait_log(r"^checkpoint step \d+ committed", 240)
        job = a.job_show()
        assert job["members"][0]["step"] > 0 and job["members"][0]["loss"] > 0, job
        a.ctl("job", "stop", "ctl", "--force")
        m = a.wait_log(r"^stopped by the coordinator at step (\d+)", 60)
        a.wait_all(120)
    finally:
        a.close()
    stopped = int(m.group(1))
    listed = subprocess.run(
        [
            str(binary("stokerctl")),
            "--checkpoint",
            a.env["STOKER_CHECKPOINT"],
            "--json",
            "checkpoint",
            "list",
            "ctl",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    steps = [c["step"] for c in json.loads(listed.stdout)["checkpoints"]]
    assert any(s % 6 >= 0 and s < 1000 for s in steps if s != stopped), steps
    assert stopped in steps, (stopped, steps)
    assert stopped < 100000


def test_the_trainer_creates_its_loader_on_every_part(daemons, tmp_path):
    """STOKER_DATALOADER naming two parts (as the Kubernetes job does): the
    trainer creates its loader on each part and trains from both."""
    parts = []
    for i in range(2):
        (tmp_path / f"part-{i}").mkdir()
        parts.append(
            Daemon("dataloader", tmp_path / f"part-{i}", "--part", f"{i}/2", data_roots=[tmp_path])
        )
    a = Agents(daemons, tmp_path, "two")
    a.env["STOKER_DATALOADER"] = ",".join(p.addr for p in parts)
    try:
        a.start(1, "1", steps=4, every=1000)
        a.wait_all(240)
        with Jobs(dataloader=a.env["STOKER_DATALOADER"]) as ops:
            shown = [(ld.part, ld.parts) for ld in ops.loader_parts("two")]
    finally:
        a.close()
        for p in parts:
            p.stop()
    assert re.search(r"^step 4 loss .* world 1$", a.text(), re.M), a.text()[-3000:]
    assert shown == [(0, 2), (1, 2)], shown


def test_a_resize_opens_its_round_on_its_checkpoint(daemons, tmp_path):
    """``stokerctl job scale`` from 2 ranks to 1 under torchrun: the
    coordinator answers the workers CHECKPOINT_NOW with resizing; the ranks
    say the step they stop at (``report_stop``) and save it, and the round
    opens on that checkpoint ("scaled"), not at the resize's deadline (10
    heartbeats, "scaled (no checkpoint in time)"). Every rank stops at that
    step (``await_new_round``): world 2 trains no step past it, so none is
    trained twice; the rank kept restores it at world 1 and trains on from
    the next step. The node not needed exits 0 with one line saying why and
    no traceback."""
    a = Agents(daemons, tmp_path, "rs")
    a.ctl("job", "create", "rs", "--min", "1", "--max", "2", "--heartbeat", "1s")
    try:
        a.start(2, "1:2", steps=100000, every=100000)
        a.wait_log(r"^step 5 loss .* world 2$", 240)
        a.ctl("job", "scale", "rs", "1")
        m = a.wait_log(r"^restored step (\d+) at world 1$", 240)
        restored = int(m.group(1))
        a.wait_log(rf"^step {restored + 10} loss .* world 1$", 240)
        # The node not needed leaves and exits 0 with one line, no traceback
        # (an exit 1 is a failed pod to a Job).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and all(p.poll() is None for p in a.procs):
            time.sleep(0.2)
        surplus = [i for i, p in enumerate(a.procs) if p.poll() is not None]
        assert len(surplus) == 1, [p.poll() for p in a.procs]
        log = a.logs[surplus[0]].read_text(errors="replace")
        assert a.procs[surplus[0]].returncode == 0, log[-3000:]
        # Refused its Join, or told STOP and passing its exit barrier alone
        # (which of the two depends on who heard of the resize first).
        said = r"stoker: job rs(: exit barrier .* passed alone| takes this node no more: .*needed)"
        assert re.search(said, log), log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        a.ctl("job", "stop", "rs", "--force")
        for p in a.procs:
            p.wait(timeout=120)
    finally:
        a.close()
    # The kept node's exit barrier at the stop, its generation ended: passed
    # alone, not torch's ERROR traceback.
    assert "Error waiting on exit barrier" not in a.text(), a.text()[-3000:]
    with Jobs(a.env["STOKER_COORDINATOR"]) as jobs:
        rounds = [e.message for e in jobs.watch("rs", idle_timeout=0.5) if e.type == "ROUND_OPENED"]
    assert "scaled" in rounds and "scaled (no checkpoint in time)" not in rounds, rounds
    runs: dict[int, dict[int, float]] = {}
    for step, loss, world in LINE.findall(a.text()):
        runs.setdefault(int(world), {})[int(step)] = float(loss)
    assert min(runs[1]) == restored + 1, sorted(runs[1])
    assert max(runs[2]) == restored, (restored, sorted(runs[2]))


def uninterrupted_losses(
    daemons, tmp_path: pathlib.Path, job: str, spec: list[str], nnodes: str, steps: int
) -> dict[int, float]:
    """The reference: rank 0's loss at every step 1..steps of two torchrun
    nodes (``--nnodes nnodes``) of a job created with spec, never
    interrupted (in tmp_path/ref)."""
    (tmp_path / "ref").mkdir()
    ref = Agents(daemons, tmp_path / "ref", job)
    ref.ctl("job", "create", job, *spec)
    try:
        ref.start(2, nnodes, steps=steps, every=1000)
        ref.wait_all(300)
    finally:
        ref.close()
    losses = {int(s): float(loss) for s, loss, _ in LINE.findall(ref.text())}
    assert sorted(losses) == list(range(1, steps + 1)), sorted(losses)
    return losses


def shrink_losses(text: str) -> list[tuple[int, float, int]]:
    """Every step line rank 0 printed: (step, loss, world), in order."""
    return [(int(s), float(loss), int(w)) for s, loss, w in LINE.findall(text)]


def agent_of_rank(a: Agents, rank: int) -> int:
    """The index in ``a.procs`` of the agent seated at ``rank``: a member's
    id holds its process's pid (``stoker.membership.default_member_id``)."""
    for m in a.job_show()["members"]:
        if int(m.get("rank", 0)) == rank:
            for i, p in enumerate(a.procs):
                if f"-{p.pid}-" in m["member_id"]:
                    return i
    raise AssertionError(f"no agent at rank {rank}: {a.job_show()}")


@pytest.mark.parametrize(
    ("sigterm", "removed_rank"),
    [("before_the_vote", 1), ("after_the_vote", 1), ("before_the_vote", 0)],
)
def test_a_shrink_in_place_keeps_the_kept_agent_and_trains_every_step_once(
    daemons, tmp_path, monkeypatch, sigterm, removed_rank
):
    """``stokerctl job scale JOB 1 --in-place`` under torchrun, then SIGTERM
    to the agent at ``removed_rank`` (torchrun is the pod's main process;
    the queue controller's Indexed Job deletes the pod of its highest index
    right after ScaleJob, whose node rank may be 0, the rank that commits):
    ``before_the_vote`` at once, as the controller does (the SIGTERM reaches
    the coordinator before the workers vote their stop step; the agent's
    heartbeat goes at once, the workers hear the resize only with the next
    one, 300 ms), ``after_the_vote`` once rank 0 said the step it stops at. The
    job never pauses (no PREEMPTED, no PAUSED) and logs one SHRUNK "(in
    place)" at the step every rank stopped at; the removed agent exits 75
    (the podFailurePolicy's Ignore: its index is not counted completed)
    within a minute of its SIGTERM; the kept agent never exits until the
    job is done (its worker restarts once: torchrun starts new workers on a
    new round) and its worker restores that step at world 1; every step is
    trained once, at world 2 up to the stop step and at world 1 after it,
    with the losses of an uninterrupted two-node run within 1e-4 relative;
    the loader's plan (Explain) serves no token twice and skips none; the
    job ends FINISHED."""
    spec = ["--min", "1", "--max", "2", "--heartbeat", "300ms", "--misses", "10"]
    spec += ["--last-call", "1s"]
    steps = 40
    uninterrupted = uninterrupted_losses(daemons, tmp_path, "sh-ref", spec, "1:2", steps)

    (tmp_path / "sh").mkdir()
    a = Agents(daemons, tmp_path / "sh", "sh")
    a.ctl("job", "create", "sh", *spec)
    try:
        a.start(2, "1:2", steps=steps, every=1000)
        a.wait_log(r"^step [4-9] loss .* world 2$", 240)
        removed = agent_of_rank(a, removed_rank)
        kept = 1 - removed
        a.ctl("job", "scale", "sh", "1", "--in-place")
        if sigterm == "after_the_vote":
            a.wait_log(r"^resizing: every rank stops at step \d+", 60)
        os.kill(a.procs[removed].pid, signal.SIGTERM)  # as the kubelet does
        sent = time.monotonic()
        code = a.procs[removed].wait(timeout=120)
        took = time.monotonic() - sent
        assert code == RESUMABLE_EXIT, (code, a.text()[-4000:])
        assert took < 60, took
        assert a.procs[kept].poll() is None, a.text()[-4000:]
        restored = int(a.wait_log(r"^restored step (\d+) at world 1$", 240).group(1))
        assert a.procs[kept].wait(timeout=300) == 0, a.text()[-4000:]
        job = a.job_show()
    finally:
        a.close()
    assert job["state"] == "FINISHED", job
    with Jobs(a.env["STOKER_COORDINATOR"]) as jobs:
        evs = list(jobs.watch("sh", idle_timeout=0.5))
    types = [e.type for e in evs]
    assert "PREEMPTED" not in types and "PAUSED" not in types, types
    sized = [(e.type, e.step, e.message) for e in evs if e.type in ("SHRUNK", "GROWN")]
    want = f"shrunk from 2 to 1 rank at step {restored} (in place)"
    assert sized == [("SHRUNK", restored, want)], sized
    # The kept agent's worker restarted once (a new round), the agent not.
    kept_log = a.logs[kept].read_text(errors="replace")
    assert kept_log.count(f"restored step {restored} at world 1") == 1, kept_log[-3000:]
    # Every step once: at world 2 up to the stop step, at world 1 after it
    # (by step: the logs are read agent by agent, whichever was rank 0).
    trained = sorted(shrink_losses(a.text()))
    assert [s for s, _, _ in trained] == list(range(1, steps + 1)), [s for s, _, _ in trained]
    worlds = [w for _, _, w in trained]
    assert worlds == [2] * restored + [1] * (steps - restored), worlds
    for s, loss, _ in trained:
        want_loss = uninterrupted[s]
        assert abs(loss - want_loss) <= 1e-4 * abs(want_loss), (s, loss, want_loss)
    monkeypatch.setenv("STOKER_DATALOADER", a.env["STOKER_DATALOADER"])  # (summary's Explain)
    assert summary.check_no_repeats(str(binary("stokerctl")), "sh", steps), "data repeated"

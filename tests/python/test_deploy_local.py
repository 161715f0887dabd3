"""The local scripts' shared steps (deploy/local/common.sh) that touch
processes: ``kill_node`` loses a whole torchrun node, agent and workers,
although torch starts each worker in a session of its own."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

from conftest import ROOT

WORKER = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(600)\n"


def gone(pid: int) -> bool:
    """Dead or a zombie (an orphan nobody reaps here is dead all the same)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_kill_node_kills_the_agent_and_its_worker(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    pid_file = tmp_path / "worker.pid"
    torchrun = pathlib.Path(sys.executable).with_name("torchrun")
    argv = [str(torchrun), "--standalone", "--nproc-per-node=1", "--monitor-interval=0.2"]
    argv += ["--no-python", sys.executable, str(tmp_path / "worker.py"), str(pid_file)]
    agent = subprocess.Popen(
        argv,
        start_new_session=True,  # as main-job-pytorch.sh's setsid
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text()):
            assert agent.poll() is None and time.monotonic() < deadline, "no worker started"
            time.sleep(0.05)
        worker = int(pid_file.read_text())
        assert os.getsid(worker) == worker != os.getsid(agent.pid)  # what the script meets
        out = subprocess.run(
            ["bash", "-c", f". {ROOT}/deploy/local/common.sh && kill_node {agent.pid}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 0, out.stderr
        assert agent.wait(timeout=10) == -9
        deadline = time.monotonic() + 10
        while not gone(worker):
            assert time.monotonic() < deadline, f"worker {worker} still runs: {out.stdout}"
            time.sleep(0.05)
        assert out.stdout.strip() == (
            f"killed agent {agent.pid} (its process group) and its workers: {worker}"
        )
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()

"""Fixtures of the Python suite: the real Stoker daemons from the build tree
(``STOKER_BUILD_DIR``, default ``build``), each started on 127.0.0.1:0 with a
fresh data directory and stopped (SIGTERM, then SIGKILL) at the end."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = pathlib.Path(os.environ.get("STOKER_BUILD_DIR", ROOT / "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
# The stoker package receives batch streams through the build's
# libstoker-client (stoker._native), as an installed trainer would; a test
# that wants gRPC Python sets STOKER_CLIENT_LIBRARY=off.
CLIENT_LIBRARY = BUILD / "client/c/libstoker-client.so"
os.environ.setdefault("STOKER_CLIENT_LIBRARY", str(CLIENT_LIBRARY))


def binary(name: str) -> pathlib.Path:
    """Path of a built binary: stoker-coordinator, stoker-dataloader, ..."""
    sub = {"stokerctl": "client/cli", "stoker-train": "trainer/train"}
    path = BUILD / (sub.get(name) or f"services/{name.removeprefix('stoker-')}") / name
    if not path.exists():
        pytest.fail(f"{path} is missing: build the project first (meson, ninja)")
    return path


class Daemon:
    """One running daemon: ``addr`` is its HOST:PORT; ``restart()`` kills it
    with SIGKILL and starts it again on the same port and data."""

    def __init__(
        self,
        name: str,
        root: pathlib.Path,
        *extra: str,
        listen: str = "127.0.0.1:0",
        data_roots: list[pathlib.Path] | None = None,
    ) -> None:
        self.name = name
        self.root = root
        self.extra = list(extra)
        if name == "dataloader":  # serves the files a test makes under its root
            for d in [root] if data_roots is None else data_roots:
                self.extra += ["--data-root", str(d)]
        self.data = root / f"{name}-data"
        self.listen = listen
        self.proc: subprocess.Popen[bytes] | None = None
        self.addr = ""
        self.start()

    def start(self) -> None:
        ready = self.root / f"{self.name}.ready"
        ready.unlink(missing_ok=True)
        log = open(self.root / f"{self.name}.log", "ab")  # noqa: SIM115 (the daemon's)
        self.proc = subprocess.Popen(
            [
                str(binary(f"stoker-{self.name}")),
                "--listen",
                self.listen,
                "--data-dir",
                str(self.data),
                "--ready-file",
                str(ready),
                "--log-level",
                "warn",
                *self.extra,
            ],
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"stoker-{self.name} exited with {self.proc.returncode}: "
                    + (self.root / f"{self.name}.log").read_text()[-2000:]
                )
            if ready.exists() and ready.read_text().strip():
                self.addr = ready.read_text().strip().splitlines()[0]
                self.listen = self.addr
                return
            time.sleep(0.02)
        raise RuntimeError(f"stoker-{self.name} not ready in 30 s")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def daemons(tmp_path: pathlib.Path) -> Iterator[dict[str, Daemon]]:
    """Starts daemons on demand: ``daemons["dataloader"]`` etc. (the
    checkpoint service reports to the coordinator when both are used)."""
    started: dict[str, Daemon] = {}

    class Lazy(dict[str, Daemon]):
        def __missing__(self, name: str) -> Daemon:
            extra: list[str] = []
            if name == "checkpoint" and "coordinator" in started:
                extra = ["--coordinator", started["coordinator"].addr]
            d = Daemon(name, tmp_path, *extra)
            started[name] = d
            self[name] = d
            return d

    yield Lazy()
    for d in started.values():
        d.stop()

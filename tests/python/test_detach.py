"""The detached commit (issue 23, ``CommitCheckpointRequest.detach``) against
the real checkpoint daemon over a real S3-protocol server (s3rver), through a
small HTTP proxy that can hold or refuse the requests whose path names a
pattern, so that what happens after the answer is observable:

- a process that saves with ``StokerWriter(detach=True)`` exits while the
  uploads and the manifest's requests are held (the checkpoint is not listed yet, and Abort
  is refused: the commit is decided); once they go through the service
  commits it by itself and it loads bit-exactly;
- kill -9 of the daemon right after the detached answer: with the manifest
  held (every byte uploaded), the restarted daemon commits it; with the
  uploads held (bytes only staged in the dead daemon's memory), it aborts it
  and logs why, names the detached commit, and never lists it;
- SIGTERM right after the answer, storage slow for a second: the daemon's
  graceful stop finishes it; committed after the restart;
- storage refusing the manifest: the attempt is aborted with the reason
  logged, never listed or reported committed.

Skipped when s3rver (npm) is not installed in the cache the C tests fill
(``STK_S3RVER_CACHE``, default /tmp/stk-s3rver-cache)."""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import ROOT, Daemon

from stoker.checkpoint import RPC, StokerReader
from stoker.connection import Connection
from stoker.errors import StokerError
from stoker.v1 import checkpoint_pb2 as pb

CACHE = pathlib.Path(os.environ.get("STK_S3RVER_CACHE", "/tmp/stk-s3rver-cache"))
LAUNCHER = ROOT / "tests/unit/checkpoint_storage/s3rver_launch.js"
BUCKET = "stoker-test"

SAVER = """
import sys, time, torch
import torch.distributed.checkpoint as dcp
from stoker.checkpoint import StokerWriter
addr, job, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
g = torch.Generator().manual_seed(step)
state = {"w": torch.randn(1536, 1024, generator=g), "b": torch.randn(333, generator=g)}
w = StokerWriter(job, addr, detach=True)
t0 = time.monotonic()
dcp.save(state, storage_writer=w, checkpoint_id=step, no_dist=True)
ref = w.last_commit
print(f"accepted uri={ref.uri!r} committed_at_ms={ref.committed_at_ms} "
      f"in {time.monotonic() - t0:.3f} s attempt={w._attempt}", flush=True)
"""


def expected(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {"w": torch.randn(1536, 1024, generator=g), "b": torch.randn(333, generator=g)}


class Proxy:
    """Relays one HTTP request per connection to the S3 server (the client
    reconnects: ``Connection: close``). A request whose request line holds
    ``hold`` waits until ``release()``; one holding ``refuse`` is answered
    403 AccessDenied. ``seen`` counts matching requests held or refused."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.hold = ""
        self.refuse = ""
        self.held = 0
        self.refused = 0
        self.gate = threading.Event()
        self.gate.set()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def hold_matching(self, pattern: str) -> None:
        self.hold, self.held = pattern, 0
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        with contextlib.suppress(OSError):  # s3rver gone at the end, or the client went away
            self._relay(c)

    def _relay(self, c: socket.socket) -> None:
        with c:
            head = b""
            while b"\r\n\r\n" not in head:
                got = c.recv(65536)
                if not got:
                    return
                head += got
            top, rest = head.split(b"\r\n\r\n", 1)
            line = top.split(b"\r\n", 1)[0].decode("latin-1")
            if self.refuse and self.refuse in line:
                self.refused += 1
                body = b"<Error><Code>AccessDenied</Code><Message>refused</Message></Error>"
                c.sendall(
                    b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
                    + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
                return
            if self.hold and self.hold in line and not self.gate.is_set():
                self.held += 1
                self.gate.wait()
            lines = [h for h in top.split(b"\r\n") if not h.lower().startswith(b"connection:")]
            up = socket.create_connection(("127.0.0.1", self.upstream))
            with up:
                up.sendall(b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n" + rest)
                t = threading.Thread(target=_pipe, args=(c, up), daemon=True)
                t.start()
                _pipe(up, c)


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while got := src.recv(65536):
            dst.sendall(got)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


@pytest.fixture
def s3() -> Iterator[int]:
    mod = next(
        (
            p
            for p in (CACHE / "node_modules/@20minutes/s3rver", CACHE / "node_modules/s3rver")
            if p.exists()
        ),
        None,
    )
    if mod is None:
        pytest.skip(f"s3rver is not installed in {CACHE} (the C S3 tests install it)")
    data = tempfile.mkdtemp(prefix="stk-s3rver-")
    proc = subprocess.Popen(
        ["node", "--openssl-legacy-provider", str(LAUNCHER), str(mod), data, BUCKET],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    if not line.startswith("PORT "):
        proc.kill()
        pytest.skip(f"s3rver did not start: {line!r}")
    yield int(line.split()[1])
    proc.terminate()
    proc.wait()


@pytest.fixture
def checkpoint_daemon(tmp_path: pathlib.Path) -> Iterator[Callable[[Proxy], Daemon]]:
    """Starts the test's checkpoint daemon storing through proxy; stopped
    at the test's end (a daemon left running outlived the suite)."""
    started: list[Daemon] = []

    def start(proxy: Proxy) -> Daemon:
        d = Daemon(
            "checkpoint",
            tmp_path,
            f"--storage=s3://{BUCKET}/ckpt",
            f"--s3-endpoint=http://127.0.0.1:{proxy.port}",
            "--s3-region=us-east-1",
            "--s3-access-key=S3RVER",
            "--s3-secret-key=S3RVER",
            "--shm-dir=",
        )
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


def listed(addr: str, job: str) -> list[int]:
    conn = Connection(addr)
    try:
        resp = conn.unary(RPC.List.path, pb.ListCheckpointsRequest(job=job), RPC.List.response_type)
        return [c.step for c in resp.checkpoints]
    finally:
        conn.close()


def save_detached(addr: str, job: str, step: int) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SAVER, addr, job, str(step)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done, time.monotonic() - t0


def wait_for(what: str, cond: Callable[[], bool], timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s")


def load_matches(addr: str, job: str, step: int) -> None:
    want = expected(step)
    got = {k: torch.zeros_like(v) for k, v in want.items()}
    dcp.load(got, storage_reader=StokerReader(job, addr), checkpoint_id=step, no_dist=True)
    for k, v in want.items():
        assert torch.equal(got[k], v), k


def test_the_saver_exits_before_the_manifest_and_the_service_commits_after(
    s3, tmp_path, checkpoint_daemon
) -> None:
    proxy = Proxy(s3)
    d = checkpoint_daemon(proxy)
    proxy.hold_matching("/ckpt/det/")  # every upload, the manifest's requests too
    done, took = save_detached(d.addr, "det", 5)
    # The process is gone and its commit was accepted, not done: the
    # uploads are held, no manifest is written, the checkpoint is not listed.
    assert "accepted uri='' committed_at_ms=0" in done.stdout, done.stdout
    wait_for("the first upload to reach storage", lambda: proxy.held >= 1)
    assert listed(d.addr, "det") == []
    # Decided: nobody aborts it any more.
    attempt = done.stdout.split("attempt=", 1)[1].split()[0]
    conn = Connection(d.addr)
    try:
        with pytest.raises(StokerError) as refused:
            conn.unary(
                RPC.Abort.path,
                pb.AbortCheckpointRequest(attempt=attempt, reason="test"),
                RPC.Abort.response_type,
            )
        assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION, refused.value
        assert "detached commit" in refused.value.details, refused.value
    finally:
        conn.close()
    proxy.release()
    wait_for("the service to commit after the saver is gone", lambda: listed(d.addr, "det") == [5])
    load_matches(d.addr, "det", 5)
    print(f"detached save returned in {took:.2f} s with every upload held")


def test_kill_9_after_the_answer_with_every_byte_uploaded_commits_at_restart(
    s3, tmp_path, checkpoint_daemon
) -> None:
    proxy = Proxy(s3)
    d = checkpoint_daemon(proxy)
    proxy.hold_matching("manifest.pb")
    save_detached(d.addr, "det", 6)
    wait_for("the manifest's first request to reach storage", lambda: proxy.held >= 1)
    d.kill()  # every object is uploaded and journaled; the manifest is not written
    proxy.hold = ""
    proxy.release()
    d.start()
    assert listed(d.addr, "det") == [6]
    load_matches(d.addr, "det", 6)


def test_sigterm_after_the_answer_finishes_the_commit(s3, tmp_path, checkpoint_daemon) -> None:
    """A graceful stop (a rolling update) within its shutdown grace lets the
    queued uploads and the commit finish: committed after the restart."""
    proxy = Proxy(s3)
    d = checkpoint_daemon(proxy)
    proxy.hold_matching("/ckpt/det/")
    save_detached(d.addr, "det", 4)
    wait_for("the first upload to reach storage", lambda: proxy.held >= 1)
    assert d.proc is not None
    d.proc.terminate()
    threading.Timer(1.0, proxy.release).start()  # storage slow for a second
    d.proc.wait(timeout=60)
    proxy.hold = ""
    d.start()
    assert listed(d.addr, "det") == [4]
    load_matches(d.addr, "det", 4)


def test_kill_9_before_the_bytes_are_uploaded_aborts_it_and_says_why(
    s3, tmp_path, checkpoint_daemon
) -> None:
    proxy = Proxy(s3)
    d = checkpoint_daemon(proxy)
    save_detached(d.addr, "det", 3)  # an earlier checkpoint, committed
    wait_for("step 3 to commit", lambda: listed(d.addr, "det") == [3])
    proxy.hold_matching("/ckpt/det/")  # every upload of the next attempt
    save_detached(d.addr, "det", 7)
    d.kill()  # its bytes were staged in the daemon's memory only
    proxy.hold = ""
    proxy.release()
    d.start()
    assert listed(d.addr, "det") == [3]  # never committed, the earlier one kept
    wait_for(
        "the abort of the detached commit in the daemon's log",
        lambda: (
            "a detached commit was accepted"
            in (tmp_path / "checkpoint.log").read_text(errors="replace")
        ),
    )
    load_matches(d.addr, "det", 3)


def test_a_detached_commit_storage_refuses_is_aborted_and_logged(
    s3, tmp_path, checkpoint_daemon
) -> None:
    proxy = Proxy(s3)
    d = checkpoint_daemon(proxy)
    proxy.refuse = "manifest.pb"
    save_detached(d.addr, "det", 9)
    log = tmp_path / "checkpoint.log"
    wait_for(
        "the abort to be logged",
        lambda: "checkpoint.aborted job=det step=9" in log.read_text(errors="replace"),
    )
    assert proxy.refused >= 1
    assert listed(d.addr, "det") == []

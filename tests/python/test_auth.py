"""Bearer tokens at the real coordinator, as RFC 6750 reads them (for unknown methods too): the
scheme in any case and one or more spaces before the token; any other
scheme, a wrong token or none is UNAUTHENTICATED. Also the package's own
Connection with a token file, and SIGHUP re-reading the daemon's token file."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import grpc
import pytest
from conftest import Daemon

from stoker import Security, StokerError
from stoker.jobs import Jobs
from stoker.v1 import coordinator_pb2 as pb


def test_bearer_scheme_is_case_insensitive(tmp_path):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    d = Daemon("coordinator", tmp_path, "--token-file", str(token))
    try:
        channel = grpc.insecure_channel(d.addr)
        get = channel.unary_unary(
            "/stoker.v1.Coordinator/GetJob",
            request_serializer=pb.GetJobRequest.SerializeToString,
            response_deserializer=pb.Job.FromString,
        )

        def code(header: str | None) -> grpc.StatusCode:
            md = [("authorization", header)] if header is not None else None
            try:
                get(pb.GetJobRequest(job="nope"), metadata=md, timeout=10)
            except grpc.RpcError as e:
                return e.code()
            return grpc.StatusCode.OK

        # Accepted: the call reaches the handler, which knows no such job.
        for ok in ("Bearer s3cret-token", "bearer s3cret-token", "BEARER  s3cret-token"):
            assert code(ok) == grpc.StatusCode.NOT_FOUND, ok
        for bad in (
            None,
            "Basic s3cret-token",
            "Bearer",
            "Bearer s3cret-toke",
            "Bearers3cret-token",
            "Bearer s3cret-token ",
        ):
            assert code(bad) == grpc.StatusCode.UNAUTHENTICATED, bad
        # An unknown method: without the token UNAUTHENTICATED, with it UNIMPLEMENTED.
        unknown = channel.unary_unary("/stoker.v1.Coordinator/NoSuchMethod")
        for header, want in (
            (None, grpc.StatusCode.UNAUTHENTICATED),
            ("Bearer wrong", grpc.StatusCode.UNAUTHENTICATED),
            ("bearer s3cret-token", grpc.StatusCode.UNIMPLEMENTED),
        ):
            with pytest.raises(grpc.RpcError) as err:
                md = [("authorization", header)] if header else None
                unknown(b"", metadata=md, timeout=10)
            assert err.value.code() == want, header
        channel.close()

        with pytest.raises(StokerError) as e:
            Jobs(d.addr, security=Security(token_file=str(token))).show("nope")
        assert e.value.code == grpc.StatusCode.NOT_FOUND
        with pytest.raises(StokerError) as e:
            Jobs(d.addr, security=Security(token="wrong")).show("nope")
        assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        d.stop()
    log = (tmp_path / "coordinator.log").read_text()
    assert "TLS is off" in log, log  # a token without TLS is warned about at start


def test_listening_beyond_loopback_without_tls_or_token_is_warned(tmp_path):
    for sub, listen, warned in (("lo", "127.0.0.1:0", False), ("any", "0.0.0.0:0", True)):
        root = tmp_path / sub
        root.mkdir()
        Daemon("coordinator", root, listen=listen).stop()
        log = (root / "coordinator.log").read_text()
        assert ("beyond loopback" in log) == warned, (listen, log)


def test_sighup_rereads_the_token_file_and_keeps_the_old_token_on_a_bad_one(tmp_path):
    token = tmp_path / "token"
    token.write_text("first-token\n")
    d = Daemon("coordinator", tmp_path, "--token-file", str(token))
    log = tmp_path / "coordinator.log"

    def code(tok: str) -> grpc.StatusCode:
        try:
            Jobs(d.addr, security=Security(token=tok)).show("nope")
        except StokerError as e:
            return e.code
        return grpc.StatusCode.OK

    def hup_until(done: Callable[[], bool]) -> None:
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not done():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)

    try:
        assert code("first-token") == grpc.StatusCode.NOT_FOUND  # Reaches the handler.
        token.write_text("second-token\n")
        assert code("second-token") == grpc.StatusCode.UNAUTHENTICATED  # Not before SIGHUP.
        hup_until(lambda: code("second-token") == grpc.StatusCode.NOT_FOUND)
        assert code("first-token") == grpc.StatusCode.UNAUTHENTICATED
        # A token file emptied by mistake: refused, the second token stays.
        token.write_text("")
        hup_until(lambda: "token file not reloaded" in log.read_text())
        assert code("second-token") == grpc.StatusCode.NOT_FOUND
        assert code("") == grpc.StatusCode.UNAUTHENTICATED
        assert d.proc.poll() is None  # SIGHUP never stops the daemon.
    finally:
        d.stop()


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_a_connection_follows_its_token_file(tmp_path, monkeypatch, tls):
    """A long-lived client whose token file is rotated with the daemon's keeps
    working: an UNAUTHENTICATED answer makes it re-read the file and send the
    call once more; it re-reads on its own every TOKEN_REREAD_S; a bad file
    keeps the token in use; a first read of a bad file is a clear error.
    Plaintext channels send the token from an interceptor, TLS channels from
    call credentials: both follow the file."""
    from test_tls_reload import CA

    from stoker import connection

    daemon_token, client_token = tmp_path / "daemon-token", tmp_path / "client-token"
    daemon_token.write_text("first-token\n")
    client_token.write_text("first-token\n")
    args = ["--token-file", str(daemon_token)]
    ca_file = None
    if tls:
        ca, ca_file = CA("stoker-test-ca"), tmp_path / "ca.pem"
        ca_file.write_bytes(ca.pem)
        ca.issue(tmp_path / "server.pem", tmp_path / "server.key")
        args += [
            "--tls-cert",
            str(tmp_path / "server.pem"),
            "--tls-key",
            str(tmp_path / "server.key"),
        ]
    d = Daemon("coordinator", tmp_path, *args)
    log = tmp_path / "coordinator.log"

    def sec(**kw: str) -> Security:
        return Security(tls_ca=str(ca_file) if ca_file else None, **kw)

    def rotate_daemon(tok: str) -> None:
        daemon_token.write_text(tok + "\n")
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while True:
            try:
                Jobs(d.addr, security=sec(token=tok)).show("nope")
            except StokerError as e:
                if e.code == grpc.StatusCode.NOT_FOUND:
                    return
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)

    def code(jobs: Jobs) -> grpc.StatusCode:
        with pytest.raises(StokerError) as e:
            jobs.show("nope")
        return e.value.code

    try:
        jobs = Jobs(d.addr, security=sec(token_file=str(client_token)))
        assert code(jobs) == grpc.StatusCode.NOT_FOUND  # Reaches the handler.
        # Rotated: the refused call re-reads the file and goes once more.
        rotate_daemon("second-token")
        client_token.write_text("second-token\n")
        assert code(jobs) == grpc.StatusCode.NOT_FOUND
        # A file emptied by mistake: the token in use stays.
        client_token.write_text("")
        monkeypatch.setattr(connection, "TOKEN_REREAD_S", 0.0)
        assert code(jobs) == grpc.StatusCode.NOT_FOUND
        # Re-read when due, before any refusal: the daemon still takes the
        # second token, so a client that re-read sends the third, refused,
        # once (the file gives nothing new to retry with).
        client_token.write_text("third-token\n")
        assert code(jobs) == grpc.StatusCode.UNAUTHENTICATED
        assert code(jobs) == grpc.StatusCode.UNAUTHENTICATED
        client_token.write_text("two words\n")
        with pytest.raises(StokerError) as e:
            Jobs(d.addr, security=sec(token_file=str(client_token))).show("nope")
        assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert str(client_token) in e.value.details
    finally:
        d.stop()

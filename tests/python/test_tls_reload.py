"""SIGHUP re-reads a daemon's TLS certificate and key, at each of the three
daemons: started with a certificate from CA A, the files replaced by one
from CA B, then SIGHUP: new connections are served with B's certificate (a
client trusting only A is refused), a connection opened before keeps
working; a broken key file is logged with its name and B's stays in use.
The throwaway CAs are made with the ``cryptography`` package."""

from __future__ import annotations

import datetime
import ipaddress
import pathlib
import signal
import time
from collections.abc import Callable

import grpc
import pytest
from conftest import Daemon
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

HEALTH_CHECK = "/grpc.health.v1.Health/Check"


class CA:
    """A self-signed CA that issues server certificates for 127.0.0.1."""

    def __init__(self, name: str) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        self.cert = (
            self._builder(self.name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def _builder(
        self, subject: x509.Name, public_key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        now = datetime.datetime.now(datetime.timezone.utc)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    def issue(self, cert_file: pathlib.Path, key_file: pathlib.Path) -> None:
        """Writes a new server key and its certificate, signed by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "stoker-test-server")])
        san = x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        )
        cert = (
            self._builder(subject, key.public_key())
            .add_extension(san, critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        key_file.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def tls_channel(addr: str, ca_pem: bytes) -> grpc.Channel:
    """A channel of its own (no subchannel shared with other channels), so
    that its first call makes a new connection and a new handshake."""
    creds = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    return grpc.secure_channel(addr, creds, options=[("grpc.use_local_subchannel_pool", 1)])


def healthy(channel: grpc.Channel) -> bool:
    """Whether a health check over channel succeeds (the TLS handshake included)."""
    try:
        channel.unary_unary(HEALTH_CHECK)(b"", timeout=10)
    except grpc.RpcError:
        return False
    return True


def served_to(addr: str, ca_pem: bytes) -> bool:
    """Whether a new connection that trusts only ca_pem is served."""
    with tls_channel(addr, ca_pem) as channel:
        return healthy(channel)


@pytest.mark.parametrize("name", ["coordinator", "dataloader", "checkpoint"])
def test_sighup_rereads_the_tls_certificate_and_keeps_it_on_a_bad_key(
    tmp_path: pathlib.Path, name: str
) -> None:
    ca_a, ca_b = CA("stoker-test-ca-a"), CA("stoker-test-ca-b")
    cert, key = tmp_path / "server.pem", tmp_path / "server.key"
    ca_a.issue(cert, key)
    d = Daemon(name, tmp_path, "--tls-cert", str(cert), "--tls-key", str(key))
    log = tmp_path / f"{name}.log"

    def hup_until(done: Callable[[], bool]) -> None:
        assert d.proc is not None
        d.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while not done():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)

    opened_before = tls_channel(d.addr, ca_a.pem)
    try:
        assert served_to(d.addr, ca_a.pem)
        assert not served_to(d.addr, ca_b.pem)
        assert healthy(opened_before)

        ca_b.issue(cert, key)
        assert served_to(d.addr, ca_a.pem)  # Not before SIGHUP.
        hup_until(lambda: served_to(d.addr, ca_b.pem))
        assert not served_to(d.addr, ca_a.pem)
        assert healthy(opened_before)  # An open connection keeps its certificate.

        # A key file broken by mistake: logged with its name, B's certificate stays.
        key.write_text("-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n")
        hup_until(lambda: "TLS certificates not reloaded" in log.read_text())
        assert str(key) in log.read_text()
        assert served_to(d.addr, ca_b.pem)
        assert not served_to(d.addr, ca_a.pem)
        assert d.proc is not None and d.proc.poll() is None  # SIGHUP never stops the daemon.
    finally:
        opened_before.close()
        d.stop()

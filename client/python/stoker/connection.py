"""Connections to the Stoker services: one gRPC channel per address, with the
same options as stokerctl and the C client (TLS with a CA, client
certificates for mutual TLS, a bearer token from a file), per-call deadlines
and errors translated to :class:`~stoker.errors.StokerError`.

Addresses default to the environment, as for the C client:
``STOKER_COORDINATOR``, ``STOKER_DATALOADER`` (a comma-separated list for a
scaled-out loader), ``STOKER_CHECKPOINT``; ``STOKER_TOKEN_FILE`` and
``STOKER_TLS_CA`` likewise."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from stoker.errors import StokerError

T = TypeVar("T")

# Method paths start with the service's full name (proto/stoker/v1). The package
# itself names its RPCs through stoker._proto (paths and reply types from the
# descriptors); these stay for scripts that call a method by hand.
COORDINATOR = "/stoker.v1.Coordinator/"
DATALOADER = "/stoker.v1.Dataloader/"
CHECKPOINT = "/stoker.v1.Checkpoint/"

# Largest message either way: the daemons' default --max-message-size.
MAX_MESSAGE_BYTES = 64 << 20

# Codes after which retrying the same idempotent call can succeed.
RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})


@dataclass(frozen=True)
class Security:
    """TLS and bearer-token options (all optional; plaintext without a CA).

    tls_ca: PEM file of the CA that signed the services' certificates.
    tls_cert, tls_key: PEM client certificate and key (mutual TLS).
    token: the bearer token; token_file: read it from here, and again when
    a call is answered UNAUTHENTICATED or at most every TOKEN_REREAD_S (the
    daemons' rule: trailing whitespace dropped, then one word of printable
    ASCII, at most 4096 bytes; a bad file at a re-read keeps the token in use).
    """

    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    token: str | None = None
    token_file: str | None = None

    @classmethod
    def from_env(cls) -> Security:
        return cls(
            tls_ca=os.environ.get("STOKER_TLS_CA") or None,
            token_file=os.environ.get("STOKER_TOKEN_FILE") or None,
        )

    def bearer(self) -> str | None:
        """The token now (read from token_file when that is given)."""
        if self.token:
            return self.token
        if self.token_file:
            return read_token_file(self.token_file)
        return None


# A client re-reads its token file at most this often (and when a call is
# answered UNAUTHENTICATED), as libstoker-client does.
TOKEN_REREAD_S = 30.0
TOKEN_FILE_MAX_BYTES = 4096


def read_token_file(path: str) -> str:
    """The token in ``path`` by the daemons' rule (see Security); a
    StokerError (INVALID_ARGUMENT) naming the file otherwise."""
    try:
        with open(path, "rb") as f:
            raw = f.read(TOKEN_FILE_MAX_BYTES + 1)
    except OSError as e:
        raise StokerError(
            grpc.StatusCode.INVALID_ARGUMENT, f"cannot read token file {path}: {e.strerror}"
        ) from None
    if len(raw) > TOKEN_FILE_MAX_BYTES:
        raise StokerError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"token file {path} is over {TOKEN_FILE_MAX_BYTES} bytes",
        )
    token = raw.rstrip(b" \t\r\n\v\f")
    if not token or any(b < 0x21 or b > 0x7E for b in token):
        raise StokerError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"token file {path} must hold one word of printable ASCII",
        )
    return token.decode("ascii")


class _TokenSource:
    """The token a channel sends: fixed, or followed in its file."""

    def __init__(self, sec: Security) -> None:
        self._path = None if sec.token else sec.token_file
        self._token = sec.bearer()
        self._read_at = time.monotonic()
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return self._token is not None

    def current(self) -> str:
        """The token, re-read first when the last read is TOKEN_REREAD_S old."""
        if self._path and time.monotonic() - self._read_at >= TOKEN_REREAD_S:
            self.reread()
        return self._token or ""

    def reread(self) -> bool:
        """Reads the file again now; True when the token changed. A bad
        file keeps the token in use."""
        if not self._path:
            return False
        with self._lock:
            self._read_at = time.monotonic()
            try:
                token = read_token_file(self._path)
            except StokerError:
                return False
            changed, self._token = token != self._token, token
            return changed


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    with open(path, "rb") as f:
        return f.read()


def address_from_env(name: str, address: str | None) -> str:
    """The address given, else the environment variable ``name``; a clear
    error when neither is set."""
    addr = address or os.environ.get(name, "")
    if not addr:
        raise StokerError(
            grpc.StatusCode.INVALID_ARGUMENT, f"no service address: pass address= or set {name}"
        )
    return addr


class Connection:
    """One channel to one service address.

    ``call`` runs a unary method with a deadline (seconds) and translates
    errors; idempotent calls may be retried on UNAVAILABLE (the service is
    restarting) until the deadline passes. Thread-safe; picklable only by
    address (a DataLoader worker opens its own channel)."""

    def __init__(
        self,
        address: str,
        security: Security | None = None,
        timeout: float = 30.0,
        spread: bool = False,
    ) -> None:
        self.address = address
        self.security = security or Security.from_env()
        self.timeout = timeout
        # Calls spread over every address the target resolves to (gRPC's
        # round_robin: the checkpoint replicas behind one name).
        self.spread = spread
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._pid = -1
        self._token: _TokenSource | None = None
        self._peers: dict[str, Connection] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "security": self.security,
            "timeout": self.timeout,
            "spread": self.spread,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["address"], state["security"], state["timeout"], state.get("spread", False)
        )

    def peer(self, address: str) -> Connection:
        """A connection to another address with this one's security and
        timeout, kept for later asks (the checkpoint replica that owns an
        attempt)."""
        with self._lock:
            conn = self._peers.get(address)
            if conn is None:
                conn = self._peers[address] = Connection(address, self.security, self.timeout)
            return conn

    def __repr__(self) -> str:
        return f"Connection({self.address!r})"

    @property
    def channel(self) -> grpc.Channel:
        """The channel, opened at first use (and again in a forked child)."""
        with self._lock:
            if self._channel is None or self._pid != os.getpid():
                self._channel = self._open()
                self._pid = os.getpid()
            return self._channel

    def _open(self) -> grpc.Channel:
        options: list[tuple[str, int | str]] = [
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            # As the C client: a server pod replaced (a rolling update) comes
            # back at a new address under its name. gRPC asks DNS again when
            # a connection fails, but by default at most every 30 s, and
            # backs off reconnecting for up to two minutes.
            ("grpc.dns_min_time_between_resolutions_ms", 1000),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ]
        if self.spread:
            options.append(("grpc.lb_policy_name", "round_robin"))
        sec = self.security
        token = self._token = _TokenSource(sec)
        if sec.tls_ca:
            creds = grpc.ssl_channel_credentials(
                root_certificates=_read(sec.tls_ca),
                private_key=_read(sec.tls_key),
                certificate_chain=_read(sec.tls_cert),
            )
            if token:
                creds = grpc.composite_channel_credentials(
                    creds, grpc.metadata_call_credentials(_BearerPlugin(token))
                )
            return grpc.secure_channel(self.address, creds, options)
        channel = grpc.insecure_channel(self.address, options)
        if token:
            # A token without TLS crosses in clear: the daemons warn about
            # this too. gRPC's call credentials refuse plaintext channels,
            # so the header is added by an interceptor.
            channel = grpc.intercept_channel(channel, _BearerInterceptor(token))
        return channel

    def _token_changed(self) -> bool:
        """After an UNAUTHENTICATED answer: whether the token file now holds
        another token (the call is then worth sending once more)."""
        return self._token is not None and self._token.reread()

    @property
    def is_open(self) -> bool:
        """Whether a channel of this connection or of one of its peers is open."""
        with self._lock:
            peers = list(self._peers.values())
            own = self._channel is not None and self._pid == os.getpid()
        return own or any(p.is_open for p in peers)

    def close(self) -> None:
        with self._lock:
            if self._channel is not None and self._pid == os.getpid():
                self._channel.close()
            self._channel = None
            peers, self._peers = list(self._peers.values()), {}
        for p in peers:
            p.close()

    def unary_pages(
        self,
        method: str,
        request: Any,
        response_type: Any,
        entries: str,
        timeout: float | None = None,
    ) -> list[Any]:
        """Every entry of a paged listing (``page_token`` in,
        ``next_page_token`` out; the services answer at most 100 entries by
        default and never more than about 3 MiB per page): calls ``method``
        page after page with retry, and returns the repeated field
        ``entries`` of every page, in order. ``timeout`` bounds each page."""
        req = type(request)()
        req.CopyFrom(request)
        out: list[Any] = []
        while True:
            reply = self.unary(method, req, response_type, timeout=timeout, retry=True)
            out.extend(getattr(reply, entries))
            if not reply.next_page_token:
                return out
            req.page_token = reply.next_page_token

    def unary(
        self,
        method: str,
        request: Any,
        response_type: Any,
        timeout: float | None = None,
        retry: bool = False,
    ) -> Any:
        """Calls ``method`` (``/stoker.v1.Service/Method``); returns the
        decoded reply or raises StokerError. With ``retry`` an UNAVAILABLE
        answer is retried with backoff until the deadline."""
        stub = self.channel.unary_unary(
            method, request_serializer=_serialize, response_deserializer=response_type.FromString
        )
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        delay = 0.05
        token_retried = False
        while True:
            left = deadline - time.monotonic()
            try:
                return stub(request, timeout=max(left, 0.001))
            except grpc.RpcError as e:
                err = StokerError.from_rpc(e, method)
                # The service checks the token before running the method, so
                # a call refused for it ran nothing and may go once more.
                if (
                    err.code == grpc.StatusCode.UNAUTHENTICATED
                    and not token_retried
                    and self._token_changed()
                ):
                    token_retried = True
                    continue
                if not retry or err.code not in RETRYABLE or left <= delay:
                    raise err from None
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def server_stream(
        self, method: str, request: Any, response_type: Any, timeout: float | None = None
    ) -> Iterator[Any]:
        """Starts a server-streaming call; iterating it yields replies and
        raises StokerError on failure. ``timeout`` None: no deadline."""
        stub = self.channel.unary_stream(
            method, request_serializer=_serialize, response_deserializer=response_type.FromString
        )
        call = stub(request, timeout=timeout)
        return _TranslatedStream(call, method)

    def client_stream(
        self, method: str, requests: Iterator[Any], response_type: Any, timeout: float | None = None
    ) -> Any:
        """Runs a client-streaming call over ``requests``; returns the reply."""
        stub = self.channel.stream_unary(
            method, request_serializer=_serialize, response_deserializer=response_type.FromString
        )
        try:
            return stub(requests, timeout=timeout if timeout is not None else self.timeout)
        except grpc.RpcError as e:
            raise StokerError.from_rpc(e, method) from None


def _serialize(message: Any) -> bytes:
    out: bytes = message.SerializeToString()
    return out


class _TranslatedStream:
    """Iterates a server stream, turning grpc errors into StokerError; cancel()
    ends it early."""

    def __init__(self, call: Any, method: str) -> None:
        self._call = call
        self._method = method

    def __iter__(self) -> _TranslatedStream:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._call)
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.CANCELLED and self._call.cancelled():
                raise StopIteration from None
            raise StokerError.from_rpc(e, self._method) from None

    def cancel(self) -> None:
        self._call.cancel()


class _BearerInterceptor(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
):
    """Adds ``authorization: Bearer TOKEN`` to every call of a plaintext channel."""

    def __init__(self, token: _TokenSource) -> None:
        self._token = token

    def _details(self, d: Any) -> Any:
        metadata = [*(d.metadata or []), ("authorization", f"Bearer {self._token.current()}")]
        return d._replace(metadata=metadata) if hasattr(d, "_replace") else _Details(d, metadata)

    def intercept_unary_unary(self, continuation: Callable[..., Any], d: Any, request: Any) -> Any:
        return continuation(self._details(d), request)

    def intercept_unary_stream(self, continuation: Callable[..., Any], d: Any, request: Any) -> Any:
        return continuation(self._details(d), request)

    def intercept_stream_unary(
        self, continuation: Callable[..., Any], d: Any, requests: Any
    ) -> Any:
        return continuation(self._details(d), requests)


class _BearerPlugin(grpc.AuthMetadataPlugin):
    """The token of a TLS channel, asked for by gRPC at every call."""

    def __init__(self, token: _TokenSource) -> None:
        self._token = token

    def __call__(self, context: Any, callback: Any) -> None:
        callback((("authorization", f"Bearer {self._token.current()}"),), None)


class _Details(grpc.ClientCallDetails):
    def __init__(self, d: Any, metadata: list[tuple[str, str]]) -> None:
        self.method = d.method
        self.timeout = d.timeout
        self.metadata = metadata
        self.credentials = d.credentials
        self.wait_for_ready = getattr(d, "wait_for_ready", None)
        self.compression = getattr(d, "compression", None)

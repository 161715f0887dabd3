"""Batches received through libstoker-client (ctypes): the C client's batch
stream (``stk_batch_stream_open_opts``, ``client/c/stoker_loader.h``) runs
the gRPC receive, the shared-memory ring protocol and the stream's
bookkeeping on its own threads; Python only wraps each batch's int64 tokens
in an array (a view of the ring's slot, or of the C client's widened copy of
an inline batch) and frees the batch, which releases the slot, when the
last array over it is gone.

The library is found by ``STOKER_CLIENT_LIBRARY`` (a path; ``off`` or an
empty value: never use it), else as an installed library
(``libstoker-client.so.0`` by the dynamic loader's search). A library
without the stream options (older than ``STOKER_CLIENT_0.1``) counts as
missing: the caller then speaks gRPC itself (``stoker.data``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from typing import Any

import grpc
import numpy as np
from numpy.typing import NDArray

from stoker._proto import method
from stoker.connection import Security
from stoker.errors import StokerError
from stoker.v1 import dataloader_pb2

LIBRARY_ENV = "STOKER_CLIENT_LIBRARY"
SONAME = "libstoker-client.so.0"
STREAM_METHOD = method(dataloader_pb2, "Dataloader", "StreamBatches").path

# enum stk_shm_mode, and the error codes this module branches on (stoker_error.h).
SHM_AUTO, SHM_OFF, SHM_REQUIRE = 0, 1, 2
SHM_MODES = {"auto": SHM_AUTO, "shm": SHM_REQUIRE, "grpc": SHM_OFF}  # By StokerDataset transport.
STK_ETIMEDOUT = -11
STK_ERANGE = -19

_CODES = {c.value[0]: c for c in grpc.StatusCode}


class _ClientOpts(ctypes.Structure):
    _fields_ = [
        ("address", ctypes.c_char_p),
        ("tls_ca_file", ctypes.c_char_p),
        ("tls_cert_file", ctypes.c_char_p),
        ("tls_key_file", ctypes.c_char_p),
        ("token", ctypes.c_char_p),
        ("token_file", ctypes.c_char_p),
        ("default_timeout_ms", ctypes.c_int64),
    ]


class _StreamOpts(ctypes.Structure):
    _fields_ = [
        ("prefetch", ctypes.c_uint32),
        ("token_bytes", ctypes.c_uint32),
        ("shm", ctypes.c_int),
    ]


class _Batch(ctypes.Structure):
    _fields_ = [
        ("step", ctypes.c_int64),
        ("lines", ctypes.c_uint32),
        ("line_tokens", ctypes.c_uint32),
        ("tokens", ctypes.c_void_p),
        ("doc_starts", ctypes.POINTER(ctypes.c_uint32)),
        ("n_doc_starts", ctypes.c_size_t),
        ("priv_", ctypes.c_void_p),
    ]


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i32, u32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_int64
    for name, res, args in (
        ("stk_loader_connect", i32, [ctypes.POINTER(_ClientOpts), ctypes.POINTER(p)]),
        ("stk_client_free", None, [p]),
        ("stk_client_last_error", ctypes.c_char_p, [ctypes.POINTER(i32)]),
        (
            "stk_batch_stream_open_opts",
            i32,
            [p, ctypes.c_char_p, i64, u32, u32, ctypes.POINTER(_StreamOpts), ctypes.POINTER(p)],
        ),
        ("stk_batch_stream_next", i32, [p, i64, ctypes.POINTER(_Batch)]),
        ("stk_batch_stream_free", None, [p]),
        ("stk_batch_free", None, [ctypes.POINTER(_Batch)]),
        ("stk_batch_tokens_i64", ctypes.c_void_p, [ctypes.POINTER(_Batch)]),
        ("stk_batch_ring_slots", u32, [ctypes.POINTER(_Batch)]),
        ("stk_batch_stream_ended", ctypes.c_bool, [p]),
    ):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}


def library() -> ctypes.CDLL | None:
    """The loaded libstoker-client, or None when there is none to use."""
    want = os.environ.get(LIBRARY_ENV)
    if want is not None and want.strip() in ("", "off"):
        return None
    path = want or ctypes.util.find_library("stoker-client") or SONAME
    with _lock:
        if path not in _loaded:
            try:
                _loaded[path] = _declare(ctypes.CDLL(path))
            except (OSError, AttributeError):  # Missing, or without the stream options.
                _loaded[path] = None
        return _loaded[path]


def last_error(lib: ctypes.CDLL, err: int, method: str) -> StokerError:
    """This thread's last error of the library as a StokerError."""
    code = ctypes.c_int(0)
    msg = (lib.stk_client_last_error(ctypes.byref(code)) or b"").decode(errors="replace")
    status = _CODES.get(code.value) or grpc.StatusCode.UNKNOWN
    if status == grpc.StatusCode.OK:
        status = grpc.StatusCode.UNKNOWN
    return StokerError(status, msg or f"libstoker-client error {err}", method)


class _Owner:
    """The numpy array interface over one C batch's int64 tokens; frees the
    batch (releasing its ring slot) when the last array over it is gone."""

    __slots__ = ("__array_interface__", "_batch", "_lib", "_on_free")

    def __init__(self, lib: ctypes.CDLL, batch: _Batch, address: int, count: int, on_free: Any):
        self._lib, self._batch, self._on_free = lib, batch, on_free
        self.__array_interface__ = {
            "data": (address, False),
            "shape": (count,),
            "typestr": "<i8",
            "version": 3,
        }

    def __del__(self) -> None:
        self._lib.stk_batch_free(ctypes.byref(self._batch))
        if self._on_free is not None:
            self._on_free()


class NativeStream:
    """One ``stk_batch_stream`` from ``from_step`` over a client of its own;
    ``next(timeout)`` returns the next batch's tokens and shape, the
    document starts when asked, and whether the tokens view a ring slot."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        address: str,
        security: Security,
        job: str,
        from_step: int,
        rank: int,
        world: int,
        prefetch: int,
        shm: int,
        timeout: float,
    ) -> None:
        self.lib = lib
        self.client = ctypes.c_void_p()
        self.stream = ctypes.c_void_p()
        self.lent = 0  # Batches viewing ring slots that arrays still use.
        self._lent_lock = threading.Lock()
        self._keep = [address.encode(), job.encode()]
        enc = [None if v is None else v.encode() for v in _security_fields(security)]
        opts = _ClientOpts(address.encode(), *enc, max(1, int(timeout * 1000)))
        err = lib.stk_loader_connect(ctypes.byref(opts), ctypes.byref(self.client))
        if err:
            raise last_error(lib, err, STREAM_METHOD)
        sopts = _StreamOpts(prefetch, 8, shm)
        err = lib.stk_batch_stream_open_opts(
            self.client, job.encode(), from_step, rank, world, sopts, ctypes.byref(self.stream)
        )
        if err:
            e = last_error(lib, err, STREAM_METHOD)
            self.close()
            raise e

    def next(
        self, timeout: float, doc_starts: bool
    ) -> tuple[int, NDArray[Any], int, int, NDArray[Any] | None, int]:
        """(step, int64 tokens [lines x line_tokens], lines, line_tokens,
        flat document starts or None, ring slots: 0 when not in a ring).
        The tokens view C memory: a ring slot is lent until the array (and
        every tensor over it) is freed; call ``copy_out`` to give it back now."""
        lib = self.lib
        b = _Batch()
        err = lib.stk_batch_stream_next(self.stream, int(timeout * 1000), ctypes.byref(b))
        if err:
            raise self._error(err, timeout)
        starts = None
        if doc_starts:
            starts = (
                np.ctypeslib.as_array(b.doc_starts, (b.n_doc_starts,)).astype(np.int64)
                if b.n_doc_starts
                else np.empty(0, np.int64)
            )
        slots = lib.stk_batch_ring_slots(ctypes.byref(b))
        on_free = None
        if slots:
            with self._lent_lock:
                self.lent += 1
            on_free = self._returned
        count = b.lines * b.line_tokens
        owner = _Owner(lib, b, lib.stk_batch_tokens_i64(ctypes.byref(b)), count, on_free)
        return b.step, np.asarray(owner), b.lines, b.line_tokens, starts, slots

    def _returned(self) -> None:
        with self._lent_lock:
            self.lent -= 1

    def _error(self, err: int, timeout: float) -> StokerError:
        if err == STK_ETIMEDOUT:
            return StokerError(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no batch within {timeout:g} s", STREAM_METHOD
            )
        e = last_error(self.lib, err, STREAM_METHOD)
        if err == STK_ERANGE and self.lib.stk_batch_stream_ended(self.stream):
            # Nothing asks the service to end (no count): a restart did.
            return StokerError(
                grpc.StatusCode.UNAVAILABLE, "the batch stream ended early", STREAM_METHOD
            )
        return e

    def close(self) -> None:
        """Cancels the stream; batches still in use stay valid until freed."""
        if self.stream:
            self.lib.stk_batch_stream_free(self.stream)
            self.stream = ctypes.c_void_p()
        if self.client:
            self.lib.stk_client_free(self.client)
            self.client = ctypes.c_void_p()


def _security_fields(sec: Security) -> list[str | None]:
    """tls_ca_file, tls_cert_file, tls_key_file, token, token_file."""
    return [sec.tls_ca, sec.tls_cert, sec.tls_key, sec.token, sec.token_file]

"""``StokerStore``: a ``torch.distributed.Store`` over the coordinator's
generation-scoped key-value store, so ``init_process_group(store=...)``
(gloo, NCCL) and torchrun's agents rendezvous through the coordinator.

The keys live in one generation of one job: when the job's membership
changes (a new generation) they are gone, and calls answer
FAILED_PRECONDITION (a stale generation): exactly the fencing an elastic
restart needs. Values are at most 64 KiB. ``get`` and ``wait`` park on the
coordinator until the key is set, bounded by the store's timeout
(``DistStoreError`` when it passes). Keys outside the coordinator's
alphabet ``[A-Za-z0-9._:/-]{1,256}`` are stored under a SHA-256 name.

Lifetime: a Python subclass of Store works from C++ only while its Python
object is alive (pybind's trampoline looks the overrides up on it), so keep a
reference for as long as a process group uses the store;
``stoker.elastic.init_process_group`` does.
"""

from __future__ import annotations

import hashlib
import re
import time
from datetime import timedelta
from typing import Any

import grpc
import torch.distributed as dist
from torch._C._distributed_c10d import Store

from stoker._proto import Service
from stoker.connection import Connection, Security, address_from_env
from stoker.errors import StokerError
from stoker.v1 import coordinator_pb2 as pb

RPC = Service(pb, "Coordinator")  # the RPCs, by name, from the descriptor
_KEY = re.compile(r"[A-Za-z0-9._:/-]{1,256}")
DEFAULT_TIMEOUT = timedelta(seconds=300)


def coordinator_key(key: str) -> str:
    """The coordinator's name for a Store key (itself where it is valid)."""
    if _KEY.fullmatch(key) and not key.startswith("sha256:"):
        return key
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class StoreTimeout(StokerError, dist.DistStoreError):
    """A get or wait found no value within the store's timeout."""


class StokerStore(Store):
    """A Store in generation ``generation`` of ``job``.

    Args:
        job: the coordinator job.
        generation: the generation the keys belong to (from a Join).
        address: the coordinator, default ``STOKER_COORDINATOR``.
        timeout: how long ``get`` and ``wait`` wait for a key.
    """

    def __init__(
        self,
        job: str,
        generation: int,
        address: str | None = None,
        *,
        timeout: timedelta = DEFAULT_TIMEOUT,
        security: Security | None = None,
    ) -> None:
        super().__init__()
        self.job = job
        self.generation = generation
        self.conn = Connection(
            address_from_env("STOKER_COORDINATOR", address), security, timeout=30.0
        )
        self._timeout = timeout
        self._clones: list[StokerStore] = []

    def __repr__(self) -> str:
        return (
            f"StokerStore(job={self.job!r}, generation={self.generation}, "
            f"address={self.conn.address!r})"
        )

    def _call(self, method: str, request: Any, timeout: float | None = None) -> Any:
        m = getattr(RPC, method)  # path and reply type from the descriptor
        return self.conn.unary(m.path, request, m.response_type, timeout=timeout, retry=True)

    # ---- the Store API ----------------------------------------------------------

    def set(self, key: str, value: Any) -> None:
        self._call(
            "KvSet",
            pb.KvSetRequest(
                job=self.job,
                generation=self.generation,
                key=coordinator_key(key),
                value=_as_bytes(value),
            ),
        )

    def get(self, key: str) -> bytes:
        return self._get(key, self._timeout.total_seconds())

    def _get(self, key: str, seconds: float) -> bytes:
        req = pb.KvGetRequest(
            job=self.job, generation=self.generation, key=coordinator_key(key), wait=True
        )
        try:
            reply = self._call("KvGet", req, timeout=seconds)
        except StokerError as e:
            if e.code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise StoreTimeout(
                    e.code,
                    f"key {key!r} not set within {seconds:g} s "
                    f"(job {self.job}, generation {self.generation})",
                    e.method,
                ) from None
            raise
        value: bytes = reply.value
        return value

    def add(self, key: str, value: int) -> int:
        reply = self._call(
            "KvAdd",
            pb.KvAddRequest(
                job=self.job, generation=self.generation, key=coordinator_key(key), delta=value
            ),
        )
        return int(reply.value)

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        req = pb.KvCompareSetRequest(
            job=self.job,
            generation=self.generation,
            key=coordinator_key(key),
            expected=_as_bytes(expected_value),
            desired=_as_bytes(desired_value),
        )
        value: bytes = self._call("KvCompareSet", req).value
        return value

    def delete_key(self, key: str) -> bool:
        reply = self._call(
            "KvDelete",
            pb.KvDeleteRequest(job=self.job, generation=self.generation, key=coordinator_key(key)),
        )
        return bool(reply.deleted)

    def num_keys(self) -> int:
        reply = self._call(
            "KvCount",
            pb.KvCountRequest(job=self.job, generation=self.generation),
        )
        return int(reply.keys)

    def check(self, keys: list[str]) -> bool:
        for key in keys:
            req = pb.KvGetRequest(
                job=self.job, generation=self.generation, key=coordinator_key(key), wait=False
            )
            try:
                self._call("KvGet", req)
            except StokerError as e:
                if e.code == grpc.StatusCode.NOT_FOUND:
                    return False
                raise
        return True

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        budget = (timeout or self._timeout).total_seconds()
        deadline = time.monotonic() + budget
        for key in keys:
            self._get(key, max(deadline - time.monotonic(), 0.001))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        for k, v in zip(keys, values, strict=True):
            self.set(k, v)

    def clone(self) -> StokerStore:
        """A second handle on the same keys (gloo makes one per group)."""
        twin = StokerStore(
            self.job,
            self.generation,
            self.conn.address,
            timeout=self._timeout,
            security=self.conn.security,
        )
        # C++ holds the clone, but its Python half (the overrides) lives only
        # as long as a Python reference does: keep one.
        self._clones.append(twin)
        return twin

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout

    @property
    def timeout(self) -> timedelta:
        return self._timeout

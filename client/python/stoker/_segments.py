"""Zero-copy staging of checkpoint bytes through the checkpoint service's
shared-memory directory (the Python side of the protocol in
``services/checkpoint/README.md``; the C client's is ``client/c/ckpt_seg.c``).

When the service runs on this host (``GetStagingInfo`` names a directory
holding ``instance-<token>``), a rank copies its chunks once into segment
files ``seg-<attempt>-<rank>-<tag>`` of that directory and sends only each
chunk's metadata (segment name and offset) over the Write stream. A segment
collects chunks up to the service's limit; it is created (mode 0600) or
claimed from the service's pool of recycled ``free-*`` files by an atomic
rename (their pages already exist; files this process keeps mapped first,
``stoker._segmap``), cut to exactly the bytes placed, and only then
announced, in order from offset 0. From its first message on the
service owns the file: a rank that dies after that loses nothing.
``STOKER_CKPT_SHM=off`` turns this off (bytes go inline).
"""

from __future__ import annotations

import os
import secrets
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from stoker import _segmap
from stoker._proto import method
from stoker.connection import Connection
from stoker.v1 import checkpoint_pb2 as pb

GET_STAGING_INFO = method(pb, "Checkpoint", "GetStagingInfo")
SEGMENT_BYTES = 64 << 20  # largest segment this client makes


def _token_ok(token: str) -> bool:
    return 0 < len(token) <= 64 and all(c in "0123456789abcdef" for c in token)


# The last staging info of each service address that was on this host.
_infos: dict[str, pb.StagingInfo] = {}


def _here(info: pb.StagingInfo) -> bool:
    """Whether info names a usable directory of that service instance on
    this host (another host may have a directory of that name)."""
    d = info.shm_dir
    if not d.startswith("/") or not _token_ok(info.shm_token) or info.shm_max_bytes == 0:
        return False
    return os.path.lexists(os.path.join(d, f"instance-{info.shm_token}"))


class ShmStaging:
    """Segments of one rank's Write stream."""

    def __init__(self, directory: str, attempt: str, rank: int, cap: int) -> None:
        self.dir = directory
        self.attempt, self.rank, self.cap = attempt, rank, cap
        self._tag = secrets.token_hex(4)
        self._count = 0
        self._file: _segmap.SegFile | None = None
        self._name = ""
        self._used = 0
        self._held: list[pb.WriteChunk] = []

    @classmethod
    def open(cls, conn: Connection, attempt: str, rank: int) -> ShmStaging | None:
        """Staging for this rank, or None when the service is elsewhere, has
        it off, or STOKER_CKPT_SHM says off."""
        if os.environ.get("STOKER_CKPT_SHM", "auto") in ("0", "off"):
            return None
        info = _infos.get(conn.address)
        if info is None or not _here(info):  # asked once per service instance
            info = GET_STAGING_INFO.call(conn, True)
            if not _here(info):
                return None
            _infos[conn.address] = info
        return cls(info.shm_dir, attempt, rank, min(int(info.shm_max_bytes), SEGMENT_BYTES))

    def _start(self) -> None:
        self._name = f"seg-{self.attempt}-{self.rank}-{self._tag}{self._count:08x}"
        self._count += 1
        # A recycled file (its pages exist), one still mapped here first.
        self._file = _segmap.acquire(self.dir, self._name, self.cap)
        self._used = 0

    def add(self, msg: pb.WriteChunk, data: Any, nbytes: int) -> Iterator[pb.WriteChunk]:
        """Copies a chunk's bytes (any buffer of nbytes <= cap) into the
        current segment; yields the messages of a segment it completed."""
        if self._file is not None and self._used + nbytes > self.cap:
            yield from self.flush()
        if self._file is None:
            self._start()
        assert self._file is not None
        with warnings.catch_warnings():  # a read-only buffer: the copy only reads it
            warnings.simplefilter("ignore", UserWarning)
            src = torch.frombuffer(memoryview(data).cast("B"), dtype=torch.uint8)
        _segmap.write(self._file, self._used, src)
        msg.shm_name = self._name
        msg.shm_offset = self._used
        self._held.append(msg)
        self._used += nbytes

    def flush(self) -> Iterator[pb.WriteChunk]:
        """Cuts the segment to the bytes placed and yields its messages."""
        if self._file is None:
            return
        f, self._file = self._file, None
        _segmap.complete(f, self._used)
        held, self._held = self._held, []
        yield from held

    def discard(self) -> None:
        """Removes a segment never announced (the stream failed first)."""
        if self._file is not None:
            f, self._file = self._file, None
            _segmap.discard(f, os.path.join(self.dir, self._name))
        self._held = []

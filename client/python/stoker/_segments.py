"""Zero-copy staging of checkpoint bytes through the checkpoint service's
shared-memory directory (the Python side of the protocol in
``services/checkpoint/README.md``; the C client's is ``client/c/ckpt_seg.c``).

When the service runs on this host (``GetStagingInfo`` names a directory
holding ``instance-<token>``), a rank copies its chunks once into segment
files ``seg-<attempt>-<rank>-<tag>`` of that directory and sends only each
chunk's metadata (segment name and offset) over the Write stream. A segment
collects chunks up to the service's limit; it is created (mode 0600) or
claimed from the service's pool of recycled ``free-*`` files by an atomic
rename (their pages already exist), cut to exactly the bytes placed, and
only then announced, in order from offset 0. From its first message on the
service owns the file: a rank that dies after that loses nothing.
``STOKER_CKPT_SHM=off`` turns this off (bytes go inline).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from typing import Any

from stoker.connection import CHECKPOINT, Connection
from stoker.v1 import checkpoint_pb2 as pb

SEGMENT_BYTES = 64 << 20  # largest segment this client makes


def _token_ok(token: str) -> bool:
    return 0 < len(token) <= 64 and all(c in "0123456789abcdef" for c in token)


class ShmStaging:
    """Segments of one rank's Write stream."""

    def __init__(self, directory: str, attempt: str, rank: int, cap: int) -> None:
        self.dir = directory
        self.attempt, self.rank, self.cap = attempt, rank, cap
        self._tag = secrets.token_hex(4)
        self._count = 0
        self._fd = -1
        self._name = ""
        self._used = 0
        self._held: list[pb.WriteChunk] = []

    @classmethod
    def open(cls, conn: Connection, attempt: str, rank: int) -> ShmStaging | None:
        """Staging for this rank, or None when the service is elsewhere, has
        it off, or STOKER_CKPT_SHM says off."""
        if os.environ.get("STOKER_CKPT_SHM", "auto") in ("0", "off"):
            return None
        info = conn.unary(
            CHECKPOINT + "GetStagingInfo",
            pb.StagingInfoRequest(),
            pb.StagingInfo,
            retry=True,
        )
        d = info.shm_dir
        if not d.startswith("/") or not _token_ok(info.shm_token) or info.shm_max_bytes == 0:
            return None
        if not os.path.lexists(os.path.join(d, f"instance-{info.shm_token}")):
            return None  # a directory of that name on another host
        return cls(d, attempt, rank, min(int(info.shm_max_bytes), SEGMENT_BYTES))

    def _start(self) -> None:
        self._name = f"seg-{self.attempt}-{self.rank}-{self._tag}{self._count:08x}"
        self._count += 1
        path = os.path.join(self.dir, self._name)
        self._fd = -1
        for entry in os.scandir(self.dir):
            if entry.name.startswith("free-"):
                try:  # claim a recycled file: its pages exist already
                    os.rename(entry.path, path)
                except OSError:
                    continue  # another rank was faster
                self._fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
                break
        if self._fd < 0:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            self._fd = os.open(path, flags, 0o600)
        self._used = 0

    def add(self, msg: pb.WriteChunk, data: Any, nbytes: int) -> Iterator[pb.WriteChunk]:
        """Copies a chunk's bytes (any buffer of nbytes <= cap) into the
        current segment; yields the messages of a segment it completed."""
        if self._fd >= 0 and self._used + nbytes > self.cap:
            yield from self.flush()
        if self._fd < 0:
            self._start()
        view = memoryview(data).cast("B")
        done = 0
        while done < nbytes:
            done += os.pwrite(self._fd, view[done:], self._used + done)
        msg.shm_name = self._name
        msg.shm_offset = self._used
        self._held.append(msg)
        self._used += nbytes

    def flush(self) -> Iterator[pb.WriteChunk]:
        """Cuts the segment to the bytes placed and yields its messages."""
        if self._fd < 0:
            return
        os.ftruncate(self._fd, self._used)
        os.close(self._fd)
        self._fd = -1
        held, self._held = self._held, []
        yield from held

    def discard(self) -> None:
        """Removes a segment never announced (the stream failed first)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            if self._held or self._used:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.dir, self._name))
        self._held = []

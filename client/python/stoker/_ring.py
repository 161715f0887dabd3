"""The client end of a dataloader shared-memory ring (the layout is
``services/common/shm_ring.h``; this is its Python reader).

A ``StreamBatches`` call that carries a 16-byte nonce lets a daemon on the
same host write each batch into a slot of a ring file and send only "sequence
n is ready". The client maps the file (found by path in the first such batch),
checks magic, nonce and geometry, removes the name at once, reads sequence n
in slot ``(n - 1) % slots`` in place and stores n in the slot's release word
once it no longer reads it; the daemon reuses the slot only after that.

Header (host byte order, first page)::

    0   magic "STKRING1"        24  u32 slots       32  u64 slot_bytes
    8   nonce[16]               28  u32 reserved    40  u64 data_offset
    64  u64 released[slots]     (written by the client only)
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import struct
from typing import Any

import numpy as np
from numpy.typing import NDArray

MAGIC = b"STKRING1"
NONCE_BYTES = 16
MAX_SLOTS = 256
_HEADER = struct.Struct("=8s16sIIQQ")  # magic, nonce, slots, reserved, slot_bytes, data_offset
_RELEASED_AT = 64


class RingError(Exception):
    """The ring file is not one this client may read (wrong host, nonce,
    owner or geometry); the caller falls back to bytes over gRPC."""


class Ring:
    """A mapped ring; ``view(seq, count, dtype)`` is a numpy array over slot
    memory (no copy) valid until ``release(seq)``. Slots hold little-endian
    uint32 tokens, or int64 when the stream asked for 8-byte tokens."""

    def __init__(self, path: str, nonce: bytes) -> None:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, flags)
        except FileNotFoundError as e:
            raise RingError(f"{path}: not on this host") from e
        except OSError as e:
            raise RingError(f"{path}: {e.strerror}") from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise RingError(f"{path}: not a regular file of this user")
            if st.st_size < 4096:
                raise RingError(f"{path}: too small for a ring header")
            self._map = mmap.mmap(fd, st.st_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        magic, file_nonce, slots, _, slot_bytes, data_offset = _HEADER.unpack_from(self._map, 0)
        if magic != MAGIC or file_nonce != nonce:
            self._map.close()
            raise RingError(f"{path}: not the ring of this stream (magic or nonce differ)")
        end = data_offset + slots * slot_bytes
        if (
            not 1 <= slots <= MAX_SLOTS
            or data_offset < _RELEASED_AT + 8 * slots
            or slot_bytes == 0
            or end > st.st_size
        ):
            self._map.close()
            raise RingError(f"{path}: geometry does not fit the file")
        # The memory now lives as long as the two mappings.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.path = path
        self.slots = int(slots)
        self.slot_bytes = int(slot_bytes)
        self._data_offset = int(data_offset)

    def view(self, seq: int, tokens: int, dtype: Any = np.uint32) -> NDArray[Any]:
        """The tokens of sequence ``seq`` (>= 1) as little-endian ``dtype``
        (uint32 or int64, the stream's token width), in place."""
        dt = np.dtype(dtype).newbyteorder("<")
        if seq < 1 or tokens * dt.itemsize > self.slot_bytes:
            raise RingError(f"sequence {seq} of {tokens} tokens does not fit a slot")
        offset = self._data_offset + ((seq - 1) % self.slots) * self.slot_bytes
        return np.frombuffer(self._map, dtype=dt, count=tokens, offset=offset)

    def release(self, seq: int) -> None:
        """The client no longer reads sequence ``seq``: the daemon may reuse
        its slot. A no-op once the ring is unmapped."""
        with contextlib.suppress(ValueError):  # Closed: nobody reads it any more.
            struct.pack_into("=Q", self._map, _RELEASED_AT + 8 * ((seq - 1) % self.slots), seq)

    def close(self) -> None:
        # A view handed out may still be alive: the mapping then goes with it.
        with contextlib.suppress(BufferError):
            self._map.close()

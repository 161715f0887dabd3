"""Checkpoint reads through the checkpoint service's shared-memory directory
(the Python side of ``ReadRequest.shm_name`` in
``services/checkpoint/README.md``).

When the service runs on this host (``GetStagingInfo`` names a directory
holding ``instance-<token>`` and a ``shm_read_max_bytes``), a rank creates a
file ``read-<32 hex digits>`` there (mode 0600, ``O_EXCL``), allocates its
pages, writes the header (``STKREAD1`` and a random 32-byte nonce) and names
file and nonce in its ``ReadRequest``. The service writes the wanted boxes
into it, one after the other, row-major, from byte ``DATA`` on, and sends
each piece's offset and length instead of its bytes; the rank copies each
box from its mapping into the destination tensor as soon as the box is
complete, and removes the file when the load is done. No byte crosses gRPC
or protobuf. ``STOKER_CKPT_SHM=off`` turns this off (bytes come inline).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets

import torch

from stoker._proto import method
from stoker.connection import Connection
from stoker.v1 import checkpoint_pb2 as pb

GET_STAGING_INFO = method(pb, "Checkpoint", "GetStagingInfo")
MAGIC = b"STKREAD1"
NONCE_BYTES = 32
DATA = 4096  # where the service writes the first wanted byte
FILE_BYTES = 256 << 20  # largest read file this client makes


def _token_ok(token: str) -> bool:
    return 0 < len(token) <= 64 and all(c in "0123456789abcdef" for c in token)


def read_directory(conn: Connection) -> tuple[str, int, str] | None:
    """(directory, largest file, replica) for reads through shared memory, or
    None when the service is elsewhere, too old, has it off, or
    STOKER_CKPT_SHM is off. The largest file: FILE_BYTES, or
    STOKER_CKPT_SHM_READ_BYTES (tests), within what the service accepts. The
    replica: the address of the one whose directory it is (the Read naming a
    file there goes to it), "" for a service that is not replicated."""
    if os.environ.get("STOKER_CKPT_SHM", "auto") in ("0", "off"):
        return None
    info = GET_STAGING_INFO.call(conn, True)
    d = info.shm_dir
    if not d.startswith("/") or not _token_ok(info.shm_token):
        return None
    if info.shm_read_max_bytes <= DATA:
        return None  # a service without shared-memory reads
    if not os.path.lexists(os.path.join(d, f"instance-{info.shm_token}")):
        return None  # a directory of that name on another host
    cap = int(os.environ.get("STOKER_CKPT_SHM_READ_BYTES", FILE_BYTES))
    return d, min(int(info.shm_read_max_bytes), max(cap, DATA + 8)), str(info.owner)


class ShmReadFile:
    """One rank's read file: created with its header, mapped, removed by close."""

    def __init__(self, directory: str, size: int) -> None:
        self.name = "read-" + secrets.token_hex(16)
        self.nonce = secrets.token_bytes(NONCE_BYTES)
        self.path = os.path.join(directory, self.name)
        self.size = size
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.path, flags, 0o600)
        try:
            # Pages now, from this process (tmpfs full: an error here, and the
            # caller reads inline), so the service's writes allocate nothing.
            os.posix_fallocate(fd, 0, size)
            os.pwrite(fd, MAGIC + self.nonce, 0)
            self.map = mmap.mmap(fd, size)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            raise
        finally:
            os.close(fd)

    def tensor(self, offset: int, nbytes: int) -> torch.Tensor:
        """A uint8 tensor over nbytes of the file at offset (no copy)."""
        return torch.frombuffer(self.map, dtype=torch.uint8, count=nbytes, offset=offset)

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Places bytes that came inline where the service would have put them."""
        self.map[offset : offset + len(data)] = data

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(BufferError):  # a view still alive: freed with it
            self.map.close()

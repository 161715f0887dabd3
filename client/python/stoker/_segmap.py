"""The staging segment files this process keeps mapped (the Python side of
``client/c/ckpt_segmap.c``). Copying a shard into a segment with ``pwrite``
costs about twice a memcpy even when the file's pages exist (the kernel
looks up and locks every page), and a fresh mapping costs a page fault per
4 KiB. So a segment file stays mapped here after its messages are sent, and
once the service has uploaded it and recycled it into its pool
(``free-*``), the next checkpoint of this process claims it again and
copies into pages that exist and are mapped already.

The hand-over stays the one the service checks: a file is written only
between claiming it (the atomic rename of a ``free-*`` entry to our
``seg-*`` name, which succeeds only once the service gave the file up, or
creating it) and sending its chunk messages. Keeping the mapping afterwards
gives this process no access it did not have (the directory is its user's,
0700). Claims prefer files mapped here (the directory entry's inode against
the cache). Bytes beyond what the file held are reserved with
``posix_fallocate`` before the copy, so a full tmpfs raises ``OSError``
(ENOSPC) instead of SIGBUS on a store into a hole. A cached file the service
removed has no links left; it is unmapped at the next claim.

Threads: every function takes one process-wide lock.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import stat
import threading
from dataclasses import dataclass

import torch

# Linux 5.14's; older kernels refuse it (best effort).
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
MAX_CACHED = 64  # Files kept mapped (the service's pool holds 16 of 64 MiB).


@dataclass
class SegFile:
    """A claimed segment: its descriptor and a byte tensor over its mapping."""

    fd: int
    mm: mmap.mmap
    bytes: torch.Tensor  # uint8 [cap], a view of mm
    cap: int
    alloc: int  # Bytes from offset 0 known to be allocated (no holes).
    busy: bool = True  # Claimed by a writer, not yet handed over.


_lock = threading.Lock()
_cache: dict[tuple[int, int], SegFile] = {}
reused = 0  # Claims that found their file mapped here already (tests read it).


def _drop(key: tuple[int, int]) -> None:
    f = _cache.pop(key)
    _close(f)


def _close(f: SegFile) -> None:
    del f.bytes  # The tensor holds an export of the mapping.
    with contextlib.suppress(BufferError, ValueError):
        f.mm.close()
    os.close(f.fd)


def _prune() -> None:
    for key, f in list(_cache.items()):
        if not f.busy:
            try:
                gone = os.fstat(f.fd).st_nlink == 0
            except OSError:
                gone = True
            if gone:
                _drop(key)


def _allocated(fd: int) -> int:
    st = os.fstat(fd)
    pages = (st.st_size + 4095) // 4096 * 4096
    return st.st_size if st.st_size > 0 and st.st_blocks * 512 >= pages else 0


def _claim(directory: str, path: str) -> int:
    """Renames a pool file (one mapped here first) to path; its fd or -1."""
    dev = os.stat(directory).st_dev
    with os.scandir(directory) as it:
        free = [e for e in it if e.name.startswith("free-")]
    mine = [e for e in free if (c := _cache.get((dev, e.inode()))) is not None and not c.busy]
    for e in mine + [e for e in free if e not in mine]:
        try:
            os.rename(e.path, path)
        except OSError:
            continue  # another rank was faster
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            fd = -1
        if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
            if fd >= 0:
                os.close(fd)  # Not a regular file (planted in the pool): removed.
            with contextlib.suppress(OSError):
                os.unlink(path)
            return -1
        return fd
    return -1


def acquire(directory: str, name: str, cap: int) -> SegFile:
    """Claims or creates segment file name in directory, mapped for cap bytes."""
    global reused
    path = os.path.join(directory, name)
    with _lock:
        _prune()
        fd = _claim(directory, path)
        if fd >= 0:
            st = os.fstat(fd)
            c = _cache.get((st.st_dev, st.st_ino))
            if c is not None and not c.busy and c.cap >= cap:
                os.close(fd)
                c.busy = True
                c.alloc = _allocated(c.fd)
                reused += 1
                return c
            if c is not None and not c.busy:
                _drop((st.st_dev, st.st_ino))  # Mapped too short for this service.
        else:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(path, flags, 0o600)
        try:
            alloc = _allocated(fd)
            if os.fstat(fd).st_size < cap:
                os.ftruncate(fd, cap)  # Python maps no more than the file's size.
            mm = mmap.mmap(fd, cap, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if alloc > 0:  # The pages it holds, mapped in one call (best effort).
                with contextlib.suppress(OSError):
                    mm.madvise(MADV_POPULATE_WRITE, 0, alloc // mmap.PAGESIZE * mmap.PAGESIZE)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        f = SegFile(fd, mm, torch.frombuffer(mm, dtype=torch.uint8), cap, alloc)
        st = os.fstat(fd)
        if len(_cache) < MAX_CACHED:
            _cache[(st.st_dev, st.st_ino)] = f
        return f


def write(f: SegFile, offset: int, data: torch.Tensor) -> None:
    """Copies data (a uint8 tensor) to offset of f, reserving its pages first."""
    end = offset + data.numel()
    if end > f.cap:
        raise ValueError(f"{end} bytes do not fit a segment of {f.cap}")
    if end > f.alloc:
        os.posix_fallocate(f.fd, f.alloc, end - f.alloc)
        start = f.alloc // mmap.PAGESIZE * mmap.PAGESIZE
        with contextlib.suppress(OSError):  # One call instead of a fault per page.
            f.mm.madvise(MADV_POPULATE_WRITE, start, end - start)
        f.alloc = end
    f.bytes[offset:end].copy_(data)


def complete(f: SegFile, used: int) -> None:
    """Cuts f to the bytes placed (the service maps the file whole) and
    keeps it mapped for a later claim."""
    try:
        if os.fstat(f.fd).st_size != used:
            os.ftruncate(f.fd, used)
    except BaseException:
        _release(f, keep=False)
        raise
    _release(f, keep=True)


def discard(f: SegFile, path: str) -> None:
    """Removes a segment never announced."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    _release(f, keep=False)


def _release(f: SegFile, keep: bool) -> None:
    with _lock:
        key = next((k for k, c in _cache.items() if c is f), None)
        if key is not None and keep:
            f.busy = False
        elif key is not None:
            _drop(key)
        else:
            _close(f)

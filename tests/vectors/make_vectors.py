"""Writes the shared-memory test vectors of this folder from the layouts as
documented (services/common/shm_ring.h for the ring, client/c/ckpt_seg.c and
stoker/_segments.py's opening comments for segments,
services/checkpoint/ckpt_shm_read.h for read files), with nothing of either
implementation: ``python3 tests/vectors/make_vectors.py [DIR]`` (default:
this folder). The C unit tests and pytest check both implementations
against the files it wrote; tests/python/test_shm_vectors.py also checks
that this script still writes exactly the checked-in bytes."""

from __future__ import annotations

import json
import pathlib
import struct
import sys

HERE = pathlib.Path(__file__).resolve().parent

# ---- the dataloader's ring -----------------------------------------------------------

PAGE = 4096
RING = {
    "nonce_hex": bytes(range(0x10, 0x20)).hex(),
    "slots": 2,
    "slot_bytes": PAGE,
    "data_offset": PAGE,
    # What the daemon wrote: sequence -> uint32 little-endian tokens.
    "sequences": {"1": [1000 + i for i in range(16)], "2": [70000 + 3 * i for i in range(5)]},
    # What the client released afterwards (the highest sequence per slot).
    "released": [1],
}


def ring_bytes(released: list[int]) -> bytes:
    """The ring file: header, released words, then each slot (zeros where
    nothing was written)."""
    slots, slot_bytes = RING["slots"], RING["slot_bytes"]
    out = bytearray(PAGE + slots * slot_bytes)
    nonce = bytes.fromhex(RING["nonce_hex"])
    struct.pack_into("<8s16sIIQQ", out, 0, b"STKRING1", nonce, slots, 0, slot_bytes, PAGE)
    for seq in released:
        struct.pack_into("<Q", out, 64 + 8 * ((seq - 1) % slots), seq)
    for seq, tokens in RING["sequences"].items():
        at = PAGE + ((int(seq) - 1) % slots) * slot_bytes
        struct.pack_into(f"<{len(tokens)}I", out, at, *tokens)
    return bytes(out)


# ---- the checkpoint service's staging segments ----------------------------------------

# A rank stages these chunks, in this order, into segments of at most
# cap bytes: each chunk goes at the first free byte of the current segment,
# a chunk that does not fit completes the segment (cut to the bytes placed)
# and starts the next at offset 0. Byte i of a chunk is (fill + i) % 251.
SEGMENTS = {
    "cap": 4096,
    "attempt": "0123456789abcdef0123456789abcdef",
    "rank": 3,
    "chunks": [
        {"tensor": "model.w", "length": 1000, "fill": 1},
        {"tensor": "model.b", "length": 2000, "fill": 2},
        {"tensor": "opt.m", "length": 1500, "fill": 3},
        {"tensor": "opt.v", "length": 96, "fill": 4},
    ],
}


def chunk_bytes(c: dict[str, int]) -> bytes:
    return bytes((c["fill"] + i) % 251 for i in range(c["length"]))


def place() -> tuple[list[bytes], list[dict[str, object]]]:
    """The segments' bytes and each chunk's (segment, offset)."""
    segs: list[bytearray] = []
    where: list[dict[str, object]] = []
    for c in SEGMENTS["chunks"]:
        if not segs or len(segs[-1]) + c["length"] > SEGMENTS["cap"]:
            segs.append(bytearray())
        where.append({"tensor": c["tensor"], "segment": len(segs) - 1, "offset": len(segs[-1])})
        segs[-1] += chunk_bytes(c)
    return [bytes(s) for s in segs], where


# ---- the checkpoint service's read files ----------------------------------------------

# A rank reading through shared memory makes a file of `size` bytes whose
# first bytes are "STKREAD1" and its nonce (the rest zero); the service
# writes the wanted pieces one after the other from data_offset on. Byte i
# of a piece is (fill + i) % 251.
READ = {
    "nonce_hex": bytes(range(0xA0, 0xC0)).hex(),
    "size": 2 * PAGE,
    "data_offset": PAGE,
    "pieces": [{"length": 300, "fill": 5}, {"length": 1000, "fill": 6}],
}


def read_bytes(served: bool) -> bytes:
    out = bytearray(READ["size"])
    out[0:8] = b"STKREAD1"
    nonce = bytes.fromhex(READ["nonce_hex"])
    out[8 : 8 + len(nonce)] = nonce
    at = READ["data_offset"]
    for p in READ["pieces"] if served else []:
        out[at : at + p["length"]] = chunk_bytes(p)
        at += p["length"]
    return bytes(out)


def files() -> dict[str, bytes]:
    segs, where = place()
    out = {
        "ring-daemon.bin": ring_bytes([]),
        "ring-released.bin": ring_bytes(RING["released"]),
        "ring.json": json.dumps(RING, indent=2).encode() + b"\n",
        "segments.json": json.dumps({**SEGMENTS, "placed": where}, indent=2).encode() + b"\n",
        "read.json": json.dumps(READ, indent=2).encode() + b"\n",
        "read-client.bin": read_bytes(False),
        "read-served.bin": read_bytes(True),
    }
    for i, s in enumerate(segs):
        out[f"segment-{i}.bin"] = s
    return out


def main() -> None:
    d = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    for name, data in files().items():
        (d / name).write_bytes(data)


if __name__ == "__main__":
    main()

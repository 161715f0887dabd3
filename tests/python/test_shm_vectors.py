"""The Python ends of the shared-memory protocols against the checked-in
test vectors (tests/vectors), which the C unit test ``shm_vectors`` holds
the daemon's ring writer, the C client's ring reader and its staging to as
well: stoker._ring reads each sequence of ring-daemon.bin in its slot and,
once it releases them, leaves ring-released.bin; stoker._segments places the
chunks of segments.json in the segments and at the offsets the vector
names, each segment file exactly segment-<i>.bin; stoker._shm_read makes a
read file exactly read-client.bin (header and nonce) and the served pieces
sit where read-served.bin has them; and make_vectors.py still writes exactly
the checked-in files. No daemon runs."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from stoker import _segmap, _shm_read
from stoker._ring import Ring
from stoker._segments import ShmStaging
from stoker.v1 import checkpoint_pb2 as pb

VECTORS = pathlib.Path(__file__).resolve().parents[1] / "vectors"

pytestmark = pytest.mark.skipif(sys.byteorder != "little", reason="the vectors are little-endian")


def vector(name: str) -> bytes:
    return (VECTORS / name).read_bytes()


def test_make_vectors_writes_the_checked_in_bytes(tmp_path):
    subprocess.run([sys.executable, str(VECTORS / "make_vectors.py"), str(tmp_path)], check=True)
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == sorted(p.name for p in VECTORS.iterdir() if p.suffix in (".bin", ".json"))
    for name in made:
        assert (tmp_path / name).read_bytes() == vector(name), name


def test_ring_reader_reads_and_releases_as_the_vector(tmp_path):
    ring = json.loads(vector("ring.json"))
    path = tmp_path / "ring-vector"
    path.write_bytes(vector("ring-daemon.bin"))
    path.chmod(0o600)
    fd = os.open(path, os.O_RDONLY)
    try:
        r = Ring(str(path), bytes.fromhex(ring["nonce_hex"]))
        assert not path.exists()  # the reader removed the name
        assert (r.slots, r.slot_bytes) == (ring["slots"], ring["slot_bytes"])
        for seq, tokens in ring["sequences"].items():
            got = r.view(int(seq), len(tokens), np.uint32)
            assert got.tolist() == tokens
            del got
        for seq in ring["released"]:
            r.release(seq)
        assert os.pread(fd, os.fstat(fd).st_size, 0) == vector("ring-released.bin")
        r.close()
    finally:
        os.close(fd)


def test_staging_places_the_chunks_as_the_segment_vectors(tmp_path):
    v = json.loads(vector("segments.json"))
    tmp_path.chmod(0o700)
    staging = ShmStaging(str(tmp_path), v["attempt"], v["rank"], v["cap"])
    sent: list[pb.WriteChunk] = []
    for c in v["chunks"]:
        data = bytes((c["fill"] + i) % 251 for i in range(c["length"]))
        msg = pb.WriteChunk(tensor=c["tensor"], dtype=pb.DTYPE_U8, global_shape=[len(data)])
        msg.box.offsets.append(0)
        msg.box.sizes.append(len(data))
        sent.extend(staging.add(msg, data, len(data)))
    sent.extend(staging.flush())

    prefix = f"seg-{v['attempt']}-{v['rank']}-"
    names: list[str] = []
    assert len(sent) == len(v["placed"])
    for msg, want in zip(sent, v["placed"], strict=True):
        assert (msg.tensor, msg.shm_offset) == (want["tensor"], want["offset"])
        assert msg.shm_name.startswith(prefix)
        if want["segment"] == len(names):  # a new segment, a new name
            assert msg.shm_name not in names
            names.append(msg.shm_name)
        assert msg.shm_name == names[want["segment"]]
    for i, name in enumerate(names):
        assert (tmp_path / name).read_bytes() == vector(f"segment-{i}.bin"), name
    _segmap._prune()


def test_read_file_is_made_and_filled_as_the_read_vectors(tmp_path, monkeypatch):
    v = json.loads(vector("read.json"))
    assert v["data_offset"] == _shm_read.DATA
    nonce = bytes.fromhex(v["nonce_hex"])
    monkeypatch.setattr(_shm_read.secrets, "token_bytes", lambda n: nonce[:n])
    f = _shm_read.ShmReadFile(str(tmp_path), v["size"])
    try:
        assert (tmp_path / f.name).read_bytes() == vector("read-client.bin")
        # What the service writes lands where the rank looks for it: each
        # piece, in order, from DATA on (written here as inline bytes are).
        at = v["data_offset"]
        for p in v["pieces"]:
            f.write(at, bytes((p["fill"] + i) % 251 for i in range(p["length"])))
            at += p["length"]
        assert (tmp_path / f.name).read_bytes() == vector("read-served.bin")
    finally:
        f.close()
    assert not (tmp_path / f.name).exists()

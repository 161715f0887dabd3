"""One rank of the checkpoint half of the Python benchmark (started by
python_ckpt.py, never by hand): joins a gloo process group, holds a sharded
state dict and runs DCP saves or loads on command, through Stoker or a peer.

Commands arrive on stdin, one JSON object a line; each rank answers with
one JSON line on stdout (and logs nothing else there):
  {"op": "save", "peer": P, "key": K}   dcp.async_save; answers the seconds
      until it returned (the training stall) and until its future resolved
      (durable: DCP's finish ran, the checkpoint is committed)
  {"op": "load", "peer": P, "key": K}   dcp.load into zeroed DTensors at this
      process group's world size; answers the seconds, then checks every
      element it loaded (outside the timing)
  {"op": "quit"}
A command's timing starts after a barrier, so the ranks start together.

Usage: python_ckpt_rank.py save|load RANK WORLD INIT_FILE BYTES
(a "save" rank holds the state dict from the start; a "load" rank only
makes the zeroed one of each load)
Environment: STOKER_CHECKPOINT (the service), AWS_ENDPOINT_URL and AWS_*
credentials (the S3 server of the peers).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, Shard, zeros

from stoker.checkpoint import StokerReader, StokerWriter

JOB = "pybench"
BUCKET = "bench"
REGION = "us-east-1"
COLS = 4096  # f32 per row: 16 KiB rows.
TENSORS = 16  # 8 layers x (weight, optimizer moment)
IO_THREADS = 8  # Writer threads per rank for the DCP file writers (s3torchconnector's example).
EXACT = 1 << 23  # Element values cycle below this, exact in f32.
COPY_STEP_OFFSET = 100000  # The steps of the "stoker_copy" saves: key + this.


def names() -> list[str]:
    out = []
    for layer in range(TENSORS // 2):
        out += [f"model.layers.{layer}.weight", f"optim.layers.{layer}.exp_avg"]
    return out


def rows_of(total_bytes: int) -> int:
    """Rows of each [rows, COLS] f32 tensor, so that all hold total_bytes."""
    return max(12, total_bytes // (TENSORS * COLS * 4) // 12 * 12)


def expected(k: int, row0: int, rows: int) -> torch.Tensor:
    """Rows [row0, row0 + rows) of tensor k: element i of the whole tensor
    holds (i mod 2^23) + k."""
    i = torch.arange(row0 * COLS, (row0 + rows) * COLS, dtype=torch.int64)
    return ((i % EXACT) + k).to(torch.float32).view(rows, COLS)


def local_rows(total_rows: int, mesh: DeviceMesh) -> tuple[int, int]:
    """This rank's first row and row count under Shard(0) (torch.chunk's split)."""
    world, rank = mesh.size(), mesh.get_local_rank()
    per = -(-total_rows // world)
    row0 = min(rank * per, total_rows)
    return row0, min(per, total_rows - row0)


def state(total_rows: int, mesh: DeviceMesh, empty: bool) -> dict[str, Any]:
    """The state dict: DTensors sharded on dim 0, plus a byte item (the
    trainer's counters and the dataset position, as DCP pickles them)."""
    sd: dict[str, Any] = {}
    row0, rows = local_rows(total_rows, mesh)
    for k, name in enumerate(names()):
        if empty:
            sd[name] = zeros((total_rows, COLS), device_mesh=mesh, placements=[Shard(0)])
        else:
            sd[name] = DTensor.from_local(
                expected(k, row0, rows),
                mesh,
                [Shard(0)],
                run_check=False,
                shape=torch.Size((total_rows, COLS)),
                stride=(COLS, 1),
            )
    sd["train"] = {"step": 0 if empty else 1000, "dataset": {"next_step": 0 if empty else 1000}}
    return sd


def check(sd: dict[str, Any], total_rows: int, mesh: DeviceMesh) -> None:
    row0, rows = local_rows(total_rows, mesh)
    for k, name in enumerate(names()):
        got = sd[name].to_local()
        if not torch.equal(got, expected(k, row0, rows)):
            raise RuntimeError(f"{name}: loaded rows differ from the saved ones")
    if sd["train"]["step"] != 1000:
        raise RuntimeError("the byte item was not loaded")


class Peers:
    """Writers and readers by peer name, with the clients each peer keeps
    for the whole run (a trainer keeps its client too)."""

    def __init__(self) -> None:
        self.endpoint = os.environ["AWS_ENDPOINT_URL"]
        self.stoker_addr = os.environ["STOKER_CHECKPOINT"]
        self.s3_options = {
            "endpoint_url": self.endpoint,
            "key": os.environ["AWS_ACCESS_KEY_ID"],
            "secret": os.environ["AWS_SECRET_ACCESS_KEY"],
        }
        self._tc_client: Any = None
        self.stoker_reader = StokerReader(JOB, self.stoker_addr)

    def tc_client(self) -> Any:
        """s3torchconnector's client (the Rust/CRT one) with the endpoint
        override and path-style addressing a local S3 server needs: its DCP
        classes take neither, so their file system is given this client."""
        from s3torchconnector import S3ClientConfig
        from s3torchconnector._s3client import S3Client

        if self._tc_client is None:
            config = S3ClientConfig(force_path_style=True)
            self._tc_client = S3Client(REGION, endpoint=self.endpoint, s3client_config=config)
        return self._tc_client

    def writer(self, peer: str, key: str) -> tuple[Any, str | None]:
        """(storage writer, checkpoint_id) for the checkpoint named key."""
        if peer == "stoker":
            # As the package's README has it for async_save: the step given
            # to the writer, so that staging writes to the service at once.
            return StokerWriter(JOB, self.stoker_addr, step=int(key)), key
        if peer == "stoker_copy":
            return StokerWriter(JOB, self.stoker_addr), str(int(key) + COPY_STEP_OFFSET)
        path = f"s3://{BUCKET}/{peer}/{key}"
        if peer == "s3torchconnector":
            from s3torchconnector.dcp import S3StorageWriter
            from s3torchconnector.dcp.s3_file_system import S3FileSystem

            w = S3StorageWriter(REGION, path, thread_count=IO_THREADS)
            w.fs = S3FileSystem(REGION, s3_client=self.tc_client())
            return w, None
        if peer == "s3fs":
            # sync_files=False: an S3 stream has no fileno, and DCP's
            # fallback for that is os.sync() of the whole machine.
            return (
                FsspecWriter(path, sync_files=False, thread_count=IO_THREADS, **self.s3_options),
                None,
            )
        raise ValueError(peer)

    def reader(self, peer: str, key: str) -> tuple[Any, str | None]:
        if peer == "stoker":
            return self.stoker_reader, key
        path = f"s3://{BUCKET}/{peer}/{key}"
        if peer == "s3torchconnector":
            from s3torchconnector.dcp import S3StorageReader
            from s3torchconnector.dcp.s3_file_system import S3FileSystem

            r = S3StorageReader(REGION, path)
            r.fs = S3FileSystem(
                REGION, s3_client=self.tc_client(), reader_constructor=r._reader_constructor
            )
            return r, None
        if peer == "s3fs":
            return FsspecReader(path, **self.s3_options), None
        raise ValueError(peer)


def save(peers: Peers, sd: dict[str, Any], cmd: dict[str, Any]) -> dict[str, Any]:
    writer, cid = peers.writer(cmd["peer"], cmd["key"])
    dist.barrier()
    t0 = time.perf_counter()
    res = dcp.async_save(sd, storage_writer=writer, checkpoint_id=cid)
    stall = time.perf_counter() - t0
    getattr(res, "upload_completion", res).result()
    reply: dict[str, Any] = {"stall_s": stall, "durable_s": time.perf_counter() - t0}
    if cmd["peer"].startswith("stoker"):  # How the bytes went, as the writer says.
        reply["transport"] = getattr(writer, "transport", "grpc")
    return reply


def load(peers: Peers, total_rows: int, mesh: DeviceMesh, cmd: dict[str, Any]) -> dict[str, Any]:
    sd = state(total_rows, mesh, empty=True)
    reader, cid = peers.reader(cmd["peer"], cmd["key"])
    dist.barrier()
    t0 = time.perf_counter()
    dcp.load(sd, storage_reader=reader, checkpoint_id=cid)
    seconds = time.perf_counter() - t0
    check(sd, total_rows, mesh)
    return {"load_s": seconds}


def main() -> None:
    role, rank, world, init_file, total_bytes = sys.argv[1:6]
    out = sys.stdout
    sys.stdout = sys.stderr  # Only answers go to the controller's pipe.
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=int(rank), world_size=int(world)
    )
    mesh = init_device_mesh("cpu", (int(world),))
    total_rows = rows_of(int(total_bytes))
    peers = Peers()
    sd = state(total_rows, mesh, empty=False) if role == "save" else {}
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            reply = (
                save(peers, sd, cmd) if cmd["op"] == "save" else load(peers, total_rows, mesh, cmd)
            )
        except Exception as e:  # The controller reports it and goes on.
            reply = {"error": f"{type(e).__name__}: {e}"[:2000]}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

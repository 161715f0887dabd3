"""One rank of the DCP tests (run as a process by test_checkpoint.py):
saves or loads a state dict through StokerWriter / StokerReader over a gloo
process group, and writes what it loaded to a file for the test to compare.

The state dict (identical on every world size, from fixed seeds): DTensors
sharded on dim 0 over all ranks (f32, bf16, int64), a replicated f64 tensor,
a 0-d tensor, a bool mask, and a byte item (plain Python objects, as a
dataset's state_dict).

Usage: dcp_rank.py MODE ADDR JOB STEP RANK WORLD INIT_FILE OUT
  MODE: save, async_save, async_save_copy, async_save_exit, async_save_kill
  (SIGKILL right after async_save returned), async_save_count (writes to
  OUT, as JSON, the collectives async_save ran before it returned) or load
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from stoker.checkpoint import StokerReader, StokerWriter


def full_state() -> dict[str, object]:
    g = torch.Generator().manual_seed(1234)
    return {
        "model.embed.weight": torch.randn(37, 16, generator=g),
        "model.block.0.weight": torch.randn(23, 9, generator=g).to(torch.bfloat16),
        "model.block.0.counts": torch.randint(0, 1 << 40, (19, 3), generator=g),
        "model.scale": torch.randn(5, generator=g).to(torch.float64),
        "optim.step": torch.tensor(42.5),
        "model.mask": torch.rand(11, generator=g) > 0.5,
        "extra": {"dataset": {"version": 1, "job": "pt", "next_step": 77}, "note": "hi"},
    }


def sharded(world: int, zero: bool) -> dict[str, object]:
    mesh = init_device_mesh("cpu", (world,))
    out: dict[str, object] = {}
    for k, v in full_state().items():
        if isinstance(v, torch.Tensor) and k.startswith("model.") and v.dim() == 2:
            t = torch.zeros_like(v) if zero else v
            out[k] = distribute_tensor(t, mesh, [Shard(0)])
        elif isinstance(v, torch.Tensor):
            out[k] = torch.zeros_like(v) if zero else v.clone()
        else:
            # DCP loads in place: the loading dict names every key it wants.
            out[k] = (
                {"dataset": {"version": 0, "job": "", "next_step": 0}, "note": ""} if zero else v
            )
    return out


# The torch.distributed calls through which DCP and the writer synchronize
# ranks (each object collective is two gloo operations inside).
COLLECTIVES = (
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "broadcast_object_list",
    "all_gather",
    "all_reduce",
    "broadcast",
    "barrier",
)


def count_collectives() -> list[str]:
    """Wraps COLLECTIVES in torch.distributed; the list grows by one name
    per call on the training (main) thread."""
    calls: list[str] = []

    def counted(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.current_thread() is threading.main_thread():
                calls.append(name)  # (not async_save's background thread)
            return fn(*args, **kwargs)

        return call

    for name in COLLECTIVES:
        setattr(dist, name, counted(name, getattr(dist, name)))
    return calls


def main() -> None:
    mode, addr, job, step, rank, world, init_file, out = sys.argv[1:9]
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=int(rank), world_size=int(world)
    )
    if mode != "load":
        state = sharded(int(world), zero=False)
        # With step= the writer stages on the service inside async_save;
        # without, DCP's own CPU copy stages and the bytes move later.
        writer = StokerWriter(job, addr, step=None if mode == "async_save_copy" else int(step))
        if mode == "save":
            dcp.save(state, storage_writer=writer, checkpoint_id=step)
        else:
            calls = count_collectives() if mode == "async_save_count" else []
            res = dcp.async_save(state, storage_writer=writer, checkpoint_id=step)
            if mode == "async_save_count":
                with open(out, "w") as f:
                    json.dump(calls, f)
            if mode in ("async_save_exit", "async_save_kill"):
                # The service has every byte: the checkpoint must commit
                # without this process (not even its background thread).
                print(f"transport={writer.transport}", flush=True)
                if mode == "async_save_kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                os._exit(0)
            getattr(res, "upload_completion", res).result()
        print(f"transport={writer.transport}", flush=True)
    else:
        state = sharded(int(world), zero=True)
        reader = StokerReader(job, addr)
        dcp.load(state, storage_reader=reader, checkpoint_id=step)
        print(f"transport={reader.transport}", flush=True)
        loaded = {
            k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in state.items()
        }
        torch.save(loaded, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

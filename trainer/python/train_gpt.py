"""The PyTorch main job's trainer: the GPT of gpt.py trained with FSDP2
(``fully_shard``) over gloo on the CPU, fed and kept safe by Stoker.

    torchrun --rdzv-backend=stoker --rdzv-endpoint=COORDINATOR --rdzv-id=JOB \
        --nnodes=2:4 --nproc-per-node=1 trainer/python/train_gpt.py --corpus DIR

What changes against a plain PyTorch script is a few lines, each marked
"Stoker:" below: the process group over the coordinator's store, the
dataset, the DCP storage, and the monitor that reports progress and brings
back CHECKPOINT_NOW and STOP. On a (re)start the newest committed
checkpoint is restored at whatever world size the rendezvous closed with:
model and optimizer resharded by the checkpoint service, the dataset's
position with them, so no data is repeated or skipped.

Every step, rank 0 prints ``step S loss L tokens/s R world W`` (L in full
precision: the main job compares runs with it).
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import os
import signal
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torchdata.stateful_dataloader import StatefulDataLoader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt import GPT, GPTConfig

from stoker import StokerError, elastic
from stoker.checkpoint import StokerReader, StokerWriter
from stoker.data import StokerDataset
from stoker.jobs import DatasetSpec, Jobs
from stoker.membership import CHECKPOINT_NOW, STOP


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", required=True, help="directory of text files (bytes tokenizer)")
    p.add_argument(
        "--job",
        default=os.environ.get("STOKER_JOB", "demo-pt"),
        help="coordinator, dataloader and checkpoint job name",
    )
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--global-batch", type=int, default=12, help="lines per step, all ranks")
    p.add_argument("--channels", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warmup over 10 steps, then cosine to a tenth: a pure function
    of the step, so a restore needs no scheduler state."""
    if step < 10:
        return args.lr * (step + 1) / 10
    frac = min(1.0, (step - 10) / max(1, args.steps - 10))
    return args.lr / 10 + (args.lr - args.lr / 10) * 0.5 * (1 + math.cos(math.pi * frac))


def ensure_loader(args: argparse.Namespace) -> None:
    """Creates the dataloader job on every part of the loader
    (``STOKER_DATALOADER``, comma-separated for a scaled-out one), part by
    part as the C trainer does: a part that already has it (another rank,
    an earlier run) keeps it, a part replaced without its state gets it."""
    corpus = DatasetSpec(
        "corpus", f"file://{args.corpus}", "text", tokenizer="bytes", block_bytes=4096
    )
    with Jobs(timeout=30.0) as ops:
        ops.create_loader(
            args.job,
            [corpus],
            seq_len=args.seq_len,
            global_batch=args.global_batch,
            seed=args.seed,
            exist_ok=True,
        )


class TrainState:
    """Model and optimizer as one DCP Stateful: sharded state dicts out,
    resharded ones in (torch.distributed.checkpoint.state_dict)."""

    def __init__(self, model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
        self.model, self.optim = model, optim

    def state_dict(self) -> dict[str, Any]:
        msd, osd = get_state_dict(self.model, self.optim)
        return {"model": msd, "optim": osd}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        set_state_dict(
            self.model, self.optim, model_state_dict=sd["model"], optim_state_dict=sd["optim"]
        )


def latest_checkpoint(job: str) -> int:
    """The newest committed step (0: none), the same on every rank."""
    step = [0]
    if dist.get_rank() == 0:
        try:
            step[0] = StokerReader(job).latest_step()
        except StokerError as e:
            if e.code.name != "NOT_FOUND":
                raise
    dist.broadcast_object_list(step, src=0)
    return int(step[0])


def main() -> None:
    args = parse_args()
    # SIGUSR1 prints every thread's stack to stderr (a hang's "where"; the
    # tests send it before they give up on a run).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    torch.set_num_threads(1)
    # Stoker: the process group over the coordinator's store (under torchrun
    # with --rdzv-backend=stoker); a plain torchrun works too.
    if os.environ.get(elastic.ENV_CONTROL_DIR):
        # Where a start that never trains stopped: the generation and
        # torchrun's restart count this worker got (they differ between
        # agents), before the process group forms.
        print(
            f"rank {os.environ.get('RANK')}: generation {os.environ.get(elastic.ENV_GENERATION)}, "
            f"torchrun restart {os.environ.get('TORCHELASTIC_RESTART_COUNT')}",
            flush=True,
        )
        elastic.init_process_group("gloo")
        # (An eviction's SIGTERM goes to the agent, which reports it: a
        # worker's SIGTERM is its agent stopping it, for a restart.)
        monitor: elastic.TrainingMonitor | None = elastic.TrainingMonitor.from_env()
    else:
        dist.init_process_group("gloo")
        monitor = None
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.global_batch % world:
        raise SystemExit(f"global batch {args.global_batch} does not split over {world} ranks")
    ckpt_group = dist.new_group(backend="gloo")  # async saves talk apart from training
    if rank == 0:
        ensure_loader(args)
    dist.barrier()

    torch.manual_seed(args.seed)
    cfg = GPTConfig(
        max_seq_len=args.seq_len, channels=args.channels, n_layer=args.layers, n_head=args.heads
    )
    model = GPT(cfg)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)

    # Stoker: this rank's slice of every step, resumable, rescalable.
    dataset = StokerDataset(args.job)
    loader = StatefulDataLoader(dataset, batch_size=None)
    state = {"train": TrainState(model, optim), "data": loader}
    start = latest_checkpoint(args.job)
    if start:
        # Stoker: DCP through the checkpoint service, resharded to this world.
        dcp.load(state, storage_reader=StokerReader(args.job), checkpoint_id=start)
        if rank == 0:
            print(f"restored step {start} at world {world}", flush=True)

    pending: Any = None
    pending_step = 0
    pending_last = False

    def checkpoint(step: int, last: bool = False) -> None:
        nonlocal pending, pending_step, pending_last
        finish_checkpoint()
        # Stoker: async_save returns once the service holds every byte
        # (step= lets the writer stage them itself); the commit follows.
        # The last one before a resumable stop commits detached: rank 0
        # leaves once the service decided the commit, which it finishes
        # after the ranks are gone (the job's next round waits for it).
        pending = dcp.async_save(
            state,
            storage_writer=StokerWriter(args.job, step=step, detach=last),
            checkpoint_id=step,
            process_group=ckpt_group,
        )
        pending_step = step
        pending_last = last

    def finish_checkpoint() -> None:
        nonlocal pending
        if pending is None:
            return
        getattr(pending, "upload_completion", pending).result()
        pending = None
        if rank == 0:
            done = "commit accepted (detached)" if pending_last else "committed"
            print(f"checkpoint step {pending_step} {done}", flush=True)

    it = iter(loader)
    step = start
    while step < args.steps:
        t0 = time.perf_counter()
        inputs, targets = next(it)
        if step == start and rank == 0:
            # How the tokens came: "shm" on the dataloader's host, else "grpc".
            print(f"data {dataset!r}", flush=True)
        for g in optim.param_groups:
            g["lr"] = lr_at(step, args)
        loss = model(inputs, targets)
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        dist.all_reduce(loss := loss.detach(), op=dist.ReduceOp.AVG)
        step += 1
        tps = args.global_batch * args.seq_len / (time.perf_counter() - t0)
        if rank == 0:
            print(f"step {step} loss {loss.item()!r} tokens/s {tps:.0f} world {world}", flush=True)
        actions = []
        if monitor is not None:
            # Stoker: progress to the heartbeats; CHECKPOINT_NOW and STOP back.
            monitor.report(step, loss.item(), tps)
            actions = [a for a, _ in monitor.poll()]
        # Agents hear the coordinator at different times: every rank acts
        # on the union, at the same step.
        pausing = monitor is not None and monitor.pausing
        resizing = monitor is not None and monitor.resizing
        flags = [CHECKPOINT_NOW in actions, STOP in actions, pausing, resizing]
        asked = torch.tensor([int(f) for f in flags])
        dist.all_reduce(asked, op=dist.ReduceOp.MAX)
        ckpt_now, stop, pausing, resizing = (bool(f) for f in asked)
        last = pausing and (ckpt_now or stop) and monitor is not None
        # A resize's checkpoint (ScaleJob) is this generation's last step:
        # the new round restores it, so a step trained past it would be
        # trained again there.
        resize = ckpt_now and resizing and not last and monitor is not None
        if (last or resize) and monitor is not None:
            # Stoker: every rank stops at this step; the coordinator hears it
            # at once, so a periodic save below it committing meanwhile is not
            # taken for the pause's. A STOP is handled here too, never by
            # stopping at once: it may have crossed steps trained after the
            # heartbeat it answered, and all ranks agree on the step above.
            # A resize's round opens on this checkpoint once every rank said
            # its stop step (else at the resize's deadline).
            monitor.report_stop(step)
            if resize and rank == 0:
                print(f"resizing: every rank stops at step {step}", flush=True)
        if step % args.checkpoint_every == 0 or ckpt_now or stop:
            checkpoint(step, last)
        if last and monitor is not None:
            # Stoker: the job is pausing (preempted, evicted, paused): that was
            # its last checkpoint. Every rank stops at this step and exits 75;
            # the agents leave with the step and exit 75 too, and the job
            # resumes from it when its ranks join again.
            finish_checkpoint()
            if rank == 0:
                print(f"paused at step {step}: the job resumes from it", flush=True)
            dist.destroy_process_group()
            monitor.exit_resumably(step)
        if resize and monitor is not None:
            # Stoker: every rank stopped at this step; its checkpoint opens the
            # job's next round. A node whose agent got SIGTERM (a shrink in
            # place removes it: its pod is being deleted) exits 75 here, its
            # agent with it; the others wait until their agent starts new
            # workers at the new world size, which restore this step.
            finish_checkpoint()
            dist.destroy_process_group()
            if monitor.terminating:
                print(f"rank {rank}: removed at step {step} (its node got SIGTERM)", flush=True)
            if monitor.await_new_round(step) == STOP:
                if rank == 0:
                    print(f"stopped by the coordinator at step {step}", flush=True)
                return
        if stop:
            if rank == 0:
                print(f"stopped by the coordinator at step {step}", flush=True)
            break
    finish_checkpoint()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

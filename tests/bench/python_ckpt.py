"""The checkpoint half of the Python benchmark: the same sharded state dict
saved with DCP through Stoker and through the peers on the same S3 server,
and loaded back resharded, in interleaved rounds.

Two pools of rank processes (python_ckpt_rank.py) live for the whole run,
as a trainer's ranks do: 4 that save (gloo, DTensors sharded on dim 0) and
3 that load (the same tensors resharded 4 -> 3). In each round every
subject saves once (``dcp.async_save``: the stall until it returns, the
time until its future resolves) and then loads that checkpoint once at 3
ranks; the order of the subjects rotates from round to round. A figure is
the slowest rank's; a round's ratios are taken within the round, and the
medians go to the JSON. Before the rounds each subject saves and loads
once untimed (clients connect, the service and the S3 server warm up);
after each round the round's checkpoints are deleted (outside the timing).

Subjects: ``stoker`` (``stoker.checkpoint.StokerWriter(job, step=...)`` /
``StokerReader`` on the checkpoint service, which stores to the S3 server;
with the step given the writer is its own DCP stager, so async_save returns
once the service holds the bytes),
``s3torchconnector`` (Amazon's ``S3StorageWriter`` / ``S3StorageReader``)
and ``s3fs`` (DCP's ``FsspecWriter`` / ``FsspecReader`` over s3fs); and,
saves only, ``stoker_copy``: ``StokerWriter(job)`` without the step, whose
staging is DCP's own CPU copy (what the writer did before it staged itself).
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import time
from typing import IO, Any

import python_ckpt_rank as rank_mod

from stoker.connection import Connection
from stoker.v1 import checkpoint_pb2 as pb
from stoker.v1 import common_pb2

PEERS = ("s3torchconnector", "s3fs")
# stoker_copy: the same writer without step= (DCP's CPU copy as the stager,
# the bytes sent in the background); saves only, for comparison.
SUBJECTS = ("stoker", "stoker_copy", *PEERS)
LOAD_SUBJECTS = ("stoker", *PEERS)
COPY_STEP_OFFSET = rank_mod.COPY_STEP_OFFSET
SAVE_WORLD, LOAD_WORLD = 4, 3
COMMAND_TIMEOUT_S = 300.0
HERE = os.path.dirname(os.path.abspath(__file__))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class RankPool:
    """world rank processes of one role, commanded together over pipes."""

    def __init__(self, role: str, world: int, total_bytes: int, tmp: str) -> None:
        init = os.path.join(tmp, f"pg-{role}")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    os.path.join(HERE, "python_ckpt_rank.py"),
                    role,
                    str(r),
                    str(world),
                    init,
                    str(total_bytes),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for r in range(world)
        ]
        self.replies(COMMAND_TIMEOUT_S)

    def replies(self, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        out = []
        for p in self.procs:
            stdout: IO[str] = p.stdout  # type: ignore[assignment]
            ready, _, _ = select.select([stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = stdout.readline() if ready else ""
            if not line:
                raise RuntimeError(f"a {len(self.procs)}-rank pool stopped answering")
            out.append(json.loads(line))
        return out

    def run(self, cmd: dict[str, Any]) -> list[dict[str, Any]]:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write(json.dumps(cmd) + "\n")
            p.stdin.flush()
        return self.replies(COMMAND_TIMEOUT_S)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None and p.stdin is not None:
                try:
                    p.stdin.write('{"op": "quit"}\n')
                    p.stdin.close()
                except BrokenPipeError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def slowest(replies: list[dict[str, Any]], key: str) -> float:
    errors = [r["error"] for r in replies if "error" in r]
    if errors:
        raise RuntimeError(errors[0])
    return max(float(r[key]) for r in replies)


class Cleaner:
    """Deletes a round's checkpoints: the peers' objects through s3fs, the
    service's checkpoint with its Delete call."""

    def __init__(self) -> None:
        import s3fs

        self.fs = s3fs.S3FileSystem(
            endpoint_url=os.environ["AWS_ENDPOINT_URL"],
            key=os.environ["AWS_ACCESS_KEY_ID"],
            secret=os.environ["AWS_SECRET_ACCESS_KEY"],
        )
        self.conn = Connection(os.environ["STOKER_CHECKPOINT"])

    def delete(self, subject: str, key: str) -> None:
        try:
            if subject.startswith("stoker"):
                step = int(key) + (COPY_STEP_OFFSET if subject == "stoker_copy" else 0)
                self.conn.unary(
                    "/stoker.v1.Checkpoint/Delete",
                    pb.DeleteCheckpointRequest(job=rank_mod.JOB, step=step),
                    common_pb2.Empty,
                )
            else:
                self.fs.rm(f"{rank_mod.BUCKET}/{subject}/{key}", recursive=True)
        except Exception as e:  # Space only: the figures do not depend on it.
            log(f"  (could not delete {subject} {key}: {e})")


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def rotated(items: tuple[str, ...], r: int) -> list[str]:
    k = r % len(items)
    return list(items[k:] + items[:k])


def run(total_bytes: int, rounds: int, tmp: str) -> dict[str, Any]:
    """Warm-up and rounds; the checkpoint keys of the JSON."""
    tensor_bytes = rank_mod.rows_of(total_bytes) * rank_mod.COLS * 4 * rank_mod.TENSORS
    log(f"checkpoint: {tensor_bytes / 2**20:.0f} MiB, {SAVE_WORLD} ranks save, {LOAD_WORLD} load")
    savers = RankPool("save", SAVE_WORLD, total_bytes, tmp)
    loaders = RankPool("load", LOAD_WORLD, total_bytes, tmp)
    cleaner = Cleaner()
    failed: dict[str, str] = {}
    fig: dict[str, dict[str, list[float]]] = {
        k: {s: [] for s in SUBJECTS} for k in ("stall_s", "durable_s", "load_s")
    }
    ratios: dict[str, list[float]] = {"stall": [], "durable": [], "load": []}
    transports: set[str] = set()
    try:
        for r in range(-1, rounds):
            key = str(1000 + r + 1)
            got: dict[str, dict[str, float]] = {s: {} for s in SUBJECTS}
            for s in [s for s in rotated(SUBJECTS, r + 1) if s not in failed]:
                try:
                    rep = savers.run({"op": "save", "peer": s, "key": key})
                    got[s]["stall_s"] = slowest(rep, "stall_s")
                    got[s]["durable_s"] = slowest(rep, "durable_s")
                    if s == "stoker":
                        transports.update(str(x["transport"]) for x in rep if "transport" in x)
                except RuntimeError as e:
                    failed[s] = f"save: {e}"
                    log(f"  {s} save failed: {e}")
            for s in [s for s in rotated(LOAD_SUBJECTS, r + 1) if s not in failed]:
                try:
                    rep = loaders.run({"op": "load", "peer": s, "key": key})
                    got[s]["load_s"] = slowest(rep, "load_s")
                except RuntimeError as e:
                    failed[s] = f"load: {e}"
                    log(f"  {s} load failed: {e}")
            for s in SUBJECTS:
                cleaner.delete(s, key)
            if "stoker" in failed:
                raise RuntimeError(f"stoker failed: {failed['stoker']}")
            line = "; ".join(
                f"{s} " + " ".join(f"{k.removesuffix('_s')} {v:.3f} s" for k, v in got[s].items())
                for s in SUBJECTS
                if s not in failed
            )
            if r < 0:
                log(f"warm-up: {line}")
                continue
            for k in fig:
                for s in SUBJECTS:
                    if k in got[s]:
                        fig[k][s].append(got[s][k])
            peers = [p for p in PEERS if p not in failed]
            if peers:
                ratios["stall"].append(
                    got["stoker"]["stall_s"] / min(got[p]["stall_s"] for p in peers)
                )
                # Throughput ratios: the best peer's time over Stoker's.
                ratios["durable"].append(
                    min(got[p]["durable_s"] for p in peers) / got["stoker"]["durable_s"]
                )
                ratios["load"].append(
                    min(got[p]["load_s"] for p in peers) / got["stoker"]["load_s"]
                )
                line += (
                    f"; ratios stall {ratios['stall'][-1]:.3f} durable "
                    f"{ratios['durable'][-1]:.3f} load {ratios['load'][-1]:.3f}"
                )
            log(f"ckpt round {r + 1}: {line}")
    finally:
        savers.close()
        loaders.close()
    out = summary(tensor_bytes, rounds, fig, ratios, failed)
    out["ckpt_stoker_transport"] = ",".join(sorted(transports))
    return out


def summary(
    tensor_bytes: int,
    rounds: int,
    fig: dict[str, dict[str, list[float]]],
    ratios: dict[str, list[float]],
    failed: dict[str, str],
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ckpt_stall_vs_best_peer_ratio": median_or_none(ratios["stall"]),
        "ckpt_durable_vs_best_peer_ratio": median_or_none(ratios["durable"]),
        "ckpt_load_vs_best_peer_ratio": median_or_none(ratios["load"]),
        "ckpt_bytes": tensor_bytes,
        "ckpt_save_ranks": SAVE_WORLD,
        "ckpt_load_ranks": LOAD_WORLD,
        "ckpt_rounds": rounds,
    }
    for s in SUBJECTS:
        if s in failed:
            out[f"ckpt_{s}_error"] = failed[s]
        for k, v in fig.items():
            if not v[s]:
                continue
            med = statistics.median(v[s])
            out[f"ckpt_{s}_{k}"] = round(med, 4)
            if k != "stall_s":
                out[f"ckpt_{s}_{k.removesuffix('_s')}_bytes_per_s"] = round(tensor_bytes / med)
    out["ckpt_rounds_figures"] = {
        k: {s: [round(x, 4) for x in v[s]] for s in SUBJECTS if v[s]} for k, v in fig.items()
    }
    out["ckpt_ratio_rounds"] = {k: [round(x, 3) for x in v] for k, v in ratios.items()}
    for k in list(out):
        if k.endswith("_ratio") and out[k] is not None:
            out[k] = round(out[k], 3)
    return out

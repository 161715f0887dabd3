"""The Python benchmark (tests/bench/run python): Stoker's Python package
against what a PyTorch user would pick instead, measured side by side in
the same run, in interleaved rounds, with medians (README.md, "python").

1. Data (python_data.py): tokens/s that reach a training loop through
   ``StokerDataset`` + ``StatefulDataLoader``, the C client on the same
   service, a map-style dataset over ``np.memmap`` and MosaicML
   ``StreamingDataset``, all over one llm.c corpus. Each of BENCH_ROUNDS
   rounds (default 8) runs every subject for BENCH_SECONDS / BENCH_ROUNDS
   seconds (default 16 / 8; the order rotates).
2. Checkpoints (python_ckpt.py): DCP async save at 4 ranks and resharded
   load at 3 through ``StokerWriter`` / ``StokerReader``, s3torchconnector
   and s3fs, on the same S3 server: BENCH_CKPT_ROUNDS rounds (default 5)
   of BENCH_BYTES (default 512 MiB).

Prints one JSON line on stdout; progress and every round on stderr.

Usage: python_bench.py --dataloader ADDR --dataloader-log FILE --helper PATH
       --work DIR --tmp DIR (with STOKER_CHECKPOINT, AWS_ENDPOINT_URL and the
       AWS_* credentials in the environment)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
import urllib.request
from importlib.metadata import version
from typing import Any

import python_ckpt
import python_ckpt_rank
import python_data


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


class DataloaderMetrics:
    """The daemon's batch counters (its Prometheus endpoint, found in its
    log): how many of the batches a phase took came through the ring."""

    def __init__(self, log_path: str) -> None:
        self.url = ""
        deadline = time.monotonic() + 10
        while not self.url and time.monotonic() < deadline:
            with open(log_path, encoding="utf-8", errors="replace") as f:
                m = re.search(r"metrics listen=(\S+)", f.read())
            if m:
                self.url = f"http://{m.group(1)}/metrics"
            else:
                time.sleep(0.1)

    def counts(self) -> tuple[float, float]:
        """(batches sent, of them through a ring); zeros without metrics."""
        if not self.url:
            return 0.0, 0.0
        text = urllib.request.urlopen(self.url, timeout=5).read().decode()

        def value(name: str) -> float:
            m = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
            return float(m.group(1)) if m else 0.0

        return (
            value("stoker_dataloader_batches_total"),
            value("stoker_dataloader_shm_batches_total"),
        )


def data_part(args: argparse.Namespace, rounds: int, seconds: float) -> dict[str, Any]:
    tokens = env_int("BENCH_CORPUS_TOKENS", 100_000_000)
    log(f"data: corpus of {tokens} tokens and its MDS copy in {args.work} ...")
    corpus = python_data.write_corpus(args.work, tokens)
    mds = python_data.write_mds(corpus)
    prefetch = env_int("BENCH_PREFETCH", 4)
    loops = python_data.make_loops(args.dataloader, corpus, mds, args.helper, prefetch)
    metrics = DataloaderMetrics(args.dataloader_log)
    names = [loop.name for loop in loops]
    rate: dict[str, list[float]] = {n: [] for n in names}
    shm: dict[str, list[float]] = {"stoker": [], "c": [], "c_u32": []}
    vs_c: list[float] = []
    vs_c_u32: list[float] = []
    vs_peer: list[float] = []
    per = seconds / rounds
    try:
        for r in range(rounds):
            order = loops[r % len(loops) :] + loops[: r % len(loops)]
            for loop in order:
                before = metrics.counts()
                phase = loop.run(per)
                after = metrics.counts()
                rate[loop.name].append(phase.tokens_per_s)
                if loop.name in shm and after[0] > before[0]:
                    shm[loop.name].append((after[1] - before[1]) / (after[0] - before[0]))
            best = max(rate["numpy"][-1], rate["streaming"][-1])
            vs_c.append(rate["stoker"][-1] / rate["c"][-1])
            vs_c_u32.append(rate["stoker"][-1] / rate["c_u32"][-1])
            vs_peer.append(rate["stoker"][-1] / best)
            log(
                f"data round {r + 1}: "
                + " ".join(f"{n} {rate[n][-1] / 1e6:.0f} M/s" for n in names)
                + f"; stoker/c {vs_c[-1]:.3f} stoker/best peer {vs_peer[-1]:.3f}"
            )
        described = {
            f"data_{x.name}_transport": x.describe()
            for x in loops
            if isinstance(x, python_data.Loop) and x.describe
        }
    finally:
        for loop in loops:
            loop.close()
    med = {n: statistics.median(v) for n, v in rate.items()}
    out: dict[str, Any] = {
        "data_vs_c_ratio": round(statistics.median(vs_c), 3),
        "data_vs_c_uint32_ratio": round(statistics.median(vs_c_u32), 3),
        "data_vs_best_peer_ratio": round(statistics.median(vs_peer), 3),
        "data_best_peer": max(("numpy", "streaming"), key=lambda n: med[n]),
    }
    for n in names:
        out[f"data_{n}_tokens_per_s"] = round(med[n])
    for n, v in shm.items():
        out[f"data_{n}_shm_batch_fraction"] = round(statistics.median(v), 3) if v else None
    out["data_rounds_m_tokens_per_s"] = {n: [round(x / 1e6, 1) for x in v] for n, v in rate.items()}
    out["data_ratio_rounds"] = {
        "vs_c": [round(x, 3) for x in vs_c],
        "vs_c_uint32": [round(x, 3) for x in vs_c_u32],
        "vs_best_peer": [round(x, 3) for x in vs_peer],
    }
    out.update(described)
    out.update(python_data.describe(corpus))
    out["data_prefetch"] = prefetch
    out["data_seconds_per_phase"] = per
    return out


def peers() -> dict[str, str]:
    threads = python_ckpt_rank.IO_THREADS
    return {
        "data_c": "libstoker-client stk_batch_stream, int64 tokens as the PyTorch loop gets them "
        "(tests/bench/dl_stream_helper.c), same daemon",
        "data_c_u32": "the same with uint32 tokens, as the C trainer takes them",
        "data_numpy": "torch.utils.data map-style Dataset of lines over np.memmap, "
        f"DataLoader(batch_size=64, shuffle=True, num_workers=0); torch {version('torch')}",
        "data_streaming": f"mosaicml-streaming {version('mosaicml-streaming')} StreamingDataset "
        "over MDS shards (ndarray:uint32:2049, local dir), DataLoader(batch_size=64, "
        "num_workers=0)",
        "ckpt_s3torchconnector": f"s3torchconnector {version('s3torchconnector')} "
        f"S3StorageWriter(thread_count={threads}) / S3StorageReader (dcp_optimized), CRT "
        "client with endpoint override and force_path_style",
        "ckpt_s3fs": f"s3fs {version('s3fs')} via torch.distributed.checkpoint FsspecWriter"
        f"(thread_count={threads}, sync_files=False) / FsspecReader",
        "s3_server": "npm @20minutes/s3rver (one node process, SigV4 checked)",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dataloader", required=True)
    p.add_argument("--dataloader-log", required=True)
    p.add_argument("--helper", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--tmp", required=True)
    args = p.parse_args()
    rounds = env_int("BENCH_ROUNDS", 8)
    seconds = float(os.environ.get("BENCH_SECONDS") or 16)
    ckpt_rounds = env_int("BENCH_CKPT_ROUNDS", 5)
    ckpt_bytes = env_int("BENCH_BYTES", 512 << 20)
    t0 = time.monotonic()
    parts = set((os.environ.get("BENCH_PARTS") or "data,ckpt").split(","))
    if not parts <= {"data", "ckpt"}:
        raise SystemExit(f"BENCH_PARTS: {sorted(parts)} is not a subset of data,ckpt")
    out: dict[str, Any] = {"bench": "python"}
    data: dict[str, Any] = {}
    ckpt: dict[str, Any] = {}
    if "data" in parts:
        data = data_part(args, rounds, seconds)
        out.update({k: data.pop(k) for k in ("data_vs_c_ratio", "data_vs_best_peer_ratio")})
    if "ckpt" in parts:
        ckpt = python_ckpt.run(ckpt_bytes, ckpt_rounds, args.tmp)
        out.update(
            {
                k: ckpt.pop(k)
                for k in (
                    "ckpt_stall_vs_best_peer_ratio",
                    "ckpt_durable_vs_best_peer_ratio",
                    "ckpt_load_vs_best_peer_ratio",
                )
            }
        )
    out["peers"] = peers()
    out.update(data)
    out.update(ckpt)
    out["data_rounds"] = rounds
    out["wall_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

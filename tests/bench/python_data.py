"""The data half of the Python benchmark: one llm.c token corpus, and the
training loops that read it through Stoker and through what a PyTorch user
would pick instead.

Every subject delivers the same shape to the loop: ``inputs`` and
``targets``, int64 ``[L, T]`` (L lines of T + 1 tokens, targets shifted by
one), and the loop touches each batch (sums the first input and the last
target of every line). Tokens are counted as the C benchmark counts them:
L x (T + 1) per batch.

Subjects (each keeps its iterator between phases, so a phase continues the
stream where the last one stopped; an epoch's end starts the next epoch):
- ``stoker``: ``stoker.data.StokerDataset`` through torchdata's
  ``StatefulDataLoader(ds, batch_size=None)`` (tokens through the daemon's
  shared-memory ring, received by libstoker-client when ``STOKER_CLIENT_LIBRARY``
  names it, as ``tests/bench/run`` does);
- ``c``: the C client (``dl_stream_helper``, another process) on a second job
  of the same spec, delivering the same int64 tokens the PyTorch loop gets
  (the daemon writes them into the ring 8 bytes wide): the same service,
  transport and output without Python;
- ``c_u32``: the same on a third job with uint32 tokens, as the C trainer
  takes them (half the bytes written per batch);
- ``numpy``: a map-style ``torch.utils.data.Dataset`` of lines over a
  ``np.memmap`` of the token file, ``DataLoader(batch_size=L, shuffle=True)``;
- ``streaming``: MosaicML ``StreamingDataset`` over the same lines written
  once as MDS shards (``MDSWriter``), read from a local directory,
  ``DataLoader(batch_size=L)``.

Legend: L = lines per batch (64), T = seq_len (2048).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from stoker.connection import Connection
from stoker.data import StokerDataset
from stoker.v1 import common_pb2
from stoker.v1 import dataloader_pb2 as pb

SEQ_LEN = 2048
LINE_TOKENS = SEQ_LEN + 1
LINES = 64  # Per batch: the global batch of one rank of world 1.
EOT = 50256  # GPT-2 end of text: llm.c puts it before every document.
LLMC_MAGIC, LLMC_VERSION = 20240801, 7  # uint32 tokens
HEADER_BYTES = 1024
SEED = 11

Batch = tuple[torch.Tensor, torch.Tensor]


# ---- the corpus ---------------------------------------------------------------


def write_corpus(work: str, tokens: int) -> str:
    """An llm.c uint32 file of about ``tokens`` tokens in ``work/corpus-N``
    (made once, kept between runs): random documents of 1,024-3,072 tokens
    after an end-of-text token each, ids below the GPT-2 vocabulary.
    Returns the directory (the Stoker dataset is ``file://`` it)."""
    out = os.path.join(work, f"corpus-{tokens}")
    path = os.path.join(out, "part_00.bin")
    if os.path.exists(path):
        return out
    rng = np.random.default_rng(SEED)
    body = rng.integers(0, EOT, size=tokens, dtype=np.uint32)
    starts = np.cumsum(rng.integers(1024, 3073, size=tokens // 1024))
    body[starts[starts < tokens]] = EOT
    body[0] = EOT
    header = np.zeros(HEADER_BYTES // 4, np.int32)
    header[:3] = (LLMC_MAGIC, LLMC_VERSION, tokens)
    os.makedirs(out, exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(header.tobytes())
        f.write(body.tobytes())
    os.rename(path + ".tmp", path)
    return out


def corpus_lines(corpus: str) -> np.ndarray[Any, np.dtype[np.uint32]]:
    """The token file's tokens cut into lines: a read-only uint32
    ``[n, T + 1]`` view over a memory map."""
    tokens = np.memmap(os.path.join(corpus, "part_00.bin"), np.uint32, "r", offset=HEADER_BYTES)
    n = len(tokens) // LINE_TOKENS
    return tokens[: n * LINE_TOKENS].reshape(n, LINE_TOKENS)


def write_mds(corpus: str) -> str:
    """The corpus's lines as MDS shards (once): one sample per line, column
    ``tokens`` of ``ndarray:uint32:2049``, uncompressed."""
    from streaming import MDSWriter

    out = corpus.rstrip("/") + "-mds"
    if os.path.exists(os.path.join(out, "index.json")):
        return out
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    lines = corpus_lines(corpus)
    with MDSWriter(out=tmp, columns={"tokens": f"ndarray:uint32:{LINE_TOKENS}"}) as w:
        for line in lines:
            w.write({"tokens": np.asarray(line)})
    os.rename(tmp, out)
    return out


def create_jobs(addr: str, corpus: str, jobs: list[str]) -> None:
    """The loader jobs over the corpus (one per streaming client)."""
    conn = Connection(addr)
    for job in jobs:
        spec = pb.LoaderSpec(
            job=job,
            seq_len=SEQ_LEN,
            global_batch=LINES,
            seed=SEED,
            datasets=[
                pb.DatasetSpec(
                    name="corpus",
                    weight=1.0,
                    format=pb.DATASET_FORMAT_LLMC,
                    source=common_pb2.StorageRef(uri=f"file://{corpus}"),
                )
            ],
        )
        conn.unary(
            "/stoker.v1.Dataloader/CreateLoader", pb.CreateLoaderRequest(spec=spec), pb.LoaderInfo
        )
    conn.close()


# ---- the peers' datasets --------------------------------------------------------


class TokenLines(Dataset[torch.Tensor]):
    """Map-style: item i is line i of the memory-mapped token file, int64
    ``[T + 1]`` (the default collate stacks L of them)."""

    def __init__(self, corpus: str) -> None:
        self.lines = corpus_lines(corpus)

    def __len__(self) -> int:
        return len(self.lines)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(self.lines[i].astype(np.int64))


def streaming_dataset(mds: str) -> Dataset[torch.Tensor]:
    """A StreamingDataset over the local MDS directory yielding each line
    as int64 ``[T + 1]``, as llm-foundry's text dataset does."""
    from streaming import StreamingDataset

    class StreamingLines(StreamingDataset):
        def __getitem__(self, i: int) -> torch.Tensor:  # type: ignore[override]
            return torch.from_numpy(super().__getitem__(i)["tokens"].astype(np.int64))

    ds: Dataset[torch.Tensor] = StreamingLines(
        local=mds, batch_size=LINES, shuffle=True, shuffle_seed=SEED
    )
    return ds


def split(loader: DataLoader[torch.Tensor]) -> Iterator[Batch]:
    """[L, T + 1] batches as (inputs, targets) views."""
    for b in loader:
        yield b[:, :-1], b[:, 1:]


# ---- running phases ---------------------------------------------------------------


@dataclass
class Phase:
    tokens: int
    seconds: float
    batches: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


class Loop:
    """A training loop over one subject's batches, run phase by phase; the
    iterator lives across phases and is made anew at an epoch's end."""

    def __init__(
        self,
        name: str,
        make: Callable[[], Iterator[Batch]],
        describe: Callable[[], str] | None = None,
    ) -> None:
        self.name = name
        self.make = make
        self.describe = describe  # How the subject's batches came, when it says.
        self.it = make()
        self.epochs = 0
        self.touch = 0

    def run(self, seconds: float) -> Phase:
        tokens = batches = 0
        t0 = time.perf_counter()
        while True:
            try:
                inputs, targets = next(self.it)
            except StopIteration:
                self.it = self.make()
                self.epochs += 1
                continue
            self.touch += int(inputs[:, 0].sum()) + int(targets[:, -1].sum())
            tokens += inputs.shape[0] * (inputs.shape[1] + 1)
            batches += 1
            t = time.perf_counter() - t0
            if t >= seconds:
                return Phase(tokens, t, batches)

    def close(self) -> None:
        self.it = iter(())


class CLoop:
    """The C client in its own process (dl_stream_helper), driven phase by
    phase over a pipe; between phases it blocks on the pipe."""

    def __init__(self, name: str, helper: str, addr: str, job: str, prefetch: int, width: int):
        self.name = name
        self.proc = subprocess.Popen(
            [helper, addr, job, str(prefetch), str(width)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        if self.stdout.readline().strip() != "ready":
            raise RuntimeError("dl_stream_helper did not start (see stderr)")

    def run(self, seconds: float) -> Phase:
        self.stdin.write(f"{seconds}\n")
        self.stdin.flush()
        tokens, secs, batches = self.stdout.readline().split()
        return Phase(int(tokens), float(secs), int(batches))

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=30)


def make_loops(addr: str, corpus: str, mds: str, helper: str, prefetch: int) -> list[Loop | CLoop]:
    """Every subject, started and warmed (the first batch of each is taken
    before any phase is timed)."""
    create_jobs(addr, corpus, ["py-bench", "c-bench", "c32-bench"])

    made: list[StokerDataset] = []

    def stoker() -> Iterator[Batch]:
        ds = StokerDataset("py-bench", address=addr, rank=0, world_size=1, prefetch=prefetch)
        made.append(ds)
        return iter(StatefulDataLoader(ds, batch_size=None))

    def numpy_lines() -> Iterator[Batch]:
        return split(DataLoader(TokenLines(corpus), batch_size=LINES, shuffle=True))

    streaming_ds = streaming_dataset(mds)

    def streaming() -> Iterator[Batch]:
        return split(DataLoader(streaming_ds, batch_size=LINES))

    loops: list[Loop | CLoop] = [
        Loop("stoker", stoker, lambda: made[-1].transport_in_use),
        CLoop("c", helper, addr, "c-bench", prefetch, 8),
        CLoop("c_u32", helper, addr, "c32-bench", prefetch, 4),
        Loop("numpy", numpy_lines),
        Loop("streaming", streaming),
    ]
    for loop in loops:
        loop.run(0.0)
    return loops


def describe(corpus: str) -> dict[str, int]:
    size = os.path.getsize(os.path.join(corpus, "part_00.bin"))
    return {
        "corpus_tokens": (size - HEADER_BYTES) // 4,
        "corpus_bytes": size,
        "seq_len": SEQ_LEN,
        "lines_per_batch": LINES,
    }


if __name__ == "__main__":
    # Prepares the corpus and its MDS copy: python_data.py WORK TOKENS.
    import sys

    c = write_corpus(sys.argv[1], int(sys.argv[2]))
    print(json.dumps({"corpus": c, "mds": write_mds(c), **describe(c)}))

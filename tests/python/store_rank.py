"""One rank of the Store test (run as a process by test_store.py): joins
a gloo process group through StokerStore and all-reduces its rank + 1.

Usage: store_rank.py COORDINATOR JOB GENERATION RANK WORLD
"""

import sys

import torch
import torch.distributed as dist

from stoker.store import StokerStore

addr, job, gen, rank, world = sys.argv[1:6]
store = StokerStore(job, int(gen), addr)
dist.init_process_group("gloo", store=store, rank=int(rank), world_size=int(world))
t = torch.tensor([float(rank) + 1.0])
dist.all_reduce(t)
print(f"sum={t.item():g}")
dist.destroy_process_group()

"""The save that ``StokerWriter.stage`` runs for ``dcp.async_save`` (writer
given ``step=``): DCP's plans, written straight to the checkpoint service,
with one collective on the training thread instead of DCP's four.

``dcp.save`` gathers every rank's local plan on the coordinator, scatters
the global plan back, and after the writes gathers the results and
broadcasts the outcome: four object collectives (eight gloo operations with
their size exchanges), each a round trip of every rank's process. Here:

1. every rank makes its local plan with DCP's ``DefaultSavePlanner``; the
   coordinator (rank 0 of the group) also calls ``Begin`` for the attempt;
2. the ranks exchange (attempt, local plan, error) in one
   ``all_gather_object``; an error of any rank (a dtype the service has no
   type for, ``Begin`` refused) makes every rank raise it, and the
   coordinator aborts the attempt it began;
3. every rank runs DCP's global planning on the gathered plans itself: it
   is deterministic (the dedup of replicated items, the chunk checks), so
   all ranks get the global plan the coordinator gets in ``dcp.save``, and
   each writes its part; the coordinator also the JSON description
   (``describe_plans``) of the whole;
4. a rank returns once the service answered "staged" for its own stream
   (its bytes are the service's from then on). No rank waits for the
   others: the service commits once every rank's bytes are durable. A rank
   whose write fails aborts the attempt (``StokerWriter._abort``), so the
   other ranks' streams fail, or, where they were staged already, the
   commit that the background half of ``async_save`` waits for.
"""

from __future__ import annotations

import traceback
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlan

if TYPE_CHECKING:
    from stoker.checkpoint import StokerWriter

# What each rank contributes to the one collective.
_Shared = tuple[str, SavePlan | None, tuple[BaseException, Any] | None]


def stage_on_service(writer: StokerWriter, state_dict: dict[str, Any], group: Any) -> None:
    """Writes state_dict under a new attempt of writer.step (see the module
    comment); returns once the service holds this rank's bytes. Raises
    ``CheckpointException`` (every failed rank's error) when a rank could
    not plan, or this rank's write error."""
    from stoker.checkpoint import _RankPlan, describe_plans

    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank(group) if distributed else 0
    world = dist.get_world_size(group) if distributed else 1
    coordinator = rank == 0
    writer.is_coordinator = coordinator
    planner = DefaultSavePlanner()

    mine: _Shared = ("", None, None)
    try:
        planner.set_up_planner(state_dict, writer.storage_meta(), coordinator)
        local = writer.prepare_local_plan(planner.create_local_plan())
        mine = (writer.begin(world) if coordinator else "", local, None)
    except Exception as e:
        mine = ("", None, (e, traceback.extract_tb(e.__traceback__)))
    shared: list[_Shared] = [mine]
    if world > 1:
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine, group=group)
        shared = gathered
    attempt = shared[0][0]
    failures = {r: s[2] for r, s in enumerate(shared) if s[2] is not None}
    if failures:
        if coordinator and attempt:
            writer._abort(attempt, failures[min(failures)][0])
        raise CheckpointException("stage", failures)

    try:
        plans, _ = planner.create_global_plan([s[1] for s in shared])  # type: ignore[misc]
    except Exception as e:
        if coordinator:
            writer._abort(attempt, e)
        raise
    doc = describe_plans(plans) if coordinator else None
    final = replace(planner.finish_plan(plans[rank]), storage_data=_RankPlan(attempt, rank, doc))
    writer.write_data(final, planner).wait()

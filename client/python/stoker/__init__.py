"""Stoker for PyTorch: the three Stoker services behind PyTorch's own
extension points.

- :mod:`stoker.data`: the dataloader as an ``IterableDataset`` with
  ``state_dict`` / ``load_state_dict`` (torchdata's ``StatefulDataLoader``).
- :mod:`stoker.checkpoint`: ``torch.distributed.checkpoint`` storage
  (``StokerWriter`` / ``StokerReader``).
- :mod:`stoker.elastic`: the coordinator as a ``torch.distributed.Store``.
- :mod:`stoker.jobs`: the operator's API (stokerctl's verbs) as :class:`Jobs`.

Every failed call raises :class:`stoker.StokerError` with the gRPC status.
"""

from stoker.connection import Connection, Security
from stoker.errors import StokerError
from stoker.jobs import Jobs

__all__ = ["Connection", "Jobs", "Security", "StokerError"]
__version__ = "0.1.0"

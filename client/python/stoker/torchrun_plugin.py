"""The ``torchrun.handlers`` entry point. torchrun loads it while
``torch.distributed.elastic.rendezvous`` is still being imported, so this
module imports nothing of torch: the handler module is loaded when torchrun
first creates a handler."""

from __future__ import annotations

from typing import Any


def torchrun_handler() -> Any:
    """Returns the factory torchrun registers under the name ``stoker``."""

    def create(params: Any) -> Any:
        from stoker.rendezvous import create_handler

        return create_handler(params)

    return create

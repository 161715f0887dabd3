"""Errors of the stoker package: every failed call to a Stoker service raises
:class:`StokerError`, which carries the gRPC status code, the service's message
and the method that failed, so a caller can branch on ``err.code`` and a
person reads what went wrong."""

from __future__ import annotations

import grpc


class StokerError(RuntimeError):
    """A call to a Stoker service failed.

    Attributes:
        code: the gRPC status (``grpc.StatusCode.NOT_FOUND``, ...).
        details: the service's message (or the client's, for local checks).
        method: the full gRPC method name, e.g. ``/stoker.v1.Dataloader/GetBatch``.
    """

    def __init__(self, code: grpc.StatusCode, details: str, method: str = "") -> None:
        self.code = code
        self.details = details
        self.method = method
        where = f"{method}: " if method else ""
        super().__init__(f"{where}{code.name}: {details}")

    def __reduce__(self) -> tuple[type[StokerError], tuple[grpc.StatusCode, str, str]]:
        # Pickled whole (DCP gathers a rank's exception on another rank).
        return type(self), (self.code, self.details, self.method)

    @classmethod
    def from_rpc(cls, err: grpc.RpcError, method: str) -> StokerError:
        """Translates a grpc error (a ``grpc.Call``) into a StokerError."""
        code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
        details = err.details() if hasattr(err, "details") else str(err)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "", method)


def invalid_argument(message: str) -> StokerError:
    """A local check refused an argument before anything was sent."""
    return StokerError(grpc.StatusCode.INVALID_ARGUMENT, message)

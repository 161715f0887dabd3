"""What the Python client derives from the protos' descriptors instead of
writing it by hand (the Python side of ``RPC_METHOD_PATH`` in
``services/common/rpc.h``).

- :func:`method` finds an RPC in a generated module's service descriptor:
  its path (``/stoker.v1.Coordinator/GetJob``) and its request and response
  classes, so a call names the method once and never its message types. A
  method the proto lacks fails at import.
- :func:`mirror` checks a frozen dataclass against the message it mirrors
  at import (every field it copies exists in the message; every field of
  the message copied or named as left out, which the tests check) and gives it
  ``from_proto``: each field converted by what the descriptor says it is
  (repeated as tuples, maps as dicts, enums as short names, sub-messages
  as the dataclass the annotation names, a ``StorageRef`` as its URI).
  A field whose value is not the message's field of that name says how to
  get it in its ``metadata["proto"]`` (a function of the message).
- :class:`Mirror` is their base: ``from_proto`` and a generic ``as_dict``
  (every field, as JSON takes it).

So a new field of a mirrored message is one annotated line in its
dataclass (a field left out on purpose is a name in ``omit``), and a new
RPC is one ``method(...)`` line where a verb calls it.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from google.protobuf import message_factory
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from stoker.connection import Connection
from stoker.errors import invalid_argument

T = TypeVar("T")
Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


@dataclasses.dataclass(frozen=True)
class Method(Generic[Req, Resp]):
    """One RPC as its descriptor gives it. ``request(**values)`` builds the
    request message: a value of the wrong type or range is INVALID_ARGUMENT
    before anything is sent."""

    path: str
    request_type: type[Req]
    response_type: type[Resp]
    server_streaming: bool

    def request(self, **values: Any) -> Req:
        return to_message(self.request_type, **values)

    def call(self, conn: Connection, retry: bool = False, **request: Any) -> Resp:
        """A unary call on ``conn`` (``retry``: while UNAVAILABLE; for reads)."""
        reply: Resp = conn.unary(
            self.path, self.request(**request), self.response_type, retry=retry
        )
        return reply

    def pages(self, conn: Connection, items: str, **request: Any) -> list[Any]:
        """Every entry of the repeated field ``items`` over every page."""
        return conn.unary_pages(self.path, self.request(**request), self.response_type, items)

    def stream(self, conn: Connection, **request: Any) -> Any:
        """A server-streaming call: an iterator of responses with ``cancel()``."""
        return conn.server_stream(self.path, self.request(**request), self.response_type)


def method(module: types.ModuleType, service: str, name: str) -> Method[Any, Any]:
    """The RPC ``service.name`` of a generated ``*_pb2`` module. KeyError
    (at import) when the proto has no such method."""
    sd = module.DESCRIPTOR.services_by_name[service]
    md = sd.methods_by_name[name]
    return Method(
        path=f"/{sd.full_name}/{md.name}",
        request_type=message_factory.GetMessageClass(md.input_type),
        response_type=message_factory.GetMessageClass(md.output_type),
        server_streaming=md.server_streaming,
    )


def to_message(cls: type[Req], **values: Any) -> Req:
    """Message ``cls`` of ``values``; a ``str`` given for a ``StorageRef``
    field is its URI ("" leaves it unset). A value of the wrong type or range
    is INVALID_ARGUMENT naming the message."""
    desc = cls.DESCRIPTOR
    for name, v in list(values.items()):
        fd = desc.fields_by_name.get(name)
        if fd is None or not isinstance(v, str) or fd.message_type is None:
            continue
        if fd.message_type.full_name == _STORAGE_REF:
            ref = message_factory.GetMessageClass(fd.message_type)
            values[name] = ref(uri=v) if v else None
    try:
        msg: Req = cls(**{k: v for k, v in values.items() if v is not None})
        return msg
    except (TypeError, ValueError) as e:
        raise invalid_argument(f"{desc.name}: {e}") from None


_STORAGE_REF = "stoker.v1.StorageRef"


class Service:
    """A service's RPCs by name, from a generated module's descriptor:
    ``Service(ckpt_pb, "Checkpoint").Begin`` is :func:`method`'s Method
    (AttributeError for a method the proto lacks)."""

    def __init__(self, module: types.ModuleType, name: str) -> None:
        self._module, self._name = module, name
        self._methods: dict[str, Method[Any, Any]] = {}

    def __getattr__(self, name: str) -> Method[Any, Any]:
        if name.startswith("_"):
            raise AttributeError(name)
        m = self._methods.get(name)
        if m is None:
            try:
                m = self._methods[name] = method(self._module, self._name, name)
            except KeyError:
                raise AttributeError(f"{self._name} has no method {name}") from None
        return m


# ---- messages as dataclasses ----------------------------------------------------------


def enum_prefix(enum: EnumDescriptor) -> str:
    """The prefix every value name carries: "JOB_STATE_" from
    JOB_STATE_UNSPECIFIED (the zero value), else the longest common prefix
    up to an underscore."""
    names: list[str] = [v.name for v in enum.values]
    zero = enum.values_by_number.get(0)
    if zero is not None and names[0].endswith("_UNSPECIFIED"):
        return names[0].removesuffix("UNSPECIFIED")
    common = names[0]
    for n in names[1:]:
        while not n.startswith(common):
            common = common[:-1]
    return common[: common.rfind("_") + 1]


def enum_name(enum: EnumDescriptor, value: int) -> str:
    """The value's name without the enum's prefix ("RUNNING"); "UNKNOWN(7)"
    outside the enum, as stokerctl prints it."""
    v = enum.values_by_number.get(value)
    if v is None:
        return f"UNKNOWN({value})"
    name: str = v.name
    return name.removeprefix(enum_prefix(enum))


def mirror(message: type[Message], omit: tuple[str, ...] = ()) -> Callable[[type[T]], type[T]]:
    """Class decorator: checks the dataclass against ``message`` and records
    the message, for :func:`from_proto`. A field of the class the message
    lacks (one without ``metadata["proto"]``) is a TypeError at import, as
    ``from_proto`` could not fill it. A field of the message the class
    neither mirrors nor names in ``omit`` is recorded
    (:func:`unmirrored`), not raised: a proto that gained a field must not
    stop ``import stoker`` in a training job, and the tests fail on it."""
    desc = message.DESCRIPTOR

    def check(cls: type[T]) -> type[T]:
        fs = dataclasses.fields(cls)  # type: ignore[arg-type]
        ours = {f.metadata.get("covers") or f.name for f in fs}
        missing = {f.name for f in fs if "proto" not in f.metadata} - set(desc.fields_by_name)
        if missing:
            raise TypeError(
                f"{cls.__name__} mirrors {desc.full_name}, which has no {sorted(missing)}"
            )
        _MIRRORS[cls] = desc.full_name
        _UNMIRRORED[cls] = sorted(set(desc.fields_by_name) - ours - set(omit))
        return cls

    return check


_MIRRORS: dict[type, str] = {}
_UNMIRRORED: dict[type, list[str]] = {}


def unmirrored(cls: type) -> list[str]:
    """The fields of the mirrored message that ``cls`` neither copies nor
    names in ``omit`` (tests/python/test_proto_derived.py wants none)."""
    return _UNMIRRORED.get(cls, [])


def derived(get: Callable[[Any], Any], covers: str = "") -> dict[str, Any]:
    """The metadata of a field that is not the message's field of its name:
    ``get`` reads it from the message; ``covers`` names the message's field
    it stands for (for :func:`mirror`'s check)."""
    return {"proto": get, "covers": covers}


# The metadata of a field the caller gives (``from_proto(m, name=value)``).
GIVEN: dict[str, Any] = {"proto": None}

M = TypeVar("M", bound="Mirror")


class Mirror:
    """Base of the dataclasses :func:`mirror` checks: ``X.from_proto(m)``,
    and ``x.as_dict()``: every field in order, as JSON takes it (tuples as
    lists, nested mirrors as their ``as_dict()``, maps as dicts, None as
    is). A class whose JSON object differs overrides it."""

    @classmethod
    def from_proto(cls: type[M], m: Any, **given: Any) -> M:
        return from_proto(cls, m, **given)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: as_json(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]


def as_json(value: Any) -> Any:
    """A mirrored field's value as JSON takes it (see :meth:`Mirror.as_dict`)."""
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if isinstance(value, tuple | list):
        return [as_json(v) for v in value]
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    return value


def mirrored(cls: type) -> str | None:
    """The full name of the message a dataclass mirrors (None: none)."""
    return _MIRRORS.get(cls)


def from_proto(cls: type[T], m: Message, **given: Any) -> T:
    """The dataclass ``cls`` (decorated with :func:`mirror`) of message m;
    ``given``: the values of fields the message does not hold."""
    hints = _hints(cls)
    values: dict[str, Any] = dict(given)
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name in given:
            continue
        get = f.metadata.get("proto")
        if get is not None:
            values[f.name] = get(m)
            continue
        fd = m.DESCRIPTOR.fields_by_name[f.name]
        values[f.name] = _value(fd, m, hints[f.name])
    return cls(**values)


def _value(fd: FieldDescriptor, m: Message, hint: Any) -> Any:
    raw = getattr(m, fd.name)
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        return dict(raw)
    if _repeated(fd):
        (item,) = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return tuple(_one(fd, x, item) for x in raw)
    if fd.message_type is not None and _optional(hint) and not m.HasField(fd.name):
        return None
    return _one(fd, raw, _strip_none(hint))


def _one(fd: FieldDescriptor, raw: Any, hint: Any) -> Any:
    if fd.enum_type is not None:
        return enum_name(fd.enum_type, raw)
    if fd.message_type is None:
        return raw
    if fd.message_type.full_name == _STORAGE_REF and hint is str:
        return raw.uri
    own = getattr(hint, "from_proto", None)  # a Mirror's, or a class's own
    return own(raw) if own is not None else from_proto(hint, raw)


def _optional(hint: Any) -> bool:
    return type(None) in typing.get_args(hint)


def _strip_none(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if _optional(hint) and len(args) == 1:
        return args[0]
    return hint


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        module = sys.modules[cls.__module__]
        hints = _HINTS[cls] = typing.get_type_hints(cls, vars(module))
    return hints


def _repeated(fd: FieldDescriptor) -> bool:
    # protobuf 7 dropped FieldDescriptor.label; 5 and 6 may lack is_repeated.
    if hasattr(fd, "is_repeated"):
        return bool(fd.is_repeated)
    return bool(fd.label == FieldDescriptor.LABEL_REPEATED)

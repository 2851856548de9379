"""The codec of the node protocol (``workers.protocol``): one declarative shape for every message.

A message is a frozen dataclass deriving from ``Message`` whose fields are declared with
``wire(kind, default, ...)``; that is its field table. The kind (``Int``, ``Float``, ``Text``,
``Choice``, ``Flag``, ``ListOf``, ``Nested``, ...) says how the field travels in JSON and how it is
checked when read. One codec serves every message: ``encode`` writes a message as its JSON object
(its fields by name, in declaration order), ``decode`` reads one back and raises
``ProtocolError`` naming the first field found wrong by its path
(``desired[0].parts[1].node_rank: required``). A message writes no codec of its own, only the
checks that span its fields (``Message._check``). Readers ignore keys they do not know, so a newer
peer may add fields.

For example (``workers.protocol.RunningAttempt``)::

    @dataclass(frozen=True, slots=True)
    class RunningAttempt(Message):
        job_id: int = wire(Int(minimum=1))  # required: absent or null is an error
        attempt: int = wire(Int(minimum=1))
        state: str = wire(Choice(RUN_STATES))
        started_at: float = wire(Float())
        pid: int | None = wire(Int(minimum=1), None)  # optional: absent reads as None

    RunningAttempt.read({"job_id": 3, "attempt": 1}, "running[0]")
    # ProtocolError: running[0].state: required

Also here: the bounds of a message and a bounded JSON reader (``loads_bounded``) that the portal
uses for its other JSON inputs too. Imports neither ``portal`` nor Django.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, ClassVar, Self, TypeVar

# Bounds of one message (a request larger than MAX_MESSAGE_BYTES is refused with HTTP 413).
MAX_MESSAGE_BYTES = 8 * 2**20
MAX_ITEMS = 10_000  # entries in any one list (samples, results, ...)
MAX_TEXT = 2**20  # characters of any one string (a command, a log tail)
MAX_NAME = 200  # characters of a node name, a metric name, a state
MAX_JSON_DEPTH = 64  # nesting of any JSON document read here (the messages need 6)


class ProtocolError(ValueError):
    """A message does not follow the protocol; the text names the offending field."""


# --- JSON helpers ---------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(
        type(value), "a list" if isinstance(value, list) else "an object"
    )


def json_nesting_depth(text: str | bytes | bytearray) -> int:
    """The deepest nesting of ``[`` / ``{`` in a JSON document, read without parsing it (so a
    100,000-deep document is measured without recursion)."""
    if isinstance(text, bytes | bytearray):
        text = bytes(text).decode("utf-8", "replace")
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


class JsonTooDeep(ValueError):
    """A JSON document nested deeper than its reader takes (``loads_bounded``)."""


def loads_bounded(
    data: bytes | bytearray | str, max_depth: int = MAX_JSON_DEPTH, *, finite: bool = True
) -> Any:
    """``json.loads`` of a document nested at most ``max_depth`` levels deep (and, with
    ``finite``, holding finite numbers only). Raises ``JsonTooDeep`` (naming the depth) before
    decoding a deeper one (Python's decoder would hit its recursion limit), ``ValueError`` for
    anything that is not JSON."""
    depth = json_nesting_depth(data)
    if depth > max_depth:
        raise JsonTooDeep(f"nested {depth} levels deep; at most {max_depth}")
    try:
        return json.loads(data, parse_constant=_no_constant if finite else None)
    except RecursionError:  # pragma: no cover - the depth check comes first
        raise JsonTooDeep("nested too deeply") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (only finite numbers)")


def _parse(data: bytes | str | Mapping[str, Any]) -> Any:
    if isinstance(data, Mapping):
        return data
    if isinstance(data, bytes | bytearray) and len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message larger than {MAX_MESSAGE_BYTES} bytes")
    try:
        return loads_bounded(data, finite=False)  # a NaN is refused by the field it is in
    except JsonTooDeep as exc:
        raise ProtocolError(f"not a message: JSON {exc}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"not JSON: {exc}") from None


def _dump(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), allow_nan=False)


# --- field kinds ----------------------------------------------------------------------------------


class Kind:
    """How one field's value is read from JSON (checked; errors name ``where``) and written."""

    #: An absent (or null) value is fine even where the field has no default: it reads as
    #: ``empty()``. Lists, flags and maps are optional this way; numbers and texts are not.
    optional = False

    def empty(self) -> Any:
        return None

    def read(self, value: Any, where: str) -> Any:
        raise NotImplementedError

    def write(self, value: Any) -> Any:
        return value  # a number, a string, a flag: as it is


@dataclass(frozen=True)
class Int(Kind):
    """An integer (not a boolean) that fits 64 bits, at least ``minimum``."""

    minimum: int | None = None

    def read(self, value: Any, where: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ProtocolError(f"{where}: expected an integer, got {_kind(value)}")
        if not -(2**63) <= value < 2**63:
            raise ProtocolError(f"{where}: {value} is out of range")
        if self.minimum is not None and value < self.minimum:
            raise ProtocolError(f"{where}: must be at least {self.minimum}, got {value}")
        return value


@dataclass(frozen=True)
class Float(Kind):
    """A finite number, read as a float; one below ``floor`` reads as ``floor``."""

    floor: float | None = None

    def read(self, value: Any, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ProtocolError(f"{where}: expected a number, got {_kind(value)}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond any float (hundreds of digits)
            raise ProtocolError(f"{where}: out of range for a number") from None
        if not math.isfinite(number):
            raise ProtocolError(f"{where}: must be a finite number")
        return number if self.floor is None else max(self.floor, number)


@dataclass(frozen=True)
class Text(Kind):
    """A string of at most ``limit`` characters, without NUL. ``blank_as_none``: "" reads as
    None (the field says "not given" either way)."""

    limit: int = MAX_NAME
    blank_as_none: bool = False

    def empty(self) -> Any:
        return None if self.blank_as_none else ""

    def read(self, value: Any, where: str) -> str | None:
        if not isinstance(value, str):
            raise ProtocolError(f"{where}: expected a string, got {_kind(value)}")
        if len(value) > self.limit:
            raise ProtocolError(f"{where}: longer than {self.limit} characters")
        if "\x00" in value:
            raise ProtocolError(f"{where}: contains a NUL character")
        return None if self.blank_as_none and not value else value


@dataclass(frozen=True)
class Choice(Kind):
    """One of ``options`` (a name: a ``Text`` first)."""

    options: tuple[str, ...]

    def read(self, value: Any, where: str) -> str:
        text = Text().read(value, where)
        if text not in self.options:
            raise ProtocolError(f"{where}: {text!r} is not one of {', '.join(self.options)}")
        return str(text)


@dataclass(frozen=True)
class OneOf(Kind):
    """Any JSON value that must equal one of ``options`` (said tersely: a list's entries)."""

    options: tuple[str, ...]

    def read(self, value: Any, where: str) -> str:
        if value not in self.options:
            raise ProtocolError(f"{where}: one of {', '.join(self.options)}")
        return str(value)


class Flag(Kind):
    """true or false; absent: false."""

    optional = True

    def empty(self) -> bool:
        return False

    def read(self, value: Any, where: str) -> bool:
        if not isinstance(value, bool):
            raise ProtocolError(f"{where}: expected true or false, got {_kind(value)}")
        return value


@dataclass(frozen=True)
class Id(Kind):
    """An integer from ``low`` to below ``high`` standing for a ``what`` (a list's entries)."""

    low: int
    high: int
    what: str

    def read(self, value: Any, where: str) -> int:
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not self.low <= value < self.high
        ):
            raise ProtocolError(f"{where}: expected a {self.what}, got {value!r}")
        return value


@dataclass(frozen=True)
class ListOf(Kind):
    """A list of at most ``MAX_ITEMS`` values of one kind, read as a tuple; absent: empty."""

    item: Kind
    optional = True

    def empty(self) -> tuple[Any, ...]:
        return ()

    def read(self, value: Any, where: str) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected a list, got {_kind(value)}")
        if len(value) > MAX_ITEMS:
            raise ProtocolError(f"{where}: more than {MAX_ITEMS} entries")
        return tuple(self.item.read(v, f"{where}[{i}]") for i, v in enumerate(value))

    def write(self, value: Any) -> list[Any]:
        return [self.item.write(v) for v in value]


@dataclass(frozen=True)
class Nested(Kind):
    """Another message (its own field table)."""

    message: type[Message]

    def read(self, value: Any, where: str) -> Message:
        return decode(self.message, value, where)

    def write(self, value: Any) -> Any:
        return encode(value)


class Environment(Kind):
    """Environment variables: names (no ``=``, not empty) to strings; absent: none."""

    optional = True

    def empty(self) -> dict[str, str]:
        return {}

    def write(self, value: Any) -> Any:
        return _plain(value)

    def read(self, value: Any, where: str) -> dict[str, str]:
        if not isinstance(value, Mapping):
            raise ProtocolError(f"{where}: expected an object, got {_kind(value)}")
        out = {}
        for key, text in value.items():
            if not isinstance(text, str) or len(text) > MAX_TEXT or "\x00" in text:
                raise ProtocolError(f"{where}.{key}: expected a string")
            if "\x00" in key or "=" in key or not key:
                raise ProtocolError(f"{where}: bad variable name {key!r}")
            out[str(key)] = text
        return out


class AnyObject(Kind):
    """A free-form JSON object (a profile), kept as it is; absent: None."""

    optional = True

    def write(self, value: Any) -> Any:
        return _plain(value)

    def read(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ProtocolError(f"{where}: expected an object, got {_kind(value)}")
        return dict(value)


@dataclass(frozen=True)
class Record(Kind):
    """A JSON object (a dict, not a message) whose ``keys`` are required, each of its kind.
    ``keep_all``: the object is kept as sent, other keys too; else only ``keys``, as read."""

    keys: Mapping[str, Kind]
    keep_all: bool = False

    def write(self, value: Any) -> Any:
        return _plain(value)

    def read(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ProtocolError(f"{where}: expected an object, got {_kind(value)}")
        out = {}
        for key, kind in self.keys.items():
            if value.get(key) is None:
                raise ProtocolError(f"{where}.{key}: required")
            out[key] = kind.read(value[key], f"{where}.{key}")
        return dict(value) if self.keep_all else out


@dataclass(frozen=True)
class Wire:
    """One row of a message's field table (``wire``)."""

    kind: Kind
    required: bool  # absent or null is an error
    check: Callable[[Any, str], Any] | None  # (value, where) -> value, after the kind's reading
    first: bool  # read before the others (a version: a foreign message is refused at once)


def wire(
    kind: Kind,
    default: Any = MISSING,
    *,
    factory: Callable[[], Any] | Any = MISSING,
    required: bool | None = None,
    check: Callable[[Any, str], Any] | None = None,
    first: bool = False,
) -> Any:
    """A message field: its JSON ``kind`` and its ``default`` (or ``factory``). An absent or
    null value reads as the default, else as the kind's empty value where the kind is optional,
    else is an error; ``required`` overrides that (a field may have a default in Python and be
    required on the wire). ``check`` refines the value read, naming ``where`` when it refuses.
    ``first``: read before the other fields (a version, so that a message of another version is
    refused for that and nothing else; an attempt's parts and node rank, the frame of the rest)."""
    if required is None:
        required = default is MISSING and factory is MISSING and not kind.optional
    spec = Wire(kind, required, check, first)
    return field(default=default, default_factory=factory, metadata={"wire": spec})


Row = tuple[Field[Any], Wire]
_TABLES: dict[type, tuple[tuple[Row, ...], tuple[Row, ...]]] = {}


def _table(cls: type) -> tuple[Row, ...]:
    """A message class's field table, in declaration order (the order ``encode`` writes)."""
    return _tables(cls)[0]


def _read_order(cls: type) -> tuple[Row, ...]:
    """The field table in the order ``decode`` reads it: the ``first`` fields, then the rest."""
    return _tables(cls)[1]


def _tables(cls: type) -> tuple[tuple[Row, ...], tuple[Row, ...]]:
    found = _TABLES.get(cls)
    if found is None:
        rows = []
        for f in fields(cls):
            if "wire" not in f.metadata:  # pragma: no cover - a programming error
                raise TypeError(f"{cls.__name__}.{f.name}: declare it with wire()")
            rows.append((f, f.metadata["wire"]))
        ordered = sorted(rows, key=lambda row: not row[1].first)
        found = _TABLES[cls] = (tuple(rows), tuple(ordered))
    return found


def _absent(f: Field[Any], spec: Wire) -> Any:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return spec.kind.empty()


M = TypeVar("M", bound="Message")


def decode(cls: type[M], data: Any, path: str) -> M:
    """Read a ``cls`` message from its JSON form (parsed), checking every field;
    ``ProtocolError`` names the first field found wrong by its path under ``path``."""
    table = _table(cls)
    if cls.list_form:
        if not isinstance(data, list) or len(data) != len(table):
            raise ProtocolError(f"{path}: expected {cls.list_form}")
        data = {f.name: value for (f, _), value in zip(table, data, strict=True)}
    if not isinstance(data, Mapping):
        raise ProtocolError(f"{path or 'message'}: expected an object, got {_kind(data)}")
    values = {}
    for f, spec in _read_order(cls):
        where = f"{path}.{f.name}" if path else f.name
        raw = data.get(f.name)
        if raw is None:
            if spec.required:
                raise ProtocolError(f"{where}: required")
            value = _absent(f, spec)
        else:
            value = spec.kind.read(raw, where)
        values[f.name] = value if spec.check is None else spec.check(value, where)
    message = cls(**values)
    message._check(path)
    return message


def encode(message: Message) -> Any:
    """A message's JSON form: an object of its fields by name (``Sample``: a list of them)."""
    out = {}
    for f, spec in _table(type(message)):
        value = getattr(message, f.name)
        out[f.name] = None if value is None else spec.kind.write(value)
    return list(out.values()) if message.list_form else out


def _plain(value: Any) -> Any:
    """A free-form value as JSON: tuples as lists, mappings as objects."""
    if isinstance(value, Message):
        return encode(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


class Message:
    """The base of every message: its JSON form comes from its field table (``wire``).
    Top-level messages travel as text (``to_json`` / ``from_json``), the others inside them
    (``to_dict`` / ``read``)."""

    __slots__ = ()
    #: Non-empty: the message travels as a list of its fields in order, not an object, and this
    #: names them in the error for a list of another shape.
    list_form: ClassVar[str] = ""

    def to_dict(self) -> Any:
        return encode(self)

    @classmethod
    def read(cls, data: Any, path: str) -> Self:
        return decode(cls, data, path)

    def to_json(self) -> str:
        return _dump(encode(self))

    @classmethod
    def from_json(cls, data: bytes | str | Mapping[str, Any]) -> Self:
        return decode(cls, _parse(data), "")

    def _check(self, path: str) -> None:
        """Checks that span several fields, after each field's own (none by default)."""

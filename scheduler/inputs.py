"""Readable errors for bad input files, and a YAML loader that remembers line numbers.

Every reader of user files (traces, cluster specs, profiles, scenarios) raises ``InputError``
naming the file, the line (1-based) and the field, so the command line can print one clear
sentence instead of a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypedDict, overload

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type hints (types-PyYAML not installed)


class InputError(ValueError):
    """A user-supplied file is wrong: ``file:line: field 'x': message``."""

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.file = str(file) if file is not None else None
        self.line = line
        self.field = field
        super().__init__(str(self))

    def __str__(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where += f":{self.line}"
        what = f"field {self.field!r}: " if self.field else ""
        return f"{where}: {what}{self.message}"


class Loc(TypedDict):
    """Where a value came from, for ``**loc`` in ``InputError`` / ``to_float`` calls."""

    file: str | Path
    line: int | None


class FieldLoc(TypedDict):
    """``Loc`` plus the field name."""

    file: str | Path
    line: int | None
    field: str


class MarkedDict(dict):
    """A YAML mapping that knows its own line and the line of each key (1-based)."""

    line: int | None = None
    key_lines: dict[str, int]

    def line_of(self, key: str) -> int | None:
        return getattr(self, "key_lines", {}).get(key, self.line)


class MarkedList(list):
    """A YAML sequence that knows its own line and the line of each item (1-based)."""

    line: int | None = None
    item_lines: list[int]

    def line_of(self, index: int) -> int | None:
        lines = getattr(self, "item_lines", [])
        return lines[index] if index < len(lines) else self.line


def line_of(container: Any, key: Any) -> int | None:
    """Line of ``key`` in a Marked container, or None for plain containers."""
    if isinstance(container, (MarkedDict, MarkedList)):
        return container.line_of(key)
    return None


def _convert(node: yaml.Node, constructor: yaml.constructor.SafeConstructor) -> Any:
    if isinstance(node, yaml.MappingNode):
        out = MarkedDict()
        out.line = node.start_mark.line + 1
        out.key_lines = {}
        for key_node, value_node in node.value:
            key = _convert(key_node, constructor)
            out[key] = _convert(value_node, constructor)
            out.key_lines[str(key)] = key_node.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        seq = MarkedList(_convert(v, constructor) for v in node.value)
        seq.line = node.start_mark.line + 1
        seq.item_lines = [v.start_mark.line + 1 for v in node.value]
        return seq
    return constructor.construct_object(node, deep=True)


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file into plain values whose dicts and lists know their line numbers.

    Raises InputError (with the line) for unreadable or binary files, bytes that are not
    UTF-8, YAML syntax errors, and strings with a NUL character or a lone surrogate.
    """
    sniff_binary(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read file ({exc.strerror})", file=path) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InputError(
            f"not valid UTF-8 (byte 0x{data[exc.start]:02x})", file=path, line=line
        ) from None
    return parse_yaml(text, source=path)


def parse_yaml(text: str, *, source: str | Path = "<yaml>") -> Any:
    """Like ``load_yaml`` for text already read; ``source`` names it in errors."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.reader.ReaderError as exc:  # a character YAML does not accept (NUL...)
        what = f"#x{exc.character:04x}" if isinstance(exc.character, int) else "a character"
        raise InputError(
            f"bad YAML: unacceptable character {what}",
            file=source,
            line=text[: exc.position].count("\n") + 1,
        ) from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"bad YAML: {problem}", file=source, line=_mark_line(exc)) from None
    except RecursionError:
        raise InputError("bad YAML: nested too deeply", file=source) from None
    if node is None:
        return None
    try:
        value = _convert(node, yaml.constructor.SafeConstructor())
    except yaml.YAMLError as exc:  # e.g. a bad !!binary or timestamp value
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"bad YAML: {problem}", file=source, line=_mark_line(exc)) from None
    except RecursionError:
        raise InputError("bad YAML: nested too deeply", file=source) from None
    _check_strings(value, source, getattr(value, "line", None), "")
    return value


def _mark_line(exc: Exception) -> int | None:
    mark = getattr(exc, "problem_mark", None)
    return int(mark.line) + 1 if mark is not None else None


def _check_strings(value: Any, source: str | Path, line: int | None, where: str) -> None:
    """InputError for a key or string value with a NUL character, a lone surrogate (YAML's
    ``"\\ud800"`` escape makes one) or more than ``MAX_CELL_CHARS`` characters."""
    if isinstance(value, str):
        check_text(value, file=source, line=line, field=where or "value")
    elif isinstance(value, MarkedDict):
        for key, item in value.items():
            key_line = value.line_of(str(key)) if isinstance(key, str) else line
            path = f"{where}.{key}" if where else str(key)
            if isinstance(key, str):
                check_text(key, file=source, line=key_line, field=path)
            _check_strings(item, source, key_line, path)
    elif isinstance(value, MarkedList):
        for i, item in enumerate(value):
            _check_strings(item, source, value.line_of(i), f"{where}[{i}]")


def require_mapping(value: Any, *, file: str | Path, line: int | None, field: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise InputError(
            f"expected a mapping, got {type(value).__name__}", file=file, line=line, field=field
        )
    return value


#: Integers in user files fit what the portal's database stores (a signed 32-bit column).
MAX_INT = 2**31 - 1
#: Sane ceilings for numbers no real trace or cluster comes near ("absurd" above them).
MAX_SECONDS = 1e10  # arrival and run times: about 317 years
MAX_MB = 1e9  # memory: 1 PB
MAX_STEPS = 1e15  # training steps of one job
MAX_JOB_GPUS = 1_000_000  # GPUs (or cores) one job may ask
#: Text limits: a cell of a CSV file, and a physical line of it.
MAX_CELL_CHARS = 4096
MAX_LINE_CHARS = 65536
_SNIFF_BYTES = 8192


@overload
def to_float(
    value: Any,
    *,
    file: str | Path,
    line: int | None,
    field: str,
    minimum: float | None = None,
    maximum: float | None = None,
    allow_none: Literal[False] = False,
    positive: bool = False,
) -> float: ...


@overload
def to_float(
    value: Any,
    *,
    file: str | Path,
    line: int | None,
    field: str,
    minimum: float | None = None,
    maximum: float | None = None,
    allow_none: bool,
    positive: bool = False,
) -> float | None: ...


def to_float(
    value: Any,
    *,
    file: str | Path,
    line: int | None,
    field: str,
    minimum: float | None = None,
    maximum: float | None = None,
    allow_none: bool = False,
    positive: bool = False,
) -> float | None:
    """``value`` as a finite float (>= ``minimum``, <= ``maximum``, > 0 if ``positive``),
    else InputError."""
    if value is None or (isinstance(value, str) and value.strip() == ""):
        if allow_none:
            return None
        raise InputError("missing value", file=file, line=line, field=field)
    if isinstance(value, bool):
        raise InputError(f"expected a number, got {value!r}", file=file, line=line, field=field)
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise InputError(
            f"expected a number, got {_short(value)}", file=file, line=line, field=field
        ) from None
    if not math.isfinite(number):
        raise InputError(
            f"expected a finite number, got {_short(value)}", file=file, line=line, field=field
        )
    if minimum is not None and number < minimum:
        raise InputError(
            f"must be >= {minimum:g}, got {_short(value)}", file=file, line=line, field=field
        )
    if positive and number <= 0:
        raise InputError(f"must be > 0, got {_short(value)}", file=file, line=line, field=field)
    if maximum is not None and number > maximum:
        raise InputError(
            f"must be <= {maximum:g}, got {_short(value)}", file=file, line=line, field=field
        )
    return number


def to_int(
    value: Any,
    *,
    file: str | Path,
    line: int | None,
    field: str,
    minimum: int | None = None,
    maximum: int = MAX_INT,
) -> int:
    """``value`` as an int (``"4"`` and ``4.0`` accepted, ``4.5`` not) between ``minimum``
    (default ``-MAX_INT``) and ``maximum`` (default ``MAX_INT``: what a database integer
    holds), else InputError."""
    loc: FieldLoc = {"file": file, "line": line, "field": field}
    number: float | int
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        digits = value.strip()
        if len(digits) > 20:  # far beyond any bound; int() of it would only waste time
            raise InputError(f"must be <= {maximum}, got {_short(value)}", **loc)
        number = int(digits)
    else:
        number = to_float(value, **loc)
        if number != int(number):
            raise InputError(f"expected a whole number, got {_short(value)}", **loc)
    low = -MAX_INT if minimum is None else minimum
    if number < low:
        raise InputError(f"must be >= {low}, got {_short(value)}", **loc)
    if number > maximum:
        raise InputError(f"must be <= {maximum}, got {_short(value)}", **loc)
    return int(number)


def _short(value: Any) -> str:
    """``repr(value)``, cut to 40 characters (a 200 KB cell must not flood the message)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_text(
    value: str, *, file: str | Path, line: int | None, field: str, limit: int = MAX_CELL_CHARS
) -> str:
    """``value`` if it is clean text: no NUL character, no lone surrogate (which is also how
    bytes that are not UTF-8 show after ``surrogateescape`` decoding), at most ``limit``
    characters; else InputError naming the problem and where it is."""
    loc: FieldLoc = {"file": file, "line": line, "field": field}
    if len(value) > limit:
        raise InputError(f"{len(value):,} characters; at most {limit:,}", **loc)
    if "\x00" in value:
        raise InputError(
            f"contains a NUL character (at character {value.index(chr(0)) + 1})", **loc
        )
    if value.isascii():
        return value
    for i, ch in enumerate(value):
        if "\ud800" <= ch <= "\udfff":
            code = ord(ch)
            if 0xDC80 <= code <= 0xDCFF:  # an undecodable byte, kept by surrogateescape
                what = f"is not valid UTF-8 (byte 0x{code - 0xDC00:02x} at character {i + 1})"
            else:
                what = f"contains a lone surrogate (U+{code:04X} at character {i + 1})"
            raise InputError(what, **loc)
    return value


def sniff_binary(path: str | Path) -> None:
    """InputError if the start of ``path`` looks like binary data rather than text (more than
    5 % control bytes other than tab, newline and carriage return, e.g. NULs), or if the file
    cannot be read."""
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as exc:
        raise InputError(f"cannot read file ({exc.strerror})", file=path) from exc
    if not head:
        return
    control = sum(1 for b in head if b < 9 or 13 < b < 32 or b == 127)
    if control > 0.05 * len(head):
        raise InputError(
            f"not a text file ({control} control bytes in its first {len(head):,}; "
            "a binary or compressed file?)",
            file=path,
            line=1,
        )

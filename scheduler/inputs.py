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

    Raises InputError (with the line) for unreadable files and YAML syntax errors.
    """
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"cannot read file ({exc.strerror})", file=path) from exc
    return parse_yaml(text, source=path)


def parse_yaml(text: str, *, source: str | Path = "<yaml>") -> Any:
    """Like ``load_yaml`` for text already read; ``source`` names it in errors."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"bad YAML: {problem}", file=source, line=line) from exc
    if node is None:
        return None
    return _convert(node, yaml.constructor.SafeConstructor())


def require_mapping(value: Any, *, file: str | Path, line: int | None, field: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise InputError(
            f"expected a mapping, got {type(value).__name__}", file=file, line=line, field=field
        )
    return value


@overload
def to_float(
    value: Any,
    *,
    file: str | Path,
    line: int | None,
    field: str,
    minimum: float | None = None,
    allow_none: Literal[False] = False,
) -> float: ...


@overload
def to_float(
    value: Any,
    *,
    file: str | Path,
    line: int | None,
    field: str,
    minimum: float | None = None,
    allow_none: bool,
) -> float | None: ...


def to_float(
    value: Any,
    *,
    file: str | Path,
    line: int | None,
    field: str,
    minimum: float | None = None,
    allow_none: bool = False,
) -> float | None:
    """``value`` as a finite float (>= ``minimum`` if given), else InputError."""
    if value is None or (isinstance(value, str) and value.strip() == ""):
        if allow_none:
            return None
        raise InputError("missing value", file=file, line=line, field=field)
    if isinstance(value, bool):
        raise InputError(f"expected a number, got {value!r}", file=file, line=line, field=field)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InputError(
            f"expected a number, got {value!r}", file=file, line=line, field=field
        ) from None
    if not math.isfinite(number):
        raise InputError(
            f"expected a finite number, got {value!r}", file=file, line=line, field=field
        )
    if minimum is not None and number < minimum:
        raise InputError(
            f"must be >= {minimum:g}, got {value!r}", file=file, line=line, field=field
        )
    return number


def to_int(
    value: Any,
    *,
    file: str | Path,
    line: int | None,
    field: str,
    minimum: int | None = None,
) -> int:
    """``value`` as an int (``"4"`` and ``4.0`` accepted, ``4.5`` not), else InputError."""
    number = to_float(value, file=file, line=line, field=field)
    if number != int(number):
        raise InputError(
            f"expected a whole number, got {value!r}", file=file, line=line, field=field
        )
    if minimum is not None and number < minimum:
        raise InputError(f"must be >= {minimum}, got {value!r}", file=file, line=line, field=field)
    return int(number)

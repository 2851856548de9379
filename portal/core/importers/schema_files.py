"""Our own profile files: ``csv`` (one row per profile) and ``json`` (one object per profile),
with ``ApplicationProfile`` field names (``docs/profiles.md``)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from portal.core.importers.records import (
    MAX_CELL_CHARS,
    MAX_FILE_BYTES,
    MAX_FILE_DEPTH,
    ProfileImportError,
    ProfileRecord,
    RowError,
    _Collector,
    record_from_mapping,
)
from portal.core.validation import (
    json_nesting_depth,
    text_error,
)


def _decode(content: bytes | str) -> str:
    size = len(content) if isinstance(content, bytes) else len(content.encode("utf-8", "replace"))
    if size > MAX_FILE_BYTES:
        raise ProfileImportError(
            [RowError(None, "file", f"{size:,} bytes; a profile file may hold {MAX_FILE_BYTES:,}")]
        )
    if isinstance(content, bytes):
        try:
            content = content.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ProfileImportError([RowError(None, "file", "not UTF-8 text")]) from None
    text = content.lstrip("\ufeff")
    problem = text_error(text)
    if problem:
        where = text.find("\x00")
        line = text.count("\n", 0, where) + 1 if where >= 0 else None
        raise ProfileImportError(
            [RowError(line, "file", f"not a text file: it {problem} (binary data?)")]
        )
    return text


def parse_csv(text: str) -> list[ProfileRecord]:
    """Our CSV schema: a header of field names, one profile per line."""
    out = _Collector()
    # strict: a quote that never closes (or stray text after a closing quote) is an error, not
    # a cell that silently swallows the following lines
    reader = csv.DictReader(io.StringIO(text), strict=True)
    try:
        header = reader.fieldnames
    except csv.Error as exc:
        raise ProfileImportError([RowError(1, "file", _csv_message(exc))]) from None
    if not header:
        raise ProfileImportError([RowError(None, "file", "empty file: no header")])
    records = []
    rows: list[tuple[int, dict[str, Any]]] = []
    start = reader.line_num + 1
    try:
        for row in reader:
            rows.append((start, row))
            start = reader.line_num + 1
    except csv.Error as exc:
        raise ProfileImportError([RowError(start, "file", _csv_message(exc))]) from None
    for line, row in rows:
        too_long = [k for k, v in row.items() if isinstance(v, str) and len(v) > MAX_CELL_CHARS]
        if too_long:
            for key in too_long:
                out.add(line, str(key), f"cell longer than {MAX_CELL_CHARS:,} characters")
            continue
        multi_line = [
            str(k)
            for k, v in row.items()
            if k is not None and k not in _MULTI_LINE and isinstance(v, str) and "\n" in v
        ]
        if multi_line:  # a quoted cell running over lines: a stray quote, most likely
            for key in multi_line:
                out.add(line, key, "a quoted cell runs over several lines (an unbalanced quote?)")
            continue
        if None in row:
            out.add(line, "(row)", f"{len(row[None])} more cell(s) than header columns")
            row.pop(None)
        if all(v is None or not str(v).strip() for v in row.values()):
            continue
        records.append(record_from_mapping(row, line, out))
    return _finish(records, out)


#: Columns whose text may hold line breaks (inside a quoted cell).
_MULTI_LINE = frozenset({"description"})


def _csv_message(exc: csv.Error) -> str:
    text = str(exc)
    if "field larger than field limit" in text:
        return f"a cell is longer than {csv.field_size_limit():,} characters"
    if "unexpected end of data" in text:
        return "not valid CSV: a quote opened in this row never closes (unbalanced quote)"
    return f"not valid CSV: {text}"


def parse_json(text: str) -> list[ProfileRecord]:
    """Our JSON schema: a list of profile objects, or ``{"profiles": [...]}``, or one object."""
    depth = json_nesting_depth(text)
    if depth > MAX_FILE_DEPTH:
        raise ProfileImportError(
            [RowError(None, "file", f"JSON nested {depth} levels deep; at most {MAX_FILE_DEPTH}")]
        )
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ProfileImportError(
            [RowError(None, "file", f"not valid JSON: {exc.msg} at line {exc.lineno}")]
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ProfileImportError([RowError(None, "file", f"not valid JSON: {exc}")]) from None
    if isinstance(data, dict) and "profiles" in data:
        data = data["profiles"]
    elif isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise ProfileImportError([RowError(None, "file", "expected a list of profile objects")])
    out = _Collector()
    records = []
    for i, item in enumerate(data, 1):
        if not isinstance(item, dict):
            out.add(i, "(row)", "expected an object")
            continue
        records.append(record_from_mapping(item, i, out))
    return _finish(records, out)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finish(records: list[ProfileRecord], out: _Collector) -> list[ProfileRecord]:
    seen: dict[tuple[str, str], int | None] = {}
    for rec in records:
        if not rec.fields.get("name"):
            continue
        if rec.key in seen:
            out.add(
                rec.row,
                "name",
                f"{rec.key[0]} v{rec.key[1]} appears twice in the file (first at row "
                f"{seen[rec.key]})",
            )
        else:
            seen[rec.key] = rec.row
    if not records and not out.errors:
        out.add(None, "file", "no profiles in the file")
    if out.errors:
        raise ProfileImportError(out.errors)
    return records

"""Parse profile files into validated ``ProfileRecord`` objects (no database writes here).

Four formats, documented in ``docs/profiles.md``:

- ``csv``: our schema, one row per profile; column names are ``ApplicationProfile`` field names,
  GPU run times are ``gpu_time_s.<MODEL>`` columns, memory steps one ``memory_steps`` cell.
- ``json``: the same fields, one object per profile (a list, or ``{"profiles": [...]}``);
  ``gpu_time_s`` is an object ``{model: seconds}``, ``memory_steps`` a list of objects.
- ``nvprof``: ``nvprof --csv --metrics ...`` output (one row per kernel and metric), aggregated
  over kernels (mean weighted by invocations) into one profile.
- ``ncu``: Nsight Compute ``ncu --csv`` output, either the default details page (one row per
  kernel and metric: ``"Metric Name","Metric Unit","Metric Value"``) or ``--page raw`` (one row
  per kernel, one column per metric, a units row under the header); aggregated over kernels
  (mean weighted by kernel duration) into one profile.

Every row is validated; all errors are collected (row, field, message) and raised together as
``ProfileImportError`` so a caller can reject the whole file. Row numbers are file line numbers
for CSV (the header is line 1) and 1-based positions for JSON.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from django.db import models

from portal.core.models import JOB_KINDS, ApplicationProfile
from portal.core.validation import (
    DB_INT_MAX,
    JSON_MAX_DEPTH,
    TEXT_MAX_CHARS,
    json_error,
    json_nesting_depth,
    text_error,
)
from scheduler.catalog import UnknownGpuModel, canonical_model, gpu_spec
from workers.protocol import loads_bounded

FORMATS = ("csv", "json", "nvprof", "ncu")

# Bounds of a profile file: anything larger is refused with one clear error, never a 500.
MAX_FILE_BYTES = 10 * 1024 * 1024
MAX_CELL_CHARS = 65_536  # one CSV cell (the csv module's own limit is 131,072)
MAX_FILE_DEPTH = JSON_MAX_DEPTH + 4  # a file's list, a profile, memory steps, then args
MAX_MEMORY_STEPS = 100
MAX_GPU_TIMES = 64

# Columns a file may carry (e.g. a JSON export from the API) that an import ignores: status and
# source are import options, the rest is assigned by the server.
IGNORED_KEYS = frozenset(
    {
        "id",
        "status",
        "source",
        "created_at",
        "updated_at",
        "created_by",
        "approved_by",
        "approved_at",
        "classes",
        "url",
    }
)
_NOT_IMPORTED = {"id", "status", "source", "created_by", "approved_by", "approved_at"}
_KINDS = {value for value, _label in JOB_KINDS}


def _profile_fields() -> dict[str, models.Field]:
    return {
        f.name: f
        for f in ApplicationProfile._meta.concrete_fields
        if f.name not in _NOT_IMPORTED
        and not getattr(f, "auto_now", False)
        and not getattr(f, "auto_now_add", False)
        and not f.name.endswith("_id")
    }


PROFILE_FIELDS: dict[str, models.Field] = _profile_fields()


@dataclass
class ProfileRecord:
    """One profile to create or update. Only keys present in ``fields`` are written;
    ``gpu_times`` / ``memory_steps`` of ``None`` mean "not given" (kept on update)."""

    row: int | None
    fields: dict[str, Any]
    gpu_times: dict[str, float] | None = None
    memory_steps: list[tuple[float, float, float]] | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.fields["name"], str(self.fields.get("version") or "1"))


@dataclass
class RowError:
    row: int | None
    field: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"row": self.row, "field": self.field, "message": self.message}

    def __str__(self) -> str:
        where = f"row {self.row}" if self.row is not None else "file"
        return f"{where}, {self.field}: {self.message}"


class ProfileImportError(Exception):
    """The file was rejected; ``errors`` lists every problem found (nothing was stored)."""

    def __init__(self, errors: list[RowError]) -> None:
        self.errors = errors
        shown = "; ".join(str(e) for e in errors[:5])
        more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
        super().__init__(f"{len(errors)} error(s): {shown}{more}")


class ProfileImportConflict(ProfileImportError):
    """Another import stored the same profile while this one ran (HTTP 409): nothing stored."""


@dataclass
class _Collector:
    errors: list[RowError] = field(default_factory=list)

    def add(self, row: int | None, name: str, message: str) -> None:
        self.errors.append(RowError(row, name, message))


# --------------------------------------------------------------------------------------------
# Our schema: value checks shared by CSV and JSON


def _number(raw: Any, *, integer: bool) -> float | int:
    if isinstance(raw, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(raw, str):
        text = raw.strip()
        value: float = float(text)
    elif isinstance(raw, int | float):
        value = float(raw)
    else:
        raise ValueError(f"expected a number, got {type(raw).__name__}")
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    if integer:
        if value != int(value):
            raise ValueError("must be a whole number")
        return int(value)
    return value


def _clean_field(name: str, raw: Any) -> Any:
    """Convert and check one field value; raises ValueError with a readable message."""
    model_field = PROFILE_FIELDS[name]
    if name == "default_time_limit_s":  # seconds, or any form of scheduler.durations
        from scheduler.durations import parse_duration

        return parse_duration(raw)
    if isinstance(model_field, models.JSONField):
        if isinstance(raw, str):
            try:
                raw = loads_bounded(raw, MAX_FILE_DEPTH)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not valid JSON: {exc.msg}") from None
            except ValueError as exc:  # too deep, NaN
                raise ValueError(f"not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise ValueError("must be a JSON object")
        problem = json_error(raw)
        if problem:
            raise ValueError(problem)
        return raw
    if isinstance(model_field, models.FloatField | models.IntegerField):
        integer = isinstance(model_field, models.IntegerField)
        try:
            value = _number(raw, integer=integer)
        except ValueError as exc:
            if str(exc).startswith(("expected", "must")):
                raise
            raise ValueError(f"{raw!r} is not a number") from None
        if value < 0:
            raise ValueError("must not be negative")
        if integer and value > DB_INT_MAX:
            raise ValueError(f"{value:,} is too large: at most {DB_INT_MAX:,}")
        if name.endswith("_pct") and value > 100:
            raise ValueError("a percentage must be within 0..100")
        return value
    # text
    if not isinstance(raw, str):
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            raw = f"{raw:g}" if isinstance(raw, float) else str(raw)
        else:
            raise ValueError("must be text")
    problem = text_error(raw)
    if problem:
        raise ValueError(problem)
    value = raw.strip()
    if name == "kind" and value not in _KINDS:
        raise ValueError(f"unknown kind {value!r}; known: {', '.join(sorted(_KINDS))}")
    max_length = getattr(model_field, "max_length", None) or TEXT_MAX_CHARS
    if len(value) > max_length:
        raise ValueError(f"at most {max_length} characters")
    return value


def parse_memory_steps(raw: Any) -> list[tuple[float, float, float]]:
    """Memory steps from ``"0:0-833;0.25:833-1895"`` (start fraction:from MB-to MB), from
    ``"0-833;833-1895"`` (fractions spread evenly) or from a JSON list of objects with
    ``start_fraction``, ``from_mb``, ``to_mb``. Raises ValueError naming the bad step."""
    steps: list[tuple[float | None, float, float]] = []
    if isinstance(raw, str):
        parts = [p.strip() for p in raw.split(";") if p.strip()]
        for i, part in enumerate(parts, 1):
            m = re.fullmatch(r"(?:([\d.eE+-]+)\s*:)?\s*([\d.eE+-]+)\s*-\s*([\d.eE+-]+)", part)
            if not m:
                raise ValueError(f"step {i} {part!r}: expected 'start:from-to' or 'from-to'")
            try:
                start = float(m.group(1)) if m.group(1) is not None else None
                steps.append((start, float(m.group(2)), float(m.group(3))))
            except ValueError:
                raise ValueError(f"step {i} {part!r}: not a number") from None
    elif isinstance(raw, list):
        for i, item in enumerate(raw, 1):
            if not isinstance(item, dict):
                raise ValueError(f"step {i}: expected an object with from_mb and to_mb")
            unknown = set(item) - {"start_fraction", "from_mb", "to_mb", "index"}
            if unknown:
                raise ValueError(f"step {i}: unknown key(s) {', '.join(sorted(unknown))}")
            try:
                start = item.get("start_fraction")
                steps.append(
                    (
                        None if start is None else float(_number(start, integer=False)),
                        float(_number(item["from_mb"], integer=False)),
                        float(_number(item["to_mb"], integer=False)),
                    )
                )
            except KeyError as exc:
                raise ValueError(f"step {i}: missing {exc.args[0]}") from None
            except ValueError as exc:
                raise ValueError(f"step {i}: {exc}") from None
    else:
        raise ValueError("expected a string like '0:0-833;0.5:833-1895' or a list")
    if len(steps) > MAX_MEMORY_STEPS:
        raise ValueError(f"{len(steps)} steps; at most {MAX_MEMORY_STEPS}")
    if steps and all(s[0] is None for s in steps):
        steps = [(i / len(steps), a, b) for i, (_s, a, b) in enumerate(steps)]
    elif any(s[0] is None for s in steps):
        raise ValueError("give a start fraction for every step or for none")
    result: list[tuple[float, float, float]] = []
    previous = -1.0
    for i, (start, from_mb, to_mb) in enumerate(steps, 1):
        if start is None:  # filled in above; never None here
            raise ValueError(f"step {i}: no start fraction")
        if not 0 <= start <= 1:
            raise ValueError(f"step {i}: start fraction {start:g} is outside 0..1")
        if start <= previous:
            raise ValueError(f"step {i}: start fractions must increase")
        if from_mb < 0 or to_mb < 0:
            raise ValueError(f"step {i}: memory must not be negative")
        if to_mb < from_mb:
            raise ValueError(f"step {i}: to_mb {to_mb:g} is below from_mb {from_mb:g}")
        previous = start
        result.append((start, from_mb, to_mb))
    return result


def _gpu_time(model: str, raw: Any) -> tuple[str, float]:
    if not isinstance(model, str) or text_error(model) or len(model) > 40:
        raise ValueError("not a GPU model name")
    try:
        key = canonical_model(model)
    except UnknownGpuModel as exc:
        raise ValueError(str(exc)) from None
    value = float(_number(raw, integer=False))
    if value <= 0:
        raise ValueError("a run time must be positive")
    return key, value


def memory_max_error(
    max_mb: float | None, steps: list[tuple[float, float, float]] | None
) -> str | None:
    """Why a declared GPU memory maximum contradicts the profile's memory steps (it is below
    their peak: a job would then ask too little), or None. No declared maximum is no error."""
    if max_mb is None or not steps:
        return None
    peak = max(max(lo, hi) for _start, lo, hi in steps)
    if max_mb + 1e-6 >= peak:
        return None
    return (
        f"{max_mb:,.0f} MB is below the peak of the profile's memory steps ({peak:,.0f} MB): "
        "declare at least the peak, or correct the steps"
    )


def record_from_mapping(data: dict[str, Any], row: int | None, out: _Collector) -> ProfileRecord:
    """Validate one profile in our schema (a CSV row or a JSON object); errors go to ``out``.

    Empty strings and ``None`` mean "not given". Returns a record even when errors were found
    (the caller decides by ``out.errors``)."""
    fields: dict[str, Any] = {}
    gpu_times: dict[str, float] | None = None
    steps: list[tuple[float, float, float]] | None = None
    for key, raw in data.items():
        key = (key or "").strip() if isinstance(key, str) else ""
        if text_error(key) or len(key) > 100:
            out.add(row, "(column name)", "not a field name (binary data?)")
            continue
        if key in IGNORED_KEYS:
            continue
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            continue
        if key.startswith("gpu_time_s."):
            try:
                model, value = _gpu_time(key.split(".", 1)[1], raw)
            except ValueError as exc:
                out.add(row, key, str(exc))
                continue
            gpu_times = gpu_times or {}
            gpu_times[model] = value
        elif key in ("gpu_time_s", "gpu_times"):
            if not isinstance(raw, dict):
                out.add(row, key, "expected an object {gpu model: seconds}")
                continue
            if len(raw) > MAX_GPU_TIMES:
                out.add(row, key, f"{len(raw)} GPU models; at most {MAX_GPU_TIMES}")
                continue
            gpu_times = gpu_times or {}
            for model, value in raw.items():
                try:
                    canonical, seconds = _gpu_time(model, value)
                except ValueError as exc:
                    out.add(row, f"{key}.{model}", str(exc))
                    continue
                gpu_times[canonical] = seconds
        elif key == "memory_steps":
            try:
                steps = parse_memory_steps(raw)
            except ValueError as exc:
                out.add(row, key, str(exc))
        elif key in PROFILE_FIELDS:
            try:
                fields[key] = _clean_field(key, raw)
            except ValueError as exc:
                out.add(row, key, str(exc))
        else:
            out.add(row, key or "(empty column name)", "unknown field")
    if not fields.get("name"):
        if "name" not in {e.field for e in out.errors if e.row == row}:
            out.add(row, "name", "required")
        fields.setdefault("name", "")
    fields["version"] = fields.get("version") or "1"
    problem = memory_max_error(fields.get("gpu_memory_max_mb"), steps)
    if problem:
        out.add(row, "gpu_memory_max_mb", problem)
    return ProfileRecord(row=row, fields=fields, gpu_times=gpu_times, memory_steps=steps)


def validate_profile_mapping(data: dict[str, Any], row: int | None = None) -> ProfileRecord:
    """One profile in our schema -> a record; raises ``ProfileImportError`` listing every
    bad field (used by the API's profile create/update)."""
    out = _Collector()
    record = record_from_mapping(data, row, out)
    if out.errors:
        raise ProfileImportError(out.errors)
    return record


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


# --------------------------------------------------------------------------------------------
# Profiler exports: nvprof and Nsight Compute


_VALUE_RE = re.compile(r"^\s*([-+]?[\d,]*\.?\d+(?:[eE][-+]?\d+)?)\s*([A-Za-z/%]*)\s*$")
_LEVEL_RE = re.compile(r"^\s*(Idle|Low|Mid|High|Max)\s*\((\d+)\)\s*$", re.IGNORECASE)
_BYTE_PREFIX = {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1.0, "t": 1e3}  # -> GB/s
_TIME_TO_S = {
    "ns": 1e-9,
    "nsecond": 1e-9,
    "us": 1e-6,
    "usecond": 1e-6,
    "ms": 1e-3,
    "msecond": 1e-3,
    "s": 1.0,
    "second": 1.0,
}


def _measure(raw: str, unit: str = "") -> tuple[float, str]:
    """``"245.6GB/s"`` -> (245.6, "GB/s"); ``"High (7)"`` -> (7, "level"); ``"1,234"`` -> 1234."""
    text = (raw or "").strip().strip('"')
    level = _LEVEL_RE.match(text)
    if level:
        return float(level.group(2)), "level"
    m = _VALUE_RE.match(text)
    if not m:
        raise ValueError(f"cannot read a number from {raw!r}")
    return float(m.group(1).replace(",", "")), (m.group(2) or unit or "").strip()


def _to_gbps(value: float, unit: str) -> float:
    u = unit.lower().replace("byte", "b").replace("/second", "/s")
    m = re.fullmatch(r"([kmgt]?)b/s", u)
    if not m:
        raise ValueError(f"unit {unit!r} is not a throughput")
    return value * _BYTE_PREFIX[m.group(1)]


def _pct(value: float, unit: str) -> float:
    return value if unit == "%" else value * 100 if value <= 1 and unit == "" else value


# Stall reasons of the profilers -> the six groups of ALGORITHMS.md §3 (Table 7).
_NVPROF_STALLS = {
    "stall_exec_dependency": "exec_dependency",
    "stall_inst_fetch": "instruction_fetch",
    "stall_memory_dependency": "memory_dependency",
    "stall_texture": "texture",
    "stall_sync": "synchronization",
    "stall_other": "other",
    "stall_pipe_busy": "other",
    "stall_constant_memory_dependency": "other",
    "stall_memory_throttle": "other",
    "stall_not_selected": "other",
}
# Nsight Compute (Volta+) warp states; "selected" (issuing) is not a stall.
_NCU_STALLS = {
    "long_scoreboard": "memory_dependency",
    "lg_throttle": "memory_dependency",
    "drain": "memory_dependency",
    "imc_miss": "memory_dependency",
    "wait": "exec_dependency",
    "short_scoreboard": "exec_dependency",
    "math_pipe_throttle": "exec_dependency",
    "mio_throttle": "other",
    "tex_throttle": "texture",
    "no_instruction": "instruction_fetch",
    "branch_resolving": "instruction_fetch",
    "barrier": "synchronization",
    "membar": "synchronization",
    "sleeping": "other",
    "dispatch_stall": "other",
    "misc": "other",
    "not_selected": "other",
}


def _weighted_mean(pairs: list[tuple[float, float]]) -> float | None:
    total = sum(w for _v, w in pairs)
    if not pairs:
        return None
    if total <= 0:
        return sum(v for v, _w in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / total


def _aggregate(kernels: list[tuple[dict[str, float], float]]) -> dict[str, Any]:
    """Per-kernel metrics (already in our units and keys) -> profile fields.

    Means are weighted by ``weight`` (invocations for nvprof, duration for ncu); stall reasons
    are normalised so the six groups sum to 100 %."""
    keys = {k for metrics, _w in kernels for k in metrics}
    fields: dict[str, Any] = {}
    for key in sorted(keys):
        pairs = [(m[key], w) for m, w in kernels if key in m]
        value = _weighted_mean(pairs)
        if value is None:
            continue
        if key.startswith("stall:"):
            continue
        if key in ("registers_per_block", "smem_per_block_bytes"):
            fields[key] = int(round(max(v for v, _w in pairs)))  # the largest kernel's need
        else:
            fields[key] = round(value, 4)
    stall_totals: dict[str, float] = {}
    for key in keys:
        if key.startswith("stall:"):
            group = key.split(":", 1)[1]
            value = _weighted_mean([(m[key], w) for m, w in kernels if key in m]) or 0.0
            stall_totals[group] = stall_totals.get(group, 0.0) + value
    total = sum(stall_totals.values())
    if total > 0:
        for group in (
            "exec_dependency",
            "instruction_fetch",
            "memory_dependency",
            "texture",
            "synchronization",
            "other",
        ):
            fields[f"stall_{group}_pct"] = round(100 * stall_totals.get(group, 0.0) / total, 2)
    for key, value in fields.items():
        if key.endswith("_pct"):
            fields[key] = min(100.0, max(0.0, value))
    return fields


def _profiler_record(
    fields: dict[str, Any], options: dict[str, Any], default_name: str | None
) -> list[ProfileRecord]:
    out = _Collector()
    raw: dict[str, Any] = {**fields}
    for opt in ("name", "version", "kind", "description"):
        if options.get(opt):
            raw[opt] = options[opt]
    if not raw.get("name") and default_name:
        raw["name"] = default_name
    if not raw.get("name"):
        out.add(None, "name", "the file does not say which application it profiles; give a name")
    record = record_from_mapping(raw, None, out)
    if out.errors:
        raise ProfileImportError(out.errors)
    return [record]


def _csv_block(lines: list[str], header_index: int) -> list[tuple[int, list[str]]]:
    rows = []
    reader = csv.reader(lines[header_index:])
    for offset, cells in enumerate(reader):
        line_no = header_index + offset + 1
        if not cells or (len(cells) == 1 and cells[0].startswith("==")):
            continue
        rows.append((line_no, [c.strip() for c in cells]))
    return rows


_NVPROF_COMMAND_RE = re.compile(r"^==\d+== NVPROF is profiling process \d+, command: (.+)$")
_NVPROF_METRICS = {
    "sm_efficiency": "sm_efficiency_pct",
    "warp_execution_efficiency": "warp_efficiency_pct",
    "ipc": "ipc",
    "achieved_occupancy": "occupancy_pct",
    "gld_throughput": "gld_gbps",
    "gst_throughput": "gst_gbps",
    "dram_read_throughput": "dram_bw_gbps",
    "dram_write_throughput": "dram_bw_gbps",
    "eligible_warps_per_cycle": "epc",
    "dram_utilization": "mem_util_pct",
    "tex_cache_transactions": "l1_transactions",
    "l1_cache_global_hit_rate": None,
    "flop_sp_efficiency": "flop_sp_efficiency",
}


def parse_nvprof(text: str, options: dict[str, Any]) -> list[ProfileRecord]:
    """``nvprof --csv --metrics ...`` -> one profile (kernels aggregated, weighted by
    invocations). Throughputs become GB/s, occupancy 0..1 becomes percent, utilisation levels
    0..10 become percent (level x 10), ``flop_sp_efficiency`` x the device's catalogue peak gives
    GFLOPS demand; stall reasons are grouped as in ALGORITHMS.md §3."""
    lines = text.splitlines()
    command = None
    header_index = None
    for i, line in enumerate(lines):
        m = _NVPROF_COMMAND_RE.match(line.strip())
        if m:
            command = m.group(1).strip()
        if line.lstrip().startswith('"Device","Kernel"') or line.startswith("Device,Kernel"):
            header_index = i
            break
    if header_index is None:
        raise ProfileImportError(
            [RowError(None, "file", 'no nvprof metric table ("Device","Kernel",... header)')]
        )
    rows = _csv_block(lines, header_index)
    header = rows[0][1]
    need = ["Device", "Kernel", "Invocations", "Metric Name", "Avg"]
    missing = [c for c in need if c not in header]
    if missing:
        raise ProfileImportError(
            [RowError(rows[0][0], c, "column missing from the nvprof header") for c in missing]
        )
    col = {name: header.index(name) for name in need}
    out = _Collector()
    kernels: dict[str, tuple[dict[str, float], float]] = {}
    device = None
    for line_no, cells in rows[1:]:
        if len(cells) < len(header):
            out.add(line_no, "(row)", f"{len(cells)} cells, expected {len(header)}")
            continue
        metric = cells[col["Metric Name"]]
        device = device or cells[col["Device"]]
        kernel = cells[col["Kernel"]]
        try:
            invocations = float(cells[col["Invocations"]])
        except ValueError:
            out.add(line_no, "Invocations", f"{cells[col['Invocations']]!r} is not a number")
            continue
        metrics, _w = kernels.setdefault(kernel, ({}, invocations))
        if metric not in _NVPROF_METRICS and metric not in _NVPROF_STALLS:
            continue  # metrics we do not use are fine
        try:
            value, unit = _measure(cells[col["Avg"]])
        except ValueError as exc:
            out.add(line_no, metric, str(exc))
            continue
        try:
            if metric in _NVPROF_STALLS:
                key = f"stall:{_NVPROF_STALLS[metric]}"
                metrics[key] = metrics.get(key, 0.0) + value
                continue
            target = _NVPROF_METRICS[metric]
            if target is None:
                continue
            if target.endswith("_gbps"):
                value = _to_gbps(value, unit)
                metrics[target] = metrics.get(target, 0.0) + value  # read + write add up
            elif metric == "achieved_occupancy":
                metrics[target] = value * 100 if value <= 1 else value
            elif unit == "level":
                metrics[target] = value * 10
            else:
                metrics[target] = value
        except ValueError as exc:
            out.add(line_no, metric, str(exc))
    if out.errors:
        raise ProfileImportError(out.errors)
    if not kernels:
        raise ProfileImportError([RowError(None, "file", "the nvprof table has no kernel rows")])
    fields = _aggregate(list(kernels.values()))
    efficiency = fields.pop("flop_sp_efficiency", None)
    if efficiency is not None and device:
        try:
            peak = gpu_spec(re.sub(r"\s*\(\d+\)$", "", device)).peak_gflops
            fields["gflops"] = round(peak * efficiency / 100, 2)
        except UnknownGpuModel:
            pass
    default_name = PurePath(command.split()[0]).name if command else None
    return _profiler_record(fields, options, default_name)


_NCU_DETAILS = {
    # (metric name, unit class) -> our key; unit class "%" or "rate" or "" (anything)
    ("Achieved Occupancy", "%"): "occupancy_pct",
    ("Executed Ipc Active", ""): "ipc",
    ("Eligible Warps Per Scheduler", ""): "epc",
    ("Memory Throughput", "%"): "mem_util_pct",
    ("Memory Throughput", "rate"): "dram_bw_gbps",
    ("DRAM Throughput", "%"): "mem_util_pct",
    ("Compute (SM) Throughput", "%"): "sm_efficiency_pct",
    ("SM Busy", "%"): None,
    ("Duration", ""): "duration_s",
    ("Registers Per Thread", ""): "registers_per_thread",
    ("Block Size", ""): "block_size",
    ("Static Shared Memory Per Block", ""): "smem_static",
    ("Dynamic Shared Memory Per Block", ""): "smem_dynamic",
    ("Avg. Active Threads Per Warp", ""): "active_threads_per_warp",
}
_NCU_RAW = {
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "sm__inst_executed.avg.per_cycle_active": "ipc",
    "smsp__warps_eligible.avg.per_cycle_active": "epc",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "mem_util_pct",
    "dram__bytes.sum.per_second": "dram_bw_gbps",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_efficiency_pct",
    "smsp__thread_inst_executed_per_inst_executed.ratio": "active_threads_per_warp",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum.per_second": "gld_gbps",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum.per_second": "gst_gbps",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "l1_transactions",
    "gpu__time_duration.sum": "duration_s",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__block_size": "block_size",
    "launch__shared_mem_per_block_static": "smem_static",
    "launch__shared_mem_per_block_dynamic": "smem_dynamic",
}
_NCU_STALL_RE = re.compile(
    r"^smsp__(?:average_|pcsamp_)?(?:warps?_)?(?:latency_)?issue_stalled_([a-z_]+?)"
    r"(?:_per_warp_active\.pct|_per_issue_active\.ratio|\.ratio|\.pct|\.sum)?$"
)


def _ncu_value(key: str, value: float, unit: str) -> float:
    """Convert an Nsight Compute value to our unit for ``key``."""
    u = unit.strip()
    if key.endswith("_gbps"):
        return _to_gbps(value, u)
    if key == "duration_s":
        return value * _TIME_TO_S.get(u, 1e-9)
    if key.startswith("smem_"):
        factor = {"byte/block": 1, "Kbyte/block": 1024, "Mbyte/block": 1024**2}
        return value * factor.get(u, 1)
    return value


def _ncu_finish(kernels: list[dict[str, float]]) -> dict[str, Any]:
    weighted = []
    for m in kernels:
        if "registers_per_thread" in m and "block_size" in m:
            m["registers_per_block"] = m["registers_per_thread"] * m["block_size"]
        if "smem_static" in m or "smem_dynamic" in m:
            m["smem_per_block_bytes"] = m.get("smem_static", 0) + m.get("smem_dynamic", 0)
        if "active_threads_per_warp" in m:
            m["warp_efficiency_pct"] = 100 * m["active_threads_per_warp"] / 32
        weight = m.get("duration_s", 1.0)
        for helper in (
            "registers_per_thread",
            "block_size",
            "smem_static",
            "smem_dynamic",
            "active_threads_per_warp",
            "duration_s",
        ):
            m.pop(helper, None)
        weighted.append((m, weight))
    return _aggregate(weighted)


def parse_ncu(text: str, options: dict[str, Any]) -> list[ProfileRecord]:
    """Nsight Compute ``ncu --csv`` (details page or ``--page raw``) -> one profile, kernels
    weighted by duration. Warp-state stall reasons are grouped as in ALGORITHMS.md §3; warp
    efficiency is active threads per warp / 32."""
    lines = text.splitlines()
    header_index = next(
        (i for i, line in enumerate(lines) if line.lstrip().startswith('"ID","Process ID"')), None
    )
    if header_index is None:
        raise ProfileImportError(
            [RowError(None, "file", 'no Nsight Compute table ("ID","Process ID",... header)')]
        )
    rows = _csv_block(lines, header_index)
    header_line, header = rows[0]
    out = _Collector()
    process = None
    per_kernel: dict[str, dict[str, float]] = {}
    if "Metric Name" in header and "Metric Value" in header:
        c_id, c_name = header.index("ID"), header.index("Metric Name")
        c_unit = header.index("Metric Unit") if "Metric Unit" in header else None
        c_value, c_proc = header.index("Metric Value"), header.index("Process Name")
        for line_no, cells in rows[1:]:
            if len(cells) < len(header):
                out.add(line_no, "(row)", f"{len(cells)} cells, expected {len(header)}")
                continue
            process = process or cells[c_proc]
            name = cells[c_name]
            unit = cells[c_unit] if c_unit is not None else ""
            unit_class = "%" if unit == "%" else "rate" if "/second" in unit else ""
            key = _NCU_DETAILS.get((name, unit_class), _NCU_DETAILS.get((name, "")))
            if key is None:
                continue
            try:
                value, parsed_unit = _measure(cells[c_value], unit)
                per_kernel.setdefault(cells[c_id], {})[key] = _ncu_value(
                    key, value, unit or parsed_unit
                )
            except ValueError as exc:
                out.add(line_no, name, str(exc))
    else:
        if "Kernel Name" not in header:
            raise ProfileImportError([RowError(header_line, "Kernel Name", "column missing")])
        data_rows = rows[1:]
        units: list[str] = [""] * len(header)
        if data_rows and not data_rows[0][1][0].strip().isdigit():
            units = data_rows[0][1]  # the units row under the header
            data_rows = data_rows[1:]
        c_id, c_proc = header.index("ID"), header.index("Process Name")
        for line_no, cells in data_rows:
            if len(cells) < len(header):
                out.add(line_no, "(row)", f"{len(cells)} cells, expected {len(header)}")
                continue
            process = process or cells[c_proc]
            metrics = per_kernel.setdefault(cells[c_id], {})
            for i, column in enumerate(header):
                stall = _NCU_STALL_RE.match(column)
                key = _NCU_RAW.get(column)
                if stall:
                    group = _NCU_STALLS.get(stall.group(1))
                    if group is None:
                        continue
                    key = f"stall:{group}"
                if key is None or not cells[i]:
                    continue
                try:
                    value, parsed_unit = _measure(cells[i], units[i] if i < len(units) else "")
                    value = _ncu_value(key, value, units[i] if i < len(units) else parsed_unit)
                except ValueError as exc:
                    out.add(line_no, column, str(exc))
                    continue
                metrics[key] = metrics.get(key, 0.0) + value if key.startswith("stall:") else value
    if out.errors:
        raise ProfileImportError(out.errors)
    if not per_kernel:
        raise ProfileImportError([RowError(None, "file", "the Nsight Compute table has no rows")])
    fields = _ncu_finish(list(per_kernel.values()))
    return _profiler_record(fields, options, process or None)


def detect_format(text: str, filename: str | None = None) -> str:
    """Guess the format from the file name and the first lines."""
    suffix = PurePath(filename).suffix.lower() if filename else ""
    head = text.lstrip()[:4000]
    if suffix == ".json" or head[:1] in "[{":
        return "json"
    if '"ID","Process ID"' in head or "==PROF==" in head:
        return "ncu"
    if '"Device","Kernel","Invocations"' in head or "NVPROF" in head:
        return "nvprof"
    return "csv"


def parse_profiles(
    content: bytes | str,
    *,
    fmt: str | None = None,
    filename: str | None = None,
    options: dict[str, Any] | None = None,
) -> list[ProfileRecord]:
    """Parse and validate a profile file. ``fmt`` is one of ``FORMATS`` (None: detect).
    ``options`` may give ``name``, ``version``, ``kind``, ``description`` for the profiler
    formats (which describe one application per file). Raises ``ProfileImportError``."""
    text = _decode(content)
    if not text.strip():
        raise ProfileImportError([RowError(None, "file", "empty file")])
    fmt = fmt or detect_format(text, filename)
    if fmt not in FORMATS:
        raise ProfileImportError(
            [RowError(None, "format", f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")]
        )
    options = options or {}
    try:
        if fmt == "json":
            return parse_json(text)
        if fmt == "nvprof":
            return parse_nvprof(text, options)
        if fmt == "ncu":
            return parse_ncu(text, options)
        return parse_csv(text)
    except csv.Error as exc:  # the profiler formats read CSV too
        raise ProfileImportError([RowError(None, "file", _csv_message(exc))]) from None

"""One profile, validated: the fields a profile file may carry, the checks on each value, the
``ProfileRecord`` they build and the errors an import collects (``RowError``,
``ProfileImportError``). Shared by every format (``docs/profiles.md``)."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from django.db import models

from portal.core.models import JOB_KINDS, ApplicationProfile
from portal.core.validation import (
    DB_INT_MAX,
    JSON_MAX_DEPTH,
    TEXT_MAX_CHARS,
    json_error,
    text_error,
)
from scheduler.catalog import UnknownGpuModel, canonical_model
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

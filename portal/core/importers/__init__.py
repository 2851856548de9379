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

The package: ``records`` (the fields, the checks on each value, the records and errors every
format shares), ``schema_files`` (``csv``, ``json``), ``profilers`` (``nvprof``, ``ncu``);
``parse_profiles`` and ``detect_format`` are here.
"""

from __future__ import annotations

import csv
from pathlib import PurePath
from typing import Any

from portal.core.importers.profilers import parse_ncu, parse_nvprof
from portal.core.importers.records import (
    FORMATS,
    IGNORED_KEYS,
    MAX_CELL_CHARS,
    MAX_FILE_BYTES,
    MAX_FILE_DEPTH,
    MAX_GPU_TIMES,
    MAX_MEMORY_STEPS,
    PROFILE_FIELDS,
    ProfileImportConflict,
    ProfileImportError,
    ProfileRecord,
    RowError,
    memory_max_error,
    parse_memory_steps,
    record_from_mapping,
    validate_profile_mapping,
)
from portal.core.importers.schema_files import _csv_message, _decode, parse_csv, parse_json

# Every public name of the former single-file module stays importable from here.
__all__ = [
    "FORMATS",
    "MAX_FILE_BYTES",
    "MAX_CELL_CHARS",
    "MAX_FILE_DEPTH",
    "MAX_MEMORY_STEPS",
    "MAX_GPU_TIMES",
    "IGNORED_KEYS",
    "PROFILE_FIELDS",
    "ProfileRecord",
    "RowError",
    "ProfileImportError",
    "ProfileImportConflict",
    "parse_memory_steps",
    "memory_max_error",
    "record_from_mapping",
    "validate_profile_mapping",
    "parse_csv",
    "parse_json",
    "parse_nvprof",
    "parse_ncu",
    "detect_format",
    "parse_profiles",
]


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

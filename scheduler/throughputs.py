"""Gavel's measured solo throughputs: steps per second per job type, GPU count and GPU model.

``data/gavel/solo_throughput.csv`` (see ``scheduler/data/README.md``) holds them consolidated
(one server) and unconsolidated (``<model>_unconsolidated``: spread over servers). The trace
readers (``scheduler.traces``) and the trace generator (``scheduler.trace_generator``) both read
them here.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from scheduler.catalog import UnknownGpuModel, canonical_model
from scheduler.csv_reading import csv_rows
from scheduler.inputs import InputError, to_float, to_int

GAVEL_SOLO_CSV = Path(__file__).resolve().parent / "data" / "gavel" / "solo_throughput.csv"

#: (job_type, scale_factor) -> {catalogue model: steps per second}.
ThroughputTable = Mapping[tuple[str, int], Mapping[str, float]]

_UNCONSOLIDATED = "_unconsolidated"

_Table = dict[tuple[str, int], dict[str, float]]


@functools.lru_cache(maxsize=4)
def _load_throughput_tables(path: str) -> tuple[_Table, _Table]:
    """(consolidated, unconsolidated) throughput tables of a Gavel solo-throughput CSV."""
    tables: tuple[_Table, _Table] = ({}, {})
    for line, row in csv_rows(path, ("job_type", "scale_factor", "gpu_type", "throughput")):
        gpu_type = row["gpu_type"]
        spread = gpu_type.endswith(_UNCONSOLIDATED)
        if not spread and row.get("consolidated", "1") not in ("1", "True", "true"):
            continue
        if spread:
            gpu_type = gpu_type[: -len(_UNCONSOLIDATED)]
        try:
            model = canonical_model(gpu_type)
        except UnknownGpuModel:
            raise InputError(
                f"unknown GPU type {row['gpu_type']!r}", file=path, line=line, field="gpu_type"
            ) from None
        scale = to_int(row["scale_factor"], file=path, line=line, field="scale_factor", minimum=1)
        tput = to_float(row["throughput"], file=path, line=line, field="throughput", minimum=0)
        entry = tables[spread].setdefault((row["job_type"], scale), {})
        if tput:
            entry[model] = tput
    return tables


def load_solo_throughputs(path: str | Path = GAVEL_SOLO_CSV) -> ThroughputTable:
    """(job_type, scale_factor) -> {catalogue model: steps per second}, consolidated rows only.

    Models measured at throughput 0 (infeasible) are absent from the inner mapping.
    """
    return _load_throughput_tables(str(path))[0]


def load_unconsolidated_throughputs(path: str | Path = GAVEL_SOLO_CSV) -> ThroughputTable:
    """Like ``load_solo_throughputs`` for the ``<model>_unconsolidated`` rows: the job's
    throughput with its ``scale_factor`` GPUs spread over several servers."""
    return _load_throughput_tables(str(path))[1]

"""Synthetic Gavel-format traces drawn with Gavel's generator settings (docs/simulator.md).

Gavel (Narayanan et al., OSDI'20; stanford-futuredata/gavel, ``scheduler/utils.py`` and
``scheduler/scripts/utils/generate_trace.py``) generates its simulated workloads from
distributions its authors took from Microsoft's Philly trace. This module draws jobs from the
same distributions (our own code, not theirs):

- **scale factor** (GPUs per job), with ``multi_gpu``: 1 with probability 0.70, 2 with 0.10,
  4 with 0.15 and 8 with 0.05 (Gavel's ``_generate_scale_factor``); without it every job asks
  for 1 GPU;
- **duration** (run time on V100 GPUs at that scale factor): ``60 * 10 ** U(1.5, 3)`` seconds
  (30 min to 17 h) with probability 0.8, else ``60 * 10 ** U(3, 4)`` (17 h to 7 days)
  (``_generate_duration``);
- **job type**: uniform over the Gavel job types measured at that scale factor with a positive
  V100 throughput (for scale factors above 1: ResNet-18, ResNet-50, Transformer and LM at their
  batch sizes; Gavel's "distributed" templates);
- **total steps** = duration x the measured V100 throughput of that type and scale factor
  (``data/gavel/solo_throughput.csv``), so other GPU models take what Gavel measured for them;
- **arrivals**: the first job at 0, then exponential inter-arrival times of mean
  ``3600 / jobs_per_hour`` seconds (a Poisson process, Gavel's ``lam``).

As in Gavel's ``generate_trace.py`` each aspect has its own random stream, seeded ``seed``
(job type), ``seed + 1`` (arrivals), ``seed + 2`` (durations) and ``seed + 3`` (scale
factors), so changing one distribution does not reshuffle the others. Same arguments, same
file, byte for byte.

    python -m scheduler.traces generate --jobs 500 --multi-gpu --seed 0 \\
        --jobs-per-hour 0.5 --out trace.csv
"""

from __future__ import annotations

import csv
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from scheduler.throughputs import ThroughputTable, load_solo_throughputs

#: (scale factor, probability): Gavel's ``_generate_scale_factor``.
SCALE_FACTORS: tuple[tuple[int, float], ...] = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
#: (probability, low, high): duration = 60 * 10 ** U(low, high) s; Gavel's ``_generate_duration``.
DURATIONS: tuple[tuple[float, float, float], ...] = ((0.8, 1.5, 3.0), (0.2, 3.0, 4.0))
REFERENCE_MODEL = "V100"

#: The columns of the Gavel trace CSV (as in ``data/gavel/traces/``).
GAVEL_TRACE_COLUMNS = (
    "job_id",
    "job_type",
    "arrival_time_s",
    "total_steps",
    "scale_factor",
    "model",
    "batch_size",
    "priority_weight",
    "slo",
    "num_steps_arg",
    "needs_data_dir",
    "implied_duration_v100_s",
    "in_throughput_table",
)

_TYPE_RE = re.compile(r"^(?P<model>.*?) \(batch size (?P<batch>\d+)\)$")


@dataclass(frozen=True, slots=True)
class GeneratedJob:
    """One row of a generated trace."""

    job_id: int
    job_type: str
    arrival_s: float
    total_steps: int
    scale_factor: int
    duration_v100_s: float


def _draw_scale_factor(rng: random.Random) -> int:
    r = rng.random()
    for scale, p in SCALE_FACTORS:
        if r < p:
            return scale
        r -= p
    return SCALE_FACTORS[-1][0]


def _draw_duration(rng: random.Random) -> float:
    r = rng.random()
    for p, low, high in DURATIONS:
        if r < p:
            return 60.0 * 10.0 ** rng.uniform(low, high)
        r -= p
    _, low, high = DURATIONS[-1]
    return 60.0 * 10.0 ** rng.uniform(low, high)


def generate_jobs(
    jobs: int,
    *,
    multi_gpu: bool = False,
    seed: int = 0,
    jobs_per_hour: float = 0.5,
    throughputs: ThroughputTable | None = None,
    burst: bool = False,
    duration_hours: tuple[float, float] | None = None,
) -> list[GeneratedJob]:
    """``jobs`` jobs drawn with Gavel's settings (module docstring), in arrival order.

    ``burst``: every job arrives at 0 (the arrival stream is not drawn). ``duration_hours``
    ``(low, high)``: run times on V100 log-uniform between ``low`` and ``high`` hours
    (``3600 * 10 ** U(log10 low, log10 high)``, from the duration stream) instead of Gavel's
    Philly-derived mix; the setting of Gavel's small-cluster traces (1 to 4 h).
    """
    if jobs < 0:
        raise ValueError(f"jobs must be >= 0, got {jobs}")
    if duration_hours is not None:
        lo_h, hi_h = duration_hours
        if not (0 < lo_h <= hi_h and math.isfinite(hi_h)):
            raise ValueError(f"duration_hours must be 0 < low <= high, got {duration_hours}")
    if not (jobs_per_hour > 0 and math.isfinite(jobs_per_hour)):
        raise ValueError(f"jobs_per_hour must be a positive number, got {jobs_per_hour}")
    table = throughputs if throughputs is not None else load_solo_throughputs()
    types: dict[int, list[str]] = {}
    for (job_type, scale), tputs in sorted(table.items()):
        if tputs.get(REFERENCE_MODEL, 0.0) > 0:
            types.setdefault(scale, []).append(job_type)
    type_rng = random.Random(seed)
    arrival_rng = random.Random(seed + 1)
    duration_rng = random.Random(seed + 2)
    scale_rng = random.Random(seed + 3)
    mean_gap_s = 3600.0 / jobs_per_hour
    out: list[GeneratedJob] = []
    t = 0.0
    for k in range(jobs):
        scale = _draw_scale_factor(scale_rng) if multi_gpu else 1
        if scale not in types:
            raise ValueError(f"no job type was measured on {REFERENCE_MODEL} at scale {scale}")
        job_type = type_rng.choice(types[scale])
        if duration_hours is None:
            duration = _draw_duration(duration_rng)
        else:
            lo_e, hi_e = math.log10(duration_hours[0]), math.log10(duration_hours[1])
            duration = 3600.0 * 10.0 ** duration_rng.uniform(lo_e, hi_e)
        steps = max(1, round(duration * table[(job_type, scale)][REFERENCE_MODEL]))
        if k > 0 and not burst:
            t += -math.log(1.0 - arrival_rng.random()) * mean_gap_s
        out.append(GeneratedJob(k, job_type, round(t, 1), steps, scale, duration))
    return out


def write_gavel_trace(jobs: Sequence[GeneratedJob], path: str | Path) -> None:
    """Write ``jobs`` in the Gavel trace CSV format (``GAVEL_TRACE_COLUMNS``). Columns Gavel
    uses to launch real jobs (``num_steps_arg``, ``needs_data_dir``) are left empty."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(GAVEL_TRACE_COLUMNS)
        for job in jobs:
            match = _TYPE_RE.match(job.job_type)
            model = match.group("model") if match else job.job_type
            batch = match.group("batch") if match else ""
            writer.writerow(
                [
                    job.job_id,
                    job.job_type,
                    f"{job.arrival_s:.1f}",
                    job.total_steps,
                    job.scale_factor,
                    model,
                    batch,
                    "1.0",
                    "",
                    "",
                    "",
                    f"{job.duration_v100_s:.1f}",
                    1,
                ]
            )


def describe(jobs: Sequence[GeneratedJob]) -> str:
    """One line: how many jobs per scale factor, the span, the V100 GPU-hours of work."""
    if not jobs:
        return "0 jobs"
    scales: dict[int, int] = {}
    for j in jobs:
        scales[j.scale_factor] = scales.get(j.scale_factor, 0) + 1
    work_h = sum(j.duration_v100_s * j.scale_factor for j in jobs) / 3600.0
    mix = ", ".join(f"{n} x {s} GPU" for s, n in sorted(scales.items()))
    return (
        f"{len(jobs)} jobs ({mix}) over {jobs[-1].arrival_s / 86400:.1f} days; "
        f"{work_h:,.0f} V100 GPU-hours of work"
    )

"""Interference: how much slower a job runs when it shares a GPU.

``slowdown(job, co_runners, gpu, mode)`` returns a factor (unitless) by which the job's run
time grows next to ``co_runners`` on a GPU of model ``gpu``: the "interference value" of
ALGORITHMS.md §2 (co-run time / solo time). 1.0 means no interference; ``float("inf")`` means
the jobs cannot run together at all (measured as infeasible, e.g. out of memory).

The convention by sharing mode and the rule for several co-runners are in
``scheduler.interference_rules`` (the model interface below every model, so that the learned
model and the simulator's sharing model need not import this registry).

Implementations, registered by name for ``build_interference``:
``measured`` (Gavel co-location table), ``class_based`` (§4: M+M worst, C+C middle, M+C best),
``none`` (always 1.0) and ``learned`` (a trained model, §2: ``scheduler.learning.interference``,
imported on first use).
"""

from __future__ import annotations

import csv
import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from scheduler.classes import CM_THRESHOLD, cm_class, kernel_class
from scheduler.domain import GpuSpec, JobSpec, SharingMode
from scheduler.interference_rules import (
    InterferenceError,
    InterferenceModel,
    apply_mode,
    co_run_slowdown,
    combine_pairwise,
)

# The contract moved to ``scheduler.interference_rules``; its names stay importable from here.
__all__ = [
    "GAVEL_COLOCATION_CSV",
    "GAVEL_GPU_TYPES",
    "INTERFERENCE_MODELS",
    "ClassBasedInterference",
    "InterferenceError",
    "InterferenceModel",
    "MeasuredInterference",
    "NoInterference",
    "apply_mode",
    "build_interference",
    "co_run_slowdown",
    "colocation_signature",
    "combine_pairwise",
]

GAVEL_COLOCATION_CSV = Path(__file__).resolve().parent / "data" / "gavel" / "colocation.csv"

#: Catalogue model -> ``gpu_type`` of the Gavel tables.
GAVEL_GPU_TYPES: Mapping[str, str] = {"K80": "k80", "P100": "p100", "V100": "v100"}


class NoInterference:
    """Jobs never slow each other down (``none``): an upper bound to compare against."""

    name = "none"

    def slowdown(
        self, job: JobSpec, co_runners: Sequence[JobSpec], gpu: GpuSpec, mode: SharingMode
    ) -> float:
        return 1.0


@functools.lru_cache(maxsize=4)
def _load_colocation(path: str) -> tuple[dict[tuple[str, str, str], float], dict[str, float]]:
    """(gpu_type, job, co_runner) -> pairwise slowdown, and gpu_type -> median slowdown."""
    table: dict[tuple[str, str, str], float] = {}
    by_gpu: dict[str, list[float]] = {}
    with open(path, newline="") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                gpu_type = row["gpu_type"].strip().lower()
                feasible = row["feasible"].strip() not in ("0", "false", "False")
                pairs = (
                    (row["job_a"], row["job_b"], row["norm_a"]),
                    (row["job_b"], row["job_a"], row["norm_b"]),
                )
                for job, other, norm_text in pairs:
                    norm = float(norm_text)
                    s = 1.0 / norm if feasible and norm > 0 else math.inf
                    # A row written in the other orientation must not overwrite a direct one.
                    table.setdefault((gpu_type, job, other), s)
                    if math.isfinite(s):
                        by_gpu.setdefault(gpu_type, []).append(s)
            except (KeyError, ValueError) as exc:
                raise InterferenceError(f"{path}, line {line}: bad row ({exc})") from exc
    medians = {g: statistics.median(v) for g, v in by_gpu.items()}
    return table, medians


@functools.lru_cache(maxsize=4)
def _signatures(path: str) -> dict[str, tuple[float, ...]]:
    table, _ = _load_colocation(path)
    gpu_types = sorted({g for g, _, _ in table})
    job_types = sorted({j for _, j, _ in table})
    out = {}
    for job in job_types:
        out[job] = tuple(
            1.0 / s if math.isfinite(s) and s > 0 else 0.0
            for s in (
                table.get((g, job, other), math.nan) for g in gpu_types for other in job_types
            )
            if not math.isnan(s)
        )
    return out


def colocation_signature(
    job_type: str | None, path: str | Path = GAVEL_COLOCATION_CSV
) -> tuple[float, ...] | None:
    """The measured co-location signature of a Gavel job type, or None if it was not measured.

    For every measured GPU type and every measured co-runner type (both sorted by name), the
    job type's normalised throughput next to that co-runner (co-located / solo throughput,
    ``norm`` in ``colocation.csv``; 0 where the pair is infeasible). Two job types with close
    signatures are slowed down by the same co-runners, i.e. they lean on the same resources:
    ``mystic`` uses it as the metric vector of jobs whose profile has no metrics.
    """
    if job_type is None:
        return None
    return _signatures(str(path)).get(job_type)


class MeasuredInterference:
    """Pairwise slowdowns measured by Gavel (``measured``; ``data/gavel/colocation.csv``).

    Looks up ``(gpu_type, job.job_type, co_runner.job_type)`` for two jobs of the same GPU
    count (a pair of different scale factors is missing data): the slowdown is
    ``1 / norm_a`` (``norm`` = co-located / solo throughput). ``gpu_type`` comes from
    ``gpu_types`` (catalogue model -> table name, default K80/P100/V100 -> k80/p100/v100; add
    e.g. ``{"T4": "v100"}`` to borrow a measured GPU for an unmeasured one). Pairs measured
    infeasible (``feasible = 0``, memory) give ``inf``.

    The table measures two jobs running concurrently on one GPU; it is read as the MPS
    slowdown and turned into the time-slicing interference part as the module docstring says.

    Missing data (a job without ``job_type``, a pair or a GPU model not in the table): the
    ``fallback`` model is asked for that pair if one is given (an ``InterferenceModel`` or a
    registered name, e.g. ``"class_based"``); otherwise ``default_slowdown`` if set; otherwise
    the median measured slowdown on that GPU type (V100 1.47, P100 1.70, K80 1.87), or over
    all GPU types for an unmeasured GPU. ``self.misses`` counts the fallbacks taken.
    """

    name = "measured"

    def __init__(
        self,
        *,
        path: str | Path = GAVEL_COLOCATION_CSV,
        gpu_types: Mapping[str, str] | None = None,
        fallback: InterferenceModel | str | None = None,
        default_slowdown: float | None = None,
    ) -> None:
        self._table, self._medians = _load_colocation(str(path))
        self._overall_median = statistics.median(self._medians.values()) if self._medians else 1.0
        self.gpu_types = dict(GAVEL_GPU_TYPES if gpu_types is None else gpu_types)
        self.fallback = build_interference(fallback) if isinstance(fallback, str) else fallback
        self.default_slowdown = default_slowdown
        self.misses = 0

    def measured_pair(self, job: JobSpec, other: JobSpec, gpu: GpuSpec) -> float | None:
        """The measured concurrent slowdown of ``job`` next to ``other`` on ``gpu``, or None
        when the table has no such pair (no fallback; ``inf`` when measured infeasible)."""
        if job.job_type is None or other.job_type is None or job.gpus != other.gpus:
            return None
        gpu_type = self.gpu_types.get(gpu.model, gpu.model.lower())
        return self._table.get((gpu_type, job.job_type, other.job_type))

    def pair_slowdown(self, job: JobSpec, other: JobSpec, gpu: GpuSpec) -> float:
        """Concurrent slowdown of ``job`` next to ``other`` alone on ``gpu`` (MPS-like)."""
        gpu_type = self.gpu_types.get(gpu.model, gpu.model.lower())
        # Pairs were measured between jobs of one GPU each; two multi-GPU jobs of the same
        # scale factor sharing their GPUs pairwise read the same pair (as Gavel does), a pair
        # of different scale factors was never measured.
        if job.job_type is not None and other.job_type is not None and job.gpus == other.gpus:
            s = self._table.get((gpu_type, job.job_type, other.job_type))
            if s is not None:
                return s
        self.misses += 1
        if self.fallback is not None:
            return self.fallback.slowdown(job, (other,), gpu, SharingMode.MPS)
        if self.default_slowdown is not None:
            return self.default_slowdown
        return self._medians.get(gpu_type, self._overall_median)

    def slowdown(
        self, job: JobSpec, co_runners: Sequence[JobSpec], gpu: GpuSpec, mode: SharingMode
    ) -> float:
        """See the class docstring and the module docstring for the mode convention."""
        if not co_runners or mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
            return 1.0
        s = combine_pairwise([self.pair_slowdown(job, c, gpu) for c in co_runners])
        return apply_mode(s, 1 + len(co_runners), mode)


class ClassBasedInterference:
    """Slowdown from the jobs' C/M classes (``class_based``; ALGORITHMS.md §4).

    §4 orders the pairs M+M worst, C+C middle, M+C best (M+C often beats running the two one
    after the other). The paper gives no numbers, so the factors are parameters (concurrent,
    MPS-like slowdown of one job next to one co-runner):

    - ``mm`` = 1.9: two memory-bound jobs fight for DRAM bandwidth, almost plain time sharing
      (2.0);
    - ``cc`` = 1.5: two compute-bound jobs split the SMs; near the median measured pairwise
      slowdown on V100 in the Gavel table (1.47);
    - ``mc`` = 1.2: complementary jobs; the pair's throughput (2 / 1.2 = 1.67 jobs' worth) beats
      running them in turn;
    - ``unknown`` = 1.5: either class unknown.

    A job's class is ``cm_class`` (C/M ratio, threshold ``cm_threshold`` = 10; falls back to
    SM efficiency / memory utilisation), else its kernel class (§3: ``memory`` and ``l1`` -> M,
    ``compute`` -> C), else unknown. Pairs combine and modes apply as the module docstring says.
    """

    name = "class_based"

    def __init__(
        self,
        *,
        mm: float = 1.9,
        cc: float = 1.5,
        mc: float = 1.2,
        unknown: float = 1.5,
        cm_threshold: float = CM_THRESHOLD,
    ) -> None:
        if not (mc <= cc <= mm):
            raise InterferenceError(
                f"class_based factors must keep §4's order mc <= cc <= mm; got mc={mc}, "
                f"cc={cc}, mm={mm}"
            )
        self.factors = {("M", "M"): mm, ("C", "C"): cc, ("C", "M"): mc, ("M", "C"): mc}
        self.unknown = unknown
        self.cm_threshold = cm_threshold

    def job_class(self, job: JobSpec) -> str | None:
        """``C``, ``M`` or None for ``job`` (see the class docstring)."""
        cls = cm_class(job.profile, threshold=self.cm_threshold)
        if cls is not None:
            return cls
        kc = kernel_class(job.profile)
        if kc is None:
            return None
        return "C" if kc == "compute" else "M"

    def pair_slowdown(self, job: JobSpec, other: JobSpec) -> float:
        a, b = self.job_class(job), self.job_class(other)
        if a is None or b is None:
            return self.unknown
        return self.factors[(a, b)]

    def slowdown(
        self, job: JobSpec, co_runners: Sequence[JobSpec], gpu: GpuSpec, mode: SharingMode
    ) -> float:
        """See the class docstring and the module docstring for the mode convention."""
        if not co_runners or mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
            return 1.0
        s = combine_pairwise([self.pair_slowdown(job, c) for c in co_runners])
        return apply_mode(s, 1 + len(co_runners), mode)


def _learned(**params: Any) -> InterferenceModel:
    """``learned``, imported on first use (it needs scikit-learn and may train a model)."""
    from scheduler.learning.interference import LearnedInterference

    return LearnedInterference(**params)


def _sharing_model(**params: Any) -> InterferenceModel:
    """``sharing``: the per-mode speed model of ``scheduler.simulator.sharing`` (MIG instances
    by sensitivity, MPS shares by thread percentage, time-slicing turns; docs/sharing.md)."""
    from scheduler.simulator.sharing import SharingModel

    try:
        return SharingModel(**params)
    except ValueError as exc:
        raise InterferenceError(str(exc)) from exc


INTERFERENCE_MODELS: dict[str, Callable[..., InterferenceModel]] = {
    "measured": MeasuredInterference,
    "class_based": ClassBasedInterference,
    "none": NoInterference,
    "learned": _learned,
    "sharing": _sharing_model,
}


def build_interference(name: str, **params: Any) -> InterferenceModel:
    """The interference model registered as ``name``, built with ``params``.

    Raises InterferenceError naming the known models for an unknown name, and the model's
    parameters for a bad one.
    """
    factory = INTERFERENCE_MODELS.get(name)
    if factory is None:
        raise InterferenceError(
            f"unknown interference model {name!r}; known: {', '.join(sorted(INTERFERENCE_MODELS))}"
        )
    try:
        return factory(**params)
    except TypeError as exc:
        raise InterferenceError(f"interference model {name!r}: {exc}") from exc

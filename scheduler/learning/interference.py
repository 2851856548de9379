"""``learned``: a trained model as an interference model (ALGORITHMS.md §2).

``LearnedInterference`` answers ``scheduler.interference.InterferenceModel``'s question (co-run
time / solo time of a job next to co-runners) from an ``InterferencePredictor``: the pairwise
concurrent slowdown is ``1 / predicted normalised throughput``, clamped to ``1 .. 1/norm_floor``
(a prediction above 1 means no slowdown; the simulator clamps too), and ``inf`` when the
feasibility classifier gives the pair less than ``min_feasible`` probability of co-running at
all. Pairs combine and sharing modes apply as ``scheduler.interference`` says.

Parameters: ``model`` ("active", "builtin", "file:PATH"; ``scheduler.learning.runtime``),
``min_feasible`` (0.5), ``norm_floor`` (0.05).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scheduler.domain import GpuSpec, JobSpec, SharingMode
from scheduler.interference_rules import InterferenceError, apply_mode, combine_pairwise
from scheduler.learning.features import gpu_vector
from scheduler.learning.predictor import (
    InterferencePredictor,
    Key,
    PredictorError,
    Vector,
    vector_key,
)
from scheduler.learning.runtime import resolve

_MEMO_LIMIT = 50_000


class LearnedInterference:
    """Pairwise slowdowns predicted by a trained model (module docstring)."""

    name = "learned"

    def __init__(
        self,
        *,
        model: str | InterferencePredictor = "active",
        min_feasible: float = 0.5,
        norm_floor: float = 0.05,
    ) -> None:
        if not 0.0 <= float(min_feasible) <= 1.0:
            raise InterferenceError(f"learned: min_feasible must be in 0..1, got {min_feasible}")
        if not 0.0 < float(norm_floor) <= 1.0:
            raise InterferenceError(f"learned: norm_floor must be in (0, 1], got {norm_floor}")
        try:
            self.predictor = resolve(model)
        except PredictorError as exc:
            raise InterferenceError(f"learned: {exc}") from None
        self.min_feasible = float(min_feasible)
        self.norm_floor = float(norm_floor)
        self._vectors: dict[tuple[int, str | None], tuple[object, tuple[Key, Vector]]] = {}
        self._gpus: dict[int, tuple[GpuSpec, tuple[Key, Vector]]] = {}

    def vector(self, job: JobSpec) -> tuple[Key, Vector]:
        """(cache key, raw feature vector) of the job, memoised per profile object and type."""
        key = (id(job.profile), job.job_type)
        hit = self._vectors.get(key)
        if hit is not None and hit[0] is job.profile:
            return hit[1]
        if len(self._vectors) > _MEMO_LIMIT:
            self._vectors.clear()
        vec = self.predictor.job_vector(job.profile, job.job_type)
        entry = (vector_key(vec), vec)
        self._vectors[key] = (job.profile, entry)  # the profile is kept so its id stays unique
        return entry

    def gpu_vector(self, gpu: GpuSpec) -> tuple[Key, Vector]:
        hit = self._gpus.get(id(gpu))
        if hit is not None and hit[0] is gpu:
            return hit[1]
        vec = gpu_vector(gpu)
        entry = (vector_key(vec), vec)
        self._gpus[id(gpu)] = (gpu, entry)
        return entry

    def prefetch(self, pairs: Sequence[tuple[JobSpec, JobSpec, GpuSpec]]) -> None:
        """Predict every ``(job, co-runner, gpu)`` not cached yet, in one batch."""
        if pairs:
            self.predictor.predict_keyed(
                [(self.vector(a), self.vector(b), self.gpu_vector(g)) for a, b, g in pairs]
            )

    def pair_norm(self, job: JobSpec, other: JobSpec, gpu: GpuSpec) -> tuple[float, float]:
        """(predicted normalised throughput of ``job`` next to ``other``, probability the
        pair can co-run)."""
        return self.predictor.predict_keyed(
            [(self.vector(job), self.vector(other), self.gpu_vector(gpu))]
        )[0]

    def pair_slowdown(self, job: JobSpec, other: JobSpec, gpu: GpuSpec) -> float:
        """Concurrent slowdown of ``job`` next to ``other`` alone on ``gpu`` (MPS-like)."""
        norm, p_ok = self.pair_norm(job, other, gpu)
        if p_ok < self.min_feasible:
            return math.inf
        return 1.0 / max(self.norm_floor, min(1.0, norm))

    def slowdown(
        self, job: JobSpec, co_runners: Sequence[JobSpec], gpu: GpuSpec, mode: SharingMode
    ) -> float:
        """See ``scheduler.interference`` for the mode convention."""
        if not co_runners or mode in (SharingMode.EXCLUSIVE, SharingMode.MIG):
            return 1.0
        s = combine_pairwise([self.pair_slowdown(job, c, gpu) for c in co_runners])
        return apply_mode(s, 1 + len(co_runners), mode)

"""``mystic``: co-locate the least similar jobs first (ALGORITHMS.md §2 baseline).

Each job is described by its profile metric vector (§2, Table 1 of 003): average GPU
utilisation, SM efficiency, warp efficiency, IPC, occupancy, max and average GPU memory, memory
utilisation, host-to-device and device-to-host throughput, global load and store throughput.
Each metric is normalised by its largest value among the jobs of the snapshot (pending and
running), so every component lies in 0..1; a missing metric counts as 0.

A single-GPU job goes to the GPU whose residents are least similar to it: the score is
``1 - max cosine similarity`` to the jobs on the GPU. An idle GPU has nothing to be similar to
(score 1) and is taken first; metric vectors are non-negative, so a shared GPU never scores
above an idle one. A job, or a resident, with no metric at all has similarity
``unknown_similarity``. Co-located jobs run under the GPU's best sharing mode (MPS if supported,
else time-slicing). Queue order is kept; multi-GPU jobs take idle GPUs exclusively, CPU jobs the
first CPU node that fits.

Parameters (besides the framework's):

- ``unknown_similarity`` (0..1, 0.5): similarity assumed when a vector is missing.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from scheduler.domain import ClusterState, JobSpec, Profile
from scheduler.policies.base import PolicyError
from scheduler.policies.framework import (
    Candidate,
    FrameworkPolicy,
    WorkingView,
    framework_defaults,
    job_type_key,
)

METRICS: tuple[str, ...] = (
    "gpu_util_pct",
    "sm_efficiency_pct",
    "warp_efficiency_pct",
    "ipc",
    "occupancy_pct",
    "gpu_memory_max_mb",
    "gpu_memory_avg_mb",
    "mem_util_pct",
    "h2d_gbps",
    "d2h_gbps",
    "gld_gbps",
    "gst_gbps",
)


def raw_vector(profile: Profile | None) -> tuple[float, ...] | None:
    """The profile's metrics in ``METRICS`` order (missing -> 0), or None if none is known."""
    if profile is None:
        return None
    values = [getattr(profile, m) for m in METRICS]
    if all(v is None for v in values):
        return None
    return tuple(float(v) if v is not None else 0.0 for v in values)


def cosine(a: tuple[float, ...], b: tuple[float, ...]) -> float | None:
    """Cosine similarity of two vectors (None if either is all zeros)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na = math.sqrt(sum(x * x for x in a))
    nb = math.sqrt(sum(y * y for y in b))
    if na == 0 or nb == 0:
        return None
    return dot / (na * nb)


class MysticPolicy(FrameworkPolicy):
    name: ClassVar[str] = "mystic"
    defaults: ClassVar[dict[str, Any]] = {**framework_defaults, "unknown_similarity": 0.5}
    colocate: ClassVar[bool] = True
    scorers: ClassVar[tuple[str, ...]] = ("dissimilarity",)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        u = float(self.params["unknown_similarity"])
        if not 0.0 <= u <= 1.0:
            raise PolicyError(f"policy 'mystic': unknown_similarity must be in 0..1, got {u}")
        self._vectors: dict[str, tuple[float, ...] | None] = {}
        self._scale: tuple[float, ...] = ()
        self._similarity: dict[tuple[str, str], float] = {}

    def begin_cycle(self, state: ClusterState, view: WorkingView) -> None:
        """Normalise the metric vectors of this snapshot's jobs by each metric's maximum."""
        raws: dict[str, tuple[float, ...] | None] = {}
        for job in (*state.pending, *(r.job for r in state.running)):
            key = job_type_key(job)
            if key not in raws:
                raws[key] = raw_vector(job.profile)
        known = [v for v in raws.values() if v is not None]
        scale = tuple(max((v[i] for v in known), default=0.0) or 1.0 for i in range(len(METRICS)))
        self._scale = scale
        self._similarity = {}
        self._vectors = {
            k: None if v is None else tuple(x / s for x, s in zip(v, scale, strict=True))
            for k, v in raws.items()
        }

    def vector(self, job: JobSpec) -> tuple[float, ...] | None:
        key = job_type_key(job)
        if key not in self._vectors:  # a job outside the snapshot (tests, direct calls)
            raw = raw_vector(job.profile)
            self._vectors[key] = (
                None
                if raw is None or not self._scale
                else tuple(x / s for x, s in zip(raw, self._scale, strict=True))
            )
        return self._vectors[key]

    def similarity(self, a: JobSpec, b: JobSpec) -> float:
        """Cosine similarity (0..1) of two jobs' normalised vectors, or ``unknown_similarity``
        (memoised per pair of job types within a cycle)."""
        key = (job_type_key(a), job_type_key(b))
        cached = self._similarity.get(key)
        if cached is not None:
            return cached
        va, vb = self.vector(a), self.vector(b)
        sim = None if va is None or vb is None else cosine(va, vb)
        value = float(self.params["unknown_similarity"]) if sim is None else sim
        self._similarity[key] = value
        return value

    def score_dissimilarity(self, job: JobSpec, cand: Candidate, view: WorkingView) -> float:
        """1 - the highest similarity to a resident (1 for an idle GPU or a CPU node)."""
        if not cand.residents:
            return 1.0
        return 1.0 - max(self.similarity(job, r) for r in cand.residents)

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        where = self.placement_text(job, chosen)
        n = sum(c.pool_size for c in cands)
        if not chosen.gpus:
            return f"placed {where}: first CPU node that fits ({n} fit)"
        if len(chosen.gpus) > 1:
            return self.whole_gpus_text(job, chosen, cands)
        if not chosen.residents:
            why = "an idle GPU (nothing to interfere with)"
        else:
            sim = 1.0 - chosen.score
            shared = [c for c in cands if c.residents]
            why = (
                f"least similar residents, cosine similarity {sim:.2f} "
                f"(lowest of {len(shared)} shared-GPU groups)"
            )
        return (
            f"placed {where} {self.residents_text(chosen)}: {why}, among {n} GPUs that fit; "
            f"{self.fit_text(job, chosen)}{self.interference_text(job, chosen)}"
        )

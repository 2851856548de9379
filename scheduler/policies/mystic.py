"""``mystic``: co-locate the least similar jobs first (ALGORITHMS.md §2 baseline).

Each job is described by its profile metric vector (§2, Table 1 of 003): average GPU
utilisation, SM efficiency, warp efficiency, IPC, occupancy, max and average GPU memory, memory
utilisation, host-to-device and device-to-host throughput, global load and store throughput.
Each metric is normalised by its largest value among the jobs of the snapshot (pending and
running), so every component lies in 0..1; a missing metric counts as 0.

Jobs whose profile has none of these metrics (every job of a Gavel trace: the trace gives a
job type and run times only) use what was measured for their job type instead: its co-location
signature (``scheduler.interference.colocation_signature``), i.e. its normalised throughput next
to each measured job type on each measured GPU (Gavel ``colocation.csv``). Mystic itself fills an
unknown application's metric vector from a few measurements and compares apps by it; the
signature is the measurement we have for these jobs, and two job types with close signatures
are slowed down by the same co-runners, i.e. lean on the same resources. A profile vector and a
signature are not comparable (different quantities): such a pair counts as unknown. Without
this fallback every Gavel job is "unknown", all shared GPUs tie at ``1 - unknown_similarity``
and mystic makes exactly loadbalance's choices (idle GPU first, then the first shared GPU in
cluster order), which is what the philly scenario showed before.

A single-GPU job goes to the GPU whose residents are least similar to it: the score is
``1 - max cosine similarity`` to the jobs on the GPU. An idle GPU has nothing to be similar to
(score 1) and is taken first; metric vectors are non-negative, so a shared GPU never scores
above an idle one. A job, or a resident, with no vector at all has similarity
``unknown_similarity``. Co-located jobs run under the GPU's best sharing mode (MPS if supported,
else time-slicing). Queue order is kept; multi-GPU jobs take idle GPUs exclusively, CPU jobs the
first CPU node that fits.

Parameters (besides the framework's):

- ``unknown_similarity`` (0..1, 0.5): similarity assumed when a vector is missing.
- ``measured_signatures`` (bool, True): use the measured co-location signature of a job's
  ``job_type`` when its profile has no metrics (see above); False: such jobs are unknown.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from scheduler.domain import ClusterState, JobSpec, Profile
from scheduler.interference import colocation_signature
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
    defaults: ClassVar[dict[str, Any]] = {
        **framework_defaults,
        "unknown_similarity": 0.5,
        "measured_signatures": True,
    }
    colocate: ClassVar[bool] = True
    scorers: ClassVar[tuple[str, ...]] = ("dissimilarity",)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        u = float(self.params["unknown_similarity"])
        if not 0.0 <= u <= 1.0:
            raise PolicyError(f"policy 'mystic': unknown_similarity must be in 0..1, got {u}")
        self._vectors: dict[str, tuple[float, ...] | None] = {}
        self._signatures: dict[str, tuple[float, ...] | None] = {}
        self._scale: tuple[float, ...] = ()
        self._similarity: dict[tuple[str, str], float] = {}
        self._kind: dict[tuple[str, str], str] = {}
        # Signature similarities do not depend on the snapshot: kept across cycles.
        self._signature_similarity: dict[tuple[str, str], float | None] = {}

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
        self._kind = {}
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

    def signature(self, job: JobSpec) -> tuple[float, ...] | None:
        """The measured co-location signature of ``job``'s type, if it has no profile metrics
        and ``measured_signatures`` is on (see the module docstring)."""
        key = job_type_key(job)
        if key not in self._signatures:
            sig = None
            if self.params["measured_signatures"] and raw_vector(job.profile) is None:
                sig = colocation_signature(job.job_type)
            self._signatures[key] = sig
        return self._signatures[key]

    def similarity(self, a: JobSpec, b: JobSpec) -> float:
        """Cosine similarity (0..1) of two jobs' normalised profile vectors, else of their
        measured co-location signatures, else ``unknown_similarity`` (memoised per pair of job
        types within a cycle)."""
        key = (job_type_key(a), job_type_key(b))
        cached = self._similarity.get(key)
        if cached is not None:
            return cached
        va, vb = self.vector(a), self.vector(b)
        kind = "profile metrics"
        if va is None and vb is None:
            kind = "measured co-location signatures"
            if key in self._signature_similarity:
                sim = self._signature_similarity[key]
            else:
                sa, sb = self.signature(a), self.signature(b)
                sim = None if sa is None or sb is None else cosine(sa, sb)
                self._signature_similarity[key] = sim
        else:
            sim = None if va is None or vb is None else cosine(va, vb)
        value = float(self.params["unknown_similarity"]) if sim is None else sim
        self._similarity[key] = value
        self._kind[key] = "" if sim is None else kind
        return value

    def similarity_basis(self, a: JobSpec, b: JobSpec) -> str:
        """What ``similarity(a, b)`` was computed from (for explanations; "" if assumed)."""
        self.similarity(a, b)
        return self._kind[(job_type_key(a), job_type_key(b))]

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
            closest = max(chosen.residents, key=lambda r: self.similarity(job, r))
            basis = self.similarity_basis(job, closest)
            how = (
                f"cosine similarity {sim:.2f} of {basis}"
                if basis
                else (f"similarity {sim:.2f} assumed (no comparable metric vectors)")
            )
            why = f"least similar residents, {how} (lowest of {len(shared)} shared-GPU groups)"
        return (
            f"placed {where} {self.residents_text(chosen)}: {why}, among {n} GPUs that fit; "
            f"{self.fit_text(job, chosen)}{self.interference_text(job, chosen)}"
        )

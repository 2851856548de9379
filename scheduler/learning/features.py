"""The Co-scheML feature vector of a job pair and its normalisation (ALGORITHMS.md §2).

The thesis' model input is "the two applications' normalised metric vectors, concatenated"
(003 §III.3, Table 1). One job's raw vector here has three blocks, every value a float or NaN
(unknown):

1. **Profile metrics** (``PROFILE_METRICS``): Table 1 of the thesis as far as
   ``scheduler.domain.Profile`` holds it (average GPU utilisation, SM efficiency, warp
   efficiency, IPC, occupancy, max and average GPU memory, memory utilisation, device-to-host
   and host-to-device throughput, global load and store throughput) plus the other kernel
   metrics nvprof gives (eligible warps per cycle, DRAM bandwidth, achieved GFLOPS).
2. **Cheap profile** (``CHEAP_FEATURES``): what a few solo runs tell without a profiler: the
   speed-up from a K80 to a V100 and to a P100 (solo time ratios; the job's "sensitivity",
   ALGORITHMS.md §4) and log2 of the batch size (the thesis' "input values").
3. **Co-runs with reference jobs** (``reference_features``): the job's normalised throughput
   next to each of ``REFERENCE_JOB_TYPES`` on a V100 ("sensitivity") and the reference's next to
   the job ("intensity"). Three co-runs instead of one per job type: the cheap way to profile a
   job for which no kernel metrics exist (the Gavel PyTorch job types). Looked up in a
   *repository* (job type -> values) that the trained model carries, like the thesis' profile
   repository; absent -> NaN.

The pair vector is ``[job a's vector, job b's vector, GPU features]`` (``GPU_FEATURES`` of the
``GpuSpec`` the two share), and the target is job a's normalised throughput next to job b
(co-run / solo throughput; 1 = no interference; the thesis' interference value is its inverse).

**Normalisation** (thesis: "each metric has its own unit and scale, so metric values were
normalised"; the method is not named): min-max to 0..1 per feature over the training set, one
range per metric shared by the a and b sides (``FeatureSpace``). A missing value becomes -1
(below every real value, so a tree can split it off) and, for features that had missing values
in training, an indicator column (1 = missing) per side tells linear models the same. Features
missing from every training sample are dropped: a model cannot learn from them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from scheduler.domain import GpuSpec, Profile

#: Profile fields, in this order: Table 1 of 003 first, then further nvprof kernel metrics.
PROFILE_METRICS: tuple[str, ...] = (
    "gpu_util_pct",
    "sm_efficiency_pct",
    "warp_efficiency_pct",
    "ipc",
    "occupancy_pct",
    "gpu_memory_max_mb",
    "gpu_memory_avg_mb",
    "mem_util_pct",
    "d2h_gbps",
    "h2d_gbps",
    "gld_gbps",
    "gst_gbps",
    "epc",
    "dram_bw_gbps",
    "gflops",
)
#: Speed-up V100 over K80 and P100 over K80 (solo time ratios), log2 of the batch size.
CHEAP_FEATURES: tuple[str, ...] = ("speedup_v100_vs_k80", "speedup_p100_vs_k80", "log2_batch_size")
#: The reference job types of the cheap co-run profile (Gavel ``colocation.csv`` names): a
#: convolutional network, a recurrent language model and an embedding-heavy recommender, chosen
#: a priori as three different resource mixes (not tuned to a score).
REFERENCE_JOB_TYPES: tuple[str, ...] = (
    "ResNet-18 (batch size 64)",
    "LM (batch size 20)",
    "Recommendation (batch size 2048)",
)
#: GPU model features (catalogue figures of the GPU the pair shares).
GPU_FEATURES: tuple[str, ...] = ("memory_mb", "sm_count", "dram_bw_gbps", "peak_gflops")
#: The GPU the reference co-runs were measured on.
REFERENCE_GPU = "v100"


def reference_features() -> tuple[str, ...]:
    """Names of the reference co-run features: ``sens:<type>`` then ``intens:<type>``."""
    return tuple(f"sens:{r}" for r in REFERENCE_JOB_TYPES) + tuple(
        f"intens:{r}" for r in REFERENCE_JOB_TYPES
    )


JOB_FEATURES: tuple[str, ...] = PROFILE_METRICS + CHEAP_FEATURES + reference_features()

#: job type (or profile name) -> reference feature name -> value.
Repository = Mapping[str, Mapping[str, float]]


def _num(value: object) -> float:
    """``value`` as a float rounded to 6 significant digits (NaN if unknown). Rounding makes
    equal profiles give equal vectors, e.g. speed-ups computed from run times of different
    lengths, so the prediction cache (keyed by vectors) hits."""
    if value is None:
        return math.nan
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan
    return float(f"{out:.6g}") if math.isfinite(out) else math.nan


def _speedup(times: Mapping[str, float], fast: str, slow: str) -> float:
    t_fast, t_slow = _num(times.get(fast)), _num(times.get(slow))
    if math.isnan(t_fast) or math.isnan(t_slow) or t_fast <= 0 or t_slow <= 0:
        return math.nan
    # 4 significant digits: run times are often rounded, so ratios of two of them differ in
    # the 5th digit between jobs of one type (Gavel traces: different step counts).
    return float(f"{t_slow / t_fast:.4g}")


def job_key(profile: Profile | None, job_type: str | None) -> str:
    """The repository key of a job: its job type, else its profile name, else ""."""
    if job_type:
        return job_type
    return profile.name if profile is not None else ""


def job_vector(
    profile: Profile | None, job_type: str | None = None, repository: Repository | None = None
) -> tuple[float, ...]:
    """The raw feature vector of one job, in ``JOB_FEATURES`` order (NaN = unknown).

    Units as in ``Profile`` (percent, MB, GB/s, GFLOPS); speed-ups unitless; batch size log2.
    """
    values: list[float] = []
    if profile is None:
        values.extend([math.nan] * (len(PROFILE_METRICS) + len(CHEAP_FEATURES)))
    else:
        values.extend(_num(getattr(profile, m)) for m in PROFILE_METRICS)
        times = profile.gpu_time_s
        values.append(_speedup(times, "V100", "K80"))
        values.append(_speedup(times, "P100", "K80"))
        batch = _num(profile.batch_size)
        values.append(_num(math.log2(batch)) if batch > 0 else math.nan)
    refs = (repository or {}).get(job_key(profile, job_type), {})
    values.extend(_num(refs.get(name)) for name in reference_features())
    return tuple(values)


def gpu_vector(gpu: GpuSpec) -> tuple[float, ...]:
    """The GPU features of ``gpu`` in ``GPU_FEATURES`` order."""
    return tuple(_num(getattr(gpu, name)) for name in GPU_FEATURES)


@dataclass
class FeatureSpace:
    """Which features a model uses and their min-max ranges (fitted on its training set).

    ``job_index``: indices into ``JOB_FEATURES`` kept (seen at least once in training);
    ``job_lo``/``job_hi``: their ranges (shared by the a and b sides); ``job_missing``: kept
    features that were missing somewhere in training (they get indicator columns).
    """

    job_index: tuple[int, ...]
    job_lo: np.ndarray
    job_hi: np.ndarray
    job_missing: tuple[bool, ...]
    gpu_lo: np.ndarray
    gpu_hi: np.ndarray
    names: tuple[str, ...] = field(default=())

    @classmethod
    def fit(cls, a: np.ndarray, b: np.ndarray, g: np.ndarray) -> FeatureSpace:
        """Fit on raw matrices: ``a`` and ``b`` are (n, len(JOB_FEATURES)), ``g`` is
        (n, len(GPU_FEATURES))."""
        both = np.vstack([a, b])
        seen = ~np.all(np.isnan(both), axis=0)
        index = tuple(int(i) for i in np.flatnonzero(seen))
        kept = both[:, index]
        lo = np.nanmin(kept, axis=0)
        hi = np.nanmax(kept, axis=0)
        missing = tuple(bool(x) for x in np.any(np.isnan(kept), axis=0))
        names = [f"a.{JOB_FEATURES[i]}" for i in index] + [f"b.{JOB_FEATURES[i]}" for i in index]
        names += [f"gpu.{n}" for n in GPU_FEATURES]
        miss_names = [JOB_FEATURES[i] for i, m in zip(index, missing, strict=True) if m]
        names += [f"a.missing.{n}" for n in miss_names] + [f"b.missing.{n}" for n in miss_names]
        return cls(
            job_index=index,
            job_lo=lo,
            job_hi=hi,
            job_missing=missing,
            gpu_lo=np.nanmin(g, axis=0),
            gpu_hi=np.nanmax(g, axis=0),
            names=tuple(names),
        )

    @property
    def used_job_features(self) -> tuple[str, ...]:
        """Names of the per-job features the model reads."""
        return tuple(JOB_FEATURES[i] for i in self.job_index)

    @staticmethod
    def _scale(x: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        span = np.where(hi > lo, hi - lo, 1.0)
        out = (x - lo) / span
        return np.where(np.isnan(out), -1.0, out)

    def transform(self, a: np.ndarray, b: np.ndarray, g: np.ndarray) -> np.ndarray:
        """The model's input matrix from raw matrices (shapes as in ``fit``)."""
        a_k, b_k = a[:, self.job_index], b[:, self.job_index]
        parts = [
            self._scale(a_k, self.job_lo, self.job_hi),
            self._scale(b_k, self.job_lo, self.job_hi),
            self._scale(g, self.gpu_lo, self.gpu_hi),
        ]
        miss = np.array(self.job_missing, dtype=bool)
        if miss.any():
            parts.append(np.isnan(a_k[:, miss]).astype(float))
            parts.append(np.isnan(b_k[:, miss]).astype(float))
        return np.hstack(parts)


def stack(vectors: Sequence[tuple[float, ...]], width: int) -> np.ndarray:
    """Rows of floats as an (n, width) matrix (an empty list gives shape (0, width))."""
    if not vectors:
        return np.empty((0, width))
    return np.asarray(vectors, dtype=float)

"""Training samples for the interference model, from real measurements (ALGORITHMS.md §2).

Two families of measured pairs from the Gavel project (``scheduler/data/gavel``, MIT; see
``scheduler/data/README.md``), plus live co-runs:

- **tf**: ``nvprof_summary.csv`` (kernel metrics of TensorFlow 1.12 models, profiled alone on a
  V100) joined with ``tf_colocation_2019.csv`` (the same models co-located two to a GPU on K80,
  P100 and V100) on the model directory. Logs ``k80``, ``p100`` and ``v100`` use the ``v100``
  profile set (the same nine models); log ``v100_2019-02-01`` uses the profile set of that name
  (twenty model directories, several batch sizes). A job's profile is what it showed alone on a
  V100, wherever the co-run happened: profiling is done once, offline, as in the thesis; the
  GPU features say where the pair runs. The ``k80_reduced_minibatch_sizes`` log is left out:
  its batch sizes are not recorded, so no profile matches its jobs. nvprof columns map onto
  ``Profile`` fields: ``sm_efficiency`` -> ``sm_efficiency_pct``, ``warp_execution_efficiency``
  -> ``warp_efficiency_pct``, ``ipc``, ``eligible_warps_per_cycle`` -> ``epc``,
  ``dram_read + dram_write_throughput`` -> ``dram_bw_gbps``, ``l2_read_throughput`` ->
  ``gld_gbps`` and ``l2_write_throughput`` -> ``gst_gbps`` (L2 traffic is the global memory
  traffic that reaches L2; nvprof's gld/gst metrics were not collected), ``achieved_gflops_sp``
  -> ``gflops``. Solo throughputs (per step) give ``gpu_time_s`` per GPU model (seconds per
  step; only ratios are used).
- **pytorch**: the 26 single-GPU job types of ``colocation.csv`` (no kernel metrics exist for
  them) with a cheap profile: solo throughput per GPU model (``solo_throughput.csv``), batch
  size, and co-runs on a V100 with the three ``REFERENCE_JOB_TYPES`` (the *repository*; see
  ``features``). Pairs with a reference job are trained on but never scored: their target is
  one of the partner's features.
- **live**: co-runs observed by the portal (Slow-Down of jobs sharing a GPU), given as
  ``PairSample`` objects by the caller.

Every measured ordered pair is one sample (``tf_colocation_2019.csv`` lists each unordered
pair once with both jobs' throughputs: both orientations are used). A pair measured infeasible
(``feasible = 0``, out of memory) is a sample with ``norm = None``: the regression skips it, the
feasibility classifier learns from it. Memory is not in either file, so the regression never
sees a memory feature from these data sets (the portal's profiles can bring one).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints

from scheduler.catalog import CATALOG
from scheduler.domain import GpuSpec, JobKind, Profile
from scheduler.learning.features import (
    GPU_FEATURES,
    JOB_FEATURES,
    REFERENCE_GPU,
    REFERENCE_JOB_TYPES,
    Repository,
    gpu_vector,
    job_vector,
    stack,
)

GAVEL_DIR = Path(__file__).resolve().parents[1] / "data" / "gavel"
NVPROF_CSV = GAVEL_DIR / "nvprof_summary.csv"
TF_COLOCATION_CSV = GAVEL_DIR / "tf_colocation_2019.csv"
COLOCATION_CSV = GAVEL_DIR / "colocation.csv"
SOLO_CSV = GAVEL_DIR / "solo_throughput.csv"

#: tf_colocation log -> nvprof profile set of its jobs.
TF_LOG_PROFILE_SETS: Mapping[str, str] = {
    "k80": "v100",
    "p100": "v100",
    "v100": "v100",
    "v100_2019-02-01": "v100_2019-02-01",
}
GPU_TYPE_MODELS: Mapping[str, str] = {"k80": "K80", "p100": "P100", "v100": "V100"}
_NVPROF_FIELDS: Mapping[str, str] = {
    "sm_efficiency": "sm_efficiency_pct",
    "warp_execution_efficiency": "warp_efficiency_pct",
    "ipc": "ipc",
    "eligible_warps_per_cycle": "epc",
    "l2_read_throughput": "gld_gbps",
    "l2_write_throughput": "gst_gbps",
    "achieved_gflops_sp": "gflops",
}
_BATCH_RE = re.compile(r"\(batch size (\d+)\)")


class DatasetError(ValueError):
    """A data file is missing, malformed, or a data set is empty."""


@dataclass(frozen=True)
class PairSample:
    """One measured ordered pair: job a's normalised throughput next to job b on ``gpu``.

    ``norm`` = co-run throughput / solo throughput of a (None: the pair could not co-run).
    ``app_a``/``app_b``: the applications (for leave-one-application-out; a model at several
    batch sizes is one application). ``reference_pair``: b or a is a reference job whose
    co-runs are features (trained on, never scored).
    """

    a: Profile
    b: Profile
    gpu: GpuSpec
    norm: float | None
    family: str
    app_a: str
    app_b: str
    type_a: str | None = None
    type_b: str | None = None
    source: str = ""
    reference_pair: bool = False

    @property
    def pair_id(self) -> str:
        """The unordered pair (both orientations and every GPU share it)."""
        x, y = sorted([self.a.name, self.b.name])
        return f"{self.family}:{x}|{y}"


@dataclass
class TrainingSet:
    """Samples, the repository of reference co-runs, and the raw matrices built from them."""

    samples: list[PairSample]
    repository: dict[str, dict[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.samples:
            raise DatasetError("the training set is empty")
        rep = self.repository
        self.a = stack([job_vector(s.a, s.type_a, rep) for s in self.samples], len(JOB_FEATURES))
        self.b = stack([job_vector(s.b, s.type_b, rep) for s in self.samples], len(JOB_FEATURES))
        self.g = stack([gpu_vector(s.gpu) for s in self.samples], len(GPU_FEATURES))
        self.norm = np.array([math.nan if s.norm is None else s.norm for s in self.samples])
        self.feasible = np.array([s.norm is not None for s in self.samples])
        self.scored = np.array([not s.reference_pair for s in self.samples])
        self.pair_ids = np.array([s.pair_id for s in self.samples])
        self.app_a = np.array([s.app_a for s in self.samples])
        self.app_b = np.array([s.app_b for s in self.samples])
        self.family = np.array([s.family for s in self.samples])

    def __len__(self) -> int:
        return len(self.samples)

    def subset(self, mask: np.ndarray) -> TrainingSet:
        """The samples where ``mask`` is true (same repository)."""
        return TrainingSet(
            [s for s, keep in zip(self.samples, mask, strict=True) if keep], self.repository
        )

    def applications(self) -> list[str]:
        """Every application that appears in a pair, sorted."""
        return sorted(set(self.app_a) | set(self.app_b))

    def digest(self) -> str:
        """SHA-256 of the samples' raw features, targets and families (hex): two trainings on
        the same data have the same digest, whatever the order of the files' rows."""
        frame = pd.DataFrame(np.hstack([self.a, self.b, self.g, self.norm[:, None]]))
        frame["family"] = self.family
        frame["pair"] = self.pair_ids
        frame = frame.sort_values(list(frame.columns)).reset_index(drop=True)
        h = hashlib.sha256()
        h.update(pd.util.hash_pandas_object(frame.round(9), index=False).values.tobytes())
        for key in sorted(self.repository):
            h.update(key.encode())
            for name, value in sorted(self.repository[key].items()):
                h.update(f"{name}={value:.9g}".encode())
        return h.hexdigest()

    def describe(self) -> dict[str, object]:
        """Counts for logs and the model registry."""
        fam = pd.Series(self.family)
        return {
            "samples": len(self),
            "feasible": int(self.feasible.sum()),
            "scored": int((self.feasible & self.scored).sum()),
            "by_family": {k: int(v) for k, v in fam.value_counts().sort_index().items()},
            "applications": len(self.applications()),
        }


def _read(path: Path, required: Sequence[str]) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path)
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not a CSV file ({exc})") from None
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise DatasetError(f"{path}: missing column(s) {', '.join(missing)}")
    return frame


def _float(value: object) -> float | None:
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def gpu_of(gpu_type: str) -> GpuSpec:
    """The catalogue spec of a Gavel ``gpu_type`` (k80, p100, v100)."""
    model = GPU_TYPE_MODELS.get(str(gpu_type).strip().lower())
    if model is None:
        raise DatasetError(f"unknown gpu_type {gpu_type!r}; known: {', '.join(GPU_TYPE_MODELS)}")
    return CATALOG[model]


# -- tf family ----------------------------------------------------------------------------------


def tf_profiles(
    nvprof: str | Path = NVPROF_CSV, colocation: str | Path = TF_COLOCATION_CSV
) -> dict[tuple[str, str], tuple[Profile, str]]:
    """(profile set, model dir) -> (Profile named ``tf:<model dir>``, application ``tf:<model>``)
    from the nvprof summary, with ``gpu_time_s`` from the co-location logs' solo throughputs."""
    nv = _read(Path(nvprof), ["profile_set", "model", "model_dir", "batch_size"])
    co = _read(Path(colocation), ["log", "gpu_type", "job_a", "job_b", "solo_a", "solo_b"])
    solo: dict[str, dict[str, float]] = {}
    for log in ("k80", "p100", "v100", "v100_2019-02-01"):
        rows = co[co["log"] == log]
        model = GPU_TYPE_MODELS["v100" if log.startswith("v100") else log]
        for job_col, solo_col in (("job_a", "solo_a"), ("job_b", "solo_b")):
            for job, value in zip(rows[job_col], rows[solo_col], strict=True):
                tput = _float(value)
                if tput and tput > 0:
                    # First log wins: the V100 time of a base model comes from the v100 log.
                    solo.setdefault(str(job), {}).setdefault(model, 1.0 / tput)
    out: dict[tuple[str, str], tuple[Profile, str]] = {}
    for _, row in nv.iterrows():
        fields: dict[str, float | None] = {}
        for column, name in _NVPROF_FIELDS.items():
            fields[name] = _float(row.get(column))
        dram = [_float(row.get(c)) for c in ("dram_read_throughput", "dram_write_throughput")]
        fields["dram_bw_gbps"] = sum(dram) if all(v is not None for v in dram) else None  # type: ignore[arg-type]
        batch = _float(row.get("batch_size"))
        model_dir = str(row["model_dir"])
        profile = Profile(
            name=f"tf:{model_dir}",
            kind=JobKind.DL_TRAIN,
            gpu_time_s=dict(solo.get(model_dir, {})),
            batch_size=int(batch) if batch else None,
            **fields,  # type: ignore[arg-type]
        )
        out[(str(row["profile_set"]), model_dir)] = (profile, f"tf:{row['model']}")
    return out


def tf_samples(
    nvprof: str | Path = NVPROF_CSV, colocation: str | Path = TF_COLOCATION_CSV
) -> list[PairSample]:
    """Both orientations of every co-location run of the logs in ``TF_LOG_PROFILE_SETS``."""
    profiles = tf_profiles(nvprof, colocation)
    co = _read(
        Path(colocation), ["log", "gpu_type", "job_a", "job_b", "norm_a", "norm_b", "feasible"]
    )
    samples: list[PairSample] = []
    for line, row in enumerate(co.itertuples(index=False), start=2):
        profile_set = TF_LOG_PROFILE_SETS.get(str(row.log))
        if profile_set is None:
            continue
        pa = profiles.get((profile_set, str(row.job_a)))
        pb = profiles.get((profile_set, str(row.job_b)))
        if pa is None or pb is None:
            raise DatasetError(
                f"{colocation}, line {line}: no nvprof profile for "
                f"{row.job_a if pa is None else row.job_b!r} in profile set {profile_set!r}"
            )
        gpu = gpu_of(str(row.gpu_type))
        feasible = str(row.feasible).strip() not in ("0", "0.0", "False", "false")
        for (p, app), (q, app_q), norm in (
            (pa, pb, row.norm_a),
            (pb, pa, row.norm_b),
        ):
            value = _float(norm) if feasible else None
            if feasible and (value is None or value <= 0):
                raise DatasetError(f"{colocation}, line {line}: bad norm {norm!r}")
            samples.append(
                PairSample(
                    a=p,
                    b=q,
                    gpu=gpu,
                    norm=value,
                    family="tf",
                    app_a=app,
                    app_b=app_q,
                    source=f"tf_colocation_2019.csv:{row.log}",
                )
            )
    return samples


# -- pytorch family -----------------------------------------------------------------------------


def application_of(job_type: str) -> str:
    """``pt:ResNet-50`` for ``ResNet-50 (batch size 64)``; ``pt:A3C`` for ``A3C``."""
    return "pt:" + _BATCH_RE.sub("", job_type).strip()


def pytorch_profiles(solo: str | Path = SOLO_CSV) -> dict[str, Profile]:
    """Job type -> Profile with ``gpu_time_s`` (seconds per step, single GPU, consolidated)
    and the batch size from the type's name."""
    frame = _read(
        Path(solo), ["job_type", "scale_factor", "gpu_type", "consolidated", "throughput"]
    )
    frame = frame[(frame["scale_factor"] == 1) & (frame["consolidated"] == 1)]
    out: dict[str, Profile] = {}
    for job_type, rows in frame.groupby("job_type"):
        times = {}
        for gpu_type, tput in zip(rows["gpu_type"], rows["throughput"], strict=True):
            value = _float(tput)
            model = GPU_TYPE_MODELS.get(str(gpu_type))
            if model and value and value > 0:
                times[model] = 1.0 / value
        match = _BATCH_RE.search(str(job_type))
        out[str(job_type)] = Profile(
            name=str(job_type),
            kind=JobKind.DL_TRAIN,
            gpu_time_s=times,
            batch_size=int(match.group(1)) if match else None,
        )
    return out


def _colocation_frame(path: str | Path) -> pd.DataFrame:
    return _read(Path(path), ["gpu_type", "job_a", "job_b", "norm_a", "feasible"])


def reference_repository(
    colocation: str | Path = COLOCATION_CSV,
    references: Sequence[str] = REFERENCE_JOB_TYPES,
) -> dict[str, dict[str, float]]:
    """Job type -> ``sens:<ref>`` (its norm next to the reference) and ``intens:<ref>`` (the
    reference's norm next to it) on a V100; an infeasible co-run counts as 0."""
    frame = _colocation_frame(colocation)
    frame = frame[frame["gpu_type"].astype(str).str.lower() == REFERENCE_GPU]
    norm: dict[tuple[str, str], float] = {}
    for row in frame.itertuples(index=False):
        feasible = str(row.feasible).strip() not in ("0", "0.0", "False", "false")
        value = _float(row.norm_a) if feasible else 0.0
        if value is not None:
            norm[(str(row.job_a), str(row.job_b))] = value
    types = sorted({a for a, _ in norm})
    repo: dict[str, dict[str, float]] = {}
    for job in types:
        entry = {}
        for ref in references:
            if (job, ref) in norm:
                entry[f"sens:{ref}"] = norm[(job, ref)]
            if (ref, job) in norm:
                entry[f"intens:{ref}"] = norm[(ref, job)]
        repo[job] = entry
    return repo


def pytorch_samples(
    colocation: str | Path = COLOCATION_CSV,
    solo: str | Path = SOLO_CSV,
    *,
    exclude_pairs: Iterable[frozenset[str]] = (),
    only_pairs: Iterable[frozenset[str]] | None = None,
) -> list[PairSample]:
    """Every ordered pair of ``colocation.csv`` (job a's norm next to job b) on every GPU type.

    ``exclude_pairs`` / ``only_pairs``: unordered job-type pairs to leave out / to keep only
    (the held-out-pairs experiment).
    """
    profiles = pytorch_profiles(solo)
    excluded = set(exclude_pairs)
    only = None if only_pairs is None else set(only_pairs)
    refs = set(REFERENCE_JOB_TYPES)
    samples = []
    for line, row in enumerate(_colocation_frame(colocation).itertuples(index=False), start=2):
        a, b = str(row.job_a), str(row.job_b)
        pair = frozenset((a, b))
        if pair in excluded or (only is not None and pair not in only):
            continue
        if a not in profiles or b not in profiles:
            raise DatasetError(f"{colocation}, line {line}: no solo throughput for {a!r} or {b!r}")
        feasible = str(row.feasible).strip() not in ("0", "0.0", "False", "false")
        value = _float(row.norm_a) if feasible else None
        if feasible and (value is None or value <= 0):
            raise DatasetError(f"{colocation}, line {line}: bad norm_a {row.norm_a!r}")
        samples.append(
            PairSample(
                a=profiles[a],
                b=profiles[b],
                gpu=gpu_of(str(row.gpu_type)),
                norm=value,
                family="pytorch",
                app_a=application_of(a),
                app_b=application_of(b),
                type_a=a,
                type_b=b,
                source="colocation.csv",
                reference_pair=a in refs or b in refs,
            )
        )
    return samples


def gavel_training_set(
    *,
    families: Sequence[str] = ("tf", "pytorch"),
    exclude_pairs: Iterable[frozenset[str]] = (),
    extra: Sequence[PairSample] = (),
    data_dir: str | Path = GAVEL_DIR,
) -> TrainingSet:
    """The training set from the Gavel measurements (``families``) plus ``extra`` samples
    (live co-runs); ``exclude_pairs`` leaves PyTorch job-type pairs out (held-out pairs)."""
    data = Path(data_dir)
    samples: list[PairSample] = []
    repository: dict[str, dict[str, float]] = {}
    unknown = set(families) - {"tf", "pytorch"}
    if unknown:
        raise DatasetError(f"unknown famil(ies) {', '.join(sorted(unknown))}; known: tf, pytorch")
    if "tf" in families:
        samples += tf_samples(data / NVPROF_CSV.name, data / TF_COLOCATION_CSV.name)
    if "pytorch" in families:
        samples += pytorch_samples(
            data / COLOCATION_CSV.name, data / SOLO_CSV.name, exclude_pairs=exclude_pairs
        )
        repository = reference_repository(data / COLOCATION_CSV.name)
    samples += list(extra)
    return TrainingSet(samples, repository)


def merge_repository(base: Repository, more: Repository) -> dict[str, dict[str, float]]:
    """``base`` with ``more``'s entries added (``more`` wins on a clash)."""
    out = {k: dict(v) for k, v in base.items()}
    for key, values in more.items():
        out.setdefault(key, {}).update(values)
    return out

"""The trained interference model as the scheduler uses it (ALGORITHMS.md §2).

``InterferencePredictor`` holds a fitted scikit-learn regressor of job a's normalised throughput
next to job b, the ``FeatureSpace`` it was trained in, the repository of reference co-runs, an
optional feasibility classifier, and metadata (algorithm, data set hash, features, scores).

Predictions are cached per profile pair and GPU model: the cache key is the two jobs' raw
feature vectors and the GPU's, so two jobs with the same profile share entries and an edited
profile gets fresh ones. A scheduling cycle asks for all the pairs it needs at once
(``predict``), so scikit-learn is called once per cycle at most, and not at all once the
profiles present have been seen (decision latency, docs/coscheml.md).

``dumps`` / ``loads`` turn a predictor into bytes and back (pickle, zlib-compressed, with a
format tag and the scikit-learn version it was made with). Only load bytes you wrote yourself:
unpickling runs code.
"""

from __future__ import annotations

import io
import math
import pickle
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from scheduler.domain import GpuSpec, JobSpec, Profile
from scheduler.learning.features import (
    GPU_FEATURES,
    JOB_FEATURES,
    FeatureSpace,
    gpu_vector,
    job_vector,
)

FORMAT_TAG = b"cosched-interference-v1\n"
CACHE_LIMIT = 200_000

Vector = tuple[float, ...]
Key = tuple[Any, ...]


class PredictorError(ValueError):
    """A predictor file or blob could not be read."""


def _is_forest(model: Any) -> bool:
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor  # type: ignore[import-untyped]  # scikit-learn ships no type hints

    return isinstance(model, RandomForestRegressor | RandomForestClassifier)


def _regress(model: Any, x: np.ndarray) -> np.ndarray:
    """``model.predict(x)``; for a random forest, the mean of its trees' predictions computed
    directly (the same numbers without scikit-learn's per-call parallel machinery, which costs
    ~20 ms per call for 100 trees: a scheduling cycle's budget)."""
    if _is_forest(model):
        x32 = np.asarray(x, dtype=np.float32)
        out = np.zeros(len(x))
        for tree in model.estimators_:
            out += tree.predict(x32, check_input=False)
        return out / len(model.estimators_)
    return np.asarray(model.predict(x), dtype=float)


def _proba(model: Any, x: np.ndarray) -> np.ndarray:
    """``model.predict_proba(x)`` (forests: averaged over trees directly, as ``_regress``)."""
    if _is_forest(model):
        x32 = np.asarray(x, dtype=np.float32)
        out = np.zeros((len(x), len(model.classes_)))
        for tree in model.estimators_:
            out += tree.predict_proba(x32, check_input=False)
        return out / len(model.estimators_)
    return np.asarray(model.predict_proba(x), dtype=float)


def vector_key(vector: Vector) -> tuple[float | None, ...]:
    """A hashable, comparable key: NaN (never equal to itself) becomes None."""
    return tuple(None if math.isnan(v) else v for v in vector)


class InterferencePredictor:
    """A trained pairwise interference model with a prediction cache (module docstring)."""

    def __init__(
        self,
        *,
        name: str,
        algorithm: str,
        space: FeatureSpace,
        regressor: Any,
        feasibility: Any = None,
        repository: Mapping[str, Mapping[str, float]] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.algorithm = algorithm
        self.space = space
        self.regressor = regressor
        self.feasibility = feasibility
        self.repository = {k: dict(v) for k, v in (repository or {}).items()}
        self.metadata = dict(metadata or {})
        self._cache: dict[Key, tuple[float, float]] = {}
        self.calls = 0  # scikit-learn predict calls (batches), for tests and benchmarks

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_cache"] = {}
        state["calls"] = 0
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- features ------------------------------------------------------------------------------

    def job_vector(self, profile: Profile | None, job_type: str | None = None) -> Vector:
        """Raw feature vector of a job (``features.job_vector`` with this model's repository)."""
        return job_vector(profile, job_type, self.repository)

    def knows(self, vector: Vector) -> int:
        """How many of the features this model reads are known in ``vector``."""
        return sum(1 for i in self.space.job_index if not math.isnan(vector[i]))

    # -- predictions ---------------------------------------------------------------------------

    def predict(self, pairs: Sequence[tuple[Vector, Vector, Vector]]) -> list[tuple[float, float]]:
        """(normalised throughput of a next to b, probability the pair can co-run) for each
        ``(vector a, vector b, GPU vector)``; uncached pairs go to scikit-learn in one batch."""
        return self.predict_keyed(
            [((vector_key(a), a), (vector_key(b), b), (vector_key(g), g)) for a, b, g in pairs]
        )

    def predict_keyed(
        self, items: Sequence[tuple[tuple[Key, Vector], tuple[Key, Vector], tuple[Key, Vector]]]
    ) -> list[tuple[float, float]]:
        """``predict`` for callers that keep each vector's ``vector_key`` (cheaper per call)."""
        keys = [(a[0], b[0], g[0]) for a, b, g in items]
        cache = self._cache
        missing: dict[Key, int] = {}
        for i, key in enumerate(keys):
            if key not in cache and key not in missing:
                missing[key] = i
        if missing:
            rows = [items[i] for i in missing.values()]
            a = np.asarray([r[0][1] for r in rows], dtype=float).reshape(-1, len(JOB_FEATURES))
            b = np.asarray([r[1][1] for r in rows], dtype=float).reshape(-1, len(JOB_FEATURES))
            g = np.asarray([r[2][1] for r in rows], dtype=float).reshape(-1, len(GPU_FEATURES))
            x = self.space.transform(a, b, g)
            norms = _regress(self.regressor, x)
            if self.feasibility is not None:
                classes = list(self.feasibility.classes_)
                proba = _proba(self.feasibility, x)
                ok = proba[:, classes.index(1)] if 1 in classes else np.zeros(len(x))
            else:
                ok = np.ones(len(x))
            self.calls += 1
            if len(cache) + len(missing) > CACHE_LIMIT:
                cache.clear()
            for key, norm, p in zip(missing, norms, ok, strict=True):
                cache[key] = (float(norm), float(p))
        return [cache[k] for k in keys]

    def predict_pair(
        self,
        a: Profile | None,
        b: Profile | None,
        gpu: GpuSpec,
        *,
        type_a: str | None = None,
        type_b: str | None = None,
    ) -> tuple[float, float]:
        """(normalised throughput of a next to b on ``gpu``, probability they can co-run)."""
        return self.predict(
            [(self.job_vector(a, type_a), self.job_vector(b, type_b), gpu_vector(gpu))]
        )[0]

    def predict_jobs(self, a: JobSpec, b: JobSpec, gpu: GpuSpec) -> tuple[float, float]:
        """``predict_pair`` for two jobs (their profiles and job types)."""
        return self.predict_pair(a.profile, b.profile, gpu, type_a=a.job_type, type_b=b.job_type)

    def cache_size(self) -> int:
        return len(self._cache)

    # -- description ---------------------------------------------------------------------------

    def scores(self, validation: str = "cv5") -> Mapping[str, Any]:
        """The stored validation scores (empty if none)."""
        return dict((self.metadata.get("scores") or {}).get(validation) or {})

    def summary(self) -> str:
        """ "forest-1a2b3c4d (random forest; cv5 MSE 0.0123, R^2 0.71)" for explanations."""
        s = self.scores("cv5")
        if s.get("n") and s.get("r2") is not None:
            return f"{self.name} ({self.algorithm}; cv5 MSE {s['mse']:.4f}, R^2 {s['r2']:.2f})"
        return f"{self.name} ({self.algorithm})"


def dumps(predictor: InterferencePredictor) -> bytes:
    """The predictor as compressed bytes (see the module docstring)."""
    import sklearn  # type: ignore[import-untyped]  # scikit-learn ships no type hints

    buf = io.BytesIO()
    pickle.dump({"sklearn": sklearn.__version__, "predictor": predictor}, buf, protocol=5)
    return FORMAT_TAG + zlib.compress(buf.getvalue(), 6)


def loads(data: bytes) -> InterferencePredictor:
    """A predictor from ``dumps`` bytes; PredictorError if they are not one."""
    if not data.startswith(FORMAT_TAG):
        raise PredictorError("not a Cosched interference model (bad header)")
    try:
        payload = pickle.loads(zlib.decompress(data[len(FORMAT_TAG) :]))  # noqa: S301
    except (zlib.error, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as exc:
        raise PredictorError(f"corrupt interference model: {exc}") from None
    predictor = payload.get("predictor") if isinstance(payload, dict) else None
    if not isinstance(predictor, InterferencePredictor):
        raise PredictorError("corrupt interference model: no predictor inside")
    return predictor


def save(predictor: InterferencePredictor, path: str) -> None:
    """Write ``dumps(predictor)`` to ``path``."""
    with open(path, "wb") as f:
        f.write(dumps(predictor))


def load(path: str) -> InterferencePredictor:
    """Read a predictor written by ``save``; PredictorError if missing or not one."""
    try:
        with open(path, "rb") as f:
            return loads(f.read())
    except FileNotFoundError:
        raise PredictorError(f"{path}: no such model file") from None
    except IsADirectoryError:
        raise PredictorError(f"{path}: is a directory, not a model file") from None

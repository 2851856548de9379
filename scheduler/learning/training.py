"""Train and validate interference models with scikit-learn (ALGORITHMS.md §2, thesis Table 2).

Algorithms (``ALGORITHMS``; hyper-parameters are scikit-learn's defaults except where a comment
says why; the thesis names the model kinds, not their settings):

- ``linear``: ordinary least squares;
- ``tree``: a regression tree, at least 3 samples per leaf (an unpruned tree memorises noise);
- ``forest``: 100 trees, at least 2 samples per leaf (the thesis' choice of model);
- ``boosting``: histogram gradient boosting (scikit-learn's ``HistGradientBoostingRegressor``).

Validation, each reporting MSE, R^2 and MAE of the predicted normalised throughput over the
held-out samples, pooled over folds (plus MSE and R^2 of the slowdown 1/norm, the quantity of
the thesis' table; norms are floored at 0.05, a 20x slowdown, before inverting):

- ``cv5``: 5-fold cross-validation over samples, shuffled (the thesis' protocol). Both
  orientations of a pair and its runs on other GPUs may fall in different folds, so the model
  has usually seen the pair: optimistic.
- ``cv5_pairs``: 5 folds over unordered pairs: a pair's samples (both orientations, every GPU)
  are all in one fold, so every scored pair is unseen but both its jobs were seen with others.
- ``loao``: leave-one-application-out: for each application (a model at any batch size), train
  on the pairs without it and score the pairs with it: a job type the model never saw.

Only feasible samples are regressed; samples of pairs with a reference job (whose co-runs are
features) are trained on but never scored. A model that predicts the training mean
(``constant``) is the baseline every score should beat.

A separate random-forest classifier learns ``feasible`` (could the pair co-run at all) from the
same features; its 5-fold accuracy and recall of infeasible pairs are reported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin, clone  # type: ignore[import-untyped]  # scikit-learn ships no type hints
from sklearn.ensemble import (  # type: ignore[import-untyped]  # scikit-learn ships no type hints
    HistGradientBoostingRegressor,
    RandomForestClassifier,
    RandomForestRegressor,
)
from sklearn.linear_model import LinearRegression  # type: ignore[import-untyped]  # scikit-learn ships no type hints
from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score  # type: ignore[import-untyped]  # scikit-learn ships no type hints
from sklearn.model_selection import GroupKFold, KFold  # type: ignore[import-untyped]  # scikit-learn ships no type hints
from sklearn.tree import DecisionTreeRegressor  # type: ignore[import-untyped]  # scikit-learn ships no type hints

from scheduler.learning.datasets import DatasetError, TrainingSet
from scheduler.learning.features import FeatureSpace
from scheduler.learning.predictor import InterferencePredictor

#: Norms are floored here before computing slowdowns (1 / norm): a 20x slowdown.
NORM_FLOOR = 0.05
VALIDATIONS: tuple[str, ...] = ("cv5", "cv5_pairs", "loao")
#: Called as ``progress(done, total, message)`` after each fit.
Progress = Callable[[int, int, str], None]


class ConstantRegressor(RegressorMixin, BaseEstimator):
    """Predicts the training mean: the baseline a learned model must beat."""

    def fit(self, x: np.ndarray, y: np.ndarray) -> ConstantRegressor:
        self.mean_ = float(np.mean(y))
        return self

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.full(len(x), self.mean_)


def make_estimator(algorithm: str, seed: int = 0) -> Any:
    """A fresh, unfitted scikit-learn regressor for ``algorithm`` (see the module docstring)."""
    if algorithm == "linear":
        return LinearRegression()
    if algorithm == "tree":
        return DecisionTreeRegressor(min_samples_leaf=3, random_state=seed)
    if algorithm == "forest":
        return RandomForestRegressor(
            n_estimators=100, min_samples_leaf=2, random_state=seed, n_jobs=1
        )
    if algorithm == "boosting":
        return HistGradientBoostingRegressor(random_state=seed)
    if algorithm == "constant":
        return ConstantRegressor()
    raise DatasetError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}, constant")


ALGORITHMS: tuple[str, ...] = ("linear", "tree", "forest", "boosting")
ALGORITHM_LABELS: Mapping[str, str] = {
    "linear": "linear regression",
    "tree": "decision tree",
    "forest": "random forest",
    "boosting": "gradient boosting",
    "constant": "constant (training mean)",
}


def scores(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, Any]:
    """MSE, R^2 and MAE of normalised throughputs, and MSE / R^2 of slowdowns (1 / norm);
    an undefined R^2 is None (the scores are stored as JSON)."""
    if len(y_true) == 0:
        return {"n": 0}
    s_true = 1.0 / np.maximum(y_true, NORM_FLOOR)
    s_pred = 1.0 / np.clip(y_pred, NORM_FLOOR, None)
    out: dict[str, float | None] = {
        "n": int(len(y_true)),
        "mse": float(mean_squared_error(y_true, y_pred)),
        "mae": float(mean_absolute_error(y_true, y_pred)),
        "r2": _r2(y_true, y_pred),
        "slowdown_mse": float(mean_squared_error(s_true, s_pred)),
        "slowdown_r2": _r2(s_true, s_pred),
    }
    return out


def _r2(y_true: np.ndarray, y_pred: np.ndarray) -> float | None:
    """R^2, or None where it is undefined (fewer than two samples, or a constant truth)."""
    if len(y_true) < 2 or float(np.var(y_true)) == 0.0:
        return None
    return float(r2_score(y_true, y_pred))


def _folds(data: TrainingSet, validation: str, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train mask, test mask) per fold over all samples."""
    n = len(data)
    out = []
    if validation == "cv5":
        splitter = KFold(n_splits=5, shuffle=True, random_state=seed)
        for train, test in splitter.split(np.zeros(n)):
            tr, te = np.zeros(n, bool), np.zeros(n, bool)
            tr[train], te[test] = True, True
            out.append((tr, te))
    elif validation == "cv5_pairs":
        pairs = np.unique(data.pair_ids)
        order = np.random.default_rng(seed).permutation(len(pairs))
        fold_of = {pairs[i]: k % 5 for k, i in enumerate(order)}
        groups = np.array([fold_of[p] for p in data.pair_ids])
        for train, test in GroupKFold(n_splits=5).split(np.zeros(n), groups=groups):
            tr, te = np.zeros(n, bool), np.zeros(n, bool)
            tr[train], te[test] = True, True
            out.append((tr, te))
    elif validation == "loao":
        for app in data.applications():
            te = (data.app_a == app) | (data.app_b == app)
            out.append((~te, te))
    else:
        raise DatasetError(f"unknown validation {validation!r}; known: {', '.join(VALIDATIONS)}")
    return out


def _fit_predict(
    estimator: Any, data: TrainingSet, train: np.ndarray, test: np.ndarray
) -> np.ndarray:
    space = FeatureSpace.fit(data.a[train], data.b[train], data.g[train])
    x_train = space.transform(data.a[train], data.b[train], data.g[train])
    model = clone(estimator).fit(x_train, data.norm[train])
    return np.asarray(model.predict(space.transform(data.a[test], data.b[test], data.g[test])))


def validate(
    data: TrainingSet,
    algorithm: str,
    validation: str,
    *,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Pooled held-out scores of ``algorithm`` under ``validation`` (module docstring), overall
    and per family. Folds whose training part has no feasible sample are skipped."""
    usable = data.feasible
    y_true: list[np.ndarray] = []
    y_pred: list[np.ndarray] = []
    fams: list[np.ndarray] = []
    folds = 0
    estimator = make_estimator(algorithm, seed)
    for train, test in _folds(data, validation, seed):
        tr = train & usable
        te = test & usable & data.scored
        if progress is not None:
            progress(f"{algorithm} {validation} fold {folds + 1}")
        if not tr.any() or not te.any():
            continue
        y_pred.append(_fit_predict(estimator, data, tr, te))
        y_true.append(data.norm[te])
        fams.append(data.family[te])
        folds += 1
    if not y_true:
        return {"n": 0, "folds": 0}
    yt, yp, fam = np.concatenate(y_true), np.concatenate(y_pred), np.concatenate(fams)
    out: dict[str, Any] = scores(yt, yp)
    out["folds"] = folds
    out["by_family"] = {f: scores(yt[fam == f], yp[fam == f]) for f in sorted(set(fam))}
    return out


def fold_count(data: TrainingSet, validation: str) -> int:
    """How many fits ``validate`` makes for ``validation`` (for progress bars)."""
    return len(data.applications()) if validation == "loao" else 5


def fit_predictor(
    data: TrainingSet,
    algorithm: str = "forest",
    *,
    seed: int = 0,
    name: str = "",
    feasibility: bool = True,
    metadata: Mapping[str, Any] | None = None,
) -> InterferencePredictor:
    """Fit ``algorithm`` on every feasible sample (and, with ``feasibility``, the feasibility
    classifier on every sample) and wrap it with its feature space and repository."""
    usable = data.feasible
    if not usable.any():
        raise DatasetError("no feasible sample to train on")
    space = FeatureSpace.fit(data.a, data.b, data.g)
    model = make_estimator(algorithm, seed).fit(
        space.transform(data.a[usable], data.b[usable], data.g[usable]), data.norm[usable]
    )
    classifier = None
    if feasibility and (~data.feasible).any():
        classifier = RandomForestClassifier(
            n_estimators=100, min_samples_leaf=2, random_state=seed, class_weight="balanced"
        ).fit(space.transform(data.a, data.b, data.g), data.feasible.astype(int))
    digest = data.digest()
    meta: dict[str, Any] = {
        "algorithm": algorithm,
        "dataset_hash": digest,
        "dataset": data.describe(),
        "features": list(space.used_job_features),
        "seed": seed,
    }
    meta.update(metadata or {})
    return InterferencePredictor(
        name=name or f"{algorithm}-{digest[:8]}",
        algorithm=algorithm,
        space=space,
        regressor=model,
        feasibility=classifier,
        repository={k: dict(v) for k, v in data.repository.items()},
        metadata=meta,
    )


def feasibility_scores(data: TrainingSet, *, seed: int = 0) -> dict[str, float]:
    """5-fold accuracy and recall of infeasible pairs of the feasibility classifier."""
    if data.feasible.all() or not data.feasible.any():
        return {"n": len(data), "infeasible": int((~data.feasible).sum())}
    truth: list[np.ndarray] = []
    guess: list[np.ndarray] = []
    for train, test in _folds(data, "cv5", seed):
        space = FeatureSpace.fit(data.a[train], data.b[train], data.g[train])
        clf = RandomForestClassifier(
            n_estimators=100, min_samples_leaf=2, random_state=seed, class_weight="balanced"
        ).fit(
            space.transform(data.a[train], data.b[train], data.g[train]),
            data.feasible[train].astype(int),
        )
        guess.append(clf.predict(space.transform(data.a[test], data.b[test], data.g[test])))
        truth.append(data.feasible[test].astype(int))
    t, g = np.concatenate(truth), np.concatenate(guess)
    infeasible = t == 0
    return {
        "n": int(len(t)),
        "infeasible": int(infeasible.sum()),
        "accuracy": float((t == g).mean()),
        "infeasible_recall": float((g[infeasible] == 0).mean()),
    }


@dataclass
class TrainingReport:
    """What ``train_models`` did: scores per algorithm and validation, the fitted predictors."""

    dataset_hash: str
    dataset: dict[str, Any]
    scores: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    feasibility: dict[str, float] = field(default_factory=dict)
    predictors: dict[str, InterferencePredictor] = field(default_factory=dict)

    def best(self, validation: str = "cv5") -> str:
        """The algorithm with the lowest MSE under ``validation``."""
        ranked = [
            (s[validation]["mse"], a)
            for a, s in self.scores.items()
            if validation in s and s[validation].get("n")
        ]
        if not ranked:
            raise DatasetError(f"no algorithm was scored under {validation}")
        return min(ranked)[1]


def train_models(
    data: TrainingSet,
    algorithms: Sequence[str] = ALGORITHMS,
    validations: Sequence[str] = VALIDATIONS,
    *,
    seed: int = 0,
    progress: Progress | None = None,
    fit_final: bool = True,
    name_prefix: str = "",
) -> TrainingReport:
    """Validate every algorithm under every validation, then (``fit_final``) fit each on the
    whole data set. ``progress(done, total, message)`` is called after each fit."""
    for algorithm in algorithms:
        make_estimator(algorithm)  # fail fast on a bad name
    for validation in validations:
        if validation not in VALIDATIONS:
            raise DatasetError(
                f"unknown validation {validation!r}; known: {', '.join(VALIDATIONS)}"
            )
    per_algorithm = sum(fold_count(data, v) for v in validations) + (1 if fit_final else 0)
    total = per_algorithm * len(algorithms) + 1
    done = [0]

    def step(message: str) -> None:
        done[0] += 1
        if progress is not None:
            progress(min(done[0], total), total, message)

    report = TrainingReport(dataset_hash=data.digest(), dataset=data.describe())
    for algorithm in algorithms:
        report.scores[algorithm] = {}
        for validation in validations:
            report.scores[algorithm][validation] = validate(
                data, algorithm, validation, seed=seed, progress=step
            )
    report.feasibility = feasibility_scores(data, seed=seed)
    step("feasibility classifier")
    if fit_final:
        for algorithm in algorithms:
            report.predictors[algorithm] = fit_predictor(
                data,
                algorithm,
                seed=seed,
                name=f"{name_prefix}{algorithm}-{report.dataset_hash[:8]}",
                metadata={
                    "scores": report.scores[algorithm],
                    "feasibility_scores": report.feasibility,
                },
            )
            step(f"{algorithm} final fit")
    return report

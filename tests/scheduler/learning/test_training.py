"""Training and validation on a small real fixture (scheduler.learning.training).

The fixture is the TensorFlow family on a V100 (the ``v100`` log, 48 runs = 96 samples, nine
applications): big enough for the scores to mean something, small enough for seconds."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.learning.datasets import DatasetError, TrainingSet, tf_samples
from scheduler.learning.training import (
    _folds,
    fit_predictor,
    fold_count,
    train_models,
    validate,
)


@pytest.fixture(scope="module")
def small() -> TrainingSet:
    samples = [s for s in tf_samples() if s.source.endswith(":v100")]
    return TrainingSet(samples, {})


def test_forest_scores_are_in_range_and_beat_a_constant_model(small):
    report = train_models(small, ["forest", "constant"], ["cv5"], fit_final=False)
    forest, constant = report.scores["forest"]["cv5"], report.scores["constant"]["cv5"]
    assert forest["n"] == int(small.feasible.sum()) == constant["n"]
    assert 0.0 < forest["mse"] < 0.04 and 0.0 < forest["mae"] < 0.15
    assert 0.4 < forest["r2"] <= 1.0
    assert forest["mse"] < 0.6 * constant["mse"]
    assert constant["r2"] < 0.05  # a constant explains nothing
    assert report.best("cv5") == "forest"


def test_leave_one_application_out_never_trains_on_the_held_out_application(small):
    folds = _folds(small, "loao", seed=0)
    assert len(folds) == fold_count(small, "loao") == len(small.applications()) == 9
    for app, (train, test) in zip(small.applications(), folds, strict=True):
        assert not ((small.app_a[train] == app) | (small.app_b[train] == app)).any()
        assert ((small.app_a[test] == app) | (small.app_b[test] == app)).all()
    tree = validate(small, "tree", "loao")
    constant = validate(small, "constant", "loao")
    assert tree["folds"] == 9 and tree["n"] > small.feasible.sum()  # pairs scored in 2 folds
    assert np.isfinite(tree["mse"]) and tree["mse"] < constant["mse"]


def test_pair_folds_keep_both_orientations_together(small):
    for train, test in _folds(small, "cv5_pairs", seed=0):
        assert not set(small.pair_ids[train]) & set(small.pair_ids[test])


def test_progress_reaches_its_total_and_fit_final_gives_predictors(small):
    seen = []
    report = train_models(
        small, ["linear"], ["cv5"], progress=lambda d, t, m: seen.append((d, t, m))
    )
    assert seen[-1][0] == seen[-1][1] == 5 + 1 + 1  # folds, feasibility, final fit
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)
    predictor = report.predictors["linear"]
    assert predictor.metadata["dataset_hash"] == small.digest()
    assert predictor.scores("cv5")["n"] == report.scores["linear"]["cv5"]["n"]
    assert "sm_efficiency_pct" in predictor.metadata["features"]


def test_bad_names_and_empty_data_are_errors(small):
    with pytest.raises(DatasetError, match="unknown algorithm 'svm'"):
        train_models(small, ["svm"])
    with pytest.raises(DatasetError, match="unknown validation"):
        train_models(small, ["linear"], ["cv10"])
    with pytest.raises(DatasetError, match="empty"):
        TrainingSet([], {})
    k80 = TrainingSet([s for s in tf_samples() if s.source.endswith(":k80")], {})
    infeasible = k80.subset(~k80.feasible)
    with pytest.raises(DatasetError, match="no feasible sample"):
        fit_predictor(infeasible, "linear")

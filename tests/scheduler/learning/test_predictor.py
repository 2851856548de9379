"""The trained artifact: predictions, cache, (de)serialisation, the runtime loader."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.catalog import gpu_spec
from scheduler.learning import runtime
from scheduler.learning.datasets import TrainingSet, tf_samples
from scheduler.learning.features import gpu_vector
from scheduler.learning.predictor import PredictorError, _proba, _regress, dumps, load, loads, save
from scheduler.learning.training import fit_predictor


@pytest.fixture(scope="module")
def data() -> TrainingSet:
    return TrainingSet([s for s in tf_samples() if s.source.endswith(":k80")], {})


@pytest.fixture(scope="module")
def forest(data):
    return fit_predictor(data, "forest", name="t-forest")


def test_fast_forest_path_equals_scikit_learn(forest, data):
    x = forest.space.transform(data.a, data.b, data.g)
    assert np.allclose(_regress(forest.regressor, x), forest.regressor.predict(x))
    assert np.allclose(_proba(forest.feasibility, x), forest.feasibility.predict_proba(x))


def test_predictions_are_cached_per_profile_pair(data):
    predictor = fit_predictor(data, "tree", name="t-tree")
    a, b = data.samples[0].a, data.samples[0].b
    v100 = gpu_spec("K80")
    first = predictor.predict_pair(a, b, v100)
    assert predictor.calls == 1 and predictor.cache_size() == 1
    again = predictor.predict_pair(a, b, v100)
    assert again == first and predictor.calls == 1
    pairs = [
        (predictor.job_vector(s.a), predictor.job_vector(s.b), gpu_vector(s.gpu))
        for s in data.samples
    ]
    predictor.predict(pairs)
    assert predictor.calls == 2  # one batch for every new pair
    assert 0.0 < first[0] < 2.0 and 0.0 <= first[1] <= 1.0


def test_round_trip_through_bytes_and_files(forest, data, tmp_path):
    pairs = [
        (forest.job_vector(s.a), forest.job_vector(s.b), gpu_vector(s.gpu))
        for s in data.samples[:10]
    ]
    before = forest.predict(pairs)
    blob = dumps(forest)
    again = loads(blob)
    assert again.cache_size() == 0  # the cache is not stored
    assert again.predict(pairs) == before
    assert again.name == "t-forest" and again.metadata["dataset_hash"] == data.digest()
    path = tmp_path / "m.model"
    save(forest, str(path))
    assert load(str(path)).predict(pairs) == before
    assert runtime.resolve(f"file:{path}").predict(pairs) == before


def test_bad_blobs_and_paths_are_clear_errors(tmp_path):
    with pytest.raises(PredictorError, match="bad header"):
        loads(b"not a model")
    with pytest.raises(PredictorError, match="corrupt"):
        loads(b"cosched-interference-v1\nxxxx")
    with pytest.raises(PredictorError, match="no such model file"):
        runtime.resolve(f"file:{tmp_path / 'missing.model'}")
    with pytest.raises(PredictorError, match="unknown model 'latest'"):
        runtime.resolve("latest")


def test_active_provider_is_cached_by_key_and_reloaded_on_change(forest, data):
    blobs = {"a": dumps(forest), "b": dumps(fit_predictor(data, "linear", name="t-linear"))}
    loads_seen = []
    current = {"key": "a"}

    def provider():
        key = current["key"]
        if key is None:
            return None

        def load_bytes():
            loads_seen.append(key)
            return blobs[key]

        return key, load_bytes

    previous = runtime.active_provider()  # the portal's, when Django is set up
    runtime.set_active_provider(provider)
    try:
        first = runtime.resolve("active")
        assert first.name == "t-forest" and runtime.resolve("active") is first
        current["key"] = "b"
        second = runtime.resolve("active")
        assert second.name == "t-linear" and loads_seen == ["a", "b"]
        current["key"] = None
        assert runtime.resolve("active") is runtime.builtin_predictor()
    finally:
        runtime.set_active_provider(previous)

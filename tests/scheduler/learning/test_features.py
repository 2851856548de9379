"""The Co-scheML feature vector and its normalisation (scheduler.learning.features)."""

from __future__ import annotations

import math

import numpy as np

from scheduler.catalog import gpu_spec
from scheduler.domain import Profile
from scheduler.learning.features import (
    GPU_FEATURES,
    JOB_FEATURES,
    FeatureSpace,
    gpu_vector,
    job_vector,
)


def _at(vector, name):
    return vector[JOB_FEATURES.index(name)]


def test_job_vector_reads_profile_metrics_speedups_batch_and_repository():
    profile = Profile(
        "x",
        sm_efficiency_pct=80.0,
        ipc=1.5,
        gpu_time_s={"K80": 400.0, "P100": 200.0, "V100": 100.0},
        batch_size=64,
    )
    repo = {"x": {"sens:LM (batch size 20)": 0.7, "intens:LM (batch size 20)": 0.9}}
    v = job_vector(profile, None, repo)
    assert len(v) == len(JOB_FEATURES)
    assert _at(v, "sm_efficiency_pct") == 80.0 and _at(v, "ipc") == 1.5
    assert _at(v, "speedup_v100_vs_k80") == 4.0 and _at(v, "speedup_p100_vs_k80") == 2.0
    assert _at(v, "log2_batch_size") == 6.0
    assert _at(v, "sens:LM (batch size 20)") == 0.7
    assert _at(v, "intens:LM (batch size 20)") == 0.9
    assert math.isnan(_at(v, "gpu_util_pct"))  # unknown stays unknown
    assert math.isnan(_at(v, "sens:ResNet-18 (batch size 64)"))


def test_job_type_is_the_repository_key_and_no_profile_is_all_unknown():
    repo = {"T": {"sens:LM (batch size 20)": 0.5}}
    assert _at(job_vector(Profile("other"), "T", repo), "sens:LM (batch size 20)") == 0.5
    assert all(math.isnan(x) for x in job_vector(None))


def test_speedups_of_rounded_run_times_give_equal_vectors():
    # Two jobs of one type whose run times were rounded differently: the cache must hit.
    a = Profile("a", gpu_time_s={"K80": 1000.0 / 3.0, "V100": 100.0 / 3.0})
    b = Profile("a", gpu_time_s={"K80": 333.333, "V100": 33.3333})
    assert job_vector(a) == job_vector(b)


def test_gpu_vector_is_the_catalogue_figures():
    v100 = gpu_spec("V100")
    assert gpu_vector(v100) == (v100.memory_mb, v100.sm_count, v100.dram_bw_gbps, v100.peak_gflops)
    assert len(GPU_FEATURES) == 4


def test_feature_space_min_max_missing_and_dropped_features():
    n = len(JOB_FEATURES)
    a = np.full((3, n), np.nan)
    b = np.full((3, n), np.nan)
    ipc = JOB_FEATURES.index("ipc")
    sm = JOB_FEATURES.index("sm_efficiency_pct")
    a[:, ipc] = [1.0, 2.0, 3.0]
    b[:, ipc] = [3.0, 2.0, 1.0]
    a[:, sm] = [50.0, np.nan, 100.0]
    b[:, sm] = [0.0, 100.0, np.nan]
    g = np.array(
        [gpu_vector(gpu_spec("V100")), gpu_vector(gpu_spec("K80")), gpu_vector(gpu_spec("V100"))]
    )
    space = FeatureSpace.fit(a, b, g)
    assert space.used_job_features == ("sm_efficiency_pct", "ipc")  # never-seen features dropped
    x = space.transform(a, b, g)
    # a side (sm, ipc), b side (sm, ipc), 4 GPU features, indicators for sm on both sides
    assert x.shape == (3, 2 + 2 + 4 + 2)
    assert x[:, 1].tolist() == [0.0, 0.5, 1.0]  # ipc min-max over both sides
    assert x[1, 0] == -1.0 and x[1, 8] == 1.0  # missing a.sm: -1 and its indicator
    assert x[0, 0] == 0.5 and x[0, 8] == 0.0
    assert x[2, 2] == -1.0 and x[2, 9] == 1.0  # missing b.sm
    assert set(np.round(x[:, 4], 6)) <= {0.0, 1.0}  # GPU memory scaled too
    assert len(space.names) == x.shape[1]

"""Estimated solo times on an unmeasured GPU model (scheduler.gpu_estimates): the catalogue's
bandwidth ratio for memory-bound codes, its FP32 ratio for compute-bound ones, their geometric
mean otherwise; and the note says which."""

from __future__ import annotations

import math

import pytest

from scheduler.catalog import gpu_spec
from scheduler.gpu_estimates import estimate_gpu_time, speed_ratio


def test_ratios_follow_the_catalogue():
    xp, a30 = gpu_spec("TitanXp"), gpu_spec("A30")
    bandwidth = a30.dram_bw_gbps / xp.dram_bw_gbps
    compute = a30.peak_gflops / xp.peak_gflops
    assert speed_ratio("TitanXp", "A30", "memory") == pytest.approx(bandwidth)
    assert speed_ratio("TitanXp", "A30", "compute") == pytest.approx(compute)
    assert speed_ratio("TitanXp", "A30") == pytest.approx(math.sqrt(bandwidth * compute))
    assert speed_ratio("TitanXp", "A30", "l1") == speed_ratio("TitanXp", "A30", None)
    assert speed_ratio("A30", "A30", "memory") == 1.0


def test_an_estimate_says_how_it_was_made():
    seconds, note = estimate_gpu_time(21.0, "TitanXp", "A30", "memory")
    assert seconds == pytest.approx(21.0 * 547.6 / 933.0, rel=5e-3)  # 3 significant digits
    assert "DRAM bandwidth" in note and "TitanXp" in note and "x1.70 faster" in note
    seconds, note = estimate_gpu_time(32.0, "TitanXp", "A30", "compute")
    assert seconds > 32.0 and "FP32 GFLOPS" in note  # the A30's FP32 peak is the lower one
    tiny, _note = estimate_gpu_time(0.04, "TitanXp", "A30", "memory")
    assert tiny > 0  # three significant digits, never rounded to nothing

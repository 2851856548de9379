"""The kernel-level model of K-Scheduler's scenario (scheduler.kernels)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler import kernels as K
from scheduler.classes import kernel_class
from scheduler.scenarios import SCENARIO_DIR


def test_profiles_carry_table7_and_its_classes():
    ps = K.kernel_profiles()
    assert len(ps) == 18
    for app, row in K.table7().items():
        assert kernel_class(ps[app]) == row.kind
    assert ps["QS"].registers_per_block == 15360 and ps["CUTCP"].smem_per_block_bytes == 4019


def test_saturation_points_match_the_thesis_observations():
    ps = K.kernel_profiles()
    assert {a: ps[a].saturation_tbs_per_sm for a in K.OBSERVED_KNEE} == dict(K.OBSERVED_KNEE)


def test_saturation_algorithm_on_a_hand_made_curve():
    # Gains of 50 %, 20 %, 3 %, 2 %: with Rate_tb = 5 % and a window of 2, j = 3 saturates.
    perf = [1.0, 1.5, 1.8, 1.854, 1.891, 1.9]
    assert K.saturation_point(perf, rate_tb=0.05, w_size=2) == 3
    # A later big jump inside the window keeps it from saturating early.
    assert K.saturation_point([1.0, 1.02, 1.5, 1.51, 1.52], rate_tb=0.05, w_size=2) == 3
    assert K.saturation_point([1.0, 1.02, 1.5, 1.51, 1.52], rate_tb=0.05, w_size=1) == 1
    with pytest.raises(ValueError):
        K.saturation_point([])


def test_static_limits_and_shares():
    qs = K.kernel_profiles()["QS"]
    assert K.static_tb_limit(qs.registers_per_block, qs.smem_per_block_bytes) == 4
    # At its saturation point QS holds 4 x 15360 registers of 65536: 94 % of an SM.
    assert K.share_for_saturation(qs) == 94
    lm = K.kernel_profiles()["LM"]
    assert K.tbs_for_share(lm, K.share_for_saturation(lm) / 100) == lm.saturation_tbs_per_sm


def test_solo_curve_fits_the_thesis_timings():
    # LavaMD: 64 ms with 1 block per SM, 58 ms at 2; CUTCP: 237 ms at 1, 46 ms at 10.
    lm, cutcp = K.kernel_profiles()["LM"], K.kernel_profiles()["CUTCP"]
    assert 58.0 / K.perf_table(lm)[0] == pytest.approx(64.0, rel=0.05)
    assert 46.0 / K.perf_table(cutcp)[0] == pytest.approx(237.0, rel=0.05)


def test_pair_model_stays_close_to_the_thesis_pairs():
    for a, b, thesis, model in K.pair_model_vs_thesis():
        assert model == pytest.approx(thesis, rel=0.15), (a, b)
    kappa, lam, rms = K.fit_contention(kappas=(2.6, 2.7, 2.8), lambdas=(9.5, 10.0, 10.5))
    assert (kappa, lam) == (K.KAPPA, K.LAMBDA) and rms < 0.06


def test_corun_orders_the_classes_as_the_thesis_observes():
    ps = K.kernel_profiles()
    cm = K.pair_speedup(ps["LM"], ps["SPMV"], (0.22, 0.32))
    mm = K.pair_speedup(ps["SPMV"], ps["BS"], (0.32, 0.45))
    l1 = K.pair_speedup(ps["LBM"], ps["LBM"], (0.37, 0.37))
    assert cm > 1.3 > 1.0 > mm and l1 < 1.0
    # Alone at its saturation share a kernel runs at its solo speed.
    assert K.corun_speeds([ps["STENCIL"]], [0.75]) == pytest.approx([1.0])


def test_scenario_profiles_file_is_the_generated_one():
    path = Path(SCENARIO_DIR) / "profiles" / "kscheduler003.yaml"
    assert path.read_text() == K.profiles_yaml_text()


def test_workloads_have_the_character_table9_gives():
    t7 = K.table7()
    classes = {w: [t7[a].kind for a in apps] for w, apps in K.WORKLOADS.items()}
    assert set(classes["W1"]) == {"compute"} and set(classes["W2"]) == {"memory"}
    assert classes["W3"].count("compute") == classes["W3"].count("memory") == 3
    assert classes["W4"].count("compute") == 2 * classes["W4"].count("memory")
    assert all(t7[a].epc > 1 for a in K.WORKLOADS["W5"])
    assert all(t7[a].epc < 1 for a in K.WORKLOADS["W6"])
    high = {w: sum(t7[a].epc > 1 for a in K.WORKLOADS[w]) for w in ("W7", "W8", "W9")}
    assert high == {"W7": 3, "W8": 2, "W9": 4}

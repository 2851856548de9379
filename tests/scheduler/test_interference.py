"""Interference models: measured (Gavel), class-based (§4), the mode convention and the registry."""

from __future__ import annotations

import csv
import math

import pytest

from scheduler.catalog import gpu_spec
from scheduler.domain import JobSpec, Profile, SharingMode, StallReasons
from scheduler.interference import (
    GAVEL_COLOCATION_CSV,
    ClassBasedInterference,
    InterferenceError,
    MeasuredInterference,
    NoInterference,
    apply_mode,
    build_interference,
    co_run_slowdown,
    combine_pairwise,
)

V100, P100, K80, A100 = (gpu_spec(m) for m in ("V100", "P100", "K80", "A100"))
MPS, TS = SharingMode.MPS, SharingMode.TIME_SLICING


def _job(job_type: str | None = None, cm: float | None = None, **kw) -> JobSpec:
    profile = Profile(job_type or "p", cm_ratio=cm, **kw) if cm is not None or kw else None
    return JobSpec(id=job_type or "j", job_type=job_type, profile=profile)


def _row(gpu_type: str, a: str, b: str) -> dict[str, str]:
    with open(GAVEL_COLOCATION_CSV, newline="") as f:
        for row in csv.DictReader(f):
            if (row["gpu_type"], row["job_a"], row["job_b"]) == (gpu_type, a, b):
                return row
    raise AssertionError(f"no row {gpu_type} {a} {b}")


A3C, GAN = "A3C", "CycleGAN"
R18_16, R18_256 = "ResNet-18 (batch size 16)", "ResNet-18 (batch size 256)"
R50_64, R50_128 = "ResNet-50 (batch size 64)", "ResNet-50 (batch size 128)"


@pytest.fixture(scope="module")
def measured() -> MeasuredInterference:
    return MeasuredInterference()


@pytest.mark.parametrize(("gpu", "gpu_type"), [(V100, "v100"), (P100, "p100"), (K80, "k80")])
def test_measured_is_inverse_of_norm_in_both_orientations(measured, gpu, gpu_type):
    row = _row(gpu_type, A3C, GAN)
    a3c, gan = _job(A3C), _job(GAN)
    assert measured.slowdown(a3c, [gan], gpu, MPS) == pytest.approx(1 / float(row["norm_a"]))
    assert measured.slowdown(gan, [a3c], gpu, MPS) == pytest.approx(1 / float(row["norm_b"]))


def test_measured_slowdowns_differ_by_gpu_model(measured):
    a3c, gan = _job(A3C), _job(GAN)
    values = {g.model: measured.slowdown(a3c, [gan], g, MPS) for g in (V100, P100, K80)}
    assert len(set(values.values())) == 3


def test_measured_infeasible_pair_is_inf(measured):
    assert _row("v100", R50_64, R50_128)["feasible"] == "0"
    assert math.isinf(measured.slowdown(_job(R50_64), [_job(R50_128)], V100, MPS))
    assert math.isinf(measured.slowdown(_job(R50_128), [_job(R50_64)], V100, TS))


def test_measured_three_jobs_add_pairwise_excess(measured):
    job, b, c = _job(A3C), _job(GAN), _job(R18_256)
    sb = measured.slowdown(job, [b], V100, MPS)
    sc = measured.slowdown(job, [c], V100, MPS)
    assert measured.slowdown(job, [b, c], V100, MPS) == pytest.approx(1 + (sb - 1) + (sc - 1))


def test_measured_missing_gpu_uses_overall_median_or_default():
    m = MeasuredInterference()
    s = m.slowdown(_job(A3C), [_job(GAN)], A100, MPS)
    assert 1.4 < s < 1.9  # between the per-GPU medians, not a measured pair
    assert m.misses == 1
    m2 = MeasuredInterference(default_slowdown=1.25)
    assert m2.slowdown(_job(A3C), [_job(GAN)], A100, MPS) == 1.25
    assert m2.slowdown(_job(None), [_job(GAN)], V100, MPS) == 1.25


def test_measured_gpu_alias_borrows_a_measured_model():
    m = MeasuredInterference(gpu_types={"A100": "v100"})
    direct = MeasuredInterference().slowdown(_job(A3C), [_job(GAN)], V100, MPS)
    assert m.slowdown(_job(A3C), [_job(GAN)], A100, MPS) == pytest.approx(direct)


def test_measured_fallback_model_for_unknown_pairs():
    m = MeasuredInterference(fallback="class_based")
    mem1, mem2 = _job("mine-1", cm=3.0), _job("mine-2", cm=4.0)
    assert m.slowdown(mem1, [mem2], V100, MPS) == pytest.approx(1.9)
    # Known pairs still come from the table.
    known = MeasuredInterference().slowdown(_job(A3C), [_job(GAN)], V100, MPS)
    assert m.slowdown(_job(A3C), [_job(GAN)], V100, MPS) == pytest.approx(known)


def test_mode_convention(measured):
    a3c, gan = _job(A3C), _job(GAN)
    mps = measured.slowdown(a3c, [gan], V100, MPS)
    assert measured.slowdown(a3c, [gan], V100, SharingMode.MIG) == 1.0
    assert measured.slowdown(a3c, [gan], V100, SharingMode.EXCLUSIVE) == 1.0
    assert measured.slowdown(a3c, [], V100, MPS) == 1.0
    assert measured.slowdown(a3c, [gan], V100, TS) == pytest.approx(max(1.0, mps / 2))
    # The interference part of the worst K80 pair exceeds the time share.
    worst = ClassBasedInterference(mm=3.0, cc=2.0, mc=1.0)
    m, m2 = _job("a", cm=1.0), _job("b", cm=2.0)
    assert worst.slowdown(m, [m2], K80, TS) == pytest.approx(1.5)


def test_apply_mode_and_total():
    assert apply_mode(1.6, 2, MPS) == 1.6
    assert apply_mode(1.6, 2, TS) == 1.0
    assert apply_mode(3.0, 2, TS) == 1.5
    assert apply_mode(math.inf, 2, TS) == math.inf
    assert apply_mode(3.0, 1, MPS) == 1.0
    model = NoInterference()
    a, b = _job("a"), _job("b")
    assert co_run_slowdown(model, a, [b], V100, TS, context_switch_overhead=0.1) == pytest.approx(
        2.2
    )
    assert co_run_slowdown(model, a, [b], V100, MPS) == 1.0


def test_combine_pairwise():
    assert combine_pairwise([]) == 1.0
    assert combine_pairwise([1.5, 1.2]) == pytest.approx(1.7)
    assert combine_pairwise([1.5, math.inf]) == math.inf


def test_class_based_order_mm_worst_cc_middle_mc_best():
    model = ClassBasedInterference()
    c1, c2 = _job("c1", cm=18.49), _job("c2", cm=11.13)  # Table 3: C
    m1, m2 = _job("m1", cm=9.04), _job("m2", cm=3.69)  # Table 3: M
    mm = model.slowdown(m1, [m2], V100, MPS)
    cc = model.slowdown(c1, [c2], V100, MPS)
    mc = model.slowdown(m1, [c1], V100, MPS)
    cm = model.slowdown(c1, [m1], V100, MPS)
    assert mm > cc > mc
    assert mc == cm


def test_class_based_uses_factors_and_fallbacks():
    model = ClassBasedInterference(mm=2.5, cc=1.7, mc=1.1, unknown=1.33)
    c = _job("c", sm_efficiency_pct=90.0, mem_util_pct=5.0)  # C/M 18 -> C
    kernel_mem = JobSpec(
        id="k", profile=Profile("k", stall=StallReasons(memory_dependency=70.0))
    )  # §3 memory -> M
    assert model.slowdown(c, [kernel_mem], V100, MPS) == pytest.approx(1.1)
    assert model.slowdown(kernel_mem, [kernel_mem], V100, MPS) == pytest.approx(2.5)
    assert model.slowdown(c, [_job("nothing")], V100, MPS) == pytest.approx(1.33)


def test_class_based_rejects_factors_out_of_order():
    with pytest.raises(InterferenceError, match="order"):
        ClassBasedInterference(mm=1.1, cc=1.5, mc=1.2)


def test_registry_builds_by_name_and_reports_unknown():
    assert isinstance(build_interference("measured"), MeasuredInterference)
    assert isinstance(build_interference("class_based", mm=2.0), ClassBasedInterference)
    assert build_interference("none").slowdown(_job("a"), [_job("b")], V100, MPS) == 1.0
    with pytest.raises(InterferenceError, match="known: class_based, learned, measured, none"):
        build_interference("trained")
    with pytest.raises(InterferenceError, match="none"):
        build_interference("none", factor=2)

"""The simulator's sharing model and MIG layout book (scheduler.simulator.sharing)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from scheduler.catalog import CATALOG, MigLayoutError
from scheduler.cluster_spec import parse_cluster_spec
from scheduler.domain import Decision, JobSpec, Placement, Plan, Profile, SharingMode
from scheduler.interference import build_interference
from scheduler.kernels import corun_speeds, kernel_profiles
from scheduler.simulator import SimConfig, simulate
from scheduler.simulator.sharing import MigBook, SharingModel, sensitivity_exponent
from tests.scheduler.sim_helpers import Scripted

A30, V100, TITAN = CATALOG["A30"], CATALOG["V100"], CATALOG["TitanXp"]
MPS, MIG, TS = SharingMode.MPS, SharingMode.MIG, SharingMode.TIME_SLICING


def dl(id, sensitivity=None, cm=None):
    return JobSpec(id=id, profile=Profile(id, sensitivity=sensitivity, cm_ratio=cm))


def test_sensitivity_exponent_spans_a_quarter_to_the_whole_gpu():
    assert sensitivity_exponent(4.0) == pytest.approx(1.0)  # linear: 4x the SMs, 4x the speed
    assert sensitivity_exponent(2.0) == pytest.approx(0.5)
    assert sensitivity_exponent(1.0) == 0.0
    assert sensitivity_exponent(9.0) == 1.0  # clamped
    assert sensitivity_exponent(None, default=0.7) == 0.7


def test_mig_speed_is_share_to_alpha_less_the_mig_overhead():
    model = SharingModel()
    job = dl("a", sensitivity=2.0)
    pl = Placement("a", "n", (0,), MIG, mig_profile="1g.6gb")
    assert model.gpu_factor(job, pl, A30, MIG, []) == pytest.approx(0.25**0.5 * 0.92)
    big = Placement("a", "n", (0,), MIG, mig_profile="4g.24gb")
    assert model.gpu_factor(job, big, A30, MIG, []) == pytest.approx(0.92)
    # Isolation: co-runners in other instances change nothing.
    other = (dl("b", cm=1.0), pl)
    assert model.gpu_factor(job, pl, A30, MIG, [other]) == pytest.approx(0.25**0.5 * 0.92)


def test_time_slicing_takes_turns_with_overhead():
    model = SharingModel()
    job = dl("a", sensitivity=1.2)
    co = [(dl("b"), None), (dl("c"), None)]
    assert model.gpu_factor(job, None, TITAN, TS, co, 0.05) == pytest.approx(1 / (3 * 1.05))
    assert model.gpu_factor(job, None, TITAN, TS, [], 0.05) == 1.0


def test_mps_shares_by_thread_percentage_then_class_interference():
    model = SharingModel()
    a, b = dl("a", sensitivity=2.0, cm=18.0), dl("b", sensitivity=4.0, cm=5.0)  # C and M
    pa = Placement("a", "n", (0,), MPS, mps_percentage=30)
    pb = Placement("b", "n", (0,), MPS, mps_percentage=60)
    # 30 + 60 <= 100: each gets its own percentage; C+M interferes by mc = 1.0.
    assert model.gpu_factor(a, pa, V100, MPS, [(b, pb)]) == pytest.approx(0.3**0.5)
    assert model.gpu_factor(b, pb, V100, MPS, [(a, pa)]) == pytest.approx(0.6)
    # Oversubscribed (no percentages = 100 each): shares in proportion, 1/2 each.
    assert model.gpu_factor(a, None, V100, MPS, [(b, None)]) == pytest.approx(0.5**0.5)
    # Two memory-intensive jobs: the SM split and mm = 1.35 on top.
    m1, m2 = dl("m1", sensitivity=4.0, cm=5.0), dl("m2", cm=5.0)
    assert model.gpu_factor(m1, None, V100, MPS, [(m2, None)]) == pytest.approx(0.5 / 1.35)


def test_percentages_are_ignored_before_volta():
    model = SharingModel()
    a, b = dl("a", sensitivity=4.0, cm=18.0), dl("b", sensitivity=4.0, cm=18.0)
    pa = Placement("a", "n", (0,), MPS, mps_percentage=90)
    pb = Placement("b", "n", (0,), MPS, mps_percentage=10)
    on_pascal = model.gpu_factor(a, pa, TITAN, MPS, [(b, pb)])
    assert on_pascal == pytest.approx(0.5 / 1.1)  # shared in proportion, cc = 1.1
    assert model.gpu_factor(a, pa, V100, MPS, [(b, pb)]) == pytest.approx(0.9 / 1.1)


def test_kernels_under_mps_use_the_kernel_model():
    ks = kernel_profiles()
    lm, spmv = JobSpec(id="lm", profile=ks["LM"]), JobSpec(id="spmv", profile=ks["SPMV"])
    limited = replace(TITAN, mps_thread_limit=True)
    pl = Placement("lm", "n", (0,), MPS, mps_percentage=22)
    ps = Placement("spmv", "n", (0,), MPS, mps_percentage=32)
    got = SharingModel().gpu_factor(lm, pl, limited, MPS, [(spmv, ps)])
    assert got == pytest.approx(corun_speeds([ks["LM"], ks["SPMV"]], [0.22, 0.32])[0])


def test_model_keeps_the_papers_class_order():
    with pytest.raises(ValueError, match="mc <= cc <= mm"):
        SharingModel(mm=1.0, cc=1.2)
    with pytest.raises(ValueError):
        build_interference("sharing", mig_overhead=1.5)


def test_mig_book_reuses_free_instances_and_charges_creation():
    book = MigBook(relayout_s=7.0)
    key = ("n", 0)
    first = Placement("a", "n", (0,), MIG, mig_profile="2g.12gb", mig_layout=("2g.12gb", "2g.12gb"))
    assert book.place(key, A30, "a", first) == 7.0  # re-layout of an idle GPU
    assert book.layout(key) == ("2g.12gb", "2g.12gb")
    assert book.place(key, A30, "b", Placement("b", "n", (0,), MIG, mig_profile="2g.12gb")) == 0
    book.release(key, "a")
    assert book.place(key, A30, "c", Placement("c", "n", (0,), MIG, mig_profile="2g.12gb")) == 0
    book.release(key, "c")
    # A 1g.6gb instance is not configured: it is created (the free 2g is dropped).
    assert book.place(key, A30, "d", Placement("d", "n", (0,), MIG, mig_profile="1g.6gb")) == 7.0
    assert sorted(book.layout(key)) == ["1g.6gb", "2g.12gb"]


def test_mig_book_refuses_layouts_that_drop_instances_in_use():
    book = MigBook(relayout_s=1.0)
    key = ("n", 0)
    book.place(key, A30, "a", Placement("a", "n", (0,), MIG, mig_profile="2g.12gb"))
    bad = Placement("b", "n", (0,), MIG, mig_profile="1g.6gb", mig_layout=("1g.6gb", "1g.6gb"))
    with pytest.raises(MigLayoutError, match="drops instance"):
        book.place(key, A30, "b", bad)
    with pytest.raises(MigLayoutError):
        book.place(key, A30, "c", Placement("c", "n", (0,), MIG, mig_profile="4g.24gb"))


def place(*placements: Placement) -> Scripted:
    """A policy that places each pending job as given (once it is pending)."""

    def plan(state, rng):
        pending = {j.id for j in state.pending}
        return Plan(
            decisions=tuple(
                Decision(p, "test", "scripted") for p in placements if p.job_id in pending
            )
        )

    return Scripted(plan)


def _a30():
    return parse_cluster_spec({"nodes": [{"name": "a", "gpu_model": "A30", "gpus_per_node": 1}]})


def test_simulator_charges_the_relayout_before_the_job_runs():
    job = JobSpec(
        id="a", gpu_memory_mb=1000, profile=Profile("a", gpu_time_s={"A30": 100.0}, sensitivity=4)
    )
    pl = Placement("a", "a-0", (0,), MIG, mig_profile="2g.12gb", mig_layout=("2g.12gb",))
    result = simulate(
        _a30(),
        [job],
        place(pl),
        interference=SharingModel(),
        config=SimConfig(mig_relayout_s=30.0),
    )
    (rec,) = result.jobs
    # 30 s creating the instance, then half the SMs at alpha 1, less 8 %: 100 / (0.5 * 0.92).
    assert rec.finish_s == pytest.approx(30.0 + 100.0 / (0.5 * 0.92))
    assert rec.end_reason == "completed"


def test_simulator_refuses_an_impossible_layout():
    from scheduler.simulator import PolicyDecisionError

    job = JobSpec(id="a", gpu_memory_mb=1000, profile=Profile("a", gpu_time_s={"A30": 10.0}))
    pl = Placement("a", "a-0", (0,), MIG, mig_profile="2g.12gb", mig_layout=("4g.24gb", "2g.12gb"))
    with pytest.raises(PolicyDecisionError, match="compute slices"):
        simulate(_a30(), [job], place(pl), interference=SharingModel())


def test_simulator_refuses_two_owners_under_mps():
    from scheduler.simulator import PolicyDecisionError

    v100 = parse_cluster_spec({"nodes": [{"name": "v", "gpu_model": "V100"}]})
    prof = Profile("p", gpu_time_s={"V100": 10.0})
    jobs = [
        JobSpec(id="a", gpu_memory_mb=100, profile=prof, owner="alice"),
        JobSpec(id="b", gpu_memory_mb=100, profile=prof, owner="bob"),
    ]
    policy = place(Placement("a", "v-0", (0,), MPS), Placement("b", "v-0", (0,), MPS))
    with pytest.raises(PolicyDecisionError, match="one unix user per GPU"):
        simulate(v100, jobs, policy, interference=SharingModel())
    assert math.isfinite(SharingModel().slowdown(jobs[0], [jobs[1]], V100, MPS))

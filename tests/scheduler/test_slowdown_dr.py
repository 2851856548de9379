"""The DR manager of ``slowdown_dr`` (paper 000, Algorithm 1) and its policy."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.catalog import gpu_spec
from scheduler.cluster_spec import parse_cluster_spec
from scheduler.domain import (
    ActionKind,
    ClusterState,
    DataParallelState,
    GpuState,
    JobKind,
    JobSpec,
    NodeKind,
    NodeState,
    Placement,
    Profile,
    RunningJob,
    SharingMode,
)
from scheduler.policies.base import PolicyError
from scheduler.policies.registry import build_policy
from scheduler.simulator.dataparallel import DpConfig, simulate_data_parallel
from scheduler.slowdown_dr import (
    DrJob,
    DrParams,
    RatioError,
    check_ratio,
    dr_update_sd,
    dr_update_util,
    largest_remainder,
    manage,
    split_by_ratio,
)


def table(**jobs: tuple[tuple[int, ...], float | None]) -> dict[str, DrJob]:
    return {k: DrJob(k, ratio, sd) for k, (ratio, sd) in jobs.items()}


# --- rounding and ratios ---------------------------------------------------------------


def test_paper_util_example_gives_1_2_7_0() -> None:
    # ALGORITHMS §5: [5,5,0,0], remaining capacity 10 %, 20 %, 80 % on GPU0..2 -> [1,2,7,0].
    assert dr_update_util((5, 5, 0, 0), [90, 80, 20, 50], gpu_min=2) == (1, 2, 7, 0)


def test_largest_remainder_keeps_the_sum_where_rounding_would_not() -> None:
    # Three equal thirds round to 3+3+3 = 9; the largest remainder gives the 10th to GPU 0.
    assert largest_remainder([1, 1, 1]) == (4, 3, 3)
    assert sum(round(x / 3 * 10) for x in (1, 1, 1)) == 9


@given(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=8))
def test_largest_remainder_always_sums_to_ten(weights: list[float]) -> None:
    out = largest_remainder(weights)
    assert sum(out) == 10 and all(0 <= v <= 10 for v in out)
    check_ratio(out)


@given(
    st.integers(0, 100_000),
    st.lists(st.integers(0, 10), min_size=1, max_size=8).filter(lambda r: sum(r) > 0),
)
def test_split_adds_up_exactly(total: int, ratio: list[int]) -> None:
    parts = split_by_ratio(total, ratio)
    assert sum(parts) == total
    assert all(p == 0 for p, r in zip(parts, ratio, strict=True) if r == 0)


@pytest.mark.parametrize("bad", [(5, 4), (11, -1), (5.0, 5.0), (), (True, 9)])
def test_check_ratio_refuses_bad_ratios(bad: tuple) -> None:
    with pytest.raises(RatioError):
        check_ratio(bad)


def test_dr_update_sd_moves_an_integer_within_bounds() -> None:
    # E_mbr = (1.9 - 1) / 10 = 0.09; r = (1.9 - (1.9 + 1.0) / 2) / 0.09 = 5
    assert dr_update_sd(1.9, (10, 0, 0), [1.9, 1.0, 1.4], 0, 2) == ((5, 0, 5), 5)
    # r larger than the source share is clamped to it
    new, r = dr_update_sd(3.0, (1, 9, 0), [3.0, 1.0], 0, 2)
    assert r == 1 and new == (0, 9, 1)
    # a job that is not slowed moves nothing
    assert dr_update_sd(1.0, (10, 0), [1.0, 1.0], 0, 1) == ((10, 0), 0)


# --- Algorithm 1 branches ----------------------------------------------------------------


def test_consolidates_when_jobs_do_not_outnumber_gpus() -> None:
    jobs = table(a=((5, 5, 0), 1.5), b=((0, 10, 0), 1.2))
    change = manage("a", jobs, [100, 100, 10])
    assert change.branch == "consolidate" and change.new == (0, 0, 10)
    assert "GPU 2" in change.explanation
    # a job already alone on its GPU keeps it
    jobs = table(a=((0, 0, 10), 1.5), b=((0, 10, 0), 1.2))
    assert not manage("a", jobs, [0, 100, 100]).changed


def test_keeps_ratio_unless_largest_sd_over_threshold() -> None:
    jobs = table(a=((10, 0), 1.2), b=((10, 0), 1.9), c=((0, 10), 1.0))
    assert manage("a", jobs, [100, 100]).branch == "keep"  # not the largest
    close = table(a=((10, 0), 1.45), b=((10, 0), 1.5), c=((0, 10), 1.42))
    keep = manage("b", close, [100, 100], DrParams(sd_threshold=0.1))
    assert not keep.changed and "SD_th" in keep.explanation


def test_slowdown_branch_explains_the_move() -> None:
    jobs = table(
        **{
            "41": ((10, 0, 0), 1.9),
            "b": ((10, 0, 0), 1.4),
            "c": ((0, 10, 0), 1.0),
            "d": ((0, 0, 10), 1.3),
        }
    )
    change = manage("41", jobs, [100, 95, 100])
    assert change.branch == "slowdown"
    # dest: GPU 1 (its jobs' mean SD 1.0); r = (1.9 - 1.45) / 0.09 = 5
    assert change.new == (5, 5, 0)
    assert change.explanation.startswith(
        "moved 5/10 of job 41's batch from GPU 0 to GPU 1: SD 1.90"
    )


def test_util_branch_when_gap_exceeds_threshold() -> None:
    jobs = table(
        a=((5, 5, 0, 0), 2.0),
        b=((10, 0, 0, 0), 1.0),
        c=((0, 10, 0, 0), 1.1),
        d=((0, 0, 0, 10), 1.0),
        e=((0, 0, 0, 10), 1.0),
    )
    change = manage("a", jobs, [90, 80, 20, 100], DrParams(util_threshold_pct=20))
    assert change.branch == "util" and change.new == (1, 2, 7, 0)
    same_gap_higher_threshold = manage(
        "a", jobs, [90, 80, 20, 100], DrParams(util_threshold_pct=80)
    )
    assert same_gap_higher_threshold.branch == "slowdown"


# --- the policy ------------------------------------------------------------------------------


def _state(
    ratios: dict[str, tuple[tuple[int, ...], float, bool]], util: list[float]
) -> ClusterState:
    spec = gpu_spec("V100")
    gpus = tuple(
        GpuState("n", g, spec, SharingMode.TIME_SLICING, util_pct=util[g]) for g in range(len(util))
    )
    running = tuple(
        RunningJob(
            JobSpec(k, profile=Profile(k, gpu_time_s={"V100": 100})),
            Placement(k, "n", (r.index(max(r)),), SharingMode.TIME_SLICING),
            0.0,
            data_parallel=DataParallelState(r, sd, 3, ended),
        )
        for k, (r, sd, ended) in ratios.items()
    )
    return ClusterState(10.0, (NodeState("n", NodeKind.GPU, 8, 8, gpus=gpus),), (), running)


def test_policy_answers_only_jobs_at_an_epoch_end() -> None:
    policy = build_policy("slowdown_dr")
    state = _state(
        {"a": ((10, 0), 2.0, False), "b": ((10, 0), 1.9, True), "c": ((0, 10), 1.0, False)},
        [100, 100],
    )
    assert policy.schedule(state, random.Random(0)).actions == ()  # b is not the largest
    state = _state(
        {"a": ((10, 0), 2.0, True), "b": ((10, 0), 1.9, False), "c": ((0, 10), 1.0, False)},
        [100, 100],
    )
    (action,) = policy.schedule(state, random.Random(0)).actions
    assert action.kind == ActionKind.SET_DATA_RATIO and action.job_id == "a"
    assert action.value == (5, 5) and action.policy == "slowdown_dr"
    assert "moved 5/10 of job a's batch from GPU 0 to GPU 1" in action.explanation


def test_policy_refuses_bad_settings() -> None:
    with pytest.raises(PolicyError):
        build_policy("slowdown_dr", {"util_threshold_pct": 150})
    with pytest.raises(PolicyError):
        build_policy("slowdown_dr", {"placement": "slowdown_dr"})
    with pytest.raises(PolicyError):
        build_policy("slowdown_dr", {"sd_threshold": -1})


# --- Table 1 of paper 000 ------------------------------------------------------------------


def _table1_jobs() -> list[JobSpec]:
    t = 600.0
    return [
        JobSpec(
            f"app{k}",
            kind=JobKind.DL_TRAIN,
            profile=Profile(f"app{k}", gpu_time_s={"QuadroRTX6000": k * t}, gpu_memory_max_mb=2048),
        )
        for k in (1, 2, 3)
    ]


def test_table1_static_sds_are_1_and_2_and_the_method_evens_them() -> None:
    """Solo times t, 2t, 3t on 2 GPUs: every static placement gives SDs {1, 2} while the
    three run together; ``slowdown_dr`` brings the completed jobs' SDs together (the fluid
    optimum with all three equal is 1.5; the paper's 1.66 is the static mean)."""
    cluster = parse_cluster_spec(
        {"nodes": [{"name": "n", "count": 1, "gpu_model": "QuadroRTX6000", "gpus_per_node": 2}]}
    )
    cfg = DpConfig(epochs=30, iterations_per_epoch=10, context_switch_overhead=0, split_overhead=0)
    static = simulate_data_parallel(
        cluster, _table1_jobs(), build_policy("loadbalance"), config=cfg
    )
    together = [s for s in static.samples if s.running == 3]
    assert together
    assert all(s.min_sd == pytest.approx(1.0, abs=0.02) for s in together)
    assert all(s.max_sd == pytest.approx(2.0, abs=0.02) for s in together)
    assert static.ratio_log == []

    dr = simulate_data_parallel(cluster, _table1_jobs(), build_policy("slowdown_dr"), config=cfg)
    assert dr.completed and static.completed
    sds = [j.slowdown for j in dr.jobs]
    static_sds = [j.slowdown for j in static.jobs]
    assert max(static_sds) == pytest.approx(2.0, abs=0.01)
    assert all(s is not None for s in sds)
    assert max(sds) < 1.7  # type: ignore[type-var]
    assert max(sds) - min(sds) < 0.5 * (max(static_sds) - min(static_sds))  # type: ignore[type-var,operator]
    assert dr.summary()["mean_job_sd"] < static.summary()["mean_job_sd"]
    assert dr.ratio_log and all("job app" in c.explanation for c in dr.ratio_log)
    for change in dr.ratio_log:
        assert sum(change.new) == 10

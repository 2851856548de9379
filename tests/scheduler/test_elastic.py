"""The autoscaling engine of seed 002 (scheduler/elastic.py) and the ``elastic`` policy."""

from __future__ import annotations

import random

import pytest

from scheduler import elastic as en
from scheduler.catalog import gpu_spec
from scheduler.domain import ActionKind, ClusterState, GpuState, JobSpec, Placement, RunningJob
from scheduler.policies.base import PolicyError
from scheduler.policies.registry import build_policy
from tests.scheduler.snapshots import check_plan, gpu_node, job

CFG = en.ElasticConfig(scale_step_workers=2, scale_interval_batches=20)


def run_windows(
    state: en.ElasticState, rate: float, n: int, ranks: tuple[float, ...] | None = None
) -> en.ElasticState:
    """Feed ``n`` windows of 10 mini-batches at job throughput ``rate`` steps/s."""
    for _ in range(n):
        per_rank = ranks if ranks is not None else (1.0,) * state.workers
        window = en.Window(state.workers, 10, 10 / rate, per_rank, remaining_steps=1e5)
        state = en.observe(state, window, CFG)
    return state


def walk(curve: dict[int, float], job_: en.ElasticJob, start: int, cfg=CFG, limit=20) -> list[int]:
    """Drive the engine over a throughput curve; the counts it visits, last = converged."""
    state = en.start(job_, start, 1e5)
    visited = [state.workers]
    for _ in range(limit):
        state = run_windows(state, curve[state.workers], 3)
        d = en.decide(state, job_, cfg)
        if d.kind == en.DecisionKind.HOLD:
            return visited
        assert d.kind == en.DecisionKind.SCALE
        state = en.changed(state, d.workers)
        visited.append(d.workers)
    raise AssertionError(f"no convergence: {visited}")


def test_scaling_efficiency_formula():
    # linear gain: doubling 2 -> 4 doubles the throughput
    assert en.scaling_efficiency(10.0, 20.0, 2, 2) == pytest.approx(1.0)
    assert en.scaling_efficiency(10.0, 10.0, 2, 2) == pytest.approx(0.0)
    assert en.scaling_efficiency(10.0, 8.0, 4, 4) == pytest.approx(-0.2)
    # half the linear gain: R 10 at 4 workers, +4 workers add 5
    assert en.scaling_efficiency(10.0, 15.0, 4, 4) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        en.scaling_efficiency(1.0, 2.0, 0, 1)


def test_grows_while_s_holds_and_falls_back_to_the_best_point():
    # 2 -> 4 gains 0.9 of linear, 4 -> 6 gains 0.05 of linear (< 0.1): back to 4
    curve = {2: 10.0, 4: 19.0, 6: 19.0 + 0.05 * 2 * 19.0 / 4, 8: 19.5}
    visited = walk(curve, en.ElasticJob(1, 8), start=2)
    assert visited == [2, 4, 6, 4]


def test_recovers_from_an_over_allocation_by_probing_down():
    curve = {2: 10.0, 4: 19.0, 6: 19.5, 8: 19.6}
    visited = walk(curve, en.ElasticJob(2, 8), start=8)
    assert visited[0] == 8 and visited[-1] == 4
    # 4 -> 6 fails, so 4 is checked against 2 (unmeasured) before it is kept
    assert visited == [8, 6, 4, 2, 4]


def test_linear_curve_reaches_the_maximum_and_stays():
    curve = {w: 5.0 * w for w in range(1, 9)}
    assert walk(curve, en.ElasticJob(1, 8), start=2) == [2, 4, 6, 8]


def test_max_global_batch_caps_the_worker_count_and_sets_the_local_batch():
    job_ = en.ElasticJob(1, 16, local_batch=64, max_global_batch=256)
    assert job_.top == 4
    assert en.local_batch_size(2, 64, 256) == 128  # grows until the global batch is the max
    assert en.local_batch_size(4, 64, 256) == 64
    assert en.local_batch_size(8, 64, None) == 64  # no max: fixed
    curve = {w: 5.0 * w for w in range(1, 17)}
    assert walk(curve, job_, start=2) == [2, 4]


def test_value_per_hour_utility_stops_growth_that_is_not_worth_its_cost():
    # S = 0.8 passes condition 1, but an hour sooner is worth only 0.1 GPU-hours
    curve = {2: 10.0, 4: 18.0}
    cheap = en.ElasticJob(1, 4, en.Utility(en.UtilityKind.VALUE_PER_HOUR, value_per_hour=0.1))
    assert walk(curve, cheap, start=2) == [2, 4, 2]
    dear = en.ElasticJob(1, 4, en.Utility(en.UtilityKind.VALUE_PER_HOUR, value_per_hour=100.0))
    assert walk(curve, dear, start=2) == [2, 4]


def test_deadline_utility_grows_only_to_meet_the_deadline():
    # 1e5 steps: 2 workers take 10,000 s, 4 take 5,556 s
    curve = {2: 10.0, 4: 18.0, 6: 26.0}
    tight = en.ElasticJob(2, 6, en.Utility(en.UtilityKind.DEADLINE, deadline_s=7000.0))
    visited = walk(curve, tight, start=2)
    assert visited[-1] == 4
    loose = en.ElasticJob(2, 6, en.Utility(en.UtilityKind.DEADLINE, deadline_s=50_000.0))
    assert walk(curve, loose, start=2)[-1] == 2


def test_holds_until_enough_batches_were_measured():
    state = en.start(en.ElasticJob(1, 8), 2, 1e5)
    state = run_windows(state, 10.0, 1)
    d = en.decide(state, en.ElasticJob(1, 8), CFG)
    assert d.kind == en.DecisionKind.HOLD and "measuring" in d.explanation
    # the first window after a change is skipped: nothing measured yet
    assert state.throughput_at(2) is None


def test_a_persistent_straggler_is_replaced_a_transient_one_is_not():
    job_ = en.ElasticJob(4, 4)
    state = en.start(job_, 4, 1e5)
    slow_once = run_windows(state, 10.0, 1, (1.0, 1.0, 0.5, 1.0))
    slow_once = run_windows(slow_once, 10.0, 3)
    assert en.stragglers(slow_once, CFG) == ()
    persistent = run_windows(state, 10.0, 4, (1.0, 1.0, 0.5, 1.0))
    assert en.stragglers(persistent, CFG) == (2,)
    d = en.decide(persistent, job_, CFG)
    assert d.kind == en.DecisionKind.REPLACE and d.ranks == (2,)
    assert "rank 2" in d.explanation and "0.8" in d.explanation
    fixed = en.replaced(persistent, d.ranks)
    assert en.stragglers(fixed, CFG) == ()
    assert fixed.throughput_at(4) is None  # measured again without the straggler


def test_no_decision_during_a_transition():
    state = en.begin_transition(run_windows(en.start(en.ElasticJob(1, 8), 2, 1e5), 10.0, 5))
    assert en.decide(state, en.ElasticJob(1, 8), CFG).kind == en.DecisionKind.HOLD


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError):
        en.ElasticConfig(scale_step_workers=0)
    with pytest.raises(ValueError):
        en.ElasticJob(4, 2)
    with pytest.raises(PolicyError):
        build_policy("elastic", {"straggler_ewma_alpha": 0.0})


# --- the policy on snapshots ------------------------------------------------------------------


def _running(spec: JobSpec, node: str, gpus: tuple[int, ...], state: en.ElasticState) -> RunningJob:
    return RunningJob(spec, Placement(spec.id, node, gpus), started_s=0.0, elastic=state)


def _busy(node: str, idx: int, job_id: str) -> GpuState:
    return GpuState(node, idx, gpu_spec("V100"), job_ids=(job_id,))


def test_policy_probes_up_when_gpus_are_idle_and_explains_with_s():
    spec = JobSpec("e1", gpus=2, elastic_min=1, elastic_max=8)
    measured = run_windows(en.start(en.elastic_job_of(spec), 2, 1e5), 10.0, 5)
    node = gpu_node("n1", "V100", 4, gpus={0: _busy("n1", 0, "e1"), 1: _busy("n1", 1, "e1")})
    state = ClusterState(0.0, (node,), (), (_running(spec, "n1", (0, 1), measured),))
    policy = build_policy("elastic", {"scale_interval_batches": 20})
    assert policy.step_for(state.running[0], state) == 4  # K = GPUs of the node
    # K = 4 would need 4 idle GPUs, there are 2: no action
    assert policy.schedule(state, random.Random(1)).actions == ()
    policy = build_policy("elastic", {"scale_interval_batches": 20, "scale_step_workers": 2})
    (action,) = policy.schedule(state, random.Random(1)).actions
    assert action.kind == ActionKind.SET_WORKERS and action.value["workers"] == 4
    assert "probe 4 workers (+2)" in action.explanation


def test_policy_does_not_grow_without_idle_gpus_and_places_pending_like_fifo():
    spec = JobSpec("e1", gpus=2, elastic_min=1, elastic_max=8)
    measured = run_windows(en.start(en.elastic_job_of(spec), 2, 1e5), 10.0, 5)
    node = gpu_node("n1", "V100", 3, gpus={0: _busy("n1", 0, "e1"), 1: _busy("n1", 1, "e1")})
    pending = job("p1", gpus=1)
    state = ClusterState(0.0, (node,), (pending,), (_running(spec, "n1", (0, 1), measured),))
    policy = build_policy("elastic", {"scale_interval_batches": 20, "scale_step_workers": 1})
    plan = policy.schedule(state, random.Random(1))
    check_plan(state, plan)
    assert [d.placement.job_id for d in plan.decisions] == ["p1"]
    assert plan.actions == ()  # the only idle GPU went to p1


def test_policy_replaces_a_straggling_rank():
    spec = JobSpec("e1", gpus=4, elastic_min=4, elastic_max=4)
    state_e = run_windows(en.start(en.elastic_job_of(spec), 4, 1e5), 10.0, 4, (1, 1, 1, 0.4))
    node = gpu_node("n1", "V100", 5, gpus={i: _busy("n1", i, "e1") for i in range(4)})
    state = ClusterState(0.0, (node,), (), (_running(spec, "n1", (0, 1, 2, 3), state_e),))
    (action,) = build_policy("elastic").schedule(state, random.Random(1)).actions
    assert action.kind == ActionKind.REPLACE_WORKERS and action.value == (3,)
    # without an idle GPU of the model for a spare, the straggler stays (no action)
    full = gpu_node("n1", "V100", 4, gpus={i: _busy("n1", i, "e1") for i in range(4)})
    state = ClusterState(0.0, (full,), (), (_running(spec, "n1", (0, 1, 2, 3), state_e),))
    assert build_policy("elastic").schedule(state, random.Random(1)).actions == ()


def test_a_window_held_down_by_a_straggler_is_not_a_measurement_of_the_count():
    cfg = en.ElasticConfig()
    state = run_windows(en.start(en.ElasticJob(1, 8), 3, 1e5), 30.0, 3, (1.0, 1.0, 1.0))
    assert state.throughput_at(3) == pytest.approx(30.0)
    slow = en.observe(state, en.Window(3, 10, 10 / 12.0, (1.0, 1.0, 0.4), 1e5, 0.0), cfg)
    assert slow.throughput_at(3) == pytest.approx(30.0)  # not folded in
    assert slow.straggler_ewma[2] < 1.0  # but the rank's average saw it
    mild = en.observe(state, en.Window(3, 10, 10 / 27.0, (1.0, 1.0, 0.9), 1e5, 0.0), cfg)
    assert mild.throughput_at(3) < 30.0  # above the threshold: a measurement


def test_policy_ignores_jobs_that_are_not_elastic_or_not_measured():
    plain = JobSpec("j1", gpus=1)
    node = gpu_node("n1", "V100", 4, gpus={0: _busy("n1", 0, "j1"), 1: _busy("n1", 1, "e1")})
    unmeasured = JobSpec("e1", gpus=1, elastic_min=1, elastic_max=4)
    state = ClusterState(
        0.0,
        (node,),
        (),
        (
            RunningJob(plain, Placement("j1", "n1", (0,)), 0.0),
            RunningJob(unmeasured, Placement("e1", "n1", (1,)), 0.0),
        ),
    )
    assert build_policy("elastic").schedule(state, random.Random(1)).actions == ()


def test_state_round_trips_through_json_and_malformed_state_is_ignored():
    import json

    state = run_windows(en.start(en.ElasticJob(1, 8), 4, 1e5), 10.0, 4, (1.0, 1.0, 0.5, 1.0))
    stored = json.loads(json.dumps(en.state_to_dict(state)))
    back = en.state_from_dict(stored)
    assert back is not None
    assert back.measured == state.measured and back.straggler_ewma == state.straggler_ewma
    assert (back.workers, back.batches_at_count) == (state.workers, state.batches_at_count)
    assert en.state_from_dict({}) is None
    assert en.state_from_dict({"workers": "four", "measured": []}) is None
    assert en.state_from_dict({"workers": 2}) is None


@pytest.mark.parametrize("seed", range(30))
def test_the_walk_always_settles_within_the_bounds(seed):
    rng = random.Random(seed)
    lo, hi = rng.randint(1, 3), rng.randint(4, 12)
    curve = {w: rng.uniform(1.0, 100.0) for w in range(1, 13)}
    job_ = en.ElasticJob(lo, hi)
    cfg = en.ElasticConfig(scale_step_workers=rng.randint(1, 3), scale_interval_batches=20)
    visited = walk(curve, job_, start=rng.randint(lo, hi), cfg=cfg, limit=60)
    assert all(lo <= w <= hi for w in visited)
    # where it settled, the step up (when there is room) was measured and fails condition 1
    k = cfg.scale_step_workers
    end, up = visited[-1], visited[-1] + k
    if up <= hi:
        assert up in visited
        assert en.scaling_efficiency(curve[end], curve[up], end, k) <= 0.1
    # and the step down to it (when there is room) was measured and holds
    down = end - k
    if down >= lo:
        assert down in visited
        assert en.scaling_efficiency(curve[down], curve[end], down, k) > 0.1

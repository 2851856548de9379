"""Execution model of the simulator: sharing modes, memory phases and OOM, pause/resume,
multi-GPU jobs, CPU placements, periodic rescheduling. Expected values are derived from the
model's definition in each test, not copied from output."""

from __future__ import annotations

import math

import pytest

from scheduler.domain import Decision, Placement, Plan, SharingMode
from scheduler.simulator import EndReason, OomAction, SimConfig, simulate
from tests.scheduler.sim_helpers import (
    FirstFit,
    FixedSlowdown,
    Scripted,
    cluster,
    job,
    pause,
    resume,
)

ONE_V100 = cluster({"name": "n", "gpu_model": "V100", "gpus_per_node": 1, "cpus": 8})
TWO_V100 = cluster({"name": "n", "gpu_model": "V100", "gpus_per_node": 2, "cpus": 8})


def records(result):
    return {r.job_id: r for r in result.jobs}


def test_exclusive_fifo_on_one_gpu_equals_sum_of_run_times():
    solos = [100.0, 50.0, 30.0, 7.5]
    jobs = [job(f"j{i}", s) for i, s in enumerate(solos)]
    result = simulate(ONE_V100, jobs, FirstFit())
    recs = records(result)
    elapsed = 0.0
    for i, s in enumerate(solos):
        elapsed += s
        assert recs[f"j{i}"].finish_s == pytest.approx(elapsed)
        assert recs[f"j{i}"].end_reason == "completed"
    assert max(r.finish_s for r in result.jobs) == pytest.approx(sum(solos))


@pytest.mark.parametrize("overhead", [0.0, 0.05, 0.2])
def test_time_slicing_two_identical_jobs_doubles_both_within_overhead(overhead):
    jobs = [job("a", 100.0), job("b", 100.0)]
    config = SimConfig(context_switch_overhead=overhead)
    result = simulate(ONE_V100, jobs, FirstFit(SharingMode.TIME_SLICING, per_gpu=2), config=config)
    for r in result.jobs:
        assert 2 * 100.0 - 1e-6 <= r.jct_s <= 2 * 100.0 * (1 + overhead) + 1e-6
        assert r.jct_s == pytest.approx(2 * 100.0 * (1 + overhead))
        assert r.mode == "time_slicing"


def test_mps_progress_follows_interference_and_speeds_up_when_alone():
    s = 1.5
    jobs = [job("short", 100.0), job("long", 200.0)]
    result = simulate(
        ONE_V100, jobs, FirstFit(SharingMode.MPS, per_gpu=2), interference=FixedSlowdown(s)
    )
    recs = records(result)
    t_short = 100.0 * s
    assert recs["short"].finish_s == pytest.approx(t_short)
    done_long = t_short / (200.0 * s)  # fraction of its work done while co-located
    assert recs["long"].finish_s == pytest.approx(t_short + (1 - done_long) * 200.0)
    assert recs["long"].slowdown == pytest.approx(recs["long"].finish_s / 200.0)


def test_slowdown_below_one_is_clamped():
    jobs = [job("a", 100.0), job("b", 100.0)]
    result = simulate(
        ONE_V100, jobs, FirstFit(SharingMode.MPS, per_gpu=2), interference=FixedSlowdown(0.5)
    )
    assert all(r.jct_s == pytest.approx(100.0) for r in result.jobs)


def test_mig_instance_runs_at_slice_share_without_interference():
    a30 = cluster({"name": "a", "gpu_model": "A30", "gpus_per_node": 1})
    jobs = [job("a", 100.0, model="A30", mem=5000), job("b", 100.0, model="A30", mem=5000)]
    policy = FirstFit(SharingMode.MIG, per_gpu=4, mig_profile="1g.6gb")
    result = simulate(
        a30,
        jobs,
        policy,
        interference=FixedSlowdown(3.0),
        config=SimConfig(mig_speed_exponent=1.0, mig_relayout_s=0.0),
    )
    slices = 1 / 4  # 1g of the A30's 4 compute slices
    for r in result.jobs:
        assert r.finish_s == pytest.approx(100.0 / slices)
        assert r.location == "a-0/0"


def _oom_jobs():
    # "a" holds 10,000 MB; "b" holds 1,000 MB for the first half of its work, then grows
    # linearly to 9,000 MB: together they pass the V100's 16,160 MB during b's second half.
    a = job("a", 100.0, mem=10_000)
    b = job("b", 100.0, steps=[(0.0, 1000, 1000), (0.5, 1000, 9000)])
    return a, b


def _oom_time() -> float:
    capacity = 16_160 - 10_000  # what is left for b
    progress = 0.5 + 0.5 * (capacity - 1000) / 8000
    return progress * 100.0  # b runs at solo speed (no interference)


def test_memory_growth_past_capacity_fails_the_growing_job():
    a, b = _oom_jobs()
    result = simulate(
        ONE_V100,
        [a, b],
        FirstFit(SharingMode.MPS, per_gpu=2),
        config=SimConfig(oom_action=OomAction.FAIL),
    )
    recs = records(result)
    assert result.oom_count == 1
    assert recs["b"].end_reason == EndReason.FAILED_OOM
    assert recs["b"].end_s == pytest.approx(_oom_time(), rel=1e-6)
    assert recs["b"].finish_s is None
    assert recs["a"].end_reason == EndReason.COMPLETED
    assert recs["a"].finish_s == pytest.approx(100.0)


def test_memory_growth_past_capacity_requeues_and_restarts_from_scratch():
    a, b = _oom_jobs()
    result = simulate(
        ONE_V100,
        [a, b],
        FirstFit(SharingMode.MPS, per_gpu=2),
        config=SimConfig(oom_action=OomAction.REQUEUE),
    )
    recs = records(result)
    assert result.oom_count == 1
    assert recs["b"].restarts == 1
    # Placed again at once, next to "a" until 100 s, then alone: restarts from zero at t_oom.
    assert recs["b"].finish_s == pytest.approx(_oom_time() + 100.0)
    assert recs["b"].end_reason == EndReason.COMPLETED


def test_requeue_gives_up_after_max_restarts():
    big = job("big", 50.0, steps=[(0.0, 1000, 30_000)])  # outgrows a V100 alone
    result = simulate(
        ONE_V100,
        [big],
        FirstFit(),
        config=SimConfig(oom_action=OomAction.REQUEUE, max_oom_restarts=2),
    )
    rec = result.jobs[0]
    assert rec.end_reason == EndReason.FAILED_OOM
    assert rec.oom_count == 3 and rec.restarts == 2
    assert result.oom_count == 3


def test_infeasible_colocation_kills_the_job_placed_last():
    jobs = [job("first", 100.0), job("second", 100.0)]
    result = simulate(
        ONE_V100,
        jobs,
        FirstFit(SharingMode.MPS, per_gpu=2),
        interference=FixedSlowdown(math.inf),
        config=SimConfig(oom_action=OomAction.FAIL),
    )
    recs = records(result)
    assert recs["second"].end_reason == EndReason.FAILED_OOM
    assert recs["first"].finish_s == pytest.approx(100.0)


def test_pause_stops_progress_but_keeps_memory():
    seen = {}

    def plan(state, rng):
        acts = []
        if state.now_s == 20.0:
            acts.append(pause("a"))
        if state.now_s == 50.0:
            acts.append(resume("a"))
        if state.now_s == 30.0:
            (gpu,) = state.node("n-0").gpus
            (rj,) = state.running
            seen.update(
                paused=rj.paused, used=gpu.used_memory_mb, util=gpu.util_pct, progress=rj.progress
            )
        decisions = tuple(
            Decision(Placement(j.id, "n-0", (0,)), "test", "only GPU") for j in state.pending
        )
        return Plan(decisions=decisions, actions=tuple(acts))

    result = simulate(
        ONE_V100,
        [job("a", 100.0, mem=3000)],
        Scripted(plan),
        config=SimConfig(reschedule_interval_s=10.0),
    )
    rec = result.jobs[0]
    assert rec.finish_s == pytest.approx(100.0 + 30.0)
    assert rec.paused_s == pytest.approx(30.0)
    assert seen["paused"] is True
    assert seen["used"] == pytest.approx(3000)
    assert seen["util"] == 0.0
    assert seen["progress"] == pytest.approx(0.2, abs=0.011)


def test_multi_gpu_job_runs_at_its_slowest_gpu():
    # "m" takes both GPUs under time-slicing; "s" shares GPU 0 with it.
    def plan(state, rng):
        out = []
        for j in state.pending:
            gpus = (0, 1) if j.gpus == 2 else (0,)
            out.append(Decision(Placement(j.id, "n-0", gpus, SharingMode.TIME_SLICING), "t", ""))
        return Plan(decisions=tuple(out))

    jobs = [job("m", 100.0, gpus=2), job("s", 50.0)]
    result = simulate(TWO_V100, jobs, Scripted(plan), config=SimConfig(context_switch_overhead=0.0))
    recs = records(result)
    # Both at half speed on GPU 0 until "s" is done (50 s of work at 1/2 speed).
    assert recs["s"].finish_s == pytest.approx(100.0)
    m_done = 100.0 * 0.5 / 100.0
    assert recs["m"].finish_s == pytest.approx(100.0 + (1 - m_done) * 100.0)


def test_cpu_placement_uses_cpu_time_and_cores():
    c = cluster(
        {"name": "g", "gpu_model": "V100", "gpus_per_node": 1},
        {"name": "cpu", "count": 1, "cpus": 2},
    )

    def plan(state, rng):
        free = state.node("cpu-0").free_cores
        return Plan(
            decisions=tuple(
                Decision(Placement(j.id, "cpu-0", (), cpus=1), "t", "cpu") for j in state.pending
            )[:free]
        )

    jobs = [job(f"c{i}", 10.0, cpu_time=300.0) for i in range(3)]
    result = simulate(c, jobs, Scripted(plan))
    finishes = sorted(r.finish_s for r in result.jobs)
    assert finishes == pytest.approx([300.0, 300.0, 600.0])  # 2 cores: two at a time
    assert {r.mode for r in result.jobs} == {"cpu"}
    assert all(r.location == "cpu-0/cpu" for r in result.jobs)


def test_unplaceable_job_ends_unschedulable_with_the_policys_reason():
    jobs = [job("two", 10.0, gpus=2), job("one", 10.0)]

    def plan(state, rng):
        decisions, waiting = [], {}
        for j in state.pending:
            if j.gpus == 1 and not state.running:
                decisions.append(Decision(Placement(j.id, "n-0", (0,)), "t", "fits"))
            else:
                waiting[j.id] = "needs 2 GPUs; this policy never places them"
        return Plan(decisions=tuple(decisions), waiting=waiting)

    # Admissible (the node has 2 GPUs), but the policy never places it.
    result = simulate(TWO_V100, jobs, Scripted(plan))
    recs = records(result)
    assert recs["one"].end_reason == EndReason.COMPLETED
    assert recs["two"].end_reason == EndReason.UNSCHEDULABLE
    assert "needs 2 GPUs" in recs["two"].explanation


def test_periodic_rescheduling_calls_the_policy_between_events():
    policy = FirstFit()
    config = SimConfig(reschedule_interval_s=25.0, max_idle_ticks=2)
    simulate(ONE_V100, [job("a", 100.0)], policy, config=config)
    for t in (25.0, 50.0, 75.0):
        assert t in policy.calls
    # Once nothing runs, ticks stop after max_idle_ticks calls that changed nothing.
    assert max(policy.calls) <= 100.0 + (config.max_idle_ticks + 1) * 25.0


def test_arrivals_wait_for_their_time_and_decision_latency_is_recorded():
    jobs = [job("a", 10.0, arrival=5.0), job("b", 10.0, arrival=40.0)]
    policy = FirstFit()
    result = simulate(ONE_V100, jobs, policy)
    recs = records(result)
    assert recs["a"].start_s == 5.0 and recs["b"].start_s == 40.0
    assert recs["b"].queue_s == 0.0
    assert len(result.decision_latency_s) == result.policy_calls >= 3
    assert all(x >= 0 for x in result.decision_latency_s)


def test_horizon_stops_the_run_and_marks_jobs_unfinished():
    jobs = [job("a", 100.0), job("b", 100.0, arrival=500.0)]
    result = simulate(ONE_V100, jobs, FirstFit(), config=SimConfig(max_time_s=50.0))
    assert {r.end_reason for r in result.jobs} == {EndReason.UNFINISHED}


def test_timeline_integrates_to_busy_gpu_seconds():
    jobs = [job("a", 100.0), job("b", 40.0, arrival=10.0)]
    result = simulate(TWO_V100, jobs, FirstFit())
    tl = result.timeline
    area = sum(p.busy_gpus * (q.t_s - p.t_s) for p, q in zip(tl, tl[1:], strict=False))
    assert area == pytest.approx(100.0 + 40.0)
    assert tl[-1].busy_gpus == 0 and tl[-1].queued == 0


def test_snapshots_rebuild_only_the_gpus_that_changed():
    # One node of two GPUs: a starts on GPU 0 at 0 s, b on GPU 1 at 10 s, c waits at 20 s.
    seen: dict[float, tuple] = {}
    policy = FirstFit(check=lambda state: seen.setdefault(state.now_s, state.nodes[0].gpus))
    c = cluster({"name": "v", "count": 1, "gpu_model": "V100", "gpus_per_node": 2})
    jobs = [job("a", 100.0), job("b", 100.0, arrival=10.0), job("c", 100.0, arrival=20.0)]
    simulate(c, jobs, policy)
    at0, at10, at20 = seen[0.0], seen[10.0], seen[20.0]
    assert at10[0].job_ids == ("a",) and at10[1] is at0[1]  # GPU 1 untouched: the same state
    assert at20[1].job_ids == ("b",) and at20[0] is at10[0]  # GPU 0 untouched since
    assert at20[0].util_pct == 100.0 and at20[1].util_pct == 100.0


@pytest.mark.parametrize("scenario", ["sharing001", "seed004", "coscheml003"])
def test_cached_node_snapshots_equal_a_rebuild_from_scratch(scenario: str) -> None:
    # MPS, time-slicing and MIG (sharing001), memory steps (seed004), co-location
    # (coscheml003): at every policy call, under every policy of the scenario.
    from scheduler.interference import build_interference
    from scheduler.policies.registry import build_policy
    from scheduler.scenarios import load_scenario
    from scheduler.simulator.engine import Simulator

    checks = []

    class Checked(Simulator):
        def _nodes_snapshot(self):  # type: ignore[no-untyped-def]
            got = super()._nodes_snapshot()
            kept, self.gpu_states = self.gpu_states, {}
            fresh = tuple(self._node_state(n) for n in self.nodes)
            self.gpu_states = kept
            assert got == fresh, self.now
            checks.append(self.now)
            return got

    sc = load_scenario(scenario)
    model = None if sc.interference in (None, "none") else build_interference(sc.interference)
    for name in sc.policies:
        policy = build_policy(name, sc.policy_params.get(name))
        Checked(sc.cluster, list(sc.jobs), policy, interference=model, config=sc.config).run()
    assert len(checks) > 50

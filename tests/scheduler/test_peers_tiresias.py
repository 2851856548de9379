"""``tiresias``: discretised 2D-LAS, non-clairvoyant, with its starvation guard."""

from __future__ import annotations

import random

import pytest

from scheduler.domain import ActionKind
from scheduler.policies.base import PolicyError
from scheduler.policies.registry import build_policy
from tests.scheduler.peer_snapshots import gpu_node, pjob, running_on, state
from tests.scheduler.snapshots import check_plan

H = 3600.0


def _one_gpu_with_a_runner(now: float, runner_started: float = 0.0):
    a = pjob("a", {"V100": 10 * H})
    b = pjob("b", {"V100": 10 * H}, arrival=10.0)
    node, ra = running_on(gpu_node("v0", "V100", 1), 0, a, runner_started)
    return state(now, [node], [b], [ra])


def test_a_job_is_demoted_past_its_threshold_and_preempted():
    policy = build_policy("tiresias", {"queue_threshold_gpu_s": 100.0, "queues": 2, "round_s": 0})
    early = _one_gpu_with_a_runner(50.0)
    plan = policy.schedule(early, random.Random(0))
    check_plan(early, plan)
    assert plan.actions == () and plan.decisions == ()  # both in Q0: a came first
    assert "Q0" in plan.waiting["b"]
    late = _one_gpu_with_a_runner(150.0)  # a has attained 150 GPU-s: Q1
    plan = policy.schedule(late, random.Random(0))
    check_plan(late, plan)
    assert [(a.kind, a.job_id) for a in plan.actions] == [(ActionKind.REQUEUE, "a")]
    assert [d.placement.job_id for d in plan.decisions] == ["b"]
    assert "Q1" in plan.actions[0].explanation


def test_attained_service_counts_gpus_times_seconds():
    policy = build_policy("tiresias", {"queue_threshold_gpu_s": 300.0, "queues": 2, "round_s": 0})
    big = pjob("big", {"V100": H}, gpus=4)
    node = gpu_node("v0", "V100", 4)
    for i in range(4):
        node, _ = running_on(node, i, big, 0.0)
    from scheduler.domain import Placement, RunningJob, SharingMode

    rj = RunningJob(big, Placement("big", "v0", (0, 1, 2, 3), SharingMode.EXCLUSIVE), 0.0)
    small = pjob("small", {"V100": H}, arrival=5.0)
    st = state(100.0, [node], [small], [rj])  # 4 GPUs x 100 s = 400 GPU-s >= 300: Q1
    plan = policy.schedule(st, random.Random(0))
    assert policy.queue_of(policy.service("big")) == 1
    assert [a.job_id for a in plan.actions] == ["big"]


def test_queues_grow_tenfold():
    policy = build_policy("tiresias", {"queue_threshold_gpu_s": 10.0, "queues": 4})
    assert policy.thresholds == (10.0, 100.0, 1000.0)
    assert [policy.queue_of(s) for s in (0, 9.9, 10, 99, 100, 5000)] == [0, 0, 1, 1, 2, 3]


def test_never_reads_job_lengths():
    # The first-come job runs first whatever its length (no SRTF by the back door).
    def snap(long_s: float):
        long = pjob("long", {"V100": long_s})
        short = pjob("short", {"V100": 60.0}, arrival=1.0)
        return state(2.0, [gpu_node("v0", "V100", 1)], [long, short])

    for length in (100 * H, 10.0):
        plan = build_policy("tiresias").schedule(snap(length), random.Random(0))
        assert [d.placement.job_id for d in plan.decisions] == ["long"]


def test_promote_knob_brings_a_starved_job_back_to_the_first_queue():
    policy = build_policy(
        "tiresias", {"queue_threshold_gpu_s": 100.0, "queues": 2, "promote_knob": 2.0, "round_s": 0}
    )
    # c ran for 500 s (Q1), was preempted at t=500 and waits; d runs in Q1 as well but came
    # later, and e (Q0) waits too.
    policy.attained.update({"c": 500.0})
    policy.last_run_s["c"] = 500.0
    policy.stopped_s["c"] = 500.0
    policy._last_now = 500.0
    c = pjob("c", {"V100": 10 * H})
    d = pjob("d", {"V100": 10 * H}, arrival=100.0)
    node, rd = running_on(gpu_node("v0", "V100", 1), 0, d, 500.0)
    policy.attained["d"] = 0.0
    # At 1000 s c has waited 500 s < 2 x 500 s: not promoted, still Q1.
    before = state(1000.0, [node], [c], [rd])
    policy.schedule(before, random.Random(0))
    assert policy.base.get("c") is None and policy.queue_of(policy.service("c")) == 1
    # At 1600 s c has waited 1100 s >= 2 x 500 s: promoted, its count restarts.
    policy2 = build_policy(
        "tiresias", {"queue_threshold_gpu_s": 100.0, "queues": 2, "promote_knob": 2.0, "round_s": 0}
    )
    policy2.attained.update({"c": 500.0, "d": 0.0})
    policy2.last_run_s["c"] = 500.0
    policy2.stopped_s["c"] = 500.0
    policy2._last_now = 1600.0
    after = state(1600.0, [node], [c], [rd])
    plan = policy2.schedule(after, random.Random(0))
    assert policy2.service("c") == 0.0 and policy2.queue_of(policy2.service("c")) == 0
    assert [d.placement.job_id for d in plan.decisions] == ["c"]
    assert "Q0" in plan.decisions[0].explanation


def test_no_preemption_between_decision_points():
    policy = build_policy(
        "tiresias", {"queue_threshold_gpu_s": 100.0, "queues": 2, "round_s": 360.0}
    )
    policy.schedule(_one_gpu_with_a_runner(0.0), random.Random(0))  # a decision point at 0
    plan = policy.schedule(_one_gpu_with_a_runner(150.0), random.Random(0))
    assert plan.actions == ()  # a is in Q1 but the next round is at 360 s
    plan = policy.schedule(_one_gpu_with_a_runner(400.0), random.Random(0))
    assert [a.job_id for a in plan.actions] == ["a"]
    assert policy.tick_interval_s == 360.0


@pytest.mark.parametrize(
    "params",
    [{"queue_threshold_gpu_s": 0}, {"queues": 0}, {"promote_knob": -1}, {"round_s": -1}],
)
def test_bad_parameters_are_refused(params):
    with pytest.raises(PolicyError):
        build_policy("tiresias", params)

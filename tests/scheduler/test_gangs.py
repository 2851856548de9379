"""Gangs: jobs larger than any node, placed whole over several nodes of one GPU model."""

from __future__ import annotations

import csv
import itertools
import random
import statistics

import pytest

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    UNCONSOLIDATED_SPEED,
    ClusterState,
    GpuState,
    JobSpec,
    Placement,
    Profile,
    RunningJob,
    SharingMode,
)
from scheduler.policies.registry import available_policies, build_policy
from scheduler.policies.working_view import WorkingView
from scheduler.traces import GAVEL_SOLO_CSV
from tests.scheduler.snapshots import GB, check_plan, gpu_node

PROFILE = Profile(
    "resnet x8",
    gpu_time_s={"V100": 3600.0, "K80": 14400.0},
    gpu_time_unconsolidated_s={"V100": 7200.0},
)


def gang(job_id: str, gpus: int, *, cpus: int = 1, profile: Profile | None = PROFILE) -> JobSpec:
    return JobSpec(id=job_id, gpus=gpus, cpus=cpus, gpu_memory_mb=GB, profile=profile)


def busy(node: str, indices, job_id: str = "r", model: str = "V100") -> dict[int, GpuState]:
    return {
        i: GpuState(node, i, gpu_spec(model), SharingMode.EXCLUSIVE, (job_id,), GB) for i in indices
    }


def plan_of(state: ClusterState, name: str = "fifo", **params):
    plan = build_policy(name, params).schedule(state, random.Random(0))
    check_plan(state, plan)
    return plan


def parts(plan, job_id: str) -> list[tuple[str, tuple[int, ...]]]:
    (d,) = [d for d in plan.decisions if d.placement.job_id == job_id]
    return [(p.node, p.gpu_indices) for p in d.placement.parts]


def test_a_job_larger_than_any_node_is_placed_whole_over_nodes_of_one_model():
    state = ClusterState(
        0.0,
        (gpu_node("v0", "V100", 4), gpu_node("k0", "K80", 4), gpu_node("v1", "V100", 4)),
        pending=(gang("g", 8),),
    )
    plan = plan_of(state)
    assert parts(plan, "g") == [("v0", (0, 1, 2, 3)), ("v1", (0, 1, 2, 3))]
    (d,) = plan.decisions
    assert d.placement.is_gang and d.placement.mode == SharingMode.EXCLUSIVE
    assert d.explanation.startswith("8 GPUs on v0 and v1: no single node has 8 V100")
    assert "unconsolidated speed 0.50x (measured)" in d.explanation


def test_all_or_nothing_never_a_partial_gang():
    # 7 idle V100 (and 4 idle K80 that the job may also use): 8 of one model are not there.
    state = ClusterState(
        0.0,
        (
            gpu_node("v0", "V100", 4),
            gpu_node("v1", "V100", 4, gpus=busy("v1", [0])),
            gpu_node("k0", "K80", 4),
        ),
        pending=(gang("g", 8),),
    )
    for name in available_policies():
        plan = plan_of(state, name)
        assert plan.decisions == (), name
        assert "needs 8 V100 at once on several nodes" in plan.waiting["g"], name


def test_no_two_half_placed_gangs():
    # 12 idle GPUs, two gangs of 8: one runs, the other waits whole (not 4 + 4 of each).
    state = ClusterState(
        0.0,
        tuple(gpu_node(f"v{i}", "V100", 4) for i in range(3)),
        pending=(gang("a", 8), gang("b", 8)),
    )
    for name in available_policies():
        plan = plan_of(state, name, backfill=True)
        assert [d.placement.gpu_count for d in plan.decisions] == [8], name
        assert set(plan.waiting) == {"b"}, name
        assert "4 idle" in plan.waiting["b"] and "4 more expected" in plan.waiting["b"], name


def test_fewest_nodes_first():
    # Idle counts 2, 4, 3, 4: the two nodes with 4 idle (2 nodes), not 2 + 3 + 3 (3 nodes).
    state = ClusterState(
        0.0,
        (
            gpu_node("n0", "V100", 4, gpus=busy("n0", [0, 1])),
            gpu_node("n1", "V100", 4),
            gpu_node("n2", "V100", 4, gpus=busy("n2", [0])),
            gpu_node("n3", "V100", 4),
        ),
        pending=(gang("g", 8),),
    )
    assert parts(plan_of(state), "g") == [("n1", (0, 1, 2, 3)), ("n3", (0, 1, 2, 3))]


def test_fullest_nodes_among_the_fewest():
    # 6 GPUs from idle counts 4, 3, 3: two nodes either way; 3 + 3 leaves no idle GPU behind
    # (4 + 3 would leave one), so the whole 4-idle node stays free for a 4-GPU job.
    state = ClusterState(
        0.0,
        (
            gpu_node("n0", "V100", 4),
            gpu_node("n1", "V100", 4, gpus=busy("n1", [0])),
            gpu_node("n2", "V100", 4, gpus=busy("n2", [3])),
        ),
        pending=(gang("g", 6),),
    )
    assert parts(plan_of(state), "g") == [("n1", (1, 2, 3)), ("n2", (0, 1, 2))]


def test_a_job_one_node_can_hold_is_never_spread():
    # A 6-GPU job and an 8-GPU node (busy): it waits for that node rather than taking the
    # 8 idle GPUs of the two 4-GPU nodes.
    state = ClusterState(
        0.0,
        (
            gpu_node("big", "V100", 8, gpus=busy("big", [0, 1, 2])),
            gpu_node("n0", "V100", 4),
            gpu_node("n1", "V100", 4),
        ),
        pending=(gang("g", 6),),
    )
    for name in available_policies():
        plan = plan_of(state, name)
        assert plan.decisions == (), name
        assert "on one node" in plan.waiting["g"], name


def test_gang_needs_the_cores_on_every_node():
    state = ClusterState(
        0.0,
        (
            gpu_node("n0", "V100", 4, cores=8),
            gpu_node("n1", "V100", 4, cores=2),  # not enough cores for the job
            gpu_node("n2", "V100", 4, cores=8),
        ),
        pending=(gang("g", 8, cpus=4),),
    )
    plan = plan_of(state)
    assert parts(plan, "g") == [("n0", (0, 1, 2, 3)), ("n2", (0, 1, 2, 3))]
    assert [p.cpus for p in plan.decisions[0].placement.parts] == [4, 4]


def test_waiting_gang_says_what_is_missing_and_when():
    # 5 idle V100; job 812 holds 3 more, half done, 3000 s solo: about 25 min left.
    r = JobSpec(
        id="812", gpus=3, gpu_memory_mb=GB, profile=Profile("x", gpu_time_s={"V100": 3000.0})
    )
    state = ClusterState(
        100.0,
        (gpu_node("v0", "V100", 4), gpu_node("v1", "V100", 4, gpus=busy("v1", [0, 1, 2], "812"))),
        pending=(gang("g", 8),),
        running=(RunningJob(r, Placement("812", "v1", (0, 1, 2)), started_s=0.0, progress=0.5),),
    )
    reason = plan_of(state).waiting["g"]
    assert reason == (
        "needs 8 V100 at once on several nodes (no node holds 8; the largest holds 4): 5 idle; "
        "3 more expected in about 25 min when job 812 is predicted to end"
    )


def test_waiting_gang_without_predictable_ends_says_so():
    r = JobSpec(id="812", gpus=3, gpu_memory_mb=GB)  # no profile: no predicted end
    state = ClusterState(
        100.0,
        (gpu_node("v0", "V100", 4), gpu_node("v1", "V100", 4, gpus=busy("v1", [0, 1, 2], "812"))),
        pending=(gang("g", 8, profile=None),),
        running=(RunningJob(r, Placement("812", "v1", (0, 1, 2)), started_s=0.0),),
    )
    reason = plan_of(state).waiting["g"]
    assert "5 idle; 3 more needed but only 0 of the 3 busy GPUs have a predicted end" in reason


def test_assumed_speed_when_the_profile_has_no_unconsolidated_time():
    prof = Profile("plain", gpu_time_s={"V100": 100.0})
    state = ClusterState(
        0.0,
        (gpu_node("v0", "V100", 4), gpu_node("v1", "V100", 4)),
        pending=(gang("g", 8, profile=prof),),
    )
    (d,) = plan_of(state).decisions
    assert f"unconsolidated speed {UNCONSOLIDATED_SPEED:.2f}x (assumed" in d.explanation
    (d,) = plan_of(state, unconsolidated_speed=0.5).decisions
    assert "unconsolidated speed 0.50x (assumed" in d.explanation


def test_default_unconsolidated_speed_is_the_median_of_the_data():
    cons: dict[tuple[str, str, str], float] = {}
    unc: dict[tuple[str, str, str], float] = {}
    with open(GAVEL_SOLO_CSV) as f:
        for row in csv.DictReader(f):
            key = (row["job_type"], row["scale_factor"], row["gpu_type"].split("_")[0])
            table = unc if row["gpu_type"].endswith("_unconsolidated") else cons
            table[key] = float(row["throughput"])
    ratios = [u / cons[k] for k, u in unc.items() if k[1] != "1" and u > 0 and cons.get(k)]
    assert len(ratios) == 165
    assert abs(statistics.median(ratios) - UNCONSOLIDATED_SPEED) < 0.005


def _brute_force(idle: list[int], cores_ok: list[bool], k: int) -> tuple[int, int] | None:
    """(nodes, idle GPUs left) of the most consolidated choice, by trying every subset."""
    usable = [c for c, ok in zip(idle, cores_ok, strict=True) if ok and c > 0]
    for m in range(1, len(usable) + 1):
        sums = [sum(s) for s in itertools.combinations(usable, m) if sum(s) >= k]
        if sums:
            return m, min(sums) - k
    return None


@pytest.mark.parametrize("seed", range(40))
def test_gang_choice_matches_brute_force(seed):
    rng = random.Random(seed)
    size = rng.choice([2, 4, 8])
    n = rng.randint(3, 9)
    nodes = []
    idle = []
    cores_ok = []
    for i in range(n):
        free = rng.randint(0, size)
        busy_idx = rng.sample(range(size), size - free)
        enough = rng.random() < 0.85
        nodes.append(
            gpu_node(f"n{i}", "V100", size, cores=8, gpus=busy(f"n{i}", busy_idx))
            if enough
            else gpu_node(f"n{i}", "V100", size, cores=1, gpus=busy(f"n{i}", busy_idx))
        )
        idle.append(free)
        cores_ok.append(enough)
    k = rng.randint(size + 1, max(size + 1, sum(idle)))
    view = WorkingView(ClusterState(0.0, tuple(nodes), pending=()), colocate=False)
    (sid,) = view.idle_pools or [0]
    cand = view.gang(sid, k, cpus=2)
    best = _brute_force(idle, cores_ok, k)
    if best is None:
        assert cand is None
        return
    assert cand is not None and len(cand.gpus) == k
    assert (len(cand.parts), cand.idle_left()) == best


def test_release_order_kept_in_step_with_reservations():
    # The sorted predicted releases are updated as the cycle places jobs, not rebuilt: they
    # must equal a fresh sort of the index after a busy cycle with gangs waiting.
    from benchmarks.decision_latency import build_state

    state = build_state(800, 120, gangs=True)
    for name in ("binpack", "fifo"):
        policy = build_policy(name, {"backfill": True})
        plan = policy.schedule(state, random.Random(0))
        view = policy._view
        assert view is not None and view._release is not None, name
        assert view._release_sorted, name  # some gang waited and asked for a prediction
        assert any(d.placement.is_gang for d in plan.decisions)
        for sid, (known, unknown) in view._release_sorted.items():
            entries = list(view._release[sid].values())
            assert known == sorted(e for e in entries if e is not None), name
            assert unknown == sum(1 for e in entries if e is None), name

"""``coscheml``: Algorithm 1 of thesis 003 (idle first, greedy lowest-interference pairs,
can_co_schedule) on tiny hand-built snapshots, with a table-driven interference model."""

from __future__ import annotations

import math
import random

import pytest

from scheduler import interference
from scheduler.domain import ClusterState, GpuState, JobSpec, Profile, SharingMode
from scheduler.policies.base import PolicyError
from scheduler.policies.registry import build_policy
from scheduler.traces import load_solo_throughputs
from tests.scheduler.snapshots import GB, busy_gpu, check_plan, gpu_node, job

# Concurrent slowdown of the first job type next to the second.
TABLE = {
    ("X", "A"): 1.1,
    ("A", "X"): 1.1,
    ("X", "B"): 1.5,
    ("B", "X"): 1.5,
    ("Y", "A"): 1.2,
    ("A", "Y"): 1.2,
    ("Y", "B"): 1.3,
    ("B", "Y"): 1.3,
    ("Z", "A"): math.inf,
    ("A", "Z"): math.inf,
    ("Z", "B"): 1.9,
    ("B", "Z"): 1.9,
}


class TableInterference:
    name = "table"

    def __init__(self) -> None:
        self.asked = 0

    def slowdown(self, job, co_runners, gpu, mode):
        if not co_runners:
            return 1.0
        self.asked += 1
        return interference.combine_pairwise(
            [TABLE.get((job.job_type, c.job_type), 1.4) for c in co_runners]
        )


@pytest.fixture(autouse=True)
def _table(monkeypatch):
    monkeypatch.setitem(interference.INTERFERENCE_MODELS, "table", TableInterference)


def typed(id: str, job_type: str, mem_gb: float = 2.0, **kw) -> JobSpec:
    return job(id, mem_gb, job_type=job_type, **kw)


def two_busy_gpus(pending, *, used_mb=None) -> ClusterState:
    a, b = typed("ra", "A"), typed("rb", "B")
    g0, run0 = busy_gpu("n0", 0, "V100", [a], SharingMode.MPS)
    g1, run1 = busy_gpu("n0", 1, "V100", [b], SharingMode.MPS)
    if used_mb is not None:
        g0 = GpuState(**{**{f: getattr(g0, f) for f in g0.__slots__}, "used_memory_mb": used_mb[0]})
        g1 = GpuState(**{**{f: getattr(g1, f) for f in g1.__slots__}, "used_memory_mb": used_mb[1]})
    return ClusterState(
        now_s=10.0,
        nodes=(gpu_node("n0", "V100", 2, gpus={0: g0, 1: g1}),),
        pending=tuple(pending),
        running=(*run0, *run1),
    )


def where(plan) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {d.placement.job_id: (d.placement.node, d.placement.gpu_indices) for d in plan.decisions}


def test_idle_gpus_first_in_cluster_order_then_pairs():
    state = ClusterState(
        now_s=0.0,
        nodes=(gpu_node("n0", "V100", 2),),
        pending=(typed("x", "X"), typed("y", "Y"), typed("z", "B")),
    )
    policy = build_policy("coscheml", {"predictor": "table"})
    plan = policy.schedule(state, random.Random(0))
    check_plan(state, plan)
    placed = where(plan)
    assert placed["x"] == ("n0", (0,)) and placed["y"] == ("n0", (1,))
    assert "an idle GPU, first of 2" in plan.decisions[0].explanation
    # z found no idle GPU: it is paired with x or y (both alone on their GPUs), lowest first.
    assert placed["z"][1] in ((0,), (1,))
    assert plan.decisions[2].placement.mode == SharingMode.MPS


def test_greedy_selection_takes_the_lowest_pair_first_not_queue_order():
    # Queue order is y, x. Alone, y would take A's GPU (1.2 < 1.3); but x-A (1.1) is the
    # lowest pair overall, so the greedy selection gives A's GPU to x and y goes next to B.
    state = two_busy_gpus([typed("y", "Y"), typed("x", "X")])
    plan = build_policy("coscheml", {"predictor": "table"}).schedule(state, random.Random(0))
    check_plan(state, plan)
    assert where(plan) == {"x": ("n0", (0,)), "y": ("n0", (1,))}
    by_job = {d.placement.job_id: d.explanation for d in plan.decisions}
    assert by_job["x"].startswith("paired with job ra (A) on n0/gpu0 under MPS")
    assert "predicted slowdown 1.10 (this job 1.10, job ra 1.10), lowest of 4 pairs" in by_job["x"]
    assert "rank 3 of 4 pairs" in by_job["y"]  # 1.1, 1.2 (y-A, skipped), 1.3
    assert "memory 4.0 of 15.8 GB (this job 2.0 + 2.0 held)" in by_job["x"]
    assert "model table interference" in by_job["x"]


def test_jobs_left_without_a_pair_wait_with_the_reason():
    state = two_busy_gpus([typed("x", "X"), typed("y", "Y"), typed("x2", "X")])
    plan = build_policy("coscheml", {"predictor": "table"}).schedule(state, random.Random(0))
    assert set(where(plan)) == {"x", "y"}
    reason = plan.waiting["x2"]
    assert "6 pairs with GPUs running one job ranked by predicted slowdown" in reason
    assert "went to lower-interference pairs; its best was 1.10" in reason


def test_predicted_infeasible_pairs_are_never_taken():
    state = two_busy_gpus([typed("z", "Z"), typed("z2", "Z")])
    plan = build_policy("coscheml", {"predictor": "table"}).schedule(state, random.Random(0))
    assert where(plan) == {"z": ("n0", (1,))}  # next to B; never next to A
    assert "z2" in plan.waiting


def test_can_co_schedule_counts_monitored_memory():
    # GPU 0 (resident A, committed 2 GB) is monitored at 14 GB in use: a 4 GB job would OOM.
    state = two_busy_gpus([typed("x", "X", mem_gb=4.0)], used_mb=(14 * GB, 1 * GB))
    plan = build_policy("coscheml", {"predictor": "table"}).schedule(state, random.Random(0))
    assert where(plan) == {"x": ("n0", (1,))}  # B's GPU despite the higher slowdown
    assert "memory 6.0 of 15.8 GB (this job 4.0 + 2.0 held)" in plan.decisions[0].explanation
    both_full = two_busy_gpus([typed("x", "X", mem_gb=4.0)], used_mb=(14 * GB, 13 * GB))
    plan = build_policy("coscheml", {"predictor": "table"}).schedule(both_full, random.Random(0))
    assert plan.decisions == ()
    assert "can_co_schedule predicts an OOM" in plan.waiting["x"]
    assert "in use, monitored" in plan.waiting["x"]


def test_margin_and_slowdown_limit():
    state = two_busy_gpus([typed("x", "X", mem_gb=4.0)])
    roomy = build_policy("coscheml", {"predictor": "table", "memory_margin_mb": 11 * GB})
    assert where(roomy.schedule(state, random.Random(0))) == {}
    capped = build_policy("coscheml", {"predictor": "table", "max_predicted_slowdown": 1.05})
    plan = capped.schedule(state, random.Random(0))
    assert plan.decisions == () and "above max_predicted_slowdown 1.05" in plan.waiting["x"]
    with pytest.raises(PolicyError, match="max_predicted_slowdown"):
        build_policy("coscheml", {"max_predicted_slowdown": 0.5})
    with pytest.raises(PolicyError, match="memory_margin_mb"):
        build_policy("coscheml", {"memory_margin_mb": -1})
    with pytest.raises(PolicyError, match="unknown interference model 'nope'"):
        build_policy("coscheml", {"predictor": "nope"})


def test_pair_values_are_memoised_per_cycle():
    state = two_busy_gpus([typed(f"x{i}", "X") for i in range(20)])
    policy = build_policy("coscheml", {"predictor": "table"})
    policy.schedule(state, random.Random(0))
    assert policy.model.asked <= 8  # 2 types x 2 directions x 2 GPUs, not per job


def gavel_job(id: str, job_type: str) -> JobSpec:
    times = load_solo_throughputs()[(job_type, 1)]
    profile = Profile(job_type, gpu_time_s={m: 1000.0 / t for m, t in times.items()})
    return JobSpec(id=id, profile=profile, job_type=job_type)


def test_learned_model_by_default_explains_with_the_model_name():
    a, b = gavel_job("ra", "ResNet-50 (batch size 64)"), gavel_job("rb", "A3C")
    g0, run0 = busy_gpu("n0", 0, "V100", [a], SharingMode.MPS)
    g1, run1 = busy_gpu("n0", 1, "V100", [b], SharingMode.MPS)
    state = ClusterState(
        now_s=0.0,
        nodes=(gpu_node("n0", "V100", 2, gpus={0: g0, 1: g1}),),
        pending=(gavel_job("p", "LM (batch size 20)"),),
        running=(*run0, *run1),
    )
    policy = build_policy("coscheml")
    plan = policy.schedule(state, random.Random(0))
    assert len(plan.decisions) == 1
    text = plan.decisions[0].explanation
    assert "paired with job r" in text and "model builtin-forest (forest" in text
    # The choice is the pair the model ranks lower.
    model = policy.model
    value = {
        gpu: (
            model.slowdown(state.pending[0], [r], g.spec, SharingMode.MPS)
            + model.slowdown(r, [state.pending[0]], g.spec, SharingMode.MPS)
        )
        / 2
        for gpu, r, g in ((0, a, g0), (1, b, g1))
    }
    chosen = plan.decisions[0].placement.gpu_indices[0]
    assert value[chosen] == min(value.values())
    assert f"predicted slowdown {value[chosen]:.2f}" in text

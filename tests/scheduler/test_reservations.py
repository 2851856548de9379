"""EASY reservations (the framework's ``reserve`` parameter): the first waiting multi-GPU job
gets the GPUs predicted idle first, and later jobs may not delay it.

The snapshots: V100 nodes of 4 GPUs (a job of 8 is a gang over two); running jobs with a
profiled solo time, started at 0, at ``now`` 0, so each is predicted to end after its solo
time. Expected values follow from the rules in the framework's module docstring."""

from __future__ import annotations

import random

import pytest

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ClusterState,
    GpuState,
    JobSpec,
    NodeState,
    Placement,
    Profile,
    RunningJob,
    SharingMode,
)
from scheduler.policies.registry import available_policies, build_policy, policy_class
from scheduler.simulator import simulate
from tests.scheduler import sim_helpers
from tests.scheduler.snapshots import GB, check_plan, gpu_node
from tests.scheduler.test_policies_contract import SNAPSHOTS

V100 = gpu_spec("V100")


def timed(job_id: str, seconds: float | None, gpus: int = 1, **extra) -> JobSpec:
    """A job predicted to run ``seconds`` on a V100 (None: no profiled time)."""
    profile = Profile(f"p-{job_id}", gpu_time_s={"V100": seconds}) if seconds else None
    return JobSpec(id=job_id, gpus=gpus, gpu_memory_mb=GB, profile=profile, **extra)


def node(name: str, busy: dict[int, str]) -> NodeState:
    """A node of 4 V100; ``busy`` maps a GPU index to the job running on it."""
    gpus = {
        i: GpuState(name, i, V100, SharingMode.EXCLUSIVE, (job_id,), GB)
        for i, job_id in busy.items()
    }
    return gpu_node(name, "V100", 4, cores=16, gpus=gpus)


def state(nodes: list[NodeState], ends: dict[str, float], pending: list[JobSpec]) -> ClusterState:
    """``ends``: each running job's predicted end (its solo time; started at 0, now 0)."""
    running = []
    for job_id, end in ends.items():
        keys = [(n.name, g.index) for n in nodes for g in n.gpus if job_id in g.job_ids]
        by_node: dict[str, list[int]] = {}
        for name, idx in keys:
            by_node.setdefault(name, []).append(idx)
        (name, idxs), *more = by_node.items()
        assert not more, "one node per running job in these snapshots"
        placement = Placement(job_id, name, tuple(idxs))
        running.append(RunningJob(timed(job_id, end, len(idxs)), placement, started_s=0.0))
    return ClusterState(0.0, tuple(nodes), tuple(pending), tuple(running))


def plan_of(st: ClusterState, reserve: bool, name: str = "binpack"):
    plan = build_policy(name, {"reserve": reserve}).schedule(st, random.Random(0))
    check_plan(st, plan)
    return plan


def where(plan, job_id: str) -> list[tuple[str, tuple[int, ...]]] | None:
    for d in plan.decisions:
        if d.placement.job_id == job_id:
            return [(p.node, p.gpu_indices) for p in d.placement.parts]
    return None


# v0 busy until 3,600 s (job r0), v1 has 2 idle GPUs and 2 busy until 1,800 s (r1): the gang
# of 8 is predicted to start at 3,600 s on v0 and v1 (4 GPUs idle by then on each). v2, when
# present, has 2 idle GPUs and 2 busy for long (r2): outside the reservation.
def two_nodes(pending: list[JobSpec], *, third: bool = False) -> ClusterState:
    nodes = [node("v0", {0: "r0", 1: "r0", 2: "r0", 3: "r0"}), node("v1", {2: "r1", 3: "r1"})]
    ends = {"r0": 3600.0, "r1": 1800.0}
    if third:
        nodes.append(node("v2", {2: "r2", 3: "r2"}))
        ends["r2"] = 20_000.0
    return state(nodes, ends, pending)


POLICIES = ["binpack", "loadbalance", "mystic", "placement_rate", "random"]


@pytest.mark.parametrize("name", POLICIES)
def test_a_long_job_does_not_take_a_reserved_gpu(name):
    st = two_nodes([timed("gang", 7200.0, gpus=8), timed("long", 7200.0)])
    assert where(plan_of(st, False, name), "long") is not None  # backfill alone: it starts
    plan = plan_of(st, True, name)
    assert where(plan, "long") is None
    assert "would delay job gang's reservation" in plan.waiting["long"]


@pytest.mark.parametrize("name", POLICIES)
def test_a_job_predicted_to_end_before_the_reservation_uses_a_reserved_gpu(name):
    st = two_nodes([timed("gang", 7200.0, gpus=8), timed("short", 3000.0)])
    plan = plan_of(st, True, name)
    assert where(plan, "short") in ([("v1", (0,))], [("v1", (1,))])
    assert "holds a reservation of 8 V100 on v0/gpu0,1,2,3 + v1/gpu0,1,2,3" in plan.waiting["gang"]


@pytest.mark.parametrize("name", POLICIES)
def test_a_job_outside_the_reservation_still_starts(name):
    st = two_nodes([timed("gang", 7200.0, gpus=8), timed("long", 7200.0)], third=True)
    plan = plan_of(st, True, name)
    assert where(plan, "long") in ([("v2", (0,))], [("v2", (1,))])
    assert "holds a reservation of 8 V100 on v0/gpu0,1,2,3 + v1/gpu0,1,2,3" in plan.waiting["gang"]


def test_the_reservation_is_the_earliest_predicted_start_on_the_fewest_nodes():
    # Predicted idle: v1 two now and two at 1,800 s, v0 four at 3,600 s, v2 two now: the
    # 8th GPU is idle at 3,600 s; by then v0 and v1 have 4 each (v2 only 2).
    st = two_nodes([timed("gang", 7200.0, gpus=8)], third=True)
    reason = plan_of(st, True).waiting["gang"]
    assert reason.startswith(
        "holds a reservation of 8 V100 on v0/gpu0,1,2,3 + v1/gpu0,1,2,3, predicted idle in "
        "about 60 min, when job r0 is predicted to end; jobs behind it may start on these GPUs "
        "only if predicted to end by then; needs 8 V100 at once on several nodes"
    )
    assert "holds a reservation" not in plan_of(st, False).waiting["gang"]


def test_a_job_whose_run_time_is_unknown_only_uses_gpus_outside_the_reservation():
    unknown = timed("unknown", None)
    st = two_nodes([timed("gang", 7200.0, gpus=8), unknown])
    plan = plan_of(st, True)
    assert where(plan, "unknown") is None
    assert plan.waiting["unknown"] == (
        "would delay job gang's reservation (8 V100 on v0/gpu0,1,2,3 + v1/gpu0,1,2,3, predicted "
        "idle in about 60 min, when job r0 is predicted to end): it fits now only on those "
        "GPUs, and its run time cannot be predicted (no profiled time on V100 and no time limit)"
    )
    st3 = two_nodes([timed("gang", 7200.0, gpus=8), unknown], third=True)
    assert where(plan_of(st3, True), "unknown") in ([("v2", (0,))], [("v2", (1,))])
    # A time limit is a prediction (an upper bound): short enough, it may use them.
    limited = JobSpec(id="limited", gpu_memory_mb=GB, time_limit_s=600.0)
    st = two_nodes([timed("gang", 7200.0, gpus=8), limited])
    assert where(plan_of(st, True), "limited") is not None


def test_the_long_jobs_reason_quotes_its_predicted_run_time():
    st = two_nodes([timed("gang", 7200.0, gpus=8), timed("long", 7200.0)])
    assert (
        plan_of(st, True)
        .waiting["long"]
        .endswith("it fits now only on those GPUs, and it is predicted to run about 2.0 h")
    )


def test_a_multi_gpu_job_behind_the_reservation_avoids_its_gpus():
    # A 2-GPU job of 2 h fits on v1 (reserved) or v2 (not): it must take v2.
    st = two_nodes([timed("gang", 7200.0, gpus=8), timed("pair", 7200.0, gpus=2)], third=True)
    assert where(plan_of(st, True), "pair") == [("v2", (0, 1))]
    assert where(plan_of(st, False), "pair") == [("v1", (0, 1))]


def test_a_second_gang_does_not_take_the_reserved_gpus():
    # A gang of 12 waits for v0 (busy until 3,600 s) and reserves all three nodes; a gang of
    # 8 behind it fits now on the idle v1 + v2, which are reserved.
    nodes = [
        node("v0", {0: "r0", 1: "r0", 2: "r0", 3: "r0"}),
        node("v1", {}),
        node("v2", {}),
    ]
    st = state(nodes, {"r0": 3600.0}, [timed("big", 7200.0, gpus=12), timed("g8", 7200.0, 8)])
    assert where(plan_of(st, False), "g8") == [("v1", (0, 1, 2, 3)), ("v2", (0, 1, 2, 3))]
    plan = plan_of(st, True)
    assert where(plan, "g8") is None
    assert plan.waiting["big"].startswith("holds a reservation of 12 V100 on v0/gpu0,1,2,3 + ")
    assert plan.waiting["g8"].startswith("would delay job big's reservation")
    # Short enough (1,000 s at 0.74x spread speed: 1,351 s < 3,600 s), it may.
    st = state(nodes, {"r0": 3600.0}, [timed("big", 7200.0, gpus=12), timed("g8", 1000.0, 8)])
    assert where(plan_of(st, True), "g8") is not None


def test_only_multi_gpu_jobs_get_a_reservation_and_backfill_off_ignores_it():
    # A waiting 1-GPU job gets none: every GPU is busy, and the job behind it still starts
    # on the GPUs its own shape allows.
    nodes = [node("v0", {0: "r0", 1: "r0", 2: "r0", 3: "r0"})]
    st = state(nodes, {"r0": 3600.0}, [timed("one", 7200.0)])
    assert "reservation" not in plan_of(st, True).waiting["one"]
    st = two_nodes([timed("gang", 7200.0, gpus=8), timed("long", 7200.0)])
    strict = build_policy("fifo", {"reserve": True}).schedule(st, random.Random(0))
    assert "reservation" not in strict.waiting["gang"]
    assert strict.waiting["long"].startswith("waiting behind job gang")


def test_same_snapshot_same_plan_and_a_reused_policy_agrees_with_a_fresh_one():
    st = two_nodes(
        [timed("gang", 7200.0, gpus=8), timed("long", 7200.0), timed("short", 600.0)],
        third=True,
    )
    policy = build_policy("placement_rate", {"reserve": True})
    first = policy.schedule(st, random.Random(0))
    again = policy.schedule(st, random.Random(0))  # the kept view, refreshed
    fresh = build_policy("placement_rate", {"reserve": True}).schedule(st, random.Random(0))
    assert first == again == fresh


# -- the starvation scenario, in the simulator -----------------------------------------------

CLUSTER = sim_helpers.cluster(
    {"name": "v", "count": 2, "gpu_model": "V100", "gpus_per_node": 4, "cpus": 16}
)


def stream_and_gang() -> list[JobSpec]:
    """One 1-GPU job of 1,000 s every 125 s for 10,000 s (8 GPUs' worth: every GPU that frees
    has a job waiting for it) and, at t=10, a gang of all 8 GPUs."""
    jobs = [sim_helpers.job(f"s{i:02d}", 1000.0, arrival=125.0 * i) for i in range(80)]
    jobs.append(sim_helpers.job("gang", 2000.0, gpus=8, arrival=10.0))
    return sorted(jobs, key=lambda j: j.arrival_s)


@pytest.mark.parametrize("name", ["fifo", "binpack", "placement_rate"])
def test_a_gang_starves_behind_a_stream_of_small_jobs_without_a_reservation(name):
    params = {"backfill": True}  # fifo's default is strict order; the others backfill
    starved = simulate(CLUSTER, stream_and_gang(), build_policy(name, params))
    gang = {r.job_id: r for r in starved.jobs}["gang"]
    assert gang.start_s > 10_000.0  # only once the stream has dried up
    reserved = simulate(CLUSTER, stream_and_gang(), build_policy(name, {**params, "reserve": True}))
    recs = {r.job_id: r for r in reserved.jobs}
    # At t=10 the reservation is every GPU from 1,000 s (when s00 is predicted to end); the
    # 1-GPU jobs arriving meanwhile would run past it, so they wait, and the gang starts then.
    assert recs["gang"].start_s == pytest.approx(1000.0)
    assert len(recs) == 81 and all(r.finish_s is not None for r in recs.values())


# -- the contract, with reservations on --------------------------------------------------------

RESERVING = [n for n in available_policies() if "reserve" in policy_class(n).defaults]


@pytest.mark.parametrize("snapshot", SNAPSHOTS)
@pytest.mark.parametrize("name", RESERVING)
def test_every_policy_keeps_the_contract_with_reservations(name, snapshot):
    params = {"reserve": True, "backfill": True}
    policy = build_policy(name, params)
    st = SNAPSHOTS[snapshot]()
    plan = policy.schedule(st, random.Random(7))
    check_plan(st, plan, max_jobs_per_gpu=policy.params.get("max_jobs_per_gpu"))
    again = build_policy(name, params).schedule(SNAPSHOTS[snapshot](), random.Random(7))
    assert plan == again


def test_a_job_that_fits_one_node_reserves_the_node_predicted_to_have_its_gpus_first():
    # v0: its 4th GPU is idle at 5,000 s; v1: at 2,000 s (3 busy until then, 1 idle now).
    nodes = [
        node("v0", {0: "r0", 1: "r0", 2: "r1", 3: "r1"}),
        node("v1", {0: "r2", 1: "r2", 2: "r2"}),
    ]
    ends = {"r0": 1000.0, "r1": 5000.0, "r2": 2000.0}
    pending = [timed("four", 7200.0, gpus=4), timed("long", 7200.0), timed("short", 1000.0)]
    plan = plan_of(state(nodes, ends, pending), True)
    assert plan.waiting["four"].startswith(
        "holds a reservation of 4 V100 on v1/gpu0,1,2,3, predicted idle in about 33 min, when "
        "job r2 is predicted to end; "
    )
    assert "would delay job four's reservation" in plan.waiting["long"]
    assert where(plan, "short") == [("v1", (3,))]
    assert where(plan_of(state(nodes, ends, pending), False), "long") == [("v1", (3,))]

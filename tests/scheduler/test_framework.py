"""The framework's cycle: reservations within a cycle, the failure cache, MIG, scoring."""

from __future__ import annotations

import random
from typing import ClassVar

from scheduler.domain import ClusterState, JobSpec, Profile, SharingMode
from scheduler.policies.framework import FrameworkPolicy, framework_defaults
from scheduler.policies.registry import build_policy
from tests.scheduler.snapshots import GB, busy_gpu, check_plan, gpu_node, job


class CountingPolicy(FrameworkPolicy):
    """Counts how often the filter runs; prefers GPUs with a high index via two scorers."""

    name: ClassVar[str] = "counting"
    defaults: ClassVar[dict] = dict(framework_defaults)
    colocate: ClassVar[bool] = False
    scorers: ClassVar[tuple[str, ...]] = ("late", "early")

    def __init__(self, **params):
        super().__init__(**params)
        self.filter_calls = 0

    def candidates(self, job, view):
        self.filter_calls += 1
        return super().candidates(job, view)

    def score_late(self, job, cand, view):
        return cand.node.order

    def score_early(self, job, cand, view):
        return -cand.node.order


def test_capacity_reserved_within_a_cycle():
    state = ClusterState(0.0, (gpu_node("n0", "V100", 1),), pending=(job("a"), job("b")))
    plan = build_policy("fifo").schedule(state, random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] == ["a"]


def test_failed_shapes_are_cached_within_a_cycle():
    state = ClusterState(
        0.0,
        (gpu_node("n0", "V100", 1),),
        pending=(job("a"), *(job(f"same{i}", 4) for i in range(20)), job("other", 5)),
    )
    policy = CountingPolicy(backfill=True)
    plan = policy.schedule(state, random.Random(0))
    assert len(plan.waiting) == 21
    assert policy.filter_calls == 3  # a, the first "same", "other": the rest hit the cache
    assert plan.waiting["same19"] == plan.waiting["same0"]


def test_weights_decide_between_scorers():
    state = ClusterState(
        0.0, (gpu_node("n0", "K80", 1), gpu_node("n1", "V100", 1)), pending=(job("a", 1),)
    )
    late = CountingPolicy(weights={"late": 2.0, "early": 1.0}).schedule(state, random.Random(0))
    early = CountingPolicy(weights={"late": 1.0, "early": 2.0}).schedule(state, random.Random(0))
    assert late.decisions[0].placement.node == "n1"
    assert early.decisions[0].placement.node == "n0"


def test_existing_mig_gpu_gets_the_smallest_fitting_instance():
    r = job("r", 10)
    a30, running = busy_gpu("a0", 0, "A30", [r], SharingMode.MIG, mig_slices_used=2)
    state = ClusterState(
        0.0,
        (gpu_node("a0", "A30", 1, gpus={0: a30}),),
        pending=(job("s1", 5), job("s2", 5), job("s3", 5)),
        running=tuple(running),
    )
    plan = build_policy("binpack").schedule(state, random.Random(0))
    check_plan(state, plan)
    assert [d.placement.mig_profile for d in plan.decisions] == ["1g.6gb", "1g.6gb"]
    assert "at most 0 free compute slices" in plan.waiting["s3"]


def test_profiled_models_only():
    only_v100 = JobSpec(id="x", gpu_memory_mb=GB, profile=Profile("x", gpu_time_s={"V100": 9.0}))
    state = ClusterState(
        0.0, (gpu_node("k0", "K80", 1), gpu_node("v0", "V100", 1)), pending=(only_v100,)
    )
    plan = build_policy("fifo").schedule(state, random.Random(0))
    assert plan.decisions[0].placement.node == "v0"
    plan = build_policy("fifo", {"profiled_models_only": False}).schedule(state, random.Random(0))
    assert plan.decisions[0].placement.node == "k0"


def test_down_nodes_get_nothing():
    state = ClusterState(
        0.0,
        (gpu_node("d0", "V100", 2, up=False), gpu_node("v0", "V100", 1)),
        pending=(job("a"), job("b")),
    )
    for name in ("fifo", "binpack", "random"):
        plan = build_policy(name).schedule(state, random.Random(0))
        # Something is placed (a policy placing nothing would pass the "all" alone), on v0.
        assert plan.decisions, (name, plan.waiting)
        assert all(d.placement.node == "v0" for d in plan.decisions)


def test_snapshot_is_not_modified():
    state = ClusterState(0.0, (gpu_node("v0", "V100", 2),), pending=(job("a"), job("b")))
    before = repr(state)
    build_policy("binpack").schedule(state, random.Random(0))
    assert repr(state) == before


# -- co-location filter: pairs that cannot co-run are not candidates -----------------------------

RN50_128 = "ResNet-50 (batch size 128)"  # measured infeasible next to Transformer-256 on V100
TF_256 = "Transformer (batch size 256)"
RN18_16, RN18_32 = "ResNet-18 (batch size 16)", "ResNet-18 (batch size 32)"  # feasible pair
CO_LOCATING = ("binpack", "loadbalance", "random", "mystic")


def _one_shared_v100(resident_type, pending, idle_gpus=0):
    resident = job("r", 2, job_type=resident_type)
    shared, running = busy_gpu("n0", 0, "V100", [resident], SharingMode.MPS)
    return ClusterState(
        0.0,
        (gpu_node("n0", "V100", 1 + idle_gpus, gpus={0: shared}),),
        pending=tuple(pending),
        running=tuple(running),
    )


def test_infeasible_pair_is_not_a_candidate_and_the_job_waits_with_the_reason():
    state = _one_shared_v100(RN50_128, [job("t", 2, job_type=TF_256)])
    for name in CO_LOCATING:
        plan = build_policy(name).schedule(state, random.Random(0))
        check_plan(state, plan)
        assert not plan.decisions, name
        reason = plan.waiting["t"]
        assert "cannot co-run" in reason and "infeasible" in reason, reason
        assert TF_256 in reason and RN50_128 in reason


def test_infeasible_pair_goes_to_an_idle_gpu_instead():
    # binpack prefers the fuller (shared) GPU, loadbalance and mystic the idle one anyway;
    # all must end on the idle GPU 1.
    state = _one_shared_v100(RN50_128, [job("t", 2, job_type=TF_256)], idle_gpus=1)
    for name in CO_LOCATING:
        plan = build_policy(name).schedule(state, random.Random(0))
        assert [d.placement.gpu_indices for d in plan.decisions] == [(1,)], name


class _FragileNextToAnyone:
    """A one-sided interference model: a job of type "fragile" cannot run next to anything;
    every other job does not mind."""

    name = "fragile"

    def slowdown(self, job, co_runners, gpu, mode):
        return float("inf") if co_runners and job.job_type == "fragile" else 1.0


def test_the_check_asks_the_residents_side_too(monkeypatch):
    from scheduler import interference

    monkeypatch.setitem(interference.INTERFERENCE_MODELS, "fragile", _FragileNextToAnyone)
    policy = build_policy("binpack", {"colocation_check": "fragile"})
    # The newcomer would not mind, but the resident cannot take a co-runner.
    state = _one_shared_v100("fragile", [job("n", 2, job_type="sturdy")])
    plan = policy.schedule(state, random.Random(0))
    assert not plan.decisions and "cannot co-run" in plan.waiting["n"]
    # The other way round too; and two sturdy jobs share.
    state = _one_shared_v100("sturdy", [job("n", 2, job_type="fragile")])
    assert not policy.schedule(state, random.Random(0)).decisions
    state = _one_shared_v100("sturdy", [job("n", 2, job_type="sturdy2")])
    assert policy.schedule(state, random.Random(0)).decisions


def test_feasible_pair_still_co_locates_and_the_check_can_be_turned_off():
    state = _one_shared_v100(RN18_16, [job("x", 2, job_type=RN18_32)])
    (d,) = build_policy("binpack").schedule(state, random.Random(0)).decisions
    assert d.placement.gpu_indices == (0,)
    state = _one_shared_v100(RN50_128, [job("t", 2, job_type=TF_256)])
    plan = build_policy("binpack", {"colocation_check": None}).schedule(state, random.Random(0))
    assert [d.placement.gpu_indices for d in plan.decisions] == [(0,)]


def test_the_check_asks_the_snapshots_knowledge_not_a_table():
    """The default check reads ``ClusterState.knowledge``: a pair its prior holds impossible is
    refused, one it holds possible shares, whatever Gavel's table says (issue 24: policies read
    estimates only)."""
    from dataclasses import replace

    from scheduler.knowledge import Knowledge

    def prior(j, co_runners, gpu_model, mode):
        # The reverse of the table: the measured-infeasible pair is possible, and a
        # feasible pair (two ResNet-18) is not.
        types = {j.job_type, *(c.job_type for c in co_runners)}
        return 0.0 if types <= {RN18_16, RN18_32} else 0.6

    knowledge = Knowledge(pair_prior=prior)
    table_infeasible = _one_shared_v100(RN50_128, [job("t", 2, job_type=TF_256)])
    table_feasible = _one_shared_v100(RN18_16, [job("x", 2, job_type=RN18_32)])
    policy = build_policy("binpack")
    assert not policy.schedule(table_infeasible, random.Random(0)).decisions
    assert policy.schedule(table_feasible, random.Random(0)).decisions
    for name in CO_LOCATING:
        policy = build_policy(name)
        plan = policy.schedule(replace(table_infeasible, knowledge=knowledge), random.Random(0))
        assert [d.placement.gpu_indices for d in plan.decisions] == [(0,)], name
        plan = build_policy(name).schedule(
            replace(table_feasible, knowledge=knowledge), random.Random(0)
        )
        assert not plan.decisions, name
        assert "knowledge (pair prior) interference: infeasible" in plan.waiting["x"], name
    # Once the cluster saw the pair run, the prior's "impossible" no longer holds.
    from scheduler.knowledge import Observation, ObservationKind

    knowledge.observe(
        Observation(
            kind=ObservationKind.PROGRESS,
            job_id="old",
            job_type=RN18_32,
            at_s=0.0,
            gpu_model="V100",
            progress_from=0.0,
            progress_to=0.1,
            window_s=60.0,
            co_runners=(RN18_16,),
            mode=SharingMode.MPS,
        )
    )
    plan = build_policy("binpack").schedule(
        replace(table_feasible, knowledge=knowledge), random.Random(0)
    )
    assert plan.decisions


def test_two_infeasible_newcomers_are_not_paired_within_one_cycle():
    # Two ResNet-50 (bs 128) on one idle V100: the first takes it, the second must not join.
    state = ClusterState(
        0.0,
        (gpu_node("n0", "V100", 1),),
        pending=(job("a", 2, job_type=RN50_128), job("b", 2, job_type=RN50_128)),
    )
    plan = build_policy("binpack").schedule(state, random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] == ["a"]
    assert "cannot co-run" in plan.waiting["b"]


def _replay_beside_a_resnet(params=None):
    """A long ResNet-50 (bs 128) holds one of two V100s; five Transformer (bs 256) jobs arrive
    10 s apart. Gavel measured the pair (and two Transformers) as infeasible on a V100."""
    from scheduler.cluster_spec import parse_cluster_spec
    from scheduler.interference import build_interference
    from scheduler.simulator import simulate

    cluster = parse_cluster_spec(
        {"nodes": [{"name": "v", "count": 1, "gpu_model": "V100", "gpus_per_node": 2}]}
    )

    def gavel_job(i, job_type, solo, arrival):
        return JobSpec(
            id=str(i),
            arrival_s=arrival,
            job_type=job_type,
            profile=Profile(job_type, gpu_time_s={"V100": solo}),
        )

    jobs = [gavel_job(0, RN50_128, 1000.0, 0.0)]
    jobs += [gavel_job(i, TF_256, 100.0, 10.0 * i) for i in range(1, 6)]
    policy = build_policy("binpack", params or {})
    return simulate(cluster, jobs, policy, interference=build_interference("measured"))


def test_binpack_replay_has_no_oom_cascade():
    """Without the filter binpack packs each Transformer next to the ResNet, the co-run is
    killed, requeued and packed there again."""
    result = _replay_beside_a_resnet()
    assert result.oom_count == 0
    assert all(r.end_reason == "completed" for r in result.jobs)


# -- the working view kept between cycles gives the same plans as a fresh one --------------------


class _CompareWarmWithFresh:
    """Wraps a policy: each cycle, the reused (warm) object and a fresh one must agree."""

    def __init__(self, name):
        self.name = name
        self.warm = build_policy(name)
        self.cycles = 0
        self.reused_nodes = 0

    def schedule(self, state, rng):
        seed = rng.random()
        warm = self.warm.schedule(state, random.Random(seed))
        fresh = build_policy(self.name).schedule(state, random.Random(seed))
        assert warm == fresh, f"{self.name}: cycle {self.cycles} differs"
        self.cycles += 1
        view = self.warm._view
        if view is not None:
            self.reused_nodes += len(view.nodes) - view.rebuilt_nodes
        return warm


def test_incremental_view_matches_a_fresh_one_over_a_replay(tmp_path):
    from benchmarks.simulator_throughput import cluster_spec, make_trace
    from scheduler.cluster_spec import parse_cluster_spec
    from scheduler.interference import build_interference
    from scheduler.simulator import simulate
    from scheduler.traces import read_trace

    make_trace(tmp_path / "t.csv", 150, 24, seed=3)
    jobs = read_trace(tmp_path / "t.csv", fmt="gavel")
    cluster = parse_cluster_spec(cluster_spec(24))
    for name in ("fifo", "binpack", "loadbalance", "random", "mystic"):
        policy = _CompareWarmWithFresh(name)
        result = simulate(cluster, jobs, policy, interference=build_interference("measured"))
        assert policy.cycles > 100 and policy.reused_nodes > 0
        assert sum(r.end_reason == "completed" for r in result.jobs) == len(jobs)


def test_incremental_view_matches_a_fresh_one_with_gangs(tmp_path):
    # Jobs of 8 GPUs on 4-GPU nodes: gangs placed and waiting (their reasons quote predicted
    # ends) must be the same whether the view was kept from earlier cycles or built afresh.
    from scheduler import trace_generator
    from scheduler.cluster_spec import parse_cluster_spec
    from scheduler.interference import build_interference
    from scheduler.simulator import simulate
    from scheduler.traces import read_trace

    path = tmp_path / "g.csv"
    trace_generator.write_gavel_trace(
        trace_generator.generate_jobs(90, multi_gpu=True, seed=4, jobs_per_hour=6.0), path
    )
    jobs = read_trace(path)
    assert sum(1 for j in jobs if j.gpus == 8) >= 3
    cluster = parse_cluster_spec(
        {
            "nodes": [
                {"name": m.lower(), "count": 2, "gpu_model": m, "gpus_per_node": 4}
                for m in ("K80", "P100", "V100")
            ]
        }
    )
    for name in ("fifo", "binpack", "random", "placement_rate"):
        policy = _CompareWarmWithFresh(name)
        result = simulate(cluster, jobs, policy, interference=build_interference("measured"))
        assert policy.cycles > 50
        assert all(r.end_reason == "completed" for r in result.jobs)
        assert any(r.nodes == 2 for r in result.jobs)


def test_refresh_after_a_cycle_on_the_same_snapshot_forgets_its_reservations():
    state = ClusterState(0.0, (gpu_node("n0", "V100", 2),), pending=(job("a"), job("b")))
    policy = build_policy("binpack")
    first = policy.schedule(state, random.Random(0))
    again = policy.schedule(state, random.Random(0))  # the plan was not applied
    assert first == again and len(first.decisions) == 2


# -- observed OOM kills: a job is not placed again beside the types it died beside --------------


def test_a_job_is_not_placed_again_beside_a_type_it_was_oom_killed_beside():
    from dataclasses import replace

    victim = replace(job("t", 2, job_type=TF_256), oom_with=frozenset({RN50_128}))
    unchecked = {"colocation_check": None}  # no model: only the observation keeps them apart
    for name in CO_LOCATING:
        waits = build_policy(name, unchecked).schedule(
            _one_shared_v100(RN50_128, [victim]), random.Random(0)
        )
        assert not waits.decisions, name
        reason = waits.waiting["t"]
        assert "skipped: this job was OOM-killed beside their jobs' type before" in reason
        assert f"e.g. {RN50_128} on V100" in reason
        idle = _one_shared_v100(RN50_128, [victim], idle_gpus=1)
        plan = build_policy(name, unchecked).schedule(idle, random.Random(0))
        assert [d.placement.gpu_indices for d in plan.decisions] == [(1,)], name
        # beside another type it may share again, and a job of its type without the
        # observation is not held back by it
        other = _one_shared_v100(RN18_16, [victim])
        assert build_policy(name, unchecked).schedule(other, random.Random(0)).decisions, name
    fresh = _one_shared_v100(RN50_128, [job("u", 2, job_type=TF_256)])
    assert build_policy("binpack", unchecked).schedule(fresh, random.Random(0)).decisions


def test_no_job_joins_a_resident_beside_the_type_it_was_oom_killed_beside():
    from dataclasses import replace

    resident = replace(job("r", 2, job_type=RN50_128), oom_with=frozenset({TF_256}))
    shared, running = busy_gpu("n0", 0, "V100", [resident], SharingMode.MPS)
    unchecked = {"colocation_check": None}

    def state_with(newcomer):
        return ClusterState(
            0.0, (gpu_node("n0", "V100", 1, gpus={0: shared}),), pending=(newcomer,),
            running=tuple(running),
        )  # fmt: skip

    barred, welcome = state_with(job("t", 2, job_type=TF_256)), state_with(job("x", 2))
    for name in (*CO_LOCATING, "sharing_mode"):  # each shares that pair without oom_with
        policy = build_policy(name, unchecked)
        assert not policy.schedule(barred, random.Random(0)).decisions, name
        assert build_policy(name, unchecked).schedule(welcome, random.Random(0)).decisions
    reason = build_policy("binpack", unchecked).schedule(barred, random.Random(0)).waiting["t"]
    assert f"a resident killed beside {TF_256} on V100" in reason
    # one cycle, the barred job first: the job behind it, of the same size but another type,
    # is not turned away by the barred one's cached failure
    both = ClusterState(
        0.0, (gpu_node("n0", "V100", 1, gpus={0: shared}),),
        pending=(job("t", 2, job_type=TF_256), job("x", 2)), running=tuple(running),
    )  # fmt: skip
    for name in (*CO_LOCATING, "sharing_mode"):
        plan = build_policy(name, unchecked).schedule(both, random.Random(0))
        assert [d.placement.job_id for d in plan.decisions] == ["x"], name


def test_without_a_model_an_oom_is_tried_once_per_pair_not_until_the_job_fails():
    """The replay of ``test_binpack_replay_has_no_oom_cascade`` with the co-location check
    off: every Transformer is killed beside the ResNet-50 (and beside another Transformer)
    once, then placed elsewhere; before the jobs carried what they died beside, each was
    packed there again until it failed (20 kills, 5 failed jobs)."""
    result = _replay_beside_a_resnet({"colocation_check": None})
    assert all(r.end_reason == "completed" for r in result.jobs)
    assert all(r.oom_count <= 2 for r in result.jobs)  # one per type it met
    assert result.oom_count == 9

"""Invariants of any simulation, defensive validation of plans, determinism."""

from __future__ import annotations

import dataclasses
import random

import pytest

from scheduler.domain import Decision, Placement, PlacementPart, Plan, SharingMode
from scheduler.simulator import EndReason, PolicyDecisionError, SimConfig, simulate
from tests.scheduler.sim_helpers import (
    FixedSlowdown,
    RandomShare,
    Scripted,
    cluster,
    job,
)

MIXED = cluster(
    {"name": "v", "count": 2, "gpu_model": "V100", "gpus_per_node": 2, "cpus": 16},
    {"name": "k", "count": 1, "gpu_model": "K80", "gpus_per_node": 2, "cpus": 16},
)
ENDINGS = {e.value for e in EndReason}


def random_trace(n: int, seed: int):
    """Single-GPU jobs with solo times on V100 and K80, some with growing memory."""
    rng = random.Random(seed)
    jobs = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(1 / 20.0)
        v100 = rng.uniform(10, 200)
        steps = ()
        mem = rng.choice([1000.0, 3000.0, 6000.0])
        if rng.random() < 0.3:
            steps = ((0.0, 500.0, 2000.0), (0.6, 2000.0, rng.uniform(4000, 9000)))
            mem = None
        j = job(f"j{i:03d}", v100, arrival=t, mem=mem, steps=steps)
        profile = j.profile.__class__(
            name=j.profile.name,
            gpu_time_s={"V100": v100, "K80": v100 * rng.uniform(2, 5)},
            gpu_memory_max_mb=j.profile.gpu_memory_max_mb,
            memory_steps=j.profile.memory_steps,
        )
        jobs.append(j.__class__(id=j.id, arrival_s=t, profile=profile))
    return jobs


def check_snapshot(state):
    """What every snapshot handed to a policy must satisfy."""
    seen: dict[str, tuple[str, int]] = {}
    for node in state.nodes:
        assert 0 <= node.free_cores <= node.cores
        for g in node.gpus:
            assert g.used_memory_mb is not None
            assert g.used_memory_mb <= g.spec.memory_mb + 1e-2, (g.key, g.used_memory_mb)
            assert g.mig_slices_used <= g.spec.mig_total_slices or g.mig_slices_used == 0
            if g.mode == SharingMode.EXCLUSIVE:
                assert len(g.job_ids) <= 1
            assert (g.mode is None) == (not g.job_ids)
            for jid in g.job_ids:
                assert jid not in seen, f"{jid} on {seen.get(jid)} and {g.key}"
                seen[jid] = g.key
    running = {r.job.id for r in state.running}
    pending = {j.id for j in state.pending}
    assert not running & pending
    assert set(seen) == {r.job.id for r in state.running if r.placement.gpu_indices}
    for r in state.running:
        assert 0.0 <= r.progress <= 1.0


def test_invariants_hold_under_random_colocation_with_memory_growth():
    jobs = random_trace(60, seed=3)
    policy = RandomShare(per_gpu=3, check=check_snapshot)
    result = simulate(
        MIXED,
        jobs,
        policy,
        interference=FixedSlowdown(1.4),
        config=SimConfig(seed=11, reschedule_interval_s=50.0),
    )
    by_id = {j.id: j for j in jobs}
    assert len(result.jobs) == len(jobs)
    for r in result.jobs:
        assert r.end_reason in ENDINGS
        if r.end_reason == "completed":
            solo = by_id[r.job_id].solo_time_s(r.gpu_model)
            assert r.solo_s == pytest.approx(solo)
            assert r.jct_s >= solo - 1e-6  # JCT >= solo time on its GPU model
            assert r.run_s >= solo - 1e-6
            assert r.start_s >= r.arrival_s
    assert result.oom_count == sum(r.oom_count for r in result.jobs)
    assert {r.end_reason for r in result.jobs} <= {"completed", "failed-oom"}


def test_same_seed_same_result_and_the_seed_matters():
    jobs = random_trace(40, seed=5)

    def run(seed):
        res = simulate(
            MIXED,
            jobs,
            RandomShare(per_gpu=2),
            interference=FixedSlowdown(1.3),
            config=SimConfig(seed=seed),
        )
        return res.jobs_frame().drop(columns=[]), res

    a, ra = run(1)
    b, rb = run(1)
    c, _ = run(2)
    assert a.equals(b)
    assert ra.timeline == rb.timeline and ra.oom_count == rb.oom_count
    assert not a["location"].equals(c["location"])


def _place(*placements):
    def fn(state, rng):
        pending = {j.id for j in state.pending}
        return Plan(
            decisions=tuple(Decision(p, "bad", "test") for p in placements if p.job_id in pending)
        )

    return fn


ONE = cluster({"name": "n", "gpu_model": "V100", "gpus_per_node": 2, "cpus": 4})
A30 = cluster({"name": "a", "gpu_model": "A30", "gpus_per_node": 1, "cpus": 4})
V_K = cluster(
    {"name": "n", "gpu_model": "V100", "gpus_per_node": 2, "cpus": 4},
    {"name": "k", "gpu_model": "K80", "gpus_per_node": 2, "cpus": 4},
)
TWO_NODES = cluster(
    {"name": "n", "count": 2, "gpu_model": "V100", "gpus_per_node": 2, "cpus": 4},
    {"name": "k", "gpu_model": "K80", "gpus_per_node": 2, "cpus": 4},
)


def both(job_id: str, gpus: int):
    """A job with solo times on V100 and K80."""
    spec = job(job_id, 10, gpus=gpus)
    profile = dataclasses.replace(spec.profile, gpu_time_s={"V100": 10.0, "K80": 30.0})
    return dataclasses.replace(spec, profile=profile)


def spread(job_id: str, *parts, cpus: int = 1) -> Placement:
    (node, idx), *more = parts
    return Placement(
        job_id, node, idx, cpus=cpus, more=tuple(PlacementPart(n, i, cpus) for n, i in more)
    )


@pytest.mark.parametrize(
    ("clus", "jobs", "placements", "message"),
    [
        (
            ONE,
            [job("a", 10), job("b", 10)],
            [Placement("a", "n-0", (0,)), Placement("b", "n-0", (0,))],
            "double-books",
        ),
        (
            ONE,
            [job("a", 10, mem=9000), job("b", 10, mem=9000)],
            [
                Placement("a", "n-0", (0,), SharingMode.MPS),
                Placement("b", "n-0", (0,), SharingMode.MPS),
            ],
            "over-commits memory",
        ),
        (
            A30,
            [job(x, 10, model="A30", mem=1000) for x in "abc"],
            [Placement(x, "a-0", (0,), SharingMode.MIG, mig_profile="2g.12gb") for x in "abc"],
            "over-commits MIG slices",
        ),
        (
            A30,
            [job("a", 10, model="A30", mem=7000)],
            [Placement("a", "a-0", (0,), SharingMode.MIG, mig_profile="1g.6gb")],
            "MIG instance",
        ),
        (ONE, [job("a", 10)], [Placement("a", "nowhere", (0,))], "unknown node"),
        (ONE, [job("a", 10)], [Placement("a", "n-0", (5,))], "GPU 5"),
        (ONE, [job("a", 10, gpus=2)], [Placement("a", "n-0", (0,))], "needs 2 GPU"),
        (V_K, [job("a", 10, model="K80")], [Placement("a", "n-0", (0,))], "no solo time"),
        # Gangs: every part is checked.
        (
            TWO_NODES,
            [both("a", 4)],
            [spread("a", ("n-0", (0, 1)), ("k-0", (0, 1)))],
            "mixes GPU",
        ),
        (
            TWO_NODES,
            [job("a", 10, gpus=3)],
            [spread("a", ("n-0", (0, 1)), ("n-1", (0, 1)))],
            "needs 3 GPU(s) but was given 4 over 2 nodes",
        ),
        (
            TWO_NODES,
            [job("a", 10, gpus=2)],
            [spread("a", ("n-0", (0, 1)), ("n-1", ()))],
            "part on n-1 has no GPU",
        ),
        (
            TWO_NODES,
            [job("a", 10, gpus=4)],
            [spread("a", ("n-0", (0, 1)), ("n-0", (0, 1)))],
            "lists node n-0 twice",
        ),
        (
            TWO_NODES,
            [job("a", 10), job("b", 10, gpus=4)],
            [Placement("a", "n-1", (1,)), spread("b", ("n-0", (0, 1)), ("n-1", (0, 1)))],
            "double-books n-1/1",
        ),
        (
            TWO_NODES,
            [job("a", 10, gpus=4)],
            [spread("a", ("n-0", (0, 1)), ("n-1", (0, 1)), cpus=9)],
            "CPU cores on n-0",
        ),
        (
            TWO_NODES,
            [job("a", 10, gpus=4)],
            [spread("a", ("n-0", (0, 1)), ("n-1", (0, 7)))],
            "GPU 7 of n-1",
        ),
        (
            ONE,
            [job("a", 10)],
            [Placement("a", "n-0", (0,), SharingMode.MIG, mig_profile="x")],
            "supports",
        ),
        (ONE, [job("a", 10)], [Placement("a", "n-0", (), cpus=1)], "cpu_time_s"),
        (ONE, [job("a", 10)], [Placement("a", "n-0", (0,), cpus=99)], "CPU cores"),
    ],
)
def test_impossible_plans_raise_naming_policy_and_job(clus, jobs, placements, message):
    with pytest.raises(PolicyDecisionError) as err:
        simulate(clus, jobs, Scripted(_place(*placements)))
    text = str(err.value)
    assert "test-scripted" in text and message in text
    assert any(f"'{p.job_id}'" in text for p in placements)


def test_placing_a_job_twice_in_one_plan_raises():
    def fn(state, rng):
        return Plan(
            decisions=(
                Decision(Placement("a", "n-0", (0,)), "x", ""),
                Decision(Placement("a", "n-0", (1,)), "x", ""),
            )
        )

    with pytest.raises(PolicyDecisionError, match="not pending"):
        simulate(ONE, [job("a", 10)], Scripted(fn))


def test_policy_returning_garbage_is_a_clear_error():
    from scheduler.simulator import SimulationError

    with pytest.raises(SimulationError, match="not a Plan"):
        simulate(ONE, [job("a", 10)], Scripted(lambda s, r: None))


def test_mig_instances_share_a_gpu_up_to_its_slices():
    jobs = [job(x, 40, model="A30", mem=5000) for x in "abcd"]
    placements = [Placement(x, "a-0", (0,), SharingMode.MIG, mig_profile="1g.6gb") for x in "abcd"]
    result = simulate(A30, jobs, Scripted(_place(*placements)))
    assert all(r.end_reason == "completed" for r in result.jobs)
    assert result.timeline[0].busy_gpus == pytest.approx(1.0)  # 4 of 4 slices

"""``binpack``: the fullest GPU that still fits, co-located under the GPU's best mode."""

from __future__ import annotations

import random
from dataclasses import replace

from scheduler.domain import ClusterState, SharingMode
from scheduler.policies.registry import build_policy
from tests.scheduler.snapshots import busy_gpu, check_plan, gpu_node, job


def _state(free_gb_by_gpu, pending, model="V100"):
    """One node whose GPU i runs one job leaving ``free_gb_by_gpu[i]`` GB (None: idle)."""
    spec_gb = {"V100": 16160, "P100": 16280}[model] / 1024
    gpus, running = {}, []
    for i, free in enumerate(free_gb_by_gpu):
        if free is not None:
            g, run = busy_gpu(
                "n0",
                i,
                model,
                [job(f"r{i}", spec_gb - free)],
                SharingMode.MPS if model == "V100" else SharingMode.TIME_SLICING,
            )
            gpus[i] = g
            running += run
    return ClusterState(
        0.0,
        (gpu_node("n0", model, len(free_gb_by_gpu), gpus=gpus),),
        pending=tuple(pending),
        running=tuple(running),
    )


def _plan(state, **params):
    plan = build_policy("binpack", params).schedule(state, random.Random(0))
    check_plan(state, plan, max_jobs_per_gpu=params.get("max_jobs_per_gpu", 2))
    return plan


def test_picks_the_fullest_gpu_that_fits():
    state = _state([10.0, 6.0, 3.0, None], [job("a", 5)])
    (d,) = _plan(state).decisions
    assert d.placement.gpu_indices == (1,)  # 6 GB free: fuller than 10, and 3 is too little
    assert d.placement.mode == SharingMode.MPS
    assert "1.0 GB left" in d.explanation and "with job r1" in d.explanation


def test_uses_an_idle_gpu_only_when_no_shared_one_fits():
    state = _state([3.0, None, 2.0], [job("a", 5)])
    (d,) = _plan(state).decisions
    assert d.placement.gpu_indices == (1,)
    assert "alone for now" in d.explanation


def test_packs_successive_jobs_onto_the_same_gpu():
    state = ClusterState(0.0, (gpu_node("n0", "V100", 2),), pending=(job("a", 4), job("b", 4)))
    plan = _plan(state)
    assert [d.placement.gpu_indices for d in plan.decisions] == [(0,), (0,)]


def test_job_limit_per_gpu():
    state = ClusterState(
        0.0, (gpu_node("n0", "V100", 2),), pending=(job("a", 1), job("b", 1), job("c", 1))
    )
    assert [d.placement.gpu_indices for d in _plan(state).decisions] == [(0,), (0,), (1,)]
    three = _plan(state, max_jobs_per_gpu=3)
    assert [d.placement.gpu_indices for d in three.decisions] == [(0,), (0,), (0,)]


def test_time_slicing_on_a_gpu_without_mps():
    # Every catalogue model runs MPS (Kepler on): a site that allows time-slicing only on its
    # P100s says so in the GPU's modes, as a cluster spec override does.
    state = _state([8.0, None], [job("a", 4), job("b", 4)], model="P100")
    no_mps = (SharingMode.EXCLUSIVE, SharingMode.TIME_SLICING)
    nodes = tuple(
        replace(
            n, gpus=tuple(replace(g, spec=replace(g.spec, sharing_modes=no_mps)) for g in n.gpus)
        )
        for n in state.nodes
    )
    state = replace(state, nodes=nodes)
    plan = _plan(state)
    assert {d.placement.mode for d in plan.decisions} == {SharingMode.TIME_SLICING}


def test_p100_pairs_share_under_mps_not_time_slicing():
    # The catalogue gives MPS to Kepler and later: co-located P100 jobs run concurrently.
    state = ClusterState(0.0, (gpu_node("n0", "P100", 1),), pending=(job("a", 4), job("b", 4)))
    plan = _plan(state)
    assert [d.placement.mode for d in plan.decisions] == [SharingMode.MPS, SharingMode.MPS]


def test_quotes_predicted_interference_when_configured():
    a3c = job("a3c", 2, job_type="A3C")
    state = ClusterState(
        0.0, (gpu_node("n0", "V100", 1),), pending=(a3c, job("gan", 2, job_type="CycleGAN"))
    )
    plan = _plan(state, interference="measured")
    assert "predicted slowdown" in plan.decisions[1].explanation
    assert "(measured)" in plan.decisions[1].explanation

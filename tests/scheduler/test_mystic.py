"""``mystic``: least-similar metric vectors first."""

from __future__ import annotations

import random

import pytest

from scheduler.domain import ClusterState, SharingMode
from scheduler.policies.mystic import cosine
from scheduler.policies.registry import build_policy
from tests.scheduler.snapshots import busy_gpu, check_plan, gpu_node, job

COMPUTE = {"sm_efficiency_pct": 90.0, "ipc": 3.0, "mem_util_pct": 5.0}
MEMORY = {"sm_efficiency_pct": 20.0, "ipc": 0.4, "mem_util_pct": 85.0, "gld_gbps": 400.0}


def _two_shared(pending):
    c, m = job("rc", 2, job_type="comp", **COMPUTE), job("rm", 2, job_type="mem", **MEMORY)
    g0, run0 = busy_gpu("n0", 0, "V100", [c], SharingMode.MPS)
    g1, run1 = busy_gpu("n0", 1, "V100", [m], SharingMode.MPS)
    return ClusterState(
        0.0,
        (gpu_node("n0", "V100", 2, gpus={0: g0, 1: g1}),),
        pending=tuple(pending),
        running=(*run0, *run1),
    )


def _plan(state, **params):
    plan = build_policy("mystic", params).schedule(state, random.Random(0))
    check_plan(state, plan)
    return plan


def test_compute_job_goes_next_to_the_memory_job():
    (d,) = _plan(_two_shared([job("new", 2, job_type="comp2", **COMPUTE)])).decisions
    assert d.placement.gpu_indices == (1,)
    assert "cosine similarity" in d.explanation


def test_memory_job_goes_next_to_the_compute_job():
    (d,) = _plan(_two_shared([job("new", 2, job_type="mem2", **MEMORY)])).decisions
    assert d.placement.gpu_indices == (0,)


def test_idle_gpu_first():
    state = ClusterState(
        0.0, (gpu_node("n0", "V100", 2),), pending=(job("a", 2, **COMPUTE), job("b", 2, **MEMORY))
    )
    plan = _plan(state)
    assert [d.placement.gpu_indices for d in plan.decisions] == [(0,), (1,)]


def test_unknown_vectors_use_the_unknown_similarity():
    # A profile-less job: both GPUs score 1 - 0.5; the first in order wins.
    (d,) = _plan(_two_shared([job("blank", 2)])).decisions
    assert d.placement.gpu_indices == (0,)
    assert "0.50" in d.explanation


def test_cosine():
    assert cosine((1.0, 0.0), (0.0, 1.0)) == 0.0
    assert cosine((1.0, 1.0), (2.0, 2.0)) == pytest.approx(1.0)
    assert cosine((0.0, 0.0), (1.0, 0.0)) is None


# -- jobs without profile metrics: the measured co-location signature of their job type --------

RN18_16 = "ResNet-18 (batch size 16)"
RN50_64 = "ResNet-50 (batch size 64)"
A3C = "A3C"


def _gavel_shared(resident_types, newcomer_type):
    """One V100 per resident type (profile-less Gavel jobs under MPS) and one pending job."""
    gpus, running = {}, []
    for i, t in enumerate(resident_types):
        g, run = busy_gpu("n0", i, "V100", [job(f"r{i}", 1, job_type=t)], SharingMode.MPS)
        gpus[i] = g
        running += run
    return ClusterState(
        0.0,
        (gpu_node("n0", "V100", len(resident_types), gpus=gpus),),
        pending=(job("new", 1, job_type=newcomer_type),),
        running=tuple(running),
    )


def test_gavel_jobs_avoid_their_own_type_where_loadbalance_takes_the_first_gpu():
    # Same type first in cluster order: its signature is identical (similarity 1), so mystic
    # goes to the other GPU; loadbalance has no utilisation for these jobs and takes GPU 0.
    for same, other in ((RN18_16, A3C), (A3C, RN50_64), (RN50_64, RN18_16)):
        state = _gavel_shared([same, other], same)
        (d,) = _plan(state).decisions
        assert d.placement.gpu_indices == (1,), (same, other)
        assert "measured co-location signatures" in d.explanation
        lb = build_policy("loadbalance").schedule(state, random.Random(0))
        assert lb.decisions[0].placement.gpu_indices == (0,)


def test_signature_similarity_ranks_the_residents():
    from scheduler.interference import colocation_signature

    types = [RN18_16, A3C, RN50_64]
    newcomer = "Transformer (batch size 32)"
    sims = [cosine(colocation_signature(t), colocation_signature(newcomer)) for t in types]
    (d,) = _plan(_gavel_shared(types, newcomer)).decisions
    assert d.placement.gpu_indices == (sims.index(min(sims)),)


def test_measured_signatures_off_gives_the_old_tie():
    state = _gavel_shared([RN18_16, A3C], RN18_16)
    (d,) = _plan(state, measured_signatures=False).decisions
    assert d.placement.gpu_indices == (0,)
    assert "assumed" in d.explanation


def test_colocation_signature():
    from scheduler.interference import colocation_signature

    sig = colocation_signature(RN18_16)
    assert sig is not None and len(sig) == 3 * 26  # 3 GPU types x 26 co-runner types
    assert all(0.0 <= x <= 1.5 for x in sig)
    assert 0.0 in colocation_signature("ResNet-50 (batch size 128)")  # infeasible pairs
    assert colocation_signature("no such type") is None and colocation_signature(None) is None

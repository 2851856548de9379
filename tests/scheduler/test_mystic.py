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

"""``fifo``: exclusive, first fit, strict queue order."""

from __future__ import annotations

import random

from scheduler.domain import ClusterState, SharingMode
from scheduler.policies.registry import build_policy
from tests.scheduler.snapshots import busy_gpu, check_plan, cpu_node, gpu_node, job


def _plan(state, **params):
    plan = build_policy("fifo", params).schedule(state, random.Random(0))
    check_plan(state, plan)
    return plan


def _where(plan):
    return {d.placement.job_id: (d.placement.node, d.placement.gpu_indices) for d in plan.decisions}


def test_first_fit_in_cluster_order_and_exclusive():
    state = ClusterState(
        0.0,
        (gpu_node("n0", "V100", 2), gpu_node("n1", "V100", 2)),
        pending=(job("a"), job("b"), job("c")),
    )
    plan = _plan(state)
    assert _where(plan) == {"a": ("n0", (0,)), "b": ("n0", (1,)), "c": ("n1", (0,))}
    assert {d.placement.mode for d in plan.decisions} == {SharingMode.EXCLUSIVE}


def test_skips_a_gpu_model_too_small_for_the_job():
    # K80 (11.2 GB) comes first but cannot hold 14 GB; the V100 can.
    state = ClusterState(
        0.0,
        (gpu_node("k0", "K80", 1), gpu_node("v0", "V100", 1)),
        pending=(job("big", 14), job("small", 2)),
    )
    assert _where(_plan(state)) == {"big": ("v0", (0,)), "small": ("k0", (0,))}


def test_never_shares_a_gpu_even_with_memory_free():
    g, run = busy_gpu("v0", 0, "V100", [job("r", 1)], SharingMode.MPS)
    state = ClusterState(
        0.0, (gpu_node("v0", "V100", 1, gpus={0: g}),), pending=(job("a", 1),), running=tuple(run)
    )
    plan = _plan(state)
    assert plan.decisions == () and "no idle GPU" in plan.waiting["a"]


def test_blocked_head_blocks_the_queue_without_backfill():
    state = ClusterState(
        0.0, (gpu_node("n0", "V100", 2),), pending=(job("a"), job("wide", 1, gpus=2), job("small"))
    )
    plan = _plan(state)
    assert _where(plan) == {"a": ("n0", (0,))}
    assert "at most 1" in plan.waiting["wide"]
    assert "behind job wide" in plan.waiting["small"]


def test_backfill_lets_later_jobs_pass_a_blocked_head():
    state = ClusterState(
        0.0, (gpu_node("n0", "V100", 2),), pending=(job("a"), job("wide", 1, gpus=2), job("small"))
    )
    plan = _plan(state, backfill=True)
    assert _where(plan) == {"a": ("n0", (0,)), "small": ("n0", (1,))}
    assert "wide" in plan.waiting


def test_multi_gpu_job_takes_gpus_on_one_node():
    state = ClusterState(
        0.0,
        (gpu_node("n0", "V100", 2), gpu_node("n1", "V100", 4)),
        pending=(job("one"), job("three", 2, gpus=3)),
    )
    plan = _plan(state)
    assert _where(plan) == {"one": ("n0", (0,)), "three": ("n1", (0, 1, 2))}


def test_cpu_job_goes_to_first_cpu_node_with_cores():
    state = ClusterState(
        0.0,
        (gpu_node("n0", "V100", 1), cpu_node("c0", 4, free=1), cpu_node("c1", 8)),
        pending=(job("cpu", gpus=0, cpus=2),),
    )
    assert _where(_plan(state)) == {"cpu": ("c1", ())}


def test_explanation_has_numbers():
    state = ClusterState(0.0, (gpu_node("n0", "V100", 3),), pending=(job("a", 9.1),))
    (d,) = _plan(state).decisions
    assert d.explanation == (
        "placed on n0/gpu0 exclusive: first fit among 3 idle V100; needs 9.1 of 15.8 GB free"
    )


def test_an_unknown_memory_need_is_said_so_not_shown_as_zero():
    from dataclasses import replace

    # no profile, no gpu_memory_mb; the portal's jobs (pack_unknown_memory off)
    unknown = replace(job("a"), gpu_memory_mb=None, pack_unknown_memory=False)
    state = ClusterState(0.0, (gpu_node("n0", "V100", 1),), pending=(unknown,))
    (d,) = _plan(state).decisions
    assert "needs 0.0" not in d.explanation
    assert d.explanation.endswith(
        "first fit among 1 idle V100; GPU memory unknown; whole GPUs of its own: its GPU memory "
        "is unknown (no profiled max, no gpu_memory_mb), so it is assumed to need a whole GPU"
    ), d.explanation
    # a trace's job may be packed on a 0-GB count: said so
    trace_job = replace(unknown, pack_unknown_memory=True)
    (d,) = _plan(ClusterState(0.0, (gpu_node("n0", "V100", 1),), pending=(trace_job,))).decisions
    assert d.explanation.endswith("counted as 0 GB (pack_unknown_memory); 15.8 GB free")

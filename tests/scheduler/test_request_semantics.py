"""Request semantics (docs/jobs.md): what a job allows binds every policy.

``sharing: never`` (or an unknown GPU memory in the live loop) means whole GPUs of its own;
``sharing: mps`` / ``time_slicing`` / a MIG profile only that mode; a GPU job goes to a CPU node
only with ``allow_cpu``; host memory is reserved per node.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.admission import admit, capacity_of
from scheduler.domain import (
    SHARING_NEVER,
    ClusterState,
    JobSpec,
    NodeKind,
    NodeState,
    Profile,
    SharingMode,
    sharing_error,
)
from scheduler.policies.registry import available_policies, build_policy
from tests.scheduler.snapshots import GB, busy_gpu, check_plan, gpu_node, job
from tests.scheduler.test_placement_rate import cpu_nodes, pjob, titan_node

# The co-locating policies a site may run live; each must honour what a job allows.
PACKING = ("binpack", "placement_rate", "sharing_mode", "kscheduler", "coscheml", "mystic")


def _plan(name: str, state: ClusterState, *, check: bool = True, **params):
    plan = build_policy(name, params).schedule(state, random.Random(0))
    if check:  # the checker allows no GPU job on a CPU node (``allow_cpu`` tests skip it)
        check_plan(state, plan)
    return plan


def _one_shared_gpu(pending: tuple[JobSpec, ...], model: str = "V100") -> ClusterState:
    """GPU 0 runs job r0 (4 GB, MPS) and GPU 1 is idle."""
    g0, running = busy_gpu("n0", 0, model, [job("r0", 4)], SharingMode.MPS)
    return ClusterState(
        0.0, (gpu_node("n0", model, 2, gpus={0: g0}),), pending=pending, running=tuple(running)
    )


def test_defaults_keep_the_traces_behaviour_and_the_portal_reads_never():
    j = job("a", 4)
    assert j.sharing == "allowed" and j.allow_cpu and j.may_share()
    assert replace(j, sharing=SHARING_NEVER).whole_gpu_reason() == (
        "it asks for GPUs of its own (sharing: never)"
    )
    unknown = JobSpec(id="u", gpus=1, pack_unknown_memory=False)
    assert not unknown.memory_known() and not unknown.may_share()
    assert "GPU memory is unknown" in (unknown.whole_gpu_reason() or "")
    # A profile's max counts as known.
    profiled = replace(unknown, profile=Profile("p", gpu_memory_max_mb=2000))
    assert profiled.memory_known() and profiled.may_share()


def test_a_job_that_allows_sharing_is_packed():
    # The control of the tests below: with sharing allowed binpack packs it beside r0.
    plan = _plan("binpack", _one_shared_gpu((job("a", 4),)))
    assert plan.decisions[0].placement.gpu_indices == (0,)
    assert "shares (sharing: allowed) on its GPU memory: 4.0 GB declared" in (
        plan.decisions[0].explanation
    )


@pytest.mark.parametrize("name", PACKING)
def test_a_never_job_takes_an_idle_gpu_of_its_own(name):
    state = _one_shared_gpu((replace(job("a", 4), sharing=SHARING_NEVER),))
    plan = _plan(name, state)
    (d,) = plan.decisions
    assert d.placement.gpu_indices == (1,)
    assert d.placement.mode == SharingMode.EXCLUSIVE
    assert d.placement.mps_percentage is None
    assert "whole GPUs of its own: it asks for GPUs of its own (sharing: never)" in d.explanation


@pytest.mark.parametrize("name", PACKING)
def test_a_job_of_unknown_memory_is_never_packed_and_says_so(name):
    # Live (pack_unknown_memory off): no profile max, no gpu_memory_mb -> not a 0-GB guess.
    blind = JobSpec(id="b", gpus=1, pack_unknown_memory=False)
    plan = _plan(name, _one_shared_gpu((blind,)))
    (d,) = plan.decisions
    assert d.placement.gpu_indices == (1,) and d.placement.mode == SharingMode.EXCLUSIVE
    assert "its GPU memory is unknown" in d.explanation
    assert "assumed to need a whole GPU" in d.explanation


@pytest.mark.parametrize("name", PACKING)
def test_a_never_job_waits_rather_than_share_and_nobody_joins_it(name):
    # Both GPUs shared: a never job waits, with a reason naming what it asked.
    g0, r0 = busy_gpu("n0", 0, "V100", [job("r0", 4)], SharingMode.MPS)
    g1, r1 = busy_gpu("n0", 1, "V100", [job("r1", 4)], SharingMode.MPS)
    never = replace(job("a", 4), sharing=SHARING_NEVER)
    state = ClusterState(
        0.0,
        (gpu_node("n0", "V100", 2, gpus={0: g0, 1: g1}),),
        pending=(never,),
        running=(*r0, *r1),
    )
    plan = _plan(name, state)
    assert not plan.decisions
    assert (
        "whole GPUs of its own: it asks for GPUs of its own (sharing: never)" in (plan.waiting["a"])
    )
    # Two jobs in one cycle on one idle GPU: the never job first, then one that may share
    # does not join it (the GPU is exclusive); it waits.
    state = ClusterState(0.0, (gpu_node("n0", "V100", 1),), pending=(never, job("b", 4)))
    plan = _plan(name, state)
    assert [d.placement.job_id for d in plan.decisions] == ["a"]
    assert plan.decisions[0].placement.mode == SharingMode.EXCLUSIVE
    assert "b" in plan.waiting


def test_hetero_srtf_packs_only_jobs_that_allow_it():
    # hetero_srtf packs measured pairs under MPS; a never job starts exclusive and nobody
    # joins it, and a never job joins nobody.
    def gjob(i: str, **kw):
        p = Profile("ResNet-18 (batch size 16)", gpu_time_s={"V100": 1000.0})
        return JobSpec(id=i, gpus=1, profile=p, job_type="ResNet-18 (batch size 16)", **kw)

    state = ClusterState(
        0.0, (gpu_node("n0", "V100", 1),), pending=(gjob("a"), gjob("b")), running=()
    )
    allowed = _plan("hetero_srtf", state)
    never = _plan("hetero_srtf", replace(state, pending=(gjob("a", sharing="never"), gjob("b"))))
    assert {d.placement.job_id for d in never.decisions} == {"a"}
    assert never.decisions[0].placement.mode == SharingMode.EXCLUSIVE
    assert "whole GPUs of its own: it asks for GPUs of its own" in never.decisions[0].explanation
    # The control: both run packed when both allow it (the measured pair is worth it).
    assert [(d.placement.job_id, d.placement.mode) for d in allowed.decisions] == [
        ("a", SharingMode.MPS),
        ("b", SharingMode.MPS),
    ]
    # A never job does not join a packed host either.
    late = _plan("hetero_srtf", replace(state, pending=(gjob("a"), gjob("b", sharing="never"))))
    assert [d.placement.job_id for d in late.decisions] == ["a"]
    # ... nor does a live job whose GPU memory is unknown.
    blind = _plan(
        "hetero_srtf",
        replace(state, pending=(gjob("a"), gjob("b", pack_unknown_memory=False))),
    )
    assert [d.placement.job_id for d in blind.decisions] == ["a"]


def test_mode_requests_join_only_that_mode():
    ts = replace(job("t", 4), sharing="time_slicing")
    plan = _plan("binpack", _one_shared_gpu((ts,)))  # r0 is under MPS: not for it
    (d,) = plan.decisions
    assert d.placement.gpu_indices == (1,) and d.placement.mode == SharingMode.TIME_SLICING
    mps = replace(job("m", 4), sharing="mps")
    (d,) = _plan("binpack", _one_shared_gpu((mps,))).decisions
    assert d.placement.gpu_indices == (0,) and d.placement.mode == SharingMode.MPS


def test_a_mig_request_takes_only_that_instance_else_a_whole_gpu():
    state = ClusterState(
        0.0, (gpu_node("n0", "A30", 1),), pending=(replace(job("g", 5), sharing="2g.12gb"),)
    )
    for name in ("sharing_mode", "binpack"):
        (d,) = _plan(name, state, share_mode="mig").decisions
        # 5 GB fits 1g.6gb, the policy's pick; the job asked 2g.12gb and gets it.
        assert (d.placement.mode, d.placement.mig_profile) == (SharingMode.MIG, "2g.12gb"), name
        assert "sharing: 2g.12gb" in d.explanation or name == "binpack"
    # A profile the GPU does not offer: the whole GPU, exclusive (a whole GPU serves any ask).
    odd = replace(state, pending=(replace(job("g", 5), sharing="7g.80gb"),))
    (d,) = _plan("binpack", odd, share_mode="mig").decisions
    assert (d.placement.mode, d.placement.mig_profile) == (SharingMode.EXCLUSIVE, None)


def test_gpu_jobs_go_to_a_cpu_node_only_when_they_allow_it():
    # seed 004's split sends the low-rate job to the CPU node; with allow_cpu off it waits
    # for the GPU instead (placement_rate and sharing_chain read the same split).
    pending = (pjob("g1", 1000, 10), pjob("s1", 20, 15))
    state = ClusterState(0.0, (titan_node(), *cpu_nodes(1)), pending)
    plan = _plan("placement_rate", state, check=False, max_jobs_per_gpu=1)
    where = {d.placement.job_id: d.placement for d in plan.decisions}
    assert not where["s1"].on_gpu  # the control: auto lets the split pick the CPU
    strict = tuple(replace(j, allow_cpu=False) for j in pending)
    for name in ("placement_rate", "sharing_chain", "placement_rate+exec_plan"):
        plan = _plan(name, replace(state, pending=strict), max_jobs_per_gpu=1)
        assert all(d.placement.on_gpu for d in plan.decisions), name
        assert "s1" in plan.waiting, name


def test_host_memory_is_reserved_per_node():
    # Two 16 GB nodes with a GPU each; three jobs of 10 GB host memory: two run, one waits.
    nodes = tuple(
        replace(gpu_node(f"n{i}", "V100", 1), memory_mb=16 * GB, free_memory_mb=16 * GB)
        for i in range(2)
    )
    pending = tuple(replace(job(f"j{i}", 4), memory_mb=10 * GB) for i in range(3))
    plan = _plan("fifo", ClusterState(0.0, nodes, pending))
    assert [d.placement.node for d in plan.decisions] == ["n0", "n1"]
    assert "host memory" in plan.waiting["j2"] or "no idle GPU" in plan.waiting["j2"]
    # One node with 4 GPUs and 16 GB: the memory, not the GPUs, limits it.
    big = replace(gpu_node("n0", "V100", 4), memory_mb=16 * GB, free_memory_mb=16 * GB)
    plan = _plan("fifo", ClusterState(0.0, (big,), pending))
    assert len(plan.decisions) == 1
    assert "needs 10240 MB of host memory on a node: at most 6144 MB free" in plan.waiting["j1"]


def test_admission_names_host_memory_and_unknown_mig_profiles():
    nodes = [
        replace(gpu_node("n0", "V100", 2), memory_mb=128 * GB),
        NodeState("c0", NodeKind.CPU, 8, 8, memory_mb=64 * GB),
    ]
    cap = capacity_of(nodes)
    huge = replace(job("a", 4), memory_mb=10 * 1024 * 1024 * 1024)
    assert (
        "largest GPU node of a usable model has 131072 MB" in admit(huge, cap).errors["memory_mb"]
    )
    cpu = JobSpec(id="c", gpus=0, memory_mb=100 * GB)
    assert "largest CPU node has 65536 MB" in admit(cpu, cap).errors["memory_mb"]
    assert admit(replace(job("a", 4), memory_mb=64 * GB), cap).ok
    mig = replace(job("m", 4), sharing="1g.6gb")
    assert "MIG profile 1g.6gb" in admit(mig, cap).errors["sharing"]


def test_sharing_values():
    for ok in ("never", "allowed", "mps", "time_slicing", "1g.6gb", "3g.20gb", "1g.10gb+me"):
        assert sharing_error(ok) is None, ok
    for bad in ("sometimes", "", "MPS", "1g"):
        assert sharing_error(bad) is not None, bad


def test_every_registered_policy_keeps_a_never_job_alone():
    # Whatever the site runs: a never job is never placed on a GPU with residents.
    never = replace(job("a", 4), sharing=SHARING_NEVER)
    state = _one_shared_gpu((never,))
    for name in available_policies():
        plan = build_policy(name, {}).schedule(state, random.Random(0))
        for d in plan.decisions:
            if d.placement.job_id == "a" and d.placement.on_gpu:
                assert d.placement.gpu_indices == (1,), name

"""``kscheduler`` (rules 1-5, saturation shares), ``even_partition`` and ``warped_slicer``."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.catalog import gpu_spec
from scheduler.classes import kernel_class
from scheduler.domain import ClusterState, GpuState, JobSpec, NodeKind, NodeState, SharingMode
from scheduler.kernels import footprint, kernel_profiles, share_for_saturation, tbs_for_share
from scheduler.policies.registry import build_policy
from tests.scheduler.snapshots import check_plan

KERNELS = kernel_profiles()
LIMITED = replace(
    gpu_spec("TitanXp"),
    sharing_modes=(SharingMode.EXCLUSIVE, SharingMode.MPS),
    mps_thread_limit=True,
)


def kernel(app, owner=None, k=0):
    return JobSpec(id=f"{k:02d}-{app}", name=app, profile=KERNELS[app], owner=owner)


def state(apps, spec=LIMITED, gpus=1, owners=None):
    jobs = [kernel(a, (owners or {}).get(a), k) for k, a in enumerate(apps)]
    node = NodeState(
        "n", NodeKind.GPU, 16, 16, gpus=tuple(GpuState("n", i, spec) for i in range(gpus))
    )
    return ClusterState(0.0, (node,), tuple(jobs))


def groups(name, apps, **params):
    policy = build_policy(name, {"max_gflops": 379.7, **params} if name == "kscheduler" else params)
    st = state(apps)
    policy.schedule(st, random.Random(0))
    return [[j.name for j in g] for g in policy.groups], policy


def test_sorting_puts_l1_then_memory_then_compute_longest_first():
    policy = build_policy("kscheduler")
    order = policy.sort_kernels([kernel(a) for a in ("QS", "SPMV", "LBM", "BS", "CUTCP")])
    assert [j.name for j in order] == ["LBM", "BS", "SPMV", "CUTCP", "QS"]  # BS 80 ms > SPMV 68


def test_rules_one_to_five():
    p = build_policy("kscheduler", {"max_gflops": 379.7})
    k = {a: kernel(a) for a in KERNELS}
    spec = LIMITED
    assert p.rules([k["NW"]], k["BS"], spec).startswith("rule 4")  # memory + memory
    assert p.rules([k["SPMV"]], k["BS"], spec).startswith("rule 2")  # 350 + 266 GB/s > 547.6
    assert p.rules([k["LBM"]], k["CONV"], spec).startswith("rule 3")  # l1 + l1
    assert p.rules([k["LBM"]], k["FT"], spec).startswith("rule 3")  # FT's L1 proxy is 13 >= 10
    assert p.rules([k["LBM"]], k["CP"], spec) is None  # CP: no L1 transactions
    assert p.rules([k["LBM"]], k["QS"], spec).startswith("rule 1")  # QS: 94 % of registers
    assert p.rules([k["QS"]], k["CUTCP"], spec).startswith("rule 1")  # 94 % + 51 % of registers
    # Rule 5 on small allocations (rule 1 would stop the real CUTCP + BO first).
    small = {
        a: JobSpec(id=a, profile=replace(KERNELS[a], saturation_tbs_per_sm=2)) for a in KERNELS
    }
    assert p.rules([small["CUTCP"]], small["BO"], spec).startswith("rule 5")  # EPC 5.7, 5.9
    # EPC > max (4) admits none > base (1); EPC > base admits none > max.
    assert p.rules([small["CUTCP"]], small["DX"], spec).startswith("rule 5")  # 5.67; 3.75
    assert p.rules([small["DX"]], small["CUTCP"], spec).startswith("rule 5")  # 3.75; 5.67
    assert p.rules([small["DX"]], small["SG"], spec).startswith("rule 5")  # 3.75; 4.02
    assert p.rules([small["DX"]], small["CP"], spec) is None  # 3.75; 3.41
    assert p.rules([small["CUTCP"]], small["FT"], spec) is None  # 5.67; 0.55

    assert p.rules([k["CUTCP"]], k["LM"], spec) is None  # EPC 5.7 with 0.17
    assert p.rules([k["LM"]], k["LM"], spec).startswith("rule 2")  # 2 x 200 GFLOPS > 379.7
    assert p.rules([k["SPMV"], k["LM"]], k["FT"], spec) is None  # three members fit
    alice, bob = kernel("LM", "alice"), kernel("SPMV", "bob")
    assert "owner" in p.rules([alice], bob, spec)


def test_groups_obey_the_rules_and_cover_every_kernel():
    apps = ("LM", "CUTCP", "FT", "BS", "STENCIL", "SPMV")
    got, policy = groups("kscheduler", apps)
    assert sorted(a for g in got for a in g) == sorted(apps)
    for g in got:
        classes = [kernel_class(KERNELS[a]) for a in g]
        assert classes.count("memory") <= 1 and classes.count("l1") <= 1
        sat = [KERNELS[a].saturation_tbs_per_sm for a in g]
        assert sum(KERNELS[a].registers_per_block * s for a, s in zip(g, sat, strict=True)) < 65536
    assert len(got) == 3  # three memory kernels: at least three groups (rule 4)


def test_first_group_runs_with_saturation_percentages_and_the_rest_waits():
    apps = ("LM", "CUTCP", "BS", "SPMV")
    policy = build_policy("kscheduler", {"max_gflops": 379.7})
    st = state(apps)
    plan = policy.schedule(st, random.Random(0))
    check_plan(st, plan, max_jobs_per_gpu=4)
    first = [j.name for j in policy.groups[0]]
    placed = {d.placement.job_id.split("-")[1]: d.placement for d in plan.decisions}
    assert sorted(placed) == sorted(first)
    for name, pl in placed.items():
        assert pl.mode == SharingMode.MPS
        assert pl.mps_percentage == share_for_saturation(KERNELS[name])
    for why in plan.waiting.values():
        assert "waits for an idle GPU" in why or "waits for its first member" in why


def test_no_percentage_where_the_gpu_ignores_it():
    st = state(("LM", "SPMV"), spec=replace(LIMITED, mps_thread_limit=False, architecture="Pascal"))
    plan = build_policy("kscheduler").schedule(st, random.Random(0))
    assert plan.decisions and all(d.placement.mps_percentage is None for d in plan.decisions)
    assert all("not enforced (Pascal" in d.explanation for d in plan.decisions)


def test_a_group_holds_one_owner():
    st = state(("LM", "SPMV"), owners={"LM": "alice", "SPMV": "bob"})
    plan = build_policy("kscheduler").schedule(st, random.Random(0))
    assert len(plan.decisions) == 1  # bob's kernel waits: alice's group holds the GPU


def test_even_partition_splits_equally_in_queue_order():
    got, policy = groups("even_partition", ("LM", "CUTCP", "FT", "BS", "STENCIL"), group_size=3)
    assert got == [["LM", "CUTCP", "FT"], ["BS", "STENCIL"]]
    assert [policy.shares[j.id] for j in policy.groups[0]] == [33, 33, 33]
    assert [policy.shares[j.id] for j in policy.groups[1]] == [50, 50]


def test_warped_slicer_water_fills_solo_curves_within_an_sm():
    got, policy = groups("warped_slicer", ("STENCIL", "SPMV", "LM"))
    assert got == [["STENCIL", "SPMV", "LM"]]
    shares = [policy.shares[j.id] for j in policy.groups[0]]
    # Each member gets at least one block and the group's blocks fit one SM's registers.
    blocks = [
        tbs_for_share(j.profile, pct / 100) for j, pct in zip(policy.groups[0], shares, strict=True)
    ]
    assert min(blocks) >= 1
    members = zip(blocks, policy.groups[0], strict=True)
    regs = sum(b * j.profile.registers_per_block for b, j in members)
    assert regs <= 65536
    # STENCIL (knee 12) is given more than the flat LavaMD (knee 2).
    assert shares[0] > shares[2]


@pytest.mark.parametrize("name", ["kscheduler", "even_partition", "warped_slicer"])
def test_non_kernels_run_alone(name):
    job = JobSpec(id="dl", gpu_memory_mb=1000)
    st = ClusterState(0.0, state(()).nodes, (job, kernel("LM", k=1)))
    plan = build_policy(name).schedule(st, random.Random(0))
    modes = {d.placement.job_id: d.placement.mode for d in plan.decisions}
    assert modes.get("dl") in (SharingMode.EXCLUSIVE, None)
    assert footprint(KERNELS["LM"], 2) > 0

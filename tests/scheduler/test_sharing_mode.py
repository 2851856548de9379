"""``sharing_mode`` (paper 001's criteria), ``byscale`` and ``sharing_random``."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ClusterState,
    GpuState,
    JobSpec,
    NodeKind,
    NodeState,
    Placement,
    Profile,
    RunningJob,
    SharingMode,
)
from scheduler.policies.registry import build_policy
from scheduler.policies.sharing_mode import preferred_mode
from tests.scheduler.snapshots import GB, check_plan

MIG, MPS, TS = SharingMode.MIG, SharingMode.MPS, SharingMode.TIME_SLICING
# Sizes of Table 6: small 5x56, medium 16x224, big 48x448.
SIZE = {"small": (5, 56), "medium": (16, 224), "big": (48, 448)}


def app(id, scale="medium", sens=1.2, cm=18.0, mem=2.0, owner=None, times=None):
    batch, image = SIZE[scale]
    profile = Profile(
        id,
        gpu_time_s=times or {"TitanXp": 100.0, "RTX2080Ti": 90.0, "A30": 80.0},
        sensitivity=sens,
        cm_ratio=cm,
        batch_size=batch,
        image_size=image,
    )
    return JobSpec(id=id, gpu_memory_mb=mem * GB, profile=profile, owner=owner)


def gpu(node, i, model, modes, jobs=(), mode=None, layout=(), slices=0):
    spec = replace(gpu_spec(model), sharing_modes=modes)
    return GpuState(
        node=node,
        index=i,
        spec=spec,
        mode=mode,
        job_ids=tuple(j.id for j in jobs),
        committed_memory_mb=sum(j.memory_need_mb() for j in jobs),
        mig_slices_used=slices,
        mig_layout=tuple(layout),
    )


def paper_cluster(residents=None, a30_layout=(), a30_used=()):
    """Paper 001's cluster: Titan Xp time-slicing, RTX 2080 Ti MPS, A30 MIG (one each)."""
    residents = residents or {}
    running = []
    gpus = {}
    for node, model, modes, mode in (
        ("titan", "TitanXp", (SharingMode.EXCLUSIVE, TS), TS),
        ("rtx", "RTX2080Ti", (SharingMode.EXCLUSIVE, MPS), MPS),
        ("a30", "A30", (SharingMode.EXCLUSIVE, MIG), MIG),
    ):
        jobs = residents.get(node, ())
        used = a30_used if node == "a30" else ()
        slices = sum(gpu_spec("A30").mig_profile(p).compute_slices for p in used)
        gpus[node] = gpu(
            node,
            0,
            model,
            modes,
            jobs,
            mode if jobs else None,
            a30_layout if node == "a30" else (),
            slices,
        )
        for k, j in enumerate(jobs):
            prof = used[k] if node == "a30" else None
            running.append(RunningJob(j, Placement(j.id, node, (0,), mode, mig_profile=prof), 0.0))
    nodes = tuple(NodeState(n, NodeKind.GPU, 16, 16, gpus=(g,)) for n, g in gpus.items())
    return nodes, tuple(running)


def plan_for(name, pending, residents=None, **kw):
    nodes, running = paper_cluster(residents, kw.pop("a30_layout", ()), kw.pop("a30_used", ()))
    state = ClusterState(0.0, nodes, tuple(pending), running)
    policy = build_policy(name, {"max_jobs_per_gpu": 4, **kw})
    plan = policy.schedule(state, random.Random(1))
    check_plan(state, plan, max_jobs_per_gpu=4)
    return plan


def test_criteria_of_section_4_3_2():
    assert preferred_mode("big", "low", "C", [])[0] == TS  # 1
    assert preferred_mode("big", "low", "M", [("small", "M")])[0] == TS  # 1 comes first
    assert preferred_mode("small", "high", "C", [])[0] == MIG  # 2 and 3
    assert preferred_mode("medium", "low", "C", [])[0] == MPS  # 3
    assert preferred_mode("small", "low", "M", [("big", "M")])[0] == MIG  # 4
    assert preferred_mode("small", "low", "M", [("big", "C")])[0] == MPS  # 5: C+M, low
    assert preferred_mode("small", "high", "C", [("big", "C")])[0] == MIG  # 5: C+C, high
    assert "criterion 4" in preferred_mode("small", "low", "M", [("big", "M")])[1]


def test_big_low_sensitivity_goes_to_time_slicing():
    (d,) = plan_for("sharing_mode", [app("a", "big", 1.2, mem=8)]).decisions
    assert (d.placement.node, d.placement.mode) == ("titan", TS)
    assert d.explanation.startswith("criterion 1")


def test_idle_gpu_by_sensitivity():
    plan = plan_for("sharing_mode", [app("hi", "small", 2.5), app("lo", "medium", 1.2)])
    where = {d.placement.job_id: (d.placement.node, d.placement.mode) for d in plan.decisions}
    assert where == {"hi": ("a30", MIG), "lo": ("rtx", MPS)}


def test_memory_intensive_next_to_memory_intensive_goes_to_mig():
    resident = app("r", "medium", 1.2, cm=5.0)
    plan = plan_for("sharing_mode", [app("m", "small", 1.2, cm=6.0)], {"rtx": (resident,)})
    (d,) = plan.decisions
    assert (d.placement.node, d.placement.mode) == ("a30", MIG)
    assert "criterion 4" in d.explanation


def test_second_choice_fallback_or_wait_when_the_preferred_mode_is_full():
    used = ("1g.6gb",) * 4
    kw = {"a30_layout": used, "a30_used": used}
    full = {"a30": tuple(app(f"r{i}", "small", 2.5, mem=5) for i in range(4))}
    job = app("hi", "small", 2.5, mem=5)
    # The A30 (MIG, preferred) is full: MPS, which criterion 2 also allows.
    (d,) = plan_for("sharing_mode", [job], full, **kw).decisions
    assert (d.placement.node, d.placement.mode) == ("rtx", MPS)
    assert "criterion 2 allows MPS or MIG" in d.explanation
    # The MPS GPU is full too: time-slicing only as a fallback, or wait.
    full["rtx"] = tuple(app(f"q{i}", "small", 1.2, mem=1) for i in range(4))
    (d,) = plan_for("sharing_mode", [job], full, **kw).decisions
    assert d.placement.node == "titan" and "fell back to time-slicing" in d.explanation
    strict = plan_for("sharing_mode", [job], full, fallback=False, **kw)
    assert not strict.decisions
    assert "criterion 3" in strict.waiting["hi"] and "fallback is off" in strict.waiting["hi"]


def test_mig_uses_a_free_instance_or_asks_for_a_relayout():
    job = app("hi", "small", 2.5, mem=5)
    (d,) = plan_for("sharing_mode", [job]).decisions
    assert d.placement.mig_profile == "1g.6gb" and d.placement.mig_layout == ("1g.6gb",)
    assert "creating the 1g.6gb instance" in d.explanation
    laid_out = plan_for("sharing_mode", [job], a30_layout=("2g.12gb", "1g.6gb", "1g.6gb"))
    (d,) = laid_out.decisions
    assert d.placement.mig_profile == "1g.6gb" and d.placement.mig_layout is None
    assert "creating" not in d.explanation


def test_mig_instances_in_one_cycle_follow_the_layout_rules():
    jobs = [app(f"j{i}", "small", 2.5, mem=10) for i in range(3)]  # 2g.12gb each
    plan = plan_for("sharing_mode", jobs, fallback=False)
    on_a30 = [d for d in plan.decisions if d.placement.node == "a30"]
    assert [d.placement.mig_profile for d in on_a30] == ["2g.12gb", "2g.12gb"]
    # A third 2g.12gb does not fit an A30: MPS, the criteria's second choice.
    (third,) = [d for d in plan.decisions if d.placement.node != "a30"]
    assert third.placement.mode == MPS and not plan.waiting


def test_byscale_maps_scale_to_mode_and_waits():
    plan = plan_for(
        "byscale", [app("b", "big", 2.5, mem=8), app("m", "medium"), app("s", "small", 1.2)]
    )
    where = {d.placement.job_id: d.placement.mode for d in plan.decisions}
    assert where == {"b": TS, "m": MPS, "s": MIG}
    busy = {"rtx": (app("r", "medium", owner=None, mem=9),)}
    waiting = plan_for("byscale", [app("m2", "medium", mem=4)], busy)
    assert not waiting.decisions and "ByScale (medium -> MPS)" in waiting.waiting["m2"]


def test_sharing_random_same_seed_same_plan_and_binding():
    jobs = [app(f"j{i}", "small", 1.2, mem=1) for i in range(6)]
    a = plan_for("sharing_random", jobs)
    b = plan_for("sharing_random", jobs)
    assert a == b and len(a.decisions) == 6
    bound = plan_for("sharing_random", jobs, bind=True, bind_seed=3)
    policy = build_policy("sharing_random", {"bind": True, "bind_seed": 3, "max_jobs_per_gpu": 4})
    nodes, running = paper_cluster()
    policy.begin_cycle(ClusterState(0.0, nodes, tuple(jobs), running), _view(policy, nodes, jobs))
    for d in bound.decisions:
        assert (d.placement.node, 0) == policy.bound_gpu(jobs[int(d.placement.job_id[1])])
        assert "random binding" in d.explanation


def _view(policy, nodes, jobs):
    from scheduler.policies.working_view import WorkingView

    return WorkingView(ClusterState(0.0, nodes, tuple(jobs)), colocate=True)


@pytest.mark.parametrize("name", ["sharing_mode", "byscale", "sharing_random"])
def test_mps_stays_with_one_owner(name):
    mine = app("r", "medium", 1.2, owner="alice")
    plan = plan_for(name, [app("x", "medium", 1.2, owner="bob")], {"rtx": (mine,)})
    for d in plan.decisions:
        assert not (d.placement.node == "rtx" and d.placement.mode == MPS)

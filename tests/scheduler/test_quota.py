"""The ``quota`` wrapper: guarantees under contention, borrowing, reclaim, fair-share order."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.domain import (
    Accounts,
    ActionKind,
    ClusterState,
    JobSpec,
    Placement,
    ProjectQuota,
    RunningJob,
    SharingMode,
)
from scheduler.fairshare import decayed_usage, fair_share_factors
from scheduler.policies.base import PolicyError
from scheduler.policies.registry import build_policy
from tests.scheduler.snapshots import check_plan, gpu_node

QUOTAS = (
    ProjectQuota("alpha", "V100", guaranteed=2, borrow_limit=2),
    ProjectQuota("beta", "V100", guaranteed=2, borrow_limit=2),
)


def _job(id: str, project: str, owner: str = "u", gpus: int = 1, **kw) -> JobSpec:
    return JobSpec(id=id, gpus=gpus, gpu_memory_mb=1024.0, project=project, owner=owner, **kw)


def _cluster(pending, running=(), quotas=QUOTAS, usage=None) -> ClusterState:
    """Two nodes of 2 V100 each (4 GPUs), the running jobs' GPUs marked busy."""
    nodes = [gpu_node("n1", "V100", 2), gpu_node("n2", "V100", 2)]
    busy: dict[tuple[str, int], list[str]] = {}
    for r in running:
        for key in r.placement.gpu_keys:
            busy.setdefault(key, []).append(r.job.id)
    out = []
    for node in nodes:
        gpus = tuple(
            replace(
                g,
                job_ids=tuple(busy.get(g.key, ())),
                mode=SharingMode.EXCLUSIVE if busy.get(g.key) else None,
                committed_memory_mb=1024.0 * len(busy.get(g.key, ())),
            )
            for g in node.gpus
        )
        out.append(replace(node, gpus=gpus))
    return ClusterState(
        now_s=100.0,
        nodes=tuple(out),
        pending=tuple(pending),
        running=tuple(running),
        accounts=Accounts(quotas=tuple(quotas), usage=usage or {}),
    )


def _running(job: JobSpec, node: str, index: int, started: float) -> RunningJob:
    return RunningJob(job, Placement(job.id, node, (index,)), started_s=started)


def _placed_projects(plan, state) -> dict[str, int]:
    jobs = {j.id: j for j in state.pending}
    out: dict[str, int] = {}
    for d in plan.decisions:
        project = jobs[d.placement.job_id].project
        out[project] = out.get(project, 0) + d.placement.gpu_count
    return out


def test_each_project_gets_its_guarantee_under_contention():
    # alpha queued first and asks for everything; beta's guarantee still comes first.
    pending = [_job(f"a{i}", "alpha") for i in range(4)] + [_job(f"b{i}", "beta") for i in range(4)]
    state = _cluster(pending)
    plan = build_policy("quota", {"base": "fifo", "base_params": {"backfill": True}}).schedule(
        state, random.Random(0)
    )
    check_plan(state, plan)
    assert _placed_projects(plan, state) == {"alpha": 2, "beta": 2}
    for job_id in ("a2", "a3", "b2", "b3"):
        assert "would borrow" in plan.waiting[job_id]


def test_idle_capacity_is_lent_up_to_the_borrowing_limit():
    quotas = (
        ProjectQuota("alpha", "V100", guaranteed=1, borrow_limit=2),
        ProjectQuota("beta", "V100", guaranteed=1, borrow_limit=0),
    )
    pending = [_job(f"a{i}", "alpha") for i in range(4)]
    state = _cluster(pending, quotas=quotas)
    plan = build_policy("quota", {"base_params": {"backfill": True}}).schedule(
        state, random.Random(0)
    )
    check_plan(state, plan)
    assert _placed_projects(plan, state) == {"alpha": 3}  # 1 guaranteed + 2 borrowed
    assert plan.waiting["a3"] == (
        "waiting for quota: project alpha at its guaranteed 1 V100; borrowing limit reached "
        "(2 borrowed of 2)"
    )
    borrowed = [d for d in plan.decisions if "borrows" in d.explanation]
    assert len(borrowed) == 2
    assert all(d.policy == "quota" and d.explanation.startswith("fifo: ") for d in plan.decisions)


def test_refused_jobs_leave_their_gpus_to_others_in_the_same_cycle():
    quotas = (ProjectQuota("alpha", "V100", guaranteed=1, borrow_limit=0),)
    # alpha's second job would be placed by fifo first; it is refused and beta's job gets a GPU.
    pending = [_job("a0", "alpha"), _job("a1", "alpha"), _job("b0", "beta")]
    state = _cluster(pending, quotas=quotas)
    plan = build_policy("quota", {"fair_share": False}).schedule(state, random.Random(0))
    assert sorted(d.placement.job_id for d in plan.decisions) == ["a0", "b0"]
    assert plan.waiting["a1"] == "waiting for quota: project alpha at its guaranteed 1 V100; " + (
        "no borrowing"
    )


def test_borrowed_gpus_are_reclaimed_newest_first_within_one_cycle():
    # alpha borrowed all 4 GPUs while beta was idle; beta comes back with 2 jobs.
    running = [
        _running(_job("a0", "alpha"), "n1", 0, started=10.0),
        _running(_job("a1", "alpha"), "n1", 1, started=20.0),
        _running(_job("a2", "alpha"), "n2", 0, started=30.0),
        _running(_job("a3", "alpha"), "n2", 1, started=40.0),
    ]
    pending = [_job("b0", "beta"), _job("b1", "beta")]
    state = _cluster(pending, running)
    plan = build_policy("quota", {}).schedule(state, random.Random(0))
    requeued = [a.job_id for a in plan.actions if a.kind == ActionKind.REQUEUE]
    assert requeued == ["a3", "a2"]  # the newest borrowed ones, and no more than beta needs
    assert plan.decisions == ()
    assert "reclaiming 1 V100 borrowed by project alpha (jobs a3)" in plan.waiting["b0"]
    assert "jobs a2" in plan.waiting["b1"]

    # Next cycle (the live loop requeued them): beta gets both GPUs before alpha's requeued jobs.
    after = _cluster(
        [*pending, _job("a2", "alpha"), _job("a3", "alpha")], running[:2], quotas=QUOTAS
    )
    plan2 = build_policy("quota", {}).schedule(after, random.Random(0))
    check_plan(after, plan2)
    assert sorted(d.placement.job_id for d in plan2.decisions) == ["b0", "b1"]
    assert not plan2.actions


def test_no_reclaim_from_a_project_within_its_guarantee():
    running = [
        _running(_job("a0", "alpha"), "n1", 0, 10.0),
        _running(_job("a1", "alpha"), "n1", 1, 20.0),
        _running(_job("b0", "beta"), "n2", 0, 30.0),
        _running(_job("b1", "beta"), "n2", 1, 40.0),
    ]
    state = _cluster([_job("b2", "beta")], running)
    plan = build_policy("quota", {}).schedule(state, random.Random(0))
    assert plan.actions == ()
    assert "b2" in plan.waiting


def test_without_quotas_it_places_what_the_base_policy_places():
    pending = [_job(f"j{i}", "p") for i in range(5)]
    state = _cluster(pending, quotas=())
    base = build_policy("fifo", {}).schedule(state, random.Random(0))
    wrapped = build_policy("quota", {"fair_share": False}).schedule(state, random.Random(0))
    assert [d.placement for d in wrapped.decisions] == [d.placement for d in base.decisions]
    assert set(wrapped.waiting) == set(base.waiting)


def test_fair_share_orders_equal_jobs_by_past_usage():
    # Same project, same priority; bob used far more than carol lately: carol goes first.
    pending = [_job("bob1", "lab", owner="bob"), _job("carol1", "lab", owner="carol")]
    usage = {("lab", "bob"): 36_000.0, ("lab", "carol"): 600.0}
    nodes = _cluster(pending, quotas=(), usage=usage)
    one_gpu = replace(nodes, nodes=(replace(nodes.nodes[0], gpus=nodes.nodes[0].gpus[:1]),))
    plan = build_policy("quota", {}).schedule(one_gpu, random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] == ["carol1"]
    # Reversed usage, reversed order; fair share off: queue order.
    flipped = replace(
        one_gpu, accounts=Accounts(usage={("lab", "bob"): 600.0, ("lab", "carol"): 36_000.0})
    )
    plan = build_policy("quota", {}).schedule(flipped, random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] == ["bob1"]
    plan = build_policy("quota", {"fair_share": False}).schedule(one_gpu, random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] == ["bob1"]


def test_fair_share_factor_values():
    accounts = Accounts(usage={("a", "x"): 100.0, ("b", "y"): 0.0})
    f = fair_share_factors(accounts)
    # a used all (U=1) of an even share (S=0.5): 2^-2 at the project level, 2^-1 for its only user
    assert f[("a", "x")] == pytest.approx(0.25 * 0.5)
    assert f[("b", "y")] == pytest.approx(1.0)
    # priority beats fair share
    hi = _job("hi", "a", owner="x", priority=5)
    lo = _job("lo", "b", owner="y")
    state = _cluster([lo, hi], quotas=(), usage=dict(accounts.usage))
    one_gpu = replace(state, nodes=(replace(state.nodes[0], gpus=state.nodes[0].gpus[:1]),))
    plan = build_policy("quota", {}).schedule(one_gpu, random.Random(0))
    assert [d.placement.job_id for d in plan.decisions] == ["hi"]


def test_decayed_usage_halves_every_half_life():
    # 1 GPU for 10 s ending now: about 10; the same 10 s one half-life ago: about 5.
    assert decayed_usage(1.0, 990.0, 1000.0, 1000.0, 3600.0) == pytest.approx(10.0, rel=1e-2)
    assert decayed_usage(1.0, 990.0 - 3600, 1000.0 - 3600, 1000.0, 3600.0) == pytest.approx(
        5.0, rel=1e-2
    )
    assert decayed_usage(2.0, 0.0, 10.0, 10.0, 0.0) == 20.0
    assert decayed_usage(1.0, 5.0, 50.0, 10.0, 3600.0) == pytest.approx(5.0, rel=1e-2)


def test_bad_parameters_are_refused():
    with pytest.raises(PolicyError):
        build_policy("quota", {"base": "quota"})
    with pytest.raises(PolicyError):
        build_policy("quota", {"base": "nope"})
    with pytest.raises(PolicyError):
        build_policy("quota", {"max_rounds": 0})


def test_actions_of_a_wrapped_execution_plan_are_passed_on_once():
    # A refusal makes the wrapper run exec_plan again: its pauses are passed on once.
    from scheduler.domain import MemoryStep, Profile

    growing = Profile(
        "grow",
        gpu_time_s={"V100": 100.0},
        memory_steps=(MemoryStep(0.0, 1000.0, 2000.0), MemoryStep(0.5, 2000.0, 15000.0)),
    )
    a = JobSpec(id="a", gpus=1, profile=growing, project="alpha", owner="u")
    b = JobSpec(id="b", gpus=1, profile=growing, project="alpha", owner="u")
    shared = Placement("a", "n1", (0,), mode=SharingMode.TIME_SLICING)
    running = [
        RunningJob(a, shared, started_s=0.0, progress=0.45),
        RunningJob(b, replace(shared, job_id="b"), started_s=0.0, progress=0.45),
    ]
    state = _cluster([_job("p0", "alpha"), _job("p1", "alpha")], quotas=())
    busy = replace(
        state.nodes[0].gpus[0],
        job_ids=("a", "b"),
        mode=SharingMode.TIME_SLICING,
        committed_memory_mb=4000.0,
    )
    nodes = (replace(state.nodes[0], gpus=(busy, state.nodes[0].gpus[1])), state.nodes[1])
    quotas = (ProjectQuota("alpha", "V100", guaranteed=0, borrow_limit=1),)
    state = replace(state, nodes=nodes, running=tuple(running), accounts=Accounts(quotas=quotas))
    base = build_policy("all_gpu+exec_plan", {})
    alone = base.schedule(state, random.Random(0))
    assert alone.actions and {a.kind for a in alone.actions} == {ActionKind.PAUSE}
    wrapped = build_policy("quota", {"base": "all_gpu+exec_plan"})
    plan = wrapped.schedule(state, random.Random(0))
    assert "quota" in plan.waiting["p0"]  # refused: the base ran again
    assert [(a.kind, a.job_id) for a in plan.actions] == [(a.kind, a.job_id) for a in alone.actions]


def test_a_two_gpu_job_reclaims_both_gpus_on_one_node():
    # alpha borrowed 3 GPUs (guarantee 1): a0 on n1 (oldest), a1 on n1, a2 on n2, a3 on n2
    # (newest). beta (guarantee 2) asks for 2 GPUs on one node: newest first across nodes would
    # free n2/1 and n1/1, two GPUs on different nodes; it frees both GPUs of n2 instead.
    quotas = (
        ProjectQuota("alpha", "V100", guaranteed=1, borrow_limit=3),
        ProjectQuota("beta", "V100", guaranteed=2, borrow_limit=0),
    )
    running = [
        _running(_job("a0", "alpha"), "n1", 0, started=10.0),
        _running(_job("a2", "alpha"), "n2", 0, started=20.0),
        _running(_job("a1", "alpha"), "n1", 1, started=30.0),
        _running(_job("a3", "alpha"), "n2", 1, started=40.0),
    ]
    state = _cluster([_job("b", "beta", gpus=2)], running, quotas=quotas)
    plan = build_policy("quota", {}).schedule(state, random.Random(0))
    assert sorted(a.job_id for a in plan.actions) == ["a2", "a3"]
    assert "reclaiming 2 V100 on n2 borrowed by project alpha" in plan.waiting["b"]


def test_no_reclaim_for_a_job_that_could_not_use_the_gpus():
    running = [
        _running(_job(f"a{i}", "alpha"), f"n{1 + i // 2}", i % 2, 10.0 * i) for i in range(4)
    ]
    too_big = JobSpec(id="b", gpus=1, gpu_memory_mb=64_000.0, project="beta", owner="u")
    plan = build_policy("quota", {}).schedule(_cluster([too_big], running), random.Random(0))
    assert plan.actions == ()
    fits = _job("b", "beta")
    plan = build_policy("quota", {}).schedule(_cluster([fits], running), random.Random(0))
    assert [a.job_id for a in plan.actions] == ["a3"]

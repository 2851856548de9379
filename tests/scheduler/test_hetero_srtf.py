"""hetero_srtf: the policy on snapshots and small simulated clusters (its estimates and keys:
``test_hetero_srtf_estimates.py``; its model assignment: ``test_hetero_srtf_assign.py``)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from scheduler.domain import ActionKind, ClusterState, JobSpec, Profile, SharingMode
from scheduler.interference import MeasuredInterference
from scheduler.policies.base import PolicyError
from scheduler.policies.hetero_srtf import HeteroSrtfPolicy
from scheduler.simulator import SimConfig, simulate
from tests.scheduler.sim_helpers import cluster
from tests.scheduler.snapshots import gpu_node


def gjob(
    job_id: str,
    times: dict[str, float],
    *,
    arrival: float = 0.0,
    gpus: int = 1,
    job_type: str | None = None,
) -> JobSpec:
    return JobSpec(
        id=job_id,
        arrival_s=arrival,
        gpus=gpus,
        job_type=job_type,
        profile=Profile(name=f"p-{job_id}", gpu_time_s=times),
    )


def one_gpu(model: str = "V100", count: int = 1):
    return cluster({"name": model.lower(), "count": count, "gpu_model": model, "gpus_per_node": 1})


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(PolicyError):
        HeteroSrtfPolicy(preempt_margin=1.5)
    with pytest.raises(PolicyError):
        HeteroSrtfPolicy(aging="x")


# -- the policy on snapshots and in the simulator ------------------------------------------


def test_shortest_first_and_heterogeneity_aware_placement_on_a_snapshot() -> None:
    state = ClusterState(
        now_s=0.0,
        nodes=(gpu_node("v", "V100", 1), gpu_node("k", "K80", 1)),
        pending=(
            gjob("long", {"V100": 9000.0, "K80": 10000.0}),
            gjob("short", {"V100": 100.0, "K80": 1000.0}),
            gjob("mid", {"V100": 500.0, "K80": 600.0}),
        ),
    )
    plan = HeteroSrtfPolicy(pack_threshold=0).schedule(state, random.Random(0))
    placed = {d.placement.job_id: d.placement.node for d in plan.decisions}
    # The two shortest run; short (10x faster on V100) gets the V100, mid the K80.
    assert placed == {"short": "v", "mid": "k"}
    assert "long" in plan.waiting and "shortest predicted remaining time" in plan.waiting["long"]
    assert all(d.placement.mode == SharingMode.EXCLUSIVE for d in plan.decisions)


def test_a_short_arrival_preempts_a_long_job_and_the_cost_delays_its_restart() -> None:
    jobs = [gjob("long", {"V100": 1000.0}), gjob("short", {"V100": 100.0}, arrival=100.0)]
    for cost, finish in ((0.0, 1100.0), (60.0, 1160.0)):
        res = simulate(
            one_gpu(),
            jobs,
            HeteroSrtfPolicy(**{"preemption_cost_s": cost}),
            config=SimConfig(preemption_cost_s=cost),
        )
        rec = {r.job_id: r for r in res.jobs}
        assert rec["short"].finish_s == pytest.approx(200.0)
        assert rec["long"].finish_s == pytest.approx(finish)
        assert rec["long"].preemptions == 1


def test_a_preemption_that_does_not_pay_its_cost_is_not_made() -> None:
    # The long job has 120 s left when the 100-s job arrives: not worth a 60-s restart.
    jobs = [gjob("long", {"V100": 220.0}), gjob("short", {"V100": 100.0}, arrival=100.0)]
    res = simulate(
        one_gpu(),
        jobs,
        HeteroSrtfPolicy(**{"preemption_cost_s": 60.0}),
        config=SimConfig(preemption_cost_s=60.0),
    )
    rec = {r.job_id: r for r in res.jobs}
    assert rec["long"].preemptions == 0
    assert rec["long"].finish_s == pytest.approx(220.0)


def test_no_job_is_preempted_more_than_the_bound() -> None:
    # Short jobs keep arriving while a long one runs: each would preempt it.
    jobs = [gjob("j0", {"V100": 5000.0})]
    for i in range(1, 12):
        jobs.append(gjob(f"j{i}", {"V100": 10.0}, arrival=100.0 * i))
    res = simulate(one_gpu(), jobs, HeteroSrtfPolicy(**{"max_preemptions": 2}))
    assert all(r.end_reason == "completed" for r in res.jobs)
    assert max(r.preemptions for r in res.jobs) == 2
    unbounded = simulate(one_gpu(), jobs, HeteroSrtfPolicy(**{"max_preemptions": 100}))
    assert max(r.preemptions for r in unbounded.jobs) > 2


def test_aging_prevents_starvation_behind_a_stream_of_short_jobs() -> None:
    # One long job, then two 100-s jobs every 200 s for 60,000 s: the GPU is never idle.
    jobs = [gjob("long", {"V100": 1000.0}, arrival=1.0)]
    jobs += [gjob(f"s{i}", {"V100": 100.0}, arrival=200.0 * (i // 2)) for i in range(600)]
    finish = {}
    for aging in (0.0, 0.5, 2.0):
        res = simulate(one_gpu(), jobs, HeteroSrtfPolicy(aging=aging, ftf_cap=0))
        assert all(r.end_reason == "completed" for r in res.jobs)
        finish[aging] = {r.job_id: r for r in res.jobs}["long"].finish_s
    # Without aging it waits for the whole stream; with aging its key
    # 1000 / (1 + aging x age / 1000) falls below the short jobs' and it runs while they still
    # arrive, the sooner the larger the weight.
    assert finish[0.0] > 60_000
    assert finish[2.0] < finish[0.5] < 45_000
    # The finish-time-fairness cap (2 by default) bounds the wait without aging, too.
    capped = simulate(one_gpu(), jobs, HeteroSrtfPolicy(aging=0.0))
    assert {r.job_id: r for r in capped.jobs}["long"].finish_s < 20_000


def test_measured_pairs_are_packed_above_the_threshold_only() -> None:
    # The simulator's knowledge starts from the Gavel table (exact here: no pair noise), with
    # the smallest spread it gives a prior (sigma 0.05): the policy packs on the pair's
    # throughput one standard deviation below the estimate.
    table = MeasuredInterference()
    spec = gpu_node("v", "V100", 1).gpus[0].spec
    a_type, b_type = "ResNet-18 (batch size 16)", "ResNet-18 (batch size 64)"
    a = gjob("a", {"V100": 1000.0}, job_type=a_type)
    b = gjob("b", {"V100": 1000.0}, job_type=b_type)
    s_a, s_b = table.measured_pair(a, b, spec), table.measured_pair(b, a, spec)
    assert s_a is not None and s_b is not None
    value = 1 / s_a + 1 / s_b  # 2.0 for this pair (measured at solo speed on V100)
    low = value * math.exp(-0.05)  # 1.90
    for threshold, sigmas, packed in (
        (low - 0.05, 1.0, True),
        (low + 0.05, 1.0, False),  # the central estimate would pass, the cautious one not
        (low + 0.05, 0.0, True),
        (0.0, 1.0, False),
    ):
        res = simulate(
            one_gpu(),
            [a, b],
            HeteroSrtfPolicy(pack_threshold=threshold, pack_sigmas=sigmas),
            interference=table,
        )
        rec = {r.job_id: r for r in res.jobs}
        both_at_once = rec["b"].start_s == pytest.approx(0.0)
        assert both_at_once is packed, (threshold, sigmas)
        if packed:
            assert rec["b"].mode == "mps" and "packed next to job a" in rec["b"].explanation
            basis = "central estimate" if sigmas == 0 else "1 standard deviation below the estimate"
            assert f"({basis}) >= {threshold:.2f}" in rec["b"].explanation


def test_a_pair_known_only_from_its_prior_needs_a_margin_a_measured_one_does_not() -> None:
    from scheduler.knowledge import Knowledge, Observation, ObservationKind

    host = gjob("a", {"V100": 1000.0}, job_type="ta")
    joiner = gjob("b", {"V100": 2000.0}, job_type="tb")
    state = ClusterState(
        now_s=5.0,
        nodes=(gpu_node("v", "V100", 1, gpus={0: _busy("v", "a")}),),
        pending=(joiner,),
        running=(_running(host, "v"),),
    )

    def knowledge(measured: bool) -> Knowledge:
        # The prior holds that each runs at 0.8 of its solo speed beside the other (1.6
        # jobs' worth, sigma 0.3: 1.19 one standard deviation down).
        k = Knowledge(pair_prior=lambda job, co, model, mode: 0.8, pair_prior_sigma=0.3)
        if measured:  # earlier jobs of both types ran alone and beside each other at 0.8
            for i in range(4):
                for own, other in (("ta", "tb"), ("tb", "ta")):
                    jid = f"{own}{i}"
                    for start, frac, co, mode in (
                        (0.0, 0.1, (), SharingMode.EXCLUSIVE),
                        (0.1, 0.08, (other,), SharingMode.MPS),
                    ):
                        k.observe(
                            Observation(
                                ObservationKind.PROGRESS,
                                jid,
                                own,
                                at_s=100.0,
                                window_s=100.0,
                                gpu_model="V100",
                                mode=mode,
                                co_runners=co,
                                progress_from=start,
                                progress_to=start + frac,
                            )
                        )
        return k

    def packed(measured: bool, sigmas: float) -> bool:
        policy = HeteroSrtfPolicy(pack_threshold=1.4, pack_sigmas=sigmas)
        plan = policy.schedule(replace(state, knowledge=knowledge(measured)), random.Random(0))
        placed = [d for d in plan.decisions if d.placement.job_id == "b"]
        assert not plan.actions  # the host is shorter: nobody is preempted
        return bool(placed) and placed[0].placement.mode == SharingMode.MPS

    assert packed(measured=False, sigmas=0.0)  # 1.6 >= 1.4 on the central estimate
    assert not packed(measured=False, sigmas=1.0)  # 1.19 < 1.4: the prior alone is too unsure
    assert packed(measured=True, sigmas=1.0)  # measured at 0.8 each: the spread is small


def test_preemption_actions_name_their_reason_and_are_counted() -> None:
    policy = HeteroSrtfPolicy()
    running = simulate(
        one_gpu(),
        [gjob("long", {"V100": 1000.0})],
        HeteroSrtfPolicy(),
        config=SimConfig(max_time_s=1.0),
    )
    assert running.jobs[0].end_reason == "unfinished"
    state = ClusterState(
        now_s=5.0,
        nodes=(gpu_node("v", "V100", 1, gpus={0: _busy("v", "long")}),),
        pending=(gjob("short", {"V100": 10.0}, arrival=5.0),),
        running=(_running(gjob("long", {"V100": 1000.0}), "v"),),
    )
    plan = policy.schedule(state, random.Random(0))
    assert [(a.kind, a.job_id) for a in plan.actions] == [(ActionKind.REQUEUE, "long")]
    assert "preempted for shorter jobs" in plan.actions[0].explanation
    assert [d.placement.job_id for d in plan.decisions] == ["short"]
    assert policy.preemptions == {"long": 1}


def _busy(node: str, job_id: str):
    from scheduler.catalog import gpu_spec
    from scheduler.domain import GpuState

    return GpuState(
        node=node, index=0, spec=gpu_spec("V100"), mode=SharingMode.MPS, job_ids=(job_id,)
    )


def _running(job: JobSpec, node: str):
    from scheduler.domain import Placement, RunningJob

    return RunningJob(job, Placement(job.id, node, (0,), mode=SharingMode.MPS), 0.0, 0.005)


def _on_k80(progress: float) -> ClusterState:
    from scheduler.catalog import gpu_spec
    from scheduler.domain import GpuState, Placement, RunningJob

    a = gjob("a", {"V100": 1000.0, "K80": 4000.0})
    busy = GpuState("k", 0, gpu_spec("K80"), SharingMode.MPS, ("a",))
    return ClusterState(
        now_s=10.0,
        nodes=(gpu_node("v", "V100", 1), gpu_node("k", "K80", 1, gpus={0: busy})),
        pending=(),
        running=(
            RunningJob(a, Placement("a", "k", (0,), SharingMode.MPS), 0.0, progress=progress),
        ),
    )


def test_a_running_job_moves_to_an_idle_faster_gpu_when_it_pays() -> None:
    # 90 % left: 3,600 s on the K80 against 900 s on the idle V100 (+ 60 s restart).
    plan = HeteroSrtfPolicy().schedule(_on_k80(0.1), random.Random(0))
    assert [(a.kind, a.job_id) for a in plan.actions] == [(ActionKind.REQUEUE, "a")]
    assert "moved from K80 to V100" in plan.actions[0].explanation
    assert [(d.placement.job_id, d.placement.node) for d in plan.decisions] == [("a", "v")]
    # Almost done (2 % left: 80 s on the K80, 20 s + 60 s restart on the V100): it stays.
    assert HeteroSrtfPolicy().schedule(_on_k80(0.98), random.Random(0)).actions == ()
    # A restart cost larger than the saving: it stays too.
    costly = HeteroSrtfPolicy(preemption_cost_s=5000.0)
    assert costly.schedule(_on_k80(0.1), random.Random(0)).actions == ()


def test_the_bound_also_reads_the_callers_preemption_count() -> None:
    # A fresh policy object (the portal builds one per cycle) learns the count from the job.
    import dataclasses

    state = _on_k80(0.1)
    rj = state.running[0]
    counted = dataclasses.replace(rj.job, params={"preemptions": 5})
    # Only the K80 node, and a much shorter job waiting: the cap decides whether it preempts.
    short = gjob("b", {"K80": 100.0})
    state = dataclasses.replace(
        state,
        nodes=state.nodes[1:],
        running=(dataclasses.replace(rj, job=counted),),
        pending=(short,),
    )
    assert HeteroSrtfPolicy(max_preemptions=5).schedule(state, random.Random(0)).actions == ()
    assert HeteroSrtfPolicy(max_preemptions=6).schedule(state, random.Random(0)).actions != ()


def test_the_preemption_cap_never_pins_a_job_on_a_slow_model() -> None:
    # Preempted 5 times (at the cap): nobody pushes it out any more, but an idle V100 that
    # saves it 45 minutes still takes it.
    import dataclasses

    state = _on_k80(0.1)
    rj = state.running[0]
    counted = dataclasses.replace(rj.job, params={"preemptions": 5})
    state = dataclasses.replace(state, running=(dataclasses.replace(rj, job=counted),))
    plan = HeteroSrtfPolicy(max_preemptions=5).schedule(state, random.Random(0))
    assert [(d.placement.job_id, d.placement.node) for d in plan.decisions] == [("a", "v")]
    assert "moved from K80 to V100" in plan.actions[0].explanation


def test_the_churn_budget_bounds_requeues_per_cycle() -> None:
    # 4 GPUs run long jobs, 4 much shorter jobs wait: without a budget all 4 are preempted;
    # with churn_budget 0.02 (of 4 running: at least one) only the longest goes this cycle.
    from scheduler.catalog import gpu_spec
    from scheduler.domain import GpuState, Placement, RunningJob

    longs = [gjob(f"l{i}", {"K80": 10_000.0 * (i + 1)}) for i in range(4)]
    busy = {
        i: GpuState("k", i, gpu_spec("K80"), SharingMode.EXCLUSIVE, (j.id,))
        for i, j in enumerate(longs)
    }
    state = ClusterState(
        now_s=10.0,
        nodes=(gpu_node("k", "K80", 4, gpus=busy),),
        pending=tuple(gjob(f"s{i}", {"K80": 100.0}, arrival=5.0) for i in range(4)),
        running=tuple(
            RunningJob(j, Placement(j.id, "k", (i,), SharingMode.EXCLUSIVE), 0.0, progress=0.0)
            for i, j in enumerate(longs)
        ),
    )
    free = HeteroSrtfPolicy(churn_budget=1.0, pack_threshold=0).schedule(state, random.Random(0))
    assert sorted(a.job_id for a in free.actions) == ["l0", "l1", "l2", "l3"]
    capped = HeteroSrtfPolicy(pack_threshold=0, churn_min=1).schedule(state, random.Random(0))
    assert [a.job_id for a in capped.actions] == ["l3"]
    assert len(capped.decisions) == 1
    # churn_min: a small cluster may always re-plan that many jobs (2 % of 4 is none).
    two = HeteroSrtfPolicy(pack_threshold=0, churn_min=2).schedule(state, random.Random(0))
    assert sorted(a.job_id for a in two.actions) == ["l2", "l3"]
    # Above churn_min jobs' worth, the share rules: 50 % of 4 running jobs.
    half = HeteroSrtfPolicy(pack_threshold=0, churn_min=1, churn_budget=0.5).schedule(
        state, random.Random(0)
    )
    assert sorted(a.job_id for a in half.actions) == ["l2", "l3"]


def test_the_ftf_cap_averages_the_jobs_present_over_a_jobs_life() -> None:
    # One V100. From 0 to 20,000 s a long job runs and "b" (1,000 s) waits: two jobs present.
    # Then the GPU frees and 20 jobs of 200 s arrive. Counting the 21 present now, b's share
    # looks generous (rho = 21,000 / 21,000 = 1) and the cap of 2 stays silent; over b's life
    # the count averages about 3 (rho about 7), as the metric measures it, so b goes first.
    from scheduler.catalog import gpu_spec
    from scheduler.domain import GpuState, Placement, RunningJob

    b = gjob("b", {"V100": 1000.0})
    hog = gjob("hog", {"V100": 20_000.0})
    busy = GpuState("v", 0, gpu_spec("V100"), SharingMode.EXCLUSIVE, ("hog",))
    early = ClusterState(
        now_s=0.0,
        nodes=(gpu_node("v", "V100", 1, gpus={0: busy}),),
        pending=(b,),
        running=(
            RunningJob(hog, Placement("hog", "v", (0,), SharingMode.EXCLUSIVE), 0.0, progress=0.0),
        ),
    )
    shorts = tuple(gjob(f"s{i}", {"V100": 200.0}, arrival=20_000.0) for i in range(20))
    late = ClusterState(now_s=20_000.0, nodes=(gpu_node("v", "V100", 1),), pending=(b, *shorts))

    def first(policy: HeteroSrtfPolicy, *states: ClusterState) -> str:
        plan = None
        for s in states:
            plan = policy.schedule(s, random.Random(0))
        assert plan is not None and len(plan.decisions) == 1
        return plan.decisions[0].placement.job_id

    settings = {"aging": 0.0, "pack_threshold": 0}
    # The policy that saw b wait through the quiet spell caps it.
    assert first(HeteroSrtfPolicy(ftf_cap=2.0, **settings), early, late) == "b"
    # Seeing only the burst, it counts 21 jobs over b's whole life: no cap, shortest first.
    assert first(HeteroSrtfPolicy(ftf_cap=2.0, **settings), late).startswith("s")
    # Without the cap, shortest first either way.
    assert first(HeteroSrtfPolicy(ftf_cap=0, **settings), early, late).startswith("s")
    # A fresh policy (the live loop's) reads the history from the snapshot instead: b was
    # one of two jobs present for 20,000 s; the shorts have just arrived.
    history = {"b": 40_000.0, **{s.id: 0.0 for s in shorts}}
    told = replace(late, present_job_s=history)
    assert first(HeteroSrtfPolicy(ftf_cap=2.0, **settings), told) == "b"
    # History that says the cluster was as busy all along leaves the shortest first.
    crowded = replace(late, present_job_s={**history, "b": 21 * 20_000.0})
    assert first(HeteroSrtfPolicy(ftf_cap=2.0, **settings), crowded).startswith("s")


def test_ftf_sigmas_weighs_the_age_of_a_job_that_may_be_shorter_than_declared() -> None:
    # One idle V100. "b" declared 10,000 s, has waited 12,000 s with one other job present on
    # average; "s" (200 s) has just arrived. As declared, b's share of half the GPU is 20,000 s
    # and its ratio (12,000 + 10,000) / 20,000 = 1.1: under the cap, shortest first. Were b
    # two standard deviations (prior sigma 0.5) shorter than declared, its age would count
    # e = 2.72 times: (32,600 + 10,000) / 20,000 = 2.1, over the cap, so b goes first.
    from scheduler.knowledge import Knowledge

    b = gjob("b", {"V100": 10_000.0})
    s = gjob("s", {"V100": 200.0}, arrival=12_000.0)
    state = ClusterState(
        now_s=12_000.0,
        nodes=(gpu_node("v", "V100", 1),),
        pending=(b, s),
        present_job_s={"b": 24_000.0, "s": 0.0},
        knowledge=Knowledge(prior_sigma=0.5),
    )

    def first(**params: float) -> str:
        policy = HeteroSrtfPolicy(aging=0.0, pack_threshold=0, ftf_cap=2.0, **params)
        plan = policy.schedule(state, random.Random(0))
        assert len(plan.decisions) == 1
        return plan.decisions[0].placement.job_id

    assert first() == "s"
    assert first(ftf_sigmas=1.0) == "s"  # 1.65 x 12,000: ratio 1.5
    assert first(ftf_sigmas=2.0) == "b"
    # The spread is the knowledge's: where declared lengths are known to be close, the same
    # caution weighs little.
    assert first(ftf_sigmas=2.0) == "b"
    # A job that ran past its declared length is known not to be shorter. At 20,000 s b runs
    # at progress 1 (a quarter of its length taken as left: 2,500 s) and a 200-s job arrives.
    # As declared b's ratio is (20,000 + 2,500) / 20,000 = 1.1, and the short job preempts
    # it; weighed, it would be (54,400 + 2,500) / 20,000 = 2.8 and keep its GPU.
    from scheduler.catalog import gpu_spec
    from scheduler.domain import GpuState, Placement, RunningJob

    late = gjob("late", {"V100": 200.0}, arrival=20_000.0)
    busy = GpuState("v", 0, gpu_spec("V100"), SharingMode.EXCLUSIVE, ("b",))
    past = replace(
        state,
        now_s=20_000.0,
        nodes=(gpu_node("v", "V100", 1, gpus={0: busy}),),
        pending=(late,),
        running=(
            RunningJob(b, Placement("b", "v", (0,), SharingMode.EXCLUSIVE), 0.0, progress=1.0),
        ),
        present_job_s={"b": 40_000.0, "late": 0.0},
    )
    plan = HeteroSrtfPolicy(aging=0.0, pack_threshold=0, ftf_sigmas=2.0).schedule(
        past, random.Random(0)
    )
    assert [a.job_id for a in plan.actions] == ["b"]
    assert [d.placement.job_id for d in plan.decisions] == ["late"]
    state = replace(state, knowledge=Knowledge(prior_sigma=0.1))
    assert first(ftf_sigmas=2.0) == "s"
    with pytest.raises(PolicyError, match="ftf_sigmas"):
        HeteroSrtfPolicy(ftf_sigmas=-1)


def test_restarts_bound_preemptions_by_their_share_of_the_jobs_length() -> None:
    """A running job keeps its GPUs once its restarts (preemptions x preemption_cost_s) reach
    ``max_restart_share`` of its estimated length: a long job preempted five times (5 min of
    restarts in 28 h) still yields to a short one; a 2,000-s job with four (240 s >= 10 %)
    does not."""
    from dataclasses import replace as with_

    from scheduler.catalog import gpu_spec
    from scheduler.domain import GpuState, Placement, RunningJob

    def one_k80(running: JobSpec, preemptions: int) -> ClusterState:
        running = with_(running, params={"preemptions": preemptions})
        busy = GpuState("k", 0, gpu_spec("K80"), SharingMode.EXCLUSIVE, (running.id,))
        return ClusterState(
            now_s=10.0,
            nodes=(gpu_node("k", "K80", 1, gpus={0: busy}),),
            pending=(gjob("s", {"K80": 100.0}, arrival=5.0),),
            running=(
                RunningJob(running, Placement(running.id, "k", (0,), SharingMode.EXCLUSIVE), 0.0),
            ),
        )

    def preempts(state: ClusterState, **params: float) -> bool:
        plan = HeteroSrtfPolicy(pack_threshold=0, **params).schedule(state, random.Random(0))
        return [a.job_id for a in plan.actions] == [state.running[0].job.id]

    long_job = gjob("long", {"K80": 100_000.0})
    assert preempts(one_k80(long_job, 5))
    assert not preempts(one_k80(long_job, 5), max_preemptions=5)  # the count alone: pinned
    mid = gjob("mid", {"K80": 2_000.0})
    assert preempts(one_k80(mid, 3))  # 180 s of restarts < 200 s
    assert not preempts(one_k80(mid, 4))  # 240 s >= 200 s
    assert preempts(one_k80(mid, 4), max_restart_share=0)  # the share off: the count rules


def test_sorted_by_orders_as_the_whole_key_ties_included() -> None:
    # The cycle sorts tens of thousands of candidates by their float first and settles the
    # ties by the whole key; with many ties (and -0.0 == 0.0, infinities) it must match.
    from scheduler.policies.hetero_srtf import _sorted_by

    rng = random.Random(3)
    firsts = [0.0, -0.0, 1.5, -math.inf, math.inf, 2.0]
    items = [
        (rng.choice(firsts), rng.randint(0, 3), f"j{rng.randint(0, 999):03d}") for _ in range(500)
    ]
    assert _sorted_by(items, lambda x: x[0], lambda x: x) == sorted(items)
    assert _sorted_by(items, lambda x: x[0], lambda x: x) != sorted(items, key=lambda x: x[0])
    assert _sorted_by([], lambda x: x, lambda x: x) == []


def _k80_and_v100_busy() -> ClusterState:
    # "a" (1,000 s on a V100, 4,000 s on a K80) has run half its work on the K80 since 0;
    # "b" (5,000 s / 20,000 s) has just started on the V100; "c" (very long) waits.
    from scheduler.catalog import gpu_spec
    from scheduler.domain import GpuState, Placement, RunningJob

    a = gjob("a", {"V100": 1000.0, "K80": 4000.0})
    b = gjob("b", {"V100": 5000.0, "K80": 20_000.0}, arrival=4300.0)
    c = gjob("c", {"V100": 100_000.0}, arrival=4350.0)
    on_k = GpuState("k", 0, gpu_spec("K80"), SharingMode.EXCLUSIVE, ("a",))
    on_v = GpuState("v", 0, gpu_spec("V100"), SharingMode.EXCLUSIVE, ("b",))
    return ClusterState(
        now_s=4400.0,
        nodes=(gpu_node("v", "V100", 1, gpus={0: on_v}), gpu_node("k", "K80", 1, gpus={0: on_k})),
        pending=(c,),
        running=(
            RunningJob(a, Placement("a", "k", (0,), SharingMode.EXCLUSIVE), 0.0, progress=0.5),
            RunningJob(b, Placement("b", "v", (0,), SharingMode.EXCLUSIVE), 4300.0, progress=0.02),
        ),
    )


def test_a_job_over_the_ftf_cap_is_not_swapped_to_a_slow_model_and_moves_first() -> None:
    # Three jobs present over a's life: its fair share takes 3 / (1/1000 + 1/4000) = 2,400 s,
    # and (4,400 + 500 left on the V100) / 2,400 = 2.04 puts it over the cap of 2. The total
    # relative cost alone keeps both where they are (moving both costs restarts and the
    # margin: 5.6 against 5.0); over the cap a goes first, takes the V100 and is not swapped
    # back, and b moves to the K80. The move costs the churn budget two requeues (a, and the job
    # on the GPU it takes).
    state = _k80_and_v100_busy()
    settings = {"aging": 0.0, "pack_threshold": 0, "churn_min": 2}
    plan = HeteroSrtfPolicy(**settings).schedule(state, random.Random(0))
    assert sorted(a.job_id for a in plan.actions) == ["a", "b"]
    moved = {a.job_id: a.explanation for a in plan.actions}
    assert "moved from K80 to V100" in moved["a"]
    placed = {d.placement.job_id: d.placement.node for d in plan.decisions}
    assert placed == {"a": "v", "b": "k"}
    # Without the cap the assignment minimises the total relative cost: a stays on the K80.
    plain = HeteroSrtfPolicy(ftf_cap=0, **settings).schedule(state, random.Random(0))
    assert plain.actions == () and plain.decisions == ()
    # A budget of one requeue holds the move back to a later cycle, and b, whose move
    # needed a's GPU, stays too: nobody is requeued without a GPU to go to.
    held = HeteroSrtfPolicy(**{**settings, "churn_min": 1}).schedule(state, random.Random(0))
    assert held.actions == () and held.decisions == ()


def test_a_capped_move_makes_room_before_other_requeues() -> None:
    # As above, on two K80s, with "d" (50,000 s, K80 only) beside a and "s" (100 s) waiting:
    # s would take d's GPU and a takes b's. With a budget of two, a's move spends it (a and
    # the job on the V100): b leaves, although d is the longest, so a finds its GPU free;
    # d keeps its GPU and s waits for a later cycle. A budget of three lets d go too.
    from scheduler.catalog import gpu_spec
    from scheduler.domain import GpuState, Placement, RunningJob

    a = gjob("a", {"V100": 1000.0, "K80": 4000.0})
    b = gjob("b", {"V100": 5000.0, "K80": 20_000.0}, arrival=6900.0)
    d = gjob("d", {"K80": 50_000.0}, arrival=6950.0)
    s = gjob("s", {"K80": 100.0}, arrival=6990.0)
    k = {
        0: GpuState("k", 0, gpu_spec("K80"), SharingMode.EXCLUSIVE, ("a",)),
        1: GpuState("k", 1, gpu_spec("K80"), SharingMode.EXCLUSIVE, ("d",)),
    }
    v = {0: GpuState("v", 0, gpu_spec("V100"), SharingMode.EXCLUSIVE, ("b",))}

    def running(job: JobSpec, node: str, index: int, progress: float) -> RunningJob:
        pl = Placement(job.id, node, (index,), SharingMode.EXCLUSIVE)
        return RunningJob(job, pl, job.arrival_s, progress=progress)

    state = ClusterState(
        now_s=7000.0,
        nodes=(gpu_node("v", "V100", 1, gpus=v), gpu_node("k", "K80", 2, gpus=k)),
        pending=(s,),
        running=(running(a, "k", 0, 0.5), running(b, "v", 0, 0.02), running(d, "k", 1, 0.0)),
    )
    plan = HeteroSrtfPolicy(aging=0.0, pack_threshold=0, churn_min=2).schedule(
        state, random.Random(0)
    )
    assert sorted(x.job_id for x in plan.actions) == ["a", "b"]
    placed = {x.placement.job_id: x.placement.node for x in plan.decisions}
    assert placed == {"a": "v", "b": "k"}
    more = HeteroSrtfPolicy(aging=0.0, pack_threshold=0, churn_min=3).schedule(
        state, random.Random(0)
    )
    assert sorted(x.job_id for x in more.actions) == ["a", "b", "d"]
    placed = {x.placement.job_id: x.placement.node for x in more.decisions}
    assert placed["a"] == "v" and placed["s"] == "k"


def test_a_job_its_model_cannot_take_gets_an_idle_gpu_of_another() -> None:
    # x runs twice as fast on the P100, but the P100's node has 2 cores free and x asks for
    # 8: the idle V100 (16 cores) takes it in the same cycle rather than leaving both idle.
    # A long job runs beside (on a third model) and a second one waits, so the cycle takes
    # the full path.
    import dataclasses

    from scheduler.catalog import gpu_spec
    from scheduler.domain import GpuState, Placement, RunningJob

    x = dataclasses.replace(gjob("x", {"P100": 1000.0, "V100": 2000.0}, arrival=50.0), cpus=8)
    hog = gjob("hog", {"K80": 90_000.0})
    wait = gjob("w", {"K80": 80_000.0}, arrival=60.0)
    on_k = {0: GpuState("k", 0, gpu_spec("K80"), SharingMode.EXCLUSIVE, ("hog",))}
    p100 = dataclasses.replace(gpu_node("p", "P100", 1, cores=16), free_cores=2)
    state = ClusterState(
        now_s=100.0,
        nodes=(p100, gpu_node("v", "V100", 1, cores=16), gpu_node("k", "K80", 1, gpus=on_k)),
        pending=(x, wait),
        running=(
            RunningJob(hog, Placement("hog", "k", (0,), SharingMode.EXCLUSIVE), 0.0, progress=0.1),
        ),
    )
    plan = HeteroSrtfPolicy(pack_threshold=0).schedule(state, random.Random(0))
    placed = {d.placement.job_id: d.placement.node for d in plan.decisions}
    assert placed.get("x") == "v", (placed, plan.waiting)


def test_a_job_that_left_its_gpu_to_move_is_not_left_without_one() -> None:
    # r moves from its K80 (3,600 s left) to the idle V100 (900 s), and w takes the K80; the
    # V100's node has no core free for r, so r takes the idle P100 (1,350 s) in the same
    # cycle rather than wait without a GPU.
    import dataclasses

    from scheduler.catalog import gpu_spec
    from scheduler.domain import GpuState, Placement, RunningJob

    r = gjob("r", {"V100": 1000.0, "P100": 1500.0, "K80": 4000.0})
    w = gjob("w", {"K80": 80_000.0}, arrival=50.0)
    on_k = {0: GpuState("k", 0, gpu_spec("K80"), SharingMode.EXCLUSIVE, ("r",))}
    v100 = dataclasses.replace(gpu_node("v", "V100", 1, cores=16), free_cores=0)
    state = ClusterState(
        now_s=100.0,
        nodes=(v100, gpu_node("p", "P100", 1), gpu_node("k", "K80", 1, gpus=on_k)),
        pending=(w,),
        running=(
            RunningJob(r, Placement("r", "k", (0,), SharingMode.EXCLUSIVE, cpus=1), 0.0, 0.1),
        ),
    )
    plan = HeteroSrtfPolicy(pack_threshold=0).schedule(state, random.Random(0))
    placed = {d.placement.job_id: d.placement.node for d in plan.decisions}
    assert [a.job_id for a in plan.actions] == ["r"]
    assert placed == {"r": "p", "w": "k"}, (placed, plan.waiting)


def test_a_job_is_kept_off_a_model_where_it_would_end_over_the_ftf_cap() -> None:
    # Two jobs present, a V100 and a K80 free. x (1,000 s on the V100, 2,500 on the K80) has
    # waited 1,000 s: its fair share (half of each GPU) takes 1 / (0.5/1000 + 0.5/2500) =
    # 1,429 s, and 1,000 + 2,500 on the K80 would end it at a ratio of 2.45, over the cap of
    # 2 (1.4 on the V100). y (2,900 on the K80) has just arrived: 2,900 / 1,487 = 1.95 on the
    # K80. The total relative cost alone puts x on the K80 (2.5 + 1 against 1 + 2.9); with
    # the cap, x takes the V100 and y the K80.
    state = ClusterState(
        now_s=1000.0,
        nodes=(gpu_node("v", "V100", 1), gpu_node("k", "K80", 1)),
        pending=(
            gjob("x", {"V100": 1000.0, "K80": 2500.0}, arrival=0.0),
            gjob("y", {"V100": 1000.0, "K80": 2900.0}, arrival=1000.0),
        ),
    )
    settings = {"aging": 0.0, "pack_threshold": 0}
    plan = HeteroSrtfPolicy(**settings).schedule(state, random.Random(0))
    placed = {d.placement.job_id: d.placement.node for d in plan.decisions}
    assert placed == {"x": "v", "y": "k"}
    plain = HeteroSrtfPolicy(ftf_cap=0, **settings).schedule(state, random.Random(0))
    placed = {d.placement.job_id: d.placement.node for d in plain.decisions}
    assert placed == {"x": "k", "y": "v"}

"""The ``elastic`` policy's yield to the queue (scheduler/policies/elastic.py, docs/elastic.md):
grown elastic jobs step down, lowest measured S first, so that a waiting job can start."""

from __future__ import annotations

import random

import pytest

from scheduler import elastic as en
from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ActionKind,
    ClusterState,
    GpuState,
    JobKind,
    JobSpec,
    NodeState,
    Placement,
    Plan,
    Profile,
    RunningJob,
)
from scheduler.policies.base import PolicyError
from scheduler.policies.registry import build_policy
from scheduler.simulator import SimConfig, simulate
from scheduler.simulator.elastic import ElasticModel, load_curve_table
from tests.scheduler.sim_helpers import cluster
from tests.scheduler.snapshots import check_plan, gpu_node, job


def measured(workers: int, rates: dict[int, float], *, moving: bool = False) -> en.ElasticState:
    """An engine state at ``workers`` with the throughputs ``rates`` measured, past its
    measuring interval (``moving``: a change is under way)."""
    return en.ElasticState(
        workers=workers,
        measured=tuple(en.Measured(w, r, 5) for w, r in sorted(rates.items())),
        batches_at_count=100,
        windows_skipped=1,
        straggler_ewma=(1.0,) * workers,
        remaining_steps=1e5,
        in_transition=moving,
    )


def elastic_job(job_id: str, start: int = 2, lo: int = 1, hi: int = 8) -> JobSpec:
    return JobSpec(job_id, gpus=start, elastic_min=lo, elastic_max=hi)


def node(name: str, count: int, held: dict[int, str]) -> NodeState:
    spec = gpu_spec("V100")
    return gpu_node(
        name,
        "V100",
        count,
        gpus={i: GpuState(name, i, spec, job_ids=(j,)) for i, j in held.items()},
    )


def running(spec: JobSpec, where: str, gpus: tuple[int, ...], state: en.ElasticState):
    return RunningJob(spec, Placement(spec.id, where, gpus), started_s=0.0, elastic=state)


def plan_of(state: ClusterState, **params) -> Plan:
    policy = build_policy("elastic", {"scale_step_workers": 2, **params})
    plan = policy.schedule(state, random.Random(1))
    check_plan(state, plan)
    return plan


def shrinks(plan: Plan) -> dict[str, int]:
    return {
        a.job_id: a.value["workers"]
        for a in plan.actions
        if a.kind == ActionKind.SET_WORKERS and a.value["workers"] < a.value["workers_from"]
    }


def two_grown_jobs(waiting_gpus: int = 2) -> ClusterState:
    """Two nodes of 4 V100, each full with an elastic job grown 2 -> 4: ``a``'s step had
    S = 0.6, ``b``'s S = 0.2; job ``w`` waits."""
    a = elastic_job("a")
    b = elastic_job("b")
    nodes = (
        node("n1", 4, dict.fromkeys(range(4), "a")),
        node("n2", 4, dict.fromkeys(range(4), "b")),
    )
    return ClusterState(
        0.0,
        nodes,
        (job("w", gpus=waiting_gpus),),
        (
            running(a, "n1", (0, 1, 2, 3), measured(4, {2: 10.0, 4: 16.0})),  # S = 0.6
            running(b, "n2", (0, 1, 2, 3), measured(4, {2: 10.0, 4: 12.0})),  # S = 0.2
        ),
    )


def test_the_job_whose_last_step_had_the_lowest_s_gives_its_gpus_to_the_waiting_job():
    state = two_grown_jobs()
    plan = plan_of(state)
    assert "w" in plan.waiting  # fifo could not place it this cycle
    assert shrinks(plan) == {"b": 2}
    (action,) = plan.actions
    assert action.value["workers_from"] == 4 and action.value["efficiency"] == pytest.approx(0.2)
    text = action.explanation
    assert "shrink 4 -> 2 workers so job w (2 V100) can start" in text
    assert "the step 2->4 had S=0.20, the lowest" in text
    assert "job a: 2->4 S=0.60" in text  # the other candidate and its S


def test_the_freed_gpus_are_those_the_waiting_job_needs_not_merely_the_lowest_s():
    """b (lowest S) frees 2 GPUs of a full node of 4; a 3-GPU job needs them on one node: a's
    node has one idle GPU, so a's step (higher S) is the one that lets it start."""
    a = elastic_job("a")
    b = elastic_job("b")
    nodes = (
        node("n1", 5, {0: "a", 1: "a", 2: "a", 3: "a"}),
        node("n2", 4, {0: "b", 1: "b", 2: "b", 3: "b"}),
    )
    rj = (
        running(a, "n1", (0, 1, 2, 3), measured(4, {2: 10.0, 4: 16.0})),  # S = 0.6
        running(b, "n2", (0, 1, 2, 3), measured(4, {2: 10.0, 4: 12.0})),  # S = 0.2
    )
    plan = plan_of(ClusterState(0.0, nodes, (job("w", gpus=3),), rj))
    assert shrinks(plan) == {"a": 2}
    text = plan.actions[0].explanation
    assert "the step 2->4 had S=0.60; the jobs with a lower S free no GPUs w can use" in text
    # with room for 3 on b's node instead, b (the lowest S) is the one
    nodes = (
        node("n1", 4, dict.fromkeys(range(4), "a")),
        node("n2", 5, dict.fromkeys(range(4), "b")),
    )
    assert shrinks(plan_of(ClusterState(0.0, nodes, (job("w", gpus=3),), rj))) == {"b": 2}


def test_never_below_the_minimum_nor_to_a_count_the_engine_did_not_measure():
    state = two_grown_jobs(waiting_gpus=1)
    a = elastic_job("a", lo=3)
    b = elastic_job("b", lo=4)
    rj = (
        running(a, "n1", (0, 1, 2, 3), measured(4, {2: 10.0, 3: 14.0, 4: 16.0})),
        running(b, "n2", (0, 1, 2, 3), measured(4, {2: 10.0, 4: 12.0})),
    )
    plan = plan_of(ClusterState(0.0, state.nodes, state.pending, rj))
    # b is at its minimum; a steps down by K = 2 but stops at its minimum, 3 (measured)
    assert shrinks(plan) == {"a": 3}
    assert "shrink 4 -> 3 workers so job w (1 V100)" in plan.actions[0].explanation
    # 3 not measured: a would land on a count the engine knows nothing of: no step down
    rj = (running(a, "n1", (0, 1, 2, 3), measured(4, {2: 10.0, 4: 16.0})), rj[1])
    assert shrinks(plan_of(ClusterState(0.0, state.nodes, state.pending, rj))) == {}
    assert en.yield_target(measured(4, {2: 10.0, 4: 16.0}), en.ElasticJob(3, 8), 2) is None
    assert en.yield_target(measured(4, {3: 10.0, 4: 16.0}), en.ElasticJob(3, 8), 2) == 3
    assert en.yield_target(measured(3, {3: 10.0}), en.ElasticJob(3, 8), 2) is None


def test_no_step_down_for_a_job_that_could_not_fit_even_with_every_elastic_job_at_its_minimum():
    assert shrinks(plan_of(two_grown_jobs(waiting_gpus=4))) == {}  # a node of 4 at once
    state = two_grown_jobs(waiting_gpus=3)
    assert shrinks(plan_of(state)) == {}  # 4 -> 2 frees 2 GPUs per node: not 3 in one step
    # at the minimum (1) each node would have 3 idle GPUs: it could fit, but not this cycle
    # with one step per job; with a plain job holding 2 GPUs of each node it never could
    a, b = elastic_job("a"), elastic_job("b")
    nodes = (
        node("n1", 6, {0: "a", 1: "a", 2: "a", 3: "a", 4: "x", 5: "x"}),
        node("n2", 6, {0: "b", 1: "b", 2: "b", 3: "b", 4: "y", 5: "y"}),
    )
    rj = (
        running(a, "n1", (0, 1, 2, 3), measured(4, {2: 10.0, 4: 16.0})),
        running(b, "n2", (0, 1, 2, 3), measured(4, {2: 10.0, 4: 12.0})),
    )
    fits = ClusterState(0.0, nodes, (job("w", gpus=2),), rj)
    assert shrinks(plan_of(fits)) == {"b": 2}
    never = ClusterState(0.0, nodes, (job("w", gpus=6),), rj)  # 6 on one node: 2 are x's
    plan = plan_of(never)
    assert "w" in plan.waiting and shrinks(plan) == {}


def test_yield_to_queue_off_keeps_the_grown_jobs():
    state = two_grown_jobs()
    assert shrinks(plan_of(state)) == {"b": 2}
    plan = plan_of(state, yield_to_queue=False)
    assert shrinks(plan) == {} and "w" in plan.waiting
    assert build_policy("elastic").params["yield_to_queue"] is True
    with pytest.raises(PolicyError, match="yield_to_queue must be true or false"):
        build_policy("elastic", {"yield_to_queue": "no"})


def test_no_step_down_of_a_job_with_a_change_under_way_and_one_proposal_per_job():
    state = two_grown_jobs()
    a, b = state.running
    # b is growing 2 -> 4 (the simulator holds the warming GPUs at once): it cannot step down
    # now; a, the next lowest S, does
    growing = RunningJob(b.job, b.placement, 0.0, elastic=measured(2, {2: 10.0}, moving=True))
    plan = plan_of(ClusterState(0.0, state.nodes, state.pending, (a, growing)))
    assert shrinks(plan) == {"a": 2}
    # b has a change under way that the snapshot cannot tell from a step down proposed for w in
    # an earlier cycle (the live system carries it out at b's next checkpointed window): no
    # second round of steps down until it lands
    moving = RunningJob(
        b.job, b.placement, 0.0, elastic=measured(4, {2: 10.0, 4: 12.0}, moving=True)
    )
    plan = plan_of(ClusterState(0.0, state.nodes, state.pending, (a, moving)))
    assert shrinks(plan) == {} and plan.actions == ()
    # two waiting jobs of 2: b steps down for the first, a for the second; one action each
    two = ClusterState(0.0, state.nodes, (job("w", gpus=2), job("v", gpus=2)), state.running)
    plan = plan_of(two, backfill=True)
    assert shrinks(plan) == {"b": 2, "a": 2}
    assert len(plan.actions) == 2
    assert "so job v" in next(x.explanation for x in plan.actions if x.job_id == "a")
    # with backfill off (fifo's default) v waits behind w whatever happens: only w is served
    assert shrinks(plan_of(two)) == {"b": 2}


def test_no_step_up_onto_gpus_a_waiting_job_can_be_given():
    """a is changing (cannot step down now) but at its minimum w would fit: b must not grow
    onto the idle GPUs of the model meanwhile."""
    a = elastic_job("a")
    b = elastic_job("b")
    nodes = (node("n1", 4, {0: "a", 1: "a", 2: "a"}), node("n2", 4, {0: "b", 1: "b"}))
    rj = (
        running(a, "n1", (0, 1, 2), measured(3, {1: 5.0, 3: 12.0}, moving=True)),
        running(b, "n2", (0, 1), measured(2, {2: 10.0})),  # would probe 4 on n2's idle pair
    )
    state = ClusterState(0.0, nodes, (job("w", gpus=3),), rj)
    assert plan_of(state).actions == ()
    grows = plan_of(state, yield_to_queue=False).actions
    assert [(x.job_id, x.value["workers"]) for x in grows] == [("b", 4)]


def test_the_engine_steps_back_up_after_a_step_down_for_the_queue():
    """The step down keeps the measurements: the larger count is not taken for a bad one."""
    job_ = en.ElasticJob(1, 8)
    cfg = en.ElasticConfig(scale_step_workers=2)
    state = measured(4, {2: 10.0, 4: 16.0, 6: 16.5})  # converged at 4: 4->6 has S=0.06
    target = en.yield_target(state, job_, 2)
    assert target == 2
    after = en.changed(state, target)
    assert after.throughput_at(4) == pytest.approx(16.0)
    after = en.observe(after, en.Window(2, 10, 1.0, (1.0, 1.0), 1e5), cfg)  # skipped (first)
    for _ in range(5):
        after = en.observe(after, en.Window(2, 10, 1.0, (1.0, 1.0), 1e5), cfg)
    decision = en.decide(after, job_, cfg)
    assert decision.kind == en.DecisionKind.SCALE and decision.workers == 4
    assert decision.explanation.startswith("scale up: 2->4 workers")


# --- in the cluster simulator ---------------------------------------------------------------

TABLE = load_curve_table()
R18 = "ResNet-18 (batch size 64)"


def r18(job_id: str, arrival: float, hours: float, elastic: tuple[int, int] | None) -> JobSpec:
    curve = TABLE.curve(R18, "V100")
    assert curve is not None
    steps = curve.consolidated[1] * hours * 3600.0
    return JobSpec(
        id=job_id,
        arrival_s=arrival,
        gpus=2,
        profile=Profile(
            name=R18,
            kind=JobKind.DL_TRAIN,
            gpu_time_s={"V100": steps / curve.throughput(2, 4)},
            batch_size=TABLE.batch.get(R18),
        ),
        job_type=R18,
        params={"total_steps": steps},
        elastic_min=elastic[0] if elastic else None,
        elastic_max=elastic[1] if elastic else None,
    )


def test_in_the_simulator_a_grown_job_gives_gpus_back_and_the_waiting_job_starts_at_once():
    """One node of 4 V100: a grows 2 -> 4; b (2 GPUs) arrives later. With the yield, a steps
    down when b arrives and b starts at that very instant; without, b waits for a to end."""
    one_node = cluster({"name": "v", "count": 1, "gpu_model": "V100", "gpus_per_node": 4})
    jobs = [r18("a", 0.0, 4.0, (1, 4)), r18("b", 1800.0, 0.5, None)]
    model = ElasticModel(noise_sd=0.0, static_jobs=True)
    out = {}
    for on in (True, False):
        policy = build_policy("elastic", {"scale_step_workers": 2, "yield_to_queue": on})
        out[on] = simulate(one_node, jobs, policy, config=SimConfig(elastic_model=model))
    with_yield, without = out[True], out[False]
    steps = [(e.t_s, e.workers_from, e.workers_to) for e in with_yield.elastic_events]
    assert any(f == 2 and t == 4 for _, f, t in steps)  # it grew
    down = [e for e in with_yield.elastic_events if e.text.startswith("yield to the queue")]
    assert [(e.job_id, e.workers_from, e.workers_to) for e in down] == [("a", 4, 2)]
    assert down[0].t_s == pytest.approx(1800.0)
    b_yield = next(r for r in with_yield.jobs if r.job_id == "b")
    b_plain = next(r for r in without.jobs if r.job_id == "b")
    assert b_yield.queue_s == pytest.approx(0.0)
    assert b_plain.queue_s > 600.0
    assert not [e for e in without.elastic_events if e.text.startswith("yield")]

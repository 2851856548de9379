"""``hetero_srtf`` on jobs of unknown length (step 7: Gittins index over completed jobs'
lengths at the job's attained service; least attained service without a history)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from scheduler.catalog import gpu_spec
from scheduler.domain import (
    ActionKind,
    ClusterState,
    GpuState,
    JobSpec,
    Placement,
    Profile,
    RunningJob,
    SharingMode,
)
from scheduler.knowledge import Knowledge
from scheduler.policies.hetero_srtf import HeteroSrtfPolicy
from tests.scheduler.snapshots import check_plan, completion, gpu_node


def ujob(job_id: str, *, arrival: float = 0.0, job_type: str | None = None) -> JobSpec:
    """A GPU job without a profile: its length is unknown."""
    return JobSpec(id=job_id, arrival_s=arrival, job_type=job_type, gpu_memory_mb=4096.0)


def _one_busy_gpu(running: JobSpec, *, now: float = 20_000.0) -> ClusterState:
    busy = GpuState("v", 0, gpu_spec("V100"), SharingMode.EXCLUSIVE, (running.id,))
    return ClusterState(
        now_s=now,
        nodes=(gpu_node("v", "V100", 1, gpus={0: busy}),),
        pending=(),
        running=(RunningJob(running, Placement(running.id, "v", (0,)), 0.0),),
    )


def test_a_long_running_job_of_unknown_length_yields_to_a_new_one() -> None:
    # "old" has run 5 h; "new" just arrived. Least attained service: "new" goes first.
    old, new = ujob("old"), ujob("new", arrival=19_990.0)
    state = replace(_one_busy_gpu(old), pending=(new,), attained_s={"old": 18_000.0, "new": 0.0})
    plan = HeteroSrtfPolicy(pack_threshold=0).schedule(state, random.Random(0))
    check_plan(state, plan)
    assert [(a.kind, a.job_id) for a in plan.actions] == [(ActionKind.REQUEUE, "old")]
    (decision,) = plan.decisions
    assert decision.placement.job_id == "new"
    assert "length unknown: least attained service" in decision.explanation
    # fifo (the former treatment): never preempted, the new job waits
    fifo = HeteroSrtfPolicy(pack_threshold=0, unknown_lengths="fifo").schedule(
        state, random.Random(0)
    )
    assert fifo.actions == () and fifo.decisions == ()
    assert "new" in fifo.waiting


def test_without_the_snapshots_history_the_current_attempt_counts() -> None:
    # No attained_s: the running job's current attempt (started at 0, now 20,000 s) counts.
    old, new = ujob("old"), ujob("new", arrival=19_990.0)
    state = replace(_one_busy_gpu(old), pending=(new,))
    plan = HeteroSrtfPolicy(pack_threshold=0).schedule(state, random.Random(0))
    assert [a.job_id for a in plan.actions] == ["old"]
    # A job that has run only a few minutes is not preempted for one that ran nothing:
    # the discretised service puts both at 0 (no churn between equals).
    plan = HeteroSrtfPolicy(pack_threshold=0).schedule(
        replace(state, attained_s={"old": 300.0, "new": 0.0}), random.Random(0)
    )
    assert plan.actions == ()


def _completed(knowledge: Knowledge, job_type: str, seconds: float, n: int) -> None:
    for i in range(n):
        knowledge.observe(completion(f"{job_type}{i}", job_type, seconds))


def test_the_lengths_of_completed_jobs_of_its_type_order_them() -> None:
    # Jobs of type "sweep" have taken 10 min, jobs of type "train" 10 h: of two waiting jobs
    # of unknown length, the sweep goes first although the training job arrived first.
    knowledge = Knowledge()
    _completed(knowledge, "sweep", 600.0, 6)
    _completed(knowledge, "train", 36_000.0, 6)
    state = ClusterState(
        now_s=100.0,
        nodes=(gpu_node("v", "V100", 1),),
        pending=(ujob("t", job_type="train"), ujob("s", arrival=50.0, job_type="sweep")),
        knowledge=knowledge,
        attained_s={"t": 0.0, "s": 0.0},
    )
    plan = HeteroSrtfPolicy(pack_threshold=0).schedule(state, random.Random(0))
    check_plan(state, plan)
    assert [d.placement.job_id for d in plan.decisions] == ["s"]
    said = (
        "Gittins index at its 0 min of service over the lengths of 6 completed jobs of type "
        "sweep (6 longer)"
    )
    assert said in plan.decisions[0].explanation
    # Without that history both are unknown alike, and the older one goes first.
    blind = HeteroSrtfPolicy(pack_threshold=0).schedule(
        replace(state, knowledge=Knowledge()), random.Random(0)
    )
    assert [d.placement.job_id for d in blind.decisions] == ["t"]


def test_a_job_of_known_length_and_one_of_unknown_length_share_one_scale() -> None:
    # A known 2-h job against an unknown one whose type takes 10 min: the unknown goes first;
    # against an unknown one of a 10-h type, the known job goes first.
    knowledge = Knowledge()
    _completed(knowledge, "sweep", 600.0, 6)
    _completed(knowledge, "train", 36_000.0, 6)
    known = JobSpec(id="k", profile=Profile(name="k", gpu_time_s={"V100": 7200.0}))
    for other, first in (("sweep", "u"), ("train", "k")):
        state = ClusterState(
            now_s=0.0,
            nodes=(gpu_node("v", "V100", 1),),
            pending=(known, ujob("u", job_type=other)),
            knowledge=knowledge,
        )
        plan = HeteroSrtfPolicy(pack_threshold=0).schedule(state, random.Random(0))
        assert [d.placement.job_id for d in plan.decisions] == [first], other


def test_relative_speeds_of_a_job_that_declared_no_length_pick_its_gpu() -> None:
    # Its profile says only that it runs 4x faster on the V100 (times at a nominal hour):
    # it takes the V100, and the known job, which gains less there, the K80.
    hidden = replace(
        JobSpec(id="h", profile=Profile(name="h", gpu_time_s={"V100": 3600.0, "K80": 14_400.0})),
        length_known=False,
    )
    known = JobSpec(id="k", profile=Profile(name="k", gpu_time_s={"V100": 600.0, "K80": 900.0}))
    state = ClusterState(
        now_s=0.0,
        nodes=(gpu_node("v", "V100", 1), gpu_node("k80", "K80", 1)),
        pending=(hidden, known),
    )
    plan = HeteroSrtfPolicy(pack_threshold=0).schedule(state, random.Random(0))
    check_plan(state, plan)
    assert {d.placement.job_id: d.placement.node for d in plan.decisions} == {
        "h": "v",
        "k": "k80",
    }


def test_jobs_still_running_count_in_the_length_history() -> None:
    # Six jobs of type x completed in 10 minutes; four others of type x have run 50 minutes
    # and go on. A fresh job of type x is not taken for a 10-minute job: the four count as
    # lengths of twice their service (100 min), so its Gittins estimate is
    # min over budgets d of E[min(T, d)] / P(T <= d) = (6 x 600 + 4 x 600) / 6 = 1,000 s.
    knowledge = Knowledge()
    _completed(knowledge, "x", 600.0, 6)
    busy = {
        i: GpuState("v", i, gpu_spec("V100"), SharingMode.EXCLUSIVE, (f"r{i}",)) for i in range(4)
    }
    running = tuple(
        RunningJob(ujob(f"r{i}", job_type="x"), Placement(f"r{i}", "v", (i,)), 0.0)
        for i in range(4)
    )
    state = ClusterState(
        now_s=3000.0,
        nodes=(gpu_node("v", "V100", 4, gpus=busy), gpu_node("w", "V100", 1)),
        pending=(ujob("p", arrival=3000.0, job_type="x"),),
        running=running,
        knowledge=knowledge,
        attained_s={"p": 0.0, **{f"r{i}": 3000.0 for i in range(4)}},
    )
    plan = HeteroSrtfPolicy(pack_threshold=0).schedule(state, random.Random(0))
    (decision,) = plan.decisions
    assert decision.placement.job_id == "p" and decision.score == pytest.approx(1000.0)
    assert "6 completed jobs of type x, 4 unfinished at twice their service" in (
        decision.explanation
    )


def test_a_job_of_unknown_length_moves_to_an_idle_faster_gpu() -> None:
    # It runs on a K80, 4x slower than on the V100 that is idle; its type took 2 h on
    # average: a move pays whatever it has left. Left to fifo, it stays.
    knowledge = Knowledge()
    _completed(knowledge, "x", 7200.0, 6)
    hidden = replace(
        JobSpec(
            id="h",
            job_type="x",
            profile=Profile(name="h", gpu_time_s={"V100": 3600.0, "K80": 14_400.0}),
        ),
        length_known=False,
    )
    busy = GpuState("k", 0, gpu_spec("K80"), SharingMode.EXCLUSIVE, ("h",))
    state = ClusterState(
        now_s=1000.0,
        nodes=(gpu_node("k", "K80", 1, gpus={0: busy}), gpu_node("v", "V100", 1)),
        pending=(),
        running=(RunningJob(hidden, Placement("h", "k", (0,)), 0.0),),
        knowledge=knowledge,
        attained_s={"h": 1000.0},
    )
    plan = HeteroSrtfPolicy(pack_threshold=0).schedule(state, random.Random(0))
    check_plan(state, plan)
    assert [(a.kind, a.job_id) for a in plan.actions] == [(ActionKind.REQUEUE, "h")]
    assert [(d.placement.job_id, d.placement.node) for d in plan.decisions] == [("h", "v")]
    fifo = HeteroSrtfPolicy(pack_threshold=0, unknown_lengths="fifo").schedule(
        state, random.Random(0)
    )
    assert fifo.actions == () and fifo.decisions == ()

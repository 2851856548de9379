"""Container jobs go only to nodes with a container runtime (``NodeState.container_runtimes``),
under every registered policy; with none up they wait with the reason."""

from __future__ import annotations

import dataclasses
import random

import pytest

from scheduler.domain import ClusterState
from scheduler.policies.framework import NO_CONTAINER_RUNTIME
from scheduler.policies.registry import available_policies, build_policy
from tests.scheduler.snapshots import check_plan, cpu_node, gpu_node, job

POLICIES = available_policies()


def _with_runtime(node):
    return dataclasses.replace(node, container_runtimes=("podman",))


def _cluster(runtime_on: set[str]) -> tuple:
    """Nodes in cluster order: the first GPU and CPU nodes lack the runtime unless named."""
    nodes = (
        gpu_node("plain-gpu", "V100", 2),
        gpu_node("ctr-gpu", "V100", 2),
        cpu_node("plain-cpu", 8),
        cpu_node("ctr-cpu", 8),
    )
    return tuple(_with_runtime(n) if n.name in runtime_on else n for n in nodes)


@pytest.mark.parametrize("name", POLICIES)
def test_container_jobs_go_only_to_nodes_with_a_runtime(name):
    jobs = (
        dataclasses.replace(job("g1"), container=True),
        dataclasses.replace(job("g2", gpus=2), container=True),
        dataclasses.replace(job("c1", gpus=0, cpus=2), container=True),
        job("plain"),  # not a container job: anywhere
    )
    state = ClusterState(0.0, _cluster({"ctr-gpu", "ctr-cpu"}), pending=jobs)
    plan = build_policy(name).schedule(state, random.Random(0))
    check_plan(state, plan)
    placed = {d.placement.job_id: d.placement for d in plan.decisions}
    for job_id in ("g1", "g2", "c1"):
        if job_id in placed:
            nodes = {p.node for p in placed[job_id].parts}
            assert nodes <= {"ctr-gpu", "ctr-cpu"}, (name, job_id, nodes)
    # The GPU container job that fits at once is placed (on ctr-gpu, not the first node).
    assert "g1" in placed or "g2" in placed, (name, plan.waiting)


@pytest.mark.parametrize("name", POLICIES)
def test_without_a_runtime_container_jobs_wait_and_say_why(name):
    jobs = (dataclasses.replace(job("g1"), container=True), job("plain"))
    state = ClusterState(0.0, _cluster(set()), pending=jobs)
    plan = build_policy(name).schedule(state, random.Random(0))
    check_plan(state, plan)
    assert "g1" not in {d.placement.job_id for d in plan.decisions}
    assert NO_CONTAINER_RUNTIME in plan.waiting["g1"]
    assert "plain" in {d.placement.job_id for d in plan.decisions}


def test_a_container_job_on_a_busy_runtime_node_says_it_waits_for_one():
    jobs = (
        dataclasses.replace(job("big", gpus=2), container=True),
        dataclasses.replace(job("big2", gpus=2), container=True),
    )
    state = ClusterState(0.0, _cluster({"ctr-gpu"}), pending=jobs)
    plan = build_policy("fifo").schedule(state, random.Random(0))
    assert [(d.placement.job_id, d.placement.node) for d in plan.decisions] == [("big", "ctr-gpu")]
    assert plan.waiting["big2"].startswith("a container job, on nodes with a container runtime")

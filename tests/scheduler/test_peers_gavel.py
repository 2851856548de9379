"""``gavel_maxmin`` / ``gavel_ftf``: the allocation LPs and the round mechanism."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.policies.gavel import (
    allocation_ftf,
    allocation_maxmin,
    equal_share,
    round_assignment,
)
from scheduler.policies.registry import build_policy
from tests.scheduler.peer_snapshots import gpu_node, pjob, running_on, state
from tests.scheduler.snapshots import check_plan

H = 3600.0


def _normalised(T, X, gpus, counts):
    return (T * X).sum(axis=1) / (T @ equal_share(gpus, counts))


def test_symmetric_jobs_get_equal_normalised_throughput():
    T = np.array([[2.0, 1.0], [2.0, 1.0], [2.0, 1.0]])
    gpus, counts = np.ones(3), np.array([1.0, 1.0])
    X = allocation_maxmin(T, gpus, counts)
    norm = _normalised(T, X, gpus, counts)
    assert norm == pytest.approx([norm[0]] * 3, rel=1e-6)
    assert norm[0] == pytest.approx(1.0, rel=1e-6)  # nothing better than the equal share
    assert (X * gpus[:, None]).sum(axis=0) == pytest.approx(counts)  # no idle capacity


def test_heterogeneity_aware_split_in_the_textbook_case():
    # Job 0 runs 4x faster on the V100 (column 0) than on the K80, job 1 equally fast on
    # both. An agnostic equal split gives each half of each GPU (normalised throughput 1 for
    # both); the heterogeneity-aware allocation gives the V100 to job 0 and the K80 to job 1:
    # job 0 gains 60 %, job 1 loses nothing.
    T = np.array([[4.0, 1.0], [1.0, 1.0]])
    gpus, counts = np.ones(2), np.array([1.0, 1.0])
    X = allocation_maxmin(T, gpus, counts)
    assert X[0, 0] == pytest.approx(1.0, abs=1e-6) and X[1, 1] == pytest.approx(1.0, abs=1e-6)
    norm = _normalised(T, X, gpus, counts)
    assert norm[1] == pytest.approx(1.0, rel=1e-6) and norm[0] == pytest.approx(1.6, rel=1e-6)


def test_max_min_lifts_the_worst_job():
    # Three jobs, one V100 and one K80: the job that gains nothing on the V100 gets the K80,
    # and the two V100 lovers share the V100; every normalised throughput is at least the
    # max-min optimum and the smallest is above the equal split's.
    T = np.array([[4.0, 1.0], [4.0, 1.0], [1.0, 1.0]])
    gpus, counts = np.ones(3), np.array([1.0, 1.0])
    X = allocation_maxmin(T, gpus, counts)
    norm = _normalised(T, X, gpus, counts)
    assert norm.min() > 1.0 + 1e-3
    assert X[2, 1] > X[2, 0]
    assert norm[0] == pytest.approx(norm[1], rel=1e-4)


def test_models_a_job_cannot_use_get_no_time_and_capacity_counts_gpus():
    T = np.array([[1.0, 0.0], [1.0, 1.0]])
    gpus, counts = np.array([2.0, 1.0]), np.array([2.0, 1.0])
    X = allocation_maxmin(T, gpus, counts)
    assert X[0, 1] == 0.0
    assert ((X * gpus[:, None]).sum(axis=0) <= counts + 1e-9).all()


def test_ftf_serves_the_job_that_has_waited_longest():
    # Two equal jobs, one has been in the system far longer: FTF gives it more time, and its
    # largest rho is no worse than max-min's allocation.
    T = np.array([[1 / H, 1 / (3 * H)], [1 / H, 1 / (3 * H)]])
    gpus, counts = np.ones(2), np.array([1.0, 1.0])
    age, rem = np.array([20 * H, 0.0]), np.array([1.0, 1.0])
    X, rho = allocation_ftf(T, gpus, counts, age, rem)
    assert (T[0] * X[0]).sum() > (T[1] * X[1]).sum()

    def max_rho(X):
        iso = 1.0 / (T @ equal_share(gpus, counts))
        return max((age + rem / (T * X).sum(axis=1)) / iso)

    assert max_rho(X) == pytest.approx(rho, rel=0.03)
    assert max_rho(X) <= max_rho(allocation_maxmin(T, gpus, counts)) + 1e-9


def test_job_classes_group_proportional_rows_of_one_size():
    from scheduler.policies.gavel import job_classes

    T = np.array([[2.0, 1.0], [4.0, 2.0], [2.0, 1.0], [1.0, 1.0]])
    labels, rows, scale = job_classes(T, np.array([1.0, 1.0, 2.0, 1.0]))
    assert labels[0] == labels[1] != labels[2] and labels[3] not in (labels[0], labels[2])
    assert scale.tolist() == [2.0, 4.0, 2.0, 1.0]


def test_grouped_ftf_matches_the_exact_one_on_distinct_jobs():
    T = np.array([[1 / H, 1 / (3 * H)], [1 / H, 1 / (2 * H)], [1 / (2 * H), 1 / (2 * H)]])
    gpus, counts = np.ones(3), np.array([1.0, 1.0])
    age, rem = np.array([5 * H, H, 0.0]), np.array([0.5, 1.0, 1.0])
    exact, rho = allocation_ftf(T, gpus, counts, age, rem)
    grouped, rho_g = allocation_ftf(T, gpus, counts, age, rem, group_above=0)
    assert rho_g == pytest.approx(rho, rel=0.03)  # every class has one member here


def test_round_mechanism_prefers_the_pair_furthest_behind_its_share():
    X = np.array([[0.5], [0.5]])
    got = round_assignment(X, np.array([[0.6], [0.4]]), [1, 1], [1], [-1, -1], [0.0, 0.0])
    assert [(j, m) for j, m, _ in got] == [(1, 0)]
    # A pair that never ran has an infinite priority.
    got = round_assignment(X, np.array([[0.0], [0.1]]), [1, 1], [1], [-1, 0], [0.0, 0.0])
    assert got[0][0] == 0


@pytest.mark.parametrize("name", ["gavel_maxmin", "gavel_ftf"])
def test_policy_places_each_job_on_the_model_the_allocation_gives_it(name):
    fast = pjob("fast", {"V100": H, "K80": 4 * H})
    flat = pjob("flat", {"V100": H, "K80": H})
    st = state(0.0, [gpu_node("k0", "K80", 1), gpu_node("v0", "V100", 1)], [flat, fast])
    plan = build_policy(name).schedule(st, random.Random(0))
    check_plan(st, plan)
    where = {d.placement.job_id: d.placement.node for d in plan.decisions}
    assert where == {"fast": "v0", "flat": "k0"}
    assert "round grant on V100" in next(
        d.explanation for d in plan.decisions if d.placement.job_id == "fast"
    )


def test_round_moves_a_job_to_its_allocated_model():
    # "fast" runs on the K80 and "flat" waits; the allocation wants fast on the V100.
    fast = pjob("fast", {"V100": H, "K80": 4 * H})
    flat = pjob("flat", {"V100": H, "K80": H})
    k0, rf = running_on(gpu_node("k0", "K80", 1), 0, fast, 0.0)
    st = state(10.0, [k0, gpu_node("v0", "V100", 1)], [flat], [rf])
    plan = build_policy("gavel_maxmin", {"round_s": 0}).schedule(st, random.Random(0))
    check_plan(st, plan)
    assert [a.job_id for a in plan.actions] == ["fast"]
    where = {d.placement.job_id: d.placement.node for d in plan.decisions}
    assert where == {"fast": "v0", "flat": "k0"}


def test_knowledge_replaces_the_profile_when_present():
    from scheduler.knowledge import Knowledge
    from scheduler.policies.peer_base import cluster_of

    policy = build_policy("gavel_maxmin")
    job = pjob("j", {"V100": H, "K80": 4 * H})
    st = state(0.0, [gpu_node("k0", "K80", 1), gpu_node("v0", "V100", 1)], [job])
    assert policy.solo_time(st, job, "K80") == 4 * H
    from dataclasses import replace

    known = replace(st, knowledge=Knowledge())
    t = policy.solo_time(known, job, "K80")
    assert t is not None and t > 0
    T = policy.throughputs(known, cluster_of(known), [job])
    assert T.shape == (1, 2) and (T > 0).all()

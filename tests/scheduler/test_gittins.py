"""Remaining time of jobs of unknown length (``scheduler.gittins``) and the length history
the knowledge keeps for it (``Knowledge.duration_samples``)."""

from __future__ import annotations

import math
import random

import pytest

from scheduler.gittins import discretise, effective_remaining_s
from scheduler.knowledge import Knowledge
from tests.scheduler.snapshots import completion


def _brute(lengths: list[float], a: float) -> float:
    """1 / G(a) straight from the definition, over every budget d in the support."""
    tail = [t for t in lengths if t > a]
    best = math.inf
    for d in sorted({t - a for t in tail}):
        p = sum(1 for t in tail if t - a <= d) / len(tail)
        e = sum(min(t - a, d) for t in tail) / len(tail)
        best = min(best, e / p)
    return best


def test_discretised_service_steps_at_the_quantum_then_doubles() -> None:
    assert [discretise(x, 360) for x in (0, 359, 360, 719, 720, 1439, 1440, 10_000)] == [
        0,
        0,
        360,
        360,
        720,
        720,
        1440,
        5760,
    ]
    assert discretise(123.4, 0) == 123.4  # 0: continuous


def test_without_history_it_is_least_attained_service() -> None:
    assert effective_remaining_s((), 0.0, floor_s=3600) == (3600, 0)
    assert effective_remaining_s((), 7200.0, floor_s=3600) == (7200, 0)
    # a job that ran longer than everything the cluster saw: as long again as it ran
    assert effective_remaining_s((10.0, 20.0, 30.0), 50.0, floor_s=1.0) == (50.0, 0)


def test_one_known_length_gives_the_time_left() -> None:
    eff, n = effective_remaining_s((1000.0,) * 5, 300.0, floor_s=1.0)
    assert eff == pytest.approx(700.0) and n == 5


def test_a_job_past_the_short_mode_is_expected_to_be_long() -> None:
    # 90 % of jobs take 60 s, 10 % take 10 h: a fresh job is probably short, one that ran
    # two minutes is surely long.
    lengths = sorted([60.0] * 90 + [36_000.0] * 10)
    fresh, _ = effective_remaining_s(lengths, 0.0, floor_s=1.0)
    past, n = effective_remaining_s(lengths, 120.0, floor_s=1.0)
    assert fresh < 120.0  # about a minute: short jobs go first
    assert past == pytest.approx(36_000.0 - 120.0) and n == 10


def test_it_matches_the_definition_on_random_histories() -> None:
    rng = random.Random(7)
    for _ in range(200):
        lengths = sorted(rng.lognormvariate(7, 1.5) for _ in range(rng.randint(3, 60)))
        a = rng.choice([0.0, lengths[0] / 2, lengths[len(lengths) // 2] * 0.9])
        eff, n = effective_remaining_s(lengths, a, floor_s=1.0, min_samples=1)
        assert n == sum(1 for t in lengths if t > a)
        assert eff == pytest.approx(_brute(lengths, a), rel=1e-9)


def test_length_history_comes_from_owner_then_type_then_every_job() -> None:
    k = Knowledge()
    assert k.duration_samples("a", "u1") == ((), "", False)
    for i in range(5):
        k.observe(completion(f"a{i}", "a", 100.0 + i, owner="u1"))
    for i in range(3):
        k.observe(completion(f"b{i}", "b", 5000.0 - i, owner="u2"))
    lengths, what, typed = k.duration_samples("a", "u1")
    assert lengths == (100.0, 101.0, 102.0, 103.0, 104.0) and "by u1" in what and typed
    # type a without an owner: the type's five; u2's three of type b are too few, and so
    # are the type's: every completed job
    assert k.duration_samples("a")[0] == lengths and "by" not in k.duration_samples("a")[1]
    assert len(k.duration_samples("b", "u2")[0]) == 8
    assert "of any type" in k.duration_samples("b", "u2")[1]
    assert not k.duration_samples("b", "u2")[2]
    assert len(k.duration_samples("c")[0]) == 8  # an unseen type: every completed job
    # a new completion is seen at once (the answers are cached until then)
    for i in range(5):
        k.observe(completion(f"c{i}", "c", 7.0))
    assert k.duration_samples("c")[0] == (7.0,) * 5

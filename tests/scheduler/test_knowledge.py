"""The knowledge module: estimates move from priors towards what the cluster observed."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.domain import JobSpec, Profile, SharingMode
from scheduler.knowledge import Knowledge, Observation, ObservationKind


def _job(jid: str, t: float | None = 1000.0, jtype: str = "resnet") -> JobSpec:
    prof = Profile(name=jtype, gpu_time_s={"V100": t} if t is not None else {})
    return JobSpec(id=jid, job_type=jtype, profile=prof)


def _window(jid, frac, secs, *, co=(), mode=SharingMode.EXCLUSIVE, jtype="resnet", start=0.0):
    return Observation(
        kind=ObservationKind.PROGRESS,
        job_id=jid,
        job_type=jtype,
        at_s=secs,
        window_s=secs,
        gpu_model="V100",
        mode=mode,
        co_runners=tuple(co),
        progress_from=start,
        progress_to=start + frac,
    )


def test_prior_only_is_the_profile_with_its_spread():
    k = Knowledge(prior_sigma=0.5)
    est = k.solo_time(_job("1"), "V100")
    assert est is not None
    assert est.value == pytest.approx(1000.0)
    assert est.sigma == pytest.approx(0.5)
    assert k.solo_time(_job("1"), "K80") is None


def test_own_windows_pull_the_estimate_to_the_measurement():
    k = Knowledge(prior_sigma=0.5, obs_sigma=0.1)
    for i in range(4):
        k.observe(_window("1", 0.05, 100.0, start=0.05 * i))  # 0.05 per 100 s: 2000 s
    est = k.solo_time(_job("1"), "V100")
    assert est is not None
    assert 1800 < est.value < 2000  # most of the way from the prior (1000) to 2000
    assert est.sigma < 0.1
    left = k.remaining_s(_job("1"), "V100", 0.5)
    assert left is not None and left.value == pytest.approx(est.value / 2)


def test_a_window_that_folds_reports_counts_as_that_many_windows():
    # One 400-s window standing for four 100-s reports (a simulator folds a job's reports at
    # one speed) says what the four reports say: the same rate, count and spread.
    folded, split = Knowledge(obs_sigma=0.1), Knowledge(obs_sigma=0.1)
    folded.observe(_window("1", 0.2, 400.0), reports=4)
    for i in range(4):
        split.observe(_window("1", 0.05, 100.0, start=0.05 * i))
    a, b = folded.solo_time(_job("1"), "V100"), split.solo_time(_job("1"), "V100")
    assert a is not None and b is not None
    assert a.value == pytest.approx(b.value)
    assert a.sigma == pytest.approx(b.sigma) and a.sigma < 0.1
    assert a.n == b.n == 4
    assert folded.observations == split.observations == 4
    with pytest.raises(ValueError, match="reports"):
        folded.observe(_window("1", 0.1, 100.0), reports=0)


def test_same_type_jobs_inform_a_new_job_without_a_profile():
    k = Knowledge()
    k.observe(_window("1", 0.1, 300.0))  # 3000 s
    k.observe(_window("2", 0.1, 500.0))  # 5000 s
    est = k.solo_time(_job("3", t=None), "V100")
    assert est is not None
    assert est.value == pytest.approx(math.sqrt(3000 * 5000))
    assert "2 jobs of type resnet" in est.source


def test_co_run_speed_from_pair_windows_over_the_jobs_own_solo_rate():
    k = Knowledge(pair_prior=lambda j, co, m, mode: 0.9)
    k.observe(_window("1", 0.1, 100.0))  # alone: 0.001/s
    k.observe(_window("1", 0.04, 100.0, co=["lstm"], mode=SharingMode.MPS, start=0.1))
    lstm = _job("9", jtype="lstm")
    est = k.co_run_speed(_job("1"), "V100", [lstm], SharingMode.MPS)
    assert est is not None
    assert 0.4 <= est.value < 0.5  # the measured 0.4 outweighs the 0.9 prior
    prior_only = k.co_run_speed(_job("1"), "V100", [lstm], SharingMode.TIME_SLICING)
    assert prior_only is not None and prior_only.value == pytest.approx(0.9)


def test_completed_durations_by_type_and_owner():
    k = Knowledge()
    k.observe(
        Observation(
            ObservationKind.COMPLETED,
            "1",
            "lammps",
            at_s=10,
            window_s=400,
            owner="ann",
            progress_to=1.0,
        )
    )
    est = k.duration("lammps", "ann")
    assert est is not None and est.value == pytest.approx(400)
    assert k.duration("gromacs") is None


def test_observation_round_trips_and_rejects_nonsense():
    obs = _window("1", 0.2, 50.0, co=["b", "a"], mode=SharingMode.MPS)
    back = Observation.from_dict(obs.to_dict())
    assert back.co_runners == ("a", "b")
    assert back.rate == pytest.approx(obs.rate)
    with pytest.raises(ValueError, match="window_s"):
        _window("1", 0.2, 0.0)
    with pytest.raises(ValueError, match="progress"):
        _window("1", 0.9, 10.0, start=0.5)


_SAME_IN_EVERY_PROCESS = """
from tests.scheduler.test_knowledge import _job, _window
from scheduler.domain import SharingMode
from scheduler.knowledge import Knowledge
k = Knowledge()
for i in range(40):
    jid = f"job-{i}"
    k.observe(_window(jid, 0.01 + 0.0037 * (i % 11), 97.0 + i))
    k.observe(_window(jid, 0.02 + 0.0011 * (i % 13), 61.0 + i, co=("bert",), mode=SharingMode.MPS))
print(repr(k.solo_time(_job("new"), "V100").value))
print(repr(k.co_run_speed(_job("new"), "V100", (_job("x", jtype="bert"),), SharingMode.MPS)))
"""


def test_estimates_are_the_same_whatever_the_processs_hash_seed():
    # Estimates pool the windows of many jobs of a type: summed in a set's order, which for
    # strings changes with PYTHONHASHSEED, their last bits differed between runs, and a
    # peer's LP broke its ties differently (gavel_ftf's Philly median moved between runs).
    root = Path(__file__).resolve().parents[2]
    outs = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", _SAME_IN_EVERY_PROCESS],
            cwd=root, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        outs.add(done.stdout)
    assert len(outs) == 1, outs
    assert "None" not in next(iter(outs))

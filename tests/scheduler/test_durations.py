"""``scheduler.durations``: the one parser of job time limits."""

from __future__ import annotations

import pytest

from scheduler.domain import JobSpec, Profile
from scheduler.durations import MAX_S, DurationError, format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        (90, 90),
        (7200.0, 7200),
        ("90s", 90),
        ("30m", 1800),
        ("2h", 7200),
        ("1d", 86400),
        ("1.5h", 5400),
        (" 2H ", 7200),
        ("10:00", 600),  # MM:SS
        ("90:00", 5400),  # minutes may exceed 59 when they lead, as in Slurm
        ("1:00:00", 3600),  # HH:MM:SS
        ("36:00:00", 129600),
        ("1-00:00:00", 86400),  # D-HH:MM:SS
        ("2-3", 2 * 86400 + 3 * 3600),  # D-HH
        ("2-3:04", 2 * 86400 + 3 * 3600 + 4 * 60),  # D-HH:MM
        ("366-00:00:00", MAX_S),
    ],
)
def test_every_accepted_form_gives_its_seconds(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "empty"),
        ("abc", "is not a duration"),
        ("2 hours", "is not a duration"),
        ("1:2:3:4", "is not a duration"),
        ("-5", "is not a duration"),
        ("0", "at least 1 s"),
        (0, "at least 1 s"),
        ("0s", "at least 1 s"),
        ("367d", "longer than 366-00:00:00"),
        (10**12, "longer than"),
        ("5:60", "up to 59"),
        ("1:60:00", "up to 59"),
        ("1-24:00:00", "hours up to 23"),
        (1.5, "whole number"),
        (float("nan"), "whole number"),
        (True, "expected a duration"),
        (None, "expected a duration"),
        ([60], "expected a duration"),
        ("9" * 50, "too long"),
    ],
)
def test_bad_values_are_refused_with_a_clear_message(value, message):
    with pytest.raises(DurationError, match=message) as info:
        parse_duration(value)
    assert isinstance(info.value, ValueError)


def test_errors_name_the_accepted_forms():
    with pytest.raises(DurationError) as info:
        parse_duration("soon")
    assert "90s, 30m, 2h" in str(info.value) and "1-00:00:00" in str(info.value)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, ""),
        (59, "00:00:59"),
        (3600, "01:00:00"),
        (86400, "1-00:00:00"),
        (93784, "1-02:03:04"),
    ],
)
def test_format_writes_what_sacct_shows_and_parses_back(seconds, text):
    assert format_duration(seconds) == text
    if seconds:
        assert parse_duration(text) == seconds


def test_a_policy_may_take_the_time_limit_as_the_work_estimate():
    limited = JobSpec(id="1", time_limit_s=600.0)
    assert limited.work_estimate_s("V100") == 600.0
    profiled = JobSpec(
        id="2", time_limit_s=600.0, profile=Profile(name="p", gpu_time_s={"V100": 90.0})
    )
    assert profiled.work_estimate_s("V100") == 90.0  # the profile's measured time first
    assert profiled.work_estimate_s("K80") == 600.0  # no time there: the declared bound
    assert JobSpec(id="3").work_estimate_s("V100") is None


def test_a_running_jobs_time_limit_bounds_its_predicted_end():
    """The framework's waiting reasons: a job with a time limit ends at the latest when the
    limit runs out (its node stops it), profiled or not."""
    from scheduler.domain import ClusterState, Placement, RunningJob
    from tests.scheduler.test_gangs import busy, gang, gpu_node, plan_of

    def reason(job: JobSpec, progress: float = 0.0) -> str:
        state = ClusterState(
            100.0,
            (gpu_node("v0", "V100", 4), gpu_node("v1", "V100", 4, gpus=busy("v1", [0, 1, 2], "9"))),
            pending=(gang("g", 8),),
            running=(RunningJob(job, Placement("9", "v1", (0, 1, 2)), 0.0, progress=progress),),
        )
        return plan_of(state).waiting["g"]

    unbounded = JobSpec(id="9", gpus=3)
    assert "only 0 of the 3 busy GPUs have a predicted end" in reason(unbounded)
    assert "nor a time limit" in reason(unbounded)
    limited = JobSpec(id="9", gpus=3, time_limit_s=1300.0)  # started at 0: ends by 1300
    assert "3 more expected in about 20 min when job 9 is predicted to end" in reason(limited)
    profiled = JobSpec(
        id="9", gpus=3, time_limit_s=1300.0, profile=Profile("x", gpu_time_s={"V100": 3000.0})
    )
    assert "about 20 min" in reason(profiled, progress=0.5)  # 1500 s left, the limit says 1200
    assert "about 20 min" not in reason(JobSpec(id="9", gpus=3, profile=profiled.profile), 0.5)

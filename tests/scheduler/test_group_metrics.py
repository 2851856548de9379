"""Per-group figures (per user now, per project later) over a simulator jobs frame."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scheduler.group_metrics import GROUP_COLUMNS, group_fairness, group_summary


def frame(rows):
    columns = ["policy", "job_id", "end_reason", "jct_s", "queue_s", "slowdown", "run_s", "gpus"]
    return pd.DataFrame(rows, columns=columns)


JOBS = frame(
    [
        ("fifo", "1", "completed", 100.0, 10.0, 1.0, 90.0, 1),
        ("fifo", "2", "completed", 300.0, 50.0, 2.0, 250.0, 2),
        ("fifo", "3", "completed", 200.0, 0.0, 1.0, 200.0, 1),
        ("fifo", "4", "unschedulable", None, None, None, None, 8),
        ("fifo", "5", "completed", 60.0, 0.0, 1.5, 60.0, 0),
    ]
)
OWNERS = {"1": "ana", "2": "ana", "3": "ben", "4": "ben"}


def test_each_group_gets_its_own_figures():
    summary = group_summary(JOBS, OWNERS)
    assert list(summary.columns) == GROUP_COLUMNS
    rows = {r.group: r for r in summary.itertuples()}
    assert set(rows) == {"ana", "ben", "?"}  # job 5 has no owner in the mapping
    ana, ben = rows["ana"], rows["ben"]
    assert (ana.jobs, ana.completed) == (2, 2)
    assert ana.avg_jct_s == 200.0 and ana.avg_queue_s == 30.0 and ana.avg_slowdown == 1.5
    assert ana.mean_speedup == pytest.approx((1.0 + 0.5) / 2)
    assert ana.gpu_seconds == 90.0 + 2 * 250.0
    assert (ben.jobs, ben.completed) == (2, 1) and ben.avg_jct_s == 200.0
    assert ben.mean_speedup == 1.0 and ben.gpu_seconds == 200.0


def test_group_fairness_is_min_over_max_of_mean_speedups():
    summary = group_summary(JOBS, OWNERS)
    fairness = group_fairness(summary)
    # ana 0.75, ben 1.0, ? (job 5: speedup 1/1.5)
    assert fairness == {"fifo": pytest.approx((1 / 1.5) / 1.0)}


def test_policies_are_kept_apart_and_empty_input_is_empty():
    two = pd.concat([JOBS, JOBS.assign(policy="binpack", slowdown=1.0)], ignore_index=True)
    fairness = group_fairness(group_summary(two, OWNERS))
    assert fairness["binpack"] == 1.0 and fairness["fifo"] < 1.0
    assert group_summary(JOBS.iloc[0:0], OWNERS).empty
    nothing_done = frame([("fifo", "4", "unschedulable", None, None, None, None, 8)])
    assert math.isnan(group_fairness(group_summary(nothing_done, OWNERS))["fifo"])

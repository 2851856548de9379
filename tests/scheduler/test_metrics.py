"""Metrics over hand-built frames: each expected value is worked out from the definitions."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scheduler import metrics


def jobs_frame():
    # id, arrival, start, finish, solo, gpus, reason, mode
    rows = [
        ("a", 0.0, 0.0, 100.0, 100.0, 1, "completed", "exclusive"),
        ("b", 0.0, 10.0, 210.0, 100.0, 1, "completed", "mps"),
        ("c", 50.0, 60.0, 160.0, 50.0, 2, "completed", "mps"),
        ("d", 20.0, None, None, None, 1, "unschedulable", None),
        ("e", 5.0, 5.0, None, 80.0, 1, "failed-oom", "mps"),
    ]
    out = []
    for jid, arr, start, fin, solo, gpus, reason, mode in rows:
        run = fin - start if fin is not None else None
        sd = run / solo if run is not None else None
        out.append(
            {
                "job_id": jid,
                "arrival_s": arr,
                "start_s": start,
                "finish_s": fin,
                "solo_s": solo,
                "gpus": gpus,
                "end_reason": reason,
                "mode": mode,
                "jct_s": fin - arr if fin is not None else None,
                "queue_s": start - arr if start is not None else None,
                "run_s": run,
                "slowdown": sd,
                "speedup": 1 / sd if sd else None,
            }
        )
    return pd.DataFrame(out)


def test_job_level_metrics():
    jobs = jobs_frame()
    assert metrics.average_jct(jobs) == pytest.approx((100 + 210 + 110) / 3)
    assert metrics.average_queueing_delay(jobs) == pytest.approx((0 + 10 + 10) / 3)
    assert metrics.makespan(jobs) == pytest.approx(210.0)
    mean_sd, max_sd = metrics.slowdown_stats(jobs)
    assert (mean_sd, max_sd) == pytest.approx(((1 + 2 + 2) / 3, 2.0))
    assert metrics.antt(jobs) == pytest.approx((100 / 100 + 210 / 100 + 110 / 50) / 3)
    assert metrics.fairness(jobs) == pytest.approx(0.5 / 1.0)


def test_utilisation_and_weighted_speedup_from_a_step_timeline():
    # 2 GPUs: both busy 0-100, one busy 100-200, none after.
    timeline = pd.DataFrame({"t_s": [0.0, 100.0, 200.0], "busy_gpus": [2.0, 1.0, 0.0]})
    assert metrics.busy_gpu_seconds(timeline) == pytest.approx(300.0)
    assert metrics.gpu_utilisation(timeline, 2, 0.0, 200.0) == pytest.approx(300 / 400)
    assert metrics.gpu_utilisation(timeline, 2, 50.0, 150.0) == pytest.approx(150 / 200)
    jobs = jobs_frame()
    solo_gpu_s = 100 * 1 + 100 * 1 + 50 * 2
    assert metrics.weighted_speedup(jobs, 300.0) == pytest.approx(solo_gpu_s / 300.0)


def test_latency_percentiles_and_sd_max_diff():
    p50, p99 = metrics.latency_ms([0.001, 0.002, 0.003])
    assert p50 == pytest.approx(2.0)
    assert 2.9 < p99 <= 3.0
    assert all(math.isnan(v) for v in metrics.latency_ms([]))
    samples = pd.DataFrame({"t_s": [0, 1], "max_diff": [0.2, 0.6]})
    assert metrics.sd_max_diff(samples) == pytest.approx((0.4, 0.6))


def test_summary_row_counts_endings_and_has_the_cli_columns():
    timeline = pd.DataFrame({"t_s": [0.0, 210.0], "busy_gpus": [1.0, 0.0]})
    samples = pd.DataFrame(columns=["t_s", "max_diff"])
    row = metrics.summary_row(
        "p", jobs_frame(), timeline, samples, [0.001], gpu_count=2, oom_count=4
    )
    assert set(row) >= {
        "policy",
        "jobs",
        "completed",
        "avg_jct_s",
        "makespan_s",
        "gpu_util",
        "max_slowdown",
        "oom_count",
        "decision_ms_p50",
    }
    assert (row["jobs"], row["completed"], row["failed_oom"], row["unschedulable"]) == (5, 3, 1, 1)
    assert row["gpu_util"] == pytest.approx(210 / (2 * 210))
    assert row["oom_count"] == 4


def _row(jobs):
    timeline = pd.DataFrame({"t_s": [0.0, 210.0], "busy_gpus": [1.0, 0.0]})
    samples = pd.DataFrame(columns=["t_s", "max_diff"])
    return metrics.summary_row("p", jobs, timeline, samples, [0.001], gpu_count=2, oom_count=0)


def test_an_incomplete_run_gives_no_jct_or_makespan_and_says_why():
    row = _row(jobs_frame())  # one unschedulable, one failed
    assert row["status"] == "incomplete: 1 failed-oom, 1 unschedulable"
    for column in ("avg_jct_s", "avg_queue_s", "makespan_s", "antt"):
        assert math.isnan(row[column]), column
    assert row["completed"] == 3  # still counted


def test_rejected_jobs_do_not_make_a_run_incomplete():
    jobs = jobs_frame()
    jobs = jobs[jobs["job_id"].isin(["a", "b", "c"])].copy()
    jobs.loc[len(jobs)] = {"job_id": "r", "arrival_s": 1.0, "end_reason": "rejected", "gpus": 99}
    row = _row(jobs)
    assert row["status"] == "complete" and row["rejected"] == 1 and row["completed"] == 3
    assert row["avg_jct_s"] == pytest.approx((100 + 210 + 110) / 3)  # over the admitted jobs
    assert row["makespan_s"] == pytest.approx(210.0)


def test_ranking_leaves_incomplete_runs_out_whatever_their_figures():
    summary = pd.DataFrame(
        [
            {"policy": "slow", "status": "complete", "avg_jct_s": 900.0},
            {"policy": "quick-but-left-jobs", "status": "incomplete: 4 unfinished"},
            {"policy": "fast", "status": "complete", "avg_jct_s": 300.0},
        ]
    )
    assert metrics.ranking(summary) == [("fast", 300.0), ("slow", 900.0)]
    summary["rejected"] = 0
    notes = metrics.summary_notes(summary)
    assert notes[0].startswith("INCOMPLETE quick-but-left-jobs: 4 unfinished")
    assert notes[-1] == "ranking by avg JCT (complete runs only): 1. fast 300 s, 2. slow 900 s"


def test_empty_results_give_nan_not_errors():
    jobs = jobs_frame()
    none_done = jobs[jobs["end_reason"] != "completed"]
    assert math.isnan(metrics.average_jct(none_done))
    assert math.isnan(metrics.makespan(none_done))
    assert math.isnan(metrics.fairness(none_done))

"""``python -m scheduler.reproduce``: the sharing001 and kscheduler003 comparisons."""

from __future__ import annotations

import pandas as pd

from scheduler import reproduce


def test_kscheduler003_keeps_the_thesis_direction(tmp_path, capsys):
    assert reproduce.main(["kscheduler003", "--quiet", "--out", str(tmp_path)]) == 0
    summary = pd.read_csv(tmp_path / "summary.csv").set_index("policy")
    assert set(summary.index) == {"kscheduler", "warped_slicer", "even_partition"}
    assert summary["all_completed"].all() and (summary["workloads"] == 9).all()
    k, w, e = (summary.loc[p] for p in ("kscheduler", "warped_slicer", "even_partition"))
    # The thesis: K-Scheduler has the best weighted speedup, ANTT and fairness.
    assert k.weighted_speedup > max(w.weighted_speedup, e.weighted_speedup)
    assert k.antt < min(w.antt, e.antt)
    assert k.fairness > max(w.fairness, e.fairness)
    assert "thesis_antt" in summary.columns and "W9" in capsys.readouterr().out


def test_sharing001_one_seed_table(monkeypatch):
    runs = reproduce.run_sharing001(seeds=1)
    assert len(runs) == 2 * 3 and (runs.completed == runs.jobs).all()
    summary = reproduce.summarize_sharing001(runs).set_index(["reading", "policy"])
    assert summary.loc[("bound", "sharing_mode"), "ratio_to_sharing_mode"] == 1.0
    byscale = summary.loc[("work-conserving", "byscale")]
    assert (
        byscale.makespan_mean_s > summary.loc[("work-conserving", "sharing_mode")].makespan_mean_s
    )
    assert byscale.paper_ratio == 5.0


def test_seed_zero_keeps_the_scenario_order():
    jobs = list(range(10))
    assert reproduce.shuffled(jobs, 0) == jobs
    assert sorted(reproduce.shuffled(jobs, 3)) == jobs and reproduce.shuffled(jobs, 3) != jobs


def test_slowdown000_lowers_the_settled_gap_in_every_set(tmp_path):
    assert reproduce.main(["slowdown000", "--quiet", "--out", str(tmp_path)]) == 0
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["completed"].all() and len(summary) == 6
    for key in ("a", "b", "c"):
        rows = summary[summary["set"] == key].set_index("policy")
        static, dr = rows.loc["loadbalance"], rows.loc["slowdown_dr"]
        assert static.ratio_changes == 0 and dr.ratio_changes > 0
        assert dr.sd_max_diff_settled < static.sd_max_diff_settled
        assert dr.job_sd_max <= static.job_sd_max + 0.01
    samples = pd.read_csv(tmp_path / "runs.csv")
    assert {"set", "policy", "t_s", "max_diff", "util_pct"} <= set(samples.columns)


def test_reserve_comparison_runs_both_ways_and_summarizes():
    from scheduler.scenarios.reservations import run_reservations, summarize_reservations

    runs = run_reservations(
        traces=("philly_multigpu",),
        policies=(("placement_rate", "placement_rate", {}),),
    )
    assert list(runs.reserve) == [False, True]
    assert (runs.status == "complete").all() and (runs.completed == 500).all()
    assert (runs.big_jobs == 21).all() and (runs.big_started == 21).all()
    off, on = runs.big_worst_wait_s
    assert on < off  # the 8-GPU jobs' worst wait: the reservation's point
    summary = summarize_reservations(runs)
    assert len(summary) == 1 and summary.jct_on_over_off.iloc[0] > 0

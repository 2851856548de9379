"""Multi-seed runs: one row per (policy, seed), median and range per policy."""

from __future__ import annotations

import dataclasses

from scheduler.multiseed import HEADLINE, markdown, run_seeds, seed_summary
from scheduler.scenarios import load_scenario


def test_seeds_draw_the_noise_and_the_summary_gives_median_and_range() -> None:
    sc = load_scenario("gavel100_burst")
    jobs = list(sc.jobs)[:20]
    config = dataclasses.replace(sc.config, **HEADLINE)
    frame = run_seeds(["fifo", "hetero_srtf"], sc.cluster, jobs, config, [0, 1, 2])
    assert list(frame["policy"]) == ["fifo"] * 3 + ["hetero_srtf"] * 3
    assert (frame["completed"] == 20).all() and (frame["total"] == 20).all()
    # fifo never reads estimates: the noise leaves it alone; hetero_srtf's order follows them.
    fifo = frame[frame["policy"] == "fifo"]
    assert fifo["avg_jct_s"].nunique() == 1
    srtf = frame[frame["policy"] == "hetero_srtf"]
    assert srtf["avg_jct_s"].nunique() > 1
    summary = seed_summary(frame)
    row = summary[summary["policy"] == "hetero_srtf"].iloc[0]
    assert row["avg_jct_s_min"] <= row["avg_jct_s_median"] <= row["avg_jct_s_max"]
    assert row["avg_jct_s_median"] == srtf["avg_jct_s"].median()
    assert row["complete_seeds"] == 3
    assert "| hetero_srtf | 3/3 |" in markdown(summary)


def test_an_incomplete_seed_is_counted_not_hidden() -> None:
    sc = load_scenario("gavel100_burst")
    jobs = list(sc.jobs)[:20]
    config = dataclasses.replace(sc.config, max_time_s=3600.0)
    frame = run_seeds(["fifo"], sc.cluster, jobs, config, [0])
    assert frame["completed"].iloc[0] < frame["admitted"].iloc[0]
    assert seed_summary(frame)["complete_seeds"].iloc[0] == 0

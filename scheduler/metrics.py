"""Metrics of DESIGN.md ("Metrics, defined once") as pure functions over data frames.

Inputs are the simulator's frames (``SimResult.jobs_frame()``, ``timeline_frame()``,
``slowdown_frame()``) or any frame with the same columns (the portal's job history). Times are
seconds; utilisation is a fraction 0..1; latencies are reported in milliseconds.

Definitions (docs/simulator.md, "Metrics"):

- JCT = finish - arrival; queueing delay = first start - arrival; makespan = last finish -
  first arrival; all over completed jobs.
- Slow-Down of a finished job = (finish - first start) / solo time on the GPU model (or CPU)
  it ran on: ALGORITHMS §5's ``SD_i`` at completion, when ``iter_left`` is 0. Queueing is not
  in it (that is ANTT's job). While running, the simulator samples
  ``(now - start + remaining time at the current speed) / solo``; ``SD_max_diff`` = max - min
  over the running jobs at a sample.
- Speedup = solo / co-run time = 1 / Slow-Down (0..1; ALGORITHMS §2).
- Weighted speedup = sum of solo GPU-seconds (solo time x GPUs) of the completed GPU jobs /
  busy GPU-seconds (time a GPU ran at least one unpaused job): ALGORITHMS §3's "sum of solo
  times / concurrent time", per GPU-second. > 1 means sharing got more work done per GPU.
- ANTT = mean of turnaround / solo time, turnaround = finish - arrival (§3; lower is better).
- Fairness = min speedup / max speedup over completed jobs (§3; 0..1).
- GPU utilisation = busy GPU-seconds / (GPUs x (last finish - first arrival)).

**Complete runs only.** A run is *complete* when every admitted job (every job but those
rejected at arrival because the cluster could never run them) completed. Averages over the
completed jobs flatter a run that left its hardest jobs unfinished, so the summary gives
``avg_jct_s``, ``avg_queue_s``, ``makespan_s`` and ``antt`` only for complete runs (NaN, an
empty cell in CSV, otherwise), says why in ``status`` and ranks complete runs only
(``ranking``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)

COMPLETED = "completed"
REJECTED = "rejected"
COMPLETE = "complete"
#: Columns given only for complete runs (see the module docstring).
COMPLETE_ONLY = ("avg_jct_s", "avg_queue_s", "makespan_s", "antt")


def completed(jobs: pd.DataFrame) -> pd.DataFrame:
    """The rows of jobs that completed."""
    return jobs[jobs["end_reason"] == COMPLETED]


def _mean(series: pd.Series) -> float:
    s = series.dropna()
    return float(s.mean()) if len(s) else float("nan")


def average_jct(jobs: pd.DataFrame) -> float:
    """Mean JCT (s) of completed jobs; NaN if none completed."""
    return _mean(completed(jobs)["jct_s"])


def average_queueing_delay(jobs: pd.DataFrame) -> float:
    """Mean queueing delay (s): first start - arrival, completed jobs."""
    return _mean(completed(jobs)["queue_s"])


def span(jobs: pd.DataFrame) -> tuple[float, float]:
    """(first arrival, last finish) of the completed jobs, in s; (nan, nan) if none."""
    done = completed(jobs)
    if done.empty:
        return float("nan"), float("nan")
    return float(done["arrival_s"].min()), float(done["finish_s"].max())


def makespan(jobs: pd.DataFrame) -> float:
    """Last finish - first arrival (s) over completed jobs."""
    first, last = span(jobs)
    return last - first


def slowdown_stats(jobs: pd.DataFrame) -> tuple[float, float]:
    """(mean, max) Slow-Down of completed jobs (see the module docstring)."""
    s = completed(jobs)["slowdown"].dropna()
    if s.empty:
        return float("nan"), float("nan")
    return float(s.mean()), float(s.max())


def antt(jobs: pd.DataFrame) -> float:
    """Average normalised turnaround time: mean (finish - arrival) / solo (ALGORITHMS §3)."""
    done = completed(jobs).dropna(subset=["solo_s", "jct_s"])
    done = done[done["solo_s"] > 0]
    return float((done["jct_s"] / done["solo_s"]).mean()) if len(done) else float("nan")


def fairness(jobs: pd.DataFrame) -> float:
    """min speedup / max speedup over completed jobs (ALGORITHMS §3), 0..1."""
    s = completed(jobs)["speedup"].dropna()
    if s.empty or s.max() <= 0:
        return float("nan")
    return float(s.min() / s.max())


def busy_gpu_seconds(timeline: pd.DataFrame, end_s: float | None = None) -> float:
    """Integral of ``busy_gpus`` over time (GPU-seconds), up to ``end_s`` (default: last
    point). The timeline is a step function: each row holds until the next."""
    if timeline.empty:
        return 0.0
    t = timeline["t_s"].to_numpy(dtype=float)
    busy = timeline["busy_gpus"].to_numpy(dtype=float)
    end = float(t[-1]) if end_s is None else float(end_s)
    nxt = np.minimum(np.append(t[1:], end), end)
    widths = np.clip(nxt - t, 0.0, None)
    return float((busy * widths).sum())


def gpu_utilisation(timeline: pd.DataFrame, gpu_count: int, start_s: float, end_s: float) -> float:
    """Time-averaged fraction of GPUs busy over [start_s, end_s]."""
    if gpu_count <= 0 or not end_s > start_s:
        return float("nan")
    window = timeline[timeline["t_s"] <= end_s]
    before = window[window["t_s"] <= start_s]
    area = busy_gpu_seconds(window, end_s) - busy_gpu_seconds(before, start_s)
    return area / (gpu_count * (end_s - start_s))


def utilisation_over_time(timeline: pd.DataFrame, gpu_count: int) -> pd.DataFrame:
    """``t_s, util`` (fraction of GPUs busy) at each change point, for plots."""
    out = timeline[["t_s"]].copy()
    out["util"] = timeline["busy_gpus"] / gpu_count if gpu_count else np.nan
    return out


def weighted_speedup(jobs: pd.DataFrame, busy_gpu_s: float) -> float:
    """Solo GPU-seconds of completed GPU jobs / busy GPU-seconds (module docstring)."""
    done = completed(jobs)
    done = done[(done["gpus"] > 0) & (done["mode"] != "cpu")].dropna(subset=["solo_s"])
    if busy_gpu_s <= 0 or done.empty:
        return float("nan")
    return float((done["solo_s"] * done["gpus"]).sum() / busy_gpu_s)


def sd_max_diff(samples: pd.DataFrame) -> tuple[float, float]:
    """(time-averaged, maximum) SD_max_diff over the Slow-Down samples (ALGORITHMS §5)."""
    if samples.empty:
        return float("nan"), float("nan")
    return float(samples["max_diff"].mean()), float(samples["max_diff"].max())


def latency_ms(latencies_s: Sequence[float]) -> tuple[float, float]:
    """(p50, p99) decision latency in milliseconds; NaN if there were no calls."""
    if not len(latencies_s):
        return float("nan"), float("nan")
    arr = np.asarray(latencies_s, dtype=float) * 1000.0
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


SUMMARY_COLUMNS = [
    "policy",
    "status",
    "jobs",
    "completed",
    "rejected",
    "failed_oom",
    "unschedulable",
    "unfinished",
    "avg_jct_s",
    "avg_queue_s",
    "makespan_s",
    "gpu_util",
    "avg_slowdown",
    "max_slowdown",
    "sd_max_diff_avg",
    "weighted_speedup",
    "antt",
    "fairness",
    "oom_count",
    "decision_ms_p50",
    "decision_ms_p99",
    "policy_calls",
    "events",
    "wall_s",
]


def summary_row(
    policy: str,
    jobs: pd.DataFrame,
    timeline: pd.DataFrame,
    samples: pd.DataFrame,
    latencies_s: Sequence[float],
    gpu_count: int,
    oom_count: int,
    **extra: Any,
) -> dict[str, Any]:
    """One row of the comparison table (``SUMMARY_COLUMNS``). ``status`` is ``complete`` or
    ``incomplete: ...`` with the counts of jobs that did not complete; the ``COMPLETE_ONLY``
    columns are NaN for an incomplete run."""
    reasons = jobs["end_reason"].value_counts()
    first, last = span(jobs)
    busy = busy_gpu_seconds(timeline[timeline["t_s"] <= last], last) if last == last else 0.0
    mean_sd, max_sd = slowdown_stats(jobs)
    p50, p99 = latency_ms(latencies_s)
    row = {
        "policy": policy,
        "status": run_status(reasons),
        "jobs": len(jobs),
        "completed": int(reasons.get(COMPLETED, 0)),
        "rejected": int(reasons.get(REJECTED, 0)),
        "failed_oom": int(reasons.get("failed-oom", 0)),
        "unschedulable": int(reasons.get("unschedulable", 0)),
        "unfinished": int(reasons.get("unfinished", 0)),
        "avg_jct_s": average_jct(jobs),
        "avg_queue_s": average_queueing_delay(jobs),
        "makespan_s": last - first,
        "gpu_util": gpu_utilisation(timeline, gpu_count, first, last),
        "avg_slowdown": mean_sd,
        "max_slowdown": max_sd,
        "sd_max_diff_avg": sd_max_diff(samples)[0],
        "weighted_speedup": weighted_speedup(jobs, busy),
        "antt": antt(jobs),
        "fairness": fairness(jobs),
        "oom_count": oom_count,
        "decision_ms_p50": p50,
        "decision_ms_p99": p99,
    }
    if row["status"] != COMPLETE:
        for column in COMPLETE_ONLY:
            row[column] = float("nan")
    row.update(extra)
    return row


def run_status(reasons: Any) -> str:
    """``complete`` if every job that was not rejected completed, else ``incomplete: 3
    unschedulable, 1 unfinished`` (``reasons``: end reason -> count)."""
    missing = {
        str(reason): int(count)
        for reason, count in dict(reasons).items()
        if reason not in (COMPLETED, REJECTED) and count
    }
    if not missing:
        return COMPLETE
    return "incomplete: " + ", ".join(f"{n} {r}" for r, n in sorted(missing.items()))


def ranking(summary: pd.DataFrame, by: str = "avg_jct_s") -> list[tuple[str, float]]:
    """(policy, value) of the complete runs, best (lowest ``by``) first; incomplete runs are
    left out whatever their figures."""
    done = summary[summary["status"] == COMPLETE].dropna(subset=[by])
    done = done.sort_values(by, kind="stable")
    return [(str(p), float(v)) for p, v in zip(done["policy"], done[by], strict=True)]


def summarize(result: Any) -> dict[str, Any]:
    """``summary_row`` of a ``scheduler.simulator.SimResult``."""
    return summary_row(
        result.policy,
        result.jobs_frame(),
        result.timeline_frame(),
        result.slowdown_frame(),
        result.decision_latency_s,
        result.gpu_count,
        result.oom_count,
        policy_calls=result.policy_calls,
        events=result.events,
        wall_s=result.wall_s,
    )


def summary_notes(summary: pd.DataFrame) -> list[str]:
    """Lines under the table: incomplete runs (and why), rejected jobs, and the ranking by
    average JCT over complete runs only (``scheduler.metrics.ranking``)."""
    lines = []
    for _, row in summary.iterrows():
        if row["status"] != COMPLETE:
            lines.append(
                f"INCOMPLETE {row['policy']}: {row['status'].removeprefix('incomplete: ')} "
                "(avg JCT, queueing delay, makespan and ANTT not given: they would count only "
                "the jobs that finished)"
            )
    rejected = summary["rejected"].max() if len(summary) else 0
    if rejected:
        lines.append(
            f"{int(rejected)} job(s) rejected at arrival: the cluster could never run them "
            "(jobs.csv says why)"
        )
    ranked = ranking(summary)
    if ranked:
        lines.append(
            "ranking by avg JCT (complete runs only): "
            + ", ".join(f"{i}. {p} {v:,.0f} s" for i, (p, v) in enumerate(ranked, start=1))
        )
    elif len(summary):
        lines.append("ranking: no complete run to rank")
    return lines

"""Metrics per group of jobs (per user now; per project once projects exist), over the
simulator's job frames (``SimResult.jobs_frame()``) or any frame with the same columns.

A group is whatever key a caller maps each job id to (``group_of``): the portal's what-if replay
passes job id -> user name. Definitions follow ``scheduler.metrics`` (docs/simulator.md,
"Metrics"): JCT and queueing delay over completed jobs (s), Slow-Down = run time / solo time.

**Group fairness** = min / max over groups of the group's mean speedup (speedup = 1 / Slow-Down,
ALGORITHMS.md §2 and §3's fairness, taken across groups instead of jobs): 1 when every group's
jobs ran as close to their solo speed as every other group's, towards 0 when one group's jobs
were slowed down much more than another's.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd  # type: ignore[import-untyped]  # pandas ships no type hints (no pandas-stubs)

from scheduler.metrics import COMPLETED

GROUP_COLUMNS = [
    "policy",
    "group",
    "jobs",
    "completed",
    "avg_jct_s",
    "avg_queue_s",
    "avg_slowdown",
    "mean_speedup",
    "gpu_seconds",
]


def group_summary(jobs: pd.DataFrame, group_of: Mapping[str, str]) -> pd.DataFrame:
    """One row per (policy, group): jobs, completed, mean JCT / queueing delay / Slow-Down of
    the completed jobs, mean speedup, and GPU-seconds used (run time x GPUs, completed jobs).

    Jobs whose id ``group_of`` does not hold fall in group ``"?"``. A frame without a
    ``policy`` column counts as one policy ``""``.
    """
    if jobs.empty:
        return pd.DataFrame(columns=GROUP_COLUMNS)
    frame = jobs.copy()
    if "policy" not in frame.columns:
        frame["policy"] = ""
    frame["group"] = [group_of.get(str(j), "?") for j in frame["job_id"]]
    rows = []
    for (policy, group), part in frame.groupby(["policy", "group"], sort=True):
        done = part[part["end_reason"] == COMPLETED]
        slowdown = done["slowdown"].dropna()
        speedup = (1.0 / slowdown[slowdown > 0]) if len(slowdown) else slowdown
        run = (done["run_s"].fillna(0.0) * done["gpus"]).sum() if len(done) else 0.0
        rows.append(
            {
                "policy": policy,
                "group": group,
                "jobs": len(part),
                "completed": len(done),
                "avg_jct_s": _mean(done["jct_s"]),
                "avg_queue_s": _mean(done["queue_s"]),
                "avg_slowdown": _mean(slowdown),
                "mean_speedup": _mean(speedup),
                "gpu_seconds": float(run),
            }
        )
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def group_fairness(summary: pd.DataFrame) -> dict[str, float]:
    """policy -> min / max of the groups' mean speedup (see the module docstring); NaN for a
    policy with fewer than one group holding a known speedup."""
    out: dict[str, float] = {}
    for policy, part in summary.groupby("policy", sort=False):
        speedups = part["mean_speedup"].dropna()
        speedups = speedups[speedups > 0]
        out[str(policy)] = float(speedups.min() / speedups.max()) if len(speedups) else float("nan")
    return out


def _mean(series: pd.Series) -> float:
    s = series.dropna()
    return float(s.mean()) if len(s) else float("nan")

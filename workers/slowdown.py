"""Live Slow-Down of running jobs (ALGORITHMS.md §5), for the node agent and the dashboard.

    SD_i = (T_current - T_start + iter_left * iter_time) / solorun_time
    SD_max_diff = max |SD_i - SD_j| over running jobs = max(SD) - min(SD)

``T_current - T_start`` is wall time since the job started (pauses included: a paused job falls
behind). The remaining-time estimate is ``iter_left * iter_time`` when the job reports
iterations (``iter_time`` = its recent mean iteration time, seconds); with only a progress
fraction ``p`` it is ``active_s * (1 - p) / p`` when the job's active (unpaused) time is known,
else ``elapsed * (1 - p) / p``, i.e. the rate so far continues. Nothing can be estimated before
the first progress report: None.

The simulator computes the same quantity from its own clock (``scheduler.simulator``); this is
the live reading from a job's reports, kept here because it needs nothing of the scheduler.
"""

from __future__ import annotations

from collections.abc import Iterable


def remaining_estimate_s(
    *,
    elapsed_s: float,
    progress: float | None = None,
    iters_done: int | None = None,
    iters_total: int | None = None,
    iter_time_s: float | None = None,
    active_s: float | None = None,
) -> float | None:
    """Seconds of work left (see the module docstring), or None when it cannot be told.

    Iterations win over a fraction when both are given; a finished job has 0 s left.
    """
    if iters_total is not None and iters_done is not None and iter_time_s is not None:
        return max(0, iters_total - iters_done) * iter_time_s
    if progress is None and iters_total and iters_done is not None:
        progress = iters_done / iters_total
    if progress is None or progress <= 0.0:
        return None
    if progress >= 1.0:
        return 0.0
    basis = active_s if active_s is not None else elapsed_s
    return basis * (1.0 - progress) / progress


def live_slowdown(
    now_s: float,
    started_s: float,
    solo_time_s: float | None,
    *,
    progress: float | None = None,
    iters_done: int | None = None,
    iters_total: int | None = None,
    iter_time_s: float | None = None,
    active_s: float | None = None,
) -> float | None:
    """SD_i (unitless) of a running job at ``now_s`` (seconds, same clock as ``started_s``).

    ``solo_time_s``: the job's solo run time on its GPU model from the profile. Returns None
    without a positive solo time or a remaining-time estimate. See the module docstring.
    """
    if solo_time_s is None or solo_time_s <= 0:
        return None
    elapsed = max(0.0, now_s - started_s)
    remaining = remaining_estimate_s(
        elapsed_s=elapsed,
        progress=progress,
        iters_done=iters_done,
        iters_total=iters_total,
        iter_time_s=iter_time_s,
        active_s=active_s,
    )
    if remaining is None:
        return None
    return (elapsed + remaining) / solo_time_s


def sd_max_diff(values: Iterable[float | None]) -> float:
    """SD_max_diff = max |SD_i - SD_j| (= max - min) over the known values; 0 below two."""
    known = [v for v in values if v is not None]
    if len(known) < 2:
        return 0.0
    return max(known) - min(known)

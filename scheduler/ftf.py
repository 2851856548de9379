"""Finish-time fairness of a simulated run (Mahajan et al.'s rho, as Gavel reports it).

A job's **finish-time-fairness ratio** is ``rho = JCT / isolated JCT``: its job completion
time over the time it would have taken on an isolated ``1/n`` share of the cluster, ``n``
being the time-averaged number of jobs present (queued, running or paused) between its arrival
and its finish. On a heterogeneous cluster the share is ``1/n`` of every GPU model at once:
the job progresses at ``sum over models of (GPUs of the model / n) / (its solo time there x
its GPU count)``, never faster than alone on its fastest model (``isolated_time_s`` of
``scheduler.policies.hetero_srtf``). ``rho`` <= 1 means the job did at least as well as with
its fair share. Times are the simulator's (true) solo times, not a policy's estimates.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from scheduler.domain import JobSpec
from scheduler.policies.hetero_srtf import isolated_time_s
from scheduler.simulator.results import SimResult


def jobs_present(result: SimResult) -> tuple[list[float], list[float]]:
    """(times, cumulative job-seconds) of the number of jobs present, from the timeline."""
    times: list[float] = []
    area: list[float] = []
    total = 0.0
    last_t, last_n = 0.0, 0
    for p in result.timeline:
        total += last_n * (p.t_s - last_t)
        times.append(p.t_s)
        area.append(total)
        last_t, last_n = p.t_s, p.queued + p.running + p.paused
    times.append(float("inf"))
    area.append(total)
    return times, area


def _integral(times: list[float], area: list[float], result: SimResult, t: float) -> float:
    i = bisect.bisect_right(times, t) - 1
    if i < 0:
        return 0.0
    p = result.timeline[i] if i < len(result.timeline) else result.timeline[-1]
    n = p.queued + p.running + p.paused
    return area[i] + n * (t - times[i])


def ftf_ratios(
    result: SimResult, jobs: Sequence[JobSpec], gpu_counts: Mapping[str, int]
) -> dict[str, float]:
    """Job id -> rho for every completed job of ``result`` (``jobs``: the true specs)."""
    by_id = {j.id: j for j in jobs}
    times, area = jobs_present(result)
    out = {}
    for rec in result.jobs:
        if rec.finish_s is None or rec.jct_s is None or rec.jct_s <= 0:
            continue
        spec = by_id.get(rec.job_id)
        if spec is None or spec.profile is None:
            continue
        span = rec.finish_s - rec.arrival_s
        n = (
            _integral(times, area, result, rec.finish_s)
            - _integral(times, area, result, rec.arrival_s)
        ) / span
        solo = {m: t for m, t in spec.profile.gpu_time_s.items() if m in gpu_counts}
        iso = isolated_time_s(solo, gpu_counts, spec.gpus, max(1, round(n)))
        if iso > 0 and iso != float("inf"):
            out[rec.job_id] = rec.jct_s / iso
    return out

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
import math
from collections.abc import Iterator, Mapping, Sequence

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


def _isolated(
    result: SimResult, jobs: Sequence[JobSpec], gpu_counts: Mapping[str, int]
) -> Iterator[tuple[str, float, JobSpec, dict[str, float], float]]:
    """(job id, JCT, true spec, solo times on the cluster's models, isolated JCT) of every
    completed job with a profile and a finite isolated time."""
    by_id = {j.id: j for j in jobs}
    times, area = jobs_present(result)
    for rec in result.jobs:
        jct = rec.jct_s
        if rec.finish_s is None or jct is None or jct <= 0:
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
            yield rec.job_id, jct, spec, solo, iso


def ftf_ratios(
    result: SimResult, jobs: Sequence[JobSpec], gpu_counts: Mapping[str, int]
) -> dict[str, float]:
    """Job id -> rho for every completed job of ``result`` (``jobs``: the true specs)."""
    return {jid: jct / iso for jid, jct, _, _, iso in _isolated(result, jobs, gpu_counts)}


def round_wait_floors(
    result: SimResult,
    jobs: Sequence[JobSpec],
    gpu_counts: Mapping[str, int],
    round_s: float | None,
) -> dict[str, float]:
    """Job id -> the smallest rho the job could have had in this run, for every job
    ``ftf_ratios`` rates: its wait for the first decision round at or after its arrival (the
    engine decides at multiples of ``round_s``; None or 0: at once) plus its fastest true solo
    time, over its isolated JCT in this run (the same ``n``: the jobs present as this run had
    them). No placement does better: the job cannot start before that round, nor run faster
    than alone on its fastest model (a multi-GPU job spread over nodes or a shared GPU is
    slower). Where a run's largest ratio sits at its job's floor, the rounds, not the policy's
    choices, made it."""
    out = {}
    for jid, _, spec, solo, iso in _isolated(result, jobs, gpu_counts):
        fastest = min((t for t in solo.values() if t > 0), default=0.0)
        wait = 0.0
        if round_s:
            wait = math.ceil(spec.arrival_s / round_s) * round_s - spec.arrival_s
        out[jid] = (wait + fastest) / iso
    return out

"""Job-seconds present: the history a finish-time-fairness cap reads (issue 24).

A job's finish-time-fairness ratio (``scheduler.ftf``) measures its isolated time with ``n``,
the number of jobs present (queued, running or paused) averaged over its life. A policy that
caps the ratio needs, for each job in a snapshot, the integral of that count from the job's
arrival to now. The simulator's policy object adds it up cycle by cycle; the live loop builds
a fresh policy each cycle, so the portal computes it from the jobs' submission and end times
(``portal.core.snapshot``) and hands it over as ``ClusterState.present_job_s``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping


def job_seconds_present(
    intervals: Iterable[tuple[float, float | None]],
    arrivals: Mapping[str, float],
    now: float,
) -> dict[str, float]:
    """For each job in ``arrivals`` (id -> arrival, seconds), the integral from its arrival to
    ``now`` of the number of jobs present. ``intervals``: (arrival, end or None while present)
    of every job present at some time in that span (jobs that ended before the earliest
    arrival asked about may be left out). Ends after ``now`` count as present until ``now``.

    Each job k adds its overlap with [a, now]: ``E_k - max(s_k, a)`` when its end ``E_k``
    (capped at now) is after ``a``. Summed: ``sum(E_k > a) E_k - sum(s_k > a) s_k - a * (#(E_k >
    a) - #(s_k > a))`` (a job starting after ``a`` also ends after it), read from sorted starts
    and ends with suffix sums: O((jobs + asked) log jobs)."""
    starts: list[float] = []
    ends: list[float] = []
    for start, end in intervals:
        stop = now if end is None else min(end, now)
        if stop > start:
            starts.append(start)
            ends.append(stop)
    starts.sort()
    ends.sort()
    s_suffix, e_suffix = _suffix(starts), _suffix(ends)
    out: dict[str, float] = {}
    for jid, a in arrivals.items():
        a = min(a, now)
        i = bisect_right(starts, a)
        j = bisect_right(ends, a)
        total = e_suffix[j] - s_suffix[i] - a * ((len(ends) - j) - (len(starts) - i))
        out[jid] = max(0.0, total)
    return out


def _suffix(values: list[float]) -> list[float]:
    """``out[i]`` = the sum of ``values[i:]`` (``out[len(values)]`` = 0)."""
    out = [0.0] * (len(values) + 1)
    total = 0.0
    for i in range(len(values) - 1, -1, -1):
        total += values[i]
        out[i] = total
    return out

"""Remaining time of a job whose length is unknown, from the service it has attained.

A job that declares no length (no profile, or ``JobSpec.length_known`` False) still tells the
scheduler how long it has run. Two classic non-clairvoyant rules order such jobs:

- **least attained service** (LAS): the job that has run least goes first. It needs no
  history, and it favours short jobs because every long job was once a short one.
- **Gittins index**: given the distribution of job lengths, a job that has run ``a`` seconds
  is worth ``G(a) = max over d of P(T - a <= d | T > a) / E[min(T - a, d) | T > a]``: the best
  chance of finishing per second of service invested, over every service budget ``d``. Ordering by
  the largest index minimises mean response time on one server (Gittins, 1989; Aalto, Ayesta
  and Righter, 2009); it is SRPT when lengths are known and LAS when the lengths have a
  decreasing hazard rate.

``effective_remaining_s`` returns ``1 / G(a)`` in seconds: for a job of known length ``r``
left, ``1 / G = r``, so the value sits in the same scale as a known job's remaining time and a
policy can rank both kinds in one queue. The distribution is the empirical one of the lengths
of completed jobs (``Knowledge.duration_samples``: same type and owner, else type, else every
job). Where fewer than ``min_samples`` completed jobs ran longer than ``a`` (no history, or a
job longer than what the cluster has seen), it falls back to LAS: the job is taken to need as
long again as it has run, and at least ``floor_s``.

Attained service is discretised (``discretise``: 0, then ``quantum``, 2x, 4x, ... seconds) so
that the order of two jobs changes at a few points of their lives, not continuously, the
discretised-LAS idea of Tiresias (Gu et al., NSDI 2019): a running job is not preempted by a
job that has run a moment less.

Pure functions, unit-tested (``tests/scheduler/test_gittins.py``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence


def discretise(attained_s: float, quantum_s: float) -> float:
    """``attained_s`` rounded down to 0 or ``quantum_s x 2^k`` (k = 0, 1, ...)."""
    if quantum_s <= 0:
        return max(0.0, attained_s)
    if attained_s < quantum_s:
        return 0.0
    return quantum_s * 2.0 ** math.floor(math.log2(attained_s / quantum_s))


def effective_remaining_s(
    lengths: Sequence[float],
    attained_s: float,
    *,
    floor_s: float,
    min_samples: int = 3,
) -> tuple[float, int]:
    """(``1 / G(attained_s)`` in seconds, how many completed lengths exceed ``attained_s``).

    ``lengths``: completed jobs' run times, sorted ascending. With fewer than ``min_samples``
    of them above ``attained_s``, LAS: ``max(attained_s, floor_s)`` (and 0 for the count).
    """
    a = max(0.0, attained_s)
    start = bisect.bisect_right(lengths, a)
    n = len(lengths) - start
    if n < max(1, min_samples):
        return max(a, floor_s), 0
    best = math.inf
    done = 0.0  # sum of (t - a) over the lengths up to and including this one
    for k in range(n):
        d = lengths[start + k] - a
        done += d
        # E[min(T - a, d)] x n = the finished ones' service + d for each one still running
        expected = done + (n - k - 1) * d
        ratio = expected / (k + 1)  # E[min] / P(T - a <= d), both x n
        if ratio < best:
            best = ratio
    return best, n

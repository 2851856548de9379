"""``hetero_srtf``'s estimates and keys (steps 1-3 and 6 of ``scheduler.policies.hetero_srtf``):
remaining time per GPU model from the profile and the reported progress, the priority key with
aging, the key a running job defends its GPUs with, the preemption rule, the pair value and the
isolated (``1/n`` share) finish time. Pure functions, unit-tested one by one
(``tests/scheduler/test_hetero_srtf_estimates.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from scheduler.domain import JobSpec

_INF = math.inf

#: A running job that reports all of its declared work done but has not ended overran its
#: estimate; it is assumed to need this fraction of the declared work again.
OVERRUN_LEFT = 0.25


def remaining_fraction(progress: float) -> float:
    """Fraction of its declared work a job still needs: ``1 - progress``, or ``OVERRUN_LEFT``
    once it reports everything done while still running."""
    return OVERRUN_LEFT if progress >= 1.0 else max(0.0, 1.0 - progress)


def remaining_times(
    job: JobSpec, progress: float, models: Iterable[str], *, spread: Mapping[str, bool] = {}
) -> dict[str, float]:
    """Estimated solo seconds left for ``job`` on each model of ``models`` it has a time for:
    ``remaining_fraction(progress) x`` the profile's time (spread over nodes where
    ``spread[model]``)."""
    if job.profile is None:
        return {}
    left = remaining_fraction(progress)
    out = {}
    for m in models:
        t = job.run_time_s(m, spread=spread.get(m, False))
        if t is not None and t > 0:
            out[m] = left * t
    return out


def priority_key(best_remaining_s: float, solo_best_s: float, age_s: float, aging: float) -> float:
    """SRTF key with aging: ``best_remaining / (1 + aging x age / solo_best)`` (lower first)."""
    if solo_best_s <= 0:
        return best_remaining_s
    return best_remaining_s / (1.0 + aging * max(0.0, age_s) / solo_best_s)


def defended_key(key: float, cost_s: float, margin: float) -> float:
    """The key a running job defends its GPUs with: ``key x (1 - margin) - cost``."""
    return key * (1.0 - margin) - cost_s


def should_preempt(
    challenger_key: float,
    incumbent_key: float,
    *,
    cost_s: float,
    margin: float,
    preemptions: int,
    max_preemptions: int,
) -> bool:
    """Whether a waiting job with ``challenger_key`` should take a running job's GPUs.

    Only if the running job has been preempted fewer than ``max_preemptions`` times and the
    challenger beats its defended key (``defended_key``): the swap must pay the restart cost.
    """
    if preemptions >= max_preemptions:
        return False
    return challenger_key < defended_key(incumbent_key, cost_s, margin)


def pair_value(norm_a: float, norm_b: float) -> float:
    """Throughput of a pair sharing a GPU, in jobs' worth: ``norm_a + norm_b``."""
    return norm_a + norm_b


def worth_packing(norm_a: float, norm_b: float, threshold: float) -> bool:
    """True if the pair's throughput reaches ``threshold`` (> 0) jobs' worth."""
    return threshold > 0 and pair_value(norm_a, norm_b) >= threshold


def isolated_time_s(
    times: Mapping[str, float], counts: Mapping[str, int], gpus: int, n: int
) -> float:
    """Finish time of a job with solo ``times`` per model on a ``1/n`` share of a cluster of
    ``counts`` GPUs per model (every model's share at once, Gavel's isolated baseline), never
    less than its time on its fastest model alone."""
    if not times:
        return _INF
    return isolated_from(min(times.values()), share_rate(times.items(), counts), gpus, n)


def share_rate(times: Iterable[tuple[str, float]], counts: Mapping[str, int]) -> float:
    """A job's progress per second on the whole cluster at once: the sum over its (model, solo
    time) ``times`` of the model's GPU count over the time (``isolated_time_s``' rate)."""
    return sum(counts.get(m, 0) / t for m, t in times if t > 0)


def isolated_from(fastest: float, rate: float, gpus: int, n: int) -> float:
    """``isolated_time_s`` from its parts: the job's ``fastest`` solo time and its
    ``share_rate``, for a job of ``gpus`` GPUs among ``n`` jobs (callers that ask for many
    ``n`` keep the parts)."""
    if rate <= 0:
        return _INF
    return max(fastest, max(1, n) * max(1, gpus) / rate)

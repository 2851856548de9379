"""Fair share: decayed past usage -> a factor in (0, 1] that orders equal jobs (docs/projects.md).

The idea is Slurm's classic fair-share factor ``F = 2^(-U/S)``: ``U`` the part of the cluster's
(decayed) usage an account consumed, ``S`` the part of the shares it holds. An account that used
exactly its share gets 0.5, one that used nothing 1, one that used far more than its share tends
to 0. Here it is computed at two levels and multiplied:

- the project among all projects (``U`` its share of all usage, ``S`` its shares over all
  shares, 1 each unless configured);
- the user within the project (``U`` their part of the project's usage, ``S`` 1 / the users the
  project has in the snapshot: those with usage or a queued job).

Usage decays exponentially with a half-life: a GPU-second used one half-life ago counts 0.5,
two half-lives ago 0.25 (``decayed_usage``). The portal turns attempt records into decayed usage
per (project, user) with it; the simulator can do the same from its own records.

Pure: no clock (``now_s`` is passed in), no I/O.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

from scheduler.domain import Accounts, JobSpec

#: Default half-life of past usage: 7 days (Slurm's ``PriorityDecayHalfLife`` default).
DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0


def decayed_usage(
    rate: float, start_s: float, end_s: float, now_s: float, half_life_s: float
) -> float:
    """Usage at ``rate`` per second (e.g. GPUs held) from ``start_s`` to ``end_s``, each second
    weighted by ``2^(-(now_s - t) / half_life_s)``: the exact integral. Intervals ending after
    ``now_s`` are cut at ``now_s``; a half-life <= 0 means no decay (plain rate x seconds)."""
    end_s = min(end_s, now_s)
    if end_s <= start_s or rate <= 0:
        return 0.0
    if half_life_s <= 0 or math.isinf(half_life_s):
        return rate * (end_s - start_s)
    k = math.log(2) / half_life_s
    # integral of exp(-k (now - t)) dt from start to end
    return rate * (math.exp(-k * (now_s - end_s)) - math.exp(-k * (now_s - start_s))) / k


def _factor(used_part: float, share_part: float) -> float:
    if share_part <= 0:
        return 0.0 if used_part > 0 else 1.0
    return float(2.0 ** (-used_part / share_part))


def fair_share_factors(
    accounts: Accounts, pending: Iterable[JobSpec] = ()
) -> dict[tuple[str, str], float]:
    """``(project, user) -> factor`` in (0, 1] for every pair with usage or a queued job (see the
    module docstring). Jobs without a project count as project ``""``, without an owner as user
    ``""``."""
    usage: Mapping[tuple[str, str], float] = accounts.usage
    pairs = set(usage)
    for job in pending:
        pairs.add((job.project or "", job.owner or ""))
    project_usage: dict[str, float] = defaultdict(float)
    users: dict[str, set[str]] = defaultdict(set)
    for project, user in pairs:
        users[project].add(user)
        project_usage[project] += max(0.0, float(usage.get((project, user), 0.0)))
    total = sum(project_usage.values())
    shares = {p: max(0.0, float(accounts.shares.get(p, 1.0))) for p in users}
    share_total = sum(shares.values())
    result: dict[tuple[str, str], float] = {}
    for project, user in pairs:
        p_used = project_usage[project] / total if total > 0 else 0.0
        p_share = shares[project] / share_total if share_total > 0 else 0.0
        u_usage = max(0.0, float(usage.get((project, user), 0.0)))
        u_used = u_usage / project_usage[project] if project_usage[project] > 0 else 0.0
        u_share = 1.0 / len(users[project])
        result[(project, user)] = _factor(p_used, p_share) * _factor(u_used, u_share)
    return result


def job_factor(job: JobSpec, factors: Mapping[tuple[str, str], float]) -> float:
    """The fair-share factor of ``job``'s (project, owner); 1 when unknown."""
    return factors.get((job.project or "", job.owner or ""), 1.0)

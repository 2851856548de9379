"""``gavel_maxmin`` and ``gavel_ftf``: Gavel's heterogeneity-aware policies (Narayanan et al.,
OSDI 2020), without space sharing.

Every decision point (a *round*, ``round_s`` = 360 s by default, Gavel's round length) the policy
computes an **allocation** ``X``: for every active job ``j`` (running or waiting GPU job) and GPU
model ``m``, the fraction of time ``X[j, m]`` the job should spend on ``m``. Constraints: a job
spends at most all of its time somewhere (``sum_m X[j, m] <= 1``) and a model is not
over-subscribed (``sum_j gpus_j X[j, m] <= GPUs of m``). ``T[j, m]`` is the job's estimated
throughput on ``m``: 1 / its estimated solo time there (``PeerPolicy.solo_time``: knowledge,
else profile, else time limit; a job nothing estimates gets ``DEFAULT_WORK_S`` on every model it
may use). The *effective throughput* of ``j`` under ``X`` is ``sum_m T[j, m] X[j, m]``.

- ``gavel_maxmin`` (Gavel's heterogeneity-aware max-min fairness, "LAS"): maximise the smallest
  normalised effective throughput ``sum_m T X / sum_m T X_equal`` where ``X_equal`` gives every
  job an equal time share of every model (``GPUs of m / max(GPUs asked, GPUs)``). One linear
  programme (``scipy.optimize.linprog``, HiGHS); a small second term (1e-3 x the sum of the
  normalised throughputs) picks, among the max-min optima, one that leaves no capacity idle.
- ``gavel_ftf`` (finish-time fairness, Themis' metric in Gavel's LP form): minimise the largest
  ``rho_j = (age_j + remaining_j / throughput_j(X)) / isolated_j``, ``isolated_j`` being the
  job's whole run time at ``X_equal``. ``rho`` is not linear in ``X``, but for a fixed ``rho``
  the constraints ``throughput_j(X) >= remaining_j / (rho isolated_j - age_j)`` are: the
  policy bisects on ``rho`` (feasibility LPs, ``ftf_iterations`` at most) and keeps the
  feasible ``X`` of the smallest ``rho`` found, with the same efficiency term.

The allocation is recomputed when the set of active jobs (or the cluster's GPUs) changes, as
Gavel does on arrivals and completions; rounds in between reuse it.

**Round mechanism** (Gavel §5): each job-model pair gets the priority ``X[j, m] / received[j,
m]``, ``received`` being the share of the job's time in the system it has run on ``m`` (0 gives
an infinite priority: pairs that never ran go first). Pairs are taken in decreasing priority
(ties: larger ``X``, the job already running on ``m``, arrival) and a job gets model ``m`` when
it has no model yet and ``m`` still has ``gpus_j`` GPUs this round. Jobs admitted on another
model than the one they run on move; running jobs left out are preempted when their GPUs are
needed (``PeerPolicy.realise``). Between rounds waiting jobs only fill idle GPUs (Gavel leaves
them idle until the next round; filling them is a small advantage we grant every peer).

Not modelled: space sharing (Gavel's SS variants need a pair-throughput estimate the peers do not
read; multi-GPU pairs are zero in Gavel's table anyway), job priorities and weights, and
Gavel's placement sensitivity beyond our consolidation rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from scipy.optimize import linprog  # type: ignore[import-untyped]
from scipy.sparse import coo_matrix, hstack, vstack  # type: ignore[import-untyped]

from scheduler.domain import ClusterState, JobSpec
from scheduler.policies.base import PolicyError
from scheduler.policies.peer_base import DEFAULT_WORK_S, Cluster, PeerPolicy, Want, peer_defaults

_EFFICIENCY = 1e-3


def equal_share(gpus: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``X_equal`` per model (the same for every job): GPUs of m / max(GPUs asked, GPUs)."""
    total = float(counts.sum())
    return counts / max(float(gpus.sum()), total, 1e-12)


def job_classes(T: np.ndarray, gpus: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class of each job, each class's throughput row scaled to a largest entry of 1, each
    job's scale ``max_m T[j, m]``). Jobs of one class have the same GPU count and throughput
    rows proportional to each other (to 3 significant digits): the same job type, whatever
    its length."""
    scale = T.max(axis=1) if T.size else np.zeros(len(T))
    safe = np.where(scale > 0, scale, 1.0)
    shape = np.round(T / safe[:, None], 3)
    keys = np.concatenate([shape, gpus[:, None]], axis=1)
    _, first, labels = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    return labels.reshape(-1), shape[first], scale


def _structure(
    T: np.ndarray, weight: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray, Any, np.ndarray]:
    """(row index, model index of every variable, the rows "a row's time <= 1" and "a
    model's GPUs", their bounds). ``weight``: GPUs one unit of a row's time takes."""
    jj, mm = np.nonzero(T > 0)
    nv = len(jj)
    rows = np.concatenate([jj, len(T) + mm])
    cols = np.concatenate([np.arange(nv), np.arange(nv)])
    vals = np.concatenate([np.ones(nv), weight[jj].astype(float)])
    A = coo_matrix((vals, (rows, cols)), shape=(len(T) + len(counts), nv))
    b = np.concatenate([np.ones(len(T)), counts.astype(float)])
    return jj, mm, A, b


def allocation_maxmin(T: np.ndarray, gpus: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Max-min fair ``X`` (jobs x models) of normalised effective throughput (module doc).

    ``T``: throughput per job and model (0: the job may not use the model); ``gpus``: GPUs per
    job; ``counts``: GPUs per model. Normalised throughput does not change when a job's row is
    scaled, so jobs of one class (``job_classes``) are interchangeable and one LP row per
    class gives the same optimum (the LP is convex: averaging an optimum over the members of
    a class is an optimum): the LP grows with the job types, not the jobs."""
    n, M = T.shape
    X = np.zeros((n, M))
    if n == 0 or M == 0:
        return X
    labels, Tg, _ = job_classes(T, gpus)
    G = len(Tg)
    members = np.bincount(labels, minlength=G).astype(float)
    g_gpus = np.zeros(G)
    g_gpus[labels] = gpus
    jj, mm, cap, b = _structure(Tg, members * g_gpus, counts)
    nv = len(jj)
    if nv == 0:
        return X
    eq = Tg @ equal_share(gpus, counts)
    eq[eq <= 0] = 1.0
    norm = Tg[jj, mm] / eq[jj]
    # variables: x (nv), t; minimise -t - eps sum(members x norm x)
    c = np.concatenate([-_EFFICIENCY * norm * members[jj], [-1.0]])
    fair = coo_matrix(
        (np.concatenate([-norm, np.ones(G)]), (np.concatenate([jj, np.arange(G)]),
         np.concatenate([np.arange(nv), np.full(G, nv)]))),
        shape=(G, nv + 1),
    )  # fmt: skip
    A = vstack([fair, hstack([cap, coo_matrix((cap.shape[0], 1))])]).tocsr()
    ub = np.concatenate([np.zeros(G), b])
    bounds = [(0.0, 1.0)] * nv + [(0.0, None)]
    res = linprog(c, A_ub=A, b_ub=ub, bounds=bounds, method="highs")
    if res.status != 0 or res.x is None:
        return X
    Xg = np.zeros((G, M))
    Xg[jj, mm] = np.clip(res.x[:nv], 0.0, 1.0)
    return Xg[labels]


def allocation_ftf(
    T: np.ndarray,
    gpus: np.ndarray,
    counts: np.ndarray,
    age_s: np.ndarray,
    remaining: np.ndarray,
    iterations: int = 12,
    group_above: int = 256,
) -> tuple[np.ndarray, float]:
    """(``X``, its largest finish-time-fairness ratio ``rho``) minimising the largest ``rho``
    (module doc) by bisection on feasibility LPs. ``remaining``: fraction of each job left.

    With more than ``group_above`` jobs, jobs of one class (``job_classes``) share one row of
    time shares, sized for the member that needs the most: an approximation (every member
    gets what the most deprived one needs) that keeps a cycle under a second at 1,000 jobs."""
    n, M = T.shape
    X = np.zeros((n, M))
    if n == 0 or M == 0:
        return X, 0.0
    if n > group_above:
        labels, Tg, scale = job_classes(T, gpus)
    else:
        labels, Tg, scale = np.arange(n), T, np.ones(n)
    G = len(Tg)
    members = np.bincount(labels, minlength=G).astype(float)
    g_gpus = np.zeros(G)
    g_gpus[labels] = gpus
    jj, mm, cap, b = _structure(Tg, members * g_gpus, counts)
    nv = len(jj)
    if nv == 0:
        return X, math.inf
    eq = T @ equal_share(gpus, counts)
    eq[eq <= 0] = 1e-12
    iso = 1.0 / eq
    best_rate = T.max(axis=1)
    best_rate[best_rate <= 0] = 1e-12
    lo = float(np.max((age_s + remaining / best_rate) / iso))
    thr = coo_matrix((-Tg[jj, mm], (jj, np.arange(nv))), shape=(G, nv))
    A = vstack([thr, cap]).tocsr()
    eq_g = Tg @ equal_share(gpus, counts)
    eq_g[eq_g <= 0] = 1e-12
    c = -_EFFICIENCY * Tg[jj, mm] / eq_g[jj] * members[jj]
    bounds = (0.0, 1.0)
    g_best = Tg.max(axis=1)

    def solve(rho: float) -> np.ndarray | None:
        slack = rho * iso - age_s
        if np.any(slack <= 0):
            return None
        need = remaining / slack / np.where(scale > 0, scale, 1.0)
        g_need = np.zeros(G)
        np.maximum.at(g_need, labels, need)
        if np.any(g_need > g_best * (1 + 1e-9)):
            return None
        res = linprog(c, A_ub=A, b_ub=np.concatenate([-g_need, b]), bounds=bounds, method="highs")
        return res.x if res.status == 0 and res.x is not None else None

    hi = max(lo, 1e-9) * 1.25
    sol = solve(hi)
    tries = 0
    while sol is None and tries < 40:
        lo, hi = hi, hi * 2.0
        sol = solve(hi)
        tries += 1
    if sol is None:
        return X, math.inf
    for _ in range(iterations):
        if hi - lo <= 0.02 * hi:
            break
        mid = 0.5 * (lo + hi)
        x = solve(mid)
        if x is None:
            lo = mid
        else:
            hi, sol = mid, x
    Xg = np.zeros((G, M))
    Xg[jj, mm] = np.clip(sol, 0.0, 1.0)
    return Xg[labels], hi


def round_assignment(
    X: np.ndarray,
    received: np.ndarray,
    gpus: Sequence[int],
    counts: Sequence[int],
    current: Sequence[int],
    tiebreak: Sequence[float],
) -> list[tuple[int, int, float]]:
    """Gavel's round mechanism: (job, model, priority) in the order pairs were granted.

    ``received``: share of each job's time spent on each model so far; ``current``: the model
    index a job runs on now (-1: waiting); ``tiebreak``: lower first among equal pairs."""
    n, M = X.shape
    with np.errstate(divide="ignore", invalid="ignore"):
        prio = np.where(received > 0, X / np.maximum(received, 1e-12), np.inf)
    pairs = [
        (-prio[j, m], -X[j, m], 0 if current[j] == m else 1, tiebreak[j], j, m)
        for j in range(n)
        for m in range(M)
        if X[j, m] > 1e-6
    ]
    pairs.sort()
    cap = list(counts)
    done: set[int] = set()
    out = []
    for p in pairs:
        j, m = p[4], p[5]
        if j in done or cap[m] < gpus[j]:
            continue
        cap[m] -= gpus[j]
        done.add(j)
        out.append((j, m, float(prio[j, m])))
    return out


class _GavelPolicy(PeerPolicy):
    """Shared by ``gavel_maxmin`` and ``gavel_ftf``: estimates, the LP, the round."""

    objective: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {**peer_defaults, "ftf_iterations": 12}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        it = self.params["ftf_iterations"]
        if not isinstance(it, int) or isinstance(it, bool) or not 1 <= it <= 100:
            raise PolicyError(f"{self.name}: ftf_iterations must be an integer 1..100")
        self.last_rho: float | None = None
        # Gavel recomputes the allocation when the set of active jobs changes (an arrival or a
        # completion), not every round: the last one, keyed by the jobs and the cluster.
        self._cache: tuple[tuple[Any, ...], np.ndarray] | None = None

    def throughputs(self, state: ClusterState, cl: Cluster, jobs: Sequence[JobSpec]) -> np.ndarray:
        T = np.zeros((len(jobs), len(cl.order)))
        col = {m: i for i, m in enumerate(cl.order)}
        for i, job in enumerate(jobs):
            usable = self.usable_models(job, cl)
            times = {m: self.solo_time(state, job, m) for m in usable}
            known = [t for t in times.values() if t is not None and t > 0]
            for m in usable:
                t = times[m]
                if t is None or t <= 0:
                    t = DEFAULT_WORK_S if not known else max(known)
                T[i, col[m]] = 1.0 / t
        return T

    def wants(
        self, state: ClusterState, cl: Cluster, decision_point: bool
    ) -> tuple[list[Want], dict[str, str]]:
        running = {r.job.id: r for r in state.running}
        jobs: list[JobSpec] = [r.job for r in state.running if r.job.gpus > 0]
        jobs += [j for j in state.pending if j.gpus > 0]
        if not decision_point:
            # Between rounds: waiting jobs fill idle GPUs, oldest first.
            between = [
                Want(j, None, "waits for the next round (between rounds only idle GPUs fill)")
                for j in sorted(state.pending, key=lambda j: (j.arrival_s, j.id))
            ]
            return between, {}
        jobs.sort(key=lambda j: j.id)  # a stable row order: the allocation cache's key
        T = self.throughputs(state, cl, jobs)
        keep = T.max(axis=1) > 0 if len(jobs) else np.zeros(0, dtype=bool)
        jobs = [j for j, k in zip(jobs, keep, strict=True) if k]
        T = T[keep] if len(keep) else T
        gpus = np.array([max(1, j.gpus) for j in jobs], dtype=float)
        counts = np.array([cl.counts[m] for m in cl.order], dtype=float)
        age = np.array([max(0.0, state.now_s - j.arrival_s) for j in jobs])
        rem = np.array([self.remaining_fraction(j, running.get(j.id)) for j in jobs])
        key = (tuple(j.id for j in jobs), tuple(cl.order), tuple(counts))
        if self._cache is not None and self._cache[0] == key:
            X = self._cache[1]
        elif self.objective == "ftf":
            X, rho = allocation_ftf(
                T, gpus, counts, age, rem, iterations=int(self.params["ftf_iterations"])
            )
            self.last_rho = rho
        else:
            X = allocation_maxmin(T, gpus, counts)
        self._cache = (key, X)
        received = np.zeros_like(X)
        col = {m: i for i, m in enumerate(cl.order)}
        for i, j in enumerate(jobs):
            per = self.model_s.get(j.id)
            if per and age[i] > 0:
                for model, secs in per.items():
                    if model in col:
                        received[i, col[model]] = min(1.0, secs / max(age[i], self.round_s, 1.0))
        current = [col.get(cl.model_of.get(j.id, ""), -1) for j in jobs]
        ties = [j.arrival_s for j in jobs]
        grant = round_assignment(
            X, received, [int(g) for g in gpus], [int(c) for c in counts], current, ties
        )
        wants: list[Want] = []
        granted: set[int] = set()
        for i, m, prio in grant:
            granted.add(i)
            j = jobs[i]
            p = "never ran there" if math.isinf(prio) else f"{prio:.2f}"
            why = (
                f"round grant on {cl.order[m]}: X = {X[i, m]:.2f} of its time there, "
                f"priority X / received {p}"
            )
            wants.append(Want(j, (cl.order[m],), why, running.get(j.id)))
        rest = sorted(
            (i for i in range(len(jobs)) if i not in granted),
            key=lambda i: (-float(X[i].sum()), jobs[i].arrival_s, jobs[i].id),
        )
        for i in rest:
            j = jobs[i]
            share = ", ".join(
                f"{cl.order[m]} {X[i, m]:.2f}" for m in range(X.shape[1]) if X[i, m] > 1e-3
            )
            why = (
                f"no round grant this round (allocation {share or 'none'}; pairs of higher "
                f"priority took the GPUs)"
            )
            wants.append(Want(j, None, why, running.get(j.id)))
        return wants, {}


class GavelMaxMinPolicy(_GavelPolicy):
    name: ClassVar[str] = "gavel_maxmin"
    objective: ClassVar[str] = "maxmin"


class GavelFtfPolicy(_GavelPolicy):
    name: ClassVar[str] = "gavel_ftf"
    objective: ClassVar[str] = "ftf"


__all__ = [
    "GavelFtfPolicy",
    "GavelMaxMinPolicy",
    "allocation_ftf",
    "allocation_maxmin",
    "round_assignment",
]

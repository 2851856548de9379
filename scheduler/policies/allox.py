"""``allox``: min-cost bipartite matching of jobs to (GPU model, position) slots (Le et al.,
EuroSys 2020), re-solved at every call, non-preemptive.

AlloX schedules jobs over interchangeable resources of different speeds to minimise the total
completion time. With ``p[j, m]`` the estimated run time of job ``j`` on model ``m``
(``PeerPolicy.solo_time``), a machine that runs jobs one after another gives the job in the
``k``-th position *from the end* a contribution ``k x p[j, m]`` to the sum of completion times
(it delays itself and the ``k - 1`` jobs after it). So the total completion time is minimised
by a min-cost matching of jobs to slots ``(m, k)`` (``g_m`` copies of each: the GPUs of ``m``)
with cost ``k x p[j, m]`` (``scipy.optimize.linear_sum_assignment``). A job of ``g`` GPUs is
charged ``g x k x p``: it holds ``g`` machines (our approximation; AlloX's jobs take one
resource each).

The matching fixes each job's model; on a model the jobs run in decreasing position (the ones
matched last-to-first in the queue start first), ties by shorter ``p``. Only the first ones
start, as many as the model has idle GPUs; the others wait for that model (no filling of other
models: the matching chose). Running jobs are never preempted (AlloX is non-preemptive); their
remaining time on a busy GPU is not charged to the slots (simplification).

**Fairness knob** ``alpha`` (0..1, default 0.8): at each call only the ``ceil(alpha x U)``
users (``JobSpec.owner``; a job without one is its own user) with the least attained service
(GPU-seconds, then the longest-waiting job) enter the matching; 1 is AlloX without fairness
(pure total completion time), small values approach serving the most deprived user first.
``max_jobs`` (400) bounds the matching to the longest-waiting jobs of those users (the
others wait for a later call), so one call stays well under a second at scale.
``positions`` are ``ceil(jobs / GPUs) + 1`` per GPU (enough slots for every job).
``round_s`` (0 here): every call matches (AlloX re-solves on arrivals and completions and
never preempts, so it needs no rounds).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from scipy.optimize import linear_sum_assignment  # type: ignore[import-untyped]

from scheduler.domain import ClusterState, JobSpec
from scheduler.policies.base import PolicyError
from scheduler.policies.peer_base import DEFAULT_WORK_S, Cluster, PeerPolicy, Want, peer_defaults

_INFEASIBLE = 1e18


def match_jobs(p: np.ndarray, gpus: np.ndarray, counts: np.ndarray) -> list[tuple[int, int, int]]:
    """(job, model, position from the end) per job that got a slot, minimising the total
    completion time. ``p``: run time per job and model (inf: the job may not use it)."""
    n, M = p.shape
    if n == 0 or M == 0:
        return []
    K = math.ceil(n / max(1.0, float(counts.sum()))) + 1
    cols: list[tuple[int, int]] = []
    for m in range(M):
        copies = int(min(counts[m], n))
        for k in range(1, K + 1):
            cols.extend([(m, k)] * copies)
    if not cols:
        return []
    mcol = np.array([c[0] for c in cols])
    kcol = np.array([c[1] for c in cols], dtype=float)
    cost = p[:, mcol] * kcol[None, :] * gpus[:, None]
    cost[~np.isfinite(cost)] = _INFEASIBLE
    rows, chosen = linear_sum_assignment(cost)
    out = []
    for r, c in zip(rows, chosen, strict=True):
        if cost[r, c] < _INFEASIBLE:
            out.append((int(r), int(mcol[c]), int(kcol[c])))
    return out


class AlloxPolicy(PeerPolicy):
    name: ClassVar[str] = "allox"
    defaults: ClassVar[dict[str, Any]] = {
        **peer_defaults,
        "round_s": 0.0,
        "alpha": 0.8,
        "max_jobs": 400,
    }

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        a = self.params["alpha"]
        if not isinstance(a, int | float) or isinstance(a, bool) or not 0 < a <= 1:
            raise PolicyError(f"allox: alpha must be in (0, 1], got {a!r}")
        mj = self.params["max_jobs"]
        if not isinstance(mj, int) or isinstance(mj, bool) or mj < 1:
            raise PolicyError(f"allox: max_jobs must be an integer >= 1, got {mj!r}")

    def times(self, state: ClusterState, cl: Cluster, job: JobSpec) -> np.ndarray:
        usable = {m for m in self.usable_models(job, cl) if cl.counts[m] >= max(1, job.gpus)}
        known = {m: self.solo_time(state, job, m) for m in usable}
        fallback = max((t for t in known.values() if t), default=DEFAULT_WORK_S)
        return np.array(
            [
                (known[m] or fallback) * self.remaining_fraction(job, None)
                if m in usable
                else math.inf
                for m in cl.order
            ]
        )

    def wants(
        self, state: ClusterState, cl: Cluster, decision_point: bool
    ) -> tuple[list[Want], dict[str, str]]:
        wants = [
            Want(r.job, None, "running (never preempted)", r, keep=True) for r in state.running
        ]
        gpu_jobs = [j for j in state.pending if j.gpus > 0]
        if not gpu_jobs:
            return wants, {}
        if not any(cl.idle.values()):
            # Every GPU is busy and nobody is preempted: nothing to match this call.
            why = "every GPU is busy (AlloX never preempts): matched when one frees"
            wants.extend(Want(j, None, why, fill=False) for j in gpu_jobs)
            return wants, {}
        # Fairness knob: the alpha share of users with the least attained service.
        users: dict[str, list[JobSpec]] = {}
        for j in gpu_jobs:
            users.setdefault(j.owner or f"#{j.id}", []).append(j)
        served: dict[str, float] = {}
        for r in state.running:
            u = r.job.owner or f"#{r.job.id}"
            served[u] = served.get(u, 0.0) + self.attained.get(r.job.id, 0.0)
        for u, js in users.items():
            served[u] = served.get(u, 0.0) + sum(self.attained.get(j.id, 0.0) for j in js)
        ranked = sorted(users, key=lambda u: (served[u], min(j.arrival_s for j in users[u]), u))
        take = max(1, math.ceil(float(self.params["alpha"]) * len(ranked)))
        chosen_users = set(ranked[:take])
        pool = sorted(
            (j for j in gpu_jobs if (j.owner or f"#{j.id}") in chosen_users),
            key=lambda j: (j.arrival_s, j.id),
        )[: int(self.params["max_jobs"])]
        inside = {j.id for j in pool}
        p = np.array([self.times(state, cl, j) for j in pool]).reshape(len(pool), len(cl.order))
        gpus = np.array([max(1, j.gpus) for j in pool], dtype=float)
        counts = np.array([cl.counts[m] for m in cl.order], dtype=float)
        matched = match_jobs(p, gpus, counts)
        per_model: dict[int, list[tuple[int, float, int]]] = {}
        for i, m, k in matched:
            per_model.setdefault(m, []).append((k, float(p[i, m]), i))
        got: set[str] = set()
        for m in sorted(per_model):
            seq = sorted(per_model[m], key=lambda x: (-x[0], x[1], pool[x[2]].id))
            for rank, (k, t, i) in enumerate(seq):
                job = pool[i]
                got.add(job.id)
                why = (
                    f"matched to {cl.order[m]}, position {k} from the end "
                    f"(est. {t / 3600:.2f} h there; {rank} matched jobs start before it there)"
                )
                wants.append(Want(job, (cl.order[m],), why, fill=False))
        for j in gpu_jobs:
            if j.id in got:
                continue
            if j.id in inside:
                why = "no slot in the matching (no GPU model it may use holds it)"
                wants.append(Want(j, None, why))
                continue
            if (j.owner or f"#{j.id}") not in chosen_users:
                why = (
                    f"fairness knob alpha = {self.params['alpha']}: its user is not among the "
                    f"{take} of {len(ranked)} users with the least attained service"
                )
            else:
                why = f"beyond the {self.params['max_jobs']} longest-waiting jobs matched per call"
            wants.append(Want(j, None, why, fill=False))
        return wants, {}

"""``themis``: finish-time-fair leases and auctions (Mahajan et al., NSDI 2020), simplified.

Themis gives GPUs out in *leases*; when leases end, the freed GPUs are offered to the fraction
``1 - f`` of jobs that are furthest from finish-time fairness, who bid for them; what the
auction leaves goes to the other jobs. A job's finish-time-fairness ratio is
``rho = T_shared / T_ideal``: ``T_shared = age + estimated remaining time`` at its current
allocation (a waiting job: on its fastest usable model after one more lease of waiting, a
running one: on its current model), ``T_ideal`` its whole run time on an isolated ``1/n`` share
of every model (``n`` = GPU jobs present; never less than alone on its fastest model).

Here, at each decision point (``round_s`` = the lease, 360 s by default):

1. Running jobs whose lease has not ended (run for less than ``round_s`` since they started)
   keep their GPUs.
2. **Offer**: the idle GPUs and those of the jobs whose lease ended, per model.
3. **Participants**: the jobs waiting or whose lease ended, worst ``rho`` first; the first
   ``ceil((1 - f) x count)`` of them (at least one) take part (``f`` = 0.8 by default).
4. **Auction** (simplified): in decreasing ``rho`` (the worst first) each participant takes the
   offered bundle (its GPU count of one model) it values most: its valuation of model ``m`` is
   the fall of its ``rho`` from waiting another lease to running on ``m``
   (``(round_s + remaining_best - remaining_m) / T_ideal``; a job already on ``m`` pays no
   restart). Themis runs a partial-allocation auction over bundles of all offered GPUs with
   hidden payments (the leftover of a partial allocation); with one bundle per bidder and
   truthful valuations from estimates, a serial choice by the worst ``rho`` keeps its two
   properties that matter here: the worst-off job is served first, and each job gets the model
   it benefits from most.
5. **Leftover**: what the auction left goes to the other jobs in decreasing ``rho`` (running
   ones prefer their current model), so no GPU idles while a job waits.

Jobs whose lease ended and that got nothing are preempted when their GPUs are needed
(``PeerPolicy.realise``). Between decision points waiting jobs fill idle GPUs, worst ``rho``
first.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from scheduler.domain import ClusterState, JobSpec, RunningJob
from scheduler.policies.base import PolicyError
from scheduler.policies.peer_base import DEFAULT_WORK_S, Cluster, PeerPolicy, Want, peer_defaults


def ideal_time_s(times: dict[str, float], counts: dict[str, int], gpus: int, n: int) -> float:
    """Run time of a job with solo ``times`` per model on a ``1/n`` share of every model of a
    cluster with ``counts`` GPUs per model, never less than alone on its fastest model."""
    rate = sum(counts.get(m, 0) / t for m, t in times.items() if t > 0)
    if rate <= 0:
        return math.inf
    return max(min(times.values()), max(1, n) * max(1, gpus) / rate)


class ThemisPolicy(PeerPolicy):
    name: ClassVar[str] = "themis"
    defaults: ClassVar[dict[str, Any]] = {**peer_defaults, "f": 0.8}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        f = self.params["f"]
        if not isinstance(f, int | float) or isinstance(f, bool) or not 0 <= f < 1:
            raise PolicyError(f"themis: f must be in [0, 1), got {f!r}")
        self.f = float(f)

    def wants(
        self, state: ClusterState, cl: Cluster, decision_point: bool
    ) -> tuple[list[Want], dict[str, str]]:
        now = state.now_s
        present: list[tuple[JobSpec, RunningJob | None]] = [
            (r.job, r) for r in state.running if r.job.gpus > 0
        ]
        present += [(j, None) for j in state.pending if j.gpus > 0]
        n = len(present)
        info: dict[str, tuple[float, float, dict[str, float]]] = {}  # id -> (rho, ideal, rem)
        for job, r in present:
            usable = self.usable_models(job, cl)
            solo = {m: self.solo_time(state, job, m) for m in usable}
            known = [t for t in solo.values() if t]
            times = {m: (t or (max(known) if known else DEFAULT_WORK_S)) for m, t in solo.items()}
            left = self.remaining_fraction(job, r)
            rem = {m: left * t for m, t in times.items()}
            ideal = ideal_time_s(times, cl.counts, job.gpus, n) if times else math.inf
            age = max(0.0, now - job.arrival_s)
            cur = cl.model_of.get(job.id) if r is not None else None
            if cur is not None and cur in rem:
                shared = age + rem[cur]
            else:
                shared = age + self.round_s + (min(rem.values()) if rem else math.inf)
            rho = shared / ideal if ideal > 0 and math.isfinite(ideal) else math.inf
            info[job.id] = (rho, ideal, rem)

        def worst_first(item: tuple[JobSpec, RunningJob | None]) -> tuple[float, float, str]:
            return (-info[item[0].id][0], item[0].arrival_s, item[0].id)

        def rho_text(job: JobSpec) -> str:
            rho = info[job.id][0]
            return "rho unknown" if not math.isfinite(rho) else f"rho {rho:.2f}"

        if not decision_point:
            waiting = sorted(((j, None) for j in state.pending), key=lambda x: worst_first(x))
            return [
                Want(j, None, f"{rho_text(j)}; waits for the next lease end") for j, _ in waiting
            ], {}
        wants: list[Want] = []
        contenders: list[tuple[JobSpec, RunningJob | None]] = []
        for job, r in present:
            if (
                r is not None
                and now - self.run_since.get(job.id, r.started_s) < self.round_s - 1e-9
            ):
                wants.append(Want(job, None, f"{rho_text(job)}; lease runs", r, keep=True))
            else:
                contenders.append((job, r))
        contenders.sort(key=worst_first)
        offered = dict(cl.idle)
        for job, r in contenders:
            if r is not None:
                m = cl.model_of.get(job.id)
                if m is not None and job.id in cl.exclusive:
                    offered[m] = offered.get(m, 0) + max(1, job.gpus)
        k = max(1, math.ceil((1.0 - self.f) * len(contenders))) if contenders else 0
        bidders, others = contenders[:k], contenders[k:]
        for job, r in bidders:
            rho, ideal, rem = info[job.id]
            cur = cl.model_of.get(job.id) if r is not None else None
            best = min(rem.values()) if rem else math.inf
            choices = []
            for m, t in rem.items():
                if offered.get(m, 0) < max(1, job.gpus):
                    continue
                value = (self.round_s + best - t + (self.round_s if m == cur else 0.0)) / ideal
                choices.append((-value, cl.order.index(m), m))
            if not choices:
                wants.append(Want(job, None, f"{rho_text(job)}; bid but no offered bundle fits", r))
                continue
            choices.sort()
            m = choices[0][2]
            offered[m] -= max(1, job.gpus)
            why = (
                f"{rho_text(job)}, among the {k} worst of {len(contenders)}: won {job.gpus} "
                f"{m} in the auction (valuation {-choices[0][0]:.3f})"
            )
            wants.append(Want(job, (m,), why, r))
        for job, r in others:
            _, _, rem = info[job.id]
            cur = cl.model_of.get(job.id) if r is not None else None
            prefs = sorted(rem, key=lambda m: (m != cur, rem[m], cl.order.index(m)))
            why = (
                f"{rho_text(job)}, not among the {k} worst of {len(contenders)} "
                f"(fairness knob f = {self.f}): leftover GPUs only"
            )
            wants.append(Want(job, tuple(prefs), why, r))
        return wants, {}

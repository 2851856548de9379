"""``hetero_srtf``: heterogeneity-aware, preemptive shortest-remaining-time-first with pairs.

Every cycle the policy re-plans the whole cluster from *estimates* (profile times, i.e. the
measured throughput per GPU model x the declared work, and the progress the jobs report), never
from the simulator's truth:

1. **Remaining time.** For every running and pending job and every GPU model it may use:
   ``remaining(g) = (1 - progress) x solo time on g`` (``remaining_times``); ``best`` is the
   smallest over the models of the cluster.
2. **Priority with aging** (``priority_key``): ``key = best / (1 + aging x age / solo_best)``
   with ``age`` = now - arrival and ``solo_best`` the job's whole solo time on its fastest model.
   Shortest remaining first; a job that has waited ``k`` times its own length is treated as if
   it had ``1 + aging x k`` times less left, so every job eventually reaches the front (no
   starvation; ``tests/scheduler/test_hetero_srtf.py`` checks the bound). With ``ftf_cap`` > 0
   a job whose predicted finish-time-fairness ratio (age + best remaining, over its time on an
   isolated ``1/n`` share of the cluster, ``n`` = jobs present) reaches the cap goes before
   every job under it (worst ratio first).
3. **Who runs.** Jobs are taken in key order until the cluster's GPUs are spoken for. A running
   job defends its GPUs with ``key x (1 - preempt_margin) - preemption_cost_s``: a waiting job
   preempts it only if it is shorter by the margin *and* the restart cost
   (``should_preempt``: swapping two jobs saves ``r_running - r_waiting - cost`` seconds of
   total JCT). A job preempted ``max_preemptions`` times is no longer preempted for other
   jobs, but still moves to a faster model when one frees up (it is never pinned on a slow
   GPU by the cap).
4. **Which GPU model** (``assign_models``): the chosen jobs go to the models where they lose
   least against their own fastest model (cost ``remaining(g) / best``: the job's slowdown on
   g; a running job pays ``preemption_cost_s`` to move), first greedily in key order, then by
   swapping pairs of jobs between models while that lowers the total. So a job that is 10x
   faster on a V100 gets the V100 before a job that is 1.2x faster on it, whichever is shorter.
5. **Where.** Running jobs that keep their model keep their GPUs. Jobs to start take idle or
   freed GPUs of their model: multi-GPU jobs first (one node, the fullest that fits; else a gang
   over the fewest nodes when no node of the model is large enough), then single-GPU jobs on the
   fullest nodes. GPUs still idle are filled with the next jobs in key order (work
   conserving). **Fast path**: when the idle GPUs hold every pending job, nobody is
   preempted; the pending jobs are placed (step 4 over the idle GPUs) and running jobs move to
   an idle GPU of a faster model when the saving pays the move cost plus ``preempt_margin`` of
   their remaining time (weighed only when idle GPUs appeared since the last such cycle: a
   saving only shrinks as a job progresses).
6. **Pairs** (``pack_threshold`` > 0): a job still waiting joins a GPU (set) that runs exactly
   one job of the same GPU count, owner and model under MPS, if the estimated pair throughput
   ``norm_a + norm_b`` (each job's co-run speed over its solo speed, from the measured pair
   table: ``MeasuredInterference.measured_pair``; unmeasured pairs are never packed) is at least
   the threshold; the best such pair first. With a ``ClusterState.knowledge`` the norms are
   its ``co_run_speed`` estimates (a noisy pair prior, refined by measured co-runs; no
   estimate, no packing: multi-GPU pairs have none until measured). A packed job (the one
   that joined) moves to a GPU of its own when one is free, if its preemption bound allows.

Parameters (``portal/core/policy_settings.py`` documents them for the admin):


- ``aging`` (0.5): weight of a job's age, in multiples of its own length, in its key.
- ``preemption_cost_s`` (60): estimated checkpoint-and-restart time; a preemption or move
  must save more than this (the simulator passes its ``--preemption-cost-s``).
- ``preempt_margin`` (0.1): a waiting job must be this fraction shorter than a running one.
- ``max_preemptions`` (5): preemptions (moves included) of one job before it keeps its GPUs.
- ``pack_threshold`` (1.2): pack two jobs on a GPU when their estimated pair throughput
  reaches this many jobs' worth (0: never pack).
- ``ftf_cap`` (0): finish-time-fairness cap; jobs predicted at or above it go first (0: off).
- ``tick_s`` (0): also re-plan every so many seconds (0: on arrivals and completions only).
- ``churn_budget`` (0.02): at most this share of the running jobs (at least one) is requeued
  (preempted or moved) per cycle; the longest go first, the others keep their GPUs until a
  later cycle still finds the change worth its margin and restart cost (1: no limit).
- ``replan_limit`` (512): with more running jobs than this, a running job that no waiting job
  could preempt (its defended key at most the smallest waiting key; estimated from its fastest
  model) keeps its GPUs and model without entering the assignment, so a cycle's work grows
  with the jobs that may change, not with the cluster. Below it every running job is
  re-planned (moves between models included).

Jobs it cannot estimate (CPU jobs, jobs without a profiled time on a GPU model of the
cluster that holds their memory, jobs larger than every model) are handed, on what is left
of the cluster after its own plan, to ``fifo`` of the framework with the framework's
parameters (``backfill``, ``max_jobs_per_gpu``, ``share_mode``, ...: their meaning there),
which places them or says why they wait. ``max_jobs_per_gpu`` below 2 or a ``share_mode``
other than ``auto``/``mps`` also turns packing off.

Preemption is a ``REQUEUE`` action (the job keeps its progress: checkpointed) followed, for a
migration, by a new placement in the same plan. Each job's preemptions are counted here (this
object's state, the only state it keeps); a caller that builds a new policy object per cycle
(the portal) passes the count in ``JobSpec.params["preemptions"]`` for the bound to hold.
Every decision, action and waiting job is explained.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from scheduler.domain import (
    SHARING_ALLOWED,
    Action,
    ActionKind,
    ClusterState,
    Decision,
    GpuSpec,
    JobSpec,
    NodeState,
    Placement,
    PlacementPart,
    Plan,
    RunningJob,
    SharingMode,
)
from scheduler.policies.base import Policy, PolicyError
from scheduler.policies.framework import framework_defaults

_INF = math.inf
#: ``JobSpec.params`` key a caller may set to the job's past preemptions (the live side rebuilds
#: the policy every cycle, so its own count starts at 0 each time).
PREEMPTIONS_PARAM = "preemptions"


# ----------------------------------------------------------------------------------------
# The pure core (unit-tested one by one)


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
    rate = sum(counts.get(m, 0) / t for m, t in times.items() if t > 0)
    if rate <= 0 or not times:
        return _INF
    best = min(times.values())
    return max(best, max(1, n) * max(1, gpus) / rate)


@dataclass(slots=True)
class Cand:
    """A job in one cycle: running (``running`` set) or pending."""

    job: JobSpec
    rem: dict[str, float]  # model -> estimated remaining seconds
    best: float
    key: float
    running: RunningJob | None = None
    model: str | None = None  # current model if running
    pinned: bool = False  # running and may not be preempted or moved
    guest: bool = False  # running, joined a GPU with another job (packed)
    move_cost: float = 0.0  # seconds a running job loses if it moves
    placed_model: str | None = None  # where it runs after this cycle
    freed: Placement | None = None  # its old placement, once requeued this cycle
    stay_bonus: float = 0.0  # seconds a move must save beyond move_cost (margin x remaining)
    gpus: int = 0  # GPUs it asks (set from the job)
    costs: dict[str, float] = field(default_factory=dict)  # model -> cost (assign_models)

    def __post_init__(self) -> None:
        self.gpus = max(1, self.job.gpus)

    def cost(self, model: str) -> float:
        """Relative cost of running on ``model``: its slowdown there (move cost included)."""
        r = self.rem.get(model)
        if r is None:
            return _INF
        if self.running is not None and model != self.model:
            if self.pinned:
                return _INF
            r += self.move_cost + self.stay_bonus
        return r / self.best if self.best > 0 else 1.0


def assign_models(cands: Sequence[Cand], capacity: Mapping[str, int]) -> dict[str, str]:
    """Job id -> GPU model for ``cands`` (in priority order) within ``capacity`` GPUs per model.

    Greedy in order (each job takes its cheapest model with room; a job that fits nowhere is
    left out), then pairwise swaps of same-size jobs between two models, and moves into spare
    capacity, while they lower the total relative cost (``Cand.cost``).
    """
    left = dict(capacity)
    out: dict[str, str] = {}
    models = sorted(capacity)
    # Each candidate's cost on every model is computed once (``Cand.costs``): swaps read it.
    by_id: dict[str, Cand] = {}
    for c in cands:
        best_m, best_cost = None, _INF
        for m in c.rem:
            if left.get(m, 0) >= c.gpus:
                cost = c.cost(m)
                if cost < best_cost:
                    best_m, best_cost = m, cost
        if best_m is not None:
            out[c.job.id] = best_m
            by_id[c.job.id] = c
            c.costs = {m: c.cost(m) for m in models}
            left[best_m] -= c.gpus
    sizes = sorted({c.gpus for c in by_id.values()})
    for _ in range(3):
        groups: dict[tuple[str, int], list[Cand]] = {}
        for jid, c in by_id.items():
            groups.setdefault((out[jid], c.gpus), []).append(c)
        improved = False
        for g in models:
            for h in models:
                if g >= h:
                    continue
                for k in sizes:
                    improved |= _swap(groups, out, left, g, h, k)
        if not improved:
            break
    return out


def _gains(on: Sequence[Cand], here: str, there: str) -> list[float]:
    """What moving each job of ``on`` from ``here`` to ``there`` costs (negative: a gain)."""
    return [c.costs[there] - c.costs[here] for c in on]


def _smallest(d: list[float], below: float) -> list[tuple[float, int]]:
    """(value, index) of the entries of ``d`` under ``below``, ascending (ties by index): the
    prefix of the sorted list that ``_swap`` can use."""
    return sorted((x, i) for i, x in enumerate(d) if x < below)


def _usable(other_min: float) -> float:
    """A bound above every gain a move (< -1e-9) or a pair with the other side's smallest
    gain ``other_min`` can use, with slack for rounding (a longer prefix changes nothing)."""
    lim = max(-1e-9, -1e-9 - other_min)
    return lim + 1e-6 * (1.0 + abs(lim))


def _swap(
    groups: dict[tuple[str, int], list[Cand]],
    out: dict[str, str],
    left: dict[str, int],
    g: str,
    h: str,
    k: int,
) -> bool:
    """Improve the assignment of ``k``-GPU jobs between models ``g`` and ``h`` (moves into
    spare room, then swaps of the pairs that gain most; see ``assign_models``)."""
    on_g = groups.get((g, k), [])
    on_h = groups.get((h, k), [])
    if not on_g and not on_h:
        return False
    # d: what moving to the other model costs (negative: a gain). Only entries that a move
    # (negative) or a pair (negative sum with the other side's smallest) can use are sorted.
    eg, eh = _gains(on_g, g, h), _gains(on_h, h, g)
    dg = _smallest(eg, _usable(min(eh, default=_INF)))
    dh = _smallest(eh, _usable(min(eg, default=_INF)))
    to_h: list[int] = []
    to_g: list[int] = []
    i = j = 0
    while True:
        if i < len(dg) and dg[i][0] < -1e-9 and left.get(h, 0) >= k:
            to_h.append(dg[i][1])
            left[h] -= k
            left[g] += k
            i += 1
            continue
        if j < len(dh) and dh[j][0] < -1e-9 and left.get(g, 0) >= k:
            to_g.append(dh[j][1])
            left[g] -= k
            left[h] += k
            j += 1
            continue
        if i < len(dg) and j < len(dh) and dg[i][0] + dh[j][0] < -1e-9:
            to_h.append(dg[i][1])
            to_g.append(dh[j][1])
            i += 1
            j += 1
            continue
        break
    if not to_h and not to_g:
        return False
    moved_h = [on_g[x] for x in to_h]
    moved_g = [on_h[x] for x in to_g]
    for c in moved_h:
        out[c.job.id] = h
    for c in moved_g:
        out[c.job.id] = g
    sh, sg = set(to_h), set(to_g)
    groups[(g, k)] = [c for x, c in enumerate(on_g) if x not in sh] + moved_g
    groups[(h, k)] = [c for x, c in enumerate(on_h) if x not in sg] + moved_h
    return True


# ----------------------------------------------------------------------------------------
# The policy


class _NodeFacts:
    """What the policy reads of one up GPU node (cached per ``NodeState`` object)."""

    __slots__ = ("state", "model", "spec", "size", "idle", "shared")

    def __init__(self, n: NodeState) -> None:
        self.state = n
        self.spec = n.gpus[0].spec
        self.model = self.spec.model
        self.size = len(n.gpus)
        self.idle = tuple(g.index for g in n.gpus if not g.job_ids)
        self.shared = any(len(g.job_ids) > 1 for g in n.gpus)


class _Gpus:
    """Free GPUs of one model: by node, and nodes bucketed by their free count (node order
    kept within a bucket), so a best fit costs O(GPUs per node), not O(nodes)."""

    def __init__(self) -> None:
        self.free: dict[str, list[int]] = {}
        self.buckets: dict[int, dict[str, None]] = {}
        self.n = 0

    def total(self) -> int:
        return self.n

    def _move(self, node: str, old: int, new: int) -> None:
        if old:
            b = self.buckets[old]
            del b[node]
            if not b:
                del self.buckets[old]
        if new:
            self.buckets.setdefault(new, {})[node] = None

    def fill(self, node: str, indices: list[int]) -> None:
        """Set ``node``'s free GPUs (a node not seen yet)."""
        if indices:
            self.free[node] = indices
            self.n += len(indices)
            self.buckets.setdefault(len(indices), {})[node] = None

    def add(self, node: str, index: int) -> None:
        lst = self.free.setdefault(node, [])
        if index in lst:
            return
        lst.append(index)
        lst.sort()
        self.n += 1
        self._move(node, len(lst) - 1, len(lst))

    def take(self, node: str, k: int) -> tuple[int, ...]:
        lst = self.free[node]
        idx = tuple(lst[:k])
        del lst[:k]
        self.n -= len(idx)
        self._move(node, len(lst) + len(idx), len(lst))
        if not lst:
            del self.free[node]
        return idx

    def best_fit(self, k: int, ok: Callable[[str], bool]) -> str | None:
        """The node with the fewest free GPUs, at least ``k``, that ``ok`` accepts."""
        for count in sorted(c for c in self.buckets if c >= k):
            for node in self.buckets[count]:
                if ok(node):
                    return node
        return None

    def most_free(self, ok: Callable[[str], bool]) -> list[tuple[int, str]]:
        """(free count, node) of the nodes ``ok`` accepts, most free first."""
        out: list[tuple[int, str]] = []
        for count in sorted(self.buckets, reverse=True):
            out.extend((count, node) for node in self.buckets[count] if ok(node))
        return out


def _residual(
    state: ClusterState, requeued: set[str], decisions: Sequence[Decision]
) -> tuple[NodeState, ...]:
    """The snapshot's nodes after ``requeued`` jobs left and ``decisions`` were applied."""
    placed: dict[tuple[str, int], list[tuple[JobSpec | None, Placement]]] = {}
    cores_used: dict[str, int] = {}
    freed: dict[str, float] = {}
    running = {r.job.id: r for r in state.running}
    for jid in requeued:
        rj = running.get(jid)
        if rj is None:
            continue
        freed[jid] = rj.job.memory_need_mb()
        for part in rj.placement.parts:
            cores_used[part.node] = cores_used.get(part.node, 0) - part.cpus
    pending = {j.id: j for j in state.pending}
    pending.update({jid: running[jid].job for jid in requeued if jid in running})
    for d in decisions:
        pl = d.placement
        for part in pl.parts:
            cores_used[part.node] = cores_used.get(part.node, 0) + part.cpus
        for key in pl.gpu_keys:
            placed.setdefault(key, []).append((pending.get(pl.job_id), pl))
    touched = set(cores_used) | {node for node, _ in placed}
    gone_keys: set[tuple[str, int]] = set()
    for jid in requeued:
        rj = running.get(jid)
        if rj is not None:
            gone_keys.update(rj.placement.gpu_keys)
            touched.update(rj.placement.nodes)
    out = []
    for n in state.nodes:
        if n.name not in touched:
            out.append(n)
            continue
        gpus = []
        for g in n.gpus:
            key = (n.name, g.index)
            new = placed.get(key)
            if new is None and key not in gone_keys:
                gpus.append(g)
                continue
            new = new or []
            ids = tuple(j for j in g.job_ids if j not in requeued)
            mem = g.committed_memory_mb - sum(freed.get(j, 0.0) for j in g.job_ids)
            ids += tuple(pl.job_id for _, pl in new)
            mem += sum(j.memory_need_mb() for j, _ in new if j is not None)
            mode = (new[0][1].mode if new else g.mode) if ids else None
            gpus.append(replace(g, job_ids=ids, committed_memory_mb=mem, mode=mode))
        out.append(
            replace(n, free_cores=n.free_cores - cores_used.get(n.name, 0), gpus=tuple(gpus))
        )
    return tuple(out)


def _may_pack(job: JobSpec) -> bool:
    """Whether ``job`` may share a GPU under MPS (the only mode this policy packs in): it
    allows sharing (``JobSpec.may_share``) and asks for no other mode (docs/jobs.md)."""
    return job.may_share() and job.sharing in (SHARING_ALLOWED, SharingMode.MPS.value)


def _fmt_h(seconds: float) -> str:
    if math.isnan(seconds):
        return "an unknown time"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class HeteroSrtfPolicy(Policy):
    """See the module docstring (parameters included)."""

    name = "hetero_srtf"
    defaults: ClassVar[Mapping[str, Any]] = {
        **framework_defaults,
        "backfill": True,
        "aging": 0.5,
        "preemption_cost_s": 60.0,
        "preempt_margin": 0.1,
        "max_preemptions": 5,
        "pack_threshold": 1.2,
        "ftf_cap": 0.0,
        "tick_s": 0.0,
        "replan_limit": 512,
        "churn_budget": 0.02,
    }

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        try:
            self.aging = float(p["aging"])
            self.cost_s = float(p["preemption_cost_s"])
            self.margin = float(p["preempt_margin"])
            self.max_preemptions = int(p["max_preemptions"])
            self.pack_threshold = float(p["pack_threshold"])
            self.ftf_cap = float(p["ftf_cap"])
            tick = float(p["tick_s"])
            self.replan_limit = int(p["replan_limit"])
            self.churn_budget = float(p["churn_budget"])
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"policy 'hetero_srtf': bad parameter ({exc})") from None
        checks = (
            ("aging", 0 <= self.aging <= 100),
            ("preemption_cost_s", 0 <= self.cost_s <= 1e7),
            ("preempt_margin", 0 <= self.margin < 1),
            ("max_preemptions", 0 <= self.max_preemptions <= 10_000),
            ("pack_threshold", 0 <= self.pack_threshold <= 2),
            ("ftf_cap", 0 <= self.ftf_cap <= 1e6),
            ("tick_s", 0 <= tick <= 1e7),
            ("replan_limit", 0 <= self.replan_limit <= 10_000_000),
            ("churn_budget", 0 <= self.churn_budget <= 1),
        )
        for name, ok in checks:
            if not ok:
                raise PolicyError(f"policy 'hetero_srtf': {name}={p[name]!r} is out of range")
        self.pack = (
            self.pack_threshold > 0
            and int(p["max_jobs_per_gpu"]) >= 2
            and p["share_mode"] in ("auto", "mps")
        )
        from scheduler.policies.fifo import FifoPolicy

        self.fallback = FifoPolicy(**{k: p[k] for k in framework_defaults})
        self.tick_interval_s: float | None = tick or None
        self.preemptions: dict[str, int] = {}
        self._pairs: Any = None
        self._knowledge: Any = None
        self._max_node: dict[str, int] = {}
        self._specs: dict[str, GpuSpec] = {}
        self._node_cache: dict[str, _NodeFacts] = {}
        self._last_idle: dict[str, int] = {}  # idle GPUs per model after the last fast cycle
        self._faster: dict[str, tuple[str, ...]] = {}  # job id -> models faster than its own

    # -- helpers ---------------------------------------------------------------------------

    def _pair_norms(self, a: JobSpec, b: JobSpec, spec: GpuSpec) -> tuple[float, float] | None:
        """(norm of a, norm of b) next to each other on ``spec``: the knowledge's co-run
        speeds (pair prior, then measured co-runs); without one in the state, a knowledge
        with the Gavel table as its prior (``scheduler.knowledge.priors.table_pair_prior``)."""
        knowledge = self._knowledge
        if knowledge is None:
            if self._pairs is None:
                from scheduler.knowledge import Knowledge
                from scheduler.knowledge.priors import table_pair_prior

                self._pairs = Knowledge(pair_prior=table_pair_prior())
            knowledge = self._pairs
        ea = knowledge.co_run_speed(a, spec.model, (b,), SharingMode.MPS)
        eb = knowledge.co_run_speed(b, spec.model, (a,), SharingMode.MPS)
        if ea is None or eb is None or ea.value <= 0 or eb.value <= 0:
            return None
        return min(1.0, ea.value), min(1.0, eb.value)

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        now = state.now_s
        self._knowledge = state.knowledge
        # GPUs per model on up nodes, the specs, idle GPUs (per-node facts cached while the
        # snapshot hands the same NodeState object: unchanged nodes cost a lookup).
        counts: dict[str, int] = {}
        specs: dict[str, GpuSpec] = {}
        free_cores: dict[str, int] = {}
        node_model: dict[str, str] = {}
        max_node: dict[str, int] = {}
        entries: list[_NodeFacts] = []
        any_shared = False
        cache = self._node_cache
        for n in state.nodes:
            if not n.up or not n.gpus:
                continue
            e = cache.get(n.name)
            if e is None or e.state is not n:
                e = _NodeFacts(n)
                cache[n.name] = e
            entries.append(e)
            m = e.model
            counts[m] = counts.get(m, 0) + e.size
            specs[m] = e.spec
            node_model[n.name] = m
            free_cores[n.name] = n.free_cores
            if e.size > max_node.get(m, 0):
                max_node[m] = e.size
            any_shared = any_shared or e.shared
        self._max_node = max_node
        self._specs = specs
        models = sorted(counts)
        n_jobs = len(state.pending) + len(state.running)
        ftf = self.ftf_cap

        spreads: dict[int, dict[str, bool]] = {}  # GPU count -> spread per model

        def make(job: JobSpec, rj: RunningJob | None) -> Cand | None:
            progress = rj.progress if rj is not None else 0.0
            k = max(1, job.gpus)
            spread = spreads.get(k)
            if spread is None:
                spread = spreads[k] = {m: k > max_node.get(m, 0) for m in models}
            if rj is not None and rj.placement.is_gang:
                spread = dict(spread)
                spread[node_model.get(rj.placement.node, "")] = True
            rem = remaining_times(job, progress, models, spread=spread)
            need = job.memory_need_mb()
            here = node_model.get(rj.placement.node) if rj is not None else None
            rem = {
                m: r
                for m, r in rem.items()
                if m == here or (counts[m] >= k and specs[m].memory_mb >= need)
            }
            if not rem:
                return None
            best = min(rem.values())
            left = remaining_fraction(progress)
            solo_best = best / left if left > 0 else best
            age = now - job.arrival_s
            key = priority_key(best, solo_best, age, self.aging)
            if ftf > 0:
                full = {m: r / max(1e-9, left) for m, r in rem.items()}
                iso = isolated_time_s(full, counts, k, n_jobs)
                rho = (age + best) / iso if iso > 0 else 0.0
                if rho >= ftf:
                    key = -rho
            return Cand(job, rem, best, key)

        pending: list[Cand] = []
        waiting: dict[str, str] = {}
        others: list[JobSpec] = []  # for the fallback
        for job in state.pending:
            c = make(job, None) if job.gpus > 0 else None
            if c is None:
                others.append(job)
            else:
                pending.append(c)
        pending.sort(key=lambda c: (c.key, c.job.arrival_s, c.job.id))
        free: dict[str, _Gpus] = {m: _Gpus() for m in models}
        for e in entries:
            if e.idle:
                free[e.model].fill(e.state.name, list(e.idle))
        # Fast path: every pending job gets a model among the idle GPUs and nothing is packed,
        # so nobody needs to be preempted; only moves to idle, faster GPUs are weighed.
        if not others and not any_shared:
            fast = self._fast_plan(state, pending, free, free_cores, node_model, models)
            if fast is not None:
                return fast
        self._last_idle = {}  # the next fast cycle weighs moves again
        gpu_jobs: dict[tuple[str, int], tuple[str, ...]] = {
            (e.state.name, g.index): g.job_ids for e in entries for g in e.state.gpus
        }
        running: list[Cand] = []
        guests: list[Cand] = []
        fixed: list[Cand] = []
        capacity = dict(counts)
        min_pending = min((c.key for c in pending), default=_INF)
        # Above replan_limit running jobs, the ones no waiting job could preempt keep their
        # GPUs and model without a full estimate (bounded work on large clusters).
        bounded = ftf <= 0 and len(state.running) > self.replan_limit
        multi = {key for key, ids in gpu_jobs.items() if len(ids) > 1}  # GPUs shared now
        solos: dict[int, float | None] = {}  # id(profile) -> its fastest time (quick keys)
        modes = (SharingMode.MPS, SharingMode.EXCLUSIVE)
        for rj in state.running:
            rpl = rj.placement
            if rj.paused or not rpl.gpu_indices:
                continue
            if rpl.mode not in modes:
                continue  # time-sliced or MIG by someone else: left alone
            shared = bool(multi) and any(
                key in multi and gpu_jobs[key][0] != rj.job.id for key in rpl.gpu_keys
            )
            here = node_model.get(rpl.node)
            pinned = self.preempted(rj.job) >= self.max_preemptions
            if bounded and not shared and here is not None:
                # A job no waiting job could preempt keeps its GPUs without a full estimate.
                quick = self._quick_key(rj, now, models, solos)
                if quick is not None and (
                    pinned or defended_key(quick, self.cost_s, self.margin) <= min_pending
                ):
                    f = Cand(rj.job, {}, 0.0, quick, running=rj, model=here, pinned=True)
                    fixed.append(f)
                    capacity[here] -= f.gpus
                    continue
            c = make(rj.job, rj)
            if c is None:
                continue
            c.running = rj
            c.model = here
            c.move_cost = self.cost_s
            c.stay_bonus = self.margin * c.rem.get(c.model or "", 0.0)
            c.pinned = pinned
            if shared:
                c.guest = True
                guests.append(c)
            else:
                running.append(c)

        # 3. Who runs: merge by (defended) key.
        def rank(c: Cand) -> tuple[float, int, float, str]:
            if c.running is not None:
                if c.pinned:
                    return (-_INF, 0, c.job.arrival_s, c.job.id)
                return (defended_key(c.key, self.cost_s, self.margin), 0, c.job.arrival_s, c.job.id)
            return (c.key, 1, c.job.arrival_s, c.job.id)

        ordered = sorted(running + pending, key=rank)  # job ids break every tie
        cap_left = sum(capacity.values())
        chosen: list[Cand] = []
        for c in ordered:
            if cap_left <= 0:
                break
            if c.gpus <= cap_left:
                chosen.append(c)
                cap_left -= c.gpus
        # 4. Which model.
        assignment = assign_models(chosen, capacity)

        # 5. Where.
        actions: list[Action] = []
        decisions: list[Decision] = []
        chosen_ids = set(assignment)
        keep: list[Cand] = []
        to_start: list[Cand] = []
        leaving: list[Cand] = []
        for c in running:
            target = assignment.get(c.job.id)
            faster = target is not None and c.rem.get(target, _INF) + self.cost_s < c.rem.get(
                c.model or "", _INF
            )
            if target == c.model or (c.pinned and not faster):
                keep.append(c)
            else:
                leaving.append(c)
        # Churn budget: at most churn_budget of the running jobs (at least one) leave their
        # GPUs this cycle; the longest (largest defended key) go first, the others keep their
        # GPUs until a later cycle still finds them worth moving (preempt_margin and the
        # restart cost are the hysteresis).
        budget = max(1, math.floor(self.churn_budget * len(state.running)))
        if len(leaving) > budget:
            leaving.sort(key=lambda c: (-rank(c)[0], c.job.arrival_s, c.job.id))
            # the deferred keep their GPUs; jobs chosen for them wait (placement fails)
            keep.extend(leaving[budget:])
            leaving = leaving[:budget]
        for c in leaving:
            target = assignment.get(c.job.id)
            if target is not None:
                to_start.append(c)
            why = (
                f"moved from {c.model} to {target} (about "
                f"{_fmt_h(c.rem.get(c.model or '', math.nan))} "
                f"left there, {_fmt_h(c.rem[target])} on {target})"
                if target is not None
                else "preempted for shorter jobs (its key "
                f"{_fmt_h(c.key)}; remaining about {_fmt_h(c.best)})"
            )
            self._requeue(c, why, actions, free, gpu_jobs)
        # Jobs that wait (chosen but not placed) must not cause preemptions above; a freed GPU
        # with nothing to start is re-filled below by the next jobs in key order.
        for c in pending:
            if c.job.id in chosen_ids:
                to_start.append(c)
        to_start.sort(key=lambda c: (-c.gpus, rank(c)))
        cores = dict(free_cores)
        started: set[str] = set()
        hosts: list[tuple[Cand, Placement]] = []  # jobs on their GPUs after the plan
        keep.extend(fixed)
        for c in keep:
            c.placed_model = c.model
            if c.running is not None:
                hosts.append((c, c.running.placement))
        for c in to_start:
            m = assignment[c.job.id]
            pl = self._place(c, m, free[m], cores)
            if pl is None:
                waiting[c.job.id] = (
                    f"{c.gpus} GPU(s) of {m} chosen for it (key {_fmt_h(c.key)}) are not free "
                    "together on few enough nodes yet"
                )
                continue
            decisions.append(self._decision(c, pl, m, "shortest predicted remaining time first"))
            c.placed_model = m
            started.add(c.job.id)
            hosts.append((c, pl))
        # Work conserving: idle GPUs take the next jobs in key order (guests first in order).
        rest = [c for c in pending if c.job.id not in started and c.job.id not in waiting]
        rest += [g for g in guests if self.preempted(g.job) < self.max_preemptions]
        rest.sort(key=lambda c: (c.key, c.job.arrival_s, c.job.id))
        if any(f.total() for f in free.values()):
            for c in rest:
                rem = c.rem
                options = [m for m in sorted(rem, key=rem.__getitem__) if free[m].total() >= c.gpus]
                if not options:
                    continue
                m = options[0]
                if c.running is not None:
                    # A packed job moves to a GPU of its own if that pays the move (sharing is
                    # taken as half speed here) and it fits on one node of the model now.
                    shared_rem = c.rem.get(c.model or "", _INF) * 2
                    if rem[m] + self.cost_s >= shared_rem:
                        continue
                    back = {p.node: p.cpus for p in c.running.placement.parts}
                    need = max(1, c.job.cpus)

                    def ok(node: str, back: dict = back, need: int = need) -> bool:
                        return cores.get(node, 0) + back.get(node, 0) >= need

                    if free[m].best_fit(c.gpus, ok) is None:
                        continue
                    self._requeue(c, f"moved to a GPU of its own on {m}", actions, free, gpu_jobs)
                pl = self._place(c, m, free[m], cores)
                if pl is None:
                    continue
                decisions.append(self._decision(c, pl, m, "an idle GPU, next in key order"))
                c.placed_model = m
                started.add(c.job.id)
                hosts.append((c, pl))
                if not any(f.total() for f in free.values()):
                    break
        # 6. Pairs.
        if self.pack:
            self._pack(pending, started, waiting, hosts, gpu_jobs, specs, cores, decisions)
        for c in pending:
            if c.job.id in started or c.job.id in waiting:
                continue
            waiting[c.job.id] = (
                f"queued by shortest predicted remaining time: key {_fmt_h(c.key)} "
                f"(about {_fmt_h(c.best)} left on its fastest model); shorter or older jobs "
                "hold every GPU"
            )
        # Multi-GPU jobs left waiting: the framework says what they miss (whole nodes, GPUs
        # at once, predicted ends) and takes them if what is left holds them (work conserving).
        mine: dict[str, str] = {}
        for c in pending:
            if c.gpus > 1 and c.job.id in waiting:
                mine[c.job.id] = waiting.pop(c.job.id)
                others.append(c.job)
        # Jobs it cannot estimate: the framework's fifo on what is left.
        if others:
            requeued = {a.job_id for a in actions}
            specs_by_id = {c.job.id: c.job for c in pending} | {c.job.id: c.job for c in running}
            specs_by_id |= {c.job.id: c.job for c in guests}
            specs_by_id |= {c.job.id: c.job for c in fixed}
            placed_now = tuple(
                RunningJob(specs_by_id[d.placement.job_id], d.placement, now, 0.0)
                for d in decisions
                if d.placement.job_id in specs_by_id
            )
            rest_state = ClusterState(
                now_s=now,
                nodes=_residual(state, requeued, decisions),
                pending=tuple(sorted(others, key=lambda j: (j.arrival_s, j.id))),
                running=tuple(r for r in state.running if r.job.id not in requeued) + placed_now,
            )
            extra = self.fallback.schedule(rest_state, rng)
            decisions.extend(
                Decision(
                    d.placement,
                    self.name,
                    (
                        f"GPUs left idle after the plan, framework first fit: {d.explanation}"
                        if d.placement.job_id in mine
                        else f"no estimate for it, framework first fit: {d.explanation}"
                    ),
                    d.score,
                )
                for d in extra.decisions
            )
            for jid, reason in extra.waiting.items():
                waiting[jid] = f"{reason}; {mine[jid]}" if jid in mine else reason
        return Plan(decisions=tuple(decisions), actions=tuple(actions), waiting=waiting)

    def _fast_plan(
        self,
        state: ClusterState,
        pending: Sequence[Cand],
        free: dict[str, _Gpus],
        free_cores: Mapping[str, int],
        node_model: Mapping[str, str],
        models: Sequence[str],
    ) -> Plan | None:
        """The plan when the idle GPUs hold every pending job (None: they do not)."""
        idle = {m: free[m].total() for m in models}
        if sum(c.gpus for c in pending) > sum(idle.values()):
            return None
        assignment = assign_models(pending, idle)
        if len(assignment) < len(pending):
            return None
        cores = dict(free_cores)
        decisions: list[Decision] = []
        placed: list[tuple[Cand, Placement, str]] = []
        for c in sorted(pending, key=lambda c: -c.gpus):
            m = assignment[c.job.id]
            pl = self._place(c, m, free[m], cores)
            if pl is None:  # fragmentation: the full plan decides
                return None
            placed.append((c, pl, m))
        for c, pl, m in placed:
            c.placed_model = m
            decisions.append(self._decision(c, pl, m, "idle GPUs for every pending job"))
        actions: list[Action] = []
        gpu_jobs: dict[tuple[str, int], tuple[str, ...]] = {}
        # A move that did not pay at the last cycle does not pay now with no more idle GPUs
        # (its saving only shrinks as it progresses): moves are weighed when idle GPUs appeared.
        idle_now = {m: f.total() for m, f in free.items()}
        if any(n > self._last_idle.get(m, 0) for m, n in idle_now.items()):
            self._fast_moves(state, free, cores, node_model, decisions, actions, gpu_jobs)
        self._last_idle = {m: f.total() for m, f in free.items()}
        return Plan(decisions=tuple(decisions), actions=tuple(actions), waiting={})

    def _fast_moves(
        self,
        state: ClusterState,
        free: dict[str, _Gpus],
        cores: dict[str, int],
        node_model: Mapping[str, str],
        decisions: list[Decision],
        actions: list[Action],
        gpu_jobs: dict[tuple[str, int], tuple[str, ...]],
    ) -> None:
        """Running jobs move to idle GPUs of a faster model when that saves more than the move
        cost plus ``preempt_margin`` of their remaining time (largest saving first)."""
        room = {m for m, f in free.items() if f.total() > 0}
        movers: list[tuple[float, str, RunningJob, str]] = []
        faster_cache = self._faster
        for rj in state.running:
            pl = rj.placement
            # Models faster than the one it is on (cached per job and node).
            fkey = f"{rj.job.id}@{pl.node}"
            faster = faster_cache.get(fkey)
            if faster is None:
                faster = self._faster_models(rj, node_model)
                faster_cache[fkey] = faster
            if not faster or room.isdisjoint(faster):
                continue
            if rj.paused or pl.is_gang or not pl.gpu_indices or rj.job.profile is None:
                continue
            if pl.mode not in (SharingMode.MPS, SharingMode.EXCLUSIVE):
                continue
            # No preemption cap here: the cap bounds how often others push a job out, not
            # its right to move to an idle, faster GPU (no job stays pinned on a slow model).
            times = rj.job.profile.gpu_time_s
            cur = node_model.get(pl.node)
            t_cur = times.get(cur or "")
            if not t_cur:
                continue
            k = max(1, rj.job.gpus)
            need = rj.job.memory_need_mb()
            left = remaining_fraction(rj.progress)
            best_gain, best_m = 0.0, ""
            for m in faster:
                if m not in room:
                    continue
                t = times.get(m)
                if not t or t >= t_cur or free[m].total() < k:
                    continue
                if self._specs[m].memory_mb < need:
                    continue
                gain = left * (t_cur - t) - self.cost_s - self.margin * left * t_cur
                if gain > best_gain:
                    best_gain, best_m = gain, m
            if best_m:
                movers.append((best_gain, rj.job.id, rj, best_m))
        movers.sort(key=lambda x: (-x[0], x[1]))
        del movers[max(1, math.floor(self.churn_budget * len(state.running))) :]  # churn budget
        for _, _, rj, m in movers:
            need_cores = max(1, rj.job.cpus)
            back = {p.node: p.cpus for p in rj.placement.parts}

            def ok(node: str, need_cores: int = need_cores, back: dict = back) -> bool:
                return cores.get(node, 0) + back.get(node, 0) >= need_cores

            if free[m].best_fit(max(1, rj.job.gpus), ok) is None:
                continue
            c = Cand(
                rj.job,
                remaining_times(rj.job, rj.progress, [m, node_model[rj.placement.node]]),
                0.0,
                0.0,
            )
            c.best = min(c.rem.values())
            c.key = c.best
            c.running = rj
            c.model = node_model.get(rj.placement.node)
            for key in rj.placement.gpu_keys:
                gpu_jobs.setdefault(key, (rj.job.id,))
            self._requeue(
                c,
                f"moved from {c.model} to {m}: about {_fmt_h(c.rem.get(c.model or '', math.nan))} "
                f"left there, {_fmt_h(c.rem[m])} on {m}",
                actions,
                free,
                gpu_jobs,
            )
            new_pl = self._place(c, m, free[m], cores)
            if new_pl is None:  # room was checked above
                raise AssertionError(f"hetero_srtf: no room left on {m} for {rj.job.id}")
            c.placed_model = m
            decisions.append(self._decision(c, new_pl, m, "moved to an idle, faster GPU"))

    def preempted(self, job: JobSpec) -> int:
        """How often ``job`` was preempted: this object's count, or the caller's
        ``job.params["preemptions"]`` (the live side's attempt history) if larger."""
        if not job.params:
            return self.preemptions.get(job.id, 0)
        given = job.params.get(PREEMPTIONS_PARAM, 0)
        try:
            given = int(given)
        except (TypeError, ValueError):
            given = 0
        return max(self.preemptions.get(job.id, 0), given)

    def _quick_key(
        self, rj: RunningJob, now: float, models: Sequence[str], solos: dict[int, float | None]
    ) -> float | None:
        """A running job's key from its fastest model's consolidated time (no spread or memory
        filter): enough to tell that no waiting job could preempt it. ``solos`` caches the
        fastest time per profile object within a cycle."""
        prof = rj.job.profile
        if prof is None:
            return None
        pid = id(prof)
        if pid in solos:
            solo = solos[pid]
        else:
            times = [t for m, t in prof.gpu_time_s.items() if t > 0 and m in models]
            solo = solos[pid] = min(times) if times else None
        if solo is None:
            return None
        return priority_key(
            remaining_fraction(rj.progress) * solo, solo, now - rj.job.arrival_s, self.aging
        )

    def _faster_models(self, rj: RunningJob, node_model: Mapping[str, str]) -> tuple[str, ...]:
        """The models of the cluster on which ``rj`` would run faster than where it runs."""
        prof = rj.job.profile
        cur = node_model.get(rj.placement.node)
        if prof is None or cur is None or cur not in prof.gpu_time_s:
            return ()
        t_cur = prof.gpu_time_s[cur]
        return tuple(m for m, t in sorted(prof.gpu_time_s.items(), key=lambda x: x[1]) if t < t_cur)

    def _requeue(
        self,
        c: Cand,
        why: str,
        actions: list[Action],
        free: dict[str, _Gpus],
        gpu_jobs: dict[tuple[str, int], tuple[str, ...]],
    ) -> None:
        rj = c.running
        assert rj is not None
        self.preemptions[c.job.id] = self.preempted(c.job) + 1
        actions.append(Action(ActionKind.REQUEUE, c.job.id, self.name, why))
        for key in rj.placement.gpu_keys:
            jobs = tuple(j for j in gpu_jobs.get(key, ()) if j != c.job.id)
            gpu_jobs[key] = jobs
            if not jobs and c.model is not None:
                free[c.model].add(*key)
        # Cores come back too (per node of its placement).
        c.running = None
        c.model = None
        c.pinned = False
        c.guest = False
        c.freed = rj.placement

    def _place(self, c: Cand, model: str, gpus: _Gpus, cores: dict[str, int]) -> Placement | None:
        """Take ``c.gpus`` free GPUs of ``model``: one node (fullest fitting), else a gang."""
        k = c.gpus
        need = max(1, c.job.cpus)
        if c.freed is not None:
            for part in c.freed.parts:
                cores[part.node] = cores.get(part.node, 0) + part.cpus
            c.freed = None
        spec = self._specs.get(model)
        mps = (
            self.pack
            and spec is not None
            and spec.supports(SharingMode.MPS)
            and _may_pack(c.job)  # else a GPU of its own: nobody joins it
        )
        mode = SharingMode.MPS if mps else SharingMode.EXCLUSIVE

        def ok(node: str) -> bool:
            return cores.get(node, 0) >= need

        node = gpus.best_fit(k, ok)
        if node is not None:
            cores[node] -= need
            return Placement(c.job.id, node, gpus.take(node, k), mode=mode, cpus=need)
        if k <= self._max_node.get(model, 0):
            return None  # one node holds it: it waits for one rather than spread
        # A gang: fewest nodes (most free first).
        if gpus.total() < k:
            return None
        avail = gpus.most_free(ok)
        if sum(a for a, _ in avail) < k:
            return None
        parts: list[PlacementPart] = []
        got = 0
        for a, name in avail:
            take = min(a, k - got)
            parts.append(PlacementPart(name, gpus.take(name, take), need))
            cores[name] -= need
            got += take
            if got >= k:
                break
        first = parts[0]
        return Placement(
            c.job.id, first.node, first.gpu_indices, mode=mode, cpus=need, more=tuple(parts[1:])
        )

    def _decision(self, c: Cand, pl: Placement, model: str, why: str) -> Decision:
        others = sorted((r, m) for m, r in c.rem.items() if m != model)
        there = c.rem[model]
        vs = (
            f"; {others[0][1]}, its next best, would take {others[0][0] / there:.2f}x as long"
            if others and there > 0
            else ""
        )
        spread = f" over {len(pl.parts)} nodes" if pl.is_gang else ""
        where = "+".join(f"{p.node}/gpu{','.join(map(str, p.gpu_indices))}" for p in pl.parts)
        text = (
            f"{why}: key {_fmt_h(c.key)}, about {_fmt_h(there)} left on {model}{spread}"
            f"{vs}; placed on {where}"
        )
        own = c.job.whole_gpu_reason()
        if own is not None and self.pack:
            text += f"; whole GPUs of its own: {own}"
        return Decision(pl, self.name, text, score=c.key)

    def _pack(
        self,
        pending: Sequence[Cand],
        started: set[str],
        waiting: dict[str, str],
        hosts: Sequence[tuple[Cand, Placement]],
        gpu_jobs: Mapping[tuple[str, int], tuple[str, ...]],
        specs: Mapping[str, GpuSpec],
        cores: dict[str, int],
        decisions: list[Decision],
    ) -> None:
        """Step 6 of the module docstring: waiting jobs join single-job GPUs (best pair).

        Hosts are grouped by (GPU count, model, job type, owner): the pair value depends only
        on that, so each waiting job looks at the groups, not at every host."""
        Key = tuple[tuple[str, int], ...]
        joiners = [
            c
            for c in pending
            if c.job.id not in started and c.job.id not in waiting and _may_pack(c.job)
        ]
        if not joiners:
            return
        # Only hosts of a (GPU count, owner) that some waiting job has can be joined.
        wanted = {(c.gpus, c.job.owner) for c in joiners}
        mps = {m for m, spec in specs.items() if spec.supports(SharingMode.MPS)}
        multi = {k for k, ids in gpu_jobs.items() if len(ids) > 1}
        host_of: dict[Key, Cand] = {}
        for h, pl in hosts:
            if (h.gpus, h.job.owner) in wanted and not h.guest and h.placed_model in mps:
                host_of[pl.gpu_keys] = h
        groups: dict[tuple[int, str, str | None, str | None], list[tuple[Key, Cand]]] = {}
        for keys, h in host_of.items():
            m = h.placed_model
            assert m is not None  # in mps
            if h.running is not None and h.running.placement.mode != SharingMode.MPS:
                continue
            if multi and any(k in multi for k in keys):
                continue
            if not _may_pack(h.job):
                continue
            groups.setdefault((h.gpus, m, h.job.job_type, h.job.owner), []).append((keys, h))
        by_size: dict[int, list[tuple[str, str | None, str | None]]] = {}
        for k, m, t, o in groups:
            by_size.setdefault(k, []).append((m, t, o))
        taken: set[Key] = set()
        left = sum(len(v) for v in groups.values())
        # Groups by pair value, best first, per (job type, GPU count, owner): the value depends
        # only on the types and the model, so each waiting job walks its list down to the first
        # group with a free host that holds its memory (the best pair for it).
        ranked: dict[tuple[str, int, str | None], list[tuple[float, str, str | None]]] = {}
        first: dict[tuple[int, str, str | None, str | None], int] = {}  # first untaken member
        for c in joiners:
            if left <= 0:
                break
            if c.job.id in started:
                continue
            rkey = (c.job.type_key(), c.gpus, c.job.owner)
            ranking = ranked.get(rkey)
            if ranking is None:
                ranking = []
                for m, t, owner in by_size.get(c.gpus, ()):
                    if owner != c.job.owner:
                        continue
                    members = groups[(c.gpus, m, t, owner)]
                    norms = self._pair_norms(c.job, members[0][1].job, specs[m])
                    if norms is None or not worth_packing(norms[0], norms[1], self.pack_threshold):
                        continue
                    ranking.append((pair_value(*norms), m, t))
                ranking.sort(key=lambda x: (-x[0], x[1], x[2] or ""))
                ranked[rkey] = ranking
            best: tuple[float, Key, Cand, str] | None = None
            need_mb = c.job.memory_need_mb()
            for value, m, t in ranking:
                if m not in c.rem:
                    continue
                gkey = (c.gpus, m, t, c.job.owner)
                members = groups[gkey]
                i = first.get(gkey, 0)
                while i < len(members) and members[i][0] in taken:
                    i += 1  # taken hosts stay taken: skip them once for every later job
                first[gkey] = i
                for keys, h in members[i:]:
                    if keys in taken:
                        continue
                    if h.job.memory_need_mb() + need_mb > specs[m].memory_mb:
                        continue
                    best = (value, keys, h, m)
                    break
                if best is not None:
                    break
            if best is None:
                continue
            value, keys, h, m = best
            need = max(1, c.job.cpus)
            nodes = sorted({n for n, _ in keys})
            if any(cores.get(n, 0) < need for n in nodes):
                continue
            by_node: dict[str, list[int]] = {}
            for n, i in keys:
                by_node.setdefault(n, []).append(i)
            order = list(dict.fromkeys(n for n, _ in keys))
            parts = [PlacementPart(n, tuple(by_node[n]), need) for n in order]
            for n in order:
                cores[n] -= need
            pl = Placement(
                c.job.id,
                parts[0].node,
                parts[0].gpu_indices,
                mode=SharingMode.MPS,
                cpus=need,
                more=tuple(parts[1:]),
            )
            taken.add(keys)
            left -= 1
            started.add(c.job.id)
            decisions.append(
                Decision(
                    pl,
                    self.name,
                    f"packed next to job {h.job.id} on {m} under MPS: estimated pair throughput "
                    f"{value:.2f} jobs' worth (measured pair) >= {self.pack_threshold:.2f}; "
                    f"key {_fmt_h(c.key)}",
                    score=c.key,
                )
            )

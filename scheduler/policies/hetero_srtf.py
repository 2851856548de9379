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
   isolated ``1/n`` share of the cluster) reaches the cap goes before every job under it
   (worst ratio first). ``n`` is the count of jobs present averaged over the job's life, as
   the metric averages it: measured from its arrival to now, the present count for the time
   it has left (with the count of the moment only, a job that waited through a quiet spell and
   meets a burst looked fairly treated, and the cap rarely fired). The job-seconds present
   since a job's arrival come from the snapshot where it carries them
   (``ClusterState.present_job_s``: the live loop builds a policy per cycle and computes them
   from the job history), else from the policy object's own count (the simulator keeps one
   object for a run).
3. **Who runs.** Jobs are taken in key order until the cluster's GPUs are spoken for. A running
   job defends its GPUs with ``key x (1 - preempt_margin) - preemption_cost_s``: a waiting job
   preempts it only if it is shorter by the margin *and* the restart cost
   (``should_preempt``: swapping two jobs saves ``r_running - r_waiting - cost`` seconds of
   total JCT). A job whose restarts (preemptions x ``preemption_cost_s``) reach
   ``max_restart_share`` of its estimated length, or that was preempted ``max_preemptions``
   times, is no longer preempted for other jobs, but still moves to a faster model when one
   frees up (it is never pinned on a slow GPU by the cap). A long job may thus yield to short
   ones many times (its restarts stay a small share of it), a short one a few times.
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
   estimate, no packing: multi-GPU pairs have none until measured), each taken
   ``pack_sigmas`` standard deviations below its central value (``exp(-k sigma)`` times
   it): a pair is packed on what it yields unless the estimate is too high by more than its
   own spread, so a pair known only from its prior needs a clear margin and a measured one
   little. A packed job (the one that joined) moves to a GPU of its own when one is free, if
   its preemption bound allows.

7. **Jobs of unknown length** (no profile, or ``JobSpec.length_known`` False; with
   ``unknown_lengths`` = ``gittins``): their remaining time is the Gittins index's ``1 / G``
   at their attained service (``ClusterState.attained_s``: seconds run over every attempt;
   without it, the current attempt's), over the lengths of completed jobs of the same type
   and owner, else type, else any (``Knowledge.duration_samples``; ``scheduler.gittins``),
   and of the jobs of unknown length in the snapshot that have run without finishing, each
   counted as twice its service (else the history holds only the jobs short enough to have
   finished, and every job that outlived it looks longer than a fresh one). The lengths are
   taken as times on the job's fastest model. Beyond that history, least attained service
   (as long again as it has run, at least ``unknown_length_s``). Attained service is
   discretised (0, ``las_quantum_s``, then doubling), so the order changes at a few points
   of a job's life. Per model the time is scaled by the profile's relative speeds (without a
   profile: the same on every model that holds the job). They then rank, are preempted and
   defend their GPUs like every other job (keys, margin, restart cost, churn budget); they
   age by the time they have waited (not run), in multiples of what a fresh job like them is
   expected to take; the restart bound and the fairness cap take their attained service
   plus the estimate as their length, and the fast path moves them to idle, faster GPUs by
   their relative speeds. Their decisions say what the estimate rests on.

Parameters (``portal/core/policy_settings.py`` documents them for the admin):


- ``aging`` (0.5): weight of a job's age, in multiples of its own length, in its key.
- ``preemption_cost_s`` (60): estimated checkpoint-and-restart time; a preemption or move
  must save more than this (the simulator passes its ``--preemption-cost-s``).
- ``preempt_margin`` (0.1): a waiting job must be this fraction shorter than a running one.
- ``max_preemptions`` (100): preemptions (moves included) of one job before it keeps its GPUs,
  whatever its length.
- ``max_restart_share`` (0.1): a job keeps its GPUs once its restarts (preemptions x
  ``preemption_cost_s``) reach this share of its estimated run time on its fastest model
  (0: the count alone).
- ``pack_threshold`` (1.2): pack two jobs on a GPU when their estimated pair throughput
  reaches this many jobs' worth (0: never pack).
- ``pack_sigmas`` (1): how cautious packing is: each job's co-run speed is taken this many
  standard deviations of its estimate below the estimate (0: the central estimate). Among
  many candidate pairs the best-looking ones are those whose estimates erred upwards; one
  standard deviation is the usual lower bound, not a value fitted to a trace.
- ``ftf_cap`` (2): finish-time-fairness cap; jobs predicted at or above it go first, keep the
  model the greedy assignment gives them (no swap sends them to a slower one), and each
  waiting one may take one running job's GPUs beyond the churn budget; running ones over it
  that move leave first within the budget; a job under it on its fastest model but over it
  on a slower one, were it to run there to the end, is kept off that one in the assignment
  if another job can take it (``OVER_CAP_COST``) (0: off). 2 is issue 24's bound.
- ``ftf_sigmas`` (0): how cautious the cap is about declared lengths: it counts a job's age
  ``exp(k sigma)`` times (``sigma``: ``Knowledge.prior_sigma``, the spread of a declared
  length), i.e. it predicts the ratio of a job that many standard deviations shorter than
  declared. Progress is reported against the declared length, so a length declared too long
  shows nowhere before the job ends, and the cap, whose share grows with the declared length,
  does not see such a job fall behind. A job past its declared length, and a job of unknown
  length (whose length is no declaration), are weighed as they are. Off by default: it trades
  average JCT for the largest ratio, in different measure on different traces
  (docs/policies.md).
- ``tick_s`` (0): also re-plan every so many seconds (0: on arrivals and completions only).
- ``churn_budget`` (0.02): at most this share of the running jobs (and at least
  ``churn_min``) is requeued (preempted or moved) per cycle; those whose GPUs the plan needs
  (for moving, then waiting jobs) go first, then the longest; the others keep their GPUs
  until a later cycle still finds the change worth its margin and restart cost, and a move
  that would find no room once the budget has cut is not made (1: no limit).
- ``churn_min`` (8): jobs a cycle may always requeue, however small the cluster: the share
  bounds checkpoint storms on large clusters (1,600 jobs at 80,000 GPUs), while 2 % of a
  36-GPU cluster would be one job per cycle, and short jobs would queue behind long ones.
- ``replan_limit`` (512): with more running jobs than this, a running job that no waiting job
  could preempt (its defended key at most the smallest waiting key; estimated from its fastest
  model) keeps its GPUs and model without entering the assignment, so a cycle's work grows
  with the jobs that may change, not with the cluster. Below it every running job is
  re-planned (moves between models included).

- ``unknown_lengths`` (``gittins``): how jobs of unknown length are ranked (step 7);
  ``fifo`` hands them to the framework's fifo below, as before, never preempted.
- ``unknown_length_s`` (3,600): what a job of unknown length is taken to need while the
  cluster has no history for it (and at least what it has run).
- ``las_quantum_s`` (360): the first step of the discretised attained service (0: continuous).

Jobs it cannot estimate (CPU jobs, container jobs, whose nodes the framework knows, jobs
without a profiled time on a GPU model of the cluster that holds their memory, jobs larger
than every model, and with ``unknown_lengths`` = ``fifo`` jobs of unknown length) are
handed, on what is left of the cluster after its own plan, to ``fifo`` of the framework
with the framework's parameters (``backfill``, ``max_jobs_per_gpu``, ``share_mode``, ...:
their meaning there), which places them or says why they wait. ``max_jobs_per_gpu`` below
2 or a ``share_mode`` other than ``auto``/``mps`` also turns packing off.

Preemption is a ``REQUEUE`` action (the job keeps its progress: checkpointed) followed, for a
migration, by a new placement in the same plan. Each job's preemptions are counted here (this
object's state, the only state it keeps); a caller that builds a new policy object per cycle
(the portal) passes the count in ``JobSpec.params["preemptions"]`` for the bound to hold.
Every decision, action and waiting job is explained.

The steps live beside this module, one idea each: estimates and keys
(``hetero_srtf_estimates``: steps 1-3), the model assignment (``hetero_srtf_assign``: step 4),
the free GPUs and the residual snapshot (``hetero_srtf_gpus``: step 5), the pairs
(``hetero_srtf_pack``: step 6). This module holds the cycle and re-exports their public names.
"""

from __future__ import annotations

import gc
import math
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

from scheduler.domain import (
    Action,
    ActionKind,
    ClusterState,
    Decision,
    GpuSpec,
    JobSpec,
    Placement,
    PlacementPart,
    Plan,
    RunningJob,
    SharingMode,
)
from scheduler.gittins import discretise, effective_remaining_s
from scheduler.policies.base import Policy, PolicyError
from scheduler.policies.filtering import table_knowledge
from scheduler.policies.framework import framework_defaults
from scheduler.policies.hetero_srtf_assign import Cand, assign_models
from scheduler.policies.hetero_srtf_estimates import (
    OVERRUN_LEFT,
    defended_key,
    isolated_from,
    isolated_time_s,
    pair_value,
    priority_key,
    remaining_fraction,
    remaining_times,
    share_rate,
    should_preempt,
    worth_packing,
)
from scheduler.policies.hetero_srtf_gpus import FreeGpus, NodeFacts, fmt_h, may_pack, residual_nodes
from scheduler.policies.hetero_srtf_pack import pack_waiting

__all__ = [
    "OVERRUN_LEFT",
    "PREEMPTIONS_PARAM",
    "Cand",
    "HeteroSrtfPolicy",
    "assign_models",
    "defended_key",
    "isolated_time_s",
    "pair_value",
    "priority_key",
    "remaining_fraction",
    "remaining_times",
    "should_preempt",
    "worth_packing",
]

_INF = math.inf
#: ``JobSpec.params`` key a caller may set to the job's past preemptions (the live side rebuilds
#: the policy every cycle, so its own count starts at 0 each time).
PREEMPTIONS_PARAM = "preemptions"


def _sorted_by(
    items: Sequence[Any], first: Callable[[Any], float], key: Callable[[Any], Any]
) -> list[Any]:
    """``sorted(items, key=key)`` where ``first(x) == key(x)[0]`` (a float, never NaN): one
    sort by the float, then each run that ties on it by the whole key. The same order; on
    tens of thousands of candidates with few ties, much cheaper than comparing tuples."""
    firsts = [first(x) for x in items]
    order = sorted(range(len(firsts)), key=firsts.__getitem__)
    out = [items[i] for i in order]
    i, n = 0, len(out)
    while i < n:
        f = firsts[order[i]]
        j = i + 1
        while j < n and firsts[order[j]] == f:
            j += 1
        if j - i > 1:
            out[i:j] = sorted(out[i:j], key=key)
        i = j
    return out


# ----------------------------------------------------------------------------------------
# The policy


class HeteroSrtfPolicy(Policy):
    """See the module docstring (parameters included)."""

    name = "hetero_srtf"
    defaults: ClassVar[Mapping[str, Any]] = {
        **framework_defaults,
        "backfill": True,
        "aging": 0.5,
        "preemption_cost_s": 60.0,
        "preempt_margin": 0.1,
        "max_preemptions": 100,
        "pack_threshold": 1.2,
        "pack_sigmas": 1.0,
        "ftf_cap": 2.0,
        "ftf_sigmas": 0.0,
        "tick_s": 0.0,
        "replan_limit": 512,
        "churn_budget": 0.02,
        "churn_min": 8,
        "max_restart_share": 0.1,
        "unknown_lengths": "gittins",
        "unknown_length_s": 3600.0,
        "las_quantum_s": 360.0,
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
            self.pack_sigmas = float(p["pack_sigmas"])
            self.ftf_cap = float(p["ftf_cap"])
            self.ftf_sigmas = float(p["ftf_sigmas"])
            tick = float(p["tick_s"])
            self.replan_limit = int(p["replan_limit"])
            self.churn_budget = float(p["churn_budget"])
            self.churn_min = int(p["churn_min"])
            self.restart_share = float(p["max_restart_share"])
            self.unknown_length_s = float(p["unknown_length_s"])
            self.las_quantum_s = float(p["las_quantum_s"])
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"policy 'hetero_srtf': bad parameter ({exc})") from None
        checks = (
            ("aging", 0 <= self.aging <= 100),
            ("preemption_cost_s", 0 <= self.cost_s <= 1e7),
            ("preempt_margin", 0 <= self.margin < 1),
            ("max_preemptions", 0 <= self.max_preemptions <= 10_000),
            ("pack_threshold", 0 <= self.pack_threshold <= 2),
            ("pack_sigmas", 0 <= self.pack_sigmas <= 5),
            ("ftf_cap", 0 <= self.ftf_cap <= 1e6),
            ("ftf_sigmas", 0 <= self.ftf_sigmas <= 5),
            ("tick_s", 0 <= tick <= 1e7),
            ("replan_limit", 0 <= self.replan_limit <= 10_000_000),
            ("churn_budget", 0 <= self.churn_budget <= 1),
            ("churn_min", 1 <= self.churn_min <= 10_000_000),
            ("max_restart_share", 0 <= self.restart_share <= 10),
            ("unknown_length_s", 0 < self.unknown_length_s <= 1e9),
            ("las_quantum_s", 0 <= self.las_quantum_s <= 1e9),
            ("unknown_lengths", p["unknown_lengths"] in ("gittins", "fifo")),
        )
        for name, ok in checks:
            if not ok:
                raise PolicyError(f"policy 'hetero_srtf': {name}={p[name]!r} is out of range")
        self.unknown_lengths = str(p["unknown_lengths"])
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
        self._node_cache: dict[str, NodeFacts] = {}
        self._last_idle: dict[str, int] = {}  # idle GPUs per model after the last fast cycle
        # job id -> (its node, the models faster than that node's)
        self._faster: dict[str, tuple[str, tuple[str, ...]]] = {}
        # The finish-time-fairness cap's count of jobs present, averaged over time as the
        # metric averages it (``scheduler.ftf``): job-seconds present since the first cycle,
        # the count since the last one, and per job (area, time, count) when first seen.
        self._area = 0.0
        self._area_t: float | None = None
        self._area_n = 0
        self._seen: dict[str, tuple[float, float, int]] = {}

    # -- helpers ---------------------------------------------------------------------------

    def _pair_norms(self, a: JobSpec, b: JobSpec, spec: GpuSpec) -> tuple[float, float] | None:
        """(norm of a, norm of b) next to each other on ``spec``: the knowledge's co-run
        speeds (pair prior, then measured co-runs), each ``pack_sigmas`` standard deviations
        below its estimate and at most 1; without a knowledge in the state, one with the Gavel
        table as its prior (``scheduler.knowledge.priors.table_pair_prior``)."""
        knowledge = self._knowledge
        if knowledge is None:
            if self._pairs is None:
                self._pairs = table_knowledge()
            knowledge = self._pairs
        ea = knowledge.co_run_speed(a, spec.model, (b,), SharingMode.MPS)
        eb = knowledge.co_run_speed(b, spec.model, (a,), SharingMode.MPS)
        if ea is None or eb is None or ea.value <= 0 or eb.value <= 0:
            return None
        k = self.pack_sigmas
        return min(1.0, ea.value * math.exp(-k * ea.sigma)), min(
            1.0, eb.value * math.exp(-k * eb.sigma)
        )

    def _pack_basis(self) -> str:
        """How ``_pair_norms`` takes the speeds, for the packing decisions' explanation."""
        k = self.pack_sigmas
        if k == 0:
            return "central estimate"
        return f"{k:g} standard deviation{'' if k == 1 else 's'} below the estimate"

    def _churn_allowance(self, running: int) -> int:
        """Jobs that may leave their GPUs this cycle: ``churn_budget`` of the running jobs, and
        never fewer than ``churn_min``."""
        return max(self.churn_min, math.floor(self.churn_budget * running))

    def _count_jobs_present(self, state: ClusterState, now: float, n_jobs: int) -> None:
        """Advance the job-seconds present to ``now`` (the count since the last cycle held
        until now) and forget jobs no longer present once the table doubles."""
        if self._area_t is not None and now > self._area_t:
            self._area += self._area_n * (now - self._area_t)
        self._area_t, self._area_n = now, n_jobs
        if len(self._seen) > 2 * n_jobs + 64:
            present = {j.id for j in state.pending} | {rj.job.id for rj in state.running}
            self._seen = {k: v for k, v in self._seen.items() if k in present}

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        # A cycle on a large cluster allocates hundreds of thousands of short-lived objects
        # and no garbage that needs the cycle collector: the collector's full passes over the
        # heap were about a fifth of a cycle at 80,000 GPUs. It is paused for the cycle (and
        # left as it was found); reference counting still frees everything as usual.
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            return self._schedule(state, rng)
        finally:
            if paused:
                gc.enable()

    def _schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        now = state.now_s
        self._knowledge = state.knowledge
        # GPUs per model on up nodes, the specs, idle GPUs (per-node facts cached while the
        # snapshot hands the same NodeState object: unchanged nodes cost a lookup).
        counts: dict[str, int] = {}
        specs: dict[str, GpuSpec] = {}
        free_cores: dict[str, int] = {}
        node_model: dict[str, str] = {}
        max_node: dict[str, int] = {}
        entries: list[NodeFacts] = []
        any_shared = False
        cache = self._node_cache
        for n in state.nodes:
            if not n.up or not n.gpus:
                continue
            e = cache.get(n.name)
            if e is None or e.state is not n:
                e = NodeFacts(n)
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
        if ftf > 0:
            self._count_jobs_present(state, now, n_jobs)
        area_now, seen_jobs = self._area, self._seen
        # With ftf_sigmas, the cap counts a job's age as if its declared length were that many
        # standard deviations of a declared length (the knowledge's prior spread) too long:
        # its fair share that much shorter. Progress is reported against the declared length,
        # so nothing seen before a job ends tells one declared too long (docs/policies.md).
        age_weight = (
            math.exp(self.ftf_sigmas * state.knowledge.prior_sigma)
            if self.ftf_sigmas > 0 and state.knowledge is not None
            else 1.0
        )

        # Solo times per model that a job may use, per (profile object, GPU count, memory need,
        # current model, gang): jobs of one profile share them within a cycle.
        solo_times: dict[tuple[int, int, float, str | None, bool], list[tuple[str, float]]] = {}
        # ck -> sum over its models of count / solo time: with the fastest time, what
        # ``isolated_time_s`` reads from a job's times, for every n.
        share_rates: dict[tuple[int, int, float, str | None, bool], float] = {}
        fastest_of: dict[tuple[int, int, float, str | None, bool], float] = {}  # ck -> min time
        aging = self.aging

        history = state.present_job_s

        def fastest_time(ck: Any, times: list[tuple[str, float]]) -> float:
            """The fastest of ``times`` (non-empty), kept per ck."""
            t = fastest_of.get(ck)
            if t is None:
                t = fastest_of[ck] = min(t for _, t in times)
            return t

        def sighting(job: JobSpec) -> tuple[float, float, int] | None:
            """This policy's record of when it first saw the job (area, time, count then),
            noted now if it is new; None where the live loop's job history counts it."""
            if history is not None and job.id in history:
                return None
            seen = seen_jobs.get(job.id)
            if seen is None:
                seen = seen_jobs[job.id] = (area_now, now, n_jobs)
            return seen

        def present_past(job: JobSpec) -> float:
            """Job-seconds present from the job's arrival to now: the live loop's count from
            the job history, else this policy's own (before the job was first seen, the count
            then)."""
            seen = sighting(job)
            if seen is not None:
                return area_now - seen[0] + seen[2] * max(0.0, seen[1] - job.arrival_s)
            assert history is not None  # sighting found the job there
            return history[job.id]

        def fair_share_s(
            job: JobSpec, age: float, best: float, ck: Any, times: Any, k: int, past: float
        ) -> float:
            """The job's time on an isolated ``1/n`` share (``isolated_time_s`` of its solo
            ``times`` per model), the denominator of its predicted finish-time-fairness ratio
            (age + ``best`` remaining over it); ``n`` the count of jobs present averaged over
            the job's life, as the metric does: ``past`` (``present_past``) from its arrival
            to now, the present count for the time it is predicted to have left. Never less
            than its fastest time in ``times``. ``ck``: a key for jobs that share ``times``,
            then a non-empty list of (model, solo time); None: not cached, ``times`` a dict."""
            life = max(0.0, age) + best
            mean_n = (past + n_jobs * best) / life if life > 0 else float(n_jobs)
            n = max(1, round(mean_n))
            if ck is None:
                return isolated_time_s(times, counts, k, n)
            # isolated_time_s from its parts, kept per ck (jobs of one profile and count share
            # them within a cycle, whatever their n).
            rate = share_rates.get(ck)
            if rate is None:
                rate = share_rates[ck] = share_rate(times, counts)
            return isolated_from(fastest_time(ck, times), rate, k, n)

        def make(job: JobSpec, rj: RunningJob | None) -> Cand | None:
            if job.container:
                return None  # the framework knows which nodes run containers
            if job.length_unknown():  # (make is only asked about GPU jobs)
                return make_unknown(job, rj) if unknown_on else None
            progress = rj.progress if rj is not None else 0.0
            k = g if (g := job.gpus) > 1 else 1  # max(1, job.gpus)
            need = job.memory_need_mb()
            here = node_model.get(rj.placement.node) if rj is not None else None
            gang = rj is not None and bool(rj.placement.more)  # is_gang
            ck = (id(job.profile), k, need, here, gang)
            times = solo_times.get(ck)
            if times is None:
                spread = {m: k > max_node.get(m, 0) for m in models}
                if rj is not None and gang:
                    spread[node_model.get(rj.placement.node, "")] = True
                times = solo_times[ck] = [
                    (m, t)
                    for m in models
                    if (t := job.run_time_s(m, spread=spread[m])) is not None
                    and t > 0
                    and (m == here or (counts[m] >= k and specs[m].memory_mb >= need))
                ]
            # remaining_fraction and priority_key, written out (called ~30,000 times a cycle
            # on the largest benchmark): the same arithmetic.
            left = OVERRUN_LEFT if progress >= 1.0 else (d if (d := 1.0 - progress) > 0.0 else 0.0)
            rem = {m: left * t for m, t in times}  # as remaining_times
            if not rem:
                return None
            best = min(rem.values())
            solo_best = best / left if left > 0 else best
            age = now - job.arrival_s
            key = (
                best
                if solo_best <= 0
                else best / (1.0 + aging * (age if age > 0.0 else 0.0) / solo_best)
            )
            over: frozenset[str] | None = None
            if ftf > 0:
                tmin = fastest_time(ck, times)
                worst = max(rem.values()) if len(rem) > 1 else best
                # Under the cap on every model whatever its share when age + its slowest
                # remaining time stays under ftf times its fastest time (the share is never
                # shorter): the share is not worked out, but a job seen for the first time is
                # noted.
                # (A job past its declared length is known not to be shorter than declared.)
                aged = age * age_weight if progress < 1.0 else age
                if aged + worst >= ftf * tmin:
                    iso = fair_share_s(job, age, best, ck, times, k, present_past(job))
                    if iso > 0:
                        if (rho := (aged + best) / iso) >= ftf:
                            key = -rho  # over the cap even on its fastest model
                        elif worst > (lim := ftf * iso - aged):
                            # Under the cap on its fastest model, over it were it to run on
                            # these to the end: the assignment keeps it off them if it can.
                            over = frozenset(m for m, r in rem.items() if r > lim)
                else:
                    sighting(job)
            return Cand(job, rem, best, key, over_cap=over)

        unknown_on = self.unknown_lengths == "gittins"
        attained = state.attained_s
        knowledge = state.knowledge
        gittins: dict[tuple[str, str | None, float, float | None], tuple[float, float, str]] = {}
        floor_s, quantum_s = self.unknown_length_s, self.las_quantum_s

        def served(job: JobSpec, rj: RunningJob | None) -> float:
            """Seconds ``job`` has run (the snapshot's history, else its current attempt)."""
            if attained is not None and job.id in attained:
                return attained[job.id]
            return now - rj.started_s if rj is not None else 0.0

        # Jobs of unknown length that have run but not finished are lengths not yet seen:
        # each counts, beside the completed ones, as twice the service it has had (the
        # least-attained-service assumption), by type and in all. Without them the history
        # holds only the jobs that were short enough to finish, and early on every job that
        # outlived it looks longer than a fresh one.
        # (Gathered at the first job of unknown length: a cycle without one never pays.)
        unfinished: dict[str, list[float]] = {}
        unfinished_all: list[float] = []
        gathered = False

        def gather_unfinished() -> None:
            for job, rj in (
                *((j, None) for j in state.pending),
                *((r.job, r) for r in state.running),
            ):
                if job.length_unknown():
                    done = served(job, rj)
                    if done > 0:
                        unfinished.setdefault(job.type_key(), []).append(2.0 * done)
                        unfinished_all.append(2.0 * done)

        def make_unknown(job: JobSpec, rj: RunningJob | None) -> Cand | None:
            """A job whose length is unknown (``scheduler.gittins``): its remaining time is
            the Gittins index's ``1 / G`` over the lengths of completed jobs like it, at its
            discretised attained service (LAS without such a history); per model, scaled by
            its profile's relative speeds (none: the same on every model that holds it)."""
            nonlocal gathered
            if not gathered:
                gather_unfinished()
                gathered = True
            k = g if (g := job.gpus) > 1 else 1
            done = served(job, rj)
            a = discretise(done, quantum_s)
            limit = job.time_limit_s
            gk = (job.type_key(), job.owner, a, limit)
            hit = gittins.get(gk)
            if hit is None:
                if knowledge is not None:
                    lengths, what, typed = knowledge.duration_samples(gk[0], job.owner)
                else:
                    lengths, what, typed = (), "", False
                more = unfinished.get(gk[0], []) if typed else unfinished_all
                if more:
                    lengths = tuple(sorted((*lengths, *more)))
                    still = f"{len(more)} unfinished at twice their service"
                    what = f"{what}, {still}" if what else still
                eff, n = effective_remaining_s(lengths, a, floor_s=floor_s)
                fresh = effective_remaining_s(lengths, 0.0, floor_s=floor_s)[0] if a else eff
                if limit is not None and limit > 0:
                    eff = min(eff, max(limit - a, quantum_s))  # the user's bound
                    fresh = min(fresh, limit)
                note = (
                    f"length unknown: Gittins index at its {fmt_h(a)} of service over the "
                    f"lengths of {what} ({n} longer)"
                    if n
                    else f"length unknown: least attained service ({fmt_h(a)} run so far)"
                )
                hit = gittins[gk] = (eff, fresh, note)
            eff, fresh, note = hit
            need = job.memory_need_mb()
            here = node_model.get(rj.placement.node) if rj is not None else None
            usable = [
                m for m in models if m == here or (counts[m] >= k and specs[m].memory_mb >= need)
            ]
            prof = job.profile
            if prof is not None:
                times = {m: t for m in usable if (t := prof.gpu_time_s.get(m)) and t > 0}
                fastest = min(times.values(), default=0.0)
                rem = {m: eff * t / fastest for m, t in times.items()}
            else:
                rem = dict.fromkeys(usable, eff)
            if not rem:
                return None
            best = min(rem.values())
            age = now - job.arrival_s
            # Aging by the time it has waited (not run: service is what the ranking counts),
            # in multiples of what a fresh job like it is expected to take, the same for a
            # waiting and a running one (with its own estimate, a job that has run long would
            # age slower than one that waits, and the two would keep swapping).
            solo = fresh * best / eff if eff > 0 else best
            wait = age - done
            key = best / (1.0 + aging * (wait if wait > 0.0 else 0.0) / solo) if solo > 0 else best
            if ftf > 0:  # its whole length taken as what it ran plus the estimate
                whole = {m: r + done for m, r in rem.items()}
                iso = fair_share_s(job, age, best, None, whole, k, present_past(job))
                if iso > 0 and (rho := (age + best) / iso) >= ftf:
                    key = -rho
            c = Cand(job, rem, best, key)
            c.note = note
            c.attained = done
            return c

        pending: list[Cand] = []
        waiting: dict[str, str] = {}
        others: list[JobSpec] = []  # for the fallback
        for job in state.pending:
            c = make(job, None) if job.gpus > 0 else None
            if c is None:
                others.append(job)
            else:
                pending.append(c)
        pending = _sorted_by(pending, lambda c: c.key, lambda c: (c.key, c.job.arrival_s, c.job.id))
        free: dict[str, FreeGpus] = {m: FreeGpus() for m in models}
        for e in entries:
            if e.idle:
                free[e.model].fill(e.state.name, list(e.idle))
        # Fast path: every pending job gets a model among the idle GPUs and nothing is packed,
        # so nobody needs to be preempted; only moves to idle, faster GPUs are weighed.
        if not others and not any_shared:

            def unknown_left(rj: RunningJob) -> float:
                """Estimated seconds left of a running job of unknown length, per second
                of its profile's time on a model (its Gittins estimate over that time)."""
                c = make_unknown(rj.job, rj)
                here = node_model.get(rj.placement.node, "")
                t = rj.job.profile.gpu_time_s.get(here) if rj.job.profile is not None else None
                if c is None or not t or here not in c.rem:
                    return 0.0
                return c.rem[here] / t

            fast = self._fast_plan(
                state,
                pending,
                free,
                free_cores,
                node_model,
                models,
                unknown_left if unknown_on else None,
            )
            if fast is not None:
                return fast
        self._last_idle = {}  # the next fast cycle weighs moves again
        gpu_jobs: dict[tuple[str, int], tuple[str, ...]] = {
            (e.state.name, g.index): g.job_ids for e in entries for g in e.state.gpus
        }
        running: list[Cand] = []
        guests: list[Cand] = []
        # Running jobs that keep their GPUs without a full estimate ("fixed", below) are no
        # candidates at all: they only count against the capacity, and, when packing, are
        # filed for it at once by (GPU count, model, job type, owner) if they run under MPS
        # (the only hosts it may join), in running order.
        fixed_hosts: dict[tuple[int, str, str | None, str | None], list[tuple[Placement, Any]]]
        fixed_hosts = {}
        packing = self.pack
        capacity = dict(counts)
        # Jobs over the fairness cap (negative keys) are left out: they rank before every
        # running job that is not pinned and take the GPUs of the worst-ranked ones, which are
        # never the fixed ones below.
        min_pending = min((c.key for c in pending if c.key >= 0), default=_INF)
        # Above replan_limit running jobs, the ones no waiting job could preempt keep their
        # GPUs and model without a full estimate (bounded work on large clusters).
        # (A fixed job is not seen by the fairness cap's count until it is re-planned.)
        bounded = len(state.running) > self.replan_limit
        multi = {  # GPUs shared now (only nodes with a shared GPU are looked at)
            (e.state.name, g.index)
            for e in entries
            if e.shared
            for g in e.state.gpus
            if len(g.job_ids) > 1
        }
        solos: dict[int, float | None] = {}  # id(profile) -> its fastest time (quick keys)
        modes = (SharingMode.MPS, SharingMode.EXCLUSIVE)
        mps_mode = SharingMode.MPS
        # The loop below runs once per running job (80,000 on the largest benchmark), so
        # ``priority_key``, ``defended_key`` and ``preempted`` are written out in it (same
        # arithmetic, same order; ``max(0.0, x)`` as ``x if x > 0.0 else 0.0``, equal for
        # every float, NaN included). The quick key is a running job's key from its fastest
        # model's consolidated time (no spread or memory filter): enough to tell that no
        # waiting job could preempt it; ``solos`` caches that time per profile object.
        counted = self.preemptions
        keep_frac, cost_s = 1.0 - self.margin, self.cost_s
        model_set = set(models)
        has_multi = bool(multi)
        for rj in state.running:
            rpl = rj.placement
            if rj.paused or not rpl.gpu_indices:
                continue
            if rpl.mode not in modes:
                continue  # time-sliced or MIG by someone else: left alone
            job = rj.job
            shared = has_multi and any(
                key in multi and gpu_jobs[key][0] != job.id for key in rpl.gpu_keys
            )
            here = node_model.get(rpl.node)
            pinned: bool | None = None  # looked up when needed
            if (
                bounded
                and not shared
                and here is not None
                and job.profile is not None
                and job.length_known
            ):
                # A job no waiting job could preempt keeps its GPUs without a full estimate.
                solo = self._fastest_solo(job, model_set, solos)
                if solo is not None:
                    prog = rj.progress
                    left = OVERRUN_LEFT if prog >= 1.0 else (d if (d := 1.0 - prog) > 0.0 else 0.0)
                    age = now - job.arrival_s
                    quick = left * solo / (1.0 + aging * (age if age > 0.0 else 0.0) / solo)
                    if quick * keep_frac - cost_s <= min_pending or (
                        pinned := self._pinned_after(
                            self.preempted(job) if job.params else counted.get(job.id, 0), solo
                        )
                    ):
                        k = g if (g := job.gpus) > 1 else 1  # Cand.gpus
                        capacity[here] -= k
                        if packing and rpl.mode == mps_mode:
                            gkey = (k, here, job.job_type, job.owner)
                            filed = fixed_hosts.get(gkey)
                            if filed is None:
                                filed = fixed_hosts[gkey] = []
                            filed.append((rpl, rj))
                        continue
            c = make(job, rj)
            if c is None:
                # Left where it runs (a job the framework placed): its GPUs are taken.
                if here is not None and not shared:
                    capacity[here] -= g if (g := job.gpus) > 1 else 1
                continue
            if pinned is None:
                if c.attained is not None:  # unknown length: it is at least as long as it ran
                    n_pre = self.preempted(job)
                    pinned = n_pre > 0 and self._pinned_after(n_pre, c.attained + c.best)
                else:
                    pinned = self._pinned(job, model_set, solos)
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
        def ranked_by(c: Cand) -> float:
            """A candidate's place in the merge: a waiting job's key, a running job's
            defended key (``defended_key``), -inf for a pinned one."""
            if c.running is None:
                return c.key
            return -_INF if c.pinned else c.key * keep_frac - cost_s

        def rank(c: Cand) -> tuple[float, int, float, str]:
            return (ranked_by(c), 0 if c.running is not None else 1, c.job.arrival_s, c.job.id)

        # sorted(running + pending, key=rank); job ids break every tie
        ordered = _sorted_by(running + pending, ranked_by, rank)
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
            if target == c.model:
                keep.append(c)
                continue
            faster = target is not None and c.rem.get(target, _INF) + self.cost_s < c.rem.get(
                c.model or "", _INF
            )
            if c.pinned and not faster:
                keep.append(c)
            else:
                leaving.append(c)
        # Churn budget: at most churn_budget of the running jobs (at least one) leave their
        # GPUs this cycle; the longest (largest defended key) go first, the others keep their
        # GPUs until a later cycle still finds them worth moving (preempt_margin and the
        # restart cost are the hysteresis).
        # Jobs over the finish-time-fairness cap are not held back by it: each may take the
        # GPUs of one more running job (the cap binds where the budget would defer it).
        # Running jobs over the cap that move leave first, most over the cap first, within
        # the budget (not the part added for the waiting jobs over the cap), each counting
        # itself and the GPUs it takes. When the budget cuts, the jobs whose GPUs are needed
        # go first (below), and a move that would find no room is not made.
        budget = self._churn_allowance(len(state.running))
        for_waiting = sum(1 for c in chosen if c.running is None and c.key < 0)
        movers: list[Cand] = []
        cut = False  # some job that would leave keeps its GPUs this cycle
        if any(c.key < 0 for c in leaving):
            spent = 0
            plain: list[Cand] = []
            for c in sorted(leaving, key=lambda c: (c.key, c.job.arrival_s, c.job.id)):
                if c.key >= 0 or assignment.get(c.job.id) is None:
                    plain.append(c)
                elif spent + 1 + c.gpus <= budget:
                    spent += 1 + c.gpus
                    movers.append(c)
                else:
                    keep.append(c)  # next cycle: it still ranks first
                    cut = True
            budget -= len(movers)
            leaving = plain
        budget += for_waiting  # the waiting jobs over the cap: not spent on moves
        if len(leaving) > budget:
            leaving = _sorted_by(
                leaving,
                lambda c: -ranked_by(c),
                lambda c: (-ranked_by(c), c.job.arrival_s, c.job.id),
            )
            # Those whose GPUs are needed go first: the GPUs the moving jobs, then the
            # waiting ones chosen (in rank order), then the other moves take on each model,
            # beyond the idle ones there. The longest go first within each.
            idle = {m: free[m].total() for m in models}
            ordered_leaving: list[Cand] = []
            rest = leaving
            for wanting in (
                movers,
                [c for c in pending if c.job.id in chosen_ids],
                [c for c in leaving if c.job.id in chosen_ids],
            ):
                short = dict.fromkeys(models, 0)
                for c in wanting:
                    short[assignment[c.job.id]] += c.gpus
                for m in models:  # the idle GPUs serve first
                    use = min(idle[m], short[m])
                    idle[m] -= use
                    short[m] -= use
                later: list[Cand] = []
                for c in rest:
                    here_m = c.model or ""
                    if short.get(here_m, 0) > 0:
                        short[here_m] -= c.gpus
                        ordered_leaving.append(c)
                    else:
                        later.append(c)
                rest = later
            leaving = ordered_leaving + rest
            # the deferred keep their GPUs; jobs chosen for them wait (placement fails)
            keep.extend(leaving[budget:])
            leaving = leaving[:budget]
            cut = True
        if cut:
            # A job that would move finds room on its model only if enough jobs there leave
            # (or GPUs there are idle): one that would not is not moved (it would lose its
            # GPUs and wait), which may in turn leave less room for another.
            moves = [c for c in movers + leaving if assignment.get(c.job.id) is not None]
            freed = {m: free[m].total() for m in models}
            for c in movers + leaving:
                if c.model is not None:
                    freed[c.model] = freed.get(c.model, 0) + c.gpus
            while moves:
                room = dict(freed)
                stuck: list[Cand] = []
                for c in moves:
                    target = assignment[c.job.id]
                    if room.get(target, 0) >= c.gpus:
                        room[target] -= c.gpus
                    else:
                        stuck.append(c)
                if not stuck:
                    break
                gone = {id(c) for c in stuck}
                moves = [c for c in moves if id(c) not in gone]
                movers = [c for c in movers if id(c) not in gone]
                leaving = [c for c in leaving if id(c) not in gone]
                for c in stuck:
                    keep.append(c)
                    if c.model is not None:
                        freed[c.model] -= c.gpus
        leaving = movers + leaving
        moving = {c.job.id for c in leaving if assignment.get(c.job.id) is not None}
        for c in leaving:
            target = assignment.get(c.job.id)
            if target is not None:
                to_start.append(c)
            why = (
                f"moved from {c.model} to {target} (about "
                f"{fmt_h(c.rem.get(c.model or '', math.nan))} "
                f"left there, {fmt_h(c.rem[target])} on {target})"
                if target is not None
                else "preempted for shorter jobs (its key "
                f"{fmt_h(c.key)}; remaining about {fmt_h(c.best)})"
            )
            self._requeue(c, why, actions, free, gpu_jobs)
        # Jobs that wait (chosen but not placed) must not cause preemptions above; a freed GPU
        # with nothing to start is re-filled below by the next jobs in key order.
        for c in pending:
            if c.job.id in chosen_ids:
                to_start.append(c)
        # Per size: jobs over the cap first, then jobs that left their GPUs to move, then
        # the waiting ones, each in rank order.
        to_start.sort(key=lambda c: (-c.gpus, c.key >= 0, c.freed is None, rank(c)))
        cores = dict(free_cores)
        started: set[str] = set()
        hosts: list[tuple[Cand, Placement]] = []  # jobs on their GPUs after the plan
        for c in keep:
            c.placed_model = c.model
            if c.running is not None:
                hosts.append((c, c.running.placement))
        kept_hosts = len(hosts)  # the fixed jobs come next in host order (fixed_hosts)
        for c in to_start:
            m = assignment[c.job.id]
            pl = self._place(c, m, free[m], cores)
            if pl is None:
                if free[m].best_fit(c.gpus, lambda node: True) is not None:
                    waiting[c.job.id] = (
                        f"{c.gpus} GPU(s) of {m} chosen for it (key {fmt_h(c.key)}) are free, "
                        f"but not {max(1, c.job.cpus)} cores beside them"
                    )
                else:
                    waiting[c.job.id] = (
                        f"{c.gpus} GPU(s) of {m} chosen for it (key {fmt_h(c.key)}) are not "
                        "free together on few enough nodes yet"
                    )
                continue
            decisions.append(self._decision(c, pl, m, "shortest predicted remaining time first"))
            c.placed_model = m
            started.add(c.job.id)
            hosts.append((c, pl))
        # Work conserving: idle GPUs take the next jobs in key order (guests first in order),
        # jobs chosen above whose model had no room for them included (on another model).
        rest = [c for c in pending if c.job.id not in started]
        rest += [c for c in to_start if c.job.id in moving and c.job.id not in started]
        rest += [g for g in guests if not g.pinned]
        rest.sort(key=lambda c: (c.key, c.job.arrival_s, c.job.id))
        # (model, GPUs) -> the fewest cores a placement found no node for: GPUs and cores
        # only get fewer as this loop places jobs, so a job asking as many fails too.
        nofit: dict[tuple[str, int], float] = {}
        if any(f.total() for f in free.values()):
            for c in rest:
                rem = c.rem
                options = [m for m in sorted(rem, key=rem.__getitem__) if free[m].total() >= c.gpus]
                if not options:
                    continue
                pl = None
                if c.running is None:  # the fastest model with room that also has the cores
                    need = max(1, c.job.cpus)
                    if c.freed is not None:
                        nofit.clear()  # its old cores came back: anything may fit again
                    for m in options:
                        if nofit.get((m, c.gpus), _INF) <= need:
                            continue  # as many GPUs with as many cores failed already
                        if (pl := self._place(c, m, free[m], cores)) is not None:
                            break
                        nofit[(m, c.gpus)] = min(need, nofit.get((m, c.gpus), _INF))
                else:
                    m = options[0]
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
                    nofit.clear()  # what it leaves may fit others again
                    pl = self._place(c, m, free[m], cores)
                if pl is None:
                    continue
                decisions.append(self._decision(c, pl, m, "an idle GPU, next in key order"))
                c.placed_model = m
                started.add(c.job.id)
                waiting.pop(c.job.id, None)
                hosts.append((c, pl))
                if not any(f.total() for f in free.values()):
                    break
        # 6. Pairs.
        if self.pack:
            pack_waiting(
                pending,
                started,
                waiting,
                hosts,
                gpu_jobs,
                specs,
                cores,
                decisions,
                pair_norms=self._pair_norms,
                shared={key for key in multi if len(gpu_jobs[key]) > 1},  # requeues only remove
                fixed=(kept_hosts, fixed_hosts),
                threshold=self.pack_threshold,
                policy=self.name,
                basis=self._pack_basis(),
            )
        for c in pending:
            if c.job.id in started or c.job.id in waiting:
                continue
            waiting[c.job.id] = (
                f"queued by shortest predicted remaining time: key {fmt_h(c.key)} "
                f"(about {fmt_h(c.best)} left on its fastest model); shorter or older jobs "
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
            # The specs of the jobs placed by this plan (fixed jobs are never placed).
            decided = {d.placement.job_id for d in decisions}
            specs_by_id = {
                c.job.id: c.job
                for group in (pending, running, guests)
                for c in group
                if c.job.id in decided
            }
            placed_now = tuple(
                RunningJob(specs_by_id[d.placement.job_id], d.placement, now, 0.0)
                for d in decisions
                if d.placement.job_id in specs_by_id
            )
            rest_state = ClusterState(
                now_s=now,
                nodes=residual_nodes(state, requeued, decisions),
                pending=tuple(sorted(others, key=lambda j: (j.arrival_s, j.id))),
                running=tuple([r for r in state.running if r.job.id not in requeued]) + placed_now,
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
        free: dict[str, FreeGpus],
        free_cores: Mapping[str, int],
        node_model: Mapping[str, str],
        models: Sequence[str],
        unknown_left: Callable[[RunningJob], float] | None = None,
    ) -> Plan | None:
        """The plan when the idle GPUs hold every pending job (None: they do not).
        ``unknown_left``: for a running job of unknown length, its estimated remaining time
        as a fraction of its profile's (nominal) times; None: such jobs do not move."""
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
            self._fast_moves(
                state, free, cores, node_model, decisions, actions, gpu_jobs, unknown_left
            )
        self._last_idle = {m: f.total() for m, f in free.items()}
        return Plan(decisions=tuple(decisions), actions=tuple(actions), waiting={})

    def _fast_moves(
        self,
        state: ClusterState,
        free: dict[str, FreeGpus],
        cores: dict[str, int],
        node_model: Mapping[str, str],
        decisions: list[Decision],
        actions: list[Action],
        gpu_jobs: dict[tuple[str, int], tuple[str, ...]],
        unknown_left: Callable[[RunningJob], float] | None = None,
    ) -> None:
        """Running jobs move to idle GPUs of a faster model when that saves more than the move
        cost plus ``preempt_margin`` of their remaining time (largest saving first). A job of
        unknown length moves by its profile's relative speeds and ``unknown_left``."""
        room = {m for m, f in free.items() if f.total() > 0}
        movers: list[tuple[float, str, RunningJob, str, float]] = []
        faster_cache = self._faster
        for rj in state.running:
            pl = rj.placement
            # Models faster than the one it is on (cached per job while it stays on its node).
            hit = faster_cache.get(rj.job.id)
            if hit is not None and hit[0] == pl.node:
                faster = hit[1]
            else:
                faster = self._faster_models(rj, node_model)
                faster_cache[rj.job.id] = (pl.node, faster)
            if not faster or room.isdisjoint(faster):
                continue
            if (
                rj.paused
                or pl.is_gang
                or not pl.gpu_indices
                or rj.job.profile is None
                or (not rj.job.length_known and unknown_left is None)
            ):
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
            left = (
                remaining_fraction(rj.progress)
                if rj.job.length_known or unknown_left is None
                else unknown_left(rj)
            )
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
                movers.append((best_gain, rj.job.id, rj, best_m, left))
        movers.sort(key=lambda x: (-x[0], x[1]))
        del movers[self._churn_allowance(len(state.running)) :]  # churn budget
        for _, _, rj, m, left in movers:
            need_cores = max(1, rj.job.cpus)
            back = {p.node: p.cpus for p in rj.placement.parts}

            def ok(node: str, need_cores: int = need_cores, back: dict = back) -> bool:
                return cores.get(node, 0) + back.get(node, 0) >= need_cores

            if free[m].best_fit(max(1, rj.job.gpus), ok) is None:
                continue
            times = rj.job.profile.gpu_time_s if rj.job.profile is not None else {}
            c = Cand(
                rj.job,
                {mm: left * t for mm in (m, node_model[rj.placement.node]) if (t := times.get(mm))},
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
                f"moved from {c.model} to {m}: about {fmt_h(c.rem.get(c.model or '', math.nan))} "
                f"left there, {fmt_h(c.rem[m])} on {m}",
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

    def _pinned(
        self, job: JobSpec, models: Collection[str], solos: dict[int, float | None]
    ) -> bool:
        """Whether a running job keeps its GPUs against other jobs (it may still move to an
        idle, faster GPU): after ``max_preemptions`` preemptions, or once the restart time
        they cost (``preemption_cost_s`` each) reaches ``max_restart_share`` of its estimated
        run time on its fastest model, so restarts slow it by about that share at most."""
        n = self.preempted(job)
        if n == 0 and self.max_preemptions > 0:
            return False
        return self._pinned_after(n, self._fastest_solo(job, models, solos))

    def _pinned_after(self, n: int, solo: float | None) -> bool:
        """``_pinned`` for a job preempted ``n`` times whose fastest time is ``solo``."""
        if n >= self.max_preemptions:
            return True
        if n == 0 or self.restart_share <= 0 or solo is None:
            return False
        return n * self.cost_s >= self.restart_share * solo

    def _fastest_solo(
        self, job: JobSpec, models: Collection[str], solos: dict[int, float | None]
    ) -> float | None:
        """The job's profiled time on its fastest model of ``models`` (consolidated), cached
        per profile object in ``solos`` within a cycle."""
        prof = job.profile
        if prof is None:
            return None
        pid = id(prof)
        if pid in solos:
            return solos[pid]
        times = [t for m, t in prof.gpu_time_s.items() if t > 0 and m in models]
        solo = solos[pid] = min(times) if times else None
        return solo

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
        free: dict[str, FreeGpus],
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

    def _place(
        self, c: Cand, model: str, gpus: FreeGpus, cores: dict[str, int]
    ) -> Placement | None:
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
            and may_pack(c.job)  # else a GPU of its own: nobody joins it
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
            f"{why}: key {fmt_h(c.key)}, about {fmt_h(there)} left on {model}{spread}"
            f"{vs}; placed on {where}"
        )
        if c.note:
            text += f"; {c.note}"
        own = c.job.whole_gpu_reason()
        if own is not None and self.pack:
            text += f"; whole GPUs of its own: {own}"
        return Decision(pl, self.name, text, score=c.key)

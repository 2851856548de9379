"""The common machinery of the peer policies (``tiresias``, ``gavel_*``, ``allox``, ``themis``).

Each peer (docs/policies.md, "Peers") decides *who* should run and on *which GPU model*; this
module turns that wish into a plan with the same consolidation and packing rules as every
framework policy, so the comparison measures the policies' decisions, not their placement code:

1. ``account`` (every call): the attained service of each job (GPU-seconds), the seconds it ran
   on each GPU model, its last reported progress and the length of its last uninterrupted run,
   integrated between calls from the snapshots (the policy object's only state).
2. ``wants`` (the subclass): every job that may run, best first, each with the GPU models it
   may take in order of preference (None: any model it may use, its current one first) and a
   reason. Running jobs the subclass keeps in place come first with ``keep`` set.
3. ``realise``: admits the wants in order while the cluster has GPUs of a wanted model (counts
   per model; a running job is admitted on its current model when it is among its choices). At
   a *decision point* (``round_s`` elapsed since the last one, or every call with
   ``round_s`` 0) running jobs that were not admitted are preempted (``REQUEUE``: the job keeps
   its progress) lowest first, and only as many as the admitted waiting jobs need GPUs of their
   model beyond the idle ones; a running job admitted on another model moves (``REQUEUE`` and a
   new placement). Between decision points nobody is preempted and waiting jobs only fill idle
   GPUs. Only jobs that own their GPUs (EXCLUSIVE) are ever preempted.
4. The framework's serial cycle (``FrameworkPolicy``) places the admitted jobs, each on its
   admitted model, then the others on what is left (work conserving): one node where one node
   holds the job, else a gang over the fewest nodes, exclusive GPUs (no packing: the peers as
   written here never read a pair estimate, so they never share a GPU). Every waiting job's
   reason starts with the policy's own reason (its queue, priority or bid) and ends with the
   framework's (what is missing).

Estimates (``solo_time``): ``state.knowledge.solo_time(job, model)`` when the snapshot carries
knowledge, else the job's profile (its solo time per model), else its time limit, else None
(the peers that need a length then assume ``DEFAULT_WORK_S`` on every model). Never the
simulator's truth.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from scheduler.domain import (
    Action,
    ActionKind,
    ClusterState,
    Decision,
    GpuState,
    JobSpec,
    NodeKind,
    NodeState,
    Plan,
    RunningJob,
    SharingMode,
)
from scheduler.policies.base import PolicyError
from scheduler.policies.framework import FrameworkPolicy, WorkingView, framework_defaults

#: Seconds of work the peers assume on every model for a job nothing estimates (no profile
#: time, no time limit, no knowledge).
DEFAULT_WORK_S = 3600.0

peer_defaults: dict[str, Any] = {**framework_defaults, "round_s": 360.0}


@dataclass(slots=True)
class Want:
    """One job a peer would like to run, in the peer's order."""

    job: JobSpec
    models: tuple[str, ...] | None  # preference order; None: any usable, current first
    why: str
    running: RunningJob | None = None
    keep: bool = False  # running, stays where it is whatever the order
    fill: bool = True  # waiting and not admitted: may still take GPUs left idle (else waits)


@dataclass(slots=True)
class Cluster:
    """Per call: the up GPUs per model, the idle ones, and each running job's model."""

    counts: dict[str, int]
    idle: dict[str, int]
    memory: dict[str, float]  # model -> memory of one GPU (MB), the largest spec of the name
    order: list[str]  # models in cluster order
    model_of: dict[str, str]  # running job id -> model of its first GPU
    exclusive: set[str]  # running job ids that own their GPUs (may be preempted)


def cluster_of(state: ClusterState) -> Cluster:
    counts: dict[str, int] = {}
    idle: dict[str, int] = {}
    memory: dict[str, float] = {}
    order: list[str] = []
    where: dict[tuple[str, int], GpuState] = {}
    for node in state.nodes:
        if node.kind != NodeKind.GPU:
            continue
        for g in node.gpus:
            where[(node.name, g.index)] = g
            if not node.up:
                continue
            m = g.spec.model
            if m not in counts:
                order.append(m)
                counts[m] = idle[m] = 0
            counts[m] += 1
            memory[m] = max(memory.get(m, 0.0), float(g.spec.memory_mb))
            if not g.job_ids and g.mig_slices_used == 0:
                idle[m] += 1
    model_of: dict[str, str] = {}
    exclusive: set[str] = set()
    for r in state.running:
        pl = r.placement
        if not pl.gpu_indices:
            continue
        first = where.get((pl.node, pl.gpu_indices[0]))
        if first is None:
            continue
        model_of[r.job.id] = first.spec.model
        if pl.mode == SharingMode.EXCLUSIVE and all(
            (k in where and where[k].job_ids == (r.job.id,)) for k in pl.gpu_keys
        ):
            exclusive.add(r.job.id)
    return Cluster(counts, idle, memory, order, model_of, exclusive)


class PeerPolicy(FrameworkPolicy):
    """Base of the peers: accounting, wants -> admission -> preemption -> framework placement.

    Parameters (besides the framework's): ``round_s`` (360): seconds between decision points
    (preemptions and moves happen only there; the policy also asks the simulator for a call
    every ``round_s``: ``tick_interval_s``); 0: every call is a decision point.
    """

    colocate: ClassVar[bool] = False
    defaults: ClassVar[dict[str, Any]] = peer_defaults

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        r = self.params.get("round_s", 0.0)
        if not isinstance(r, int | float) or isinstance(r, bool) or not 0 <= r < math.inf:
            raise PolicyError(f"policy {self.name!r}: round_s must be a number >= 0, got {r!r}")
        self.round_s = float(r)
        self.attained: dict[str, float] = {}  # job id -> GPU-seconds received
        self.model_s: dict[str, dict[str, float]] = {}  # job id -> model -> seconds run there
        self.progress: dict[str, float] = {}  # job id -> last reported progress
        self.run_since: dict[str, float] = {}  # running job id -> start of its current run
        self.last_run_s: dict[str, float] = {}  # job id -> length of its last finished run
        self.stopped_s: dict[str, float] = {}  # job id -> when its last run ended
        self._last_now: float | None = None
        self._last_round = -math.inf
        self._target: dict[str, frozenset[str]] = {}

    @property
    def tick_interval_s(self) -> float | None:
        """The simulator calls the policy at least this often (decision points)."""
        return self.round_s or None

    # -- accounting ------------------------------------------------------------------------

    def account(self, state: ClusterState, cl: Cluster) -> None:
        """Integrate attained service and per-model time since the last call."""
        now = state.now_s
        last = self._last_now
        seen: set[str] = set()
        for r in state.running:
            jid = r.job.id
            seen.add(jid)
            begin = r.started_s if last is None else max(last, r.started_s)
            dt = max(0.0, now - begin)
            if dt > 0:
                self.attained[jid] = self.attained.get(jid, 0.0) + dt * max(1, r.job.gpus)
                m = cl.model_of.get(jid)
                if m is not None:
                    per = self.model_s.setdefault(jid, {})
                    per[m] = per.get(m, 0.0) + dt
            self.progress[jid] = r.progress
            if jid not in self.run_since or (last is not None and r.started_s > last):
                self.run_since[jid] = r.started_s
        for jid in [j for j in self.run_since if j not in seen]:
            began = self.run_since.pop(jid)
            self.last_run_s[jid] = max(0.0, (last if last is not None else now) - began)
            self.stopped_s[jid] = last if last is not None else now
        present = seen | {j.id for j in state.pending}
        if len(self.attained) > 2 * len(present) + 64:  # forget finished jobs
            for d in (self.attained, self.model_s, self.progress, self.last_run_s, self.stopped_s):
                for jid in [j for j in d if j not in present]:
                    del d[jid]
        self._last_now = now

    # -- estimates -------------------------------------------------------------------------

    def solo_time(self, state: ClusterState, job: JobSpec, model: str) -> float | None:
        """Estimated whole run time of ``job`` alone on ``model`` (see the module doc)."""
        if state.knowledge is not None:
            est = state.knowledge.solo_time(job, model)
            if est is not None and est.value > 0 and math.isfinite(est.value):
                return est.value
        t = job.run_time_s(model)
        if t is not None and 0 < t < math.inf:
            return t
        return job.time_limit_s

    def usable_models(self, job: JobSpec, cl: Cluster) -> list[str]:
        """Models of the cluster ``job`` may use (memory, profiled models), cluster order."""
        allowed = FrameworkPolicy.allowed_models(self, job)
        need = job.memory_need_mb()
        return [
            m
            for m in cl.order
            if cl.memory[m] >= need and (allowed is None or m in allowed) and cl.counts[m] > 0
        ]

    def remaining_fraction(self, job: JobSpec, running: RunningJob | None) -> float:
        p = running.progress if running is not None else self.progress.get(job.id, 0.0)
        return 0.25 if p >= 1.0 else max(0.0, 1.0 - p)

    # -- the subclass ----------------------------------------------------------------------

    def wants(
        self, state: ClusterState, cl: Cluster, decision_point: bool
    ) -> tuple[list[Want], dict[str, str]]:
        """(the jobs to run in order, reasons for jobs left out of the order)."""
        raise NotImplementedError

    # -- the cycle -------------------------------------------------------------------------

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        cl = cluster_of(state)
        self.account(state, cl)
        due = self.round_s <= 0 or state.now_s - self._last_round >= self.round_s - 1e-9
        if not state.pending and not due:
            return Plan()
        if due:
            self._last_round = state.now_s
        wants, left_out = self.wants(state, cl, due)
        return self.realise(state, cl, wants, left_out, due, rng)

    def realise(
        self,
        state: ClusterState,
        cl: Cluster,
        wants: Sequence[Want],
        left_out: dict[str, str],
        preempt: bool,
        rng: random.Random,
    ) -> Plan:
        cap = dict(cl.counts)
        running = {r.job.id: r for r in state.running}
        pending_ids = {j.id for j in state.pending}
        target: dict[str, str] = {}
        why: dict[str, str] = {}
        admitted: list[Want] = []
        rest: list[Want] = []
        kept: set[str] = set()
        # Without preemption every running job stays: its GPUs are spoken for.
        for r in state.running:
            m = cl.model_of.get(r.job.id)
            if m is None:
                continue
            if not preempt or r.job.id not in cl.exclusive:
                cap[m] -= max(1, r.job.gpus)
                kept.add(r.job.id)
        for w in wants:
            if w.keep and w.running is not None and w.job.id not in kept:
                m = cl.model_of.get(w.job.id)
                if m is not None:
                    cap[m] -= max(1, w.job.gpus)
                    kept.add(w.job.id)
        for w in wants:
            jid = w.job.id
            why[jid] = w.why
            if jid in kept or w.job.gpus <= 0:
                continue
            current = cl.model_of.get(jid) if w.running is not None else None
            if w.models is None:
                prefs = self.usable_models(w.job, cl)
                if current in prefs:
                    prefs.remove(current)
                    prefs.insert(0, current)
            else:
                prefs = [m for m in w.models if m in cap]
            k = max(1, w.job.gpus)
            for m in prefs:
                if cap[m] >= k:
                    cap[m] -= k
                    target[jid] = m
                    admitted.append(w)
                    break
            else:
                rest.append(w)
        requeue: dict[str, str] = {}
        movers: list[Want] = []
        if preempt:
            idle = dict(cl.idle)
            demand: dict[str, int] = {}
            for w in admitted:
                jid = w.job.id
                m = target[jid]
                if jid in running:
                    cur = cl.model_of.get(jid)
                    if cur == m:
                        continue
                    if cur is not None:
                        idle[cur] = idle.get(cur, 0) + max(1, w.job.gpus)
                    movers.append(w)
                    requeue[jid] = f"moves to {m}: {w.why}"
                demand[m] = demand.get(m, 0) + max(1, w.job.gpus)
            short = {m: demand[m] - idle.get(m, 0) for m in demand}
            admitted_ids = {w.job.id for w in admitted} | kept
            order_pos = {w.job.id: i for i, w in enumerate(wants)}
            victims = [
                r
                for r in state.running
                if r.job.id in cl.exclusive
                and r.job.id not in admitted_ids
                and short.get(cl.model_of.get(r.job.id, ""), 0) > 0
            ]
            victims.sort(key=lambda r: (-order_pos.get(r.job.id, len(wants)), r.job.id))
            for r in victims:
                m = cl.model_of[r.job.id]
                if short[m] <= 0:
                    continue
                short[m] -= max(1, r.job.gpus)
                requeue[r.job.id] = (
                    f"preempted for a job of higher priority on {m}: {why.get(r.job.id, '')}"
                ).rstrip(": ")
        # The snapshot the framework places into: requeued jobs' GPUs freed.
        reduced = self._without(state, requeue) if requeue else state
        by_id = {j.id: j for j in state.pending}
        # Jobs no GPU model can take go first: they fail at once with the precise reason
        # (memory, GPU count) and take nothing from the others.
        order: list[JobSpec] = [
            j for j in state.pending if j.gpus > 0 and not self.usable_models(j, cl)
        ]
        placed_ids: set[str] = {j.id for j in order}
        for w in admitted:
            jid = w.job.id
            if jid in pending_ids or jid in {m.job.id for m in movers}:
                order.append(by_id.get(jid, w.job))
                placed_ids.add(jid)
        held_back: dict[str, str] = {}
        for w in rest:
            if w.job.id in pending_ids and w.job.id not in placed_ids:
                if not w.fill:
                    held_back[w.job.id] = w.why
                    continue
                order.append(by_id[w.job.id])
                placed_ids.add(w.job.id)
        order.extend(j for j in state.pending if j.id not in placed_ids | set(held_back))
        self._target = {jid: frozenset((m,)) for jid, m in target.items()}
        sub = replace(reduced, pending=tuple(order))
        inner = FrameworkPolicy.schedule(self, sub, rng)
        self._target = {}
        actions = tuple(
            Action(ActionKind.REQUEUE, jid, self.name, f"{self.name}: {text}")
            for jid, text in requeue.items()
        )
        decisions = tuple(
            Decision(d.placement, d.policy, self._prefix(why, d.placement.job_id, d.explanation))
            for d in inner.decisions
        )
        waiting = {
            jid: self._prefix(why, jid, text, left_out.get(jid))
            for jid, text in inner.waiting.items()
        }
        if held_back:
            view = self._view
            if view is None:
                view = self._view = WorkingView(sub, colocate=self.colocate)
            elif not sub.pending:
                view.refresh(sub)
            for jid, text in held_back.items():
                job = by_id[jid]
                if job.gpus > 1 and not self.one_node_holds(job, view):
                    if self.candidates(job, view):
                        text = (
                            f"{text}; a gang: needs {job.gpus} GPUs at once on several nodes "
                            f"(no node holds {job.gpus})"
                        )
                    else:
                        text = f"{text}; {self.gang_wait_reason(job, view)}"
                waiting[jid] = f"{self.name}: {text}"
        return Plan(decisions=decisions, actions=actions, waiting=waiting)

    def _prefix(self, why: dict[str, str], jid: str, text: str, other: str | None = None) -> str:
        own = why.get(jid) or other
        return f"{self.name}: {own}; {text}" if own else f"{self.name}: {text}"

    @staticmethod
    def _without(state: ClusterState, gone: dict[str, str]) -> ClusterState:
        """``state`` with the (exclusive) jobs ``gone`` taken off their GPUs and cores."""
        cores: dict[str, int] = {}
        touched: set[str] = set()
        for r in state.running:
            if r.job.id in gone:
                for part in r.placement.parts:
                    cores[part.node] = cores.get(part.node, 0) + part.cpus
                    touched.add(part.node)
        nodes: list[NodeState] = []
        for n in state.nodes:
            if n.name not in touched:
                nodes.append(n)
                continue
            gpus = tuple(
                replace(
                    g,
                    mode=None,
                    job_ids=(),
                    committed_memory_mb=0.0,
                    used_memory_mb=None,
                    util_pct=None,
                )
                if g.job_ids and all(j in gone for j in g.job_ids)
                else g
                for g in n.gpus
            )
            free = min(n.cores, n.free_cores + cores.get(n.name, 0)) if n.cores > 0 else 0
            nodes.append(replace(n, gpus=gpus, free_cores=free))
        running = tuple(r for r in state.running if r.job.id not in gone)
        return replace(state, nodes=tuple(nodes), running=running)

    def allowed_models(self, job: JobSpec) -> frozenset[str] | None:
        t = self._target.get(job.id)
        if t is not None:
            return t
        return super().allowed_models(job)

    def explain(self, job: JobSpec, chosen: Any, cands: list[Any], view: Any) -> str:
        where = self.placement_text(job, chosen)
        if not chosen.gpus:
            return f"placed {where}: first CPU node in order with {job.cpus} free cores"
        n = len(chosen.gpus)
        what = f"{n} whole idle {chosen.gpus[0].spec.model}" if n > 1 else "an idle GPU"
        return (
            f"placed {where}: {what} of the model it was given, first fit in cluster order "
            f"({len(cands)} candidates); {self.fit_text(job, chosen)}"
        )

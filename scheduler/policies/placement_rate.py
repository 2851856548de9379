"""``placement_rate``: profile-driven CPU-vs-GPU node choice of seed 004 (ALGORITHMS.md §1).

Every cycle the whole waiting queue is ranked by the GPU placement rate of eq. (2)::

    rate_i = sum_k C_k * f_k(i) / sum_j |f_k(j)|        (j over the n waiting jobs)

Each feature ``f_k`` is normalised by its sum over the queue (absolute values, so a feature that
can be negative does not flip the scale) and weighted by ``C_k`` (parameter ``features``). The
highest-rated jobs go to GPU nodes while the GPU capacity lasts, the rest to CPU nodes, so both
node kinds work at once ("overlapping").

**Reading chosen for what the paper leaves open** (also in docs/seed004.md):

- Sides: a job asking for no GPU goes to CPU nodes; a 1-GPU job with a CPU time and a GPU
  time for a model in the cluster can go either way; any other GPU job stays on GPUs (a job
  without profiled GPU times may use any GPU, as in the framework's filter).
- Features (per job, from its profile; GPU time on the fastest profiled GPU model present in the
  cluster): ``time_saved`` = CPU time - GPU time (s), ``speedup`` = CPU time / GPU time,
  ``gpu_memory`` = GPU memory asked or profiled (MB), ``gpu_time``, ``cpu_time`` (s),
  ``priority`` = 1 + max(priority, 0) (our reading of the paper's job term ``C_0 j_i``; weight 0
  by default, the paper's jobs have none) and ``waited`` = seconds in the queue. A job without a
  CPU or GPU time has 0 for the features that need it (it can only go to one side anyway).
- Default weights ``{"time_saved": 3.0, "speedup": 1.0, "gpu_memory": -0.1}``: time saved is
  what a GPU slot buys the workload, speedup how well the job uses it; memory enters with a small
  negative weight (more memory means a shared GPU costs more). With them the paper's five
  applications rank as published: CNN > LAMMPS > GROMACS > BlackScholes > Binomial (the
  absolute values differ from the paper's 0.53-0.61: its normalisation is not given).
- **GPU capacity** (how many of the ranked queue the GPU side takes): the split point ``k`` that
  minimises the predicted time until both sides are done. Each side is predicted as a list
  schedule of its jobs, in rank order, on its slots: a GPU has ``max_jobs_per_gpu`` container
  slots (1 for an exclusive GPU), a CPU node one slot per core; a slot is free when the job in
  it ends. A job's predicted time on a GPU slot is its GPU time times ``gpu_share_slowdown``
  (None: the number of slots per GPU, i.e. a full GPU time-slices among its containers), on a CPU
  slot its CPU time; running jobs hold their slots for their predicted remaining time. Among
  equally short splits the one with the smallest sum of predicted completion times wins (a job
  that would only fill the GPU side's slack goes where it finishes sooner), then the one with
  more jobs on the GPU. Jobs that can only run on one side are always on that side.

The split is recomputed every cycle from the snapshot (the policy keeps no state between calls),
so a job can change side while it waits. GPU placement uses the framework's filter (co-location
up to ``max_jobs_per_gpu`` on shared GPUs, memory by the jobs' declared needs) plus one more
check: the GPU's memory in use now plus what the job takes at its start fit the GPU (the
simulator and a real GPU refuse anything else). Among the GPUs that fit, the job's fastest
profiled model wins, then cluster order; but a one-GPU job joins residents only when no GPU
it may use is idle (an idle GPU of a slower model beats sharing a faster one: the paper's
container slots are for when the GPUs are full, and a packed GPU beside an idle one is what an
operator reads as a scheduling fault). Jobs sent to CPU nodes need ``job.cpus`` free cores and
a profiled CPU time.

Parameters (besides the framework's, see ``scheduler.policies.framework``):

- ``features`` (mapping feature -> weight, default above).
- ``gpu_share_slowdown`` (float or None, None): see the capacity rule.
- ``exact_split_limit`` (int, 200): with more flexible jobs than this in the queue the CPU
  side is predicted by its lower bound (longest job, or total work / slots) instead of a list
  schedule per split, to keep a cycle cheap.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from scheduler.domain import ClusterState, JobSpec, NodeKind, Plan, SharingMode
from scheduler.policies.base import PolicyError
from scheduler.policies.framework import (
    Candidate,
    FrameworkPolicy,
    WorkingView,
    framework_defaults,
)
from scheduler.policies.memory_steps import memory_at

DEFAULT_FEATURES: dict[str, float] = {"time_saved": 3.0, "speedup": 1.0, "gpu_memory": -0.1}
FEATURES = ("time_saved", "speedup", "gpu_memory", "gpu_time", "cpu_time", "priority", "waited")
_MEM_TOL_MB = 1e-3


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st..."""
    if 10 <= n % 100 <= 20:
        return f"{n}th"
    return f"{n}{ {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th') }"


@dataclass(frozen=True, slots=True)
class JobTimes:
    """What the rate and the split need to know of one job."""

    gpu_s: float | None  # on the fastest profiled GPU model present in the cluster
    gpu_model: str | None
    cpu_s: float | None
    can_gpu: bool
    can_cpu: bool


def job_times(
    job: JobSpec, gpu_models: frozenset[str], has_cpu_nodes: bool, gpu_node_cores: bool = False
) -> JobTimes:
    """GPU and CPU time of ``job`` in this cluster, and which sides it can run on
    (``gpu_node_cores``: a job asking for no GPU may also use a GPU node's spare cores)."""
    best: tuple[float, str] | None = None
    if job.profile is not None:
        for model, t in sorted(job.profile.gpu_time_s.items()):
            ok = model in gpu_models and t is not None and 0 < t < math.inf
            if ok and (best is None or t < best[0]):
                best = (t, model)
    cpu = job.profile.cpu_time_s if job.profile is not None else None
    cpu = cpu if cpu is not None and 0 < cpu < math.inf else None
    # A profile without GPU times says nothing against any GPU (as in the framework's filter).
    unprofiled = job.profile is None or not job.profile.gpu_time_s
    can_gpu = job.gpus >= 1 and (best is not None or unprofiled)
    # A GPU job goes to a CPU node only when it allows it (``allow_cpu``: ``device: auto``);
    # a CPU job may also use a GPU node's spare cores.
    can_cpu = (
        has_cpu_nodes and (job.gpus == 0 or (cpu is not None and job.gpus == 1 and job.allow_cpu))
    ) or (gpu_node_cores and job.gpus == 0)
    return JobTimes(best[0] if best else None, best[1] if best else None, cpu, can_gpu, can_cpu)


def feature_value(name: str, job: JobSpec, times: JobTimes, now_s: float) -> float:
    """The raw value of feature ``name`` for ``job`` (see the module docstring)."""
    g, c = times.gpu_s, times.cpu_s
    if name == "time_saved":
        return c - g if g is not None and c is not None else 0.0
    if name == "speedup":
        return c / g if g is not None and c is not None else 0.0
    if name == "gpu_memory":
        return job.memory_need_mb()
    if name == "gpu_time":
        return g or 0.0
    if name == "cpu_time":
        return c or 0.0
    if name == "priority":
        return 1.0 + max(job.priority, 0)
    if name == "waited":
        return max(0.0, now_s - job.arrival_s)
    raise PolicyError(f"unknown rate feature {name!r}; known: {', '.join(FEATURES)}")


def placement_rates(
    jobs: Sequence[JobSpec],
    times: Sequence[JobTimes],
    features: Mapping[str, float],
    now_s: float = 0.0,
) -> list[float]:
    """Eq. (2) for every job of ``jobs``: weighted features, each normalised over ``jobs``."""
    rates = [0.0] * len(jobs)
    for name, weight in features.items():
        if not weight:
            continue
        values = [feature_value(name, j, t, now_s) for j, t in zip(jobs, times, strict=True)]
        total = sum(abs(v) for v in values)
        if total <= 0:
            continue
        for i, v in enumerate(values):
            rates[i] += weight * v / total
    return rates


def check_features(policy: str, features: Any) -> dict[str, float]:
    if not isinstance(features, Mapping) or not features:
        raise PolicyError(
            f"policy {policy!r}: features must be a non-empty mapping "
            f"feature -> weight; known features: {', '.join(FEATURES)}"
        )
    unknown = set(features) - set(FEATURES)
    if unknown:
        raise PolicyError(
            f"policy {policy!r}: unknown rate feature(s) "
            f"{', '.join(sorted(unknown))}; known: {', '.join(FEATURES)}"
        )
    try:
        return {k: float(v) for k, v in features.items()}
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"policy {policy!r}: feature weights must be numbers") from exc


class UsedMemoryGuard(FrameworkPolicy):
    """Adds to the framework's filter: the GPU's memory in use now (``GpuState.used_memory_mb``,
    monitored or simulated) plus what the job takes at its start must fit the GPU. The
    framework checks declared needs only; a job that outgrew its declaration (LAMMPS in 004)
    makes the two differ."""

    def begin_cycle(self, state: ClusterState, view: WorkingView) -> None:
        self._used: dict[tuple[str, int], float] = {}
        for node in state.nodes:
            for gpu in node.gpus:
                if gpu.used_memory_mb is not None:
                    self._used[gpu.key] = gpu.used_memory_mb

    def start_memory(self, job: JobSpec) -> float:
        return memory_at(job, 0.0)

    def keep(self, job: JobSpec, cand: Candidate, view: WorkingView) -> bool:
        if not cand.gpus or cand.mig_profile is not None:
            return True
        need = self.start_memory(job)
        return all(
            self._used.get((g.node.name, g.index), 0.0) + need <= g.spec.memory_mb + _MEM_TOL_MB
            for g in cand.gpus
        )

    def pick(
        self, job: JobSpec, cands: list[Candidate], view: WorkingView, rng: random.Random
    ) -> Candidate | None:
        chosen = super().pick(job, cands, view, rng)
        if chosen is not None:
            need = self.start_memory(job)
            for g in chosen.gpus:
                key = (g.node.name, g.index)
                self._used[key] = self._used.get(key, 0.0) + need
        return chosen


@dataclass
class _Cycle:
    """What one cycle decided before placing: ranks, sides and the predicted split."""

    n: int = 0
    rate: dict[str, float] = field(default_factory=dict)
    position: dict[str, int] = field(default_factory=dict)  # 1-based rank
    side: dict[str, str | None] = field(default_factory=dict)  # "gpu", "cpu" or None
    times: dict[str, JobTimes] = field(default_factory=dict)
    gpu_capacity: int = 0  # waiting jobs given to the GPU side
    gpu_finish_s: float = 0.0  # predicted, from now
    cpu_finish_s: float = 0.0
    order: list[JobSpec] = field(default_factory=list)


def c_dur_all(jobs: Sequence[JobSpec], cycle: _Cycle) -> list[float]:
    return [cycle.times[j.id].cpu_s or 0.0 for j in jobs]


def _list_schedule(
    slots: list[float], durations: Sequence[float]
) -> tuple[float, list[float], float]:
    """Each duration, in order, on the slot free first: (finish of the last, final slots, sum
    of the completion times)."""
    heap = list(slots)
    heapq.heapify(heap)
    done = 0.0
    for d in durations:
        t = heapq.heappop(heap)
        heapq.heappush(heap, t + d)
        done += t + d
    return (max(heap) if heap else 0.0), heap, done


class PlacementRatePolicy(UsedMemoryGuard):
    name: ClassVar[str] = "placement_rate"
    defaults: ClassVar[dict[str, Any]] = {
        **framework_defaults,
        "features": dict(DEFAULT_FEATURES),
        "gpu_share_slowdown": None,
        "exact_split_limit": 200,
    }
    colocate: ClassVar[bool] = True
    scorers: ClassVar[tuple[str, ...]] = ("speed",)

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.features = check_features(self.name, self.params["features"])
        slow = self.params["gpu_share_slowdown"]
        if slow is not None and not (isinstance(slow, int | float) and slow > 0):
            raise PolicyError(f"policy {self.name!r}: gpu_share_slowdown must be > 0 or None")
        self._cycle = _Cycle()

    # -- the cycle -----------------------------------------------------------------------------

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        plan = super().schedule(state, rng)
        waiting = {j: f"{self.rank_text(j)}; {reason}" for j, reason in plan.waiting.items()}
        return Plan(decisions=plan.decisions, actions=plan.actions, waiting=waiting)

    def begin_cycle(self, state: ClusterState, view: WorkingView) -> None:
        super().begin_cycle(state, view)
        self._cycle = self.split(state)

    def slots_per_gpu(self) -> int:
        return max(1, int(self.params.get("max_jobs_per_gpu", 1))) if self.colocate else 1

    def share_slowdown(self) -> float:
        slow = self.params.get("gpu_share_slowdown")
        return float(slow) if slow is not None else float(self.slots_per_gpu())

    def split(self, state: ClusterState) -> _Cycle:
        """Rank the queue by rate and choose the GPU capacity (see the module docstring)."""
        pending = list(state.pending)
        cycle = _Cycle(n=len(pending))
        if not pending:
            return cycle
        up = [n for n in state.nodes if n.up]
        models = frozenset(g.spec.model for n in up for g in n.gpus)
        cpu_nodes = [n for n in up if n.kind == NodeKind.CPU]
        on_gpu_nodes = bool(self.params.get("cpu_jobs_on_gpu_nodes", True)) and any(
            n.kind != NodeKind.CPU and n.cores > 0 for n in up
        )
        times = [job_times(j, models, bool(cpu_nodes), on_gpu_nodes) for j in pending]
        rates = placement_rates(pending, times, self.features, state.now_s)
        order = sorted(range(len(pending)), key=lambda i: (-rates[i], i))
        for pos, i in enumerate(order, start=1):
            job = pending[i]
            cycle.rate[job.id] = rates[i]
            cycle.position[job.id] = pos
            cycle.times[job.id] = times[i]
        cycle.order = [pending[i] for i in order]

        slow = self.share_slowdown()
        # Slots: free times (seconds from now) of the GPU containers and the CPU cores.
        gpu_slots: list[float] = []
        cpu_slots: list[float] = []
        running_on: dict[tuple[str, int] | str, list[float]] = {}
        model_of = {n.name: n.gpus[0].spec.model for n in state.nodes if n.gpus}
        for r in state.running:
            remaining = max(0.0, 1.0 - r.progress)
            if r.placement.gpu_indices:
                t = r.job.run_time_s(
                    model_of.get(r.placement.node),
                    spread=r.placement.is_gang,
                    speed=self.unconsolidated_speed,
                )
                rem = remaining * (t or 0.0) * slow
                for key in r.placement.gpu_keys:
                    running_on.setdefault(key, []).append(rem)
            else:
                cpu_t = r.job.profile.cpu_time_s if r.job.profile is not None else None
                rem = remaining * (cpu_t or 0.0)
                for _ in range(max(1, r.placement.cpus)):
                    running_on.setdefault(r.placement.node, []).append(rem)
        for node in up:
            if node.kind == NodeKind.CPU:
                busy = sorted(running_on.get(node.name, []), reverse=True)
                slots = [0.0] * max(node.cores, len(busy))
                slots[: len(busy)] = busy
                cpu_slots.extend(slots)
                continue
            for gpu in node.gpus:
                busy = sorted(running_on.get(gpu.key, []), reverse=True)
                exclusive = gpu.mode == SharingMode.EXCLUSIVE and bool(busy)
                per = 1 if exclusive else self.slots_per_gpu()
                slots = [0.0] * max(per, len(busy))
                slots[: len(busy)] = busy
                gpu_slots.extend(slots)

        fixed_gpu: list[float] = []
        fixed_cpu: list[float] = []
        flexible: list[JobSpec] = []
        for job in cycle.order:
            jt = cycle.times[job.id]
            if jt.can_gpu and jt.can_cpu:
                flexible.append(job)
            elif jt.can_gpu:
                cycle.side[job.id] = "gpu"
                fixed_gpu.append((jt.gpu_s or 0.0) * slow)
            elif jt.can_cpu:
                cycle.side[job.id] = "cpu"
                fixed_cpu.append(jt.cpu_s or 0.0)
            else:
                cycle.side[job.id] = None
        k = self._choose_split(flexible, cycle, gpu_slots, cpu_slots, fixed_gpu, fixed_cpu)
        for i, job in enumerate(flexible):
            cycle.side[job.id] = "gpu" if i < k else "cpu"
        cycle.gpu_capacity = sum(1 for s in cycle.side.values() if s == "gpu")
        return cycle

    def _choose_split(
        self,
        flexible: list[JobSpec],
        cycle: _Cycle,
        gpu_slots: list[float],
        cpu_slots: list[float],
        fixed_gpu: list[float],
        fixed_cpu: list[float],
    ) -> int:
        """Number of top-ranked flexible jobs for the GPU side (see the module docstring)."""
        f = len(flexible)
        if not gpu_slots:
            everything = fixed_cpu + c_dur_all(flexible, cycle)
            cycle.cpu_finish_s = _list_schedule(cpu_slots, everything)[0]
            return 0
        slow = self.share_slowdown()
        # Flexible jobs can run on both sides, so both of their times are known.
        g_dur = [(cycle.times[j.id].gpu_s or 0.0) * slow for j in flexible]
        c_dur = [cycle.times[j.id].cpu_s or 0.0 for j in flexible]
        if not cpu_slots:
            cycle.gpu_finish_s = _list_schedule(gpu_slots, fixed_gpu + g_dur)[0]
            return f
        # GPU side for every prefix, incrementally.
        _, heap, done = _list_schedule(gpu_slots, fixed_gpu)
        gpu_finish = [max(heap)]
        gpu_done = [done]
        for d in g_dur:
            t = heapq.heappop(heap)
            heapq.heappush(heap, t + d)
            gpu_finish.append(max(gpu_finish[-1], t + d))
            gpu_done.append(gpu_done[-1] + t + d)
        exact = f <= int(self.params.get("exact_split_limit", 200))
        base_cpu, cpu_heap, base_done = _list_schedule(cpu_slots, fixed_cpu)
        suffix_work = [0.0] * (f + 1)
        suffix_long = [0.0] * (f + 1)
        for i in range(f - 1, -1, -1):
            suffix_work[i] = suffix_work[i + 1] + c_dur[i]
            suffix_long[i] = max(suffix_long[i + 1], c_dur[i])
        busy = sum(cpu_heap)
        best: tuple[float, float, int] | None = None
        best_k, best_cpu = f, 0.0
        for k in range(f + 1):
            if exact:
                cpu_finish, _, cpu_done = _list_schedule(cpu_heap, c_dur[k:])
                cpu_finish = max(cpu_finish, base_cpu)
            else:  # bounds: no list schedule per split
                cpu_finish = max(base_cpu, suffix_long[k], (busy + suffix_work[k]) / len(cpu_slots))
                cpu_done = suffix_work[k] * (f - k)
            span = max(gpu_finish[k], cpu_finish)
            key = (round(span, 6), round(gpu_done[k] + base_done + cpu_done, 6), -k)
            if best is None or key < best:
                best, best_k, best_cpu = key, k, cpu_finish
        cycle.gpu_finish_s = gpu_finish[best_k]
        cycle.cpu_finish_s = best_cpu
        return best_k

    # -- framework extension points ------------------------------------------------------------

    def sort_queue(
        self, pending: Sequence[JobSpec], view: WorkingView, rng: random.Random
    ) -> list[JobSpec]:
        return list(self._cycle.order) if self._cycle.order else list(pending)

    def feasibility_key(self, job: JobSpec) -> Any:
        return self._cycle.side.get(job.id)

    def candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        side = self._cycle.side.get(job.id)
        if side == "cpu":
            return self._cpu_candidates(job, view)
        if side == "gpu":
            return super().candidates(job, view)
        return []

    def pick(
        self, job: JobSpec, cands: list[Candidate], view: WorkingView, rng: random.Random
    ) -> Candidate | None:
        """Idle GPUs first (see the module docstring), then the fastest model."""
        if job.gpus == 1:
            alone = [c for c in cands if c.gpus and not c.residents]
            if alone and len(alone) < len(cands):
                cands = alone
        return super().pick(job, cands, view, rng)

    def score_speed(self, job: JobSpec, cand: Candidate, view: WorkingView) -> float:
        """Minus the job's solo time there: the fastest profiled GPU model first (ties and
        unprofiled models: cluster order)."""
        model = cand.gpus[0].spec.model if cand.gpus else None
        t = job.run_time_s(model, spread=cand.is_gang, speed=self.unconsolidated_speed)
        return -t if t is not None else 0.0

    def no_fit_reason(self, job: JobSpec, view: WorkingView) -> str:
        side = self._cycle.side.get(job.id)
        if side is None:
            return "no side can run it: no GPU time for a GPU model here and no CPU time"
        if side == "cpu":
            up = [n for n in view.cpu_nodes if n.up]
            most = max((n.free_cores for n in up), default=0)
            return (
                f"CPU side: needs {job.cpus} free cores on a CPU node (most free: {most}, "
                f"{len(up)} CPU nodes up)"
            )
        return "GPU side: " + super().no_fit_reason(job, view)

    # -- explanations --------------------------------------------------------------------------

    def rank_text(self, job_id: str) -> str:
        c = self._cycle
        return (
            f"rate {c.rate.get(job_id, 0.0):.3f}, {ordinal(c.position.get(job_id, 0))} "
            f"of {c.n}; GPU capacity for {c.gpu_capacity} job"
            f"{'' if c.gpu_capacity == 1 else 's'}"
        )

    def explain_gang(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        return f"{self.rank_text(job.id)}: {super().explain_gang(job, chosen, cands, view)}"

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        c = self._cycle
        t = c.times.get(job.id)
        where = self.placement_text(job, chosen)
        if not chosen.gpus:
            if job.gpus <= 0:
                return f"{self.rank_text(job.id)}: asks for no GPU, so placed {where}"
            cpu = f"{t.cpu_s:.0f} s" if t and t.cpu_s else "unknown time"
            gpu = f"{t.gpu_s:.0f} s on {t.gpu_model}" if t and t.gpu_s else "no GPU time"
            return (
                f"{self.rank_text(job.id)}: below the GPU capacity, so placed {where}; "
                f"{cpu} on CPU vs {gpu}; predicted CPU side {c.cpu_finish_s:.0f} s, "
                f"GPU side {c.gpu_finish_s:.0f} s"
            )
        return (
            f"{self.rank_text(job.id)}: placed {where} {self.residents_text(chosen)}; "
            f"{self.fit_text(job, chosen)}; predicted GPU side {c.gpu_finish_s:.0f} s, "
            f"CPU side {c.cpu_finish_s:.0f} s"
        )

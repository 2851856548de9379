"""A scheduling-framework-style base class: sort, filter, score, pick, reserve, explain.

In the spirit of the Kubernetes scheduling framework (DESIGN.md, STYLE.md): a small core runs a
serial decision cycle over ``state.pending`` and calls extension points a policy overrides:

- ``sort_queue(pending, view, rng)``: the order jobs are considered in (default: queue order).
- ``candidates(job, view)``: the feasible placements (filter). The default covers CPU jobs,
  single-GPU jobs (exclusive on an idle GPU, or co-located when ``colocate`` is set),
  multi-GPU jobs (``k`` idle GPUs of one model on one node, exclusive) and gangs (a job
  larger than any node: ``k`` idle GPUs of one model over several nodes, all or nothing).
- ``keep(job, candidate, view)``: an extra per-candidate filter (default: keep all).
- ``score_<name>(job, candidate, view)`` for each name in ``scorers``: raw scores, higher is
  better. With several scorers each is min-max normalised to 0..100 over the candidates and
  combined with the weights in the ``weights`` parameter (default 1 each); ties go to the
  candidate first in cluster order (nodes in snapshot order, then GPU index).
- ``pick(job, scored, view, rng)``: the winner (default: best score, first in order).
- ``explain(job, chosen, scored, view)``: the human-readable reason, with numbers;
  ``explain_gang`` for a gang (the default names the nodes, why not one, and the speed).

Capacity is reserved in a ``WorkingView``: light mutable copies of the GPUs and nodes (not a
deep copy of the snapshot) plus per-cycle indexes, so later jobs in the same cycle see earlier
decisions. Indexes: GPUs in *pools* of equivalent GPUs (same spec, mode, resident job types,
committed memory and MIG slices: one pool holds all idle V100s), which makes the per-job cost
grow with the number of distinct GPU situations rather than the number of GPUs; per model,
nodes bucketed by their count of idle GPUs (multi-GPU jobs); and a per-cycle cache of job
*shapes* (GPUs, memory per GPU in MB, cores, allowed models) that found no fit. Capacity only
shrinks during a cycle, so a shape that did not fit, and any larger one, will not fit later.
Gangs use the same buckets: per model, up nodes by idle count, so choosing the nodes of a
gang costs O(GPUs asked x distinct idle counts), not O(nodes); and per model the sizes of
the up nodes (``node_caps``), which say whether a job is a gang at all.

The view outlives the cycle: the next ``schedule`` call refreshes it, re-indexing only the nodes
whose ``NodeState`` object changed or that a reservation touched (``WorkingView.refresh``), so a
cycle on a large, mostly unchanged cluster costs what changed rather than the number of GPUs.
Candidates are listed in cluster order, so a refreshed view and a fresh one give the same plan.
A cycle with no pending job returns an empty plan at once.

Feasibility rules (all policies built on this class):

- Nodes that are not ``up`` get nothing.
- CPU-only jobs (``gpus == 0``) go to CPU nodes with ``free_cores >= job.cpus``.
- GPU jobs need ``job.cpus`` free cores on the GPU node too (nodes with ``cores == 0`` do not
  track cores and are not checked).
- A job needs ``job.memory_need_mb()`` free on each GPU it gets (spec memory minus the memory
  committed to the jobs already placed there).
- If the job's profile lists solo times per GPU model (``gpu_time_s``), only those models with a
  positive, finite time are feasible (``profiled_models_only``; an unprofiled model has no
  run time to simulate).
- A GPU running jobs under EXCLUSIVE (or with no mode recorded) takes no more jobs. Under MPS or
  TIME_SLICING it takes up to ``max_jobs_per_gpu`` jobs, all under that mode (under MPS only
  jobs of the residents' owner: one MPS server serves one unix user); under MIG a job
  takes the smallest instance profile whose memory covers its need and whose compute slices are
  still free (``mig_total_slices - mig_slices_used``).
- An idle GPU gets the policy's fresh mode: EXCLUSIVE for exclusive policies; for co-locating
  ones ``share_mode`` if the GPU supports it, else its best sharing mode (MPS if supported,
  else time-slicing), so later jobs can join it.
- Multi-GPU jobs always take whole idle GPUs of one model on one node, exclusively: data-parallel
  jobs stall on their slowest worker, and the measured co-location data are single-GPU.
- **Gangs.** A job asking for more GPUs than any up node holds of one usable model (with the
  cores) gets whole idle GPUs of ONE model on several nodes, exclusively, with ``job.cpus``
  cores on each node: all of them in one decision or none (a gang is never half placed, so
  two gangs cannot each hold half of what they need). A job that one node could hold, busy
  or not, waits for that node and is never spread. Among gangs: the fewest nodes, then the
  fullest nodes (fewest idle GPUs left on them), then cluster order; node rank 0 is the node
  giving the most GPUs. A spread job runs slower (gradients cross the network): the
  explanation quotes its profile's unconsolidated time, else ``unconsolidated_speed``. A
  waiting gang's reason says what is missing and, from the running jobs' progress and
  profiled times, when enough GPUs are predicted to be idle ("needs 8 V100 at once on
  several nodes ...: 5 idle; 3 more expected in about 25 min when job 812 is predicted to
  end").
- A shared GPU is no candidate when the ``colocation_check`` model predicts an infinite slowdown
  (``scheduler.interference``: the pair cannot co-run at all, e.g. Gavel measured it out of
  memory) for the job next to the residents, or for a resident next to the job. Otherwise a
  co-locating policy would place the job there, the co-run would be killed at once (an OOM),
  the job requeued and placed there again: an OOM cascade. The waiting reason names the pair.
- A shared GPU is no candidate for a job that was OOM-killed beside a job of one of its
  residents' types, or whose resident was killed beside the job's type (``JobSpec.oom_with``:
  what a job was observed to die beside, filled by the simulator at a requeue): the pair is
  not tried again, whatever a model predicts.
- With ``backfill`` off, the first job that cannot be placed blocks the rest of the queue.
- **Reservations** (``reserve``, with ``backfill`` on: EASY backfilling, as Slurm's backfill
  scheduler does). The first job in the policy's order that asks more than one GPU, cannot
  be placed, and whose start can be predicted gets a reservation: the earliest time enough
  GPUs are predicted idle (``WorkingView.release_times``: the running jobs' predicted ends,
  the same estimates as the waiting reasons), and which GPUs those are (on one node, the
  node predicted to have them first; for a gang, the GPUs free by then on the fewest nodes,
  fullest first). Only jobs of more than one GPU get one: a one-GPU job is first in line
  for the next GPU that frees and fits it, so backfill cannot starve it. A job behind it in
  the order may then start on the reserved GPUs only if it is predicted to end before the
  reservation's start (its profiled solo time on that model, spread if it is a gang,
  bounded by its time limit; the time limit alone when nothing is profiled); a job whose run
  time cannot be predicted, or that would end later, may start on other GPUs only. A
  reserved GPU that is running jobs now takes no co-located job (it would slow the jobs
  whose ends the reservation counts on). The reserved job's reason names the GPUs and the
  predicted start; a job kept off the reserved GPUs says it would delay that reservation.
  One reservation per cycle, recomputed every cycle from the snapshot (deterministic). Cores
  are not reserved: a later job may take cores on a reserved node (the nodes of the traces
  have cores to spare; a node short of cores at the start delays the reservation).

Common parameters (``framework_defaults``; policies add their own):

- ``backfill`` (bool, True): let later jobs go past one that does not fit.
- ``reserve`` (bool, False): with ``backfill`` on, give the first waiting multi-GPU job an
  EASY reservation that later jobs may not delay (see the feasibility rules). Off, a stream
  of small jobs can keep a large one waiting indefinitely.
- ``max_jobs_per_gpu`` (int, 2): co-location limit under MPS and time-slicing.
- ``share_mode`` (str, "auto"): mode for an idle GPU a co-locating policy starts sharing:
  "auto", "mps", "time_slicing" or "mig".
- ``profiled_models_only`` (bool, True): see above.
- ``weights`` (mapping scorer name -> weight, None = 1 each).
- ``interference`` (str or None, None): a registered interference model name
  (``scheduler.interference.build_interference``) whose predicted slowdown co-locating policies
  quote in explanations; ``interference_params`` (mapping, None) its parameters.
- ``colocation_check`` (str or None, "measured"): the interference model the filter asks
  whether a pair can co-run at all (see the feasibility rules); None turns the check off. The
  measured table knows the Gavel job types only; for other jobs its fallback is finite, so they
  pass. When it names the same model as ``interference``, that instance (and its parameters)
  is used.
- ``unconsolidated_speed`` (float, 0.74 = ``scheduler.domain.UNCONSOLIDATED_SPEED``): speed of
  a gang relative to one node where its profile has no unconsolidated time (the median of
  Gavel's measured ratios); used in explanations and predicted ends, an estimate only.
- ``cpu_jobs_on_gpu_nodes`` (bool, True): a job asking for no GPU may run on a GPU node's spare
  cores (its free cores less one per idle GPU, ``spare_cores``), after every CPU node on equal
  scores; the node hides every GPU device from it and its cores count against the node.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from scheduler.domain import (
    SHARING_ALLOWED,
    SHARING_NEVER,
    UNCONSOLIDATED_SPEED,
    ClusterState,
    Decision,
    GpuSpec,
    GpuState,
    JobSpec,
    MigProfile,
    NodeKind,
    NodeState,
    Placement,
    PlacementPart,
    Plan,
    RunningJob,
    SharingMode,
)
from scheduler.interference import InterferenceModel, build_interference, co_run_slowdown
from scheduler.policies.base import Policy, PolicyError

_MB_PER_GB = 1024.0
_SHARED_MODES = (SharingMode.MPS, SharingMode.TIME_SLICING)

#: A job parameter naming the one GPU model the job may run on.
GPU_MODEL_PARAM = "gpu_model"

framework_defaults: dict[str, Any] = {
    "backfill": True,
    "reserve": False,
    "max_jobs_per_gpu": 2,
    "share_mode": "auto",
    "profiled_models_only": True,
    "weights": None,
    "interference": None,
    "interference_params": None,
    "colocation_check": "measured",
    "unconsolidated_speed": UNCONSOLIDATED_SPEED,
    # A job asking for no GPU may run on a GPU node's spare cores (after every CPU node; the
    # node hides every GPU device from it): docs/policies.md.
    "cpu_jobs_on_gpu_nodes": True,
}


def mps_owners(jobs: Sequence[JobSpec]) -> tuple[str | None, ...]:
    """The distinct owners of ``jobs`` (sorted, None first). MPS serves one unix user at a
    time per GPU (ALGORITHMS §4): a job may join an MPS GPU only when this is its own owner
    alone; jobs without an owner (traces) count as one anonymous user."""
    return tuple(sorted({j.owner for j in jobs}, key=lambda o: (o is not None, o or "")))


def spare_cores(node: WorkNode) -> int:
    """Cores of ``node`` a CPU job may take: its free cores, less one for each idle GPU of a
    GPU node (kept for the GPU jobs it may still take)."""
    if node.kind == NodeKind.CPU:
        return node.free_cores
    return max(0, node.free_cores - sum(node.idle_by_sid.values()))


def gb(mb: float) -> str:
    """``mb`` megabytes as a short GB figure for explanations ("9.1")."""
    return f"{mb / _MB_PER_GB:.1f}"


def job_type_key(job: JobSpec) -> str:
    """What makes two jobs interchangeable for pooling and scoring: the job type, else the
    profile name, else the job id (no pooling). ``JobSpec.type_key``."""
    return job.type_key()


def memory_basis(job: JobSpec) -> str:
    """What the policy knows of ``job``'s GPU memory: "9.1 GB declared", "8.3 GB, its
    profile's max" or "unknown (no profiled max, no gpu_memory_mb)"."""
    if job.gpu_memory_mb is not None:
        return f"{gb(job.gpu_memory_mb)} GB declared"
    if job.profile is not None and job.profile.gpu_memory_max_mb is not None:
        return f"{gb(job.profile.gpu_memory_max_mb)} GB, its profile's max"
    return "unknown (no profiled max, no gpu_memory_mb)"


def request_text(job: JobSpec, cand: Candidate | None) -> str:
    """What a GPU job's placement (``cand``) or waiting reason (None) adds about its request:
    "; a GPU of its own: <why>" for a job that may not share; "; packed on its GPU memory:
    <basis>" for a job placed beside others; "" otherwise."""
    if job.gpus <= 0:
        return ""
    why = job.whole_gpu_reason()
    if why is not None:
        return f"; whole GPUs of its own: {why}"
    if cand is not None and cand.residents:
        return f"; shares (sharing: {job.sharing}) on its GPU memory: {memory_basis(job)}"
    return ""


def oom_beside(job: JobSpec, residents: Sequence[str], shunned: frozenset[str]) -> str | None:
    """Why ``job`` may not join a shared GPU whose residents have the types ``residents`` and
    were OOM-killed beside the types ``shunned`` (a shared pool key's last two entries), or
    None: it was killed beside one of those residents' types, or one of them beside its type
    (``JobSpec.oom_with``)."""
    if job.oom_with and not job.oom_with.isdisjoint(residents):
        return " + ".join(sorted(job.oom_with.intersection(residents)))
    own = job_type_key(job)
    if own in shunned:
        return f"a resident killed beside {own}"
    return None


class WorkGpu:
    """A GPU's mutable state during one cycle (starts as a copy of its ``GpuState``)."""

    __slots__ = (
        "node",
        "index",
        "spec",
        "mode",
        "jobs",
        "committed_mb",
        "mig_used",
        "order",
        "pool_key",
        "sid",
    )

    def __init__(
        self, gpu: GpuState, node: WorkNode, order: int, jobs: list[JobSpec], sid: int
    ) -> None:
        self.node = node
        self.index = gpu.index
        self.spec = gpu.spec
        self.sid = sid  # the view's small integer id of ``spec`` (cheap to hash)
        self.mode = gpu.mode
        self.jobs = jobs
        self.committed_mb = gpu.committed_memory_mb
        self.mig_used = gpu.mig_slices_used
        self.order = order
        self.pool_key: tuple[Any, ...] | None = None

    @property
    def free_mb(self) -> float:
        return self.spec.memory_mb - self.committed_mb

    @property
    def idle(self) -> bool:
        return not self.jobs and self.mig_used == 0 and self.committed_mb <= 0

    @property
    def label(self) -> str:
        return f"{self.node.name}/gpu{self.index}"

    def free_mig_slices(self) -> int:
        return max(0, self.spec.mig_total_slices - self.mig_used)


class WorkNode:
    """A node's mutable state during one cycle."""

    __slots__ = (
        "name",
        "kind",
        "cores",
        "free_cores",
        "up",
        "gpus",
        "order",
        "idle_by_sid",
        "size_by_sid",
        "containers",
        "barred",
        "free_memory_mb",
    )

    def __init__(self, node: NodeState, order: int) -> None:
        self.name = node.name
        self.free_memory_mb = node.free_memory_mb  # host memory; None: not tracked
        self.kind = node.kind
        self.cores = node.cores
        self.free_cores = node.free_cores
        self.up = node.up
        self.containers = bool(node.container_runtimes)  # runs container jobs
        self.barred = False  # kept from the job being decided (``WorkingView.bar``)
        self.gpus: list[WorkGpu] = []
        self.order = order
        self.idle_by_sid: dict[int, int] = {}  # spec id -> idle GPUs of it on this node
        self.size_by_sid: dict[int, int] = {}  # spec id -> GPUs of it on this node (if up)

    def has_cores(self, cpus: int) -> bool:
        """Room for ``cpus`` more cores (always, for a node that does not track cores); never
        while barred."""
        return not self.barred and (self.cores <= 0 or self.free_cores >= cpus)

    def idle_count(self, gpu: WorkGpu) -> int:
        """Idle GPUs on this node of the same spec as ``gpu``."""
        return self.idle_by_sid.get(gpu.sid, 0)


Part = tuple[WorkNode, tuple[WorkGpu, ...]]


class Candidate:
    """One feasible placement: a node, its GPUs (empty for CPU), the mode and MIG profile.

    Single-GPU candidates stand for a whole pool of equivalent GPUs (``pool``); ``gpus`` holds
    the pool's first GPU whose node has the cores. ``score`` is set by the scoring step.

    A **gang** candidate (``gang`` set) spans several nodes: ``gang`` lists each node with its
    GPUs in node-rank order, ``node`` is rank 0 and ``gpus`` holds every GPU of every node (so
    per-GPU checks see them all). ``rank`` orders candidates of equal score: cluster order for
    single-node candidates; for gangs (nodes, idle GPUs left on them, cluster order), i.e. the
    most consolidated first.
    """

    __slots__ = ("node", "gpus", "mode", "mig_profile", "pool", "score", "raw", "gang", "_rank")

    def __init__(
        self,
        node: WorkNode,
        gpus: tuple[WorkGpu, ...],
        mode: SharingMode,
        mig_profile: MigProfile | None = None,
        pool: list[WorkGpu] | None = None,
        gang: tuple[Part, ...] | None = None,
    ) -> None:
        self.node = node
        self.gpus = gpus
        self.mode = mode
        self.mig_profile = mig_profile
        self.pool = pool
        self.score = 0.0
        self.raw: dict[str, float] = {}
        self.gang = gang
        self._rank = (len(gang), self.idle_left(), gpus[0].order) if gang else None

    @property
    def rank(self) -> tuple[int, int, int]:
        """Tie-break key (lower first): cluster order; for gangs (nodes, idle left, order)."""
        return self._rank if self._rank is not None else (0, 0, self.order)

    @property
    def is_gang(self) -> bool:
        return self.gang is not None

    @property
    def parts(self) -> tuple[Part, ...]:
        """Every node with its GPUs, node rank 0 first (one part unless a gang)."""
        return self.gang if self.gang is not None else ((self.node, self.gpus),)

    def in_containers(self) -> bool:
        """Whether every node of the placement runs container jobs."""
        return all(node.containers for node, _ in self.parts)

    def idle_left(self) -> int:
        """Idle GPUs of the placement's spec left on its node(s) after placing it."""
        if not self.gpus:
            return 0
        sid = self.gpus[0].sid
        return sum(node.idle_by_sid.get(sid, 0) for node, _ in self.parts) - len(self.gpus)

    @property
    def gpu(self) -> WorkGpu | None:
        return self.gpus[0] if self.gpus else None

    @property
    def order(self) -> int:
        return self.gpus[0].order if self.gpus else self.node.order

    @property
    def residents(self) -> list[JobSpec]:
        """Jobs already on the (first) GPU of this candidate."""
        return self.gpus[0].jobs if self.gpus else []

    @property
    def label(self) -> str:
        if not self.gpus:
            return self.node.name
        return " + ".join(
            f"{node.name}/gpu" + ",".join(str(g.index) for g in gpus) for node, gpus in self.parts
        )

    @property
    def pool_size(self) -> int:
        return len(self.pool) if self.pool is not None else 1

    def start_fresh(self, mode: SharingMode) -> None:
        """Run on the candidate's idle GPU(s) under ``mode`` (no MIG instance): what a job's
        request (``FrameworkPolicy.honour_request``) makes of a policy's choice."""
        self.mode = mode
        self.mig_profile = None


@dataclass(slots=True, eq=False)
class Reservation:
    """The EASY reservation of one waiting job (``reserve``; see the module docstring).

    ``start_s``: seconds from now until every reserved GPU is predicted idle; ``sid``: the
    spec id of its GPUs (one model); ``gpus``: (node order, GPU index) of each, node rank
    order; ``work``: the view's ``WorkGpu`` of those that can take a job now (idle, or shared),
    which the view hides from jobs that would delay the reservation; ``until_job``: the job
    whose predicted end sets ``start_s``; ``label``: "v0/gpu0,1 + v1/gpu2,3".
    """

    job: JobSpec
    start_s: float
    sid: int
    model: str
    gpus: tuple[tuple[int, int], ...]
    work: tuple[WorkGpu, ...]
    until_job: str
    label: str

    @property
    def text(self) -> str:
        """ "8 V100 on v0/gpu0,1,2,3 + v1/gpu0,1,2,3, predicted idle in about 25 min, when
        job 812 is predicted to end"."""
        return (
            f"{len(self.gpus)} {self.model} on {self.label}, predicted idle in "
            f"{duration_text(self.start_s)}, when job {self.until_job} is predicted to end"
        )


# ``FrameworkPolicy.schedule``'s failure cache entry of a job kept off reserved GPUs (its
# text names the job's own predicted run time, so it is written per job).
_DELAYS_RESERVATION = "\0delays-reservation"
# The waiting reason of a container job while no up node has a container runtime.
NO_CONTAINER_RUNTIME = "no node has a container runtime (docs/containers.md)"


def _mode_text(mode: SharingMode, mig_profile: MigProfile | None) -> str:
    if mode == SharingMode.MIG:
        return f"under MIG {mig_profile.name}" if mig_profile is not None else "under MIG"
    if mode == SharingMode.MPS:
        return "under MPS"
    if mode == SharingMode.TIME_SLICING:
        return "under time-slicing"
    return "exclusive"


class WorkingView:
    """Per-cycle mutable view of a snapshot with the indexes the framework needs.

    Only GPUs that can take a job get a ``WorkGpu`` (idle ones, and with ``colocate`` the
    shared ones): a GPU owned exclusively, or on a node that is down, is counted and skipped,
    so ``WorkNode.gpus`` lists the usable GPUs only.
    """

    def __init__(self, state: ClusterState, *, colocate: bool = True) -> None:
        self.colocate = colocate
        # Distinct GPU specs, indexed by a small integer id (specs are slow to hash). Every
        # spec object met is kept alive in ``_spec_objs`` so its ``id()`` is never reused.
        self.specs: list[GpuSpec] = []
        self._sid_by_obj: dict[int, int] = {}
        self._sid_by_spec: dict[GpuSpec, int] = {}
        self._spec_objs: list[GpuSpec] = []
        self._build(state)

    def _build(self, state: ClusterState) -> None:
        """Index the whole snapshot (the first cycle, or after the node list changed)."""
        self.node_states: list[NodeState] = list(state.nodes)
        self.nodes: list[WorkNode] = []
        self.cpu_nodes: list[WorkNode] = []
        self.gpu_count = 0
        # GPU order = node order * stride + GPU index: cluster order, stable across cycles.
        self.stride = max((len(n.gpus) for n in state.nodes), default=0) + 1
        # Pools of equivalent GPUs; every list sorted by ``WorkGpu.order``.
        self.idle_pools: dict[int, list[WorkGpu]] = {}
        self.shared_pools: dict[tuple[Any, ...], list[WorkGpu]] = {}
        # Per spec id: idle count -> node orders with that many idle GPUs (sorted).
        self.idle_buckets: dict[int, dict[int, list[int]]] = {}
        # Per spec id: (GPUs of it on a node, the node's cores) -> number of such up nodes:
        # whether some node could ever hold a multi-GPU job (else it is a gang).
        self.node_caps: dict[int, dict[tuple[int, int], int]] = {}
        self.node_index: dict[str, int] = {n.name: i for i, n in enumerate(state.nodes)}
        self._running: dict[str, JobSpec] | None = None
        self._state = state
        # Co-run feasibility per (job type key, spec id, mode, resident types); kept across
        # cycles (see ``FrameworkPolicy._co_run_ok``).
        self.co_run_ok: dict[tuple[Any, ...], bool] = {}
        for n_order, node_state in enumerate(state.nodes):
            node = self._make_node(node_state, n_order)
            self.nodes.append(node)
            if node.kind == NodeKind.CPU:
                self.cpu_nodes.append(node)
        self.rebuilt_nodes = len(self.nodes)
        self._new_cycle()

    def _new_cycle(self) -> None:
        self._release: dict[int, dict[tuple[int, int], tuple[float, str] | None]] | None = None
        self._speed = 1.0
        self._release_sorted: dict[int, tuple[list[tuple[float, str]], int]] = {}
        self.failures: dict[tuple[Any, ...], str] = {}
        # The shared pools the last filter call rejected: (GPUs, text naming the pair).
        self.co_run_rejected: list[tuple[int, str]] = []
        # ... and those skipped for an OOM the job had beside their type: (GPUs, text).
        self.oom_rejected: list[tuple[int, str]] = []
        self.touched: set[int] = set()  # orders of the nodes ``reserve`` changed
        self.reserved_now: list[tuple[JobSpec, Placement]] = []  # this cycle's placements

    def refresh(self, state: ClusterState) -> None:
        """Make this view (used for an earlier cycle) a view of ``state``.

        Nodes whose ``NodeState`` is the same object as last time, and that no reservation
        changed, are kept as they are; the others are re-indexed. The simulator and the live
        loop rebuild only the nodes that changed, so a cycle costs what changed, not the
        cluster size. A different node list (names or order) is indexed from scratch.
        """
        nodes = state.nodes
        old = self.node_states
        self._running = None
        self._state = state
        if len(nodes) != len(old) or any(
            a is not b and a.name != b.name for a, b in zip(nodes, old, strict=True)
        ):
            self._build(state)
            return
        self.rebuilt_nodes = 0
        for n_order, node_state in enumerate(nodes):
            if node_state is old[n_order] and n_order not in self.touched:
                continue
            if len(node_state.gpus) >= self.stride:
                self._build(state)
                return
            self._drop_node(n_order)
            node = self._make_node(node_state, n_order)
            if self.nodes[n_order].kind == NodeKind.CPU:
                self.cpu_nodes.remove(self.nodes[n_order])
            self.nodes[n_order] = node
            if node.kind == NodeKind.CPU:
                bisect.insort(self.cpu_nodes, node, key=lambda n: n.order)
            old[n_order] = node_state
            self.rebuilt_nodes += 1
        self._new_cycle()

    def _sid(self, spec: GpuSpec) -> int:
        sid = self._sid_by_obj.get(id(spec))
        if sid is None:
            sid = self._sid_by_spec.setdefault(spec, len(self._sid_by_spec))
            self._sid_by_obj[id(spec)] = sid
            self._spec_objs.append(spec)
            if sid == len(self.specs):
                self.specs.append(spec)
        return sid

    def _resident(self, job_id: str) -> JobSpec:
        if self._running is None:
            self._running = {r.job.id: r.job for r in self._state.running}
        return self._running.get(job_id) or JobSpec(id=job_id)

    def _make_node(self, node_state: NodeState, n_order: int) -> WorkNode:
        """A WorkNode for ``node_state`` with its usable GPUs indexed in the pools."""
        node = WorkNode(node_state, n_order)
        if node.kind == NodeKind.CPU or not node_state.gpus:
            return node
        self.gpu_count += len(node_state.gpus)
        if not node.up:
            return node
        colocate = self.colocate
        base = n_order * self.stride
        sizes = node.size_by_sid
        for gpu_state in node_state.gpus:
            sid = self._sid(gpu_state.spec)
            sizes[sid] = sizes.get(sid, 0) + 1
            busy = bool(gpu_state.job_ids) or gpu_state.mig_slices_used > 0
            if busy and (
                not colocate or gpu_state.mode is None or gpu_state.mode == SharingMode.EXCLUSIVE
            ):
                continue  # cannot take a job this cycle
            jobs = [self._resident(j) for j in gpu_state.job_ids] if gpu_state.job_ids else []
            gpu = WorkGpu(gpu_state, node, base + gpu_state.index, jobs, sid)
            node.gpus.append(gpu)
            if not busy and gpu.committed_mb <= 0:
                gpu.pool_key = ("idle", sid)
                pool = self.idle_pools.get(sid)
                if pool is None:
                    pool = self.idle_pools[sid] = []
                if pool and pool[-1].order > gpu.order:
                    bisect.insort(pool, gpu, key=lambda g: g.order)
                else:
                    pool.append(gpu)
                node.idle_by_sid[sid] = node.idle_by_sid.get(sid, 0) + 1
            else:
                self._add_to_pool(gpu)
        for sid, count in node.idle_by_sid.items():
            lst = self.idle_buckets.setdefault(sid, {}).setdefault(count, [])
            if lst and lst[-1] > n_order:
                bisect.insort(lst, n_order)
            else:
                lst.append(n_order)
        for sid, size in sizes.items():
            caps = self.node_caps.setdefault(sid, {})
            caps[(size, node.cores)] = caps.get((size, node.cores), 0) + 1
        return node

    def _drop_node(self, n_order: int) -> None:
        """Take node ``n_order``'s GPUs out of the pools and buckets."""
        node = self.nodes[n_order]
        state = self.node_states[n_order]
        if node.kind != NodeKind.CPU and state.gpus:
            self.gpu_count -= len(state.gpus)
        for gpu in node.gpus:
            self._remove_from_pool(gpu)
        for sid, size in node.size_by_sid.items():
            caps = self.node_caps[sid]
            left = caps[(size, node.cores)] - 1
            if left:
                caps[(size, node.cores)] = left
            else:
                del caps[(size, node.cores)]

    def spec_pools(self) -> list[tuple[GpuSpec, list[WorkGpu]]]:
        """(spec, idle GPUs of it) for every spec with an idle pool."""
        return [(self.specs[sid], pool) for sid, pool in self.idle_pools.items()]

    # -- pools -------------------------------------------------------------------------------

    @staticmethod
    def _shared_key(gpu: WorkGpu) -> tuple[Any, ...] | None:
        if gpu.idle:
            return ("idle", gpu.sid)
        if gpu.mode is None or gpu.mode == SharingMode.EXCLUSIVE:
            return None  # owned: takes no more jobs
        residents = tuple(sorted(job_type_key(j) for j in gpu.jobs))
        # MPS serves one unix user per GPU: the residents' owners are part of the situation.
        owners = mps_owners(gpu.jobs) if gpu.mode == SharingMode.MPS else None
        # The types a resident was OOM-killed beside (``JobSpec.oom_with``): none may join it.
        shunned = frozenset().union(*(j.oom_with for j in gpu.jobs))
        return (gpu.sid, gpu.mode, residents, gpu.committed_mb, gpu.mig_used, owners, shunned)

    def _add_to_pool(self, gpu: WorkGpu) -> None:
        key = self._shared_key(gpu)
        gpu.pool_key = key
        if key is None:
            return
        if key[0] == "idle":
            pool = self.idle_pools.setdefault(gpu.sid, [])
            gpu.node.idle_by_sid[gpu.sid] = gpu.node.idle_by_sid.get(gpu.sid, 0) + 1
        else:
            pool = self.shared_pools.setdefault(key, [])
        if pool and pool[-1].order > gpu.order:
            bisect.insort(pool, gpu, key=lambda g: g.order)
        else:
            pool.append(gpu)

    def _remove_from_pool(self, gpu: WorkGpu) -> None:
        key = gpu.pool_key
        if key is None:
            return
        if key[0] == "idle":
            pool = self.idle_pools[gpu.sid]
            self._count_idle(gpu.node, gpu.sid, -1)
        else:
            pool = self.shared_pools[key]
        i = bisect.bisect_left(pool, gpu.order, key=lambda g: g.order)
        del pool[i]
        if not pool and key[0] != "idle":
            del self.shared_pools[key]
        gpu.pool_key = None

    def _count_idle(self, node: WorkNode, sid: int, change: int) -> None:
        """``node`` has ``change`` (+1 / -1) idle GPUs of spec id ``sid``: its count and the
        bucket of nodes by idle count (``idle_buckets``) follow."""
        old = node.idle_by_sid.get(sid, 0)
        node.idle_by_sid[sid] = old + change
        buckets = self.idle_buckets.setdefault(sid, {})
        if old > 0:
            lst = buckets[old]
            del lst[bisect.bisect_left(lst, node.order)]
        if old + change > 0:
            bisect.insort(buckets.setdefault(old + change, []), node.order)

    # -- reservation -------------------------------------------------------------------------

    def reserve(self, job: JobSpec, cand: Candidate) -> Placement:
        """Commit ``cand`` for ``job`` in the view (every node of a gang: its GPUs and
        ``job.cpus`` cores on each) and return its Placement."""
        need = job.memory_need_mb()
        parts = cand.parts
        for node, gpus in parts:
            self.touched.add(node.order)
            if node.cores > 0:
                node.free_cores -= job.cpus
            if node.free_memory_mb is not None:
                node.free_memory_mb -= job.memory_mb
            for gpu in gpus:
                self._remove_from_pool(gpu)
                gpu.jobs = [*gpu.jobs, job]
                gpu.committed_mb += need
                gpu.mode = cand.mode
                if cand.mig_profile is not None:
                    gpu.mig_used += cand.mig_profile.compute_slices
                self._add_to_pool(gpu)
        first, first_gpus = parts[0]
        placement = Placement(
            job_id=job.id,
            node=first.name,
            gpu_indices=tuple(g.index for g in first_gpus),
            mode=cand.mode,
            mig_profile=cand.mig_profile.name if cand.mig_profile is not None else None,
            cpus=job.cpus,
            more=tuple(
                PlacementPart(node.name, tuple(g.index for g in gpus), job.cpus)
                for node, gpus in parts[1:]
            ),
        )
        if cand.gpus:
            self.reserved_now.append((job, placement))
            if self._release is not None:  # already indexed this cycle: add it
                end = self._placed_end(job, placement, self._speed)
                self._release_add(self._release, job.id, placement, end)
        return placement

    # -- EASY reservations ---------------------------------------------------------------------

    def container_nodes_up(self) -> bool:
        """Whether some up node runs container jobs (has a container runtime)."""
        return any(n.up and n.containers for n in self.nodes)

    def bar_without_containers(self) -> list[WorkNode]:
        """Bar every node without a container runtime (``WorkNode.has_cores`` is then False
        for it, so no candidate uses it) until ``unbar``; returns those barred now."""
        barred = [n for n in self.nodes if not n.containers and not n.barred]
        for node in barred:
            node.barred = True
        return barred

    def unbar(self, nodes: Sequence[WorkNode]) -> None:
        for node in nodes:
            node.barred = False

    def hide(self, gpus: Sequence[WorkGpu]) -> None:
        """Take ``gpus`` (a reservation's) out of the pools: no candidate uses them until
        ``show_idle``. Their nodes are re-indexed at the next refresh."""
        for gpu in gpus:
            if gpu.pool_key is not None:
                self._remove_from_pool(gpu)
                self.touched.add(gpu.node.order)

    def show_idle(self, gpus: Sequence[WorkGpu]) -> None:
        """Put the idle ones of ``gpus`` (hidden by ``hide``) back in their idle pool, with
        their nodes' idle counts and buckets. Hidden shared GPUs stay hidden."""
        for gpu in gpus:
            if gpu.pool_key is not None or not gpu.idle:
                continue
            bisect.insort(self.idle_pools.setdefault(gpu.sid, []), gpu, key=lambda g: g.order)
            self._count_idle(gpu.node, gpu.sid, +1)
            gpu.pool_key = ("idle", gpu.sid)

    def usable_idle(self, node: WorkNode, sid: int) -> tuple[WorkGpu, ...]:
        """The idle GPUs of spec id ``sid`` on ``node`` that are in the pools (not hidden)."""
        return tuple(g for g in node.gpus if g.sid == sid and g.idle and g.pool_key is not None)

    def free_times(self, sid: int, cpus: int, speed: float) -> list[tuple[float, str, int, int]]:
        """(seconds from now until it is predicted idle, the job predicted to end then ("" if
        idle now), node order, GPU index) for every GPU of spec id ``sid`` on an up node with
        at least ``cpus`` cores (or that does not track cores) whose release is predicted."""
        out: list[tuple[float, str, int, int]] = []
        nodes = self.nodes
        for gpu in self.idle_pools.get(sid, ()):
            node = gpu.node
            if node.cores <= 0 or node.cores >= cpus:
                out.append((0.0, "", node.order, gpu.index))
        for (n_order, idx), release in self.release_times(sid, speed).items():
            if release is None:
                continue
            node = nodes[n_order]
            if node.cores <= 0 or node.cores >= cpus:
                out.append((release[0], release[1], n_order, idx))
        return out

    # -- lookups used by the default filter ----------------------------------------------------

    def first_with_cores(self, pool: Sequence[WorkGpu], cpus: int) -> WorkGpu | None:
        for gpu in pool:
            if gpu.node.has_cores(cpus):
                return gpu
        return None

    def first_node_with_idle(self, sid: int, count: int, cpus: int) -> WorkNode | None:
        """The first node (in order) with exactly ``count`` idle GPUs of spec id ``sid`` and
        ``cpus`` free cores."""
        for n_order in self.idle_buckets.get(sid, {}).get(count, ()):
            node = self.nodes[n_order]
            if node.has_cores(cpus):
                return node
        return None

    def largest_node(self, sid: int, cpus: int) -> int:
        """The most GPUs of spec id ``sid`` one up node holds, over nodes with at least
        ``cpus`` cores (or that do not track cores); 0 if none."""
        return max(
            (size for (size, cores) in self.node_caps.get(sid, {}) if cores <= 0 or cores >= cpus),
            default=0,
        )

    def gang(self, sid: int, k: int, cpus: int) -> Candidate | None:
        """The most consolidated gang of ``k`` idle GPUs of spec id ``sid`` over several nodes
        with ``cpus`` free cores each, or None if there are not enough.

        Fewest nodes first; among those, the fullest nodes (the fewest idle GPUs left on the
        chosen nodes); then cluster order. Nodes are chosen by idle count: at each step the
        node with the fewest idle GPUs that still lets the remaining steps reach ``k`` with the
        largest counts left (fullest first), the first such node in cluster order. Node rank 0
        is the node giving the most GPUs. Cost: O(k x distinct idle counts), whatever the
        cluster size.
        """
        buckets = self.idle_buckets.get(sid)
        if not buckets:
            return None
        # Nodes by idle count, in cluster order, with the cores: at most ceil(k / count) of
        # each count can be useful (that many already reach k on their own).
        by_count: dict[int, list[WorkNode]] = {}
        for count, orders in buckets.items():
            if not orders:
                continue
            useful = -(-k // count)
            found: list[WorkNode] = []
            for n_order in orders:
                node = self.nodes[n_order]
                if node.has_cores(cpus):
                    found.append(node)
                    if len(found) >= useful:
                        break
            if found:
                by_count[count] = found
        counts = sorted(by_count, reverse=True)
        # Fewest nodes: the largest counts first.
        total = steps = 0
        for c in counts:
            for _ in by_count[c]:
                if total >= k:
                    break
                total += c
                steps += 1
        if total < k:
            return None
        left = {c: len(nodes) for c, nodes in by_count.items()}

        def reach(j: int) -> int:
            """The most GPUs ``j`` of the nodes still available can give."""
            got = 0
            for c in counts:
                n = min(j, left[c])
                got += n * c
                j -= n
                if j == 0:
                    break
            return got

        chosen: list[int] = []
        need = k
        for j in range(steps, 0, -1):
            for c in reversed(counts):  # fewest idle first
                if not left[c]:
                    continue
                left[c] -= 1
                if c >= need or c + reach(j - 1) >= need:
                    chosen.append(c)
                    need -= c
                    break
                left[c] += 1
            if need <= 0:
                break
        taken = {c: 0 for c in by_count}
        picked: list[tuple[int, WorkNode]] = []
        for c in chosen:
            picked.append((c, by_count[c][taken[c]]))
            taken[c] += 1
        picked.sort(key=lambda cn: (-cn[0], cn[1].order))
        parts: list[Part] = []
        need = k
        for _, node in picked:
            gpus = self.usable_idle(node, sid)
            take = gpus[: min(need, len(gpus))]
            need -= len(take)
            parts.append((node, take))
        gpus_all = tuple(g for _, gs in parts for g in gs)
        return Candidate(parts[0][0], gpus_all, SharingMode.EXCLUSIVE, gang=tuple(parts))

    def release_times(
        self, sid: int, speed: float
    ) -> dict[tuple[int, int], tuple[float, str] | None]:
        """For every busy GPU of spec id ``sid`` on an up node, ``(node order, GPU index)`` ->
        (seconds from now until its last job is predicted to end, that job's id), or None
        when a job there has no prediction (paused, or no profiled time).

        A running job is predicted to end after ``(1 - progress) x`` its profiled solo time on
        that model (spread over nodes: the unconsolidated time, else the solo time / ``speed``);
        with no progress reported, its solo time minus the time since it started; never after
        its time limit runs out (the node stops it then), which is also the prediction of a job
        with a time limit and no profiled time. Built once
        once per cycle, from the snapshot alone (the same snapshot gives the same answer
        whatever the view's history).
        """
        if self._release is None:
            self._speed = speed
            self._release = self._release_index(speed)
        return self._release.get(sid, {})

    def release_order(self, sid: int, speed: float) -> tuple[list[tuple[float, str]], int]:
        """(the predicted releases of ``release_times(sid)``, soonest first; how many busy
        GPUs of the spec have no prediction). Cached per cycle."""
        cached = self._release_sorted.get(sid)
        if cached is None:
            release = self.release_times(sid, speed)
            known = sorted(v for v in release.values() if v is not None)
            cached = self._release_sorted[sid] = (known, len(release) - len(known))
        return cached

    def _release_index(
        self, speed: float
    ) -> dict[int, dict[tuple[int, int], tuple[float, str] | None]]:
        state = self._state
        now = state.now_s
        out: dict[int, dict[tuple[int, int], tuple[float, str] | None]] = {}
        for r in state.running:
            self._release_add(out, r.job.id, r.placement, self._predicted_end(r, now, speed))
        for job, placement in self.reserved_now:
            self._release_add(out, job.id, placement, self._placed_end(job, placement, speed))
        return out

    def _release_add(
        self,
        out: dict[int, dict[tuple[int, int], tuple[float, str] | None]],
        job_id: str,
        placement: Placement,
        end: float | None,
    ) -> None:
        """Enter a job's GPUs in the release index ``out``, free at ``end`` (absolute time;
        None: unknown). A GPU shared by several jobs is free when the last one ends."""
        now = self._state.now_s
        for node_name, idx in placement.gpu_keys:
            n_order = self.node_index.get(node_name)
            if n_order is None or not self.nodes[n_order].up:
                continue
            gpu = _gpu_at(self.node_states[n_order], idx)
            if gpu is None:
                continue
            sid = self._sid(gpu.spec)
            per_gpu = out.setdefault(sid, {})
            key = (n_order, idx)
            had = key in per_gpu
            old = per_gpu.get(key)
            if end is None:
                new = None
            elif not had or (old is not None and old[0] < end - now):
                new = (max(0.0, end - now), job_id)
            else:
                continue  # an earlier entry ends later (or never predicted): it stays
            per_gpu[key] = new
            ordered = self._release_sorted.get(sid)
            if ordered is not None:  # keep the sorted copy of this spec in step
                known, unknown = ordered
                if had and old is None:
                    unknown -= 1
                elif had and old is not None:
                    del known[bisect.bisect_left(known, old)]
                if new is None:
                    unknown += 1
                else:
                    bisect.insort(known, new)
                self._release_sorted[sid] = (known, unknown)

    def _placed_end(self, job: JobSpec, placement: Placement, speed: float) -> float | None:
        """Predicted end of a job placed in this cycle: now + its solo time there."""
        n_order = self.node_index.get(placement.node)
        if n_order is None:
            return None
        gpus = self.node_states[n_order].gpus
        model = gpus[0].spec.model if gpus else None
        solo = job.run_time_s(model, spread=placement.is_gang, speed=speed)
        if solo is None or not math.isfinite(solo):
            solo = job.time_limit_s  # the node stops it then: an upper bound
        elif job.time_limit_s is not None:
            solo = min(solo, job.time_limit_s)
        if solo is None:
            return None
        return self._state.now_s + solo

    def _predicted_end(self, r: RunningJob, now: float, speed: float) -> float | None:
        """Absolute predicted end of running job ``r`` (see ``release_times``), or None."""
        if r.paused:
            return None
        n_order = self.node_index.get(r.placement.node)
        if n_order is None:
            return None
        gpus = self.node_states[n_order].gpus
        model = gpus[0].spec.model if gpus and r.placement.gpu_indices else None
        solo = r.job.run_time_s(model, spread=r.placement.is_gang, speed=speed)
        # A time limit bounds the end: the node stops the job then (time_limit_s, per attempt;
        # started_s is the current attempt's start).
        limit = r.job.time_limit_s
        bound = None if limit is None else max(now, r.started_s + limit)
        if solo is None or not math.isfinite(solo):
            return bound
        if r.progress > 0:
            end = now + max(0.0, 1.0 - r.progress) * solo
        else:
            end = max(now, r.started_s + solo)
        return end if bound is None else min(end, bound)


class FrameworkPolicy(Policy):
    """Base of the policies that run the framework's serial decision cycle (see module doc).

    Subclasses set ``name``, ``defaults`` (include ``framework_defaults``), ``colocate``,
    ``scorers`` and implement the ``score_<name>`` methods and ``explain``.
    """

    colocate: ClassVar[bool] = False
    scorers: ClassVar[tuple[str, ...]] = ()
    defaults: ClassVar[Mapping[str, Any]] = framework_defaults

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        if p.get("share_mode", "auto") not in ("auto", "mps", "time_slicing", "mig"):
            raise PolicyError(
                f"policy {self.name!r}: share_mode must be auto, mps, time_slicing or mig; "
                f"got {p['share_mode']!r}"
            )
        if int(p.get("max_jobs_per_gpu", 1)) < 1:
            raise PolicyError(f"policy {self.name!r}: max_jobs_per_gpu must be >= 1")
        speed = p.get("unconsolidated_speed", UNCONSOLIDATED_SPEED)
        if not isinstance(speed, int | float) or isinstance(speed, bool) or not 0 < speed <= 10:
            raise PolicyError(
                f"policy {self.name!r}: unconsolidated_speed must be a number in (0, 10], "
                f"got {speed!r}"
            )
        self.unconsolidated_speed = float(speed)
        weights = p.get("weights") or {}
        unknown = set(weights) - set(self.scorers)
        if unknown:
            raise PolicyError(
                f"policy {self.name!r} has no scorer(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(self.scorers) or 'none'}"
            )
        self.weights = {s: float(weights.get(s, 1.0)) for s in self.scorers}
        # The working view is kept between cycles and refreshed (``WorkingView.refresh``):
        # a policy object serves one scheduling loop at a time (not thread-safe).
        self._view: WorkingView | None = None
        self._oom_seen = False  # some job of this cycle carries OOM kills (``schedule``)
        self.interference: InterferenceModel | None = None
        if p.get("interference"):
            self.interference = build_interference(
                p["interference"], **dict(p.get("interference_params") or {})
            )
        self.colocation_check: InterferenceModel | None = None
        check = p.get("colocation_check")
        if self.colocate and check and check != "none":
            if self.interference is not None and check == p.get("interference"):
                self.colocation_check = self.interference
            else:
                self.colocation_check = build_interference(str(check))

    # -- the cycle -----------------------------------------------------------------------------

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        if not state.pending:
            # Nothing to decide (the simulator calls on every completion): skip the view,
            # whose construction is linear in the GPUs.
            return Plan()
        view = self._view
        if view is None:
            view = self._view = WorkingView(state, colocate=self.colocate)
        else:
            view.refresh(state)
        # A job's type decides where it may go once some job carries OOM kills (``oom_beside``):
        # the failure cache (``shape``) must then tell types apart.
        self._oom_seen = any(j.oom_with for j in state.pending) or any(
            r.job.oom_with for r in state.running
        )
        self.begin_cycle(state, view)
        decisions: list[Decision] = []
        waiting: dict[str, str] = {}
        blocked_by: JobSpec | None = None
        backfill = bool(self.params.get("backfill", True))
        reserving = backfill and bool(self.params.get("reserve", False))
        held: Reservation | None = None  # this cycle's reservation, once made
        unreservable: set[tuple[Any, ...]] = set()  # shapes that could get none this cycle
        for job in self.sort_queue(state.pending, view, rng):
            if job.container and not view.container_nodes_up():
                waiting[job.id] = NO_CONTAINER_RUNTIME
                continue
            # A container job sees only the nodes with a container runtime.
            barred = view.bar_without_containers() if job.container else []
            try:
                if blocked_by is not None:
                    waiting[job.id] = (
                        f"waiting behind job {blocked_by.id}, which does not fit yet "
                        f"(strict queue order, backfill off)"
                    )
                    continue
                shape = self.shape(job)
                # Behind a reservation: "short" jobs (predicted to end before it starts) see its
                # idle GPUs, "long" ones do not; "other" jobs cannot use its GPU model anyway.
                regime = self.reservation_regime(job, held, view) if held is not None else "other"
                if held is not None and regime == "short":
                    view.show_idle(held.work)
                chosen, cands, reason = self._decide(job, shape, regime, held, view, rng)
                if chosen is not None:
                    if chosen.is_gang:
                        explanation = self.explain_gang(job, chosen, cands, view)
                    else:
                        explanation = self.explain(job, chosen, cands, view)
                    if chosen.gpus:
                        explanation += request_text(job, chosen)
                    placement = view.reserve(job, chosen)
                    decisions.append(Decision(placement, self.name, explanation, chosen.score))
                if held is not None and regime == "short":
                    view.hide(held.work)
                if chosen is not None:
                    continue
                if reason == _DELAYS_RESERVATION and held is not None:
                    reason = self.delay_text(job, held, view)
                if reserving and held is None and job.gpus > 1 and shape not in unreservable:
                    held = self.make_reservation(job, view)
                    if held is None:
                        unreservable.add(shape)
                    else:
                        view.hide(held.work)
                        reason = (
                            f"holds a reservation of {held.text}; jobs behind it may start on "
                            f"these GPUs only if predicted to end by then; "
                            f"{reason or 'no feasible placement'}"
                        )
                reason = reason or "no feasible placement"
                if job.container:
                    reason = f"a container job, on nodes with a container runtime: {reason}"
                waiting[job.id] = reason + request_text(job, None)
                if not backfill:
                    blocked_by = job
            finally:
                view.unbar(barred)
        return Plan(decisions=tuple(decisions), waiting=waiting)

    def _decide(
        self,
        job: JobSpec,
        shape: tuple[Any, ...],
        regime: str,
        held: Reservation | None,
        view: WorkingView,
        rng: random.Random,
    ) -> tuple[Candidate | None, list[Candidate], str | None]:
        """Filter, score and pick for one job: (the chosen candidate or None, the candidates,
        why it waits). Failures are cached per shape (and per reservation regime)."""
        key = shape if regime == "other" else (*shape, regime)
        reason = view.failures.get(key)
        cands: list[Candidate] = []
        if reason is None:
            fitting = [
                c
                for c in self.candidates(job, view)
                if self.keep(job, c, view) and (not job.container or c.in_containers())
            ]
            cands = self.honour_request(job, fitting)
            if fitting and not cands:
                reason = self.request_refusal(job, fitting)
                view.failures[key] = reason
            elif not cands:
                if regime == "long" and held is not None:
                    # Kept off the reserved GPUs: would it fit on them?
                    view.show_idle(held.work)
                    wider = any(self.keep(job, c, view) for c in self.candidates(job, view))
                    reason = _DELAYS_RESERVATION if wider else self.no_fit_reason(job, view)
                    view.hide(held.work)
                else:
                    reason = self.no_fit_reason(job, view)
                view.failures[key] = reason
        chosen = None
        if cands:
            self.score_candidates(job, cands, view)
            chosen = self.pick(job, cands, view, rng)
            if chosen is None:
                reason = f"{self.name}: no acceptable placement among {len(cands)} candidates"
        return chosen, cands, reason

    # -- EASY reservations (``reserve``) -------------------------------------------------------

    def predicted_run_s(self, job: JobSpec, model: str, *, spread: bool) -> float | None:
        """What the policy predicts ``job`` runs on ``model`` (s): its profiled solo time
        (spread over nodes: the unconsolidated time, else the solo time /
        ``unconsolidated_speed``), bounded by its time limit; the time limit alone when
        nothing is profiled; None when neither is known."""
        solo = job.run_time_s(model, spread=spread, speed=self.unconsolidated_speed)
        if solo is None or not math.isfinite(solo):
            return job.time_limit_s
        if job.time_limit_s is not None:
            return min(solo, job.time_limit_s)
        return solo

    def reservation_regime(self, job: JobSpec, held: Reservation, view: WorkingView) -> str:
        """How ``job`` stands to the reservation ``held``: "other" (it cannot use its GPU
        model: memory, profiled models, or a CPU job), "short" (predicted to end before the
        reservation starts: it may use the reserved idle GPUs) or "long" (it may not)."""
        if job.gpus <= 0:
            return "other"
        spec = view.specs[held.sid]
        allowed = self.allowed_models(job)
        if spec.memory_mb < job.memory_need_mb() or (
            allowed is not None and spec.model not in allowed
        ):
            return "other"
        spread = job.gpus > 1 and not self.one_node_holds(job, view)
        run = self.predicted_run_s(job, spec.model, spread=spread)
        return "short" if run is not None and run <= held.start_s else "long"

    def make_reservation(self, job: JobSpec, view: WorkingView) -> Reservation | None:
        """The earliest predicted start of ``job`` (more than one GPU) and the GPUs it would
        get, or None when it cannot be predicted (busy GPUs without a predicted end) or the
        GPUs are idle now (the job waits for something else: cores, a policy's filter).

        On one node: the node of a usable spec whose ``job.gpus``-th GPU is predicted idle
        first (then cluster order). A gang: the time the ``job.gpus``-th GPU of a usable spec
        is predicted idle, on the nodes with the most GPUs idle by then (fewest nodes), then
        cluster order; each node's GPUs free first. Among specs, the earliest start, then the
        fewest nodes, then cluster order. Cost: O(GPUs of the usable specs x log)."""
        k, cpus = job.gpus, job.cpus
        spread = not self.one_node_holds(job, view)
        speed = self.unconsolidated_speed
        best: tuple[tuple[float, int, int], int, list[tuple[float, str, int, int]]] | None = None
        for sid in self.eligible_specs(job, view):
            times = view.free_times(sid, cpus, speed)
            if len(times) < k:
                continue
            by_node: dict[int, list[tuple[float, str, int, int]]] = {}
            for entry in times:
                by_node.setdefault(entry[2], []).append(entry)
            picks: list[tuple[float, str, int, int]] = []
            if spread:
                times.sort()
                start = times[k - 1][0]
                ready = {
                    n: sorted(e for e in entries if e[0] <= start) for n, entries in by_node.items()
                }
                for n in sorted(ready, key=lambda n: (-len(ready[n]), n)):
                    picks.extend(ready[n][: k - len(picks)])
                    if len(picks) >= k:
                        break
            else:
                found: tuple[float, int] | None = None
                for n, entries in by_node.items():
                    if len(entries) < k or view.nodes[n].size_by_sid.get(sid, 0) < k:
                        continue
                    entries.sort()
                    if found is None or (entries[k - 1][0], n) < found:
                        found = (entries[k - 1][0], n)
                if found is None:
                    continue
                picks = by_node[found[1]][:k]
            start = max(e[0] for e in picks)
            nodes = {e[2] for e in picks}
            key = (start, len(nodes), min(nodes))
            if best is None or key < best[0]:
                best = (key, sid, picks)
        if best is None or best[0][0] <= 0.0:
            return None
        (start, _, _), sid, picks = best
        per_node: dict[int, list[int]] = {}
        for _, _, n, idx in picks:
            per_node.setdefault(n, []).append(idx)
        ranked = sorted(per_node, key=lambda n: (-len(per_node[n]), n))
        gpus = tuple((n, idx) for n in ranked for idx in sorted(per_node[n]))
        wanted = set(gpus)
        work = tuple(g for n in ranked for g in view.nodes[n].gpus if (n, g.index) in wanted)
        label = " + ".join(
            f"{view.nodes[n].name}/gpu" + ",".join(str(i) for i in sorted(per_node[n]))
            for n in ranked
        )
        until = max(picks)[1]
        return Reservation(job, start, sid, view.specs[sid].model, gpus, work, until, label)

    def delay_text(self, job: JobSpec, held: Reservation, view: WorkingView) -> str:
        """Why ``job`` does not start on GPUs reserved for another job."""
        spread = job.gpus > 1 and not self.one_node_holds(job, view)
        run = self.predicted_run_s(job, held.model, spread=spread)
        if run is None:
            why = (
                f"its run time cannot be predicted (no profiled time on {held.model} and no "
                "time limit)"
            )
        else:
            why = f"it is predicted to run {duration_text(run)}"
        return (
            f"would delay job {held.job.id}'s reservation ({held.text}): it fits now only on "
            f"those GPUs, and {why}"
        )

    # -- extension points ----------------------------------------------------------------------

    def begin_cycle(self, state: ClusterState, view: WorkingView) -> None:
        """Hook to precompute per-cycle data (normalisation ranges...). Default: nothing."""

    def sort_queue(
        self, pending: Sequence[JobSpec], view: WorkingView, rng: random.Random
    ) -> list[JobSpec]:
        """The order jobs are considered in. Default: queue (submission) order."""
        return list(pending)

    def shape(self, job: JobSpec) -> tuple[Any, ...]:
        """The cache key of what ``job`` needs: jobs of one shape fit or fail together."""
        return (
            job.gpus,
            job.memory_need_mb(),
            job.cpus,
            self.allowed_models(job),
            self.feasibility_key(job),
            job_type_key(job)
            if (self.colocation_check is not None or self._oom_seen) and job.gpus == 1
            else None,
            job.oom_with or None,  # observed pairs: jobs of one shape fit differently
            job.owner,  # MPS GPUs take one owner's jobs: owners fit differently
            job.container,  # container jobs see only the nodes with a runtime
            (job.sharing, job.may_share(), job.allow_cpu, job.memory_mb),  # what it allows
        )

    def feasibility_key(self, job: JobSpec) -> Any:
        """Anything job-specific a policy's ``keep`` depends on (default: None)."""
        return None

    def allowed_models(self, job: JobSpec) -> frozenset[str] | None:
        """GPU models ``job`` may run on (None: any). See ``profiled_models_only``; a job whose
        ``params`` name a ``gpu_model`` (the profiling runs, docs/profiles.md) runs on it only."""
        pinned = job.params.get(GPU_MODEL_PARAM) if job.params else None
        if pinned:
            return frozenset({str(pinned)})
        if not self.params.get("profiled_models_only", True) or job.profile is None:
            return None
        times = job.profile.gpu_time_s
        if not times:
            return None
        return frozenset(m for m, t in times.items() if t is not None and 0 < t < math.inf)

    def keep(self, job: JobSpec, cand: Candidate, view: WorkingView) -> bool:
        """Extra filter on one candidate (default: keep)."""
        return True

    def request_refusal(self, job: JobSpec, fitting: list[Candidate]) -> str:
        """Why every placement that fits ``job`` breaks what it asked (``honour_request``
        left none): its host memory, its own GPUs, or its device."""
        parts = [node for c in fitting for node, _ in c.parts]
        tracked = [n.free_memory_mb for n in parts if n.free_memory_mb is not None]
        if job.memory_mb > 0 and tracked and max(tracked) < job.memory_mb:
            return (
                f"needs {job.memory_mb:.0f} MB of host memory on a node: at most "
                f"{max(tracked):.0f} MB free on the {len(fitting)} placement(s) that fit "
                "otherwise"
            )
        gpu = [c for c in fitting if c.gpus]
        if job.gpus > 0 and not gpu:
            return (
                f"device gpu: it runs on GPUs only, and the {len(fitting)} placement(s) that "
                "fit are on CPU nodes (device auto allows them)"
            )
        if not job.may_share():  # the waiting reason then says why (``request_text``)
            return f"no idle GPU fits; the {len(gpu)} shared GPU(s) with room are not for it"
        return (
            f"the {len(gpu)} placement(s) that fit are not in the mode it asked "
            f"(sharing: {job.sharing})"
        )

    def honour_request(self, job: JobSpec, cands: list[Candidate]) -> list[Candidate]:
        """The candidates that honour what the job asked (docs/jobs.md), for every policy:

        - a job asking host memory (``memory_mb``) only on nodes with that much free (where
          nodes track it; the first GPU of a pool stands for the pool, as for cores);
        - a GPU job that may not run on a CPU node (``allow_cpu`` off) gets no CPU candidate;
        - a job that may not share (``JobSpec.whole_gpu_reason``: ``sharing: never``, or its
          GPU memory is unknown) gets no GPU with residents, and an idle GPU under EXCLUSIVE
          (a fresh sharing mode would let others join it);
        - ``sharing: mps`` / ``time_slicing`` joins only GPUs under that mode, and an idle GPU
          starts under it where the GPU supports it (else exclusive); a MIG profile name joins
          only instances of that profile, and an idle GPU otherwise runs it whole, exclusive.
        """
        if job.memory_mb > 0:  # host memory, reserved per node (docs/jobs.md)
            cands = [
                c
                for c in cands
                if all(
                    node.free_memory_mb is None or node.free_memory_mb >= job.memory_mb
                    for node, _ in c.parts
                )
            ]
        if job.gpus <= 0:
            return cands
        out: list[Candidate] = []
        shares = job.may_share()
        wanted = job.sharing
        for c in cands:
            if not c.gpus:
                if job.allow_cpu:
                    out.append(c)
                continue
            if c.residents:
                if not shares or not _mode_matches(c, wanted):
                    continue
            elif not shares or not _mode_matches(c, wanted):
                _make_fresh(c, wanted if shares else SHARING_NEVER)
            out.append(c)
        return out

    def fresh_mode(self, spec: GpuSpec) -> SharingMode:
        """The mode an idle GPU gets: EXCLUSIVE, or for co-locating policies ``share_mode`` if
        supported, else MPS if supported, else time-slicing."""
        if not self.colocate:
            return SharingMode.EXCLUSIVE
        wanted = self.params.get("share_mode", "auto")
        if wanted != "auto":
            mode = SharingMode(wanted)
            if spec.supports(mode) and (mode != SharingMode.MIG or spec.mig_profiles):
                return mode
        for mode in (SharingMode.MPS, SharingMode.TIME_SLICING):
            if spec.supports(mode):
                return mode
        return SharingMode.EXCLUSIVE

    def candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        """The feasible placements of ``job`` (the filter step; see the module docstring)."""
        if job.gpus <= 0:
            return self._cpu_candidates(job, view)
        if job.gpus > 1:
            if self.one_node_holds(job, view):
                return self._multi_gpu_candidates(job, view)
            return self._gang_candidates(job, view)
        return self._single_gpu_candidates(job, view)

    def eligible_specs(self, job: JobSpec, view: WorkingView) -> list[int]:
        """Spec ids of the GPUs ``job`` may use: enough memory, an allowed model."""
        need, allowed = job.memory_need_mb(), self.allowed_models(job)
        return [
            sid
            for sid, spec in enumerate(view.specs)
            if spec.memory_mb >= need and (allowed is None or spec.model in allowed)
        ]

    def one_node_holds(self, job: JobSpec, view: WorkingView) -> bool:
        """Whether some up node holds ``job.gpus`` GPUs of one usable spec (and the cores),
        busy or not: then the job waits for one node and is never spread over several."""
        return any(
            view.largest_node(sid, job.cpus) >= job.gpus for sid in self.eligible_specs(job, view)
        )

    def score_candidates(self, job: JobSpec, cands: list[Candidate], view: WorkingView) -> None:
        """Fill ``cand.score``: weighted sum of the scorers, min-max normalised when several."""
        if not self.scorers:
            return
        if len(self.scorers) == 1:
            fn = getattr(self, "score_" + self.scorers[0])
            for c in cands:
                c.score = fn(job, c, view)
                c.raw[self.scorers[0]] = c.score
            return
        for c in cands:
            c.score = 0.0
        for name in self.scorers:
            fn = getattr(self, "score_" + name)
            values = [fn(job, c, view) for c in cands]
            lo, hi = min(values), max(values)
            span = hi - lo
            w = self.weights[name]
            for c, v in zip(cands, values, strict=True):
                c.raw[name] = v
                c.score += w * (100.0 * (v - lo) / span if span > 0 else 100.0)

    def pick(
        self, job: JobSpec, cands: list[Candidate], view: WorkingView, rng: random.Random
    ) -> Candidate | None:
        """The best-scored candidate; ties go to the first in cluster order."""
        best = None
        for c in cands:
            if (
                best is None
                or c.score > best.score
                or (c.score == best.score and c.rank < best.rank)
            ):
                best = c
        return best

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        """Why ``chosen``: policies override; this default states the placement and fit."""
        return f"placed {self.placement_text(job, chosen)}"

    # -- helpers for explanations ------------------------------------------------------------------

    def placement_text(self, job: JobSpec, cand: Candidate) -> str:
        """ "on n3/gpu1 exclusive" (GPU) or "on cpu-0 (4 cores)" (CPU)."""
        if not cand.gpus:
            return f"on {cand.node.name} ({job.cpus} of {cand.node.free_cores} free cores)"
        return f"on {cand.label} {_mode_text(cand.mode, cand.mig_profile)}"

    def fit_text(self, job: JobSpec, cand: Candidate) -> str:
        """ "needs 9.1 of 16.0 GB free" for the chosen GPU (per GPU for multi-GPU jobs)."""
        if not cand.gpus:
            return f"needs {job.cpus} of {cand.node.free_cores} free cores"
        gpu = cand.gpus[0]
        need = job.memory_need_mb()
        if cand.mig_profile is not None:
            return f"needs {gb(need)} of the instance's {gb(cand.mig_profile.memory_mb)} GB"
        each = " per GPU" if len(cand.gpus) > 1 else ""
        return f"needs {gb(need)} of {gb(gpu.free_mb)} GB free{each}"

    def whole_gpus_text(self, job: JobSpec, cand: Candidate, cands: list[Candidate]) -> str:
        """Explanation for a CPU or multi-GPU placement by a co-locating policy (these take
        whole idle GPUs, or a CPU node, whatever the policy's scoring)."""
        where = self.placement_text(job, cand)
        if not cand.gpus:
            return f"placed {where}: CPU node chosen among {len(cands)} that fit"
        gpu = cand.gpus[0]
        if len(cand.gpus) == 1:  # a one-GPU job in the mode it asked (``honour_request``)
            return (
                f"placed {where} {self.residents_text(cand)}: chosen among {len(cands)} GPUs "
                f"that fit what it asked (sharing: {job.sharing}); {self.fit_text(job, cand)}"
            )
        return (
            f"placed {where}: {len(cand.gpus)} whole idle {gpu.spec.model} on one node "
            f"(multi-GPU jobs do not share), chosen among {len(cands)} node groups that fit; "
            f"{self.fit_text(job, cand)}"
        )

    def spread_speed_text(self, job: JobSpec, model: str) -> str:
        """ "unconsolidated speed 0.50x (measured)": the job's speed spread over nodes relative
        to one node, from its profile, else ``unconsolidated_speed`` (an assumption)."""
        profile = job.profile
        if profile is None or model not in profile.gpu_time_s:
            return (
                f"unconsolidated speed {self.unconsolidated_speed:.2f}x assumed "
                f"(no profiled time on {model})"
            )
        spread, measured = profile.spread_time_s(model, self.unconsolidated_speed)
        base = profile.gpu_time_s[model]
        if not spread or not math.isfinite(spread):
            return "unconsolidated speed unknown"
        how = "measured" if measured else "assumed: the profile has no unconsolidated time"
        return f"unconsolidated speed {base / spread:.2f}x ({how})"

    def explain_gang(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        """Why a gang (several nodes): which nodes, why not one, how consolidated, how fast.
        Policies may override; the default fits every policy (gangs take whole idle GPUs)."""
        gpu = chosen.gpus[0]
        model = gpu.spec.model
        k = len(chosen.gpus)
        parts = chosen.parts
        names = [node.name for node, _ in parts]
        where = ", ".join(names[:-1]) + f" and {names[-1]}"
        largest = view.largest_node(gpu.sid, job.cpus)
        idle = len(view.idle_pools.get(gpu.sid, ()))  # before this reservation
        text = (
            f"{k} GPUs on {where}: no single node has {k} {model} (the largest holds "
            f"{largest}); {len(parts)} nodes, the fewest with them idle now, fullest first "
            f"({idle} idle {model}); placed on {chosen.label} exclusive; "
            f"{self.spread_speed_text(job, model)}"
        )
        if len(cands) > 1:
            text += f"; {len(cands)} GPU models could take it"
        return text

    def gang_wait_reason(self, job: JobSpec, view: WorkingView) -> str:
        """Why a gang waits: what is missing, and when enough GPUs are predicted to be idle
        (``WorkingView.release_times``), on the usable spec predicted to have them first."""
        k, cpus = job.gpus, job.cpus
        need = job.memory_need_mb()
        best: tuple[tuple[float, int], str] | None = None
        largest_total = 0
        for sid in self.eligible_specs(job, view):
            spec = view.specs[sid]
            model = spec.model
            caps = view.node_caps.get(sid, {})
            total = sum(
                size * n for (size, cores), n in caps.items() if cores <= 0 or cores >= cpus
            )
            largest_total = max(largest_total, total)
            if total < k:
                continue
            largest = view.largest_node(sid, cpus)
            head = (
                f"needs {k} {model} at once on several nodes (no node holds {k}; the largest "
                f"holds {largest})"
            )
            idle = len(view.idle_pools.get(sid, ()))
            if idle >= k:
                usable = sum(
                    c
                    for c, orders in view.idle_buckets.get(sid, {}).items()
                    for o in orders
                    if view.nodes[o].has_cores(cpus)
                )
                if usable < k:
                    text = (
                        f"{head}: {idle} idle but only {usable} on nodes with {cpus} free "
                        f"core{'s' if cpus != 1 else ''}"
                    )
                    key = (0.0, -usable)
                    if best is None or key < best[0]:
                        best = (key, text)
                    continue
                idle = usable
            missing = k - idle
            known, unknown = view.release_order(sid, self.unconsolidated_speed)
            if len(known) >= missing:
                wait_s, job_id = known[missing - 1]
                text = (
                    f"{head}: {idle} idle; {missing} more expected in "
                    f"{duration_text(wait_s)} when job {job_id} is predicted to end"
                )
                key = (wait_s, -idle)
            else:
                text = (
                    f"{head}: {idle} idle; {missing} more needed but only {len(known)} of the "
                    f"{len(known) + unknown} busy GPUs have a predicted end (the others run "
                    f"jobs that are paused or have neither a profiled time nor a time limit)"
                )
                key = (math.inf, -idle)
            if best is None or key < best[0]:
                best = (key, text)
        if best is not None:
            return best[1]
        allowed = self.allowed_models(job)
        only = f" (profiled models: {', '.join(sorted(allowed))})" if allowed is not None else ""
        cores = f" on nodes with {cpus} cores" if cpus > 1 else ""
        return (
            f"needs {k} GPUs of one model with {gb(need)} GB{only}{cores}: the nodes that are "
            f"up hold at most {largest_total} of one such model"
        )

    def residents_text(self, cand: Candidate) -> str:
        if not cand.residents:
            return "alone for now"
        return "with " + ", ".join(f"job {j.id} ({job_type_key(j)})" for j in cand.residents)

    def interference_text(self, job: JobSpec, cand: Candidate) -> str:
        """ "; predicted slowdown 1.31 (measured)" when an interference model is configured."""
        if self.interference is None or not cand.residents or cand.gpu is None:
            return ""
        s = co_run_slowdown(self.interference, job, cand.residents, cand.gpu.spec, cand.mode)
        return f"; predicted slowdown {s:.2f} ({self.interference.name})"

    # -- the default filter ------------------------------------------------------------------------

    def _cpu_candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        out = [
            Candidate(node, (), SharingMode.EXCLUSIVE)
            for node in view.cpu_nodes
            if node.up and not node.barred and node.free_cores >= job.cpus
        ]
        if job.gpus <= 0 and self.params.get("cpu_jobs_on_gpu_nodes", True):
            # GPU nodes' spare cores, after the CPU nodes on equal scores: what is left after
            # one core for each of its idle GPUs (a node that does not count its cores,
            # cores <= 0, takes no CPU job: nothing would bound them).
            for node in view.nodes:
                if node.kind == NodeKind.CPU or not node.up or node.cores <= 0:
                    continue
                if spare_cores(node) >= job.cpus:
                    cand = Candidate(node, (), SharingMode.EXCLUSIVE)
                    cand._rank = (1, 0, cand.order)
                    out.append(cand)
        return out

    def _multi_gpu_candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        k, need, allowed = job.gpus, job.memory_need_mb(), self.allowed_models(job)
        out: list[Candidate] = []
        for sid, buckets in view.idle_buckets.items():
            spec = view.specs[sid]
            if spec.memory_mb < need or (allowed is not None and spec.model not in allowed):
                continue
            counts = sorted(c for c, nodes in buckets.items() if c >= k and nodes)
            for count in counts:
                # One candidate per (spec, idle count): the first node in order with the cores.
                node = view.first_node_with_idle(sid, count, job.cpus)
                if node is not None:
                    gpus = view.usable_idle(node, sid)[:k]
                    out.append(Candidate(node, gpus, SharingMode.EXCLUSIVE))
        out.sort(key=lambda c: c.order)  # cluster order, whatever the indexes' history
        return out

    def _gang_candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        """One gang per usable spec with ``job.gpus`` idle GPUs over its nodes (``gang``)."""
        k = job.gpus
        out: list[Candidate] = []
        for sid in self.eligible_specs(job, view):
            if len(view.idle_pools.get(sid, ())) < k:
                continue  # fewer idle GPUs of this spec in the whole cluster
            cand = view.gang(sid, k, job.cpus)
            if cand is not None:
                out.append(cand)
        out.sort(key=lambda c: c.rank)
        return out

    def _single_gpu_candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        need, cpus, allowed = job.memory_need_mb(), job.cpus, self.allowed_models(job)
        out: list[Candidate] = []
        for sid, pool in view.idle_pools.items():
            spec = view.specs[sid]
            if not pool or spec.memory_mb < need:
                continue
            if allowed is not None and spec.model not in allowed:
                continue
            mode = self.fresh_mode(spec)
            mig = None
            if mode == SharingMode.MIG:
                mig = _smallest_mig_profile(spec, need, spec.mig_total_slices)
                if mig is None:
                    continue
            gpu = view.first_with_cores(pool, cpus)
            if gpu is not None:
                out.append(Candidate(gpu.node, (gpu,), mode, mig, pool))
        # Candidates in cluster order (idle GPUs first, then shared ones), whatever the order
        # the pools were created in: the same snapshot gives the same list.
        out.sort(key=lambda c: c.order)
        if not self.colocate:
            return out
        shared: list[Candidate] = []
        rejected: list[tuple[int, int, str]] = []
        oom_rejected: list[tuple[int, int, str]] = []
        limit = int(self.params.get("max_jobs_per_gpu", 2))
        for key, pool in view.shared_pools.items():
            sid, mode, residents, committed, _mig_used, owners, shunned = key
            spec = view.specs[sid]
            if allowed is not None and spec.model not in allowed:
                continue
            if owners is not None and owners != (job.owner,):
                continue  # another user's MPS server holds the GPU
            mig = None
            if mode == SharingMode.MIG:
                mig = _smallest_mig_profile(spec, need, pool[0].free_mig_slices())
                if mig is None:
                    continue
            elif len(residents) >= limit or spec.memory_mb - committed < need:
                continue
            seen = oom_beside(job, residents, shunned)
            if seen is not None:
                oom_rejected.append((pool[0].order, len(pool), f"{seen} on {spec.model}"))
                continue
            if not self._co_run_ok(job, key, pool[0], view):
                pair = f"{job_type_key(job)} with {' + '.join(residents)} on {spec.model}"
                rejected.append((pool[0].order, len(pool), pair))
                continue
            gpu = view.first_with_cores(pool, cpus)
            if gpu is not None:
                shared.append(Candidate(gpu.node, (gpu,), mode, mig, pool))
        shared.sort(key=lambda c: c.order)
        rejected.sort()
        oom_rejected.sort()
        view.co_run_rejected = [(n, pair) for _, n, pair in rejected]
        view.oom_rejected = [(n, beside) for _, n, beside in oom_rejected]
        return out + shared

    def _co_run_ok(
        self, job: JobSpec, key: tuple[Any, ...], gpu: WorkGpu, view: WorkingView
    ) -> bool:
        """Whether ``job`` may join the residents of the shared pool ``key`` (``gpu`` is one of
        its GPUs): no infinite predicted slowdown for it or for any resident. Cached per cycle
        by job type and pool key; residents of one pool have the same job types."""
        model = self.colocation_check
        if model is None or not gpu.jobs:
            return True
        # (job type, spec id, mode, resident types): the model's inputs, so the answer holds
        # across cycles as long as the view (and its spec ids) lives.
        cache_key = (job_type_key(job), key[0], key[1], key[2])
        ok = view.co_run_ok.get(cache_key)
        if ok is None:
            residents = gpu.jobs
            mode = gpu.mode or SharingMode.MPS
            ok = math.isfinite(model.slowdown(job, residents, gpu.spec, mode))
            for i, resident in enumerate(residents):
                if not ok:
                    break
                others = [*residents[:i], *residents[i + 1 :], job]
                ok = math.isfinite(model.slowdown(resident, others, gpu.spec, mode))
            view.co_run_ok[cache_key] = ok
        return ok

    def no_fit_reason(self, job: JobSpec, view: WorkingView) -> str:
        """Why ``job`` has no candidate, with the numbers that matter."""
        need = job.memory_need_mb()
        allowed = self.allowed_models(job)
        only = f" (profiled models: {', '.join(sorted(allowed))})" if allowed is not None else ""
        if job.gpus <= 0:
            up = [n for n in view.cpu_nodes if n.up]
            where = "CPU nodes"
            if self.params.get("cpu_jobs_on_gpu_nodes", True):
                up += [n for n in view.nodes if n.kind != NodeKind.CPU and n.up and n.cores > 0]
                where = "nodes"
            if not up:
                return "CPU job: no CPU node is up"
            most = max(up, key=spare_cores)
            return (
                f"CPU job needs {job.cpus} free cores: most free is {spare_cores(most)} on "
                f"{most.name} ({len(up)} {where} up)"
            )
        if view.gpu_count == 0:
            return "no GPU in the cluster"
        if job.gpus > 1:
            if not self.one_node_holds(job, view):
                return self.gang_wait_reason(job, view)
            best = 0
            for sid, buckets in view.idle_buckets.items():
                spec = view.specs[sid]
                if spec.memory_mb >= need and (allowed is None or spec.model in allowed):
                    best = max([best, *(c for c, nodes in buckets.items() if nodes)])
            return (
                f"needs {job.gpus} idle GPUs with {gb(need)} GB on one node{only}: "
                f"at most {best} fit on any node now"
            )
        idle = sum(len(p) for s, p in view.spec_pools() if allowed is None or s.model in allowed)
        fitting_idle = sum(
            len(p)
            for s, p in view.spec_pools()
            if s.memory_mb >= need and (allowed is None or s.model in allowed)
        )
        if fitting_idle:
            return (
                f"{fitting_idle} idle GPUs could hold {gb(need)} GB{only} but none on a node "
                f"with {job.cpus} free cores"
            )
        text = f"no idle GPU with {gb(need)} GB{only} ({idle} idle GPUs, all too small)"
        if idle == 0:
            needs = f"; it needs {gb(need)} GB" if job.memory_known() else ""
            text = f"no idle GPU{only} (all {view.gpu_count} busy or down{needs})"
        if self.colocate:
            most_free = max(
                (
                    view.specs[key[0]].memory_mb - key[3]
                    for key in view.shared_pools
                    if key[1] in _SHARED_MODES
                    and len(key[2]) < int(self.params.get("max_jobs_per_gpu", 2))
                    and (allowed is None or view.specs[key[0]].model in allowed)
                ),
                default=None,
            )
            if most_free is None:
                text += "; no shared GPU below its job limit"
            else:
                text += f"; most free on a shared GPU below its job limit: {gb(most_free)} GB"
            rejected = view.co_run_rejected if job.gpus == 1 else []
            if rejected:
                gpus = sum(n for n, _ in rejected)
                model_name = self.colocation_check.name if self.colocation_check else "?"
                text += (
                    f"; {gpus} shared GPU(s) with room rejected because the pair cannot co-run "
                    f"({model_name} interference: infeasible, e.g. {rejected[0][1]})"
                )
            oom_rejected = view.oom_rejected if job.gpus == 1 else []
            if oom_rejected:
                gpus = sum(n for n, _ in oom_rejected)
                text += (
                    f"; {gpus} shared GPU(s) with room skipped: this job was OOM-killed beside "
                    f"their jobs' type before, or theirs beside its type (e.g. "
                    f"{oom_rejected[0][1]})"
                )
            other_users = sum(
                len(pool)
                for key, pool in view.shared_pools.items()
                if key[5] is not None and key[5] != (job.owner,)
            )
            if other_users and job.gpus == 1:
                text += (
                    f"; {other_users} MPS GPU(s) serve another user's jobs (MPS serves one "
                    "user per GPU)"
                )
            mig_free = [
                view.specs[key[0]].mig_total_slices - key[4]
                for key in view.shared_pools
                if key[1] == SharingMode.MIG
            ]
            if mig_free:
                text += (
                    f"; no MIG instance of {gb(need)} GB fits "
                    f"(at most {max(mig_free)} free compute slices on a MIG GPU)"
                )
        return text


def _mode_matches(cand: Candidate, wanted: str) -> bool:
    """Whether ``cand``'s mode is one a job asking ``sharing: wanted`` accepts."""
    if wanted == SHARING_ALLOWED:
        return True
    if wanted in (SharingMode.MPS.value, SharingMode.TIME_SLICING.value):
        return cand.mode == SharingMode(wanted)
    if wanted == SHARING_NEVER:
        return cand.mode == SharingMode.EXCLUSIVE
    return cand.mode == SharingMode.MIG and (
        cand.mig_profile is not None and cand.mig_profile.name == wanted
    )


def _make_fresh(cand: Candidate, wanted: str) -> None:
    """Start ``cand``'s idle GPU(s) under the mode ``sharing: wanted`` asks: MPS or
    time-slicing where every GPU supports it, else exclusive (a whole GPU satisfies any
    request)."""
    mode = SharingMode.EXCLUSIVE
    if cand.mode == SharingMode.MIG and len(cand.gpus) == 1:
        # The policy starts a MIG GPU: the instance asked, if the GPU offers it.
        gpu = cand.gpus[0]
        prof = gpu.spec.mig_profile(wanted)
        if prof is not None and prof.compute_slices <= gpu.free_mig_slices():
            cand.mig_profile = prof
            return
    if wanted in (SharingMode.MPS.value, SharingMode.TIME_SLICING.value):
        asked = SharingMode(wanted)
        if all(g.spec.supports(asked) for g in cand.gpus) and len(cand.gpus) == 1:
            mode = asked
    cand.start_fresh(mode)


def _gpu_at(node: NodeState, index: int) -> GpuState | None:
    """The GPU of ``node`` with ``index`` (GPUs are usually listed in index order)."""
    gpus = node.gpus
    if 0 <= index < len(gpus) and gpus[index].index == index:
        return gpus[index]
    return next((g for g in gpus if g.index == index), None)


def duration_text(seconds: float) -> str:
    """ "about 25 min", "about 3.5 h", "about 2 days" (for predicted waits)."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"about {round(seconds / 60)} min"
    if seconds < 48 * 3600:
        hours = seconds / 3600
        return f"about {hours:.1f} h" if hours < 10 else f"about {round(hours)} h"
    return f"about {seconds / 86400:.1f} days"


def _smallest_mig_profile(spec: GpuSpec, need_mb: float, free_slices: int) -> MigProfile | None:
    """The MIG profile with the least memory >= ``need_mb`` that fits in ``free_slices``."""
    best = None
    for prof in spec.mig_profiles:
        if (
            prof.memory_mb >= need_mb
            and prof.compute_slices <= free_slices
            and (
                best is None
                or (prof.memory_mb, prof.compute_slices) < (best.memory_mb, best.compute_slices)
            )
        ):
            best = prof
    return best

"""What a candidate placement is made of: the per-cycle copies of GPUs and nodes, and a candidate.

``WorkGpu`` and ``WorkNode`` are light mutable copies of a snapshot's ``GpuState`` and
``NodeState`` that a ``WorkingView`` (``scheduler.policies.working_view``) keeps and updates as
the framework's cycle places jobs (``scheduler.policies.framework``), so later jobs of the same
cycle see earlier decisions. A ``Candidate`` is one feasible placement over them: a node and its
GPUs (none for a CPU job), the sharing mode and MIG profile, or for a gang, several nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.domain import GpuState, JobSpec, MigProfile, NodeKind, NodeState, SharingMode


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


def job_type_key(job: JobSpec) -> str:
    """What makes two jobs interchangeable for pooling and scoring: the job type, else the
    profile name, else the job id (no pooling). ``JobSpec.type_key``."""
    return job.type_key()


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

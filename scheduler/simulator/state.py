"""The simulator's mutable records of a job, a GPU and a node (``scheduler.simulator.engine``).

A ``SimJob`` holds a job's progress (0 to 1 of its solo work), its speed and the memory phases
of its profile as segments (GPU memory as a function of progress); a ``SimGpu`` the jobs on it,
its mode and MIG slices; a ``SimNode`` its cores and GPUs. The engine integrates progress lazily
between events (``SimJob.progress_at``); the policy never sees these objects, only the
``ClusterState`` snapshots built from them (``scheduler.simulator.base``).
"""

from __future__ import annotations

import bisect

from scheduler.domain import GpuSpec, JobSpec, NodeKind, Placement, SharingMode
from scheduler.simulator.elastic import DataParallelJob
from scheduler.simulator.results import EndReason

MEM_TOL_MB = 1e-3  # memory may exceed capacity by this much (float noise) before an OOM

# A job's status in the engine.
PENDING, RUNNING, DONE = "pending", "running", "done"


class SimJob:
    __slots__ = (
        "spec",
        "seq",
        "status",
        "placement",
        "gpus",
        "nodes",
        "model",
        "solo_s",
        "ref_s",
        "progress",
        "t_last",
        "rate",
        "paused",
        "version",
        "first_start",
        "last_start",
        "finish",
        "reason",
        "explanation",
        "segments",
        "bounds",
        "const_mem",
        "oom_count",
        "restarts",
        "preemptions",
        "paused_since",
        "paused_total",
        "rj_version",
        "waiting",
        "target",
        "ready_at",
        "restart_cost",
        "work_factor",
        "dp",
        "gpu_s",
        "held_since",
        "obs_t",
        "obs_p",
        "obs_ctx",
        "obs_since",
        "obs_gen",
        "run_s",
    )

    def __init__(self, spec: JobSpec, seq: int, work_factor: float = 1.0) -> None:
        self.spec = spec
        self.seq = seq
        self.status = PENDING
        self.placement: Placement | None = None
        self.gpus: list[SimGpu] = []
        self.nodes: list[SimNode] = []  # node rank order (one unless a gang)
        self.model: str | None = None
        self.solo_s = 0.0  # solo time of its placement: spread over nodes for a gang
        self.ref_s = 0.0  # solo time on one node of its model (Slow-Down's reference)
        self.progress = 0.0
        self.t_last = 0.0
        self.rate = 0.0
        self.paused = False
        self.version = 0
        self.first_start: float | None = None
        self.last_start = 0.0
        self.finish: float | None = None
        self.reason: EndReason | None = None
        self.explanation = ""
        self.waiting = ""
        self.oom_count = 0
        self.restarts = 0
        self.preemptions = 0
        self.paused_since = 0.0
        self.paused_total = 0.0
        self.rj_version = 0
        self.target = 1.0  # progress at its next scheduled event (a step boundary or 1)
        self.ready_at = 0.0  # no progress before this time (a MIG instance being created)
        self.restart_cost = 0.0  # seconds without progress at its next start (preempted)
        self.dp: DataParallelJob | None = None  # an elastic job on a measured curve
        self.gpu_s = 0.0  # GPU-seconds held so far
        self.held_since = 0.0
        # True work / estimated work (noisy estimates: scheduler.estimates). Engine-private:
        # the profile holds the estimate the policy reads; the simulator runs the true work.
        self.work_factor = work_factor
        # The observation window being measured (what a live cluster would see): since obs_t,
        # from declared progress obs_p, under obs_ctx (model, mode, co-runner types, spread,
        # GPUs); None while not running.
        self.obs_t = 0.0
        self.obs_p = 0.0
        self.obs_ctx: tuple | None = None
        self.obs_since = 0.0  # when the window's speed and context began (report back-off)
        self.obs_gen = 0  # bumped when a window opens or closes (stale report entries)
        self.run_s = 0.0  # seconds placed, every attempt
        # Memory phases as segments (start, end, from_mb, to_mb); bounds = starts.
        steps = spec.profile.memory_steps if spec.profile is not None else ()
        self.const_mem = spec.memory_need_mb()
        self.segments: list[tuple[float, float, float, float]] = []
        for i, s in enumerate(steps):
            end = steps[i + 1].start_fraction if i + 1 < len(steps) else 1.0
            if end > s.start_fraction:
                self.segments.append((s.start_fraction, end, s.from_mb, s.to_mb))
        if self.segments and self.segments[0][0] > 0:
            first = self.segments[0]
            self.segments.insert(0, (0.0, first[0], first[2], first[2]))
        self.bounds = [seg[0] for seg in self.segments]

    # Memory as a function of progress -----------------------------------------------------

    def mem_at(self, p: float) -> float:
        """GPU memory (MB, per GPU) at progress ``p``."""
        if not self.segments:
            return self.const_mem
        i = max(0, bisect.bisect_right(self.bounds, p) - 1)
        start, end, lo, hi = self.segments[i]
        frac = min(1.0, max(0.0, (p - start) / (end - start)))
        return lo + (hi - lo) * frac

    def mem_slope(self, p: float) -> float:
        """d memory / d progress (MB per unit progress) in the segment holding ``p``."""
        if not self.segments or p >= 1.0:
            return 0.0
        i = max(0, bisect.bisect_right(self.bounds, p) - 1)
        start, end, lo, hi = self.segments[i]
        return (hi - lo) / (end - start)

    def next_bound(self, p: float) -> float | None:
        i = bisect.bisect_right(self.bounds, p + 1e-12)
        return self.bounds[i] if i < len(self.bounds) else None

    @property
    def mig_profile(self) -> str | None:
        """The MIG instance profile of its placement (None: not placed, or not under MIG)."""
        return self.placement.mig_profile if self.placement is not None else None

    def progress_at(self, now: float) -> float:
        if self.rate <= 0.0:
            return self.progress
        return min(1.0, self.progress + self.rate * (now - self.t_last))


class SimGpu:
    __slots__ = ("node", "index", "spec", "mode", "jobs", "mig_used", "version", "util")

    def __init__(self, node: SimNode, index: int, spec: GpuSpec) -> None:
        self.node = node
        self.index = index
        self.spec = spec
        self.mode: SharingMode | None = None
        self.jobs: list[SimJob] = []
        self.mig_used = 0
        self.version = 0
        self.util = 0.0

    @property
    def live(self) -> bool:
        """True if its memory use changes with time (a job on it has memory steps)."""
        return any(j.segments for j in self.jobs)

    def label(self) -> str:
        return f"{self.node.name}/{self.index}"


class SimNode:
    __slots__ = ("spec_index", "name", "kind", "cores", "free_cores", "memory_mb", "gpus")

    def __init__(self, spec_index: int, name: str, kind: NodeKind, cores: int, memory: float):
        self.spec_index = spec_index
        self.name = name
        self.kind = kind
        self.cores = cores
        self.free_cores = cores
        self.memory_mb = memory
        self.gpus: list[SimGpu] = []

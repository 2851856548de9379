"""``kscheduler``: kernel-class co-run groups with MPS shares from each kernel's saturation point
(ALGORITHMS §3, thesis 003 chapter IV), and its baselines ``even_partition`` and
``warped_slicer``.

A *kernel* here is a single-GPU job whose profile has stall reasons (its class: ``memory``,
``l1`` or ``compute``, ``scheduler.classes.kernel_class``), EPC and registers per block. The
three policies turn the pending kernels into *co-run groups* and start a group on an idle GPU
under MPS, every member with its own ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: the portable
equivalent of the thesis' thread-block partition (its modified runtime is not on stock
drivers). Groups start one at a time per GPU, when the GPU is idle (the thesis runs its list
of groups in order); the percentage is only sent where the GPU honours it (Volta and later,
``GpuSpec.mps_thread_limit``), and always quoted in the explanation. Jobs of one group have one
owner (MPS serves one unix user per GPU). Jobs that are not kernels run alone (exclusive) on an
idle GPU; multi-GPU and CPU jobs as the framework places them.

**kscheduler** (Fig. 25): sort kernels ``l1`` first, then ``memory``, then ``compute``, longer
first within a class (solo time, the shortest profiled one); then, while kernels are left,
start a group CK and move into it, in list order, every kernel for which rules 1-5 hold
against CK:

1. per SM, at each kernel's saturation point (``Profile.saturation_tbs_per_sm``, else the
   model's knee): sum of registers + K's < ``max_regs``; of shared memory < ``max_smem_bytes``;
   of thread blocks < ``max_tbs``;
2. sum of DRAM demand + K's < the GPU's bandwidth; sum of GFLOPS + K's < ``max_gflops``
   (default: the GPU's peak);
3. no two ``l1`` kernels; a non-``l1`` kernel joins an ``l1`` one only with
   ``l1_transactions`` below ``l1_threshold``;
4. no two ``memory`` kernels;
5. a ``compute`` kernel with EPC > ``max_epc`` in CK admits no K with EPC > ``base_epc``;
   one with EPC > ``base_epc`` admits no K with EPC > ``max_epc``.

Each member's percentage is the share of an SM its blocks take at its saturation point
(``scheduler.kernels.share_for_saturation``: the largest of its registers, shared memory and
block-slot shares).

**even_partition**: groups of ``group_size`` kernels in queue order, each member
``100 / size`` percent. **warped_slicer**: groups of ``group_size`` (the "K" of Fig. 26, 3),
thread blocks by water-filling on each kernel's solo scalability curve (``kernels.perf_table``):
every member starts at one block per SM and the block that adds the most solo performance per
share of SM it costs goes next, while the group fits an SM; the percentage is the footprint of
the blocks each member got. Neither looks at classes or contention (that is the point of the
comparison).

Reading chosen (the thesis gives no values): ``base_epc`` 1.0 (Observation #5 splits EPC at
1), ``max_epc`` 4.0, ``l1_threshold`` 10.0 (in the units of ``Profile.l1_transactions``; the
kscheduler003 profiles use the proxy of ``scheduler.kernels``), per-SM limits of the thesis'
Titan Xp (64 K registers, 96 KB shared memory, 32 blocks; Pascal to Hopper share the first and
the last).

Parameters: the framework's (``max_jobs_per_gpu`` default 4 caps a group) and the ones above,
plus ``join_running`` (bool, False): also let a kernel join a GPU whose group is still running
when rules 1-5 hold against it (a dynamic variant; the thesis leaves dynamic arrivals to future
work).
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from scheduler.classes import kernel_class
from scheduler.domain import ClusterState, GpuSpec, JobSpec, Plan, Profile, SharingMode
from scheduler.kernels import (
    TITAN_XP,
    SmLimits,
    dram_demand,
    footprint,
    is_kernel,
    kernel_knee,
    perf_table,
    share_for_saturation,
)
from scheduler.policies.base import PolicyError
from scheduler.policies.framework import (
    Candidate,
    FrameworkPolicy,
    WorkGpu,
    WorkingView,
    framework_defaults,
    oom_beside,
)

MPS = SharingMode.MPS
_CLASS_ORDER = {"l1": 0, "memory": 1, "compute": 2}

corun_defaults: dict[str, Any] = {
    **framework_defaults,
    "max_jobs_per_gpu": 4,
    "max_regs": TITAN_XP.max_regs,
    "max_smem_bytes": TITAN_XP.max_smem_bytes,
    "max_tbs": TITAN_XP.max_tbs,
    "max_gflops": None,
    "join_running": False,
}


def solo_s(job: JobSpec) -> float:
    """The job's shortest profiled solo time (s), inf if none (sorting only)."""
    times = [t for t in (job.profile.gpu_time_s.values() if job.profile else ()) if t > 0]
    return min(times) if times else math.inf


def prof_of(job: JobSpec) -> Profile:
    """The profile of a kernel job (kernels have one: ``CoRunGroupPolicy.kernel``)."""
    if job.profile is None:
        raise PolicyError(f"job {job.id} is not a profiled kernel")
    return job.profile


def saturation(job: JobSpec, limits: SmLimits) -> int:
    """Thread blocks per SM at the kernel's saturation point (profile, else the model's)."""
    profile = prof_of(job)
    return profile.saturation_tbs_per_sm or kernel_knee(profile, limits)


class CoRunGroupPolicy(FrameworkPolicy):
    """Forms co-run groups (``form_groups``) and starts each on an idle GPU under MPS."""

    colocate: ClassVar[bool] = True
    defaults: ClassVar[Mapping[str, Any]] = corun_defaults

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        try:
            self.limits = SmLimits(
                max_regs=int(p["max_regs"]),
                max_smem_bytes=int(p["max_smem_bytes"]),
                max_tbs=int(p["max_tbs"]),
            )
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"policy {self.name!r}: SM limits must be integers") from exc
        self.group_of: dict[str, int] = {}
        self.groups: list[list[JobSpec]] = []
        self.shares: dict[str, int] = {}
        self._gpu_of: dict[int, WorkGpu] = {}
        self._extras: dict[str, dict[str, Any]] = {}
        self._notes: dict[str, str] = {}
        self._group_text: dict[int, str] = {}
        self._spec: GpuSpec | None = None

    # -- groups --------------------------------------------------------------------------------

    def form_groups(self, kernels: list[JobSpec], spec: GpuSpec | None) -> list[list[JobSpec]]:
        raise NotImplementedError

    def group_shares(self, group: Sequence[JobSpec], spec: GpuSpec | None) -> list[int]:
        """MPS percentage of each member (1..100)."""
        raise NotImplementedError

    def group_note(self, group: Sequence[JobSpec]) -> str:
        return f"co-run group of {len(group)}"

    def kernel(self, job: JobSpec) -> bool:
        return job.gpus == 1 and is_kernel(job.profile) and kernel_class(job.profile) is not None

    # -- the cycle -----------------------------------------------------------------------------

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        self._extras, self._notes = {}, {}
        plan = super().schedule(state, rng)
        decisions = tuple(
            replace(d, placement=replace(d.placement, **self._extras[d.placement.job_id]))
            if d.placement.job_id in self._extras
            else d
            for d in plan.decisions
        )
        waiting = {j: self._notes.get(j, why) for j, why in plan.waiting.items()}
        return Plan(decisions=decisions, actions=plan.actions, waiting=waiting)

    def begin_cycle(self, state: ClusterState, view: WorkingView) -> None:
        super().begin_cycle(state, view)
        # The GPU model groups are sized for: the first MPS-capable one in the cluster.
        self._spec = next(
            (g.spec for n in state.nodes for g in n.gpus if g.spec.supports(MPS)), None
        )
        kernels = [j for j in state.pending if self.kernel(j)]
        self.groups = self.form_groups(kernels, self._spec)
        self.group_of = {j.id: k for k, group in enumerate(self.groups) for j in group}
        self.shares = {}
        self._group_text = {}
        for k, group in enumerate(self.groups):
            for j, pct in zip(group, self.group_shares(group, self._spec), strict=True):
                self.shares[j.id] = pct
            self._group_text[k] = self.group_note(group)
        self._gpu_of = {}

    def sort_queue(
        self, pending: Sequence[JobSpec], view: WorkingView, rng: random.Random
    ) -> list[JobSpec]:
        grouped = [j for group in self.groups for j in group]
        others = [j for j in pending if j.id not in self.group_of]
        return grouped + others

    def feasibility_key(self, job: JobSpec) -> Any:
        # Group members are placed one by one on their group's GPU: no shape sharing.
        return job.id if job.id in self.group_of else None

    # -- candidates ----------------------------------------------------------------------------

    def candidates(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        if job.gpus != 1:
            return super().candidates(job, view)
        need, cpus, allowed = job.memory_need_mb(), job.cpus, self.allowed_models(job)
        k = self.group_of.get(job.id)
        if k is not None and k not in self._gpu_of and self.groups[k][0].id != job.id:
            self._notes[job.id] = (
                f"{self._group_text[k]} (group {k + 1} of {len(self.groups)}) waits for its "
                f"first member, job {self.groups[k][0].id}, to start it"
            )
            return []
        if k is not None and k in self._gpu_of:
            gpu = self._gpu_of[k]  # join the group's GPU
            if gpu.node.has_cores(cpus) and gpu.free_mb >= need:
                return [Candidate(gpu.node, (gpu,), MPS, None, None)]
            self._notes[job.id] = f"its group's GPU {gpu.label} has no room left for it"
            return []
        mode = MPS if k is not None else SharingMode.EXCLUSIVE
        out: list[Candidate] = []
        for sid, pool in view.idle_pools.items():
            spec = view.specs[sid]
            if not pool or spec.memory_mb < need or not spec.supports(mode):
                continue
            if allowed is not None and spec.model not in allowed:
                continue
            first = view.first_with_cores(pool, cpus)
            if first is not None:
                out.append(Candidate(first.node, (first,), mode, None, pool))
        if k is not None and self.params.get("join_running") and not out:
            out = self._join_running(job, view)
        out.sort(key=lambda c: c.order)
        if not out and k is not None:
            self._notes[job.id] = (
                f"{self._group_text[k]} (group {k + 1} of {len(self.groups)}) waits for an "
                "idle GPU: groups start on idle GPUs, one at a time"
            )
        return out

    def _join_running(self, job: JobSpec, view: WorkingView) -> list[Candidate]:
        out = []
        for key, pool in view.shared_pools.items():
            if key[1] != MPS or (key[5] is not None and key[5] != (job.owner,)):
                continue
            if oom_beside(job, key[2], key[6]) is not None:
                continue  # an observed OOM kill of this pair (framework)
            for gpu in pool:
                if (
                    len(gpu.jobs) < int(self.params["max_jobs_per_gpu"])
                    and gpu.free_mb >= job.memory_need_mb()
                    and gpu.node.has_cores(job.cpus)
                    and all(self.kernel(r) for r in gpu.jobs)
                    and self.fits_group(list(gpu.jobs), job, gpu.spec)
                ):
                    out.append(Candidate(gpu.node, (gpu,), MPS, None, None))
                    break
        return out

    def fits_group(self, group: list[JobSpec], job: JobSpec, spec: GpuSpec | None) -> bool:
        """Whether ``job`` may join ``group`` (default: by size only)."""
        return len(group) < int(self.params["max_jobs_per_gpu"])

    def pick(
        self, job: JobSpec, cands: list[Candidate], view: WorkingView, rng: random.Random
    ) -> Candidate | None:
        chosen = min(cands, key=lambda c: c.order) if cands else None
        if chosen is None or job.gpus != 1:
            return chosen if chosen is not None else None
        k = self.group_of.get(job.id)
        if k is not None:
            self._gpu_of.setdefault(k, chosen.gpus[0])
            if chosen.gpus[0].spec.mps_thread_limit and chosen.mode == MPS:
                self._extras[job.id] = {"mps_percentage": self.shares[job.id]}
        return chosen

    def explain(
        self, job: JobSpec, chosen: Candidate, cands: list[Candidate], view: WorkingView
    ) -> str:
        if job.gpus != 1:
            return self.whole_gpus_text(job, chosen, cands)
        k = self.group_of.get(job.id)
        where = self.placement_text(job, chosen)
        if k is None:
            return (
                f"placed {where}: not a profiled kernel (no stall reasons, EPC or registers), "
                f"so it runs alone; {self.fit_text(job, chosen)}"
            )
        pct = self.shares[job.id]
        gpu = chosen.gpus[0]
        share = (
            f"MPS {pct}%"
            if gpu.spec.mps_thread_limit
            else f"share {pct}% not enforced ({gpu.spec.architecture}: MPS without a thread limit)"
        )
        cls = kernel_class(job.profile)
        epc = job.profile.epc if job.profile is not None else None
        return (
            f"{self._group_text[k]} (group {k + 1} of {len(self.groups)}): placed {where} "
            f"{self.residents_text(chosen)}; {share}; {cls} kernel, EPC {epc:g}; "
            f"{self.fit_text(job, chosen)}"
        )


class KSchedulerPolicy(CoRunGroupPolicy):
    """K-Scheduler's groups (module docstring)."""

    name: ClassVar[str] = "kscheduler"
    defaults: ClassVar[Mapping[str, Any]] = {
        **corun_defaults,
        "base_epc": 1.0,
        "max_epc": 4.0,
        "l1_threshold": 10.0,
    }

    def sort_kernels(self, kernels: Sequence[JobSpec]) -> list[JobSpec]:
        """l1, then memory, then compute; longer first within a class (Fig. 25, line 2)."""
        return sorted(
            kernels,
            key=lambda j: (_CLASS_ORDER[kernel_class(j.profile) or "compute"], -solo_s(j), j.id),
        )

    def form_groups(self, kernels: list[JobSpec], spec: GpuSpec | None) -> list[list[JobSpec]]:
        left = self.sort_kernels(kernels)
        groups = []
        while left:
            group: list[JobSpec] = []
            rest = []
            for k in left:
                if self.rules(group, k, spec) is None:
                    group.append(k)
                else:
                    rest.append(k)
            groups.append(group)
            left = rest
        return groups

    def fits_group(self, group: list[JobSpec], job: JobSpec, spec: GpuSpec | None) -> bool:
        return self.rules(group, job, spec) is None

    def rules(self, group: Sequence[JobSpec], k: JobSpec, spec: GpuSpec | None) -> str | None:
        """None if ``k`` may join ``group`` (rules 1-5, one owner, the job limit); else the
        first rule that fails, as text."""
        if not group:
            return None
        p = self.params
        lim = self.limits
        if len(group) >= int(p["max_jobs_per_gpu"]):
            return "group full (max_jobs_per_gpu)"
        if any(g.owner != k.owner for g in group):
            return "another owner (MPS serves one user per GPU)"
        members = [*group, k]
        prof = [prof_of(m) for m in members]
        sat = [saturation(m, lim) for m in members]
        # Rule 1: static resources per SM at each kernel's saturation point.
        regs = sum((q.registers_per_block or 0) * s for q, s in zip(prof, sat, strict=True))
        smem = sum((q.smem_per_block_bytes or 0) * s for q, s in zip(prof, sat, strict=True))
        if not (regs < lim.max_regs and smem < lim.max_smem_bytes and sum(sat) < lim.max_tbs):
            return "rule 1 (registers, shared memory or blocks per SM)"
        # Rule 2: system supply.
        if spec is not None:
            bw = sum(dram_demand(q) for q in prof)
            max_gflops = p.get("max_gflops") or spec.peak_gflops
            gflops = sum(q.gflops or 0.0 for q in prof)
            if not (bw < spec.dram_bw_gbps and gflops < float(max_gflops)):
                return "rule 2 (DRAM bandwidth or GFLOPS)"
        cls = [kernel_class(m.profile) for m in group]
        kc = kernel_class(k.profile)
        l1_t = float(p["l1_threshold"])
        # Rule 3: l1 kernels.
        if kc == "l1" and "l1" in cls:
            return "rule 3 (two L1-intensive kernels)"
        if kc != "l1" and "l1" in cls and (prof_of(k).l1_transactions or 0.0) >= l1_t:
            return "rule 3 (too many L1 transactions next to an L1-intensive kernel)"
        if kc == "l1":
            for m in group:
                if (prof_of(m).l1_transactions or 0.0) >= l1_t:
                    return "rule 3 (an L1-heavy kernel already in the group)"
        # Rule 4: memory kernels.
        if kc == "memory" and "memory" in cls:
            return "rule 4 (two memory-intensive kernels)"
        # Rule 5: EPC of compute kernels.
        if kc == "compute":
            base, top = float(p["base_epc"]), float(p["max_epc"])
            epcs = [
                prof_of(m).epc or 0.0 for m, c in zip(group, cls, strict=True) if c == "compute"
            ]
            epc = prof_of(k).epc or 0.0
            if any(e > top for e in epcs) and epc > base:
                return "rule 5 (high-EPC compute kernels together)"
            if any(e > base for e in epcs) and epc > top:
                return "rule 5 (high-EPC compute kernels together)"
        return None

    def group_shares(self, group: Sequence[JobSpec], spec: GpuSpec | None) -> list[int]:
        return [share_for_saturation(prof_of(j), self.limits) for j in group]

    def group_note(self, group: Sequence[JobSpec]) -> str:
        classes = "+".join(kernel_class(j.profile) or "?" for j in group)
        return f"K-Scheduler co-run group of {len(group)} ({classes}; rules 1-5 hold)"


class EvenPartitionPolicy(CoRunGroupPolicy):
    """Groups of ``group_size`` in queue order, equal shares."""

    name: ClassVar[str] = "even_partition"
    defaults: ClassVar[Mapping[str, Any]] = {**corun_defaults, "group_size": 3}

    def _size(self) -> int:
        size = int(self.params["group_size"])
        if size < 1:
            raise PolicyError(f"policy {self.name!r}: group_size must be >= 1")
        return min(size, int(self.params["max_jobs_per_gpu"]))

    def form_groups(self, kernels: list[JobSpec], spec: GpuSpec | None) -> list[list[JobSpec]]:
        size = self._size()
        groups: list[list[JobSpec]] = []
        for k in kernels:  # queue order; a group holds one owner's jobs
            if groups and len(groups[-1]) < size and groups[-1][0].owner == k.owner:
                groups[-1].append(k)
            else:
                groups.append([k])
        return groups

    def group_shares(self, group: Sequence[JobSpec], spec: GpuSpec | None) -> list[int]:
        return [max(1, 100 // len(group))] * len(group)

    def group_note(self, group: Sequence[JobSpec]) -> str:
        return f"even partition: group of {len(group)} in queue order, equal shares"


class WarpedSlicerPolicy(EvenPartitionPolicy):
    """Groups of ``group_size`` in queue order, blocks by water-filling on solo curves."""

    name: ClassVar[str] = "warped_slicer"

    def group_shares(self, group: Sequence[JobSpec], spec: GpuSpec | None) -> list[int]:
        lim = self.limits
        profiles = [prof_of(j) for j in group]
        curves = [perf_table(p, lim) for p in profiles]
        tbs = [1] * len(group)

        def fits(alloc: list[int]) -> bool:
            regs = sum(
                a * (p.registers_per_block or 0) for a, p in zip(alloc, profiles, strict=True)
            )
            smem = sum(
                a * (p.smem_per_block_bytes or 0) for a, p in zip(alloc, profiles, strict=True)
            )
            return regs <= lim.max_regs and smem <= lim.max_smem_bytes and sum(alloc) <= lim.max_tbs

        while True:
            best, gain = None, 0.0
            for i, curve in enumerate(curves):
                if tbs[i] >= len(curve):
                    continue
                trial = list(tbs)
                trial[i] += 1
                if not fits(trial):
                    continue
                cost = footprint(profiles[i], 1, lim)
                g = (curve[tbs[i]] - curve[tbs[i] - 1]) / cost
                if g > gain + 1e-12:
                    best, gain = i, g
            if best is None:
                break
            tbs[best] += 1
        return [
            max(1, min(100, math.ceil(100.0 * footprint(p, t, lim) - 1e-9)))
            for p, t in zip(profiles, tbs, strict=True)
        ]

    def group_note(self, group: Sequence[JobSpec]) -> str:
        return (
            f"Warped-slicer: group of {len(group)} in queue order, blocks by water-filling on "
            "solo scalability curves"
        )

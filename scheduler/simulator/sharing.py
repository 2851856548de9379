"""How fast a job runs on a shared GPU, by sharing mode, and the MIG layouts of the simulator.

Two things live here (docs/sharing.md is the long version, with each constant's source):

**``SharingModel``** (interference model ``sharing``; ``--interference sharing``): the speed of
a job relative to its solo speed on the whole GPU, given the mode and what shares the GPU with
it. The engine asks it through ``gpu_factor`` (placements included, so MPS percentages and MIG
instances are seen):

- *Sensitivity curve.* A job given a share ``f`` of the GPU's SMs runs at ``f ** alpha`` of its
  whole-GPU speed, ``alpha = ln(S) / ln(4)`` clamped to 0..1, where ``S`` is the profile's
  ``sensitivity``: paper 001 measures it as throughput on the whole A30 over throughput on its
  smallest MIG instance, 1g.6gb, a quarter of the SMs (hence the 4). ``S`` = 4 is linear
  scaling, ``S`` = 1 a job that does not use more than a quarter of the GPU. Without a
  sensitivity, ``alpha = default_alpha`` (1: linear, the engine's old MIG rule).
- *MIG*: ``f`` = the instance's compute slices / the GPU's; speed ``f ** alpha x (1 -
  mig_overhead)``; no interference (hardware isolation, §4 Table 1). ``mig_overhead`` = 0.08
  from paper 001 Fig. 5: a big job ran 8 % faster time-sliced alone than in a whole-GPU MIG
  instance.
- *Time-slicing*: ``n`` unpaused jobs take turns: each runs at ``1 / (n (1 + overhead))``,
  ``overhead`` the simulator's ``context_switch_overhead``; contexts do not overlap, so no
  interference on top, and a job's sensitivity does not matter (it has the whole GPU in its
  turn).
- *MPS*: job ``i`` asks ``p_i`` percent (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``; 100 without
  one, or on a GPU that ignores it, i.e. before Volta). Shares ``f_i = p_i / 100`` while the
  percentages add up to at most 100, else ``p_i / sum p`` (the SMs are oversubscribed and
  shared in proportion). Speed ``f_i ** alpha_i / I_i`` with ``I_i`` the interference by C/M
  class (§4: M+M worst, C+C middle, M+C best) on top of the SM split: ``1 + sum over
  co-runners (factor - 1)`` with factors ``mm`` 1.35, ``cc`` 1.10, ``mc`` 1.00. They are the
  ``class_based`` model's total slowdowns (1.9 / 1.5 / 1.2) divided by the SM-split loss of a
  median job (``alpha`` 0.5 at half the SMs: 1.41), ``mc`` clamped at 1 (paper 001 Fig. 7:
  M-C pairs under MPS run about as fast as alone on half an A30). Kernels (profiles with stall
  reasons, EPC and registers: ``scheduler.kernels``) use the kernel-level model instead, with
  their percentages as SM shares.

**``MigBook``**: the instances configured on each MIG GPU of the simulated cluster. A MIG job
takes a free instance of its profile; if there is none, an instance is created, and a
placement may ask for a whole new layout (``Placement.mig_layout``). Any change costs
``relayout_s`` (``SimConfig.mig_relayout_s``) before the job starts. A requested layout must be
valid for the model (``scheduler.catalog``) and keep every instance in use; an instance created
on demand is checked against the compute slices only (the policies of the framework count
slices, not start positions).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.catalog import MigLayoutError, check_mig_layout
from scheduler.classes import CM_THRESHOLD, cm_class, kernel_class
from scheduler.domain import GpuSpec, JobSpec, Placement, SharingMode
from scheduler.interference_rules import combine_pairwise
from scheduler.kernels import corun_speeds, is_kernel

#: Paper 001 measures sensitivity from the smallest A30 instance (1/4 of the SMs) up.
SENSITIVITY_SPAN = 4.0


def sensitivity_exponent(sensitivity: float | None, default: float = 1.0) -> float:
    """``alpha`` of the sensitivity curve (module docstring): ``ln S / ln 4`` in 0..1."""
    if sensitivity is None or sensitivity <= 0:
        return default
    return min(1.0, max(0.0, math.log(sensitivity) / math.log(SENSITIVITY_SPAN)))


def share_speed(share: float, alpha: float) -> float:
    """Speed (relative to the whole GPU) of a job with ``share`` (0..1] of the SMs."""
    if share <= 0:
        return 0.0
    return min(1.0, share) ** alpha


@dataclass
class SharingModel:
    """The ``sharing`` interference model (module docstring). Parameters are the constants."""

    mm: float = 1.35
    cc: float = 1.10
    mc: float = 1.00
    unknown: float = 1.10
    mig_overhead: float = 0.08
    default_alpha: float = 1.0
    cm_threshold: float = CM_THRESHOLD
    name: str = field(default="sharing", init=False)

    def __post_init__(self) -> None:
        if not (1.0 <= self.mc <= self.cc <= self.mm):
            raise ValueError(
                f"sharing model: need 1 <= mc <= cc <= mm (§4 order); got mc={self.mc}, "
                f"cc={self.cc}, mm={self.mm}"
            )
        if not 0.0 <= self.mig_overhead < 1.0:
            raise ValueError("sharing model: mig_overhead must be in [0, 1)")

    # -- pieces --------------------------------------------------------------------------------

    def alpha(self, job: JobSpec) -> float:
        profile = job.profile
        return sensitivity_exponent(
            profile.sensitivity if profile is not None else None, self.default_alpha
        )

    def job_class(self, job: JobSpec) -> str | None:
        cls = cm_class(job.profile, threshold=self.cm_threshold)
        if cls is not None:
            return cls
        kc = kernel_class(job.profile)
        return None if kc is None else ("C" if kc == "compute" else "M")

    def class_factor(self, job: JobSpec, other: JobSpec) -> float:
        a, b = self.job_class(job), self.job_class(other)
        if a is None or b is None:
            return self.unknown
        if a == b:
            return self.mm if a == "M" else self.cc
        return self.mc

    def mig_speed(self, job: JobSpec, gpu: GpuSpec, profile_name: str | None) -> float:
        """Speed of ``job`` alone in a MIG instance of ``profile_name`` on ``gpu``."""
        prof = gpu.mig_profile(profile_name)
        total = gpu.mig_total_slices or 1
        share = prof.compute_slices / total if prof is not None else 1.0
        return share_speed(share, self.alpha(job)) * (1.0 - self.mig_overhead)

    def mps_speeds(
        self, jobs: Sequence[JobSpec], percentages: Sequence[int | None], gpu: GpuSpec
    ) -> list[float]:
        """Speed of each of ``jobs`` running together under MPS with these percentages."""
        pcts = [float(p) if p is not None and gpu.mps_thread_limit else 100.0 for p in percentages]
        kernels = [j.profile for j in jobs if j.profile is not None and is_kernel(j.profile)]
        if len(kernels) == len(jobs):
            return corun_speeds(kernels, [p / 100.0 for p in pcts])
        total = sum(pcts)
        out = []
        for i, job in enumerate(jobs):
            share = pcts[i] / 100.0 if total <= 100.0 else pcts[i] / total
            others = [self.class_factor(job, o) for k, o in enumerate(jobs) if k != i]
            out.append(share_speed(share, self.alpha(job)) / combine_pairwise(others))
        return out

    # -- the engine's interface ----------------------------------------------------------------

    def gpu_factor(
        self,
        job: JobSpec,
        placement: Placement | None,
        gpu: GpuSpec,
        mode: SharingMode | None,
        co_runners: Sequence[tuple[JobSpec, Placement | None]],
        context_switch_overhead: float = 0.0,
    ) -> float:
        """Speed of ``job`` on ``gpu`` relative to its solo speed on the whole GPU, next to the
        unpaused ``co_runners`` (with their placements), under ``mode``."""
        if mode is None or mode == SharingMode.EXCLUSIVE:
            return 1.0
        if mode == SharingMode.MIG:
            return self.mig_speed(job, gpu, placement.mig_profile if placement else None)
        if mode == SharingMode.TIME_SLICING:
            n = 1 + len(co_runners)
            return 1.0 if n == 1 else 1.0 / (n * (1.0 + context_switch_overhead))
        jobs = [job, *(c for c, _ in co_runners)]
        pcts = [placement.mps_percentage if placement else None]
        pcts += [p.mps_percentage if p else None for _, p in co_runners]
        return self.mps_speeds(jobs, pcts, gpu)[0]

    def slowdown(
        self, job: JobSpec, co_runners: Sequence[JobSpec], gpu: GpuSpec, mode: SharingMode
    ) -> float:
        """The ``InterferenceModel`` view (no placements: MPS without percentages). Under
        time-slicing the part on top of the time share, 1 here; MIG and exclusive 1."""
        if not co_runners or mode != SharingMode.MPS:
            return 1.0
        speed = self.mps_speeds([job, *co_runners], [None] * (1 + len(co_runners)), gpu)[0]
        return 1.0 / speed if speed > 0 else math.inf


class MigBook:
    """The MIG instances of each simulated GPU, keyed by ``(node, gpu index)`` (module
    docstring). ``place`` returns the seconds before the job can start."""

    def __init__(self, relayout_s: float) -> None:
        self.relayout_s = relayout_s
        self.layouts: dict[tuple[str, int], list[str]] = {}
        self.users: dict[tuple[str, int], dict[int, str]] = {}  # instance index -> job id
        self.relayouts = 0

    def layout(self, key: tuple[str, int]) -> tuple[str, ...]:
        return tuple(self.layouts.get(key, ()))

    def place(
        self, key: tuple[str, int], spec: GpuSpec, job_id: str, placement: Placement
    ) -> float:
        """Give ``job_id`` an instance of ``placement.mig_profile`` on GPU ``key``; raises
        MigLayoutError for an impossible request. Returns the re-layout delay (seconds)."""
        profile = placement.mig_profile
        if profile is None:
            raise MigLayoutError("a MIG placement needs an instance profile (mig_profile)")
        layout = self.layouts.setdefault(key, [])
        users = self.users.setdefault(key, {})
        in_use = [layout[i] for i in sorted(users)]
        delay = 0.0
        if placement.mig_layout is not None:
            wanted = list(placement.mig_layout)
            check_mig_layout(spec, wanted)
            missing = Counter([*in_use, profile]) - Counter(wanted)
            if missing:
                raise MigLayoutError(
                    f"requested layout {' + '.join(wanted) or '(none)'} drops instance(s) "
                    f"{', '.join(sorted(missing.elements()))} still needed (in use or for this "
                    "job)"
                )
            if Counter(wanted) != Counter(layout):
                # Keep the instances in use where they are; the rest are (re)created.
                rest = Counter(wanted) - Counter(in_use)
                new_layout = list(in_use) + list(rest.elements())
                self.users[key] = {i: users[k] for i, k in enumerate(sorted(users))}
                users = self.users[key]
                layout[:] = new_layout
                delay = self.relayout_s
        free = [i for i, name in enumerate(layout) if name == profile and i not in users]
        if not free:
            # Create the instance on demand: drop the free instances, keep those in use.
            slices = sum(
                p.compute_slices
                for p in (spec.mig_profile(n) for n in [*in_use, profile])
                if p is not None
            )
            if spec.mig_profile(profile) is None:
                raise MigLayoutError(f"{spec.model} has no MIG profile {profile!r}")
            if slices > spec.mig_total_slices:
                raise MigLayoutError(
                    f"no room for a {profile} instance next to {' + '.join(in_use)} "
                    f"({slices} of {spec.mig_total_slices} compute slices)"
                )
            self.users[key] = {i: users[k] for i, k in enumerate(sorted(users))}
            users = self.users[key]
            layout[:] = [*in_use, profile]
            free = [len(layout) - 1]
            delay = self.relayout_s
        users[free[0]] = job_id
        if delay > 0:
            self.relayouts += 1
        return delay

    def release(self, key: tuple[str, int], job_id: str) -> None:
        """The job left its instance (which stays configured, free)."""
        users = self.users.get(key, {})
        for i, who in list(users.items()):
            if who == job_id:
                del users[i]

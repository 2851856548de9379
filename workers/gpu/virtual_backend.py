"""The ``virtual`` GPU backend: GPUs that do not exist, whose readings follow the jobs on them.

Used by the embedded demo and the tests, and named "virtual" wherever it shows. The node agent
tells it what runs where (``attach`` / ``detach`` / ``set_paused`` / ``set_progress``); ``sample``
then reports, per GPU:

- **memory**: the sum over attached jobs (running or paused) of the job's memory at its progress,
  from the profile's memory steps (``workers.profiles.memory_at``; ALGORITHMS.md §1). A paused job
  keeps its memory, as under the cgroup freezer.
- **utilisation**: the sum over running jobs of ``util_i / slowdown_i``, capped at 100 %.
  ``util_i`` is the profile's ``gpu_util_pct`` (100 when unknown), capped at the job's MPS
  active-thread percentage under MPS and scaled by its MIG slice share under MIG.
  ``slowdown_i`` (>= 1) is the optional interference model's value
  (``scheduler.interference.InterferenceModel.slowdown``) next to the other running jobs on the
  GPU: under MPS the whole co-run slowdown, under time-slicing only the interference on top of
  the time share (that module's convention), 1 under MIG and without a model. A job slowed ``s``
  times by contention does ``1/s`` of its solo work per busy second, so it drives ``1/s`` of its
  solo utilisation; under time-slicing the jobs' idle gaps are filled by the others, hence the
  sum. An infeasible pair (``inf``) drives nothing. Paused jobs contribute nothing and are
  nobody's co-runner.

``slowdown(job_id)`` gives the job's *total* co-run slowdown (time share included, through
``scheduler.interference.co_run_slowdown``), for estimating how fast a virtual job progresses.

**MIG**: each virtual GPU has a layout of MIG instances, each with a stable UUID
(``MIG-virtual-<node>-<gpu>-<n>``), listed by ``devices()`` whether in use or free.
``apply_mig_layout`` sets it (checked against the catalogue's placement rules; instances in
use are kept, a layout that drops one is refused), as the nvml backend does on a real GPU. A
MIG job attached with a profile takes a free instance of it; without one, the instance is
created next to those in use (if the compute slices allow), as the simulator does.

**Data-parallel emulated jobs** (``workers.emulate_dp``) publish their data ratios in
``shares_dir``: such a job drives ``100 * u * DR[g] / 10 / factor`` percent of GPU ``g`` (its
solo work there per second of its slowed iterations) wherever its ratio sends work, and nothing
through its placement.

No randomness: the same calls give the same readings.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from scheduler.catalog import MigLayoutError, check_mig_layout, gpu_spec
from scheduler.domain import GpuSpec, JobSpec, MigProfile, Profile, SharingMode
from scheduler.interference import InterferenceModel, NoInterference, co_run_slowdown
from workers.emulate_dp import read_board
from workers.gpu.base import (
    DEFAULT_CLOCK,
    Clock,
    DeviceInfo,
    GpuBackendError,
    GpuSample,
    MigDeviceInfo,
    MigLayoutReport,
)
from workers.profiles import memory_at

DEFAULT_UTIL_PCT = 100.0  # a GPU job whose profile has no utilisation keeps its GPU busy

_SPEC_PART = re.compile(r"^\s*([A-Za-z0-9 ._-]+?)\s*(?:[x*]\s*(\d+))?\s*$")


def parse_gpu_spec(spec: str | Sequence[str]) -> list[str]:
    """Catalogue models from ``"V100x2,T4"`` (``x`` or ``*`` repeats; ``,`` or ``+`` separates).

    A sequence of model names is accepted as is. Names are canonicalised through the catalogue;
    raises GpuBackendError on an unknown model or an empty spec.
    """
    pieces = re.split(r"[,+]", spec) if isinstance(spec, str) else list(spec)
    models: list[str] = []
    for piece in pieces:
        if not piece.strip():
            continue
        match = _SPEC_PART.match(piece)
        if match is None:
            raise GpuBackendError(f"bad virtual GPU spec {piece!r}; expected e.g. 'V100x2'")
        name, count = match.group(1), int(match.group(2) or 1)
        try:
            model = gpu_spec(name).model
        except KeyError as exc:
            raise GpuBackendError(str(exc)) from exc
        models.extend([model] * count)
    if not models:
        raise GpuBackendError("a virtual node needs at least one GPU model")
    return models


@dataclass
class VirtualJob:
    """What the virtual backend knows of one attached job."""

    job_id: str
    gpu_indices: tuple[int, ...]
    profile: Profile
    mode: SharingMode
    started_at: float  # seconds
    mps_percentage: int | None = None
    mig_profile: str | None = None
    mig_uuid: str | None = None
    pid: int | None = None
    job_type: str | None = None
    paused: bool = False
    progress: float = 0.0  # 0..1

    def spec(self) -> JobSpec:
        return JobSpec(
            id=self.job_id,
            kind=self.profile.kind,
            gpus=len(self.gpu_indices),
            profile=self.profile,
            job_type=self.job_type,
        )


class VirtualBackend:
    """Virtual GPUs of catalogue models; see the module docstring for what they report."""

    name = "virtual"

    def __init__(
        self,
        models: str | Sequence[str],
        *,
        node: str = "virtual",
        interference: InterferenceModel | None = None,
        clock: Clock = DEFAULT_CLOCK,
    ) -> None:
        self.node = node
        self.specs: list[GpuSpec] = [gpu_spec(m) for m in parse_gpu_spec(models)]
        self.interference = interference
        self.clock = clock
        self.jobs: dict[str, VirtualJob] = {}
        # Where emulated data-parallel jobs publish their shares (workers.emulate_dp; the agent
        # sets it). Their utilisation follows their data ratios instead of their placement.
        self.shares_dir: Path | None = None
        self._mig_serial = 0
        # Per GPU index: its MIG instances, (profile, uuid), in slot order.
        self.mig_layouts: dict[int, list[tuple[str, str]]] = {}

    # --- what the agent tells us ------------------------------------------------------------

    def attach(
        self,
        job_id: str,
        gpu_index: int | Sequence[int],
        profile: Profile,
        mode: SharingMode | str = SharingMode.EXCLUSIVE,
        started_at: float | None = None,
        *,
        mps_percentage: int | None = None,
        mig_profile: str | None = None,
        pid: int | None = None,
        job_type: str | None = None,
    ) -> VirtualJob:
        """Start accounting ``job_id`` on one GPU index (or several, for a multi-GPU job).

        ``started_at`` is in seconds (default: the clock). Under MIG, ``mig_profile`` must be one
        of the model's profiles; the job gets a virtual MIG instance whose UUID is in
        ``VirtualJob.mig_uuid`` (and in ``devices()``). Re-attaching a job replaces it.
        """
        indices = (gpu_index,) if isinstance(gpu_index, int) else tuple(gpu_index)
        if not indices:
            raise GpuBackendError(f"job {job_id}: a virtual GPU job needs at least one GPU index")
        for i in indices:
            if not 0 <= i < len(self.specs):
                raise GpuBackendError(
                    f"job {job_id}: no virtual GPU {i} on {self.node} ({len(self.specs)} GPUs)"
                )
        mode = SharingMode(mode)
        mig_uuid = None
        old = self.jobs.pop(job_id, None)
        if mode is SharingMode.MIG:
            for i in indices:
                self._mig_profile(self.specs[i], mig_profile)
            try:
                mig_uuid = self._take_instance(indices[0], mig_profile, job_id)  # type: ignore[arg-type]
            except GpuBackendError:
                if old is not None:
                    self.jobs[job_id] = old
                raise
        job = VirtualJob(
            job_id=job_id,
            gpu_indices=indices,
            profile=profile,
            mode=mode,
            started_at=self.clock() if started_at is None else started_at,
            mps_percentage=mps_percentage,
            mig_profile=mig_profile,
            mig_uuid=mig_uuid,
            pid=pid,
            job_type=job_type,
        )
        self.jobs[job_id] = job
        return job

    def detach(self, job_id: str) -> None:
        """Forget ``job_id`` (its memory is freed); unknown ids are ignored."""
        self.jobs.pop(job_id, None)

    def set_paused(self, job_id: str, paused: bool) -> None:
        """Mark a job paused (keeps memory, no utilisation) or running again."""
        self._job(job_id).paused = paused

    def set_progress(self, job_id: str, fraction: float) -> None:
        """Set how far the job is, 0..1 of its work (clamped)."""
        self._job(job_id).progress = min(1.0, max(0.0, float(fraction)))

    def set_pid(self, job_id: str, pid: int | None) -> None:
        """Record the job's process id, so samples list its memory under that pid too."""
        self._job(job_id).pid = pid

    # --- what the agent reads -----------------------------------------------------------------

    def apply_mig_layout(self, index: int, layout: Sequence[str]) -> MigLayoutReport:
        """Lay virtual GPU ``index`` out as the MIG instances ``layout`` (profile names).
        Instances in use are kept; raises GpuBackendError for a layout the model cannot hold
        or that would drop an instance in use."""
        if not 0 <= index < len(self.specs):
            raise GpuBackendError(f"no virtual GPU {index} on {self.node}")
        spec = self.specs[index]
        where = f"virtual GPU {index} ({spec.model})"
        try:
            check_mig_layout(spec, list(layout))
        except MigLayoutError as exc:
            raise GpuBackendError(f"{where}: {exc}") from exc
        current = self.mig_layouts.get(index, [])
        used = self._used_instances(index)
        wanted = Counter(layout)
        kept, dropped = [], []
        for profile, uuid in current:
            if uuid in used or wanted[profile] > 0:
                if wanted[profile] <= 0:
                    job = used[uuid]
                    raise GpuBackendError(
                        f"{where}: the layout drops the {profile} instance {uuid}, in use by "
                        f"job {job}"
                    )
                wanted[profile] -= 1
                kept.append((profile, uuid))
            else:
                dropped.append(profile)
        created = list(wanted.elements())
        self.mig_layouts[index] = kept + [(p, self._new_uuid(index)) for p in created]
        return MigLayoutReport(
            index,
            True,
            f"{where}: laid out as {' + '.join(layout) or 'no instances'} "
            f"({len(created)} created, {len(dropped)} destroyed, {len(kept)} kept)",
            self.devices()[index].mig_devices,
            tuple(created),
            tuple(dropped),
        )

    def _new_uuid(self, index: int) -> str:
        self._mig_serial += 1
        return f"MIG-virtual-{self.node}-{index}-{self._mig_serial}"

    def _used_instances(self, index: int) -> dict[str, str]:
        """UUID -> job id of the MIG instances of GPU ``index`` that jobs hold."""
        return {
            j.mig_uuid: j.job_id
            for j in self.jobs.values()
            if j.mig_uuid is not None and j.gpu_indices[0] == index
        }

    def _take_instance(self, index: int, profile: str, job_id: str) -> str:
        """A free instance of ``profile`` on GPU ``index``, created if the layout has none."""
        layout = self.mig_layouts.setdefault(index, [])
        used = self._used_instances(index)
        for name, uuid in layout:
            if name == profile and uuid not in used:
                return uuid
        spec = self.specs[index]
        in_use = [name for name, uuid in layout if uuid in used]
        slices = sum(self._mig_profile(spec, n).compute_slices for n in [*in_use, profile])
        if slices > spec.mig_total_slices:
            raise GpuBackendError(
                f"job {job_id}: no room for a {profile} instance on virtual GPU {index} next to "
                f"{' + '.join(in_use)} ({slices} of {spec.mig_total_slices} compute slices)"
            )
        # Free instances of other profiles go; the new one is created.
        layout[:] = [(n, u) for n, u in layout if u in used]
        uuid = self._new_uuid(index)
        layout.append((profile, uuid))
        return uuid

    def devices(self) -> list[DeviceInfo]:
        out = []
        for index, spec in enumerate(self.specs):
            migs = tuple(
                MigDeviceInfo(
                    index=n,
                    uuid=uuid,
                    profile=profile,
                    memory_total_mb=float(self._mig_profile(spec, profile).memory_mb),
                )
                for n, (profile, uuid) in enumerate(self.mig_layouts.get(index, ()))
            )
            out.append(
                DeviceInfo(
                    index=index,
                    uuid=self.gpu_uuid(index),
                    name=f"virtual {spec.model}",
                    model=spec.model,
                    memory_total_mb=float(spec.memory_mb),
                    sm_count=spec.sm_count,
                    mig_enabled=bool(migs),
                    mig_devices=migs,
                )
            )
        return out

    def sample(self, now: float | None = None) -> list[GpuSample]:
        stamp = self.clock() if now is None else now
        samples = []
        for index, spec in enumerate(self.specs):
            on_gpu = self._jobs_on(index)
            job_mem = {job.job_id: memory_at(job.profile, job.progress) for job in on_gpu}
            util = self.utilisation(index)
            running = [j for j in on_gpu if j.pid is not None and not j.paused]
            samples.append(
                GpuSample(
                    index=index,
                    uuid=self.gpu_uuid(index),
                    timestamp=stamp,
                    util_pct=util,
                    memory_used_mb=sum(job_mem.values(), 0.0),
                    memory_total_mb=float(spec.memory_mb),
                    process_memory_mb={
                        job.pid: job_mem[job.job_id] for job in on_gpu if job.pid is not None
                    },
                    # Per-process samples: the GPU's utilisation shared by its running jobs.
                    process_util_pct={
                        job.pid: util / len(running) for job in running if job.pid is not None
                    },
                    job_memory_mb=job_mem,
                    mig_memory_used_mb={
                        job.mig_uuid: job_mem[job.job_id]
                        for job in on_gpu
                        if job.mig_uuid is not None
                    },
                )
            )
        return samples

    def slowdown(self, job_id: str) -> float:
        """Total co-run time / solo time of a running job now: time share and interference.

        1.0 alone; with several GPUs, the worst of them (a data-parallel job waits for its
        slowest replica). Without a model, time-slicing still shares time (``n`` jobs: ``n``).
        """
        job = self._job(job_id)
        model = self.interference or NoInterference()
        worst = 1.0
        for index in job.gpu_indices:
            others = self._co_runners(job, index)
            if others:
                factor = co_run_slowdown(model, job.spec(), others, self.specs[index], job.mode)
                worst = max(worst, factor)
        return worst

    def utilisation(self, index: int) -> float:
        """Utilisation (percent) of virtual GPU ``index`` now; see the module docstring."""
        spec = self.specs[index]
        total = 0.0
        board = read_board(self.shares_dir) if self.shares_dir is not None else []
        by_ratio = {str(e.get("job")) for e in board if e.get("job")}
        for entry in board:
            ratio = entry.get("ratio") or []
            if index < len(ratio) and ratio[index] > 0:
                u = float(entry.get("u", 1.0))
                total += (
                    100.0 * u * ratio[index] / 10.0 / max(float(entry.get("factor", 1.0)), 1e-9)
                )
        for job in self._jobs_on(index):
            if job.paused or job.job_id in by_ratio:
                continue
            util = job.profile.gpu_util_pct
            util = DEFAULT_UTIL_PCT if util is None else float(util)
            if job.mode is SharingMode.MPS and job.mps_percentage is not None:
                util = min(util, float(job.mps_percentage))
            if job.mode is SharingMode.MIG and spec.mig_total_slices:
                slices = self._mig_profile(spec, job.mig_profile).compute_slices
                util *= slices / spec.mig_total_slices
            total += util / self._slowdown_on(job, index)
        return min(100.0, total)

    def gpu_uuid(self, index: int) -> str:
        return f"GPU-virtual-{self.node}-{index}"

    def close(self) -> None:
        self.jobs.clear()

    # --- helpers ------------------------------------------------------------------------------

    def _job(self, job_id: str) -> VirtualJob:
        try:
            return self.jobs[job_id]
        except KeyError:
            raise GpuBackendError(f"job {job_id} is not attached to {self.node}") from None

    def _jobs_on(self, index: int, mode: SharingMode | None = None) -> list[VirtualJob]:
        return [
            j
            for j in self.jobs.values()
            if index in j.gpu_indices and (mode is None or j.mode is mode)
        ]

    def _co_runners(self, job: VirtualJob, index: int) -> list[JobSpec]:
        return [j.spec() for j in self._jobs_on(index) if j.job_id != job.job_id and not j.paused]

    def _slowdown_on(self, job: VirtualJob, index: int) -> float:
        """The model's slowdown of ``job`` on GPU ``index`` (see the module docstring)."""
        if self.interference is None or job.paused:
            return 1.0
        others = self._co_runners(job, index)
        if not others:
            return 1.0
        factor = self.interference.slowdown(job.spec(), others, self.specs[index], job.mode)
        return max(1.0, float(factor))

    @staticmethod
    def _mig_profile(spec: GpuSpec, name: str | None) -> MigProfile:
        for profile in spec.mig_profiles:
            if profile.name == name:
                return profile
        known = ", ".join(p.name for p in spec.mig_profiles) or "none (no MIG on this model)"
        raise GpuBackendError(f"{spec.model} has no MIG profile {name!r}; known: {known}")

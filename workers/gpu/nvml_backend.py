"""The ``nvml`` GPU backend: real NVIDIA GPUs read through pynvml (package nvidia-ml-py).

The NVML module is injected (``NvmlBackend(nvml=module)``, default ``import pynvml``) so the unit
tests can hand it a fake; the backend only uses pynvml's public names, and catches errors as
``nvml.NVMLError`` with the ``nvml.NVML_ERROR_*`` codes of whichever module it was given.

Readings: memory from ``nvmlDeviceGetMemoryInfo`` (bytes -> MiB), utilisation from
``nvmlDeviceGetUtilizationRates().gpu`` (None where NVML does not support it, e.g. a GPU in MIG
mode), per-process memory from ``nvmlDeviceGetComputeRunningProcesses`` (processes whose memory
NVML cannot see are left out), per-process SM utilisation from
``nvmlDeviceGetProcessUtilization`` (the mean of the samples since the previous reading; none
where the GPU does not keep them), MIG instances from ``nvmlDeviceGetMigDeviceHandleByIndex``, the
minor number of each GPU's device node (``/dev/nvidia<minor>``) from ``nvmlDeviceGetMinorNumber``.

MIG layouts (``apply_mig_layout``): checked against the catalogue's placement rules first;
then MIG mode is switched on if needed (the driver applies it at the next GPU reset, which we
report rather than force), instances the new layout does not keep are destroyed (refused if a
process runs in one) and the missing ones created: a GPU instance of the profile
(``nvmlDeviceCreateGpuInstance``, the profile id whose memory matches the name) holding one
compute instance over all its slices. Every refusal of the driver (no permission: it needs
root; no MIG on this GPU; no room) comes back as a ``GpuBackendError`` naming the GPU, the
profile and what to do.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from scheduler.catalog import (
    CATALOG,
    MigLayoutError,
    UnknownGpuModel,
    canonical_model,
    check_mig_layout,
)
from workers.gpu.base import (
    DEFAULT_CLOCK,
    Clock,
    DeviceInfo,
    GpuBackendError,
    GpuSample,
    MigDeviceInfo,
    MigLayoutReport,
    NvmlUnavailable,
)

MIB = 1024 * 1024

MISSING_MESSAGE = (
    "NVML is not available on this machine ({why}): use --backend virtual, "
    "or install the NVIDIA driver on a host with an NVIDIA GPU"
)

_MIG_NAME = re.compile(r"MIG\s+(\d+g\.\d+gb)", re.IGNORECASE)
_PROFILE_NAME = re.compile(r"^(\d+)g\.(\d+)gb$")
_VENDOR_WORDS = ("nvidia ", "tesla ")


def catalogue_model(device_name: str) -> str | None:
    """The catalogue key for an NVML device name, or None if it maps to no known model.

    Tries the name as is, without the vendor words "NVIDIA"/"Tesla", the part before the first
    "-" (``A100-SXM4-80GB`` -> ``A100``) and then each word of the name.
    """
    name = device_name.strip()
    candidates = [name]
    lowered = name
    for word in _VENDOR_WORDS:
        if lowered.lower().startswith(word):
            lowered = lowered[len(word) :]
            candidates.append(lowered)
    candidates.append(lowered.split("-")[0])
    candidates.extend(lowered.split("-")[0].split())
    for candidate in candidates:
        try:
            return canonical_model(candidate)
        except UnknownGpuModel:
            continue
    return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """Real GPUs through NVML. Raises NvmlUnavailable at construction where NVML is missing."""

    name = "nvml"

    def __init__(self, nvml: ModuleType | Any | None = None, *, clock: Clock = DEFAULT_CLOCK):
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:  # the Python binding itself is missing
                raise NvmlUnavailable(
                    MISSING_MESSAGE.format(why="the pynvml module (nvidia-ml-py) is not installed")
                ) from exc
        self.nvml = nvml
        self.clock = clock
        self._open = False
        self._util_seen: dict[int, int] = {}  # GPU index -> newest process sample (us)
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise self._init_error(exc) from exc
        self._open = True

    # --- errors -------------------------------------------------------------------------------

    def _code(self, name: str) -> int | None:
        return getattr(self.nvml, name, None)

    def _is(self, exc: BaseException, *names: str) -> bool:
        value = getattr(exc, "value", None)
        return value is not None and any(value == self._code(n) for n in names)

    def _describe(self, exc: BaseException) -> str:
        try:
            text = str(exc)
        except Exception:  # pynvml's __str__ may itself call into the missing library
            text = ""
        return text or f"NVML error {getattr(exc, 'value', '?')}"

    def _init_error(self, exc: BaseException) -> GpuBackendError:
        if self._is(exc, "NVML_ERROR_LIBRARY_NOT_FOUND"):
            return NvmlUnavailable(MISSING_MESSAGE.format(why="libnvidia-ml.so not found"))
        if self._is(exc, "NVML_ERROR_DRIVER_NOT_LOADED"):
            return NvmlUnavailable(MISSING_MESSAGE.format(why="the NVIDIA driver is not loaded"))
        if self._is(exc, "NVML_ERROR_NO_PERMISSION"):
            return NvmlUnavailable(
                MISSING_MESSAGE.format(why="no permission to open the NVIDIA devices")
            )
        return GpuBackendError(f"NVML initialisation failed: {self._describe(exc)}")

    def _optional(self, call: Any, *args: Any) -> Any:
        """Result of an NVML call whose absence is normal (not supported, not found), else None."""
        try:
            return call(*args)
        except self.nvml.NVMLError as exc:
            if self._is(
                exc,
                "NVML_ERROR_NOT_SUPPORTED",
                "NVML_ERROR_NOT_FOUND",
                "NVML_ERROR_NO_PERMISSION",
                "NVML_ERROR_FUNCTION_NOT_FOUND",
                "NVML_ERROR_INVALID_ARGUMENT",
            ):
                return None
            raise

    def _required(self, what: str, index: int, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except self.nvml.NVMLError as exc:
            raise GpuBackendError(f"GPU {index}: {what} failed: {self._describe(exc)}") from exc

    # --- reading ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if not self._open:
            raise GpuBackendError("the NVML backend is closed")

    def _handles(self) -> list[Any]:
        self._check_open()
        n = self.nvml
        count = self._required("device count", -1, n.nvmlDeviceGetCount)
        return [
            self._required("device handle", i, n.nvmlDeviceGetHandleByIndex, i)
            for i in range(count)
        ]

    def _mig_handles(self, handle: Any) -> list[tuple[int, Any]]:
        n = self.nvml
        mode = self._optional(n.nvmlDeviceGetMigMode, handle)
        if not mode or mode[0] != getattr(n, "NVML_DEVICE_MIG_ENABLE", 1):
            return []
        slots = self._optional(n.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
        out = []
        for slot in range(slots):
            mig = self._optional(n.nvmlDeviceGetMigDeviceHandleByIndex, handle, slot)
            if mig is not None:  # empty slots answer NOT_FOUND
                out.append((slot, mig))
        return out

    def devices(self) -> list[DeviceInfo]:
        n = self.nvml
        out = []
        for index, handle in enumerate(self._handles()):
            name = _text(self._required("name", index, n.nvmlDeviceGetName, handle))
            model = catalogue_model(name)
            memory = self._required("memory info", index, n.nvmlDeviceGetMemoryInfo, handle)
            attrs = self._optional(n.nvmlDeviceGetAttributes, handle)
            sm_count = getattr(attrs, "multiprocessorCount", None) if attrs is not None else None
            if sm_count is None and model is not None:
                sm_count = CATALOG[model].sm_count
            mode = self._optional(n.nvmlDeviceGetMigMode, handle)
            mig_enabled = bool(mode) and mode[0] == getattr(n, "NVML_DEVICE_MIG_ENABLE", 1)
            migs = []
            for slot, mig in self._mig_handles(handle):
                mig_name = _text(self._optional(n.nvmlDeviceGetName, mig) or "")
                match = _MIG_NAME.search(mig_name)
                mig_mem = self._optional(n.nvmlDeviceGetMemoryInfo, mig)
                migs.append(
                    MigDeviceInfo(
                        index=slot,
                        uuid=_text(self._required("MIG UUID", index, n.nvmlDeviceGetUUID, mig)),
                        profile=match.group(1).lower() if match else None,
                        memory_total_mb=mig_mem.total / MIB if mig_mem is not None else 0.0,
                        gpu_instance_id=self._optional(n.nvmlDeviceGetGpuInstanceId, mig),
                        compute_instance_id=self._optional(n.nvmlDeviceGetComputeInstanceId, mig),
                    )
                )
            out.append(
                DeviceInfo(
                    index=index,
                    uuid=_text(self._required("UUID", index, n.nvmlDeviceGetUUID, handle)),
                    name=name,
                    model=model,
                    memory_total_mb=memory.total / MIB,
                    sm_count=sm_count,
                    mig_enabled=mig_enabled,
                    mig_devices=tuple(migs),
                    minor_number=self._optional(n.nvmlDeviceGetMinorNumber, handle),
                )
            )
        return out

    def _processes(self, handle: Any) -> dict[int, float] | None:
        procs = self._optional(self.nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        if procs is None:
            return None
        out: dict[int, float] = {}
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            if used is not None:  # None: NVML cannot see it (WDDM, other containers)
                out[int(proc.pid)] = out.get(int(proc.pid), 0.0) + used / MIB
        return out

    def _process_util(self, index: int, handle: Any) -> dict[int, float]:
        """Mean SM utilisation per process over the samples NVML took since the last call
        (``nvmlDeviceGetProcessUtilization``; empty where the GPU or driver has none)."""
        call = getattr(self.nvml, "nvmlDeviceGetProcessUtilization", None)
        if call is None:
            return {}
        since = self._util_seen.get(index, 0)
        found = self._optional(call, handle, since)
        if not found:
            return {}
        sums: dict[int, list[float]] = {}
        newest = since
        for s in found:
            stamp = int(getattr(s, "timeStamp", 0) or 0)
            if stamp <= since:
                continue
            newest = max(newest, stamp)
            sums.setdefault(int(s.pid), []).append(float(getattr(s, "smUtil", 0) or 0))
        self._util_seen[index] = newest
        return {pid: sum(v) / len(v) for pid, v in sums.items()}

    def sample(self, now: float | None = None) -> list[GpuSample]:
        n = self.nvml
        stamp = self.clock() if now is None else now
        samples = []
        for index, handle in enumerate(self._handles()):
            memory = self._required("memory info", index, n.nvmlDeviceGetMemoryInfo, handle)
            rates = self._optional(n.nvmlDeviceGetUtilizationRates, handle)
            migs = self._mig_handles(handle)
            listed = self._processes(handle)
            processes = dict(listed or {})
            mig_used: dict[str, float] = {}
            for _slot, mig in migs:
                uuid = _text(self._required("MIG UUID", index, n.nvmlDeviceGetUUID, mig))
                mig_mem = self._optional(n.nvmlDeviceGetMemoryInfo, mig)
                if mig_mem is not None:
                    mig_used[uuid] = mig_mem.used / MIB
                if listed is None:  # the parent would not list them: ask each MIG instance
                    for pid, mb in (self._processes(mig) or {}).items():
                        processes[pid] = processes.get(pid, 0.0) + mb
            samples.append(
                GpuSample(
                    index=index,
                    uuid=_text(self._required("UUID", index, n.nvmlDeviceGetUUID, handle)),
                    timestamp=stamp,
                    util_pct=float(rates.gpu) if rates is not None else None,
                    memory_used_mb=memory.used / MIB,
                    memory_total_mb=memory.total / MIB,
                    process_memory_mb=processes,
                    process_util_pct=self._process_util(index, handle),
                    mig_memory_used_mb=mig_used,
                )
            )
        return samples

    # --- MIG layouts ---------------------------------------------------------------------------

    def apply_mig_layout(self, index: int, layout: Sequence[str]) -> MigLayoutReport:
        """Lay GPU ``index`` out as the MIG instances ``layout`` (profile names, e.g.
        ``["2g.12gb", "1g.6gb", "1g.6gb"]``); see the module docstring. Raises GpuBackendError
        saying why where the driver or the layout does not allow it."""
        n = self.nvml
        handle = self._handles()[index]
        name = _text(self._required("name", index, n.nvmlDeviceGetName, handle))
        where = f"GPU {index} ({name})"
        model = catalogue_model(name)
        spec = CATALOG.get(model) if model else None
        if spec is None or not spec.mig_profiles:
            raise GpuBackendError(f"{where}: this model has no MIG (A30, A100 and H100 do)")
        try:
            check_mig_layout(spec, list(layout))
        except MigLayoutError as exc:
            raise GpuBackendError(f"{where}: {exc}") from exc
        mode = self._optional(n.nvmlDeviceGetMigMode, handle)
        if not mode:
            raise GpuBackendError(f"{where}: the driver reports no MIG support on this GPU")
        enabled = getattr(n, "NVML_DEVICE_MIG_ENABLE", 1)
        if mode[0] != enabled:
            if mode[1] != enabled:
                self._mig_call(where, "enabling MIG mode", n.nvmlDeviceSetMigMode, handle, enabled)
            return MigLayoutReport(
                index,
                False,
                f"{where}: MIG mode is switched on but takes effect at the next GPU reset: stop "
                f"every process on the GPU, run `nvidia-smi -r -i {index}`, then apply the "
                "layout again",
            )
        existing = self.devices()[index].mig_devices
        wanted = Counter(layout)
        keep, drop = [], []
        for inst in existing:
            if inst.profile is not None and wanted[inst.profile] > 0:
                wanted[inst.profile] -= 1
                keep.append(inst)
            else:
                drop.append(inst)
        busy = {
            inst.uuid: pids
            for inst, (_slot, mig) in zip(existing, self._mig_handles(handle), strict=False)
            if inst in drop and (pids := sorted((self._processes(mig) or {}).keys()))
        }
        if busy:
            listed = "; ".join(f"{u}: pids {', '.join(map(str, p))}" for u, p in busy.items())
            raise GpuBackendError(
                f"{where}: the layout would destroy MIG instances that run processes ({listed})"
            )
        destroyed = []
        for inst in drop:
            gi = self._mig_call(
                where,
                "finding a GPU instance",
                n.nvmlDeviceGetGpuInstanceById,
                handle,
                inst.gpu_instance_id,
            )
            ci = self._mig_call(
                where,
                "finding a compute instance",
                n.nvmlGpuInstanceGetComputeInstanceById,
                gi,
                inst.compute_instance_id,
            )
            self._mig_call(where, f"destroying {inst.profile}", n.nvmlComputeInstanceDestroy, ci)
            self._mig_call(where, f"destroying {inst.profile}", n.nvmlGpuInstanceDestroy, gi)
            destroyed.append(inst.profile or inst.uuid)
        created = []
        for profile in sorted(wanted.elements(), key=lambda p: -self._slices(p)):
            self._create_instance(handle, where, profile)
            created.append(profile)
        after = self.devices()[index].mig_devices
        return MigLayoutReport(
            index,
            True,
            f"{where}: laid out as {' + '.join(layout) or 'no instances'} "
            f"({len(created)} created, {len(destroyed)} destroyed, {len(keep)} kept)",
            after,
            tuple(created),
            tuple(destroyed),
        )

    @staticmethod
    def _slices(profile: str) -> int:
        match = _PROFILE_NAME.match(profile)
        return int(match.group(1)) if match else 0

    def _mig_call(self, where: str, what: str, call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except self.nvml.NVMLError as exc:
            if self._is(exc, "NVML_ERROR_NO_PERMISSION"):
                why = "no permission (MIG configuration needs root)"
            elif self._is(exc, "NVML_ERROR_INSUFFICIENT_RESOURCES"):
                why = "no room: the free slices are taken or fragmented"
            elif self._is(exc, "NVML_ERROR_IN_USE"):
                why = "in use by a process"
            elif self._is(exc, "NVML_ERROR_NOT_SUPPORTED"):
                why = "not supported by this GPU or driver"
            else:
                why = self._describe(exc)
            raise GpuBackendError(f"{where}: {what} failed: {why}") from exc

    def _create_instance(self, handle: Any, where: str, profile: str) -> None:
        """A GPU instance of ``profile`` with one compute instance over all its slices."""
        n = self.nvml
        match = _PROFILE_NAME.match(profile)
        if match is None:
            raise GpuBackendError(f"{where}: bad MIG profile name {profile!r}")
        slices, gb = int(match.group(1)), int(match.group(2))
        best = None
        for suffix in ("", "_REV1", "_REV2"):
            pid = getattr(n, f"NVML_GPU_INSTANCE_PROFILE_{slices}_SLICE{suffix}", None)
            if pid is None:
                continue
            info = self._optional(n.nvmlDeviceGetGpuInstanceProfileInfo, handle, pid)
            if info is None or int(getattr(info, "sliceCount", slices)) != slices:
                continue
            miss = abs(float(info.memorySizeMB) / 1024.0 - gb) / gb
            if miss <= 0.2 and (best is None or miss < best[0]):
                best = (miss, info)
        if best is None:
            raise GpuBackendError(
                f"{where}: the driver offers no {profile} GPU-instance profile here"
            )
        gi = self._mig_call(
            where,
            f"creating a {profile} GPU instance",
            n.nvmlDeviceCreateGpuInstance,
            handle,
            best[1].id,
        )
        ci_pid = getattr(n, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE", None)
        shared = getattr(n, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0)
        ci_info = self._mig_call(
            where,
            f"reading the {profile} compute profile",
            n.nvmlGpuInstanceGetComputeInstanceProfileInfo,
            gi,
            ci_pid,
            shared,
        )
        self._mig_call(
            where,
            f"creating the {profile} compute instance",
            n.nvmlGpuInstanceCreateComputeInstance,
            gi,
            ci_info.id,
        )

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        with contextlib.suppress(self.nvml.NVMLError):  # shutting down anyway
            self.nvml.nvmlShutdown()

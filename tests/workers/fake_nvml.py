"""A fake NVML module for the ``nvml`` backend's unit tests: the only fake in the project.

It mimics the names and behaviour of pynvml (nvidia-ml-py) that the backend uses: module-level
``nvml*`` functions, ``NVML_ERROR_*`` codes with pynvml's values, an ``NVMLError`` whose
constructor maps a code to a subclass (``NVMLError(3)`` is an ``NVMLError_NotSupported``) and
carries it in ``.value``, memory in bytes, processes with ``pid`` and ``usedGpuMemory`` (None when
NVML cannot see it), MIG mode as ``[current, pending]`` and NOT_FOUND for empty MIG slots.
Calls before ``nvmlInit`` raise UNINITIALIZED, as the real library does.

Build one with ``FakeNvml([FakeGpu(...), ...])`` and pass it as ``NvmlBackend(nvml=fake)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

MIB = 1024 * 1024

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_UNKNOWN = 999
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
# GPU- and compute-instance profile ids, pynvml's values (slices -> id).
NVML_GPU_INSTANCE_PROFILE_1_SLICE = 0
NVML_GPU_INSTANCE_PROFILE_2_SLICE = 1
NVML_GPU_INSTANCE_PROFILE_3_SLICE = 2
NVML_GPU_INSTANCE_PROFILE_4_SLICE = 3
NVML_GPU_INSTANCE_PROFILE_7_SLICE = 4
NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 = 7
NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0
NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 1
NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 2
NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 3
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 4
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
#: An A30's GPU-instance profiles: id -> (slices, memory MB, name).
A30_GI_PROFILES = {0: (1, 5952, "1g.6gb"), 1: (2, 11904, "2g.12gb"), 3: (4, 23808, "4g.24gb")}

_NAMES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "InvalidArgument",
    NVML_ERROR_NOT_SUPPORTED: "NotSupported",
    NVML_ERROR_NO_PERMISSION: "NoPermission",
    NVML_ERROR_NOT_FOUND: "NotFound",
    NVML_ERROR_DRIVER_NOT_LOADED: "DriverNotLoaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "LibraryNotFound",
    NVML_ERROR_GPU_IS_LOST: "GpuIsLost",
    NVML_ERROR_RESET_REQUIRED: "ResetRequired",
    NVML_ERROR_IN_USE: "InUse",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "InsufficientResources",
    NVML_ERROR_UNKNOWN: "Unknown",
}


class NVMLError(Exception):
    """Like pynvml.NVMLError: ``NVMLError(code)`` builds the code's subclass; ``.value`` = code."""

    _valClassMapping: dict[int, type[NVMLError]] = {}

    def __new__(cls, value: int):
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return f"{_NAMES.get(self.value, 'Unknown')} (NVML error {self.value})"


for _code, _name in _NAMES.items():
    _cls = type(f"NVMLError_{_name}", (NVMLError,), {})
    NVMLError._valClassMapping[_code] = _cls
    globals()[_cls.__name__] = _cls


@dataclass
class FakeMig:
    uuid: str
    name: str  # e.g. "NVIDIA A30 MIG 1g.6gb"
    memory_total_mb: float
    memory_used_mb: float = 0.0
    gpu_instance_id: int = 1
    compute_instance_id: int = 0
    processes: dict[int, float | None] = field(default_factory=dict)  # pid -> MB
    failing: dict[str, int] = field(default_factory=dict)  # function name -> error code


@dataclass
class FakeGpu:
    """One fake GPU. ``unsupported`` names functions that answer NOT_SUPPORTED on it."""

    name: str = "Tesla V100-SXM2-16GB"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    memory_total_mb: float = 16160.0
    memory_used_mb: float = 0.0
    util_pct: int = 0
    sm_count: int | None = 80
    minor_number: int | None = None  # None: NOT_SUPPORTED
    processes: dict[int, float | None] = field(default_factory=dict)  # pid -> MB (None: hidden)
    # nvmlDeviceGetProcessUtilization: (pid, timestamp us, SM %) samples the GPU keeps
    process_samples: list[tuple[int, int, int]] = field(default_factory=list)
    mig_enabled: bool | None = None  # None: MIG not supported on this model
    mig_pending: bool | None = None  # MIG mode after the next reset (None: as now)
    migs: dict[int, FakeMig] = field(default_factory=dict)  # slot -> instance
    max_mig_slots: int = 7
    mig_slices: int = 4  # compute slices the fake hands out to GPU instances
    gi_profiles: dict[int, tuple[int, float, str]] = field(default_factory=dict)  # see A30_...
    unsupported: set[str] = field(default_factory=set)  # on this GPU and its MIG instances
    failing: dict[str, int] = field(default_factory=dict)  # on this GPU's own handle only


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu
    mig: FakeMig | None = None


@dataclass(frozen=True)
class _Instance:
    gpu: FakeGpu
    slot: int


def _slices_used(gpu: FakeGpu) -> int:
    total = 0
    for mig in gpu.migs.values():
        for slices, _mb, name in gpu.gi_profiles.values():
            if mig.name.endswith(f"MIG {name}"):
                total += slices
    return total


class FakeNvml:
    """A module-like object with pynvml's names; see the module docstring."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], *, init_error: int | None = None) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.initialised = False
        self.shutdown_calls = 0
        self.created: list[str] = []  # MIG instances created, by profile
        self.destroyed: list[str] = []
        for name, value in globals().items():
            if name.startswith("NVML_") or name.startswith("NVMLError_"):
                setattr(self, name, value)

    # --- helpers ------------------------------------------------------------------------------

    def _enter(self, fn: str, handle: _Handle | None = None) -> None:
        if not self.initialised:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is not None:
            failing = handle.mig.failing if handle.mig else handle.gpu.failing
            if fn in failing:
                raise NVMLError(failing[fn])
            if fn in handle.gpu.unsupported:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    @staticmethod
    def _memory(total_mb: float, used_mb: float) -> SimpleNamespace:
        total, used = int(total_mb * MIB), int(used_mb * MIB)
        return SimpleNamespace(total=total, used=used, free=total - used)

    @staticmethod
    def _procs(processes: dict[int, float | None]) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(
                pid=pid,
                usedGpuMemory=None if mb is None else int(mb * MIB),
                gpuInstanceId=0xFFFFFFFF,
                computeInstanceId=0xFFFFFFFF,
            )
            for pid, mb in processes.items()
        ]

    # --- pynvml API ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialised = False
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(self.gpus[index])

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetName", handle)
        return handle.mig.name if handle.mig else handle.gpu.name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        return handle.mig.uuid if handle.mig else handle.gpu.uuid

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetMemoryInfo", handle)
        if handle.mig:
            return self._memory(handle.mig.memory_total_mb, handle.mig.memory_used_mb)
        return self._memory(handle.gpu.memory_total_mb, handle.gpu.memory_used_mb)

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetMinorNumber", handle)
        if handle.mig or handle.gpu.minor_number is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.gpu.minor_number

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        if handle.mig or handle.gpu.mig_enabled:  # as on real GPUs in MIG mode
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=handle.gpu.util_pct, memory=0)

    def nvmlDeviceGetAttributes(self, handle: _Handle) -> SimpleNamespace:
        self._enter("nvmlDeviceGetAttributes", handle)
        if handle.gpu.sm_count is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(multiprocessorCount=handle.gpu.sm_count)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        return self._procs(handle.mig.processes if handle.mig else handle.gpu.processes)

    def nvmlDeviceGetProcessUtilization(self, handle: _Handle, since: int) -> list[SimpleNamespace]:
        self._enter("nvmlDeviceGetProcessUtilization", handle)
        found = [
            SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
            for pid, ts, sm in handle.gpu.process_samples
            if ts > since
        ]
        if not found:  # as NVML: nothing newer than ``since``
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return found

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        if handle.gpu.mig_enabled is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return handle.gpu.max_mig_slots

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if not handle.gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if index not in handle.gpu.migs:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, handle.gpu.migs[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", handle)
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: _Handle) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId", handle)
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig.compute_instance_id

    # --- MIG configuration: MIG mode (pending until ``reset``), GPU-instance profiles, creating
    # and destroying GPU / compute instances. A created instance appears as a MIG device in the
    # next free slot; destroying one that runs processes answers IN_USE; creating past
    # ``mig_slices`` answers INSUFFICIENT_RESOURCES.

    def nvmlDeviceSetMigMode(self, handle: _Handle, mode: int) -> int:
        self._enter("nvmlDeviceSetMigMode", handle)
        if handle.gpu.mig_enabled is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        handle.gpu.mig_pending = mode == NVML_DEVICE_MIG_ENABLE
        return NVML_ERROR_RESET_REQUIRED  # the activation status: a reset is needed

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        if handle.gpu.mig_enabled is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        current = NVML_DEVICE_MIG_ENABLE if handle.gpu.mig_enabled else NVML_DEVICE_MIG_DISABLE
        pending = handle.gpu.mig_pending
        return [current, current if pending is None else int(bool(pending))]

    def reset(self, index: int) -> None:
        """What ``nvidia-smi -r`` does to the fake: pending MIG mode takes effect."""
        gpu = self.gpus[index]
        if gpu.mig_pending is not None:
            gpu.mig_enabled, gpu.mig_pending = gpu.mig_pending, None
            gpu.migs.clear()

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: _Handle, profile: int) -> SimpleNamespace:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        if profile not in handle.gpu.gi_profiles:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        slices, mb, name = handle.gpu.gi_profiles[profile]
        return SimpleNamespace(id=profile, sliceCount=slices, memorySizeMB=mb, name=name)

    def nvmlDeviceCreateGpuInstance(self, handle: _Handle, profile: int) -> SimpleNamespace:
        self._enter("nvmlDeviceCreateGpuInstance", handle)
        gpu = handle.gpu
        if not gpu.mig_enabled:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        slices, _mb, _name = gpu.gi_profiles[profile]
        if _slices_used(gpu) + slices > gpu.mig_slices:
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        return SimpleNamespace(gpu=gpu, profile=profile, gi_id=100 + len(self.created))

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi: SimpleNamespace, profile: int, engine: int
    ) -> SimpleNamespace:
        self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo")
        return SimpleNamespace(id=profile)

    def nvmlGpuInstanceCreateComputeInstance(self, gi: SimpleNamespace, profile: int) -> None:
        self._enter("nvmlGpuInstanceCreateComputeInstance")
        gpu = gi.gpu
        _slices, mb, name = gpu.gi_profiles[gi.profile]
        slot = next(i for i in range(gpu.max_mig_slots) if i not in gpu.migs)
        uuid = f"MIG-fake-{gpu.uuid}-{gi.gi_id}"
        gpu.migs[slot] = FakeMig(uuid, f"{gpu.name} MIG {name}", mb, 0.0, gi.gi_id, 0)
        self.created.append(name)

    def nvmlDeviceGetGpuInstanceById(self, handle: _Handle, gi_id: int) -> _Instance:
        self._enter("nvmlDeviceGetGpuInstanceById", handle)
        for slot, mig in handle.gpu.migs.items():
            if mig.gpu_instance_id == gi_id:
                return _Instance(handle.gpu, slot)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlGpuInstanceGetComputeInstanceById(self, gi: _Instance, ci_id: int) -> _Instance:
        self._enter("nvmlGpuInstanceGetComputeInstanceById")
        return gi

    def nvmlComputeInstanceDestroy(self, ci: _Instance) -> None:
        self._enter("nvmlComputeInstanceDestroy")
        if ci.gpu.migs[ci.slot].processes:
            raise NVMLError(NVML_ERROR_IN_USE)

    def nvmlGpuInstanceDestroy(self, gi: _Instance) -> None:
        self._enter("nvmlGpuInstanceDestroy")
        mig = gi.gpu.migs.pop(gi.slot)
        self.destroyed.append(mig.name.rsplit(" ", 1)[-1])

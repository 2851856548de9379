"""The GPU backend interface: what a node agent reads from its GPUs, whatever they are.

Two backends implement it: ``nvml`` (real GPUs through pynvml) and ``virtual`` (no GPU: GPUs whose
utilisation and memory follow the running jobs' profiles). Units: megabytes are MiB (2**20 bytes,
as NVML and the GPU catalogue count them), utilisation is percent 0..100, timestamps are seconds
since the epoch (or whatever the backend's clock returns).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

Clock = Callable[[], float]
"""A zero-argument callable returning the current time in seconds (``time.time`` by default)."""

DEFAULT_CLOCK: Clock = time.time


class GpuBackendError(RuntimeError):
    """A GPU backend could not answer (device lost, driver error, bad configuration)."""


class NvmlUnavailable(GpuBackendError):
    """NVML (the NVIDIA driver's management library) is missing or unusable on this machine."""


@dataclass(frozen=True, slots=True)
class MigDeviceInfo:
    """One MIG instance of a GPU in MIG mode. ``uuid`` is what ``CUDA_VISIBLE_DEVICES`` takes."""

    index: int  # slot index under the parent GPU
    uuid: str  # "MIG-..."
    profile: str | None  # e.g. "1g.6gb", parsed from the device name when possible
    memory_total_mb: float
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """One physical GPU as the node agent registers it.

    ``model`` is the catalogue key (``scheduler.catalog``) when the device name maps to one,
    else None; ``name`` is the raw device name.
    """

    index: int
    uuid: str
    name: str
    model: str | None
    memory_total_mb: float
    sm_count: int | None = None
    mig_enabled: bool = False
    mig_devices: tuple[MigDeviceInfo, ...] = ()
    minor_number: int | None = None  # of its device node, /dev/nvidia<minor> (NVML), if known


@dataclass(frozen=True, slots=True)
class MigLayoutReport:
    """What ``apply_mig_layout`` did on one GPU (backends that can lay out MIG offer it).

    ``applied`` False means nothing is usable yet and ``message`` says why and what to do
    (e.g. MIG mode was switched on and waits for a GPU reset). ``instances`` are the GPU's
    MIG instances afterwards; ``created`` / ``destroyed`` list profiles.
    """

    index: int
    applied: bool
    message: str
    instances: tuple[MigDeviceInfo, ...] = ()
    created: tuple[str, ...] = ()
    destroyed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One reading of one GPU.

    ``util_pct`` is None where the device cannot report it (NVML on a GPU in MIG mode).
    ``process_memory_mb`` maps a process id to the GPU memory it holds on this GPU (MB);
    ``process_util_pct`` maps a process id to its SM utilisation since the previous reading
    (percent; empty where the GPU gives no per-process samples);
    ``job_memory_mb`` maps a job id to its memory where the backend knows jobs (virtual only);
    ``mig_memory_used_mb`` maps a MIG instance UUID to its used memory (MB).
    """

    index: int
    uuid: str
    timestamp: float  # seconds
    util_pct: float | None
    memory_used_mb: float
    memory_total_mb: float
    process_memory_mb: Mapping[int, float] = field(default_factory=dict)
    process_util_pct: Mapping[int, float] = field(default_factory=dict)
    job_memory_mb: Mapping[str, float] = field(default_factory=dict)
    mig_memory_used_mb: Mapping[str, float] = field(default_factory=dict)

    @property
    def memory_free_mb(self) -> float:
        return max(0.0, self.memory_total_mb - self.memory_used_mb)


@runtime_checkable
class GpuBackend(Protocol):
    """What the node agent needs from a GPU backend."""

    name: str

    def devices(self) -> list[DeviceInfo]:
        """The GPUs of this node, in index order."""
        ...

    def sample(self, now: float | None = None) -> list[GpuSample]:
        """One reading per GPU; ``now`` (seconds) overrides the backend's clock for the stamp."""
        ...

    def close(self) -> None:
        """Release the backend (idempotent)."""
        ...

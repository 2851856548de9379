"""GPU backends behind one interface (``GpuBackend``), opened by name with ``open_backend``.

Backends are registered as data (name -> dotted path) and imported lazily, so the virtual backend
never imports pynvml and the nvml backend loads only where asked for.
"""

from __future__ import annotations

import importlib
from typing import Any

from workers.gpu.base import (
    Clock,
    DeviceInfo,
    GpuBackend,
    GpuBackendError,
    GpuSample,
    MigDeviceInfo,
    MigLayoutReport,
    NvmlUnavailable,
)

BACKENDS: dict[str, str] = {
    "nvml": "workers.gpu.nvml_backend.NvmlBackend",
    "virtual": "workers.gpu.virtual_backend.VirtualBackend",
}

__all__ = [
    "BACKENDS",
    "Clock",
    "DeviceInfo",
    "GpuBackend",
    "GpuBackendError",
    "GpuSample",
    "MigDeviceInfo",
    "MigLayoutReport",
    "NvmlUnavailable",
    "open_backend",
]


def open_backend(name: str, **opts: Any) -> GpuBackend:
    """Open the backend called ``name`` with its constructor's keyword options.

    ``open_backend("virtual", models="V100x2,T4", node="gpu-1")``;
    ``open_backend("nvml")`` (raises NvmlUnavailable where NVML is missing).
    Raises GpuBackendError for an unknown name.
    """
    try:
        dotted = BACKENDS[name]
    except KeyError:
        known = ", ".join(sorted(BACKENDS))
        raise GpuBackendError(f"unknown GPU backend {name!r}; known: {known}") from None
    module_name, class_name = dotted.rsplit(".", 1)
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(**opts)

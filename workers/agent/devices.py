"""This node's GPUs as the portal sees them (``device_row``) and the device nodes a job may not
open (``gpu_devices_for``, ``workers.isolation.GpuDevices``)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from scheduler.catalog import UnknownGpuModel, gpu_spec
from workers.gpu.base import DeviceInfo, GpuBackend
from workers.isolation import GpuDevices

log = logging.getLogger(__name__)


def device_row(device: DeviceInfo) -> dict[str, Any]:
    """The ``Gpu`` row fields (``portal.core.nodes.node_register``) of one backend device."""
    row: dict[str, Any] = {
        "index": device.index,
        "uuid": device.uuid,
        "model": device.model or device.name,
        "memory_mb": int(device.memory_total_mb),
        "sm_count": device.sm_count or 0,
    }
    try:
        spec = gpu_spec(device.model or device.name)
    except (UnknownGpuModel, KeyError):
        # Registered all the same, for exclusive use only: no sharing modes or MIG profiles are
        # known for it. Say so, since the scheduler then never packs jobs there.
        log.warning(
            "GPU %s (%s) is not in the GPU catalogue (scheduler/catalog.py): it is offered for "
            "exclusive use only; add the model to share it",
            device.index,
            device.model or device.name,
        )
        return row
    row.update(
        architecture=spec.architecture,
        sm_count=device.sm_count or spec.sm_count,
        sharing_modes=[m.value for m in spec.sharing_modes],
        mig_profiles=[
            {"name": p.name, "slices": p.compute_slices, "memory_mb": p.memory_mb}
            for p in spec.mig_profiles
        ],
    )
    return row


def gpu_device_nodes(devices: list[DeviceInfo], device_dir: str | Path) -> dict[int, str]:
    """GPU index -> its device node: ``<device_dir>/nvidia<N>``, N the GPU's minor number where
    the backend knows it (NVML), else its index."""
    return {
        d.index: os.path.join(
            device_dir, f"nvidia{d.minor_number if d.minor_number is not None else d.index}"
        )
        for d in devices
    }


def gpu_devices_for(
    backend: GpuBackend | None,
    backend_name: str,
    device_dir: str | Path | None,
    *,
    sys_admin: bool | None = None,
) -> GpuDevices:
    """Whether this node can hide GPUs from the jobs not given them (``GpuDevices.detect``):
    the device nodes are in ``device_dir`` (``--gpu-device-dir``; default ``/dev`` for the
    ``nvml`` backend, none for ``virtual``, whose GPUs have no device nodes)."""
    if backend is None:
        return GpuDevices.detect({}, no_nodes="a node without GPUs")
    if device_dir is None and backend_name == "nvml":
        device_dir = "/dev"
    if device_dir is None:
        return GpuDevices.detect(
            {},
            no_nodes="virtual GPUs have no device nodes; --gpu-device-dir DIR names "
            "stand-ins (DIR/nvidia<N> for GPU N)",
        )
    return GpuDevices.detect(gpu_device_nodes(backend.devices(), device_dir), sys_admin=sys_admin)

"""How the profile page groups a profile's metrics (by ALGORITHMS.md section) and its derived
classes (computed by ``scheduler.classes``, never stored)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from portal.core import adapters
from portal.core.models import ApplicationProfile


@dataclass(frozen=True)
class Metric:
    label: str
    value: Any
    unit: str = ""

    @property
    def known(self) -> bool:
        return self.value is not None and self.value != ""


@dataclass(frozen=True)
class Section:
    anchor: str
    title: str
    algorithm: str  # the short name of ALGORITHMS.md
    metrics: list[Metric]


# (field, label, unit) per section, in the order of ALGORITHMS.md.
_SECTIONS: list[tuple[str, str, str, list[tuple[str, str, str]]]] = [
    (
        "s1",
        "Run times and memory",
        "placement_rate, exec_plan",
        [
            ("cpu_time_s", "CPU run time", "s"),
            ("gpu_memory_max_mb", "GPU memory, max", "MB"),
            ("gpu_memory_avg_mb", "GPU memory, average", "MB"),
        ],
    ),
    (
        "s2",
        "Utilisation metrics",
        "coscheml",
        [
            ("gpu_util_pct", "GPU utilisation", "%"),
            ("sm_efficiency_pct", "SM efficiency", "%"),
            ("warp_efficiency_pct", "Warp efficiency", "%"),
            ("ipc", "IPC", "instr/cycle"),
            ("occupancy_pct", "Occupancy", "%"),
            ("mem_util_pct", "Memory utilisation", "%"),
            ("h2d_gbps", "Host to device (PCIe)", "GB/s"),
            ("d2h_gbps", "Device to host (PCIe)", "GB/s"),
            ("gld_gbps", "Global load throughput", "GB/s"),
            ("gst_gbps", "Global store throughput", "GB/s"),
        ],
    ),
    (
        "s3",
        "Stall reasons and kernel resources",
        "kscheduler",
        [
            ("stall_exec_dependency_pct", "Stalls: execution dependency", "%"),
            ("stall_instruction_fetch_pct", "Stalls: instruction fetch", "%"),
            ("stall_memory_dependency_pct", "Stalls: memory dependency", "%"),
            ("stall_texture_pct", "Stalls: texture / L1", "%"),
            ("stall_synchronization_pct", "Stalls: synchronisation", "%"),
            ("stall_other_pct", "Stalls: other", "%"),
            ("epc", "Eligible warps per cycle (EPC)", ""),
            ("registers_per_block", "Registers per block", ""),
            ("smem_per_block_bytes", "Shared memory per block", "B"),
            ("l1_transactions", "L1 transactions", ""),
            ("saturation_tbs_per_sm", "Saturation point", "TBs/SM"),
            ("dram_bw_gbps", "DRAM bandwidth demand", "GB/s"),
            ("gflops", "Compute demand", "GFLOPS"),
        ],
    ),
    (
        "s4",
        "Job descriptors",
        "sharing_mode",
        [
            ("cm_ratio", "C/M ratio", ""),
            ("sensitivity", "Sensitivity", "× throughput"),
            ("batch_size", "Batch size", ""),
            ("image_size", "Image size", "px"),
        ],
    ),
]


def sections(profile: ApplicationProfile) -> list[Section]:
    """The profile's stored metrics grouped by ALGORITHMS.md section (None = not measured)."""
    return [
        Section(
            anchor, title, algorithm, [Metric(lbl, getattr(profile, f), u) for f, lbl, u in rows]
        )
        for anchor, title, algorithm, rows in _SECTIONS
    ]


# Labels for the keys of ``portal.core.adapters.derived_classes``.
_CLASS_LABELS = {
    "kernel_class": "Kernel class",
    "cm_class": "C/M class",
    "scale_class": "Scale",
    "sensitivity_class": "Sensitivity",
}


def derived_classes(profile: ApplicationProfile) -> list[Metric]:
    """Kernel class (§3), C/M class, scale and sensitivity (§4), computed by
    ``scheduler.classes`` through the adapter; None ("—") when the data is missing."""
    values = adapters.derived_classes(profile)
    return [Metric(label, values.get(key)) for key, label in _CLASS_LABELS.items()]


@dataclass(frozen=True)
class GpuTimeRow:
    gpu_model: str
    time_s: float
    speedup_vs_cpu: float | None  # CPU run time / GPU run time, the §1 placement-rate feature


def gpu_time_rows(profile: ApplicationProfile) -> list[GpuTimeRow]:
    """Solo GPU run times per GPU model (seconds) with the speed-up over the CPU run time."""
    cpu = profile.cpu_time_s
    return [
        GpuTimeRow(t.gpu_model, t.time_s, cpu / t.time_s if cpu and t.time_s > 0 else None)
        for t in profile.gpu_times.all()
    ]


@dataclass(frozen=True)
class SourceRow:
    label: str
    source: str


def source_rows(profile: ApplicationProfile) -> list[SourceRow]:
    """Where the profile's numbers come from (``ApplicationProfile.sources``), labelled as on
    the page: "GPU time, A30", "GPU memory, max", "Memory steps", ..."""
    labels = {field: label for *_head, metrics in _SECTIONS for field, label, _unit in metrics}
    rows = []
    for key, source in (profile.sources or {}).items():
        if key.startswith("gpu_time_s."):
            label = f"GPU time, {key.split('.', 1)[1]}"
        elif key == "memory_steps":
            label = "Memory steps"
        else:
            label = labels.get(key) or key.replace("_", " ")
        rows.append(SourceRow(label, str(source)))
    return sorted(rows, key=lambda r: r.label.lower())

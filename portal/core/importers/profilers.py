"""Profiler exports: ``nvprof --csv --metrics`` and Nsight Compute ``ncu --csv`` (details page
or ``--page raw``), aggregated over kernels into one profile (``docs/profiles.md``)."""

from __future__ import annotations

import csv
import re
from pathlib import PurePath
from typing import Any

from portal.core.importers.records import (
    ProfileImportError,
    ProfileRecord,
    RowError,
    _Collector,
    record_from_mapping,
)
from scheduler.catalog import UnknownGpuModel, gpu_spec

_VALUE_RE = re.compile(r"^\s*([-+]?[\d,]*\.?\d+(?:[eE][-+]?\d+)?)\s*([A-Za-z/%]*)\s*$")


_LEVEL_RE = re.compile(r"^\s*(Idle|Low|Mid|High|Max)\s*\((\d+)\)\s*$", re.IGNORECASE)


_BYTE_PREFIX = {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1.0, "t": 1e3}  # -> GB/s


_TIME_TO_S = {
    "ns": 1e-9,
    "nsecond": 1e-9,
    "us": 1e-6,
    "usecond": 1e-6,
    "ms": 1e-3,
    "msecond": 1e-3,
    "s": 1.0,
    "second": 1.0,
}


def _measure(raw: str, unit: str = "") -> tuple[float, str]:
    """``"245.6GB/s"`` -> (245.6, "GB/s"); ``"High (7)"`` -> (7, "level"); ``"1,234"`` -> 1234."""
    text = (raw or "").strip().strip('"')
    level = _LEVEL_RE.match(text)
    if level:
        return float(level.group(2)), "level"
    m = _VALUE_RE.match(text)
    if not m:
        raise ValueError(f"cannot read a number from {raw!r}")
    return float(m.group(1).replace(",", "")), (m.group(2) or unit or "").strip()


def _to_gbps(value: float, unit: str) -> float:
    u = unit.lower().replace("byte", "b").replace("/second", "/s")
    m = re.fullmatch(r"([kmgt]?)b/s", u)
    if not m:
        raise ValueError(f"unit {unit!r} is not a throughput")
    return value * _BYTE_PREFIX[m.group(1)]


def _pct(value: float, unit: str) -> float:
    return value if unit == "%" else value * 100 if value <= 1 and unit == "" else value


# Stall reasons of the profilers -> the six groups of ALGORITHMS.md §3 (Table 7).
_NVPROF_STALLS = {
    "stall_exec_dependency": "exec_dependency",
    "stall_inst_fetch": "instruction_fetch",
    "stall_memory_dependency": "memory_dependency",
    "stall_texture": "texture",
    "stall_sync": "synchronization",
    "stall_other": "other",
    "stall_pipe_busy": "other",
    "stall_constant_memory_dependency": "other",
    "stall_memory_throttle": "other",
    "stall_not_selected": "other",
}


# Nsight Compute (Volta+) warp states; "selected" (issuing) is not a stall.
_NCU_STALLS = {
    "long_scoreboard": "memory_dependency",
    "lg_throttle": "memory_dependency",
    "drain": "memory_dependency",
    "imc_miss": "memory_dependency",
    "wait": "exec_dependency",
    "short_scoreboard": "exec_dependency",
    "math_pipe_throttle": "exec_dependency",
    "mio_throttle": "other",
    "tex_throttle": "texture",
    "no_instruction": "instruction_fetch",
    "branch_resolving": "instruction_fetch",
    "barrier": "synchronization",
    "membar": "synchronization",
    "sleeping": "other",
    "dispatch_stall": "other",
    "misc": "other",
    "not_selected": "other",
}


def _weighted_mean(pairs: list[tuple[float, float]]) -> float | None:
    total = sum(w for _v, w in pairs)
    if not pairs:
        return None
    if total <= 0:
        return sum(v for v, _w in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / total


def _aggregate(kernels: list[tuple[dict[str, float], float]]) -> dict[str, Any]:
    """Per-kernel metrics (already in our units and keys) -> profile fields.

    Means are weighted by ``weight`` (invocations for nvprof, duration for ncu); stall reasons
    are normalised so the six groups sum to 100 %."""
    keys = {k for metrics, _w in kernels for k in metrics}
    fields: dict[str, Any] = {}
    for key in sorted(keys):
        pairs = [(m[key], w) for m, w in kernels if key in m]
        value = _weighted_mean(pairs)
        if value is None:
            continue
        if key.startswith("stall:"):
            continue
        if key in ("registers_per_block", "smem_per_block_bytes"):
            fields[key] = int(round(max(v for v, _w in pairs)))  # the largest kernel's need
        else:
            fields[key] = round(value, 4)
    stall_totals: dict[str, float] = {}
    for key in keys:
        if key.startswith("stall:"):
            group = key.split(":", 1)[1]
            value = _weighted_mean([(m[key], w) for m, w in kernels if key in m]) or 0.0
            stall_totals[group] = stall_totals.get(group, 0.0) + value
    total = sum(stall_totals.values())
    if total > 0:
        for group in (
            "exec_dependency",
            "instruction_fetch",
            "memory_dependency",
            "texture",
            "synchronization",
            "other",
        ):
            fields[f"stall_{group}_pct"] = round(100 * stall_totals.get(group, 0.0) / total, 2)
    for key, value in fields.items():
        if key.endswith("_pct"):
            fields[key] = min(100.0, max(0.0, value))
    return fields


def _profiler_record(
    fields: dict[str, Any], options: dict[str, Any], default_name: str | None
) -> list[ProfileRecord]:
    out = _Collector()
    raw: dict[str, Any] = {**fields}
    for opt in ("name", "version", "kind", "description"):
        if options.get(opt):
            raw[opt] = options[opt]
    if not raw.get("name") and default_name:
        raw["name"] = default_name
    if not raw.get("name"):
        out.add(None, "name", "the file does not say which application it profiles; give a name")
    record = record_from_mapping(raw, None, out)
    if out.errors:
        raise ProfileImportError(out.errors)
    return [record]


def _csv_block(lines: list[str], header_index: int) -> list[tuple[int, list[str]]]:
    rows = []
    reader = csv.reader(lines[header_index:])
    for offset, cells in enumerate(reader):
        line_no = header_index + offset + 1
        if not cells or (len(cells) == 1 and cells[0].startswith("==")):
            continue
        rows.append((line_no, [c.strip() for c in cells]))
    return rows


_NVPROF_COMMAND_RE = re.compile(r"^==\d+== NVPROF is profiling process \d+, command: (.+)$")


_NVPROF_METRICS = {
    "sm_efficiency": "sm_efficiency_pct",
    "warp_execution_efficiency": "warp_efficiency_pct",
    "ipc": "ipc",
    "achieved_occupancy": "occupancy_pct",
    "gld_throughput": "gld_gbps",
    "gst_throughput": "gst_gbps",
    "dram_read_throughput": "dram_bw_gbps",
    "dram_write_throughput": "dram_bw_gbps",
    "eligible_warps_per_cycle": "epc",
    "dram_utilization": "mem_util_pct",
    "tex_cache_transactions": "l1_transactions",
    "l1_cache_global_hit_rate": None,
    "flop_sp_efficiency": "flop_sp_efficiency",
}


def parse_nvprof(text: str, options: dict[str, Any]) -> list[ProfileRecord]:
    """``nvprof --csv --metrics ...`` -> one profile (kernels aggregated, weighted by
    invocations). Throughputs become GB/s, occupancy 0..1 becomes percent, utilisation levels
    0..10 become percent (level x 10), ``flop_sp_efficiency`` x the device's catalogue peak gives
    GFLOPS demand; stall reasons are grouped as in ALGORITHMS.md §3."""
    lines = text.splitlines()
    command = None
    header_index = None
    for i, line in enumerate(lines):
        m = _NVPROF_COMMAND_RE.match(line.strip())
        if m:
            command = m.group(1).strip()
        if line.lstrip().startswith('"Device","Kernel"') or line.startswith("Device,Kernel"):
            header_index = i
            break
    if header_index is None:
        raise ProfileImportError(
            [RowError(None, "file", 'no nvprof metric table ("Device","Kernel",... header)')]
        )
    rows = _csv_block(lines, header_index)
    header = rows[0][1]
    need = ["Device", "Kernel", "Invocations", "Metric Name", "Avg"]
    missing = [c for c in need if c not in header]
    if missing:
        raise ProfileImportError(
            [RowError(rows[0][0], c, "column missing from the nvprof header") for c in missing]
        )
    col = {name: header.index(name) for name in need}
    out = _Collector()
    kernels: dict[str, tuple[dict[str, float], float]] = {}
    device = None
    for line_no, cells in rows[1:]:
        if len(cells) < len(header):
            out.add(line_no, "(row)", f"{len(cells)} cells, expected {len(header)}")
            continue
        metric = cells[col["Metric Name"]]
        device = device or cells[col["Device"]]
        kernel = cells[col["Kernel"]]
        try:
            invocations = float(cells[col["Invocations"]])
        except ValueError:
            out.add(line_no, "Invocations", f"{cells[col['Invocations']]!r} is not a number")
            continue
        metrics, _w = kernels.setdefault(kernel, ({}, invocations))
        if metric not in _NVPROF_METRICS and metric not in _NVPROF_STALLS:
            continue  # metrics we do not use are fine
        try:
            value, unit = _measure(cells[col["Avg"]])
        except ValueError as exc:
            out.add(line_no, metric, str(exc))
            continue
        try:
            if metric in _NVPROF_STALLS:
                key = f"stall:{_NVPROF_STALLS[metric]}"
                metrics[key] = metrics.get(key, 0.0) + value
                continue
            target = _NVPROF_METRICS[metric]
            if target is None:
                continue
            if target.endswith("_gbps"):
                value = _to_gbps(value, unit)
                metrics[target] = metrics.get(target, 0.0) + value  # read + write add up
            elif metric == "achieved_occupancy":
                metrics[target] = value * 100 if value <= 1 else value
            elif unit == "level":
                metrics[target] = value * 10
            else:
                metrics[target] = value
        except ValueError as exc:
            out.add(line_no, metric, str(exc))
    if out.errors:
        raise ProfileImportError(out.errors)
    if not kernels:
        raise ProfileImportError([RowError(None, "file", "the nvprof table has no kernel rows")])
    fields = _aggregate(list(kernels.values()))
    efficiency = fields.pop("flop_sp_efficiency", None)
    if efficiency is not None and device:
        try:
            peak = gpu_spec(re.sub(r"\s*\(\d+\)$", "", device)).peak_gflops
            fields["gflops"] = round(peak * efficiency / 100, 2)
        except UnknownGpuModel:
            pass
    default_name = PurePath(command.split()[0]).name if command else None
    return _profiler_record(fields, options, default_name)


_NCU_DETAILS = {
    # (metric name, unit class) -> our key; unit class "%" or "rate" or "" (anything)
    ("Achieved Occupancy", "%"): "occupancy_pct",
    ("Executed Ipc Active", ""): "ipc",
    ("Eligible Warps Per Scheduler", ""): "epc",
    ("Memory Throughput", "%"): "mem_util_pct",
    ("Memory Throughput", "rate"): "dram_bw_gbps",
    ("DRAM Throughput", "%"): "mem_util_pct",
    ("Compute (SM) Throughput", "%"): "sm_efficiency_pct",
    ("SM Busy", "%"): None,
    ("Duration", ""): "duration_s",
    ("Registers Per Thread", ""): "registers_per_thread",
    ("Block Size", ""): "block_size",
    ("Static Shared Memory Per Block", ""): "smem_static",
    ("Dynamic Shared Memory Per Block", ""): "smem_dynamic",
    ("Avg. Active Threads Per Warp", ""): "active_threads_per_warp",
}


_NCU_RAW = {
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "sm__inst_executed.avg.per_cycle_active": "ipc",
    "smsp__warps_eligible.avg.per_cycle_active": "epc",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "mem_util_pct",
    "dram__bytes.sum.per_second": "dram_bw_gbps",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_efficiency_pct",
    "smsp__thread_inst_executed_per_inst_executed.ratio": "active_threads_per_warp",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum.per_second": "gld_gbps",
    "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum.per_second": "gst_gbps",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "l1_transactions",
    "gpu__time_duration.sum": "duration_s",
    "launch__registers_per_thread": "registers_per_thread",
    "launch__block_size": "block_size",
    "launch__shared_mem_per_block_static": "smem_static",
    "launch__shared_mem_per_block_dynamic": "smem_dynamic",
}


_NCU_STALL_RE = re.compile(
    r"^smsp__(?:average_|pcsamp_)?(?:warps?_)?(?:latency_)?issue_stalled_([a-z_]+?)"
    r"(?:_per_warp_active\.pct|_per_issue_active\.ratio|\.ratio|\.pct|\.sum)?$"
)


def _ncu_value(key: str, value: float, unit: str) -> float:
    """Convert an Nsight Compute value to our unit for ``key``."""
    u = unit.strip()
    if key.endswith("_gbps"):
        return _to_gbps(value, u)
    if key == "duration_s":
        return value * _TIME_TO_S.get(u, 1e-9)
    if key.startswith("smem_"):
        factor = {"byte/block": 1, "Kbyte/block": 1024, "Mbyte/block": 1024**2}
        return value * factor.get(u, 1)
    return value


def _ncu_finish(kernels: list[dict[str, float]]) -> dict[str, Any]:
    weighted = []
    for m in kernels:
        if "registers_per_thread" in m and "block_size" in m:
            m["registers_per_block"] = m["registers_per_thread"] * m["block_size"]
        if "smem_static" in m or "smem_dynamic" in m:
            m["smem_per_block_bytes"] = m.get("smem_static", 0) + m.get("smem_dynamic", 0)
        if "active_threads_per_warp" in m:
            m["warp_efficiency_pct"] = 100 * m["active_threads_per_warp"] / 32
        weight = m.get("duration_s", 1.0)
        for helper in (
            "registers_per_thread",
            "block_size",
            "smem_static",
            "smem_dynamic",
            "active_threads_per_warp",
            "duration_s",
        ):
            m.pop(helper, None)
        weighted.append((m, weight))
    return _aggregate(weighted)


def parse_ncu(text: str, options: dict[str, Any]) -> list[ProfileRecord]:
    """Nsight Compute ``ncu --csv`` (details page or ``--page raw``) -> one profile, kernels
    weighted by duration. Warp-state stall reasons are grouped as in ALGORITHMS.md §3; warp
    efficiency is active threads per warp / 32."""
    lines = text.splitlines()
    header_index = next(
        (i for i, line in enumerate(lines) if line.lstrip().startswith('"ID","Process ID"')), None
    )
    if header_index is None:
        raise ProfileImportError(
            [RowError(None, "file", 'no Nsight Compute table ("ID","Process ID",... header)')]
        )
    rows = _csv_block(lines, header_index)
    header_line, header = rows[0]
    out = _Collector()
    process = None
    per_kernel: dict[str, dict[str, float]] = {}
    if "Metric Name" in header and "Metric Value" in header:
        c_id, c_name = header.index("ID"), header.index("Metric Name")
        c_unit = header.index("Metric Unit") if "Metric Unit" in header else None
        c_value, c_proc = header.index("Metric Value"), header.index("Process Name")
        for line_no, cells in rows[1:]:
            if len(cells) < len(header):
                out.add(line_no, "(row)", f"{len(cells)} cells, expected {len(header)}")
                continue
            process = process or cells[c_proc]
            name = cells[c_name]
            unit = cells[c_unit] if c_unit is not None else ""
            unit_class = "%" if unit == "%" else "rate" if "/second" in unit else ""
            key = _NCU_DETAILS.get((name, unit_class), _NCU_DETAILS.get((name, "")))
            if key is None:
                continue
            try:
                value, parsed_unit = _measure(cells[c_value], unit)
                per_kernel.setdefault(cells[c_id], {})[key] = _ncu_value(
                    key, value, unit or parsed_unit
                )
            except ValueError as exc:
                out.add(line_no, name, str(exc))
    else:
        if "Kernel Name" not in header:
            raise ProfileImportError([RowError(header_line, "Kernel Name", "column missing")])
        data_rows = rows[1:]
        units: list[str] = [""] * len(header)
        if data_rows and not data_rows[0][1][0].strip().isdigit():
            units = data_rows[0][1]  # the units row under the header
            data_rows = data_rows[1:]
        c_id, c_proc = header.index("ID"), header.index("Process Name")
        for line_no, cells in data_rows:
            if len(cells) < len(header):
                out.add(line_no, "(row)", f"{len(cells)} cells, expected {len(header)}")
                continue
            process = process or cells[c_proc]
            metrics = per_kernel.setdefault(cells[c_id], {})
            for i, column in enumerate(header):
                stall = _NCU_STALL_RE.match(column)
                key = _NCU_RAW.get(column)
                if stall:
                    group = _NCU_STALLS.get(stall.group(1))
                    if group is None:
                        continue
                    key = f"stall:{group}"
                if key is None or not cells[i]:
                    continue
                try:
                    value, parsed_unit = _measure(cells[i], units[i] if i < len(units) else "")
                    value = _ncu_value(key, value, units[i] if i < len(units) else parsed_unit)
                except ValueError as exc:
                    out.add(line_no, column, str(exc))
                    continue
                metrics[key] = metrics.get(key, 0.0) + value if key.startswith("stall:") else value
    if out.errors:
        raise ProfileImportError(out.errors)
    if not per_kernel:
        raise ProfileImportError([RowError(None, "file", "the Nsight Compute table has no rows")])
    fields = _ncu_finish(list(per_kernel.values()))
    return _profiler_record(fields, options, process or None)

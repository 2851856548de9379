"""Cluster specification: which nodes and GPUs a simulated (or demo) cluster has.

YAML format (documented in docs/simulator.md)::

    gpu_models:            # optional: override catalogue fields, or define a new model
      V100: {memory_mb: 32768}
    nodes:
      - {name: v100, count: 4, gpu_model: V100, gpus_per_node: 8, cpus: 64}
      - {name: cpu, count: 2, cpus: 32}          # a CPU node: no gpu_model

A group expands to ``count`` nodes named ``<name>-0`` .. ``<name>-<count-1>``. GPU models are
looked up in ``scheduler.catalog`` (spelling tolerant: ``titan xp`` -> ``TitanXp``).
Errors name the file, the line and the field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduler.catalog import CATALOG, UnknownGpuModel, canonical_model, has_mps_thread_limit
from scheduler.domain import GpuSpec, GpuState, MigProfile, NodeKind, NodeState, SharingMode
from scheduler.inputs import (
    MAX_JOB_GPUS,
    MAX_MB,
    FieldLoc,
    InputError,
    line_of,
    load_yaml,
    require_mapping,
    to_float,
    to_int,
)

DEFAULT_CPUS = 8  # cores of a node whose group gives no ``cpus``
MAX_NODES = 100_000  # nodes in one cluster spec (beyond: a typo, not a cluster)
MAX_GPUS_PER_NODE = 1_024

_GROUP_FIELDS = {"name", "count", "gpu_model", "gpus_per_node", "cpus", "memory_mb"}
_GPU_FIELDS = {f.name for f in dataclasses.fields(GpuSpec)} - {"model"}


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node: ``gpu_model`` None for a CPU node. Memory in MB (0 = not modelled)."""

    name: str
    kind: NodeKind
    cores: int
    gpu_model: str | None = None
    gpu_count: int = 0
    memory_mb: float = 0.0


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A whole cluster: its nodes and the GPU specs they use (catalogue plus overrides)."""

    nodes: tuple[NodeSpec, ...]
    gpu_models: Mapping[str, GpuSpec]
    source: str = "<cluster>"

    def gpu_spec(self, model: str) -> GpuSpec:
        return self.gpu_models[model]

    @property
    def gpu_count(self) -> int:
        return sum(n.gpu_count for n in self.nodes)

    def initial_nodes(self) -> tuple[NodeState, ...]:
        """Idle ``NodeState`` snapshots of every node, in file order."""
        out = []
        for n in self.nodes:
            gpus: tuple[GpuState, ...] = ()
            if n.gpu_model is not None:
                spec = self.gpu_models[n.gpu_model]
                gpus = tuple(GpuState(node=n.name, index=i, spec=spec) for i in range(n.gpu_count))
            out.append(
                NodeState(
                    name=n.name,
                    kind=n.kind,
                    cores=n.cores,
                    free_cores=n.cores,
                    memory_mb=n.memory_mb,
                    gpus=gpus,
                )
            )
        return tuple(out)

    def describe(self) -> str:
        """One line such as ``12 nodes: 36 GPUs (12 K80, 12 P100, 12 V100), 2 CPU nodes``."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            if n.gpu_model:
                counts[n.gpu_model] = counts.get(n.gpu_model, 0) + n.gpu_count
        cpu_nodes = sum(1 for n in self.nodes if n.kind == NodeKind.CPU)
        parts = ", ".join(f"{c} {m}" for m, c in counts.items())
        text = f"{len(self.nodes)} nodes: {self.gpu_count} GPUs ({parts})"
        return text + (f", {cpu_nodes} CPU nodes" if cpu_nodes else "")


def load_cluster_spec(path: str | Path) -> ClusterSpec:
    """Read a cluster YAML file (see the module docstring). Raises InputError."""
    data = load_yaml(path)
    return parse_cluster_spec(data, source=path)


def parse_cluster_spec(data: Any, *, source: str | Path = "<cluster>") -> ClusterSpec:
    """Build a ClusterSpec from parsed YAML (``load_yaml`` output keeps line numbers)."""
    top = require_mapping(data, file=source, line=line_of(data, 0), field="cluster")
    unknown = set(top) - {"nodes", "gpu_models", "name", "description"}
    if unknown:
        key = sorted(unknown)[0]
        raise InputError(
            "unknown section; expected 'nodes' and optionally 'gpu_models'",
            file=source,
            line=line_of(top, key),
            field=key,
        )
    models = _parse_gpu_models(top.get("gpu_models") or {}, source, line_of(top, "gpu_models"))
    groups = top.get("nodes")
    if not isinstance(groups, list) or not groups:
        raise InputError(
            "expected a non-empty list of node groups",
            file=source,
            line=line_of(top, "nodes"),
            field="nodes",
        )
    nodes: list[NodeSpec] = []
    seen: set[str] = set()
    for i, group in enumerate(groups):
        gline = line_of(groups, i)
        group = require_mapping(group, file=source, line=gline, field=f"nodes[{i}]")
        nodes.extend(_parse_group(group, i, models, source, gline, seen))
    return ClusterSpec(nodes=tuple(nodes), gpu_models=models, source=str(source))


def _parse_group(
    group: Mapping,
    i: int,
    models: dict[str, GpuSpec],
    source: str | Path,
    gline: int | None,
    seen: set[str],
) -> list[NodeSpec]:
    def where(key: str) -> FieldLoc:
        return {"file": source, "line": line_of(group, key) or gline, "field": f"nodes[{i}].{key}"}

    unknown = set(group) - _GROUP_FIELDS
    if unknown:
        key = sorted(unknown)[0]
        raise InputError(
            f"unknown field; expected {', '.join(sorted(_GROUP_FIELDS))}", **where(key)
        )
    name = group.get("name")
    if not isinstance(name, str) or not name.strip():
        raise InputError("every node group needs a name", **where("name"))
    count = to_int(group.get("count", 1), minimum=1, maximum=MAX_NODES, **where("count"))
    if len(seen) + count > MAX_NODES:
        raise InputError(f"more than {MAX_NODES:,} nodes in the cluster", **where("count"))
    cores = to_int(
        group.get("cpus", DEFAULT_CPUS), minimum=1, maximum=MAX_JOB_GPUS, **where("cpus")
    )
    memory = to_float(group.get("memory_mb", 0), minimum=0, maximum=MAX_MB, **where("memory_mb"))
    model_name = group.get("gpu_model")
    model: str | None = None
    gpu_count = 0
    if model_name is not None:
        model = _resolve_model(str(model_name), models)
        if model is None:
            known = ", ".join(sorted(models))
            raise InputError(
                f"unknown GPU model {model_name!r}; known: {known} (or define it under gpu_models)",
                **where("gpu_model"),
            )
        gpu_count = to_int(
            group.get("gpus_per_node", 1),
            minimum=1,
            maximum=MAX_GPUS_PER_NODE,
            **where("gpus_per_node"),
        )
    elif "gpus_per_node" in group and group["gpus_per_node"] not in (0, None):
        raise InputError("a group with GPUs needs a gpu_model", **where("gpus_per_node"))
    out = []
    for k in range(count):
        node_name = f"{name}-{k}"
        if node_name in seen:
            raise InputError(f"node name {node_name!r} used twice", **where("name"))
        seen.add(node_name)
        out.append(
            NodeSpec(
                name=node_name,
                kind=NodeKind.GPU if model else NodeKind.CPU,
                cores=cores,
                gpu_model=model,
                gpu_count=gpu_count,
                memory_mb=memory,
            )
        )
    return out


def _resolve_model(name: str, models: Mapping[str, GpuSpec]) -> str | None:
    if name in models:
        return name
    try:
        key = canonical_model(name)
    except UnknownGpuModel:
        return None
    return key if key in models else None


def _parse_gpu_models(section: Any, source: str | Path, sline: int | None) -> dict[str, GpuSpec]:
    """Catalogue plus the file's overrides / new models."""
    models = dict(CATALOG)
    section = require_mapping(section, file=source, line=sline, field="gpu_models")
    for raw_name, fields in section.items():
        mline = line_of(section, raw_name)
        fields = require_mapping(
            fields or {}, file=source, line=mline, field=f"gpu_models.{raw_name}"
        )
        name = _resolve_model(str(raw_name), models) or str(raw_name)
        base = models.get(name)
        values: dict[str, Any] = {}
        for key, value in fields.items():
            loc: FieldLoc = {
                "file": source,
                "line": line_of(fields, key) or mline,
                "field": f"gpu_models.{raw_name}.{key}",
            }
            if key not in _GPU_FIELDS:
                raise InputError(
                    f"unknown GPU field; expected {', '.join(sorted(_GPU_FIELDS))}", **loc
                )
            values[key] = _gpu_field(key, value, loc)
        if base is None:
            missing = {"architecture", "memory_mb", "sm_count", "dram_bw_gbps", "peak_gflops"}
            missing -= set(values)
            if missing:
                raise InputError(
                    f"new GPU model needs {', '.join(sorted(missing))}",
                    file=source,
                    line=mline,
                    field=f"gpu_models.{raw_name}",
                )
            values.setdefault("mps_thread_limit", has_mps_thread_limit(values["architecture"]))
            models[name] = GpuSpec(model=name, **values)
        else:
            models[name] = dataclasses.replace(base, **values)
    return models


def _gpu_field(key: str, value: Any, loc: FieldLoc) -> Any:
    if key == "architecture":
        return str(value)
    if key in ("memory_mb", "sm_count", "mig_total_slices"):
        return to_int(
            value, minimum=0, maximum=int(MAX_MB) if key == "memory_mb" else 1_000_000, **loc
        )
    if key in ("dram_bw_gbps", "peak_gflops"):
        return to_float(value, minimum=0, maximum=1e9, **loc)
    if key == "mps_thread_limit":
        if not isinstance(value, bool):
            raise InputError("expected true or false", **loc)
        return value
    if key == "sharing_modes":
        if not isinstance(value, list):
            raise InputError("expected a list of sharing modes", **loc)
        try:
            return tuple(SharingMode(str(v).lower()) for v in value)
        except ValueError:
            known = ", ".join(m.value for m in SharingMode)
            raise InputError(f"unknown sharing mode in {value!r}; known: {known}", **loc) from None
    if key == "mig_profiles":
        if not isinstance(value, list):
            raise InputError("expected a list of {name, compute_slices, memory_mb}", **loc)
        out = []
        for p in value:
            p = require_mapping(p, **loc)
            if not {"name", "compute_slices", "memory_mb"} <= set(p):
                raise InputError("a MIG profile needs name, compute_slices, memory_mb", **loc)
            out.append(
                MigProfile(
                    str(p["name"]),
                    to_int(p["compute_slices"], minimum=1, maximum=1_000, **loc),
                    to_int(p["memory_mb"], minimum=1, maximum=int(MAX_MB), **loc),
                )
            )
        return tuple(out)
    raise InputError("unsupported field", **loc)  # pragma: no cover - guarded above

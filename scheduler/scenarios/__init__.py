"""Named simulation scenarios: a cluster, a workload, default policies and settings, as YAML.

A scenario file (``scheduler/scenarios/<name>.yaml``; format in docs/simulator.md)::

    name: seed004
    description: one line
    cluster: {nodes: [...], gpu_models: {...}}   # inline, or cluster_file: path
    trace: {file: path, format: gavel|profile|alibaba, profiles: path}   # or:
    workload:
      profiles: profiles/seed004.yaml
      arrival_interval_s: 0          # job k (in generated order) arrives at k * interval
      order: sequential              # or round_robin over the groups
      jobs: [{profile: CNN-MNIST, count: 13, gpus: 1}, ...]
    policies: [fifo, binpack]
    policy_params: {binpack: {max_jobs_per_gpu: 3}}
    interference: class_based        # measured | class_based | none
    simulation: {seed: 0, oom_action: requeue, context_switch_overhead: 0.05, ...}

Relative paths are relative to the scenario file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.cluster_spec import ClusterSpec, load_cluster_spec, parse_cluster_spec
from scheduler.domain import JobSpec
from scheduler.inputs import (
    MAX_JOB_GPUS,
    MAX_MB,
    MAX_SECONDS,
    FieldLoc,
    InputError,
    line_of,
    load_yaml,
    require_mapping,
    to_float,
    to_int,
)
from scheduler.simulator.elastic import ElasticModel, StragglerFaults
from scheduler.simulator.results import OomAction, SimConfig
from scheduler.traces import load_profiles, read_trace

SCENARIO_DIR = Path(__file__).resolve().parent

_TOP_FIELDS = {
    "name",
    "description",
    "cluster",
    "cluster_file",
    "trace",
    "workload",
    "policies",
    "policy_params",
    "interference",
    "simulation",
    "notes",
}
_SIM_FIELDS = {f.name: f for f in dataclasses.fields(SimConfig)}


@dataclass(frozen=True)
class Scenario:
    """A loaded scenario: everything ``simulate`` needs."""

    name: str
    description: str
    cluster: ClusterSpec
    jobs: tuple[JobSpec, ...]
    policies: tuple[str, ...]
    policy_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    interference: str = "none"
    config: SimConfig = field(default_factory=SimConfig)
    source: str = ""


def list_scenarios() -> list[tuple[str, str]]:
    """(name, description) of every built-in scenario, sorted by name."""
    out = []
    for path in sorted(SCENARIO_DIR.glob("*.yaml")):
        try:
            data = load_yaml(path)
            desc = str(data.get("description", "")) if isinstance(data, Mapping) else ""
        except InputError as exc:
            desc = f"(broken: {exc})"
        out.append((path.stem, desc))
    return out


def scenario_path(name: str) -> Path:
    """The file of scenario ``name`` (a built-in name or a path to a YAML file)."""
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") and candidate.exists():
        return candidate
    path = SCENARIO_DIR / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(n for n, _ in list_scenarios())
        raise InputError(f"unknown scenario {name!r}; known: {known}")
    return path


def load_scenario(name: str) -> Scenario:
    """Load a built-in scenario by name, or a scenario YAML file by path. Raises InputError."""
    path = scenario_path(name)
    data = load_yaml(path)
    top = require_mapping(data, file=path, line=1, field="scenario")
    unknown = set(top) - _TOP_FIELDS
    if unknown:
        key = sorted(unknown)[0]
        raise InputError(
            f"unknown field; expected {', '.join(sorted(_TOP_FIELDS))}",
            file=path,
            line=line_of(top, key),
            field=key,
        )
    base = path.parent
    if "cluster" in top:
        cluster = parse_cluster_spec(top["cluster"], source=path)
    elif "cluster_file" in top:
        cluster = load_cluster_spec(base / str(top["cluster_file"]))
    else:
        raise InputError(
            "a scenario needs 'cluster' or 'cluster_file'", file=path, line=1, field="cluster"
        )
    if "trace" in top:
        jobs = _trace_jobs(top["trace"], base, path, line_of(top, "trace"))
    elif "workload" in top:
        jobs = _workload_jobs(top["workload"], base, path, line_of(top, "workload"))
    else:
        raise InputError("a scenario needs 'trace' or 'workload'", file=path, line=1, field="trace")
    policies = top.get("policies") or ["fifo"]
    if not isinstance(policies, list) or not all(isinstance(p, str) for p in policies):
        raise InputError(
            "expected a list of policy names",
            file=path,
            line=line_of(top, "policies"),
            field="policies",
        )
    params = top.get("policy_params") or {}
    require_mapping(params, file=path, line=line_of(top, "policy_params"), field="policy_params")
    return Scenario(
        name=str(top.get("name", path.stem)),
        description=str(top.get("description", "")),
        cluster=cluster,
        jobs=tuple(jobs),
        policies=tuple(policies),
        policy_params={k: dict(v or {}) for k, v in params.items()},
        interference=str(top.get("interference", "none")),
        config=_sim_config(top.get("simulation") or {}, path, line_of(top, "simulation")),
        source=str(path),
    )


def _trace_jobs(section: Any, base: Path, path: Path, sline: int | None) -> list[JobSpec]:
    section = require_mapping(section, file=path, line=sline, field="trace")
    if "file" not in section:
        raise InputError("missing trace file", file=path, line=sline, field="trace.file")
    profiles = section.get("profiles")
    return read_trace(
        base / str(section["file"]),
        fmt=section.get("format"),
        profiles=base / str(profiles) if profiles else None,
        limit=section.get("limit"),
    )


def _workload_jobs(section: Any, base: Path, path: Path, sline: int | None) -> list[JobSpec]:
    section = require_mapping(section, file=path, line=sline, field="workload")

    def loc(key: str) -> FieldLoc:
        return {"file": path, "line": line_of(section, key) or sline, "field": f"workload.{key}"}

    if "profiles" not in section:
        raise InputError("missing profiles file", **loc("profiles"))
    profiles = load_profiles(base / str(section["profiles"]))
    interval = to_float(
        section.get("arrival_interval_s", 0),
        minimum=0,
        maximum=MAX_SECONDS,
        **loc("arrival_interval_s"),
    )
    start = to_float(section.get("start_s", 0), minimum=0, maximum=MAX_SECONDS, **loc("start_s"))
    order = section.get("order", "sequential")
    if order not in ("sequential", "round_robin"):
        raise InputError("expected sequential or round_robin", **loc("order"))
    groups = section.get("jobs")
    if not isinstance(groups, list) or not groups:
        raise InputError("expected a non-empty list of job groups", **loc("jobs"))
    expanded: list[list[tuple[dict[str, Any], str]]] = []
    for i, g in enumerate(groups):
        gline = line_of(groups, i)
        g = require_mapping(g, file=path, line=gline, field=f"workload.jobs[{i}]")
        gloc: FieldLoc = {"file": path, "line": gline, "field": f"workload.jobs[{i}]"}
        name = g.get("profile")
        if name not in profiles:
            raise InputError(
                f"unknown profile {name!r}; known: {', '.join(sorted(profiles))}", **gloc
            )
        n = to_int(g.get("count", 1), minimum=1, maximum=1_000_000, **gloc)
        fields = {
            "gpus": to_int(g.get("gpus", 1), minimum=0, maximum=MAX_JOB_GPUS, **gloc),
            "cpus": to_int(g.get("cpus", 1), minimum=1, maximum=MAX_JOB_GPUS, **gloc),
            "priority": to_int(g.get("priority", 0), **gloc),
            "gpu_memory_mb": to_float(
                g.get("gpu_memory_mb"), minimum=0, maximum=MAX_MB, allow_none=True, **gloc
            ),
            "job_type": g.get("job_type"),
        }
        expanded.append([(fields, name)] * n)
    if order == "sequential":
        sequence = [item for group in expanded for item in group]
    else:
        sequence = []
        longest = max(len(g) for g in expanded)
        for k in range(longest):
            sequence.extend(g[k] for g in expanded if k < len(g))
    jobs = []
    for k, (fields, name) in enumerate(sequence):
        profile = profiles[name]
        jobs.append(
            JobSpec(
                id=f"{k:04d}-{name}",
                name=name,
                kind=profile.kind,
                arrival_s=start + k * interval,
                profile=profile,
                **fields,
            )
        )
    return jobs


_ELASTIC_FIELDS = {f.name for f in dataclasses.fields(ElasticModel)}
_FAULT_FIELDS = {f.name for f in dataclasses.fields(StragglerFaults)}


def _elastic_model(section: Mapping[str, Any], loc: FieldLoc, path: Path) -> ElasticModel:
    """``simulation.elastic_model``: ``ElasticModel`` fields; ``faults`` a mapping of
    ``StragglerFaults`` fields; ``throughputs`` a path relative to the scenario file."""
    values: dict[str, Any] = {}
    for key, value in section.items():
        here: FieldLoc = {**loc, "field": f"{loc['field']}.{key}"}
        if key not in _ELASTIC_FIELDS:
            raise InputError(
                f"unknown setting; known: {', '.join(sorted(_ELASTIC_FIELDS))}", **here
            )
        if key == "faults":
            faults = require_mapping(value, **here)
            unknown = sorted(set(faults) - _FAULT_FIELDS)
            if unknown:
                known = ", ".join(sorted(_FAULT_FIELDS))
                raise InputError(f"unknown setting {unknown[0]!r}; known: {known}", **here)
            values[key] = StragglerFaults(
                **{k: to_float(v, minimum=0, maximum=1e6, **here) for k, v in faults.items()}
            )
        elif key == "static_jobs":
            values[key] = bool(value)
        elif key == "throughputs":
            values[key] = str(path.parent / str(value))
        elif key in ("seed", "window_steps"):
            values[key] = to_int(value, minimum=0 if key == "seed" else 1, **here)
        else:
            values[key] = to_float(value, minimum=0, maximum=1e9, **here)
    return ElasticModel(**values)


def _sim_config(section: Any, path: Path, sline: int | None) -> SimConfig:
    section = require_mapping(section, file=path, line=sline, field="simulation")
    values: dict[str, Any] = {}
    for key, value in section.items():
        loc: FieldLoc = {
            "file": path,
            "line": line_of(section, key) or sline,
            "field": f"simulation.{key}",
        }
        fld = _SIM_FIELDS.get(key)
        if fld is None:
            raise InputError(f"unknown setting; known: {', '.join(sorted(_SIM_FIELDS))}", **loc)
        if value is None:
            values[key] = None
        elif key == "oom_action":
            try:
                values[key] = OomAction(str(value))
            except ValueError:
                raise InputError("expected fail or requeue", **loc) from None
        elif key == "requeue_keeps_progress":
            values[key] = bool(value)
        elif key == "preemption_cost_by_type":
            costs = require_mapping(value, **loc)
            values[key] = {
                str(k): to_float(v, minimum=0, maximum=1e9, **loc) for k, v in costs.items()
            }
        elif key in ("seed", "max_oom_restarts"):
            values[key] = to_int(value, **loc)
        elif key == "elastic_model":
            values[key] = _elastic_model(require_mapping(value, **loc), loc, path)
        else:
            values[key] = to_float(value, minimum=0, maximum=1e12, **loc)
    try:
        return SimConfig(**values)
    except ValueError as exc:  # a setting out of its range (SimConfig.__post_init__)
        raise InputError(str(exc), file=path, line=sline, field="simulation") from None

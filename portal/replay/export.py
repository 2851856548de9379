"""The portal's job history as a simulator input (docs/replay.md).

``history_export(since, until)`` reads the jobs submitted in ``[since, until)`` and the nodes
registered before ``until``; ``history_export_write`` writes them in the simulator's own formats
(``scheduler.traces`` profile trace + profiles YAML, ``scheduler.cluster_spec`` cluster YAML), so
``python -m scheduler.simulate --trace trace.csv --profiles profiles.yaml --cluster
cluster.yaml`` replays them. Only COMPLETED jobs are exported (a failed or cancelled job's work
is not known); the others are counted by reason in ``left_out``.

Each job keeps its portal id, name, GPUs, GPU memory asked, cores, priority, kind and owner (the
user name, ``owner`` column); its arrival is its submission time in seconds after the first
exported submission. Its profile is its application profile (what policies read live). A job
submitted without a profile gets a **measured** profile ``job-<id>``: its own run time (finish
- start of its last run) on the GPU model it ran on, or as CPU time; a job without a profile
that never recorded both times is left out.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from portal.core import adapters
from portal.core.models import ApplicationProfile, Job, Node, Placement
from portal.core.states import JobState
from scheduler.domain import JobKind, JobSpec, Profile
from scheduler.traces import write_profile_trace

TRACE_FILE = "trace.csv"
PROFILES_FILE = "profiles.yaml"
CLUSTER_FILE = "cluster.yaml"


@dataclass
class LiveRecord:
    """How one exported job really went (seconds), for the "live (as it ran)" comparison row."""

    job_id: str
    jct_s: float
    queue_s: float
    run_s: float
    gpus: int
    gpu_model: str | None
    solo_s: float | None


@dataclass
class HistoryExport:
    jobs: list[JobSpec]
    cluster: dict[str, Any]
    origin: datetime | None
    owners: dict[str, str] = field(default_factory=dict)  # job id -> user name
    projects: dict[str, str] = field(default_factory=dict)  # job id -> project name
    left_out: dict[str, int] = field(default_factory=dict)  # reason -> jobs
    live: list[LiveRecord] = field(default_factory=list)

    @property
    def gpu_count(self) -> int:
        return sum(int(g.get("gpus_per_node", 0)) for g in self.cluster["nodes"])


def history_export(since: datetime, until: datetime) -> HistoryExport:
    """The jobs submitted in ``[since, until)`` and the nodes registered before ``until`` (all
    nodes if none was), as domain types and a cluster-spec mapping (module docstring)."""
    period = Job.objects.filter(submitted_at__gte=since, submitted_at__lt=until)
    left_out: Counter[str] = Counter()
    for state, n in Counter(
        period.exclude(state=JobState.COMPLETED).values_list("state", flat=True)
    ).items():
        left_out[f"{state.lower()} (not completed)"] += n

    rows = list(
        period.filter(state=JobState.COMPLETED)
        .select_related("owner", "project")
        .order_by("submitted_at", "id")
    )
    # The GPU model each job's completed attempt ran on (one query for the whole period).
    ran_on: dict[int, str] = {}
    through = Placement.gpus.through.objects.filter(
        placement__job__in=period.filter(state=JobState.COMPLETED),
        placement__outcome=Placement.Outcome.COMPLETED,
    ).values_list("placement__job_id", "gpu__model")
    for job_id, model in through.iterator(chunk_size=5000):
        ran_on.setdefault(job_id, adapters._gpu_model_key(model))

    profile_ids = {j.profile_id for j in rows if j.profile_id is not None}
    profiles = _profiles(profile_ids)
    origin = rows[0].submitted_at if rows else None
    jobs: list[JobSpec] = []
    owners: dict[str, str] = {}
    projects: dict[str, str] = {}
    live: list[LiveRecord] = []
    for job in rows:
        run_s = _seconds_between(job.started_at, job.finished_at)
        model = ran_on.get(job.pk) if job.gpus else None
        profile = profiles.get(job.profile_id) if job.profile_id is not None else None
        if profile is None:
            if run_s is None or run_s <= 0 or (job.gpus and model is None):
                left_out["no profile and no measured run"] += 1
                continue
            profile = _measured_profile(job, run_s, model)
        user = job.owner.get_username()
        spec = JobSpec(
            id=str(job.pk),
            name=job.name,
            kind=JobKind(job.kind),
            arrival_s=(job.submitted_at - rows[0].submitted_at).total_seconds(),
            gpus=job.gpus,
            gpu_memory_mb=None if job.gpu_memory_mb is None else float(job.gpu_memory_mb),
            cpus=max(1, job.cpus),
            memory_mb=float(job.memory_mb or 0),
            priority=job.priority,
            profile=profile,
            owner=user,
            job_type=(job.params or {}).get("job_type") or None,
        )
        jobs.append(spec)
        owners[spec.id] = user
        projects[spec.id] = job.project.name if job.project is not None else "?"
        if run_s is not None and job.started_at is not None:
            live.append(
                LiveRecord(
                    job_id=spec.id,
                    jct_s=(job.finished_at - job.submitted_at).total_seconds(),
                    queue_s=(job.started_at - job.submitted_at).total_seconds(),
                    run_s=run_s,
                    gpus=job.gpus,
                    gpu_model=model,
                    solo_s=profile.solo_time_s(model),
                )
            )
    return HistoryExport(
        jobs=jobs,
        cluster=cluster_of(until),
        origin=origin,
        owners=owners,
        projects=projects,
        left_out=dict(left_out),
        live=live,
    )


def _seconds_between(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else (end - start).total_seconds()


def _profiles(ids: set[int]) -> dict[int, Profile]:
    """Domain profiles by row id, each under a name unique in the export (``name`` alone,
    or ``name vVERSION`` when two versions of one name are exported)."""
    rows = list(
        ApplicationProfile.objects.filter(pk__in=ids).prefetch_related("gpu_times", "memory_steps")
    )
    names = Counter(p.name for p in rows)
    out = {}
    for row in rows:
        profile = adapters.profile_to_domain(row)
        if names[row.name] > 1:
            profile = dataclasses.replace(profile, name=f"{row.name} v{row.version}")
        out[row.pk] = profile
    return out


def _measured_profile(job: Job, run_s: float, model: str | None) -> Profile:
    if model is None:
        return Profile(name=f"job-{job.pk}", kind=JobKind(job.kind), cpu_time_s=run_s)
    return Profile(
        name=f"job-{job.pk}",
        kind=JobKind(job.kind),
        gpu_time_s={model: run_s},
        gpu_memory_max_mb=None if job.gpu_memory_mb is None else float(job.gpu_memory_mb),
    )


def cluster_of(until: datetime) -> dict[str, Any]:
    """The nodes registered before ``until`` (all nodes if none was) as a cluster-spec mapping
    (``scheduler.cluster_spec``): one group per node, named after it (the simulator calls it
    ``<name>-0``), and every GPU model it uses with the figures of its GPU rows."""
    nodes = list(Node.objects.filter(created_at__lt=until).prefetch_related("gpus"))
    if not nodes:
        nodes = list(Node.objects.prefetch_related("gpus"))
    models: dict[str, dict[str, Any]] = {}
    groups = []
    for node in sorted(nodes, key=lambda n: n.name):
        gpus = sorted(node.gpus.all(), key=lambda g: g.index)
        group: dict[str, Any] = {"name": node.name, "count": 1, "cpus": max(1, node.cores)}
        if node.memory_mb:
            group["memory_mb"] = node.memory_mb
        if gpus:
            # A node with mixed models is exported with its most common one.
            model_of = Counter(adapters._gpu_model_key(g.model) for g in gpus)
            model = model_of.most_common(1)[0][0]
            group["gpu_model"] = model
            group["gpus_per_node"] = len(gpus)
            if model not in models:
                first = next(g for g in gpus if adapters._gpu_model_key(g.model) == model)
                models[model] = _gpu_model_fields(adapters.gpu_spec_of(first))
        groups.append(group)
    out: dict[str, Any] = {"nodes": groups}
    if models:
        out["gpu_models"] = models
    return out


def _gpu_model_fields(spec: Any) -> dict[str, Any]:
    return {
        "architecture": spec.architecture or "unknown",
        "memory_mb": int(spec.memory_mb),
        "sm_count": int(spec.sm_count),
        "dram_bw_gbps": float(spec.dram_bw_gbps),
        "peak_gflops": float(spec.peak_gflops),
        "sharing_modes": [m.value for m in spec.sharing_modes],
        "mig_profiles": [
            {"name": p.name, "compute_slices": p.compute_slices, "memory_mb": p.memory_mb}
            for p in spec.mig_profiles
        ],
        "mig_total_slices": int(spec.mig_total_slices),
        "mps_thread_limit": bool(spec.mps_thread_limit),
    }


def history_export_write(export: HistoryExport, out_dir: Path) -> dict[str, Path]:
    """Write ``trace.csv``, ``profiles.yaml`` and ``cluster.yaml`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "trace": out_dir / TRACE_FILE,
        "profiles": out_dir / PROFILES_FILE,
        "cluster": out_dir / CLUSTER_FILE,
    }
    write_profile_trace(export.jobs, paths["trace"], paths["profiles"])
    paths["cluster"].write_text(yaml.safe_dump(export.cluster, sort_keys=False))
    return paths

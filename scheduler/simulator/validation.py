"""Checking a policy's decision before the simulator applies it.

A placement must name a pending job, known nodes with the cores, GPU indices that exist, one GPU
model for all its GPUs (a gang: every part), a mode every GPU supports and that its residents
run, one owner per MPS GPU, an existing MIG profile with free slices, and the memory; a CPU
placement needs the profile's CPU time. Else ``PolicyDecisionError`` names the policy, the job
and what is wrong (the simulator's contract tests rely on it: no GPU double-booked).
"""

from __future__ import annotations

from scheduler.domain import JobSpec, Placement, SharingMode
from scheduler.simulator.results import PolicyDecisionError
from scheduler.simulator.state import MEM_TOL_MB, PENDING, SimGpu, SimJob, SimNode


def check_decision(
    name: str,
    job: SimJob,
    pl: Placement,
    *,
    queued: bool,
    node_by_name: dict[str, SimNode],
    now: float,
    unconsolidated_speed: float,
) -> tuple[list[SimNode], list[SimGpu], str | None, float, float]:
    """Validate ``pl`` for ``job`` (``queued``: it is in the queue) under policy ``name``:
    (its nodes, its GPUs, its GPU model or None for CPU, its solo time there, its one-node
    reference time; seconds, declared work). PolicyDecisionError if impossible."""
    if job.status != PENDING or not queued:
        raise PolicyDecisionError(
            name,
            pl.job_id,
            f"placed a job that is {job.status}, not pending (placed twice?)",
        )
    parts = pl.parts
    nodes: list[SimNode] = []
    for part in parts:
        node = node_by_name.get(part.node)
        if node is None:
            raise PolicyDecisionError(name, pl.job_id, f"placed on unknown node {part.node!r}")
        if node in nodes:
            raise PolicyDecisionError(name, pl.job_id, f"lists node {node.name} twice")
        if part.cpus > node.free_cores:
            raise PolicyDecisionError(
                name,
                pl.job_id,
                f"over-commits CPU cores on {node.name}: needs {part.cpus}, "
                f"{node.free_cores} of {node.cores} free",
            )
        nodes.append(node)
    spec = job.spec
    gpus: list[SimGpu] = []
    ref: float | None
    if pl.gpu_count:
        if pl.gpu_count != spec.gpus:
            over = f" over {len(parts)} nodes" if pl.is_gang else ""
            raise PolicyDecisionError(
                name,
                pl.job_id,
                f"needs {spec.gpus} GPU(s) but was given {pl.gpu_count}{over}",
            )
        for part, node in zip(parts, nodes, strict=True):
            if not part.gpu_indices:
                raise PolicyDecisionError(name, pl.job_id, f"a gang part on {node.name} has no GPU")
            if len(set(part.gpu_indices)) != len(part.gpu_indices):
                raise PolicyDecisionError(
                    name, pl.job_id, f"lists a GPU of {node.name} twice: {part.gpu_indices}"
                )
            for idx in part.gpu_indices:
                if not 0 <= idx < len(node.gpus):
                    raise PolicyDecisionError(
                        name,
                        pl.job_id,
                        f"placed on GPU {idx} of {node.name}, which has {len(node.gpus)} GPU(s)",
                    )
                gpus.append(node.gpus[idx])
        models = sorted({g.spec.model for g in gpus})
        if len(models) > 1:
            raise PolicyDecisionError(
                name, pl.job_id, f"mixes GPU models {', '.join(models)} in one job"
            )
        model: str | None = models[0]
        ref = spec.solo_time_s(model)
        if ref is None:
            raise PolicyDecisionError(
                name, pl.job_id, f"has no solo time for GPU model {model} in its profile"
            )
        solo = spread_time(spec, models[0], ref, unconsolidated_speed) if pl.is_gang else ref
        mem = job.mem_at(job.progress)
        for gpu in gpus:
            check_gpu_fits(name, job, gpu, pl, mem, now)
    else:
        if pl.is_gang:
            raise PolicyDecisionError(
                name, pl.job_id, "a CPU placement (no GPU) spread over several nodes"
            )
        node = nodes[0]
        if spec.profile is None or spec.profile.cpu_time_s is None:
            raise PolicyDecisionError(
                name,
                pl.job_id,
                f"placed on CPU ({node.name}) but its profile has no cpu_time_s",
            )
        model = None
        solo = ref = spec.profile.cpu_time_s
    return nodes, gpus, model, solo, ref


def spread_time(spec: JobSpec, model: str, solo: float, unconsolidated_speed: float) -> float:
    """Solo time of ``spec`` spread over several nodes of ``model``: its profile's
    unconsolidated time (measured), else ``solo / unconsolidated_speed``
    (``SimConfig.unconsolidated_speed``)."""
    measured = spec.profile.gpu_time_unconsolidated_s.get(model) if spec.profile else None
    if measured is not None:
        return measured
    return solo / unconsolidated_speed


def check_gpu_fits(
    name: str, job: SimJob, gpu: SimGpu, pl: Placement, mem: float, now: float
) -> None:
    """Whether ``job`` (``mem`` MB per GPU now) may join ``gpu`` under ``pl``'s mode."""
    label = gpu.label()
    if not gpu.spec.supports(pl.mode):
        raise PolicyDecisionError(
            name,
            pl.job_id,
            f"asks for {pl.mode} on {label}, a {gpu.spec.model} that "
            f"supports {', '.join(m.value for m in gpu.spec.sharing_modes)}",
        )
    if gpu.jobs:
        if gpu.mode == SharingMode.EXCLUSIVE or pl.mode == SharingMode.EXCLUSIVE:
            others = ", ".join(j.spec.id for j in gpu.jobs)
            raise PolicyDecisionError(
                name, pl.job_id, f"double-books {label} (exclusive; running {others})"
            )
        if gpu.mode != pl.mode:
            raise PolicyDecisionError(
                name, pl.job_id, f"asks for {pl.mode} on {label}, which runs in {gpu.mode}"
            )
        if pl.mode == SharingMode.MPS and any(j.spec.owner != job.spec.owner for j in gpu.jobs):
            raise PolicyDecisionError(
                name,
                pl.job_id,
                f"puts owner {job.spec.owner!r} under MPS on {label} next to another owner's "
                "jobs (MPS serves one unix user per GPU)",
            )
    if pl.mode == SharingMode.MIG:
        profile = next((p for p in gpu.spec.mig_profiles if p.name == pl.mig_profile), None)
        if profile is None:
            known = ", ".join(p.name for p in gpu.spec.mig_profiles) or "none"
            raise PolicyDecisionError(
                name,
                pl.job_id,
                f"MIG profile {pl.mig_profile!r} does not exist on "
                f"{gpu.spec.model} (known: {known})",
            )
        if gpu.mig_used + profile.compute_slices > gpu.spec.mig_total_slices:
            raise PolicyDecisionError(
                name,
                pl.job_id,
                f"over-commits MIG slices on {label}: "
                f"{gpu.mig_used} + {profile.compute_slices} > {gpu.spec.mig_total_slices}",
            )
        if mem > profile.memory_mb + MEM_TOL_MB:
            raise PolicyDecisionError(
                name,
                pl.job_id,
                f"over-commits memory of MIG instance {profile.name} on "
                f"{label}: needs {mem:.0f} MB of {profile.memory_mb} MB",
            )
        return
    used = sum(j.mem_at(j.progress_at(now)) for j in gpu.jobs)
    if used + mem > gpu.spec.memory_mb + MEM_TOL_MB:
        raise PolicyDecisionError(
            name,
            pl.job_id,
            f"over-commits memory on {label}: {used:.0f} MB in use + "
            f"{mem:.0f} MB > {gpu.spec.memory_mb} MB",
        )

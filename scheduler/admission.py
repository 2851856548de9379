"""Admission: can a job *ever* run on the registered cluster? (DESIGN.md, Jobs and attempts)

A job that asks for more than the cluster could give even when idle waits forever and, under a
strict FIFO policy, blocks every job behind it. The portal refuses such a job at submission
(HTTP 400 / a form error naming the field and the largest request that would fit) and the
simulator rejects it at its arrival (state ``rejected``), through the same function here.

What counts is the cluster as registered, whatever is busy or down now:

- ``gpus``: at most the number of GPUs of one model in the whole cluster (a gang may span
  nodes, but never GPU models), over the models the job may use (its profile's models when the
  profile lists GPU times, else any);
- ``gpu_memory_mb``: per GPU, at most the memory of the largest GPU of a model with enough GPUs
  for the job;
- ``cpus``: per node (a gang asks ``cpus`` cores on each of its nodes), at most the cores of the
  largest node of the right kind (CPU nodes for CPU jobs, GPU nodes of a usable model for GPU
  jobs; GPU nodes that do not track cores, ``cores == 0``, do not limit). A CPU job may also
  run on a GPU node's spare cores (the policy parameter ``cpu_jobs_on_gpu_nodes``): there at
  most the node's cores less one per GPU;
- ``profile``: a profile whose GPU times name only models the cluster lacks;
- ``memory_mb`` (host memory, per node): at most the memory of the largest node of the right
  kind (as for ``cpus``; nodes that do not report their memory, ``memory_mb == 0``, do not
  limit);
- ``sharing``: a MIG profile name that no GPU of a usable model offers.

With no node registered at all, every job is admitted (an operator may submit before the first
agent registers) and ``Admission.note`` says so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from scheduler.domain import SHARING_CHOICES, JobSpec, NodeKind, NodeState


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the registered cluster could offer one job at most.

    ``gpus_by_model``: GPUs of each model over every node; ``memory_mb_by_model``: the largest
    GPU memory of each model (MB); ``cores_by_model``: the most cores of one node holding that
    model (0: a node that does not track cores); ``cpu_node_cores``: the most cores of one CPU
    node (None: no CPU node); ``gpu_node_spare_cores``: the most cores one GPU node counting its
    cores could give a CPU job (its cores less one per GPU; None: no such node).
    """

    gpus_by_model: Mapping[str, int] = field(default_factory=dict)
    memory_mb_by_model: Mapping[str, float] = field(default_factory=dict)
    cores_by_model: Mapping[str, int] = field(default_factory=dict)
    cpu_node_cores: int | None = None
    nodes: int = 0
    gpu_node_spare_cores: int | None = None
    # Host memory (MB): the largest node holding each model, and the largest CPU node;
    # ``math.inf`` where such a node does not report its memory.
    host_memory_by_model: Mapping[str, float] = field(default_factory=dict)
    cpu_node_memory_mb: float | None = None
    mig_profiles_by_model: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.nodes == 0


@dataclass(frozen=True, slots=True)
class Admission:
    """The verdict: ``errors`` maps a job field to a message (empty: admitted)."""

    errors: Mapping[str, str] = field(default_factory=dict)
    note: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors

    def reason(self) -> str:
        """One line with every error, for logs, the simulator's records and the CLI."""
        return "; ".join(f"{k}: {v}" for k, v in sorted(self.errors.items()))


def capacity_of(nodes: Iterable[NodeState]) -> Capacity:
    """The ``Capacity`` of a cluster made of ``nodes`` (up or down alike)."""
    gpus: dict[str, int] = {}
    memory: dict[str, float] = {}
    cores: dict[str, int] = {}
    cpu_cores: int | None = None
    spare: int | None = None
    host: dict[str, float] = {}
    cpu_memory: float | None = None
    migs: dict[str, frozenset[str]] = {}
    count = 0
    for node in nodes:
        count += 1
        node_memory = node.memory_mb if node.memory_mb > 0 else math.inf
        if node.kind == NodeKind.CPU and not node.gpus:
            cpu_cores = max(cpu_cores or 0, node.cores)
            cpu_memory = max(cpu_memory or 0.0, node_memory)
            continue
        if node.cores > len(node.gpus):
            spare = max(spare or 0, node.cores - len(node.gpus))
        for gpu in node.gpus:
            model = gpu.spec.model
            host[model] = max(host.get(model, 0.0), node_memory)
            migs[model] = migs.get(model, frozenset()) | {p.name for p in gpu.spec.mig_profiles}
            gpus[model] = gpus.get(model, 0) + 1
            memory[model] = max(memory.get(model, 0.0), float(gpu.spec.memory_mb))
            # A node with cores == 0 does not track cores: it never limits, so 0 sticks.
            if node.cores <= 0 or cores.get(model) == 0:
                cores[model] = 0
            else:
                cores[model] = max(cores.get(model, 0), node.cores)
    return Capacity(gpus, memory, cores, cpu_cores, count, spare, host, cpu_memory, migs)


def _models_text(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{m}: {n}" for m, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def admit(job: JobSpec, capacity: Capacity) -> Admission:
    """Whether ``job`` can ever run on a cluster of ``capacity``; see the module docstring.

    Messages name the largest request that would fit, e.g. ``"at most 12 GPUs of one model
    exist (V100: 12, K80: 4)"``.
    """
    if capacity.empty:
        return Admission(note="no node is registered yet: the job waits for the first one")
    errors: dict[str, str] = {}
    if job.gpus <= 0:
        most = max(capacity.cpu_node_cores or 0, capacity.gpu_node_spare_cores or 0)
        if capacity.cpu_node_cores is None and capacity.gpu_node_spare_cores is None:
            errors["gpus"] = (
                "this is a CPU job (0 GPUs) but the cluster has no CPU node and no GPU node "
                "with spare cores; ask for at least 1 GPU"
            )
        elif job.cpus > most:
            errors["cpus"] = (
                f"asks {job.cpus} cores; the largest CPU node has {capacity.cpu_node_cores}"
                if most == capacity.cpu_node_cores
                else f"asks {job.cpus} cores; at most {most} on one node (a GPU node keeps one "
                "core per GPU)"
            )
        largest = capacity.cpu_node_memory_mb
        if largest is not None and job.memory_mb > largest:
            errors["memory_mb"] = _memory_text(job.memory_mb, largest, "CPU node")
        return Admission(errors)

    allowed = _allowed_models(job)
    present = dict(capacity.gpus_by_model)
    if allowed is not None:
        usable = {m: n for m, n in present.items() if m in allowed}
        if not usable:
            errors["profile"] = (
                f"the profile has GPU times for {', '.join(sorted(allowed))} only; the cluster "
                f"has {', '.join(sorted(present)) or 'no GPU'}"
            )
            return Admission(errors)
    else:
        usable = present
    if not usable:
        errors["gpus"] = "the cluster has no GPU; ask for 0 GPUs (a CPU job)"
        return Admission(errors)

    enough = {m: n for m, n in usable.items() if n >= job.gpus}
    if not enough:
        most = max(usable.values())
        errors["gpus"] = (
            f"asks {job.gpus} GPUs of one model; at most {most} exist ({_models_text(usable)})"
        )
        return Admission(errors)

    need = job.memory_need_mb()
    fits_memory = {m: n for m, n in enough.items() if capacity.memory_mb_by_model[m] >= need}
    if not fits_memory:
        largest = max(capacity.memory_mb_by_model[m] for m in enough)
        field_name = "gpu_memory_mb" if job.gpu_memory_mb is not None else "profile"
        source = "asks" if job.gpu_memory_mb is not None else "its profile needs"
        errors[field_name] = (
            f"{source} {need:.0f} MB per GPU; the largest GPU with {job.gpus} of its model has "
            f"{largest:.0f} MB"
        )
        return Admission(errors)

    host = max((capacity.host_memory_by_model.get(m, math.inf) for m in fits_memory), default=0)
    if job.memory_mb > host:
        errors["memory_mb"] = _memory_text(job.memory_mb, host, "GPU node of a usable model")
    mig = job.sharing
    if mig not in SHARING_CHOICES:
        offered = frozenset().union(
            *(capacity.mig_profiles_by_model.get(m, frozenset()) for m in fits_memory)
        )
        if mig not in offered:
            errors["sharing"] = (
                f"no GPU here offers the MIG profile {mig} "
                f"({', '.join(sorted(offered)) or 'no MIG profile at all'})"
            )
    core_limits = [capacity.cores_by_model.get(m, 0) for m in fits_memory]
    if 0 not in core_limits:
        most_cores = max(core_limits)
        if job.cpus > most_cores:
            errors["cpus"] = (
                f"asks {job.cpus} cores per node; the largest GPU node of a usable model has "
                f"{most_cores}"
            )
    return Admission(errors)


def _memory_text(asked: float, largest: float, where: str) -> str:
    return f"asks {asked:.0f} MB of host memory; the largest {where} has {largest:.0f} MB"


def _allowed_models(job: JobSpec) -> frozenset[str] | None:
    """Models with a positive, finite profiled time (None: the profile does not restrict)."""
    if job.profile is None or not job.profile.gpu_time_s:
        return None
    return frozenset(
        m for m, t in job.profile.gpu_time_s.items() if t is not None and 0 < t < math.inf
    )

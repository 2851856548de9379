"""Small, exact interference models and cluster rows for the portal.ml tests."""

from __future__ import annotations

from portal.core.models import ApplicationProfile, Gpu, Job, Node, Placement
from portal.core.services import job_transition
from portal.core.states import JobState
from scheduler.catalog import gpu_spec
from scheduler.domain import Profile
from scheduler.learning.datasets import PairSample, TrainingSet
from scheduler.learning.predictor import InterferencePredictor
from scheduler.learning.training import fit_predictor


def sm_model(name: str, *, hurt_by_busy: bool) -> InterferencePredictor:
    """A linear model of one feature, the co-runner's SM efficiency: with ``hurt_by_busy`` a job
    slows down next to a busy co-runner (norm = 1 - 0.4 sm/100), else next to an idle one
    (norm = 0.6 + 0.4 sm/100). Fitted exactly by least squares."""
    profiles = [Profile(f"p{k}", sm_efficiency_pct=10.0 * k) for k in range(11)]
    spec = gpu_spec("TitanXp")
    samples = []
    for a in profiles:
        for b in profiles:
            sm = b.sm_efficiency_pct / 100.0
            norm = 1.0 - 0.4 * sm if hurt_by_busy else 0.6 + 0.4 * sm
            samples.append(PairSample(a, b, spec, norm, "syn", a.name, b.name))
    return fit_predictor(TrainingSet(samples, {}), "linear", feasibility=False, name=name)


def profile(name: str, sm: float, **kw) -> ApplicationProfile:
    return ApplicationProfile.objects.create(
        name=name, status="approved", sm_efficiency_pct=sm, gpu_memory_max_mb=2000, **kw
    )


def titan_node(name: str = "g1", gpus: int = 2) -> Node:
    node = Node.objects.create(name=name, kind="gpu", cores=8, memory_mb=65536)
    for i in range(gpus):
        Gpu.objects.create(
            node=node,
            index=i,
            model="TitanXp",
            memory_mb=12288,
            uuid=f"GPU-{name}-{i}",
            sharing_modes=["exclusive", "time_slicing", "mps"],
        )
    return node


def running_on(owner, node: Node, index: int, prof: ApplicationProfile, mode: str = "mps") -> Job:
    """A RUNNING job of ``prof`` alone on GPU ``index`` of ``node``."""
    job = Job.objects.create(
        owner=owner,
        name=f"run-{prof.name}",
        command="true",
        gpus=1,
        gpu_memory_mb=2000,
        profile=prof,
        sharing="allowed",  # it runs on a shared GPU (docs/jobs.md)
    )
    job_transition(job, JobState.SCHEDULED, actor="test")
    job_transition(job, JobState.RUNNING, actor="test")
    gpu = node.gpus.get(index=index)
    placement = Placement.objects.create(
        job=job, node=node, sharing_mode=mode, gpu_memory_mb=2000, policy="test", cpus=1
    )
    placement.gpus.set([gpu])
    Gpu.objects.filter(pk=gpu.pk).update(current_mode=mode)
    return job

"""DB rows -> scheduler.domain types, as the live scheduling loop will build its snapshot."""

from __future__ import annotations

from datetime import timedelta

import pytest

from portal.core import services
from portal.core.adapters import (
    derived_classes,
    gpu_spec_of,
    gpu_to_domain,
    job_to_domain,
    node_to_domain,
    profile_to_domain,
)
from portal.core.models import (
    ApplicationProfile,
    Gpu,
    Job,
    Node,
    Placement,
    ProfileGpuTime,
    ProfileMemoryStep,
)
from scheduler.domain import (
    GpuSpec,
    JobKind,
    JobSpec,
    MemoryStep,
    NodeKind,
    NodeState,
    Profile,
    SharingMode,
    StallReasons,
)
from scheduler.policies.hetero_srtf import HeteroSrtfPolicy

pytestmark = pytest.mark.django_db


@pytest.fixture
def lammps():
    profile = ApplicationProfile.objects.create(
        name="LAMMPS",
        kind="hpc",
        status="approved",
        cpu_time_s=990,
        gpu_memory_max_mb=2273,
        gpu_memory_avg_mb=1286.5,
        stall_memory_dependency_pct=40,
        stall_exec_dependency_pct=30,
        epc=1.5,
        registers_per_block=4096,
        batch_size=None,
        cm_ratio=4.0,
    )
    ProfileGpuTime.objects.create(profile=profile, gpu_model="TitanXp", time_s=85)
    ProfileGpuTime.objects.create(profile=profile, gpu_model="V100", time_s=40)
    for i, (start, lo, hi) in enumerate(
        [(0, 0, 833), (0.25, 833, 1895), (0.5, 1895, 2795), (0.75, 2795, 8317)], 1
    ):
        ProfileMemoryStep.objects.create(
            profile=profile, index=i, start_fraction=start, from_mb=lo, to_mb=hi
        )
    return profile


def test_profile_to_domain(lammps):
    p = profile_to_domain(lammps)
    assert isinstance(p, Profile)
    assert (p.name, p.kind, p.cpu_time_s) == ("LAMMPS", JobKind.HPC, 990)
    assert dict(p.gpu_time_s) == {"TitanXp": 85, "V100": 40}
    assert p.solo_time_s("V100") == 40 and p.solo_time_s(None) == 990
    assert p.memory_steps == (
        MemoryStep(0, 0, 833),
        MemoryStep(0.25, 833, 1895),
        MemoryStep(0.5, 1895, 2795),
        MemoryStep(0.75, 2795, 8317),
    )
    assert p.stall == StallReasons(memory_dependency=40, exec_dependency=30)
    assert (p.epc, p.registers_per_block, p.cm_ratio, p.gpu_memory_max_mb) == (
        1.5,
        4096,
        4.0,
        2273,
    )
    assert p.sm_efficiency_pct is None


def test_profile_without_stalls_has_none():
    p = profile_to_domain(ApplicationProfile.objects.create(name="bare"))
    assert p.stall is None and p.gpu_time_s == {} and p.memory_steps == ()


def test_gpu_model_aliases_become_catalogue_keys():
    profile = ApplicationProfile.objects.create(name="x")
    ProfileGpuTime.objects.create(profile=profile, gpu_model="tesla v100-sxm2-16gb", time_s=1)
    ProfileGpuTime.objects.create(profile=profile, gpu_model="MyCustomGPU", time_s=2)
    assert dict(profile_to_domain(profile).gpu_time_s) == {"V100": 1, "MyCustomGPU": 2}


def test_job_to_domain(alice, lammps):
    job, _ = services.job_submit(
        alice,
        name="lammps-1",
        command="lmp -in in.lj",
        profile=lammps,
        gpus=2,
        gpu_memory_mb=9000,
        cpus=4,
        memory_mb=32000,
        priority=3,
        elastic_min_workers=1,
        elastic_max_workers=4,
        params={"job_type": "LM (batch size 20)", "steps": 100},
    )
    spec = job_to_domain(job, epoch=job.submitted_at - timedelta(seconds=30))
    assert isinstance(spec, JobSpec)
    assert spec.id == str(job.pk)
    assert (spec.name, spec.kind, spec.gpus, spec.cpus, spec.priority) == (
        "lammps-1",
        JobKind.HPC,
        2,
        4,
        3,
    )
    assert spec.arrival_s == pytest.approx(30)
    assert (spec.gpu_memory_mb, spec.memory_mb) == (9000.0, 32000.0)
    assert (spec.elastic_min, spec.elastic_max) == (1, 4)
    assert spec.job_type == "LM (batch size 20)"
    assert spec.profile.name == "LAMMPS"
    assert spec.memory_need_mb() == 9000


def test_the_policies_see_the_portals_requeue_count_not_the_users(alice):
    # hetero_srtf bounds preemptions per job from params["preemptions"]; the live side builds
    # a new policy object each cycle, so the count must come from the job's row, and a user's
    # own value (which would pin the job on its GPUs) must not survive.
    job, _ = services.job_submit(
        alice, name="pinned?", command="x", gpus=1, params={"preemptions": 99, "steps": 5}
    )
    Job.objects.filter(pk=job.pk).update(requeue_count=2)
    job.refresh_from_db()
    spec = job_to_domain(job)
    assert spec.params["preemptions"] == 2
    assert spec.params["steps"] == 5
    policy = HeteroSrtfPolicy(max_preemptions=2)
    assert policy.preempted(spec) == 2
    # a requeue after an OOM beside another job (portal.core.oom) is no preemption
    Job.objects.filter(pk=job.pk).update(requeue_count=3, oom_requeues=1, oom_with=["resnet"])
    job.refresh_from_db()
    spec = job_to_domain(job)
    assert spec.params["preemptions"] == 2 and spec.oom_with == frozenset({"resnet"})


def test_cpu_job_without_profile(alice):
    job, _ = services.job_submit(alice, name="cpu", command="true")
    spec = job_to_domain(job)
    assert (spec.gpus, spec.profile, spec.arrival_s, spec.memory_mb) == (0, None, 0.0, 0.0)
    assert spec.memory_need_mb() == 0


@pytest.fixture
def a30_node():
    node = Node.objects.create(name="gpu-a30", kind="gpu", cores=32, memory_mb=131072)
    for index in range(2):
        Gpu.objects.create(
            node=node,
            index=index,
            uuid=f"VIRTUAL-{index}",
            model="A30",
            architecture="Ampere",
            memory_mb=24576,
            sm_count=56,
            sharing_modes=["exclusive", "time_slicing", "mps", "mig"],
            mig_profiles=[
                {"name": "1g.6gb", "slices": 1, "memory_mb": 6144},
                {"name": "2g.12gb", "slices": 2, "memory_mb": 12288},
            ],
            current_mode="mig",
        )
    return node


def test_gpu_spec_of_a_row_keeps_its_figures_over_the_catalogue(a30_node):
    spec = gpu_spec_of(a30_node.gpus.get(index=0))
    assert isinstance(spec, GpuSpec)
    assert (spec.model, spec.memory_mb, spec.sm_count) == ("A30", 24576, 56)
    assert spec.dram_bw_gbps == 933.0 and spec.mig_total_slices == 4  # from the catalogue
    assert [p.name for p in spec.mig_profiles] == ["1g.6gb", "2g.12gb"]  # from the row
    assert spec.supports(SharingMode.MIG)


def test_gpu_spec_of_an_unknown_model():
    node = Node.objects.create(name="n", kind="gpu")
    gpu = Gpu.objects.create(node=node, index=0, model="Mystery", memory_mb=1000)
    spec = gpu_spec_of(gpu)
    assert (spec.model, spec.memory_mb, spec.sharing_modes) == (
        "Mystery",
        1000,
        (SharingMode.EXCLUSIVE,),
    )


def test_node_and_gpus_with_placed_jobs(alice, a30_node):
    running, _ = services.job_submit(alice, name="a", command="x", gpus=1)
    finished, _ = services.job_submit(alice, name="b", command="x", gpus=1)
    services.job_transition(running, "SCHEDULED", actor="t")
    services.job_transition(running, "RUNNING", actor="t")
    gpu0 = a30_node.gpus.get(index=0)
    placement = Placement.objects.create(
        job=running,
        node=a30_node,
        sharing_mode="mig",
        mig_profile="2g.12gb",
        gpu_memory_mb=12288,
        cpus=6,
        policy="sharing_mode",
    )
    placement.gpus.add(gpu0)
    old = Placement.objects.create(job=finished, node=a30_node, cpus=8, policy="p", active=False)
    old.gpus.add(gpu0)

    state = node_to_domain(a30_node)
    assert isinstance(state, NodeState)
    assert (state.name, state.kind, state.cores, state.free_cores, state.up) == (
        "gpu-a30",
        NodeKind.GPU,
        32,
        26,
        True,
    )
    g0, g1 = state.gpus
    assert g0.job_ids == (str(running.pk),)
    assert (g0.committed_memory_mb, g0.mig_slices_used, g0.mode) == (12288, 2, SharingMode.MIG)
    assert g0.free_memory_mb == 24576 - 12288
    assert g1.idle and g1.mode is None and g1.uuid == "VIRTUAL-1"
    assert gpu_to_domain(gpu0, used_memory_mb=5000, util_pct=70).util_pct == 70


def test_a_node_that_is_down_or_cpu_only():
    node = Node.objects.create(name="cpu-1", kind="cpu", cores=8, status="down")
    state = node_to_domain(node)
    assert (state.kind, state.up, state.gpus, state.free_cores) == (NodeKind.CPU, False, (), 8)


def test_derived_classes(lammps):
    classes = derived_classes(lammps)
    assert classes["kernel_class"] == "memory"  # 40 % memory-dependency stalls >= 33 %
    assert classes["cm_class"] == "M"
    assert classes["scale_class"] is None  # no batch size
    assert classes["sensitivity_class"] is None


def test_adapters_use_prefetched_rows(lammps, django_assert_num_queries):
    profile = ApplicationProfile.objects.prefetch_related("gpu_times", "memory_steps").get(
        pk=lammps.pk
    )
    with django_assert_num_queries(0):
        profile_to_domain(profile)

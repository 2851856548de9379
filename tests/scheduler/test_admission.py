"""Admission (scheduler.admission): refuse what can never run, name the field and the limit."""

from __future__ import annotations

from scheduler.admission import admit, capacity_of
from scheduler.catalog import gpu_spec
from scheduler.domain import GpuState, JobSpec, NodeKind, NodeState, Profile


def _gpu_node(name: str, model: str, count: int, cores: int = 16) -> NodeState:
    spec = gpu_spec(model)
    gpus = tuple(GpuState(node=name, index=i, spec=spec) for i in range(count))
    return NodeState(name=name, kind=NodeKind.GPU, cores=cores, free_cores=cores, gpus=gpus)


def _cpu_node(name: str, cores: int) -> NodeState:
    return NodeState(name=name, kind=NodeKind.CPU, cores=cores, free_cores=cores)


CLUSTER = capacity_of(
    [
        _gpu_node("v100-1", "V100", 4),
        _gpu_node("v100-2", "V100", 4),
        _gpu_node("k80-1", "K80", 4, cores=8),
        _cpu_node("cpu-1", 32),
    ]
)


def test_a_gang_over_two_nodes_of_one_model_is_admitted():
    assert admit(JobSpec("1", gpus=8), CLUSTER).ok


def test_more_gpus_of_one_model_than_exist_names_the_largest():
    verdict = admit(JobSpec("1", gpus=9), CLUSTER)
    assert set(verdict.errors) == {"gpus"}
    assert "at most 8 exist" in verdict.errors["gpus"]
    assert "V100: 8" in verdict.errors["gpus"] and "K80: 4" in verdict.errors["gpus"]


def test_a_million_gpus_is_refused():
    assert not admit(JobSpec("1", gpus=1_000_000), CLUSTER).ok


def test_memory_above_every_gpu_is_refused_with_the_largest():
    verdict = admit(JobSpec("1", gpus=1, gpu_memory_mb=40_000), CLUSTER)
    assert set(verdict.errors) == {"gpu_memory_mb"}
    assert "16160 MB" in verdict.errors["gpu_memory_mb"]  # V100, the largest here


def test_memory_counts_only_models_with_enough_gpus():
    # 5 GPUs: only V100 has that many; 12 GB fits a V100 (16 GB), so admitted.
    assert admit(JobSpec("1", gpus=5, gpu_memory_mb=12_000), CLUSTER).ok


def test_profile_memory_is_named_as_the_profile():
    job = JobSpec("1", gpus=1, profile=Profile("big", gpu_memory_max_mb=30_000))
    assert set(admit(job, CLUSTER).errors) == {"profile"}


def test_cores_per_node():
    verdict = admit(JobSpec("1", gpus=1, cpus=17), CLUSTER)
    assert set(verdict.errors) == {"cpus"}
    assert "has 16" in verdict.errors["cpus"]
    assert admit(JobSpec("1", gpus=0, cpus=32), CLUSTER).ok
    assert "has 32" in admit(JobSpec("1", gpus=0, cpus=33), CLUSTER).errors["cpus"]


def test_profile_restricted_to_absent_models():
    job = JobSpec("1", gpus=1, profile=Profile("p", gpu_time_s={"A100": 10.0}))
    verdict = admit(job, CLUSTER)
    assert set(verdict.errors) == {"profile"}
    assert "A100" in verdict.errors["profile"]


def test_profile_models_limit_the_gpu_count():
    job = JobSpec("1", gpus=5, profile=Profile("p", gpu_time_s={"K80": 10.0}))
    assert "at most 4 exist" in admit(job, CLUSTER).errors["gpus"]


def test_no_cpu_node_and_no_spare_gpu_node_cores_refuses_cpu_jobs():
    cap = capacity_of([_gpu_node("g", "V100", 2, cores=2)])
    assert set(admit(JobSpec("1", gpus=0), cap).errors) == {"gpus"}


def test_a_cpu_job_may_use_a_gpu_nodes_spare_cores():
    cap = capacity_of([_gpu_node("g", "V100", 2, cores=8)])  # one core kept per GPU: 6 spare
    assert admit(JobSpec("1", gpus=0, cpus=6), cap).ok
    refused = admit(JobSpec("1", gpus=0, cpus=7), cap).errors["cpus"]
    assert refused == "asks 7 cores; at most 6 on one node (a GPU node keeps one core per GPU)"


def test_nodes_that_do_not_track_cores_never_limit():
    cap = capacity_of([_gpu_node("g", "V100", 2, cores=0)])
    assert admit(JobSpec("1", gpus=1, cpus=500), cap).ok


def test_an_empty_cluster_admits_and_says_so():
    verdict = admit(JobSpec("1", gpus=64), capacity_of([]))
    assert verdict.ok
    assert "no node" in verdict.note

"""Measured on the cluster (docs/profiles.md): per-job GPU readings from a real agent (fake NVML,
real job processes) into the portal and its API, progress windows as observations, the
scheduling cycle's knowledge built from them, and the measured profile draft."""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from portal.core import adapters, observations, scheduling
from portal.core.models import (
    ApplicationProfile,
    GpuReading,
    Job,
    JobObservation,
    ProfileGpuTime,
    ProfileMemoryStep,
)
from scheduler.domain import SharingMode
from tests.workers.fake_nvml import FakeGpu, FakeNvml
from tests.workers.test_agent import Switch, _job, _job_pid, _step_until
from workers.agent import NodeAgent, kill_marked_processes
from workers.gpu.nvml_backend import NvmlBackend
from workers.gpu.virtual_backend import VirtualBackend
from workers.isolation import GpuDevices
from workers.report_lines import parse_report

NODE = "meas-n1"


@pytest.fixture
def fake_gpu() -> FakeGpu:
    return FakeGpu(name="NVIDIA A30", uuid="GPU-meas-0", memory_total_mb=24576.0, sm_count=56)


def _start(agent_factory):
    agents = []

    def make(backend, name=NODE, backend_name="virtual", tmp=None):
        agent = NodeAgent(
            name,
            backend,
            Switch(),
            cores=16,
            memory_mb=65536,
            backend_name=backend_name,
            data_dir=tmp,
            sample_every_s=0.0,
            gpu_devices=GpuDevices("none", reason="test"),
        )
        agents.append(agent)
        assert agent.step()  # registers the node and its GPUs
        return agent

    yield make
    for agent in agents:
        agent.shutdown(kill_jobs=True)
        kill_marked_processes(agent.marker)


@pytest.fixture
def make_agent(db):
    yield from _start(None)


@pytest.fixture
def toy(db) -> ApplicationProfile:
    """Alone on an A30 it runs 20 s by its profile (1 s at --scale 0.05), 1-2 GB of memory."""
    profile = ApplicationProfile.objects.create(
        name="toy-m", kind="dl-train", status="approved", gpu_util_pct=60.0, gpu_memory_max_mb=2000
    )
    ProfileGpuTime.objects.create(profile=profile, gpu_model="A30", time_s=20.0)
    ProfileMemoryStep.objects.create(
        profile=profile, index=1, start_fraction=0.0, from_mb=1000, to_mb=2000
    )
    return profile


def test_nvml_per_process_memory_and_utilisation_reach_the_jobs_api(
    alice, alice_api, bob_api, make_agent, fake_gpu, tmp_path
):
    agent = make_agent(NvmlBackend(nvml=FakeNvml([fake_gpu])), backend_name="nvml", tmp=tmp_path)
    from portal.core.models import Node

    node = Node.objects.get(name=NODE)
    job = _job(alice, node, "sh -c 'sleep 30; true'")
    other = _job(alice, node, "sleep 30")
    pid = _job_pid(agent, job)
    other_pid = _job_pid(agent, other)
    # the job's shell started its sleep: NVML sees the child (the CUDA process), not the shell
    children = _wait_children(pid)
    fake_gpu.processes = {children[0]: 1500.0, other_pid: 700.0, 1: 99.0}
    fake_gpu.process_samples = [(children[0], 10, 55), (other_pid, 10, 20)]
    agent.step()
    fake_gpu.processes = {children[0]: 2500.0, other_pid: 700.0}
    fake_gpu.process_samples.append((children[0], 20, 65))
    agent.step()

    rows = list(GpuReading.objects.filter(job=job).order_by("at"))
    assert [(r.attempt, r.gpu_index, r.memory_mb, r.util_pct) for r in rows] == [
        (1, 0, 1500.0, 55.0),
        (1, 0, 2500.0, 65.0),
    ]
    assert [r.memory_mb for r in GpuReading.objects.filter(job=other)] == [700.0, 700.0]
    # init (pid 1) holds memory too: nobody's job, so nobody's reading
    assert GpuReading.objects.count() == 4

    body = alice_api.get(f"/api/v1/jobs/{job.pk}/gpu-readings/").json()
    assert [(r["gpu_index"], r["memory_mb"], r["util_pct"]) for r in body["readings"]] == [
        (0, 1500.0, 55.0),
        (0, 2500.0, 65.0),
    ]
    assert body["readings"][0]["node"] == NODE
    (summary,) = body["summary"]
    assert summary["memory_peak_mb"] == 2500.0 and summary["util_mean_pct"] == 60.0
    assert bob_api.get(f"/api/v1/jobs/{job.pk}/gpu-readings/").status_code == 404


def _wait_children(pid: int, timeout: float = 5.0) -> list[int]:
    from pathlib import Path

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = Path(f"/proc/{pid}/task/{pid}/children")
        found = [int(x) for x in path.read_text().split()] if path.exists() else []
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"{pid} has no child")


def test_progress_lines_of_any_program_are_read_in_their_short_form():
    report = parse_report("@cosched progress 0.25 steps=300")
    assert report is not None and report.event == "progress"
    assert report.fields == {"fraction": 0.25, "steps": 300}


def test_an_emulated_job_is_measured_and_its_profile_gets_a_measured_draft(
    alice, alice_api, make_agent, toy, tmp_path, monkeypatch, django_capture_on_commit_callbacks
):
    monkeypatch.setitem(settings.COSCHED, "OBSERVATION_WINDOW_S", 0.2)
    agent = make_agent(VirtualBackend("A30x1", node=NODE), tmp=tmp_path)
    from portal.core.models import Node

    node = Node.objects.get(name=NODE)
    command = "python -m workers.emulate --profile toy-m --scale 0.1 --report-every 0.05"
    job = _job(alice, node, command, profile=toy)
    with django_capture_on_commit_callbacks(execute=True):  # the completion is observed after
        job = _step_until(agent, job, "COMPLETED", "FAILED", timeout=30)
    assert job.state == "COMPLETED"

    windows = list(JobObservation.objects.filter(job=job, kind="progress").order_by("at"))
    assert len(windows) >= 3
    assert all(
        w.gpu_model == "A30" and w.co_runners == [] and w.mode == "exclusive" for w in windows
    )
    assert windows[-1].progress_to > 0.9
    # 20 s alone by the profile, scaled by 0.1: the job measures about 2 s, not 20
    done = sum(w.progress_to - w.progress_from for w in windows)
    measured = sum(w.window_s for w in windows) / done
    assert 1.0 < measured < 6.0
    assert JobObservation.objects.filter(job=job, kind="completed").count() == 1
    body = alice_api.get(f"/api/v1/jobs/{job.pk}/observations/").json()["observations"]
    assert body[0]["job_type"] == "toy-m" and body[0]["gpu_model"] == "A30"
    assert body[0]["rate"] > 0.05

    # the job that reported progress changed its profile's draft
    draft = ApplicationProfile.objects.get(name="toy-m", version="1-m1")
    assert (draft.status, draft.source) == ("draft", "monitored")
    a30 = draft.gpu_times.get(gpu_model="A30").time_s
    assert a30 == pytest.approx(measured, rel=0.35)
    assert draft.sources["gpu_time_s.A30"].startswith(f"measured on {NODE}, 1 run, ")
    assert 1000.0 <= draft.gpu_memory_max_mb <= 2000.0
    assert draft.sources["gpu_memory_max_mb"].startswith(f"measured on {NODE}")
    assert list(draft.memory_steps.values_list("from_mb", "to_mb")) == [(1000.0, 2000.0)]
    toy.refresh_from_db()
    assert toy.gpu_times.get().time_s == 20.0  # the approved version is untouched

    # the next scheduling cycle knows: a queued job of the same type is short on an A30
    queued = Job.objects.create(owner=alice, name="again", profile=toy, gpus=1)
    snapshot = scheduling.build_snapshot()
    spec = next(j for j in snapshot.state.pending if j.id == str(queued.pk))
    estimate = snapshot.state.knowledge.solo_time(spec, "A30")
    assert (
        estimate is not None and estimate.value < 10.0 and "1 jobs of type toy-m" in estimate.source
    )
    assert spec.solo_time_s("A30") == 20.0  # the profile still says 20


def test_the_policy_is_handed_the_measured_knowledge_and_it_can_reorder(alice, toy, monkeypatch):
    other = ApplicationProfile.objects.create(name="other-m", kind="dl-train", status="approved")
    ProfileGpuTime.objects.create(profile=other, gpu_model="A30", time_s=8.0)
    slow_by_profile = Job.objects.create(owner=alice, name="toy", profile=toy, gpus=1)
    short_by_profile = Job.objects.create(owner=alice, name="other", profile=other, gpus=1)

    def order(state):
        def left(spec):
            est = state.knowledge.remaining_s(spec, "A30", 0.0)
            return est.value if est is not None else float("inf")

        return [j.name for j in sorted(state.pending, key=left)]

    assert order(scheduling.build_snapshot().state) == ["other", "toy"]
    # a finished job of type toy-m measured 2 s alone on an A30 (progress windows)
    done = Job.objects.create(owner=alice, name="measured", profile=toy, gpus=1, state="COMPLETED")
    from datetime import UTC, datetime

    for i in range(4):
        JobObservation.objects.create(
            job=done,
            attempt=1,
            kind="progress",
            job_type="toy-m",
            at=datetime(2026, 11, 27, 10, 0, i, tzinfo=UTC),
            window_s=0.5,
            gpu_model="A30",
            progress_from=i / 4,
            progress_to=(i + 1) / 4,
        )
    seen = []
    real = scheduling._run_policy

    def spy(name, params, state, seed):
        seen.append(state)
        return real(name, params, state, seed)

    monkeypatch.setattr(scheduling, "_run_policy", spy)
    scheduling.run_cycle()
    state = seen[0]
    assert order(state) == ["toy", "other"]
    ids = {j.id for j in state.pending}
    assert {str(slow_by_profile.pk), str(short_by_profile.pk)} <= ids
    assert observations.recent_observations(["toy-m"], per_type=2)[-1].progress_to == 1.0


def test_a_window_a_co_runner_entered_is_dropped_and_the_next_one_is_beside_it(alice, toy):
    from portal.core.models import Gpu, Node, Placement, PlacementPart

    node = Node.objects.create(name="win-1", kind="gpu", cores=8, memory_mb=65536)
    gpu = Gpu.objects.create(node=node, index=0, model="A30", memory_mb=24576, uuid="GPU-win")

    def running(name, profile=None, params=None):
        job = Job.objects.create(
            owner=alice, name=name, gpus=1, state="RUNNING", profile=profile, params=params or {}
        )
        p = Placement.objects.create(
            job=job, attempt=1, node=node, policy="t", sharing_mode="time_slicing"
        )
        p.gpus.set([gpu])
        PlacementPart.objects.create(placement=p, node=node, node_rank=0, gpu_indices=[0])
        return job

    job = running("measured", toy)
    window = settings.COSCHED["OBSERVATION_WINDOW_S"]
    assert observations.advance_window(job.pk, 1, 1000.0, 0.10, 10) is None  # the mark
    got = observations.advance_window(job.pk, 1, 1000.0 + window, 0.20, 30)
    assert got is not None and got.co_runners == [] and got.steps == 20.0
    running("neighbour", params={"job_type": "bert"})
    # the co-runner came between this window's ends: no observation, a new mark beside it
    assert observations.advance_window(job.pk, 1, 1000.0 + 2 * window, 0.30, 50) is None
    beside = observations.advance_window(job.pk, 1, 1000.0 + 3 * window, 0.35, 60)
    assert beside is not None and beside.co_runners == ["bert"] and beside.mode == "time_slicing"
    assert beside.progress_from == pytest.approx(0.30) and beside.window_s == pytest.approx(window)
    knowledge = observations.build_knowledge(["toy-m"])
    spec = adapters.job_to_domain(job)
    speed = knowledge.co_run_speed(
        spec,
        "A30",
        [adapters.job_to_domain(Job.objects.get(name="neighbour"))],
        SharingMode.TIME_SLICING,
    )
    assert speed is not None and speed.value == pytest.approx(0.5, rel=0.01)  # half as fast


def test_old_gpu_readings_are_pruned_with_the_metrics(alice):
    from datetime import timedelta

    from django.utils import timezone

    from portal.core.metrics import metrics_prune

    job = Job.objects.create(owner=alice, name="old", gpus=1)
    now = timezone.now()
    for age in (30, 1):
        GpuReading.objects.create(
            job=job, attempt=1, gpu_index=0, at=now - timedelta(days=age), memory_mb=1.0
        )
    assert metrics_prune(timedelta(days=14)) == 1
    assert GpuReading.objects.filter(job=job).count() == 1


@pytest.mark.parametrize("measured", [False, True])
def test_a_measured_throughput_changes_the_next_placement(alice, toy, measured):
    """The live loop's decision, not only its knowledge: one A30, two waiting jobs, the active
    policy ``allox`` (its solo times are ``state.knowledge.solo_time``; min-cost matching puts
    the shorter job first). By the profiles ``other`` is shorter (8 s against toy-m's 20 s) and
    gets the GPU; once a finished toy-m job was measured at 2 s alone on an A30, the same cycle
    gives it to ``toy``. (``hetero_srtf`` reads pair speeds from the knowledge but solo times
    from the profile: see docs/policies.md.)"""
    from datetime import UTC, datetime

    from portal.core.models import Gpu, Node, PolicySettings

    node = Node.objects.create(name="a30", kind="gpu", cores=8, memory_mb=65536)
    Gpu.objects.create(
        node=node, index=0, model="A30", memory_mb=24576, uuid="GPU-a30-0",
        sharing_modes=["exclusive"],
    )  # fmt: skip
    PolicySettings.objects.create(name="a", policy="allox", params={}, active=True)
    other = ApplicationProfile.objects.create(name="other-m", kind="dl-train", status="approved")
    ProfileGpuTime.objects.create(profile=other, gpu_model="A30", time_s=8.0)
    Job.objects.create(owner=alice, name="toy", profile=toy, gpus=1)
    Job.objects.create(owner=alice, name="other", profile=other, gpus=1)
    if measured:
        done = Job.objects.create(
            owner=alice, name="measured", profile=toy, gpus=1, state="COMPLETED"
        )
        for i in range(4):
            JobObservation.objects.create(
                job=done, attempt=1, kind="progress", job_type="toy-m",
                at=datetime(2026, 11, 27, 10, 0, i, tzinfo=UTC), window_s=0.5,
                gpu_model="A30", progress_from=i / 4, progress_to=(i + 1) / 4,
            )  # fmt: skip
    scheduling.run_cycle()
    placed = list(Job.objects.filter(placements__active=True).values_list("name", flat=True))
    assert placed == (["toy"] if measured else ["other"])

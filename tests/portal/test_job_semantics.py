"""Jobs as their users mean them (docs/jobs.md): ``sharing``, ``device`` and host memory through
the API, the form, the job page and the real scheduling cycle; the history like ``sacct``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from portal.core.models import (
    ApplicationProfile,
    Gpu,
    Job,
    Node,
    Placement,
    PlacementPart,
    PolicySettings,
    ProfileGpuTime,
)
from portal.core.scheduling import run_cycle
from portal.core.services import job_submit, job_transition
from portal.core.states import JobState

pytestmark = pytest.mark.django_db

TITAN_MB = 12288


def _cluster(*, gpus: int = 2, node_memory_mb: int = 131072) -> Node:
    """A virtual cluster: a node of ``gpus`` Titan Xp and a 4-core CPU node."""
    node = Node.objects.create(name="titan", kind="gpu", cores=8, memory_mb=node_memory_mb)
    for i in range(gpus):
        Gpu.objects.create(
            node=node,
            index=i,
            model="TitanXp",
            memory_mb=TITAN_MB,
            uuid=f"GPU-titan-{i}",
            sharing_modes=["exclusive", "time_slicing", "mps"],
        )
    Node.objects.create(name="cpu0", kind="cpu", cores=4, memory_mb=65536)
    return node


def _policy(name: str, **params) -> None:
    PolicySettings.objects.create(name=name, policy=name, params=params, active=True)


def _submit(owner, **fields) -> Job:
    job, _ = job_submit(owner, name=fields.pop("name", "j"), command="true", **fields)
    return job


def _placement(job: Job) -> Placement:
    return job.placements.get(active=True)


# -- the API: fields, defaults, 400s ----------------------------------------------------------


def test_the_api_fills_the_defaults_and_returns_them(alice_api):
    _cluster()
    r = alice_api.post("/api/v1/jobs/", {"name": "a", "command": "true", "gpus": 1}, format="json")
    assert r.status_code == 201, r.data
    assert (r.data["sharing"], r.data["device"]) == ("never", "gpu")
    r = alice_api.post("/api/v1/jobs/", {"name": "c", "command": "true"}, format="json")
    assert (r.data["sharing"], r.data["device"]) == ("never", "cpu")
    r = alice_api.post(
        "/api/v1/jobs/",
        {"name": "b", "command": "true", "gpus": 1, "gpu_memory_mb": 2000,
         "sharing": "mps", "device": "auto", "memory_mb": 4096},
        format="json",
    )  # fmt: skip
    assert r.status_code == 201, r.data
    job = Job.objects.get(pk=r.data["id"])
    assert (job.sharing, job.device, job.memory_mb) == ("mps", "auto", 4096)


@override_settings(COSCHED={"DEFAULT_SHARING": "allowed"})
def test_the_site_default_sharing_applies_to_jobs_that_do_not_say(alice_api):
    _cluster()
    r = alice_api.post("/api/v1/jobs/", {"name": "a", "command": "true", "gpus": 1}, format="json")
    assert r.data["sharing"] == "allowed"


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"gpus": 1, "sharing": "sometimes"}, "sharing", "MIG profile name"),
        ({"gpus": 1, "sharing": "1g.6gb"}, "sharing", "no GPU here offers the MIG profile"),
        ({"gpus": 1, "device": "cpu"}, "device", "ask 0 GPUs"),
        ({"gpus": 0, "device": "auto"}, "device", "needs at least 1 GPU"),
        ({"gpus": 1, "device": "tpu"}, "device", "not a valid choice"),
        # 10 TB of host memory against 128 GB nodes: the accepted-then-placed job.
        ({"gpus": 1, "memory_mb": 10 * 1024 * 1024}, "memory_mb", "largest GPU node"),
        ({"gpus": 0, "memory_mb": 100000}, "memory_mb", "the largest CPU node has 65536 MB"),
    ],
)
def test_bad_requests_are_a_400_naming_the_field(alice_api, fields, field, words):
    _cluster()
    r = alice_api.post("/api/v1/jobs/", {"name": "bad", "command": "true", **fields}, format="json")
    assert r.status_code == 400, r.data
    assert field in r.data and words in " ".join(map(str, r.data[field])), r.data
    assert not Job.objects.exists()


# -- the real scheduling cycle -----------------------------------------------------------------


def _shared_resident(owner, node: Node) -> Job:
    """A running job on titan/gpu0 under MPS that allows sharing (2 GB declared)."""
    job = Job.objects.create(
        owner=owner, name="resident", command="true", gpus=1, gpu_memory_mb=2048,
        sharing="allowed",
    )  # fmt: skip
    job_transition(job, JobState.SCHEDULED, actor="t")
    placement = Placement.objects.create(
        job=job, node=node, gpu_memory_mb=2048, policy="t", sharing_mode="mps"
    )
    placement.gpus.set([node.gpus.get(index=0)])
    PlacementPart.objects.create(placement=placement, node=node, gpu_indices=[0])
    Gpu.objects.filter(node=node, index=0).update(current_mode="mps")
    job_transition(job, JobState.RUNNING, actor="t")
    return job


@pytest.mark.parametrize("policy", ["binpack", "placement_rate+exec_plan", "sharing_mode"])
def test_a_profile_less_gpu_job_never_shares_while_a_gpu_idles(alice, bob, policy):
    """The issue's "done when": a profile-less ``gpus: 1`` job gets the idle Titan Xp, not a
    slot beside the resident (binpack would pack it there on a 0-GB guess); the next one waits
    rather than share, and never goes to the CPU node; the reasons say what was assumed."""
    node = _cluster()
    _policy(policy, max_jobs_per_gpu=3)
    _shared_resident(alice, node)
    first = _submit(bob, name="first", gpus=1)  # no profile, no gpu_memory_mb
    run_cycle()
    first.refresh_from_db()
    assert first.state == JobState.SCHEDULED, first.waiting_reason
    placement = _placement(first)
    assert [g.index for g in placement.gpus.all()] == [1]
    assert placement.sharing_mode == "exclusive"
    assert "whole GPUs of its own" in placement.explanation
    # The control: a job that allows sharing and declares its memory joins the resident.
    packed = _submit(alice, name="packed", gpus=1, gpu_memory_mb=2048, sharing="allowed")
    blind = _submit(bob, name="blind", gpus=1, sharing="allowed")  # allows, memory unknown
    run_cycle()
    packed.refresh_from_db()
    blind.refresh_from_db()
    assert packed.state == JobState.SCHEDULED
    assert [g.index for g in _placement(packed).gpus.all()] == [0]
    assert "on its GPU memory: 2.0 GB declared" in _placement(packed).explanation
    assert blind.state == JobState.PENDING  # room on gpu0, but never on a 0-GB guess
    assert "its GPU memory is unknown" in blind.waiting_reason
    assert "assumed to need a whole GPU" in blind.waiting_reason
    assert not Placement.objects.filter(node__name="cpu0").exists()


def _seed004_like_profile(name: str, cpu_s: float, gpu_s: float) -> ApplicationProfile:
    profile = ApplicationProfile.objects.create(
        name=name, kind="hpc", status="approved", cpu_time_s=cpu_s, gpu_memory_max_mb=1000
    )
    ProfileGpuTime.objects.create(profile=profile, gpu_model="TitanXp", time_s=gpu_s)
    return profile


@pytest.mark.parametrize("device", ["gpu", "auto"])
def test_a_gpu_job_goes_to_the_cpu_node_only_with_device_auto(alice, device):
    """seed 004's split sends the low-rate job to the CPU node where that shortens the queue:
    with ``device: auto`` it does; with the default ``gpu`` it waits for the GPU."""
    _cluster(gpus=1)
    _policy("placement_rate", max_jobs_per_gpu=1)
    fast = _seed004_like_profile("fast-on-gpu", 1000.0, 10.0)
    slow = _seed004_like_profile("little-gain", 20.0, 15.0)
    _submit(alice, name="fast", gpus=1, profile=fast, device=device)
    small = _submit(alice, name="small", gpus=1, profile=slow, device=device)
    run_cycle()
    small.refresh_from_db()
    if device == "auto":
        assert small.state == JobState.SCHEDULED
        assert _placement(small).node.name == "cpu0"
    else:
        assert small.state == JobState.PENDING
        assert not Placement.objects.filter(node__name="cpu0").exists()


def test_host_memory_is_reserved_on_the_node(alice):
    """Two 40 GB jobs on a 64 GB GPU node with two idle GPUs: one runs, the other waits and
    says why; the reservation is on the node, whatever GPUs are idle."""
    _cluster(gpus=2, node_memory_mb=65536)
    _policy("fifo")
    a = _submit(alice, name="a", gpus=1, memory_mb=40960)
    b = _submit(alice, name="b", gpus=1, memory_mb=40960)
    run_cycle()
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.state == JobState.SCHEDULED
    assert b.state == JobState.PENDING
    assert "host memory" in b.waiting_reason and "24576 MB free" in b.waiting_reason


# -- the job page and the form -----------------------------------------------------------------


def test_the_job_page_shows_the_request_semantics(client, alice):
    _cluster()
    blind = _submit(alice, name="blind", gpus=1, sharing="allowed")
    auto = _submit(alice, name="auto", gpus=1, gpu_memory_mb=1000, sharing="allowed",
                   device="auto", memory_mb=2048)  # fmt: skip
    client.force_login(alice)
    page = client.get(f"/jobs/{blind.pk}/").content.decode()
    assert "its GPU memory is unknown" in page and "gets whole GPUs of its own" in page
    assert "gpu: GPUs only, never a CPU node" in page
    page = client.get(f"/jobs/{auto.pk}/").content.decode()
    assert "allowed: the policy may pack it beside other jobs" in page
    assert "auto: on GPUs, or on a CPU node" in page
    assert "reserved on the node, enforced" in page


def test_the_form_submits_sharing_device_and_memory_and_names_bad_ones(client, alice):
    _cluster()
    client.force_login(alice)
    page = client.get("/jobs/new/").content.decode()
    assert 'name="sharing"' in page and 'name="device"' in page and 'name="memory_mb"' in page
    base = {"name": "f", "command": "true", "gpus": "1", "cpus": "1", "priority": "0"}
    r = client.post("/jobs/new/", {**base, "sharing": "sometimes", "device": "cpu"})
    assert r.status_code == 400  # the form again, with the errors beside their fields
    errors = r.context["form"].errors
    assert "MIG profile name" in " ".join(errors["sharing"])
    assert "ask 0 GPUs" in " ".join(errors["device"])
    r = client.post(
        "/jobs/new/",
        {**base, "gpu_memory_mb": "1000", "sharing": "mps", "device": "auto", "memory_mb": "512"},
    )
    assert r.status_code == 302
    job = Job.objects.get(name="f")
    assert (job.sharing, job.device, job.memory_mb) == ("mps", "auto", 512)


# -- history like sacct ------------------------------------------------------------------------


def _finished(owner, name: str, *, state: str, ago_h: float, ran_h: float, node: Node) -> Job:
    job = Job.objects.create(owner=owner, name=name, command="true", gpus=2)
    job_transition(job, JobState.SCHEDULED, actor="t")
    placement = Placement.objects.create(job=job, node=node, policy="t")
    placement.gpus.set(list(node.gpus.all()[:2]))
    PlacementPart.objects.create(placement=placement, node=node, gpu_indices=[0, 1])
    job_transition(job, JobState.RUNNING, actor="t")
    end = timezone.now() - timedelta(hours=ago_h)
    start = end - timedelta(hours=ran_h)
    submitted = start - timedelta(minutes=30)
    if state == JobState.FAILED:
        job_transition(job, JobState.FAILED, actor="t", message="boom")
    else:
        job_transition(job, JobState.COMPLETED, actor="t")
    Job.objects.filter(pk=job.pk).update(
        submitted_at=submitted, started_at=start, finished_at=end,
        exit_code=1 if state == JobState.FAILED else 0,
        failure_reason="exit code 1" if state == JobState.FAILED else "",
    )  # fmt: skip
    Placement.objects.filter(pk=placement.pk).update(started_at=start, released_at=end)
    return job


def test_history_lists_finished_jobs_with_sacct_figures(alice_api, alice, bob, staff_api):
    node = _cluster()
    recent = _finished(alice, "recent", state=JobState.FAILED, ago_h=2, ran_h=1.5, node=node)
    _finished(alice, "old", state=JobState.COMPLETED, ago_h=72, ran_h=1, node=node)
    _finished(bob, "bobs", state=JobState.COMPLETED, ago_h=1, ran_h=1, node=node)
    _submit(alice, name="pending", gpus=1)
    r = alice_api.get("/api/v1/jobs/", {"finished_since": "1d"})
    assert r.status_code == 200
    assert [j["name"] for j in r.data["results"]] == ["recent"]  # not bob's, not old, not pending
    row = r.data["results"][0]
    assert row["id"] == recent.pk and row["exit_code"] == 1
    assert row["elapsed_s"] == pytest.approx(1.5 * 3600, abs=2)
    assert row["queue_wait_s"] == pytest.approx(1800, abs=2)
    assert row["gpu_hours"] == pytest.approx(3.0, abs=0.01)  # 2 GPUs x 1.5 h
    assert row["nodes"] == ["titan"] and row["failure_reason"] == "exit code 1"
    r = alice_api.get("/api/v1/jobs/", {"finished_since": "7d", "state": "COMPLETED"})
    assert [j["name"] for j in r.data["results"]] == ["old"]
    r = staff_api.get("/api/v1/jobs/", {"finished_since": "7d", "user": "bob"})
    assert [j["name"] for j in r.data["results"]] == ["bobs"]
    r = staff_api.get("/api/v1/jobs/", {"finished_since": "7d", "finished_until": "1d"})
    assert [j["name"] for j in r.data["results"]] == ["old"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"finished_since": "yesterday"}, "finished_since"),
        ({"finished_since": "99999999d"}, "finished_since"),
        ({"finished_since": "20000d"}, "finished_since"),
        ({"finished_since": "1d", "finished_until": "2d"}, "finished_until"),
    ],
)
def test_a_bad_history_window_is_a_400_naming_the_parameter(alice_api, params, field):
    r = alice_api.get("/api/v1/jobs/", params)
    assert r.status_code == 400 and field in r.data, r.data

"""Node registration, heartbeats and lost nodes (portal.core.nodes)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core.models import Gpu, Job, JobEvent, Node, Placement
from portal.core.nodes import node_heartbeat, node_register, nodes_mark_lost
from workers import triggers

pytestmark = pytest.mark.django_db


def _gpu(index: int, memory_mb: int = 24576, model: str = "A30") -> dict:
    return {
        "index": index,
        "uuid": f"GPU-{index}",
        "model": model,
        "architecture": "Ampere",
        "memory_mb": memory_mb,
        "sm_count": 56,
        "sharing_modes": ["exclusive", "mps", "mig"],
        "mig_profiles": [{"name": "1g.6gb", "slices": 1, "memory_mb": 6144}],
    }


def _register(name: str = "n1", gpus: list[dict] | None = None, **kw) -> Node:
    args = {"kind": "gpu", "cores": 16, "memory_mb": 65536, "backend": "virtual"} | kw
    return node_register(name, gpus=[_gpu(0), _gpu(1)] if gpus is None else gpus, **args)


@pytest.fixture
def wakes():
    """Reasons the scheduling loop was woken with (through the real triggers module)."""
    seen: list[str] = []
    triggers.set_local_waker(seen.append)
    yield seen
    triggers.set_local_waker(None)


def _silence(node: Node, seconds: float) -> None:
    Node.objects.filter(pk=node.pk).update(
        last_heartbeat=timezone.now() - timedelta(seconds=seconds)
    )


def _placed_job(owner, node: Node, state: str, gpu: Gpu | None = None) -> Job:
    job = Job.objects.create(owner=owner, name=f"{state.lower()}-job", command="true", state=state)
    placement = Placement.objects.create(job=job, node=node, policy="test", cpus=1)
    if gpu is not None:
        placement.gpus.add(gpu)
    return job


def test_register_creates_the_node_and_its_gpus_up_with_a_heartbeat(
    django_capture_on_commit_callbacks, wakes
):
    with django_capture_on_commit_callbacks(execute=True):
        node = _register()
    assert (node.kind, node.cores, node.memory_mb, node.backend) == ("gpu", 16, 65536, "virtual")
    assert node.status == Node.Status.UP
    assert timezone.now() - node.last_heartbeat < timedelta(seconds=5)
    gpus = list(node.gpus.order_by("index"))
    assert [(g.index, g.uuid, g.model, g.memory_mb) for g in gpus] == [
        (0, "GPU-0", "A30", 24576),
        (1, "GPU-1", "A30", 24576),
    ]
    assert gpus[0].mig_profiles[0]["name"] == "1g.6gb"
    assert wakes == ["node n1 changed"]


def test_register_again_updates_in_place_and_keeps_gpu_ids(alice):
    node = _register()
    ids = dict(node.gpus.values_list("index", "pk"))
    Gpu.objects.filter(node=node).update(current_mode="mps")
    Node.objects.filter(pk=node.pk).update(status=Node.Status.DOWN)

    again = _register(gpus=[_gpu(0, memory_mb=20000), _gpu(1)], cores=8)

    assert again.pk == node.pk and Node.objects.count() == 1
    assert again.status == Node.Status.UP and again.cores == 8
    assert dict(again.gpus.values_list("index", "pk")) == ids
    gpu0 = Gpu.objects.get(pk=ids[0])
    assert gpu0.memory_mb == 20000
    assert gpu0.current_mode == "mps"  # the scheduler's business, not the agent's


def test_register_drops_gpus_no_longer_reported_unless_a_job_holds_them(alice):
    node = _register(gpus=[_gpu(0), _gpu(1), _gpu(2)])
    held = Gpu.objects.get(node=node, index=2)
    _placed_job(alice, node, "RUNNING", gpu=held)

    _register(gpus=[_gpu(0)])

    assert sorted(node.gpus.values_list("index", flat=True)) == [0, 2]


def test_register_keeps_a_draining_node_draining():
    node = _register()
    Node.objects.filter(pk=node.pk).update(status=Node.Status.DRAINING)
    assert _register().status == Node.Status.DRAINING


def test_heartbeat_moves_last_heartbeat_forward():
    node = _register()
    _silence(node, 100)
    node_heartbeat("n1")
    node.refresh_from_db()
    assert timezone.now() - node.last_heartbeat < timedelta(seconds=5)
    assert node.status == Node.Status.UP


def test_heartbeat_of_an_unknown_node_raises():
    with pytest.raises(Node.DoesNotExist, match="ghost"):
        node_heartbeat("ghost")


def test_a_down_node_comes_back_up_on_its_heartbeat_and_wakes_the_scheduler(
    django_capture_on_commit_callbacks, wakes
):
    node = _register()
    Node.objects.filter(pk=node.pk).update(status=Node.Status.DOWN)
    wakes.clear()
    with django_capture_on_commit_callbacks(execute=True):
        node_heartbeat("n1")
    node.refresh_from_db()
    assert node.status == Node.Status.UP
    assert wakes == ["node n1 changed"]
    # An UP node's heartbeat changes nothing else.
    with django_capture_on_commit_callbacks(execute=True):
        node_heartbeat("n1")
    assert wakes == ["node n1 changed"]


def test_mark_lost_marks_silent_nodes_down_and_requeues_their_jobs(alice):
    lost = _register("lost-1")
    alive = _register("alive-1")
    gpu = lost.gpus.get(index=0)
    running = _placed_job(alice, lost, "RUNNING", gpu=gpu)
    scheduled = _placed_job(alice, lost, "SCHEDULED", gpu=gpu)
    paused = _placed_job(alice, lost, "PAUSED", gpu=gpu)
    elsewhere = _placed_job(alice, alive, "RUNNING", gpu=alive.gpus.get(index=0))
    _silence(lost, 95)
    _silence(alive, 3)

    assert nodes_mark_lost(30) == ["lost-1"]

    lost.refresh_from_db()
    alive.refresh_from_db()
    assert lost.status == Node.Status.DOWN and alive.status == Node.Status.UP
    for job in (running, scheduled, paused):
        job.refresh_from_db()
        assert job.state == "PENDING"
        assert job.requeue_count == 1
        assert not job.placements.filter(active=True).exists()
        event = JobEvent.objects.filter(job=job).latest("id")
        assert event.to_state == "PENDING"
        assert event.message == "node lost-1 lost (no heartbeat for 95 s)"
    elsewhere.refresh_from_db()
    assert elsewhere.state == "RUNNING"
    # Already down: a second check (another scheduler worker) requeues nothing twice.
    assert nodes_mark_lost(30) == []
    running.refresh_from_db()
    assert running.requeue_count == 1


def test_mark_lost_leaves_finished_jobs_alone(alice):
    node = _register()
    done = _placed_job(alice, node, "COMPLETED")
    Placement.objects.filter(job=done).update(active=False)
    _silence(node, 60)
    assert nodes_mark_lost(30) == ["n1"]
    done.refresh_from_db()
    assert done.state == "COMPLETED" and done.requeue_count == 0


def test_a_node_that_never_sent_a_heartbeat_counts_from_its_creation():
    old = Node.objects.create(name="old", kind="cpu", status=Node.Status.UP)
    Node.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    Node.objects.create(name="new", kind="cpu", status=Node.Status.UP)
    assert nodes_mark_lost(30) == ["old"]


def test_a_lost_node_comes_back_when_its_agent_beats_again(alice):
    node = _register()
    _silence(node, 60)
    assert nodes_mark_lost(30) == ["n1"]
    node_heartbeat("n1")
    node.refresh_from_db()
    assert node.status == Node.Status.UP
    assert nodes_mark_lost(30) == []

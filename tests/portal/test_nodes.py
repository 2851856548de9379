"""Node registration, node tokens, leases and lost nodes (portal.core.nodes)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core import outbox
from portal.core.agent_sync import agent_sync
from portal.core.models import Gpu, Job, JobEvent, Node, NodeToken, Placement, PlacementPart
from portal.core.nodes import (
    node_register,
    node_token_create,
    node_token_node,
    node_token_revoke,
    nodes_mark_lost,
)
from workers.protocol import SyncRequest

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
    """What the outbox told the (embedded) loop, through the real relay."""
    seen: list[str] = []
    outbox.set_local_waker(seen.append)
    yield seen
    outbox.set_local_waker(None)


def _lease_ran_out(node: Node, seconds_ago: float) -> None:
    now = timezone.now()
    Node.objects.filter(pk=node.pk).update(
        lease_expires_at=now - timedelta(seconds=seconds_ago),
        last_heartbeat=now - timedelta(seconds=seconds_ago + 20),
    )


def _placed_job(owner, node: Node, state: str, gpu: Gpu | None = None, *, offered=True) -> Job:
    job = Job.objects.create(owner=owner, name=f"{state.lower()}-job", command="true", state=state)
    placement = Placement.objects.create(job=job, node=node, policy="test", cpus=1)
    if gpu is not None:
        placement.gpus.add(gpu)
    PlacementPart.objects.create(
        placement=placement,
        node=node,
        gpu_indices=[gpu.index] if gpu else [],
        offered_at=timezone.now() if offered else None,
        started_at=timezone.now() if state in ("RUNNING", "PAUSED") else None,
    )
    return job


def test_register_creates_the_node_and_its_gpus_up(django_capture_on_commit_callbacks, wakes):
    with django_capture_on_commit_callbacks(execute=True):
        node = _register(address="10.1.2.3")
    assert (node.kind, node.cores, node.memory_mb, node.backend) == ("gpu", 16, 65536, "virtual")
    assert node.status == Node.Status.UP and node.address == "10.1.2.3"
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


# --- tokens ---------------------------------------------------------------------------------------


def test_a_node_token_is_stored_hashed_and_names_its_node():
    token, key = node_token_create("gpu-1")
    assert key.startswith("cosn_") and len(key) > 40
    assert key not in token.key_hash and token.prefix == key[:13]
    assert node_token_node(key) == "gpu-1"
    assert NodeToken.objects.get(pk=token.pk).last_used_at is not None
    assert node_token_node(key + "x") is None and node_token_node("cos_" + key[5:]) is None


def test_revoking_keeps_only_the_rotated_token():
    old, old_key = node_token_create("gpu-1")
    new, new_key = node_token_create("gpu-1")
    assert node_token_revoke("gpu-1", keep=new) == 1
    assert node_token_node(old_key) is None and node_token_node(new_key) == "gpu-1"
    assert node_token_revoke("gpu-1") == 1
    assert node_token_node(new_key) is None


# --- leases and lost nodes ------------------------------------------------------------------------


def test_a_sync_renews_the_lease_and_a_down_node_comes_back(
    django_capture_on_commit_callbacks, wakes
):
    node = _register()
    Node.objects.filter(pk=node.pk).update(status=Node.Status.DOWN, lease_expires_at=None)
    wakes.clear()
    with django_capture_on_commit_callbacks(execute=True):
        agent_sync(SyncRequest(node="n1", instance="i", seq=5, sent_at=0.0))
    node.refresh_from_db()
    assert node.status == Node.Status.UP and node.sync_seq == 5
    left = (node.lease_expires_at - timezone.now()).total_seconds()
    assert 19 < left <= 20  # COSCHED_LEASE_S
    assert wakes == ["node n1 is back"]


def test_lost_nodes_are_down_their_parts_fenced_and_their_jobs_requeued(alice, settings):
    lost = _register("lost-1")
    alive = _register("alive-1")
    gpu = lost.gpus.get(index=0)
    running = _placed_job(alice, lost, "RUNNING", gpu=gpu)
    scheduled = _placed_job(alice, lost, "SCHEDULED", gpu=gpu, offered=False)
    paused = _placed_job(alice, lost, "PAUSED", gpu=gpu)
    elsewhere = _placed_job(alice, alive, "RUNNING", gpu=alive.gpus.get(index=0))
    _lease_ran_out(lost, 11)  # the margin is 10 s
    _lease_ran_out(alive, 9)  # ran out, but within the margin: its runners may still be stopping

    assert nodes_mark_lost() == ["lost-1"]

    lost.refresh_from_db()
    alive.refresh_from_db()
    assert lost.status == Node.Status.DOWN and alive.status == Node.Status.UP
    for job in (running, scheduled, paused):
        job.refresh_from_db()
        assert job.state == "PENDING" and job.requeue_count == 1
        attempt = job.placements.get()
        assert not attempt.active and attempt.outcome == "requeued"
        event = JobEvent.objects.filter(job=job).latest("id")
        assert event.to_state == "PENDING"
        assert event.message.startswith("node lost-1 lost (no sync for 31 s; its lease ran out at ")
        assert attempt.end_reason == event.message
    # Offered parts are fenced (settled: their runners stopped them); the unoffered one never ran.
    assert PlacementPart.objects.get(placement__job=running).settled_at is not None
    assert PlacementPart.objects.get(placement__job=scheduled).settled_at is None
    elsewhere.refresh_from_db()
    assert elsewhere.state == "RUNNING"
    # Already down: a second check (another scheduler worker) requeues nothing twice.
    assert nodes_mark_lost() == []
    running.refresh_from_db()
    assert running.requeue_count == 1


def test_a_gang_loses_every_rank_with_one_node_and_the_others_are_nudged(
    alice, django_capture_on_commit_callbacks, wakes
):
    a, b = _register("gang-a"), _register("gang-b")
    job = Job.objects.create(owner=alice, name="gang", command="true", gpus=4, state="RUNNING")
    placement = Placement.objects.create(job=job, node=a, policy="test", cpus=1)
    for rank, node in enumerate((a, b)):
        PlacementPart.objects.create(
            placement=placement,
            node=node,
            node_rank=rank,
            gpu_indices=[0, 1],
            offered_at=timezone.now(),
            started_at=timezone.now(),
        )
    _lease_ran_out(b, 60)
    wakes.clear()
    with django_capture_on_commit_callbacks(execute=True):
        assert nodes_mark_lost() == ["gang-b"]
    job.refresh_from_db()
    assert job.state == "PENDING"
    assert "nudge gang-a: node gang-b lost" in wakes
    # The rank on gang-a is not fenced (its node is alive): it is settled when gang-a reports it.
    assert PlacementPart.objects.get(node=a).settled_at is None


def test_a_finished_job_of_a_lost_node_is_left_alone(alice):
    node = _register()
    done = _placed_job(alice, node, "COMPLETED")
    Placement.objects.filter(job=done).update(active=False)
    _lease_ran_out(node, 60)
    assert nodes_mark_lost() == ["n1"]
    done.refresh_from_db()
    assert done.state == "COMPLETED" and done.requeue_count == 0


def test_a_node_that_never_synced_counts_from_its_creation():
    old = Node.objects.create(name="old", kind="cpu", status=Node.Status.UP)
    Node.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    Node.objects.create(name="new", kind="cpu", status=Node.Status.UP)
    assert nodes_mark_lost() == ["old"]


def test_a_lost_node_comes_back_when_its_agent_syncs_again(alice):
    node = _register()
    _lease_ran_out(node, 60)
    assert nodes_mark_lost() == ["n1"]
    agent_sync(SyncRequest(node="n1", instance="i", seq=1, sent_at=0.0))
    node.refresh_from_db()
    assert node.status == Node.Status.UP
    assert nodes_mark_lost() == []

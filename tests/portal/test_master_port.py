"""MASTER_PORT of multi-process attempts (portal.core.ports): chosen once per attempt, the same
in every node's spec, different from any other active attempt whose rank 0 is on the same node
and from the job's last attempt."""

from __future__ import annotations

import dataclasses

import pytest
from django.db import IntegrityError, transaction

from portal.core.agent_sync import _desired
from portal.core.models import Gpu, Job, Node, Placement, PlacementPart
from portal.core.ports import PORT_BASE, PORT_COUNT, master_port_assign
from portal.core.services import job_transition
from portal.core.states import JobState
from workers.agent import gang_env
from workers.protocol import AttemptSpec, GangPart, ProtocolError

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes():
    made = []
    for name in ("p1", "p2"):
        node = Node.objects.create(name=name, kind="gpu", cores=8, address=f"{name}.lan")
        for i in range(4):
            Gpu.objects.create(node=node, index=i, model="V100", memory_mb=16384)
        made.append(node)
    return made


def gang(owner, nodes, pk: int, gpus: tuple[int, ...] = (0,), attempt: int = 1) -> Placement:
    job = Job.objects.filter(pk=pk).first()
    if job is None:
        job = Job.objects.create(pk=pk, owner=owner, name=f"g{pk}", command="true", gpus=2)
        job_transition(job, JobState.SCHEDULED, actor="t")
    p = Placement.objects.create(job=job, attempt=attempt, node=nodes[0], policy="t")
    for rank, node in enumerate(nodes):
        PlacementPart.objects.create(placement=p, node=node, node_rank=rank, gpu_indices=list(gpus))
    return p


def spec_of(node, job_id: int) -> AttemptSpec:
    return next(s for s in _desired(node, _now()) if s.job_id == job_id)


def _now():
    from django.utils import timezone

    return timezone.now()


def test_two_gangs_with_rank_0_on_one_node_get_different_ports(alice, nodes):
    # job ids 1 and 101 at attempt 1: the agent's own fallback formula would give both 29510
    a = gang(alice, nodes, 1, gpus=(0,))
    b = gang(alice, nodes, 101, gpus=(1,))
    fallback = {
        gang_env(dataclasses.replace(spec_of(nodes[0], j), master_port=None))["MASTER_PORT"]
        for j in (1, 101)
    }
    assert len(fallback) == 1  # they would have collided
    port_a, port_b = spec_of(nodes[0], 1).master_port, spec_of(nodes[0], 101).master_port
    assert port_a is not None and port_b is not None and port_a != port_b
    assert min(port_a, port_b) >= PORT_BASE and max(port_a, port_b) < PORT_BASE + PORT_COUNT
    # every node of an attempt is told the same port, and it is kept on the attempt
    assert spec_of(nodes[1], 1).master_port == port_a
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.master_port, b.master_port) == (port_a, port_b)
    assert gang_env(spec_of(nodes[1], 1))["MASTER_PORT"] == str(port_a)


def test_the_next_attempt_does_not_reuse_the_last_ones_port(alice, nodes):
    first = gang(alice, nodes, 7)
    port = master_port_assign(first)
    Placement.objects.filter(pk=first.pk).update(active=False)
    second = gang(alice, nodes, 7, attempt=2)
    assert master_port_assign(second) != port


def test_the_database_refuses_one_port_twice_on_a_node(alice, nodes):
    a = gang(alice, nodes, 3)
    b = gang(alice, nodes, 4, gpus=(1,))
    port = master_port_assign(a)
    with pytest.raises(IntegrityError), transaction.atomic():
        Placement.objects.filter(pk=b.pk).update(master_port=port)


def test_a_single_process_attempt_gets_no_port(alice, nodes):
    job = Job.objects.create(owner=alice, name="one", command="true", gpus=1)
    job_transition(job, JobState.SCHEDULED, actor="t")
    p = Placement.objects.create(job=job, attempt=1, node=nodes[0], policy="t")
    PlacementPart.objects.create(placement=p, node=nodes[0], gpu_indices=[2])
    assert spec_of(nodes[0], job.pk).master_port is None
    p.refresh_from_db()
    assert p.master_port is None


def test_the_protocol_refuses_a_port_out_of_range():
    data = AttemptSpec(1, 1, True, False, "x", (GangPart("a", 0),), master_port=80).to_dict()
    with pytest.raises(ProtocolError, match="master_port"):
        AttemptSpec.read(data, "desired[0]")

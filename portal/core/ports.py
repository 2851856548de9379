"""``MASTER_PORT`` for multi-process attempts (gangs, elastic jobs' ranks).

Rank 0 of such an attempt listens on ``MASTER_ADDR:MASTER_PORT`` (PyTorch's rendezvous). Two
attempts whose rank 0 is on the same node must not be given the same port, and a job's next
attempt should not be given its last one's (the old listener may still be closing). The port is
chosen when the attempt is first offered to a node and kept on the attempt
(``Placement.master_port``); a unique constraint over the active attempts of a node makes two
concurrent choices (two nodes' syncs, two scheduler workers) settle on different ports.
"""

from __future__ import annotations

from django.db import IntegrityError, transaction

from portal.core.models import Placement

PORT_BASE = 29500  # PyTorch's default MASTER_PORT
PORT_COUNT = 1000  # 29500-30499


def master_port_assign(placement: Placement) -> int:
    """The attempt's ``MASTER_PORT``: the one it has, else the first free port of the range
    on its rank-0 node, starting from a point spread by job and attempt. Raises RuntimeError when
    all ``PORT_COUNT`` ports are taken on that node."""
    if placement.master_port is not None:
        return placement.master_port
    in_use = set(
        Placement.objects.filter(
            node_id=placement.node_id, active=True, master_port__isnull=False
        ).values_list("master_port", flat=True)
    )
    last = (
        Placement.objects.filter(job_id=placement.job_id, attempt=placement.attempt - 1)
        .values_list("master_port", flat=True)
        .first()
    )
    start = (placement.job_id * 37 + placement.attempt * 7) % PORT_COUNT
    for step in range(PORT_COUNT):
        port = PORT_BASE + (start + step) % PORT_COUNT
        if port in in_use or port == last:
            continue
        try:
            with transaction.atomic():
                Placement.objects.filter(pk=placement.pk, master_port__isnull=True).update(
                    master_port=port
                )
        except IntegrityError:
            continue  # another attempt on the node took it just now
        placement.refresh_from_db(fields=["master_port"])
        if placement.master_port is not None:
            return placement.master_port
    raise RuntimeError(f"no free MASTER_PORT on node {placement.node_id} ({PORT_COUNT} in use)")

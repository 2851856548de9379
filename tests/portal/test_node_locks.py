"""A node's state lock does not stop others from referencing the node: ``locked_nodes()``
takes ``FOR NO KEY UPDATE``, so a transaction that inserts a row pointing at the node (its
foreign-key check takes ``FOR KEY SHARE``) goes on while a sync, drain or registration holds
the node. Under ``FOR UPDATE`` the insert waited for the lock, and a sync holding its node while
waiting for a job row such a transaction held deadlocked with it (a preempt from the job page
against the agent's sync, in the browser test)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, transaction

from portal.core.models import Gpu, Node
from portal.core.nodes import locked_nodes

pytestmark = pytest.mark.django_db(transaction=True)


def _hold_lock(name: str, held: threading.Event, release: threading.Event, lock) -> None:
    from django.db import connection as thread_connection

    try:
        with transaction.atomic():
            lock().get(name=name)
            held.set()
            release.wait(10)
    finally:
        thread_connection.close()


@pytest.mark.parametrize("strict", [False, True])
def test_a_row_referencing_a_locked_node_is_written_while_the_lock_is_held(strict):
    if connection.vendor != "postgresql":
        pytest.fail("needs PostgreSQL (DATABASE_URL): the lock modes are PostgreSQL's")
    Node.objects.create(name="n1", kind="gpu", cores=8, memory_mb=65536)
    held, release = threading.Event(), threading.Event()
    lock = (lambda: Node.objects.select_for_update()) if strict else locked_nodes
    holder = threading.Thread(target=_hold_lock, args=("n1", held, release, lock))
    holder.start()
    try:
        assert held.wait(10)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '1s'")
        try:
            Gpu.objects.create(
                node=Node.objects.get(name="n1"), index=0, model="A30", memory_mb=24576, uuid="g0"
            )
            written = True
        except Exception as exc:  # the lock timeout: the insert waited for the node's lock
            assert "lock timeout" in str(exc), exc
            written = False
        finally:
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = 0")
    finally:
        release.set()
        holder.join(10)
    # FOR UPDATE (what the code used before) blocks the reference; locked_nodes() does not
    assert written is not strict

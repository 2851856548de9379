"""Job control through the whole embedded stack (the real scheduling loop, in-process agents of
a ``virtual`` node, jobs as real processes): a dependency chain of three jobs runs in order, a
held job does not start until released, and an array never has more tasks placed than its
limit, each task seeing its own COSCHED_ARRAY_TASK_ID."""

from __future__ import annotations

import threading
import time

import pytest

from portal.core.jobcontrol import parse_array
from portal.core.models import Job, Node, Placement, PolicySettings
from portal.core.services import job_release, job_submit
from tests.e2e.conftest import wait_for
from tests.embedded import embedded_loop

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def cluster():
    PolicySettings.objects.create(name="f", policy="fifo", params={}, active=True)
    # 8 cores: without the array limit every task of the array below would run at once.
    Node.objects.create(name="jc-live", kind="cpu", cores=8, memory_mb=8192, backend="virtual")


def _done(*ids: int) -> bool:
    return all(
        s in ("COMPLETED", "FAILED", "CANCELLED")
        for s in Job.objects.filter(pk__in=ids).values_list("state", flat=True)
    )


def test_a_chain_runs_in_order_and_a_held_job_waits_for_its_release(
    alice, cluster, settings, tmp_path
):
    trace = tmp_path / "order.txt"
    step = f"sleep 0.3; echo %s >> {trace}"
    a, _ = job_submit(alice, name="a", command=step % "a")
    b, _ = job_submit(
        alice, name="b", command=step % "b", dependencies=[{"type": "afterok", "job": a.pk}]
    )
    c, _ = job_submit(
        alice, name="c", command=step % "c", dependencies=[{"type": "afterok", "job": b.pk}]
    )
    held, _ = job_submit(alice, name="held", command=f"echo held >> {trace}", held=True)
    with embedded_loop(settings, tmp_path / "logs", interval=0.2):
        wait_for(lambda: _done(a.pk, b.pk, c.pk), timeout=60, what="the chain to finish")
        time.sleep(1.0)  # a few more cycles: the held job must still wait
        held.refresh_from_db()
        assert held.state == "PENDING" and held.started_at is None
        assert held.waiting_reason.startswith("held by its owner")
        assert trace.read_text().split() == ["a", "b", "c"]
        job_release(held, actor="user:alice")
        wait_for(lambda: _done(held.pk), timeout=30, what="the released job to finish")
    jobs = {j.name: j for j in Job.objects.filter(pk__in=[a.pk, b.pk, c.pk, held.pk])}
    assert {j.state for j in jobs.values()} == {"COMPLETED"}
    assert jobs["a"].finished_at <= jobs["b"].started_at
    assert jobs["b"].finished_at <= jobs["c"].started_at
    assert trace.read_text().split() == ["a", "b", "c", "held"]


def test_an_array_never_exceeds_its_limit_and_each_task_knows_its_index(
    alice, cluster, settings, tmp_path
):
    out = tmp_path / "tasks"
    out.mkdir()
    task = "$COSCHED_ARRAY_TASK_ID"
    first, _ = job_submit(
        alice,
        name="sweep",
        command=f"sleep 0.4; echo {task} > {out}/{task}",
        array=parse_array("0-7%2"),
    )
    ids = list(Job.objects.filter(array_of=first).values_list("pk", flat=True))
    most = [0]
    stop = threading.Event()

    def watch() -> None:  # the placed tasks, sampled while the array runs
        from django.db import connection

        try:
            while not stop.is_set():
                placed = Job.objects.filter(
                    pk__in=ids, state__in=["SCHEDULED", "RUNNING", "PAUSED"]
                ).count()
                most[0] = max(most[0], placed)
                time.sleep(0.02)
        finally:
            connection.close()

    watcher = threading.Thread(target=watch)
    with embedded_loop(settings, tmp_path / "logs", interval=0.2):
        watcher.start()
        try:
            wait_for(lambda: _done(*ids), timeout=90, what="the array to finish")
        finally:
            stop.set()
            watcher.join()
    assert set(Job.objects.filter(pk__in=ids).values_list("state", flat=True)) == {"COMPLETED"}
    assert sorted(int(p.read_text()) for p in out.iterdir()) == list(range(8))
    assert most[0] == 2  # reached, never passed
    # The same from the attempts' own times: never more than 2 overlap.
    spans = sorted((p.created_at, p.released_at) for p in Placement.objects.filter(job_id__in=ids))
    for start, _ in spans:
        overlapping = sum(1 for s, e in spans if s <= start < e)
        assert overlapping <= 2


def test_output_goes_to_the_owners_files_and_the_portal_keeps_the_whole_log(
    alice, cluster, settings, tmp_path
):
    from rest_framework.test import APIClient

    from portal.core.models import JobLogChunk

    # 60,000 numbered lines (about 700 KB: more than the 16 KB tail and than one chunk),
    # one line to stderr, a second later: the two streams reach the log through two copies, so
    # a write to one may land between two writes of the other (not mid-line with the pause).
    command = "seq 1 60000 | sed 's/^/line /'; sleep 1; echo oops >&2"
    job, _ = job_submit(
        alice, name="big", command=command, output_path="%u-%j.out", error_path="err/%j.err"
    )
    plain, _ = job_submit(alice, name="plain", command="echo plain-output")
    with embedded_loop(settings, tmp_path / "logs", interval=0.2) as agents:
        workdir = agents[0].work_dir
        (workdir / f"job-{job.pk}" / "err").mkdir(parents=True)
        wait_for(lambda: _done(job.pk, plain.pk), timeout=60, what="the jobs to finish")
        kept = JobLogChunk.objects.filter(job=job).values_list("text", flat=True)
        wait_for(lambda: "line 60000\n" in "".join(kept), timeout=30, what="the whole log")
    assert Job.objects.get(pk=job.pk).state == "COMPLETED"
    out = (workdir / f"job-{job.pk}" / f"alice-{job.pk}.out").read_text()
    assert out.splitlines() == [f"line {i}" for i in range(1, 60001)]
    assert (workdir / f"job-{job.pk}" / "err" / f"{job.pk}.err").read_text() == "oops\n"
    default = workdir / f"job-{plain.pk}" / f"cosched-{plain.pk}.out"
    assert default.read_text() == "plain-output\n"
    assert JobLogChunk.objects.filter(job=job).count() >= 3  # streamed in pieces

    api = APIClient()
    api.force_authenticate(alice)
    response = api.get(f"/api/v1/jobs/{job.pk}/log/full/")
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="job-{job.pk}.log"'
    text = b"".join(response.streaming_content).decode()
    lines = [line for line in text.splitlines() if line.startswith("line ")]
    assert lines == [f"line {i}" for i in range(1, 60001)]  # whole, in order, once
    assert "oops" in text
    tail = api.get(f"/api/v1/jobs/{job.pk}/log/").json()["text"]
    assert len(tail) <= 16 * 1024 + 100 and "line 1\n" not in tail

"""The ``cosched`` commands of job control (docs/job-control.md) through the real console
script against a live test server: submit --array / --dependency / --hold / --output, jobs
--array, hold, release, update, pause, resume, requeue."""

from __future__ import annotations

import re

import pytest

from portal import cli
from portal.core.models import Job, Node, Placement, PlacementPart
from portal.core.services import job_transition
from portal.core.states import JobState
from tests.portal.test_cli import run_cli, server  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _file(tmp_path, name="step"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"name: {name}\ncommand: echo hi\ncpus: 1\n")
    return str(path)


def test_submit_an_array_with_a_limit_and_list_its_tasks(server, tmp_path):  # noqa: F811
    done = run_cli(
        "submit", _file(tmp_path, "sweep"), "--array", "0-9%2", "-o", "out/%j_%a.log",
        url=server.url, token=server.key,
    )  # fmt: skip
    assert done.code == 0, done.err
    match = re.match(
        r"Submitted array (\d+) \(sweep\): 0-9%2; tasks: cosched jobs --array \1", done.out
    )
    assert match, done.out
    first = int(match.group(1))
    tasks = Job.objects.filter(array_of_id=first)
    assert tasks.count() == 10 and {t.array_limit for t in tasks} == {2}
    assert {t.output_path for t in tasks} == {"out/%j_%a.log"}
    listing = run_cli("jobs", "--array", str(first), url=server.url, token=server.key)
    assert listing.code == 0
    assert re.search(rf"^{first} \[0\]\s+PENDING", listing.out, re.M), listing.out
    assert re.search(r"^\d+ \[9\]\s+PENDING", listing.out, re.M)
    status = run_cli("status", str(first), url=server.url, token=server.key)
    assert re.search(rf"array\s+task 0 of {first}, at most 2 at once", status.out), status.out
    bad = run_cli(
        "submit", _file(tmp_path, "bad"), "--array", "9-1", url=server.url, token=server.key
    )
    assert bad.code == cli.EXIT_BAD_INPUT and "array" in bad.err


def test_dependency_hold_release_and_update(server, alice, tmp_path):  # noqa: F811
    first = run_cli("submit", _file(tmp_path, "a"), "-q", url=server.url, token=server.key)
    first_id = int(first.out)
    second = run_cli(
        "submit", _file(tmp_path, "b"), "-q", "--hold", "-d", f"afterok:{first_id}",
        url=server.url, token=server.key,
    )  # fmt: skip
    assert second.code == 0, second.err
    job_id = int(second.out)
    job = Job.objects.get(pk=job_id)
    assert job.held and job.dependencies == [{"type": "afterok", "job": first_id}]
    status = run_cli("status", str(job_id), url=server.url, token=server.key)
    assert re.search(rf"depends on\s+afterok:{first_id}", status.out)
    assert re.search(r"held\s+yes", status.out)

    released = run_cli("release", str(job_id), url=server.url, token=server.key)
    assert released.code == 0 and f"Released job {job_id} (b): PENDING" in released.out
    assert not Job.objects.get(pk=job_id).held
    again = run_cli("release", str(job_id), url=server.url, token=server.key)
    assert again.code == cli.EXIT_JOB_NOT_COMPLETED and "only a held job" in again.err
    held = run_cli("hold", str(job_id), url=server.url, token=server.key)
    assert held.code == 0 and Job.objects.get(pk=job_id).held

    updated = run_cli(
        "update", str(job_id), "--cpus", "2", "--priority", "7", "--time-limit", "1h",
        "-d", f"afterany:{first_id}", url=server.url, token=server.key,
    )  # fmt: skip
    assert updated.code == 0, updated.err
    job = Job.objects.get(pk=job_id)
    assert (job.cpus, job.priority, job.time_limit_s) == (2, 7, 3600)
    assert job.dependencies == [{"type": "afterany", "job": first_id}]
    nothing = run_cli("update", str(job_id), url=server.url, token=server.key)
    assert nothing.code == cli.EXIT_BAD_INPUT and "nothing to change" in nothing.err
    bad = run_cli("update", str(job_id), "--cpus", "0", url=server.url, token=server.key)
    assert bad.code == cli.EXIT_BAD_INPUT and "cpus" in bad.err
    assert Job.objects.get(pk=job_id).cpus == 2


def test_pause_resume_and_requeue_a_running_job(server, alice):  # noqa: F811
    node = Node.objects.create(name="cli-jc", kind="cpu", cores=4)
    job = Job.objects.create(owner=alice, name="r", command="sleep 9", state="SCHEDULED")
    placement = Placement.objects.create(job=job, node=node, policy="t")
    PlacementPart.objects.create(placement=placement, node=node)
    job_transition(job, JobState.RUNNING, actor="t")
    paused = run_cli("pause", str(job.pk), url=server.url, token=server.key)
    assert paused.code == 0 and f"Paused job {job.pk} (r): PAUSED" in paused.out
    assert Job.objects.get(pk=job.pk).user_paused
    resumed = run_cli("resume", str(job.pk), url=server.url, token=server.key)
    assert resumed.code == 0 and "RUNNING" in resumed.out
    requeued = run_cli("requeue", str(job.pk), url=server.url, token=server.key)
    assert requeued.code == 0 and f"Requeued job {job.pk} (r): PENDING" in requeued.out
    again = run_cli("requeue", str(job.pk), url=server.url, token=server.key)
    assert again.code == cli.EXIT_JOB_NOT_COMPLETED and "PENDING" in again.err


def test_logs_all_prints_the_whole_log_and_a_1000_task_array_is_one_request(
    server,  # noqa: F811
    alice,
    tmp_path,
):
    import time

    from portal.core.models import JobLogChunk

    job = Job.objects.create(owner=alice, name="logged", command="true")
    lines = "".join(f"line {i}\n" for i in range(5000))  # far more than the 16 KB tail
    JobLogChunk.objects.create(job=job, attempt=1, seq=0, size=len(lines), text=lines)
    JobLogChunk.objects.create(job=job, attempt=2, seq=len(lines), size=6, text="again\n")
    done = run_cli("logs", str(job.pk), "--all", url=server.url, token=server.key)
    assert done.code == 0 and done.out == lines + "again\n"
    second = run_cli(
        "logs", str(job.pk), "--all", "--attempt", "2", url=server.url, token=server.key
    )
    assert second.code == 0 and second.out == "again\n"
    empty = Job.objects.create(owner=alice, name="quiet", command="true")
    none = run_cli("logs", str(empty.pk), "--all", url=server.url, token=server.key)
    assert none.code == 0 and none.out == "" and "no output kept yet" in none.err

    started = time.perf_counter()  # the whole command: Python start, HTTP, 1,000 rows
    big = run_cli(
        "submit", _file(tmp_path, "big"), "--array", "0-999%8", "-q",
        url=server.url, token=server.key,
    )  # fmt: skip
    elapsed = time.perf_counter() - started
    assert big.code == 0, big.err
    assert Job.objects.filter(array_of_id=int(big.out)).count() == 1000
    print(f"cosched submit --array 0-999%8 against a live server: {elapsed:.2f} s")
    assert elapsed < 4.0  # the request itself is measured in test_job_control (< 2 s)

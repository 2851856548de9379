"""The staff's replay pages and the replay service: access, field errors with nothing written,
a replay run in-process (the embedded default's eager Celery) with its comparison and files.
The same path through a real Celery worker is tests/e2e/test_replay_live.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError

from portal.core.models import Job
from portal.replay.models import ReplayRun
from portal.replay.services import LIVE_ROW, replay_run_execute
from tests.portal.replay_helpers import T0, finished_job, make_nodes, make_profile

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(alice, bob):
    nodes = make_nodes()
    profile = make_profile("ResNet", TitanXp=600.0)
    jobs = []
    for i in range(6):
        who = alice if i % 2 else bob
        jobs.append(
            finished_job(
                who,
                name=f"j{i}",
                submitted_s=10 * i,
                wait_s=3,
                run_s=590,
                node=nodes["titan"],
                profile=profile,
            )
        )
    return jobs


def form(**over):
    data = {
        "since": "2026-03-02T08:00",
        "until": "2026-03-02T10:00",
        "policies": ["fifo", "binpack"],
        "interference": "class_based",
        "seed": "0",
    }
    data.update(over)
    return data


def test_only_staff_see_the_replay_pages(client, alice, staff):
    client.force_login(alice)
    assert client.get("/replay/").status_code == 302  # to the admin login
    assert client.post("/replay/", form()).status_code == 302
    assert not ReplayRun.objects.exists()
    client.force_login(staff)
    page = client.get("/replay/")
    assert page.status_code == 200 and b"New replay" in page.content


def test_bad_fields_are_named_and_nothing_is_written(client, staff):
    client.force_login(staff)
    response = client.post(
        "/replay/", form(until="2026-03-01T10:00", policies=["fifo", "no-such-policy"], seed="-1")
    )
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert set(errors) == {"policies", "seed"}  # the form's own checks first
    response = client.post("/replay/", form(until="2026-03-01T10:00"))
    assert response.status_code == 400
    assert "until" in response.context["form"].errors
    assert not ReplayRun.objects.exists()


def test_a_replay_runs_and_shows_the_comparison(
    client, staff, history, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.DATA_DIR = tmp_path
    client.force_login(staff)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/replay/", form())
    run = ReplayRun.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/replay/{run.pk}/"
    run.refresh_from_db()
    assert run.status == "done", run.error
    assert run.progress == 1.0 and run.jobs_exported == 6
    assert [row["policy"] for row in run.summary] == [LIVE_ROW, "fifo", "binpack"]
    live = run.summary[0]
    assert live["avg_queue_s"] == pytest.approx(3) and live["avg_jct_s"] == pytest.approx(593)
    assert live["avg_slowdown"] == pytest.approx(590 / 600)
    fifo = run.summary[1]
    assert fifo["status"] == "complete" and fifo["completed"] == 6
    # 2 GPUs, six 600 s jobs arriving 10 s apart: fifo runs them two at a time, in order
    assert fifo["makespan_s"] == pytest.approx(1810)  # j5 starts at 1210 when j1 ends
    assert fifo["user_fairness"] is not None and 0 < fifo["user_fairness"] <= 1
    users = {(r["policy"], r["group"]): r for r in run.per_user}
    assert users[("fifo", "alice")]["jobs"] == 3 and users[("fifo", "bob")]["jobs"] == 3
    assert users[("fifo", "alice")]["gpu_seconds"] == pytest.approx(1800)
    # The same per project (each user's jobs are in their personal project here).
    names = {
        j.owner.username: j.project.name for j in Job.objects.select_related("owner", "project")
    }
    projects = {(r["policy"], r["group"]): r for r in run.per_project}
    assert {g for p, g in projects if p == "fifo"} == set(names.values())
    assert projects[("fifo", names["alice"])]["gpu_seconds"] == pytest.approx(1800)
    assert fifo["project_fairness"] is not None and 0 < fifo["project_fairness"] <= 1

    page = client.get(f"/replay/{run.pk}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "live (as it ran)" in text and "binpack" in text and 'id="replay-users"' in text
    assert 'id="replay-projects"' in text and "project fairness" in text
    assert '<td class="num">1,810</td>' in text  # fifo's makespan, as the table shows it
    assert 'id="replay-mismatch"' not in text  # the jobs ran 590 s of their profiles' 600 s
    status = client.get(f"/replay/{run.pk}/status/").json()
    assert status == {
        "id": run.pk,
        "status": "done",
        "status_display": "Done",
        "progress": 1.0,
        "message": "done",
        "error": "",
    }
    report = client.get(f"/replay/{run.pk}/files/report.html")
    assert (
        report.status_code == 200 and report["Content-Security-Policy"] == "sandbox allow-scripts"
    )
    trace = b"".join(client.get(f"/replay/{run.pk}/files/trace.csv").streaming_content)
    assert trace.startswith(b"job_id,arrival_s,profile") and trace.count(b"\n") == 7
    assert client.get(f"/replay/{run.pk}/files/..%2Fsecrets").status_code == 404


def test_a_period_without_completed_jobs_fails_with_a_reason(staff, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    make_nodes()
    run = ReplayRun.objects.create(
        created_by=staff, since=T0, until=T0 + timedelta(hours=1), policies=["fifo"]
    )
    run = replay_run_execute(run.pk)
    assert run.status == "failed" and "no completed job" in run.error
    # a second delivery of the same task finds it claimed and does nothing
    assert replay_run_execute(run.pk).error == run.error


def test_a_replay_whose_worker_died_is_taken_up_again(staff, history, settings, tmp_path):
    from django.utils import timezone

    settings.DATA_DIR = tmp_path
    since, until = T0 - timedelta(hours=1), T0 + timedelta(hours=1)
    lost = ReplayRun.objects.create(
        since=since,
        until=until,
        policies=["fifo"],
        status="running",
        started_at=timezone.now() - timedelta(hours=2),
    )
    recent = ReplayRun.objects.create(
        since=since, until=until, policies=["fifo"], status="running", started_at=timezone.now()
    )
    assert replay_run_execute(lost.pk).status == "done"
    assert replay_run_execute(recent.pk).status == "running"  # its worker may still be at it


def test_saved_policy_configurations_replay_with_their_own_settings(
    staff, history, settings, tmp_path
):
    from portal.core.models import PolicySettings
    from portal.replay.forms import ReplayForm
    from portal.replay.services import replay_run_create

    settings.DATA_DIR = tmp_path
    PolicySettings.objects.all().delete()
    PolicySettings.objects.create(
        name="lab", policy="binpack", params={"seed": 4, "max_jobs_per_gpu": 1}
    )
    PolicySettings.objects.create(
        name="typo", policy="fifo", params={"no_such_knob": 1}, active=False
    )
    choices = dict(ReplayForm().fields["policies"].choices)
    assert choices["saved:lab"] == "lab: binpack with its saved settings (active)"
    assert "fifo" in choices

    period = {"since": T0 - timedelta(hours=1), "until": T0 + timedelta(hours=1)}
    run = replay_run_create(user=staff, policies=["fifo", "saved:lab"], **period)
    run = replay_run_execute(run.pk)
    assert run.status == "done", run.error
    assert [row["policy"] for row in run.summary] == [LIVE_ROW, "fifo", "lab: binpack"]
    assert {row["policy"] for row in run.per_user} == {"fifo", "lab: binpack"}

    # the saved parameters reach the policy: a bad one fails the replay, naming it
    run = replay_run_execute(replay_run_create(user=staff, policies=["saved:typo"], **period).pk)
    assert run.status == "failed" and "no_such_knob" in run.error
    with pytest.raises(ValidationError) as refused:
        replay_run_create(user=staff, policies=["saved:gone"], **period)
    assert "policies" in refused.value.message_dict


def test_the_page_warns_when_jobs_ran_far_from_their_profiles(
    client, staff, alice, settings, tmp_path
):
    settings.DATA_DIR = tmp_path
    nodes = make_nodes()
    profile = make_profile("ResNet", TitanXp=600.0)
    for i in range(3):  # the demo's DEMO_SCALE 0.1: 60 s runs of 600 s profiles
        finished_job(
            alice,
            name=f"s{i}",
            submitted_s=i,
            wait_s=1,
            run_s=60,
            node=nodes["titan"],
            profile=profile,
        )
    run = ReplayRun.objects.create(
        created_by=staff, since=T0, until=T0 + timedelta(hours=1), policies=["fifo"]
    )
    replay_run_execute(run.pk)
    client.force_login(staff)
    text = client.get(f"/replay/{run.pk}/").content.decode()
    assert "ran on average 10.0 times faster than their profiles say" in text


def test_a_demo_sessions_history_replays_with_a_report(staff, settings, tmp_path):
    """The demo's own profiles, cluster (Titan Xp, A30 with MIG, a CPU node) and seed 004's
    jobs, finished as the demo would leave them (each run taking its profile's time on the
    model the demo's policy gave it), replayed under the demo's saved policy and fifo."""
    from io import StringIO

    from django.core.management import call_command
    from django.utils import timezone

    from portal.core.models import Gpu, Job, Node, Placement

    settings.DATA_DIR = tmp_path
    call_command("load_demo", stdout=StringIO())
    jobs = list(Job.objects.select_related("profile").order_by("id"))
    assert len(jobs) == 25
    titan = Node.objects.get(name="gpu-titanxp-1")
    cpu = Node.objects.get(kind="cpu")
    start = timezone.now() - timedelta(hours=2)
    for i, job in enumerate(jobs):
        times = {t.gpu_model: t.time_s for t in job.profile.gpu_times.all()}
        on_gpu = job.gpus > 0 and "TitanXp" in times
        run_s = times["TitanXp"] if on_gpu else job.profile.cpu_time_s
        placement = Placement.objects.create(
            job=job, node=titan if on_gpu else cpu, policy="demo", active=False, outcome="completed"
        )
        if on_gpu:
            placement.gpus.set([Gpu.objects.get(node=titan, index=i % 2)])
        Job.objects.filter(pk=job.pk).update(
            state="COMPLETED",
            submitted_at=start + timedelta(seconds=i),
            started_at=start + timedelta(seconds=i + 1),
            finished_at=start + timedelta(seconds=i + 1 + run_s),
        )
    run = ReplayRun.objects.create(
        created_by=staff,
        since=start - timedelta(minutes=1),
        until=timezone.now(),
        policies=["saved:default", "fifo"],
    )
    run = replay_run_execute(run.pk)
    assert run.status == "done", run.error
    assert run.jobs_exported == 25 and run.left_out == {}
    assert "2 A30" in run.cluster and "2 TitanXp" in run.cluster
    policies = [row["policy"] for row in run.summary]
    assert policies[0] == LIVE_ROW and policies[2] == "fifo" and policies[1].startswith("default:")
    for row in run.summary[1:]:
        assert row["status"] == "complete" and row["completed"] == 25
    assert run.summary[0]["avg_slowdown"] == pytest.approx(1.0)  # ran as their profiles say
    report = (tmp_path / "replay" / str(run.pk) / "report.html").read_text()
    assert "fifo" in report and len(report) > 100_000


def test_staff_delete_an_ended_replay_with_its_files(client, staff, history, settings, tmp_path):
    settings.DATA_DIR = tmp_path
    period = {"since": T0 - timedelta(hours=1), "until": T0 + timedelta(hours=1)}
    done = replay_run_execute(
        ReplayRun.objects.create(created_by=staff, policies=["fifo"], **period).pk
    )
    folder = tmp_path / "replay" / str(done.pk)
    assert (folder / "report.html").exists()
    running = ReplayRun.objects.create(
        created_by=staff, policies=["fifo"], status="running", **period
    )
    client.force_login(staff)
    assert client.get(f"/replay/{done.pk}/delete/").status_code == 405
    response = client.post(f"/replay/{running.pk}/delete/")
    assert response.status_code == 302 and ReplayRun.objects.filter(pk=running.pk).exists()
    response = client.post(f"/replay/{done.pk}/delete/")
    assert response.status_code == 302 and response["Location"] == "/replay/"
    assert not ReplayRun.objects.filter(pk=done.pk).exists() and not folder.exists()

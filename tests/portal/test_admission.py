"""Admission at submission (issue 10): a job that can never run on the registered cluster is
refused with a 400 / a form error / a CLI message naming the field and the largest request that
would fit; with no node registered, the job is accepted and says why it waits. Waiting reasons
show in the API, on the pages and in the CLI."""

from __future__ import annotations

import io
import re

import pytest

from portal import cli
from portal.core.models import ApplicationProfile, Gpu, Job, Node, ProfileGpuTime
from portal.core.services import job_submit
from portal.front.services import token_create

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs/"


@pytest.fixture
def cluster():
    """4 V100 (16 GB) on a 16-core node, 2 A30 (24 GB) on an 8-core node, a 32-core CPU node."""
    v100 = Node.objects.create(name="gpu-v100", kind="gpu", cores=16, memory_mb=65536)
    for i in range(4):
        Gpu.objects.create(node=v100, index=i, model="V100", memory_mb=16384)
    a30 = Node.objects.create(name="gpu-a30", kind="gpu", cores=8, memory_mb=65536)
    for i in range(2):
        Gpu.objects.create(node=a30, index=i, model="A30", memory_mb=24576)
    Node.objects.create(name="cpu-1", kind="cpu", cores=32, memory_mb=131072)


@pytest.fixture
def k80_profile():
    profile = ApplicationProfile.objects.create(name="OldApp", kind="hpc", status="approved")
    ProfileGpuTime.objects.create(profile=profile, gpu_model="K80", time_s=100.0)
    return profile


# field -> (extra job fields, the message the refusal must carry)
REFUSED = {
    "gpus": ({"gpus": 5}, "asks 5 GPUs of one model; at most 4 exist (V100: 4, A30: 2)"),
    "gpu_memory_mb": (
        {"gpus": 1, "gpu_memory_mb": 30000},
        "asks 30000 MB per GPU; the largest GPU with 1 of its model has 24576 MB",
    ),
    "cpus": (
        {"gpus": 1, "cpus": 20},
        "asks 20 cores per node; the largest GPU node of a usable model has 16",
    ),
    "cpus-cpu-job": ({"gpus": 0, "cpus": 64}, "asks 64 cores; the largest CPU node has 32"),
    "profile": (
        {"gpus": 1, "profile": "OldApp"},
        "the profile has GPU times for K80 only; the cluster has A30, V100",
    ),
}


def _field(case: str) -> str:
    return case.split("-")[0]


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_api_refuses_a_job_that_can_never_run(cluster, k80_profile, alice_api, case):
    extra, message = REFUSED[case]
    response = alice_api.post(URL, {"name": "big", "command": "run", **extra}, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()[_field(case)] == [message]
    assert Job.objects.count() == 0


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_form_refuses_a_job_that_can_never_run(cluster, k80_profile, client, alice, case):
    extra, message = REFUSED[case]
    if "profile" in extra:
        extra = {**extra, "profile": k80_profile.pk}
    client.force_login(alice)
    response = client.post("/jobs/new/", {"name": "big", "command": "run", **extra})
    assert response.status_code == 400
    form = response.context["form"]
    assert form.errors[_field(case)] == [message]
    assert message in response.content.decode()
    assert Job.objects.count() == 0


def test_a_job_that_fits_the_largest_node_is_admitted(cluster, alice_api):
    body = {"name": "fits", "command": "run", "gpus": 4, "gpu_memory_mb": 16000, "cpus": 16}
    response = alice_api.post(URL, body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["waiting_reason"] == ""


def test_with_no_node_registered_the_job_is_accepted_and_says_why_it_waits(
    alice_api, client, alice
):
    response = alice_api.post(URL, {"name": "early", "command": "run", "gpus": 64}, format="json")
    assert response.status_code == 201
    note = "no node is registered yet: the job waits for the first one"
    assert response.json()["waiting_reason"] == note
    client.force_login(alice)
    page = client.post(
        "/jobs/new/", {"name": "early-web", "command": "run", "gpus": 8}, follow=True
    )
    assert f"it is PENDING. Note: {note}." in page.content.decode()
    assert note in client.get(f"/jobs/{response.json()['id']}/").content.decode()


# -- the CLI (in-process, against a live server) ------------------------------------------------


def _cli(url: str, key: str, *args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(args), out=out, err=err, env={"COSCHED_URL": url, "COSCHED_TOKEN": key})
    return code, out.getvalue(), err.getvalue()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_the_cli_prints_each_refused_field(
    live_server, cluster, k80_profile, alice, tmp_path, case
):
    _, key = token_create(alice, name="ci")
    extra, message = REFUSED[case]
    job_file = tmp_path / "job.yaml"
    job_file.write_text(
        "name: big\ncommand: run\n" + "".join(f"{k}: {v}\n" for k, v in extra.items())
    )
    code, out, err = _cli(live_server.url, key, "submit", str(job_file))
    assert code == cli.EXIT_BAD_INPUT
    assert "the server rejected the job:" in err
    assert f"  {_field(case)}: {message}" in err.splitlines()
    assert Job.objects.count() == 0


# -- waiting reasons ------------------------------------------------------------------------------

REASON = "needs 8 V100 at once; 5 free; 3 busy until about 14:20 when job 812 is predicted to end"


@pytest.fixture
def waiting_job(alice):
    job, _ = job_submit(alice, name="queued", command="run")
    Job.objects.filter(pk=job.pk).update(waiting_reason=REASON)
    return job


def test_the_api_shows_the_waiting_reason_of_a_pending_job(waiting_job, alice_api):
    assert alice_api.get(f"{URL}{waiting_job.pk}/").json()["waiting_reason"] == REASON
    assert alice_api.get(URL).json()["results"][0]["waiting_reason"] == REASON


def test_a_job_that_left_the_queue_has_no_waiting_reason(waiting_job, alice_api):
    Job.objects.filter(pk=waiting_job.pk).update(state="RUNNING")
    assert alice_api.get(f"{URL}{waiting_job.pk}/").json()["waiting_reason"] is None


def test_the_pages_show_the_waiting_reason_next_to_the_state(waiting_job, client, alice):
    client.force_login(alice)
    detail = client.get(f"/jobs/{waiting_job.pk}/").content.decode()
    badge_then_reason = re.search(
        r'id="job-state">PENDING</span></h1>\s*<p class="waiting-reason" id="job-waiting-reason">'
        r'<span class="label">Waiting:</span> <span id="job-waiting-text">([^<]*)</span>',
        detail,
    )
    assert badge_then_reason and badge_then_reason.group(1) == REASON
    listing = client.get("/jobs/").content.decode()
    assert re.search(
        r'PENDING</span><div class="waiting-reason small" title="[^"]*">needs 8 V100 at once',
        listing,
    )


@pytest.mark.django_db(transaction=True)
def test_the_cli_shows_the_waiting_reason(live_server, alice):
    _, key = token_create(alice, name="ci")
    job, _ = job_submit(alice, name="queued", command="run")
    Job.objects.filter(pk=job.pk).update(waiting_reason=REASON)
    code, out, _ = _cli(live_server.url, key, "status", str(job.pk))
    assert code == 0
    assert re.search(rf"^waiting\s+{re.escape(REASON)}$", out, re.M), out
    code, out, _ = _cli(live_server.url, key, "jobs", "--reason-width", "0")
    assert code == 0
    header, row = out.splitlines()[:2]
    assert header.split()[-2:] == ["WAITING", "BECAUSE"]
    assert row.endswith(REASON) and row.startswith(f"{job.pk}  ")
    code, out, _ = _cli(live_server.url, key, "jobs")
    assert out.splitlines()[1].endswith(REASON[:69] + "…")

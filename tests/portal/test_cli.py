"""The ``cosched`` CLI: job files, exit codes, and a round trip through the real console script
against a live test server (submit, status, jobs, cancel, wait)."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from rest_framework.test import APIClient

from portal import cli
from portal.core.models import ApplicationProfile, Job
from portal.core.services import job_submit, job_transition
from portal.core.states import JobState
from portal.front.services import token_create

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "cosched"
JOB_YAML = """\
# nightly LAMMPS run, submitted by CI
name: lammps-nightly
command: lmp -in in.melt
gpus: 1
gpu_memory_mb: 2400
cpus: 2
kind: hpc
priority: 3
params:
  steps: 5000
"""


def run_cli(*args: str, url: str, token: str, stdin: str | None = None) -> SimpleNamespace:
    """Run the installed ``cosched`` script (or ``python -m portal.cli``) in a subprocess."""
    command = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "portal.cli"]
    env = {**os.environ, "COSCHED_URL": url, "COSCHED_TOKEN": token}
    done = subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        input=stdin,
        timeout=60,
    )
    return SimpleNamespace(code=done.returncode, out=done.stdout, err=done.stderr)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- job files and the module itself ----------------------------------------------------------


def test_the_cli_package_needs_no_django():
    """portal/cli/ loads and runs with Django made unimportable."""
    code = (
        "import sys\n"
        "sys.modules['django'] = None\n"
        "import portal.cli\n"
        "argv = ['--url', 'http://127.0.0.1:1', '--retries', '0', 'status', '1']\n"
        "sys.exit(portal.cli.main(argv))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == cli.EXIT_AUTH, done.stderr
    assert "no API token" in done.stderr


def test_python_dash_m_runs_the_cli():
    """``python -m portal.cli`` is the console script (tests use it when none is installed)."""
    done = subprocess.run(
        [sys.executable, "-m", "portal.cli", "--url", "http://127.0.0.1:1", "status", "1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert done.returncode == cli.EXIT_AUTH, done.stderr
    assert "no API token" in done.stderr


def test_importing_the_cli_through_the_package_loads_neither_django_nor_celery():
    """``import portal.cli`` (what the console script does) keeps the portal package light."""
    code = (
        "import sys, portal.cli\n"
        "print(sorted(m for m in ('django', 'celery', 'rest_framework') if m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_yaml_and_json_job_files_load(tmp_path):
    yaml_file = tmp_path / "job.yaml"
    yaml_file.write_text(JOB_YAML)
    fields, raw = cli.load_job_file(str(yaml_file))
    assert fields["params"] == {"steps": 5000} and raw == JOB_YAML.encode()
    json_file = tmp_path / "job.json"
    json_file.write_text(json.dumps(fields))
    assert cli.load_job_file(str(json_file))[0] == fields


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("job.yaml", "name: [unclosed\n", "not valid YAML"),
        ("job.json", '{"name": "x",}', "not valid JSON: Expecting property name"),
        ("job.yaml", "- just\n- a list\n", "a job file is a mapping of job fields"),
        ("job.yaml", "", "got an empty file"),
        ("job.yaml", "1: one\n", "field names must be strings"),
    ],
)
def test_bad_job_files_are_readable_errors(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(cli.CliError) as caught:
        cli.load_job_file(str(path))
    assert message in str(caught.value)
    assert caught.value.exit_code == cli.EXIT_BAD_INPUT


def test_a_missing_job_file(tmp_path):
    with pytest.raises(cli.CliError, match="no such file"):
        cli.load_job_file(str(tmp_path / "nope.yaml"))


def test_the_default_idempotency_key_follows_the_file_content():
    assert cli.default_idempotency_key(b"a") == cli.default_idempotency_key(b"a")
    assert cli.default_idempotency_key(b"a") != cli.default_idempotency_key(b"b")
    assert cli.default_idempotency_key(b"a").startswith("cli-")


# -- wait, without a server -------------------------------------------------------------------


class FakeClient:
    """Answers GET /api/v1/jobs/N/ with the next of ``states``; time advances on sleep."""

    def __init__(self, *jobs: dict) -> None:
        self.jobs = list(jobs)
        self.now = 0.0
        self.url = "http://fake"

    def request(self, method, path, **kwargs):
        job = self.jobs.pop(0) if len(self.jobs) > 1 else self.jobs[0]
        return 200, job

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def wait(client: FakeClient, **options) -> tuple[int, str, str]:
    args = SimpleNamespace(**{"id": 7, "timeout": None, "interval": 3.0, "json": False, **options})
    out, err = io.StringIO(), io.StringIO()
    code = cli.cmd_wait(client, args, out, err, clock=lambda: client.now)
    return code, out.getvalue(), err.getvalue()


def test_wait_exits_0_when_the_job_completes_and_logs_each_state_change():
    client = FakeClient(
        {"state": "PENDING"},
        {"state": "RUNNING"},
        {"state": "RUNNING"},
        {"state": "COMPLETED", "exit_code": 0},
    )
    code, out, err = wait(client)
    assert code == cli.EXIT_OK
    assert out == "Job 7 COMPLETED (exit code 0)\n"
    # No spinner off a TTY: one line per change, with the time waited.
    assert err == "job 7: PENDING after 0s\njob 7: RUNNING after 3s\njob 7: COMPLETED after 9s\n"


def test_wait_exits_1_with_the_failure_reason():
    client = FakeClient(
        {"state": "FAILED", "exit_code": 137, "failure_reason": "CUDA out of memory"}
    )
    code, out, _ = wait(client)
    assert code == cli.EXIT_JOB_NOT_COMPLETED
    assert out == "Job 7 FAILED: exit code 137; CUDA out of memory\n"


def test_wait_gives_up_at_the_timeout():
    with pytest.raises(cli.CliError) as caught:
        wait(FakeClient({"state": "PENDING"}), timeout=10.0)
    assert caught.value.exit_code == cli.EXIT_TIMEOUT
    assert "job 7 is still PENDING" in str(caught.value)


# -- round trip against a live server ---------------------------------------------------------


@pytest.fixture
def server(live_server, alice):
    _, key = token_create(alice, name="ci")
    return SimpleNamespace(url=live_server.url, key=key)


@pytest.mark.django_db(transaction=True)
def test_round_trip_submit_then_see_the_job_in_the_api_the_page_and_the_cli(
    server, alice, client, tmp_path
):
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB_YAML)

    submitted = run_cli("submit", str(job_file), url=server.url, token=server.key)
    assert submitted.code == 0, submitted.err
    match = re.match(r"Submitted job (\d+) \(lammps-nightly\): PENDING\n", submitted.out)
    assert match, submitted.out
    job_id = int(match.group(1))
    assert f"{server.url}/jobs/{job_id}/" in submitted.out

    # A CI retry with the same file returns the same job.
    retried = run_cli("submit", str(job_file), url=server.url, token=server.key)
    assert (
        retried.code == 0 and f"Job {job_id} (lammps-nightly) was already submitted" in retried.out
    )
    assert Job.objects.count() == 1

    # The same job through the API...
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {server.key}")
    body = api.get(f"/api/v1/jobs/{job_id}/").json()
    assert (body["name"], body["state"], body["owner"], body["gpus"]) == (
        "lammps-nightly",
        "PENDING",
        "alice",
        1,
    )
    assert body["params"] == {"steps": 5000}
    # ...and on its page.
    client.force_login(alice)
    page = client.get(f"/jobs/{job_id}/").content.decode()
    assert "lammps-nightly" in page and "lmp -in in.melt" in page

    status = run_cli("status", str(job_id), url=server.url, token=server.key)
    assert status.code == 0
    assert "lammps-nightly" in status.out and re.search(r"state\s+PENDING", status.out)
    as_json = json.loads(
        run_cli("status", str(job_id), "--json", url=server.url, token=server.key).out
    )
    assert as_json["id"] == job_id and as_json["priority"] == 3

    listing = run_cli("jobs", url=server.url, token=server.key)
    assert listing.code == 0
    assert re.search(
        rf"^{job_id}\s+PENDING\s+hpc\s+1\s+.*lammps-nightly\s+no node is registered yet",
        listing.out,
        re.M,
    )
    assert (
        "No jobs in state RUNNING."
        in run_cli("jobs", "--state", "running", url=server.url, token=server.key).out
    )

    cancelled = run_cli("cancel", str(job_id), url=server.url, token=server.key)
    assert cancelled.code == 0 and f"Cancelled job {job_id}" in cancelled.out
    assert Job.objects.get(pk=job_id).state == JobState.CANCELLED
    again = run_cli("cancel", str(job_id), url=server.url, token=server.key)
    assert again.code == cli.EXIT_JOB_NOT_COMPLETED and "already CANCELLED" in again.err

    waited = run_cli("wait", str(job_id), url=server.url, token=server.key)
    assert waited.code == cli.EXIT_JOB_NOT_COMPLETED
    assert f"Job {job_id} CANCELLED" in waited.out


@pytest.mark.django_db(transaction=True)
def test_wait_exits_0_for_a_completed_job_and_6_on_timeout(server, alice):
    done, _ = job_submit(alice, name="done", command="true")
    for state in (JobState.SCHEDULED, JobState.RUNNING):
        job_transition(done, state, actor="test")
    job_transition(done, JobState.COMPLETED, actor="test", exit_code=0)
    completed = run_cli("wait", str(done.pk), url=server.url, token=server.key)
    assert completed.code == 0, completed.err
    assert f"Job {done.pk} COMPLETED" in completed.out

    waiting, _ = job_submit(alice, name="waiting", command="true")
    timed_out = run_cli(
        "wait",
        str(waiting.pk),
        "--timeout",
        "0.5",
        "--interval",
        "0.2",
        url=server.url,
        token=server.key,
    )
    assert timed_out.code == cli.EXIT_TIMEOUT
    assert f"job {waiting.pk} is still PENDING" in timed_out.err


@pytest.mark.django_db(transaction=True)
def test_input_errors_are_readable_with_exit_code_2(server, tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("name: [unclosed\n")
    result = run_cli("submit", str(bad_yaml), url=server.url, token=server.key)
    assert result.code == 2
    assert result.err.startswith(f"cosched: {bad_yaml}: not valid YAML")
    assert "Traceback" not in result.err

    rejected = tmp_path / "rejected.yaml"
    rejected.write_text("name: x\ncommand: run\ngpus: -1\ngpu: 1\n")
    result = run_cli("submit", str(rejected), url=server.url, token=server.key)
    assert result.code == 2
    assert "the server rejected the job:" in result.err
    assert re.search(r"^  gpus: .*greater than or equal to 0", result.err, re.M)
    assert re.search(r"^  gpu: unknown field", result.err, re.M)
    assert Job.objects.count() == 0

    missing = run_cli("submit", str(tmp_path / "nope.yaml"), url=server.url, token=server.key)
    assert missing.code == 2 and "no such file" in missing.err


@pytest.mark.django_db(transaction=True)
def test_a_profile_may_be_named_in_the_job_file(server, tmp_path):
    profile = ApplicationProfile.objects.create(name="LAMMPS", kind="hpc", status="approved")
    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: md\ncommand: lmp\nprofile: LAMMPS\n")
    result = run_cli("submit", str(job_file), "-q", url=server.url, token=server.key)
    assert result.code == 0, result.err
    assert Job.objects.get(pk=int(result.out)).profile == profile
    job_file.write_text("name: md\ncommand: lmp\nprofile: NoSuchApp\n")
    unknown = run_cli("submit", str(job_file), url=server.url, token=server.key)
    assert unknown.code == 2 and "profile: no profile is named 'NoSuchApp'" in unknown.err


@pytest.mark.django_db(transaction=True)
def test_auth_not_found_and_connection_errors(server, alice, bob):
    job, _ = job_submit(alice, name="alice-only", command="true")

    wrong = run_cli("jobs", url=server.url, token="cos_wrong-token")
    assert wrong.code == cli.EXIT_AUTH
    assert wrong.err.startswith("cosched: authentication failed (HTTP 401)")
    assert "Traceback" not in wrong.err
    no_token = run_cli("jobs", url=server.url, token="")
    assert no_token.code == cli.EXIT_AUTH and "no API token" in no_token.err

    _, bob_key = token_create(bob, name="ci")
    foreign = run_cli("status", str(job.pk), url=server.url, token=bob_key)
    assert foreign.code == cli.EXIT_NOT_FOUND
    assert f"job {job.pk} not found" in foreign.err
    assert run_cli("cancel", str(job.pk), url=server.url, token=bob_key).code == cli.EXIT_NOT_FOUND
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING

    down = run_cli(
        "jobs", "--retries", "0", url=f"http://127.0.0.1:{free_port()}", token=server.key
    )
    assert down.code == cli.EXIT_SERVER
    assert "connection refused" in down.err and "Traceback" not in down.err


# -- pipelines: logs, submit --wait, completion ----------------------------------------------------


def test_new_log_text_follows_a_sliding_tail():
    assert cli.new_log_text("", "a\nb\n") == "a\nb\n"
    assert cli.new_log_text("a\nb\n", "a\nb\nc\n") == "c\n"
    before = "".join(f"line {i}\n" for i in range(200))
    after = "".join(f"line {i}\n" for i in range(50, 260))  # the tail slid by 50 lines
    assert cli.new_log_text(before, after) == "".join(f"line {i}\n" for i in range(200, 260))
    assert cli.new_log_text("x" * 2000, "y" * 100).startswith("[... output skipped")


class LogClient(FakeClient):
    def __init__(self, *bodies: dict) -> None:
        super().__init__(*bodies)
        self.paths: list[str] = []

    def request(self, method, path, **kwargs):
        self.paths.append(path)
        return super().request(method, path, **kwargs)


def test_logs_follow_prints_each_new_line_once_until_the_job_ends():
    client = LogClient(
        {"state": "RUNNING", "text": "epoch 1\n"},
        {"state": "RUNNING", "text": "epoch 1\nepoch 2\n"},
        {"state": "COMPLETED", "text": "epoch 1\nepoch 2\ndone\n"},
    )
    out, err = io.StringIO(), io.StringIO()
    args = SimpleNamespace(id=7, follow=True, interval=1.0, json=False)
    assert cli.cmd_logs(client, args, out, err) == cli.EXIT_OK
    assert out.getvalue() == "epoch 1\nepoch 2\ndone\n"
    assert err.getvalue() == "job 7 COMPLETED\n"
    assert client.paths == ["/api/v1/jobs/7/log/"] * 3


def test_wait_on_a_terminal_draws_one_progress_line_with_the_reason():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    client = FakeClient(
        {"state": "PENDING", "waiting_reason": "needs 1 V100; 0 free"},
        {"state": "RUNNING"},
        {"state": "COMPLETED", "exit_code": 0},
    )
    out, err = io.StringIO(), Tty()
    args = SimpleNamespace(id=7, timeout=None, interval=3.0, json=False)
    assert cli.cmd_wait(client, args, out, err, clock=lambda: client.now) == cli.EXIT_OK
    screen = err.getvalue()
    assert "\r\033[K| job 7 PENDING  0s  needs 1 V100; 0 free" in screen
    assert "\r\033[Kjob 7: RUNNING after 3s\n" in screen  # each change stays on its own line
    assert screen.endswith("\r\033[K")


def test_completion_scripts_name_every_command():
    script = cli.completion_script("bash")
    assert "complete -o filenames -F _cosched cosched" in script
    for command in ("submit", "status", "wait", "logs", "cancel", "jobs", "completion"):
        assert f"        {command}) opts=" in script
    assert "--wait" in script.split("submit) opts=")[1].split(";;")[0]
    assert cli.completion_script("zsh").startswith("#compdef cosched\nautoload -U +X bashcompinit")
    bash = subprocess.run(
        [
            "bash",
            "-c",
            script + '\nCOMP_WORDS=(cosched lo); COMP_CWORD=1; _cosched; echo "${COMPREPLY[@]}"',
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bash.stdout.split() == ["logs"], bash.stderr


def test_submit_help_documents_the_job_file():
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["submit"].format_help()
    for field in ("name:", "command:", "profile:", "gpus:", "gpu_memory_mb:", "params:"):
        assert field in help_text


@pytest.mark.django_db(transaction=True)
def test_submit_wait_and_logs_against_the_server(server, alice, tmp_path):
    from portal.core import metrics

    job_file = tmp_path / "job.yaml"
    job_file.write_text("name: quick\ncommand: echo hi\n")
    # Nobody runs the job here: --wait gives up at its timeout with the job still PENDING.
    waited = run_cli(
        "submit",
        str(job_file),
        "--wait",
        "--timeout",
        "0.5",
        "--interval",
        "0.2",
        url=server.url,
        token=server.key,
    )
    assert waited.code == cli.EXIT_TIMEOUT
    job_id = int(re.match(r"Submitted job (\d+)", waited.out).group(1))
    assert f"job {job_id}: PENDING after 0s" in waited.err and "still PENDING" in waited.err

    metrics.log_tail_store(job_id, "hello from the node\n")
    logs = run_cli("logs", str(job_id), url=server.url, token=server.key)
    assert logs.code == 0 and logs.out == "hello from the node\n"
    job = Job.objects.get(pk=job_id)
    for state in (JobState.SCHEDULED, JobState.RUNNING):
        job_transition(job, state, actor="test")
    job_transition(job, JobState.COMPLETED, actor="test", exit_code=0)
    followed = run_cli("logs", str(job_id), "-f", url=server.url, token=server.key)
    assert followed.code == 0 and followed.out == "hello from the node\n"
    assert followed.err.endswith(f"job {job_id} COMPLETED\n")
    again = run_cli("submit", str(job_file), "--wait", url=server.url, token=server.key)
    assert again.code == 0 and f"Job {job_id} COMPLETED (exit code 0)" in again.out


def test_status_of_an_elastic_job_names_its_range_current_count_and_last_change():
    from portal.cli import _job_lines

    job = {
        "id": 9,
        "name": "el",
        "state": "RUNNING",
        "gpus": 1,
        "elastic_min_workers": 1,
        "elastic_max_workers": 4,
        "time_limit": 600,
        "attempts": [
            {"attempt": 1, "active": False, "gpus": ["a/0"]},
            {"attempt": 2, "active": True, "gpus": ["a/0", "a/1", "b/0"]},
        ],
        "elastic_changes": [
            {"summary": "1 -> 3 workers (S=0.90)", "applied": True, "refused": ""},
            {"summary": "3 -> 4 workers", "applied": False,
             "refused": "only 0 idle V100 GPU(s), 1 needed"},
        ],
    }  # fmt: skip
    line = next(text for text in _job_lines(job) if text.startswith("elastic"))
    assert line == (
        "elastic     1..4 workers, now 3 (attempt 2); 2 changes, last: 3 -> 4 workers: "
        "not applied: only 0 idle V100 GPU(s), 1 needed"
    )
    assert "time limit  00:10:00 per attempt, regroups included" in _job_lines(job)
    plain = {k: v for k, v in job.items() if not k.startswith("elastic")}
    assert not any(text.startswith("elastic") for text in _job_lines(plain))
    assert "time limit  00:10:00 per attempt" in _job_lines(plain)

"""``cosched submit --sharing/--device/--memory`` and ``cosched history``, through the real
console script against a live test server (docs/jobs.md)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from portal import cli
from portal.core.models import Job, Node
from portal.front.services import token_create
from tests.portal.test_cli import run_cli
from tests.portal.test_job_semantics import _cluster, _finished

JOB = "name: semantics\ncommand: 'true'\ngpus: 1\ngpu_memory_mb: 1000\n"


@pytest.fixture
def server(live_server, alice):
    _, key = token_create(alice, name="ci")
    return SimpleNamespace(url=live_server.url, key=key)


def test_memory_sizes_read_like_sbatch_mem():
    assert [cli._memory_mb(t) for t in ("512", "512M", "16G", "1T", "1.5g", "2048K")] == [
        512,
        512,
        16384,
        1048576,
        1536,
        2,
    ]
    for bad in ("lots", "0", "-1G"):
        with pytest.raises(Exception, match="memory size|at least 1 MB"):
            cli._memory_mb(bad)


@pytest.mark.django_db(transaction=True)
def test_submit_flags_reach_the_job_and_status_shows_them(server, tmp_path):
    _cluster()
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB)
    done = run_cli(
        "submit", str(job_file), "--sharing", "mps", "--device", "auto", "--memory", "2G",
        "-q", url=server.url, token=server.key,
    )  # fmt: skip
    assert done.code == 0, done.err
    job = Job.objects.get(pk=int(done.out))
    assert (job.sharing, job.device, job.memory_mb) == ("mps", "auto", 2048)
    status = run_cli("status", str(job.pk), url=server.url, token=server.key)
    assert re.search(r"^sharing\s+mps$", status.out, re.M), status.out
    assert re.search(r"^device\s+auto$", status.out, re.M)
    assert re.search(r"^memory\s+2048 MB$", status.out, re.M)
    # The defaults: never and gpu; another flag value is another job (not the same key).
    plain = run_cli("submit", str(job_file), "-q", url=server.url, token=server.key)
    other = Job.objects.get(pk=int(plain.out))
    assert other.pk != job.pk and (other.sharing, other.device) == ("never", "gpu")


@pytest.mark.django_db(transaction=True)
def test_a_bad_sharing_or_memory_is_refused_naming_the_field(server, tmp_path):
    _cluster()
    job_file = tmp_path / "job.yaml"
    job_file.write_text(JOB)
    bad = run_cli(
        "submit", str(job_file), "--sharing", "sometimes", url=server.url, token=server.key
    )
    assert bad.code == cli.EXIT_BAD_INPUT and "sharing" in bad.err, bad.err
    huge = run_cli("submit", str(job_file), "--memory", "10T", url=server.url, token=server.key)
    assert huge.code == cli.EXIT_BAD_INPUT and "memory_mb" in huge.err, huge.err
    assert "largest GPU node" in huge.err
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_history_lists_finished_jobs_like_sacct(server, alice, bob):
    _cluster()
    node = Node.objects.get(name="titan")
    failed = _finished(alice, "broke", state="FAILED", ago_h=2, ran_h=1.5, node=node)
    _finished(alice, "fine", state="COMPLETED", ago_h=3, ran_h=1, node=node)
    _finished(alice, "ancient", state="COMPLETED", ago_h=100, ran_h=1, node=node)
    _finished(bob, "bobs", state="FAILED", ago_h=1, ran_h=1, node=node)
    done = run_cli("history", url=server.url, token=server.key)
    assert done.code == 0, done.err
    lines = done.out.splitlines()
    assert lines[0].split() == [
        "ID", "NAME", "USER", "STATE", "EXIT", "ELAPSED", "WAIT", "GPU-H", "NODES", "REASON",
    ]  # fmt: skip
    names = [line.split()[1] for line in lines[1:]]
    assert names == ["broke", "fine"]  # latest finish first; not bob's, not 100 h ago
    row = lines[1].split()
    assert row[0] == str(failed.pk) and row[3:5] == ["FAILED", "1"]
    # elapsed 1.5 h, queued 30 min, 2 GPUs x 1.5 h, on titan, and why it failed.
    assert " ".join(row[5:]) == "1h 30m 30m 00s 3.00 titan exit code 1"
    only = run_cli(
        "history", "--since", "7d", "--state", "COMPLETED", "--json",
        url=server.url, token=server.key,
    )  # fmt: skip
    assert [j["name"] for j in json.loads(only.out)] == ["fine", "ancient"]
    bad = run_cli("history", "--since", "whenever", url=server.url, token=server.key)
    assert bad.code == cli.EXIT_BAD_INPUT and "finished_since" in bad.err

"""``manage.py migrate`` on a running system does not stop jobs (issue 27, docs/upgrade.md).

Two checks. The live one: a job runs under a real node agent (a separate process syncing with
the portal over HTTP) while ``manage.py migrate`` runs in another process, taking the newest
core migration off and putting it back: while the schema is behind the portal's code the
agent's syncs fail, and the job runs on regardless and completes, once, with its exit code.
The static one: every migration's SQL on PostgreSQL (``sqlmigrate``) is read for the
statements that rewrite or lock a large table for a scan; only the ones listed in
``REVIEWED`` (each with why it is acceptable) may do so, so a new migration that would hold
the job tables must be split (docs/upgrade.md) or reviewed here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django.apps import apps
from django.db import connection
from django.db.migrations.loader import MigrationLoader

from portal.core.models import Job, JobEvent, Node
from portal.core.scheduling import run_cycle
from portal.core.services import job_submit
from tests.processes import cpu_agent_command, subprocess_database_url

REPO = Path(__file__).resolve().parents[2]
OUR_APPS = ("core", "front", "ml", "replay", "teams")

# Tables that grow with use (one row per job, event, sample, log chunk...): a statement that
# rewrites one, or scans it under an exclusive lock, holds every request and sync for its length.
LARGE_TABLES = {
    "core_job",
    "core_jobevent",
    "core_placement",
    "core_placementpart",
    "core_metricsample",
    "core_gpureading",
    "core_joblogchunk",
    "core_jobobservation",
    "core_outboxmessage",
}

# (app, migration) -> what it holds and why that is acceptable. Measured on PostgreSQL 15 with a
# job table of a million rows (434 MB; docs/upgrade.md): a CHECK scan holds the table about
# 0.25 s, an index build blocks writes about 0.6 s; agents' leases last 20 s. Each entry was
# written before this rule: a new migration that holds a large table is split instead.
_CHECK = "a CHECK on a new column (a scan under an exclusive lock)"
# A NOT NULL column added without a database default (Django drops the default it added the
# column with): the older portal, still running until its restart, omits the column from its
# INSERTs, which fail until then. A field gets ``db_default`` instead.
_NO_DB_DEFAULT = "a NOT NULL column without a database default (older code cannot insert)"
_OLD_INSERTS = "older code's inserts fail until its restart"
REVIEWED = {  # migration -> (statements found, what they hold)
    ("core", "0002_job_waiting_reason"): (1, f"core_job: {_OLD_INSERTS}"),
    ("core", "0004_attempts_leases_outbox"): (4, f"core_placement: {_CHECK}; {_OLD_INSERTS}"),
    ("core", "0005_time_limits_preemption"): (1, f"core_job: {_CHECK}"),
    ("core", "0008_job_project"): (1, "core_job: an index on project_id (writes wait)"),
    ("core", "0009_elastic_training"): (3, f"core_job: two of {_CHECK}; {_OLD_INSERTS}"),
    ("core", "0011_placement_master_port"): (2, f"core_placement: {_CHECK}, a unique index"),
    ("core", "0013_job_oom_with"): (3, f"core_job: {_CHECK}; {_OLD_INSERTS}"),
    ("core", "0015_job_sharing_device"): (2, f"core_job: {_OLD_INSERTS}"),
    ("core", "0016_job_control"): (8, f"core_job: two of {_CHECK}, an index; {_OLD_INSERTS}"),
    ("core", "0018_measured"): (1, f"core_placement: {_OLD_INSERTS}"),
}

_DANGEROUS = [
    (re.compile(r"ALTER COLUMN \S+ TYPE", re.I), "changes a column's type (rewrites the table)"),
    (re.compile(r"ALTER COLUMN \S+ SET NOT NULL", re.I), "SET NOT NULL (scans under lock)"),
    (re.compile(r"^CREATE (UNIQUE )?INDEX (?!CONCURRENTLY)", re.I), "a non-concurrent index"),
    (re.compile(r"ADD COLUMN .* CHECK", re.I), "a new CHECK constraint (scans under lock)"),
    (re.compile(r"ADD CONSTRAINT .* CHECK", re.I), "a new CHECK constraint (scans under lock)"),
    (
        re.compile(r"DEFAULT \(?(now|clock_timestamp|random|gen_random_uuid)\(", re.I),
        "a volatile default (rewrites)",
    ),
    (re.compile(r"^(UPDATE|DELETE FROM) ", re.I), "rewrites rows in the migration"),
]


def _table_of(statement: str) -> str | None:
    found = re.search(r'(?:ALTER TABLE|ON|UPDATE|DELETE FROM)\s+"(\w+)"', statement)
    return found.group(1) if found else None


@pytest.mark.django_db
def test_migrations_hold_no_large_table_unless_reviewed():
    from io import StringIO

    from django.core.management import call_command

    loader = MigrationLoader(connection)
    findings: dict[tuple[str, str], list[str]] = {}
    checked = 0
    for app, name in sorted(loader.disk_migrations):
        if app not in OUR_APPS:
            continue
        out = StringIO()
        call_command("sqlmigrate", app, name, stdout=out)
        checked += 1
        created: set[str] = set()  # tables this migration creates: empty, nothing to hold
        for statement in out.getvalue().splitlines():
            new = re.match(r'CREATE TABLE "(\w+)"', statement)
            if new:
                created.add(new.group(1))
                continue
            table = _table_of(statement)
            if table not in LARGE_TABLES or table in created:
                continue
            for pattern, why in _DANGEROUS:
                if pattern.search(statement):
                    findings.setdefault((app, name), []).append(f"{why}: {statement[:160]}")
            if re.search(r"ALTER COLUMN \S+ DROP DEFAULT", statement):
                findings.setdefault((app, name), []).append(f"{_NO_DB_DEFAULT}: {statement[:160]}")
    assert checked >= 20 and apps.get_app_config("core")
    unreviewed = {
        key: found
        for key, found in findings.items()
        if key not in REVIEWED or len(found) != REVIEWED[key][0]
    }
    assert not unreviewed, (
        "migrations that would hold a large table while the system runs; split them "
        "(docs/upgrade.md) or review them in REVIEWED: " + repr(unreviewed)
    )
    # The review list names only migrations that exist and still need it.
    assert set(REVIEWED) <= set(findings), sorted(set(REVIEWED) - set(findings))


def _migrate(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    return subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _newest_and_previous(app: str) -> tuple[str, str]:
    loader = MigrationLoader(connection)
    newest = loader.graph.leaf_nodes(app)[0]
    parents = [p for p in loader.graph.node_map[newest].parents if p[0] == app]
    return newest[1], parents[0][1]


@pytest.mark.django_db(transaction=True)
def test_a_job_runs_through_a_migration(live_server, alice, tmp_path):
    if connection.vendor != "postgresql":
        pytest.fail("this test needs PostgreSQL (make test sets DATABASE_URL)")
    newest, previous = _newest_and_previous("core")
    argv, env = cpu_agent_command("migrating-node", live_server.url, tmp_path)
    log_path = tmp_path / "agent.log"
    log = log_path.open("w")
    agent = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    migrated_back = False
    gate_dir = Path(tempfile.mkdtemp(prefix="cosched-migrate-gate-"))
    gate_dir.chmod(0o755)
    gate = gate_dir / "migrated"
    try:
        deadline = time.monotonic() + 30
        while not Node.objects.filter(name="migrating-node", agent_version__gt=0).exists():
            assert agent.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)

        # The job runs until the test says the migration is over (a file it can see: the
        # job may run as another unix account), so it spans the whole migration however
        # long that takes on a loaded machine; it gives up after two minutes (exit 1).
        command = (
            f"for i in $(seq 600); do [ -e {gate} ] && break; sleep 0.2; done; "
            f"[ -e {gate} ] && echo survived"
        )
        job, _ = job_submit(alice, name="through", command=command, cpus=1)
        deadline = time.monotonic() + 30
        while Job.objects.get(pk=job.pk).state != "RUNNING":
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            run_cycle()
            time.sleep(0.2)

        started = time.time()
        down = _migrate("core", previous)
        migrated_back = down.returncode == 0
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"Unapplying core.{newest}" in down.stdout
        time.sleep(1.0)  # the agent syncs against the older schema meanwhile
        up = _migrate()
        assert up.returncode == 0, up.stdout + up.stderr
        assert f"Applying core.{newest}" in up.stdout
        migrated_back = False
        finished_migrating = time.time()
        gate.touch()

        deadline = time.monotonic() + 60
        while Job.objects.get(pk=job.pk).state != "COMPLETED":
            state = Job.objects.get(pk=job.pk).state
            assert state in ("RUNNING", "COMPLETED"), f"{state}: {log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            run_cycle()
            time.sleep(0.3)
        job.refresh_from_db()
        assert job.exit_code == 0
        # It ran once, from before the migration began until after it ended.
        assert job.placements.count() == 1
        states = list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True))
        assert states.count("RUNNING") == 1 and "PENDING" in states
        assert job.started_at.timestamp() < started
        assert job.finished_at.timestamp() > finished_migrating
        # The agent met the older schema (a sync failed meanwhile) and went on.
        agent_log = log_path.read_text()
        assert agent.poll() is None, agent_log[-3000:]
        assert "sync failed" in agent_log and "sync works again" in agent_log, agent_log[-3000:]
    finally:
        if migrated_back:
            _migrate()
        gate.touch()
        agent.terminate()
        agent.wait(15)
        log.close()
        shutil.rmtree(gate_dir, ignore_errors=True)

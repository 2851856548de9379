"""The documented backup and restore (docs/maintenance.md): ``deploy/backup.sh once`` dumps the
real PostgreSQL database the portal uses, and the documented ``pg_restore`` command brings it
back into an empty database with the same rows; retention deletes old dumps only."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from django.db import connection

from portal.core.models import Job
from portal.core.services import job_submit

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "backup.sh"


def _pg_env(database: str) -> dict[str, str]:
    settings = connection.settings_dict
    return {
        **os.environ,
        "PGHOST": settings["HOST"] or "127.0.0.1",
        "PGPORT": str(settings["PORT"] or 5432),
        "PGUSER": settings["USER"] or "postgres",
        "PGPASSWORD": settings["PASSWORD"] or "",
        "PGDATABASE": database,
    }


@pytest.mark.django_db(transaction=True)
def test_backup_then_restore_gives_the_same_rows(alice, tmp_path):
    if connection.vendor != "postgresql":
        pytest.fail("this test needs the PostgreSQL test database (make test sets it)")
    for i in range(3):
        job_submit(alice, name=f"kept-{i}", command="true")
    source = connection.settings_dict["NAME"]
    backups = tmp_path / "backups"
    backups.mkdir()
    stale = backups / "cosched-20000101T000000Z.dump"
    stale.write_bytes(b"old")
    os.utime(stale, (time.time() - 30 * 86400,) * 2)
    other = backups / "notes.txt"
    other.write_text("not a dump")
    os.utime(other, (time.time() - 30 * 86400,) * 2)

    env = {**_pg_env(source), "BACKUP_DIR": str(backups), "BACKUP_KEEP_DAYS": "14"}
    done = subprocess.run(["sh", str(SCRIPT), "once"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    dumps = sorted(backups.glob("cosched-*.dump"))
    assert len(dumps) == 1 and dumps[0] != stale  # the old one went, the new one is whole
    assert other.exists() and not list(backups.glob("*.partial"))
    assert "backup: " in done.stdout

    target = f"{source}_restore"
    admin = _pg_env("postgres")
    subprocess.run(["dropdb", "--if-exists", target], env=admin, check=True)
    subprocess.run(["createdb", target], env=admin, check=True)
    try:
        restore = subprocess.run(
            ["pg_restore", "--clean", "--if-exists", "--no-owner", "-d", target, str(dumps[0])],
            env=admin,
            capture_output=True,
            text=True,
        )
        assert restore.returncode == 0, restore.stderr
        query = "SELECT name FROM core_job ORDER BY name"
        rows = subprocess.run(
            ["psql", "-At", "-d", target, "-c", query],
            env=admin,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert (
            rows
            == sorted(Job.objects.values_list("name", flat=True))
            == [
                "kept-0",
                "kept-1",
                "kept-2",
            ]
        )
        migrations = subprocess.run(
            ["psql", "-At", "-d", target, "-c", "SELECT count(*) FROM django_migrations"],
            env=admin,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM django_migrations")
            assert int(migrations) == cursor.fetchone()[0]
    finally:
        subprocess.run(["dropdb", "--if-exists", target], env=admin, check=False)


def test_a_failed_dump_leaves_nothing_and_says_so(tmp_path):
    env = {
        **os.environ,
        "PGHOST": "127.0.0.1",
        "PGUSER": "postgres",
        "PGDATABASE": "no_such_database_for_backup",
        "BACKUP_DIR": str(tmp_path),
    }
    done = subprocess.run(["sh", str(SCRIPT), "once"], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "pg_dump failed" in done.stderr
    assert list(tmp_path.iterdir()) == []

"""Settings from the environment: ``manage.py check --deploy`` is clean with deployment
variables set."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL"}
    }
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_check_deploy_is_clean_with_deployment_variables(tmp_path):
    env = {
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "0",
        "ALLOWED_HOSTS": "cosched.example.org",
        "DATABASE_URL": "postgres://cosched:secret@127.0.0.1:5432/cosched",
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "STATIC_ROOT": str(tmp_path / "static"),
        "COSCHED_DATA_DIR": str(tmp_path),
    }
    result = _run(["check", "--deploy", "--fail-level", "WARNING"], env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "System check identified no issues" in output
    assert "WARNING" not in output and "?:" not in output


def test_check_deploy_warns_about_the_embedded_defaults(tmp_path):
    """Without deployment variables (DEBUG on, development key) --deploy does complain."""
    result = _run(
        ["check", "--deploy", "--fail-level", "WARNING"], {"COSCHED_DATA_DIR": str(tmp_path)}
    )
    assert result.returncode != 0
    assert "security.W018" in result.stdout + result.stderr  # DEBUG on

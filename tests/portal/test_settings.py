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


def _python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in {"DEBUG", "SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL", "REDIS_URL"}
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**clean, "DJANGO_SETTINGS_MODULE": "portal.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


STATIC_PROBE = """
import warnings
warnings.simplefilter("always")
import django
django.setup()
from django.test import Client
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    response = Client().get("/static/css/cosched.css")
print(response.status_code)
print(sum(1 for w in caught if "No directory at" in str(w.message)))
"""


def test_development_serves_static_files_without_collectstatic_or_warning(tmp_path):
    """DEBUG on (the embedded default): CSS comes from static/ and a missing STATIC_ROOT is
    not worth a warning."""
    done = _python(
        STATIC_PROBE,
        {"STATIC_ROOT": str(tmp_path / "never-collected"), "COSCHED_DATA_DIR": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    status, warned = done.stdout.split()
    assert (status, warned) == ("200", "0"), done.stdout + done.stderr


def test_a_deployment_without_collectstatic_still_warns(tmp_path):
    """DEBUG off: only the collected STATIC_ROOT is served, so its absence is reported."""
    done = _python(
        STATIC_PROBE,
        {
            "SECRET_KEY": secrets.token_urlsafe(50),
            "DEBUG": "0",
            "ALLOWED_HOSTS": "testserver",
            "SECURE_SSL_REDIRECT": "0",
            "STATIC_ROOT": str(tmp_path / "never-collected"),
            "COSCHED_DATA_DIR": str(tmp_path),
        },
    )
    assert done.returncode == 0, done.stderr
    status, warned = done.stdout.split()
    assert status == "404" and int(warned) >= 1, done.stdout + done.stderr


def test_django_processes_load_the_configured_celery_app(tmp_path):
    """The Celery app is loaded by Django's app registry (not by ``import portal``), so a web
    process enqueues to REDIS_URL rather than to Celery's built-in default app."""
    code = (
        "import sys, django\n"
        "import portal\n"
        "print('portal.celery' in sys.modules)\n"
        "django.setup()\n"
        "from celery import current_app\n"
        "print('portal.celery' in sys.modules, current_app.main, current_app.conf.broker_url)\n"
    )
    redis_url = "redis://127.0.0.1:6379/9"
    done = _python(code, {"REDIS_URL": redis_url, "COSCHED_DATA_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.strip().splitlines()
    assert before == "False"
    assert after == f"True cosched {redis_url}"


def test_celery_command_line_finds_the_app_with_dash_a_portal(tmp_path):
    """``celery -A portal ...`` (docker-compose.yml) finds the app in portal.celery."""
    celery = Path(sys.executable).parent / "celery"
    clean = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DATABASE_URL"}}
    redis_url = "redis://127.0.0.1:6379/9"
    done = subprocess.run(
        [str(celery), "-A", "portal", "report"],
        cwd=ROOT,
        env={**clean, "REDIS_URL": redis_url, "COSCHED_DATA_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"CELERY_BROKER_URL: '{redis_url}'" in done.stdout


def test_rate_limit_counters_are_shared_through_redis_when_there_is_one(tmp_path):
    """With REDIS_URL the cache (the API throttles' counters) is Redis, shared by every web
    worker (Django's Redis cache, degrading while Redis is down: portal.core.cache); without
    it, process memory."""
    code = (
        "import django; django.setup()\n"
        "from django.conf import settings\n"
        "print(settings.CACHES['default']['BACKEND'])\n"
    )
    env = {"COSCHED_DATA_DIR": str(tmp_path)}
    shared = _python(code, {**env, "REDIS_URL": "redis://127.0.0.1:6379/13"})
    assert shared.stdout.strip() == "portal.core.cache.ResilientRedisCache", shared.stderr
    local = _python(code, env)
    assert local.stdout.strip() == "django.core.cache.backends.locmem.LocMemCache", local.stderr

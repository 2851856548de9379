"""The node-side modules stand alone: importable with Django and Celery absent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MODULES = [
    "workers.gpu",
    "workers.gpu.nvml_backend",
    "workers.gpu.virtual_backend",
    "workers.profiles",
    "workers.report_lines",
    "workers.emulate",
    "workers.launcher",
    "workers.slowdown",
    "workers.protocol",
    "workers.runner",
    "workers.agent",
    "workers.sdk",
    "workers.sdk.client",
    "workers.emulate_dp",
]


def test_modules_import_without_django_or_celery():
    code = (
        "import sys\n"
        "for blocked in ('django', 'celery', 'rest_framework', 'redis'):\n"
        "    sys.modules[blocked] = None\n"
        f"for name in {MODULES!r}:\n"
        "    __import__(name)\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"

"""``scheduler`` imports without Django, Celery or Redis (DESIGN.md, "The one rule")."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import scheduler

BLOCKED = ("django", "celery", "redis", "kombu", "rest_framework", "portal", "workers")

_SCRIPT = f"""
import importlib, pkgutil, sys
for name in {BLOCKED!r}:
    sys.modules[name] = None  # any import of it, or of a submodule, raises ImportError
import scheduler
imported = []
for info in pkgutil.walk_packages(scheduler.__path__, "scheduler."):
    importlib.import_module(info.name)
    imported.append(info.name)
print(len(imported))
"""


def test_every_scheduler_module_imports_without_django_celery_redis():
    root = Path(scheduler.__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout.strip()) >= 10  # the walk did find the package's modules


def test_policies_read_no_clock():
    policies = Path(scheduler.__file__).resolve().parent / "policies"
    for path in policies.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] not in ("time", "datetime"), f"{path.name} reads a clock"

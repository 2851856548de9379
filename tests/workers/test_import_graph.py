"""The portal and the node agents share one protocol module and nothing else (STYLE.md 7): the
import graph between ``portal`` and ``workers`` has no circle.

Read from the source (every ``import``, also inside functions), not from ``sys.modules``, so
a lazy import cannot hide an edge.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What portal code may import from workers: the protocol, and two pure helpers that import
# nothing of portal or Django (checked below), so no edge leads back: the definition of the
# live Slow-Down metrics (used by portal.core.metrics) and the log tail reader (portal.api); and
# the training SDK's wire format (workers.sdk.client: the jobs' side of portal.core.training).
PORTAL_MAY_IMPORT = {
    "workers.protocol",
    "workers.slowdown",
    "workers.launcher",
    "workers.sdk.client",
    # Container image references and the allow-list (submit-time checks, docs/containers.md).
    "workers.containers",
}
# The one place that hosts agents inside the portal's process: the embedded default.
AGENT_HOSTS = {
    "portal/core/management/commands/run_embedded.py": {
        "workers.agent",
        "workers.gpu.virtual_backend",
        "workers.isolation",  # --run-jobs-as: the agents' job accounts, as the agent's option
        "workers.tasks",
    }
}
# The Celery task wrappers call portal services (thin tasks); nothing in portal imports them.
WORKERS_MAY_IMPORT_PORTAL = {"workers/tasks.py"}
SERVER_SIDE = ("portal", "django", "celery", "rest_framework")


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _workers_modules(names: set[str]) -> set[str]:
    modules = {p.relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
               for p in (ROOT / "workers").rglob("*.py")}  # fmt: skip
    modules = {m.removesuffix(".__init__") for m in modules}
    return {n for n in names if n in modules and n != "workers"}


def test_portal_imports_only_the_protocol_and_pure_helpers_from_workers():
    offending = {}
    for path in sorted((ROOT / "portal").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        used = _workers_modules(_imports(path))
        extra = used - PORTAL_MAY_IMPORT - AGENT_HOSTS.get(rel, set())
        if extra:
            offending[rel] = sorted(extra)
    assert offending == {}


def test_workers_never_import_the_portal_or_django():
    offending = {}
    for path in sorted((ROOT / "workers").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in WORKERS_MAY_IMPORT_PORTAL:
            continue
        bad = {n for n in _imports(path) if n.split(".")[0] in SERVER_SIDE}
        if bad:
            offending[rel] = sorted(bad)
    assert offending == {}


def test_nothing_imports_the_celery_tasks_but_their_host():
    for path in sorted((ROOT / "portal").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if "workers.tasks" in _imports(path):
            assert rel in AGENT_HOSTS, rel


def test_the_node_side_runs_with_the_server_side_absent():
    """The agent, the runner and the protocol import with Django, Celery, Redis and portal
    blocked: a node needs none of them (Redis only for nudges, imported when used)."""
    modules = ["workers.protocol", "workers.runner", "workers.agent", *sorted(PORTAL_MAY_IMPORT)]
    code = (
        "import sys\n"
        "for blocked in ('django', 'celery', 'rest_framework', 'redis', 'portal'):\n"
        "    sys.modules[blocked] = None\n"
        f"for name in {modules!r}:\n"
        "    __import__(name)\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_runner_needs_only_the_standard_library():
    result = subprocess.run(
        [sys.executable, "-S", "-c", "import sys, workers.runner; "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in ('workers', 'scheduler')))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # workers.isolation (the job's account, files and cgroup) is standard library only too.
    assert result.stdout.strip() == "['workers', 'workers.isolation', 'workers.runner']"

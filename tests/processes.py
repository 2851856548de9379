"""Real processes a test starts beside itself: a node agent, and the URL of the test database
for subprocesses (``manage.py`` commands, the portal's processes) to reach it."""

from __future__ import annotations

from typing import Any


def subprocess_database_url() -> str:
    """``DATABASE_URL`` of the database this test runs on (pytest-django's test database)."""
    from django.db import connection

    db = connection.settings_dict
    return (
        f"postgres://{db['USER'] or 'postgres'}@{db['HOST'] or '127.0.0.1'}:"
        f"{db['PORT'] or 5432}/{db['NAME']}"
    )


def cpu_agent_command(
    name: str, portal_url: str, tmp_path: Any
) -> tuple[list[str], dict[str, str]]:
    """argv and environment of a real node agent (``python -m workers.agent``) for a CPU node
    ``name`` of 2 cores on the virtual backend, syncing with ``portal_url`` every 0.3 s: its
    token (created here) and data directory under ``tmp_path``, jobs run as this account, no
    database or Redis settings in its environment (an agent has none) and no nudges."""
    import os
    import pwd
    import sys

    from portal.core.nodes import node_token_create

    token = tmp_path / f"{name}.token"
    token.write_text(node_token_create(name)[1])
    argv = [sys.executable, "-m", "workers.agent", "--name", name, "--portal", portal_url]
    argv += ["--token-file", str(token), "--backend", "virtual"]
    argv += ["--kind", "cpu", "--cores", "2", "--interval", "0.3"]
    argv += ["--data-dir", str(tmp_path / "data")]
    argv += ["--run-jobs-as", pwd.getpwuid(os.geteuid()).pw_name]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE", "REDIS"))}
    env["COSCHED_NUDGE_URL"] = ""
    return argv, env

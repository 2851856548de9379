"""Nodes of catalogue GPUs written straight into the database, for tests that need the rows an
agent's registration would make without running one."""

from __future__ import annotations

from typing import Any


def catalogue_node(name: str, model: str, count: int, uuid_prefix: str, **fields: Any) -> Any:
    """Node ``name`` (``fields``: its kind, cores, memory...) with ``count`` GPUs of catalogue
    ``model``, GPU i's uuid ``<uuid_prefix>-<i>``."""
    from portal.core.models import Gpu, Node
    from scheduler.catalog import gpu_spec

    node = Node.objects.create(name=name, kind="gpu", **fields)
    spec = gpu_spec(model)
    for index in range(count):
        Gpu.objects.create(
            node=node,
            index=index,
            uuid=f"{uuid_prefix}-{index}",
            model=spec.model,
            architecture=spec.architecture,
            memory_mb=spec.memory_mb,
            sm_count=spec.sm_count,
            sharing_modes=[m.value for m in spec.sharing_modes],
        )
    return node


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

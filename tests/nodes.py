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

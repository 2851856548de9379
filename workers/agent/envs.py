"""The environment of an attempt's processes beyond ``workers.launcher``'s: the runner's own, and
the launcher variables of a multi-process attempt (one process per node, or one per GPU)."""

from __future__ import annotations

from typing import Any

from workers.launcher import is_portal_variable
from workers.protocol import AttemptSpec

RUNNER_ENV_KEEP = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "TMPDIR"})


def runner_env(agent_env: Any) -> dict[str, str]:
    """The environment a runner starts with: ``RUNNER_ENV_KEEP`` and ``LC_*`` of the agent's
    own (the agent adds its marker, the attempt directory and ``PYTHONPATH``)."""
    return {
        k: v
        for k, v in agent_env.items()
        if (k in RUNNER_ENV_KEEP or k.startswith("LC_")) and not is_portal_variable(k)
    }


def master_port(spec: AttemptSpec) -> int:
    """``MASTER_PORT`` of an attempt: the portal's choice (unique among the attempts whose rank
    0 is on that node, ``portal.core.ports``); from a portal that sends none, one derived from
    the job id and attempt number (29500-30499)."""
    if spec.master_port is not None:
        return spec.master_port
    return 29500 + (spec.job_id % 100) * 10 + spec.attempt % 10


def gang_env(spec: AttemptSpec) -> dict[str, str]:
    """The launcher environment of a multi-process attempt (PyTorch's and Horovod's names):
    ``MASTER_ADDR`` (node rank 0's address), ``MASTER_PORT``, ``WORLD_SIZE``, ``NODE_RANK`` /
    ``GROUP_RANK`` (this node's rank), ``LOCAL_WORLD_SIZE`` and ``COSCHED_NODES`` (every node,
    rank order). One process per node: ``WORLD_SIZE`` is the node count and ``RANK`` the node
    rank, ``LOCAL_RANK`` 0; empty for a single-node attempt. One per GPU
    (``spec.process_per_gpu``, elastic jobs): ``WORLD_SIZE`` counts the GPUs of every node and
    each process's ``RANK`` / ``LOCAL_RANK`` / GPU come from ``rank_envs``; set even on one
    node."""
    if not spec.is_gang and not spec.process_per_gpu:
        return {}
    master = spec.parts[0]
    env = {
        "MASTER_ADDR": master.address or master.node,
        "MASTER_PORT": str(master_port(spec)),
        "WORLD_SIZE": str(spec.world_size),
        "NODE_RANK": str(spec.node_rank),
        "GROUP_RANK": str(spec.node_rank),
        "COSCHED_NODES": ",".join(p.node for p in spec.parts),
    }
    if spec.process_per_gpu:
        env["LOCAL_WORLD_SIZE"] = str(max(1, len(spec.part.gpu_indices)))
    else:
        env.update(RANK=str(spec.node_rank), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    return env


def rank_envs(spec: AttemptSpec, env: dict[str, str], node: str) -> list[dict[str, str]] | None:
    """What each process of a ``process_per_gpu`` part adds to the part's environment ``env``:
    ``RANK`` (global: node ranks in order, GPUs in order within a node), ``LOCAL_RANK``, its own
    GPU in ``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES`` (one entry of the part's list)
    and ``COSCHED_GPU`` (``node/index``). None: one process for the part."""
    gpus = spec.part.gpu_indices
    if not spec.process_per_gpu or len(gpus) < 1:
        return None
    visible = env.get("CUDA_VISIBLE_DEVICES", "").split(",")
    if not _one_entry_per_gpu(spec, env):  # a MIG instance or a shared GPU: one entry for all
        visible = [",".join(visible)] * len(gpus)
    return [
        {
            "RANK": str(spec.first_rank + i),
            "LOCAL_RANK": str(i),
            "CUDA_VISIBLE_DEVICES": visible[i],
            "NVIDIA_VISIBLE_DEVICES": visible[i],
            "COSCHED_GPU": f"{node}/{index}",
        }
        for i, index in enumerate(gpus)
    ]


def process_gpus(spec: AttemptSpec, env: dict[str, str]) -> list[tuple[int, ...]]:
    """The GPU indices each process of the attempt's part holds, in start order (as
    ``rank_envs``): one process with the part's GPUs (none for a CPU part), or one per GPU with
    its own, or, where the ranks share one ``CUDA_VISIBLE_DEVICES`` entry (``rank_envs``), each
    with all of them."""
    gpus = tuple(spec.part.gpu_indices)
    if not spec.process_per_gpu or not gpus:
        return [gpus]
    if not _one_entry_per_gpu(spec, env):
        return [gpus] * len(gpus)
    return [(index,) for index in gpus]


def _one_entry_per_gpu(spec: AttemptSpec, env: dict[str, str]) -> bool:
    """Whether the part's ``CUDA_VISIBLE_DEVICES`` names each of its GPUs on its own (so each
    rank gets its own), rather than one entry for all (a MIG instance, a shared GPU)."""
    return len(env.get("CUDA_VISIBLE_DEVICES", "").split(",")) == len(spec.part.gpu_indices)

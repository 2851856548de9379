"""``hetero_srtf``'s view of the cluster's GPUs (step 5 of ``scheduler.policies.hetero_srtf``):
per-node facts cached between cycles (``NodeFacts``), the free GPUs of one model bucketed by
node for best fits (``FreeGpus``), the snapshot left after a plan for the framework's fallback
(``residual_nodes``), and two small helpers (``may_pack``, ``fmt_h``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from scheduler.domain import (
    SHARING_ALLOWED,
    ClusterState,
    Decision,
    JobSpec,
    NodeState,
    Placement,
    SharingMode,
)


class NodeFacts:
    """What the policy reads of one up GPU node (cached per ``NodeState`` object)."""

    __slots__ = ("state", "model", "spec", "size", "idle", "shared")

    def __init__(self, n: NodeState) -> None:
        self.state = n
        self.spec = n.gpus[0].spec
        self.model = self.spec.model
        self.size = len(n.gpus)
        gpus = n.gpus
        self.idle = tuple([g.index for g in gpus if not g.job_ids])
        self.shared = bool([g for g in gpus if len(g.job_ids) > 1])


class FreeGpus:
    """Free GPUs of one model: by node, and nodes bucketed by their free count (node order
    kept within a bucket), so a best fit costs O(GPUs per node), not O(nodes)."""

    def __init__(self) -> None:
        self.free: dict[str, list[int]] = {}
        self.buckets: dict[int, dict[str, None]] = {}
        self.n = 0

    def total(self) -> int:
        return self.n

    def _move(self, node: str, old: int, new: int) -> None:
        if old:
            b = self.buckets[old]
            del b[node]
            if not b:
                del self.buckets[old]
        if new:
            self.buckets.setdefault(new, {})[node] = None

    def fill(self, node: str, indices: list[int]) -> None:
        """Set ``node``'s free GPUs (a node not seen yet)."""
        if indices:
            self.free[node] = indices
            self.n += len(indices)
            self.buckets.setdefault(len(indices), {})[node] = None

    def add(self, node: str, index: int) -> None:
        lst = self.free.setdefault(node, [])
        if index in lst:
            return
        lst.append(index)
        lst.sort()
        self.n += 1
        self._move(node, len(lst) - 1, len(lst))

    def take(self, node: str, k: int) -> tuple[int, ...]:
        lst = self.free[node]
        idx = tuple(lst[:k])
        del lst[:k]
        self.n -= len(idx)
        self._move(node, len(lst) + len(idx), len(lst))
        if not lst:
            del self.free[node]
        return idx

    def best_fit(self, k: int, ok: Callable[[str], bool]) -> str | None:
        """The node with the fewest free GPUs, at least ``k``, that ``ok`` accepts."""
        for count in sorted(c for c in self.buckets if c >= k):
            for node in self.buckets[count]:
                if ok(node):
                    return node
        return None

    def most_free(self, ok: Callable[[str], bool]) -> list[tuple[int, str]]:
        """(free count, node) of the nodes ``ok`` accepts, most free first."""
        out: list[tuple[int, str]] = []
        for count in sorted(self.buckets, reverse=True):
            out.extend((count, node) for node in self.buckets[count] if ok(node))
        return out


def residual_nodes(
    state: ClusterState, requeued: set[str], decisions: Sequence[Decision]
) -> tuple[NodeState, ...]:
    """The snapshot's nodes after ``requeued`` jobs left and ``decisions`` were applied."""
    placed: dict[tuple[str, int], list[tuple[JobSpec | None, Placement]]] = {}
    cores_used: dict[str, int] = {}
    freed: dict[str, float] = {}
    running = {r.job.id: r for r in state.running if r.job.id in requeued}
    for jid in requeued:
        rj = running.get(jid)
        if rj is None:
            continue
        freed[jid] = rj.job.memory_need_mb()
        for part in rj.placement.parts:
            cores_used[part.node] = cores_used.get(part.node, 0) - part.cpus
    pending = {j.id: j for j in state.pending}
    pending.update({jid: running[jid].job for jid in requeued if jid in running})
    for d in decisions:
        pl = d.placement
        cores_used[pl.node] = cores_used.get(pl.node, 0) + pl.cpus  # rank 0 (pl.parts[0])
        for part in pl.more:
            cores_used[part.node] = cores_used.get(part.node, 0) + part.cpus
        entry = (pending.get(pl.job_id), pl)
        for key in pl.gpu_keys:
            got = placed.get(key)
            if got is None:
                placed[key] = [entry]
            else:
                got.append(entry)
    touched = set(cores_used) | {node for node, _ in placed}
    gone_keys: set[tuple[str, int]] = set()
    for jid in requeued:
        rj = running.get(jid)
        if rj is not None:
            gone_keys.update(rj.placement.gpu_keys)
            touched.update(rj.placement.nodes)
    out = []
    for n in state.nodes:
        if n.name not in touched:
            out.append(n)
            continue
        gpus = []
        for g in n.gpus:
            key = (n.name, g.index)
            new = placed.get(key)
            if new is None and key not in gone_keys:
                gpus.append(g)
                continue
            new = new or []
            ids = tuple([j for j in g.job_ids if j not in requeued])
            mem = g.committed_memory_mb - sum([freed.get(j, 0.0) for j in g.job_ids])
            ids += tuple([pl.job_id for _, pl in new])
            mem += sum([j.memory_need_mb() for j, _ in new if j is not None])
            mode = (new[0][1].mode if new else g.mode) if ids else None
            gpus.append(replace(g, job_ids=ids, committed_memory_mb=mem, mode=mode))
        out.append(
            replace(n, free_cores=n.free_cores - cores_used.get(n.name, 0), gpus=tuple(gpus))
        )
    return tuple(out)


def may_pack(job: JobSpec) -> bool:
    """Whether ``job`` may share a GPU under MPS (the only mode this policy packs in): it
    allows sharing (``JobSpec.may_share``) and asks for no other mode (docs/jobs.md)."""
    return job.may_share() and job.sharing in (SHARING_ALLOWED, SharingMode.MPS.value)


def fmt_h(seconds: float) -> str:
    if math.isnan(seconds):
        return "an unknown time"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"

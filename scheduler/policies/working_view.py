"""The working view: a snapshot's capacity, indexed, and updated as one cycle places jobs.

The framework's cycle (``scheduler.policies.framework``) reserves capacity in a
``WorkingView``: light mutable copies of the GPUs and nodes (``WorkGpu``, ``WorkNode`` in
``scheduler.policies.candidate``; not a deep copy of the snapshot) plus per-cycle indexes, so
later jobs in the same cycle see earlier decisions. Indexes: GPUs in *pools* of equivalent GPUs
(same spec, mode, resident job types, committed memory and MIG slices: one pool holds all idle
V100s), which makes the per-job cost grow with the number of distinct GPU situations rather
than the number of GPUs; per model, nodes bucketed by their count of idle GPUs (multi-GPU jobs);
and a per-cycle cache of job *shapes* (GPUs, memory per GPU in MB, cores, allowed models) that
found no fit. Capacity only shrinks during a cycle, so a shape that did not fit, and any larger
one, will not fit later. Gangs use the same buckets: per model, up nodes by idle count, so
choosing the nodes of a gang (``WorkingView.gang``) costs O(GPUs asked x distinct idle counts),
not O(nodes); and per model the sizes of the up nodes (``node_caps``), which say whether a job
is a gang at all.

The view outlives the cycle: the next ``schedule`` call refreshes it, re-indexing only the nodes
whose ``NodeState`` object changed or that a reservation touched (``WorkingView.refresh``), so a
cycle on a large, mostly unchanged cluster costs what changed rather than the number of GPUs.

The view also predicts when busy GPUs free up (``release_times``: the running jobs' predicted
ends), which the waiting reasons and the EASY reservations (``scheduler.policies.reservations``)
quote.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any

from scheduler.domain import (
    ClusterState,
    GpuSpec,
    GpuState,
    JobSpec,
    NodeKind,
    NodeState,
    Placement,
    PlacementPart,
    RunningJob,
    SharingMode,
)
from scheduler.policies.candidate import (
    Candidate,
    Part,
    WorkGpu,
    WorkNode,
    job_type_key,
    mps_owners,
)


class WorkingView:
    """Per-cycle mutable view of a snapshot with the indexes the framework needs.

    Only GPUs that can take a job get a ``WorkGpu`` (idle ones, and with ``colocate`` the
    shared ones): a GPU owned exclusively, or on a node that is down, is counted and skipped,
    so ``WorkNode.gpus`` lists the usable GPUs only.
    """

    def __init__(self, state: ClusterState, *, colocate: bool = True) -> None:
        self.colocate = colocate
        # Distinct GPU specs, indexed by a small integer id (specs are slow to hash). Every
        # spec object met is kept alive in ``_spec_objs`` so its ``id()`` is never reused.
        self.specs: list[GpuSpec] = []
        self._sid_by_obj: dict[int, int] = {}
        self._sid_by_spec: dict[GpuSpec, int] = {}
        self._spec_objs: list[GpuSpec] = []
        self._build(state)

    def _build(self, state: ClusterState) -> None:
        """Index the whole snapshot (the first cycle, or after the node list changed)."""
        self.node_states: list[NodeState] = list(state.nodes)
        self.nodes: list[WorkNode] = []
        self.cpu_nodes: list[WorkNode] = []
        self.gpu_count = 0
        # GPU order = node order * stride + GPU index: cluster order, stable across cycles.
        self.stride = max((len(n.gpus) for n in state.nodes), default=0) + 1
        # Pools of equivalent GPUs; every list sorted by ``WorkGpu.order``.
        self.idle_pools: dict[int, list[WorkGpu]] = {}
        self.shared_pools: dict[tuple[Any, ...], list[WorkGpu]] = {}
        # Per spec id: idle count -> node orders with that many idle GPUs (sorted).
        self.idle_buckets: dict[int, dict[int, list[int]]] = {}
        # Per spec id: (GPUs of it on a node, the node's cores) -> number of such up nodes:
        # whether some node could ever hold a multi-GPU job (else it is a gang).
        self.node_caps: dict[int, dict[tuple[int, int], int]] = {}
        self.node_index: dict[str, int] = {n.name: i for i, n in enumerate(state.nodes)}
        self._running: dict[str, JobSpec] | None = None
        self._state = state
        # Co-run feasibility per (job type key, spec id, mode, resident types); kept across
        # cycles (see ``FrameworkPolicy._co_run_ok``).
        self.co_run_ok: dict[tuple[Any, ...], bool] = {}
        for n_order, node_state in enumerate(state.nodes):
            node = self._make_node(node_state, n_order)
            self.nodes.append(node)
            if node.kind == NodeKind.CPU:
                self.cpu_nodes.append(node)
        self.rebuilt_nodes = len(self.nodes)
        self._new_cycle()

    def _new_cycle(self) -> None:
        self._release: dict[int, dict[tuple[int, int], tuple[float, str] | None]] | None = None
        self._speed = 1.0
        self._release_sorted: dict[int, tuple[list[tuple[float, str]], int]] = {}
        self.failures: dict[tuple[Any, ...], str] = {}
        # The shared pools the last filter call rejected: (GPUs, text naming the pair).
        self.co_run_rejected: list[tuple[int, str]] = []
        # ... and those skipped for an OOM the job had beside their type: (GPUs, text).
        self.oom_rejected: list[tuple[int, str]] = []
        self.touched: set[int] = set()  # orders of the nodes ``reserve`` changed
        self.reserved_now: list[tuple[JobSpec, Placement]] = []  # this cycle's placements

    def refresh(self, state: ClusterState) -> None:
        """Make this view (used for an earlier cycle) a view of ``state``.

        Nodes whose ``NodeState`` is the same object as last time, and that no reservation
        changed, are kept as they are; the others are re-indexed. The simulator and the live
        loop rebuild only the nodes that changed, so a cycle costs what changed, not the
        cluster size. A different node list (names or order) is indexed from scratch.
        """
        nodes = state.nodes
        old = self.node_states
        self._running = None
        self._state = state
        if len(nodes) != len(old) or any(
            a is not b and a.name != b.name for a, b in zip(nodes, old, strict=True)
        ):
            self._build(state)
            return
        self.rebuilt_nodes = 0
        for n_order, node_state in enumerate(nodes):
            if node_state is old[n_order] and n_order not in self.touched:
                continue
            if len(node_state.gpus) >= self.stride:
                self._build(state)
                return
            self._drop_node(n_order)
            node = self._make_node(node_state, n_order)
            if self.nodes[n_order].kind == NodeKind.CPU:
                self.cpu_nodes.remove(self.nodes[n_order])
            self.nodes[n_order] = node
            if node.kind == NodeKind.CPU:
                bisect.insort(self.cpu_nodes, node, key=lambda n: n.order)
            old[n_order] = node_state
            self.rebuilt_nodes += 1
        self._new_cycle()

    def _sid(self, spec: GpuSpec) -> int:
        sid = self._sid_by_obj.get(id(spec))
        if sid is None:
            sid = self._sid_by_spec.setdefault(spec, len(self._sid_by_spec))
            self._sid_by_obj[id(spec)] = sid
            self._spec_objs.append(spec)
            if sid == len(self.specs):
                self.specs.append(spec)
        return sid

    def _resident(self, job_id: str) -> JobSpec:
        if self._running is None:
            self._running = {r.job.id: r.job for r in self._state.running}
        return self._running.get(job_id) or JobSpec(id=job_id)

    def _make_node(self, node_state: NodeState, n_order: int) -> WorkNode:
        """A WorkNode for ``node_state`` with its usable GPUs indexed in the pools."""
        node = WorkNode(node_state, n_order)
        if node.kind == NodeKind.CPU or not node_state.gpus:
            return node
        self.gpu_count += len(node_state.gpus)
        if not node.up:
            return node
        colocate = self.colocate
        base = n_order * self.stride
        sizes = node.size_by_sid
        for gpu_state in node_state.gpus:
            sid = self._sid(gpu_state.spec)
            sizes[sid] = sizes.get(sid, 0) + 1
            busy = bool(gpu_state.job_ids) or gpu_state.mig_slices_used > 0
            if busy and (
                not colocate or gpu_state.mode is None or gpu_state.mode == SharingMode.EXCLUSIVE
            ):
                continue  # cannot take a job this cycle
            jobs = [self._resident(j) for j in gpu_state.job_ids] if gpu_state.job_ids else []
            gpu = WorkGpu(gpu_state, node, base + gpu_state.index, jobs, sid)
            node.gpus.append(gpu)
            if not busy and gpu.committed_mb <= 0:
                gpu.pool_key = ("idle", sid)
                pool = self.idle_pools.get(sid)
                if pool is None:
                    pool = self.idle_pools[sid] = []
                if pool and pool[-1].order > gpu.order:
                    bisect.insort(pool, gpu, key=lambda g: g.order)
                else:
                    pool.append(gpu)
                node.idle_by_sid[sid] = node.idle_by_sid.get(sid, 0) + 1
            else:
                self._add_to_pool(gpu)
        for sid, count in node.idle_by_sid.items():
            lst = self.idle_buckets.setdefault(sid, {}).setdefault(count, [])
            if lst and lst[-1] > n_order:
                bisect.insort(lst, n_order)
            else:
                lst.append(n_order)
        for sid, size in sizes.items():
            caps = self.node_caps.setdefault(sid, {})
            caps[(size, node.cores)] = caps.get((size, node.cores), 0) + 1
        return node

    def _drop_node(self, n_order: int) -> None:
        """Take node ``n_order``'s GPUs out of the pools and buckets."""
        node = self.nodes[n_order]
        state = self.node_states[n_order]
        if node.kind != NodeKind.CPU and state.gpus:
            self.gpu_count -= len(state.gpus)
        for gpu in node.gpus:
            self._remove_from_pool(gpu)
        for sid, size in node.size_by_sid.items():
            caps = self.node_caps[sid]
            left = caps[(size, node.cores)] - 1
            if left:
                caps[(size, node.cores)] = left
            else:
                del caps[(size, node.cores)]

    def spec_pools(self) -> list[tuple[GpuSpec, list[WorkGpu]]]:
        """(spec, idle GPUs of it) for every spec with an idle pool."""
        return [(self.specs[sid], pool) for sid, pool in self.idle_pools.items()]

    # -- pools -------------------------------------------------------------------------------

    @staticmethod
    def _shared_key(gpu: WorkGpu) -> tuple[Any, ...] | None:
        if gpu.idle:
            return ("idle", gpu.sid)
        if gpu.mode is None or gpu.mode == SharingMode.EXCLUSIVE:
            return None  # owned: takes no more jobs
        residents = tuple(sorted(job_type_key(j) for j in gpu.jobs))
        # MPS serves one unix user per GPU: the residents' owners are part of the situation.
        owners = mps_owners(gpu.jobs) if gpu.mode == SharingMode.MPS else None
        # The types a resident was OOM-killed beside (``JobSpec.oom_with``): none may join it.
        shunned = frozenset().union(*(j.oom_with for j in gpu.jobs))
        return (gpu.sid, gpu.mode, residents, gpu.committed_mb, gpu.mig_used, owners, shunned)

    def _add_to_pool(self, gpu: WorkGpu) -> None:
        key = self._shared_key(gpu)
        gpu.pool_key = key
        if key is None:
            return
        if key[0] == "idle":
            pool = self.idle_pools.setdefault(gpu.sid, [])
            gpu.node.idle_by_sid[gpu.sid] = gpu.node.idle_by_sid.get(gpu.sid, 0) + 1
        else:
            pool = self.shared_pools.setdefault(key, [])
        if pool and pool[-1].order > gpu.order:
            bisect.insort(pool, gpu, key=lambda g: g.order)
        else:
            pool.append(gpu)

    def _remove_from_pool(self, gpu: WorkGpu) -> None:
        key = gpu.pool_key
        if key is None:
            return
        if key[0] == "idle":
            pool = self.idle_pools[gpu.sid]
            self._count_idle(gpu.node, gpu.sid, -1)
        else:
            pool = self.shared_pools[key]
        i = bisect.bisect_left(pool, gpu.order, key=lambda g: g.order)
        del pool[i]
        if not pool and key[0] != "idle":
            del self.shared_pools[key]
        gpu.pool_key = None

    def _count_idle(self, node: WorkNode, sid: int, change: int) -> None:
        """``node`` has ``change`` (+1 / -1) idle GPUs of spec id ``sid``: its count and the
        bucket of nodes by idle count (``idle_buckets``) follow."""
        old = node.idle_by_sid.get(sid, 0)
        node.idle_by_sid[sid] = old + change
        buckets = self.idle_buckets.setdefault(sid, {})
        if old > 0:
            lst = buckets[old]
            del lst[bisect.bisect_left(lst, node.order)]
        if old + change > 0:
            bisect.insort(buckets.setdefault(old + change, []), node.order)

    # -- reservation -------------------------------------------------------------------------

    def reserve(self, job: JobSpec, cand: Candidate) -> Placement:
        """Commit ``cand`` for ``job`` in the view (every node of a gang: its GPUs and
        ``job.cpus`` cores on each) and return its Placement."""
        need = job.memory_need_mb()
        parts = cand.parts
        for node, gpus in parts:
            self.touched.add(node.order)
            if node.cores > 0:
                node.free_cores -= job.cpus
            if node.free_memory_mb is not None:
                node.free_memory_mb -= job.memory_mb
            for gpu in gpus:
                self._remove_from_pool(gpu)
                gpu.jobs = [*gpu.jobs, job]
                gpu.committed_mb += need
                gpu.mode = cand.mode
                if cand.mig_profile is not None:
                    gpu.mig_used += cand.mig_profile.compute_slices
                self._add_to_pool(gpu)
        first, first_gpus = parts[0]
        placement = Placement(
            job_id=job.id,
            node=first.name,
            gpu_indices=tuple(g.index for g in first_gpus),
            mode=cand.mode,
            mig_profile=cand.mig_profile.name if cand.mig_profile is not None else None,
            cpus=job.cpus,
            more=tuple(
                PlacementPart(node.name, tuple(g.index for g in gpus), job.cpus)
                for node, gpus in parts[1:]
            ),
        )
        if cand.gpus:
            self.reserved_now.append((job, placement))
            if self._release is not None:  # already indexed this cycle: add it
                end = self._placed_end(job, placement, self._speed)
                self._release_add(self._release, job.id, placement, end)
        return placement

    # -- EASY reservations ---------------------------------------------------------------------

    def container_nodes_up(self) -> bool:
        """Whether some up node runs container jobs (has a container runtime)."""
        return any(n.up and n.containers for n in self.nodes)

    def bar_without_containers(self) -> list[WorkNode]:
        """Bar every node without a container runtime (``WorkNode.has_cores`` is then False
        for it, so no candidate uses it) until ``unbar``; returns those barred now."""
        barred = [n for n in self.nodes if not n.containers and not n.barred]
        for node in barred:
            node.barred = True
        return barred

    def unbar(self, nodes: Sequence[WorkNode]) -> None:
        for node in nodes:
            node.barred = False

    def hide(self, gpus: Sequence[WorkGpu]) -> None:
        """Take ``gpus`` (a reservation's) out of the pools: no candidate uses them until
        ``show_idle``. Their nodes are re-indexed at the next refresh."""
        for gpu in gpus:
            if gpu.pool_key is not None:
                self._remove_from_pool(gpu)
                self.touched.add(gpu.node.order)

    def show_idle(self, gpus: Sequence[WorkGpu]) -> None:
        """Put the idle ones of ``gpus`` (hidden by ``hide``) back in their idle pool, with
        their nodes' idle counts and buckets. Hidden shared GPUs stay hidden."""
        for gpu in gpus:
            if gpu.pool_key is not None or not gpu.idle:
                continue
            bisect.insort(self.idle_pools.setdefault(gpu.sid, []), gpu, key=lambda g: g.order)
            self._count_idle(gpu.node, gpu.sid, +1)
            gpu.pool_key = ("idle", gpu.sid)

    def usable_idle(self, node: WorkNode, sid: int) -> tuple[WorkGpu, ...]:
        """The idle GPUs of spec id ``sid`` on ``node`` that are in the pools (not hidden)."""
        return tuple(g for g in node.gpus if g.sid == sid and g.idle and g.pool_key is not None)

    def free_times(self, sid: int, cpus: int, speed: float) -> list[tuple[float, str, int, int]]:
        """(seconds from now until it is predicted idle, the job predicted to end then ("" if
        idle now), node order, GPU index) for every GPU of spec id ``sid`` on an up node with
        at least ``cpus`` cores (or that does not track cores) whose release is predicted."""
        out: list[tuple[float, str, int, int]] = []
        nodes = self.nodes
        for gpu in self.idle_pools.get(sid, ()):
            node = gpu.node
            if node.cores <= 0 or node.cores >= cpus:
                out.append((0.0, "", node.order, gpu.index))
        for (n_order, idx), release in self.release_times(sid, speed).items():
            if release is None:
                continue
            node = nodes[n_order]
            if node.cores <= 0 or node.cores >= cpus:
                out.append((release[0], release[1], n_order, idx))
        return out

    # -- lookups used by the default filter ----------------------------------------------------

    def first_with_cores(self, pool: Sequence[WorkGpu], cpus: int) -> WorkGpu | None:
        for gpu in pool:
            if gpu.node.has_cores(cpus):
                return gpu
        return None

    def first_node_with_idle(self, sid: int, count: int, cpus: int) -> WorkNode | None:
        """The first node (in order) with exactly ``count`` idle GPUs of spec id ``sid`` and
        ``cpus`` free cores."""
        for n_order in self.idle_buckets.get(sid, {}).get(count, ()):
            node = self.nodes[n_order]
            if node.has_cores(cpus):
                return node
        return None

    def largest_node(self, sid: int, cpus: int) -> int:
        """The most GPUs of spec id ``sid`` one up node holds, over nodes with at least
        ``cpus`` cores (or that do not track cores); 0 if none."""
        return max(
            (size for (size, cores) in self.node_caps.get(sid, {}) if cores <= 0 or cores >= cpus),
            default=0,
        )

    def gang(self, sid: int, k: int, cpus: int) -> Candidate | None:
        """The most consolidated gang of ``k`` idle GPUs of spec id ``sid`` over several nodes
        with ``cpus`` free cores each, or None if there are not enough.

        Fewest nodes first; among those, the fullest nodes (the fewest idle GPUs left on the
        chosen nodes); then cluster order. Nodes are chosen by idle count: at each step the
        node with the fewest idle GPUs that still lets the remaining steps reach ``k`` with the
        largest counts left (fullest first), the first such node in cluster order. Node rank 0
        is the node giving the most GPUs. Cost: O(k x distinct idle counts), whatever the
        cluster size.
        """
        buckets = self.idle_buckets.get(sid)
        if not buckets:
            return None
        # Nodes by idle count, in cluster order, with the cores: at most ceil(k / count) of
        # each count can be useful (that many already reach k on their own).
        by_count: dict[int, list[WorkNode]] = {}
        for count, orders in buckets.items():
            if not orders:
                continue
            useful = -(-k // count)
            found: list[WorkNode] = []
            for n_order in orders:
                node = self.nodes[n_order]
                if node.has_cores(cpus):
                    found.append(node)
                    if len(found) >= useful:
                        break
            if found:
                by_count[count] = found
        counts = sorted(by_count, reverse=True)
        # Fewest nodes: the largest counts first.
        total = steps = 0
        for c in counts:
            for _ in by_count[c]:
                if total >= k:
                    break
                total += c
                steps += 1
        if total < k:
            return None
        left = {c: len(nodes) for c, nodes in by_count.items()}

        def reach(j: int) -> int:
            """The most GPUs ``j`` of the nodes still available can give."""
            got = 0
            for c in counts:
                n = min(j, left[c])
                got += n * c
                j -= n
                if j == 0:
                    break
            return got

        chosen: list[int] = []
        need = k
        for j in range(steps, 0, -1):
            for c in reversed(counts):  # fewest idle first
                if not left[c]:
                    continue
                left[c] -= 1
                if c >= need or c + reach(j - 1) >= need:
                    chosen.append(c)
                    need -= c
                    break
                left[c] += 1
            if need <= 0:
                break
        taken = {c: 0 for c in by_count}
        picked: list[tuple[int, WorkNode]] = []
        for c in chosen:
            picked.append((c, by_count[c][taken[c]]))
            taken[c] += 1
        picked.sort(key=lambda cn: (-cn[0], cn[1].order))
        parts: list[Part] = []
        need = k
        for _, node in picked:
            gpus = self.usable_idle(node, sid)
            take = gpus[: min(need, len(gpus))]
            need -= len(take)
            parts.append((node, take))
        gpus_all = tuple(g for _, gs in parts for g in gs)
        return Candidate(parts[0][0], gpus_all, SharingMode.EXCLUSIVE, gang=tuple(parts))

    def release_times(
        self, sid: int, speed: float
    ) -> dict[tuple[int, int], tuple[float, str] | None]:
        """For every busy GPU of spec id ``sid`` on an up node, ``(node order, GPU index)`` ->
        (seconds from now until its last job is predicted to end, that job's id), or None
        when a job there has no prediction (paused, or no profiled time).

        A running job is predicted to end after ``(1 - progress) x`` its profiled solo time on
        that model (spread over nodes: the unconsolidated time, else the solo time / ``speed``);
        with no progress reported, its solo time minus the time since it started; never after
        its time limit runs out (the node stops it then), which is also the prediction of a job
        with a time limit and no profiled time. Built once
        once per cycle, from the snapshot alone (the same snapshot gives the same answer
        whatever the view's history).
        """
        if self._release is None:
            self._speed = speed
            self._release = self._release_index(speed)
        return self._release.get(sid, {})

    def release_order(self, sid: int, speed: float) -> tuple[list[tuple[float, str]], int]:
        """(the predicted releases of ``release_times(sid)``, soonest first; how many busy
        GPUs of the spec have no prediction). Cached per cycle."""
        cached = self._release_sorted.get(sid)
        if cached is None:
            release = self.release_times(sid, speed)
            known = sorted(v for v in release.values() if v is not None)
            cached = self._release_sorted[sid] = (known, len(release) - len(known))
        return cached

    def _release_index(
        self, speed: float
    ) -> dict[int, dict[tuple[int, int], tuple[float, str] | None]]:
        state = self._state
        now = state.now_s
        out: dict[int, dict[tuple[int, int], tuple[float, str] | None]] = {}
        for r in state.running:
            self._release_add(out, r.job.id, r.placement, self._predicted_end(r, now, speed))
        for job, placement in self.reserved_now:
            self._release_add(out, job.id, placement, self._placed_end(job, placement, speed))
        return out

    def _release_add(
        self,
        out: dict[int, dict[tuple[int, int], tuple[float, str] | None]],
        job_id: str,
        placement: Placement,
        end: float | None,
    ) -> None:
        """Enter a job's GPUs in the release index ``out``, free at ``end`` (absolute time;
        None: unknown). A GPU shared by several jobs is free when the last one ends."""
        now = self._state.now_s
        for node_name, idx in placement.gpu_keys:
            n_order = self.node_index.get(node_name)
            if n_order is None or not self.nodes[n_order].up:
                continue
            gpu = _gpu_at(self.node_states[n_order], idx)
            if gpu is None:
                continue
            sid = self._sid(gpu.spec)
            per_gpu = out.setdefault(sid, {})
            key = (n_order, idx)
            had = key in per_gpu
            old = per_gpu.get(key)
            if end is None:
                new = None
            elif not had or (old is not None and old[0] < end - now):
                new = (max(0.0, end - now), job_id)
            else:
                continue  # an earlier entry ends later (or never predicted): it stays
            per_gpu[key] = new
            ordered = self._release_sorted.get(sid)
            if ordered is not None:  # keep the sorted copy of this spec in step
                known, unknown = ordered
                if had and old is None:
                    unknown -= 1
                elif had and old is not None:
                    del known[bisect.bisect_left(known, old)]
                if new is None:
                    unknown += 1
                else:
                    bisect.insort(known, new)
                self._release_sorted[sid] = (known, unknown)

    def _placed_end(self, job: JobSpec, placement: Placement, speed: float) -> float | None:
        """Predicted end of a job placed in this cycle: now + its solo time there."""
        n_order = self.node_index.get(placement.node)
        if n_order is None:
            return None
        gpus = self.node_states[n_order].gpus
        model = gpus[0].spec.model if gpus else None
        solo = job.run_time_s(model, spread=placement.is_gang, speed=speed)
        if solo is None or not math.isfinite(solo):
            solo = job.time_limit_s  # the node stops it then: an upper bound
        elif job.time_limit_s is not None:
            solo = min(solo, job.time_limit_s)
        if solo is None:
            return None
        return self._state.now_s + solo

    def _predicted_end(self, r: RunningJob, now: float, speed: float) -> float | None:
        """Absolute predicted end of running job ``r`` (see ``release_times``), or None."""
        if r.paused:
            return None
        n_order = self.node_index.get(r.placement.node)
        if n_order is None:
            return None
        gpus = self.node_states[n_order].gpus
        model = gpus[0].spec.model if gpus and r.placement.gpu_indices else None
        solo = r.job.run_time_s(model, spread=r.placement.is_gang, speed=speed)
        # A time limit bounds the end: the node stops the job then (time_limit_s, per attempt;
        # started_s is the current attempt's start).
        limit = r.job.time_limit_s
        bound = None if limit is None else max(now, r.started_s + limit)
        if solo is None or not math.isfinite(solo):
            return bound
        if r.progress > 0:
            end = now + max(0.0, 1.0 - r.progress) * solo
        else:
            end = max(now, r.started_s + solo)
        return end if bound is None else min(end, bound)


def _gpu_at(node: NodeState, index: int) -> GpuState | None:
    """The GPU of ``node`` with ``index`` (GPUs are usually listed in index order)."""
    gpus = node.gpus
    if 0 <= index < len(gpus) and gpus[index].index == index:
        return gpus[index]
    return next((g for g in gpus if g.index == index), None)

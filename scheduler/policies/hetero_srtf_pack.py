"""``hetero_srtf``'s pairs (step 6 of ``scheduler.policies.hetero_srtf``): a job still waiting
joins a GPU (set) that runs exactly one job of the same GPU count, owner and model under MPS
when the estimated pair throughput reaches the threshold, the best pair first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scheduler.domain import (
    Decision,
    GpuSpec,
    JobSpec,
    Placement,
    PlacementPart,
    SharingMode,
)
from scheduler.policies.hetero_srtf_assign import Cand
from scheduler.policies.hetero_srtf_estimates import pair_value, worth_packing
from scheduler.policies.hetero_srtf_gpus import fmt_h, may_pack

#: A group of hosts: (GPU count, model, job type, owner).
GroupKey = tuple[int, str, str | None, str | None]


class _Hosts:
    """The hosts of one group not taken yet, in host order, by the memory their job needs:
    the first host that holds a job's memory is the first untaken of one of these lists
    (usually one per group), so a waiting job never walks the hosts too full for it.

    The members are looked at lazily, in order, as far as a waiting job needs (a group of a
    large cluster holds tens of thousands of hosts; a cycle takes a few of them), and whether
    one may be joined at all only when it could be the answer: ``keys_of(item, host)`` gives
    a member's GPU keys, or None when it may not be joined; by default ``item`` is the keys."""

    def __init__(
        self,
        members: Sequence[tuple[Any, Cand]],
        keys_of: Callable[[Any, Cand], tuple[tuple[str, int], ...] | None] | None = None,
    ) -> None:
        self.members = members
        self.keys_of = keys_of
        self.scanned = 0  # members before this one are filed in by_mem
        self.by_mem: dict[float, list[int]] = {}  # memory -> member numbers, in order
        self.next: dict[float, int] = {}  # memory -> its first member not taken
        self.keys: dict[int, tuple[tuple[str, int], ...] | None] = {}  # looked up so far
        # The smallest memory need that found no host: larger needs find none either (hosts
        # are only ever taken, and the capacity is the group's model's).
        self.none_from = math.inf

    def _keys(self, order: int) -> tuple[tuple[str, int], ...] | None:
        """Member ``order``'s GPU keys, None when it may not be joined (asked once)."""
        if order in self.keys:
            return self.keys[order]
        item, h = self.members[order]
        keys = item if self.keys_of is None else self.keys_of(item, h)
        self.keys[order] = keys
        return keys

    def _scan_one(self) -> tuple[int, float] | None:
        """File the next member by its memory: (its number, its memory); None when every
        member is filed."""
        if self.scanned >= len(self.members):
            return None
        order = self.scanned
        self.scanned += 1
        mem = self.members[order][1].job.memory_need_mb()
        lst = self.by_mem.get(mem)
        if lst is None:
            lst = self.by_mem[mem] = []
            self.next[mem] = 0
        lst.append(order)
        return order, mem

    def first(self) -> Cand | None:
        """The first member that may be joined (taken or not), None if there is none."""
        for order in range(len(self.members)):
            if self._keys(order) is not None:
                return self.members[order][1]
        return None

    def first_fit(
        self, need_mb: float, capacity_mb: float
    ) -> tuple[float, tuple[tuple[str, int], ...], Cand] | None:
        """(memory, GPU keys, host) of the first untaken host with room for ``need_mb``."""
        if need_mb >= self.none_from:
            return None
        best: tuple[int, float] | None = None
        for mem, orders in self.by_mem.items():
            if mem + need_mb > capacity_mb:
                continue
            i = self.next[mem]
            while i < len(orders) and self._keys(orders[i]) is None:
                i += 1  # may not be joined: passed over for good
            self.next[mem] = i
            if i < len(orders) and (best is None or orders[i] < best[0]):
                best = (orders[i], mem)
        # Every member filed so far comes before those not filed yet: with none of them
        # free, fitting and joinable, the first such one further on is the answer.
        while best is None:
            got = self._scan_one()
            if got is None:
                self.none_from = need_mb
                return None
            order, mem = got
            if mem + need_mb <= capacity_mb and self._keys(order) is not None:
                best = got
                self.next[mem] = self.by_mem[mem].index(order, self.next[mem])
        keys = self._keys(best[0])
        assert keys is not None
        return best[1], keys, self.members[best[0]][1]

    def take(self, mem: float) -> None:
        """The host ``first_fit`` gave for ``mem`` is taken."""
        self.next[mem] += 1


def pack_waiting(
    pending: Sequence[Cand],
    started: set[str],
    waiting: dict[str, str],
    hosts: Sequence[tuple[Cand, Placement]],
    gpu_jobs: Mapping[tuple[str, int], tuple[str, ...]],
    specs: Mapping[str, GpuSpec],
    cores: dict[str, int],
    decisions: list[Decision],
    *,
    pair_norms: Callable[[JobSpec, JobSpec, GpuSpec], tuple[float, float] | None],
    threshold: float,
    policy: str,
    basis: str = "estimated",
    shared: set[tuple[str, int]] | None = None,
    fixed: tuple[int, Mapping[GroupKey, Sequence[tuple[Placement, Any]]]] | None = None,
) -> None:
    """Step 6 of ``scheduler.policies.hetero_srtf``: waiting jobs join single-job GPUs (best
    pair); ``pair_norms`` gives the two jobs' co-run speeds on a model (None: not packed),
    ``basis`` says in the decision how they were taken.
    ``shared``: the keys of ``gpu_jobs`` with more than one job, when the caller knows them.
    ``fixed``: (position, groups): more hosts, which come at that position of ``hosts``,
    already filed by (GPU count, model, job type, owner): each a (placement, running job) of
    a job running under MPS that is not a guest (the shared-GPU and may-share tests, and the
    group's model and owner, are checked here as for the others).

    Hosts are grouped by (GPU count, model, job type, owner): the pair value depends only
    on that, so each waiting job looks at the groups, not at every host."""
    Key = tuple[tuple[str, int], ...]
    joiners = [
        c
        for c in pending
        if c.job.id not in started and c.job.id not in waiting and may_pack(c.job)
    ]
    if not joiners:
        return
    # Only hosts of a (GPU count, owner) that some waiting job has can be joined. One pass
    # over the hosts files them by group with the cheap tests; the dearer ones (shared GPUs,
    # whether the host's job may share, its GPU keys) are made lazily, in host order, for the
    # hosts a waiting job actually looks at (``_Hosts``). Non-guest hosts never share a GPU,
    # so no two have the same GPU keys.
    wanted = {(c.gpus, c.job.owner) for c in joiners}
    mps = {m for m, spec in specs.items() if spec.supports(SharingMode.MPS)}
    multi = {k for k, ids in gpu_jobs.items() if len(ids) > 1} if shared is None else shared
    groups: dict[GroupKey, list[tuple[Placement, Any]]] = {}

    def add_fixed() -> None:
        """The caller's filed hosts, in their place in host order (the group tests below
        are the same for every host of a group)."""
        for gkey, members in filed.items():
            k, m, _, owner = gkey
            if m not in mps or (k, owner) not in wanted:
                continue
            got = groups.get(gkey)
            if got is None:
                groups[gkey] = list(members)
            else:
                got.extend(members)

    mps_mode = SharingMode.MPS
    at, filed = fixed if fixed is not None else (len(hosts), {})
    for n_host, (h, pl) in enumerate(hosts):
        if n_host == at:
            add_fixed()
        if h.guest:
            continue
        m = h.placed_model
        if m not in mps:
            continue
        job = h.job
        if (h.gpus, job.owner) not in wanted:
            continue
        if h.running is not None and pl.mode != mps_mode:
            continue  # (a running host's pl is its running placement)
        gkey = (h.gpus, m, job.job_type, job.owner)
        members = groups.get(gkey)
        if members is None:
            members = groups[gkey] = []
        members.append((pl, h))

    if len(hosts) <= at:
        add_fixed()

    def keys_of(pl: Placement, h: Any) -> Key | None:
        keys = pl.gpu_keys
        if multi and any(k in multi for k in keys):
            return None
        return keys if may_pack(h.job) else None

    by_size: dict[int, list[tuple[str, str | None, str | None]]] = {}
    for k, m, t, o in groups:
        by_size.setdefault(k, []).append((m, t, o))
    free_hosts: dict[GroupKey, _Hosts] = {}

    def hosts_of_group(gkey: GroupKey) -> _Hosts:
        got = free_hosts.get(gkey)
        if got is None:
            got = free_hosts[gkey] = _Hosts(groups[gkey], keys_of)
        return got

    # An upper bound on the hosts left (the lazy tests may pass over some): once it is 0
    # nobody else can join.
    left = sum(len(v) for v in groups.values())
    # Groups by pair value, best first, per (job type, GPU count, owner): the value depends
    # only on the types and the model, so each waiting job walks its list down to the first
    # group with a free host that holds its memory (the best pair for it).
    # Each entry: (value, model, job type, the group's free hosts).
    ranked: dict[tuple[str, int, str | None], list[tuple[float, str, str | None, _Hosts]]] = {}
    for c in joiners:
        if left <= 0:
            break
        if c.job.id in started:
            continue
        rkey = (c.job.type_key(), c.gpus, c.job.owner)
        ranking = ranked.get(rkey)
        if ranking is None:
            ranking = []
            for m, t, owner in by_size.get(c.gpus, ()):
                if owner != c.job.owner:
                    continue
                group = hosts_of_group((c.gpus, m, t, owner))
                first = group.first()
                if first is None:  # no host of the group may be joined
                    continue
                norms = pair_norms(c.job, first.job, specs[m])
                if norms is None or not worth_packing(norms[0], norms[1], threshold):
                    continue
                ranking.append((pair_value(*norms), m, t, group))
            ranking.sort(key=lambda x: (-x[0], x[1], x[2] or ""))
            ranked[rkey] = ranking
        best: tuple[float, Key, Cand, str, _Hosts, float] | None = None
        need_mb = c.job.memory_need_mb()
        rem = c.rem
        for value, m, _, hosts_of in ranking:
            if m not in rem:
                continue
            hit = hosts_of.first_fit(need_mb, specs[m].memory_mb)
            if hit is not None:
                mem, keys, h = hit
                best = (value, keys, h, m, hosts_of, mem)
                break
        if best is None:
            continue
        value, keys, h, m, hosts_of, mem = best
        need = max(1, c.job.cpus)
        order = list(dict.fromkeys(n for n, _ in keys))  # its nodes, in GPU order
        if any(cores.get(n, 0) < need for n in order):
            continue
        by_node: dict[str, list[int]] = {}
        for n, i in keys:
            by_node.setdefault(n, []).append(i)
        parts = [PlacementPart(n, tuple(by_node[n]), need) for n in order]
        for n in order:
            cores[n] -= need
        pl = Placement(
            c.job.id,
            parts[0].node,
            parts[0].gpu_indices,
            mode=SharingMode.MPS,
            cpus=need,
            more=tuple(parts[1:]),
        )
        hosts_of.take(mem)
        left -= 1
        started.add(c.job.id)
        decisions.append(
            Decision(
                pl,
                policy,
                f"packed next to job {h.job.id} on {m} under MPS: pair throughput "
                f"{value:.2f} jobs' worth ({basis}) >= {threshold:.2f}; "
                f"key {fmt_h(c.key)}",
                score=c.key,
            )
        )

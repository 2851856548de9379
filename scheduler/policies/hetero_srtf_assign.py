"""``hetero_srtf``'s choice of GPU model (step 4 of ``scheduler.policies.hetero_srtf``): the
candidates of a cycle (``Cand``) and ``assign_models``, a greedy assignment in priority order
improved by swaps of same-size jobs between two models while the total relative cost drops.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.domain import JobSpec, Placement, RunningJob

_INF = math.inf


@dataclass(slots=True)
class Cand:
    """A job in one cycle: running (``running`` set) or pending."""

    job: JobSpec
    rem: dict[str, float]  # model -> estimated remaining seconds
    best: float
    key: float
    running: RunningJob | None = None
    model: str | None = None  # current model if running
    pinned: bool = False  # running and may not be preempted or moved
    guest: bool = False  # running, joined a GPU with another job (packed)
    move_cost: float = 0.0  # seconds a running job loses if it moves
    placed_model: str | None = None  # where it runs after this cycle
    freed: Placement | None = None  # its old placement, once requeued this cycle
    stay_bonus: float = 0.0  # seconds a move must save beyond move_cost (margin x remaining)
    gpus: int = 0  # GPUs it asks (set from the job)
    costs: dict[str, float] = field(default_factory=dict)  # model -> cost (assign_models)

    def __post_init__(self) -> None:
        self.gpus = max(1, self.job.gpus)

    def cost(self, model: str) -> float:
        """Relative cost of running on ``model``: its slowdown there (move cost included)."""
        r = self.rem.get(model)
        if r is None:
            return _INF
        if self.running is not None and model != self.model:
            if self.pinned:
                return _INF
            r += self.move_cost + self.stay_bonus
        return r / self.best if self.best > 0 else 1.0


def assign_models(cands: Sequence[Cand], capacity: Mapping[str, int]) -> dict[str, str]:
    """Job id -> GPU model for ``cands`` (in priority order) within ``capacity`` GPUs per model.

    Greedy in order (each job takes its cheapest model with room; a job that fits nowhere is
    left out), then pairwise swaps of same-size jobs between two models, and moves into spare
    capacity, while they lower the total relative cost (``Cand.cost``).
    """
    left = dict(capacity)
    out: dict[str, str] = {}
    models = sorted(capacity)
    # Each candidate's cost on every model is computed once (``Cand.costs``): swaps read it.
    by_id: dict[str, Cand] = {}
    for c in cands:
        best_m, best_cost = None, _INF
        for m in c.rem:
            if left.get(m, 0) >= c.gpus:
                cost = c.cost(m)
                if cost < best_cost:
                    best_m, best_cost = m, cost
        if best_m is not None:
            out[c.job.id] = best_m
            by_id[c.job.id] = c
            c.costs = {m: c.cost(m) for m in models}
            left[best_m] -= c.gpus
    sizes = sorted({c.gpus for c in by_id.values()})
    for _ in range(3):
        groups: dict[tuple[str, int], list[Cand]] = {}
        for jid, c in by_id.items():
            groups.setdefault((out[jid], c.gpus), []).append(c)
        improved = False
        for g in models:
            for h in models:
                if g >= h:
                    continue
                for k in sizes:
                    improved |= _swap(groups, out, left, g, h, k)
        if not improved:
            break
    return out


def _gains(on: Sequence[Cand], here: str, there: str) -> list[float]:
    """What moving each job of ``on`` from ``here`` to ``there`` costs (negative: a gain)."""
    return [c.costs[there] - c.costs[here] for c in on]


def _smallest(d: list[float], below: float) -> list[tuple[float, int]]:
    """(value, index) of the entries of ``d`` under ``below``, ascending (ties by index): the
    prefix of the sorted list that ``_swap`` can use."""
    return sorted((x, i) for i, x in enumerate(d) if x < below)


def _usable(other_min: float) -> float:
    """A bound above every gain a move (< -1e-9) or a pair with the other side's smallest
    gain ``other_min`` can use, with slack for rounding (a longer prefix changes nothing)."""
    lim = max(-1e-9, -1e-9 - other_min)
    return lim + 1e-6 * (1.0 + abs(lim))


def _swap(
    groups: dict[tuple[str, int], list[Cand]],
    out: dict[str, str],
    left: dict[str, int],
    g: str,
    h: str,
    k: int,
) -> bool:
    """Improve the assignment of ``k``-GPU jobs between models ``g`` and ``h`` (moves into
    spare room, then swaps of the pairs that gain most; see ``assign_models``)."""
    on_g = groups.get((g, k), [])
    on_h = groups.get((h, k), [])
    if not on_g and not on_h:
        return False
    # d: what moving to the other model costs (negative: a gain). Only entries that a move
    # (negative) or a pair (negative sum with the other side's smallest) can use are sorted.
    eg, eh = _gains(on_g, g, h), _gains(on_h, h, g)
    dg = _smallest(eg, _usable(min(eh, default=_INF)))
    dh = _smallest(eh, _usable(min(eg, default=_INF)))
    to_h: list[int] = []
    to_g: list[int] = []
    i = j = 0
    while True:
        if i < len(dg) and dg[i][0] < -1e-9 and left.get(h, 0) >= k:
            to_h.append(dg[i][1])
            left[h] -= k
            left[g] += k
            i += 1
            continue
        if j < len(dh) and dh[j][0] < -1e-9 and left.get(g, 0) >= k:
            to_g.append(dh[j][1])
            left[g] -= k
            left[h] += k
            j += 1
            continue
        if i < len(dg) and j < len(dh) and dg[i][0] + dh[j][0] < -1e-9:
            to_h.append(dg[i][1])
            to_g.append(dh[j][1])
            i += 1
            j += 1
            continue
        break
    if not to_h and not to_g:
        return False
    moved_h = [on_g[x] for x in to_h]
    moved_g = [on_h[x] for x in to_g]
    for c in moved_h:
        out[c.job.id] = h
    for c in moved_g:
        out[c.job.id] = g
    sh, sg = set(to_h), set(to_g)
    groups[(g, k)] = [c for x, c in enumerate(on_g) if x not in sh] + moved_g
    groups[(h, k)] = [c for x, c in enumerate(on_h) if x not in sg] + moved_h
    return True

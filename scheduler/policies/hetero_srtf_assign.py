"""``hetero_srtf``'s choice of GPU model (step 4 of ``scheduler.policies.hetero_srtf``): the
candidates of a cycle (``Cand``) and ``assign_models``, a greedy assignment in priority order
improved by swaps of same-size jobs between two models while the total relative cost drops.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

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
    # A job of unknown length: its attained service (s) and how its remaining time was
    # estimated (said in its decision); None and "" for a job of known length.
    attained: float | None = None
    note: str = ""
    # Models where the job would finish over the finish-time-fairness cap were it to run
    # there to the end (while under it on its fastest model): each costs OVER_CAP_COST more.
    over_cap: frozenset[str] | None = None

    def __post_init__(self) -> None:
        self.gpus = g if (g := self.job.gpus) > 1 else 1  # max(1, gpus)

    def cost(self, model: str) -> float:
        """Relative cost of running on ``model``: its slowdown there (move cost included)."""
        r = self.rem.get(model)
        if r is None:
            return _INF
        if self.running is not None and model != self.model:
            if self.pinned:
                return _INF
            r += self.move_cost + self.stay_bonus
        cost = r / self.best if self.best > 0 else 1.0
        if self.over_cap and model in self.over_cap:
            cost += OVER_CAP_COST
        return cost


#: What a model where a job would end over the finish-time-fairness cap adds to its relative
#: cost (``Cand.over_cap``): more than any slowdown, so the greedy pass gives the job another
#: model with room and a swap takes it off such a model whenever its partner is not over the
#: cap there; between two jobs over the cap on the same model the slowdowns decide.
OVER_CAP_COST = 1e3

#: From this many candidates on, the swaps read the costs from one array (numpy) instead of
#: walking the candidates in Python; the two give the same assignment (tested), the array
#: only pays off when the groups are large (tens of thousands of running jobs).
VECTOR_FROM = 2048


def _cost_row(c: Cand, models: Sequence[str]) -> list[float]:
    """``[c.cost(m) for m in models]``, the same arithmetic written out as comprehensions
    (called once per candidate and cycle, ~30,000 times on the largest benchmark)."""
    if c.best <= 0:
        return [c.cost(m) for m in models]
    over = c.over_cap
    if over:
        row = _cost_row_alone(c, models)
        return [x + OVER_CAP_COST if m in over else x for x, m in zip(row, models, strict=True)]
    return _cost_row_alone(c, models)


def _cost_row_alone(c: Cand, models: Sequence[str]) -> list[float]:
    """``_cost_row`` of a job with ``best`` > 0, without ``over_cap``."""
    rem, best = c.rem, c.best
    if c.running is None:
        return [_INF if (r := rem.get(m)) is None else r / best for m in models]
    here = c.model
    if c.pinned:
        return [_INF if m != here or (r := rem.get(m)) is None else r / best for m in models]
    extra = c.move_cost + c.stay_bonus
    return [
        _INF if (r := rem.get(m)) is None else (r if m == here else r + extra) / best
        for m in models
    ]


def assign_models(
    cands: Sequence[Cand], capacity: Mapping[str, int], *, vector_from: int | None = None
) -> dict[str, str]:
    """Job id -> GPU model for ``cands`` (in priority order) within ``capacity`` GPUs per model.

    Greedy in order (each job takes its cheapest model with room; a job that fits nowhere is
    left out), then pairwise swaps of same-size jobs between two models, and moves into spare
    capacity, while they lower the total relative cost (``Cand.cost``). A job over the
    finish-time-fairness cap (a negative ``key``; it comes first in the order) keeps the model
    the greedy pass gave it: no swap moves it to a slower one to lower the others' total.
    ``vector_from`` (default ``VECTOR_FROM``): the candidate count from which the swaps use
    numpy.
    """
    left = dict(capacity)
    out: dict[str, str] = {}
    models = sorted(capacity)
    col = {m: i for i, m in enumerate(models)}
    # Each candidate's cost on every model is computed once (a row per candidate, in the
    # order of ``models``): the greedy pass and the swaps read it.
    by_id: dict[str, tuple[Cand, list[float]]] = {}
    for c in cands:
        row = _cost_row(c, models)
        best_m, best_cost = None, _INF
        k = c.gpus
        for m in c.rem:
            if left.get(m, 0) >= k:
                cost = row[col[m]]
                if cost < best_cost:
                    best_m, best_cost = m, cost
        if best_m is not None:
            out[c.job.id] = best_m
            if c.key >= 0:  # a job over the fairness cap keeps its model: no swaps
                by_id[c.job.id] = (c, row)
            left[best_m] -= k
    sizes = sorted({c.gpus for c, _ in by_id.values()})
    if len(by_id) >= (VECTOR_FROM if vector_from is None else vector_from):
        _swaps_vector(by_id, out, left, models, sizes)
        return out
    for _ in range(3):
        groups: dict[tuple[str, int], list[tuple[Cand, list[float]]]] = {}
        for jid, cr in by_id.items():
            groups.setdefault((out[jid], cr[0].gpus), []).append(cr)
        improved = False
        for g in models:
            for h in models:
                if g >= h:
                    continue
                for k in sizes:
                    improved |= _swap(groups, out, left, g, h, col[g], col[h], k)
        if not improved:
            break
    return out


def _smallest(d: list[float], below: float) -> tuple[list[float], list[int]]:
    """The entries of ``d`` under ``below``, ascending (ties by index), and their indices: the
    prefix of the sorted list that ``_swap`` can use."""
    pairs = sorted((x, i) for i, x in enumerate(d) if x < below)
    return [x for x, _ in pairs], [i for _, i in pairs]


def _usable(other_min: float) -> float:
    """A bound above every gain a move (< -1e-9) or a pair with the other side's smallest
    gain ``other_min`` can use, with slack for rounding (a longer prefix changes nothing)."""
    lim = max(-1e-9, -1e-9 - other_min)
    return lim + 1e-6 * (1.0 + abs(lim))


def _pair_up(
    dg: tuple[list[float], list[int]],
    dh: tuple[list[float], list[int]],
    left: dict[str, int],
    g: str,
    h: str,
    k: int,
) -> tuple[list[int], list[int]]:
    """Indices (into the two groups) of the jobs that go from ``g`` to ``h`` and back: moves
    into spare room first, then pairs whose gains sum below zero (``dg``, ``dh``: the usable
    gains of each side, ascending, and their indices)."""
    gv, gx = dg
    hv, hx = dh
    ng, nh = len(gv), len(hv)
    room_h, room_g = left[h], left[g]  # every model of the assignment is in left
    to_h: list[int] = []
    to_g: list[int] = []
    i = j = 0
    while True:
        if i < ng and gv[i] < -1e-9 and room_h >= k:
            to_h.append(gx[i])
            room_h -= k
            room_g += k
            i += 1
            continue
        if j < nh and hv[j] < -1e-9 and room_g >= k:
            to_g.append(hx[j])
            room_g -= k
            room_h += k
            j += 1
            continue
        if i < ng and j < nh and gv[i] + hv[j] < -1e-9:
            to_h.append(gx[i])
            to_g.append(hx[j])
            i += 1
            j += 1
            continue
        break
    left[h], left[g] = room_h, room_g
    return to_h, to_g


def _swap(
    groups: dict[tuple[str, int], list[tuple[Cand, list[float]]]],
    out: dict[str, str],
    left: dict[str, int],
    g: str,
    h: str,
    gi: int,
    hi: int,
    k: int,
) -> bool:
    """Improve the assignment of ``k``-GPU jobs between models ``g`` and ``h`` (columns
    ``gi``, ``hi`` of the cost rows): moves into spare room, then swaps of the pairs that gain
    most (see ``assign_models``)."""
    on_g = groups.get((g, k), [])
    on_h = groups.get((h, k), [])
    if not on_g and not on_h:
        return False
    # d: what moving to the other model costs (negative: a gain). Only entries that a move
    # (negative) or a pair (negative sum with the other side's smallest) can use are sorted.
    eg = [row[hi] - row[gi] for _, row in on_g]
    eh = [row[gi] - row[hi] for _, row in on_h]
    dg = _smallest(eg, _usable(min(eh, default=_INF)))
    dh = _smallest(eh, _usable(min(eg, default=_INF)))
    to_h, to_g = _pair_up(dg, dh, left, g, h, k)
    if not to_h and not to_g:
        return False
    moved_h = [on_g[x] for x in to_h]
    moved_g = [on_h[x] for x in to_g]
    for c, _ in moved_h:
        out[c.job.id] = h
    for c, _ in moved_g:
        out[c.job.id] = g
    sh, sg = set(to_h), set(to_g)
    groups[(g, k)] = [c for x, c in enumerate(on_g) if x not in sh] + moved_g
    groups[(h, k)] = [c for x, c in enumerate(on_h) if x not in sg] + moved_h
    return True


def _swaps_vector(
    by_id: Mapping[str, tuple[Cand, list[float]]],
    out: dict[str, str],
    left: dict[str, int],
    models: Sequence[str],
    sizes: Sequence[int],
) -> None:
    """The swap rounds of ``assign_models`` on arrays: the cost rows as one matrix, each group
    (model, size) as the row numbers of its jobs, in the order the plain version keeps them
    (greedy order when a round starts, then the kept jobs followed by the ones swapped in).
    Same gains, same ties (a stable sort by gain, then by position), same result."""
    items = list(by_id.values())
    cost = np.array([row for _, row in items], dtype=float)
    col = {m: i for i, m in enumerate(models)}
    where = np.array([col[out[jid]] for jid in by_id], dtype=np.int64)  # by_id's order
    start = where.copy()
    size = np.array([c.gpus for c, _ in items], dtype=np.int64)
    empty = np.zeros(0, dtype=np.int64)

    def smallest(d: Any, below: float) -> tuple[list[float], list[int]]:
        idx = np.flatnonzero(d < below)
        vals = d[idx]
        order = np.argsort(vals, kind="stable")
        return vals[order].tolist(), idx[order].tolist()

    for _ in range(3):
        groups: dict[tuple[int, int], Any] = {}
        for k in sizes:
            of_k = size == k
            for gi in range(len(models)):
                groups[(gi, k)] = np.flatnonzero(of_k & (where == gi))
        improved = False
        for gi, g in enumerate(models):
            for hi, h in enumerate(models):
                if g >= h:
                    continue
                for k in sizes:
                    on_g = groups.get((gi, k), empty)
                    on_h = groups.get((hi, k), empty)
                    if not len(on_g) and not len(on_h):
                        continue
                    eg = cost[on_g, hi] - cost[on_g, gi]
                    eh = cost[on_h, gi] - cost[on_h, hi]
                    dg = smallest(eg, _usable(float(eh.min()) if len(eh) else _INF))
                    dh = smallest(eh, _usable(float(eg.min()) if len(eg) else _INF))
                    to_h, to_g = _pair_up(dg, dh, left, g, h, k)
                    if not to_h and not to_g:
                        continue
                    improved = True
                    moved_h = on_g[np.array(to_h, dtype=np.int64)]
                    moved_g = on_h[np.array(to_g, dtype=np.int64)]
                    where[moved_h] = hi
                    where[moved_g] = gi
                    keep_g = np.ones(len(on_g), dtype=bool)
                    keep_g[to_h] = False
                    keep_h = np.ones(len(on_h), dtype=bool)
                    keep_h[to_g] = False
                    groups[(gi, k)] = np.concatenate((on_g[keep_g], moved_g))
                    groups[(hi, k)] = np.concatenate((on_h[keep_h], moved_h))
        if not improved:
            break
    for r in np.flatnonzero(where != start).tolist():  # the jobs that ended elsewhere
        out[items[r][0].job.id] = models[where[r]]

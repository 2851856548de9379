"""Simulator of one elastic data-parallel training job (ALGORITHMS.md §6, seed 002).

The cluster simulator (``scheduler.simulator.engine``) runs jobs at a fixed GPU count; this
module replays one synchronous data-parallel job mini-batch window by window and lets the
autoscaling engine of ``scheduler.elastic`` (the same functions the ``elastic`` policy calls)
change its worker count and replace its stragglers. It is the harness of scenario
``elastic002`` (``python -m scheduler.reproduce elastic002``, docs/elastic.md).

Model (every assumption is a field of ``ElasticSimConfig``):

- **Scaling curve.** The job's throughput (training steps per second of the whole job, global
  batch fixed) at w workers is Gavel's measurement (``data/gavel/solo_throughput.csv``) at
  scale factor w: the consolidated rows while ``w <= gpus_per_node``, the unconsolidated ones
  beyond (the job spans machines). Counts Gavel did not measure (3, 5, 6, 7) are interpolated
  linearly between the neighbouring measured counts (marked in ``ScalingCurve.measured``).
- **Synchronous SGD.** Every rank computes its share each mini-batch, then all wait at the
  all-reduce: the job's throughput is the curve's value times the slowest rank's speed (1 for a
  healthy rank). Each rank's reported throughput is its own speed with Gaussian measurement
  noise (``noise_sd``).
- **Transitions.** Added workers (and spares replacing stragglers) warm up for ``warmup_s``
  (library load, graph build, first batches) while the job keeps training at its old count;
  their GPUs are charged during the warm-up. Every change of the group (grow, shrink, swap) then
  stops training for ``regroup_s`` (the new all-reduce ring and parameter broadcast). Shrinking
  needs no warm-up. The job's own start pays ``warmup_s`` on every GPU, static or elastic.
- **Stragglers** (``StragglerFaults``, seeded): each rank becomes a persistent straggler (speed
  ``slow_factor``) at exponential times of rate ``persistent_per_hour`` and stays slow until it
  is replaced; transient slow windows (speed ``transient_factor`` for one window) arrive at rate
  ``transient_per_hour`` per rank.
- **Fast-forward.** When nothing can change (a static job, or an elastic one that converged,
  with every rank healthy), the simulator leaps to the next fault or the job's end in one
  window; the engine sees that leap as one window.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from scheduler import elastic as en

GAVEL_THROUGHPUTS = (
    Path(__file__).resolve().parent.parent / "data" / "gavel" / "solo_throughput.csv"
)


@dataclass(frozen=True, slots=True)
class ScalingCurve:
    """Measured throughputs (steps/s) of one job type on one GPU model by worker count."""

    job_type: str
    gpu_type: str
    consolidated: Mapping[int, float]
    unconsolidated: Mapping[int, float]

    def throughput(self, workers: int, gpus_per_node: int) -> float:
        """Steps/s at ``workers``: consolidated up to ``gpus_per_node``, else unconsolidated;
        linear between measured counts."""
        table = self.consolidated if workers <= gpus_per_node else self.unconsolidated
        if workers in table:
            return table[workers]
        known = sorted(table)
        if workers < known[0] or workers > known[-1]:
            raise ValueError(f"{self.job_type} on {self.gpu_type}: no throughput at {workers}")
        lo = max(k for k in known if k < workers)
        hi = min(k for k in known if k > workers)
        return table[lo] + (table[hi] - table[lo]) * (workers - lo) / (hi - lo)

    def measured(self, workers: int, gpus_per_node: int) -> bool:
        table = self.consolidated if workers <= gpus_per_node else self.unconsolidated
        return workers in table


def load_curves(
    path: Path | str = GAVEL_THROUGHPUTS, counts: Iterable[int] = (1, 2, 4, 8)
) -> list[ScalingCurve]:
    """Every (job type, GPU model) of Gavel's table measured at all ``counts``, consolidated
    and unconsolidated, with a positive throughput (0 marks an infeasible run)."""
    cons: dict[tuple[str, str], dict[int, float]] = {}
    uncons: dict[tuple[str, str], dict[int, float]] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            gpu = row["gpu_type"]
            spread = gpu.endswith("_unconsolidated")
            key = (row["job_type"], gpu.removesuffix("_unconsolidated"))
            value = float(row["throughput"])
            if value > 0:
                (uncons if spread else cons).setdefault(key, {})[int(row["scale_factor"])] = value
    wanted = set(counts)
    curves = []
    for key in sorted(cons):
        c, u = cons[key], uncons.get(key, {})
        if wanted <= set(c) and wanted <= set(u) | {1}:
            u = {**u, 1: u.get(1, c[1])}  # one worker is never spread
            curves.append(ScalingCurve(key[0], key[1], dict(c), u))
    return curves


@dataclass(frozen=True, slots=True)
class StragglerFaults:
    """The seeded straggler model (rates per rank-hour; speeds relative to a healthy rank)."""

    persistent_per_hour: float = 0.0
    slow_factor: float = 0.5
    transient_per_hour: float = 0.0
    transient_factor: float = 0.6


@dataclass(frozen=True, slots=True)
class ElasticSimConfig:
    """One run: the job's length and bounds, the node size, the transition costs, the faults.

    ``static``: run at that many workers without the engine (a baseline); None: elastic,
    starting at ``start_workers``.
    """

    total_steps: float
    start_workers: int
    job: en.ElasticJob
    engine: en.ElasticConfig
    gpus_per_node: int = 8
    static: int | None = None
    warmup_s: float = 60.0
    regroup_s: float = 5.0
    noise_sd: float = 0.02
    faults: StragglerFaults = StragglerFaults()
    seed: int = 0
    max_windows: int = 5_000_000


@dataclass(frozen=True, slots=True)
class Change:
    """One change of the job: ``kind`` scale or replace, when it was decided and when it took
    effect, the counts before and after, the engine's reason and S."""

    decided_s: float
    effective_s: float
    kind: str
    workers_from: int
    workers_to: int
    reason: str
    efficiency: float | None = None


@dataclass
class ElasticRun:
    """What one run gave: completion time and GPU time (seconds), the changes, the counts."""

    completion_s: float
    gpu_s: float
    final_workers: int
    changes: list[Change] = field(default_factory=list)
    persistent_stragglers: int = 0
    windows: int = 0
    completed: bool = True

    @property
    def scale_changes(self) -> list[Change]:
        return [c for c in self.changes if c.kind == "scale"]

    @property
    def settled_s(self) -> float:
        """When the worker count took its final value (0: it never changed)."""
        changes = self.scale_changes
        return changes[-1].effective_s if changes else 0.0


@dataclass
class _Pending:
    kind: str  # "scale" | "replace"
    ready_s: float
    decided_s: float
    target: int
    ranks: tuple[int, ...]
    reason: str
    efficiency: float | None
    warming: int  # GPUs charged while warming


def simulate_elastic(curve: ScalingCurve, cfg: ElasticSimConfig) -> ElasticRun:
    """Run one job to completion (static or elastic) and return its record."""
    rng = random.Random(cfg.seed)
    faults = cfg.faults
    elastic = cfg.static is None
    w = cfg.static if cfg.static is not None else cfg.start_workers
    state = en.start(cfg.job, w, cfg.total_steps)
    w = state.workers if elastic else w
    speeds = [1.0] * w
    next_fault = [_draw(rng, faults.persistent_per_hour) for _ in range(w)]
    next_blip = [_draw(rng, faults.transient_per_hour) for _ in range(w)]

    t = cfg.warmup_s
    gpu_s = w * cfg.warmup_s
    done = 0.0
    windows = 0
    persistent = 0
    pending: _Pending | None = None
    changes: list[Change] = []
    converged = not elastic
    batches = en.STATS_WINDOW_BATCHES

    while done < cfg.total_steps:
        windows += 1
        if windows > cfg.max_windows:
            return ElasticRun(t, gpu_s, w, changes, persistent, windows, completed=False)
        # rank states at this window: persistent stragglers, transient blips
        for i in range(w):
            if next_fault[i] <= t and speeds[i] == 1.0:
                speeds[i] = faults.slow_factor
                persistent += 1
                next_fault[i] = math.inf
        blips = [1.0] * w
        for i in range(w):
            if next_blip[i] <= t:
                blips[i] = faults.transient_factor
                next_blip[i] = t + _draw(rng, faults.transient_per_hour)
        rates = [s * b for s, b in zip(speeds, blips, strict=True)]
        healthy = min(rates) == 1.0
        rate = curve.throughput(w, cfg.gpus_per_node) * min(rates)
        n = float(batches)
        if converged and healthy and pending is None:
            horizon = min([*next_fault, *next_blip, math.inf]) - t
            leap = (cfg.total_steps - done) if horizon == math.inf else horizon * rate
            n = float(max(batches, math.floor(leap / batches) * batches))
        n = min(n, cfg.total_steps - done)
        dt = n / rate
        warming = pending.warming if pending is not None else 0
        t += dt
        gpu_s += (w + warming) * dt
        done += n
        if done >= cfg.total_steps:
            break
        if not elastic:
            continue
        observed = tuple(r * (1.0 + rng.gauss(0.0, cfg.noise_sd)) for r in rates)
        window = en.Window(w, int(n), dt, observed, cfg.total_steps - done, t)
        state = en.observe(state, window, cfg.engine)
        if pending is not None and pending.ready_s <= t:
            # the safe point after the warm-up: the group changes now
            t += cfg.regroup_s
            gpu_s += max(w, pending.target) * cfg.regroup_s
            changes.append(
                Change(
                    pending.decided_s,
                    t,
                    pending.kind,
                    w,
                    pending.target,
                    pending.reason,
                    pending.efficiency,
                )
            )
            if pending.kind == "replace":
                for i in pending.ranks:
                    speeds[i] = 1.0
                    next_fault[i] = t + _draw(rng, faults.persistent_per_hour)
                state = en.replaced(state, pending.ranks)
            else:
                speeds += [1.0] * (pending.target - w)
                next_fault += [
                    t + _draw(rng, faults.persistent_per_hour) for _ in range(pending.target - w)
                ]
                next_blip += [
                    t + _draw(rng, faults.transient_per_hour) for _ in range(pending.target - w)
                ]
                w = pending.target
                state = en.changed(state, w)
            pending = None
            converged = False
            continue
        if pending is not None:
            continue
        decision = en.decide(state, cfg.job, cfg.engine)
        if decision.kind == en.DecisionKind.HOLD:
            converged = decision.converged
            continue
        converged = False
        if decision.kind == en.DecisionKind.REPLACE:
            pending = _Pending(
                "replace",
                t + cfg.warmup_s,
                t,
                w,
                decision.ranks,
                decision.explanation,
                decision.efficiency,
                len(decision.ranks),
            )
            state = en.begin_transition(state)
        elif decision.workers > w:
            pending = _Pending(
                "scale",
                t + cfg.warmup_s,
                t,
                decision.workers,
                (),
                decision.explanation,
                decision.efficiency,
                decision.workers - w,
            )
            state = en.begin_transition(state)
        else:
            # shrink at once: drop the slowest ranks first (their EWMA is the lowest)
            keep = sorted(range(w), key=lambda i: -state.straggler_ewma[i])[: decision.workers]
            keep.sort()
            t += cfg.regroup_s
            gpu_s += w * cfg.regroup_s
            changes.append(
                Change(
                    t - cfg.regroup_s,
                    t,
                    "scale",
                    w,
                    decision.workers,
                    decision.explanation,
                    decision.efficiency,
                )
            )
            speeds = [speeds[i] for i in keep]
            next_fault = [next_fault[i] for i in keep]
            next_blip = [next_blip[i] for i in keep]
            ewma = tuple(state.straggler_ewma[i] for i in keep)
            w = decision.workers
            state = en.changed(state, w)
            state = _with_ewma(state, ewma)
    return ElasticRun(t, gpu_s, w, changes, persistent, windows)


def _with_ewma(state: en.ElasticState, ewma: tuple[float, ...]) -> en.ElasticState:
    return replace(state, straggler_ewma=ewma)


def _draw(rng: random.Random, per_hour: float) -> float:
    """Seconds to the next event of a Poisson process of ``per_hour`` (inf at rate 0)."""
    if per_hour <= 0:
        return math.inf
    return rng.expovariate(per_hour / 3600.0)

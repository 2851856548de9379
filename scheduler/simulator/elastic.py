"""Simulator of one elastic data-parallel training job (ALGORITHMS.md §6, seed 002).

This module replays one synchronous data-parallel job mini-batch window by window and lets the
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
- **In a cluster.** The second half of the module (``ElasticModel``, ``CurveTable``,
  ``DataParallelJob``) is what the cluster simulator (``scheduler.simulator.engine``) uses to run
  many elastic jobs at once under a policy, with the same curves, fault model and transition
  costs, plus the throughput at other batch sizes of the same model (docs/elastic.md).
- **Fast-forward.** When nothing can change (a static job, or an elastic one that converged,
  with every rank healthy), the simulator leaps to the next fault or the job's end in one
  window; the engine sees that leap as one window.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING

from scheduler import elastic as en

if TYPE_CHECKING:
    from scheduler.domain import JobSpec

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
    elastic = cfg.static is None
    w = cfg.static if cfg.static is not None else cfg.start_workers
    state = en.start(cfg.job, w, cfg.total_steps)
    w = state.workers if elastic else w
    ranks = RankFaults(rng, cfg.faults, w)

    t = cfg.warmup_s
    gpu_s = w * cfg.warmup_s
    done = 0.0
    windows = 0
    pending: _Pending | None = None
    changes: list[Change] = []
    converged = not elastic
    batches = en.STATS_WINDOW_BATCHES

    while done < cfg.total_steps:
        windows += 1
        if windows > cfg.max_windows:
            return ElasticRun(t, gpu_s, w, changes, ranks.persistent, windows, completed=False)
        rates = ranks.window_rates(t)
        healthy = min(rates) == 1.0
        rate = curve.throughput(w, cfg.gpus_per_node) * min(rates)
        n = float(batches)
        if converged and healthy and pending is None:
            horizon = ranks.next_event() - t
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
        observed = ranks.observed(rates, cfg.noise_sd)
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
                ranks.heal(pending.ranks, t)
                state = en.replaced(state, pending.ranks)
            else:
                ranks.add(pending.target - w, t)
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
            keep = shrink_keep(state.straggler_ewma, decision.workers)
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
            ranks.keep(keep)
            ewma = tuple(state.straggler_ewma[i] for i in keep)
            w = decision.workers
            state = en.changed(state, w)
            state = _with_ewma(state, ewma)
    return ElasticRun(t, gpu_s, w, changes, ranks.persistent, windows)


class RankFaults:
    """The seeded per-rank straggler model of ``StragglerFaults`` (shared by the one-job and
    the cluster simulators): each rank's speed (1 healthy, ``slow_factor`` once a persistent
    straggler, until ``heal``), its next persistent fault and its next transient blip, as
    absolute times. All draws come from ``rng``, in a fixed order."""

    def __init__(
        self, rng: random.Random, faults: StragglerFaults, ranks: int, start_s: float = 0.0
    ) -> None:
        self.rng = rng
        self.faults = faults
        self.speeds: list[float] = [1.0] * ranks
        self.next_fault = [start_s + _draw(rng, faults.persistent_per_hour) for _ in range(ranks)]
        self.next_blip = [start_s + _draw(rng, faults.transient_per_hour) for _ in range(ranks)]
        self.persistent = 0  # persistent stragglers so far

    def __len__(self) -> int:
        return len(self.speeds)

    def apply_faults(self, t: float) -> bool:
        """Turn the ranks whose persistent fault is due by ``t`` slow; True if one did."""
        hit = False
        for i in range(len(self.speeds)):
            if self.next_fault[i] <= t and self.speeds[i] == 1.0:
                self.speeds[i] = self.faults.slow_factor
                self.persistent += 1
                self.next_fault[i] = math.inf
                hit = True
        return hit

    def window_rates(self, t: float) -> list[float]:
        """Each rank's speed over a window starting at ``t``: persistent faults due by then,
        and a transient blip on the ranks whose blip is due (their next one is drawn)."""
        self.apply_faults(t)
        blips = [1.0] * len(self.speeds)
        for i in range(len(self.speeds)):
            if self.next_blip[i] <= t:
                blips[i] = self.faults.transient_factor
                self.next_blip[i] = t + _draw(self.rng, self.faults.transient_per_hour)
        return [s * b for s, b in zip(self.speeds, blips, strict=True)]

    def observed(self, rates: Sequence[float], noise_sd: float) -> tuple[float, ...]:
        """What the ranks report: their rates with Gaussian measurement noise."""
        return tuple(r * (1.0 + self.rng.gauss(0.0, noise_sd)) for r in rates)

    def skip_blips(self, t: float) -> None:
        """Redraw the blips that fell due while nobody watched (no window was produced)."""
        for i in range(len(self.speeds)):
            if self.next_blip[i] < t:
                self.next_blip[i] = t + _draw(self.rng, self.faults.transient_per_hour)

    def next_event(self) -> float:
        """The next persistent fault or blip (inf: none)."""
        return min([*self.next_fault, *self.next_blip, math.inf])

    def next_fault_s(self) -> float:
        return min([*self.next_fault, math.inf])

    def heal(self, ranks: Iterable[int], t: float) -> None:
        """Ranks replaced by healthy spares at ``t``: full speed, a new fault time."""
        for i in ranks:
            self.speeds[i] = 1.0
            self.next_fault[i] = t + _draw(self.rng, self.faults.persistent_per_hour)

    def add(self, n: int, t: float) -> None:
        """``n`` new healthy ranks joining at ``t`` (appended)."""
        per_hour = self.faults.persistent_per_hour
        self.speeds += [1.0] * n
        self.next_fault += [t + _draw(self.rng, per_hour) for _ in range(n)]
        self.next_blip += [t + _draw(self.rng, self.faults.transient_per_hour) for _ in range(n)]

    def keep(self, ranks: Sequence[int]) -> None:
        """Only ``ranks`` stay, in that order (a shrink)."""
        self.speeds = [self.speeds[i] for i in ranks]
        self.next_fault = [self.next_fault[i] for i in ranks]
        self.next_blip = [self.next_blip[i] for i in ranks]


def shrink_keep(ewma: Sequence[float], workers: int) -> list[int]:
    """The ranks a shrink to ``workers`` keeps: the highest straggler averages, in rank order
    (the slowest ranks go first)."""
    keep = sorted(range(len(ewma)), key=lambda i: -ewma[i])[:workers]
    keep.sort()
    return keep


def _with_ewma(state: en.ElasticState, ewma: tuple[float, ...]) -> en.ElasticState:
    return replace(state, straggler_ewma=ewma)


def _draw(rng: random.Random, per_hour: float) -> float:
    """Seconds to the next event of a Poisson process of ``per_hour`` (inf at rate 0)."""
    if per_hour <= 0:
        return math.inf
    return rng.expovariate(per_hour / 3600.0)


# --------------------------------------------------------------------------------------------
# Measured curves for the cluster simulator (``scheduler.simulator.engine``): every job type,
# every batch size of a model


@dataclass(frozen=True, slots=True)
class ElasticModel:
    """How the cluster simulator runs data-parallel jobs on measured curves (docs/simulator.md,
    "Elastic data-parallel jobs").

    A job is *curve-modelled* when its ``job_type`` has a curve in ``throughputs`` (Gavel's
    table unless given) on its GPU model and it declares a worker range (or ``static_jobs``).
    ``warmup_s``: every start, added worker and spare warms up this long; ``regroup_s``: each
    change of the group stops training this long; ``window_steps``: reference steps per
    statistics window (the paper's 10 mini-batches); ``noise_sd``, ``faults``: as
    ``ElasticSimConfig``; ``seed``: per-job random streams (faults, noise).
    """

    warmup_s: float = 60.0
    regroup_s: float = 5.0
    noise_sd: float = 0.02
    faults: StragglerFaults = StragglerFaults()
    seed: int = 0
    window_steps: int = en.STATS_WINDOW_BATCHES
    static_jobs: bool = False
    throughputs: str | None = None

    def __post_init__(self) -> None:
        if min(self.warmup_s, self.regroup_s, self.noise_sd) < 0 or self.window_steps < 1:
            raise ValueError(
                "warmup_s, regroup_s and noise_sd must not be negative, window_steps >= 1"
            )


#: Gavel's GPU type names -> catalogue model names.
_GAVEL_MODELS = {"k80": "K80", "p100": "P100", "v100": "V100"}


@dataclass(frozen=True, slots=True)
class CurveTable:
    """Every curve of a throughput table: by (job type, catalogue GPU model), and the job
    types of one model at each batch size (``ResNet-18 (batch size 16..256)``)."""

    curves: Mapping[tuple[str, str], ScalingCurve]
    batch: Mapping[str, int]  # job type -> its batch size (types without one are absent)
    family: Mapping[str, tuple[tuple[int, str], ...]]  # job type -> (batch, type) of its model

    def curve(self, job_type: str | None, gpu_model: str | None) -> ScalingCurve | None:
        if job_type is None or gpu_model is None:
            return None
        return self.curves.get((job_type, gpu_model))

    def supports(self, job_type: str | None, gpu_model: str | None, workers: int) -> bool:
        """Whether a throughput at ``workers`` (consolidated and spread) is known."""
        curve = self.curve(job_type, gpu_model)
        if curve is None:
            return False
        try:
            curve.throughput(workers, workers)
            curve.throughput(workers, 0)
        except ValueError:
            return False
        return True

    def rate(
        self, job_type: str, gpu_model: str, workers: int, spread: bool, local_batch: int | None
    ) -> tuple[float, int | None]:
        """(work units per second, the batch size of the row used) at ``workers`` GPUs
        (``spread``: over several nodes, Gavel's unconsolidated rows) and ``local_batch``.

        Units are samples (Gavel's steps x the row's batch size) when the job type has a batch
        size: the row of the same model at the nearest measured batch size at or below
        ``local_batch`` (else the smallest above it) that was measured at ``workers``, at its
        own samples per second. Without a batch size: Gavel's steps at the job type's row.
        Raises ValueError when nothing was measured at ``workers``.
        """
        per_node = 0 if spread else workers
        own = self.batch.get(job_type)
        if own is None or local_batch is None:
            return self.curves[(job_type, gpu_model)].throughput(workers, per_node), None
        rows = self.family.get(job_type, ())
        below = [r for r in rows if r[0] <= local_batch][::-1]
        above = [r for r in rows if r[0] > local_batch]
        for size, other in (*below, *above):
            row = self.curves.get((other, gpu_model))
            if row is None:
                continue
            try:
                return row.throughput(workers, per_node) * size, size
            except ValueError:
                continue
        raise ValueError(f"{job_type} on {gpu_model}: nothing measured at {workers} GPUs")


def load_curve_table(path: Path | str | None = None) -> CurveTable:
    """The curves of every (job type, GPU model) with a positive throughput at one GPU (other
    counts: whatever was measured; one spread GPU is one consolidated GPU)."""
    key = str(path or GAVEL_THROUGHPUTS)
    table = _TABLES.get(key)
    if table is None:
        table = _TABLES[key] = _read_curve_table(key)
    return table


_TABLES: dict[str, CurveTable] = {}


def _read_curve_table(path: str) -> CurveTable:
    cons: dict[tuple[str, str], dict[int, float]] = {}
    uncons: dict[tuple[str, str], dict[int, float]] = {}
    model_of: dict[str, str] = {}
    batch: dict[str, int] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            gpu = row["gpu_type"]
            spread = gpu.endswith("_unconsolidated")
            base = gpu.removesuffix("_unconsolidated")
            key = (row["job_type"], _GAVEL_MODELS.get(base, base))
            value = float(row["throughput"])
            model_of[row["job_type"]] = row.get("model") or row["job_type"]
            if row.get("batch_size"):
                batch[row["job_type"]] = int(row["batch_size"])
            if value > 0:
                (uncons if spread else cons).setdefault(key, {})[int(row["scale_factor"])] = value
    curves = {}
    for key, c in cons.items():
        if 1 not in c:
            continue
        u = {**uncons.get(key, {}), 1: uncons.get(key, {}).get(1, c[1])}
        curves[key] = ScalingCurve(key[0], key[1], dict(c), u)
    family: dict[str, tuple[tuple[int, str], ...]] = {}
    for job_type in batch:
        family[job_type] = tuple(
            sorted((b, t) for t, b in batch.items() if model_of[t] == model_of[job_type])
        )
    return CurveTable(curves, batch, family)


def effective_local_batch(
    workers: int, asked: int | None, max_global_batch: int | None
) -> int | None:
    """The local batch a job runs with at ``workers``: ``asked`` (the job's own, or the one
    the engine chose), or ``floor(max_global / workers)`` when ``workers * asked`` would
    exceed the maximum global batch."""
    if asked is None:
        return None
    if max_global_batch and workers * asked > max_global_batch:
        return max(1, max_global_batch // workers)
    return asked


@dataclass
class Transition:
    """A change under way in the cluster simulator: ``kind`` scale or replace, the target
    count, the straggling ranks (replace), the warming GPUs (opaque keys of the engine)."""

    kind: str
    target: int
    ranks: tuple[int, ...]
    gpus: list[object]
    local_batch: int | None
    reason: str
    decided_s: float


class DataParallelJob:
    """One curve-modelled job of the cluster simulator: its work in units (samples, or steps
    for job types without a batch size), worker count, local batch, ranks (``RankFaults``), the
    autoscaling engine's state (elastic jobs) and any transition under way. The engine
    (``scheduler.simulator.engine``) owns the GPUs and the clock; this holds the model."""

    def __init__(
        self,
        spec: JobSpec,
        gpu_model: str,
        workers: int,
        spread: bool,
        table: CurveTable,
        model: ElasticModel,
        now: float,
        seq: int,
    ) -> None:
        job_type = spec.job_type or ""
        self.job_type = job_type
        self.gpu_model = gpu_model
        self.table = table
        self.model = model
        self.declared = en.elastic_job_of(spec)
        self.batch0 = table.batch.get(job_type)
        self.max_global = spec.max_global_batch if self.batch0 else None
        self.unit = float(self.batch0 or 1)  # work units per reference step
        steps = float(spec.params.get("total_steps", 0.0)) if spec.params else 0.0
        if steps <= 0:
            solo = spec.solo_time_s(gpu_model) or 0.0
            steps = solo * table.rate(job_type, gpu_model, spec.gpus, False, None)[0]
        self.total = steps * self.unit
        self.rng = random.Random(model.seed * 1_000_003 + seq)
        self.ranks = RankFaults(self.rng, model.faults, workers, start_s=now)
        self.workers = workers
        self.spread = spread
        asked = self.batch0
        if self.declared is not None and self.batch0:
            asked = en.local_batch_size(workers, self.batch0, self.max_global)
        self.local = effective_local_batch(workers, asked, self.max_global)
        self.units_per_s = self._units(workers, spread, self.local)
        self.speed = 1.0
        self.state: en.ElasticState | None = None
        if self.declared is not None:
            st = en.start(self.declared, workers, steps)
            if st.workers != workers:  # started outside its bounds: the engine moves it
                st = replace(st, workers=workers, straggler_ewma=(1.0,) * workers)
            self.state = st
        self.streaming = False
        self.window: tuple[float, list[float]] | None = None
        self.pending: Transition | None = None
        self.timer = 0  # version of the window / fault event
        self.serial = 0  # version of the transition event
        self.suspect = False  # the last window had a rank below the straggler threshold

    def _units(self, workers: int, spread: bool, local: int | None) -> float:
        return self.table.rate(self.job_type, self.gpu_model, workers, spread, local)[0]

    def can_run(self, workers: int, spread: bool, local: int | None) -> bool:
        try:
            self._units(workers, spread, local)
        except ValueError:
            return False
        return True

    def local_for(self, workers: int, asked: int | None) -> int | None:
        """The local batch at ``workers``: the engine's ``asked`` one (else the job's own),
        capped by the maximum global batch."""
        if not self.batch0:
            return None
        return effective_local_batch(workers, asked or self.batch0, self.max_global)

    def set_group(self, workers: int, spread: bool, local: int | None) -> None:
        self.workers = workers
        self.spread = spread
        self.local = local
        self.units_per_s = self._units(workers, spread, local)

    def rate(self) -> float:
        """Work units per second now (healthy curve x the slowest rank's speed)."""
        return self.units_per_s * self.speed

    def solo_s(self, workers: int) -> float:
        """Seconds for the whole work at ``workers`` on one node, healthy, at the job's batch."""
        local = self.local_for(workers, self.batch0)
        return self.total / self._units(workers, False, local)

    def start_window(self, t: float) -> float:
        """Start a statistics window at ``t``; returns its length in seconds."""
        rates = self.ranks.window_rates(t)
        self.window = (t, rates)
        self.speed = min(rates)
        return self.model.window_steps * self.unit / max(self.rate(), 1e-12)

    def end_window(
        self, t: float, done_units: float, cfg: en.ElasticConfig, start_s: float
    ) -> None:
        """Fold the window that ends at ``t`` into the engine state."""
        if self.window is None or self.state is None:
            return
        t0, rates = self.window
        self.window = None
        observed = self.ranks.observed(rates, self.model.noise_sd)
        window = en.Window(
            self.workers,
            self.model.window_steps,
            t - t0,
            observed,
            max(0.0, self.total - done_units) / self.unit,
            t - start_s,
        )
        self.state = en.observe(self.state, window, cfg)
        mid = median(observed) if len(observed) >= 2 else 0.0
        self.suspect = mid > 0 and min(observed) / mid < cfg.straggler_threshold

    def steady(self, t: float) -> None:
        """No window is watched: persistent faults due by ``t`` apply, no blips."""
        self.window = None
        self.ranks.apply_faults(t)
        self.speed = min(self.ranks.speeds) if self.ranks.speeds else 1.0

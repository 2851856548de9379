"""The autoscaling engine of elastic data-parallel training (ALGORITHMS.md §6, seed 002).

Pure functions over small frozen dataclasses: the ``elastic`` policy (live scheduling loop) and
the elastic simulator (``scheduler.simulator.elastic``) both fold measurement windows into an
``ElasticState`` with ``observe`` and ask ``decide`` what to do next. Nothing here reads a clock,
draws a random number or does I/O.

Units: throughput in training steps per second of the whole job (the unit of Gavel's table; any
unit works if it is the same at every worker count and the global batch is the same), time in
seconds, cost in "cost units" per GPU-hour (``gpu_cost_per_hour``, 1.0 = GPU-hours).

The paper is vague in places; the readings chosen here (also in docs/elastic.md):

- **Search.** "Add K workers every N batches while the scaling conditions hold; when a step
  fails, fall back to the best point seen and try the next one." Read as a walk over the worker
  counts ``start, start ± K, ...`` within [min, max] with a table of measured throughputs: at
  ``w``, (1) if ``w - K`` was measured and the step ``w - K -> w`` fails the conditions, fall
  back to ``w - K``; (2) if ``w + K`` is unmeasured, probe it; if measured and the step passes,
  go there; (3) if the step up fails (or there is no room) and ``w - K`` is unmeasured, probe it
  (this is how an over-allocation is recovered); (4) otherwise stay: converged. A step's verdict
  depends only on the two measured throughputs, so the walk cannot oscillate between two counts.
- **Condition 1**: ``S = (R_{d+k} - R_d) / (k * R_d / d) > scaling_threshold`` (paper: 0.1).
- **Condition 2** (only when the job declares a utility): expected remaining time
  ``T(w) = remaining_steps / R_w`` (plus the time already spent, for deadlines), expected
  remaining cost ``C(w) = gpu_cost_per_hour * w * T(w) / 3600``; scale from d to d+k only if
  ``U(T(d+k)) - U(T(d)) > C(d+k) - C(d)``. Utilities: ``value_per_hour`` v gives
  ``U(T) = -v * T / 3600`` (an hour sooner is worth v); a ``deadline`` D gives
  ``U(T) = -lateness_value_per_hour * max(0, T - D) / 3600`` (no value in finishing early, a
  cost per hour late).
- **Measurements.** A worker count's throughput is the mean of its windows (10 mini-batches
  each) since the job last changed to it; the first window after a change is skipped (the new
  group's first all-reduce). A scaling decision needs ``scale_interval_batches`` at the count.
- **Stragglers.** Each rank's throughput as a fraction of the median rank's, averaged by an
  EWMA (``straggler_ewma_alpha``; the paper gives no weight), flags a persistent straggler when
  the average falls below ``straggler_threshold`` (paper: 0.8). It is replaced by a spare that
  warms up first; the executor reports the swap with ``replaced`` (the rank's average restarts
  at 1).
- **Batch size.** ``local_batch_size``: with a maximum global batch the local batch is the
  largest that keeps ``workers * local <= max_global``, never below the job's own local batch
  (and then the count is capped by ``max_workers_for_batch``); without one it stays fixed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from statistics import median
from typing import Any

from scheduler.domain import JobSpec
from scheduler.elastic_state import ElasticState, Measured

#: Statistics are gathered every this many mini-batches (the paper's interval).
STATS_WINDOW_BATCHES = 10


class UtilityKind(StrEnum):
    NONE = "none"  # condition 1 only
    DEADLINE = "deadline"
    VALUE_PER_HOUR = "value_per_hour"


@dataclass(frozen=True, slots=True)
class Utility:
    """What finishing sooner is worth to the job's owner (condition 2).

    ``deadline_s``: seconds from the job's start; ``value_per_hour``: cost units one hour of
    completion time is worth.
    """

    kind: UtilityKind = UtilityKind.NONE
    deadline_s: float | None = None
    value_per_hour: float | None = None

    def value(
        self, total_time_s: float, remaining_time_s: float, lateness_per_hour: float
    ) -> float:
        """U(T) in cost units for a completion ``total_time_s`` after the start."""
        if self.kind == UtilityKind.VALUE_PER_HOUR:
            return -(self.value_per_hour or 0.0) * remaining_time_s / 3600.0
        if self.kind == UtilityKind.DEADLINE:
            late = max(0.0, total_time_s - (self.deadline_s or 0.0))
            return -lateness_per_hour * late / 3600.0
        return 0.0


@dataclass(frozen=True, slots=True)
class ElasticConfig:
    """The engine's parameters (the ``elastic`` policy's, documented in policy_settings)."""

    scaling_threshold: float = 0.1
    scale_step_workers: int = 1
    scale_interval_batches: int = 50
    straggler_threshold: float = 0.8
    straggler_ewma_alpha: float = 0.25
    gpu_cost_per_hour: float = 1.0
    lateness_value_per_hour: float = 100.0

    def __post_init__(self) -> None:
        problems = []
        if self.scale_step_workers < 1:
            problems.append("scale_step_workers must be at least 1")
        if self.scale_interval_batches < 2 * STATS_WINDOW_BATCHES:
            problems.append(f"scale_interval_batches must be at least {2 * STATS_WINDOW_BATCHES}")
        if not 0.0 < self.straggler_ewma_alpha <= 1.0:
            problems.append("straggler_ewma_alpha must be in (0, 1]")
        if not 0.0 <= self.straggler_threshold <= 1.0:
            problems.append("straggler_threshold must be in [0, 1]")
        if self.gpu_cost_per_hour < 0 or self.lateness_value_per_hour < 0:
            problems.append("costs and values must not be negative")
        if problems:
            raise ValueError("; ".join(problems))

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ElasticConfig:
        """Build from a policy's parameter mapping (unknown keys ignored)."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in params.items() if k in names})


@dataclass(frozen=True, slots=True)
class ElasticJob:
    """What the job declared: bounds, utility, batch sizes."""

    min_workers: int
    max_workers: int
    utility: Utility = Utility()
    local_batch: int | None = None
    max_global_batch: int | None = None

    def __post_init__(self) -> None:
        if self.min_workers < 1 or self.max_workers < self.min_workers:
            raise ValueError(
                f"need 1 <= min_workers <= max_workers, got {self.min_workers}..{self.max_workers}"
            )

    @property
    def top(self) -> int:
        """The largest worker count allowed (bounds and the maximum global batch)."""
        cap = max_workers_for_batch(self.local_batch, self.max_global_batch)
        return max(self.min_workers, min(self.max_workers, cap if cap else self.max_workers))


@dataclass(frozen=True, slots=True)
class Window:
    """One statistics window: ``batches`` mini-batches at ``workers`` in ``seconds``.

    ``rank_rates``: each rank's own throughput over the window (its compute, before waiting
    at the all-reduce), any unit; only their ratios to the median are used.
    ``remaining_steps`` and ``elapsed_s`` are the job's after the window.
    """

    workers: int
    batches: int
    seconds: float
    rank_rates: tuple[float, ...] = ()
    remaining_steps: float = 0.0
    elapsed_s: float = 0.0

    @property
    def throughput(self) -> float:
        return self.batches / self.seconds if self.seconds > 0 else 0.0


class DecisionKind(StrEnum):
    HOLD = "hold"
    SCALE = "scale"
    REPLACE = "replace"


@dataclass(frozen=True, slots=True)
class ElasticDecision:
    """What to do now, why, and the scaling efficiency S behind it (None if not measured)."""

    kind: DecisionKind
    workers: int  # the target worker count (current for HOLD / REPLACE)
    explanation: str
    efficiency: float | None = None
    ranks: tuple[int, ...] = ()  # REPLACE: the straggling ranks
    local_batch: int | None = None
    converged: bool = False  # HOLD because the search has settled (not still measuring)


def elastic_job_of(spec: JobSpec) -> ElasticJob | None:
    """The elastic declaration of a job (None when it declares no worker range)."""
    if spec.elastic_min is None and spec.elastic_max is None:
        return None
    lo = spec.elastic_min or 1
    hi = max(spec.elastic_max or max(lo, spec.gpus), lo)
    if spec.elastic_deadline_s is not None:
        utility = Utility(UtilityKind.DEADLINE, deadline_s=spec.elastic_deadline_s)
    elif spec.elastic_value_per_hour is not None:
        utility = Utility(UtilityKind.VALUE_PER_HOUR, value_per_hour=spec.elastic_value_per_hour)
    else:
        utility = Utility()
    local = spec.profile.batch_size if spec.profile is not None else None
    return ElasticJob(lo, hi, utility, local, spec.max_global_batch)


# --------------------------------------------------------------------------------------------
# Formulas


def scaling_efficiency(r_d: float, r_dk: float, d: int, k: int) -> float:
    """Condition 1's ``S = (R_{d+k} - R_d) / (k * R_d / d)`` (ALGORITHMS.md §6).

    1 is a linear gain, 0 no gain, below 0 slower. ``r_*`` in any throughput unit.
    """
    if d < 1 or k < 1:
        raise ValueError("d and k must be at least 1")
    if r_d <= 0:
        return math.inf if r_dk > 0 else 0.0
    return (r_dk - r_d) / (k * r_d / d)


def reference_units(
    job: ElasticJob, seconds: float, remaining_steps: float, local_batch: int | None
) -> tuple[float, float]:
    """A window's ``seconds`` and ``remaining_steps`` in mini-batches of the job's reference
    size (its own local batch, else its maximum global batch): ``batches`` mini-batches of
    ``local_batch`` samples are ``batches * local_batch / reference`` reference ones, done in
    the same time, so the time per reference mini-batch is ``seconds * reference /
    local_batch``, and the steps left scale the other way. Unchanged without ``local_batch`` or
    a reference (the local batch then never changes with the count)."""
    reference = job.local_batch or job.max_global_batch
    if not local_batch or not reference:
        return float(seconds), float(remaining_steps)
    factor = local_batch / reference
    return float(seconds) / factor, float(remaining_steps) * factor


def max_workers_for_batch(local_batch: int | None, max_global_batch: int | None) -> int | None:
    """The most workers a maximum global batch allows at the job's local batch (None: no cap)."""
    if not local_batch or not max_global_batch:
        return None
    return max(1, max_global_batch // local_batch)


def local_batch_size(workers: int, local_batch: int | None, max_global_batch: int | None) -> int:
    """The local batch at ``workers`` (§6 "batch size"): grows until the global batch reaches
    ``max_global_batch``; fixed at ``local_batch`` without one. 0 if nothing is known."""
    if not local_batch:
        return max_global_batch // workers if max_global_batch else 0
    if not max_global_batch:
        return local_batch
    return max(local_batch, max_global_batch // workers)


def utility_gain_and_cost(
    job: ElasticJob,
    cfg: ElasticConfig,
    state: ElasticState,
    d: int,
    r_d: float,
    up: int,
    r_up: float,
) -> tuple[float, float]:
    """Condition 2's marginal utility ``U(T(up)) - U(T(d))`` and marginal cost ``C(up) - C(d)``
    in cost units, from the remaining steps and the two measured throughputs."""
    rem = state.remaining_steps
    t_d = rem / r_d if r_d > 0 else math.inf
    t_up = rem / r_up if r_up > 0 else math.inf
    lateness = cfg.lateness_value_per_hour
    u_d = job.utility.value(state.elapsed_s + t_d, t_d, lateness)
    u_up = job.utility.value(state.elapsed_s + t_up, t_up, lateness)
    c_d = cfg.gpu_cost_per_hour * d * t_d / 3600.0
    c_up = cfg.gpu_cost_per_hour * up * t_up / 3600.0
    return u_up - u_d, c_up - c_d


def step_verdict(
    job: ElasticJob, cfg: ElasticConfig, state: ElasticState, d: int, up: int
) -> tuple[bool, float, str]:
    """(passes?, S, why) for the step ``d -> up``; both counts must be measured."""
    r_d, r_up = state.throughput_at(d), state.throughput_at(up)
    if r_d is None or r_up is None:
        raise ValueError(f"step {d}->{up} is not measured")
    s = scaling_efficiency(r_d, r_up, d, up - d)
    words = f"{d}->{up} workers: R {r_d:.3g}->{r_up:.3g} steps/s, S={s:.2f}"
    if not s > cfg.scaling_threshold:
        return False, s, f"{words} <= threshold {cfg.scaling_threshold:g} (condition 1)"
    if job.utility.kind == UtilityKind.NONE:
        return True, s, f"{words} > threshold {cfg.scaling_threshold:g}"
    gain, cost = utility_gain_and_cost(job, cfg, state, d, r_d, up, r_up)
    words += f", utility gain {gain:.3g} vs cost {cost:+.3g} ({job.utility.kind.value})"
    if not gain > cost:
        return False, s, f"{words}: not worth it (condition 2)"
    return True, s, f"{words}: both conditions hold"


# --------------------------------------------------------------------------------------------
# The engine


def start(job: ElasticJob, workers: int, remaining_steps: float = 0.0) -> ElasticState:
    """A fresh state for a job starting with ``workers`` (clamped to its bounds)."""
    w = min(max(workers, job.min_workers), job.top)
    return ElasticState(workers=w, straggler_ewma=(1.0,) * w, remaining_steps=remaining_steps)


def observe(state: ElasticState, window: Window, cfg: ElasticConfig) -> ElasticState:
    """Fold one statistics window into the state: the current count's mean throughput (the
    first window after a change is skipped, and so is a window in which a rank ran below
    ``straggler_threshold`` of the median: it measures that rank, not how the job scales with
    this count) and each rank's straggler average."""
    if window.workers != state.workers:
        raise ValueError(f"window at {window.workers} workers, state at {state.workers}")
    ewma = list(state.straggler_ewma) or [1.0] * state.workers
    if len(ewma) != state.workers:
        ewma = (ewma + [1.0] * state.workers)[: state.workers]
    slowed = False
    if len(window.rank_rates) == state.workers and state.workers >= 2:
        mid = median(window.rank_rates)
        if mid > 0:
            slowed = min(window.rank_rates) / mid < cfg.straggler_threshold
            a = cfg.straggler_ewma_alpha
            ewma = [
                a * (r / mid) + (1 - a) * e for r, e in zip(window.rank_rates, ewma, strict=True)
            ]
    measured = state.measured
    skipped = state.windows_skipped
    if skipped < 1:
        skipped += 1
    elif window.seconds > 0 and not slowed:
        old = next((m for m in measured if m.workers == state.workers), None)
        if old is None:
            new = Measured(state.workers, window.throughput, 1)
        else:
            n = old.windows + 1
            new = Measured(
                state.workers, old.throughput + (window.throughput - old.throughput) / n, n
            )
        measured = tuple(m for m in measured if m.workers != state.workers) + (new,)
        measured = tuple(sorted(measured, key=lambda m: m.workers))
    return replace(
        state,
        measured=measured,
        batches_at_count=state.batches_at_count + window.batches,
        windows_skipped=skipped,
        straggler_ewma=tuple(ewma),
        remaining_steps=window.remaining_steps,
        elapsed_s=window.elapsed_s,
    )


def stragglers(state: ElasticState, cfg: ElasticConfig) -> tuple[int, ...]:
    """Ranks whose throughput-fraction average is below the threshold (persistent stragglers)."""
    return tuple(i for i, e in enumerate(state.straggler_ewma) if e < cfg.straggler_threshold)


def decide(state: ElasticState, job: ElasticJob, cfg: ElasticConfig) -> ElasticDecision:
    """The next move (see the module docstring for the search): replace persistent stragglers
    first, then scale once ``scale_interval_batches`` were seen at the current count."""
    w = state.workers
    batch = local_batch_size(w, job.local_batch, job.max_global_batch)
    if state.in_transition:
        return ElasticDecision(DecisionKind.HOLD, w, "a change is under way", local_batch=batch)
    slow = stragglers(state, cfg)
    if slow:
        avgs = ", ".join(f"rank {i} at {state.straggler_ewma[i]:.2f}" for i in slow)
        return ElasticDecision(
            DecisionKind.REPLACE,
            w,
            f"persistent straggler(s): {avgs} of the median throughput (EWMA) < "
            f"{cfg.straggler_threshold:g}; replace with warmed-up spare(s)",
            ranks=slow,
            local_batch=batch,
        )
    if w < job.min_workers or w > job.top:
        target = min(max(w, job.min_workers), job.top)
        return _scale(job, target, f"{w} workers is outside {job.min_workers}..{job.top}", None)
    if state.batches_at_count < cfg.scale_interval_batches or state.throughput_at(w) is None:
        return ElasticDecision(
            DecisionKind.HOLD,
            w,
            f"measuring {w} workers ({state.batches_at_count} of "
            f"{cfg.scale_interval_batches} mini-batches)",
            local_batch=batch,
        )
    k = cfg.scale_step_workers
    down = w - k if w - k >= job.min_workers else None
    up = w + k if w + k <= job.top else None
    if down is not None and state.throughput_at(down) is not None:
        ok, s, why = step_verdict(job, cfg, state, down, w)
        if not ok:
            return _scale(job, down, f"fall back to {down}: {why}", s)
    if up is not None:
        if state.throughput_at(up) is None:
            s_below = None
            if down is not None and state.throughput_at(down) is not None:
                s_below = step_verdict(job, cfg, state, down, w)[1]
            return _scale(job, up, f"probe {up} workers (+{k}): {up} not measured yet", s_below)
        ok, s, why = step_verdict(job, cfg, state, w, up)
        if ok:
            return _scale(job, up, f"scale up: {why}", s)
        up_why = why
    else:
        up_why = f"{w} is the most allowed ({job.top})"
    if down is not None and state.throughput_at(down) is None:
        return _scale(job, down, f"probe {down} workers (-{k}): {up_why}", None)
    s_now = None
    if down is not None:
        s_now = step_verdict(job, cfg, state, down, w)[1]
    return ElasticDecision(
        DecisionKind.HOLD,
        w,
        f"converged at {w} workers: {up_why}",
        s_now,
        local_batch=batch,
        converged=True,
    )


def _scale(job: ElasticJob, target: int, why: str, s: float | None) -> ElasticDecision:
    batch = local_batch_size(target, job.local_batch, job.max_global_batch)
    text = why + (f"; local batch {batch}" if batch else "")
    return ElasticDecision(DecisionKind.SCALE, target, text, s, local_batch=batch)


def changed(state: ElasticState, workers: int, note: str = "") -> ElasticState:
    """The state after the job joined its new group of ``workers`` (warm-up over)."""
    ewma = (tuple(state.straggler_ewma) + (1.0,) * workers)[:workers]
    history = state.history + ((note,) if note else ())
    return replace(
        state,
        workers=workers,
        batches_at_count=0,
        windows_skipped=0,
        straggler_ewma=ewma,
        in_transition=False,
        history=history,
    )


def replaced(state: ElasticState, ranks: Sequence[int], note: str = "") -> ElasticState:
    """The state after warmed spares took over ``ranks``: their averages restart at 1 and the
    current count is measured again (the straggler held its throughput down)."""
    gone = set(ranks)
    ewma = tuple(1.0 if i in gone else e for i, e in enumerate(state.straggler_ewma))
    history = state.history + ((note,) if note else ())
    measured = tuple(m for m in state.measured if m.workers != state.workers)
    return replace(
        state,
        straggler_ewma=ewma,
        measured=measured,
        batches_at_count=0,
        windows_skipped=0,
        in_transition=False,
        history=history,
    )


def measured_step_efficiency(state: ElasticState, lo: int, hi: int) -> float | None:
    """S of the step ``lo -> hi`` from the measured throughputs (None: either count is not
    measured, or ``lo >= hi``). The ``elastic`` policy's yield to the queue ranks the jobs it
    could step down by this: the GPUs of a step with a low S are worth least to their job."""
    if lo < 1 or hi <= lo:
        return None
    r_lo, r_hi = state.throughput_at(lo), state.throughput_at(hi)
    if r_lo is None or r_hi is None:
        return None
    return scaling_efficiency(r_lo, r_hi, lo, hi - lo)


def yield_target(state: ElasticState, job: ElasticJob, k: int) -> int | None:
    """The count a job steps down to when it gives GPUs back to the queue: one step of ``k``,
    never below the job's minimum, and only to a count the engine has measured (None: no such
    step). It undoes a step up the engine took, whose S is known, and keeps the walk on its
    counts (``start ± K``); the count the job started at is not taken from it unless it was
    measured below. The step goes through ``changed`` like any other: the measured throughputs
    are kept, so the engine still knows the step back up passed its conditions and asks for
    it again once GPUs are idle (no measurement says the larger count was bad)."""
    w = state.workers
    target = max(job.min_workers, w - max(1, k))
    if target >= w or state.throughput_at(target) is None:
        return None
    return target


def begin_transition(state: ElasticState) -> ElasticState:
    """Mark a change or replacement under way (no new decision until it lands)."""
    return replace(state, in_transition=True)


def end_transition(state: ElasticState) -> ElasticState:
    """The change under way could not be carried out (no GPU for it, the job was placed
    again): nothing changed, and the engine decides afresh."""
    return replace(state, in_transition=False)


def regrouped(
    state: ElasticState, workers: int, replaced_ranks: Sequence[int] = ()
) -> ElasticState:
    """The state after the job's ranks were stopped and started again as a new group of
    ``workers`` (how the live system carries out a change): measured as after ``changed``, or
    ``replaced`` for ``replaced_ranks``; every straggler average starts again at 1, since the
    new group numbers its ranks afresh."""
    after = replaced(state, replaced_ranks) if replaced_ranks else changed(state, workers)
    return replace(after, straggler_ewma=(1.0,) * after.workers)


# --------------------------------------------------------------------------------------------
# Storage (the live system keeps the state as JSON on the job row)


def state_to_dict(state: ElasticState) -> dict[str, Any]:
    """``state`` as plain JSON-able values (``state_from_dict`` reads it back)."""
    return {
        "workers": state.workers,
        "measured": [[m.workers, m.throughput, m.windows] for m in state.measured],
        "batches_at_count": state.batches_at_count,
        "windows_skipped": state.windows_skipped,
        "straggler_ewma": list(state.straggler_ewma),
        "remaining_steps": state.remaining_steps,
        "elapsed_s": state.elapsed_s,
        "in_transition": state.in_transition,
    }


def state_from_dict(data: Mapping[str, Any] | None) -> ElasticState | None:
    """The state stored by ``state_to_dict`` (None for an empty or malformed mapping)."""
    if not data:
        return None
    try:
        return ElasticState(
            workers=int(data["workers"]),
            measured=tuple(Measured(int(w), float(r), int(n)) for w, r, n in data["measured"]),
            batches_at_count=int(data.get("batches_at_count", 0)),
            windows_skipped=int(data.get("windows_skipped", 0)),
            straggler_ewma=tuple(float(e) for e in data.get("straggler_ewma", ())),
            remaining_steps=float(data.get("remaining_steps", 0.0)),
            elapsed_s=float(data.get("elapsed_s", 0.0)),
            in_transition=bool(data.get("in_transition", False)),
        )
    except (KeyError, TypeError, ValueError):
        return None

"""The autoscaling engine's memory of one elastic job (``scheduler.elastic``, ALGORITHMS.md §6).

``ElasticState`` is what the engine carries between measurement windows (the throughputs
measured per worker count, the stragglers' averages, the job's remaining steps) and what a
running job's snapshot holds (``scheduler.domain.RunningJob.elastic``). It lives below both so
that the snapshot types need not import the engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Measured:
    """The mean throughput at one worker count over ``windows`` windows."""

    workers: int
    throughput: float
    windows: int


@dataclass(frozen=True, slots=True)
class ElasticState:
    """The engine's memory for one job (carried by the executor between windows)."""

    workers: int
    measured: tuple[Measured, ...] = ()
    batches_at_count: int = 0  # since the last change, counting skipped windows
    windows_skipped: int = 0
    straggler_ewma: tuple[float, ...] = ()  # per rank
    remaining_steps: float = 0.0
    elapsed_s: float = 0.0
    in_transition: bool = False  # a change or replacement is under way (warm-up)
    history: tuple[str, ...] = field(default=())

    def throughput_at(self, workers: int) -> float | None:
        for m in self.measured:
            if m.workers == workers:
                return m.throughput
        return None

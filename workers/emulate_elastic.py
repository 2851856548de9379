"""Emulated elastic data-parallel training job (issue 17, ALGORITHMS.md §6)::

    python -m workers.emulate_elastic --curve 1:10,2:20,3:21,4:21.5 --steps 2000
        [--workers N] [--warmup-s S] [--slow-rank R --slow-factor F --slow-after-s S]

A real process that trains like a synchronous data-parallel job whose ranks are emulated inside
it: its throughput at w workers is the ``--curve`` value (steps per second of the whole job;
linear between the counts given) times its slowest rank's speed. Every 10 mini-batches (one
statistics window) it reports the window through the training SDK (``workers.sdk``,
``TrainingClient.report_window``: the count it ran at, how long the 10 batches took, each rank's
own speed) and follows the answer at the next safe point (the next window boundary):

- a larger count: the new workers warm up for ``--warmup-s`` while training goes on at the old
  count, then join;
- a smaller count: the last ranks leave at once;
- ranks to replace: a spare warms up for ``--warmup-s``, then takes the rank's place (its speed
  is 1 again) and the next window says which ranks were swapped.

``--slow-rank R`` slows rank R to ``--slow-factor`` of a healthy rank's speed from
``--slow-after-s`` seconds on (a straggler made on purpose); its replacement is healthy.

What is emulated: the ranks (they are not processes the node agents start or stop) and the
GPUs (nothing runs on them). Output: ``@cosched`` report lines (``workers.report_lines``):
``start``, ``progress`` after each window, ``elastic`` at each change, ``done``. Exit 0 when the
steps are done, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from workers.report_lines import format_report

WINDOW_BATCHES = 10


class WindowClient(Protocol):
    def report_window(
        self,
        workers: int,
        batches: int,
        seconds: float,
        rank_rates: Sequence[float],
        remaining_steps: float,
        replaced_ranks: Sequence[int] = (),
    ) -> Mapping[str, Any] | None: ...


def parse_curve(text: str) -> dict[int, float]:
    """``"1:10,2:20,4:35"`` -> ``{1: 10.0, 2: 20.0, 4: 35.0}`` (positive throughputs)."""
    curve: dict[int, float] = {}
    for item in text.split(","):
        count, sep, value = item.strip().partition(":")
        if not sep:
            raise ValueError(f"curve item {item!r} is not workers:throughput")
        w, r = int(count), float(value)
        if w < 1 or not r > 0:
            raise ValueError(f"curve item {item!r}: workers >= 1 and throughput > 0")
        curve[w] = r
    if not curve:
        raise ValueError("the curve is empty")
    return curve


def throughput(curve: Mapping[int, float], workers: int) -> float:
    """The curve at ``workers``: linear between the counts given, flat beyond the ends."""
    known = sorted(curve)
    if workers <= known[0]:
        return curve[known[0]]
    if workers >= known[-1]:
        return curve[known[-1]]
    lo = max(k for k in known if k <= workers)
    hi = min(k for k in known if k >= workers)
    if lo == hi:
        return curve[lo]
    return curve[lo] + (curve[hi] - curve[lo]) * (workers - lo) / (hi - lo)


@dataclass
class ElasticRun:
    """The job's state between windows (see the module docstring)."""

    curve: Mapping[int, float]
    total_steps: int
    workers: int
    warmup_s: float
    slow_rank: int | None = None
    slow_factor: float = 0.4
    slow_after_s: float = 0.0
    done: int = 0
    elapsed_s: float = 0.0
    speeds: list[float] = field(default_factory=list)
    grow_to: int | None = None
    grow_ready_s: float = 0.0
    swap: tuple[int, ...] = ()
    swap_ready_s: float = 0.0
    swapped: tuple[int, ...] = ()
    replaced_once: set[int] = field(default_factory=set)
    changes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.speeds = [1.0] * self.workers

    def rank_speeds(self) -> list[float]:
        out = list(self.speeds)
        r = self.slow_rank
        if (
            r is not None
            and r < len(out)
            and r not in self.replaced_once
            and self.elapsed_s >= self.slow_after_s
        ):
            out[r] = self.slow_factor
        return out

    def window(self) -> tuple[int, float, list[float]]:
        """(batches, seconds, rank speeds) of the next window at the current count."""
        batches = min(WINDOW_BATCHES, self.total_steps - self.done)
        speeds = self.rank_speeds()
        seconds = batches / (throughput(self.curve, self.workers) * min(speeds))
        return batches, seconds, speeds

    def follow(self, reply: Mapping[str, Any] | None) -> None:
        """Take the portal's answer into account (at the next safe point)."""
        if not reply:
            return
        target = int(reply.get("workers") or self.workers)
        if target < self.workers and self.grow_to is None:
            self.changes.append(f"{self.workers}->{target}")
            self.workers = target
            self.speeds = self.speeds[:target]
        elif target > self.workers and self.grow_to is None:
            self.grow_to = target
            self.grow_ready_s = self.elapsed_s + self.warmup_s
        ranks = tuple(int(r) for r in reply.get("replace_ranks") or ())
        if ranks and not self.swap and not set(ranks) <= set(self.swapped):
            self.swap = ranks
            self.swap_ready_s = self.elapsed_s + self.warmup_s

    def safe_point(self) -> None:
        """Apply what finished warming up."""
        self.swapped = ()
        if self.grow_to is not None and self.elapsed_s >= self.grow_ready_s:
            self.changes.append(f"{self.workers}->{self.grow_to}")
            self.speeds += [1.0] * (self.grow_to - self.workers)
            self.workers, self.grow_to = self.grow_to, None
        if self.swap and self.elapsed_s >= self.swap_ready_s:
            for r in self.swap:
                if r < len(self.speeds):
                    self.speeds[r] = 1.0
                    self.replaced_once.add(r)
            self.changes.append("replace " + ",".join(str(r) for r in self.swap))
            self.swapped, self.swap = self.swap, ()


def run(
    state: ElasticRun,
    client: WindowClient | None,
    *,
    sleep: Callable[[float], None] = time.sleep,
    emit: Callable[[str], None] = print,
) -> ElasticRun:
    """Train to the end: one window at a time, report, follow, apply at safe points."""
    emit(format_report("start", steps=state.total_steps, workers=state.workers))
    while state.done < state.total_steps:
        batches, seconds, speeds = state.window()
        sleep(seconds)
        state.done += batches
        state.elapsed_s += seconds
        remaining = state.total_steps - state.done
        reply = None
        if client is not None:
            reply = client.report_window(
                state.workers, batches, seconds, speeds, float(remaining), state.swapped
            )
        before = len(state.changes)
        state.safe_point()
        state.follow(reply)
        for change in state.changes[before:]:
            emit(format_report("elastic", change=change.replace(" ", "_"), workers=state.workers))
        emit(
            format_report(
                "progress",
                fraction=state.done / state.total_steps,
                iter=state.done,
                iters=state.total_steps,
                workers=state.workers,
                elapsed_s=state.elapsed_s,
            )
        )
    emit(format_report("done", iters=state.total_steps, workers=state.workers))
    return state


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m workers.emulate_elastic", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--curve", required=True, help="workers:steps_per_s,... e.g. 1:10,2:20")
    parser.add_argument("--steps", type=int, required=True, help="mini-batches of the whole run")
    parser.add_argument("--workers", type=int, default=1, help="the count it starts with")
    parser.add_argument("--warmup-s", type=float, default=1.0)
    parser.add_argument("--slow-rank", type=int, help="a rank slowed on purpose")
    parser.add_argument("--slow-factor", type=float, default=0.4)
    parser.add_argument("--slow-after-s", type=float, default=0.0)
    return parser


def main(argv: Sequence[str] | None = None, client: WindowClient | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        curve = parse_curve(args.curve)
    except ValueError as exc:
        print(f"emulate_elastic: {exc}", file=sys.stderr)
        return 2
    if args.steps < 1 or args.workers < 1 or not 0 < args.slow_factor <= 1:
        print(
            "emulate_elastic: --steps, --workers >= 1 and 0 < --slow-factor <= 1", file=sys.stderr
        )
        return 2
    if client is None:
        client = _sdk_client()
    state = ElasticRun(
        curve,
        args.steps,
        args.workers,
        args.warmup_s,
        args.slow_rank,
        args.slow_factor,
        args.slow_after_s,
    )
    run(state, client, emit=lambda line: print(line, flush=True))
    return 0


def _sdk_client() -> WindowClient | None:
    """The training SDK's client from the environment (None when the job has no token)."""
    from workers.sdk import TrainingClient

    client = TrainingClient()
    return client if client.enabled else None


if __name__ == "__main__":
    sys.exit(main())

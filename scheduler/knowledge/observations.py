"""The observation format shared by the live portal and the simulator.

An ``Observation`` is something a cluster *saw*, never something it was told:

- ``PROGRESS``: over ``window_s`` seconds of running, ending at ``at_s``, the job advanced from
  ``progress_from`` to ``progress_to`` (fractions 0..1 of its declared work) and, if it counts
  them, did ``steps`` application steps (iterations, mini-batches). It ran on ``gpus`` GPUs of
  ``gpu_model`` (None: on CPU cores) under ``mode``, beside ``co_runners`` (the ``type_key`` of
  every other job on its GPUs, sorted; empty: alone). ``spread``: a gang over several nodes.
- ``COMPLETED``: the job finished after ``window_s`` seconds of running in all (every attempt),
  ``progress_from`` 0 and ``progress_to`` 1.

The live portal derives them from the job's own progress reports (SDK, ``@cosched progress``
lines, the emulator) per attempt; the simulator from its execution of the trace. Both hand them
to ``scheduler.knowledge.Knowledge.observe``. ``to_dict`` / ``from_dict`` give the JSON shape
the portal stores and the API returns.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from scheduler.domain import SharingMode


class ObservationKind(StrEnum):
    PROGRESS = "progress"
    COMPLETED = "completed"


@dataclass(frozen=True, slots=True)
class Observation:
    """One thing the cluster saw of a job's speed (see the module docstring)."""

    kind: ObservationKind
    job_id: str
    job_type: str
    at_s: float
    window_s: float
    gpu_model: str | None = None
    gpus: int = 1
    mode: SharingMode = SharingMode.EXCLUSIVE
    co_runners: tuple[str, ...] = ()
    progress_from: float = 0.0
    progress_to: float = 0.0
    steps: float | None = None
    owner: str | None = None
    node: str | None = None
    spread: bool = False

    def __post_init__(self) -> None:
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError(f"observation window_s must be > 0 and finite, got {self.window_s!r}")
        if not (0.0 <= self.progress_from <= self.progress_to <= 1.0 + 1e-9):
            raise ValueError(
                "observation progress must satisfy 0 <= progress_from <= progress_to <= 1, "
                f"got {self.progress_from!r} -> {self.progress_to!r}"
            )
        if self.steps is not None and not (self.steps >= 0 and math.isfinite(self.steps)):
            raise ValueError(f"observation steps must be >= 0 and finite, got {self.steps!r}")

    @property
    def alone(self) -> bool:
        return not self.co_runners

    @property
    def rate(self) -> float:
        """Fraction of the job's work done per second of the window."""
        return (self.progress_to - self.progress_from) / self.window_s

    @property
    def steps_per_s(self) -> float | None:
        return None if self.steps is None else self.steps / self.window_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "job_id": self.job_id,
            "job_type": self.job_type,
            "at_s": self.at_s,
            "window_s": self.window_s,
            "gpu_model": self.gpu_model,
            "gpus": self.gpus,
            "mode": self.mode.value,
            "co_runners": list(self.co_runners),
            "progress_from": self.progress_from,
            "progress_to": self.progress_to,
            "steps": self.steps,
            "owner": self.owner,
            "node": self.node,
            "spread": self.spread,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Observation:
        return cls(
            kind=ObservationKind(data["kind"]),
            job_id=str(data["job_id"]),
            job_type=str(data["job_type"]),
            at_s=float(data["at_s"]),
            window_s=float(data["window_s"]),
            gpu_model=data.get("gpu_model"),
            gpus=int(data.get("gpus", 1)),
            mode=SharingMode(data.get("mode", SharingMode.EXCLUSIVE.value)),
            co_runners=tuple(sorted(str(c) for c in data.get("co_runners", ()))),
            progress_from=float(data.get("progress_from", 0.0)),
            progress_to=float(data.get("progress_to", 0.0)),
            steps=None if data.get("steps") is None else float(data["steps"]),
            owner=data.get("owner"),
            node=data.get("node"),
            spread=bool(data.get("spread", False)),
        )

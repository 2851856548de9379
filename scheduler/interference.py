"""Interference: how much slower a job runs when it shares a GPU.

``slowdown`` returns co-run time / solo time (>= 1 usually; 1 means no interference), the
"interference value" of ALGORITHMS.md §2. Implementations: ``measured`` (Gavel co-location
table), ``class_based`` (§4: M+M worst, C+C middle, M+C best) and, later, a trained model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from scheduler.domain import GpuSpec, JobSpec, SharingMode


class InterferenceModel(Protocol):
    name: str

    def slowdown(
        self, job: JobSpec, co_runners: Sequence[JobSpec], gpu: GpuSpec, mode: SharingMode
    ) -> float:
        """Co-run time / solo time of ``job`` on ``gpu`` next to ``co_runners`` under ``mode``."""
        ...

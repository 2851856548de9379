"""The policy plug-in interface shared by the live scheduling loop and the simulator.

A policy receives one frozen ``ClusterState`` and a seeded ``random.Random`` and returns a
``Plan``: decisions (placements with explanations), actions on running jobs, and a reason for
every pending job it leaves waiting. It reads no clock and does no I/O, so the same snapshot and
seed always give the same plan.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, ClassVar

from scheduler.domain import ClusterState, Plan


class PolicyError(ValueError):
    """A policy was named or configured wrongly (unknown name, bad parameter)."""


class Policy(ABC):
    """Base class of every policy.

    Subclasses set ``name`` and ``defaults`` (parameter name -> default value, documented in
    the subclass docstring) and implement ``schedule``.
    """

    name: ClassVar[str] = ""
    defaults: ClassVar[Mapping[str, Any]] = {}

    def __init__(self, **params: Any) -> None:
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise PolicyError(
                f"policy {self.name!r} has no parameter(s) {', '.join(sorted(unknown))}; "
                f"known: {', '.join(sorted(self.defaults)) or 'none'}"
            )
        merged = dict(self.defaults)
        merged.update(params)
        self.params: dict[str, Any] = merged

    @abstractmethod
    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        """Decide placements for ``state.pending`` (and actions on ``state.running``)."""

"""An estimate with its uncertainty: what the knowledge (``scheduler.knowledge``) answers.

A log-normal belief about a positive quantity (a run time in seconds, a co-run speed): a central
``value`` and ``sigma``, the standard deviation of its logarithm. It lives below the snapshot
types (``scheduler.domain.KnowledgeView``) and the estimator that makes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Estimate:
    """A belief about a positive quantity: ``value`` and the spread of its logarithm."""

    value: float
    sigma: float
    n: int = 0
    source: str = ""

    @property
    def low(self) -> float:
        """One sigma below (value * exp(-sigma))."""
        return self.value * math.exp(-self.sigma)

    @property
    def high(self) -> float:
        return self.value * math.exp(self.sigma)

    @property
    def confidence(self) -> float:
        """1 / (1 + sigma^2): 1 for a certain value, towards 0 as the spread grows."""
        return 1.0 / (1.0 + self.sigma * self.sigma)

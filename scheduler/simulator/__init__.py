"""Discrete-event cluster simulator: replays a trace under a policy (docs/simulator.md).

Typical use::

    from scheduler.simulator import SimConfig, simulate
    result = simulate(cluster_spec, jobs, policy, interference=model, config=SimConfig(seed=1))
    result.jobs_frame()  # one row per job
"""

from scheduler.simulator.engine import Simulator, simulate
from scheduler.simulator.results import (
    EndReason,
    JobRecord,
    OomAction,
    PolicyDecisionError,
    SimConfig,
    SimResult,
    SimulationError,
    SlowdownSample,
    TimelinePoint,
)

__all__ = [
    "EndReason",
    "JobRecord",
    "OomAction",
    "PolicyDecisionError",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "Simulator",
    "SlowdownSample",
    "TimelinePoint",
    "simulate",
]

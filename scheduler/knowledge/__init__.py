"""What the scheduler knows about jobs' speeds: estimates with uncertainty, learned online.

``observations`` holds the one format in which a cluster, live or simulated, reports what it
saw of a job (progress over a window on a GPU model, alone or beside co-runners; a job's
completion). ``estimator`` turns priors (profiles, pair tables) and those observations into
estimates with a spread. Policies ask the ``Knowledge`` object in ``ClusterState.knowledge``;
nothing of a simulator's truth reaches them.
"""

from scheduler.knowledge.estimator import Estimate, Knowledge
from scheduler.knowledge.observations import Observation, ObservationKind

__all__ = ["Estimate", "Knowledge", "Observation", "ObservationKind"]

"""``tiresias``: discretised two-dimensional least-attained-service (Gu et al., NSDI 2019).

Non-clairvoyant: the policy never reads a job's length (no profile time, no time limit, no
knowledge estimate); it orders jobs by the service they have *attained*, in GPU-seconds (GPUs
held x seconds run: the "two dimensions"), which ``PeerPolicy.account`` integrates from the
snapshots.

- **Queues.** ``queues`` (3) queues with thresholds ``queue_threshold_gpu_s`` (3,600
  GPU-seconds: one GPU-hour), then 10x each (36,000, ...), cut attained service into queues Q0
  (below the first threshold) .. Q(queues - 1). A job starts in Q0 and is
  demoted when its attained service crosses the next threshold. Lower queues run first; within
  a queue, first come first served (arrival, then id; a running job goes before a waiting one
  of the same arrival, so equal jobs do not swap).
- **Preemption.** At each decision point (``round_s``, 360 s by default; the simulator calls the
  policy that often) the order is re-drawn and running jobs of a lower queue are preempted for
  waiting jobs of a higher one (``PeerPolicy.realise``: only as many as the waiting jobs need).
- **Starvation guard** (Tiresias' PromoteKnob): a job that has waited at least
  ``promote_knob`` times the length of its last run since that run ended goes back to Q0 with
  its count of attained service restarted (0 turns the guard off).
- **Placement.** Heterogeneity-unaware, as in the paper: any GPU model the job may use, its
  current one first; consolidated on one node where one node holds it, else a gang over the
  fewest nodes (the framework's rule; Tiresias consolidates skewed models and may spread the
  others: we always consolidate when possible).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from scheduler.domain import ClusterState
from scheduler.policies.base import PolicyError
from scheduler.policies.peer_base import Cluster, PeerPolicy, Want, peer_defaults


class TiresiasPolicy(PeerPolicy):
    name: ClassVar[str] = "tiresias"
    defaults: ClassVar[dict[str, Any]] = {
        **peer_defaults,
        "queue_threshold_gpu_s": 3600.0,
        "queues": 3,
        "promote_knob": 8.0,
    }

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        first, queues = self.params["queue_threshold_gpu_s"], self.params["queues"]
        if (
            not isinstance(first, int | float)
            or isinstance(first, bool)
            or not 0 < first < math.inf
        ):
            raise PolicyError(f"tiresias: queue_threshold_gpu_s must be > 0, got {first!r}")
        if not isinstance(queues, int) or isinstance(queues, bool) or not 1 <= queues <= 20:
            raise PolicyError(f"tiresias: queues must be an integer 1..20, got {queues!r}")
        self.thresholds = tuple(float(first) * 10.0**k for k in range(queues - 1))
        knob = self.params["promote_knob"]
        if not isinstance(knob, int | float) or isinstance(knob, bool) or knob < 0:
            raise PolicyError(f"tiresias: promote_knob must be a number >= 0, got {knob!r}")
        self.promote_knob = float(knob)
        self.base: dict[str, float] = {}  # job id -> attained service at its last promotion

    def service(self, job_id: str) -> float:
        """Attained GPU-seconds counted for the queue (since the last promotion)."""
        return max(0.0, self.attained.get(job_id, 0.0) - self.base.get(job_id, 0.0))

    def queue_of(self, service_gpu_s: float) -> int:
        """The queue index of a job with this attained service (0 = highest priority)."""
        return sum(1 for t in self.thresholds if service_gpu_s >= t)

    def promote(self, state: ClusterState) -> None:
        """PromoteKnob: waiting jobs starved for ``promote_knob`` x their last run go to Q0."""
        if self.promote_knob <= 0:
            return
        for job in state.pending:
            last = self.last_run_s.get(job.id, 0.0)
            stopped = self.stopped_s.get(job.id)
            if last <= 0 or stopped is None:
                continue
            if state.now_s - stopped >= self.promote_knob * last and self.service(job.id) > 0:
                self.base[job.id] = self.attained.get(job.id, 0.0)

    def wants(
        self, state: ClusterState, cl: Cluster, decision_point: bool
    ) -> tuple[list[Want], dict[str, str]]:
        self.promote(state)
        rows: list[tuple[int, float, int, str, Want]] = []
        for r in state.running:
            s = self.service(r.job.id)
            q = self.queue_of(s)
            w = Want(r.job, None, f"queue Q{q} (attained {s / 3600:.2f} GPU-h), running", r)
            rows.append((q, r.job.arrival_s, 0, r.job.id, w))
        for j in state.pending:
            s = self.service(j.id)
            q = self.queue_of(s)
            w = Want(j, None, f"queue Q{q} (attained {s / 3600:.2f} GPU-h)")
            rows.append((q, j.arrival_s, 1, j.id, w))
        rows.sort(key=lambda x: x[:4])
        return [x[4] for x in rows], {}

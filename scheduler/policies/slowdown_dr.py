"""``slowdown_dr``: Slow-Down fairness by mini-batch redistribution (paper 000; ALGORITHMS.md §5).

Placement is delegated to another policy (``placement``, default ``loadbalance``: each new job
on the least loaded GPU); what this policy adds are ``SET_DATA_RATIO`` actions. For every
running data-parallel job that reported an epoch end (``RunningJob.data_parallel`` with
``epoch_ended``), the DR manager (``scheduler.slowdown_dr.manage``, Algorithm 1) decides the
job's data ratio for its next epoch from the Slow-Downs of the jobs on the same node and the
utilisation of that node's GPUs (``GpuState.util_pct``, monitored). Jobs that ended an epoch at
the same moment are answered in job-id order, each seeing the ratios decided before it. A
ratio that does not change gives no action; every action carries the manager's explanation
("moved 2/10 of job 41's batch from GPU 0 to GPU 2: SD 1.90 vs target 1.40 ...").

Jobs that never report (no SDK) are placed like any job and never rebalanced.

Parameters (besides the placement policy's, passed on to it: the framework's, see
``scheduler.policies.framework``, and ``loadbalance``'s ``unknown_util_pct``):

- ``placement`` (policy name, ``loadbalance``): the policy that places pending jobs.
- ``sd_threshold`` (SD_th, 0.1): nothing moves while SD_max_diff is below it.
- ``util_threshold_pct`` (Util_th, percentage points, 50.0): a larger utilisation gap between
  the job's busiest GPU and the node's least utilised GPU selects the utilisation branch.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, ClassVar

from scheduler.domain import Action, ActionKind, ClusterState, Plan, RunningJob
from scheduler.policies.base import Policy, PolicyError
from scheduler.policies.loadbalance import LoadBalancePolicy
from scheduler.slowdown_dr import DrChange, DrJob, DrParams, RatioError, check_ratio, manage

_OWN = ("placement", "sd_threshold", "util_threshold_pct")


class SlowdownDrPolicy(Policy):
    name: ClassVar[str] = "slowdown_dr"
    # The placement policy's parameters (loadbalance's, i.e. the framework's) pass through.
    defaults: ClassVar[dict[str, Any]] = {
        **LoadBalancePolicy.defaults,
        "placement": "loadbalance",
        "sd_threshold": 0.1,
        "util_threshold_pct": 50.0,
    }

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        from scheduler.policies.registry import build_policy, policy_class

        inner = self.params["placement"]
        if not isinstance(inner, str) or inner == self.name:
            raise PolicyError(f"slowdown_dr: placement must name another policy, got {inner!r}")
        sd_th = self.params["sd_threshold"]
        util_th = self.params["util_threshold_pct"]
        if not isinstance(sd_th, int | float) or isinstance(sd_th, bool) or sd_th < 0:
            raise PolicyError(f"slowdown_dr: sd_threshold must be a number >= 0, got {sd_th!r}")
        if not isinstance(util_th, int | float) or isinstance(util_th, bool):
            raise PolicyError(f"slowdown_dr: util_threshold_pct must be a number, got {util_th!r}")
        if not 0 <= util_th <= 100:
            raise PolicyError(f"slowdown_dr: util_threshold_pct must be 0..100, got {util_th!r}")
        known = policy_class(inner).defaults
        passed = {k: v for k, v in self.params.items() if k in known and k not in _OWN}
        self.inner = build_policy(inner, passed)
        self.dr_params = DrParams(float(sd_th), float(util_th))

    def schedule(self, state: ClusterState, rng: random.Random) -> Plan:
        inner = self.inner.schedule(state, rng)
        decisions = tuple(dataclasses.replace(d, policy=self.name) for d in inner.decisions)
        plan = Plan(decisions, inner.actions, inner.waiting)
        ratio_actions = [
            Action(ActionKind.SET_DATA_RATIO, c.job_id, self.name, c.explanation, c.new)
            for c in self.ratio_changes(state)
            if c.changed
        ]
        if not ratio_actions:
            return plan
        return Plan(plan.decisions, (*plan.actions, *ratio_actions), plan.waiting)

    def ratio_changes(self, state: ClusterState) -> list[DrChange]:
        """The manager's answer for every job that reported an epoch end (changed or not)."""
        by_node: dict[str, list[RunningJob]] = {}
        for rj in state.running:
            if rj.data_parallel is not None:
                by_node.setdefault(rj.placement.node, []).append(rj)
        out: list[DrChange] = []
        for node_name, rjs in sorted(by_node.items()):
            try:
                node = state.node(node_name)
            except KeyError:
                continue
            gpus = len(node.gpus)
            util: list[float | None] = [None] * gpus
            for g in node.gpus:
                if 0 <= g.index < gpus:
                    util[g.index] = g.util_pct
            table: dict[str, DrJob] = {}
            for rj in rjs:
                dp = rj.data_parallel
                assert dp is not None
                try:
                    ratio = check_ratio(dp.ratio, gpus)
                except RatioError:
                    continue  # a malformed report takes no part (the portal validates them)
                table[rj.job.id] = DrJob(rj.job.id, ratio, dp.slowdown, dp.epoch)
            ended = sorted(
                rj.job.id
                for rj in rjs
                if rj.data_parallel is not None
                and rj.data_parallel.epoch_ended
                and rj.job.id in table
            )
            for job_id in ended:
                change = manage(job_id, table, util, self.dr_params)
                out.append(change)
                if change.changed:
                    cur = table[job_id]
                    table[job_id] = DrJob(job_id, change.new, cur.slowdown, cur.epoch)
        return out

"""The policy registry: names -> ``"module:Class"`` paths, imported lazily (STYLE.md).

Adding a policy is one line in ``POLICIES``; nothing is imported until it is built, so a broken
or heavy policy module costs nothing to the others. The portal and the simulator both build
policies here, from a name and a settings mapping:

    policy = build_policy("binpack", {"max_jobs_per_gpu": 3})
    plan = policy.schedule(state, random.Random(seed))
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from scheduler.policies.base import Policy, PolicyError

POLICIES: dict[str, str] = {
    "fifo": "scheduler.policies.fifo:FifoPolicy",
    "binpack": "scheduler.policies.binpack:BinpackPolicy",
    "loadbalance": "scheduler.policies.loadbalance:LoadBalancePolicy",
    "random": "scheduler.policies.random_policy:RandomPolicy",
    "mystic": "scheduler.policies.mystic:MysticPolicy",
    "placement_rate": "scheduler.policies.placement_rate:PlacementRatePolicy",
    "all_gpu": "scheduler.policies.all_gpu:AllGpuPolicy",
    "exec_plan": "scheduler.policies.exec_plan:ExecPlanPolicy",
    "placement_rate+exec_plan": "scheduler.policies.exec_plan:PlacementRateExecPlan",
    "all_gpu+exec_plan": "scheduler.policies.exec_plan:AllGpuExecPlan",
    "coscheml": "scheduler.policies.coscheml:CoschemlPolicy",
    "sharing_mode": "scheduler.policies.sharing_mode:SharingModePolicy",
    "byscale": "scheduler.policies.sharing_mode:ByScalePolicy",
    "sharing_random": "scheduler.policies.sharing_mode:SharingRandomPolicy",
    "kscheduler": "scheduler.policies.kscheduler:KSchedulerPolicy",
    "even_partition": "scheduler.policies.kscheduler:EvenPartitionPolicy",
    "warped_slicer": "scheduler.policies.kscheduler:WarpedSlicerPolicy",
    "sharing_pipeline": "scheduler.policies.sharing_chain:SharingPipelinePolicy",
    "sharing_chain": "scheduler.policies.sharing_chain:SharingChainPolicy",
    "elastic": "scheduler.policies.elastic:ElasticPolicy",
    "hetero_srtf": "scheduler.policies.hetero_srtf:HeteroSrtfPolicy",
    "slowdown_dr": "scheduler.policies.slowdown_dr:SlowdownDrPolicy",
    "quota": "scheduler.policies.quota:QuotaPolicy",
    # Peers (docs/policies.md, "Peers"): published schedulers written from their papers.
    "tiresias": "scheduler.policies.tiresias:TiresiasPolicy",
    "gavel_maxmin": "scheduler.policies.gavel:GavelMaxMinPolicy",
    "gavel_ftf": "scheduler.policies.gavel:GavelFtfPolicy",
    "allox": "scheduler.policies.allox:AlloxPolicy",
    "themis": "scheduler.policies.themis:ThemisPolicy",
}

#: ``<name>+exec_plan`` works for any registered placement policy ``name`` (the execution plan
#: of seed 004 wrapped around it); the common ones are listed above.
EXEC_PLAN_SUFFIX = "+exec_plan"
#: What builds the class of ``<name>+exec_plan`` for a placement policy not listed above: a
#: path like the entries of ``POLICIES`` (the registry imports no policy module itself).
EXEC_PLAN_OVER = "scheduler.policies.exec_plan:exec_plan_over"


def available_policies() -> list[str]:
    """The registered policy names, sorted."""
    return sorted(POLICIES)


def policy_class(name: str) -> type[Policy]:
    """The class registered as ``name`` (imported on first use)."""
    path = POLICIES.get(name)
    if path is None and name.endswith(EXEC_PLAN_SUFFIX):
        base = name[: -len(EXEC_PLAN_SUFFIX)]
        if base in POLICIES and not base.endswith("exec_plan"):
            module_name, _, attr = EXEC_PLAN_OVER.partition(":")
            over = getattr(importlib.import_module(module_name), attr)
            return over(base)  # a Policy subclass, like every entry
    if path is None:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(available_policies())}")
    module_name, _, attr = path.partition(":")
    cls = getattr(importlib.import_module(module_name), attr, None)
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise PolicyError(f"policy {name!r}: {path} is not a Policy subclass")
    return cls


def build_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    """A ready policy: the class registered as ``name`` with ``params`` over its defaults.

    Raises PolicyError for an unknown name (listing the known ones) or an unknown parameter.
    """
    return policy_class(name)(**dict(params or {}))


def policy_defaults(name: str) -> dict[str, Any]:
    """The documented default parameters of policy ``name`` (for settings pages and docs)."""
    return dict(policy_class(name).defaults)

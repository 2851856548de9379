"""The policy registry: names -> lazily imported classes, built with parameters."""

from __future__ import annotations

import importlib
import inspect

import pytest

from scheduler.policies import framework
from scheduler.policies.base import Policy, PolicyError
from scheduler.policies.registry import (
    POLICIES,
    available_policies,
    build_policy,
    policy_class,
    policy_defaults,
)

BASELINES = {"fifo", "binpack", "loadbalance", "random", "mystic"}


def test_the_baselines_are_registered():
    assert set(available_policies()) >= BASELINES
    assert available_policies() == sorted(available_policies())


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_entry_builds_a_policy_named_as_registered(name):
    policy = build_policy(name)
    assert isinstance(policy, Policy)
    assert policy.name == name
    assert policy.params == dict(policy_class(name).defaults)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_parameter_is_documented(name):
    cls = policy_class(name)
    docs = (inspect.getmodule(cls).__doc__ or "") + (framework.__doc__ or "")
    for param in cls.defaults:
        assert f"``{param}``" in docs, f"{name}: parameter {param!r} is not documented"


def test_params_override_defaults():
    policy = build_policy("binpack", {"max_jobs_per_gpu": 3})
    assert policy.params["max_jobs_per_gpu"] == 3
    assert policy.params["backfill"] is True
    assert policy_defaults("fifo")["backfill"] is False


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(PolicyError) as err:
        build_policy("nope")
    for name in BASELINES:
        assert name in str(err.value)


def test_unknown_parameter_is_an_error():
    with pytest.raises(PolicyError, match="no parameter"):
        build_policy("fifo", {"max_job_per_gpu": 1})
    with pytest.raises(PolicyError, match="share_mode"):
        build_policy("binpack", {"share_mode": "magic"})
    with pytest.raises(PolicyError, match="no scorer"):
        build_policy("binpack", {"weights": {"speed": 1.0}})


def test_lazy_import_and_bad_path(monkeypatch):
    monkeypatch.setitem(POLICIES, "broken", "scheduler.policies.registry:available_policies")
    with pytest.raises(PolicyError, match="not a Policy"):
        build_policy("broken")
    monkeypatch.setitem(POLICIES, "missing", "scheduler.policies.nowhere:Nothing")
    with pytest.raises(ModuleNotFoundError):
        build_policy("missing")
    # Registering is data: the module is imported only when the policy is built.
    assert importlib.import_module("scheduler.policies.registry").POLICIES is POLICIES

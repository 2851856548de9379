"""A policy configuration that fails at run time does not stop scheduling (issue 18, part 1):
the loop runs the last configuration that worked, stores the error where the cluster page and
the admin show it, logs it once (not every cycle) and clears it when the configuration works
again."""

from __future__ import annotations

import logging

import pytest

from portal.core.models import Gpu, Job, Node, PolicySettings
from portal.core.scheduling import run_cycle
from scheduler.policies import registry
from scheduler.policies.fifo import FifoPolicy

pytestmark = pytest.mark.django_db

BROKEN = {"fail": True}  # flipped by the tests: the policy raises while deciding when true


class _Fragile(FifoPolicy):
    """fifo that raises while deciding (not when built: validation on save would catch that)."""

    name = "fragile"

    def schedule(self, state, rng):
        if BROKEN["fail"]:
            raise ZeroDivisionError("division by zero in the fragile policy")
        return super().schedule(state, rng)


@pytest.fixture(autouse=True)
def fragile(monkeypatch):
    monkeypatch.setitem(registry.POLICIES, "fragile", f"{__name__}:_Fragile")
    BROKEN["fail"] = True
    node = Node.objects.create(name="g1", kind="gpu", cores=8, memory_mb=65536)
    for i in range(2):
        Gpu.objects.create(
            node=node,
            index=i,
            model="TitanXp",
            memory_mb=12288,
            uuid=f"GPU-g1-{i}",
            sharing_modes=["exclusive", "time_slicing", "mps"],
        )


def _submit(owner, name: str) -> Job:
    # Allows sharing (docs/jobs.md), so binpack packs the third job beside another.
    return Job.objects.create(
        owner=owner, name=name, command="true", gpus=1, gpu_memory_mb=1000, sharing="allowed"
    )


def _errors(caplog) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and "failed at run time" in r.getMessage()
    ]


def test_the_last_good_configuration_keeps_scheduling_and_the_error_is_logged_once(alice, caplog):
    row = PolicySettings.objects.create(
        name="main", policy="binpack", params={"max_jobs_per_gpu": 3}, active=True
    )
    first = _submit(alice, "first")
    assert run_cycle().placed == [first.pk]  # binpack worked: it is the last good one
    row.refresh_from_db()
    assert (row.last_good_policy, row.last_good_params) == ("binpack", {"max_jobs_per_gpu": 3})

    row.policy, row.params = "fragile", {}
    row.save()
    caplog.set_level(logging.DEBUG, logger="portal.core.scheduling")
    second = _submit(alice, "second")
    result = run_cycle()
    assert result.placed == [second.pk]  # placed by the fallback, not stuck PENDING
    assert result.fallback == 'binpack {"max_jobs_per_gpu": 3}'
    row.refresh_from_db()
    assert row.runtime_error == "ZeroDivisionError: division by zero in the fragile policy"
    assert row.runtime_error_at is not None
    assert row.runtime_fallback == 'binpack {"max_jobs_per_gpu": 3}'
    assert (row.last_good_policy, row.policy) == ("binpack", "fragile")

    third = _submit(alice, "third")
    result = run_cycle()
    assert result.placed == [third.pk]
    run_cycle()
    assert len(_errors(caplog)) == 1  # three failing cycles, one error line (with traceback)
    assert _errors(caplog)[0].exc_info is not None

    BROKEN["fail"] = False  # the configuration works again
    fourth = _submit(alice, "fourth")
    result = run_cycle()
    assert result.placed == [fourth.pk] and result.fallback == ""
    row.refresh_from_db()
    assert (row.runtime_error, row.runtime_fallback, row.runtime_error_at) == ("", "", None)
    assert (row.last_good_policy, row.last_good_params) == ("fragile", {})
    assert any("work again" in r.getMessage() for r in caplog.records)


def test_without_a_configuration_that_ever_worked_fifo_runs(alice):
    PolicySettings.objects.create(name="main", policy="fragile", params={}, active=True)
    job = _submit(alice, "a")
    result = run_cycle()
    assert result.placed == [job.pk] and result.fallback == "fifo"


def test_a_stored_configuration_with_a_bad_parameter_falls_back_too(alice):
    """Saved before validation existed (or written straight to the database)."""
    PolicySettings.objects.create(
        name="main", policy="binpack", params={"max_jobs_per_gpu": "lots"}, active=True
    )
    job = _submit(alice, "a")
    result = run_cycle()
    assert result.placed == [job.pk] and result.fallback == "fifo"
    row = PolicySettings.objects.get(name="main")
    assert "max_jobs_per_gpu" in row.runtime_error


def test_the_cluster_page_and_the_admin_show_the_error(alice, staff, client):
    PolicySettings.objects.create(name="main", policy="fragile", params={}, active=True)
    _submit(alice, "a")
    run_cycle()
    row = PolicySettings.objects.get(name="main")

    client.force_login(staff)
    html = client.get("/cluster/").content.decode()
    assert 'id="policy-runtime-error"' in html
    assert "division by zero in the fragile policy" in html
    assert "the scheduler keeps running the last configuration that worked" in html
    admin_html = client.get(f"/admin/core/policysettings/{row.pk}/change/").content.decode()
    assert 'id="policy-runtime-error"' in admin_html
    assert "division by zero in the fragile policy" in admin_html
    listing = client.get("/admin/core/policysettings/").content.decode()
    assert "failed at run time: ZeroDivisionError" in listing

    client.force_login(alice)  # a user sees that it failed, not the error's text
    html = client.get("/cluster/").content.decode()
    assert 'id="policy-runtime-error"' in html
    assert "division by zero" not in html
    assert "Administrators have to fix it" in html

    BROKEN["fail"] = False
    run_cycle()
    client.force_login(staff)
    assert 'id="policy-runtime-error"' not in client.get("/cluster/").content.decode()


def test_saving_a_new_configuration_in_the_admin_clears_the_old_error(alice, staff, client):
    row = PolicySettings.objects.create(name="main", policy="fragile", params={}, active=True)
    _submit(alice, "a")
    run_cycle()
    row.refresh_from_db()
    assert row.runtime_error
    client.force_login(staff)
    data = {"name": "main", "policy": "fifo", "active": "on", "param__backfill": "on"}
    response = client.post(f"/admin/core/policysettings/{row.pk}/change/", data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    row.refresh_from_db()
    assert (row.policy, row.runtime_error, row.runtime_fallback) == ("fifo", "", "")

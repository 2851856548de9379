"""`run_embedded --run-jobs-as`: the embedded default can run its jobs as another account (the
agents' own option; docs/security.md), and refuses what this process cannot do."""

from __future__ import annotations

import os

import pytest
from django.core.management.base import CommandError

from portal.core.management.commands.run_embedded import _job_users


def test_by_default_jobs_run_as_this_process():
    assert _job_users(None) is None  # NodeAgent's default: JobUsers.single()


def test_an_unknown_account_is_refused_with_its_name():
    with pytest.raises(CommandError, match="no-such-account-x7"):
        _job_users("no-such-account-x7")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching accounts needs root")
def test_as_root_one_named_account_runs_every_job():
    users = _job_users("nobody")
    assert (users.mode, users.account) == ("single", "nobody")
    assert users.account_for("alice").name == "nobody"

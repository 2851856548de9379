"""A request whose database connection is terminated under it (``pg_terminate_backend`` on a
real PostgreSQL, issue 29 part 3): a GET runs once more on a fresh connection and answers 200;
a write, or a GET that loses its connection twice, is a 503 with ``Retry-After``, never a 500.
"""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection
from django.test import Client

from portal.core.models import Job
from portal.core.request_guards import RETRY_AFTER_S
from portal.core.services import job_submit

pytestmark = pytest.mark.django_db(transaction=True)


def _terminate(pid: int) -> None:
    """Terminate backend ``pid`` from a connection of its own, as an operator (or a failover)
    would."""
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    params.pop("prepare_threshold", None)
    with psycopg.connect(**params, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", [pid])


class Killer:
    """An execute wrapper: the first ``times`` queries on ``table`` find their connection
    terminated just before they run."""

    def __init__(self, table: str, times: int) -> None:
        self.table, self.left, self.killed = table, times, 0

    def __call__(self, execute, sql, params, many, context):  # noqa: ANN001, ANN204
        if self.left and self.table in sql:
            self.left -= 1
            self.killed += 1
            _terminate(connection.connection.info.backend_pid)
        return execute(sql, params, many, context)


@pytest.fixture
def client(alice):
    assert connection.vendor == "postgresql"
    job_submit(alice, name="kept", command="true")
    client = Client()
    client.force_login(alice)
    return client


def test_a_get_whose_connection_dies_is_retried_once_on_a_fresh_one(client):
    killer = Killer('"core_job"', times=1)
    with connection.execute_wrapper(killer):
        response = client.get("/api/v1/jobs/")
    assert killer.killed == 1
    assert response.status_code == 200, response.content
    assert [job["name"] for job in response.json()["results"]] == ["kept"]


def test_a_get_that_loses_its_connection_twice_is_a_503_with_retry_after(client):
    killer = Killer('"core_job"', times=2)
    with connection.execute_wrapper(killer):
        response = client.get("/api/v1/jobs/")
    assert killer.killed == 2
    assert response.status_code == 503
    assert response["Retry-After"] == str(RETRY_AFTER_S)
    assert "connection was lost" in response.json()["detail"]
    assert client.get("/api/v1/jobs/").status_code == 200  # and the next request is served


def test_a_write_whose_connection_dies_is_a_503_not_retried(client):
    killer = Killer('INSERT INTO "core_job"', times=1)
    with connection.execute_wrapper(killer):
        response = client.post(
            "/api/v1/jobs/", {"name": "new", "command": "true"}, content_type="application/json"
        )
    assert killer.killed == 1
    assert response.status_code == 503
    assert response["Retry-After"] == str(RETRY_AFTER_S)
    assert not Job.objects.filter(name="new").exists()  # rolled back with its connection


def test_a_browser_page_whose_connection_dies_is_retried(client):
    killer = Killer('"core_job"', times=1)
    with connection.execute_wrapper(killer):
        response = client.get("/jobs/")
    assert killer.killed == 1
    assert response.status_code == 200
    assert "kept" in response.content.decode()

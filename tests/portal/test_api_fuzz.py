"""A property-based fuzz of the REST API (issue 12, part 6): schemathesis generates requests
from ``/api/schema/`` (valid and invalid ones) for every operation and checks each answer.

Bounded: ``EXAMPLES`` requests per operation, in process (WSGI), as a staff user with a named
token, so every operation is reachable. The checks: no 5xx ever; every documented answer
matches its schema (required ``command``, nullable fields, the import error shape, ...); the
content type is the documented one.

Schemathesis' ``positive_data_acceptance`` check is left out on purpose: the schema cannot say
every rule a submission meets (text without NUL characters, admission against the registered
cluster, known states in filters), so a request the schema allows may rightly be a 400 naming
the field. Those rules have their own tests (test_hardening.py, test_admission.py).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from portal.core.models import ApplicationProfile, Gpu, Node
from portal.core.services import job_submit
from portal.front.services import token_create

EXAMPLES = 12
COVERAGE_PHASE = False
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


@pytest.fixture
def api_schema(db, staff, monkeypatch):
    from django.core.cache import cache
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections
    from rest_framework.throttling import SimpleRateThrottle

    from portal.wsgi import application

    cache.clear()
    monkeypatch.setattr(
        SimpleRateThrottle,
        "THROTTLE_RATES",
        {"anon": "100000/min", "user": "100000/min", "token": "100000/min"},
    )
    node = Node.objects.create(name="gpu-1", kind="gpu", cores=16, memory_mb=65536)
    Gpu.objects.create(node=node, index=0, model="V100", memory_mb=16384)
    Node.objects.create(name="cpu-1", kind="cpu", cores=8, memory_mb=32768)
    ApplicationProfile.objects.create(name="LAMMPS", kind="hpc", status="approved")
    job_submit(staff, name="seed", command="true")
    _, key = token_create(staff, name="fuzz")
    # As Django's test client does: the in-process requests must not close the test's connection.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)
        schema.key = key
        # The coverage phase (every boundary value of every parameter) alone takes minutes;
        # the bounded run keeps the explicit examples and the random (fuzzing) phase.
        schema.config.phases.coverage.enabled = COVERAGE_PHASE
        yield schema
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
    print_blob=True,
)
def test_the_api_never_fails_and_answers_as_documented(case, api_schema):
    case.call_and_validate(headers={"Authorization": f"Token {api_schema.key}"}, checks=CHECKS)

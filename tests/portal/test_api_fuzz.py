"""A property-based fuzz of the REST API (issue 12, part 6; issue 29, part 5): schemathesis
generates requests from ``/api/schema/`` (valid and invalid ones) for every operation and runs
**all** its checks on each answer: no 5xx; every status documented; every documented answer
matches its schema and content type; invalid requests rejected (``page_size=null`` included);
valid requests accepted; authentication not ignored; deleted objects gone.

Bounded: ``EXAMPLES`` requests per operation, in process (WSGI), as a staff user with a named
token, so every operation is reachable; well under a minute.

One check is left out on a few operations, and only there (``POSITIVE_DATA_EXEMPT``): whether
a request the schema allows is accepted. What those operations take cannot be said in
OpenAPI: the profile import reads a file (CSV, JSON, profiler output) whose rows are checked,
and a usage window needs ``until`` after ``since`` and at most the longest window back; a
submission is admitted against the registered cluster (a job asking more GPUs than exist is a
400 naming the field); a profile written through the API is checked with the import's rules
(GPU models of the catalogue, memory steps in order and under the stated maximum); history
windows are spans or dates at most a limit back; a profiling run names an existing profile; a
node operation depends on the node's state. Those rules have their own tests (test_import.py,
test_usage_windows.py, test_admission.py, test_api_profiles.py, test_job_semantics.py,
test_profiling.py, test_node_ops.py, test_api_bulk.py).
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from portal.core.models import ApplicationProfile, Gpu, Node
from portal.core.services import job_submit
from portal.front.services import token_create

EXAMPLES = 12
COVERAGE_PHASE = False
POSITIVE_DATA_EXEMPT = {
    ("POST", "/api/v1/profiles/import/"),
    ("GET", "/api/v1/usage/"),
    ("POST", "/api/v1/jobs/"),
    ("POST", "/api/v1/profiles/"),
    ("PUT", "/api/v1/profiles/{id}/"),
    ("PATCH", "/api/v1/profiles/{id}/"),
    # History windows (finished_since / finished_until) are spans or dates, at most a limit back.
    ("GET", "/api/v1/jobs/"),
    # Admitted against the cluster like a single submission, job by job.
    ("POST", "/api/v1/jobs/bulk/"),
    # A profiling run names a profile that must exist, and GPU models of the cluster.
    ("GET", "/api/v1/profiling/"),
    ("POST", "/api/v1/profiling/"),
    # Node operations depend on the node's state (a node that is up cannot be resumed; one
    # taken down cannot be drained) and drain/down need a reason that says something.
    ("POST", "/api/v1/nodes/{id}/drain/"),
    ("POST", "/api/v1/nodes/{id}/down/"),
    ("POST", "/api/v1/nodes/{id}/resume/"),
}


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
    exempt = (case.operation.method.upper(), case.operation.path) in POSITIVE_DATA_EXEMPT
    case.call_and_validate(
        headers={"Authorization": f"Token {api_schema.key}"},
        excluded_checks=[positive_data_acceptance] if exempt else None,
    )

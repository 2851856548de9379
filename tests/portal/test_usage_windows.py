"""The Usage page and ``/api/v1/usage/`` for every view and window (issues 25 and 29): every
grouping the page offers, JSON, CSV and the page, answers 200 for every window from one minute to
ten years; a window further back than the limit is a 400 naming it, and the CLI says so instead of
"try again later"."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from portal.front.services import token_create
from portal.teams.accounting import BY_CHOICES, MAX_WINDOW_DAYS
from tests.portal.test_cli import run_cli
from tests.portal.test_teams_accounting import carol, history  # noqa: F401  (fixtures)

pytestmark = pytest.mark.django_db

WINDOWS = ["1m", "30m", "1h", "24h", "7d", "2w", "30d", "365d", "3650d", "521w", "2016-11-01"]
TOO_FAR = ["1000000000d", "99999999999w", "36501d", "999999999999m"]


@pytest.mark.parametrize("by", [None, *BY_CHOICES])
def test_every_view_answers_for_every_window(history, alice, client, by):  # noqa: F811
    api = APIClient()
    api.force_authenticate(alice)
    client.force_login(alice)
    base = {} if by is None else {"by": by}
    assert client.get("/usage/", base).status_code == 200  # the default window too
    assert api.get("/api/v1/usage/", base).status_code == 200
    for since in WINDOWS:
        params = {**base, "since": since}
        for fmt in (None, "csv"):
            query = params if fmt is None else {**params, "format": fmt}
            response = api.get("/api/v1/usage/", query)
            assert response.status_code == 200, (query, response.content)
            page = client.get("/usage/", query)
            assert page.status_code == 200, (query, page.content[:300])
    rows = api.get("/api/v1/usage/", {**base, "since": "3650d"}).json()["rows"]
    assert rows, "ten years back holds the fixture's jobs"
    html = client.get("/usage/", {**base, "since": "3650d"}).content.decode()
    assert 'value="3650d"' in html and "No jobs in this window" not in html


@pytest.mark.parametrize("since", TOO_FAR)
def test_a_window_past_the_limit_is_a_400_naming_it(history, alice, client, since):  # noqa: F811
    api = APIClient()
    api.force_authenticate(alice)
    response = api.get("/api/v1/usage/", {"since": since, "by": "user"})
    assert response.status_code == 400
    assert f"{MAX_WINDOW_DAYS:,} days" in response.json()["since"][0]
    client.force_login(alice)
    page = client.get("/usage/", {"since": since})
    assert page.status_code == 400
    assert f"{MAX_WINDOW_DAYS:,} days" in page.content.decode()
    # A date as far back is the same error; a span written with other digits is not a span.
    old = api.get("/api/v1/usage/", {"since": "0001-01-01"})
    assert old.status_code == 400 and f"{MAX_WINDOW_DAYS:,} days" in old.json()["since"][0]
    assert api.get("/api/v1/usage/", {"since": "\u00b2d"}).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_the_cli_reports_the_limit_not_a_server_failure(live_server, history, alice):  # noqa: F811
    _, key = token_create(alice, name="ci")
    bad = run_cli("usage", "--since", "1000000000d", url=live_server.url, token=key)
    assert bad.code == 2, bad.err
    assert "the server rejected the options:\n  since:" in bad.err
    assert f"{MAX_WINDOW_DAYS:,} days" in bad.err and "try again later" not in bad.err

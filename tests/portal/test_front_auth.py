"""Log-in, log-out and the log-in wall in front of every page."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db

PAGES = [
    "/",
    "/jobs/",
    "/jobs/new/",
    "/jobs/1/",
    "/profiles/",
    "/profiles/1/",
    "/cluster/",
    "/account/",
]


@pytest.mark.parametrize("path", PAGES)
def test_every_page_redirects_an_anonymous_visitor_to_log_in(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={path}"


def test_log_in_page_renders_without_javascript(client):
    response = client.get("/login/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'name="username"' in html and 'name="password"' in html
    assert "<script" not in html


def test_logging_in_lands_on_the_jobs_page(client, alice):
    response = client.post("/login/", {"username": "alice", "password": "alice-pass-123"})
    assert response.status_code == 302
    assert response["Location"] == "/jobs/"
    assert client.get("/jobs/").status_code == 200


def test_a_wrong_password_is_refused_with_a_message(client, alice):
    response = client.post("/login/", {"username": "alice", "password": "nope"})
    assert response.status_code == 200
    assert "correct username and password" in response.content.decode()


def test_log_out_is_a_post_and_ends_the_session(client, alice):
    client.force_login(alice)
    assert client.get("/logout/").status_code == 405
    response = client.post("/logout/")
    assert response.status_code == 302
    assert client.get("/jobs/").status_code == 302


def test_navigation_links_every_section_and_a_log_out_form(client, alice):
    client.force_login(alice)
    html = client.get("/jobs/").content.decode()
    for href in [
        'href="/jobs/"',
        'href="/jobs/new/"',
        'href="/profiles/"',
        'href="/cluster/"',
        'href="/api/docs/"',
        'href="/account/"',
        'action="/logout/"',
    ]:
        assert href in html
    assert 'href="/admin/"' not in html


def test_staff_get_an_admin_link(client, staff):
    client.force_login(staff)
    assert 'href="/admin/"' in client.get("/jobs/").content.decode()

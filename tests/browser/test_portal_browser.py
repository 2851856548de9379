"""The portal in a real browser: log in, submit a job through the form, find it on its page and
in "my jobs". Screenshots of each step go to var/test-artifacts/screenshots/."""

from __future__ import annotations

import pytest

from portal.core.models import Job
from tests.browser.helpers import login, screenshot, wait_for

By = pytest.importorskip("selenium.webdriver.common.by").By


def _text(browser, selector: str) -> str:
    return browser.find_element(By.CSS_SELECTOR, selector).text


def test_log_in_submit_a_job_and_see_it_pending_on_its_page_and_in_my_jobs(
    browser, live_server, alice, bob
):
    login(browser, live_server, alice, "alice-pass-123")
    screenshot(browser, "1-logged-in")
    assert "alice" in _text(browser, ".nav-user")

    browser.find_element(By.LINK_TEXT, "Submit").click()
    wait_for(browser, lambda b: b.find_elements(By.ID, "id_name"), "the submit form")
    browser.find_element(By.ID, "id_name").send_keys("browser-smoke")
    browser.find_element(By.ID, "id_command").send_keys("python -c 'print(42)'")
    gpus = browser.find_element(By.ID, "id_gpus")
    gpus.clear()
    gpus.send_keys("0")
    screenshot(browser, "2-submit-form")
    browser.find_element(By.CSS_SELECTOR, ".form-actions button[type=submit]").click()

    wait_for(browser, lambda b: "/jobs/new/" not in b.current_url, "leaving the submit form")
    job = Job.objects.get(name="browser-smoke")
    assert browser.current_url == f"{live_server.url}/jobs/{job.pk}/"
    screenshot(browser, "3-job-detail")
    assert _text(browser, "h1").splitlines()[0] == "browser-smoke"
    assert _text(browser, "h1 span") == "PENDING"
    assert job.owner == alice and job.state == "PENDING"
    assert job.command == "python -c 'print(42)'" and job.gpus == 0

    # Someone else's job must not appear in alice's list.
    Job.objects.create(owner=bob, name="bobs-job", command="true")
    browser.find_element(By.LINK_TEXT, "Jobs").click()
    wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "table.table"), "the jobs table")
    screenshot(browser, "4-my-jobs")
    rows = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "table.table tbody tr")]
    assert len(rows) == 1, rows
    assert f"#{job.pk}" in rows[0] and "browser-smoke" in rows[0] and "PENDING" in rows[0]


def test_a_wrong_password_is_refused_with_a_message(browser, live_server, alice):
    browser.get(f"{live_server.url}/jobs/")
    wait_for(browser, lambda b: "/login/" in b.current_url, "the log-in wall")
    browser.find_element(By.ID, "id_username").send_keys("alice")
    browser.find_element(By.ID, "id_password").send_keys("not-her-password")
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
    errors = wait_for(
        browser, lambda b: b.find_elements(By.CSS_SELECTOR, ".form-errors"), "the log-in error"
    )
    screenshot(browser, "refused")
    assert "correct username and password" in errors[0].text
    assert not browser.find_elements(By.CSS_SELECTOR, ".nav-user")

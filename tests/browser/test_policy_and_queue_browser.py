"""In a real browser: a staff user cannot save an unknown policy or a bad parameter (the admin
form answers with field errors and stores nothing); the cluster page's queue shows why a job
waits, before and after the page's own refresh. Screenshots go to
var/test-artifacts/screenshots/."""

from __future__ import annotations

import pytest

from portal.core.models import Job, Node, PolicySettings
from portal.core.services import job_submit
from tests.browser.helpers import login, screenshot, wait_for

By = pytest.importorskip("selenium.webdriver.common.by").By
Select = pytest.importorskip("selenium.webdriver.support.ui").Select

ADD = "/admin/core/policysettings/add/"


def _errors(browser) -> str:
    return " ".join(e.text for e in browser.find_elements(By.CSS_SELECTOR, ".errorlist"))


def _save(browser) -> None:
    browser.find_element(By.CSS_SELECTOR, "input[name=_save]").click()
    wait_for(
        browser,
        lambda b: b.find_elements(By.CSS_SELECTOR, ".errornote, .messagelist"),
        "the admin's answer",
    )


def test_staff_cannot_save_an_unknown_policy_or_a_bad_parameter(browser, live_server, staff):
    login(browser, live_server, staff, "sam-pass-123")
    browser.get(live_server.url + ADD)
    wait_for(browser, lambda b: b.find_elements(By.ID, "id_policy"), "the policy form")
    options = [
        o.get_attribute("value") for o in Select(browser.find_element(By.ID, "id_policy")).options
    ]
    assert "placement_rate+exec_plan" in options and "banana" not in options
    browser.find_element(By.ID, "id_name").clear()
    browser.find_element(By.ID, "id_name").send_keys("main")
    screenshot(browser, "1-policy-form")

    # An unknown policy, forced into the select as a crafted request would send it.
    browser.execute_script(
        "var s = document.getElementById('id_policy');"
        "var o = document.createElement('option'); o.value = o.text = 'banana';"
        "s.appendChild(o); s.value = 'banana';"
    )
    _save(browser)
    screenshot(browser, "2-unknown-policy")
    assert "Select a valid choice. banana is not one of the available choices." in _errors(browser)

    # Choosing a policy reloads the form with that policy's parameters (the name is kept).
    Select(browser.find_element(By.ID, "id_policy")).select_by_value("fifo")
    wait_for(browser, lambda b: "policy=fifo" in b.current_url, "the form for fifo")
    wait_for(
        browser, lambda b: b.find_elements(By.ID, "id_param__max_jobs_per_gpu"), "fifo's fields"
    )
    assert browser.find_element(By.ID, "id_name").get_attribute("value") == "main"
    # A parameter that is not a number, then one out of its documented range.
    browser.execute_script(
        "var f = document.getElementById('id_param__max_jobs_per_gpu');"
        "f.type = 'text'; f.value = 'lots';"
    )
    _save(browser)
    screenshot(browser, "3-not-a-number")
    assert "Enter a whole number." in _errors(browser)
    field = browser.find_element(By.ID, "id_param__max_jobs_per_gpu")
    browser.execute_script("arguments[0].value = '0';", field)
    _save(browser)
    screenshot(browser, "4-out-of-range")
    assert "Ensure this value is greater than or equal to 1." in _errors(browser)
    assert not PolicySettings.objects.filter(name="main").exists()

    # A good value saves.
    field = browser.find_element(By.ID, "id_param__max_jobs_per_gpu")
    browser.execute_script("arguments[0].value = '3';", field)
    _save(browser)
    screenshot(browser, "5-saved")
    row = PolicySettings.objects.get(name="main")
    assert (row.policy, row.params) == ("fifo", {"max_jobs_per_gpu": 3})


def test_the_queue_shows_why_each_job_waits(browser, live_server, alice, bob):
    Node.objects.create(name="cpu-1", kind="cpu", cores=4)
    mine, _ = job_submit(alice, name="alice-wide", command="run", cpus=4)
    theirs, _ = job_submit(bob, name="bob-private", command="run", cpus=2)
    Job.objects.filter(pk=mine.pk).update(waiting_reason="needs 4 free cores; cpu-1 has 2")
    Job.objects.filter(pk=theirs.pk).update(waiting_reason="behind the job ahead of it")
    login(browser, live_server, alice, "alice-pass-123")
    browser.get(live_server.url + "/cluster/")
    wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "#queue-rows tr"), "the queue")
    screenshot(browser, "1-queue")
    rows = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "#queue-rows tr")]
    assert f"#{mine.pk} alice-wide" in rows[0] and "needs 4 free cores; cpu-1 has 2" in rows[0]
    assert "another user's job" in rows[1] and "behind the job ahead of it" in rows[1]
    assert "bob-private" not in browser.page_source

    # The page refreshes the queue itself: a new reason appears without a reload.
    Job.objects.filter(pk=mine.pk).update(waiting_reason="needs 4 free cores; cpu-1 has 3")
    wait_for(
        browser,
        lambda b: "cpu-1 has 3" in b.find_element(By.ID, "queue-rows").text,
        "the refreshed waiting reason",
    )
    screenshot(browser, "2-queue-refreshed")

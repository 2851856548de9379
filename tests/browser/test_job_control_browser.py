"""In a real browser (docs/job-control.md): the submit form's dependency, array, hold and
output fields; the array page listing the tasks; a held job released and a pending job
edited from its page; the full log's download link. Screenshots go to
var/test-artifacts/screenshots/."""

from __future__ import annotations

import pytest

from portal.core.models import Job, JobLogChunk
from portal.core.services import job_submit
from tests.browser.helpers import login, screenshot, wait_for

By = pytest.importorskip("selenium.webdriver.common.by").By

pytestmark = pytest.mark.django_db(transaction=True)


def _submit(browser, live_server, **fields: str) -> None:
    browser.get(f"{live_server.url}/jobs/new/")
    wait_for(browser, lambda b: b.find_elements(By.ID, "id_array"), "the submit form")
    browser.find_element(By.CSS_SELECTOR, "#job-control-fields summary").click()
    for name, value in fields.items():
        element = browser.find_element(By.ID, f"id_{name}")
        if name == "held":
            element.click()
        else:
            element.send_keys(value)
    browser.find_element(By.CSS_SELECTOR, ".form-actions button[type=submit]").click()
    wait_for(browser, lambda b: "/jobs/new/" not in b.current_url, "leaving the submit form")


def test_an_array_with_a_limit_through_the_form_and_its_page(browser, live_server, alice):
    login(browser, live_server, alice, "alice-pass-123")
    _submit(
        browser, live_server, name="sweep", command="echo $COSCHED_ARRAY_TASK_ID",
        array="0-11%4", output="out/%j_%a.log",
    )  # fmt: skip
    first = Job.objects.get(name="sweep", array_index=0)
    assert browser.current_url == f"{live_server.url}/jobs/array/{first.pk}/"
    summary = browser.find_element(By.ID, "array-summary").text
    assert summary.startswith("12 tasks, at most 4 running at once: 12 PENDING"), summary
    rows = browser.find_elements(By.CSS_SELECTOR, "#array-tasks tbody tr")
    assert [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows] == [str(i) for i in range(12)]
    screenshot(browser, "job-control-1-array-page")
    rows[5].find_element(By.TAG_NAME, "a").click()
    wait_for(browser, lambda b: b.find_elements(By.ID, "job-array"), "a task's page")
    assert browser.find_element(By.ID, "job-array").text.startswith(f"task 5 of array #{first.pk}")
    assert Job.objects.get(array_of=first, array_index=5).output_path == "out/%j_%a.log"


def test_a_held_dependent_job_is_released_and_edited_from_its_page(browser, live_server, alice):
    before, _ = job_submit(alice, name="before", command="true")
    login(browser, live_server, alice, "alice-pass-123")
    _submit(
        browser, live_server, name="after", command="true",
        dependencies=f"afterok:{before.pk}", held="on",
    )  # fmt: skip
    job = Job.objects.get(name="after")
    assert job.held and job.dependencies == [{"type": "afterok", "job": before.pk}]
    assert browser.current_url == f"{live_server.url}/jobs/{job.pk}/"
    assert browser.find_element(By.ID, "job-dependencies").text == f"afterok #{before.pk}"
    screenshot(browser, "job-control-2-held")
    browser.find_element(By.ID, "job-release").click()
    wait_for(browser, lambda b: b.find_elements(By.ID, "job-hold"), "the Hold button back")
    assert not Job.objects.get(pk=job.pk).held

    browser.find_element(By.ID, "job-edit").click()
    wait_for(browser, lambda b: b.find_elements(By.ID, "id_cpus"), "the edit form")
    cpus = browser.find_element(By.ID, "id_cpus")
    cpus.clear()
    cpus.send_keys("0")  # refused, naming the field
    browser.find_element(By.CSS_SELECTOR, ".form-actions button[type=submit]").click()
    wait_for(browser, lambda b: b.find_elements(By.ID, "id_cpus_error"), "the field's error")
    cpus = browser.find_element(By.ID, "id_cpus")
    cpus.clear()
    cpus.send_keys("3")
    limit = browser.find_element(By.ID, "id_time_limit")
    limit.clear()
    limit.send_keys("2h")
    screenshot(browser, "job-control-3-edit")
    browser.find_element(By.CSS_SELECTOR, ".form-actions button[type=submit]").click()
    wait_for(browser, lambda b: b.current_url.endswith(f"/jobs/{job.pk}/"), "the job page")
    job.refresh_from_db()
    assert (job.cpus, job.time_limit_s) == (3, 7200)


def test_the_job_page_links_the_full_log(browser, live_server, alice):
    job, _ = job_submit(alice, name="logged", command="true")
    JobLogChunk.objects.create(job=job, attempt=1, seq=0, size=6, text="hello\n")
    login(browser, live_server, alice, "alice-pass-123")
    browser.get(f"{live_server.url}/jobs/{job.pk}/")
    link = wait_for(browser, lambda b: b.find_elements(By.ID, "job-log-full"), "the link")[0]
    assert link.get_attribute("href") == f"{live_server.url}/api/v1/jobs/{job.pk}/log/full/"
    assert link.get_attribute("download") is not None  # a download, not a page
    text = browser.execute_async_script(  # what the link gives, in the page's own session
        "const done = arguments[arguments.length - 1];"
        "fetch(arguments[0]).then(r => r.text()).then(done);",
        link.get_attribute("href"),
    )
    assert text == "hello\n"

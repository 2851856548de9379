"""In a real browser: a job submitted with a time limit through the form runs for real (the
embedded loop: scheduling cycles and an in-process node agent whose job is a real subprocess)
and, once past its limit, is stopped and shows ``FAILED (time limit)`` on its page, which the
page's own refresh brings without a reload. A staff member preempts a running emulated job
with the job page's button: the attempts table lists the preempted attempt with the reason, and
attempt 2 resumes from the checkpoint. Screenshots go to var/test-artifacts/screenshots/.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from portal.core.models import Job, Node
from tests.browser.helpers import login, screenshot, wait_for
from tests.embedded import embedded_loop

By = pytest.importorskip("selenium.webdriver.common.by").By

NODE = "browser-cpu-1"
LIVE_WAIT_S = 40.0  # a loaded 2-core machine; the job page refreshes every 3 s


@pytest.fixture
def embedded(transactional_db, settings, tmp_path) -> Iterator[list[Any]]:
    Node.objects.create(name=NODE, kind="cpu", cores=4, memory_mb=8192, backend="virtual")
    settings.COSCHED = {**settings.COSCHED, "STOP_GRACE_S": 1.0}
    with embedded_loop(settings, tmp_path / "logs") as agents:
        assert [a.name for a in agents] == [NODE]
        yield agents


def test_a_job_over_its_time_limit_ends_failed_time_limit(browser, live_server, alice, embedded):
    login(browser, live_server, alice, "alice-pass-123")
    browser.get(f"{live_server.url}/jobs/new/")
    wait_for(browser, lambda b: b.find_elements(By.ID, "id_time_limit"), "the submit form")
    browser.find_element(By.ID, "id_name").send_keys("too-long")
    browser.find_element(By.ID, "id_command").send_keys("echo started; sleep 120")
    browser.find_element(By.ID, "id_time_limit").send_keys("5s")
    screenshot(browser, "1-submit-with-time-limit")
    browser.find_element(By.CSS_SELECTOR, ".form-actions button[type=submit]").click()
    wait_for(browser, lambda b: "/jobs/new/" not in b.current_url, "leaving the submit form")
    job = Job.objects.get(name="too-long")
    assert job.time_limit_s == 5 and job.gpus == 0
    assert browser.current_url == f"{live_server.url}/jobs/{job.pk}/"
    assert browser.find_element(By.ID, "job-time-limit").text.startswith("00:00:05")

    # The page was loaded before the job could fail; its own refresh brings FAILED (time limit)
    # (and usually RUNNING on the way, unless a loaded machine's poll misses those seconds).
    state = lambda b: b.find_element(By.ID, "job-state").text  # noqa: E731
    assert state(browser) in ("PENDING", "SCHEDULED", "RUNNING")
    seen = wait_for(
        browser,
        lambda b: state(b) in ("RUNNING", "FAILED (time limit)") and state(b),
        "the job RUNNING",
        LIVE_WAIT_S,
    )
    screenshot(browser, f"2-{seen.split()[0].lower()}")
    wait_for(
        browser, lambda b: state(b) == "FAILED (time limit)", "FAILED (time limit)", LIVE_WAIT_S
    )
    screenshot(browser, "3-failed-time-limit")

    job.refresh_from_db()
    assert job.state == "FAILED" and job.failure_reason.startswith("time limit 00:00:05")
    browser.refresh()
    wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "dd.failure"), "the reason")
    assert "time limit 00:00:05 reached" in browser.find_element(By.CSS_SELECTOR, "dd.failure").text
    assert state(browser) == "FAILED (time limit)"
    outcome = browser.find_element(By.CSS_SELECTOR, "#attempts tbody tr").text
    assert "Failed" in outcome and "time limit" in outcome
    screenshot(browser, "4-after-reload")


def test_staff_preempt_a_running_job_from_its_page_and_it_resumes(
    browser, live_server, alice, staff, embedded
):
    from portal.core.services import job_submit

    command = (
        "exec python -m workers.emulate --profile b --duration 8 --report-every 0.2 "
        "--checkpoint-every 0.3"
    )
    job, _ = job_submit(alice, name="preempt-me", command=command)
    agent = embedded[0]
    checkpoint = agent.checkpoint_dir(job.pk) / "emulate.json"
    login(browser, live_server, staff, "sam-pass-123")
    browser.get(f"{live_server.url}/jobs/{job.pk}/")
    state = lambda b: b.find_element(By.ID, "job-state").text  # noqa: E731
    wait_for(browser, lambda b: state(b) == "RUNNING", "the job RUNNING", LIVE_WAIT_S)
    wait_for(browser, lambda b: checkpoint.exists(), "a first checkpoint", LIVE_WAIT_S)

    form = browser.find_element(By.ID, "preempt-form")
    form.find_element(By.NAME, "reason").send_keys("browser test: make room")
    screenshot(browser, "1-preempt")
    form.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(
        browser,
        lambda b: "back in the queue" in b.find_element(By.TAG_NAME, "body").text,
        "the confirmation",
    )

    def two_attempts(b) -> list[str] | None:
        from selenium.common.exceptions import StaleElementReferenceException

        b.refresh()
        try:  # the page's own refresh may replace the table while we read it
            texts = [r.text for r in b.find_elements(By.CSS_SELECTOR, "#attempts tbody tr")]
        except StaleElementReferenceException:
            return None
        return texts if len(texts) == 2 and "current" in texts[1] else None

    rows = wait_for(browser, two_attempts, "attempt 2 placed", LIVE_WAIT_S)
    assert rows[0].startswith("1 ") and "Preempted" in rows[0]
    assert "browser test: make room" in rows[0] and NODE in rows[0]
    assert "requeued 1" in browser.find_element(By.CSS_SELECTOR, ".page-head").text
    browser.execute_script("document.getElementById('attempts').scrollIntoView()")
    screenshot(browser, "2-attempts")
    wait_for(
        browser,
        lambda b: "resumed_from=0." in agent.log_path(job.pk).read_text().split("attempt 2")[-1],
        "attempt 2 resuming from the checkpoint",
        LIVE_WAIT_S,
    )

"""The replay page in a browser: it follows a replay's progress by polling and shows the
comparison once the replay is done, without a reload by hand."""

from __future__ import annotations

from datetime import timedelta

import pytest

from portal.replay.models import ReplayRun
from portal.replay.services import replay_run_execute
from tests.browser.helpers import login, screenshot, wait_for
from tests.portal.replay_helpers import T0, finished_job, make_nodes, make_profile

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_replay_page_follows_a_running_replay(
    browser, live_server, staff, alice, settings, tmp_path
):
    from selenium.webdriver.common.by import By

    settings.DATA_DIR = tmp_path
    nodes = make_nodes()
    profile = make_profile("ResNet", TitanXp=600.0)
    for i in range(4):
        finished_job(
            alice,
            name=f"b{i}",
            submitted_s=5 * i,
            wait_s=2,
            run_s=600,
            node=nodes["titan"],
            profile=profile,
        )
    run = ReplayRun.objects.create(
        created_by=staff, since=T0, until=T0 + timedelta(hours=1), policies=["fifo", "binpack"]
    )
    login(browser, live_server, staff, "sam-pass-123")
    browser.get(f"{live_server.url}/replay/{run.pk}/")
    assert browser.find_element(By.ID, "replay-status").text == "Queued"

    ReplayRun.objects.filter(pk=run.pk).update(
        status="running", progress=0.4, message="fifo (1 of 2): 2 of 4 jobs ended"
    )
    wait_for(
        browser,
        lambda d: "2 of 4 jobs ended" in d.find_element(By.ID, "replay-message").text,
        "the polled progress message",
    )
    assert browser.find_element(By.ID, "replay-bar").get_attribute("value") == "0.4"
    assert browser.find_element(By.ID, "replay-status").text == "Running"
    screenshot(browser, "running")

    ReplayRun.objects.filter(pk=run.pk).update(status="queued")
    assert replay_run_execute(run.pk).status == "done"
    table = wait_for(
        browser, lambda d: d.find_elements(By.ID, "replay-summary"), "the comparison after reload"
    )[0]
    rows = [r.text for r in table.find_elements(By.CSS_SELECTOR, "tbody tr")]
    assert [r.split()[0] for r in rows] == ["live", "fifo", "binpack"]
    assert browser.find_element(By.ID, "replay-status").text == "Done"
    screenshot(browser, "done")

"""In a real browser: staff drain a node from the cluster page with a reason, see the reason
and the drained state, take it down, and resume it; a user sees the reason but no buttons."""

from __future__ import annotations

import pytest

from portal.core.models import Node
from tests.browser.helpers import login, screenshot, wait_for

By = pytest.importorskip("selenium.webdriver.common.by").By


def _body(browser) -> str:
    return browser.find_element(By.TAG_NAME, "body").text


def test_staff_drain_down_and_resume_a_node_from_the_cluster_page(
    browser, live_server, staff, alice
):
    node = Node.objects.create(name="brw-ops-1", kind="cpu", cores=4, memory_mb=4096)
    login(browser, live_server, staff, "sam-pass-123")
    browser.get(f"{live_server.url}/cluster/")
    form = wait_for(browser, lambda b: b.find_element(By.ID, f"node-ops-{node.pk}"), "the form")
    form.find_element(By.NAME, "reason").send_keys("swapping a fan")
    screenshot(browser, "1-reason")
    form.find_element(By.XPATH, ".//button[text()='Drain']").click()
    wait_for(browser, lambda b: "drains: its jobs finish" in _body(b), "the confirmation")
    reason = browser.find_element(By.ID, f"node-reason-{node.pk}").text
    assert reason.startswith("Drained: swapping a fan") and "user:sam" in reason
    node.refresh_from_db()
    assert node.status == Node.Status.DRAINING and node.state_changed_by == "user:sam"
    screenshot(browser, "2-drained")

    # No reason: refused with the field's message, nothing changes.
    form = browser.find_element(By.ID, f"node-ops-{node.pk}")
    form.find_element(By.XPATH, ".//button[text()='Down']").click()
    wait_for(browser, lambda b: "need a reason" in _body(b), "the refusal")
    node.refresh_from_db()
    assert node.status == Node.Status.DRAINING

    form = browser.find_element(By.ID, f"node-ops-{node.pk}")
    form.find_element(By.NAME, "reason").send_keys("PSU failed")
    form.find_element(By.XPATH, ".//button[text()='Down']").click()
    wait_for(browser, lambda b: "is down: 0 job(s) back in the queue" in _body(b), "down")
    assert "PSU failed" in browser.find_element(By.ID, f"node-reason-{node.pk}").text
    screenshot(browser, "3-down")

    form = browser.find_element(By.ID, f"node-ops-{node.pk}")
    form.find_element(By.XPATH, ".//button[text()='Resume']").click()
    wait_for(browser, lambda b: "back in service" in _body(b), "resumed")
    assert not browser.find_elements(By.ID, f"node-reason-{node.pk}")
    node.refresh_from_db()
    assert node.status == Node.Status.UP and not node.held_down

    # A user sees the reason of a drained node, and no buttons.
    from portal.core.node_ops import node_drain

    node_drain(node, actor="user:sam", reason="kernel update")
    browser.delete_all_cookies()
    login(browser, live_server, alice, "alice-pass-123")
    browser.get(f"{live_server.url}/cluster/")
    wait_for(browser, lambda b: b.find_elements(By.ID, f"node-reason-{node.pk}"), "the reason")
    assert "kernel update" in browser.find_element(By.ID, f"node-reason-{node.pk}").text
    assert not browser.find_elements(By.ID, f"node-ops-{node.pk}")
    screenshot(browser, "4-user-view")

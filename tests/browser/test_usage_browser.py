"""The usage page in a real browser: plotly draws GPU-hours per user stacked by GPU model from
the attempt records, the table agrees, and a member's project job is listed. Screenshots go to
var/test-artifacts/screenshots/."""

from __future__ import annotations

import pytest

from tests.browser.helpers import login, screenshot, wait_for
from tests.portal.test_teams_accounting import history  # noqa: F401  (the fixture)

By = pytest.importorskip("selenium.webdriver.common.by").By

PLOT_JS = """
const div = document.getElementById("usage-figure");
if (!div || !Array.isArray(div.data)) return null;
return div.data.map(t => ({name: t.name, x: t.x, y: t.y}));
"""


def test_usage_page_draws_gpu_hours_per_user_by_model(browser, live_server, history, alice):  # noqa: F811
    login(browser, live_server, alice, "alice-pass-123")
    browser.get(f"{live_server.url}/usage/?since=1d&by=user")
    traces = wait_for(browser, lambda b: b.execute_script(PLOT_JS), "the usage plot")
    screenshot(browser, "usage-by-user")
    by_name = {t["name"]: dict(zip(t["x"], t["y"], strict=True)) for t in traces}
    assert by_name["V100 GPU-hours"]["alice"] == pytest.approx(2.0, abs=0.01)
    assert by_name["TitanXp GPU-hours"]["alice"] == pytest.approx(4800 / 3600, abs=0.01)
    assert browser.find_elements(By.CSS_SELECTOR, "#usage-figure .main-svg")  # drawn
    rows = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "table.table tbody tr")]
    assert any(r.startswith("alice 2 3.33") for r in rows), rows
    assert any(r.startswith("bob 1 0.00") for r in rows), rows  # b2, lab's queued job

    browser.get(f"{live_server.url}/jobs/")
    listed = browser.find_element(By.CSS_SELECTOR, "table").text
    assert "b2" in listed and "lab" in listed and "b1" not in listed  # b1: bob's own project

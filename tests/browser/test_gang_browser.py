"""In a real browser: a job asking for more GPUs than one node holds is placed as a gang on two
nodes, and its page says which nodes, which GPUs and why. The screenshot
(var/test-artifacts/screenshots/test_a_gang_job_page_names_every_node_and_why-gang-job.png) is
the one the issue's note points at."""

from __future__ import annotations

import pytest

from portal.core.models import Gpu, Node, PolicySettings
from portal.core.scheduling import run_cycle
from portal.core.services import job_submit
from tests.browser.helpers import login, screenshot, wait_for

By = pytest.importorskip("selenium.webdriver.common.by").By


def _node(name: str) -> Node:
    node = Node.objects.create(name=name, kind="gpu", cores=32, memory_mb=262144)
    for i in range(4):
        Gpu.objects.create(
            node=node,
            index=i,
            model="V100",
            memory_mb=16384,
            uuid=f"GPU-{name}-{i}",
            sharing_modes=["exclusive"],
        )
    return node


def test_a_gang_job_page_names_every_node_and_why(browser, live_server, alice):
    _node("v100-1")
    _node("v100-2")
    PolicySettings.objects.create(name="test", policy="fifo", params={}, active=True)
    job, _ = job_submit(alice, name="resnet-8gpu", command="run", gpus=8, cpus=8)
    assert run_cycle().placed == [job.pk]

    login(browser, live_server, alice, "alice-pass-123")
    browser.get(f"{live_server.url}/jobs/{job.pk}/")
    wait_for(browser, lambda b: b.find_elements(By.ID, "attempts"), "the attempts table")
    browser.execute_script("document.getElementById('attempts').scrollIntoView(false)")
    screenshot(browser, "gang-job")
    assert browser.find_element(By.ID, "placement-nodes").text == "v100-1, v100-2"
    page = browser.find_element(By.TAG_NAME, "main").text
    # Every GPU of both nodes is listed, and the attempt names both nodes.
    for node in ("v100-1", "v100-2"):
        for i in range(4):
            assert f"{node}/{i} (V100)" in page
    attempt_row = browser.find_element(By.CSS_SELECTOR, "#attempts tbody tr").text
    assert "v100-1" in attempt_row and "v100-2" in attempt_row
    # The explanation says why the job is spread: no single node has 8 free GPUs.
    explanation = browser.find_element(By.CSS_SELECTOR, "p.explanation").text
    assert "v100-1" in explanation and "v100-2" in explanation, explanation

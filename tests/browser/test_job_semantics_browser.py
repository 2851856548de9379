"""In a real browser: the submit form's request fields (GPU sharing, device, host memory), a
refused value shown beside its field, and a profile-less one-GPU job submitted through the form
that the real scheduling cycle places on the idle Titan Xp, exclusive, not beside the shared
resident and not on the CPU node; its page says what it asked and why (docs/jobs.md).
Screenshots go to var/test-artifacts/screenshots/.
"""

from __future__ import annotations

import pytest

from portal.core.models import Job, PolicySettings
from portal.core.scheduling import run_cycle
from tests.browser.helpers import login, screenshot, wait_for
from tests.portal.test_job_semantics import _cluster, _shared_resident

By = pytest.importorskip("selenium.webdriver.common.by").By
Select = pytest.importorskip("selenium.webdriver.support.ui").Select


def _submit(browser) -> None:
    browser.find_element(By.CSS_SELECTOR, ".form-actions button[type=submit]").click()


def test_the_form_asks_sharing_device_and_memory_and_a_gpu_job_gets_its_own_gpu(
    browser, live_server, alice, bob, transactional_db
):
    node = _cluster()
    PolicySettings.objects.create(
        name="bp", policy="binpack", params={"max_jobs_per_gpu": 3}, active=True
    )
    _shared_resident(bob, node)
    login(browser, live_server, alice, "alice-pass-123")
    browser.get(f"{live_server.url}/jobs/new/")
    wait_for(browser, lambda b: b.find_elements(By.ID, "id_sharing"), "the submit form")
    sharing = browser.find_element(By.ID, "id_sharing")
    assert sharing.get_attribute("placeholder") == "site default"
    device = Select(browser.find_element(By.ID, "id_device"))
    options = [o.get_attribute("value") for o in device.options]
    assert options == ["", "gpu", "auto", "cpu"]
    assert browser.find_element(By.ID, "id_memory_mb").is_displayed()

    # A refused value: shown beside its field, nothing stored.
    browser.find_element(By.ID, "id_name").send_keys("own-gpu")
    browser.find_element(By.ID, "id_command").send_keys("python train.py")
    gpus = browser.find_element(By.ID, "id_gpus")
    gpus.clear()
    gpus.send_keys("1")
    Select(browser.find_element(By.ID, "id_device")).select_by_value("cpu")
    _submit(browser)
    wait_for(browser, lambda b: "ask 0 GPUs" in b.page_source, "the device error")
    screenshot(browser, "1-device-refused")
    assert not Job.objects.filter(name="own-gpu").exists()

    # The same job as a user would write it: one GPU, no profile, no GPU memory, defaults.
    Select(browser.find_element(By.ID, "id_device")).select_by_value("")
    memory = browser.find_element(By.ID, "id_memory_mb")
    memory.clear()
    memory.send_keys("4096")
    _submit(browser)
    wait_for(browser, lambda b: "/jobs/new/" not in b.current_url, "the job page")
    job = Job.objects.get(name="own-gpu")
    assert (job.sharing, job.device, job.memory_mb, job.profile) == ("never", "gpu", 4096, None)
    assert "never: whole GPUs of its own" in browser.find_element(By.ID, "job-sharing").text
    assert "GPUs only, never a CPU node" in browser.find_element(By.ID, "job-device").text

    run_cycle()  # the real scheduling cycle, binpack: it would pack a 0-GB job beside bob's
    browser.refresh()
    wait_for(browser, lambda b: b.find_elements(By.CSS_SELECTOR, "p.explanation"), "a placement")
    text = browser.find_element(By.CSS_SELECTOR, "p.explanation").text
    screenshot(browser, "2-own-gpu")
    assert "titan/gpu1 exclusive" in text and "whole GPUs of its own" in text
    placement = job.placements.get(active=True)
    assert placement.node.name == "titan" and placement.sharing_mode == "exclusive"
    assert [g.index for g in placement.gpus.all()] == [1]

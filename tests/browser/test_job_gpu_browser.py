"""In a real browser: a running job's page plots its own GPU memory and utilisation, one trace
per attempt and GPU, from the readings its node agent attributed to it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from portal.core.models import GpuReading, Job, Node
from tests.browser.helpers import login, screenshot, wait_for

By = pytest.importorskip("selenium.webdriver.common.by").By


def test_the_job_page_plots_the_jobs_gpu_memory_and_utilisation(browser, live_server, alice):
    node = Node.objects.create(name="h100-1", kind="gpu", cores=32, memory_mb=262144)
    job = Job.objects.create(owner=alice, name="matmul", command="run", gpus=2, state="RUNNING")
    now = timezone.now()
    for i in range(6):
        for gpu in (0, 1):
            GpuReading.objects.create(
                job=job,
                attempt=1,
                node=node,
                gpu_index=gpu,
                at=now - timedelta(seconds=30 - 5 * i),
                memory_mb=18000.0 + 500 * i + 100 * gpu,
                util_pct=None if gpu == 1 else 60.0 + i,
            )

    login(browser, live_server, alice, "alice-pass-123")
    browser.get(f"{live_server.url}/jobs/{job.pk}/")
    memory = wait_for(
        browser,
        lambda b: (
            (p := b.find_element(By.ID, "plot-job-gpu-memory")).get_attribute("data-points")
            not in (None, "0")
            and p
        ),
        "the GPU memory plot",
    )
    util = browser.find_element(By.ID, "plot-job-gpu-util")
    browser.execute_script("document.getElementById('job-gpu').scrollIntoView(false)")
    screenshot(browser, "job-gpu")
    assert memory.get_attribute("data-points") == "12"  # two GPUs, six readings each
    assert util.get_attribute("data-points") == "6"  # GPU 1 gave no utilisation samples
    names = [t.text for t in memory.find_elements(By.CSS_SELECTOR, ".legendtext")]
    assert names == ["attempt 1, h100-1 GPU 0", "attempt 1, h100-1 GPU 1"]
    assert browser.find_element(By.ID, "job-gpu-peak").text == "20.1 GB"  # 20,600 MB
    assert not browser.find_element(By.ID, "plot-job-gpu-memory-empty").is_displayed()

"""The demo cluster in a real browser (issue 18): the cluster page with 25 jobs running on the
demo's virtual cluster (two Titan Xp, two A30, a CPU node; the jobs are real emulated
processes), and the warning staff see when the active policy fails at run time. Screenshots go
to var/test-artifacts/screenshots/."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from portal.core.models import ApplicationProfile, Gpu, Job, Node, PolicySettings
from portal.core.scheduling import run_cycle
from portal.core.services import job_submit
from tests.browser.helpers import login, screenshot, wait_for
from tests.e2e.conftest import wait_for as wait_for_db
from tests.embedded import embedded_loop

By = pytest.importorskip("selenium.webdriver.common.by").By

# Long enough to still run while the page is looked at (CNN-MNIST: 198 s x 0.5 on a Titan Xp).
SCALE = 0.5


def _submit_25(user) -> None:
    """20 GPU jobs (the four GPUs' 5 container slots each) and 5 CPU-only jobs."""
    cnn = ApplicationProfile.objects.get(name="CNN-MNIST")
    blackscholes = ApplicationProfile.objects.get(name="BlackScholes")
    for i in range(25):
        profile, gpus = (cnn, 1) if i < 20 else (blackscholes, 0)
        job_submit(
            user,
            name=f"{profile.name}-{i + 1}",
            command=f"python -m workers.emulate --profile {profile.name} --scale {SCALE}",
            profile=profile,
            gpus=gpus,
            cpus=1,
            sharing="allowed",  # the container slots: these jobs allow sharing (docs/jobs.md)
        )


def test_the_cluster_page_with_25_running_jobs(browser, live_server, settings, tmp_path):
    call_command("load_demo", "--no-jobs", stdout=StringIO())
    demo = Job._meta.get_field("owner").related_model.objects.get(username="demo")
    _submit_25(demo)
    with embedded_loop(settings, tmp_path / "logs"):
        wait_for_db(
            lambda: Job.objects.filter(state="RUNNING").count() == 25,
            60,
            interval=0.5,
            what="25 jobs running",
        )
        login(browser, live_server, "demo", "demo-pass-123")
        browser.get(live_server.url + "/cluster/")
        wait_for(
            browser,
            lambda b: b.find_element(By.ID, "stat-running").text.strip() == "25",
            "25 running jobs on the cluster page",
            timeout=30,
        )
        assert browser.find_element(By.ID, "stat-queue").text.strip() == "0"
        # every node of the demo cluster shows its jobs
        text = browser.find_element(By.TAG_NAME, "body").text
        for node in ("gpu-titanxp-1", "gpu-a30-1", "cpu-1"):
            assert node in text
        path = screenshot(browser, "cluster-25-running")
        assert path.stat().st_size > 10_000
        browser.execute_script("window.scrollTo(0, 600)")  # the plots below the node table
        screenshot(browser, "cluster-25-running-plots")
        running = {
            node: Job.objects.filter(state="RUNNING", placements__node__name=node).count()
            for node in ("gpu-titanxp-1", "gpu-a30-1", "cpu-1")
        }
        assert running == {"gpu-titanxp-1": 10, "gpu-a30-1": 10, "cpu-1": 5}, running


def test_staff_see_a_policy_that_fails_at_run_time_and_what_runs_instead(
    browser, live_server, staff, alice
):
    node = Node.objects.create(name="g1", kind="gpu", cores=8, memory_mb=65536)
    Gpu.objects.create(node=node, index=0, model="TitanXp", memory_mb=12288, uuid="GPU-g1-0")
    # stored before validation existed: the loop cannot build it
    PolicySettings.objects.create(
        name="main", policy="binpack", params={"max_jobs_per_gpu": "lots"}, active=True
    )
    job = Job.objects.create(owner=alice, name="waits-not", command="true", gpus=1)
    assert run_cycle().placed == [job.pk]  # fifo ran instead: the job did not stay PENDING
    login(browser, live_server, staff, "sam-pass-123")
    browser.get(live_server.url + "/cluster/")
    banner = wait_for(
        browser, lambda b: b.find_elements(By.ID, "policy-runtime-error"), "the policy warning"
    )[0]
    assert "failed at run time" in banner.text and "max_jobs_per_gpu" in banner.text
    assert "keeps running the last configuration that worked, fifo" in banner.text
    screenshot(browser, "cluster-policy-failed")
    banner.find_element(By.LINK_TEXT, "Fix it in the admin").click()
    note = wait_for(
        browser, lambda b: b.find_elements(By.ID, "policy-runtime-error"), "the admin's warning"
    )[0]
    assert "runs the last configuration that worked, fifo" in note.text
    screenshot(browser, "admin-policy-failed")


def test_the_demo_packs_no_gpu_while_one_it_could_use_idles(browser, live_server):
    """Issue 25: the demo's jobs allow sharing (seed 004's container slots), yet a new job takes
    an idle GPU before it joins residents, even an idle Titan Xp against a faster A30 (the
    policy's speed rule alone would stack the A30s). The real scheduling cycle with the demo's
    policy, ``placement_rate+exec_plan``; the cluster page shows one job per GPU."""
    call_command("load_demo", "--no-jobs", stdout=StringIO())
    demo = Job._meta.get_field("owner").related_model.objects.get(username="demo")
    cnn = ApplicationProfile.objects.get(name="CNN-MNIST")
    for i in range(4):
        job_submit(
            demo,
            name=f"cnn-{i + 1}",
            command="python -m workers.emulate --profile CNN-MNIST",
            profile=cnn,
            gpus=1,
            cpus=1,
            sharing="allowed",
            device="auto",
        )
        run_cycle()  # one arrival at a time, as the demo's stream submits them
    per_gpu = {
        (g.node.name, g.index): Job.objects.filter(
            placements__active=True, placements__gpus=g
        ).count()
        for g in Gpu.objects.select_related("node")
    }
    assert per_gpu == {
        ("gpu-titanxp-1", 0): 1,
        ("gpu-titanxp-1", 1): 1,
        ("gpu-a30-1", 0): 1,
        ("gpu-a30-1", 1): 1,
    }, per_gpu
    login(browser, live_server, "demo", "demo-pass-123")
    browser.get(live_server.url + "/cluster/")
    cells = wait_for(
        browser, lambda b: b.find_elements(By.CSS_SELECTOR, "td.js-gpu-jobs"), "the GPU rows"
    )
    refs = [len(c.find_elements(By.CSS_SELECTOR, ".job-ref")) for c in cells]
    screenshot(browser, "cluster-one-job-per-gpu")
    assert refs == [1, 1, 1, 1], [c.text for c in cells]

"""The live dashboard in a real browser, with jobs that really run.

A virtual GPU node (two simulated Titan Xp, the ``virtual`` backend) runs in this process: the
embedded loop of ``manage.py run_embedded`` (scheduling cycles, an in-process node agent whose
jobs are real subprocesses, cluster metrics), no broker. The test logs in, submits an emulated
GPU job through the form, watches it reach RUNNING on the cluster page, and checks that the
plotly plots there and on the job's page draw data points, as the page's periodic refresh
brings them. Screenshots of each step go to var/test-artifacts/screenshots/.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from portal.core.models import Gpu, Job, Node
from tests.browser.helpers import login, screenshot, wait_for
from tests.embedded import embedded_loop
from tests.nodes import catalogue_node

By = pytest.importorskip("selenium.webdriver.common.by").By
StaleElementReferenceException = pytest.importorskip(
    "selenium.common.exceptions"
).StaleElementReferenceException

NODE = "browser-gpu-1"
JOB_NAME = "dashboard-run"
# ~30 s of emulated work with a progress line every half second: still running while we look.
# 600 iterations (50 ms each) so every report spans several: a steady Slow-Down estimate.
COMMAND = (
    "python -m workers.emulate --profile browser-demo --duration 30 --iterations 600"
    " --report-every 0.5"
)
# The cluster page refreshes every 5 s and the job page every 3 s; a loaded 2-core machine may
# need a few rounds.
LIVE_WAIT_S = 40.0

# Points per trace of a plotly plot: what plotly itself holds (``div.data``), not our counters.
PLOT_POINTS_JS = """
const div = document.getElementById(arguments[0]);
if (!div || !Array.isArray(div.data)) return null;
return div.data.map(t => ({
  name: t.name || "",
  points: (t.y || []).filter(v => v !== null && v !== undefined && !Number.isNaN(v)).length,
}));
"""


# The GPU-cell job reference showing ``arguments[1]`` as RUNNING (its text, or ""); one query,
# since the page's refresh replaces those cells. ``arguments[2]``: scroll it into view.
RUNNING_REF_JS = """
const ref = Array.from(document.querySelectorAll(arguments[0] + " .job-ref")).find(
  r => r.textContent.includes(arguments[1]) && r.querySelector(".state-running"));
if (ref && arguments[2]) ref.scrollIntoView({block: "center"});
return ref ? ref.textContent : "";
"""


def _plot_traces(browser: Any, plot_id: str) -> list[dict[str, Any]]:
    return browser.execute_script(PLOT_POINTS_JS, plot_id) or []


def _plot_has_data(plot_id: str):
    """Wait condition: the plot ``plot_id`` is drawn with a trace of at least one y value."""

    def condition(browser: Any) -> list[dict[str, Any]] | None:
        traces = _plot_traces(browser, plot_id)
        if any(t["points"] >= 1 for t in traces):
            return traces
        return None

    return condition


@pytest.fixture
def virtual_cluster(transactional_db) -> Node:
    """One GPU node on the ``virtual`` backend with two catalogue Titan Xp (as ``load_demo``)."""
    return catalogue_node(
        NODE, "TitanXp", 2, f"VIRTUAL-{NODE}", cores=16, memory_mb=65536, backend="virtual"
    )


@pytest.fixture
def embedded(virtual_cluster, settings, tmp_path) -> Iterator[list[Any]]:
    """The embedded loop (0.5 s period) and the node's in-process agent."""
    with embedded_loop(settings, tmp_path / "logs") as agents:
        assert [a.name for a in agents] == [NODE]
        yield agents


def test_submit_watch_the_job_run_on_the_dashboard_and_its_plots_fill(
    browser, live_server, alice, virtual_cluster, embedded
):
    login(browser, live_server, alice, "alice-pass-123")
    screenshot(browser, "1-logged-in")

    # -- submit a one-GPU emulated job through the form ------------------------------------------
    browser.get(f"{live_server.url}/jobs/new/")
    wait_for(browser, lambda b: b.find_elements(By.ID, "id_name"), "the submit form")
    browser.find_element(By.ID, "id_name").send_keys(JOB_NAME)
    browser.find_element(By.ID, "id_command").send_keys(COMMAND)
    for field, value in (("id_gpus", "1"), ("id_gpu_memory_mb", "2000")):
        box = browser.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    screenshot(browser, "2-submit-form")
    browser.find_element(By.CSS_SELECTOR, ".form-actions button[type=submit]").click()
    wait_for(browser, lambda b: "/jobs/new/" not in b.current_url, "leaving the submit form")
    job = Job.objects.get(name=JOB_NAME)
    assert job.owner == alice and job.gpus == 1 and job.command == COMMAND
    screenshot(browser, "3-submitted")

    # -- the cluster page shows it RUNNING on one of the node's GPUs -----------------------------
    browser.get(f"{live_server.url}/cluster/")
    wait_for(browser, lambda b: b.find_elements(By.ID, "plot-gpu-util"), "the cluster page")
    link = f"#{job.pk} {JOB_NAME}"
    gpu_cells = f"#node-{virtual_cluster.pk} .js-gpu-jobs"

    def job_running_on_a_gpu(b: Any) -> str:
        return b.execute_script(RUNNING_REF_JS, gpu_cells, link, False)

    ref = wait_for(
        browser, job_running_on_a_gpu, "the job RUNNING on the cluster page", LIVE_WAIT_S
    )
    assert "RUNNING" in ref
    assert browser.find_element(By.ID, "stat-running").text == "1"
    browser.execute_script(RUNNING_REF_JS, gpu_cells, link, True)
    screenshot(browser, "4-cluster-running")

    # -- the cluster plots fill in on the periodic refresh ----------------------------------------
    drawn = {}
    for plot in ("plot-gpu-util", "plot-gpu-memory", "plot-job-slowdown", "plot-sd-max-diff"):
        drawn[plot] = wait_for(browser, _plot_has_data(plot), f"data in #{plot}", LIVE_WAIT_S)
        points = browser.find_element(By.ID, plot).get_attribute("data-points")
        assert int(points) >= 1, (plot, points)
        assert not browser.find_element(By.ID, f"{plot}-empty").is_displayed(), plot
    # One utilisation and one memory trace per GPU; the job's own Slow-Down trace.
    model = Gpu.objects.filter(node=virtual_cluster).values_list("model", flat=True).first()
    for plot in ("plot-gpu-util", "plot-gpu-memory"):
        names = sorted(t["name"] for t in drawn[plot])
        assert names == [f"{NODE}/0 {model}", f"{NODE}/1 {model}"], (plot, drawn[plot])
    assert [t["name"] for t in drawn["plot-job-slowdown"]] == [link], drawn["plot-job-slowdown"]
    browser.execute_script("document.getElementById('plot-gpu-util').scrollIntoView()")
    screenshot(browser, "5-cluster-plots")

    # -- the job's page: state, Slow-Down plot, progress and the live log -------------------------
    def open_job_page(b: Any) -> bool:
        try:  # the refresh may replace the link between finding and clicking it: try again
            b.find_element(By.LINK_TEXT, link).click()
        except StaleElementReferenceException:
            return False
        return True

    wait_for(browser, open_job_page, "a click on the job's link")
    wait_for(browser, lambda b: b.find_elements(By.ID, "plot-job-slowdown"), "the job page")
    assert browser.current_url == f"{live_server.url}/jobs/{job.pk}/"
    traces = wait_for(
        browser,
        _plot_has_data("plot-job-slowdown"),
        "data in the job's Slow-Down plot",
        LIVE_WAIT_S,
    )
    assert traces[0]["points"] >= 1, traces
    wait_for(
        browser,
        lambda b: b.find_element(By.ID, "job-progress").text.endswith("%"),
        "the job's progress",
        LIVE_WAIT_S,
    )
    wait_for(
        browser,
        lambda b: "@cosched" in b.find_element(By.ID, "job-log").text,
        "the job's live log",
        LIVE_WAIT_S,
    )
    assert browser.find_element(By.ID, "job-state").text in ("RUNNING", "COMPLETED")
    screenshot(browser, "6-job-page")
    browser.execute_script("document.getElementById('dashboard').scrollIntoView()")
    screenshot(browser, "7-job-plot-and-log")

"""Headless Chromium against pytest-django's ``live_server``.

The ``browser`` fixture; the helpers live in ``tests/browser/helpers.py`` (also re-exported
here)::

    from tests.browser.helpers import login, screenshot

    def test_something(browser, live_server, alice):
        login(browser, live_server, alice, "alice-pass-123")
        screenshot(browser, "logged-in")   # var/test-artifacts/screenshots/<test>-logged-in.png

Needs Debian's ``chromium`` and ``chromium-driver`` (``make browser-deps`` installs them; CI
does so through ``make test``). Without them every test here is skipped with that advice.
A failing test also leaves ``<test>-failure.png``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.helpers import artifact_name, login, screenshot, wait_for

__all__ = ["browser", "login", "screenshot", "wait_for"]

if os.environ.get("CI") == "true":
    # The test modules ``importorskip`` selenium, which would skip every browser test without a
    # word; in CI a missing selenium is a broken set-up (collection fails here instead).
    import selenium  # noqa: F401

CHROMIUM = os.environ.get("COSCHED_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("COSCHED_CHROMEDRIVER", "/usr/bin/chromedriver")
CHROMIUM_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,900",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.browser)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    # Keep each phase's report on the item so the browser fixture can see that the test failed.
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _missing_browser() -> str:
    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if not missing:
        return ""
    return (
        f"{' and '.join(missing)} not found: run `make browser-deps` "
        "(installs Debian's chromium and chromium-driver) to run the browser tests"
    )


@pytest.fixture
def browser(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh headless Chromium (selenium WebDriver) for one test; quits afterwards."""
    reason = _missing_browser()
    if reason:
        if os.environ.get("CI") == "true":
            # In CI a missing browser is a broken set-up, not a reason to go green.
            pytest.fail(f"CI=true: {reason}", pytrace=False)
        pytest.skip(reason)
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason="selenium missing: install the dev extras (make install)"
    )
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in CHROMIUM_FLAGS:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)  # explicit waits only: failures then say what was awaited
    driver.cosched_test_name = artifact_name(request.node.name)
    try:
        yield driver
        failed = getattr(request.node, "report_call", None)
        if failed is not None and failed.failed:
            screenshot(driver, "failure")
    finally:
        driver.quit()

"""Helpers for browser tests: screenshots, explicit waits and logging in through the form.

The ``browser`` fixture (conftest.py) gives a headless Chromium WebDriver; use these with it::

    from tests.browser.helpers import login, screenshot, wait_for
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT_DIR = ROOT / "var" / "test-artifacts" / "screenshots"
WAIT_S = 10.0


def artifact_name(text: str) -> str:
    """``text`` made safe for a file name (parametrised test ids have brackets)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")


def screenshot(browser: Any, name: str) -> Path:
    """Save the current page to ``var/test-artifacts/screenshots/<test>-<name>.png``."""
    SCREENSHOT_DIR.mkdir(parents=True, exist_ok=True)
    test = getattr(browser, "cosched_test_name", "browser")
    path = SCREENSHOT_DIR / f"{test}-{artifact_name(name)}.png"
    if not browser.save_screenshot(str(path)):
        raise AssertionError(f"could not save a screenshot to {path}")
    return path


# How Chromium's driver words an element of a page that was replaced meanwhile, where it does
# not raise StaleElementReferenceException (seen with Chromium 156 during a form's reload).
_GONE_NODE = ("does not belong to the document", "No node with given id found")


def wait_for(browser: Any, condition: Callable[[Any], Any], what: str, timeout: float = WAIT_S):
    """Wait until ``condition(browser)`` is truthy and return its value; fail naming ``what``.
    An element that goes stale while the condition reads it (the page was replaced by a
    navigation or its own refresh) counts as "not yet", also where Chromium reports it as an
    inspector error ("Node with given id does not belong to the document") instead of a stale
    element."""
    from selenium.common.exceptions import (
        StaleElementReferenceException,
        TimeoutException,
        WebDriverException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    def guarded(b: Any) -> Any:
        try:
            return condition(b)
        except StaleElementReferenceException:
            return False
        except WebDriverException as exc:
            if any(marker in str(exc) for marker in _GONE_NODE):
                return False
            raise

    try:
        return WebDriverWait(browser, timeout).until(guarded)
    except TimeoutException:
        screenshot(browser, f"timeout-{what}")
        raise AssertionError(
            f"timed out after {timeout:.0f} s waiting for {what} (page {browser.current_url!r})"
        ) from None


def login(browser: Any, live_server: Any, user: Any, password: str) -> None:
    """Log in through the login form as ``user`` (a user object or a username)."""
    from selenium.webdriver.common.by import By

    username = user if isinstance(user, str) else user.get_username()
    browser.get(f"{live_server.url}/login/")
    browser.find_element(By.ID, "id_username").send_keys(username)
    browser.find_element(By.ID, "id_password").send_keys(password)
    browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()

    def logged_in_or_refused(driver: Any) -> str:
        if driver.find_elements(By.CSS_SELECTOR, ".form-errors"):
            return "refused"
        if driver.find_elements(By.CSS_SELECTOR, ".nav-user"):
            return "in"
        return ""

    outcome = wait_for(browser, logged_in_or_refused, f"log-in of {username}")
    if outcome != "in":
        screenshot(browser, "login-refused")
        errors = browser.find_element(By.CSS_SELECTOR, ".form-errors").text
        raise AssertionError(f"log-in as {username} refused: {errors}")

"""Headless Chromium for the admin's page tests: Debian's chromium and chromium-driver, via selenium.

One place for what every browser test needs: the skip where the browser is
missing (``.ci/run`` installs it; a developer machine gets the apt-get line),
starting a driver, waiting for a page of nsqtw-admin to have loaded its data,
and a confirmed click. The module-scoped ``browser`` fixture is in this
folder's ``conftest.py``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
if CHROMIUM is None or CHROMEDRIVER is None:  # pragma: no cover - CI installs both
    pytest.skip("needs Debian's chromium and chromium-driver: apt-get install -y chromium chromium-driver",
                allow_module_level=True)

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

__all__ = ["ARTIFACTS", "By", "WebDriverWait", "click_confirmed", "open_chromium", "open_page", "wait_until"]

#: screenshots of the pages (ignored by git)
ARTIFACTS = Path(os.environ.get("NSQTW_ARTIFACTS", os.path.join(ROOT, "tests", "artifacts"))) / "admin"


def open_chromium(*args: str, console: bool = False) -> Any:
    """Headless Chromium under selenium, with ``args`` besides the usual ones; ``console``:
    the page's console messages kept for ``driver.get_log("browser")``. The caller quits it."""
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM or ""
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1280,900", "--no-first-run", "--disable-extensions", *args):
        options.add_argument(arg)
    if console:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    return driver


def open_page(driver: Any, url: str) -> None:
    """Load an nsqtw-admin page and wait until its script has rendered what it fetched."""
    driver.get(url)
    WebDriverWait(driver, 20).until(lambda d: d.find_element(By.ID, "main").get_attribute("data-loaded"))


def wait_until(check: Callable[[], Any], timeout: float = 20, what: str = "condition") -> Any:
    """``check()``'s first true answer within ``timeout`` seconds (an exception counts as not yet)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except Exception as e:  # noqa: BLE001 - the page or a node is still getting there
            last = e
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: last {last!r}")


def click_confirmed(driver: Any, action: str) -> None:
    """Click an action's button, then the confirmation's OK."""
    driver.find_element(By.CSS_SELECTOR, f'button[data-action="{action}"]').click()
    WebDriverWait(driver, 10).until(lambda d: d.find_elements(By.ID, "confirm-ok"))
    driver.find_element(By.ID, "confirm-ok").click()

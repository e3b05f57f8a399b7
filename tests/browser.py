"""A real browser for the tests that look at pages: Playwright driving Debian's chromium.

``chromium_browser`` (session-scoped) launches ``/usr/bin/chromium``; it fails under ``CI=true``
when chromium or Playwright is missing (``.ci/run`` installs both) and skips otherwise. Never
``playwright install``: it would download a browser. ``screenshot(page, name)`` keeps a PNG in
``test-artifacts/screenshots/`` for people to look at.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services import require

CHROMIUM = os.environ.get("LLMB_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "screenshots"


def _chromium_present() -> None:
    if not os.access(CHROMIUM, os.X_OK):
        raise FileNotFoundError(f"{CHROMIUM} (apt-get install chromium)")


@pytest.fixture(scope="session")
def chromium_browser() -> Iterator[Any]:
    """A headless chromium (Playwright's sync API) shared by the session's browser tests."""
    require("chromium", _chromium_present)
    require("playwright", lambda: __import__("playwright.sync_api"))
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; Django's ORM refuses to run in
    # a thread with a loop unless told it is fine (the test's queries are not async).
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def screenshot(page: Any, name: str) -> Path:
    """Save the whole page as ``test-artifacts/screenshots/<name>.png``; returns the path."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path

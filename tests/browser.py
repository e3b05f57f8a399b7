"""A real browser for the tests: Playwright for Python driving Debian's ``chromium`` package.

Never a downloaded browser: ``.ci/run`` installs Debian's chromium with apt when
``/usr/bin/chromium`` is missing, and ``playwright`` (the PyPI package, which carries its driver)
comes with the ``dev`` extra. Without either, browser tests fail under ``CI=true`` and skip
elsewhere (``tests.services.require``).

Use the session fixture ``chromium_browser`` with pytest-django's ``live_server``; a test that
uses it is marked ``browser`` (``tests/conftest.py``), which ``-m 'not browser'`` leaves out.
Playwright's sync API runs an event loop in the test thread, so the fixture sets
``DJANGO_ALLOW_ASYNC_UNSAFE`` for the session (Django would otherwise refuse ORM calls made from
that thread with ``SynchronousOnlyOperation``). ``screenshot(page, name)`` saves
``test-artifacts/screenshots/<name>.png`` (gitignored) for a person to look at.

That loop stays *running* in the main thread from the first browser test until the session ends
(so ``asyncio.run`` would fail in any later test): ``tests/conftest.py`` therefore moves every
test that uses ``chromium_browser`` (or is marked ``browser``) to the end of the run, after
pytest-randomly's shuffle (``browser_tests_last``).
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.services import require

CHROMIUM = pathlib.Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = pathlib.Path(__file__).resolve().parent.parent / "test-artifacts" / "screenshots"


def _probe() -> None:
    if not CHROMIUM.exists():
        raise FileNotFoundError(f"{CHROMIUM} (Debian's chromium package: apt-get install chromium)")
    import playwright.sync_api  # noqa: F401  (the PyPI package `playwright`, in the dev extra)


@pytest.fixture(scope="session")
def chromium_browser() -> Iterator[Any]:
    """A headless chromium for the whole session (``playwright.sync_api.Browser``)."""
    require("chromium and playwright", _probe)
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
            )
            try:
                yield browser
            finally:
                browser.close()


def uses_browser(item: pytest.Item) -> bool:
    fixtures = getattr(item, "fixturenames", ())
    return "chromium_browser" in fixtures or item.get_closest_marker("browser") is not None


def browser_tests_last(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: every browser test after every other test (order otherwise
    kept)."""
    items[:] = [i for i in items if not uses_browser(i)] + [i for i in items if uses_browser(i)]


def screenshot(page: Any, name: str) -> pathlib.Path:
    """Save a full-page screenshot as ``test-artifacts/screenshots/<name>.png``."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path

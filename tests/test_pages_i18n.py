"""The tenant pages are translatable: ``makemessages`` (GNU gettext's xgettext, as a host runs it)
finds every string a person reads on them.

The test extracts the app's catalogue into a scratch copy, "translates" every message by wrapping
it in ⟦ ⟧, compiles it with msgfmt, renders every page in that language and checks that every
piece of text on the page is either inside ⟦ ⟧ or data (names, amounts, dates, numbers). A string
added to a template without ``{% translate %}``, or in Python without ``gettext``, fails it.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from django.test import Client
from django.utils import translation

import llm_budgets
from llm_budgets.models import Tenant
from tests.pages import People, people, usage_data
from tests.services import require

pytestmark = pytest.mark.django_db

LANGUAGE = "eo"  # a language Django knows; the app ships no catalogue of its own for it
OPEN, CLOSE = "\u27e6", "\u27e7"
REPO = pathlib.Path(__file__).resolve().parent.parent


def _gettext_tools() -> None:
    for tool in ("xgettext", "msgfmt"):
        if shutil.which(tool) is None:
            raise FileNotFoundError(f"{tool} (Debian's gettext package: apt-get install gettext)")


def _wrapped(po: str) -> str:
    """Every msgstr (plural forms too) set to its msgid inside ⟦ ⟧."""
    out: list[str] = []
    msgid = msgid_plural = ""
    current = ""
    for line in po.splitlines():
        if line.startswith("msgid "):
            current, msgid, msgid_plural = "id", line[6:], ""
        elif line.startswith("msgid_plural "):
            current, msgid_plural = "plural", line[13:]
        elif line.startswith('"') and current == "id":
            msgid += "\n" + line
        elif line.startswith('"') and current == "plural":
            msgid_plural += "\n" + line
        elif line.startswith("msgstr"):
            current = "str"
            if msgid == '""':  # the header
                out.append(line)
                continue
            source = msgid_plural if line.startswith("msgstr[1]") and msgid_plural else msgid
            key = line.split(" ", 1)[0]
            out.append(f'{key} "{OPEN}"\n{source}\n"{CLOSE}"')
            continue
        elif line.startswith('"') and current == "str":
            if msgid == '""':
                out.append(line)
            continue
        elif line.startswith("#, fuzzy"):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.fixture
def marked_catalogue(tmp_path: pathlib.Path, settings: Any) -> Iterator[None]:
    """The app's messages as ``makemessages`` finds them, each translated to ⟦itself⟧."""
    require("GNU gettext", _gettext_tools)
    app = pathlib.Path(llm_budgets.__file__).parent
    copy = tmp_path / "llm_budgets"
    shutil.copytree(app, copy, ignore=shutil.ignore_patterns("__pycache__", "locale"))
    (copy / "locale").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "DJANGO_SETTINGS_MODULE": "project.settings"}
    subprocess.run(
        [sys.executable, "-P", "-m", "django", "makemessages", "-l", LANGUAGE, "--no-obsolete"],
        cwd=copy,
        env=env,
        check=True,
        capture_output=True,
    )
    messages = copy / "locale" / LANGUAGE / "LC_MESSAGES"
    po = messages / "django.po"
    po.write_text(_wrapped(po.read_text()))
    subprocess.run(["msgfmt", "-o", str(messages / "django.mo"), str(po)], check=True)
    settings.LOCALE_PATHS = [str(copy / "locale")]
    with translation.override(LANGUAGE):
        yield


class _Text(HTMLParser):
    """The text a person reads: text nodes, and the alt / title / aria-label / placeholder /
    value of buttons, outside <style> and <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("style", "script"):
            self._skip += 1
        for name, value in attrs:
            if value and (
                name in ("alt", "aria-label", "placeholder")
                or (name == "value" and tag == "button")
            ):
                self.parts.append(value)

    def handle_endtag(self, tag: str) -> None:
        if tag in ("style", "script"):
            self._skip -= 1

    def handle_data(self, data: str) -> None:
        if not self._skip:
            self.parts.append(data)


# Data, not interface: the fixture's names and ids (tests/pages.py), time zones, dates, amounts.
_NAMES = [
    "Acme <b>Corp</b>",
    "<script>acme</script>",
    "=HYPERLINK(acme)",
    "alice-acme",
    "bob-acme",
    "zed-beta",
    "project=acme-secret",
    "run-acme-secret",
    "m30 (fake)",
    "Europe/Amsterdam",
    "acme",
    "beta",
    "Beta",
    "UTC",
]
_FIGURES = re.compile(r"\d{4}-\d{2}-\d{2}|[<>]?\s?-?[\d][\d,.:]*\s?%?")
# Dates, with day and month names from Django's own catalogue (or as the date format gives them).
_DATES = re.compile(r"(\b[^\W\d]{2,4}\.?\s+)?\b\d{1,2}\s+[^\W\d]{3,5}\.?(\s+\d{4})?")


def _untranslated(html: str) -> list[str]:
    """The text on the page that is neither a translated message nor data."""
    parser = _Text()
    parser.feed(html)
    text = " ".join(parser.parts)
    # Translated messages (nested ones included) and what they carry are taken out.
    while True:
        stripped = re.sub(f"{OPEN}[^{OPEN}{CLOSE}]*{CLOSE}", " ", text)
        if stripped == text:
            break
        text = stripped
    leftovers = []
    for chunk in re.split(r"\n|\s{2,}", text):
        rest = chunk.strip()
        for name in _NAMES:
            rest = rest.replace(name, " ")
        rest = _FIGURES.sub(" ", _DATES.sub(" ", rest)).replace("USD", " ")
        if re.search(r"[A-Za-z]{2,}", rest):
            leftovers.append(chunk.strip())
    return leftovers


@pytest.fixture
def folks(settings: Any) -> People:
    usage_data()
    return people()


def _client(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    ("who", "path", "params"),
    [
        ("acme_admin", "/usage/", {}),
        ("acme_admin", "/usage/models/", {}),
        ("acme_admin", "/usage/users/", {}),
        ("acme_admin", "/usage/refusals/", {}),
        ("acme_member", "/usage/", {}),
        ("support", "/usage/", {}),  # the tenant picker
        ("support", "/usage/users/", {"tenant": "acme"}),
        ("acme_admin", "/usage/manage/", {}),  # self-serve: the Budgets tab
        # ... its preview, a refusal beside its field, and a key shown once (POSTs)
        (
            "acme_admin",
            "/usage/manage/budgets/set/",
            {"kind": "end_user", "who": "bob-acme", "window": "day", "amount": "5"},
        ),
        (
            "acme_admin",
            "/usage/manage/budgets/set/",
            {"kind": "end_user", "who": "", "window": "day", "amount": "x"},
        ),
        ("acme_admin", "/usage/manage/keys/create/", {"name": "ci"}),
    ],
)
def test_every_string_on_the_pages_is_found_by_makemessages(
    marked_catalogue: None, folks: People, who: str, path: str, params: dict[str, str]
) -> None:
    Tenant.objects.filter(external_id="acme").update(self_serve=True, self_serve_ceiling=100)
    client = _client(getattr(folks, who))
    if path.startswith("/usage/manage/") and params:
        response = client.post(path, params)
        assert response.status_code in (200, 400)
        response.status_code = 200
    else:
        response = client.get(path, params)
    assert response.status_code == 200
    html = response.content.decode()
    assert OPEN in html  # the catalogue is in use
    leftovers = _untranslated(html)
    assert not leftovers, "\n".join(leftovers)

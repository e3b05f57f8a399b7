"""The accessibility gate of the browser tests: axe-core run in the page, a keyboard walk, and a
check that nothing scrolls the page sideways.

axe-core comes from the npm registry, pinned in ``tests/a11y/package.json`` and its lock file;
``make test`` runs ``npm ci`` there, so the tests read ``tests/a11y/node_modules/axe-core/
axe.min.js`` and never download anything. Without it the tests fail under ``CI=true`` and skip
elsewhere (``tests.services.require``), like the browser itself.

Use an ``Audit`` per test: ``audit.check(page, "state name")`` injects axe into the page, runs
the WCAG 2.0 and 2.1 level A and AA rules and records every violation that is not one of
Django admin's own, listed once in ``DJANGO_ADMIN_KNOWN`` by rule and CSS selector (so a new
violation of the same rule on another element still fails). ``audit.assert_clean()`` at the
end fails with one readable list: state, rule, impact, selector, help.
"""

from __future__ import annotations

import json
import pathlib
import time
from dataclasses import dataclass, field
from typing import Any

from tests.services import require

AXE_DIR = pathlib.Path(__file__).resolve().parent / "a11y"
AXE = AXE_DIR / "node_modules" / "axe-core" / "axe.min.js"
# WCAG 2.1 AA is what the pages promise (docs/pages.md, docs/support.md).
WCAG_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]

# The widths every page is checked at: a desktop window, a phone, and the desktop window at 200%
# zoom (a 640 px CSS viewport drawn with two device pixels per CSS pixel, which is what zooming a
# 1280 px window to 200% gives the page).
VIEWPORTS: dict[str, dict[str, Any]] = {
    "1280": {"viewport": {"width": 1280, "height": 900}, "device_scale_factor": 1},
    "375": {"viewport": {"width": 375, "height": 812}, "device_scale_factor": 2},
    "zoom200": {"viewport": {"width": 640, "height": 450}, "device_scale_factor": 2},
}


@dataclass(frozen=True)
class Known:
    """A violation that is Django admin's own (its templates, CSS and vendored scripts, not
    ours): axe's ``rule`` id on an element that matches the CSS ``selector`` (tested in the page
    with ``Element.matches``, so an entry covers that element wherever it appears and nothing
    else)."""

    rule: str
    selector: str
    why: str


# Django admin's own violations (Django 5.2's stock templates and CSS), written once. Nothing of
# ours may be added here: fix the template instead.
DJANGO_ADMIN_KNOWN: tuple[Known, ...] = (
    Known(
        "link-in-text-block",
        "div.breadcrumbs > a",
        "admin/base.css colours breadcrumb links (--breadcrumbs-link-fg) without an underline, "
        "under 3:1 against the bar's text (--breadcrumbs-fg)",
    ),
    Known(
        "aria-input-field-name",
        ".select2-container .select2-selection, .select2-container .select2-selection__rendered",
        "autocomplete_fields' vendored select2 gives its combobox and textbox spans roles and an "
        "aria-labelledby pointing at the empty selection, so they have no name",
    ),
    Known(
        "empty-table-header",
        ".inline-group .tabular thead th.original:empty,"
        " .inline-group .tabular thead th:last-child:empty",
        "edit_inline/tabular.html: an empty header over the change-link column, and over the "
        "Delete? column when deletion is not allowed",
    ),
)


@dataclass(frozen=True)
class Finding:
    state: str
    rule: str
    impact: str
    selector: str
    help: str
    html: str

    def line(self) -> str:
        where = f"{self.state}: {self.rule} ({self.impact}) at {self.selector}"
        return f"{where}: {self.help}\n    {self.html}"


_RUN_AXE = """async ([tags, known]) => {
  const result = await axe.run(document, {
    runOnly: {type: 'tag', values: tags}, resultTypes: ['violations'],
    // Beyond WCAG's tags: a header cell without text leaves its column unnamed.
    rules: {'empty-table-header': {enabled: true}},
  });
  const isKnown = (rule, target) => {
    if (target.length !== 1 || Array.isArray(target[0])) return false;  // in a frame or shadow
    const element = document.querySelector(target[0]);
    return !!element && known.some(k => k.rule === rule && element.matches(k.selector));
  };
  return result.violations.flatMap(v => v.nodes.map(n => ({
    rule: v.id, impact: v.impact || '', help: v.help,
    selector: n.target.map(t => Array.isArray(t) ? t.join(' >>> ') : t).join(' '),
    html: n.html.slice(0, 160),
    known: isKnown(v.id, n.target),
  })));
}"""


def _probe() -> None:
    if not AXE.exists():
        raise FileNotFoundError(f"{AXE} (run `make test`, or `npm ci` in {AXE_DIR})")


def require_axe() -> None:
    require("axe-core (tests/a11y, npm ci)", _probe)


def axe_findings(
    page: Any, state: str, known: tuple[Known, ...] = ()
) -> tuple[list[Finding], list[Finding]]:
    """Every WCAG 2.0/2.1 A and AA violation axe finds in the page as it is now: those that are
    not ``known``, and those that are."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(AXE))
    rules = [{"rule": k.rule, "selector": k.selector} for k in known]
    found, allowed = [], []
    for raw in page.evaluate(_RUN_AXE, [WCAG_TAGS, rules]):
        is_known = raw.pop("known")
        (allowed if is_known else found).append(Finding(state=state, **raw))
    return found, allowed


# Elements a keyboard user must be able to reach: visible, enabled, not taken out of the order.
_CONTROLS = """() => [...document.querySelectorAll(
    'a[href], button, input:not([type=hidden]), select, textarea, summary, [tabindex]'
  )].filter(e => !e.disabled && e.tabIndex >= 0
    && e.checkVisibility({contentVisibilityAuto: true, visibilityProperty: true}))
  .map(e => e.dataset.lbA11y || (e.dataset.lbA11y = String(Math.random()).slice(2)))"""

# What the focused element is, and whether its focus can be seen: an outline, a box shadow or a
# border that differs from the unfocused state (measured by blurring it a moment).
_FOCUSED = """() => {
  const e = document.activeElement;
  if (!e || e === document.body) return null;
  const look = el => { const s = getComputedStyle(el);
    return [s.outlineStyle, s.outlineWidth, s.outlineColor, s.boxShadow, s.borderColor,
            s.backgroundColor, s.color, s.textDecorationLine].join('|'); };
  const s = getComputedStyle(e);
  const ring = (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0)
    || (s.boxShadow && s.boxShadow !== 'none');
  const focused = look(e);
  return {id: e.dataset.lbA11y || '', ring, focused,
          name: `${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''} ${
            (e.textContent || e.value || e.name || '').trim().slice(0, 40)}`};
}"""


def keyboard_walk(page: Any, state: str, limit: int = 400) -> list[str]:
    """Tab through the page, freshly loaded, round to where it started: every control must be
    reached, and each must show where the focus is. Returns the problems found (empty: the
    walk passed)."""
    wanted = page.evaluate(_CONTROLS)
    reached: list[str] = []
    problems: list[str] = []
    outside = 0  # Tabs that left the document (past its last control, before the first)
    for _ in range(min(limit, 4 * len(wanted) + 5)):
        page.keyboard.press("Tab")
        focused = page.evaluate(_FOCUSED)
        if focused is None:
            outside += 1
            if outside > 1:
                break
            continue
        if reached and focused["id"] == reached[-1]:
            continue  # the next part of the same control (a date input's day, month, year)
        if focused["id"] in reached:
            break  # back round to where it started
        reached.append(focused["id"])
        if not focused["ring"]:
            blurred = page.evaluate(
                """() => { const e = document.activeElement; e.blur();
                  const s = getComputedStyle(e);
                  const look = [s.outlineStyle, s.outlineWidth, s.outlineColor, s.boxShadow,
                    s.borderColor, s.backgroundColor, s.color, s.textDecorationLine].join('|');
                  e.focus({focusVisible: true}); return look; }"""
            )
            if blurred == focused["focused"]:
                problems.append(f"{state}: focus not visible on {focused['name']}")
    missed = [w for w in wanted if w not in reached]
    if missed:
        names = page.evaluate(
            """(ids) => ids.map(id => {
                const e = document.querySelector(`[data-lb-a11y="${id}"]`);
                const text = (e.textContent || e.name || '').trim().slice(0, 40);
                return `${e.tagName.toLowerCase()} ${text}`; })""",
            missed[:10],
        )
        problems.append(f"{state}: Tab never reaches {len(missed)} control(s): {names}")
    return problems


def too_wide(page: Any) -> list[str]:
    """The innermost elements reaching past the window's right edge (for a failure message)."""
    return list(
        page.evaluate(
            """() => { const w = document.documentElement.clientWidth;
                const out = e => e.getBoundingClientRect().right > w + 1;
                return [...document.querySelectorAll('body *')]
                  .filter(e => out(e) && ![...e.children].some(out)
                    && !e.closest('[role=region], .results, #changelist-filter'))
                  .slice(0, 5)
                  .map(e => `${e.tagName.toLowerCase()}.${e.className} ${
                    e.textContent.trim().slice(0, 40)}`);
            }"""
        )
    )


# References to ids that are not in the page (axe only asks a person to review these): a help
# text or label pointed at but never read.
_BROKEN_IDREFS = """() => [...document.querySelectorAll('[aria-describedby], [aria-labelledby]')]
  .flatMap(e => ['aria-describedby', 'aria-labelledby'].flatMap(attr =>
    (e.getAttribute(attr) || '').split(/\\s+/).filter(id => id && !document.getElementById(id))
      .map(id => `${e.tagName.toLowerCase()}${e.id ? '#' + e.id : ''} ${attr}="${id}"`)))"""


# Django admin's own broken references, by the end of the id: nothing of ours may be added here.
DJANGO_ADMIN_KNOWN_IDREFS: dict[str, str] = {
    '_timezone_warning_helptext"': "Django 6's admin date and time inputs point at the timezone "
    "warning that DateTimeShortcuts.js adds only when the browser's offset differs from the "
    "server's (Django 5.2 has no such reference)",
}


def broken_idrefs(page: Any) -> list[str]:
    """``aria-describedby`` and ``aria-labelledby`` ids that no element of the page has, but
    Django admin's own (:data:`DJANGO_ADMIN_KNOWN_IDREFS`)."""
    return [
        ref
        for ref in page.evaluate(_BROKEN_IDREFS)
        if not any(ref.endswith(end) for end in DJANGO_ADMIN_KNOWN_IDREFS)
    ]


def sideways_overflow(page: Any) -> int:
    """How many CSS pixels the page is wider than its window (0: no sideways page scrolling)."""
    return int(
        page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    )


@dataclass
class Audit:
    """What one test found over many page states; ``assert_clean`` fails with all of it."""

    known: tuple[Known, ...] = ()
    states: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    allowed: list[Finding] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # each check's time

    def check(self, page: Any, state: str, *, keyboard: bool = False, fits: bool = False) -> None:
        """axe on the page as it is now; ``keyboard``: also the Tab walk; ``fits``: also no
        sideways scrolling of the page."""
        self.states.append(state)
        started = time.monotonic()
        found, allowed = axe_findings(page, state, self.known)
        self.findings.extend(found)
        self.allowed.extend(allowed)
        for ref in broken_idrefs(page):
            self.problems.append(f"{state}: points at an id the page lacks: {ref}")
        if fits and (overflow := sideways_overflow(page)) > 0:
            self.problems.append(
                f"{state}: the page scrolls sideways by {overflow} px: {too_wide(page)}"
            )
        if keyboard:
            self.problems.extend(keyboard_walk(page, state))
        self.seconds[state] = round(time.monotonic() - started, 2)

    def report(self) -> str:
        lines = [f.line() for f in self.findings] + self.problems
        return f"{len(self.states)} page states checked; {len(lines)} problem(s):\n" + "\n".join(
            lines
        )

    def dump(self, path: pathlib.Path) -> None:
        """All findings, the allowed ones too, as JSON (for counting; not read by the tests)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            json.dumps(
                {
                    "states": self.states,
                    "findings": [f.__dict__ for f in self.findings],
                    "allowed": [f.__dict__ for f in self.allowed],
                    "problems": self.problems,
                    "seconds": self.seconds,
                },
                indent=1,
            )
        )

    def assert_clean(self) -> None:
        assert not self.findings, self.report()
        assert not self.problems, self.report()

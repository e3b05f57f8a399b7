"""docs/integrations.md's generated tables: what the guard held and charged for each case of the
differential harness (tests/test_guard_differential.py), and how every parameter and resource of
the guarded clients is classified (from the guard's own ``Parameters`` tables and proxies).
Written by ``LLMB_WRITE_GUARD_TABLE=1 pytest tests/test_guard_differential.py``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parent.parent / "docs" / "integrations.md"
ROWS_BEGIN, ROWS_END = "<!-- guard-rows:begin -->", "<!-- guard-rows:end -->"
PARAMS_BEGIN, PARAMS_END = "<!-- guard-parameters:begin -->", "<!-- guard-parameters:end -->"


def _money(value: Any) -> str:
    return f"{value.normalize():f}" if value else "0"


def rows_table(rows: Sequence[Any], *, pending: Mapping[str, str]) -> str:
    lines = [
        "| case | SDK | call | finding | held | bill | charged | still reserved | outcome |",
        "|---|---|---|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        case = row.case
        how = [case.call, "async" if case.asynchronous else "sync"]
        if case.stream:
            how.append("stream" + (f", stopped after {case.stop_after}" if row.cut else ""))
        problems = row.problems()
        if row.refused:
            outcome = "refused" + (" (false refusal)" if problems else "")
        else:
            outcome = ", ".join(problems) or "ok"
        if case.name in pending:
            outcome += " (pending)"
        lines.append(
            f"| `{case.name}` | {case.sdk} | {'; '.join(how)} | {case.issue or 'ordinary'} | "
            f"{_money(row.held)} | {_money(row.bill)} | {_money(row.charged)} | "
            f"{_money(row.reserved)} | {outcome} |"
        )
    counts = {
        "cases": len(rows),
        "under-held": sum("under-held" in r.problems() for r in rows),
        "under-charged": sum("under-charged" in r.problems() for r in rows),
        "over-charged": sum("over-charged" in r.problems() for r in rows),
        "false refusals": sum("false refusal" in r.problems() for r in rows),
    }
    summary = ", ".join(f"{value} {name}" for name, value in counts.items())
    return "\n".join([f"Totals: {summary}.", "", *lines])


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def parameters_table() -> str:
    """Every parameter of every guarded method: priced, neutral, or refused and why."""
    from llm_budgets.integrations import anthropic as ant
    from llm_budgets.integrations import openai as oai

    tables = [
        ("openai chat.completions.create / parse", oai.CHAT_PARAMETERS),
        ("openai responses.create / parse", oai.RESPONSES_PARAMETERS),
        ("anthropic messages.create / stream", ant.MESSAGES_PARAMETERS),
    ]
    lines = ["| method | parameter | how the guard treats it |", "|---|---|---|"]
    for where, parameters in tables:
        priced = ", ".join(f"`{n}`" for n in sorted(parameters.priced))
        lines.append(f"| {where} | {priced} | admitted: counted, priced or pinned to the hold |")
        for name, why in sorted(parameters.refused.items()):
            lines.append(f"| {where} | `{name}` | refused: {_cell(why)} |")
        neutral = ", ".join(f"`{n}`" for n in sorted(parameters.neutral))
        lines.append(f"| {where} | {neutral} | admitted: bills nothing |")
    lines.append("| any | anything else | refused: not classified (deny by default) |")
    lines += ["", "| client path | names | how the guard treats them |", "|---|---|---|"]
    for sdk, proxy in (("openai", oai.GuardedOpenAI), ("anthropic", ant.GuardedAnthropic)):
        lines += _proxy_rows(sdk, proxy)
    return "\n".join(lines)


def _proxy_rows(path: str, proxy: Any) -> list[str]:
    """The guarded, free and refused names of a client proxy and of its children."""
    rows = []
    children = getattr(proxy, "_children", {})
    for label, names in (
        ("guarded: admitted and settled", sorted(children)),
        ("passes through: bills nothing", sorted(getattr(proxy, "_free", ()))),
        ("refused (`NotGuarded`)", sorted(getattr(proxy, "_refused", ()))),
    ):
        if names:
            rows.append(f"| {path} | {', '.join(f'`{n}`' for n in names)} | {label} |")
    for name, child in sorted(children.items()):
        rows += _proxy_rows(f"{path}.{name}", child)
    return rows


def _replace(text: str, begin: str, end: str, body: str) -> str:
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise AssertionError(f"docs/integrations.md has no {begin} ... {end} markers")
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text)


def write(rows: Sequence[Any], *, pending: Mapping[str, str]) -> None:
    text = DOC.read_text()
    text = _replace(text, ROWS_BEGIN, ROWS_END, rows_table(rows, pending=pending))
    text = _replace(text, PARAMS_BEGIN, PARAMS_END, parameters_table())
    DOC.write_text(text)

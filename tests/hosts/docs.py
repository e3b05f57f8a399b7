"""The fenced blocks of docs/adopting.md: the main path (run in order by tests/test_adopting.py)
and the host conventions (the matrix's hosts are built from them, tests/hosts/hosts.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ADOPTING = Path(__file__).resolve().parents[2] / "docs" / "adopting.md"
CONVENTIONS = "## Host conventions"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
# A block's first line may name the file it belongs to: "# path", "<!-- path -->", "{# path #}".
_LABEL = re.compile(r"^(?:# (?P<a>.+)|<!-- (?P<b>.+) -->|\{# (?P<c>.+) #\})$")


@dataclass(frozen=True)
class Block:
    lang: str
    label: str  # the first line's file name (and note), "" for a shell block
    body: str  # the text after the label line
    conventions: bool  # in the "Host conventions" section (else the main path)


@cache
def blocks() -> tuple[Block, ...]:
    text = ADOPTING.read_text()
    split = text.index(CONVENTIONS)
    found = []
    for match in _FENCE.finditer(text):
        lang, body = match.group(1), match.group(2)
        first, _, rest = body.partition("\n")
        label = _LABEL.match(first) if lang != "sh" else None
        name = next((g for g in label.groups() if g), "") if label else ""
        found.append(Block(lang, name, rest if label else body, match.start() > split))
    return tuple(found)


def convention(label: str) -> str:
    """The body of the conventions block labelled ``label`` (its file's text)."""
    matches = [b.body for b in blocks() if b.conventions and b.label == label]
    assert len(matches) == 1, f"docs/adopting.md has {len(matches)} blocks labelled {label!r}"
    return matches[0]

"""The template contract of the usage pages (docs/pages.md): a host's own
``llm_budgets/pages/base.html`` must give the pages a ``content`` block, and whatever blocks it
fills must exist in the template it extends (a block the parent lacks is silently not rendered:
the pages came out unstyled when a host's base had no ``extra_css``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.template import Context, TemplateDoesNotExist, TemplateSyntaxError
from django.template.loader import get_template
from django.template.loader_tags import BlockNode, ExtendsNode

BASE = "llm_budgets/pages/base.html"
OWN_BASE = Path(__file__).resolve().parent.parent / "templates" / BASE


def _compiled(name: str) -> Any:
    """The Django-language template behind ``name``, or None (another engine)."""
    return getattr(get_template(name), "template", None)


def _extends(template: Any) -> ExtendsNode | None:
    nodes = template.nodelist.get_nodes_by_type(ExtendsNode)
    return nodes[0] if nodes else None


def _parent_name(extends: ExtendsNode) -> object:
    """What ``{% extends %}`` names: a string, or (a variable) whatever it resolves to."""
    name: Any = extends.parent_name
    return name.resolve(Context())


def _chain_blocks(template: Any) -> tuple[set[str], list[str]]:
    """Every block name defined along ``template``'s inheritance chain, and the chain's names."""
    blocks: set[str] = set()
    names: list[str] = []
    seen = 0
    while template is not None and seen < 20:
        seen += 1
        names.append(str(template.origin.template_name or template.origin.name))
        blocks |= {node.name for node in template.nodelist.get_nodes_by_type(BlockNode)}
        extends = _extends(template)
        if extends is None:
            break
        parent = _parent_name(extends)
        if not isinstance(parent, str):
            break  # a variable or a Template object: cannot follow it without a request
        template = _compiled(parent)
    return blocks, names


def _unloadable(what: str, exc: Exception) -> Error:
    return Error(
        f"{what} cannot be loaded: {exc}.",
        hint="Fix the host's override (docs/pages.md, 'Template contract').",
        id="llm_budgets.E086",
    )


@register(Tags.templates)
def check_pages_base(**kwargs: Any) -> list[CheckMessage]:
    """``llm_budgets.W085`` (a filled block its parent lacks) and ``llm_budgets.E086`` (no
    ``content`` block for the pages), only when the host overrides the pages' base."""
    try:
        template = _compiled(BASE)
    except (TemplateDoesNotExist, TemplateSyntaxError) as exc:
        return [_unloadable(f"The usage pages' base template {BASE}", exc)]
    if template is None or Path(str(template.origin.name)).resolve() == OWN_BASE:
        return []
    where = str(template.origin.name)
    messages: list[CheckMessage] = []
    extends = _extends(template)
    try:
        if extends is not None:
            parent_name = _parent_name(extends)
            parent = _compiled(parent_name) if isinstance(parent_name, str) else None
            if parent is not None:
                available, chain = _chain_blocks(parent)
                # Only the top-level blocks replace the parent's; nested ones are new.
                filled = {node.name for node in extends.nodelist if isinstance(node, BlockNode)}
                for name in sorted(filled - available):
                    messages.append(
                        Warning(
                            f"{where} fills block {name!r}, which {chain[0]} (and what it "
                            "extends) does not define: its content is never rendered.",
                            hint=f"Blocks there: {', '.join(sorted(available)) or 'none'}. Put "
                            "it in one of them (docs/pages.md, 'Template contract').",
                            id="llm_budgets.W085",
                        )
                    )
        blocks, _ = _chain_blocks(template)
    except (TemplateDoesNotExist, TemplateSyntaxError) as exc:
        return [_unloadable(f"A template {where} extends", exc)]
    if "content" not in blocks:
        messages.append(
            Error(
                f"{where} defines no block 'content': every usage page fills it, so the pages "
                "would be blank.",
                hint="Put {% block content %}{% endblock %} where the pages belong in the "
                "host's layout (docs/pages.md, 'Template contract').",
                id="llm_budgets.E086",
            )
        )
    return messages

"""The guarded client's shape: a proxy that passes everything through to the SDK's client except
the calls it guards (defined by the SDK module's subclasses) and those it refuses (they cost money
and cannot be priced: ``NotGuarded``)."""

from __future__ import annotations

from typing import Any

from llm_budgets.integrations.guarding import GuardOptions, NotGuarded


class ClientProxy:
    """``_children``: attribute name -> proxy class for a resource with guarded calls.
    ``_refused``: attribute paths from the client that raise ``NotGuarded``."""

    _sdk = ""
    _children: dict[str, type[ClientProxy]] = {}
    _refused: frozenset[str] = frozenset()
    _instead = ""

    def __init__(self, target: Any, options: GuardOptions, path: str = "") -> None:
        self._target = target
        self._options = options
        self._path = path

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        path = f"{self._path}.{name}" if self._path else name
        if path in self._refused:
            raise NotGuarded(f"{self._sdk} client.{path}", instead=self._instead)
        value = getattr(self._target, name)
        child = self._children.get(name)
        if child is not None:
            return child(value, self._options, path)
        return value

    def __repr__(self) -> str:
        return f"<guarded {self._target!r} for tenant {self._options.tenant!r}>"

    @property
    def unguarded(self) -> Any:
        """The SDK object itself, for what the guard does not cover (your own hold needed)."""
        return self._target

    @property
    def is_async(self) -> bool:
        return "Async" in type(self._target).__name__

"""One walker over nested containers of tensors (batches, state dicts, training states)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch


def tree_map(fn: Callable[..., Any], obj: Any, *, leaf: Callable[..., Any] | None = None,
             path: str | None = None, container: Callable[..., Any] | None = None) -> Any:
    """``obj`` with every tensor replaced by ``fn(tensor)``, inside dicts (an OrderedDict stays one), lists, tuples
    (a namedtuple stays one), sets and frozensets; other values go through ``leaf`` (default: unchanged; dict keys
    too). ``torch.Size`` is a value, not a container.

    ``container`` is called on every container before its contents (to check its type). With ``path`` (the name
    of ``obj``, e.g. ``'state'``), the callbacks are called as ``f(value, where)`` with ``where`` like
    ``state['rng'][0]``, for error messages that name the place.
    """
    return _Walk(fn, leaf, container, with_path=path is not None).walk(obj, path)


class _Walk:
    """``tree_map``'s recursion. A class rather than a self-referencing closure: a closure that calls itself is a
    reference cycle, which would keep ``fn`` and everything it holds (tensors, XLA tensors with pending graphs)
    alive until the garbage collector runs, at a time that varies from run to run."""

    def __init__(self, fn: Callable[..., Any], leaf: Callable[..., Any] | None,
                 container: Callable[..., Any] | None, *, with_path: bool) -> None:
        self.fn, self.leaf, self.container, self.with_path = fn, leaf, container, with_path

    def call(self, f: Callable[..., Any], value: Any, where: str | None) -> Any:
        return f(value, where) if self.with_path else f(value)

    def walk(self, x: Any, where: str | None) -> Any:
        def sub(suffix: str) -> str | None:
            return None if where is None else where + suffix

        if isinstance(x, torch.Tensor):
            return self.call(self.fn, x, where)
        if self.container is not None and isinstance(x, (dict, list, tuple, set, frozenset)) \
                and not isinstance(x, torch.Size):
            self.call(self.container, x, where)
        leaf = self.leaf
        if isinstance(x, dict):
            if leaf is not None:
                for k in x:
                    self.call(leaf, k, sub(f" key {k!r}"))
            items = [(k, self.walk(v, sub(f"[{k!r}]"))) for k, v in x.items()]
            return OrderedDict(items) if isinstance(x, OrderedDict) else dict(items)
        if isinstance(x, torch.Size):
            return x if leaf is None else self.call(leaf, x, where)
        if isinstance(x, tuple) and hasattr(x, "_fields"):
            return type(x)(*(self.walk(v, sub(f"[{i}]")) for i, v in enumerate(x)))
        if isinstance(x, (list, tuple)):
            return type(x)(self.walk(v, sub(f"[{i}]")) for i, v in enumerate(x))
        if isinstance(x, (set, frozenset)):
            return type(x)(self.walk(v, sub(" element")) for v in x)
        return x if leaf is None else self.call(leaf, x, where)


def tree_tensors(obj: Any) -> list[torch.Tensor]:
    """Every tensor in ``obj``, in ``tree_map``'s order."""
    found: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        found.append(t)
        return t

    tree_map(keep, obj)
    return found

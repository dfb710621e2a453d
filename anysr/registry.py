"""Name -> class registries, so option files name things by ``type:`` as BasicSR does."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from anysr.errors import OptionError, did_you_mean

T = TypeVar("T")


class Registry:
    """A mapping from a name to a class or function, filled by the ``register`` decorator."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: dict[str, Any] = {}

    def register(self, obj: T | None = None, *, name: str | None = None) -> Any:
        """Register ``obj`` under its ``__name__`` (or ``name``); usable as ``@REG.register()``."""

        def add(o: T) -> T:
            key = name or o.__name__  # type: ignore[attr-defined]
            if key in self._items and self._items[key] is not o:
                raise KeyError(f"{self.name} registry: '{key}' is registered twice")
            self._items[key] = o
            return o

        if obj is None:
            return add
        return add(obj)

    def get(self, name: str, key_path: str = "type") -> Any:
        """The entry called ``name``; an OptionError naming ``key_path`` and the nearest name if absent."""
        try:
            return self._items[name]
        except KeyError:
            raise OptionError(
                f"{key_path}: unknown {self.name} '{name}'{did_you_mean(name, self._items)}; "
                f"known: {', '.join(sorted(self._items))}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))

    def keys(self) -> list[str]:
        return sorted(self._items)


ARCH_REGISTRY = Registry("arch")
MODEL_REGISTRY = Registry("model")
DATASET_REGISTRY = Registry("dataset")
LOSS_REGISTRY = Registry("loss")
METRIC_REGISTRY = Registry("metric")

__all__ = ["Registry", "ARCH_REGISTRY", "MODEL_REGISTRY", "DATASET_REGISTRY", "LOSS_REGISTRY",
           "METRIC_REGISTRY", "Callable"]

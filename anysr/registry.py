"""Name -> class registries, so option files name things by ``type:`` as BasicSR does."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from anysr.errors import OptionError, did_you_mean

T = TypeVar("T")


class Registry:
    """A mapping from a name to a class or function, filled by the ``register`` decorator."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: dict[str, Any] = {}
        self._aliases: dict[str, str] = {}  # lower-cased alias -> registered name
        self._sources: list[tuple[Callable[[Registry], bool], str]] = []
        self._missing: list[str] = []
        self._lazy: set[str] = set()  # names the sources registered: found by name, not listed by keys()
        # other names a file may give instead (the architectures' named presets): suggested for a misspelt name
        self.also_accepts: tuple[Callable[[], list[str]], str] | None = None

    def add_source(self, load: Callable[[Registry], bool], missing: str) -> None:
        """A lazy source of entries (an optional package): ``load(self)`` registers them and says whether it could
        (False: the package is not installed). It runs the first time a name is looked up that is not registered,
        so commands that name only built-in entries never import the package; ``keys()`` (the docs, the JSON
        Schema) lists the built-in entries only. ``missing``: added to the unknown-name error when it could not."""
        self._sources.append((load, missing))

    def _load_sources(self) -> None:
        sources, self._sources = self._sources, []
        before = set(self._items)
        for load, missing in sources:
            if not load(self):
                self._missing.append(missing)
        self._lazy |= set(self._items) - before

    def register(self, obj: T | None = None, *, name: str | None = None) -> Any:
        """Register ``obj`` under its ``__name__`` (or ``name``); usable as ``@REG.register()``."""

        def add(o: T) -> T:
            key = name or o.__name__  # type: ignore[attr-defined]
            if key in self._items and self._items[key] is not o:
                raise KeyError(f"{self.name} registry: '{key}' is registered twice")
            self._items[key] = o
            for alias in getattr(o, "other_names", ()):  # other projects' names for the same thing
                self._aliases.setdefault(alias.lower(), key)
            return o

        if obj is None:
            return add
        return add(obj)

    def canonical(self, name: object) -> str | None:
        """The registered name ``name`` refers to: itself, the one name equal to it ignoring case
        (traiNNer-redux's lower-case ``l1loss``), or one of a class's ``other_names``; None when none fits. A name
        not found loads the lazy sources once (``add_source``) and is looked up again."""
        if not isinstance(name, str):
            return None
        key = self._lookup(name)
        if key is None and self._sources:
            self._load_sources()
            key = self._lookup(name)
        return key

    def _lookup(self, name: str) -> str | None:
        if name in self._items:
            return name
        low = name.lower()
        folded = [k for k in self._items if k.lower() == low]
        if len(folded) == 1:
            return folded[0]
        return self._aliases.get(low) if not folded else None

    def get(self, name: str, key_path: str = "type") -> Any:
        """The entry called ``name`` (``canonical``); an OptionError naming ``key_path`` and the nearest name if
        absent."""
        key = self.canonical(name)
        if key is None:
            raise OptionError(f"{key_path}: {self.unknown(name)}")
        return self._items[key]

    def unknown(self, name: str, names: list[str] | None = None) -> str:
        """The message for an unknown ``name``: the nearest known one, the known ones (``names``: those shown),
        and how to install the optional packages whose entries could not be loaded."""
        names = self.keys() if names is None else names
        extra = "".join(f"; {m}" for m in self._missing)
        candidates = names
        if self.also_accepts is not None:
            candidates = names + self.also_accepts[0]()
            extra += f"; {self.also_accepts[1]}"
        return f"unknown {self.name} '{name}'{did_you_mean(str(name), candidates)}; known: {', '.join(names)}{extra}"

    def __contains__(self, name: object) -> bool:
        return self.canonical(name) is not None

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def keys(self) -> list[str]:
        """The registered names, but those of the lazy sources (so the docs do not depend on what is installed)."""
        return sorted(n for n in self._items if n not in self._lazy)

    @property
    def extensible(self) -> bool:
        """Whether lazy sources (optional packages) may add names that ``keys()`` does not list."""
        return bool(self._sources or self._lazy or self._missing)


REQUIRED = inspect.Parameter.empty
"""The default ``constructor_args`` gives to arguments without one."""


def constructor_args(obj: Any, skip: tuple[str, ...] = ()) -> tuple[dict[str, Any], bool]:
    """``({argument: default}, takes **kwargs)`` of a class or function; required ones map to ``REQUIRED``.

    ``skip``: arguments the caller supplies itself (an optimiser's ``params``, a scheduler's ``optimizer``)."""
    args: dict[str, Any] = {}
    var_kw = False
    for p in inspect.signature(obj).parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            var_kw = True
        elif p.kind is not inspect.Parameter.VAR_POSITIONAL and p.name not in skip:
            args[p.name] = p.default
    return args, var_kw


def argument(obj: Any, given: Mapping[str, Any], name: str) -> Any:
    """The value of constructor argument ``name`` that ``obj(**given)`` gets: ``given``'s, else its own default
    (one place for the default: the constructor's signature, never a copy of it in the caller)."""
    if name in given:
        return given[name]
    default = constructor_args(obj)[0].get(name, REQUIRED)
    if default is REQUIRED:
        raise KeyError(f"{getattr(obj, '__name__', obj)} has no default for argument {name!r}")
    return default


def argument_problems(obj: Any, given: Mapping[str, Any], key_path: str, what: str,
                      skip: tuple[str, ...] = ()) -> list[str]:
    """The one check of constructor arguments from options (networks, losses, optimisers, schedulers): unknown
    names (with the nearest valid one) and missing required ones, each naming ``<key_path>.<argument>``."""
    params, var_kw = constructor_args(obj, skip)
    problems = []
    valid = ", ".join(params)
    if not var_kw:
        for name in given:
            if name not in params:
                problems.append(f"{key_path}.{name}: unknown argument of {what}{did_you_mean(str(name), params)}; "
                                f"valid arguments: {valid}")
    for name, default in params.items():
        if default is REQUIRED and name not in given:
            problems.append(f"{key_path}.{name}: required argument of {what} is missing; add it "
                            f"(valid arguments: {valid})")
    return problems


def plain_options(opt: Any) -> dict[str, Any]:
    """A section of options as a plain dict (validated ``Options`` give theirs, nested lists included)."""
    to_dict = getattr(opt, "to_dict", None)
    return to_dict() if callable(to_dict) else dict(opt)


ARCH_REGISTRY = Registry("arch")
MODEL_REGISTRY = Registry("model")
DATASET_REGISTRY = Registry("dataset")
LOSS_REGISTRY = Registry("loss")
OPTIMIZER_REGISTRY = Registry("optimizer")
SCHEDULER_REGISTRY = Registry("scheduler")
METRIC_REGISTRY = Registry("metric")
DEGRADATION_REGISTRY = Registry("degradation")  # degradation models that make (LQ, GT) pairs from HR images

__all__ = ["OPTIMIZER_REGISTRY", "REQUIRED", "SCHEDULER_REGISTRY", "Registry", "argument", "argument_problems",
           "constructor_args", "plain_options", "ARCH_REGISTRY", "MODEL_REGISTRY", "DATASET_REGISTRY", "LOSS_REGISTRY",
           "METRIC_REGISTRY", "DEGRADATION_REGISTRY", "Callable"]

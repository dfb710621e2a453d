"""Validated options as frozen objects: ``opt.train.total_iter``, every default filled, nothing re-defaulted later.

``load_options`` validates a file once against the schema (``schema.py``) and returns an ``Options`` tree: each
section is an ``Options`` whose keys are exactly the schema's (a key the file did not give holds its default, or
None where the schema has no default: ``given()`` tells them apart), plus the free keys of sections that take them
(a network's constructor arguments). Lists become ``FrozenList``. Nothing can be assigned. Engine, models and data read
attributes; ``plain()`` gives nested dicts and lists back for code outside anysr (constructors, YAML, JSON).

Why not pydantic or msgspec: the schema engine already reports every problem at once with its key path, a "did you
mean" and BasicSR's quirks (``5e3`` strings, ``~``), which those libraries would need as much code to reproduce;
and this costs no import time (0.2 ms to freeze a full BasicSR file) and no dependency.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from anysr.errors import did_you_mean
from anysr.options.fields import MapOf, Section


class Options(Mapping[str, Any]):
    """One frozen section of validated options (attribute and mapping access)."""

    __slots__ = ("_values", "_known", "_where")

    def __init__(self, values: Mapping[str, Any], known: tuple[str, ...] = (), where: str = "") -> None:
        object.__setattr__(self, "_values", {k: freeze(v, f"{where}.{k}" if where else str(k))
                                             for k, v in values.items()})
        object.__setattr__(self, "_known", tuple(known))
        object.__setattr__(self, "_where", where)

    # ---------------------------------------------------------------- reading
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            return self[name]
        except KeyError as exc:
            raise AttributeError(str(exc.args[0])) from None

    def __getitem__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        if name in object.__getattribute__(self, "_known"):
            return None  # in the schema, without a default, not given
        where = object.__getattribute__(self, "_where")
        choices = [*values, *object.__getattribute__(self, "_known")]
        raise KeyError(f"{where + '.' if where else ''}{name}: no such option{did_you_mean(name, choices)}")

    def __contains__(self, name: object) -> bool:
        return name in object.__getattribute__(self, "_values")

    def __iter__(self) -> Iterator[str]:
        return iter(object.__getattribute__(self, "_values"))

    def __len__(self) -> int:
        return len(object.__getattribute__(self, "_values"))

    def given(self, name: str) -> bool:
        """Whether ``name`` has a value (given in the file or filled from a default)."""
        return name in object.__getattribute__(self, "_values")

    def with_values(self, **changes: Any) -> Options:
        """A copy with some values replaced (the data layer's one dataset per folder of a list)."""
        values, known, where = (object.__getattribute__(self, k) for k in ("_values", "_known", "_where"))
        return Options({**values, **changes}, known, where)

    def to_dict(self) -> dict[str, Any]:
        """Nested dicts and lists again (YAML, JSON, code outside anysr)."""
        return plain(self)  # type: ignore[no-any-return]

    def kwargs(self, *, exclude: tuple[str, ...] = ("type",)) -> dict[str, Any]:
        """The values given, as plain keyword arguments (a constructor's: a network, loss or optimiser)."""
        return {k: plain(v) for k, v in object.__getattribute__(self, "_values").items() if k not in exclude}

    # ---------------------------------------------------------------- frozen
    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"options are read-only ({self._where or 'top level'}.{name}); "
                             "change the YAML file or pass --force_yml")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("options are read-only")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return plain(self) == plain(dict(other))
        return NotImplemented

    def __hash__(self) -> int:
        raise TypeError("Options are not hashable")

    def __repr__(self) -> str:
        return f"Options({plain(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Options, (object.__getattribute__(self, "_values"), object.__getattribute__(self, "_known"),
                          object.__getattribute__(self, "_where")))


class FrozenList(tuple):  # type: ignore[type-arg]
    """A list of option values that cannot change; equal to the list it came from."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list):
            return list(self) == other
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__

    def __repr__(self) -> str:
        return repr(list(self))


def freeze(value: Any, where: str = "") -> Any:
    """Mappings become ``Options`` (of their own keys), lists ``FrozenList``; the rest stays."""
    if isinstance(value, Options | FrozenList):
        return value
    if isinstance(value, Mapping):
        return Options(value, (), where)
    if isinstance(value, (list, tuple)):
        return FrozenList(freeze(v, f"{where}[{i}]") for i, v in enumerate(value))
    return value


def plain(value: Any) -> Any:
    """Nested dicts and lists again (for constructors outside anysr, YAML and JSON)."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def typed(section: Section, values: Mapping[str, Any], where: str = "") -> Options:
    """Validated ``values`` of ``section`` as ``Options``: its schema keys known, nested sections typed too."""
    out = {}
    for key, value in values.items():
        fld = section.fields.get(key)
        sub = f"{where}.{key}" if where else str(key)
        out[key] = _typed_value(fld.type if fld is not None else None, value, sub)
    return Options(out, tuple(section.fields), where)


def _typed_value(spec: Any, value: Any, where: str) -> Any:
    if isinstance(value, Mapping):
        for member in spec if isinstance(spec, tuple) else (spec,):
            if isinstance(member, Section):
                return typed(member, value, where)
            if isinstance(member, MapOf):
                return Options({name: typed(member.entry, entry, f"{where}.{name}") for name, entry in value.items()},
                               (), where)
    return freeze(value, where)

"""A small schema engine: typed fields with defaults, nested sections, and a list of every problem found.

A schema is a ``Section`` (a mapping with known keys, each a ``Field``); a field's type is a Python scalar
type (``int``, ``float``, ``bool``, ``str``), ``None`` (null allowed), a ``ListOf``, a ``Section``, a
``MapOf`` (named entries, each a Section), ``dict`` (any mapping) or ``ANY``; a tuple is a union.
Validation never stops at the first problem: each one is recorded with its full key path.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anysr.errors import did_you_mean


class _Missing:
    """Marks a field without a default (it stays absent unless a rule fills it)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


class _AnyType:
    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _AnyType()


@dataclass(frozen=True)
class Check:
    """A value constraint: ``test(value)`` is True when fine; ``text`` says what is expected ('>= 1')."""

    test: Callable[[Any], bool]
    text: str

    def __call__(self, value: Any) -> str | None:
        return None if self.test(value) else f"must be {self.text}"


def at_least(low: float) -> Check:
    """Value >= ``low``."""
    return Check(lambda v: v >= low, f">= {low:g}")


def greater_than(low: float) -> Check:
    """Value > ``low``."""
    return Check(lambda v: v > low, f"> {low:g}")


def between(low: float, high: float, *, high_open: bool = False) -> Check:
    """``low <= value <= high`` (``< high`` when ``high_open``)."""
    if high_open:
        return Check(lambda v: low <= v < high, f"in [{low:g}, {high:g})")
    return Check(lambda v: low <= v <= high, f"in [{low:g}, {high:g}]")


@dataclass(frozen=True)
class ListOf:
    """A list of ``item`` values (exactly ``length`` long when given, at least ``min_len``)."""

    item: Any
    length: int | None = None
    min_len: int = 0


@dataclass(frozen=True)
class Field:
    """One option: its type, default (``MISSING``: left absent), constraints and documentation.

    ``check`` returns None when the value is fine, else what is expected ('must be >= 1').
    ``expect`` overrides the type text shown in errors and docs. ``keep=False`` validates then drops
    the key (accepted for BasicSR compatibility, ignored by anysr). ``default_doc`` describes a default
    that a rule computes (docs only). ``hints``: for a value that is not one of ``choices``, a better hint than
    the nearest spelling (``tpu`` -> TPUs are ``xla``). ``choices`` and ``expect`` may be functions of no argument,
    called when needed: what the registries hold (a choice that a registered class declares).
    """

    type: Any
    default: Any = MISSING
    required: bool = False
    choices: Sequence[Any] | Callable[[], Sequence[Any]] | None = None
    doc: str = ""
    check: Callable[[Any], str | None] | None = None
    expect: str | Callable[[], str] = ""
    keep: bool = True
    default_doc: str = ""
    hints: Mapping[str, str] = field(default_factory=dict)  # a wrong choice (lower case) -> what to say instead


@dataclass
class Context:
    """What rules may need besides the value: the mode, the root folder, the top-level scale, the problems."""

    is_train: bool
    root: Path
    scale: int | None = None
    problems: list[str] = field(default_factory=list)
    check_paths: bool = True  # False: input paths are resolved but need not exist (anysr bench reads none)
    top_level: frozenset[str] = frozenset()  # the file's first-level keys: one given inside a section is named so
    dialect: str = "basicsr"  # whose names the file speaks ("neosr": a .toml file): fixes are said in its terms

    def add(self, path: str, message: str) -> None:
        """Record one problem at ``path``."""
        self.problems.append(f"{path}: {message}" if path else message)


Rule = Callable[[dict[str, Any], str, Context, str | None], None]


@dataclass(frozen=True)
class Section:
    """A mapping with known keys. ``extra``: other keys pass through (constructor kwargs).

    ``aliases`` maps an accepted old name to the canonical one; ``refused`` maps a key to why it is refused;
    ``rule(out, path, ctx, key)`` runs after the fields (cross-field checks, computed defaults).
    """

    fields: Mapping[str, Field]
    extra: bool = False
    aliases: Mapping[str, str] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    rule: Rule | None = None
    doc: str = ""


@dataclass(frozen=True)
class MapOf:
    """A mapping of user-chosen names to entries of one Section (``datasets``, ``val.metrics``).

    ``key_check(name)`` returns None for a good name, else the problem. A null entry is dropped (not set).
    """

    entry: Section
    key_check: Callable[[str], str | None] | None = None
    doc: str = ""


def join(path: str, key: Any) -> str:
    """``a.b`` + ``c`` -> ``a.b.c`` (top level: just ``c``)."""
    return f"{path}.{key}" if path else str(key)


def show(value: Any) -> str:
    """A short printable form of a bad value, with its type."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    if value is None:
        return "null"
    return f"{text} ({type(value).__name__})"


def _members(spec: Any) -> tuple[Any, ...]:
    return spec if isinstance(spec, tuple) else (spec,)


def describe(spec: Any) -> str:
    """Human text for a type spec: 'int | null', 'list of 3 float', 'mapping'."""
    parts = []
    for m in _members(spec):
        if m is None:
            parts.append("null")
        elif m is ANY:
            parts.append("any")
        elif isinstance(m, ListOf):
            size = f"{m.length} " if m.length is not None else ""
            parts.append(f"list of {size}{describe(m.item)}")
        elif isinstance(m, MapOf):
            parts.append("mapping of name -> mapping")
        elif isinstance(m, Section) or m is dict:
            parts.append("mapping")
        else:
            parts.append(m.__name__)
    return " | ".join(parts)


def choices_of(fld: Field) -> Sequence[Any] | None:
    """The values a field accepts (its ``choices``, called when they are read from the registries), or None."""
    return fld.choices() if callable(fld.choices) else fld.choices


def expectation(fld: Field) -> str:
    """What a field accepts, for errors and docs: explicit ``expect``, else choices, else type + check."""
    if fld.expect:
        return fld.expect() if callable(fld.expect) else fld.expect
    choices = choices_of(fld)
    if choices is not None:
        return " | ".join("null" if c is None else repr(c) for c in choices)
    nullable = _allows_none(fld.type)
    text = describe(tuple(m for m in _members(fld.type) if m is not None))
    if isinstance(fld.check, Check):
        text = f"{text} {fld.check.text}"
    return f"{text} | null" if nullable else text


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            value = float(text)
        except ValueError:
            return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return float(value)
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if isinstance(value, float) and math.isfinite(value):
        return value
    return None


class _Bad(Exception):
    """Internal: the value does not match this member of a union."""


def _convert(member: Any, value: Any, path: str, ctx: Context, key: str | None) -> Any:
    """Convert ``value`` to ``member`` or raise _Bad; nested problems are recorded in ``ctx``."""
    if member is None:
        if value is None:
            return None
        raise _Bad
    if value is None:
        raise _Bad
    if member is ANY:
        return copy.deepcopy(value)
    if member is int:
        out = _as_int(value)
        if out is None:
            raise _Bad
        return out
    if member is float:
        out = _as_float(value)
        if out is None:
            raise _Bad
        return out
    if member in (bool, str):
        if type(value) is not member:
            raise _Bad
        return value
    if member is dict:
        if not isinstance(value, dict):
            raise _Bad
        return copy.deepcopy(value)
    if isinstance(member, ListOf):
        if not isinstance(value, (list, tuple)):
            raise _Bad
        if member.length is not None and len(value) != member.length:
            ctx.add(path, f"expected a list of {member.length} {describe(member.item)}, "
                    f"got {len(value)} items")
            return MISSING
        if len(value) < member.min_len:
            ctx.add(path, f"expected at least {member.min_len} items, got {len(value)}")
            return MISSING
        items = []
        for i, item in enumerate(value):
            items.append(convert(member.item, item, f"{path}[{i}]", ctx, key, expect=describe(member.item)))
        return MISSING if any(i is MISSING for i in items) else items
    if isinstance(member, Section):
        if not isinstance(value, dict):
            raise _Bad
        return validate_section(member, value, path, ctx, key)
    if isinstance(member, MapOf):
        if not isinstance(value, dict):
            raise _Bad
        out = {}
        for name, entry in value.items():
            sub = join(path, name)
            if not isinstance(name, str):
                ctx.add(sub, f"entry names must be strings, got {show(name)}")
                continue
            if member.key_check is not None:
                problem = member.key_check(name)
                if problem:
                    ctx.add(sub, problem)
                    continue
            if entry is None:  # null counts as not set: how an override removes an entry (datasets.val_2=~)
                continue
            if not isinstance(entry, dict):
                ctx.add(sub, f"expected a mapping, got {show(entry)}")
                continue
            out[name] = validate_section(member.entry, entry, sub, ctx, name)
        return out
    raise TypeError(f"unsupported schema type {member!r}")


def convert(spec: Any, value: Any, path: str, ctx: Context, key: str | None = None, *,
            expect: str | None = None) -> Any:
    """``value`` converted to ``spec`` (one type or a union); MISSING and a recorded problem on failure."""
    for member in _members(spec):
        try:
            return _convert(member, value, path, ctx, key)
        except _Bad:
            continue
    ctx.add(path, f"expected {expect or describe(spec)}, got {show(value)}")
    return MISSING


def _allows_none(spec: Any) -> bool:
    return None in _members(spec)


def validate_field(fld: Field, value: Any, path: str, ctx: Context, key: str | None = None) -> Any:
    """One field's value, converted and checked; MISSING when a problem was recorded."""
    if value is None and not _allows_none(fld.type) and fld.default is not MISSING and not fld.required:
        return fill_default(fld, path, ctx, key)
    if value is None and fld.required and not _allows_none(fld.type):
        ctx.add(path, f"required ({expectation(fld)}), got null")
        return MISSING
    out = convert(fld.type, value, path, ctx, key, expect=expectation(fld))
    if out is MISSING or out is None:
        return out
    choices = choices_of(fld)
    if choices is not None and out not in choices:
        names = [c for c in choices if isinstance(c, str)]
        hint = did_you_mean(out, names) if isinstance(out, str) else ""
        if isinstance(out, str) and out.lower() in fld.hints:
            hint = f" ({fld.hints[out.lower()]})"
        ctx.add(path, f"expected {expectation(fld)}, got {show(out)}{hint}")
        return MISSING
    if fld.check is not None:
        problem = fld.check(out)
        if problem:
            ctx.add(path, f"{problem}, got {show(out)}")
            return MISSING
    return out


def fill_default(fld: Field, path: str, ctx: Context, key: str | None = None) -> Any:
    """The field's default (mappings run through their Section so nested defaults are filled)."""
    value = copy.deepcopy(fld.default)
    if isinstance(value, dict):
        for member in _members(fld.type):
            if isinstance(member, Section):
                return validate_section(member, value, path, ctx, key)
    return value


def validate_section(section: Section, value: dict[str, Any], path: str, ctx: Context,
                     key: str | None = None) -> dict[str, Any]:
    """Check a mapping against ``section``: unknown, refused, missing and bad keys; then its rule."""
    value = dict(value)
    for alias, target in section.aliases.items():
        if alias in value:
            if target in value and value[target] != value[alias]:
                ctx.add(join(path, alias), f"is another name for '{target}', which is also set to a "
                        f"different value ({value[target]!r}); keep only '{target}'")
                value.pop(alias)
            else:
                value[target] = value.pop(alias)
    out: dict[str, Any] = {}
    for name, item in value.items():
        sub = join(path, name)
        if name in section.fields:
            continue
        if name in section.refused:
            ctx.add(sub, section.refused[name])
        elif section.extra:
            out[name] = copy.deepcopy(item)
        else:
            known = list(section.fields) + list(section.aliases)
            if path and name in ctx.top_level:  # e.g. traiNNer-redux's dataroot_lq_prob written under datasets
                ctx.add(sub, f"{name} is a top-level key, not one of {path}: move it to the file's first level")
                continue
            hint = did_you_mean(str(name), known)
            where = "top-level key" if not path else f"key in {path}"
            tail = hint if hint else f"; valid keys: {', '.join(section.fields)}"
            ctx.add(sub, f"unknown {where}{tail}")
    for name, fld in section.fields.items():
        sub = join(path, name)
        if name in value and value[name] is None and fld.default is MISSING and not fld.required \
                and not _allows_none(fld.type):
            continue  # null on an optional key without a default: left unset
        if name in value:
            result = validate_field(fld, value[name], sub, ctx, key)
        elif fld.required:
            ctx.add(sub, f"required ({expectation(fld)}) but missing")
            result = MISSING
        elif fld.default is not MISSING:
            result = fill_default(fld, sub, ctx, key)
        else:
            continue
        if fld.keep:
            out[name] = result
    failed = [k for k, v in out.items() if v is MISSING]
    if section.rule is not None:
        section.rule(out, path, ctx, key)
    for k in failed:
        out.pop(k, None)
    ordered = {k: out[k] for k in section.fields if k in out}
    ordered.update((k, v) for k, v in out.items() if k not in ordered)
    return ordered


def walk(section: Section, path: str = "") -> list[tuple[str, Field]]:
    """Every ``(key path, field)`` of a schema, depth first; named entries appear as ``<name>``."""
    found: list[tuple[str, Field]] = []
    for name, fld in section.fields.items():
        sub = join(path, name)
        found.append((sub, fld))
        for member in _members(fld.type):
            if isinstance(member, Section):
                found.extend(walk(member, sub))
            elif isinstance(member, MapOf):
                found.extend(walk(member.entry, f"{sub}.<name>"))
    return found

"""The options as a JSON Schema (draft 2020-12), for editors: ``anysr schema > options.schema.json``.

Put ``# yaml-language-server: $schema=<path or URL of the file>`` at the top of an options file and editors with
the YAML language server complete and check every key, with its documentation, choices and default. Built from
the same schema and registries the loader checks against, so it describes BasicSR's files too (aliases, numbers
written as text such as ``5e3``, ``~`` for "the default"); the arguments of every registered network, loss,
optimiser and schedule are listed under their ``type``. The loader stays the judge: some rules (paths exist,
sizes are multiples of the scale) are beyond a JSON Schema.
"""

from __future__ import annotations

import json
import math
from typing import Any

from anysr.options.common import registry
from anysr.options.fields import ANY, MISSING, Field, ListOf, MapOf, Section, choices_of, expectation
from anysr.options.schema import OPTIONS
from anysr.presets import ARCH_PRESETS, preset_names
from anysr.registry import REQUIRED, constructor_args

SCHEMA_ID = "https://anysr.dev/options.schema.json"
_NUMBER_TEXT = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"  # how PyYAML leaves 5e3 / 1e-4: a string

# Sections whose free keys are the constructor arguments of the class named by their ``type``.
_TYPED_SECTIONS = {
    ("network_g",): ("arch", ()), ("network_d",): ("arch", ()),
    ("train", "optim_g"): ("optimizer", ("params",)), ("train", "optim_d"): ("optimizer", ("params",)),
    ("train", "scheduler"): ("scheduler", ("optimizer", "warmup_iter")),
    ("train", "pixel_opt"): ("loss", ()), ("train", "perceptual_opt"): ("loss", ("vgg_state_dict",)),
    ("train", "gan_opt"): ("loss", ()), ("train", "feature_matching_opt"): ("loss", ()),
}
_NOT_ARGUMENTS = ("vgg_weights_path",)
# Required arguments the options checker fills when absent (a schedule's length defaults to train.total_iter).
_FILLED = {"scheduler": ("total_iter", "total_steps", "T_max")}  # section keys that are not constructor arguments
_ROLES = {("train", "pixel_opt"): "pixel", ("train", "perceptual_opt"): "perceptual", ("train", "gan_opt"): "gan",
          ("train", "feature_matching_opt"): "feature_matching"}
_REGISTRY_KEYS = {("model_type",): "model", ("datasets", "*", "type"): "dataset",
                  ("val", "metrics", "*", "type"): "metric"}


def _scalar(spec: Any) -> dict[str, Any]:
    if spec is None:
        return {"type": "null"}
    if spec is ANY:
        return {}
    if spec is bool:
        return {"type": "boolean"}
    if spec is str:
        return {"type": "string"}
    if spec is int:
        return {"anyOf": [{"type": "integer"}, {"type": "number", "multipleOf": 1},
                          {"type": "string", "pattern": _NUMBER_TEXT}]}
    if spec is float:
        return {"anyOf": [{"type": "number"}, {"type": "string", "pattern": _NUMBER_TEXT}]}
    if spec is dict:
        return {"type": "object"}
    raise TypeError(f"no JSON Schema for {spec!r}")


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    try:
        json.dumps(value)
    except TypeError:
        return None
    return value


def _type(spec: Any, path: tuple[str, ...]) -> dict[str, Any]:
    members = spec if isinstance(spec, tuple) else (spec,)
    parts = []
    for m in members:
        if isinstance(m, Section):
            parts.append(_section(m, path))
        elif isinstance(m, MapOf):
            entry = _section(m.entry, (*path, "*"))
            out: dict[str, Any] = {"type": "object", "additionalProperties": entry}
            if path == ("datasets",):
                out["propertyNames"] = {"pattern": "^(train|val|test)"}
            parts.append(out)
        elif isinstance(m, ListOf):
            arr: dict[str, Any] = {"type": "array", "items": _type(m.item, path)}
            if m.length is not None:
                arr["minItems"] = arr["maxItems"] = m.length
            elif m.min_len:
                arr["minItems"] = m.min_len
            parts.append(arr)
        else:
            parts.append(_scalar(m))
    return parts[0] if len(parts) == 1 else {"anyOf": parts}


def _field(fld: Field, path: tuple[str, ...]) -> dict[str, Any]:
    out = _type(fld.type, path)
    choices = choices_of(fld)
    if choices is not None:
        out = {"enum": list(choices)}
    kind = _REGISTRY_KEYS.get(path)
    if kind is not None:
        out = {"enum": registry(kind).keys()}
    if not fld.required and fld.default is not MISSING:
        out = {"anyOf": [out, {"type": "null"}]} if out.get("type") != "null" else out  # ~ means the default
        default = _json_default(fld.default)
        if default is not None and not isinstance(default, dict):
            out["default"] = default
    doc = fld.doc + (f" Accepts: {expectation(fld)}." if fld.doc else "")
    if doc:
        out["description"] = doc.strip()
    return out


def _constructor_variants(kind: str, skip: tuple[str, ...], role: str | None,
                          section_keys: list[str]) -> list[dict[str, Any]]:
    """One ``if type == X then (its arguments)`` per registered class; the section's own keys X does not take
    (SGD's momentum under Adam) are refused there."""
    variants = []
    reg = registry(kind)
    for name in reg.keys():
        cls = reg.get(name)
        if role is not None and getattr(cls, "role", None) != role:
            continue
        params, var_kw = constructor_args(cls, skip)
        props = {arg: ({"default": _json_default(default)} if default is not REQUIRED
                       and _json_default(default) is not None else {}) for arg, default in params.items()}
        required = [arg for arg, default in params.items()
                    if default is REQUIRED and arg not in _FILLED.get(kind, ())]
        then: dict[str, Any] = {"properties": props}
        if required:
            then["required"] = required
        foreign = [k for k in section_keys if k not in params and not var_kw]
        if foreign:
            then["not"] = {"anyOf": [{"required": [k]} for k in foreign]}
        variants.append({"if": {"properties": {"type": {"const": name}}, "required": ["type"]}, "then": then})
    return variants


def _preset_variants(section_keys: list[str]) -> list[dict[str, Any]]:
    """One ``if type == <preset> then (its class's arguments, under either spelling)`` per named preset."""
    variants = []
    for preset in sorted(ARCH_PRESETS.values(), key=lambda p: p.name):
        params, var_kw = constructor_args(registry("arch").get(preset.arch))
        names = {*params, *preset.renames, *preset.fixed, *preset.accepts, *(("scale",) if preset.scale_arg else ())}
        props = {arg: ({"default": _json_default(preset.kwargs[arg])} if arg in preset.kwargs
                       and _json_default(preset.kwargs[arg]) is not None else {}) for arg in sorted(names)}
        then: dict[str, Any] = {"properties": props}
        foreign = [k for k in section_keys if k not in names and not var_kw]
        if foreign:
            then["not"] = {"anyOf": [{"required": [k]} for k in foreign]}
        variants.append({"if": {"properties": {"type": {"const": preset.name}}, "required": ["type"]},
                         "then": then})
    return variants


def _section(section: Section, path: tuple[str, ...]) -> dict[str, Any]:
    props = {name: _field(fld, (*path, name)) for name, fld in section.fields.items()}
    for alias, target in section.aliases.items():
        props[alias] = {**props[target], "description": f"Another name for `{target}` (BasicSR)."}
    for refused in section.refused:
        props[refused] = {"not": {}, "description": f"Refused: it {section.refused[refused]}."}
    out: dict[str, Any] = {"type": "object", "properties": props}
    required = [name for name, fld in section.fields.items() if fld.required]
    if required:
        out["required"] = required
    if section.doc:
        out["description"] = section.doc
    typed = _TYPED_SECTIONS.get(path)
    if typed is not None:
        kind, skip = typed
        names = [n for n in registry(kind).keys() if _ROLES.get(path) is None
                 or getattr(registry(kind).get(n), "role", None) == _ROLES[path]]
        own = [k for k in section.fields if k not in ("type", *_NOT_ARGUMENTS)]
        out["allOf"] = _constructor_variants(kind, skip, _ROLES.get(path), own)
        if path == ("network_g",):
            out["allOf"] += _preset_variants(own)
            names = names + preset_names()
        if registry(kind).extensible:
            # an optional package's classes (anysr[optim]) are found by name at run time, never listed here (the
            # schema must not depend on what is installed): any other name is accepted with any arguments
            out["properties"]["type"] = {**props.get("type", {}), "anyOf": [{"enum": names}, {"type": "string"}]}
            out["allOf"].append({"if": {"properties": {"type": {"not": {"enum": names}}}, "required": ["type"]},
                                 "then": {"additionalProperties": True}})
        else:
            out["properties"]["type"] = {**props.get("type", {}), "enum": names}
        out["unevaluatedProperties"] = False  # an argument the chosen class does not take
    elif not section.extra:
        out["additionalProperties"] = False
    return out


def build_json_schema() -> dict[str, Any]:
    """The JSON Schema of an anysr (or BasicSR) options file."""
    schema = _section(OPTIONS, ())
    schema.update({"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
                   "title": "anysr options (BasicSR-compatible)"})
    return schema


def render() -> str:
    """The schema as stable, indented JSON text."""
    return json.dumps(build_json_schema(), indent=1, sort_keys=False) + "\n"

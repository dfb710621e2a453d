"""Named presets: the published variants of an architecture under one name (timm-style: ``hat_s``, ``span_s``,
``swinir_m``, ``esrgan_lite``), with traiNNer-redux's names accepted as they are.

An architecture module registers its presets next to its class (``register_presets``); an option file names one as
``network_g.type`` and may still override any argument, under the class's name or under traiNNer-redux's spelling
(``scale``, ``num_filters``, ...). The options loader expands the preset into the class and its arguments before
they are checked (so the run's saved options, the weights' metadata and every error message name the class), and
passes the top-level ``scale`` to the preset's scale argument unless that is given, as traiNNer-redux does.
``build_network`` expands presets too (``anysr infer --arch span_s``).

A name that is exactly a registered class (``SPAN``) is the class with its own defaults; a preset's name wins
over the same class name in other letter case (``span`` is traiNNer-redux's ``span`` preset: 52 channels, no
normalisation; ``rcan`` its RCAN, anysr's ``RCANOriginal``, where ``RCAN`` is BasicSR's), and a class name in
other case is the class (``msrresnet``). Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from anysr.errors import OptionError
from anysr.registry import ARCH_REGISTRY

Translate = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ArchPreset:
    """One named variant: the registered ``arch`` built with ``kwargs`` (the arguments that differ from the class's
    defaults)."""

    name: str
    arch: str
    kwargs: Mapping[str, Any]
    scale_arg: str | None = None
    renames: Mapping[str, str] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    translate: Translate | None = None
    accepts: tuple[str, ...] = ()  # other arguments ``translate`` reads (the JSON Schema lists them)
    source: str = ""

    def takes_scale(self, given: Mapping[str, Any]) -> bool:
        """Whether a scale from outside (the file's top-level ``scale``, ``--scale``) goes to this preset: it has a
        scale argument and ``given`` sets neither ``scale`` nor that argument."""
        return bool(self.scale_arg) and "scale" not in given and self.scale_arg not in given

    def arguments(self, given: Mapping[str, Any], key_path: str) -> dict[str, Any]:
        """The class's arguments for a file's ``given`` ones (any spelling) over the preset's."""
        args = dict(self.kwargs)
        for key, value in given.items():
            if key in self.fixed:
                if value != self.fixed[key]:
                    raise OptionError(f"{key_path}.{key}: {self.arch} has no such choice (anysr builds the layout of "
                                      f"{key}={self.fixed[key]!r}, the one whose weights load in spandrel); remove "
                                      f"{key} or set it to {self.fixed[key]!r}")
                continue
            name = self.scale_arg if key == "scale" and self.scale_arg else self.renames.get(key, key)
            if name == self.scale_arg and isinstance(value, bool):
                raise OptionError(f"{key_path}.{key}: the scale is a whole number (1, 2, 3, 4, ...), got {value!r}")
            args[name] = value
        if self.translate is not None:
            try:
                args = self.translate(args)
            except ValueError as e:
                raise OptionError(f"{key_path}: {e}") from e
        return args


ARCH_PRESETS: dict[str, ArchPreset] = {}


def register_presets(arch: str, presets: Mapping[str, Mapping[str, Any]], *, scale_arg: str | None,
                     renames: Mapping[str, str] | None = None, fixed: Mapping[str, Any] | None = None,
                     translate: Translate | None = None, accepts: tuple[str, ...] = (),
                     source: str = "traiNNer-redux") -> None:
    """Register named variants of ``arch``. ``scale_arg``: the argument the top-level ``scale`` goes to;
    ``renames``: other spellings of the class's arguments (traiNNer-redux's ``scale`` is always accepted);
    ``fixed``: arguments other implementations have that anysr's class builds one way only (any other value is
    refused); ``translate``: a last rewrite of the arguments (raises ValueError with a message; it may also pick
    another ``type``, as Real-CUGAN's one name picks the class by scale), reading ``accepts`` too."""
    for name, kwargs in presets.items():
        if name.lower() in ARCH_PRESETS:
            raise KeyError(f"arch preset '{name}' is registered twice")
        ARCH_PRESETS[name.lower()] = ArchPreset(name, arch, dict(kwargs), scale_arg, dict(renames or {}),
                                                dict(fixed or {}), translate, tuple(accepts), source)


def find_preset(name: object, class_names: Mapping[str, Any] | list[str]) -> ArchPreset | None:
    """The preset ``name`` names, unless it is exactly a registered class name."""
    if not isinstance(name, str) or name in class_names:
        return None
    return ARCH_PRESETS.get(name.lower())


def expand_preset(opt: Mapping[str, Any], key_path: str, scale: int | None = None) -> dict[str, Any]:
    """``{type: <preset>, ...overrides}`` -> ``{type: <class>, **arguments}``; ``scale`` (the file's top-level
    scale) goes to the preset's scale argument unless the file gives it."""
    preset = ARCH_PRESETS[str(opt["type"]).lower()]
    given = {k: v for k, v in opt.items() if k != "type"}
    if scale is not None and preset.takes_scale(given):
        given["scale"] = scale
    args = preset.arguments(given, key_path)
    return {"type": args.pop("type", preset.arch), **args}


def preset_names() -> list[str]:
    """Every registered preset name, sorted."""
    return sorted(p.name for p in ARCH_PRESETS.values())


ARCH_REGISTRY.also_accepts = (preset_names,
                              "or a named preset (hat_s, span_s, ...: docs/options.md, Architecture presets)")

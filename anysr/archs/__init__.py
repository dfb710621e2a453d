"""Network architectures. Every ``*_arch.py`` module in this folder is imported (and so registers its
classes in ``ARCH_REGISTRY``); ``build_network`` turns an option dict into a module."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
import warnings
from collections.abc import Mapping
from typing import Any

from torch import nn

from anysr.archs.arch_util import ArchArgumentError, avoid_slow_cpu_kernels
from anysr.errors import OptionError
from anysr.presets import expand_preset, find_preset
from anysr.registry import ARCH_REGISTRY, REQUIRED, argument_problems, constructor_args, plain_options

ARCH_MODULES = [
    importlib.import_module(f"{__name__}.{info.name}")
    for info in pkgutil.iter_modules(__path__)
    if info.name.endswith("_arch")
]
# Weight recognition lives in archs/recognition/; its modules' former names (anysr.archs.recognise, recognise_util,
# layouts) stay importable, as the same module objects, for code written against them.
for _moved in ("recognise", "recognise_util", "layouts"):
    sys.modules.setdefault(f"{__name__}.{_moved}", importlib.import_module(f"{__name__}.recognition.{_moved}"))
del _moved

def arch_kwargs(cls: type | str) -> dict[str, Any]:
    """Constructor arguments of an architecture (class or registered name) -> default value.

    Required arguments map to ``anysr.archs.REQUIRED`` (``inspect.Parameter.empty``).
    """
    if isinstance(cls, str):
        cls = ARCH_REGISTRY.get(cls)
    return constructor_args(cls)[0]


_NOT_SIZES = ("drop", "rate", "ratio", "prob", "eps", "scale", "range", "init", "seed", "mean", "std", "bias")


def _text_for_number(cls: type, kwargs: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    """``(argument, value given, an example)`` for the first argument given as text, a list or a mapping whose
    default (or annotation) is a number (``--arch-opt num_feat=eight``), else None: the reason a failed build
    names."""
    params = inspect.signature(cls).parameters
    for key, value in kwargs.items():
        param = params.get(key)
        if not isinstance(value, (str, list, tuple, dict)) or param is None:
            continue
        default = param.default
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            return key, value, default
        hint = param.annotation if isinstance(param.annotation, str) else getattr(param.annotation, "__name__", "")
        kinds = {part.strip() for part in str(hint).split("|")}
        if kinds & {"int", "float"} and not kinds & {"str", "Any"}:
            return key, value, 1 if "int" in kinds else 1.0
    return None


def build_network(opt: Mapping[str, Any], key_path: str = "network_g") -> nn.Module:
    """Build the architecture named by ``opt['type']`` with the other keys as constructor arguments.

    Unknown or missing arguments, and argument values the architecture rejects, raise OptionError
    naming ``<key_path>.<argument>``, the nearest valid name and the valid ones.
    """
    if not isinstance(opt, Mapping):
        raise OptionError(f"{key_path}: expected a mapping with a 'type' key and the network's arguments, "
                          f"got {type(opt).__name__}")
    opt = plain_options(opt)
    if "type" not in opt:
        raise OptionError(f"{key_path}.type: missing; name one of the architectures: "
                          f"{', '.join(ARCH_REGISTRY.keys())}")
    if find_preset(opt["type"], ARCH_REGISTRY.keys()) is not None:
        opt = expand_preset(opt, key_path)
    name = opt["type"]
    cls = ARCH_REGISTRY.get(name, key_path=f"{key_path}.type")
    kwargs = {k: v for k, v in opt.items() if k != "type"}
    problems = argument_problems(cls, kwargs, key_path, name)
    if problems:
        # Several problems: one header line, then one indented line each (as the options checker lists them).
        raise OptionError(problems[0] if len(problems) == 1 else
                          f"{len(problems)} problems in {key_path}:\n" + "\n".join(f"  {p}" for p in problems))
    try:
        with warnings.catch_warnings():  # the empty weight below is said once, as an error
            warnings.filterwarnings("ignore", message="Initializing zero-element tensors")
            net = cls(**kwargs)
    except ArchArgumentError as e:
        raise OptionError(f"{key_path}.{e.arg}: {e.detail}") from e
    except (TypeError, ValueError, ZeroDivisionError, RuntimeError) as e:  # torch's own: negative sizes and such
        text = _text_for_number(cls, kwargs)
        if text is not None:
            what = "the text" if isinstance(text[1], str) else f"a {type(text[1]).__name__}"
            raise OptionError(f"{key_path}.{text[0]}: {name} takes a number here, got {what} {text[1]!r}; give a "
                              f"number (e.g. {text[0]}={text[2]})") from e
        raise OptionError(f"{key_path}: cannot build {name} with {kwargs}: {e}") from e
    # A width of 0 builds, and fails only in the first forward, deep in torch. Empty weights alone are no error (RGT's
    # position bias is empty at small widths in the authors' code, and works): refused with an argument of 0 to name.
    zeros = [k for k, v in kwargs.items() if isinstance(v, int) and not isinstance(v, bool) and v == 0
             and not any(w in k for w in _NOT_SIZES)]
    empty = next(((n, tuple(p.shape)) for n, p in net.named_parameters() if p.numel() == 0), None) if zeros else None
    if empty is not None:
        raise OptionError(f"{key_path}: {name} with these arguments has an empty weight {empty[0]} of shape "
                          f"{list(empty[1])}: an argument is 0 ({', '.join(f'{key_path}.{k}=0' for k in zeros)})")
    avoid_slow_cpu_kernels(net)
    return net


__all__ = ["ARCH_MODULES", "REQUIRED", "arch_kwargs", "build_network"]

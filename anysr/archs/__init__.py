"""Network architectures. Every ``*_arch.py`` module in this folder is imported (and so registers its
classes in ``ARCH_REGISTRY``); ``build_network`` turns an option dict into a module."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

from torch import nn

from anysr.archs.arch_util import ArchArgumentError
from anysr.errors import OptionError, did_you_mean
from anysr.registry import ARCH_REGISTRY

ARCH_MODULES = [
    importlib.import_module(f"{__name__}.{info.name}")
    for info in pkgutil.iter_modules(__path__)
    if info.name.endswith("_arch")
]

REQUIRED = inspect.Parameter.empty
"""The value ``arch_kwargs`` gives to arguments without a default."""


def _signature_params(cls: type) -> tuple[dict[str, inspect.Parameter], bool]:
    """Named constructor parameters of ``cls`` and whether it also takes ``**kwargs``."""
    params: dict[str, inspect.Parameter] = {}
    var_kw = False
    for p in inspect.signature(cls).parameters.values():
        if p.kind is inspect.Parameter.VAR_KEYWORD:
            var_kw = True
        elif p.kind is not inspect.Parameter.VAR_POSITIONAL:
            params[p.name] = p
    return params, var_kw


def arch_kwargs(cls: type | str) -> dict[str, Any]:
    """Constructor arguments of an architecture (class or registered name) -> default value.

    Required arguments map to ``anysr.archs.REQUIRED`` (``inspect.Parameter.empty``).
    """
    if isinstance(cls, str):
        cls = ARCH_REGISTRY.get(cls)
    params, _ = _signature_params(cls)
    return {name: p.default for name, p in params.items()}


def build_network(opt: dict, key_path: str = "network_g") -> nn.Module:
    """Build the architecture named by ``opt['type']`` with the other keys as constructor arguments.

    Unknown or missing arguments, and argument values the architecture rejects, raise OptionError
    naming ``<key_path>.<argument>``, the nearest valid name and the valid ones.
    """
    if not isinstance(opt, dict):
        raise OptionError(f"{key_path}: expected a mapping with a 'type' key and the network's arguments, "
                          f"got {type(opt).__name__}")
    if "type" not in opt:
        raise OptionError(f"{key_path}.type: missing; name one of the architectures: "
                          f"{', '.join(ARCH_REGISTRY.keys())}")
    name = opt["type"]
    cls = ARCH_REGISTRY.get(name, key_path=f"{key_path}.type")
    kwargs = {k: v for k, v in opt.items() if k != "type"}
    params, var_kw = _signature_params(cls)
    valid = ", ".join(params)
    if not var_kw:
        for key in kwargs:
            if key not in params:
                raise OptionError(
                    f"{key_path}.{key}: unknown argument of {name}{did_you_mean(key, params)}; "
                    f"valid arguments: {valid}"
                )
    for pname, p in params.items():
        if p.default is REQUIRED and pname not in kwargs:
            raise OptionError(f"{key_path}.{pname}: required argument of {name} is missing; add it "
                              f"(valid arguments: {valid})")
    try:
        return cls(**kwargs)
    except ArchArgumentError as e:
        raise OptionError(f"{key_path}.{e.arg}: {e.detail}") from e
    except (TypeError, ValueError) as e:
        raise OptionError(f"{key_path}: cannot build {name} with {kwargs}: {e}") from e


__all__ = ["ARCH_MODULES", "REQUIRED", "arch_kwargs", "build_network"]

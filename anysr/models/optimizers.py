"""The optimizer registry: every ``torch.optim`` class by name and, as extras loaded on first use, the optimizers
of ``pytorch-optimizer`` (Adan, ADOPT, StableAdamW, Lion, SOAP, Prodigy, ...) and ``schedulefree``.

A new optimizer is a registration: the options check its arguments against its signature, ``build_optimizer``
calls it. Optimizers with a train/eval switch of the weights (schedule-free) are recognised by their ``train`` and
``eval`` methods; the model base (``BaseModel.optimizer_weights``) handles them.
"""

from __future__ import annotations

import fnmatch
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from anysr.errors import OptionError
from anysr.models import adan_schedulefree, neosr_optimizers  # noqa: F401 - register anysr's own optimizers
from anysr.registry import OPTIMIZER_REGISTRY, Registry, plain_options

# What some torch.optim classes need that a training step does not give: refused with the reason.
_UNSUPPORTED = {
    "LBFGS": "it needs a closure that re-evaluates the loss at every step; use Adam, AdamW or SGD",
    "SparseAdam": "it takes sparse gradients only (embeddings); use Adam or AdamW",
}


def _refusal(name: str, reason: str) -> Callable[..., Any]:
    def refuse(params: Any, **kwargs: Any) -> Any:
        del params, kwargs
        raise OptionError(f"optimizer {name} is not supported: {reason}")
    refuse.__name__ = name
    refuse.unsupported = reason  # type: ignore[attr-defined]  # the options say it before the run starts
    return refuse


def _torch_optimizers() -> dict[str, Any]:
    return {n: c for n, c in vars(torch.optim).items()
            if inspect.isclass(c) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer}


for _name, _cls in sorted(_torch_optimizers().items()):
    OPTIMIZER_REGISTRY.register(_refusal(_name, _UNSUPPORTED[_name]) if _name in _UNSUPPORTED else _cls,
                                name=_name)
# neosr's optimizers anysr has not (the others: anysr/models/neosr_optimizers.py); SOAP_SF too (case-insensitive)
OPTIMIZER_REGISTRY.register(_refusal("soap_sf", "neosr's schedule-free SOAP is not implemented in anysr; use adan_sf "
                                                "or adamw_sf (schedule-free), or pytorch-optimizer's SOAP"),
                            name="soap_sf")


def _closure_only(cls: type) -> bool:
    """Optimizers whose ``step`` requires a closure (second-order ones, schedulefree's *Closure variants)."""
    step = inspect.signature(cls.step).parameters.get("closure")
    return step is not None and step.default is inspect.Parameter.empty


def _load_pytorch_optimizer(reg: Registry) -> bool:
    try:
        import pytorch_optimizer  # noqa: PLC0415 - optional dependency (anysr[optim]), imported on first use
    except ImportError:
        return False
    for lower in pytorch_optimizer.get_supported_optimizers():
        cls = pytorch_optimizer.load_optimizer(lower)
        if cls.__name__ not in reg and not _closure_only(cls):  # torch's own classes keep their names
            reg.register(cls, name=cls.__name__)
    return True


def _load_schedulefree(reg: Registry) -> bool:
    try:
        import schedulefree  # noqa: PLC0415 - optional dependency (anysr[optim]), imported on first use
    except ImportError:
        return False
    for name in ("AdamWScheduleFree", "SGDScheduleFree", "RAdamScheduleFree", "AdamWScheduleFreeReference",
                 "SGDScheduleFreeReference"):
        cls = getattr(schedulefree, name, None)
        if cls is not None and name not in reg:
            reg.register(cls, name=name)
    return True


OPTIMIZER_REGISTRY.add_source(_load_schedulefree, "schedule-free optimizers (AdamWScheduleFree, SGDScheduleFree) "
                                                  "need `pip install anysr[optim]`")
OPTIMIZER_REGISTRY.add_source(_load_pytorch_optimizer, "optimizers of pytorch-optimizer (Adan, ADOPT, Lion, Prodigy, "
                                                       "SOAP, StableAdamW, ...) need `pip install anysr[optim]`")


def has_weight_switch(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the optimizer keeps train and eval weights and switches the parameters between them (schedule-free:
    ``train()`` / ``eval()``)."""
    return callable(getattr(optimizer, "train", None)) and callable(getattr(optimizer, "eval", None))


def param_groups(named: list[tuple[str, nn.Parameter]], opt: Any, key_path: str) -> list[dict[str, Any]]:
    """Parameter groups from ``param_groups: [{params: [glob, ...], lr: ..., ...}, ...]``: a parameter joins the
    first group one of whose patterns (``fnmatch`` on its name, e.g. ``body.*``) matches; the rest form the first
    group with the optimizer's own arguments. A group's other keys override those arguments for its parameters."""
    specs = plain_options(opt).get("param_groups") or []
    groups: list[dict[str, Any]] = [{"params": []}]
    for i, spec in enumerate(specs):
        spec = dict(spec)
        patterns = spec.pop("params", None)
        if isinstance(patterns, str):
            patterns = [patterns]
        if not patterns:
            raise OptionError(f"{key_path}.param_groups[{i}].params: required: the parameter names (globs such as "
                              "'body.*') of this group")
        groups.append({**{k: tuple(v) if isinstance(v, list) else v for k, v in spec.items()}, "params": [],
                       "patterns": [str(p) for p in patterns]})
    for name, p in named:
        group = next((g for g in groups[1:] if any(fnmatch.fnmatchcase(name, pat) for pat in g["patterns"])),
                     groups[0])
        group["params"].append(p)
    for i, group in enumerate(groups[1:]):
        if not group["params"]:
            some = ", ".join(n for n, _ in named[:4])
            raise OptionError(f"{key_path}.param_groups[{i}].params: {group['patterns']} match no trainable "
                              f"parameter of the network (its names look like: {some}, ...)")
        del group["patterns"]
    return groups if groups[0]["params"] else groups[1:]


def build_optimizer(params: list[nn.Parameter] | list[dict[str, Any]], opt: Any,
                    key_path: str) -> torch.optim.Optimizer:
    """An optimizer from ``{type: <OPTIMIZER_REGISTRY name>, lr: ..., ...}`` (arguments already checked by the
    options); ``params``: the parameters, or their groups. One with a weight switch starts in train mode."""
    kwargs = plain_options(opt)
    cls = OPTIMIZER_REGISTRY.get(kwargs.pop("type"), f"{key_path}.type")
    kwargs.pop("param_groups", None)
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in kwargs.items()}  # betas, etas, step_sizes
    try:
        optimizer = cls(params, **kwargs)
    except adan_schedulefree.OptimizerArgumentError as exc:  # anysr's own optimizers name the argument
        raise OptionError(f"{key_path}.{exc.arg}: {exc.detail}") from None
    except (TypeError, ValueError, KeyError) as exc:
        raise OptionError(f"{key_path}: {exc}") from None
    except (RuntimeError, AttributeError, ImportError) as exc:  # some take a model, 2-D weights, or an extra
        raise OptionError(f"{key_path}: {cls.__name__} cannot optimise this network's parameters ({exc}); it may "
                          "need a model instead of parameters, 2-D weights only, or another package; pick "
                          "another type") from None
    if has_weight_switch(optimizer):
        optimizer.train()
    return optimizer  # type: ignore[no-any-return]


__all__ = ["build_optimizer", "has_weight_switch", "param_groups"]

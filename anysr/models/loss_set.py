"""The losses a model trains with, from BasicSR's ``train.*_opt`` keys or the list ``train.losses`` (the same
objects either way): which to build, under which names they are logged, which weight files they read."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from anysr.archs.vgg_features import VGG_NAMES
from anysr.errors import CheckpointError, OptionError
from anysr.losses import build_loss
from anysr.losses.perceptual import vgg19_stand_in
from anysr.metrics.info import standard_weights
from anysr.models.base import WeightNeed
from anysr.registry import LOSS_REGISTRY, argument, constructor_args, plain_options

# BasicSR's keys and their log names
OPT_KEYS = {"pixel_opt": "pix", "perceptual_opt": "percep", "gan_opt": "gan", "feature_matching_opt": "feat"}
# Roles of losses on the discriminator's outputs: the GAN models build and call them, not ``SRModel.loss_terms``.
DISCRIMINATOR_ROLES = ("gan", "feature_matching")

StateDicts = list[Mapping[str, torch.Tensor]]


@dataclass(frozen=True)
class LossSpec:
    """One loss to build: logged as ``l_<name>`` (``l_g_<name>`` in GAN models), from ``key_path``; ``target``:
    what it compares the output with, ``gt`` (the model's GT for its role) or ``lq`` (the LQ upscaled to the
    output's size: ``train.match_lq_colors`` for loss classes whose ``matches_lq_colors`` is true)."""

    name: str
    key_path: str
    options: dict[str, Any]
    role: str
    target: str = "gt"

    @property
    def style_name(self) -> str:
        """The log name of a perceptual loss's style term (BasicSR's ``style`` for ``perceptual_opt``)."""
        return "style" if self.name == "percep" else f"{self.name}_style"


def loss_specs(train: Mapping[str, Any], model: str, roles: Sequence[str]) -> list[LossSpec]:
    """The losses of ``train``: its ``*_opt`` keys (as BasicSR) or its ``losses`` list (entries with loss_weight 0
    left out), each with a role the model (``model``, training ``roles``) trains; OptionError otherwise."""
    listed = train.get("losses")
    given = [k for k in OPT_KEYS if train.get(k)]
    if listed is not None and given:
        raise OptionError(f"train.losses: set together with {', '.join('train.' + k for k in given)}; keep one form")
    if listed is None:
        raw = [(OPT_KEYS[k], f"train.{k}", plain_options(train[k])) for k in given]
    else:
        raw = []
        for i, entry in enumerate(listed):
            opts = plain_options(entry)
            if opts.get("loss_weight") == 0:
                continue  # not built: needs no weight files
            label = opts.pop("name", None) or str(opts["type"]).lower().replace("loss", "")
            raw.append((label, f"train.losses[{i}]", opts))
    specs = []
    match_lq = bool(train.get("match_lq_colors"))
    for name, key_path, opts in raw:
        cls = LOSS_REGISTRY.get(opts["type"], f"{key_path}.type")
        role = getattr(cls, "role", "pixel")
        if role not in roles:
            raise OptionError(f"{key_path}.type: {opts['type']} (role {role}) is not trained by {model} "
                              f"(roles {', '.join(roles)}); change model_type or remove it")
        target = "lq" if match_lq and getattr(cls, "matches_lq_colors", False) else "gt"
        specs.append(LossSpec(name, key_path, {**opts, "type": LOSS_REGISTRY.canonical(opts["type"])}, role,
                              target))
    names = [s.name for s in specs]
    for s in specs:
        if names.count(s.name) > 1:
            raise OptionError(f"{s.key_path}: more than one loss is named '{s.name}'; give each a distinct name")
    return specs


def _takes(spec: LossSpec, argument: str) -> bool:
    return argument in constructor_args(LOSS_REGISTRY.get(spec.options["type"]))[0]


def _missing_weights(spec: LossSpec) -> str:
    """The message when a loss's weight files are not named: the class's own (``weights_needed(options)``), if any."""
    hint = getattr(LOSS_REGISTRY.get(spec.options["type"]), "weights_needed", None)
    return hint(spec.options) if hint else f"{spec.options['type']} needs its weight files"


def loss_weight_needs(specs: Sequence[LossSpec], store: dict[str, StateDicts]) -> list[WeightNeed]:
    """The weight files the losses read (the engine reads them; ``store[name]`` collects their state dicts):
    a VGG for PerceptualLoss / ContextualLoss (``vgg_weights_path``), the files of LPIPSLoss / DISTSLoss
    (``weights``, as ``val.metrics`` takes them). Not set: the standard files, found by name (``known``)."""
    needs: list[WeightNeed] = []

    def keep(name: str) -> Callable[[Mapping[str, torch.Tensor], Any], None]:
        return lambda sd, load: store.setdefault(name, []).append(sd)

    for spec in specs:
        if _takes(spec, "vgg_state_dict"):
            # a loss without the vgg_type choice runs VGG19
            vgg_type = str(argument(LOSS_REGISTRY.get(spec.options["type"]), spec.options, "vgg_type")) \
                if _takes(spec, "vgg_type") else "vgg19"
            needs.append(WeightNeed(
                "vgg19" if spec.name == "percep" else f"{spec.name} ({vgg_type})", f"{spec.key_path}.vgg_weights_path",
                spec.options.get("vgg_weights_path"), keep(spec.name), required=True, fresh_only=False,
                stand_in=lambda t=vgg_type: vgg19_stand_in(vgg_type=t),  # type: ignore[misc]
                missing=f"the {vgg_type.upper()} weights file is required (torchvision's {vgg_type} state dict)",
                known=vgg_type if vgg_type in VGG_NAMES else None))
        elif _takes(spec, "weight_state_dicts"):
            files = spec.options.get("weights") or spec.options.get("pretrain_network_ae") or []  # AESOPLoss
            files = [files] if isinstance(files, str) else list(files)
            metric = getattr(LOSS_REGISTRY.get(spec.options["type"]), "metric_name", None)
            standard = standard_weights(metric, spec.options.get("net")) if metric else ()
            if not files and not standard:
                option = "pretrain_network_ae" if _takes(spec, "pretrain_network_ae") else "weights"  # AESOPLoss
                needs.append(WeightNeed(spec.name, f"{spec.key_path}.{option}", None, keep(spec.name), required=True,
                                        fresh_only=False, missing=_missing_weights(spec)))
            for known in standard if not files else ():
                needs.append(WeightNeed(f"{spec.name} ({known})", f"{spec.key_path}.weights", None, keep(spec.name),
                                        required=True, fresh_only=False, known=known))
            for i, f in enumerate(files):
                needs.append(WeightNeed(f"{spec.name} weights[{i}]", f"{spec.key_path}.weights", str(f),
                                        keep(spec.name), required=True, fresh_only=False))
    return needs


def build_losses(specs: Sequence[LossSpec], store: dict[str, StateDicts],
                 device: torch.device) -> dict[str, nn.Module]:
    """The loss modules by name, on ``device``, the weight files' state dicts handed over (then dropped)."""
    out: dict[str, nn.Module] = {}
    for spec in specs:
        opts = dict(spec.options)
        sds = store.pop(spec.name, [])
        if _takes(spec, "vgg_state_dict"):
            opts["vgg_state_dict"] = sds[0] if sds else None
        elif _takes(spec, "weight_state_dicts"):
            opts["weight_state_dicts"] = sds
        try:
            out[spec.name] = build_loss(opts, spec.key_path).to(device)
        except (KeyError, ValueError, TypeError, RuntimeError, CheckpointError) as exc:
            raise OptionError(f"{spec.key_path}: {exc}") from None
    return out

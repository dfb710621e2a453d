"""MMRealSR's options (Mou et al., ECCV 2022; the authors' MMRealSRNet_x4.yml / MMRealSRGAN_x4.yml): the
top-level keys of its anchored synthesis, its ranking losses' checks, and which models read them.
``schema.py`` adds these fields to its sections and calls the rule."""

from __future__ import annotations

from typing import Any

from anysr.options.common import good, phase_of, registered
from anysr.options.fields import Context, Field, ListOf

ANCHORED_MODELS = "MMRealSRNetModel / MMRealSRGANModel"
_DIFF_DEFAULTS = {"gaussian_noise_diff_range": [1.0, 21.0], "poisson_noise_diff_range": [0.05, 2.05],
                  "jpeg_diff_range": [5.0, 60.0]}

MMREALSR_FIELDS: dict[str, Field] = {
    "gaussian_noise_diff_range": Field(
        (ListOf(float, length=2), None), default=None, default_doc="[1, 21] (the authors' model)",
        doc=f"{ANCHORED_MODELS}: how much stronger (sigma, 0-255 scale) the Gaussian noise of the noisier LQ "
            "version is, drawn per sample from this range when the two noise levels differ."),
    "poisson_noise_diff_range": Field(
        (ListOf(float, length=2), None), default=None, default_doc="[0.05, 2.05] (the authors' model)",
        doc=f"{ANCHORED_MODELS}: the same for the Poisson noise's scale."),
    "jpeg_diff_range": Field(
        (ListOf(float, length=2), None), default=None, default_doc="[5, 60] (the authors' files)",
        doc=f"{ANCHORED_MODELS}: how much lower the JPEG quality of the more compressed LQ version is, per sample."),
}

RANK_KEYS = ("rank_opt", "rank_opt_b", "rank_opt_anchor", "constraint_opt")


def anchored_model(model_type: Any) -> bool:
    """Whether ``model_type`` synthesises MMRealSR's anchored versions (reads the keys above)."""
    return bool(getattr(registered("model", model_type), "anchored", False))


def _datasets_rule(out: dict[str, Any], model: Any, ctx: Context) -> None:
    """MMRealSRGANDataset (three kernels per blur) goes with the MMRealSR models and they with it."""
    datasets = out.get("datasets")
    if not isinstance(datasets, dict) or not ctx.is_train:
        return
    for k, d in datasets.items():
        if phase_of(k) != "train" or not isinstance(d, dict):
            continue
        kind = d.get("type")
        triples = bool(getattr(registered("dataset", kind), "anchored_kernels", False))
        if anchored_model(model) and not triples and out.get("high_order_degradation") is not False:
            ctx.add(f"datasets.{k}.type", f"{model} synthesises its LQ versions from MMRealSRGANDataset (three "
                    f"blur kernels per stage), got {kind}; use type: MMRealSRGANDataset")
        elif triples and not anchored_model(model) and getattr(registered("model", model), "synthesises", False):
            ctx.add(f"datasets.{k}.type", f"{kind} draws MMRealSR's kernel triples for {ANCHORED_MODELS}; with "
                    f"model_type {model} use RealESRGANDataset")


def mmrealsr_rule(out: dict[str, Any], ctx: Context) -> None:
    """The keys above and train.rank_opt* only with the MMRealSR models; their defaults and ranges there; the
    ranking losses complete (the authors' models need all three)."""
    model = out.get("model_type")
    train = out.get("train") if isinstance(out.get("train"), dict) else {}
    _datasets_rule(out, model, ctx)
    if not anchored_model(model):
        for key in _DIFF_DEFAULTS:
            if out.get(key) is not None:
                ctx.add(key, f"is read only by {ANCHORED_MODELS}, not by model_type {model}; remove it")
        for key in RANK_KEYS:
            if train.get(key) is not None:
                ctx.add(f"train.{key}", f"is read only by {ANCHORED_MODELS}, not by model_type {model}; remove it")
        return
    for key, default in _DIFF_DEFAULTS.items():
        if out.get(key) is None:
            out[key] = list(default)
        elif good(out, key) and not 0 <= out[key][0] <= out[key][1]:
            ctx.add(key, f"must be [low, high] with 0 <= low <= high, got {out[key]}")
    if not ctx.is_train or not train:
        return
    if train.get("rank_opt") is not None:
        if train.get("rank_opt_b") is None:
            train["rank_opt_b"] = dict(train["rank_opt"])  # the blur ranking: rank_opt's settings unless given
        if train.get("rank_opt_anchor") is None:
            ctx.add("train.rank_opt_anchor", "missing: the ranking losses come with the anchor loss; add "
                    "{loss_weight: 0.0001} as the authors' files do (loss_weight 0: no anchor loss)")
    elif train.get("rank_opt_b") is not None or train.get("rank_opt_anchor") is not None:
        which = "rank_opt_b" if train.get("rank_opt_b") is not None else "rank_opt_anchor"
        ctx.add(f"train.{which}", "is read with train.rank_opt (the noise ranking loss); add rank_opt "
                "(e.g. {type: MarginRankingLoss, loss_weight: 0.01, margin: 0.05}) or remove it")

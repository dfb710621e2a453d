"""Real-ESRGAN's options: the keys of the models that synthesise their LQ (RealESRNetModel, RealESRGANModel) and of
RealESRGANDataset, their defaults (Real-ESRGAN x4plus) and rules. ``schema.py`` adds these fields to its sections and
calls the rules.

Which rules apply is read from the registered classes: a dataset's ``role`` ('synthesis_source': GT images and blur
kernels, no LQ), a model's ``synthesises``, the kernel kinds a synthesis source draws (``kernel_types``).
"""

from __future__ import annotations

import math
from typing import Any

from anysr.options.common import check_gt_size, dataset_role, good, known_names, phase_of, registered
from anysr.options.fields import MISSING, Check, Context, Field, ListOf, at_least, between, join

# Real-ESRGAN x4plus's settings (the Real-ESRGAN project's options/train_realesrgan_x4plus.yml): the defaults of the
# keys below, filled in for the models that synthesise their LQ and for RealESRGANDataset (BasicSR requires them).
# kernel_list and kernel_list2 default to every kind the dataset draws (its ``kernel_types``).
X4PLUS_KERNELS: dict[str, Any] = {
    "kernel_prob": [0.45, 0.25, 0.12, 0.03, 0.12, 0.03], "sinc_prob": 0.1,
    "blur_sigma": [0.2, 3.0], "betag_range": [0.5, 4.0], "betap_range": [1.0, 2.0],
    "kernel_prob2": [0.45, 0.25, 0.12, 0.03, 0.12, 0.03], "sinc_prob2": 0.1,
    "blur_sigma2": [0.2, 1.5], "betag_range2": [0.5, 4.0], "betap_range2": [1.0, 2.0],
    "final_sinc_prob": 0.8, "crop_pad_size": 400,
}
X4PLUS_MODEL: dict[str, Any] = {
    "high_order_degradation": True, "gt_usm": True, "l1_gt_usm": True, "percep_gt_usm": True, "gan_gt_usm": False,
    "resize_prob": [0.2, 0.7, 0.1], "resize_range": [0.15, 1.5], "gaussian_noise_prob": 0.5,
    "noise_range": [1.0, 30.0], "poisson_scale_range": [0.05, 3.0], "gray_noise_prob": 0.4, "jpeg_range": [30.0, 95.0],
    "second_blur_prob": 0.8, "resize_prob2": [0.3, 0.4, 0.3], "resize_range2": [0.3, 1.2],
    "gaussian_noise_prob2": 0.5, "noise_range2": [1.0, 25.0], "poisson_scale_range2": [0.05, 2.5],
    "gray_noise_prob2": 0.4, "jpeg_range2": [30.0, 95.0], "queue_size": 180,
}
# traiNNer-redux's resize filters (anysr.ops.degradation.TRAINNER_RESIZE_MODES; the options import no torch).
TRAINNER_RESIZE_MODES = ("bilinear", "bicubic", "nearest-exact", "lanczos", "area")
_KERNEL_PAD = 21  # RealESRGANDataset's kernel size (MAX_KERNEL_SIZE)
_BLUR_REACH = 10  # BasicSR pads every kernel to 21x21: filtering reflects 10 pixels, so images must be larger
_PROB = between(0, 1)


def _x4(key: str) -> str:
    value = {**X4PLUS_KERNELS, **X4PLUS_MODEL}[key]
    return f"{str(value).lower() if isinstance(value, bool) else value} (Real-ESRGAN x4plus)"


def _pair(doc: str, key: str) -> Field:
    return Field((ListOf(float, length=2), None), default=None, default_doc=_x4(key), doc=doc)


def _modes_fields(suffix: str, which: str) -> dict[str, Field]:
    return {
        f"resize_mode_list{suffix}": Field(
            (ListOf(str, min_len=1), None), default=None,
            default_doc="area, bilinear, bicubic, uniform (BasicSR)",
            expect=f"list of {' | '.join(TRAINNER_RESIZE_MODES)} | null",
            doc=f"{which} resize: the filters to choose from (traiNNer-redux's key and filters: bilinear and bicubic "
                "antialiased, lanczos (3 lobes), nearest-exact, area; results clamped to [0, 1]). Not given: "
                "BasicSR's area / bilinear / bicubic without antialiasing."),
        f"resize_mode_prob{suffix}": Field(
            (ListOf(float, min_len=1), None), default=None, default_doc="equal weights",
            doc=f"{which} resize: the weight of each filter of resize_mode_list{suffix} (traiNNer-redux)."),
    }


def _stage_fields(suffix: str, which: str) -> dict[str, Field]:
    return {
        **_modes_fields(suffix, which),
        f"jpeg_prob{suffix}": Field(float, default=1.0, check=_PROB,
                                    doc=f"{which} degradation: chance of its JPEG step, per batch (traiNNer-redux; "
                                        "BasicSR: always)."),
        f"resize_prob{suffix}": Field((ListOf(float, length=3), None), default=None,
                                      default_doc=_x4(f"resize_prob{suffix}"),
                                      doc=f"{which} degradation: weights of resizing up, down, or keeping the size."),
        f"resize_range{suffix}": _pair(f"{which} degradation: the resize factor range [low <= 1 <= high].",
                                       f"resize_range{suffix}"),
        f"gaussian_noise_prob{suffix}": Field((float, None), default=None, check=_PROB,
                                              default_doc=_x4(f"gaussian_noise_prob{suffix}"),
                                              doc=f"{which} degradation: chance of Gaussian noise (else Poisson)."),
        f"noise_range{suffix}": _pair(f"{which} degradation: Gaussian noise sigma range (0-255 scale).",
                                      f"noise_range{suffix}"),
        f"poisson_scale_range{suffix}": _pair(f"{which} degradation: Poisson noise scale range.",
                                              f"poisson_scale_range{suffix}"),
        f"gray_noise_prob{suffix}": Field((float, None), default=None, check=_PROB,
                                          default_doc=_x4(f"gray_noise_prob{suffix}"),
                                          doc=f"{which} degradation: chance that a sample's noise is gray (one field "
                                              "for all channels)."),
        f"jpeg_range{suffix}": _pair(f"{which} degradation: JPEG quality range, within (0, 100).",
                                     f"jpeg_range{suffix}"),
    }


REALESRGAN_FIELDS: dict[str, Field] = {
    "high_order_degradation": Field((bool, None), default=None, default_doc=_x4("high_order_degradation"),
                                    doc="RealESRNetModel / RealESRGANModel: synthesise the LQ from the GT by "
                                        "Real-ESRGAN's second-order degradation (needs RealESRGANDataset); false: "
                                        "train on the dataset's LQ/GT pairs (RealESRGANPairedDataset)."),
    "gt_usm": Field((bool, None), default=None, default_doc=_x4("gt_usm"),
                    doc="RealESRNetModel: USM-sharpen the GT before the degradation and train towards it."),
    "l1_gt_usm": Field((bool, None), default=None, default_doc=_x4("l1_gt_usm"),
                       doc="RealESRGANModel: the pixel loss compares with the USM-sharpened GT (false: the GT)."),
    "percep_gt_usm": Field((bool, None), default=None, default_doc=_x4("percep_gt_usm"),
                           doc="RealESRGANModel: the perceptual loss compares with the USM-sharpened GT."),
    "gan_gt_usm": Field((bool, None), default=None, default_doc=_x4("gan_gt_usm"),
                        doc="RealESRGANModel: the discriminator's real images are the USM-sharpened GT."),
    **_stage_fields("", "First"),
    "second_blur_prob": Field((float, None), default=None, check=_PROB, default_doc=_x4("second_blur_prob"),
                              doc="Second degradation: chance of the second blur (the kernels of kernel_list2)."),
    **_stage_fields("2", "Second"),
    **_modes_fields("3", "Final (back to the LQ size)"),
    "blur_prob": Field(float, default=1.0, check=_PROB,
                       doc="First degradation: chance of the first blur (kernel_list), per batch (traiNNer-redux; "
                           "BasicSR: always)."),
    "thicklines_prob": Field(float, default=0.0, check=_PROB,
                             doc="Chance, per batch, of traiNNer-redux's ThickLines filter before the first blur: "
                                 "3/4 image + 1/4 its 3x3 minimum, which thickens dark lines (line art)."),
    "lq_usm": Field((bool, None), default=None,
                    doc="traiNNer-redux: true: the degradation starts from the GT unsharp-masked with a radius drawn "
                        "per batch from lq_usm_radius_range; false: from the plain GT. null: as BasicSR (Real-ESRGAN: "
                        "from the USM-sharpened GT; RealESRNet: with gt_usm)."),
    "lq_usm_radius_range": Field(ListOf(int, length=2), default=[1, 25],
                                 doc="lq_usm: the USM radius range [min, max] (both included; even radii are made "
                                     "odd)."),
    "high_order_degradations_debug": Field(bool, default=False,
                                           doc="Save the synthesised LQ and GT batches (after the pool) as PNG grids "
                                               "in experiments/<name>/debug/otf (first rank; traiNNer-redux)."),
    "high_order_degradations_debug_limit": Field(int, default=100, check=at_least(0),
                                                 doc="high_order_degradations_debug: how many batches to save (0: "
                                                     "every one)."),
    "dataroot_lq_prob": Field(float, default=0.0, check=Check(lambda v: v == 0, "0 (mixing the dataset's real LQ "
                                                                "images with synthesised ones is not available)"),
                              doc="traiNNer-redux: chance of a real LQ image instead of a synthesised one; only 0 "
                                  "is accepted."),
    "gt_size": Field((int, None), default=None, check=at_least(1), default_doc="datasets.train.gt_size",
                     doc="Real-ESRGAN models: the GT crop taken after the synthesis (a multiple of scale, at most "
                         "crop_pad_size); equal to datasets.train.gt_size when both are set."),
    "queue_size": Field((int, None), default=None, check=at_least(0), default_doc=_x4("queue_size"),
                        doc="Real-ESRGAN models: training-pair pool size per device, a multiple of "
                            "batch_size_per_gpu (0: no pool); its contents are part of the training state."),
    "degrade_in": Field(str, default="auto", choices=("auto", "step", "loader"),
                        doc="Where Real-ESRGAN models synthesise the LQ: step (in the training step on the device, "
                            "one set of resize/noise/JPEG choices per batch, as BasicSR) or loader (per sample in "
                            "the DataLoader workers on the CPU; the device sees fixed shapes). auto: loader on XLA, "
                            "step elsewhere."),
}


def _ffhq(suffix: str, default: str) -> str:
    return "" if suffix else f" FFHQDegradationDataset: the same, for its one blur ({default}, GFPGAN v1)."


def _kernel_fields(suffix: str, which: str) -> dict[str, Field]:
    return {
        f"kernel_list{suffix}": Field((ListOf(str, min_len=1), None), default=None,
                                      default_doc="all six kinds (Real-ESRGAN x4plus)",
                                      expect=lambda: f"list of {' | '.join(kernel_types())} | null",
                                      doc=f"RealESRGANDataset, {which} blur: the kernel kinds to mix."
                                          + _ffhq(suffix, "default iso, aniso")),
        f"kernel_prob{suffix}": Field((ListOf(float, min_len=1), None), default=None,
                                      default_doc=_x4(f"kernel_prob{suffix}"),
                                      doc=f"RealESRGANDataset, {which} blur: the weight of each kind of kernel_list"
                                          f"{suffix}." + _ffhq(suffix, "default 0.5, 0.5")),
        f"blur_sigma{suffix}": _pair(f"RealESRGANDataset, {which} blur: sigma range (both axes), low > 0."
                                     + _ffhq(suffix, "default [0.1, 10]"), f"blur_sigma{suffix}"),
        f"betag_range{suffix}": _pair(f"RealESRGANDataset, {which} blur: generalized Gaussian shape range.",
                                      f"betag_range{suffix}"),
        f"betap_range{suffix}": _pair(f"RealESRGANDataset, {which} blur: plateau shape range.",
                                      f"betap_range{suffix}"),
        f"sinc_prob{suffix}": Field((float, None), default=None, check=_PROB, default_doc=_x4(f"sinc_prob{suffix}"),
                                    doc=f"RealESRGANDataset, {which} blur: chance of a sinc kernel instead."),
        f"kernel_range{suffix}": Field((ListOf(int, length=2), None), default=None, default_doc="[7, 21] (BasicSR)",
                                       doc=f"RealESRGANDataset, {which} blur: the odd kernel sizes [min, max] drawn "
                                           "from (traiNNer-redux; every kernel is padded to 21x21, so max <= 21)."),
        f"blur_kernel_size{suffix}": Field((int, ListOf(int, length=2)) if not suffix else int, keep=bool(not suffix),
                                           doc="RealESRGANDataset: accepted (BasicSR reads it and ignores it: kernel "
                                               "sizes are drawn from 7 to 21 and padded to 21)."
                                               + ("" if suffix else " FFHQDegradationDataset: the size of its blur "
                                                  "kernel, odd (default 41, GFPGAN v1). FFHQUnevenDegradationDataset: "
                                                  "that, or RestoreFormer's [low, high]: sizes 2k + 1, k uniform in "
                                                  "it per branch.")),
    }


REALESRGAN_DATASET_FIELDS: dict[str, Field] = {
    **_kernel_fields("", "first"),
    **_kernel_fields("2", "second"),
    "final_sinc_prob": Field((float, None), default=None, check=_PROB, default_doc=_x4("final_sinc_prob"),
                             doc="RealESRGANDataset: chance of the final sinc filter (else none)."),
    "final_kernel_range": Field((ListOf(int, length=2), None), default=None, default_doc="[7, 21] (BasicSR)",
                                doc="RealESRGANDataset: the odd sizes [min, max] of the final sinc filter "
                                    "(traiNNer-redux; max <= 21)."),
    "crop_pad_size": Field((int, None), default=None, check=at_least(1), default_doc="400 (RealESRGANDataset)",
                           doc="RealESRGANDataset: images are reflect-padded to at least this size, then a random "
                               "square of this size is cropped and degraded (BasicSR hard-codes 400); a multiple "
                               "of scale."),
    "random_scale": Field((float, None), default=None, check=Check(lambda v: 0 < v < 1, "a factor in (0, 1)"),
                          doc="MMRealSRGANDataset: downscale each GT (Lanczos) by a factor uniform in [random_scale, "
                              "1] first, grown by 0.1 steps while a side is below crop_pad_size (the authors' "
                              "loop). null: none."),
    "blur_kernel_diff_lower_bound": Field((float, None), default=None, check=at_least(0), default_doc="0.1",
                                          doc="MMRealSRGANDataset: the least difference of the small and the large "
                                              "blur kernel's sigmas (sum of both axes for anisotropic kernels); at "
                                              "most the width of blur_sigma and blur_sigma2."),
}
_ANCHORED_DATASET_KEYS = ("random_scale", "blur_kernel_diff_lower_bound")


SYNTHESIS_SOURCE = "synthesis_source"  # the role of a dataset that gives GT images and kernels, no LQ


def is_synthesis_source(kind: Any) -> bool:
    """A dataset that gives GT images and kernels and no LQ (RealESRGANDataset)."""
    return dataset_role(kind) == SYNTHESIS_SOURCE


def kernel_types() -> list[str]:
    """The blur kernel kinds the registered synthesis sources draw (their ``kernel_types``), in their order."""
    kinds: list[str] = []
    for name in known_names("dataset", SYNTHESIS_SOURCE):
        kinds += [k for k in registered("dataset", name).kernel_types if k not in kinds]
    return kinds


def _synthesises(model_type: Any) -> bool:
    """A model that makes its LQ from a synthesis source (RealESRNetModel, RealESRGANModel)."""
    return bool(getattr(registered("model", model_type), "synthesises", False))


def _fill(out: dict[str, Any], defaults: dict[str, Any]) -> None:
    for k, v in defaults.items():
        if k in out and out[k] is None:
            out[k] = list(v) if isinstance(v, list) else v


def _check_range(out: dict[str, Any], key: str, path: str, ctx: Context, *, low: float | None = None,
                 low_open: bool = False, high: float | None = None, high_open: bool = False,
                 around_one: bool = False) -> None:
    if not good(out, key):
        return
    lo, hi = out[key]
    bad = lo > hi or (low is not None and (lo <= low if low_open else lo < low)) \
        or (high is not None and (hi >= high if high_open else hi > high)) or (around_one and not lo <= 1 <= hi)
    if bad:
        want = "low <= high"
        if low is not None:
            want += f", low {'>' if low_open else '>='} {low:g}"
        if high is not None:
            want += f", high {'<' if high_open else '<='} {high:g}"
        if around_one:
            want += ", low <= 1 <= high"
        ctx.add(join(path, key), f"must be a range [low, high] with {want}, got {out[key]}")


def _check_weights(out: dict[str, Any], key: str, path: str, ctx: Context) -> None:
    if good(out, key) and (any(p < 0 for p in out[key]) or sum(out[key]) <= 0):
        ctx.add(join(path, key), f"must be non-negative weights with a positive sum, got {out[key]}")


def realesrgan_dataset_rule(out: dict[str, Any], path: str, ctx: Context, phase: str) -> None:
    """Cross-key checks of a synthesis source's section (RealESRGANDataset); its x4plus defaults filled."""
    kind = out["type"]
    kinds = list(registered("dataset", kind).kernel_types)
    out.pop("blur_kernel_size", None)  # read and ignored, as BasicSR does
    anchored = bool(getattr(registered("dataset", kind), "anchored_kernels", False))
    for key in _ANCHORED_DATASET_KEYS:
        if not anchored and good(out, key):
            ctx.add(f"{path}.{key}", f"is read by MMRealSRGANDataset only, not by {kind}; remove it")
    if anchored and out.get("blur_kernel_diff_lower_bound") is None:
        out["blur_kernel_diff_lower_bound"] = 0.1
    _fill(out, {**X4PLUS_KERNELS, "kernel_list": kinds, "kernel_list2": kinds})
    if phase != "train":
        ctx.add(f"{path}.type", f"{kind} is a training set (it has GT images only); validate with "
                "PairedImageDataset (lq_from_gt: true, or dataroot_lq) or RealESRGANPairedDataset")
    if "dataroot_gt" in out and out["dataroot_gt"] is None:
        ctx.add(f"{path}.dataroot_gt", f"required by {kind} (the ground-truth images)")
    if good(out, "dataroot_lq"):
        ctx.add(f"{path}.dataroot_lq", f"{kind} makes the LQ from the GT; remove dataroot_lq (or use "
                "RealESRGANPairedDataset with high_order_degradation: false)")
    for key in ("mean", "std", "color"):
        if good(out, key):
            ctx.add(f"{path}.{key}", f"is not supported by {kind} (its degradations work on 8-bit RGB); remove it")
    for suffix in ("", "2"):
        names, probs = f"kernel_list{suffix}", f"kernel_prob{suffix}"
        if good(out, names):
            bad = [k for k in out[names] if k not in kinds]
            if bad:
                ctx.add(f"{path}.{names}", f"unknown kernel kind(s) {bad}; choose from {kinds}")
            elif good(out, probs) and len(out[probs]) != len(out[names]):
                ctx.add(f"{path}.{probs}", f"has {len(out[probs])} weights for the {len(out[names])} kinds of "
                        f"{names}; give one weight per kind")
        _check_weights(out, probs, path, ctx)
        _check_range(out, f"blur_sigma{suffix}", path, ctx, low=0, low_open=True)
        _check_range(out, f"betag_range{suffix}", path, ctx, low=0, low_open=True)
        _check_range(out, f"betap_range{suffix}", path, ctx, low=0, low_open=True)
        bound, sigma = out.get("blur_kernel_diff_lower_bound"), out.get(f"blur_sigma{suffix}")
        if anchored and isinstance(bound, float) and good(out, f"blur_sigma{suffix}") \
                and bound > sigma[1] - sigma[0]:
            ctx.add(f"{path}.blur_kernel_diff_lower_bound", f"{bound} exceeds the width of blur_sigma{suffix} "
                    f"{sigma}; lower it or widen blur_sigma{suffix}")
    for key in ("kernel_range", "kernel_range2", "final_kernel_range"):
        if good(out, key):
            lo, hi = out[key]
            if lo % 2 == 0 or hi % 2 == 0 or not 3 <= lo <= hi:
                ctx.add(f"{path}.{key}", f"must be [min, max] odd kernel sizes with 3 <= min <= max, got {out[key]}")
            elif hi > _KERNEL_PAD:
                ctx.add(f"{path}.{key}", f"goes up to {hi}; every kernel is padded to {_KERNEL_PAD}x{_KERNEL_PAD}, so "
                        f"max <= {_KERNEL_PAD}")
    if good(out, "crop_pad_size") and ctx.scale is not None and out["crop_pad_size"] % ctx.scale:
        ctx.add(f"{path}.crop_pad_size", f"{out['crop_pad_size']} is not a multiple of scale ({ctx.scale}); "
                f"use e.g. {max(1, out['crop_pad_size'] // ctx.scale) * ctx.scale}")


def _crop_too_small(out: dict[str, Any], crop: int, scale: int) -> str | None:
    """Why a ``crop`` x ``crop`` GT cannot go through the second-order pipeline with these settings, or None."""
    smallest = math.floor(crop * out["resize_range"][0])
    if crop <= _BLUR_REACH:
        return f"the 21x21 blur reflects {_BLUR_REACH} pixels"
    if out["second_blur_prob"] > 0 and smallest <= _BLUR_REACH:
        return (f"the first resize can shrink it to {smallest} pixels (resize_range[0] {out['resize_range'][0]}), "
                f"and the second 21x21 blur reflects {_BLUR_REACH}")
    if int(crop / scale * out["resize_range2"][0]) < 1:
        return f"the second resize can shrink it to nothing (resize_range2[0] {out['resize_range2'][0]})"
    if crop // scale <= _BLUR_REACH:
        return f"its LQ ({crop // scale} pixels) is too small for the 21x21 sinc filter ({_BLUR_REACH} reflected)"
    return None


def _check_modes(out: dict[str, Any], modes: str, weights: str, ctx: Context) -> None:
    listed, probs = out.get(modes), out.get(weights)
    if listed is MISSING or probs is MISSING:  # a bad value (an empty list, a wrong type): already reported
        return
    if listed is None:
        if probs is not None:
            ctx.add(weights, f"weighs the filters of {modes}, which is not given; add {modes}")
        return
    bad = [m for m in listed if m not in TRAINNER_RESIZE_MODES]
    if bad:
        ctx.add(modes, f"unknown resize filter(s) {bad}; choose from {list(TRAINNER_RESIZE_MODES)}")
    elif probs is not None and len(probs) != len(listed):
        ctx.add(weights, f"has {len(probs)} weights for the {len(listed)} filters of {modes}; give one per filter")
    elif probs is not None and (any(p < 0 for p in probs) or sum(probs) <= 0):
        ctx.add(weights, f"must be non-negative weights with a positive sum, got {probs}")


def realesrgan_rule(out: dict[str, Any], ctx: Context) -> None:
    """Real-ESRGAN's keys: defaults and ranges, and which datasets go with which models."""
    datasets = out.get("datasets")
    train = [(k, d) for k, d in datasets.items() if phase_of(k) == "train" and isinstance(d, dict)] \
        if isinstance(datasets, dict) else []
    model = out.get("model_type")
    if not _synthesises(model):
        for k, d in train:
            if is_synthesis_source(d.get("type")):
                ctx.add(f"datasets.{k}.type", f"{d['type']} gives GT images and blur kernels, no LQ images; train "
                        "it with model_type RealESRNetModel or RealESRGANModel (they synthesise the LQ)")
        return
    _fill(out, X4PLUS_MODEL)
    for suffix in ("", "2"):
        _check_weights(out, f"resize_prob{suffix}", "", ctx)
        _check_range(out, f"resize_range{suffix}", "", ctx, low=0, low_open=True, around_one=True)
        _check_range(out, f"noise_range{suffix}", "", ctx, low=0)
        _check_range(out, f"poisson_scale_range{suffix}", "", ctx, low=0)
        _check_range(out, f"jpeg_range{suffix}", "", ctx, low=0, low_open=True, high=100, high_open=True)
    for suffix in ("", "2", "3"):
        _check_modes(out, f"resize_mode_list{suffix}", f"resize_mode_prob{suffix}", ctx)
    radii = out.get("lq_usm_radius_range")
    if isinstance(radii, list) and len(radii) == 2 and not 1 <= radii[0] <= radii[1]:
        ctx.add("lq_usm_radius_range", f"must be [min, max] with 1 <= min <= max, got {radii}")
    if not ctx.is_train:
        return
    for k, d in train:
        if out["high_order_degradation"] is False:
            if is_synthesis_source(d.get("type")):
                ctx.add(f"datasets.{k}.type", f"high_order_degradation: false trains on the dataset's LQ/GT pairs, "
                        f"and {d['type']} has none; use RealESRGANPairedDataset (or PairedImageDataset)")
            continue
        if not is_synthesis_source(d.get("type")):
            if ctx.dialect == "neosr":
                ctx.add(f"datasets.{k}.type", f"model_type \"otf\" synthesises its LQ from GT images (a [datasets."
                        f"{k}] of type \"otf\"), got {d.get('type')}; for LQ/GT pairs set model_type = \"image\", or "
                        f"set type = \"otf\" under [datasets.{k}]")
            else:
                ctx.add(f"datasets.{k}.type", f"{model} synthesises its LQ from RealESRGANDataset (GT images and "
                        f"blur kernels), got {d.get('type')}; use type: RealESRGANDataset, or set "
                        "high_order_degradation: false to train on the dataset's own LQ/GT pairs")
            continue
        _check_synthesis_sizes(out, k, d, ctx)


def _check_synthesis_sizes(out: dict[str, Any], key: str, d: dict[str, Any], ctx: Context) -> None:
    """gt_size decided once (the dataset's, or BasicSR's top-level key; both hold it after), crop_pad_size large
    enough, queue_size a multiple of the batch."""
    top, ds = out.get("gt_size"), d.get("gt_size")
    if top is None and ds is None:
        ctx.add("gt_size", f"required by {out['model_type']}: the GT crop taken after the synthesis, a multiple of "
                "scale such as 256 (here or as datasets.train.gt_size)")
    elif top is not None and ds is not None and top != ds:
        ctx.add("gt_size", f"{top} differs from datasets.{key}.gt_size ({ds}); the crop after the synthesis is one "
                "size: set both to the same value")
    else:
        if ds is None:
            check_gt_size(top, "gt_size", ctx)  # a dataset's own gt_size was checked by the dataset rule
        out["gt_size"] = d["gt_size"] = ds if ds is not None else top
    crop = d.get("crop_pad_size")
    if good(out, "gt_size") and isinstance(crop, int) and out["gt_size"] > crop:
        ctx.add("gt_size", f"{out['gt_size']} is larger than datasets.{key}.crop_pad_size ({crop}), the size that is "
                "degraded; lower gt_size or raise crop_pad_size")
    if isinstance(crop, int) and ctx.scale is not None and all(good(out, k) for k in (
            "resize_range", "resize_range2", "second_blur_prob")):
        why = _crop_too_small(out, crop, ctx.scale)
        if why:
            ctx.add(f"datasets.{key}.crop_pad_size", f"{crop} is too small for the degradation: {why}; raise it "
                    "(BasicSR degrades 400)")
    batch = d.get("batch_size_per_gpu")
    if good(out, "queue_size") and isinstance(batch, int) and batch > 0 and out["queue_size"] % batch:
        ctx.add("queue_size", f"{out['queue_size']} is not a multiple of batch_size_per_gpu ({batch}); use e.g. "
                f"{max(1, out['queue_size'] // batch) * batch} (or 0: no pool)")

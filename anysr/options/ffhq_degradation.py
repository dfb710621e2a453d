"""The keys of ``FFHQDegradationDataset`` (GFPGAN's training set: faces degraded in the loader) and their rule.

``schema.py`` adds these fields to the dataset section and calls :func:`ffhq_degradation_dataset_rule` for a dataset
whose ``role`` is ``face_degradation_source``. It also reads the blur keys that Real-ESRGAN's dataset shares
(``blur_kernel_size``, ``kernel_list``, ``kernel_prob``, ``blur_sigma``). Defaults: for the keys GFPGAN's dataset
requires, the values of GFPGAN's ``train_gfpgan_v1.yml``; for the keys it reads with a default, that default. For
``noise_range``, ``jpeg_range`` and the four colour-jitter ranges, a key left out takes the default and null turns
the step off, as in GFPGAN.
"""

from __future__ import annotations

from typing import Any

from anysr.options.bsrgan import BSRGAN_DATASET_FIELDS
from anysr.options.common import dataset_role, good, registered
from anysr.options.fields import Context, Field, ListOf, at_least, between, greater_than, join
from anysr.options.realesrgan import REALESRGAN_DATASET_FIELDS

FACE_DEGRADATION_SOURCE = "face_degradation_source"  # the role of a dataset that degrades its faces itself
UNEVEN_FACE_SOURCE = "uneven_face_degradation_source"  # the same with RestoreFormer++'s additions

_PROB = between(0, 1)
_GFPGAN = " (GFPGAN)"


def _pair(doc: str, default_doc: str) -> Field:
    # no default: a key left out is filled by the rule, a null one is kept (it turns the step off)
    return Field((ListOf(float, length=2), None), default_doc=default_doc, doc=doc)


_RF = "FFHQUnevenDegradationDataset and FFHQAugDataset (RestoreFormer++): "
RESTOREFORMER_DATASET_FIELDS: dict[str, Field] = {
    "exposure_prob": Field((float, None), default=None, check=_PROB, default_doc="null: never",
                           doc=_RF + "chance of multiplying the GT face itself by a factor from exposure_range (not "
                               "clipped; the LQ is made from it)."),
    "exposure_range": Field((ListOf(float, length=2), None), default=None, default_doc="[0.7, 1.1] (RestoreFormer++)",
                            doc=_RF + "the exposure factor range."),
    "shift_prob": Field((float, None), default=None, check=_PROB, default_doc="null: never",
                        doc=_RF + "chance of moving the GT face (symmetric padding, then a crop) by shift_unit times "
                            "an integer in [-shift_max_num, shift_max_num] each way; the component boxes move too."),
    "shift_unit": Field((int, None), default=None, check=at_least(0), default_doc="32 (RestoreFormer++'s code; its "
                        "file: 1)", doc=_RF + "the shift's step in pixels."),
    "shift_max_num": Field((int, None), default=None, check=at_least(0), default_doc="3 (RestoreFormer++'s code; its "
                           "file: 32)", doc=_RF + "the most steps of a shift each way."),
    "uneven_prob": Field((float, None), default=None, check=_PROB, default_doc="null: never",
                         doc="FFHQUnevenDegradationDataset: chance of an uneven LQ: two independent degradations, a "
                             "square of the first (side in [out_size / 4, out_size / 2]) pasted into the second."),
    "hazy_prob": Field((float, None), default=None, check=_PROB, default_doc="null: never",
                       doc="FFHQUnevenDegradationDataset: chance of haze after the blur (lq * alpha + 1 - alpha)."),
    "hazy_alpha": Field((ListOf(float, length=2), None), default=None, default_doc="[0.75, 0.95] (RestoreFormer++)",
                        doc="FFHQUnevenDegradationDataset: the haze's alpha range, in [0, 1]."),
}
_RF_DEFAULTS: dict[str, Any] = {"exposure_range": [0.7, 1.1], "shift_unit": 32, "shift_max_num": 3,
                                "hazy_alpha": [0.75, 0.95]}
_AUGMENT_KEYS = ("exposure_prob", "exposure_range", "shift_prob", "shift_unit", "shift_max_num")

FFHQ_DEGRADATION_DATASET_FIELDS: dict[str, Field] = {
    "out_size": Field((int, None), default=None, check=at_least(1),
                      doc="FFHQDegradationDataset: the side of every face image, GT and LQ (GFPGAN: 512); required."),
    "downsample_range": Field((ListOf(float, length=2), None), default=None, default_doc="[0.8, 8] (GFPGAN v1)",
                              doc="FFHQDegradationDataset: the downsampling factor range (> 0; below 1 enlarges); "
                                  "the LQ is resized back to out_size."),
    "noise_range": _pair("FFHQDegradationDataset: Gaussian noise sigma range (0-255 scale); null: no noise.",
                         "[0, 20] (GFPGAN v1)"),
    "jpeg_range": _pair("FFHQDegradationDataset: JPEG quality range in [0, 100] (a uniform draw, rounded); "
                        "null: no JPEG.", "[60, 100] (GFPGAN v1)"),
    "color_jitter_prob": Field((float, None), default=None, check=_PROB, default_doc="null: never",
                               doc="FFHQDegradationDataset: chance of shifting each LQ channel by a value uniform in "
                                   "[-color_jitter_shift, color_jitter_shift]."),
    "color_jitter_shift": Field((float, None), default=None, check=at_least(0), default_doc="20" + _GFPGAN,
                                doc="FFHQDegradationDataset: the largest colour shift, 0-255 scale."),
    "color_jitter_pt_prob": Field((float, None), default=None, check=_PROB, default_doc="null: never",
                                  doc="FFHQDegradationDataset: chance of torchvision's colour jitter on the LQ "
                                      "(brightness, contrast, saturation, hue in a random order)."),
    "brightness": _pair("FFHQDegradationDataset: colour jitter brightness factor range; null: no brightness change.",
                        "[0.5, 1.5]" + _GFPGAN),
    "contrast": _pair("FFHQDegradationDataset: colour jitter contrast factor range; null: none.",
                      "[0.5, 1.5]" + _GFPGAN),
    "saturation": _pair("FFHQDegradationDataset: colour jitter saturation factor range; null: none.",
                        "[0, 1.5]" + _GFPGAN),
    "hue": _pair("FFHQDegradationDataset: colour jitter hue shift range, in turns within [-0.5, 0.5]; null: none.",
                 "[-0.1, 0.1]" + _GFPGAN),
    "gray_prob": Field((float, None), default=None, check=_PROB, default_doc="null: never",
                       doc="FFHQDegradationDataset: chance of a gray LQ."),
    "gt_gray": Field((bool, None), default=None, default_doc="false",
                     doc="FFHQDegradationDataset: when the LQ turns gray, the GT does too."),
    "crop_components": Field((bool, None), default=None, default_doc="false",
                             doc="FFHQDegradationDataset: give the left eye, right eye and mouth boxes of each face "
                                 "(loc_left_eye, ...) from component_path, for GFPGAN's component discriminators."),
    "component_path": Field((str, None), default=None,
                            doc="FFHQDegradationDataset: GFPGAN's landmarks file (FFHQ_eye_mouth_landmarks_512.pth: "
                                "image name without extension -> left_eye, right_eye, mouth as [x, y, half side]); "
                                "read with torch.load(weights_only=True); must exist."),
    "eye_enlarge_ratio": Field((float, None), default=None, check=greater_than(0), default_doc="1" + _GFPGAN,
                               doc="FFHQDegradationDataset: the eye boxes' half side is multiplied by it."),
    **RESTOREFORMER_DATASET_FIELDS,
}

# GFPGAN's train_gfpgan_v1.yml for the keys its dataset requires; its code's defaults for the others.
_DEFAULTS: dict[str, Any] = {
    "blur_kernel_size": 41, "kernel_list": ["iso", "aniso"], "kernel_prob": [0.5, 0.5], "blur_sigma": [0.1, 10.0],
    "downsample_range": [0.8, 8.0], "color_jitter_shift": 20.0, "gt_gray": False, "crop_components": False,
    "eye_enlarge_ratio": 1.0,
}
_NULL_MEANS_OFF: dict[str, Any] = {
    "noise_range": [0.0, 20.0], "jpeg_range": [60.0, 100.0], "brightness": [0.5, 1.5], "contrast": [0.5, 1.5],
    "saturation": [0.0, 1.5], "hue": [-0.1, 0.1],
}
_SHARED = ("blur_kernel_size", "kernel_list", "kernel_prob", "blur_sigma")
# keys of the other degradation datasets, refused when set (they would be silently ignored)
_NOT_READ = tuple(k for k in (*REALESRGAN_DATASET_FIELDS, *BSRGAN_DATASET_FIELDS) if k not in _SHARED) + (
    "dataroot_lq", "gt_size", "color")


def is_face_degradation_source(kind: Any) -> bool:
    """A dataset that makes same-size LQ faces from its GT images (FFHQDegradationDataset, and
    FFHQUnevenDegradationDataset)."""
    return dataset_role(kind) in (FACE_DEGRADATION_SOURCE, UNEVEN_FACE_SOURCE)


def is_face_augment_source(kind: Any) -> bool:
    """A dataset of augmented HQ faces without LQ (FFHQAugDataset; its role is ``image_source``)."""
    return bool(getattr(registered("dataset", kind), "augments_faces", False))


def _restoreformer_keys(out: dict[str, Any], path: str, ctx: Context, keys: tuple[str, ...]) -> None:
    """RestoreFormer++'s keys ``keys``: defaults filled, ranges checked."""
    for key in keys:
        if out.get(key) is None and key in _RF_DEFAULTS:
            out[key] = list(_RF_DEFAULTS[key]) if isinstance(_RF_DEFAULTS[key], list) else _RF_DEFAULTS[key]
    if "exposure_range" in keys:
        _range(out, "exposure_range", path, ctx, 0)
    if "hazy_alpha" in keys:
        _range(out, "hazy_alpha", path, ctx, 0, 1)


def _range(out: dict[str, Any], key: str, path: str, ctx: Context, low: float, high: float | None = None,
           low_open: bool = False) -> None:
    if not good(out, key):
        return
    lo, hi = out[key]
    if lo > hi or (lo <= low if low_open else lo < low) or (high is not None and hi > high):
        want = f"low <= high, low {'>' if low_open else '>='} {low:g}" + ("" if high is None else f", high <= {high:g}")
        ctx.add(join(path, key), f"must be a range [low, high] with {want}, got {out[key]}")


def ffhq_degradation_dataset_rule(out: dict[str, Any], path: str, ctx: Context, phase: str) -> None:
    """Cross-key checks of a face degradation source's section; GFPGAN's defaults filled."""
    kind = out["type"]
    for key, value in _DEFAULTS.items():
        if out.get(key) is None:
            out[key] = list(value) if isinstance(value, list) else value
    for key, value in _NULL_MEANS_OFF.items():
        if key not in out:
            out[key] = list(value)
    if "dataroot_gt" in out and out["dataroot_gt"] is None:
        ctx.add(f"{path}.dataroot_gt", f"required by {kind} (the face images it degrades)")
    if not good(out, "out_size"):
        ctx.add(f"{path}.out_size", f"required by {kind} (the side of every face image, e.g. 512)")
    for key in _NOT_READ:
        if good(out, key):
            ctx.add(f"{path}.{key}", f"is not read by {kind}; remove it")
    for key in ("use_rot", "lq_from_gt"):
        if out.get(key) is True:
            ctx.add(f"{path}.{key}", f"is not supported by {kind} (it degrades whole faces); remove it")
    if ctx.scale is not None and ctx.scale != 1:
        ctx.add(f"{path}.type", f"{kind} makes LQ faces of the GT's size: it needs scale 1, got {ctx.scale}")
    size = out["blur_kernel_size"]
    uneven = dataset_role(kind) == UNEVEN_FACE_SOURCE
    if uneven:
        _restoreformer_keys(out, path, ctx, tuple(RESTOREFORMER_DATASET_FIELDS))
    else:
        for key in RESTOREFORMER_DATASET_FIELDS:
            if good(out, key):
                ctx.add(f"{path}.{key}", f"is read by FFHQUnevenDegradationDataset (RestoreFormer++), not by {kind}; "
                        "remove it or use type FFHQUnevenDegradationDataset")
    if isinstance(size, list) and not uneven:
        ctx.add(f"{path}.blur_kernel_size", f"{size}: a [low, high] range of sizes 2k + 1 is "
                "FFHQUnevenDegradationDataset's (RestoreFormer's); give one odd size (GFPGAN: 41) or use that type")
    elif isinstance(size, list) and not 0 <= size[0] <= size[1]:
        ctx.add(f"{path}.blur_kernel_size", f"must be [low, high] with 0 <= low <= high (kernel sizes 2k + 1, "
                f"RestoreFormer's [19, 20]: 39 or 41) or one odd size, got {size}")
    elif isinstance(size, int) and (size < 1 or size % 2 == 0):
        ctx.add(f"{path}.blur_kernel_size", f"must be a positive odd integer, got {size}")
    kinds = list(registered("dataset", kind).kernel_types)
    bad = [k for k in out["kernel_list"] if k not in kinds]
    if bad:
        ctx.add(f"{path}.kernel_list", f"unknown kernel kind(s) {bad}; choose from {kinds}")
    elif len(out["kernel_prob"]) != len(out["kernel_list"]):
        ctx.add(f"{path}.kernel_prob", f"has {len(out['kernel_prob'])} weights for the {len(out['kernel_list'])} "
                "kinds of kernel_list; give one weight per kind")
    elif any(p < 0 for p in out["kernel_prob"]) or sum(out["kernel_prob"]) <= 0:
        ctx.add(f"{path}.kernel_prob", f"must be non-negative weights with a positive sum, got {out['kernel_prob']}")
    _range(out, "blur_sigma", path, ctx, 0, low_open=True)
    _range(out, "downsample_range", path, ctx, 0, low_open=True)
    _range(out, "noise_range", path, ctx, 0)
    _range(out, "jpeg_range", path, ctx, 0, 100)
    for key in ("brightness", "contrast", "saturation"):
        _range(out, key, path, ctx, 0)
    _range(out, "hue", path, ctx, -0.5, 0.5)
    shrink = out["downsample_range"]
    if good(out, "out_size") and good(out, "downsample_range") and int(out["out_size"] // shrink[1]) < 1:
        ctx.add(f"{path}.downsample_range", f"{out['downsample_range'][1]} shrinks the {out['out_size']}-pixel faces "
                "to nothing; lower it")
    if out["crop_components"] and not good(out, "component_path"):
        ctx.add(f"{path}.component_path", "required by crop_components: true (GFPGAN's landmarks file, "
                "FFHQ_eye_mouth_landmarks_512.pth)")


# the keys FFHQAugDataset reads beyond the common ones; every other degradation key is refused
_AUGMENT_READS = ("out_size", "gray_prob", "gt_gray", *_AUGMENT_KEYS)


def face_augment_dataset_rule(out: dict[str, Any], path: str, ctx: Context, phase: str) -> None:
    """FFHQAugDataset's section: its keys' defaults, the degradation keys it does not read refused."""
    kind = out["type"]
    if "dataroot_gt" in out and out["dataroot_gt"] is None:
        ctx.add(f"{path}.dataroot_gt", f"required by {kind} (the face images)")
    unread = [k for k in (*FFHQ_DEGRADATION_DATASET_FIELDS, *_SHARED, *_NOT_READ) if k not in _AUGMENT_READS]
    for key in unread:
        if good(out, key):
            ctx.add(f"{path}.{key}", f"is not read by {kind} (HQ faces for the dictionary stage, nothing degraded); "
                    "remove it")
    for key in ("use_rot", "lq_from_gt"):
        if out.get(key) is True:
            ctx.add(f"{path}.{key}", f"is not supported by {kind} (whole faces); remove it")
    if ctx.scale is not None and ctx.scale != 1:
        ctx.add(f"{path}.type", f"{kind} gives faces without LQ: it needs scale 1, got {ctx.scale}")
    _restoreformer_keys(out, path, ctx, _AUGMENT_KEYS)

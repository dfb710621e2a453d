"""The keys of ``BSRGANDataset`` (BSRGAN's degradation models, KAIR's ``dataset_blindsr`` keys) and their rule.

``schema.py`` adds these fields to the dataset section and calls :func:`bsrgan_dataset_rule` for a dataset whose
``role`` is ``degradation_source`` (HR images degraded in the loader by a pipeline of ``DEGRADATION_REGISTRY``).
"""

from __future__ import annotations

from typing import Any

from anysr.options.common import dataset_role, good, known_names
from anysr.options.fields import Context, Field, at_least, between

DEGRADATION_SOURCE = "degradation_source"  # the role of a dataset that degrades its GT images itself

BSRGAN_DATASET_FIELDS: dict[str, Field] = {
    "degradation_type": Field((str, None), default=None, default_doc="bsrgan (BSRGANDataset)",
                              doc="BSRGANDataset: the degradation model (DEGRADATION_REGISTRY): bsrgan or "
                                  "bsrgan_plus (KAIR's names)."),
    "degrade_size": Field((int, None), default=None, check=at_least(1), default_doc="gt_size",
                          doc="BSRGANDataset: the HR square (KAIR's H_size, accepted as an alias) that is degraded "
                              "before the gt_size pair is cropped from it; a multiple of scale, >= gt_size."),
    "shuffle_prob": Field((float, None), default=None, check=between(0, 1), default_doc="0.1 (KAIR)",
                          doc="BSRGANDataset, bsrgan_plus: chance of shuffling all 13 steps (else only the "
                              "noises within each half)."),
    "use_sharp": Field((bool, None), default=None, default_doc="false (KAIR)",
                       doc="BSRGANDataset, bsrgan_plus: USM-sharpen the HR first (the GT is the sharpened one)."),
    "degrade_in": Field((str, None), default=None, choices=("auto", "loader", "step"), default_doc="auto",
                        doc="BSRGANDataset: where the degradation runs: loader (the DataLoader workers, what auto "
                            "picks) or step (the training process, sample by sample on the accelerator's device; "
                            "not on XLA, where every recipe's sizes would compile a new graph)."),
}
_DEFAULTS = {"degradation_type": "bsrgan", "shuffle_prob": 0.1, "use_sharp": False, "degrade_in": "auto"}


def is_degradation_source(kind: Any) -> bool:
    """A dataset that makes its LQ from its GT with a registered degradation model (BSRGANDataset)."""
    return dataset_role(kind) == DEGRADATION_SOURCE


def bsrgan_dataset_rule(out: dict[str, Any], path: str, ctx: Context, phase: str) -> None:
    """Cross-key checks of a degradation source's section; KAIR's defaults filled."""
    kind = out["type"]
    for key, value in _DEFAULTS.items():
        if out.get(key) is None:
            out[key] = value
    names = [n for n in known_names("degradation") if n != "realbasicvsr"]  # realbasicvsr degrades clips
    if out["degradation_type"] not in names:
        ctx.add(f"{path}.degradation_type", f"unknown degradation '{out['degradation_type']}'; choose from "
                f"{', '.join(names)}")
    if phase != "train":
        ctx.add(f"{path}.type", f"{kind} is a training set (random degradations of GT patches); validate with "
                "PairedImageDataset (dataroot_lq, or lq_from_gt: true), e.g. on pairs written by anysr prepare "
                "degrade")
    if "dataroot_gt" in out and out["dataroot_gt"] is None:
        ctx.add(f"{path}.dataroot_gt", f"required by {kind} (the HR images it degrades)")
    if good(out, "dataroot_lq"):
        ctx.add(f"{path}.dataroot_lq", f"{kind} makes the LQ from the GT; remove dataroot_lq")
    for key in ("mean", "std", "color"):
        if good(out, key):
            ctx.add(f"{path}.{key}", f"is not supported by {kind} (its degradations work on RGB); remove it")
    if not good(out, "gt_size"):
        ctx.add(f"{path}.gt_size", f"required by {kind} (the GT patch; the LQ patch is gt_size / scale)")
        return
    size = out.get("degrade_size")
    if size is None:
        out["degrade_size"] = size = out["gt_size"]
    scale = ctx.scale or 1
    if isinstance(size, int) and (size < out["gt_size"] or size % scale):
        ctx.add(f"{path}.degrade_size", f"{size} must be a multiple of scale ({scale}) and at least gt_size "
                f"({out['gt_size']})")
    elif out["degradation_type"] == "bsrgan_plus" and isinstance(size, int) and size < 4 * scale * scale:
        ctx.add(f"{path}.degrade_size", f"bsrgan_plus shrinks the image up to {4 * scale * scale}x before its "
                f"final resize; degrade at least {4 * scale * scale} pixels (raise gt_size or degrade_size)")

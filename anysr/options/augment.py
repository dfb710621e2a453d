"""The batch-augmentation options under ``train:`` (traiNNer-redux's mixture of augmentations keys, as they are) and
their rule. ``schema.py`` adds these fields to ``TRAIN`` and calls the rule."""

from __future__ import annotations

import math
from typing import Any

from anysr.options.fields import Context, Field, ListOf

# The names the operators know (anysr.ops.augment.AUGMENTS; a test keeps the two equal: options import no torch).
AUGMENT_NAMES = ("none", "mixup", "cutmix", "resizemix", "cutblur", "rgb")
_REFUSED = {
    "downup": "traiNNer-redux's downup resizes the LQ by a random factor; its random intermediate size would compile "
              "a new graph per draw on XLA: it is not available, remove it",
    "up": "traiNNer-redux's up crops and re-enlarges both images by a random factor: not available, remove it",
}
DEFAULT_AUGS = ["none", "mixup", "cutmix", "resizemix", "cutblur"]
DEFAULT_PROBS = [0.4, 0.084, 0.084, 0.084, 0.348]


def _names(value: list[str]) -> str | None:
    for name in value:
        if name in _REFUSED:
            return f"holds {name!r}: {_REFUSED[name]}"
        if name not in AUGMENT_NAMES:
            return f"holds {name!r}; each must be one of {', '.join(AUGMENT_NAMES)}"
    return None


def _weights(value: list[float]) -> str | None:
    if any(not math.isfinite(p) or p < 0 for p in value):
        return "must hold finite weights >= 0"
    return None if sum(value) > 0 else "must hold at least one weight > 0"


AUGMENT_TRAIN_FIELDS: dict[str, Field] = {
    "use_moa": Field(bool, default=False,
                     doc="Batch augmentations (traiNNer-redux's mixture of augmentations): each training "
                         "micro-batch gets one of moa_augs, drawn with the weights moa_probs, applied to LQ and GT "
                         "on the device inside the step (fixed shapes: one XLA graph; drawn from seed, iteration "
                         "and sample index: exact resume). Image models only (not video)."),
    "moa_augs": Field(ListOf(str, min_len=1), default=DEFAULT_AUGS, check=_names,
                      expect=f"a list of {' | '.join(AUGMENT_NAMES)}",
                      doc="The augmentations to draw from, one per micro-batch: none, mixup (blend with another "
                          "sample), cutmix (paste a box of another sample), resizemix (paste another sample "
                          "shrunk into a box), cutblur (inside a box the LQ becomes the GT downscaled), rgb "
                          "(permute the colour channels). mixup/cutmix/resizemix pair the samples of a batch: "
                          "batch_size_per_gpu must be >= 2 (even, for ranks to match one process)."),
    "moa_probs": Field(ListOf(float, min_len=1), default=DEFAULT_PROBS, check=_weights,
                       doc="The weight of each entry of moa_augs (same length; normalised, so they need not add "
                           "up to 1)."),
    "moa_debug": Field(bool, keep=False,
                       doc="Accepted (traiNNer-redux: saves the images before and after) and ignored."),
    "moa_debug_limit": Field(int, keep=False, doc="Accepted (traiNNer-redux) and ignored."),
}


def augment_rule(out: dict[str, Any], path: str, ctx: Context) -> None:
    """``moa_augs`` and ``moa_probs`` pair up one to one."""
    augs, probs = out.get("moa_augs"), out.get("moa_probs")
    if isinstance(augs, list) and isinstance(probs, list) and len(augs) != len(probs):
        ctx.add(f"{path}.moa_probs", f"has {len(probs)} weights for the {len(augs)} entries of {path}.moa_augs; "
                "give one weight per augmentation")

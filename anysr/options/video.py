"""The video options (BasicSR's keys for REDS / Vimeo-90K / video test datasets, EDVR and recurrent training,
clip validation) and their rules. ``schema.py`` adds these fields to its sections and calls the rules.

Which rules apply to a dataset is read from its registered class (``video_kind``), never from a list of names.
"""

from __future__ import annotations

from typing import Any

from anysr.options.fields import MISSING, Context, Field, ListOf, at_least, greater_than
from anysr.registry import Registry

FRAME_PADDINGS = ("replicate", "reflection", "reflection_circle", "circle")
VAL_PARTITIONS = ("REDS4", "official")
DEGRADATIONS = ("BI", "BD")


def _frames(value: int) -> str | None:
    return None if value == -1 or value >= 1 else "must be >= 1 (or -1: not used)"


VIDEO_DATASET_FIELDS: dict[str, Field] = {
    "num_frame": Field((int, None), default=None, check=_frames, expect="int >= 1 | -1 | null",
                       doc="Video datasets: frames per sample. REDSDataset, Vimeo90KDataset, VideoTestDataset: "
                           "the odd window around the centre frame (EDVR's num_frame); REDSRecurrentDataset: "
                           "the clip length; -1 / null where it is not used (recurrent test sets, Vimeo90K "
                           "recurrent: always 7)."),
    "interval_list": Field(ListOf(int, min_len=1), default=[1],
                           doc="REDS: temporal strides to draw from (temporal augmentation)."),
    "random_reverse": Field(bool, default=False, doc="Video training: reverse the frame order half of the time."),
    "val_partition": Field(str, default="REDS4", choices=VAL_PARTITIONS,
                           doc="REDS: the clips kept out of training (REDS4: 000, 011, 015, 020; official: "
                               "240-269)."),
    "test_mode": Field(bool, default=False,
                       doc="REDSRecurrentDataset: draw from the val_partition clips instead of the others."),
    "dataroot_flow": Field((str, None), default=None,
                           doc="Accepted (BasicSR's REDSDataset); precomputed flows are not read: must be null."),
    "flip_sequence": Field(bool, default=False,
                           doc="Vimeo90KRecurrentDataset: append the reversed clip (7 -> 14 frames)."),
    "cache_data": Field(bool, default=False, doc="Video test datasets: keep decoded frames in memory."),
    "padding": Field(str, default="reflection_circle", choices=FRAME_PADDINGS,
                     doc="VideoTestDataset: how windows reach past a clip's ends (BasicSR's frame padding)."),
    "degradation": Field(str, default="BI", choices=DEGRADATIONS,
                         doc="Video datasets with lq_from_gt: how LQ frames are made from GT frames. BI: MATLAB "
                             "bicubic; BD: 13x13 Gaussian blur (sigma 0.4 * scale) then every scale-th pixel "
                             "(BasicSR's duf_downsample)."),
}

VIDEO_TRAIN_FIELDS: dict[str, Field] = {
    "tsa_iter": Field((int, None), default=None, check=at_least(0),
                      doc="EDVRModel: train only the TSA fusion module before this iteration (null/0: off)."),
    "dcn_lr_mul": Field(float, default=1.0, check=at_least(0),
                        doc="EDVRModel: learning-rate factor of the deformable convolutions' parameters."),
    "fix_flow": Field((int, None), default=None, check=at_least(0),
                      doc="Video recurrent models: keep the flow network (SPyNet) and IconVSR's EDVR branch "
                          "frozen before this iteration (null/0: off)."),
    "flow_lr_mul": Field(float, default=1.0, check=at_least(0),
                         doc="VideoRecurrentModel: learning-rate factor of the flow network's parameters."),
    "lr_flow": Field((float, None), default=None, check=at_least(0),
                     doc="VideoRecurrentGANModel: learning rate of the flow network when fix_flow is set "
                         "(BasicSR's key)."),
}

VIDEO_VAL_FIELDS: dict[str, Field] = {
    "flip_seq": Field(bool, default=False,
                      doc="Video: also run the reversed clip and average both outputs (BasicSR's test-time "
                          "augmentation for recurrent networks)."),
    "center_frame_only": Field(bool, default=False,
                               doc="Video: score only the centre frame of each clip (Vimeo-90K's protocol)."),
    "chunk": Field((int, None), default=None, check=greater_than(0),
                   doc="Video recurrent networks: frames whose outputs one pass keeps; long clips run in "
                       "chunks of chunk + 2 * chunk_pad frames (bounded memory, one shape on XLA). null: "
                       "the whole clip at once."),
    "chunk_pad": Field(int, default=2, check=at_least(0),
                       doc="Video: frames of context on each side of a chunk (their outputs are discarded)."),
}


def _given(out: dict[str, Any], key: str) -> bool:
    return out.get(key, None) not in (None, MISSING)


def video_dataset_rule(out: dict[str, Any], path: str, ctx: Context, phase: str, datasets: Registry) -> None:
    """Cross-key checks of one dataset section whose type is a video dataset (no-op for image datasets).

    ``datasets``: the filled dataset registry (a video dataset class says its ``video_kind``)."""
    kind_name = out.get("type")
    cls = datasets.get(kind_name) if isinstance(kind_name, str) and kind_name in datasets else None
    kind = getattr(cls, "video_kind", None)
    if kind is None:
        return
    name = out["type"]
    if _given(out, "dataroot_flow"):
        ctx.add(f"{path}.dataroot_flow", "precomputed optical flows are not read by anysr; set it to ~ (EDVR "
                "aligns frames itself)")
    if "dataroot_gt" in out and out["dataroot_gt"] is None:
        ctx.add(f"{path}.dataroot_gt", f"required by {name} (the folder of ground-truth clips)")
    for key in ("dataroot_gt", "dataroot_lq"):
        if isinstance(out.get(key), list):
            ctx.add(f"{path}.{key}", f"{name} reads one folder of clips; give one path (several folders: link "
                    "their clips into one)")
    lq_from_gt = out.get("lq_from_gt") is True
    if "dataroot_lq" in out and out["dataroot_lq"] is None and not lq_from_gt:
        ctx.add(f"{path}.dataroot_lq", f"{name} needs dataroot_lq (the folder of LQ clips) or lq_from_gt: true "
                "(LQ frames made from the GT frames, see degradation)")
    if out.get("degradation") == "BD" and not lq_from_gt:
        ctx.add(f"{path}.degradation", "BD is applied when the LQ frames are made from the GT frames; set "
                "lq_from_gt: true, or remove it (dataroot_lq frames are read as they are)")
    if kind in ("window", "recurrent") and phase == "train" and "gt_size" in out and out["gt_size"] is None:
        ctx.add(f"{path}.gt_size", f"required by {name} (the GT patch size, a multiple of scale, e.g. 256)")
    frames = out.get("num_frame")
    if getattr(cls, "needs_num_frame", False):
        if frames in (None, -1):
            what = "the clip length, e.g. 15" if kind == "recurrent" else "an odd window, e.g. 5"
            ctx.add(f"{path}.num_frame", f"required by {name} ({what})")
        elif isinstance(frames, int) and getattr(cls, "odd_num_frame", False) and frames % 2 == 0:
            ctx.add(f"{path}.num_frame", f"{name} centres its window on the GT frame, so num_frame must be odd, "
                    f"got {frames}")
    intervals = out.get("interval_list")
    if isinstance(intervals, list) and any(i < 1 for i in intervals):
        ctx.add(f"{path}.interval_list", f"every interval must be >= 1, got {intervals}")


def network_weight_paths(out: dict[str, Any], path: str, ctx: Context, existing: Any, models: Registry) -> None:
    """``network_g.spynet_path`` / ``edvr_path`` (what registered models declare as ``weight_path_args``): resolved
    from path.root and checked to exist (the model hands them to the engine, which loads them into the sub-network;
    architectures never read files). ``models``: the filled model registry."""
    keys: list[str] = []
    for name in models.keys():
        keys += [k for k in getattr(models.get(name), "weight_path_args", ()) if k not in keys]
    for key in keys:
        existing(out, key, path, ctx, kind="file")

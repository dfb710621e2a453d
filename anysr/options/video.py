"""The video options (BasicSR's keys for REDS / Vimeo-90K / video test datasets, EDVR and recurrent training,
clip validation) and their rules. ``schema.py`` adds these fields to its sections and calls the rules.

Which rules apply to a dataset is read from its registered class (``video_kind``), never from a list of names.
"""

from __future__ import annotations

from typing import Any

from anysr.options.fields import MISSING, Context, Field, ListOf, Section, at_least, between, greater_than
from anysr.registry import Registry

FRAME_PADDINGS = ("replicate", "reflection", "reflection_circle", "circle")
VAL_PARTITIONS = ("REDS4", "official")
DEGRADATIONS = ("BI", "BD", "realbasicvsr")
# anysr.data.degradation.realbasicvsr.STAGES plus gt_usm (the options import no data module; a test keeps them equal)
RBVSR_KEYS = ("unsharp", "blur", "resize", "noise", "jpeg", "video", "blur2", "resize2", "noise2", "jpeg2", "video2",
              "final_resize", "final_blur", "gt_usm")
# anysr.data.degradation.video_codec.CODECS (the options import no data module; a test keeps the two equal)
VIDEO_CODECS = ("libx264", "h264", "mpeg4", "libx265")

VIDEO_COMPRESSION = Section(
    {
        "codec": Field(ListOf(str, min_len=1), default=["libx264", "h264", "mpeg4"],
                       doc="Video compression: the encoders drawn from (FFmpeg names; h264: FFmpeg's default "
                           "H.264 encoder, libx264 in PyAV's wheels). The PyAV build must have them."),
        "codec_prob": Field((ListOf(float, min_len=1), None), default=None,
                            doc="Video compression: the codecs' weights, one per codec (null: equal)."),
        "bitrate": Field((ListOf(float, length=2), None), default=None,
                         doc="Video compression: [low, high] bits per second (1 frame per second), a uniform "
                             "integer per clip (null, and no crf: RealBasicVSR's [1e4, 1e5])."),
        "crf": Field((ListOf(int, length=2), None), default=None,
                     doc="Video compression: [low, high] constant rate factor (0-51), a uniform integer per clip, "
                         "instead of a bitrate (H.264 and H.265 only)."),
        "prob": Field(float, default=1.0, check=between(0, 1),
                      doc="Video compression: the chance that a clip is compressed."),
    },
    doc="RealBasicVSR's RandomVideoCompression of the LQ clip (PyAV).",
)


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
                             "(BasicSR's duf_downsample); realbasicvsr: RealBasicVSR's degradation of the cropped "
                             "GT clip (recurrent training datasets; blur, resize, noise, JPEG and video codec in two "
                             "orders, a shuffled final resize; needs PyAV), see degradation_params."),
    "degradation_params": Field((dict, None), default=None,
                                doc="degradation realbasicvsr: overrides of its stages, {stage: {param: value}} with "
                                    "mmagic's parameter names (stages unsharp, blur, resize, noise, jpeg, video, "
                                    "blur2, resize2, noise2, jpeg2, video2, final_resize, final_blur; e.g. "
                                    "{noise: {gaussian_sigma: [1, 20]}}), and gt_usm (default true: train towards "
                                    "the unsharp-masked GT, as RealBasicVSR). null: RealBasicVSR's values."),
    "video_compression": Field((VIDEO_COMPRESSION, None), default=None,
                               doc="Video training datasets: compress every LQ clip (after cropping) with a codec "
                                   "drawn per clip, RealBasicVSR's RandomVideoCompression (needs PyAV: pip install "
                                   "'anysr[video]'). null: off."),
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
        if cls is not None and _given(out, "video_compression"):
            ctx.add(f"{path}.video_compression", f"{kind_name} is not a video dataset; video_compression compresses "
                    "the clips of REDS / Vimeo-90K training datasets: remove it")
        if cls is not None and (_given(out, "degradation_params") or out.get("degradation") == "realbasicvsr"):
            ctx.add(f"{path}.degradation", f"{kind_name} is not a video dataset; realbasicvsr degrades the clips of "
                    "REDS / Vimeo-90K recurrent training datasets: remove it (and degradation_params)")
        return
    name = out["type"]
    if _given(out, "dataroot_flow"):
        ctx.add(f"{path}.dataroot_flow", "precomputed optical flows are not read by anysr; set it to ~ (EDVR "
                "aligns frames itself)")
    if "dataroot_gt" in out and out["dataroot_gt"] is None:
        ctx.add(f"{path}.dataroot_gt", f"required by {name} (the folder of ground-truth clips)")
    for key in ("dataroot_gt", "dataroot_lq"):
        if isinstance(out.get(key), list) and not getattr(cls, "reads_folder_lists", False):
            ctx.add(f"{path}.{key}", f"{name} reads one folder of clips; give one path (several folders: link "
                    "their clips into one)")
    lq_from_gt = out.get("lq_from_gt") is True
    if "dataroot_lq" in out and out["dataroot_lq"] is None and not lq_from_gt:
        ctx.add(f"{path}.dataroot_lq", f"{name} needs dataroot_lq (the folder of LQ clips) or lq_from_gt: true "
                "(LQ frames made from the GT frames, see degradation)")
    if out.get("degradation") == "realbasicvsr" or _given(out, "degradation_params"):
        _realbasicvsr_rule(out, path, ctx, kind, phase, lq_from_gt)
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
    compression = out.get("video_compression")
    if isinstance(compression, dict):
        _video_compression_rule(compression, out, f"{path}.video_compression", ctx, kind, phase)


def _realbasicvsr_rule(out: dict[str, Any], path: str, ctx: Context, kind: str, phase: str, lq_from_gt: bool) -> None:
    """degradation: realbasicvsr against the dataset; its stage parameters are checked when the dataset is built."""
    params = out.get("degradation_params")
    if out.get("degradation") != "realbasicvsr":
        ctx.add(f"{path}.degradation_params", "configures degradation: realbasicvsr; set it, or remove "
                "degradation_params")
        return
    if kind != "recurrent" or phase != "train":
        ctx.add(f"{path}.degradation", f"realbasicvsr degrades the GT clips of recurrent training datasets "
                f"(REDSRecurrentDataset, Vimeo90KRecurrentDataset); {out.get('type')} ({phase}) takes BI or BD")
    if not lq_from_gt:
        ctx.add(f"{path}.lq_from_gt", "realbasicvsr makes the LQ clip from the GT clip; set lq_from_gt: true")
    if _given(out, "video_compression"):
        ctx.add(f"{path}.video_compression", "realbasicvsr compresses the clip itself (its video and video2 stages); "
                "remove video_compression (set degradation_params.video instead)")
    if isinstance(params, dict):
        unknown = [k for k in params if k not in RBVSR_KEYS]
        if unknown:
            ctx.add(f"{path}.degradation_params", f"unknown stage(s) {', '.join(map(repr, unknown))}; choose from "
                    f"{', '.join(RBVSR_KEYS)}")
    gt_size, scale = out.get("gt_size"), out.get("scale", ctx.scale)
    if isinstance(gt_size, int) and isinstance(scale, int) and scale > 0 and (gt_size % 2 or (gt_size // scale) % 2):
        ctx.add(f"{path}.gt_size", f"yuv420p video needs even frame sizes; realbasicvsr compresses frames of the "
                f"GT crop ({gt_size}) and LQ ({gt_size // scale}) sizes: use a gt_size with both even")


def _video_compression_rule(comp: dict[str, Any], out: dict[str, Any], path: str, ctx: Context, kind: str,
                            phase: str) -> None:
    """The video_compression keys against each other and against the dataset (a training clip dataset, LQ crops of
    even size). Whether the PyAV build has the codecs is checked when the dataset is built."""
    if kind not in ("window", "recurrent") or phase != "train":
        ctx.add(path, f"compresses training clips; {out.get('type')} ({phase}) draws none: remove it (give a "
                "test set its compressed LQ frames in dataroot_lq)")
    codecs, probs = comp.get("codec"), comp.get("codec_prob")
    unknown = [c for c in codecs if c not in VIDEO_CODECS] if isinstance(codecs, list) else []
    if unknown:
        ctx.add(f"{path}.codec", f"unknown codec(s) {', '.join(map(repr, unknown))}; choose from "
                f"{', '.join(VIDEO_CODECS)}")
    if isinstance(codecs, list) and isinstance(probs, list):
        if len(probs) != len(codecs):
            ctx.add(f"{path}.codec_prob", f"{len(probs)} weight(s) for {len(codecs)} codec(s); give one per codec")
        elif any(p < 0 for p in probs) or sum(probs) <= 0:
            ctx.add(f"{path}.codec_prob", f"weights must be >= 0 with a positive sum, got {probs}")
    bitrate, crf = comp.get("bitrate"), comp.get("crf")
    if isinstance(bitrate, list) and isinstance(crf, list):
        ctx.add(path, "give bitrate or crf, not both")
    if isinstance(bitrate, list) and not 1 <= bitrate[0] <= bitrate[1]:
        ctx.add(f"{path}.bitrate", f"must be [low, high] bits per second with 1 <= low <= high, got {bitrate}")
    if isinstance(crf, list):
        if not 0 <= crf[0] <= crf[1] <= 51:
            ctx.add(f"{path}.crf", f"must be [low, high] with 0 <= low <= high <= 51, got {crf}")
        if isinstance(codecs, list) and "mpeg4" in codecs:
            ctx.add(f"{path}.crf", "mpeg4 has no CRF mode; use bitrate, or drop mpeg4 from codec")
    gt_size, scale = out.get("gt_size"), out.get("scale", ctx.scale)
    if isinstance(gt_size, int) and isinstance(scale, int) and scale > 0 and (gt_size // scale) % 2:
        ctx.add(f"{path}", f"yuv420p video needs even frame sizes, but gt_size {gt_size} / scale {scale} = "
                f"{gt_size // scale} is odd; use a gt_size whose LQ size is even")


def network_weight_paths(out: dict[str, Any], path: str, ctx: Context, existing: Any, models: Registry) -> None:
    """``network_g.spynet_path`` / ``edvr_path`` (what registered models declare as ``weight_path_args``): resolved
    from path.root and checked to exist (the model hands them to the engine, which loads them into the sub-network;
    architectures never read files). ``models``: the filled model registry."""
    keys: list[str] = []
    for name in models.keys():
        keys += [k for k in getattr(models.get(name), "weight_path_args", ()) if k not in keys]
    for key in keys:
        existing(out, key, path, ctx, kind="file")

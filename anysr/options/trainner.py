"""traiNNer-redux's option keys (its BasicSR-layout dialect), accepted as they are.

Each key is a documented Field of the section it lives in (``schema.py`` adds them): the ones anysr implements
(``train.ema_power``, ...) are kept; the others are validated and dropped (``keep=False``), because
``map_trainner`` has already written what they mean into anysr's own keys before the sections are validated
(``use_amp`` -> ``train.precision``, ``datasets.train.lq_size`` -> ``gt_size``, ``val.val_enabled: false`` -> no
validation, ...). ``map_trainner`` returns one note per mapped key; the loader keeps them in ``mapped_keys`` and
the trainer logs them in one line. Keys anysr cannot honour are refused, each with its reason.
A file is read as a traiNNer-redux file when it holds one of the keys only that dialect writes (``TRAINNER_MARKERS``);
only then do traiNNer-redux's own defaults apply where they differ from BasicSR's (flips on, EMA schedule, param key).
"""

from __future__ import annotations

from typing import Any

from anysr.options.common import phase_of, registered
from anysr.options.fields import Check, Context, Field, Section, at_least, between, greater_than
from anysr.registry import constructor_args

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
# Keys only traiNNer-redux writes: top level, then (section, key).
TRAINNER_MARKERS = ("use_amp", "amp_bf16", "use_channels_last", "use_compile", "fast_matmul", "compile_mode", "onnx")
_SECTION_MARKERS = (("val", "val_enabled"), ("logger", "save_checkpoint_format"))
_DATASET_MARKERS = ("lq_size", "accum_iter")
# traiNNer-redux's perceptual loss names (any case) -> anysr's class computing it; BasicSR's PerceptualLoss keys in
# the entry keep BasicSR's class.
TRAINNER_PERCEPTUAL = ("perceptualloss", "perceptualfp16loss")
TRAINNER_PERCEPTUAL_CLASS = "TraiNNerPerceptualLoss"
_BASICSR_PERCEPTUAL_KEYS = ("perceptual_weight", "style_weight", "vgg_type", "use_input_norm", "range_norm")
EMA_POWER_DEFAULT = 10.0  # traiNNer-redux's (ema-pytorch's schedule with it reaches the decay within a few steps)
GRAD_CLIP_NORM_DEFAULT = 100.0  # traiNNer-redux's grad_clip_max_norm
# traiNNer-redux's defaults of its on-the-fly degradation keys (ReduxOptions, DatasetOptions), filled into a
# traiNNer-redux file with high_order_degradation: true where a key is not given (anysr's are Real-ESRGAN x4plus's).
OTF_DEFAULTS: dict[str, Any] = {
    "lq_usm": False, "lq_usm_radius_range": [1, 25], "blur_prob": 0.0, "thicklines_prob": 0.0,
    "resize_prob": [0.2, 0.7, 0.1], "resize_range": [0.4, 1.5], "gaussian_noise_prob": 0.0, "noise_range": [0.0, 0.0],
    "poisson_scale_range": [0.0, 0.0], "gray_noise_prob": 0.0, "jpeg_prob": 1.0, "jpeg_range": [75.0, 95.0],
    "second_blur_prob": 0.0, "resize_prob2": [0.3, 0.4, 0.3], "resize_range2": [0.6, 1.2],
    "gaussian_noise_prob2": 0.0, "noise_range2": [0.0, 0.0], "poisson_scale_range2": [0.0, 0.0],
    "gray_noise_prob2": 0.0, "jpeg_prob2": 1.0, "jpeg_range2": [75.0, 95.0], "queue_size": 120,
    # traiNNer-redux trains towards the plain GT (it has no *_gt_usm keys)
    "gt_usm": False, "l1_gt_usm": False, "percep_gt_usm": False, "gan_gt_usm": False,
    **{f"resize_mode_list{s}": ["bilinear", "bicubic", "nearest-exact", "lanczos"] for s in ("", "2", "3")},
}
OTF_DATASET_DEFAULTS: dict[str, Any] = {
    "kernel_range": [5, 17], "sinc_prob": 0.0, "blur_sigma": [0.2, 2.0], "betag_range": [0.5, 4.0],
    "betap_range": [1.0, 2.0], "kernel_range2": [5, 17], "sinc_prob2": 0.0, "blur_sigma2": [0.2, 1.0],
    "betag_range2": [0.5, 4.0], "betap_range2": [1.0, 2.0], "final_sinc_prob": 0.0, "final_kernel_range": [5, 17],
}
OTF_CROP_MARGIN = 32  # traiNNer-redux's RealESRGANDataset degrades a gt_size + 32 square


def _false_only(reason: str) -> Check:
    return Check(lambda v: v is False, f"false ({reason})")


def _null_only(reason: str) -> Check:
    return Check(lambda v: v is None, f"null ({reason})")


def _eco(value: dict[str, Any]) -> str | None:
    if value.get("enabled", False) is not False:
        return "must not enable ECO: traiNNer-redux's teacher-guided ECO training is not available in anysr; " \
               "remove train.eco"
    return None


def _onnx_shape(value: Any) -> str | None:
    parts = str(value).lower().split("x")
    if len(parts) not in (4, 5) or not all(p.isdigit() or p.isalpha() for p in parts):
        return "NxCxHxW (numbers fixed, letters dynamic), e.g. 1x3xHxW"
    return None


ONNX_SECTION = Section({
    "dtype": Field(str, default="fp32", choices=("fp32", "fp16", "bf16"),
                   doc="fp32 or fp16 ONNX; bf16 (traiNNer-redux's TensorRT mixed-precision graph) is written as "
                       "fp32 with a note: TensorRT builds bf16 engines from it (--bf16)."),
    "opset": Field(int, default=17, check=at_least(13), doc="ONNX opset."),
    "shape": Field(str, default="1x3xHxW", check=_onnx_shape,
                   doc="Input shape NxCxHxW: letters for H and W make height / width dynamic (batch too, in "
                       "anysr's export); numbers a fixed size (square: H = W)."),
    "verify": Field(bool, default=True, doc="Compare the ONNX model with PyTorch in onnxruntime."),
    "dynamo": Field(bool, default=False, doc="Accepted (traiNNer-redux) and ignored: anysr's exporter is fixed."),
    "optimize": Field(bool, default=False, doc="Accepted (traiNNer-redux: OnnxSlim) and ignored (noted)."),
    "bf16_exclude_depthwise": Field(bool, default=True, doc="Accepted (traiNNer-redux, with dtype bf16)."),
    "wrap_5d_to_4d": Field(bool, default=True, doc="Accepted (traiNNer-redux's video networks) and ignored."),
}, doc="traiNNer-redux's ONNX export settings (`anysr export -opt FILE`).")


TRAINNER_TOP_FIELDS: dict[str, Field] = {
    "use_amp": Field(bool, keep=False,
                     doc="traiNNer-redux: true -> train.precision auto (bf16 where the device runs it natively, "
                         "else fp32; fp16 only when train.precision asks for it); false -> train.precision fp32."),
    "amp_bf16": Field(bool, keep=False,
                      doc="traiNNer-redux: with use_amp, asks for bf16: that is what train.precision auto picks "
                          "where bf16 is native (and fp32 where it is not); alone, ignored as in traiNNer-redux."),
    "use_channels_last": Field(bool, keep=False,
                               doc="traiNNer-redux: true -> train.channels_last auto (anysr decides per device); "
                                   "false -> train.channels_last false."),
    "use_compile": Field(bool, keep=False, doc="traiNNer-redux: train.compile."),
    "compile_mode": Field(str, keep=False, choices=COMPILE_MODES,
                          doc="Accepted (traiNNer-redux) and ignored: anysr compiles with torch.compile's default "
                              "mode."),
    "fast_matmul": Field(bool, keep=False,
                         doc="Accepted (traiNNer-redux: TF32 matmuls) and ignored: anysr decides the precision "
                             "(train.precision)."),
    "detect_anomaly": Field(bool, keep=False,
                            doc="Accepted (traiNNer-redux: torch's autograd anomaly detection, a debugging aid) and "
                                "ignored."),
    "deterministic": Field(bool, keep=False,
                           doc="Accepted (traiNNer-redux: torch.use_deterministic_algorithms) and ignored: anysr's "
                               "runs are reproducible where the device's kernels are (CPU, XLA; exact resume)."),
    "input_pixel_format": Field(str, keep=False, choices=("rgb",),
                                doc="Accepted (traiNNer-redux) when rgb: anysr's networks take RGB."),
    "output_pixel_format": Field(str, keep=False, choices=("rgb",),
                                 doc="Accepted (traiNNer-redux) when rgb: anysr's networks give RGB."),
    "auto_resume": Field((bool, None), keep=False,
                         doc="Accepted (traiNNer-redux) and ignored; the command line's --auto_resume decides."),
    "onnx": Field((ONNX_SECTION, None),
                  doc="traiNNer-redux's ONNX export settings, read by `anysr export -opt FILE` (the weights: "
                      "path.pretrain_network_g; the file: onnx/<name>_<shape>_<dtype>_op<opset>.onnx)."),
    "blur_prob2": Field(float, keep=False, check=between(0, 1),
                        doc="traiNNer-redux: second_blur_prob (the chance of the second blur)."),
}

TRAINNER_TRAIN_FIELDS: dict[str, Field] = {
    "ema_power": Field((float, None), default=None, check=greater_than(0),
                       doc="EMA warm-up as traiNNer-redux (ema-pytorch) does it: after n updates past "
                           "ema_update_after_step the decay is min(ema_decay, 1 - (1 + n)^-ema_power) (0.75: about "
                           "10k iterations to 0.999). null: anysr's warm-up, min(ema_decay, (1 + n) / (10 + n)); "
                           "a traiNNer-redux file with EMA and without it gets traiNNer-redux's default, 10."),
    "ema_update_after_step": Field(int, default=0, check=at_least(0),
                                   doc="The EMA copies the weights (no averaging) for this many first updates "
                                       "(traiNNer-redux); the ema_power warm-up starts after them."),
    "ema_switch_iter": Field(int, default=0, check=at_least(0),
                             doc="Every this many EMA updates, the trained network takes the EMA weights "
                                 "(traiNNer-redux; 0: never). Not with schedule-free optimizers."),
    "grad_clip": Field(bool, keep=False,
                       doc="traiNNer-redux: true -> train.grad_clip_norm = grad_clip_max_norm; false: no clipping."),
    "grad_clip_max_norm": Field(float, keep=False, check=greater_than(0),
                                doc="traiNNer-redux: the norm grad_clip clips to (its default: 100)."),
    "adaptive_d": Field(bool, keep=False, check=_false_only("traiNNer-redux's adaptive discriminator pausing is "
                                                            "not available in anysr; remove it"),
                        doc="Accepted when false (traiNNer-redux); true is refused (not available)."),
    "adaptive_d_ema_decay": Field(float, keep=False, doc="Accepted (traiNNer-redux, for adaptive_d) and ignored."),
    "adaptive_d_threshold": Field(float, keep=False, doc="Accepted (traiNNer-redux, for adaptive_d) and ignored."),
    "restart_scheduler": Field(bool, keep=False,
                               doc="Accepted (traiNNer-redux) and ignored: on resume anysr applies changed schedule "
                                   "arguments when the learning rate at the resumed iteration stays the same, and "
                                   "refuses the run otherwise (see scheduler)."),
    "optim_ae": Field((dict, None), keep=False, check=_null_only("traiNNer-redux's autoencoder training is not "
                                                                 "available in anysr; remove it"),
                      doc="Accepted when null (traiNNer-redux); refused otherwise (not available)."),
    "eco": Field(dict, keep=False, check=_eco,
                 doc="Accepted when ECO is off (traiNNer-redux: {enabled: false}); enabled is refused."),
}

TRAINNER_VAL_FIELDS: dict[str, Field] = {
    "val_enabled": Field(bool, keep=False,
                         doc="traiNNer-redux: false -> no validation while training (the val section and the val* "
                             "datasets are ignored, unchecked, as there)."),
    "tile_size": Field(int, keep=False, check=at_least(0),
                       doc="traiNNer-redux: val.tile (0: whole images)."),
    "tile_overlap": Field(int, keep=False, check=at_least(0),
                          doc="traiNNer-redux: val.tile_pad (with tile_size > 0)."),
    "metrics_enabled": Field(bool, keep=False,
                             doc="traiNNer-redux: false -> val.metrics are ignored (unchecked)."),
}

TRAINNER_LOGGER_FIELDS: dict[str, Field] = {
    "save_checkpoint_format": Field(str, keep=False, choices=("safetensors", "pth"),
                                    doc="traiNNer-redux: pth -> save_format also writes BasicSR .pth weights "
                                        "(anysr's safetensors are always written); safetensors: the default."),
}

TRAINNER_DATASET_FIELDS: dict[str, Field] = {
    "lq_size": Field(int, keep=False, check=at_least(1),
                     doc="traiNNer-redux: the LQ patch size; gt_size = lq_size * scale (both given: they must "
                         "agree)."),
    "accum_iter": Field(int, keep=False, check=at_least(1),
                        doc="traiNNer-redux (train dataset): train.accumulate."),
    "num_prefetch_queue": Field(int, keep=False, doc="Accepted (traiNNer-redux) and ignored."),
}


# ---------------------------------------------------------------- the mapping (before the sections are validated)

def is_trainner(opt: dict[str, Any]) -> bool:
    """Whether ``opt`` holds a key only traiNNer-redux's files write."""
    if any(k in opt for k in TRAINNER_MARKERS):
        return True
    if any(isinstance(opt.get(s), dict) and k in opt[s] for s, k in _SECTION_MARKERS):
        return True
    sets = opt.get("datasets")
    return isinstance(sets, dict) and any(isinstance(d, dict) and any(k in d for k in _DATASET_MARKERS)
                                          for d in sets.values())


class _Mapper:
    def __init__(self, opt: dict[str, Any], ctx: Context) -> None:
        self.opt, self.ctx = opt, ctx
        self.notes: list[str] = []
        self.ignored: list[str] = []

    def put(self, source: str, section: str, key: str, value: Any, shown: str | None = None) -> None:
        """Write ``opt[section][key] = value`` for the dialect key ``source`` (a different value given there too:
        one problem naming both)."""
        where = self.opt.get(section)
        if not isinstance(where, dict):
            return  # no such section (a test-only file without train): nothing to map onto
        if key in where and where[key] is not None and where[key] != value:
            self.ctx.add(source, f"means {section}.{key}: {value!r}, but {section}.{key} is also set to "
                         f"{where[key]!r}; keep one of them")
            return
        where[key] = value
        text = shown if shown is not None else str(value).lower() if isinstance(value, bool) else value
        self.notes.append(f"{source} -> {section}.{key} {text}")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _map_top(m: _Mapper) -> None:
    opt = m.opt
    amp, bf16 = opt.get("use_amp"), opt.get("amp_bf16")
    if isinstance(amp, bool):
        source = "use_amp" + ("+amp_bf16" if amp and bf16 is True else "")
        m.put(source, "train", "precision", "auto" if amp else "fp32")
    if isinstance(opt.get("use_channels_last"), bool):
        m.put("use_channels_last", "train", "channels_last", "auto" if opt["use_channels_last"] else False)
    if isinstance(opt.get("use_compile"), bool):
        m.put("use_compile", "train", "compile", opt["use_compile"])
    if opt.get("use_compile") is True and opt.get("compile_mode") not in (None, "default"):
        m.ignored.append(f"compile_mode {opt['compile_mode']}")
    for key in ("fast_matmul", "detect_anomaly", "deterministic"):
        if opt.get(key) is True:
            m.ignored.append(key)


def _map_train(m: _Mapper, trainner: bool) -> None:
    train = m.opt.get("train")
    if not isinstance(train, dict):
        return
    if train.get("grad_clip") is True:
        norm = _number(train.get("grad_clip_max_norm", GRAD_CLIP_NORM_DEFAULT))
        if norm is not None and norm > 0:
            m.put("train.grad_clip", "train", "grad_clip_norm", norm, f"{norm:g}")
    if trainner and train.get("ema_power") is None and (_number(train.get("ema_decay")) or 0) > 0:
        train["ema_power"] = EMA_POWER_DEFAULT
        m.notes.append(f"EMA warm-up: traiNNer-redux's (ema_power {EMA_POWER_DEFAULT:g})")
    if train.get("restart_scheduler") is True:
        m.ignored.append("restart_scheduler")


def _map_losses(m: _Mapper) -> None:
    """traiNNer-redux's ``perceptualloss`` / ``perceptualfp16loss`` entries -> TraiNNerPerceptualLoss (logged under
    the entry's own name), unless the entry holds BasicSR's PerceptualLoss keys."""
    train = m.opt.get("train")
    listed = train.get("losses") if isinstance(train, dict) else None
    if not isinstance(listed, list):
        return
    for i, entry in enumerate(listed):
        if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
            continue
        given = entry["type"]
        if given.lower() not in TRAINNER_PERCEPTUAL or any(k in entry for k in _BASICSR_PERCEPTUAL_KEYS):
            continue
        entry.setdefault("name", given.lower().replace("loss", ""))
        entry["type"] = TRAINNER_PERCEPTUAL_CLASS
        m.notes.append(f"train.losses[{i}] {given} -> {TRAINNER_PERCEPTUAL_CLASS}")


def _active_gan(train: Any) -> str | None:
    """Where ``train`` turns traiNNer-redux's GAN on (its rule: ``train.gan_opt``, else the first ``ganloss`` entry
    of ``train.losses``, with a non-zero ``loss_weight``), or None."""
    if not isinstance(train, dict):
        return None
    gan_opt = train.get("gan_opt")
    if isinstance(gan_opt, dict):
        return "train.gan_opt" if (_number(gan_opt.get("loss_weight", 0)) or 0) != 0 else None
    listed = train.get("losses")
    for i, entry in enumerate(listed if isinstance(listed, list) else []):
        if isinstance(entry, dict) and str(entry.get("type", "")).lower() == "ganloss":
            return f"train.losses[{i}]" if (_number(entry.get("loss_weight", 0)) or 0) != 0 else None
    return None


def _map_model(m: _Mapper) -> None:
    """traiNNer-redux has no ``model_type``: it trains against ``network_d`` whenever a GAN loss is on (plain, not
    relativistic: BasicSR's SRGANModel; with ``high_order_degradation``, RealESRGANModel). A file without
    ``model_type`` gets that model; a ``network_d`` without a GAN loss is unused there, and dropped here."""
    opt = m.opt
    if "model_type" in opt or not isinstance(opt.get("network_d"), dict) or not m.ctx.is_train:
        return
    where = _active_gan(opt.get("train"))
    if where is None:
        opt["network_d"] = None
        m.notes.append("network_d without a GAN loss -> unused (as traiNNer-redux)")
        return
    model = "RealESRGANModel" if opt.get("high_order_degradation") is True else "SRGANModel"
    opt["model_type"] = model
    m.notes.append(f"network_d + {where} ganloss -> model_type {model}")


def _map_val(m: _Mapper) -> None:
    val = m.opt.get("val")
    if not isinstance(val, dict):
        return
    if val.get("val_enabled") is False and m.ctx.is_train:
        m.opt["val"] = None
        sets = m.opt.get("datasets")
        dropped = [k for k in sets if phase_of(str(k)) == "val"] if isinstance(sets, dict) else []
        for name in dropped:
            del sets[name]
        m.notes.append("val.val_enabled false -> no validation" +
                       (f" ({', '.join(f'datasets.{k}' for k in dropped)} ignored)" if dropped else ""))
        return
    tile = val.get("tile_size")
    if isinstance(tile, int) and not isinstance(tile, bool) and tile > 0:
        m.put("val.tile_size", "val", "tile", tile)
        pad = val.get("tile_overlap")
        if isinstance(pad, int) and not isinstance(pad, bool):
            m.put("val.tile_overlap", "val", "tile_pad", pad)
    if val.get("metrics_enabled") is False and val.get("metrics") is not None:
        val["metrics"] = None
        m.notes.append("val.metrics_enabled false -> no metrics")


def _map_logger(m: _Mapper) -> None:
    logger = m.opt.get("logger")
    if not isinstance(logger, dict) or logger.get("save_checkpoint_format") != "pth":
        return
    given = logger.get("save_format")
    if given is None:
        logger["save_format"] = ["safetensors", "pth"]
        m.notes.append("logger.save_checkpoint_format pth -> logger.save_format [safetensors, pth]")
    elif isinstance(given, list) and "pth" not in given:
        m.ctx.add("logger.save_checkpoint_format", f"pth, but logger.save_format is {given!r}; keep one of them "
                  "(save_format: [safetensors, pth])")


def _map_datasets(m: _Mapper, trainner: bool) -> None:
    sets = m.opt.get("datasets")
    if not isinstance(sets, dict):
        return
    scale = m.ctx.scale
    for name, data in sets.items():
        if not isinstance(data, dict):
            continue
        path = f"datasets.{name}"
        for root in ("dataroot_gt", "dataroot_lq"):
            roots = data.get(root)
            if isinstance(roots, list) and len(roots) == 1 and isinstance(roots[0], str):
                data[root] = roots[0]
        lq = data.get("lq_size")
        if isinstance(lq, int) and not isinstance(lq, bool) and lq >= 1 and scale is not None:
            gt = data.get("gt_size")
            if gt is not None and gt != lq * scale:
                m.ctx.add(f"{path}.lq_size", f"{lq} x scale {scale} = {lq * scale} disagrees with {path}.gt_size "
                          f"({gt}); keep one of them (gt_size = lq_size x scale)")
            elif gt is None:
                data["gt_size"] = lq * scale
                m.notes.append(f"{path}.lq_size {lq} -> gt_size {lq * scale}")
        if data.get("dataset_enlarge_ratio") == "auto":
            data["dataset_enlarge_ratio"] = 1
            m.notes.append(f"{path}.dataset_enlarge_ratio auto -> 1")
        if phase_of(str(name)) != "train":
            continue
        accum = data.get("accum_iter")
        if isinstance(accum, int) and not isinstance(accum, bool) and accum >= 1:
            m.put(f"{path}.accum_iter", "train", "accumulate", accum)
        if trainner:
            flips = [k for k in ("use_hflip", "use_rot") if k not in data]
            for k in flips:
                data[k] = True  # traiNNer-redux's default; BasicSR's (and anysr's) is false
            if flips:
                m.notes.append(f"{path}.{'/'.join(flips)} unset -> true (traiNNer-redux's default)")


def _map_path(m: _Mapper) -> None:
    paths = m.opt.get("path")
    if not isinstance(paths, dict):
        return
    for key in ("param_key_g", "param_key_d"):
        if key in paths and paths[key] is None:
            paths[key] = "auto"
            m.notes.append(f"path.{key} null -> auto")


SCALE_ARGUMENTS = ("scale", "upscale", "upscaling_factor", "up_scale", "upscale_factor")


def fill_network_scale(net: Any, scale: int | None, who: str) -> str | None:
    """``net`` (a ``network_g`` mapping) gets the top-level ``scale`` in its class's scale argument where the file
    does not set it and the class's default differs (traiNNer-redux and neosr build every generator with it; presets
    got it when they were expanded); the note saying so, or None."""
    cls = registered("arch", net.get("type")) if isinstance(net, dict) and scale is not None else None
    if cls is None:
        return None
    params = constructor_args(cls)[0]
    name = next((a for a in SCALE_ARGUMENTS if a in params), None)
    if name is None or name in net or params[name] == scale:
        return None
    net[name] = scale
    return f"network_g.{name} unset -> {scale} (the top-level scale, as {who} passes it)"


def _map_network_scale(m: _Mapper) -> None:
    note = fill_network_scale(m.opt.get("network_g"), m.ctx.scale, "traiNNer-redux")
    if note is not None:
        m.notes.append(note)


def _map_otf(m: _Mapper, trainner: bool) -> None:
    """traiNNer-redux's on-the-fly degradation: ``blur_prob2`` -> ``second_blur_prob``; in a traiNNer-redux file with
    ``high_order_degradation: true``: the model (RealESRGANModel with a discriminator, else RealESRNetModel, as
    traiNNer-redux picks its RealESRGANModel), its defaults for missing keys, its crop (gt_size + 32), and a
    queue_size rounded down to a multiple of the batch."""
    opt = m.opt
    if "blur_prob2" in opt and _number(opt["blur_prob2"]) is not None:
        given = opt.get("second_blur_prob")
        if given is not None and given != opt["blur_prob2"]:
            m.ctx.add("blur_prob2", f"means second_blur_prob: {opt['blur_prob2']}, but second_blur_prob is also set "
                      f"to {given!r}; keep one of them")
        else:
            opt["second_blur_prob"] = opt["blur_prob2"]
            m.notes.append(f"blur_prob2 -> second_blur_prob {opt['blur_prob2']}")
    if not trainner or opt.get("high_order_degradation") is not True:
        return
    if opt.get("model_type") is None:
        gan = isinstance(opt.get("network_d"), dict)
        opt["model_type"] = "RealESRGANModel" if gan else "RealESRNetModel"
        m.notes.append(f"high_order_degradation -> model_type {opt['model_type']}")
    filled = [k for k in OTF_DEFAULTS if opt.get(k) is None]
    for k in filled:
        opt[k] = list(OTF_DEFAULTS[k]) if isinstance(OTF_DEFAULTS[k], list) else OTF_DEFAULTS[k]
    if filled:
        m.notes.append("traiNNer-redux's OTF defaults for " + ", ".join(filled))
    sets = opt.get("datasets")
    train = [(k, d) for k, d in sets.items() if phase_of(str(k)) == "train" and isinstance(d, dict)] \
        if isinstance(sets, dict) else []
    for name, data in train:
        if str(data.get("type", "")).lower() != "realesrgandataset":
            continue
        for k, v in OTF_DATASET_DEFAULTS.items():
            if data.get(k) is None:
                data[k] = list(v) if isinstance(v, list) else v
        gt = data.get("gt_size")
        if data.get("crop_pad_size") is None and isinstance(gt, int) and not isinstance(gt, bool):
            data["crop_pad_size"] = gt + OTF_CROP_MARGIN
            m.notes.append(f"datasets.{name}.crop_pad_size unset -> {gt + OTF_CROP_MARGIN} (gt_size + "
                           f"{OTF_CROP_MARGIN}, traiNNer-redux's crop)")
        batch, queue = data.get("batch_size_per_gpu"), opt.get("queue_size")
        if isinstance(batch, int) and isinstance(queue, int) and batch > 0 and queue % batch and queue >= batch:
            opt["queue_size"] = queue // batch * batch
            m.notes.append(f"queue_size {queue} -> {opt['queue_size']} (a multiple of batch_size_per_gpu {batch})")


VIDEO_WINDOW_DATASETS = ("pairedvideodataset",)  # traiNNer-redux's clip datasets (LQ window -> GT centre frame)


def _map_video(m: _Mapper) -> None:
    """traiNNer-redux's video training: a dataset's ``clip_size`` -> ``num_frame``; a ``pairedvideodataset`` training
    set -> model_type VideoBaseModel (VideoGANModel where a GAN loss made it SRGANModel); OTF degradation with a
    clip network is refused (it makes single LQ images, which traiNNer-redux's temporal networks cannot take)."""
    opt = m.opt
    sets = opt.get("datasets")
    for name, data in (sets.items() if isinstance(sets, dict) else ()):
        if isinstance(data, dict) and str(data.get("type", "")).lower() == "singlevideodataset":
            m.ctx.add(f"datasets.{name}.type", "singlevideodataset (LQ clips without GT) is not in anysr: run "
                      "`anysr infer --weights W -i <frame folder> -o <out>` (a clip network runs over the folder's "
                      "frames as one sequence: one scene per folder), or give dataroot_gt and use pairedvideodataset")
            continue
        if not isinstance(data, dict) or "clip_size" not in data:
            continue
        given = data.get("num_frame")
        if given is not None and given != data["clip_size"]:
            m.ctx.add(f"datasets.{name}.clip_size", f"means num_frame: {data['clip_size']}, but num_frame is also set "
                      f"to {given!r}; keep one of them")
            continue
        data["num_frame"] = data.pop("clip_size")
        m.notes.append(f"datasets.{name}.clip_size -> num_frame {data['num_frame']}")
    net = opt.get("network_g")
    cls = registered("arch", net.get("type")) if isinstance(net, dict) else None
    if opt.get("high_order_degradation") is True and getattr(cls, "video_window", False):
        m.ctx.add("high_order_degradation", f"on-the-fly degradation makes single LQ images, but {cls.__name__} "
                  "takes clips (b, t, c, h, w) and OTF clips are not implemented (traiNNer-redux cannot train this "
                  "either); train on LQ / GT frame folders: a train dataset of type pairedvideodataset")
        return
    train = [d for k, d in sets.items() if phase_of(str(k)) == "train" and isinstance(d, dict)] \
        if isinstance(sets, dict) else []
    if not any(str(d.get("type", "")).lower() in VIDEO_WINDOW_DATASETS for d in train) or not m.ctx.is_train:
        return
    model = {None: "VideoBaseModel", "SRGANModel": "VideoGANModel"}.get(opt.get("model_type"))
    if model is not None:
        opt["model_type"] = model
        m.notes.append(f"pairedvideodataset -> model_type {model}")


def map_trainner(opt: dict[str, Any], ctx: Context) -> list[str]:
    """Write what traiNNer-redux's keys of ``opt`` mean into anysr's keys, in place (before validation); problems
    go to ``ctx``. Returns the notes (empty for a file without such keys), the ignored keys last."""
    trainner = is_trainner(opt)
    m = _Mapper(opt, ctx)
    _map_top(m)
    _map_train(m, trainner)
    _map_val(m)
    _map_logger(m)
    _map_datasets(m, trainner)
    _map_otf(m, trainner)
    if trainner:
        _map_path(m)
        _map_losses(m)
        _map_model(m)
        _map_network_scale(m)
    _map_video(m)
    if m.ignored:
        m.notes.append(f"ignored: {', '.join(m.ignored)}")
    return m.notes


def trainner_rule(train: dict[str, Any], ctx: Context) -> None:
    """``train.ema_switch_iter`` rewrites the trained weights: not with schedule-free optimizers (their weights are
    not the ones trained)."""
    optim = train.get("optim_g")
    if (train.get("ema_switch_iter") or 0) > 0 and isinstance(optim, dict) \
            and "schedulefree" in str(optim.get("type", "")).lower():
        ctx.add("train.ema_switch_iter", f"cannot switch the weights of {optim['type']} (its trained weights are "
                "not the ones it means); set it to 0 or use another optimizer")

"""The option schema: every key anysr reads (BasicSR's vocabulary plus ours), its type, default and rules.

This module is the source of truth for defaults; ``docs/options.md`` is generated from it
(``python -m anysr.options.docs``).
"""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from typing import Any

from anysr.accelerators.hardware import PRECISION_CHOICES
from anysr.accelerators.kinds import ACCELERATOR_HINTS, ACCELERATORS, LAUNCHERS
from anysr.data.degradation.kernels import KERNEL_TYPES
from anysr.data.file_backends import BACKEND_TYPES
from anysr.data.paired_image_dataset import PairedImageDataset
from anysr.errors import did_you_mean
from anysr.options.fields import (
    MISSING,
    Check,
    Context,
    Field,
    ListOf,
    MapOf,
    Rule,
    Section,
    at_least,
    between,
    greater_than,
    join,
    show,
    validate_field,
    validate_section,
)
from anysr.options.video import (
    VIDEO_DATASET_FIELDS,
    VIDEO_TRAIN_FIELDS,
    VIDEO_VAL_FIELDS,
    network_weight_paths,
    video_dataset_rule,
)
from anysr.registry import (
    ARCH_REGISTRY,
    DATASET_REGISTRY,
    LOSS_REGISTRY,
    METRIC_REGISTRY,
    MODEL_REGISTRY,
    OPTIMIZER_REGISTRY,
    REQUIRED,
    SCHEDULER_REGISTRY,
    Registry,
    argument_problems,
    constructor_args,
)

PHASES = ("train", "val", "test")

# Where each kind of named class is registered (imported on first use: the options do not load torch for --help).
_PACKAGES: dict[str, tuple[str, Registry]] = {
    "model": ("anysr.models", MODEL_REGISTRY),
    "dataset": ("anysr.data", DATASET_REGISTRY),
    "arch": ("anysr.archs", ARCH_REGISTRY),
    "metric": ("anysr.metrics", METRIC_REGISTRY),
    "loss": ("anysr.losses", LOSS_REGISTRY),
    "optimizer": ("anysr.models", OPTIMIZER_REGISTRY),
    "scheduler": ("anysr.models", SCHEDULER_REGISTRY),
}


# ---------------------------------------------------------------- what other packages registered

def registry(kind: str) -> Registry:
    """The registry of ``kind`` ('model', 'dataset', 'arch', 'metric', 'loss', 'optimizer', 'scheduler'), filled."""
    module, reg = _PACKAGES[kind]
    importlib.import_module(module)
    return reg


def known_names(kind: str, role: str | None = None) -> list[str]:
    """Names registered for ``kind`` (only classes whose ``role`` attribute is ``role``, when given)."""
    reg = registry(kind)
    return [n for n in reg.keys() if role is None or getattr(reg.get(n), "role", None) == role]


# ---------------------------------------------------------------- helpers for rules

def good(out: dict[str, Any], key: str) -> bool:
    """The key is present, valid and not null."""
    return out.get(key, None) not in (None, MISSING)


def _check_registered(kind: str, label: str, name: Any, path: str, ctx: Context, role: str | None = None) -> bool:
    names = known_names(kind, role)
    if not isinstance(name, str) or name in names:
        return True
    ctx.add(path, f"unknown {label} '{name}'{did_you_mean(name, names)}; known: {', '.join(names)}")
    return False


def resolve_path(value: str, root: Path) -> Path:
    """``~`` expanded; a relative path is taken relative to ``root``."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else root / p


def _existing(out: dict[str, Any], key: str, path: str, ctx: Context, *, kind: str) -> None:
    """Resolve ``out[key]`` in place and check it exists (``kind``: 'file' or 'file or folder')."""
    if not good(out, key):
        return
    given = out[key]
    full = resolve_path(given, ctx.root)
    out[key] = str(full)
    shown = f"'{given}'" if str(full) == given else f"'{given}' (resolved to {full})"
    sub = f"{path}.{key}"
    if not ctx.check_paths:
        return
    if not full.exists():
        ctx.add(sub, f"{shown} does not exist; fix the path (relative paths start at path.root) or create it")
    elif kind == "file" and not full.is_file():
        ctx.add(sub, f"{shown} is a folder, expected a file")


def _phase_of(name: str) -> str | None:
    for phase in PHASES:
        if name.startswith(phase):
            return phase
    return None


def _dataset_key(name: str) -> str | None:
    if _phase_of(name) is None:
        return (f"a dataset name must start with train, val or test (that is its phase), got '{name}'"
                f"{did_you_mean(name, PHASES)}")
    return None


MAX_NAME_BYTES = 200  # folder names may have 255 bytes; log files add the date to the name


def _valid_name(value: str) -> bool:
    return (bool(value.strip()) and "/" not in value and "\\" not in value and value not in (".", "..")
            and len(value.encode("utf-8")) <= MAX_NAME_BYTES)


def _num_gpu(value: Any) -> str | None:
    if isinstance(value, str):
        return None if value == "auto" else "must be 'auto' or an int >= 0"
    return None if value >= 0 else "must be 'auto' or an int >= 0"


def _auto_or_bool(value: Any) -> str | None:
    return None if isinstance(value, bool) or value == "auto" else "must be 'auto', true or false"


SAVE_FORMATS = ("safetensors", "pth", "plain.pth", "plain.safetensors")


def _save_formats(value: list[str]) -> str | None:
    bad = [v for v in value if v not in SAVE_FORMATS]
    return f"unknown format(s) {', '.join(map(repr, bad))}; choose from {', '.join(SAVE_FORMATS)}" if bad else None


def _filename_tmpl(value: str) -> str | None:
    return None if value.count("{}") == 1 else "must contain '{}' exactly once (where the file stem goes)"


# ---------------------------------------------------------------- rules (cross-field checks, computed values)

def _dataset_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    name = key or ""
    phase = _phase_of(name) or "test"
    if good(out, "phase") and out["phase"] != phase:
        ctx.add(f"{path}.phase", f"is set by the loader from the dataset name ('{name}' -> '{phase}'); "
                f"remove it, got {show(out['phase'])}")
    out["phase"] = phase
    if ctx.scale is not None:
        if good(out, "scale") and out["scale"] != ctx.scale:
            ctx.add(f"{path}.scale", f"{out['scale']} differs from the top-level scale ({ctx.scale}); "
                    "remove it (the loader copies scale into every dataset)")
        out["scale"] = ctx.scale
    if not good(out, "name"):
        out["name"] = name
    if good(out, "type"):
        _check_registered("dataset", "dataset type", out["type"], f"{path}.type", ctx)
    for root_key in ("dataroot_gt", "dataroot_lq"):
        _existing(out, root_key, path, ctx, kind="file or folder")
    _existing(out, "meta_info_file", path, ctx, kind="file")
    backend = out.get("io_backend")
    io_kind = backend.get("type") if isinstance(backend, dict) else "disk"
    for root_key in ("dataroot_gt", "dataroot_lq"):
        if ctx.check_paths and good(out, root_key) and Path(out[root_key]).is_file():
            what = "the .lmdb folder (io_backend.type is lmdb)" if io_kind == "lmdb" else "the folder of images"
            ctx.add(f"{path}.{root_key}", f"'{out[root_key]}' is a file; point it to {what}")
    if good(out, "mean") != good(out, "std"):
        ctx.add(f"{path}.{'std' if good(out, 'mean') else 'mean'}", "set mean and std together (or neither)")
    kind = out.get("type")
    if _is_paired(kind):
        if "dataroot_gt" in out and out["dataroot_gt"] is None:
            ctx.add(f"{path}.dataroot_gt", f"required by {kind} (the ground-truth images)")
        has_lq = out.get("dataroot_lq") is not None
        if has_lq and out.get("lq_from_gt") is True:
            ctx.add(f"{path}.dataroot_lq", "set together with lq_from_gt: true; keep one (lq_from_gt "
                    "makes the LQ images from the GT images)")
        elif "dataroot_lq" in out and not has_lq and out.get("lq_from_gt") is False:
            ctx.add(f"{path}.dataroot_lq", f"{kind} needs dataroot_lq (a folder of LQ images) "
                    "or lq_from_gt: true (LQ made from GT by MATLAB bicubic)")
        if phase == "train" and "gt_size" in out and out["gt_size"] is None:
            ctx.add(f"{path}.gt_size", f"required for a train {kind} (the GT patch size, a "
                    "multiple of scale, e.g. 96 or 128)")
    elif _is_synthesis_source(kind):
        _realesrgan_dataset_rule(out, path, ctx, phase)
    elif kind == "SingleImageDataset" and "dataroot_lq" in out and out["dataroot_lq"] is None:
        ctx.add(f"{path}.dataroot_lq", "required by SingleImageDataset (the folder of input images)")
    if good(out, "gt_size") and ctx.scale is not None and out["gt_size"] % ctx.scale:
        ctx.add(f"{path}.gt_size", f"{out['gt_size']} is not a multiple of scale ({ctx.scale}); "
                f"use e.g. {max(1, out['gt_size'] // ctx.scale) * ctx.scale}")
    if phase == "train" and "batch_size_per_gpu" in out and out["batch_size_per_gpu"] is None:
        ctx.add(f"{path}.batch_size_per_gpu", "required for a train dataset (images per device per step)")
    if good(out, "std") and any(s <= 0 for s in out["std"]):
        ctx.add(f"{path}.std", f"every value must be > 0, got {out['std']}")
    video_dataset_rule(out, path, ctx, phase, registry("dataset"))


def _arguments(kind: str, label: str, out: dict[str, Any], path: str, ctx: Context, *, role: str | None = None,
               skip: tuple[str, ...] = (), not_arguments: tuple[str, ...] = (),
               fill_defaults: bool = False) -> dict[str, Any] | None:
    """The one check of a ``{type: Name, ...arguments}`` section against the registered class's signature
    (``registry.argument_problems``, as ``build_network`` does): the constructor's defaults, or None when the
    type is not registered. ``not_arguments``: keys of the section that are not constructor arguments."""
    if not good(out, "type") or not _check_registered(kind, label, out["type"], f"{path}.type", ctx, role):
        return None
    cls = registry(kind).get(out["type"])
    given = {k: v for k, v in out.items() if k != "type" and k not in not_arguments}
    for problem in argument_problems(cls, given, path, out["type"], skip=skip):
        ctx.add("", problem)
    params, _ = constructor_args(cls, skip)
    for name, default in params.items():
        if name in given and isinstance(default, float) and isinstance(given[name], str):
            try:
                out[name] = float(given[name])  # PyYAML reads 1e-4 as a string
            except ValueError:
                ctx.add(f"{path}.{name}", f"expected float, got {show(given[name])}")
        elif fill_defaults and name not in out and default is not REQUIRED and default is not None:
            out[name] = list(default) if isinstance(default, tuple) else default
    return params


def _network_rule(out: dict[str, Any], path: str, ctx: Context, *, check_scale: bool) -> None:
    params = _arguments("arch", "arch", out, path, ctx)
    if params is None or not check_scale or ctx.scale is None:
        return
    arch = out["type"]
    for name in ("upscale", "scale"):
        if name in out:
            value = out[name]
            if isinstance(value, bool) or not isinstance(value, int):
                ctx.add(f"{path}.{name}", f"expected int, got {show(value)}")
            elif value != ctx.scale:
                ctx.add(f"{path}.{name}", f"{value} differs from the top-level scale ({ctx.scale}); "
                        f"set {path}.{name} and scale to the same factor")
        elif name in params and params[name] is not REQUIRED and params[name] != ctx.scale:
            ctx.add(f"{path}.{name}", f"not set, so {arch} uses its default {params[name]!r}, which differs "
                    f"from scale ({ctx.scale}); set {path}.{name}: {ctx.scale}")


def _network_g_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    _network_rule(out, path, ctx, check_scale=True)
    network_weight_paths(out, path, ctx, _existing)


def _network_d_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    _network_rule(out, path, ctx, check_scale=False)


def _optim_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    _arguments("optimizer", "optimizer", out, path, ctx, skip=("params",))
    if out.get("nesterov") is True and not (good(out, "momentum") and out["momentum"] > 0):
        ctx.add(f"{path}.nesterov", "needs momentum > 0; set momentum (e.g. 0.9) or nesterov: false")


def _scheduler_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    _arguments("scheduler", "scheduler", out, path, ctx, skip=("optimizer", "warmup_iter"), fill_defaults=True)
    if out.get("type") == "CosineAnnealingRestartLR" and good(out, "periods"):
        if not good(out, "restart_weights"):
            out["restart_weights"] = [1.0] * len(out["periods"])
        elif len(out["restart_weights"]) != len(out["periods"]):
            ctx.add(f"{path}.restart_weights", f"has {len(out['restart_weights'])} values but periods has "
                    f"{len(out['periods'])}; give one weight per period")


def _loss_rule(role: str, not_arguments: tuple[str, ...] = ()) -> Rule:
    def rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
        _arguments("loss", f"{role} loss", out, path, ctx, role=role, skip=("vgg_state_dict",),
                   not_arguments=not_arguments, fill_defaults=True)
    return rule


def _train_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    losses = ("pixel_opt", "perceptual_opt", "gan_opt")
    if all(out.get(name) is None for name in losses):
        ctx.add(path, "no loss is set; add one of train.pixel_opt (e.g. {type: L1Loss}), "
                "train.perceptual_opt, train.gan_opt")
    sched = out.get("scheduler")
    if isinstance(sched, dict) and sched.get("type") == "CosineAnnealingRestartLR" and good(sched, "periods") \
            and good(out, "total_iter") and out["total_iter"] > sum(sched["periods"]):
        end = sum(sched["periods"])
        ctx.add(f"{path}.scheduler.periods", f"the cosine periods end at iteration {end} but train.total_iter is "
                f"{out['total_iter']}: past the last period the learning rate would climb back up. Extend the "
                f"periods to cover total_iter (e.g. add a period of {out['total_iter'] - end} with its "
                "restart_weights entry) or lower train.total_iter")


# Keys of a metric section that only some metrics read: key -> short metric names (MetricInfo.name).
_METRIC_ONLY = {"convert_to": ("niqe",), "net": ("lpips",), "stats": ("fid",), "weights": ("lpips", "dists", "fid")}
_METRIC_DEFAULTS = {"niqe": {"convert_to": "y"}, "lpips": {"net": "alex"}}
_WEIGHTS_HINT = {
    "lpips": "torchvision's alexnet (or vgg16 with net: vgg) state dict and lpips' head weights/v0.1/alex.pth "
             "(vgg.pth), or one saved lpips.LPIPS state dict",
    "dists": "torchvision's vgg16 state dict and DISTS' weights.pt (alpha, beta), or one DISTS state dict",
    "fid": "pytorch-fid's pt_inception-2015-12-05-6726825d.pth (the FID Inception-v3)",
}


def _metric_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    from anysr.metrics.info import metric_info  # noqa: PLC0415 - numpy-free descriptors, no torch import

    if "crop_border" not in out and ctx.scale is not None:
        out["crop_border"] = ctx.scale
    if good(out, "weights"):
        files = [out["weights"]] if isinstance(out["weights"], str) else list(out["weights"])
        resolved = []
        for i, given in enumerate(files):
            slot = "weights" if isinstance(out["weights"], str) else f"weights[{i}]"
            item = {slot: given}
            _existing(item, slot, path, ctx, kind="file")
            resolved.append(item[slot])
        out["weights"] = resolved
    _existing(out, "stats", path, ctx, kind="file")
    if not good(out, "type") or not _check_registered("metric", "metric", out["type"], f"{path}.type", ctx):
        return
    info = metric_info(out["type"])
    if info is None:
        return
    for name, users in _METRIC_ONLY.items():
        if good(out, name) and info.name not in users:
            ctx.add(f"{path}.{name}", f"is not read by {out['type']} (only by {', '.join(users)}); remove it")
    for name, value in _METRIC_DEFAULTS.get(info.name, {}).items():
        if not good(out, name):
            out[name] = value
    if good(out, "better") and out["better"] != info.better:
        ctx.add(f"{path}.better", f"{out['type']} is {info.better}-is-better, got {out['better']!r}; remove "
                f"better (it follows the metric) or set {info.better}")
    out["better"] = info.better
    if info.name in _WEIGHTS_HINT and not good(out, "weights"):
        ctx.add(f"{path}.weights", f"required by {out['type']} (nothing is downloaded): give "
                f"{_WEIGHTS_HINT[info.name]}; one file or a list")
    if out.get("test_y_channel") is True and info.name in ("lpips", "dists", "fid"):
        ctx.add(f"{path}.test_y_channel", f"{out['type']} compares RGB images; remove test_y_channel")


def _val_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    if ctx.is_train and "val_freq" in out and out["val_freq"] is None:
        ctx.add(f"{path}.val_freq", "required when training with a val section (validate every N "
                "iterations, e.g. 5000); or remove the val section")


def _path_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    out["root"] = str(ctx.root)
    for name in ("pretrain_network_g", "pretrain_network_d", "resume_state"):
        _existing(out, name, path, ctx, kind="file")


def _fill_run_paths(paths: dict[str, Any], name: str, ctx: Context) -> None:
    """Resolve the output folders: experiments/<name>/... when training, results/<name> when testing."""
    root = ctx.root
    for k in ("experiments_root", "models", "training_states", "log", "visualization", "results_root"):
        if good(paths, k):
            paths[k] = str(resolve_path(paths[k], root))
    if ctx.is_train:
        base = Path(paths.get("experiments_root") or root / "experiments" / name)
        paths["experiments_root"] = str(base)
        for k in ("models", "training_states", "log", "visualization"):
            if not good(paths, k):
                paths[k] = str(base / k)
    else:
        base = Path(paths.get("results_root") or root / "results" / name)
        paths["results_root"] = str(base)
        if not good(paths, "log"):
            paths["log"] = str(base)
        if not good(paths, "visualization"):
            paths["visualization"] = str(base / "visualization")
    unused = ("results_root",) if ctx.is_train else ("experiments_root", "models", "training_states")
    for k in unused:
        paths.setdefault(k, None)
    ordered = {k: paths[k] for k in PATH.fields if k in paths}
    ordered.update((k, v) for k, v in paths.items() if k not in ordered)
    paths.clear()
    paths.update(ordered)


def _top_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    out["is_train"] = ctx.is_train
    if good(out, "model_type"):
        _check_registered("model", "model_type", out["model_type"], "model_type", ctx)
    datasets = out.get("datasets")
    if isinstance(datasets, dict):
        train_sets = [k for k in datasets if _phase_of(k) == "train"]
        if ctx.is_train and not train_sets:
            ctx.add("datasets", "no train dataset; add datasets.train (type, dataroot_gt, ..., "
                    "batch_size_per_gpu) to train")
        if len(train_sets) > 1:
            ctx.add("datasets", f"{len(train_sets)} train datasets ({', '.join(train_sets)}); "
                    "training reads exactly one, keep one")
    if not ctx.is_train and out.get("val") is None and "val" in out:
        out["val"] = validate_section(VAL, {}, "val", ctx)  # a test without a val section: the defaults
    tile, val = out.get("tile"), out.get("val")
    if isinstance(tile, dict) and good(tile, "tile_size") and isinstance(val, dict):
        if good(val, "tile") and val["tile"] != tile["tile_size"]:
            ctx.add("tile.tile_size", f"{tile['tile_size']} differs from val.tile ({val['tile']}); keep one")
        else:
            val["tile"], val["tile_pad"] = tile["tile_size"], tile["tile_pad"]
    if ctx.is_train and out.get("train") is None and "train" in out:
        ctx.add("train", "required when training (at least total_iter, optim_g and a loss such as pixel_opt)")
    _realesrgan_rule(out, ctx)
    paths = out.get("path")
    if isinstance(paths, dict) and good(out, "name"):
        _fill_run_paths(paths, out["name"], ctx)


# ---------------------------------------------------------------- Real-ESRGAN: synthesised training pairs

# Real-ESRGAN x4plus's settings (the Real-ESRGAN project's options/train_realesrgan_x4plus.yml): the defaults of the
# keys below, filled in for the models that synthesise their LQ and for RealESRGANDataset (BasicSR requires them).
_ALL_KERNELS = list(KERNEL_TYPES)
_X4PLUS_KERNELS: dict[str, Any] = {
    "kernel_list": _ALL_KERNELS, "kernel_prob": [0.45, 0.25, 0.12, 0.03, 0.12, 0.03], "sinc_prob": 0.1,
    "blur_sigma": [0.2, 3.0], "betag_range": [0.5, 4.0], "betap_range": [1.0, 2.0],
    "kernel_list2": _ALL_KERNELS, "kernel_prob2": [0.45, 0.25, 0.12, 0.03, 0.12, 0.03], "sinc_prob2": 0.1,
    "blur_sigma2": [0.2, 1.5], "betag_range2": [0.5, 4.0], "betap_range2": [1.0, 2.0],
    "final_sinc_prob": 0.8, "crop_pad_size": 400,
}
_X4PLUS_MODEL: dict[str, Any] = {
    "high_order_degradation": True, "gt_usm": True, "l1_gt_usm": True, "percep_gt_usm": True, "gan_gt_usm": False,
    "resize_prob": [0.2, 0.7, 0.1], "resize_range": [0.15, 1.5], "gaussian_noise_prob": 0.5,
    "noise_range": [1.0, 30.0], "poisson_scale_range": [0.05, 3.0], "gray_noise_prob": 0.4, "jpeg_range": [30.0, 95.0],
    "second_blur_prob": 0.8, "resize_prob2": [0.3, 0.4, 0.3], "resize_range2": [0.3, 1.2],
    "gaussian_noise_prob2": 0.5, "noise_range2": [1.0, 25.0], "poisson_scale_range2": [0.05, 2.5],
    "gray_noise_prob2": 0.4, "jpeg_range2": [30.0, 95.0], "queue_size": 180,
}
_BLUR_REACH = 10  # BasicSR pads every kernel to 21x21: filtering reflects 10 pixels, so images must be larger
_PROB = between(0, 1)


def _x4(key: str) -> str:
    value = {**_X4PLUS_KERNELS, **_X4PLUS_MODEL}[key]
    return f"{str(value).lower() if isinstance(value, bool) else value} (Real-ESRGAN x4plus)"


def _pair(doc: str, key: str) -> Field:
    return Field((ListOf(float, length=2), None), default=None, default_doc=_x4(key), doc=doc)


def _stage_fields(suffix: str, which: str) -> dict[str, Field]:
    return {
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


def _kernel_fields(suffix: str, which: str) -> dict[str, Field]:
    return {
        f"kernel_list{suffix}": Field((ListOf(str, min_len=1), None), default=None,
                                      default_doc="all six kinds (Real-ESRGAN x4plus)",
                                      expect=f"list of {' | '.join(KERNEL_TYPES)} | null",
                                      doc=f"RealESRGANDataset, {which} blur: the kernel kinds to mix."),
        f"kernel_prob{suffix}": Field((ListOf(float, min_len=1), None), default=None,
                                      default_doc=_x4(f"kernel_prob{suffix}"),
                                      doc=f"RealESRGANDataset, {which} blur: the weight of each kind of kernel_list"
                                          f"{suffix}."),
        f"blur_sigma{suffix}": _pair(f"RealESRGANDataset, {which} blur: sigma range (both axes), low > 0.",
                                     f"blur_sigma{suffix}"),
        f"betag_range{suffix}": _pair(f"RealESRGANDataset, {which} blur: generalized Gaussian shape range.",
                                      f"betag_range{suffix}"),
        f"betap_range{suffix}": _pair(f"RealESRGANDataset, {which} blur: plateau shape range.",
                                      f"betap_range{suffix}"),
        f"sinc_prob{suffix}": Field((float, None), default=None, check=_PROB, default_doc=_x4(f"sinc_prob{suffix}"),
                                    doc=f"RealESRGANDataset, {which} blur: chance of a sinc kernel instead."),
        f"blur_kernel_size{suffix}": Field(int, keep=False,
                                           doc="Accepted (BasicSR reads it and ignores it: kernel sizes are drawn "
                                               "from 7 to 21 and padded to 21)."),
    }


REALESRGAN_DATASET_FIELDS: dict[str, Field] = {
    **_kernel_fields("", "first"),
    **_kernel_fields("2", "second"),
    "final_sinc_prob": Field((float, None), default=None, check=_PROB, default_doc=_x4("final_sinc_prob"),
                             doc="RealESRGANDataset: chance of the final sinc filter (else none)."),
    "crop_pad_size": Field((int, None), default=None, check=at_least(1), default_doc="400 (RealESRGANDataset)",
                           doc="RealESRGANDataset: images are reflect-padded to at least this size, then a random "
                               "square of this size is cropped and degraded (BasicSR hard-codes 400); a multiple "
                               "of scale."),
}


def _dataset_class(kind: Any) -> Any:
    return registry("dataset").get(kind) if isinstance(kind, str) and kind in registry("dataset") else None


def _is_paired(kind: Any) -> bool:
    """PairedImageDataset or a subclass (RealESRGANPairedDataset): the same keys and rules."""
    cls = _dataset_class(kind)
    return cls is not None and issubclass(cls, PairedImageDataset)


def _is_synthesis_source(kind: Any) -> bool:
    """A dataset that gives GT images and kernels and no LQ (RealESRGANDataset)."""
    return bool(getattr(_dataset_class(kind), "synthesis_source", False))


def _synthesises(model_type: Any) -> bool:
    """A model that makes its LQ from a synthesis source (RealESRNetModel, RealESRGANModel)."""
    reg = registry("model")
    return isinstance(model_type, str) and model_type in reg and bool(getattr(reg.get(model_type), "synthesises",
                                                                              False))


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


def _realesrgan_dataset_rule(out: dict[str, Any], path: str, ctx: Context, phase: str) -> None:
    kind = out["type"]
    _fill(out, _X4PLUS_KERNELS)
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
            bad = [k for k in out[names] if k not in KERNEL_TYPES]
            if bad:
                ctx.add(f"{path}.{names}", f"unknown kernel kind(s) {bad}; choose from {list(KERNEL_TYPES)}")
            elif good(out, probs) and len(out[probs]) != len(out[names]):
                ctx.add(f"{path}.{probs}", f"has {len(out[probs])} weights for the {len(out[names])} kinds of "
                        f"{names}; give one weight per kind")
        _check_weights(out, probs, path, ctx)
        _check_range(out, f"blur_sigma{suffix}", path, ctx, low=0, low_open=True)
        _check_range(out, f"betag_range{suffix}", path, ctx, low=0, low_open=True)
        _check_range(out, f"betap_range{suffix}", path, ctx, low=0, low_open=True)
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


def _realesrgan_rule(out: dict[str, Any], ctx: Context) -> None:
    """Real-ESRGAN's keys: defaults and ranges, and which datasets go with which models."""
    datasets = out.get("datasets")
    train = [(k, d) for k, d in datasets.items() if _phase_of(k) == "train" and isinstance(d, dict)] \
        if isinstance(datasets, dict) else []
    model = out.get("model_type")
    if not _synthesises(model):
        for k, d in train:
            if _is_synthesis_source(d.get("type")):
                ctx.add(f"datasets.{k}.type", f"{d['type']} gives GT images and blur kernels, no LQ images; train "
                        "it with model_type RealESRNetModel or RealESRGANModel (they synthesise the LQ)")
        return
    _fill(out, _X4PLUS_MODEL)
    for suffix in ("", "2"):
        _check_weights(out, f"resize_prob{suffix}", "", ctx)
        _check_range(out, f"resize_range{suffix}", "", ctx, low=0, low_open=True, around_one=True)
        _check_range(out, f"noise_range{suffix}", "", ctx, low=0)
        _check_range(out, f"poisson_scale_range{suffix}", "", ctx, low=0)
        _check_range(out, f"jpeg_range{suffix}", "", ctx, low=0, low_open=True, high=100, high_open=True)
    if not ctx.is_train:
        return
    for k, d in train:
        if out["high_order_degradation"] is False:
            if _is_synthesis_source(d.get("type")):
                ctx.add(f"datasets.{k}.type", f"high_order_degradation: false trains on the dataset's LQ/GT pairs, "
                        f"and {d['type']} has none; use RealESRGANPairedDataset (or PairedImageDataset)")
            continue
        if not _is_synthesis_source(d.get("type")):
            ctx.add(f"datasets.{k}.type", f"{model} synthesises its LQ from RealESRGANDataset (GT images and blur "
                    f"kernels), got {d.get('type')}; use type: RealESRGANDataset, or set high_order_degradation: "
                    "false to train on the dataset's own LQ/GT pairs")
            continue
        _check_synthesis_sizes(out, k, d, ctx)


def _check_synthesis_sizes(out: dict[str, Any], key: str, d: dict[str, Any], ctx: Context) -> None:
    """gt_size (top level and the dataset's agree), crop_pad_size large enough, queue_size a multiple of the batch."""
    top, ds = out.get("gt_size"), d.get("gt_size")
    if top is None and ds is None:
        ctx.add("gt_size", f"required by {out['model_type']}: the GT crop taken after the synthesis, a multiple of "
                "scale such as 256 (here or as datasets.train.gt_size)")
    elif top is None:
        out["gt_size"] = ds
    elif ds is None:
        d["gt_size"] = top
        if ctx.scale is not None and top % ctx.scale:
            ctx.add("gt_size", f"{top} is not a multiple of scale ({ctx.scale})")
    elif top != ds:
        ctx.add("gt_size", f"{top} differs from datasets.{key}.gt_size ({ds}); the crop after the synthesis is one "
                "size: set both to the same value")
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


# ---------------------------------------------------------------- the schema

_NUM_FREQ = "int >= 1 (a float like 5e3 is accepted)"

IO_BACKEND = Section({
    "type": Field(str, default="disk", choices=BACKEND_TYPES, doc="Where images are read from."),
})

DATASET = Section(
    {
        "name": Field(str, default_doc="the dataset's key", doc="Display name (logs, result folders)."),
        "type": Field(str, required=True, doc="Dataset class in DATASET_REGISTRY, e.g. PairedImageDataset."),
        "dataroot_gt": Field((str, None), default=None,
                             doc="Ground-truth images: a folder (or .lmdb folder); must exist."),
        "dataroot_lq": Field((str, None), default=None,
                             doc="Low-quality input images; must exist. PairedImageDataset needs exactly one "
                                 "of dataroot_lq and lq_from_gt."),
        "meta_info_file": Field((str, None), default=None, doc="Text file listing the images; must exist."),
        "filename_tmpl": Field(str, default="{}", check=_filename_tmpl, expect="str containing '{}'",
                               doc="LQ file stem from the GT stem, e.g. '{}x4'."),
        "io_backend": Field(IO_BACKEND, default={}, doc="I/O backend."),
        "gt_size": Field((int, None), default=None, check=at_least(1),
                         doc="GT patch size for training crops; a multiple of scale. Required for a train "
                             "PairedImageDataset."),
        "use_hflip": Field(bool, default=False, doc="Random horizontal flip (BasicSR alias: use_flip)."),
        "use_rot": Field(bool, default=False, doc="Random vertical flip and transpose."),
        "use_shuffle": Field(bool, default=True, doc="Shuffle the training samples."),
        "num_worker_per_gpu": Field(int, default=0, check=at_least(0),
                                    doc="DataLoader workers per device (BasicSR's default is 3; ours is 0)."),
        "batch_size_per_gpu": Field((int, None), default=None, check=at_least(1),
                                    doc="Images per device per step. Required for a train dataset."),
        "dataset_enlarge_ratio": Field(int, default=1, check=at_least(1),
                                       doc="Repeat the dataset this many times per epoch."),
        "prefetch_mode": Field((str, None), default=None, choices=(None, "cpu", "cuda"),
                               doc="Accepted for BasicSR files; the loader decides prefetching."),
        "prefetch_factor": Field((int, None), default=None, check=at_least(1),
                                 doc="DataLoader prefetch_factor (batches per worker; needs workers)."),
        "pin_memory": Field(bool, default=False, doc="DataLoader pin_memory."),
        "persistent_workers": Field(bool, default=False, doc="DataLoader persistent_workers."),
        "mean": Field((ListOf(float, length=3), None), default=None, doc="Per-channel mean to subtract."),
        "std": Field((ListOf(float, length=3), None), default=None,
                     doc="Per-channel std to divide by (> 0)."),
        "color": Field((str, None), default=None, choices=("y", None),
                       doc="'y': train/test on the Y channel."),
        "lq_from_gt": Field(bool, default=False,
                            doc="Make LQ from GT with MATLAB bicubic (then dataroot_lq is not needed)."),
        **REALESRGAN_DATASET_FIELDS,
        "task": Field((str, None), keep=False, doc="Accepted (the DAT authors' option files: SR) and ignored."),
        "phase": Field(str, choices=PHASES, default_doc="from the key prefix (train, val, test)",
                       doc="Set by the loader from the dataset key."),
        "scale": Field(int, default_doc="the top-level scale",
                       doc="Set by the loader from the top-level scale."),
        **VIDEO_DATASET_FIELDS,
    },
    aliases={"use_flip": "use_hflip", "meta_info": "meta_info_file"},
    rule=_dataset_rule,
    doc="One entry per dataset; its key starts with train, val or test (its phase).",
)

NETWORK_G = Section(
    {"type": Field(str, required=True, doc="Arch class in ARCH_REGISTRY (e.g. EDSR, MSRResNet, SwinIR).")},
    extra=True,
    rule=_network_g_rule,
    doc="The generator: `type` plus the arch's constructor arguments (checked against its signature). "
        "An `upscale`/`scale` argument must equal the top-level scale.",
)

NETWORK_D = Section(
    {"type": Field(str, required=True, doc="Discriminator arch class in ARCH_REGISTRY.")},
    extra=True,
    rule=_network_d_rule,
    doc="The discriminator (GAN models): `type` plus constructor arguments.",
)

PATH = Section(
    {
        "pretrain_network_g": Field((str, None), default=None,
                                    doc="Weights to start from; an existing file."),
        "param_key_g": Field((str, None), default="params",
                             doc="Weights group: 'params', 'params_ema' (falls back to 'params'), or 'auto' "
                                 "('params_ema', then 'params', then a bare state dict)."),
        "strict_load_g": Field(bool, default=True, doc="Require every weight to match."),
        "pretrain_network_d": Field((str, None), default=None,
                                    doc="Discriminator weights; an existing file."),
        "param_key_d": Field((str, None), default="params", doc="Key in the discriminator weights file."),
        "strict_load_d": Field(bool, default=True, doc="Require every discriminator weight to match."),
        "resume_state": Field((str, None), default=None,
                              doc="Training state to resume from; an existing file."),
        "root": Field((str, None), default_doc="the root argument, else the current directory",
                      doc="Base of relative paths and of the output folders."),
        "experiments_root": Field((str, None), default_doc="<root>/experiments/<name> (train)",
                                  doc="Training output folder."),
        "models": Field((str, None), default_doc="<experiments_root>/models (train)", doc="Saved weights."),
        "training_states": Field((str, None), default_doc="<experiments_root>/training_states (train)",
                                 doc="Saved training states (resume)."),
        "log": Field((str, None), default_doc="<experiments_root>/log (train), <results_root> (test)",
                     doc="Log files and tensorboard."),
        "visualization": Field((str, None),
                               default_doc="<experiments_root>/visualization (train), "
                                           "<results_root>/visualization (test)",
                               doc="Saved validation / test images."),
        "results_root": Field((str, None), default_doc="<root>/results/<name> (test)",
                              doc="Test output folder."),
        "ignore_resume_networks": Field((ListOf(str), None), default=None,
                                        doc="Accepted (BasicSR): networks not restored on resume."),
    },
    # Older BasicSR option files (1.3 and before) use these names.
    aliases={"pretrain_model_g": "pretrain_network_g", "strict_load": "strict_load_g"},
    rule=_path_rule,
)

OPTIM = Section(
    {
        "type": Field(str, required=True, expect="a registered optimizer (Adam, AdamW, SGD)",
                      doc="Optimizer (OPTIMIZER_REGISTRY)."),
        "lr": Field(float, required=True, check=at_least(0), doc="Learning rate (0 freezes the network)."),
        "weight_decay": Field(float, check=at_least(0), default_doc="torch's default",
                              doc="Weight decay (all types)."),
        "betas": Field(ListOf(float, length=2), default_doc="torch's default", doc="Adam/AdamW betas."),
        "eps": Field(float, check=greater_than(0), default_doc="torch's default", doc="Adam/AdamW eps."),
        "momentum": Field(float, check=at_least(0), default_doc="torch's default", doc="SGD momentum."),
        "nesterov": Field(bool, default_doc="torch's default",
                          doc="SGD Nesterov momentum (needs momentum > 0)."),
    },
    extra=True,
    rule=_optim_rule,
    doc="The optimizer's constructor arguments (checked against its signature); unset keys keep torch's defaults.",
)

SCHEDULER = Section(
    {
        "type": Field(str, required=True, expect="a registered schedule (MultiStepLR, CosineAnnealingRestartLR)",
                      doc="Learning-rate schedule (SCHEDULER_REGISTRY)."),
        "milestones": Field(ListOf(int, min_len=1), default_doc="required by MultiStepLR",
                            doc="MultiStepLR: iterations where lr is multiplied by gamma."),
        "gamma": Field(float, check=greater_than(0), default_doc="0.1 (MultiStepLR)",
                       doc="MultiStepLR factor."),
        "periods": Field(ListOf(int, min_len=1), default_doc="required by CosineAnnealingRestartLR",
                         doc="CosineAnnealingRestartLR: length of each cosine cycle."),
        "restart_weights": Field(ListOf(float), default_doc="1.0 per period",
                                 doc="CosineAnnealingRestartLR: lr weight at each restart."),
        "eta_min": Field(float, check=at_least(0), default_doc="0.0 (CosineAnnealingRestartLR)",
                         doc="CosineAnnealingRestartLR: minimum lr."),
    },
    extra=True,
    rule=_scheduler_rule,
    doc="The schedule's arguments (checked against its signature; unset ones get its defaults).",
)

PIXEL_LOSS = Section(
    {
        "type": Field(str, required=True, expect="a registered pixel loss (L1Loss, MSELoss, CharbonnierLoss)",
                      doc="Pixel loss (LOSS_REGISTRY, role pixel)."),
        "loss_weight": Field(float, default=1.0, check=at_least(0), doc="Weight of this loss."),
        "reduction": Field(str, default="mean", choices=("mean", "sum"), doc="Reduction over pixels."),
        "eps": Field(float, check=greater_than(0), default_doc="1e-12 (CharbonnierLoss only)",
                     doc="CharbonnierLoss epsilon."),
    },
    extra=True,
    rule=_loss_rule("pixel"),
)


def _perceptual_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    _existing(out, "vgg_weights_path", path, ctx, kind="file")
    _loss_rule("perceptual", not_arguments=("vgg_weights_path",))(out, path, ctx, key)


PERCEPTUAL_LOSS = Section(
    {
        "type": Field(str, required=True, doc="Loss class in LOSS_REGISTRY (PerceptualLoss)."),
        "vgg_weights_path": Field((str, None), default=None,
                                  doc="torchvision's vgg19 state dict (.pth or .safetensors), an existing file; "
                                      "required by GAN models with a perceptual loss (no download happens)."),
    },
    extra=True,
    rule=_perceptual_rule,
    doc="Perceptual loss: `type`, `vgg_weights_path` and the loss's own arguments (layer_weights, ...).",
)

GAN_LOSS = Section(
    {"type": Field(str, required=True, doc="Loss class in LOSS_REGISTRY (GANLoss).")},
    extra=True,
    rule=_loss_rule("gan"),
    doc="GAN loss: `type` and the loss's arguments (gan_type, real_label_val, fake_label_val, loss_weight).",
)

TRAIN = Section(
    {
        "total_iter": Field(int, required=True, check=at_least(1), expect=_NUM_FREQ,
                            doc="Iterations to train."),
        "warmup_iter": Field(int, default=-1, check=at_least(-1),
                             doc="Linear lr warm-up iterations (-1: none)."),
        "ema_decay": Field(float, default=0.0, check=between(0, 1, high_open=True),
                           doc="EMA of the generator weights (0: off; BasicSR uses 0.999)."),
        "precision": Field(str, default="auto", choices=PRECISION_CHOICES,
                           doc="Autocast precision. auto: CUDA compute capability >= 8.0 and TPUs bf16; CPUs "
                               "with AVX512-BF16 or AMX: fp32 or bf16, whichever the network runs faster (timed "
                               "once, cached); other devices fp32; fp16 only when asked for (CUDA). The choice and "
                               "its reason are logged and kept in summary.json."),
        "compile": Field(bool, default=False, doc="torch.compile the network (cpu and cuda)."),
        "channels_last": Field((bool, str), default="auto", check=_auto_or_bool, expect="'auto' | bool",
                               doc="Keep conv weights and image batches in NHWC (channels_last) memory: the same "
                                   "results to float rounding. auto: CPUs time NCHW and NHWC on the network; CUDA "
                                   "on in bf16/fp16; off on MPS; XLA lays out memory itself."),
        "grad_clip_norm": Field((float, None), default=None, check=greater_than(0),
                                doc="Clip the gradient norm (null: no clipping)."),
        "accumulate": Field(int, default=1, check=at_least(1),
                            doc="Gradient accumulation steps per iteration."),
        "optim_g": Field(OPTIM, required=True, doc="Generator optimizer."),
        "scheduler": Field((SCHEDULER, None), default=None, doc="Learning-rate schedule (null: constant)."),
        "pixel_opt": Field((PIXEL_LOSS, None), default=None, doc="Pixel loss."),
        "perceptual_opt": Field((PERCEPTUAL_LOSS, None), default=None,
                                doc="Perceptual loss ({type: PerceptualLoss, layer_weights: ..., ...})."),
        "gan_opt": Field((GAN_LOSS, None), default=None, doc="GAN loss (GAN models)."),
        "net_d_iters": Field(int, default=1, check=at_least(1), doc="Discriminator update interval (GAN)."),
        "net_d_init_iters": Field(int, default=0, check=at_least(0), doc="Discriminator-only warm-up (GAN)."),
        "optim_d": Field((OPTIM, None), default=None, doc="Discriminator optimizer (GAN models)."),
        **VIDEO_TRAIN_FIELDS,
    },
    rule=_train_rule,
    doc="Required when training. At least one loss (pixel_opt, perceptual_opt, gan_opt) must be set.",
)

METRIC = Section(
    {
        "type": Field(str, required=True, expect="a registered metric (calculate_psnr, calculate_ssim, ...)",
                      doc="Metric (METRIC_REGISTRY: BasicSR's names and short ones)."),
        "crop_border": Field(int, check=at_least(0), default_doc="scale",
                             doc="Pixels cropped at each border."),
        "test_y_channel": Field(bool, default=False, doc="Measure on the Y channel (colour images)."),
        "better": Field(str, choices=("higher", "lower"),
                        default_doc="the metric's: lower for niqe, lpips, dists and fid, higher for psnr and ssim",
                        doc="Which direction is better (the best value and its checkpoint are tracked that way)."),
        "convert_to": Field(str, choices=("y", "gray"), default_doc="y (niqe only)",
                            doc="NIQE: measure MATLAB's BT.601 Y or OpenCV's full-range gray of colour images."),
        "net": Field(str, choices=("alex", "vgg"), default_doc="alex (lpips only)",
                     doc="LPIPS backbone: alex (the paper's default) or vgg."),
        "weights": Field((str, ListOf(str, min_len=1), None), default=None,
                         doc="LPIPS, DISTS, FID: weight file(s) (.pth or .safetensors), existing files, required "
                             "by those metrics (nothing is downloaded). LPIPS: torchvision's alexnet / vgg16 and "
                             "the lpips head (alex.pth / vgg.pth); DISTS: torchvision's vgg16 and DISTS' "
                             "weights.pt; FID: pt_inception-2015-12-05-6726825d.pth."),
        "stats": Field((str, None), default=None,
                       doc="FID: reference statistics (pytorch-fid .npz with mu / sigma, or BasicSR's .pth with "
                           "mean / cov); null: the dataset's ground-truth images are the reference."),
    },
    rule=_metric_rule,
    doc="One metric: `type` (METRIC_REGISTRY) and its settings; keys a metric does not read are refused.",
)

VAL = Section(
    {
        "val_freq": Field((int, None), default=None, check=at_least(1), expect=_NUM_FREQ + " | null",
                          doc="Validate every N iterations; required when training with a val section."),
        "save_img": Field(bool, default=False, doc="Save the output images."),
        "suffix": Field((str, None), default=None, doc="Suffix of saved image names."),
        "tile": Field((int, None), default=None, check=at_least(1),
                      doc="Tile size (LQ pixels) for tiled inference; null: whole image."),
        "tile_pad": Field(int, default=10, check=at_least(0), doc="Overlap (LQ pixels) around each tile."),
        "pbar": Field(bool, default=False, doc="Show a progress bar."),
        "log_images": Field(int, default=8, check=at_least(0),
                            doc="Validation images per dataset (the first ones) whose fixed centre crop (LQ, "
                                "result and ground truth, 128 pixels) goes to TensorBoard and report.html at each "
                                "validation (0: none)."),
        "metrics": Field((MapOf(METRIC), None), default=None,
                         doc="Named metrics, e.g. psnr: {type: calculate_psnr}."),
        **VIDEO_VAL_FIELDS,
        "use_chop": Field(bool, keep=False,
                          doc="Accepted (the DAT authors' memory-saving split test) and ignored; val.tile does that."),
    },
    rule=_val_rule,
)

TILE = Section({
    "tile_size": Field(int, required=True, check=at_least(1), doc="Tile size (LQ pixels): val.tile."),
    "tile_pad": Field(int, default=10, check=at_least(0), doc="Overlap (LQ pixels): val.tile_pad."),
})

WANDB = Section({
    "project": Field((str, None), default=None, doc="wandb project (null: wandb off)."),
    "resume_id": Field((str, None), default=None, doc="wandb run id to resume."),
    "entity": Field((str, None), default=None, doc="wandb entity."),
})

LOGGER = Section({
    "print_freq": Field(int, default=100, check=at_least(1), expect=_NUM_FREQ, doc="Log every N iterations."),
    "save_checkpoint_freq": Field(int, default=5000, check=at_least(1), expect=_NUM_FREQ,
                                  doc="Save weights and training state every N iterations."),
    "use_tb_logger": Field(bool, default=True,
                           doc="Write TensorBoard logs to <experiments_root>/tb_logger (needs anysr[tensorboard]); "
                               "view them with tensorboard --logdir experiments."),
    "save_pth": Field(bool, default=False, doc="Also write BasicSR .pth weights (same as 'pth' in save_format)."),
    "save_format": Field(ListOf(str), default=["safetensors"], check=_save_formats,
                         expect=f"list of {', '.join(SAVE_FORMATS)}",
                         doc="Weights written at every save, as models/net_g_<iter>.<format> (and net_g_latest.*): "
                             "safetensors (always: anysr's file, both groups, rebuild metadata), pth (BasicSR's "
                             "{params, params_ema}), plain.pth / plain.safetensors (one bare state dict, the EMA "
                             "weights when there are, for chaiNNer / ComfyUI / spandrel; as `anysr export`)."),
    "keep_last": Field((int, None), default=3, check=at_least(1),
                       doc="Training states to keep (null: all)."),
    "wandb": Field(WANDB, default={}, doc="Weights & Biases."),
})

DIST_PARAMS = Section({
    "backend": Field((str, None), default=None, choices=(None, "nccl", "gloo"),
                     doc="Process-group backend (null: chosen per accelerator)."),
    "port": Field((int, None), default=None, check=between(1, 65535),
                  doc="Rendezvous port (null: a free one)."),
})

XLA = Section({"spmd": Field(bool, default=False, doc="XLA SPMD: one process drives all local devices.")})

OPTIONS = Section(
    {
        "name": Field(str, required=True,
                      check=Check(_valid_name, f"a non-empty name without '/' of at most {MAX_NAME_BYTES} bytes "
                                  "(it names the output folder)"),
                      expect="str (no '/')", doc="Experiment name."),
        "model_type": Field(str, default="SRModel", doc="Model class in MODEL_REGISTRY."),
        "scale": Field(int, required=True, check=between(1, 8), doc="Upscaling factor."),
        "num_gpu": Field((int, str), default="auto", check=_num_gpu, expect="'auto' | int >= 0",
                         doc="Devices (or CPU ranks) to use; auto: all visible."),
        "accelerator": Field(str, default="auto", choices=ACCELERATORS, doc="Device kind.",
                             hints=ACCELERATOR_HINTS),
        "manual_seed": Field(int, default=0, check=at_least(0), doc="Random seed."),
        "is_train": Field(bool, default_doc="the is_train argument", doc="Set by the loader."),
        "dist": Field(bool, keep=False, doc="Accepted (BasicSR) and ignored."),
        "find_unused_parameters": Field(bool, default=False, doc="DDP find_unused_parameters."),
        "use_static_graph": Field(bool, default=False, doc="DDP static_graph."),
        "launcher": Field((str, None), default=None, choices=(None, *LAUNCHERS),
                          doc="Accepted; the command line's --launcher decides."),
        "xla": Field(XLA, default={}, doc="XLA settings."),
        "datasets": Field(MapOf(DATASET, key_check=_dataset_key), default={}, doc="Datasets by name."),
        "network_g": Field(NETWORK_G, required=True, doc="Generator network."),
        "network_d": Field((NETWORK_D, None), default=None, doc="Discriminator network (GAN models)."),
        "path": Field(PATH, default={}, doc="Input weights and output folders."),
        "train": Field((TRAIN, None), default=None, doc="Training settings (required when training)."),
        "val": Field((VAL, None), default=None, doc="Validation / test settings (null: no validation)."),
        "tile": Field((TILE, None), default=None,
                      doc="The HAT / DRCT authors' tiled test ({tile_size, tile_pad}): sets val.tile and "
                          "val.tile_pad."),
        "logger": Field(LOGGER, default={}, doc="Logging and checkpoint frequency."),
        "dist_params": Field(DIST_PARAMS, default={}, doc="Distributed settings."),
        **REALESRGAN_FIELDS,
    },
    refused={
        "rank": "is set by the launcher, remove it",
        "world_size": "is set by the launcher, remove it",
    },
    rule=_top_rule,
)


def validate(opt: dict[str, Any], *, is_train: bool, root: Path,
             check_paths: bool = True) -> tuple[dict[str, Any], list[str]]:
    """Validate a whole option dict: ``(result, problems)``; the result is meaningful without problems.

    ``check_paths=False`` resolves input paths without requiring them to exist (for commands that read none).
    """
    ctx = Context(is_train=is_train, root=root, check_paths=check_paths)
    scale = opt.get("scale")
    if not isinstance(scale, bool) and isinstance(scale, (int, float, str)):
        value = validate_field(OPTIONS.fields["scale"], scale, "scale", Context(is_train=is_train, root=root))
        ctx.scale = value if isinstance(value, int) else None
    paths = opt.get("path")
    if isinstance(paths, dict) and isinstance(paths.get("root"), str):
        ctx.root = resolve_path(paths["root"], root)
    result = validate_section(OPTIONS, opt, "", ctx)
    return result, ctx.problems

"""``anysr infer`` and ``anysr test``: upscale images, or score a network on the test datasets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from anysr.accelerators import Accelerator
from anysr.archs import build_network
from anysr.data import build_dataset, build_eval_loader
from anysr.data.imageio import read_image, write_image
from anysr.data.transforms import img2tensor
from anysr.engine import checkpoint as ckpt
from anysr.engine.evaluator import EvalResult, evaluate, run_network
from anysr.engine.logger import get_logger, setup_logging
from anysr.errors import DataError, OptionError
from anysr.models import build_model

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")


def network_scale(net: nn.Module, default: int | None = None) -> int | None:
    """The upscaling factor a network declares (``upscale`` or ``scale`` attribute), else ``default``."""
    for attr in ("upscale", "scale"):
        value = getattr(net, attr, None)
        if isinstance(value, int):
            return value
    return default


def list_images(path: Path) -> list[Path]:
    """The images in a folder (sorted), or the single file given."""
    if not path.exists():
        raise DataError(f"-i {path}: no such file or folder")
    if path.is_file():
        return [path]
    files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise DataError(f"-i {path}: the folder holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return files


def _to_float(img: np.ndarray) -> tuple[np.ndarray, bool, int]:
    """uint8 / uint16 image -> (float32 BGR HWC in [0,1], was_gray, max value)."""
    maxval = 65535 if img.dtype == np.uint16 else 255
    gray = img.ndim == 2
    if gray:
        img = np.repeat(img[:, :, None], 3, axis=2)
    elif img.shape[2] == 4:
        get_logger().warning("alpha channel dropped (only the colour channels are upscaled)")
        img = img[:, :, :3]
    return img.astype(np.float32) / maxval, gray, maxval


def output_paths(files: list[Path], out_dir: Path, suffix: str | None) -> list[Path]:
    """Where each input's result goes; refuses to overwrite an input or to write two results to one file."""
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"-o {out_dir}: exists and is not a folder; give a folder for the results")
    outs = [out_dir / (f"{p.stem}_{suffix}.png" if suffix else f"{p.stem}.png") for p in files]
    inputs = {p.resolve() for p in files}
    seen: dict[Path, Path] = {}
    for src, dst in zip(files, outs):
        if dst.resolve() in inputs:
            raise DataError(f"-o {out_dir}: the result of {src} would overwrite the input {dst}; "
                            "choose another output folder or pass --suffix")
        if dst in seen:
            raise DataError(f"{seen[dst]} and {src} would both be written to {dst}; rename one, or run them "
                            "separately")
        seen[dst] = src
    return outs


def _input_channels(net: nn.Module) -> int | None:
    """Channels the network's first convolution expects (None when it has none, e.g. Bicubic)."""
    for module in net.modules():
        if isinstance(module, nn.Conv2d):
            return int(module.in_channels)
    return None


def infer_worker(acc: Accelerator, net: nn.Module, files: list[Path], out_dir: Path, scale: int,
                 tile: int | None, tile_pad: int, suffix: str | None) -> list[Path]:
    """Upscale ``files`` one by one on ``acc`` and write PNGs into ``out_dir``.

    Grayscale inputs stay grayscale; 16-bit inputs give 16-bit results (not rounded to 8 bits); a one-channel
    network takes grayscale images.
    """
    from tqdm import tqdm  # noqa: PLC0415

    log = setup_logging(enabled=acc.is_main)
    log.info("anysr infer on %s; %s", acc.describe(), acc.describe_choices())
    for warning in acc.choice_warnings():
        log.warning(warning)
    outs = output_paths(files, out_dir, suffix)
    in_ch = _input_channels(net)
    net = acc.prepare_model(net).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path, dst in tqdm(list(zip(files, outs))[acc.rank::acc.world_size], desc="infer", disable=not acc.is_main,
                          dynamic_ncols=True):
        img, gray, maxval = _to_float(read_image(path, flag="unchanged"))
        x = img2tensor(img).unsqueeze(0)
        if in_ch == 1:
            if not gray:
                raise DataError(f"{path}: this network takes one channel (grayscale / Y); give grayscale images")
            x = x[:, :1]
        out = run_network(net, acc.to_device(x), acc, scale=scale, tile=tile, tile_pad=tile_pad)
        host = acc.to_host(out.clamp(0, 1))[0]
        if host.shape[0] == 1:
            host = host.expand(3, -1, -1)
        rgb = host.permute(1, 2, 0).numpy()[:, :, ::-1]  # RGB CHW -> BGR HWC, float in [0, 1]
        if gray:
            rgb = rgb[:, :, 0] * 0.114 + rgb[:, :, 1] * 0.587 + rgb[:, :, 2] * 0.299
        result = np.ascontiguousarray(np.round(rgb * maxval).clip(0, maxval).astype(
            np.uint16 if maxval == 65535 else np.uint8))
        write_image(dst, result)
        written.append(dst)
    acc.barrier()
    return written


def build_inference_net(*, weights: str | None, arch: str | None, arch_opts: dict[str, Any],
                        network_opt: dict[str, Any] | None, scale: int | None, param_key: str,
                        strict: bool = True) -> tuple[nn.Module, int]:
    """The network and its scale from ``--arch`` (+ options), an options file, or the weights' own metadata."""
    log = get_logger()
    if arch == "bicubic" or (arch or "").lower() == "bicubic":
        if not scale:
            raise OptionError("--arch bicubic needs --scale")
        return build_network({"type": "Bicubic", "upscale": scale}), scale
    meta: dict[str, Any] = {}
    state = None
    if weights:
        state, meta = ckpt.load_weights(weights, param_key)
    if arch:
        net_opt = {"type": arch, **arch_opts}
    elif network_opt is not None:
        net_opt = dict(network_opt)
    elif meta.get("network_g"):
        net_opt = dict(meta["network_g"])
        log.info("network rebuilt from the weights' metadata: %s", net_opt.get("type"))
    else:
        raise OptionError("no network given: pass --arch NAME [--arch-opt k=v ...] or -opt FILE.yml "
                          "(the weights file has no anysr metadata to rebuild it from)")
    net = build_network(net_opt, key_path="--arch-opt" if arch else "network_g")
    if state is not None:
        ckpt.load_into(net, state, strict=strict, source=str(weights))
    elif any(True for _ in net.parameters()):
        raise OptionError("--weights is required for a network with parameters")
    net_scale = network_scale(net, meta.get("scale"))
    if scale and net_scale and scale != net_scale:
        raise OptionError(f"--scale {scale} but the network upscales x{net_scale}; drop --scale or fix it")
    final = scale or net_scale
    if not final:
        raise OptionError("cannot tell the network's scale: pass --scale")
    return net, int(final)


def test_worker(acc: Accelerator, opt: dict[str, Any]) -> dict[str, Any]:
    """``anysr test``: every test dataset through the network, metrics reduced over ranks, summary.json."""
    results_root = Path(opt["path"]["results_root"])
    if acc.is_main:
        results_root.mkdir(parents=True, exist_ok=True)
    setup_logging(results_root / "test.log", enabled=acc.is_main)
    log = get_logger()
    acc.manual_seed(int(opt.get("manual_seed", 0)))
    model = build_model(opt, acc)
    pre = opt["path"].get("pretrain_network_g")
    if pre:
        key = opt["path"].get("param_key_g", "params")
        sd, _ = ckpt.load_weights(pre, key)
        strict = bool(opt["path"].get("strict_load_g", True))
        model.load_pretrained(sd, lambda net, s: ckpt.load_into(net, s, strict=strict, source=str(pre)))
    elif any(True for _ in model.nets["net_g"].parameters()):
        raise OptionError("path.pretrain_network_g: a test needs trained weights; set it to a .safetensors or .pth")
    model.setup()
    net = model.inference_net()
    val = opt.get("val") or {}
    scale = int(opt["scale"])
    summary: dict[str, Any] = {"name": opt["name"], "weights": pre, "accelerator": acc.plan.accelerator,
                               "world_size": acc.world_size, "precision": acc.precision,
                               "choices": {k: c.as_dict() for k, c in acc.choices.items()}, "datasets": {}}
    log.info("anysr test '%s' on %s; %s", opt["name"], acc.describe(), acc.describe_choices())
    for warning in acc.choice_warnings():
        log.warning(warning)
    for key, dopt in opt["datasets"].items():
        if not key.startswith(("test", "val")):
            continue
        name = dopt.get("name", key)
        ds = build_dataset(dopt, f"datasets.{key}")
        loader, _ = build_eval_loader(ds, dopt, world_size=acc.world_size, rank=acc.rank)
        save_dir = results_root / "visualization" / name if val.get("save_img", True) else None
        if save_dir is not None and acc.is_main:
            save_dir.mkdir(parents=True, exist_ok=True)
        acc.barrier()
        res = evaluate(net, loader, acc, dataset=name, scale=scale, metrics_opt=val.get("metrics"),
                       tile=val.get("tile"), tile_pad=int(val.get("tile_pad", 10)), save_dir=save_dir,
                       suffix=val.get("suffix"), progress=True, phase="test")
        _log_result(res)
        summary["datasets"][name] = {"n": res.count, **res.metrics, "images": res.images}
    summary["stats"] = acc.stats()
    if acc.is_main:
        ckpt.atomic_write_bytes(results_root / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
        log.info("wrote %s", results_root / "summary.json")
    return summary


def _log_result(res: EvalResult) -> None:
    log = get_logger()
    if res.images:
        keys = [k for k in res.images[0] if k != "name"]
        log.info("%-20s %s", "image", " ".join(f"{k:>16}" for k in keys))
        for row in res.images:
            log.info("%-20s %s", row["name"], " ".join(f"{row[k]:16.4f}" for k in keys))
    avg = " ".join(f"{k}={v:.4f}" for k, v in res.metrics.items())
    log.info("%s: average %s n=%d", res.dataset, avg, res.count)


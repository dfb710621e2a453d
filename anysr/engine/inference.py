"""``anysr infer`` and ``anysr test``: upscale images, or score a network on the test datasets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from anysr.accelerators import Accelerator
from anysr.archs import build_network
from anysr.archs.arch_util import input_channels
from anysr.data.imageio import IMAGE_EXTENSIONS, list_images, read_image, write_image
from anysr.engine import checkpoint as ckpt
from anysr.engine.evaluator import CALIBRATION_SIDE, run_network
from anysr.engine.logger import get_logger, log_start, setup_logging
from anysr.errors import DataError, OptionError
from anysr.ops.color import LUMA_RGB
from anysr.ops.tiling import plan_tiles
from anysr.registry import plain_options


def network_scale(net: nn.Module, default: int | None = None) -> int | None:
    """The upscaling factor a network declares (``upscale`` or ``scale`` attribute), else ``default``."""
    for attr in ("upscale", "scale"):
        value = getattr(net, attr, None)
        if isinstance(value, int):
            return value
    return default


def list_inputs(path: Path) -> list[Path]:
    """``-i``: the images in a folder (sorted), or the single file given."""
    if not path.exists():
        raise DataError(f"-i {path}: no such file or folder")
    if path.is_file():
        return [path]
    files = list_images(path)
    if not files:
        raise DataError(f"-i {path}: the folder holds no images ({', '.join(IMAGE_EXTENSIONS)})")
    return files


@dataclass(frozen=True)
class _Pixels:
    """How an input image's values map to [0, 1] and how results are stored."""

    in_max: float  # 255, 65535, or 1.0 for float images
    out_max: int  # 255 or 65535
    out_dtype: Any
    gray: bool


def _pixels(img: np.ndarray, path: Path) -> tuple[np.ndarray, _Pixels]:
    """The colour channels of an input (HW gray or HWC BGR, as stored) and its value mapping.

    8-bit gives 8-bit results, 16-bit 16-bit; float images (TIFF/EXR) must hold values in [0, 1] and give 16-bit
    PNGs. An alpha channel is dropped (with a warning).
    """
    if img.dtype == np.uint8:
        px = _Pixels(255.0, 255, np.uint8, img.ndim == 2)
    elif img.dtype == np.uint16:
        px = _Pixels(65535.0, 65535, np.uint16, img.ndim == 2)
    elif img.dtype in (np.float32, np.float64):
        lo, hi = float(np.nanmin(img)), float(np.nanmax(img))
        if not (np.isfinite(img).all() and lo >= 0.0 and hi <= 1.0):
            raise DataError(f"{path}: a floating-point image with values from {lo:g} to {hi:g}; anysr reads float "
                            "images as values in [0, 1]: rescale it to [0, 1], or convert it to an 8/16-bit PNG")
        px = _Pixels(1.0, 65535, np.uint16, img.ndim == 2)
    else:
        raise DataError(f"{path}: unsupported pixel type {img.dtype}; give 8- or 16-bit images (or float in [0, 1])")
    if img.ndim == 3 and img.shape[2] == 4:
        get_logger().warning("%s: alpha channel dropped (only the colour channels are upscaled)", path)
        img = img[:, :, :3]
    elif img.ndim == 3 and img.shape[2] == 1:
        img, px = img[:, :, 0], _Pixels(px.in_max, px.out_max, px.out_dtype, True)
    return img, px


def _to_input(window: np.ndarray, px: _Pixels, channels: int, acc: Accelerator) -> torch.Tensor:
    """An HW / HWC-BGR window (as stored) -> a (1, C, h, w) float RGB tensor in [0, 1] on the device."""
    t = acc.to_device(torch.from_numpy(np.ascontiguousarray(window)))  # the stored (small) type crosses
    t = t.float() / px.in_max
    t = t[None] if t.ndim == 2 else t.permute(2, 0, 1).flip(0)  # gray: (1, h, w); colour: BGR HWC -> RGB CHW
    if t.shape[0] == 1 and channels == 3:
        t = t.expand(3, -1, -1)
    return t.unsqueeze(0)


def _to_stored(out: torch.Tensor, px: _Pixels, acc: Accelerator) -> np.ndarray:
    """A (1, C, h, w) float result -> the stored form (HW gray or HWC BGR, 8/16-bit), rounded on the device."""
    out = out[0].float().clamp(0, 1)
    if out.shape[0] == 3 and px.gray:
        wr, wg, wb = LUMA_RGB
        out = (out[2] * wb + out[1] * wg) + out[0] * wr  # full-range luma
    elif out.shape[0] == 3:
        out = out.flip(0).permute(1, 2, 0)  # RGB CHW -> BGR HWC
    else:
        out = out[0]
    q = torch.round(out * px.out_max).clamp(0, px.out_max).to(torch.int32)
    return acc.to_host(q).numpy().astype(px.out_dtype)


def upscale_image(net: nn.Module, img: np.ndarray, px: _Pixels, acc: Accelerator, *, scale: int, tile: int | None,
                  tile_pad: int, channels: int, path: Path) -> np.ndarray:
    """``img`` (as stored) through ``net``; the result in the stored form.

    With ``tile``, tiles stream into the integer output buffer: memory is one tile plus the input and output
    images themselves, whatever the image size. Without, the whole image goes through at once.
    """
    h, w = img.shape[:2]
    if not tile or (h <= tile and w <= tile and not acc.static_shapes):
        try:
            out = run_network(net, _to_input(img, px, channels, acc), acc, scale=scale, tile=None, tile_pad=0)
        except (MemoryError, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and not _out_of_memory(exc):
                raise
            raise DataError(f"{path}: out of memory upscaling a {w}x{h} image in one piece; use --tile 512 (or "
                            "smaller): tiles bound the memory whatever the image size") from None
        return _to_stored(out, px, acc)
    if acc.static_shapes and (h < tile + 2 * tile_pad or w < tile + 2 * tile_pad):
        # smaller than one window: padded to it by tile_forward, so XLA still sees its one shape
        return _to_stored(run_network(net, _to_input(img, px, channels, acc), acc, scale=scale, tile=tile,
                                      tile_pad=tile_pad), px, acc)
    plan = plan_tiles(h, w, tile, tile_pad)
    result: np.ndarray | None = None
    for oy, ox, wy, wx in plan.jobs:
        window = img[wy:wy + plan.win_h, wx:wx + plan.win_w]
        piece = _to_stored(run_network(net, _to_input(window, px, channels, acc), acc, scale=scale, tile=None,
                                       tile_pad=0), px, acc)
        if result is None:
            result = np.empty((h * scale, w * scale, *piece.shape[2:]), dtype=piece.dtype)
        ry, rx = (oy - wy) * scale, (ox - wx) * scale
        result[oy * scale:(oy + plan.tile_h) * scale, ox * scale:(ox + plan.tile_w) * scale] = \
            piece[ry:ry + plan.tile_h * scale, rx:rx + plan.tile_w * scale]
    assert result is not None
    return result


def _out_of_memory(exc: RuntimeError) -> bool:
    text = str(exc)
    return isinstance(exc, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in text \
        or "can't allocate memory" in text or "not enough memory" in text


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


def infer_worker(acc: Accelerator, net: nn.Module, files: list[Path], out_dir: Path, scale: int,
                 tile: int | None, tile_pad: int, suffix: str | None) -> list[Path]:
    """Upscale ``files`` one by one on ``acc`` and write PNGs into ``out_dir``.

    Grayscale inputs stay grayscale; 16-bit inputs give 16-bit results (not rounded to 8 bits); a one-channel
    network takes grayscale images.
    """
    from tqdm import tqdm  # noqa: PLC0415

    setup_logging(enabled=acc.is_main)
    outs = output_paths(files, out_dir, suffix)
    in_ch = input_channels(net, default=None)
    side = tile + 2 * tile_pad if tile else CALIBRATION_SIDE
    acc.calibrate(net.eval(), (1, in_ch or 3, side, side), train=False)
    log_start("infer", acc)
    net = acc.prepare_model(net).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path, dst in tqdm(list(zip(files, outs))[acc.rank::acc.world_size], desc="infer", disable=not acc.is_main,
                          dynamic_ncols=True):
        img, px = _pixels(read_image(path, flag="unchanged"), path)
        if in_ch == 1 and not px.gray:
            raise DataError(f"{path}: this network takes one channel (grayscale / Y); give grayscale images")
        result = upscale_image(net, img, px, acc, scale=scale, tile=tile, tile_pad=tile_pad,
                               channels=1 if in_ch == 1 else 3, path=path)
        del img
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
        state, meta = ckpt.load_weights(weights, param_key, key_option="--param-key")
    if arch:
        net_opt = {"type": arch, **arch_opts}
    elif network_opt is not None:
        net_opt = plain_options(network_opt)
    elif "network_g" in meta:
        net_opt = dict(meta["network_g"])
        log.info("network rebuilt from the weights' metadata: %s", net_opt["type"])
    else:
        raise OptionError("no network given: pass --arch NAME [--arch-opt k=v ...] or -opt FILE.yml "
                          "(the weights file has no anysr metadata to rebuild it from)")
    net = build_network(net_opt, key_path="--arch-opt" if arch else "network_g")
    if state is not None:
        ckpt.load_into(net, state, strict=strict, source=str(weights),
                       fix="check --arch and --arch-opt (or the -opt file's network_g) against the file")
    elif any(True for _ in net.parameters()):
        raise OptionError("--weights is required for a network with parameters")
    net_scale = network_scale(net, meta["scale"] if "scale" in meta else None)
    if scale and net_scale and scale != net_scale:
        raise OptionError(f"--scale {scale} but the network upscales x{net_scale}; drop --scale or fix it")
    final = scale or net_scale
    if not final:
        raise OptionError("cannot tell the network's scale: pass --scale")
    return net, int(final)

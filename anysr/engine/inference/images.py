"""``anysr infer``: upscale images with a trained network (streamed tiles, alpha, any final scale, DNI)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from anysr.accelerators import Accelerator
from anysr.archs.arch_util import input_channels
from anysr.atomic import file_name_part_problem
from anysr.data.imageio import (
    IMAGE_EXTENSIONS,
    ImageInfo,
    list_images,
    probe_image,
    read_image,
    subfolder_hint,
    write_image,
)
from anysr.engine.evaluation.forward import CALIBRATION_SIDE, calibration_side, run_network
from anysr.engine.logger import get_logger, log_start, setup_logging
from anysr.engine.prepare.command import check_images
from anysr.errors import DataError, OptionError
from anysr.ops.color import LUMA_RGB
from anysr.ops.imresize import resize_taps, resize_weights
from anysr.ops.tiling import aligned_tile, padded_index, plan_tiles, round_up, tile_multiple

RESIZE_METHODS = ("bicubic", "area", "cubic", "lanczos")  # bicubic: MATLAB-exact (antialiased when shrinking)
ALPHA_MODES = ("network", "bicubic")
EXT_CHOICES = ("png", "auto", "jpg", "webp", "tif", "bmp")
_CV2_RESIZE = {"area": cv2.INTER_AREA, "cubic": cv2.INTER_CUBIC, "lanczos": cv2.INTER_LANCZOS4}
# What each output format holds: 16-bit samples, an alpha channel.
_FORMATS = {".png": (True, True), ".tif": (True, True), ".webp": (False, True), ".jpg": (False, False),
            ".bmp": (False, False)}
_NORMAL_EXT = {".jpeg": ".jpg", ".tiff": ".tif", ".ppm": ".png", ".pgm": ".png"}


def list_inputs(path: Path) -> list[Path]:
    """``-i``: the images in a folder (sorted, hidden files left out), or the single file given."""
    if not path.exists():
        raise DataError(f"-i {path}: no such file or folder")
    if path.is_file():
        return [path]
    files = list_images(path)
    if not files:
        raise DataError(f"-i {path}: the folder holds no images ({', '.join(IMAGE_EXTENSIONS)}){subfolder_hint(path)}")
    return files


def probe_inputs(files: list[Path]) -> list[ImageInfo]:
    """Every input's header, read before any work: an unreadable file is refused before a result is written,
    not midway through the folder."""
    try:
        return check_images(files, progress=False, desc="check inputs")
    except DataError as exc:
        raise DataError(f"-i: {exc}") from None


@dataclass(frozen=True)
class InferSettings:
    """What ``anysr infer`` does around the network: tiles, the final scale, the alpha channel, the file format.

    ``outscale``: the final scale (None: the network's), reached by resizing the network's result with ``resize``
    (``bicubic``: MATLAB-exact, antialiased when shrinking; ``area`` / ``cubic`` / ``lanczos``: OpenCV's).
    ``alpha``: an alpha channel goes through the ``network`` (as a gray image) or is resized ``bicubic``.
    ``ext``: ``png``, ``auto`` (the input's format) or a format; one that cannot hold a result (16 bits in JPEG or
    WebP, alpha in JPEG or BMP) gives a PNG instead, with a warning.
    """

    scale: int
    tile: int | None = None
    tile_pad: int = 10
    suffix: str | None = None
    outscale: float | None = None
    resize: str = "bicubic"
    ext: str = "png"
    alpha: str = "network"
    progress: bool = True

    def output_size(self, h: int, w: int) -> tuple[int, int]:
        """The result's (height, width) for an ``h`` x ``w`` input: ``int(side * outscale)`` as Real-ESRGAN."""
        if self.outscale is None:
            return h * self.scale, w * self.scale
        return max(1, int(h * self.outscale + 1e-6)), max(1, int(w * self.outscale + 1e-6))


@dataclass(frozen=True)
class _Pixels:
    """How an input image's values map to [0, 1] and how results are stored."""

    in_max: float  # 255, 65535, or 1.0 for float images
    out_max: int  # 255 or 65535
    out_dtype: Any
    gray: bool


def _pixels(img: np.ndarray, path: Path) -> tuple[np.ndarray, np.ndarray | None, _Pixels]:
    """The colour channels of an input (HW gray or HWC BGR, as stored), its alpha plane (or None) and its value
    mapping. 8-bit gives 8-bit results, 16-bit 16-bit; float images (TIFF/EXR) must hold values in [0, 1] and
    give 16-bit results."""
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
    alpha = None
    if img.ndim == 3 and img.shape[2] == 4:
        img, alpha = img[:, :, :3], img[:, :, 3]
    elif img.ndim == 3 and img.shape[2] == 2:  # gray + alpha
        img, alpha = img[:, :, 0], img[:, :, 1]
    elif img.ndim == 3 and img.shape[2] == 1:
        img = img[:, :, 0]
    if img.ndim == 2 and not px.gray:
        px = _Pixels(px.in_max, px.out_max, px.out_dtype, True)
    return img, alpha, px


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


def _window(img: np.ndarray, rows: np.ndarray, cols: np.ndarray, y: int, x: int, h: int, w: int) -> np.ndarray:
    """``img[y:y+h, x:x+w]`` of the image padded through the ``rows`` / ``cols`` index maps (a view when the
    window lies inside the image)."""
    if y + h <= img.shape[0] and x + w <= img.shape[1]:
        return img[y:y + h, x:x + w]
    return img[rows[y:y + h]][:, cols[x:x + w]]


def upscale_image(net: nn.Module, img: np.ndarray, px: _Pixels, acc: Accelerator, *, scale: int, tile: int | None,
                  tile_pad: int, channels: int, path: Path,
                  on_tile: Callable[[int, int], None] | None = None) -> np.ndarray:
    """``img`` (as stored) through ``net``; the result in the stored form.

    With ``tile``, tiles stream into the integer output buffer: memory is one tile plus the input and output
    images themselves, whatever the image size. Without, the whole image goes through at once. Tile and pad are
    rounded up to the network's ``tile_multiple``, and windows past the image's bottom / right read it padded as
    the network pads, so every tile lies on the network's window grid (``ops.tiling``). ``on_tile(done, total)``
    is called after each tile.
    """
    h, w = img.shape[:2]
    multiple = tile_multiple(net)
    if tile:
        tile, tile_pad = aligned_tile(tile, tile_pad, multiple)
    hp, wp = round_up(h, multiple), round_up(w, multiple)
    if not tile or (hp <= tile and wp <= tile and not acc.static_shapes):
        try:
            out = run_network(net, _to_input(img, px, channels, acc), acc, scale=scale, tile=None, tile_pad=0)
        except (MemoryError, RuntimeError) as exc:
            if isinstance(exc, RuntimeError) and not _out_of_memory(exc):
                raise
            raise DataError(f"{path}: out of memory upscaling a {w}x{h} image in one piece; use --tile 512 (or "
                            "smaller): tiles bound the memory whatever the image size") from None
        return _to_stored(out, px, acc)
    if acc.static_shapes and (hp < tile + 2 * tile_pad or wp < tile + 2 * tile_pad):
        # smaller than one window: padded to it by tile_forward, so XLA still sees its one shape
        return _to_stored(run_network(net, _to_input(img, px, channels, acc), acc, scale=scale, tile=tile,
                                      tile_pad=tile_pad), px, acc)
    plan = plan_tiles(hp, wp, tile, tile_pad)
    rows, cols = padded_index(h, hp), padded_index(w, wp)
    result: np.ndarray | None = None
    for k, (oy, ox, wy, wx) in enumerate(plan.jobs):
        window = _window(img, rows, cols, wy, wx, plan.win_h, plan.win_w)
        piece = _to_stored(run_network(net, _to_input(window, px, channels, acc), acc, scale=scale, tile=None,
                                       tile_pad=0), px, acc)
        if result is None:
            result = np.empty((h * scale, w * scale, *piece.shape[2:]), dtype=piece.dtype)
        ry, rx = (oy - wy) * scale, (ox - wx) * scale
        th, tw = min(plan.tile_h, h - oy) * scale, min(plan.tile_w, w - ox) * scale  # the last ones cropped
        if th > 0 and tw > 0:
            result[oy * scale:oy * scale + th, ox * scale:ox * scale + tw] = piece[ry:ry + th, rx:rx + tw]
        if on_tile is not None:
            on_tile(k + 1, len(plan.jobs))
    assert result is not None
    return result


def _out_of_memory(exc: RuntimeError) -> bool:
    text = str(exc)
    return isinstance(exc, getattr(torch, "OutOfMemoryError", ())) or "out of memory" in text \
        or "can't allocate memory" in text or "not enough memory" in text


# --------------------------------------------------------------------------------------------- around the network
def _resize_matlab(img: np.ndarray, out_h: int, out_w: int, out_max: int, block: int = 64) -> np.ndarray:
    """MATLAB ``imresize(img, [out_h out_w])`` (bicubic, antialiased when shrinking) of a stored 8/16-bit image,
    rounded back to its type; computed in float32 over blocks of output rows (memory: the result and a block)."""
    h, w = img.shape[:2]
    src_h, w_h = resize_taps(h, out_h / h, out_h)
    ww = resize_weights(w, out_w / w, out_w).astype(np.float32)
    out = np.empty((out_h, out_w, *img.shape[2:]), dtype=img.dtype)
    for r0 in range(0, out_h, block):
        r1 = min(r0 + block, out_h)
        rows = img[src_h[r0:r1]].astype(np.float32)  # (b, taps, w, ...)
        weights = w_h[r0:r1].astype(np.float32).reshape(r1 - r0, -1, *([1] * (img.ndim - 1)))
        part = (rows * weights).sum(axis=1)  # (b, w, ...)
        part = np.tensordot(part, ww, axes=([1], [1]))  # (b, ..., out_w)
        part = np.moveaxis(part, -1, 1)  # (b, out_w, ...)
        out[r0:r1] = np.clip(np.round(part), 0, out_max).astype(img.dtype)
    return out


def resize_result(img: np.ndarray, out_h: int, out_w: int, method: str, out_max: int) -> np.ndarray:
    """A stored result (HW / HWC, 8/16-bit) resized to ``out_h`` x ``out_w`` with ``method`` (``RESIZE_METHODS``)."""
    if img.shape[:2] == (out_h, out_w):
        return img
    if method == "bicubic":
        return _resize_matlab(img, out_h, out_w, out_max)
    return cv2.resize(img, (out_w, out_h), interpolation=_CV2_RESIZE[method])


def _merge_alpha(color: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """BGR (or gray) + alpha -> BGRA (a gray image is repeated in B, G and R: PNG writers take 1, 3 or 4
    channels)."""
    if color.ndim == 2:
        color = np.repeat(color[:, :, None], 3, axis=2)
    return np.concatenate([color, alpha[:, :, None]], axis=2)


def _output_ext(src: Path, ext: str, alpha: bool, deep: bool) -> tuple[str, str | None]:
    """The result's suffix for ``src`` and, when the asked format cannot hold it, why PNG is used instead."""
    want = src.suffix.lower() if ext == "auto" else "." + ext.lower().lstrip(".")
    want = _NORMAL_EXT.get(want, want)
    if want not in _FORMATS:
        want = ".png"
    holds_deep, holds_alpha = _FORMATS[want]
    if deep and not holds_deep:
        return ".png", f"{want[1:]} cannot hold 16-bit samples"
    if alpha and not holds_alpha:
        return ".png", f"{want[1:]} cannot hold an alpha channel"
    return want, None


def check_suffix(suffix: str | None) -> None:
    """``--suffix`` is part of a file name: a separator in it would write outside the output folder."""
    problem = file_name_part_problem(suffix) if suffix else None
    if problem:
        raise OptionError(f"--suffix {suffix!r}: {problem} (e.g. --suffix x4)")


def output_paths(files: list[Path], out_dir: Path, suffix: str | None, ext: str = "png") -> list[Path]:
    """Where each input's result goes; refuses to overwrite an input, a file already in an input's folder (an
    original beside it: ``-i photos/a.jpg -o photos`` must not replace ``photos/a.png``) or to write two results
    to one file.

    With ``ext`` other than png, each input's header says whether the format can hold its result (16 bits,
    alpha); if not, that result is a PNG (logged)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"-o {out_dir}: exists and is not a folder; give a folder for the results")
    outs = []
    for p in files:
        alpha = deep = False
        if ext != "png":
            info = probe_image(p)
            alpha, deep = info.channels in (2, 4), info.bits > 8
        suffix_ext, why = _output_ext(p, ext, alpha, deep)
        if why:
            get_logger().warning("%s: writing a PNG (%s)", p, why)
        outs.append(out_dir / (f"{p.stem}_{suffix}{suffix_ext}" if suffix else f"{p.stem}{suffix_ext}"))
    others = sorted({p.suffix.lower() for p in files} - {".png"})
    if ext == "png" and others:
        get_logger().info("results are written as PNG (lossless; the default --ext png) from %s inputs too; "
                          "--ext auto keeps each input's format", "/".join(others))
    inputs = {p.resolve() for p in files}
    input_folders = {p.resolve().parent for p in files}
    seen: dict[Path, Path] = {}
    for src, dst in zip(files, outs):
        if dst.resolve() in inputs:
            raise DataError(f"-o {out_dir}: the result of {src} would overwrite the input {dst}; "
                            "choose another output folder or pass --suffix")
        if dst.resolve().parent in input_folders and (dst.exists() or dst.is_symlink()):
            raise DataError(f"-o {out_dir}: the result of {src} would replace {dst}, a file already in the "
                            "inputs' folder; choose another output folder, or another --suffix")
        if dst in seen:
            raise DataError(f"{seen[dst]} and {src} would both be written to {dst}; rename one, or run them "
                            "separately")
        seen[dst] = src
    return outs


@dataclass
class _Bars:
    """Progress over images and, for tiled images, over tiles (main rank, when asked)."""

    enabled: bool
    images: Any = None
    tiles: Any = None
    _tqdm: Any = field(default=None, repr=False)

    def over_images(self, items: list[Any]) -> Iterator[Any]:
        self._tqdm = tqdm
        self.images = tqdm(items, desc="infer", unit="img", disable=not self.enabled, dynamic_ncols=True)
        yield from self.images

    def on_tile(self, done: int, total: int) -> None:
        if not self.enabled or total <= 1:
            return
        if self.tiles is None or self.tiles.total != total or done == 1:
            if self.tiles is not None:
                self.tiles.close()
            self.tiles = self._tqdm(total=total, desc="tiles", unit="tile", leave=False, dynamic_ncols=True,
                                    position=1)
        self.tiles.update(1)
        if done == total:
            self.tiles.close()
            self.tiles = None


def process_image(net: nn.Module, path: Path, acc: Accelerator, settings: InferSettings, in_ch: int | None,
                  on_tile: Callable[[int, int], None] | None = None) -> np.ndarray:
    """One input through the network (and its alpha through the network or bicubic), at the final scale."""
    img, alpha, px = _pixels(read_image(path, flag="unchanged"), path)
    if in_ch == 1 and not px.gray:
        raise DataError(f"{path}: this network takes one channel (grayscale / Y); give grayscale images")
    h, w = img.shape[:2]
    channels = 1 if in_ch == 1 else 3

    def through_network(plane: np.ndarray, pixels: _Pixels) -> np.ndarray:
        return upscale_image(net, plane, pixels, acc, scale=settings.scale, tile=settings.tile,
                             tile_pad=settings.tile_pad, channels=channels, path=path, on_tile=on_tile)

    result = through_network(img, px)
    del img
    if alpha is not None:
        if settings.alpha == "network":
            big_alpha = through_network(alpha, _Pixels(px.in_max, px.out_max, px.out_dtype, True))
        else:
            stored = alpha if px.in_max == px.out_max else \
                np.clip(np.round(alpha.astype(np.float64) / px.in_max * px.out_max), 0, px.out_max).astype(px.out_dtype)
            big_alpha = _resize_matlab(stored, h * settings.scale, w * settings.scale, px.out_max)
        result = _merge_alpha(result, big_alpha)
    out_h, out_w = settings.output_size(h, w)
    return resize_result(result, out_h, out_w, settings.resize, px.out_max)


def inference_shape(net: nn.Module, tile: int | None, tile_pad: int) -> tuple[int, int, int, int]:
    """The input shape at which the CPU choices (precision, memory format, ``--backend auto``) are timed: a tile
    with its padding (capped), or ``CALIBRATION_SIDE`` when untiled, on the network's window grid."""
    multiple = tile_multiple(net)
    if tile:
        tile, tile_pad = aligned_tile(tile, tile_pad, multiple)
        side = calibration_side(tile, tile_pad, multiple)
    else:
        side = round_up(CALIBRATION_SIDE, multiple)
    largest = getattr(net, "max_input_side", None)  # a network of bounded inputs (GFPGAN: its out_size faces)
    side = min(side, int(largest)) if largest else side
    return 1, input_channels(net, default=None) or 3, side, side


def infer_worker(acc: Accelerator, net: nn.Module, files: list[Path], out_dir: Path,
                 settings: InferSettings) -> list[Path]:
    """Upscale ``files`` one by one on ``acc`` and write them into ``out_dir``.

    Grayscale inputs stay grayscale; 16-bit inputs give 16-bit results (not rounded to 8 bits); an alpha channel
    is kept; a one-channel network takes grayscale images.
    """
    setup_logging(enabled=acc.is_main)
    outs = output_paths(files, out_dir, settings.suffix, settings.ext)
    in_ch = input_channels(net, default=None)
    multiple = tile_multiple(net)
    if settings.tile:
        tile, pad = aligned_tile(settings.tile, settings.tile_pad, multiple)
        if (tile, pad) != (settings.tile, settings.tile_pad):
            get_logger().info("--tile %d --tile-pad %d rounded up to %d / %d: multiples of the network's window "
                              "grid (%d)", settings.tile, settings.tile_pad, tile, pad, multiple)
    acc.calibrate(net.eval(), inference_shape(net, settings.tile, settings.tile_pad), train=False)
    log_start("infer", acc)
    net = acc.prepare_model(net).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    bars = _Bars(enabled=acc.is_main and settings.progress)
    for path, dst in bars.over_images(list(zip(files, outs))[acc.rank::acc.world_size]):
        result = process_image(net, path, acc, settings, in_ch, on_tile=bars.on_tile)
        write_image(dst, result)
        written.append(dst)
    acc.strategy.barrier()
    return written


def check_result_sizes(files: list[Path], infos: list[ImageInfo], settings: InferSettings) -> None:
    """Refuse, before any work, a result that cannot fit in this machine's memory (an ``--outscale`` typo such
    as 1000): it is built whole as float32 samples, however the network's pass is tiled."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): nothing to compare with
        return
    for path, info in zip(files, infos):
        out_h, out_w = settings.output_size(info.height, info.width)
        need = out_h * out_w * max(info.channels, 3) * 4
        if need > memory:
            flag = f"--outscale {settings.outscale:g}" if settings.outscale is not None else f"scale {settings.scale}"
            raise OptionError(f"{flag}: the result of {path} would be {out_w}x{out_h} pixels (about "
                              f"{need / 2**30:.0f} GiB as float32), more than this machine's "
                              f"{memory / 2**30:.0f} GiB of memory; give a smaller --outscale")


def check_input_sides(net: nn.Module, files: list[Path], infos: list[ImageInfo], settings: InferSettings) -> None:
    """Refuse, before any work, an image larger than a network of bounded inputs takes (``max_input_side``: GFPGAN
    restores faces of its ``out_size`` at most), unless tiles small enough are asked for."""
    largest = getattr(net, "max_input_side", None)
    if not largest:
        return
    if settings.tile:
        tile, pad = aligned_tile(settings.tile, settings.tile_pad, tile_multiple(net))
        if tile + 2 * pad <= largest:
            return
    for path, info in zip(files, infos):
        if info.width > largest or info.height > largest:
            raise DataError(f"-i: {path} is {info.width}x{info.height}, but {type(net).__name__} restores faces of "
                            f"at most {largest}x{largest} (its out_size); crop and align the face to that size first")


def check_input_channels(net: nn.Module, files: list[Path], infos: list[ImageInfo]) -> None:
    """Refuse, before any work, a colour image for a network of one input channel (grayscale / Y)."""
    if input_channels(net, default=None) != 1:
        return
    for path, info in zip(files, infos):
        if info.channels >= 3:
            raise DataError(f"-i: {path} is a colour image, but this network takes one channel (grayscale / Y); give "
                            "grayscale images (e.g. convert them with OpenCV's IMREAD_GRAYSCALE)")


def check_outscale(outscale: float | None) -> float | None:
    """``--outscale``: a positive finite number (None: the network's scale)."""
    if outscale is None:
        return None
    if not math.isfinite(outscale) or outscale <= 0:
        raise OptionError(f"--outscale {outscale}: give a positive final scale, e.g. 3.5")
    return float(outscale)

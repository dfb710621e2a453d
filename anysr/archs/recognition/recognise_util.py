"""Shape readings the recognisers of the Swin-family networks share (SwinIR's layout, kept by HAT, DRCT, DAT, ATD,
CRAFT, HiT-SR): window sizes from relative-position tables and indices, ``img_size`` from a shifted window's mask
buffer, the reconstruction (upsampler kind, scale, output channels), the residual connection's kind.

Each reading raises NotThisFamily (through ``StateShapes``) when a name it needs is missing. Arithmetic on names
and shapes; ``fitting_heads`` builds candidate heads on the meta device (no memory) to compare their shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn

from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, shuffle_splits
from anysr.errors import ArchArgumentError

PUBLISHED_IMG_SIZE = 64  # the training patch of every published Swin-family SR model


def clean(x: float) -> float | int:
    """``x`` as an int when it is whole (ratios read from widths: 2.0 -> 2, 1.5 stays)."""
    return int(x) if float(x).is_integer() else x


def square_side(n: int, what: str) -> int:
    """The side of a square of ``n`` cells; NotThisFamily when ``n`` is not a square."""
    side = math.isqrt(n)
    if side * side != n:
        raise NotThisFamily(f"{what}: {n} is not a square")
    return side


def window_from_table(s: StateShapes, key: str) -> int:
    """The window of a relative-position bias table of ``(2w - 1)**2`` rows."""
    return (square_side(s.dim(key, 0), key) + 1) // 2


def window_from_index(s: StateShapes, key: str) -> int:
    """The window of a relative-position index of ``w**2`` rows."""
    return square_side(s.dim(key, 0), key)


def img_size_from_mask(s: StateShapes, key: str, window: int) -> int:
    """The ``img_size`` a shifted block's ``attn_mask`` buffer (windows, w*w, w*w) was made for: the published 64
    when it gives that many windows (the mask is made for ``img_size`` rounded up to the window), else the side
    the windows cover."""
    side = square_side(s.dim(key, 0), key)
    return PUBLISHED_IMG_SIZE if math.ceil(PUBLISHED_IMG_SIZE / window) == side else side * window


def window_pair(area: int, table_rows: int) -> list[int]:
    """The rectangular window ``[s0, s1]`` (s0 <= s1) of ``area`` cells whose relative-position bias table has
    ``(2 s0 - 1)(2 s1 - 1) == table_rows`` rows."""
    total = (4 * area + 1 - table_rows) // 2  # s0 + s1
    for s0 in range(1, math.isqrt(area) + 1):
        if area % s0 == 0 and s0 + area // s0 == total:
            return [s0, area // s0]
    raise NotThisFamily(f"no window of {area} cells has a {table_rows}-row bias table")


def resi_connection(s: StateShapes, prefix: str) -> str:
    """'1conv' (one conv at ``prefix``), '3conv' (a Sequential of three) or 'identity' (no tensor)."""
    if f"{prefix}.weight" in s:
        return "1conv"
    return "3conv" if f"{prefix}.0.weight" in s else "identity"


def reconstruction(s: StateShapes, image_channels: int) -> list[dict[str, object]]:
    """The SwinIR-style reconstructions that fit the file, as ``{"upsampler", "upscale", "out"}``: 'pixelshuffle'
    (``conv_before_upsample``, one 4x-wide conv per factor 2 or one 9x-wide conv for x3, none for x1,
    ``conv_last``; with ``"feat"``, its width, spandrel's ``num_feat``),
    'pixelshuffledirect' (one conv to ``out * scale**2``), 'nearest+conv' (``conv_up1`` [, ``conv_up2``]), else
    none (``conv_last`` only, or nothing: x1)."""
    if "conv_up1.weight" in s:  # nearest-neighbour doublings, each followed by a conv
        return [{"upsampler": "nearest+conv", "upscale": 4 if "conv_up2.weight" in s else 2,
                 "out": s.dim("conv_last.weight", 0)}]
    if "conv_before_upsample.0.weight" in s:
        feat = s.dim("conv_before_upsample.0.weight", 0)
        ups = [s.dim(f"upsample.{i}.weight", 0) for i in s.indices("upsample.")]
        if any(u not in (4 * feat, 9 * feat) for u in ups) or (9 * feat in ups and len(ups) > 1):
            return []
        scale = 3 if ups == [9 * feat] else 2 ** len(ups)  # no upsampling conv: x1
        return [{"upsampler": "pixelshuffle", "upscale": scale, "out": s.dim("conv_last.weight", 0), "feat": feat}]
    if "upsample.0.weight" in s:
        return [{"upsampler": "pixelshuffledirect", "upscale": scale, "out": out}
                for out, scale in shuffle_splits(s.dim("upsample.0.weight", 0), (image_channels, 3, 1))]
    out = s.dim("conv_last.weight", 0) if "conv_last.weight" in s else image_channels
    return [{"upsampler": "", "upscale": 1, "out": out}]


def head_mid(s: StateShapes, prefix: str, kind: str, in_dim: int, default: int = 64) -> int:
    """The mid width of a traiNNer-redux UniUpsample head of ``kind``, read where it shows (the first conv of
    'pixelshuffle', 'dysample' and 'lda', the conv after the first upsampling of 'pa_up'; ``in_dim`` when a
    'dysample' / 'lda' head has no such conv), else ``default`` (the other kinds keep it in no tensor)."""
    if kind in ("pixelshuffle", "dysample", "lda"):
        first = s.shapes.get(f"{prefix}.0.weight", ())
        return first[0] if len(first) == 4 and first[1] == in_dim else in_dim if kind != "pixelshuffle" else default
    if kind == "pa_up" and f"{prefix}.1.weight" in s:
        return s.dim(f"{prefix}.1.weight", 0)
    return default


_HEAD_SIGNATURES = {"dysample": ".offset.weight", "lda": ".proj_q.weight", "pa_up": ".conv.0.weight"}


def head_kinds(s: StateShapes, prefix: str, kinds: Iterable[str], scales: Iterable[int]
               ) -> list[tuple[str, list[int]]]:
    """The UniUpsample kinds (of ``kinds``) a file's head can be, each with the scales to try: a kind with its own
    layers ('dysample': offsets, 'lda': query / key projections, 'pa_up': pixel attention) when the file has them
    (a 'dysample' head's scale from its offsets: 2 x 4 groups x scale**2), the plain-conv kinds otherwise."""
    names = [k for k in s.keys() if k.startswith(prefix + ".")]
    own = {kind for kind, sig in _HEAD_SIGNATURES.items() if any(k.endswith(sig) for k in names)}
    scales = list(scales)
    out = []
    for kind in kinds:
        if own and kind not in own or not own and kind in _HEAD_SIGNATURES:
            continue
        if kind == "dysample":
            offset = next(k for k in names if k.endswith(".offset.weight"))
            side = math.isqrt(s.dim(offset, 0) // 8)
            out.append((kind, [side] if side * side * 8 == s.dim(offset, 0) else []))
        else:
            out.append((kind, scales))
    return out


def fitting_heads(s: StateShapes, prefix: str, build: Callable[[str, int, int, int], nn.Module],
                  kinds: Iterable[str], scales: Iterable[int], outs: Iterable[int], mid: Callable[[str], int]
                  ) -> list[dict[str, object]]:
    """The ``{"kind", "scale", "out", "mid"}`` choices whose head ``build(kind, scale, out, mid(kind))`` (built on
    the meta device) has exactly the file's names and shapes under ``prefix``, in the order of ``kinds`` (those
    ``head_kinds`` allows), ``scales`` and ``outs``. For heads whose kind and scale no single tensor shows
    (traiNNer-redux's UniUpsample: parameter-free upsamplers between convs); each candidate costs a head build
    (milliseconds)."""
    mine = {k[len(prefix) + 1:]: shape for k, shape in s.shapes.items() if k.startswith(prefix + ".")}
    if not mine:
        raise NotThisFamily(f"no {prefix}")
    found: list[dict[str, object]] = []
    outs = list(dict.fromkeys(outs))
    for kind, kind_scales in head_kinds(s, prefix, kinds, scales):
        width = mid(kind)
        for scale in kind_scales:
            for out in outs:
                try:
                    with torch.device("meta"):
                        head = build(kind, scale, out, width)
                except (ArchArgumentError, ValueError, RuntimeError):
                    continue
                if {k: tuple(v.shape) for k, v in head.state_dict().items()} == mine:
                    found.append({"kind": kind, "scale": scale, "out": out, "mid": width})
    return found


__all__ = ["PUBLISHED_IMG_SIZE", "clean", "fitting_heads", "head_kinds", "head_mid", "img_size_from_mask",
           "reconstruction", "resi_connection", "square_side", "window_from_index", "window_from_table",
           "window_pair"]

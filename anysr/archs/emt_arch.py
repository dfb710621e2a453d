"""EMT: Efficient Mixed Transformer for lightweight SR (Zheng et al., 2023; traiNNer-redux's ``EMT``).

Module names, frozen parameters and constructor arguments follow traiNNer-redux's ``EMT``, so its checkpoints load
with ``strict=True`` and give its outputs. Each mixed transformer block runs ``n_layers`` (token mixer, MLP) pairs:
the first ``n_GTLs`` mixers are striped-window self attention (SWSA; the second one shifted), the rest pixel
mixers (a frozen one-pixel shift per channel group, wrapping around, then batch norm). The MLPs are shift convs
(a frozen 3x3 depth-wise shift, then a 1x1 conv) with SiLU between.

SWSA splits its query/value channels into one part per window shape; each part is padded (reflect, then
replicate beyond what reflect reaches) to its window, rolled by its shift, and attends inside windows with the
query as key (``softmax(q q^T) v``, unscaled, as the reference), through ``scaled_dot_product_attention``; the
window partition is one reshape and one permute. Any input size runs; ``tile_multiple`` (the least common
multiple of the window sides) is where tiles need no padding, as training crops. The frozen masks, kept as
parameters in the reference's state dict, are used as loaded.

The mean shift is the reference's: DF2K's RGB mean times 255 (``rgb_range``) on [0, 1] images, so the network is
RGB only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, check_upscale, pad_bottom_right
from anysr.archs.elan_arch import MeanShift
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

DF2K_RGB_MEAN = (0.4690, 0.4490, 0.4036)
UPSAMPLERS = ("pixelshuffle", "pixelshuffledirect")


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


class ShiftConv2d1x1(nn.Conv2d):
    """A frozen depth-wise 3x3 shift (``mask``: five channel groups taken from the right, left, below, above and
    the pixel itself; zero borders), then a 1x1 conv (``weight``, ``bias``)."""

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True) -> None:
        super().__init__(in_channels, out_channels, kernel_size=1, bias=bias)
        g = in_channels // 5
        mask = torch.zeros(in_channels, 1, 3, 3)
        for i, (r, c) in enumerate(((1, 2), (1, 0), (2, 1), (0, 1))):
            mask[i * g:(i + 1) * g, 0, r, c] = 1.0
        mask[4 * g:, 0, 1, 1] = 1.0
        self.mask = _frozen(mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.conv2d(x, self.mask, padding=1, groups=self.in_channels)
        return F.conv2d(x, self.weight, self.bias)


class PixelMixer(nn.Module):
    """A frozen depth-wise 3x3 shift by one pixel per channel group (channel ``i``: from the right, left, below,
    above or itself by ``i % 5``), wrapping around the borders."""

    def __init__(self, planes: int, mix_margin: int = 1) -> None:
        super().__init__()
        self.planes = planes
        self.mix_margin = m = mix_margin
        mask = torch.zeros(planes, 1, 2 * m + 1, 2 * m + 1)
        mask[3::5, 0, 0, m] = 1.0
        mask[2::5, 0, -1, m] = 1.0
        mask[1::5, 0, m, 0] = 1.0
        mask[0::5, 0, m, -1] = 1.0
        mask[4::5, 0, m, m] = 1.0
        self.mask = _frozen(mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = self.mix_margin
        x = torch.cat([x[..., -m:, :], x, x[..., :m, :]], dim=-2)  # circular padding as slices (XLA, ONNX)
        x = torch.cat([x[..., -m:], x, x[..., :m]], dim=-1)
        return F.conv2d(x, self.mask, groups=self.planes)


class TokenMixer(nn.Module):
    """``norm(pixel_mixer(x) - x)`` with batch norm."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.token_mixer = PixelMixer(dim)
        self.norm = nn.BatchNorm2d(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.token_mixer(x) - x)


class SWSA(nn.Module):
    """Striped-window self attention: a 1x1 conv + batch norm to query/value channels, split into one part per
    window shape of ``window_list`` (each rolled by its ``shift_list`` entry when given), attention inside the
    windows with the query as key, the parts concatenated and projected (``proj``)."""

    def __init__(self, dim: int, num_heads: int, window_list: Sequence[Sequence[int]] = ((8, 8),),
                 shift_list: Sequence[Sequence[int]] | None = None) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.window_list = [(int(a), int(b)) for a, b in window_list]
        self.shift_list = ([(int(a), int(b)) for a, b in shift_list] if shift_list is not None
                           else [(0, 0)] * len(self.window_list))
        self.attn = nn.Sequential(nn.Conv2d(dim, dim * 2, 1), nn.BatchNorm2d(dim * 2))
        self.proj = nn.Sequential(nn.Conv2d(dim, dim, 1))

    def _window_attention(self, qv: torch.Tensor, window: tuple[int, int], shift: tuple[int, int]) -> torch.Tensor:
        b, _, h, w = qv.shape
        (wh, ww), heads = window, self.num_heads
        qv = pad_bottom_right(qv, (-h) % wh, (-w) % ww)
        if shift != (0, 0):
            qv = torch.roll(qv, shifts=shift, dims=(2, 3))
        ph, pw = qv.shape[-2:]
        nh, nw = ph // wh, pw // ww
        c = qv.shape[1] // (2 * heads)
        # (2, b, heads, c, nh, wh, nw, ww) -> (2, b * heads, nh * nw, wh * ww, c)
        qv = qv.view(b, 2, heads, c, nh, wh, nw, ww).permute(1, 0, 2, 4, 6, 5, 7, 3)
        qv = qv.reshape(2, b * heads, nh * nw, wh * ww, c)
        out = F.scaled_dot_product_attention(qv[0], qv[0], qv[1], scale=1.0)
        out = out.view(b, heads, nh, nw, wh, ww, c).permute(0, 1, 6, 2, 4, 3, 5).reshape(b, heads * c, ph, pw)
        if shift != (0, 0):
            out = torch.roll(out, shifts=(-shift[0], -shift[1]), dims=(2, 3))
        return out[:, :, :h, :w]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qv = self.attn(x)
        parts = torch.split(qv, qv.shape[1] // len(self.window_list), dim=1)
        out = [self._window_attention(p, win, sh)
               for p, win, sh in zip(parts, self.window_list, self.shift_list, strict=True)]
        return self.proj(torch.cat(out, dim=1))


class Mlp(nn.Module):
    """Shift conv, SiLU, shift conv (``fc1``, ``act``, ``fc2``)."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer: type[nn.Module] = nn.SiLU) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        self.fc1 = ShiftConv2d1x1(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = ShiftConv2d1x1(hidden_features, out_features or in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MixedTransformerBlock(nn.Module):
    """``num_layer`` residual (mixer, MLP) pairs: SWSA for the first ``num_GTLs`` (every second one shifted), pixel
    mixers after; ``conv`` is the reference's empty tail (an identity)."""

    def __init__(self, dim: int, num_layer: int, num_heads: int, num_GTLs: int,  # noqa: N803 - the reference's name
                 window_list: Sequence[Sequence[int]], shift_list: Sequence[Sequence[int]], mlp_ratio: int | float,
                 act_layer: type[nn.Module] = nn.SiLU) -> None:
        super().__init__()
        self.sa_list = nn.ModuleList([
            TokenMixer(dim) if i >= num_GTLs else
            SWSA(dim, num_heads, window_list, shift_list if i % 2 == 1 else None) for i in range(num_layer)])
        self.mlp_list = nn.ModuleList([Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer)
                                       for _ in range(num_layer)])
        self.conv = nn.Sequential(nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for sa, mlp in zip(self.sa_list, self.mlp_list, strict=True):
            x = x + sa(x)
            x = x + mlp(x)
        return self.conv(x)


def _tail(upscale: int, dim: int, out_ch: int, upsampler: str) -> nn.Sequential:
    """The reference's ``Upsampler``: 'pixelshuffle' (a 3x3 conv to 4x width and PixelShuffle(2) per factor 2, or
    one to 9x for x3; then a 3x3 conv to ``out_ch``) or 'pixelshuffledirect' (one conv, one PixelShuffle)."""
    if upsampler == "pixelshuffledirect":
        return nn.Sequential(nn.Conv2d(dim, out_ch * upscale**2, 3, 1, 1), nn.PixelShuffle(upscale))
    layers: list[nn.Module] = []
    if upscale == 3:
        layers += [nn.Conv2d(dim, 9 * dim, 3, 1, 1), nn.PixelShuffle(3)]
    else:
        for _ in range(int(math.log2(upscale))):
            layers += [nn.Conv2d(dim, 4 * dim, 3, 1, 1), nn.PixelShuffle(2)]
    return nn.Sequential(*layers, nn.Conv2d(dim, out_ch, 3, 1, 1))


@ARCH_REGISTRY.register()
class EMT(nn.Module):
    """Efficient Mixed Transformer. Args (traiNNer-redux's names and defaults): scale; num_in_ch / num_out_ch (3:
    the mean shift is RGB); upsampler ('pixelshuffle': x1, 2**n or 3; 'pixelshuffledirect': any); dim (a multiple
    of 5: the shifts' five groups); n_blocks; n_layers (per block); num_heads; mlp_ratio; n_GTLs (attention layers
    per block, the rest pixel mixers); window_list (window shapes, one channel part each); shift_list (their shifts
    in the shifted layers)."""

    def __init__(self, scale: int = 4, num_in_ch: int = 3, num_out_ch: int = 3, upsampler: str = "pixelshuffle",
                 dim: int = 60, n_blocks: int = 6, n_layers: int = 6, num_heads: int = 3, mlp_ratio: int | float = 2,
                 n_GTLs: int = 2,  # noqa: N803 - the reference's name
                 window_list: Sequence[Sequence[int]] = ((32, 8), (8, 32)),
                 shift_list: Sequence[Sequence[int]] = ((16, 4), (4, 16))) -> None:
        super().__init__()
        _check_emt_args(scale, num_in_ch, num_out_ch, upsampler, dim, num_heads, mlp_ratio, window_list, shift_list)
        self.scale = scale
        self.tile_multiple: int = math.lcm(*(int(side) for window in window_list for side in window))
        self.sub_mean = MeanShift(255, sign=-1, rgb_mean=DF2K_RGB_MEAN)
        self.add_mean = MeanShift(255, sign=1, rgb_mean=DF2K_RGB_MEAN)
        self.head = nn.Conv2d(num_in_ch, dim, 3, 1, 1)
        self.body = nn.Sequential(*[
            MixedTransformerBlock(dim, n_layers, num_heads, n_GTLs, window_list, shift_list, mlp_ratio)
            for _ in range(n_blocks)])
        self.tail = _tail(scale, dim, num_out_ch, upsampler)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        head = self.head(self.sub_mean(x))
        return self.add_mean(self.tail(self.body(head) + head))


def _check_emt_args(scale: int, num_in_ch: int, num_out_ch: int, upsampler: str, dim: int, num_heads: int,
                    mlp_ratio: float, window_list: Sequence[Sequence[int]], shift_list: Sequence[Sequence[int]]
                    ) -> None:
    """Refuse what traiNNer-redux's EMT cannot build or run."""
    if upsampler not in UPSAMPLERS:
        raise ArchArgumentError("upsampler", f"EMT: unknown upsampler {upsampler!r}; use one of {UPSAMPLERS}")
    if upsampler == "pixelshuffle":
        check_upscale(scale, "scale")
    elif isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ArchArgumentError("scale", f"EMT needs an integer scale >= 1, got {scale!r}")
    if num_in_ch != 3 or num_out_ch != 3:
        raise ArchArgumentError("num_in_ch" if num_in_ch != 3 else "num_out_ch", "EMT's mean shift is for RGB "
                                f"images: num_in_ch and num_out_ch must be 3, got {num_in_ch} / {num_out_ch}")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 5 or dim % 5:
        raise ArchArgumentError("dim", f"EMT's shifts split dim into five groups: it must be a multiple of 5, got "
                                f"{dim!r}")
    hidden = dim * mlp_ratio
    if not float(hidden).is_integer() or int(hidden) % 5 or hidden < 5:
        raise ArchArgumentError("mlp_ratio", f"EMT: dim * mlp_ratio ({hidden}) must be a whole multiple of 5 (the "
                                "MLP's shifts split it into five groups)")
    try:
        windows = [(int(a), int(b)) for a, b in window_list]
        shifts = [(int(a), int(b)) for a, b in shift_list]
    except (TypeError, ValueError):
        raise ArchArgumentError("window_list", f"EMT: window_list and shift_list are lists of [rows, columns] "
                                f"pairs, got {window_list!r} / {shift_list!r}") from None
    if not windows or len(shifts) != len(windows) or any(min(w) < 1 for w in windows):
        raise ArchArgumentError("shift_list", f"EMT needs one [rows, columns] window (sides >= 1) per shift, got "
                                f"{window_list!r} / {shift_list!r}")
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1 \
            or (2 * dim) % (2 * num_heads * len(windows)):
        raise ArchArgumentError("num_heads", f"EMT: dim ({dim}) must split into {len(windows)} window parts of "
                                f"num_heads ({num_heads!r}) heads each")


__all__ = ["EMT", "MixedTransformerBlock", "PixelMixer", "SWSA", "ShiftConv2d1x1"]


# traiNNer-redux registers the class itself; its name in lower case is the class with its defaults.
register_presets("EMT", scale_arg="scale", presets={
    "emt": {},  # 1.00 M parameters at x4 (0.93 M trained; the rest are the frozen shift masks)
})


def _recognise(s: StateShapes) -> list[dict]:
    """EMT from its tensors: width from the head, blocks, layers per block and how many are attention (SWSA's
    query/value conv vs a pixel mixer's mask), the MLP ratio, the tail (a last conv after sub-pixel steps:
    'pixelshuffle', its scale from their widths; one conv alone: 'pixelshuffledirect', unless it is x1).
    ``num_heads``, ``window_list`` and ``shift_list`` are not in the tensors: the published values (fewer heads
    where the width does not split into three per window part)."""
    dim = s.dim("head.weight", 0)
    s.shape("sub_mean.weight")
    layers = s.count("body.0.sa_list.")
    gtls = sum(f"body.0.sa_list.{i}.attn.0.weight" in s for i in range(layers))
    common = {"dim": dim, "n_blocks": s.count("body."), "n_layers": layers, "n_GTLs": gtls,
              "mlp_ratio": s.dim("body.0.mlp_list.0.fc1.weight", 0) / dim}
    if common["mlp_ratio"].is_integer():
        common["mlp_ratio"] = int(common["mlp_ratio"])
    convs = [s.dim(f"tail.{i}.weight", 0) for i in s.indices("tail.")]
    if len(convs) == 1:
        tails = [("pixelshuffle" if sc == 1 else "pixelshuffledirect", sc) for _, sc in shuffle_splits(convs[0], (3,))]
    elif convs[:-1] == [9 * dim]:
        tails = [("pixelshuffle", 3)]
    elif all(u == 4 * dim for u in convs[:-1]):
        tails = [("pixelshuffle", 2 ** (len(convs) - 1))]
    else:
        raise NotThisFamily("tail: no sub-pixel upsampler of the body's width")
    return [{**common, "upsampler": up, "scale": sc, **({} if heads == 3 else {"num_heads": heads})}
            for up, sc in tails for heads in (3, 2, 1)]


register_recogniser("EMT", _recognise)

"""ASID: a lightweight super-resolution network of information-distillation groups with shared window attention,
as neosr trains it (``asid``, ``asid_d8``).

Module names and constructor arguments follow neosr's ``asid`` (``asid_arch.py``), so its checkpoints load with
``strict=True`` and give the same output. A 3x3 conv, three distillation groups (``d8``: eight), a 3x3 conv with
a long skip, and a conv + PixelShuffle head. Each group: one distillation block, a 1x1 conv, a residual and an
enhanced-spatial-attention gate (``ESA``). A distillation block keeps a quarter of the channels at three steps
(an inverted bottleneck ``LB``, then single-head self-attention over 8x8 windows, ``SLA``, and over an 8x8 grid of
pixels spaced across the image, ``SGA``, each followed by a gated conv feed-forward), joins them with 1x1 convs
and ends with channel attention inside windows and across the grid (``BlockC``). The first group's softmax maps
are shared: the later groups' attention only projects values (``to_v``) and reuses them.

The channel attention's ``flash_attn`` path is neosr's: scaled dot-product attention of the L2-normalised queries
and keys, computed without gradients (the ``qkv`` convs of ``BlockC`` learn through nothing else, and the
``temperature`` is unused); ``flash_attn=False`` takes the temperature-scaled softmax, with gradients.

Any input size: it is zero-padded at the bottom / right to a multiple of ``window_size`` (and to at least the
16 pixels or so the ESA's strided conv and 7x7 max pool need) and the output cropped back. ``tile_multiple`` is
the window size.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.archs.resize_util import resize_bilinear
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


class GatedConvFFN(nn.Module):
    """1x1 conv to twice the width, 3x3 depth-wise conv, ``gelu(first half) * second half``, 1x1 conv back."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.project_in = nn.Conv2d(dim, dim * 2, 1, bias=False)
        self.dwconv = nn.Conv2d(dim * 2, dim * 2, 3, 1, 1, groups=dim * 2, bias=False)
        self.project_out = nn.Conv2d(dim, dim, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.dwconv(self.project_in(x)).chunk(2, dim=1)
        return self.project_out(F.gelu(gate) * value)


class _ImageMean(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean((2, 3))


class SqueezeExcitation(nn.Module):
    """``x * sigmoid(linear(silu(linear(mean over the image))))`` with a quarter-width bottleneck (no biases)."""

    def __init__(self, dim: int, shrinkage_rate: float = 0.25) -> None:
        super().__init__()
        hidden = int(dim * shrinkage_rate)
        self.gate = nn.Sequential(_ImageMean(), nn.Linear(dim, hidden, bias=False), nn.SiLU(),
                                  nn.Linear(hidden, dim, bias=False), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(x)[:, :, None, None]


class _Residual(nn.Module):
    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x) + x


class LB(nn.Module):
    """Residual inverted bottleneck (expansion 1): 1x1 conv, GELU, 3x3 depth-wise conv, GELU, squeeze-excitation,
    1x1 conv."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.net = _Residual(nn.Sequential(
            nn.Conv2d(dim, dim, 1), nn.GELU(), nn.Conv2d(dim, dim, 3, 1, 1, groups=dim), nn.GELU(),
            SqueezeExcitation(dim), nn.Conv2d(dim, dim, 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _relative_index(window: int) -> torch.Tensor:
    """(w*w, w*w) index of each (query, key) offset into a (2w-1)^2 table: row offset major, column minor."""
    rows, cols = torch.meshgrid(torch.arange(window), torch.arange(window), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    return (rows[:, None] - rows[None, :] + window - 1) * (2 * window - 1) + cols[:, None] - cols[None, :] + window - 1


class SharedAttention(nn.Module):
    """Single-head self-attention over window tokens (b', n, d). ``shares``: computes the softmax map (``to_qkv``,
    optional relative position bias ``rel_pos_bias``) and returns it; otherwise it applies a given map to its values
    (``to_v``)."""

    def __init__(self, dim: int, window: int, shares: bool, pe: bool) -> None:
        super().__init__()
        self.shares, self.scale = shares, dim**-0.5
        if shares:
            self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
            self.rel_pos_bias = nn.Embedding((2 * window - 1) ** 2, 1) if pe else None
            self.register_buffer("rel_pos_indices", _relative_index(window), persistent=False)
        else:
            self.to_v = nn.Linear(dim, dim, bias=False)
        self.to_out = nn.Sequential(nn.Linear(dim, dim, bias=False))

    def forward(self, x: torch.Tensor, attn: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.shares:
            q, k, v = self.to_qkv(x).chunk(3, dim=-1)
            sim = (q * self.scale) @ k.transpose(-2, -1)
            if self.rel_pos_bias is not None:
                sim = sim + self.rel_pos_bias.weight[self.rel_pos_indices, 0]
            attn = sim.softmax(dim=-1)
        else:
            assert attn is not None
            v = self.to_v(x)
        return self.to_out(attn @ v), attn


def _windows(x: torch.Tensor, w: int, grid: bool) -> torch.Tensor:
    """(b, d, H, W) -> (b * H/w * W/w, w*w, d): ``w`` x ``w`` blocks (``grid``: ``w`` x ``w`` pixels spaced H/w
    apart)."""
    b, d, h, wd = x.shape
    if grid:
        t = x.view(b, d, w, h // w, w, wd // w).permute(0, 3, 5, 2, 4, 1)
    else:
        t = x.view(b, d, h // w, w, wd // w, w).permute(0, 2, 4, 3, 5, 1)
    return t.reshape(-1, w * w, d)


def _unwindows(t: torch.Tensor, w: int, grid: bool, shape: torch.Size) -> torch.Tensor:
    b, d, h, wd = shape
    t = t.reshape(b, h // w, wd // w, w, w, d)
    t = t.permute(0, 5, 3, 1, 4, 2) if grid else t.permute(0, 5, 1, 3, 2, 4)
    return t.reshape(b, d, h, wd)


class WindowBlock(nn.Module):
    """Pre-normed window (``grid``: spaced-grid) attention and a gated conv feed-forward, both residual
    (neosr's SLA_A / SGA_A with ``shares``, SLA_B / SGA_B without)."""

    def __init__(self, dim: int, window: int, grid: bool, shares: bool, pe: bool) -> None:
        super().__init__()
        self.window, self.grid = window, grid
        self.norm = nn.LayerNorm(dim)
        self.attn = SharedAttention(dim, window, shares, pe)
        self.cnorm = LayerNorm2d(dim)
        self.gfn = GatedConvFFN(dim)

    def forward(self, x: torch.Tensor, attn: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = _windows(x, self.window, self.grid)
        out, attn = self.attn(self.norm(tokens), attn)
        x = _unwindows(out + tokens, self.window, self.grid, x.shape)
        return self.gfn(self.cnorm(x)) + x, attn


class ChannelAttention(nn.Module):
    """Single-head attention between channels, per ``window`` x ``window`` block (``grid``: per pixel offset of
    the grid, over the pixels spaced H/window apart); q, k, v from a 1x1 and a 3x3 depth-wise conv (no biases)."""

    def __init__(self, dim: int, window: int, grid: bool, flash_attn: bool) -> None:
        super().__init__()
        self.window, self.grid, self.flash_attn = window, grid, flash_attn
        self.temperature = nn.Parameter(torch.ones(1, 1, 1))
        self.qkv = nn.Conv2d(dim, dim * 3, 1, bias=False)
        self.qkv_dwconv = nn.Conv2d(dim * 3, dim * 3, 3, 1, 1, groups=dim * 3, bias=False)
        self.project_out = nn.Conv2d(dim, dim, 1, bias=False)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        """(b, d, H, W) -> (b, groups, 1, d, pixels per group)."""
        b, d, h, w = t.shape
        p = self.window
        t = t.view(b, d, h // p, p, w // p, p)
        if self.grid:
            return t.permute(0, 3, 5, 1, 2, 4).reshape(b, p * p, 1, d, -1)
        return t.permute(0, 2, 4, 1, 3, 5).reshape(b, -1, 1, d, p * p)

    def _join(self, t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        b, d, h, w = shape
        p = self.window
        if self.grid:
            t = t.reshape(b, p, p, d, h // p, w // p).permute(0, 3, 4, 1, 5, 2)
        else:
            t = t.reshape(b, h // p, w // p, d, p, p).permute(0, 3, 1, 4, 2, 5)
        return t.reshape(b, d, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (self._split(t) for t in self.qkv_dwconv(self.qkv(x)).chunk(3, dim=1))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        if self.flash_attn:
            with torch.no_grad():
                out = F.scaled_dot_product_attention(q, k, v)
        else:
            out = ((q @ k.transpose(-2, -1)) * self.temperature).softmax(dim=-1) @ v
        return self.project_out(self._join(out, x.shape))


class TrBlockC(nn.Module):
    """Window then grid channel attention, each followed by a gated conv feed-forward; all pre-normed, residual."""

    def __init__(self, dim: int, window: int, flash_attn: bool) -> None:
        super().__init__()
        self.canorm1, self.canorm2 = LayerNorm2d(dim), LayerNorm2d(dim)
        self.cttn1 = ChannelAttention(dim, window, False, flash_attn)
        self.cttn2 = ChannelAttention(dim, window, True, flash_attn)
        self.cnorm1, self.cnorm2 = LayerNorm2d(dim), LayerNorm2d(dim)
        self.gfn1, self.gfn2 = GatedConvFFN(dim), GatedConvFFN(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.cttn1(self.canorm1(x)) + x
        x = self.gfn1(self.cnorm1(x)) + x
        x = self.cttn2(self.canorm2(x)) + x
        return self.gfn2(self.cnorm2(x)) + x


class IDSABlock(nn.Module):
    """Information distillation: three steps each keep the first quarter (``dim // 4``) of the channels and pass
    the rest through an inverted bottleneck, window and grid attention; 1x1 convs join them; channel attention
    last. ``shares``: this block computes the six attention maps (returned), otherwise it is given them."""

    def __init__(self, dim: int, window: int, shares: bool, pe: bool, flash_attn: bool) -> None:
        super().__init__()
        q = dim // 4
        self.split = q
        self.LB1, self.LB2, self.LB3 = LB(dim), LB(q * 3), LB(dim // 2)
        widths = (q * 3, dim // 2, q)
        for i, width in enumerate(widths, 1):
            setattr(self, f"SLA{i}", WindowBlock(width, window, False, shares, pe))
        for i, width in enumerate(widths, 1):
            setattr(self, f"SGA{i}", WindowBlock(width, window, True, shares, pe))
        self.BlockC = TrBlockC(dim, window, flash_attn)
        self.pw1 = nn.Conv2d(dim, dim, 1)
        self.pw2 = nn.Conv2d(q * 3, q * 3, 1)
        self.pw3 = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor, maps: list[torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        given = iter(maps) if maps is not None else None
        made: list[torch.Tensor] = []

        def attend(block: nn.Module, t: torch.Tensor) -> torch.Tensor:
            t, attn = block(t, next(given) if given is not None else None)
            made.append(attn)
            return t

        c = self.split
        x = self.LB1(x)
        kept = x[:, :c]
        x = attend(self.SGA1, attend(self.SLA1, x[:, c:]))
        x = self.pw1(torch.cat((x, kept), 1))
        first = x[:, :c]
        x = self.LB2(x[:, c:])
        kept = x[:, :c]
        x = attend(self.SGA2, attend(self.SLA2, x[:, c:]))
        x = self.pw2(torch.cat((x, kept), 1))
        second = x[:, :c]
        x = self.LB3(x[:, c:])
        kept = x[:, :c]
        x = attend(self.SGA3, attend(self.SLA3, x[:, c:]))
        x = self.pw3(torch.cat((first, second, x, kept), 1))
        return self.BlockC(x), made


class ESA(nn.Module):
    """Enhanced spatial attention (RFANet's, as in RLFN): a 1x1 conv down to ``esa_channels``, a strided 3x3
    conv, 7x7 max pool (stride 3), 3x3 conv, bilinear back to the input size, plus a 1x1 branch, 1x1 conv up,
    sigmoid gate on the input."""

    def __init__(self, esa_channels: int, n_feats: int) -> None:
        super().__init__()
        f = esa_channels
        self.conv1 = nn.Conv2d(n_feats, f, 1)
        self.conv_f = nn.Conv2d(f, f, 1)
        self.conv2 = nn.Conv2d(f, f, 3, 2, 0)
        self.conv3 = nn.Conv2d(f, f, 3, 1, 1)
        self.conv4 = nn.Conv2d(f, n_feats, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c1 = self.conv1(x)
        c3 = self.conv3(F.max_pool2d(self.conv2(c1), kernel_size=7, stride=3))
        c3 = resize_bilinear(c3, (x.shape[-2], x.shape[-1]), align_corners=False)
        return x * torch.sigmoid(self.conv4(c3 + self.conv_f(c1)))


class IDSG(nn.Module):
    """A distillation group: one block (``shares``: the first group's, in a one-entry ``Sequential``), a 1x1 conv,
    the group's residual, the ESA gate."""

    def __init__(self, dim: int, window: int, shares: bool, pe: bool, bias: bool, flash_attn: bool) -> None:
        super().__init__()
        block = IDSABlock(dim, window, shares, pe, flash_attn)
        self.residual_layer = nn.Sequential(block) if shares else block
        self.res_end = nn.Conv2d(dim, dim, 1, bias=bias)
        self.esa = ESA(max(dim // 4, 16), dim)

    def forward(self, x: torch.Tensor, maps: list[torch.Tensor] | None = None
                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        block = self.residual_layer[0] if isinstance(self.residual_layer, nn.Sequential) else self.residual_layer
        out, made = block(x, maps)
        return self.esa(self.res_end(out) + x), made


def _check(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ArchArgumentError(name, f"ASID needs an integer {name} >= {low}, got {value!r}")


@ARCH_REGISTRY.register()
class ASID(nn.Module):
    """ASID (neosr's ``asid``; ``d8``: eight groups, ``asid_d8``).

    Args:
        num_in_ch / num_out_ch: image channels. num_feat: width (a multiple of 4). window_size: attention window
        (and grid) side. scale: upscale factor. flash_attn: the channel attention's gradient-free scaled-dot-product
        path (neosr's default). d8: eight groups instead of three. pe: relative position bias in the first group's
        window attention. bias: biases of the stem, output, head and group-end convs. drop: channel dropout before
        the output conv in training. block_num: distillation blocks in the first group (neosr builds only 1).
        res_num: accepted as in neosr, where it changes nothing (``d8`` picks the depth).
    """

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, num_feat: int = 48, res_num: int = 3,
                 block_num: int = 1, window_size: int = 8, scale: int = 4, flash_attn: bool = True, d8: bool = False,
                 pe: bool = False, bias: bool = True, drop: float = 0.0) -> None:
        super().__init__()
        _check("scale", scale, 1)
        _check("num_in_ch", num_in_ch, 1)
        _check("num_out_ch", num_out_ch, 1)
        _check("window_size", window_size, 1)
        _check("res_num", res_num, 1)
        if isinstance(num_feat, bool) or not isinstance(num_feat, int) or num_feat < 8 or num_feat % 4:
            raise ArchArgumentError("num_feat", f"ASID needs a num_feat that is a multiple of 4 and >= 8, "
                                                f"got {num_feat!r}")
        if block_num != 1:
            raise ArchArgumentError("block_num", f"ASID builds one distillation block in its first group (neosr's "
                                                 f"chained blocks cannot run), got {block_num!r}")
        self.scale, self.window_size, self.in_channels = scale, window_size, num_in_ch
        self.tile_multiple = window_size
        self.min_size = -(-15 // window_size) * window_size  # the ESA's strided conv and 7x7 pool need 15 pixels
        self.drop = nn.Dropout2d(drop)
        for i in range(8 if d8 else 3):
            setattr(self, f"block{i}", IDSG(num_feat, window_size, i == 0, pe, bias, flash_attn))
        self.n_groups = 8 if d8 else 3
        self.input = nn.Conv2d(num_in_ch, num_feat, 3, 1, 1, bias=bias)
        self.output = nn.Conv2d(num_feat, num_feat, 3, 1, 1, bias=bias)
        self.up = nn.Sequential(nn.Conv2d(num_feat, num_out_ch * scale**2, 3, 1, 1, bias=bias),
                                nn.PixelShuffle(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        m = self.window_size
        pad_h, pad_w = (-h) % m, (-w) % m
        # below the ESA's minimum: more zeros (a traced graph keeps only the window padding dynamic)
        pad_h, pad_w = pad_h + max(self.min_size - h - pad_h, 0), pad_w + max(self.min_size - w - pad_w, 0)
        x = F.pad(x, (0, pad_w, 0, pad_h))
        residual = self.input(x)
        out, maps = self.block0(residual)
        for i in range(1, self.n_groups):
            out, _ = getattr(self, f"block{i}")(out, maps)
        out = self.output(self.drop(out)) + residual
        return self.up(out)[:, :, :h * self.scale, :w * self.scale]


__all__ = ["ASID", "ESA", "IDSABlock", "IDSG", "ChannelAttention", "SharedAttention", "TrBlockC", "WindowBlock"]


# neosr's names (its builders take the scale from the options file)
register_presets("ASID", scale_arg="scale", source="neosr", presets={
    "asid": {},  # 0.31 M parameters at x4
    "asid_d8": {"d8": True, "res_num": 8},  # 0.75 M parameters at x4
})


def _recognise(s: StateShapes) -> list[dict] | None:
    """ASID from its tensors: width and image channels from the stem, eight groups or three, the head's channels /
    scale split, the conv biases, the first group's position bias (its table gives the window; without one the
    published 8 is kept)."""
    if "block0.residual_layer.0.BlockC.cttn1.temperature" not in s or len(s.shape("input.weight")) != 4:
        return None
    num_feat, cin = s.shape("input.weight")[:2]
    d8 = "block7.res_end.weight" in s
    args: dict = {"num_in_ch": cin, "num_feat": num_feat, "d8": d8, "res_num": 8 if d8 else 3,
                  "bias": "input.bias" in s}
    table = "block0.residual_layer.0.SLA1.attn.rel_pos_bias.weight"
    if table in s:
        args["pe"] = True
        args["window_size"] = (round(s.dim(table, 0) ** 0.5) + 1) // 2
    return [{**args, "num_out_ch": c, "scale": sc} for c, sc in shuffle_splits(s.dim("up.0.weight", 0), (3, 1))]


register_recogniser("ASID", _recognise)

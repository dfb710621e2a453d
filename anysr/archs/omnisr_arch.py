"""Omni-SR: omni self-attention for lightweight SR (Wang et al., CVPR 2023).

Module names, buffers and constructor arguments follow spandrel 0.4.2's OmniSR (the authors' code), so
released checkpoints load with ``strict=True`` and give the same output. Every OSA block mixes five kinds
of context: an MBConv, window ("block") self-attention, channel attention inside each window, grid
self-attention (one token per window position, strided over the image) and channel attention across the
grid, each followed by a gated conv feed-forward.

Inputs of any size work: the network zero-pads the bottom / right to a multiple of ``window_size`` and
crops the output, as the original does. Inputs smaller than 16 pixels per side (where the ESA pooling of
the original fails) are first grown to 16 by reflect / edge padding, as spandrel's call API does.

``load_state_dict`` ignores the ``total_ops`` / ``total_params`` entries (thop profiler counters) that some
released checkpoints carry, as spandrel's loader does.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, pad_to_min_size
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.archs.resize_util import resize_bilinear
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

MIN_SIZE = 16  # spandrel's size requirement: ESA needs >= 15 pixels per side
PROFILER_COUNTERS = ("total_ops", "total_params")  # buffers thop's profiler leaves in every module


def _drop_profiler_counters(module: nn.Module, state_dict: dict, prefix: str, *args: object) -> None:
    """Load pre-hook: released Omni-SR checkpoints carry thop's per-module counters; they are not weights."""
    for key in [k for k in state_dict if k.startswith(prefix) and k.rsplit(".", 1)[-1] in PROFILER_COUNTERS]:
        del state_dict[key]


# ----------------------------------------------------------------------------- layout helpers
class _ToWindows(nn.Module):
    """(b, c, H, W) -> (b, H/ws, W/ws, ws, ws, c). ``grid``: window members are strided by H/ws, W/ws."""

    def __init__(self, window_size: int, grid: bool) -> None:
        super().__init__()
        self.ws = window_size
        self.grid = grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        ws, nh, nw = self.ws, h // self.ws, w // self.ws
        if self.grid:  # pixel (i * nh + y, j * nw + x) -> window (y, x), position (i, j)
            return x.reshape(b, c, ws, nh, ws, nw).permute(0, 3, 5, 2, 4, 1)
        return x.reshape(b, c, nh, ws, nw, ws).permute(0, 2, 4, 3, 5, 1)

    def extra_repr(self) -> str:
        return f"window_size={self.ws}, grid={self.grid}"


class _FromWindows(nn.Module):
    """Inverse of ``_ToWindows``: (b, nh, nw, ws, ws, c) -> (b, c, H, W)."""

    def __init__(self, grid: bool) -> None:
        super().__init__()
        self.grid = grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, nh, nw, ws, _, c = x.shape
        if self.grid:
            return x.permute(0, 5, 3, 1, 4, 2).reshape(b, c, ws * nh, ws * nw)
        return x.permute(0, 5, 1, 3, 2, 4).reshape(b, c, nh * ws, nw * ws)

    def extra_repr(self) -> str:
        return f"grid={self.grid}"


class _SpatialMean(nn.Module):
    """(b, c, h, w) -> (b, c): the mean over the image."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean((2, 3))


# ----------------------------------------------------------------------------- blocks
class PreNormResidual(nn.Module):
    """``x + fn(LayerNorm(x))`` on channel-last tokens."""

    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x)) + x


class ConvPreNormResidual(nn.Module):
    """``x + fn(LayerNorm2d(x))`` on an NCHW map."""

    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.norm = LayerNorm2d(dim)
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x)) + x


class GatedConvFeedForward(nn.Module):
    """1x1 conv to 2 x hidden, depth-wise 3x3, ``gelu(a) * b`` of the halves, 1x1 conv back."""

    def __init__(self, dim: int, mult: float = 1, bias: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        del dropout  # accepted for the original signature (unused there too)
        hidden = int(dim * mult)
        self.project_in = nn.Conv2d(dim, hidden * 2, kernel_size=1, bias=bias)
        self.dwconv = nn.Conv2d(hidden * 2, hidden * 2, kernel_size=3, stride=1, padding=1, groups=hidden * 2,
                                bias=bias)
        self.project_out = nn.Conv2d(hidden, dim, kernel_size=1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.dwconv(self.project_in(x)).chunk(2, dim=1)
        return self.project_out(F.gelu(a) * b)


class SqueezeExcitation(nn.Module):
    """Channel gate from the global mean: linear - SiLU - linear - sigmoid."""

    def __init__(self, dim: int, shrinkage_rate: float = 0.25) -> None:
        super().__init__()
        hidden = int(dim * shrinkage_rate)
        self.gate = nn.Sequential(_SpatialMean(), nn.Linear(dim, hidden, bias=False), nn.SiLU(),
                                  nn.Linear(hidden, dim, bias=False), nn.Sigmoid(), nn.Unflatten(1, (dim, 1, 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gate(x)


class MBConvResidual(nn.Module):
    """``x + fn(x)`` (the original's drop-sample is never active: rate 0)."""

    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x) + x


def mbconv(dim: int, expansion_rate: float = 1, shrinkage_rate: float = 0.25) -> MBConvResidual:
    """Inverted bottleneck: 1x1 conv, GELU, depth-wise 3x3, GELU, squeeze-excitation, 1x1 conv; residual."""
    hidden = int(expansion_rate * dim)
    return MBConvResidual(nn.Sequential(
        nn.Conv2d(dim, hidden, 1), nn.GELU(),
        nn.Conv2d(hidden, hidden, 3, stride=1, padding=1, groups=hidden), nn.GELU(),
        SqueezeExcitation(hidden, shrinkage_rate=shrinkage_rate),
        nn.Conv2d(hidden, dim, 1),
    ))


class Attention(nn.Module):
    """Multi-head self-attention among the ``ws x ws`` tokens of each window, with an optional learned
    relative-position bias (``rel_pos_bias``, one value per head and relative offset).

    Takes and returns (b, nh, nw, ws, ws, c).
    """

    def __init__(self, dim: int, dim_head: int = 32, dropout: float = 0.0, window_size: int = 7,
                 with_pe: bool = True) -> None:
        super().__init__()
        if dim_head < 1 or dim % dim_head:
            raise ArchArgumentError("num_feat", f"OmniSR attention: dim {dim} is not a multiple of the head size "
                                    f"{dim_head}")
        self.heads = dim // dim_head
        self.scale = dim_head**-0.5
        self.with_pe = with_pe
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.attend = nn.Sequential(nn.Softmax(dim=-1), nn.Dropout(dropout))
        self.to_out = nn.Sequential(nn.Linear(dim, dim, bias=False), nn.Dropout(dropout))
        if with_pe:
            span = 2 * window_size - 1
            self.rel_pos_bias = nn.Embedding(span**2, self.heads)
            coords = torch.stack(torch.meshgrid(torch.arange(window_size), torch.arange(window_size),
                                                indexing="ij")).flatten(1)  # (2, n)
            rel = coords[:, :, None] - coords[:, None, :] + (window_size - 1)  # (2, n, n)
            self.register_buffer("rel_pos_indices", rel[0] * span + rel[1], persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, nh, nw, wh, ww, c = x.shape
        heads = self.heads
        tokens = x.reshape(b * nh * nw, wh * ww, c)
        q, k, v = (t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(1, 2)
                   for t in self.to_qkv(tokens).chunk(3, dim=-1))
        sim = (q * self.scale) @ k.transpose(-2, -1)
        if self.with_pe:
            sim = sim + self.rel_pos_bias(self.rel_pos_indices).permute(2, 0, 1)
        attn = self.attend(sim.float()).to(v.dtype)
        out = (attn @ v).transpose(1, 2).reshape(b * nh * nw, wh, ww, c)
        return self.to_out(out).reshape(b, nh, nw, wh, ww, c)


class ChannelAttention(nn.Module):
    """Transposed (channel x channel) attention per head, inside each ``ws x ws`` window; the tokens are
    the window's pixels. q and k are L2-normalised; ``temperature`` scales the logits per head."""

    grid = False

    def __init__(self, dim: int, heads: int, bias: bool = False, dropout: float = 0.0, window_size: int = 7) -> None:
        super().__init__()
        del dropout  # accepted for the original signature (unused there too)
        if dim % heads:
            raise ArchArgumentError("num_feat", f"OmniSR channel attention: dim {dim} is not a multiple of "
                                    f"{heads} heads")
        self.heads = heads
        self.temperature = nn.Parameter(torch.ones(heads, 1, 1))
        self.ps = window_size
        self.qkv = nn.Conv2d(dim, dim * 3, kernel_size=1, bias=bias)
        self.qkv_dwconv = nn.Conv2d(dim * 3, dim * 3, kernel_size=3, stride=1, padding=1, groups=dim * 3,
                                    bias=bias)
        self.project_out = nn.Conv2d(dim, dim, kernel_size=1, bias=bias)

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        """(b, c, H, W) -> (b, groups, heads, c/heads, members) with windows (or grid positions) as groups."""
        b, c, h, w = t.shape
        ps, nh, nw = self.ps, h // self.ps, w // self.ps
        t = t.reshape(b, self.heads, c // self.heads, nh, ps, nw, ps)
        if self.grid:  # groups: position inside the window; members: the windows
            return t.permute(0, 4, 6, 1, 2, 3, 5).reshape(b, ps * ps, self.heads, c // self.heads, nh * nw)
        return t.permute(0, 3, 5, 1, 2, 4, 6).reshape(b, nh * nw, self.heads, c // self.heads, ps * ps)

    def _merge(self, t: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, _, heads, d, _ = t.shape
        ps, nh, nw = self.ps, h // self.ps, w // self.ps
        if self.grid:
            t = t.reshape(b, ps, ps, heads, d, nh, nw).permute(0, 3, 4, 5, 1, 6, 2)
        else:
            t = t.reshape(b, nh, nw, heads, d, ps, ps).permute(0, 3, 4, 1, 5, 2, 6)
        return t.reshape(b, heads * d, h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        q, k, v = (self._split(t) for t in self.qkv_dwconv(self.qkv(x)).chunk(3, dim=1))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        attn = ((q @ k.transpose(-2, -1)) * self.temperature).float().softmax(dim=-1).to(v.dtype)
        return self.project_out(self._merge(attn @ v, h, w))


class ChannelAttentionGrid(ChannelAttention):
    """``ChannelAttention`` across the grid: one group per position inside the window, the windows as tokens."""

    grid = True


class OSABlock(nn.Module):
    """MBConv, window attention, gated FFN, window channel attention, gated FFN, grid attention, gated FFN,
    grid channel attention, gated FFN (``layer`` indices as in the original, layout steps included)."""

    def __init__(self, channel_num: int = 64, window_size: int = 8, with_pe: bool = False,
                 dropout: float = 0.0) -> None:
        super().__init__()
        dim, ws = channel_num, window_size

        def gated() -> ConvPreNormResidual:
            return ConvPreNormResidual(dim, GatedConvFeedForward(dim=dim))

        def attention() -> PreNormResidual:
            return PreNormResidual(dim, Attention(dim=dim, dim_head=dim // 4, dropout=dropout, window_size=ws,
                                                  with_pe=with_pe))

        self.layer = nn.Sequential(
            mbconv(dim, expansion_rate=1, shrinkage_rate=0.25),
            _ToWindows(ws, grid=False), attention(), _FromWindows(grid=False),
            gated(),
            ConvPreNormResidual(dim, ChannelAttention(dim=dim, heads=4, window_size=ws)),
            gated(),
            _ToWindows(ws, grid=True), attention(), _FromWindows(grid=True),
            gated(),
            ConvPreNormResidual(dim, ChannelAttentionGrid(dim=dim, heads=4, window_size=ws)),
            gated(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class ESA(nn.Module):
    """Enhanced spatial attention: a strided conv + max-pool pyramid gives a sigmoid mask over the image."""

    def __init__(self, esa_channels: int, n_feats: int) -> None:
        super().__init__()
        f = esa_channels
        self.conv1 = nn.Conv2d(n_feats, f, kernel_size=1)
        self.conv_f = nn.Conv2d(f, f, kernel_size=1)
        self.conv2 = nn.Conv2d(f, f, kernel_size=3, stride=2, padding=0)
        self.conv3 = nn.Conv2d(f, f, kernel_size=3, padding=1)
        self.conv4 = nn.Conv2d(f, n_feats, kernel_size=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        reduced = self.conv1(x)
        pooled = F.max_pool2d(self.conv2(reduced), kernel_size=7, stride=3)
        coarse = resize_bilinear(self.conv3(pooled), (x.shape[-2], x.shape[-1]), False)  # XLA: a backward too
        return x * torch.sigmoid(self.conv4(coarse + self.conv_f(reduced)))


class OSAG(nn.Module):
    """A group of OSA blocks and a 1x1 conv with a shortcut, then ESA."""

    def __init__(self, channel_num: int = 64, bias: bool = True, block_num: int = 4, window_size: int = 0,
                 pe: bool = False) -> None:
        super().__init__()
        blocks: list[nn.Module] = [OSABlock(channel_num, window_size=window_size, with_pe=pe)
                                   for _ in range(block_num)]
        blocks.append(nn.Conv2d(channel_num, channel_num, 1, 1, 0, bias=bias))
        self.residual_layer = nn.Sequential(*blocks)
        self.esa = ESA(max(channel_num // 4, 16), channel_num)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.esa(self.residual_layer(x) + x)


@ARCH_REGISTRY.register()
class OmniSR(nn.Module):
    """Omni-SR: 3x3 conv, ``res_num`` OSA groups, 3x3 conv with a long shortcut, PixelShuffle head.

    Args:
        num_in_ch, num_out_ch: image channels. num_feat: width (a multiple of 4: four attention heads).
        block_num: OSA blocks per group. pe: relative-position bias in the self-attentions.
        window_size: attention window (inputs are padded to a multiple of it). res_num: groups.
        up_scale: integer scale >= 1. bias: biases in the plain convs.
    """

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, num_feat: int = 64, block_num: int = 1,
                 pe: bool = True, window_size: int = 8, res_num: int = 1, up_scale: int = 4,
                 bias: bool = True) -> None:
        super().__init__()
        if isinstance(up_scale, bool) or not isinstance(up_scale, int) or up_scale < 1:
            raise ArchArgumentError("up_scale", f"OmniSR needs an integer up_scale >= 1, got {up_scale!r}")
        if isinstance(window_size, bool) or not isinstance(window_size, int) or window_size < 1:
            raise ArchArgumentError("window_size", f"OmniSR needs an integer window_size >= 1, got {window_size!r}")
        if num_feat < 4 or num_feat % 4:
            raise ArchArgumentError("num_feat", f"OmniSR needs num_feat to be a multiple of 4 (four attention "
                                    f"heads), got {num_feat!r}")
        self.res_num = res_num
        self.up_scale = up_scale
        self.upscale = up_scale  # the name other code reads
        self.in_channels = num_in_ch  # the first Conv2d registered is not the input conv
        self.window_size = window_size
        self.residual_layer = nn.Sequential(*[
            OSAG(channel_num=num_feat, bias=bias, block_num=block_num, window_size=window_size, pe=pe)
            for _ in range(res_num)
        ])
        self.input = nn.Conv2d(num_in_ch, num_feat, kernel_size=3, stride=1, padding=1, bias=bias)
        self.output = nn.Conv2d(num_feat, num_feat, kernel_size=3, stride=1, padding=1, bias=bias)
        self.up = nn.Sequential(nn.Conv2d(num_feat, num_out_ch * up_scale**2, 3, padding=1, bias=bias),
                                nn.PixelShuffle(up_scale))
        self.register_load_state_dict_pre_hook(_drop_profiler_counters)

    @property
    def tile_multiple(self) -> int:
        """Input sides that are a multiple of this need no padding (the attention window)."""
        return self.window_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x = pad_to_min_size(x, MIN_SIZE)
        ws = self.window_size
        pad_h, pad_w = (-x.shape[-2]) % ws, (-x.shape[-1]) % ws
        if pad_h or pad_w:
            x = F.pad(x, (0, pad_w, 0, pad_h))
        feat = self.input(x)
        out = self.up(self.output(self.residual_layer(feat)) + feat)
        return out[..., : h * self.up_scale, : w * self.up_scale]


__all__ = ["OmniSR", "OSABlock", "OSAG", "ESA"]


# Published variants by name (traiNNer-redux's and neosr's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
# neosr's omnisr names the scale `upsampling`.
register_presets("OmniSR", scale_arg="up_scale", renames={"upsampling": "up_scale"}, presets={
    "omnisr": {"res_num": 5},  # 0.81 M parameters at x4
})


def _recognise(s: StateShapes) -> list[dict]:
    """OmniSR from its tensors: image channels, width and bias from the input conv, groups and blocks per group
    from the body, the window from the relative-position tables (2 * window - 1 squared rows; without them
    the window shows in no tensor: 8 is proposed), the scale and output channels from the head."""
    cin, feat = s.dim("input.weight", 1), s.dim("input.weight", 0)
    block_num = s.count("residual_layer.0.residual_layer.") - 1
    table = "residual_layer.0.residual_layer.0.layer.2.fn.rel_pos_bias.weight"
    common: dict = {"num_in_ch": cin, "num_feat": feat, "block_num": block_num, "res_num": s.count("residual_layer."),
                    "bias": "input.bias" in s, "pe": table in s}
    if common["pe"]:
        common["window_size"] = (round(s.dim(table, 0) ** 0.5) + 1) // 2
    return [{**common, "num_out_ch": c, "up_scale": sc}
            for c, sc in shuffle_splits(s.dim("up.0.weight", 0), tuple(dict.fromkeys((cin, 3, 1))))]


register_recogniser("OmniSR", _recognise)

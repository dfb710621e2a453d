"""CRAFT: Cross-Refinement Adaptive Fusion Transformer for lightweight super-resolution (Li, Dong, Zhang, Lu and
Wang, ICCV 2023).

Each residual group (RCRFG) runs, per stage, two rectangular-window attention blocks (SRWAB: half the channels in
``split_size_0 x split_size_1`` windows, the other half in the transposed windows, the second block shifted by
half a window, no shift mask, plus a depth-wise conv of the values) for the low frequencies, a high-frequency
enhancement residual block (HFERB: conv branch and max-pool branch) on the same input, and a hybrid fusion block
(HFB: channel attention with queries from the high-frequency branch and keys / values from the low-frequency one,
then a gated depth-wise feed-forward). A one-step pixel-shuffle reconstructs the image.

Constructor arguments, module names and buffers follow spandrel 0.4.2's ``CRAFT`` (the authors' names), so
released checkpoints load with ``strict=True``.

Size requirement: any size. As spandrel's call API, the input is first padded at the bottom / right to a multiple
of ``window_size`` (reflect, then replicate); then, as the authors' forward, it is extended by one more window of
its mirror image (always: their padding is never zero), run, and the output cropped back.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import (
    ArchArgumentError,
    LayerNorm2d,
    Mlp,
    SwinSRBase,
    UpsampleOneStep,
    pad_to_multiple,
    relative_position_index,
    to_feature_map,
    to_tokens,
    window_attention,
)
from anysr.archs.dat_arch import DynamicPosBias
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.archs.recognition.recognise_util import clean, resi_connection, window_pair
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

FFN_EXPANSION = 2.66  # the hybrid fusion blocks' feed-forward width (fixed by the authors)


def offset_table(window: tuple[int, int]) -> torch.Tensor:
    """((2wh-1)(2ww-1), 2) float (row, column) offsets, row offset major: the position-bias MLP's input."""
    wh, ww = window
    grid = torch.meshgrid(torch.arange(1 - wh, wh), torch.arange(1 - ww, ww), indexing="ij")
    return torch.stack(grid).flatten(1).transpose(0, 1).float().contiguous()


class ChannelLayerNorm(nn.Module):
    """Layer norm over the channels of an NCHW map, with bias, eps 1e-5 (parameters under ``body``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.body = LayerNorm2d(dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class RectWindowAttention(nn.Module):
    """Self attention in ``split_size`` windows (``idx`` 0) or the transposed windows (``idx`` 1), with a bias
    from a small MLP (``pos``) of the offsets; the network holds the offset tables and indices."""

    def __init__(self, dim: int, idx: int, split_size: Sequence[int] = (2, 4), num_heads: int = 6,
                 qk_scale: float | None = None) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.idx = idx
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.H_sp, self.W_sp = (split_size[0], split_size[1]) if idx == 0 else (split_size[1], split_size[0])
        self.pos = DynamicPosBias(dim // 4, num_heads, residual=False)

    def forward(self, qkv: torch.Tensor, h: int, w: int, rpi: torch.Tensor, rpe_biases: torch.Tensor) -> torch.Tensor:
        """qkv: (3, b, h*w, c) -> (b, h, w, c); h, w multiples of the window."""
        _, b, _, c = qkv.shape
        hs, ws = self.H_sp, self.W_sp
        n = hs * ws
        t = qkv.reshape(3, b, h // hs, hs, w // ws, ws, self.num_heads, c // self.num_heads)
        t = t.permute(0, 1, 2, 4, 6, 3, 5, 7).reshape(3, -1, self.num_heads, n, c // self.num_heads)
        bias = self.pos(rpe_biases)[rpi.reshape(-1)].view(n, n, -1).permute(2, 0, 1)
        out = window_attention(t[0], t[1], t[2], bias, None, scale=self.scale)  # (b*windows, heads, n, d)
        out = out.reshape(b, h // hs, w // ws, self.num_heads, hs, ws, -1).permute(0, 1, 4, 2, 5, 3, 6)
        return out.reshape(b, h, w, c)


class SRWAB(nn.Module):
    """Shifted rectangle-window attention block: pre-norm two-branch window attention plus a depth-wise conv of
    the values, then a pre-norm MLP; both residual."""

    def __init__(self, dim: int, num_heads: int, split_size: Sequence[int] = (2, 2),
                 shift_size: Sequence[int] = (0, 0), mlp_ratio: float = 2.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, act_layer: type[nn.Module] = nn.GELU,
                 norm_layer: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.dim = dim
        self.shift_size = tuple(shift_size)
        self.mlp_ratio = mlp_ratio
        self.norm1 = norm_layer(dim)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.branch_num = 2
        self.get_v = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)
        self.attns = nn.ModuleList([RectWindowAttention(dim // 2, i, split_size, num_heads // 2, qk_scale)
                                    for i in range(self.branch_num)])
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], tables: dict[str, torch.Tensor]) -> torch.Tensor:
        h, w = x_size
        b, n, c = x.shape
        half = c // 2
        qkv = self.qkv(self.norm1(x)).view(b, n, 3, c).permute(2, 0, 1, 3)  # (3, b, n, c)
        values = to_feature_map(qkv[2], h, w)
        s0, s1 = self.shift_size
        shifted = s0 > 0 or s1 > 0
        grid = qkv.reshape(3, b, h, w, c)
        outs = []
        for attn, part, shift, key in ((self.attns[0], grid[..., :half], (s0, s1), "h"),
                                       (self.attns[1], grid[..., half:], (s1, s0), "v")):
            if shifted:
                part = torch.roll(part, shifts=(-shift[0], -shift[1]), dims=(2, 3))
            y = attn(part.reshape(3, b, n, half), h, w, tables[f"rpi_{key}"], tables[f"biases_{key}"])
            if shifted:
                y = torch.roll(y, shifts=shift, dims=(1, 2))
            outs.append(y)
        attended = torch.cat(outs, dim=-1).reshape(b, n, c) + to_tokens(self.get_v(values))
        x = x + self.proj(attended)
        return x + self.mlp(self.norm2(x))


class HFERB(nn.Module):
    """High-frequency enhancement residual block: a 3x3 conv on half the channels, 3x3 max pooling and a 1x1 conv
    on the other half, fused by a 1x1 conv onto the input."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mid_dim = dim // 2
        self.dim = dim
        self.act = nn.GELU()
        self.last_fc = nn.Conv2d(dim, dim, 1)
        self.fc = nn.Conv2d(self.mid_dim, self.mid_dim, 1)
        self.max_pool = nn.MaxPool2d(3, 1, 1)
        self.conv = nn.Conv2d(self.mid_dim, self.mid_dim, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        low = self.act(self.conv(x[:, : self.mid_dim]))
        high = self.act(self.fc(self.max_pool(x[:, self.mid_dim:])))
        return x + self.last_fc(torch.cat([low, high], dim=1))


class CrossChannelAttention(nn.Module):
    """Channel ("transposed") attention across two maps: queries from ``high``, keys / values from ``low``, each a
    1x1 then depth-wise 3x3 conv; cosine similarity times a learned per-head ``temperature``."""

    def __init__(self, dim: int, num_heads: int, bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dim = dim
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.q = nn.Conv2d(dim, dim, kernel_size=1, bias=bias)
        self.q_dwconv = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim, bias=bias)
        self.kv = nn.Conv2d(dim, dim * 2, kernel_size=1, bias=bias)
        self.kv_dwconv = nn.Conv2d(dim * 2, dim * 2, kernel_size=3, stride=1, padding=1, groups=dim * 2, bias=bias)
        self.project_out = nn.Conv2d(dim, dim, kernel_size=1, bias=bias)

    def forward(self, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        b, c, h, w = low.shape
        heads = self.num_heads
        q = self.q_dwconv(self.q(high)).reshape(b, heads, c // heads, h * w)
        k, v = self.kv_dwconv(self.kv(low)).reshape(b, 2, heads, c // heads, h * w).unbind(1)
        q = F.normalize(q, dim=-1) * self.temperature.to(q.dtype)
        out = F.scaled_dot_product_attention(q, F.normalize(k, dim=-1), v, scale=1.0)
        return self.project_out(out.reshape(b, c, h, w))


class GatedFeedForward(nn.Module):
    """1x1 conv to two branches, depth-wise 3x3, GELU(first) * second, 1x1 conv back (no biases in CRAFT)."""

    def __init__(self, dim: int, ffn_expansion_factor: float, bias: bool) -> None:
        super().__init__()
        hidden = int(dim * ffn_expansion_factor)
        self.hid_fea = hidden
        self.dim = dim
        self.project_in = nn.Conv2d(dim, hidden * 2, kernel_size=1, bias=bias)
        self.dwconv = nn.Conv2d(hidden * 2, hidden * 2, kernel_size=3, stride=1, padding=1, groups=hidden * 2,
                                bias=bias)
        self.project_out = nn.Conv2d(hidden, dim, kernel_size=1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, g = self.dwconv(self.project_in(x)).chunk(2, dim=1)
        return self.project_out(F.gelu(a) * g)


class HFB(nn.Module):
    """Hybrid fusion block: pre-norm cross channel attention (residual on ``low``), pre-norm gated feed-forward."""

    def __init__(self, dim: int, num_heads: int, ffn_expansion_factor: float = FFN_EXPANSION,
                 bias: bool = False) -> None:
        super().__init__()
        self.norm1 = ChannelLayerNorm(dim)
        self.attn = CrossChannelAttention(dim, num_heads, bias)
        self.norm2 = ChannelLayerNorm(dim)
        self.ffn = GatedFeedForward(dim, ffn_expansion_factor, bias)
        self.dim = dim

    def forward(self, low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
        x = low + self.attn(self.norm1(low), high)
        return x + self.ffn(self.norm2(x))


class CRFB(nn.Module):
    """Cross-refinement fusion block: ``depth`` stages of (plain SRWAB, shifted SRWAB) -> low, HFERB -> high,
    HFB(low, high)."""

    def __init__(self, dim: int, depth: int, num_heads: int, split_size_0: int = 7, split_size_1: int = 7,
                 mlp_ratio: float = 2.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 norm_layer: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.depth = depth
        half_window = (split_size_0 // 2, split_size_1 // 2)
        self.srwa_blocks = nn.ModuleList([
            SRWAB(dim, num_heads, split_size=(split_size_0, split_size_1),
                  shift_size=(0, 0) if i % 2 == 0 else half_window, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias,
                  qk_scale=qk_scale, norm_layer=norm_layer)
            for i in range(2 * depth)
        ])
        self.hfer_blocks = nn.ModuleList([HFERB(dim) for _ in range(depth)])
        self.hf_blocks = nn.ModuleList([HFB(dim, num_heads, FFN_EXPANSION, bias=False) for _ in range(depth)])

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], tables: dict[str, torch.Tensor]) -> torch.Tensor:
        h, w = x_size
        for i in range(self.depth):
            low = to_tokens(x)
            low = self.srwa_blocks[2 * i + 1](self.srwa_blocks[2 * i](low, x_size, tables), x_size, tables)
            x = self.hf_blocks[i](to_feature_map(low, h, w), self.hfer_blocks[i](x))
        return x


class RCRFG(nn.Module):
    """Residual cross-refinement fusion group: a CRFB, a 3x3 conv and a shortcut."""

    def __init__(self, dim: int, depth: int, num_heads: int, mlp_ratio: float = 2.0, qkv_bias: bool = True,
                 qk_scale: float | None = None, split_size_0: int = 2, split_size_1: int = 2,
                 norm_layer: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.dim = dim
        self.residual_group = CRFB(dim, depth, num_heads, split_size_0, split_size_1, mlp_ratio, qkv_bias, qk_scale,
                                   norm_layer)
        self.conv = nn.Conv2d(dim, dim, 3, 1, 1)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], tables: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.conv(self.residual_group(x, x_size, tables)) + x


def mirror_extend(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Append the last ``rows`` rows / ``cols`` columns mirrored (edge included) at the bottom / right."""
    if rows:
        x = torch.cat([x, x[:, :, x.shape[2] - rows:].flip(2)], dim=2)
    if cols:
        x = torch.cat([x, x[:, :, :, x.shape[3] - cols:].flip(3)], dim=3)
    return x


@ARCH_REGISTRY.register()
class CRAFT(SwinSRBase):
    """CRAFT (arguments and defaults of spandrel 0.4.2's class): in_chans, window_size (the padding multiple; both
    split sizes must divide it), embed_dim, depths (stages per group), num_heads, split_size_0 / split_size_1
    (window rows / columns of the first branch), mlp_ratio, qkv_bias, qk_scale, norm_layer, upscale (one
    pixel-shuffle step), img_range, resi_connection ('1conv' / 'identity'), rgb_mean (RGB input mean, by default
    DIV2K's; neosr's: 0.5 each).
    """

    def __init__(self, *, in_chans: int = 3, window_size: int = 16, embed_dim: int = 48,
                 depths: Sequence[int] = (2, 2, 2, 2), num_heads: Sequence[int] = (6, 6, 6, 6), split_size_0: int = 4,
                 split_size_1: int = 16, mlp_ratio: float = 2.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 norm_layer: type[nn.Module] = nn.LayerNorm, upscale: int = 4, img_range: float = 1.0,
                 resi_connection: str = "1conv", rgb_mean: Sequence[float] | None = None) -> None:
        super().__init__()
        _check_args(window_size, embed_dim, depths, num_heads, split_size_0, split_size_1, upscale, resi_connection)
        self.window_size = window_size
        self.split_size = (split_size_0, split_size_1)
        self.num_out_ch = in_chans
        self.num_feat = 64
        h_win, v_win = (split_size_0, split_size_1), (split_size_1, split_size_0)
        self.register_buffer("relative_position_index_h", relative_position_index(h_win))
        self.register_buffer("relative_position_index_v", relative_position_index(v_win))
        self.register_buffer("biases_v", offset_table(v_win))
        self.register_buffer("biases_h", offset_table(h_win))
        self.init_shallow(in_chans, embed_dim, len(depths), img_range, upscale, "pixelshuffledirect", rgb_mean)
        self.mlp_ratio = mlp_ratio
        self.layers = nn.ModuleList([
            RCRFG(embed_dim, depths[i], num_heads[i], mlp_ratio, qkv_bias, qk_scale, split_size_0, split_size_1,
                  norm_layer)
            for i in range(len(depths))
        ])
        self.norm = ChannelLayerNorm(embed_dim)
        self.conv_after_body = nn.Conv2d(embed_dim, embed_dim, 3, 1, 1) if resi_connection == "1conv" \
            else nn.Identity()
        self.upsample = UpsampleOneStep(upscale, embed_dim, in_chans)
        self.init_swin_weights()

    @property
    def tile_multiple(self) -> int:
        return self.window_size

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x_size = (x.shape[2], x.shape[3])
        tables = {"rpi_h": self.relative_position_index_h, "rpi_v": self.relative_position_index_v,
                  "biases_h": self.biases_h.to(x.dtype), "biases_v": self.biases_v.to(x.dtype)}
        for layer in self.layers:
            x = layer(x, x_size, tables)
        return self.norm(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, self.window_size)
        x = mirror_extend(x, self.window_size, self.window_size)
        mean = self.mean.to(dtype=x.dtype)
        out = self.reconstruct((x - mean) * self.img_range) / self.img_range + mean
        return out[..., : h * self.upscale, : w * self.upscale]


def _check_args(window_size: int, embed_dim: int, depths: Sequence[int], num_heads: Sequence[int], s0: int, s1: int,
                upscale: int, resi_connection: str) -> None:
    if resi_connection not in ("1conv", "identity"):
        raise ArchArgumentError("resi_connection", f"CRAFT: unknown resi_connection {resi_connection!r}; use "
                                "'1conv' or 'identity'")
    if not isinstance(upscale, int) or isinstance(upscale, bool) or upscale < 1:
        raise ArchArgumentError("upscale", f"CRAFT: upscale must be a positive integer, got {upscale!r}")
    if len(num_heads) != len(depths):
        raise ArchArgumentError("num_heads", f"CRAFT: num_heads has {len(num_heads)} entries but depths has "
                                f"{len(depths)}; give one head count per group")
    if s0 < 1 or s1 < 1 or not isinstance(window_size, int) or window_size % s0 or window_size % s1:
        raise ArchArgumentError("window_size", f"CRAFT: window_size {window_size!r} must be a multiple of both split "
                                f"sizes ({s0}, {s1})")
    for heads in num_heads:
        if heads < 2 or embed_dim % heads or (embed_dim // 2) % (heads // 2):
            raise ArchArgumentError("num_heads", f"CRAFT: {heads} heads must divide embed_dim {embed_dim}, and "
                                    f"{heads // 2} its half {embed_dim // 2}")
    if (embed_dim // 2) // 4 < 4:
        raise ArchArgumentError("embed_dim", f"CRAFT: embed_dim must be at least 32 (the position-bias MLP is "
                                f"embed_dim / 32 wide), got {embed_dim}")


__all__ = ["CRAFT", "CRFB", "HFB", "HFERB", "SRWAB"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("CRAFT", scale_arg="upscale", presets={
    "craft": {},  # 0.75 M parameters at x4
})


def _recognise(s: StateShapes) -> list[dict]:
    """CRAFT from its tensors: width and channels from the first conv, stages per group (two window blocks each),
    heads from the high-frequency attention's temperature, the rectangle window (``split_size_0/1``) from the
    index and bias buffers, the MLP ratio, the qkv bias, the scale from the one-step upsampler. The padding
    window changes no tensor (the published 16 is kept)."""
    embed, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    groups = s.indices("layers.")
    split = window_pair(s.dim("relative_position_index_h", 0), s.dim("biases_h", 0))
    block = "layers.0.residual_group.srwa_blocks.0"
    common = {"in_chans": cin, "embed_dim": embed,
              "depths": [s.count(f"layers.{i}.residual_group.hf_blocks.") for i in groups],
              "num_heads": [s.dim(f"layers.{i}.residual_group.hf_blocks.0.attn.temperature", 0) for i in groups],
              "split_size_0": split[0], "split_size_1": split[1],
              "mlp_ratio": clean(s.dim(f"{block}.mlp.fc1.weight", 0) / embed), "qkv_bias": f"{block}.qkv.bias" in s,
              "resi_connection": resi_connection(s, "conv_after_body")}
    return [{**common, "upscale": scale} for out, scale in shuffle_splits(s.dim("upsample.0.weight", 0), (cin,))
            if out == cin]


register_recogniser("CRAFT", _recognise)

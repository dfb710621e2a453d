"""Uformer: a U-shaped transformer for image restoration (Wang et al., CVPR 2022).

Module names and constructor arguments follow spandrel 0.4.2's ``Uformer``, so released checkpoints (denoising,
deblurring, deraining) load with ``strict=True`` and give the same output. A 3x3 conv (LeakyReLU) embeds the image;
four encoder stages of LeWin blocks (window attention with a learned relative-position bias, alternately shifted,
then a feed-forward: ``leff`` with a depth-wise conv, ``fastleff`` with a full conv, or a plain ``mlp``), each
followed by a stride-2 4x4 conv that doubles the width; a bottleneck stage; four decoder stages, each after a 2x2
transposed conv and a concatenation with the encoder's map; a 3x3 conv back to the image, plus the input when the
network reads 3 channels (``dd_in``). ``modulator`` adds a learned embedding to each window's tokens in the decoder;
``cross_modulator`` lets every token attend to learned tokens first.

As in the reference, a stage whose resolution at ``img_size`` is no larger than ``win_size`` uses one window of that
resolution, unshifted (``img_size`` fixes the layout). The reference reads the map's side from the token count, so
it takes square inputs whose side is a multiple of 16 windows; here stages keep both sides, so any input works: it
is padded at the bottom / right to ``tile_multiple`` (the least common multiple of each stage's window times its
downsampling) by reflection (edge replication past the side) and the output cropped. The per-pixel input ``mask``
of the reference's forward is not part of an image-to-image network and is not taken.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    pad_bottom_right,
    relative_position_index,
    run_checkpointed,
    shifted_window_mask,
    window_attention,
)
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY

TOKEN_MLPS = ("leff", "fastleff", "mlp", "ffn")


class SepConv2d(nn.Module):
    """Depth-wise conv, ReLU, point-wise conv."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0) -> None:
        super().__init__()
        self.depthwise = nn.Conv2d(in_channels, in_channels, kernel_size, stride, padding, groups=in_channels)
        self.pointwise = nn.Conv2d(in_channels, out_channels, 1)
        self.act_layer = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pointwise(self.act_layer(self.depthwise(x)))


class ConvProjection(nn.Module):
    """q, k, v by separable convs over each window on its own (zero-padded at the window's border)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = SepConv2d(dim, dim, 3, 1, 1)
        self.to_k = SepConv2d(dim, dim, 3, 1, 1)
        self.to_v = SepConv2d(dim, dim, 3, 1, 1)

    def maps(self, x: torch.Tensor) -> torch.Tensor:
        """(b * windows, n, 3c) from (b * windows, n, c) window tokens: q, k and v side by side."""
        bw, n, c = x.shape
        ws = math.isqrt(n)
        img = x.transpose(1, 2).reshape(bw, c, ws, ws)
        out = torch.cat([self.to_q(img), self.to_k(img), self.to_v(img)], 1)
        return out.reshape(bw, 3 * c, n).transpose(1, 2)


class LinearProjection(nn.Module):
    """q from the tokens, k and v from the tokens (or from given key tokens)."""

    def __init__(self, dim: int, heads: int, bias: bool = True) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=bias)
        self.to_kv = nn.Linear(dim, dim * 2, bias=bias)

    def maps(self, x: torch.Tensor) -> torch.Tensor:
        """(..., 3c): q, k and v side by side."""
        return torch.cat([self.to_q(x), self.to_kv(x)], -1)


def _split_heads(qkv: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(bw, n, 3c) -> q, k, v of (bw, heads, n, c / heads)."""
    bw, n, c3 = qkv.shape
    q, k, v = qkv.reshape(bw, n, 3, heads, c3 // (3 * heads)).permute(2, 0, 3, 1, 4).unbind(0)
    return q, k, v


class WindowAttention(nn.Module):
    """Multi-head attention inside windows with a learned relative-position bias (Swin's table layout; the index is
    a persistent buffer, as released checkpoints carry it)."""

    def __init__(self, dim: int, win_size: int, num_heads: int, token_projection: str = "linear",
                 qkv_bias: bool = True, qk_scale: float | None = None, attn_drop: float = 0.0,
                 proj_drop: float = 0.0) -> None:
        super().__init__()
        self.win_size, self.num_heads = win_size, num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * win_size - 1) ** 2, num_heads))
        self.register_buffer("relative_position_index", relative_position_index(win_size))
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)
        self.qkv = ConvProjection(dim, num_heads) if token_projection == "conv" else \
            LinearProjection(dim, num_heads, qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def bias(self) -> torch.Tensor:
        """(heads, n, n) relative-position bias."""
        n = self.win_size * self.win_size
        idx = self.relative_position_index.reshape(-1)
        return self.relative_position_bias_table.index_select(0, idx).reshape(n, n, -1).permute(2, 0, 1)

    def forward(self, qkv: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """``qkv``: (b * windows, n, 3c) projected tokens; returns (b * windows, n, c)."""
        q, k, v = _split_heads(qkv, self.num_heads)
        out = window_attention(q, k, v, self.bias(), mask, scale=self.scale,
                               dropout_p=self.attn_drop if self.training else 0.0)
        out = out.transpose(1, 2).reshape(qkv.shape[0], qkv.shape[1], -1)
        return self.proj_drop(self.proj(out))


class Attention(nn.Module):
    """Every token attends to a set of learned key tokens (the cross modulator)."""

    def __init__(self, dim: int, num_heads: int, qkv_bias: bool = True, qk_scale: float | None = None,
                 attn_drop: float = 0.0, proj_drop: float = 0.0) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.qkv = LinearProjection(dim, num_heads, qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``x``: (b, L, c) tokens; ``keys``: (m, c) learned tokens."""
        b, n, c = x.shape
        nh = self.num_heads
        q = self.qkv.to_q(x).reshape(b, n, nh, c // nh).transpose(1, 2)
        k, v = self.qkv.to_kv(keys).reshape(1, -1, 2, nh, c // nh).permute(2, 0, 3, 1, 4).unbind(0)
        out = F.scaled_dot_product_attention(q, k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1),
                                             dropout_p=self.attn_drop if self.training else 0.0, scale=self.scale)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))


class Mlp(nn.Module):
    """fc1, GELU, dropout, fc2, dropout."""

    def __init__(self, dim: int, hidden: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class LeFF(nn.Module):
    """Locally-enhanced feed-forward: linear + GELU, 3x3 conv (depth-wise; full for ``fastleff``) + GELU, linear;
    on (b, h, w, c) tokens."""

    def __init__(self, dim: int, hidden: int, depthwise: bool = True) -> None:
        super().__init__()
        self.linear1 = nn.Sequential(nn.Linear(dim, hidden), nn.GELU())
        self.dwconv = nn.Sequential(nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden if depthwise else 1), nn.GELU())
        self.linear2 = nn.Sequential(nn.Linear(hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dwconv(self.linear1(x).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return self.linear2(y)


class LeWinTransformerBlock(nn.Module):
    """[cross modulator], then ``x + drop(W-MSA(norm1(x)))``, then ``x + drop(ffn(norm2(x)))`` on (b, h, w, c)."""

    def __init__(self, dim: int, resolution: int, num_heads: int, win_size: int = 8, shift_size: int = 0,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None, drop: float = 0.0,
                 attn_drop: float = 0.0, drop_path: float = 0.0, token_projection: str = "linear",
                 token_mlp: str = "leff", modulator: bool = False, cross_modulator: bool = False) -> None:
        super().__init__()
        self.win_size, self.shift_size = win_size, shift_size
        if resolution <= win_size:  # one window covers the stage (at img_size): no shift
            self.shift_size, self.win_size = 0, resolution
        self.modulator = nn.Embedding(win_size * win_size, dim) if modulator else None
        self.cross_modulator = nn.Embedding(win_size * win_size, dim) if cross_modulator else None
        if cross_modulator:
            self.cross_attn = Attention(dim, num_heads, qkv_bias, qk_scale, attn_drop, drop)
            # the reference computes this norm and discards it: kept for its checkpoints, never trained
            self.norm_cross = nn.LayerNorm(dim).requires_grad_(False)
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, self.win_size, num_heads, token_projection, qkv_bias, qk_scale, attn_drop,
                                    drop)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = Mlp(dim, hidden, drop) if token_mlp in ("mlp", "ffn") else \
            LeFF(dim, hidden, depthwise=token_mlp == "leff")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        ws, s = self.win_size, self.shift_size
        if self.cross_modulator is not None:
            x = x + self.cross_attn(x.reshape(b, h * w, c), self.cross_modulator.weight).reshape(b, h, w, c)
        y = self.norm1(x)
        if s:
            y = torch.roll(y, shifts=(-s, -s), dims=(1, 2))
        windows = y.reshape(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, c)
        if self.modulator is not None:
            windows = windows + self.modulator.weight
        qkv = self.attn.qkv.maps(windows)
        mask = shifted_window_mask(h, w, ws, s, device=x.device) if s else None
        out = self.attn(qkv, mask)
        out = out.reshape(b, h // ws, w // ws, ws, ws, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)
        if s:
            out = torch.roll(out, shifts=(s, s), dims=(1, 2))
        x = x + self.drop_path(out)
        return x + self.drop_path(self.mlp(self.norm2(x)))


class BasicUformerLayer(nn.Module):
    """``depth`` LeWin blocks (odd ones shifted by half a window when ``shift_flag``)."""

    def __init__(self, dim: int, resolution: int, depth: int, num_heads: int, win_size: int,
                 drop_path: Sequence[float], use_checkpoint: bool, shift_flag: bool, **block: Any) -> None:
        super().__init__()
        self.use_checkpoint = use_checkpoint
        self.blocks = nn.ModuleList([
            LeWinTransformerBlock(dim, resolution, num_heads, win_size,
                                  win_size // 2 if shift_flag and i % 2 else 0, drop_path=drop_path[i], **block)
            for i in range(depth)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = run_checkpointed(blk, x, enabled=self.use_checkpoint and self.training)
        return x


class Downsample(nn.Module):
    """4x4 conv, stride 2, on (b, h, w, c) tokens."""

    def __init__(self, in_channel: int, out_channel: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(in_channel, out_channel, 4, 2, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class Upsample(nn.Module):
    """2x2 transposed conv, stride 2, on (b, h, w, c) tokens."""

    def __init__(self, in_channel: int, out_channel: int) -> None:
        super().__init__()
        self.deconv = nn.Sequential(nn.ConvTranspose2d(in_channel, out_channel, 2, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.deconv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class InputProj(nn.Module):
    """3x3 conv and LeakyReLU: image to (b, h, w, c) tokens."""

    def __init__(self, in_channel: int, out_channel: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.Conv2d(in_channel, out_channel, 3, 1, 1), nn.LeakyReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).permute(0, 2, 3, 1)


class OutputProj(nn.Module):
    """3x3 conv: (b, h, w, c) tokens to the image."""

    def __init__(self, in_channel: int, out_channel: int) -> None:
        super().__init__()
        self.proj = nn.Sequential(nn.Conv2d(in_channel, out_channel, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.permute(0, 3, 1, 2))


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.zeros_(m.bias)
        nn.init.ones_(m.weight)


@ARCH_REGISTRY.register()
class Uformer(nn.Module):
    """Uformer (see the module docstring). ``patch_norm`` is accepted for the original signature (unused there
    too); ``use_checkpoint`` recomputes each block in backward."""

    def __init__(self, *, img_size: int = 256, in_chans: int = 3, dd_in: int = 3, embed_dim: int = 32,
                 depths: Sequence[int] = (2, 2, 2, 2, 2, 2, 2, 2, 2),
                 num_heads: Sequence[int] = (1, 2, 4, 8, 16, 16, 8, 4, 2), win_size: int = 8,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, qk_scale: float | None = None,
                 drop_rate: float = 0.0, attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1,
                 patch_norm: bool = True, use_checkpoint: bool = False, token_projection: str = "linear",
                 token_mlp: str = "leff", shift_flag: bool = True, modulator: bool = False,
                 cross_modulator: bool = False) -> None:
        super().__init__()
        del patch_norm
        if len(depths) != 9 or len(num_heads) != 9:
            raise ArchArgumentError("depths", f"Uformer needs 9 depths and 9 num_heads (4 encoder stages, the "
                                    f"bottleneck, 4 decoder stages), not {len(depths)} and {len(num_heads)}")
        if token_mlp not in TOKEN_MLPS:
            raise ArchArgumentError("token_mlp", f"Uformer's token_mlp is one of {', '.join(TOKEN_MLPS)}, not "
                                    f"{token_mlp!r}")
        if token_projection not in ("linear", "conv"):
            raise ArchArgumentError("token_projection", f"Uformer's token_projection is 'linear' or 'conv', not "
                                    f"{token_projection!r}")
        if win_size < 1 or img_size < 16:
            raise ArchArgumentError("img_size", f"Uformer needs img_size >= 16 and win_size >= 1, not {img_size} "
                                    f"and {win_size}")
        widths = [embed_dim, 2 * embed_dim, 4 * embed_dim, 8 * embed_dim, 16 * embed_dim,
                  16 * embed_dim, 8 * embed_dim, 4 * embed_dim, 2 * embed_dim]
        for i, (width, heads) in enumerate(zip(widths, num_heads, strict=True)):
            if heads < 1 or width % heads:
                raise ArchArgumentError("num_heads", f"Uformer's stage {i} has {width} channels, not a multiple of "
                                        f"its {heads} heads")
        self.in_chans, self.dd_in, self.num_in_ch = in_chans, dd_in, dd_in
        self.embed_dim, self.win_size = embed_dim, win_size
        self.pos_drop = nn.Dropout(drop_rate)
        enc = [r.item() for r in torch.linspace(0, drop_path_rate, sum(depths[:4]), device="cpu")]
        dec = enc[::-1]
        bounds = [sum(depths[5:5 + i]) for i in range(5)]
        block = dict(mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop_rate,
                     attn_drop=attn_drop_rate, token_projection=token_projection, token_mlp=token_mlp)
        resolutions = [img_size // 2**k for k in (0, 1, 2, 3, 4, 3, 2, 1, 0)]
        windows = [min(r, win_size) for r in resolutions]

        def layer(i: int, rates: Sequence[float], decoder: bool = False) -> BasicUformerLayer:
            extra = dict(modulator=modulator, cross_modulator=cross_modulator) if decoder else {}
            if len(rates) < depths[i]:
                raise ArchArgumentError("depths", f"Uformer's decoder stages take their drop-path rates from the "
                                        f"encoder's (reversed): stage {i} has {depths[i]} blocks, more than the "
                                        f"{len(rates)} left")
            return BasicUformerLayer(widths[i], resolutions[i], depths[i], num_heads[i], win_size, rates,
                                     use_checkpoint, shift_flag, **block, **extra)

        self.input_proj = InputProj(dd_in, embed_dim)
        self.output_proj = OutputProj(2 * embed_dim, in_chans)
        for i in range(4):
            setattr(self, f"encoderlayer_{i}", layer(i, enc[sum(depths[:i]):sum(depths[:i + 1])]))
            setattr(self, f"dowsample_{i}", Downsample(widths[i], widths[i] * 2))
        self.conv = layer(4, [drop_path_rate] * depths[4])
        for i in range(4):
            setattr(self, f"upsample_{i}", Upsample(widths[4 + i], widths[3 - i]))
            setattr(self, f"decoderlayer_{i}", layer(5 + i, dec[bounds[i]:bounds[i + 1]], decoder=True))
        self.tile_multiple = math.lcm(*[w * 2**k for w, k in zip(windows, (0, 1, 2, 3, 4), strict=False)])
        self.apply(_init_weights)

    def no_weight_decay_keywords(self) -> set[str]:
        """Names kept out of weight decay (the reference's list)."""
        return {"relative_position_bias_table"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        m = self.tile_multiple
        x = pad_bottom_right(x, (-h) % m, (-w) % m)
        y = self.pos_drop(self.input_proj(x))
        skips = []
        for i in range(4):
            y = getattr(self, f"encoderlayer_{i}")(y)
            skips.append(y)
            y = getattr(self, f"dowsample_{i}")(y)
        y = self.conv(y)
        for i in range(4):
            y = torch.cat([getattr(self, f"upsample_{i}")(y), skips[3 - i]], -1)
            y = getattr(self, f"decoderlayer_{i}")(y)
        y = self.output_proj(y)
        out = x + y if self.dd_in == 3 else y
        return out[:, :, :h, :w]


def _recognise(s: StateShapes) -> dict[str, Any]:
    """Uformer from its tensors: widths, channels, depths and heads per stage, the window (from the first table),
    the projection, the feed-forward and the modulators. ``img_size`` shows only through stages whose window it
    shrank (their side at img_size); else 256 (the released models) is proposed."""
    suffix = "blocks.0.attn.relative_position_bias_table"
    names = [f"encoderlayer_{i}" for i in range(4)] + ["conv"] + [f"decoderlayer_{i}" for i in range(4)]
    dim = s.dim("input_proj.proj.0.weight", 0)
    if "encoderlayer_0.blocks.0.mlp.fc1.weight" in s:
        token_mlp, hidden = "mlp", s.dim("encoderlayer_0.blocks.0.mlp.fc1.weight", 0)
    else:
        hidden = s.dim("encoderlayer_0.blocks.0.mlp.linear1.0.weight", 0)
        token_mlp = "leff" if s.dim("encoderlayer_0.blocks.0.mlp.dwconv.0.weight", 1) == 1 else "fastleff"
    conv = "encoderlayer_0.blocks.0.attn.qkv.to_q.depthwise.weight" in s
    win = (math.isqrt(s.dim(f"encoderlayer_0.{suffix}", 0)) + 1) // 2
    img_size = 256
    for k, n in enumerate(names[:5]):
        side = (math.isqrt(s.dim(f"{n}.{suffix}", 0)) + 1) // 2
        if side < win:
            img_size = side * 2**k
            break
    return {"img_size": img_size, "dd_in": s.dim("input_proj.proj.0.weight", 1),
            "in_chans": s.dim("output_proj.proj.0.weight", 0),
            "embed_dim": dim, "depths": [s.count(f"{n}.blocks.") for n in names],
            "num_heads": [s.dim(f"{n}.{suffix}", 1) for n in names],
            "win_size": win, "mlp_ratio": hidden / dim,
            "token_projection": "conv" if conv else "linear", "token_mlp": token_mlp,
            "qkv_bias": conv or "encoderlayer_0.blocks.0.attn.qkv.to_q.bias" in s,
            "modulator": "decoderlayer_0.blocks.0.modulator.weight" in s,
            "cross_modulator": "decoderlayer_0.blocks.0.cross_modulator.weight" in s}


register_recogniser("Uformer", _recognise)

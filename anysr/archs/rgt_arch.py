"""RGT: Recursive Generalization Transformer for image super-resolution (Chen, Zhang, Gu, Kong and Yang, ICLR 2024).

A SwinIR-like network (shallow conv, residual groups, pixel-shuffle reconstruction) whose groups alternate two
attentions: L-SA, self attention in rectangular windows (half the channels in ``split_size`` windows, the other
half in the transposed windows, some blocks shifted) plus a depth-wise conv of the values; and RG-SA, where every
token attends to a few "representative" tokens obtained by recursively shrinking the map 4x with a strided
depth-wise conv (global context at linear cost). Each block ends with a learned layer-scale ``gamma`` on its
input. One class covers RGT and RGT-S (they differ in depth only).

Constructor arguments, module names and buffers follow spandrel 0.4.2's ``RGT`` (the authors' names), so released
checkpoints load with ``strict=True``.

Size requirement: any size. L-SA zero-pads its queries / keys / values to a multiple of the larger window side and
crops (as the authors do; ``tile_multiple`` is the side multiple for which that padding is empty); RG-SA needs at
least 16 pixels per side in eval mode (4 in training): smaller inputs are padded at the bottom / right (reflect,
then replicate) and the output cropped, as spandrel's call API does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    SwinSRBase,
    check_upscale,
    drop_path_rates,
    pad_to_min_size,
    residual_conv,
    run_checkpointed,
    shifted_window_mask,
    to_feature_map,
    to_tokens,
)
from anysr.archs.dat_arch import SGFN, Spatial_Attention, _is_shifted, _ToTokens
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, upsample_scale, width_ratio
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

EVAL_MIN_SIZE = 16  # RG-SA shrinks the map at least 16x at inference
TRAIN_MIN_SIZE = 4


def reduction_steps(h: int, w: int, training: bool) -> int:
    """How many times RG-SA shrinks an ``h x w`` map by 4: enough to reach about 4 (training) or 16 (inference)
    pixels on the longer side, at least twice at inference (the authors' rule, float logarithm included)."""
    if training:
        return max(int(math.log(h // 4, 4)), int(math.log(w // 4, 4)))
    return max(int(math.log(h // 16, 4)), int(math.log(w // 16, 4)), 2)


class L_SA(nn.Module):  # noqa: N801 - the authors' class name
    """Rectangular-window self attention on two channel halves (``split_size`` windows and their transpose),
    shifted by half a window in some blocks, plus a depth-wise conv (``get_v``) of the values."""

    def __init__(self, dim: int, num_heads: int, split_size: Sequence[int] = (2, 4),
                 shift_size: Sequence[int] = (1, 2), qkv_bias: bool = False, qk_scale: float | None = None,
                 drop: float = 0.0, attn_drop: float = 0.0, idx: int = 0, reso: int = 64, rs_id: int = 0) -> None:
        super().__init__()
        self.dim = dim
        self.num_heads = num_heads
        self.split_size = tuple(split_size)
        self.shift_size = tuple(shift_size)
        self.idx = idx
        self.rs_id = rs_id
        self.patches_resolution = reso
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.branch_num = 2
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(drop)
        self.attns = nn.ModuleList([
            Spatial_Attention(dim // 2, idx=i, split_size=split_size, num_heads=num_heads // 2, dim_out=dim // 2,
                              qk_scale=qk_scale, attn_drop=attn_drop, proj_drop=drop, position_bias=True)
            for i in range(self.branch_num)
        ])
        self.shifted = _is_shifted(rs_id, idx)
        masks: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
        if self.shifted:  # for the checkpoints' keys (reso rounded up); forward computes the masks per size
            side = math.ceil(reso / self.multiple) * self.multiple
            masks = self.calculate_mask(side, side)
        self.register_buffer("attn_mask_0", masks[0])
        self.register_buffer("attn_mask_1", masks[1])
        self.get_v = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)

    @property
    def multiple(self) -> int:
        """The map is zero-padded to a multiple of the larger window side."""
        return max(self.split_size)

    def calculate_mask(self, h: int, w: int, device: torch.device | None = None,
                       dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """Shifted-window masks of both halves on an ``h x w`` map."""
        (s0, s1), (t0, t1) = self.split_size, self.shift_size
        return (shifted_window_mask(h, w, (s0, s1), (t0, t1), device, dtype),
                shifted_window_mask(h, w, (s1, s0), (t1, t0), device, dtype))

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        """x: (b, h*w, c) -> (b, h*w, c)."""
        b, n, c = x.shape
        half = c // 2
        qkv = self.qkv(x).view(b, n, 3, c).permute(2, 0, 1, 3)  # (3, b, n, c)
        values = to_feature_map(qkv[2], h, w)
        pad_b, pad_r = (-h) % self.multiple, (-w) % self.multiple
        hp, wp = h + pad_b, w + pad_r
        qkv = F.pad(qkv.reshape(3, b, h, w, c), (0, 0, 0, pad_r, 0, pad_b))
        parts = [qkv[..., :half], qkv[..., half:]]
        t0, t1 = self.shift_size
        shifts = ((t0, t1), (t1, t0))
        masks: Sequence[torch.Tensor | None] = (None, None)
        if self.shifted:
            masks = self.calculate_mask(hp, wp, x.device, x.dtype)
            parts = [torch.roll(p, shifts=(-s[0], -s[1]), dims=(2, 3)) for p, s in zip(parts, shifts, strict=True)]
        outs = []
        for attn, part, shift, mask in zip(self.attns, parts, shifts, masks, strict=True):
            y = attn(part.reshape(3, b, hp * wp, half), hp, wp, mask=mask)
            if self.shifted:
                y = torch.roll(y, shifts=shift, dims=(1, 2))
            outs.append(y[:, :h, :w, :].reshape(b, n, half))
        x = torch.cat(outs, dim=2) + to_tokens(self.get_v(values))
        return self.proj_drop(self.proj(x))


class RG_SA(nn.Module):  # noqa: N801 - the authors' class name
    """Recursive-generalization self attention: queries from every token, keys / values from a map shrunk
    4x ``reduction_steps`` times (``reduction1``), then ``dwconv``, a 1x1 ``conv`` to ``c_ratio * dim`` channels and
    ``norm_act``; the values get a depth-wise positional conv ``cpe``."""

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, qk_scale: float | None = None,
                 attn_drop: float = 0.0, proj_drop: float = 0.0, c_ratio: float = 0.5) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.cr = int(dim * c_ratio)
        if dim % num_heads or self.cr % num_heads:
            raise ArchArgumentError("num_heads", f"RGT: {num_heads} heads must divide dim {dim} and "
                                    f"c_ratio * dim = {self.cr}")
        self.scale = qk_scale or (dim // num_heads * c_ratio) ** -0.5
        self.reduction1 = nn.Conv2d(dim, dim, kernel_size=4, stride=4, groups=dim)
        self.dwconv = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)
        self.conv = nn.Conv2d(dim, self.cr, kernel_size=1, stride=1)
        self.norm_act = nn.Sequential(nn.LayerNorm(self.cr), nn.GELU())
        self.q = nn.Linear(dim, self.cr, bias=qkv_bias)
        self.k = nn.Linear(self.cr, self.cr, bias=qkv_bias)
        self.v = nn.Linear(self.cr, dim, bias=qkv_bias)
        self.cpe = nn.Conv2d(dim, dim, kernel_size=3, stride=1, padding=1, groups=dim)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, h: int, w: int) -> torch.Tensor:
        b, n, c = x.shape
        heads = self.num_heads
        steps = reduction_steps(h, w, self.training)
        small = to_feature_map(x, h, w)
        for _ in range(steps):
            small = self.reduction1(small)
        hs, ws = h // 4**steps, w // 4**steps
        small = self.norm_act(to_tokens(self.conv(self.dwconv(small))))  # (b, n', cr)
        q = self.q(x).view(b, n, heads, -1).transpose(1, 2)
        k = self.k(small).view(b, -1, heads, self.cr // heads).transpose(1, 2)
        v = self.v(small)  # (b, n', c)
        pos = self.cpe(to_feature_map(v, hs, ws)).view(b, heads, c // heads, -1).transpose(-1, -2)
        v = v.view(b, -1, heads, c // heads).transpose(1, 2) + pos
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0,
                                             scale=self.scale)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))


class Block(nn.Module):
    """Pre-norm attention (L-SA for even ``idx``, RG-SA for odd), pre-norm gated MLP, plus ``gamma`` times the
    block's input."""

    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = False,
                 qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0,
                 act_layer: type[nn.Module] = nn.GELU, norm_layer: type[nn.Module] = nn.LayerNorm, idx: int = 0,
                 rs_id: int = 0, split_size: Sequence[int] = (2, 4), shift_size: Sequence[int] = (1, 2),
                 reso: int = 64, c_ratio: float = 0.5, layerscale_value: float = 1e-4) -> None:
        super().__init__()
        self.norm1 = norm_layer(dim)
        if idx % 2 == 0:
            self.attn: nn.Module = L_SA(dim, num_heads, split_size=split_size, shift_size=shift_size,
                                        qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop, attn_drop=attn_drop,
                                        idx=idx, reso=reso, rs_id=rs_id)
        else:
            self.attn = RG_SA(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale, attn_drop=attn_drop,
                              proj_drop=drop, c_ratio=c_ratio)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.mlp = SGFN(dim, int(dim * mlp_ratio), dim, act_layer=act_layer)
        self.norm2 = norm_layer(dim)
        self.gamma = nn.Parameter(torch.full((dim,), float(layerscale_value)))

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        h, w = x_size
        y = x + self.drop_path(self.attn(self.norm1(x), h, w))
        y = y + self.drop_path(self.mlp(self.norm2(y), h, w))
        return y + x * self.gamma


class ResidualGroup(nn.Module):
    """``depth`` blocks, a conv on the feature map and a shortcut."""

    def __init__(self, dim: int, reso: int, num_heads: int, mlp_ratio: float = 4.0, qkv_bias: bool = False,
                 qk_scale: float | None = None, drop: float = 0.0, attn_drop: float = 0.0,
                 drop_paths: Sequence[float] | None = None, act_layer: type[nn.Module] = nn.GELU,
                 norm_layer: type[nn.Module] = nn.LayerNorm, depth: int = 2, use_chk: bool = False,
                 resi_connection: str = "1conv", rs_id: int = 0, split_size: Sequence[int] = (8, 8),
                 c_ratio: float = 0.5) -> None:
        super().__init__()
        self.use_chk = use_chk
        self.reso = reso
        rates = list(drop_paths) if drop_paths is not None else [0.0] * depth
        self.blocks = nn.ModuleList([
            Block(dim, num_heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale, drop=drop,
                  attn_drop=attn_drop, drop_path=rates[i], act_layer=act_layer, norm_layer=norm_layer, idx=i,
                  rs_id=rs_id, split_size=split_size, shift_size=(split_size[0] // 2, split_size[1] // 2),
                  c_ratio=c_ratio)  # the authors' blocks keep reso=64 whatever img_size is (mask buffer shapes)
            for i in range(depth)
        ])
        self.conv = residual_conv(dim, resi_connection)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        y = x
        for blk in self.blocks:
            y = run_checkpointed(blk, y, x_size, enabled=self.use_chk)
        return x + to_tokens(self.conv(to_feature_map(y, *x_size)))


@ARCH_REGISTRY.register()
class RGT(SwinSRBase):
    """RGT / RGT-S (arguments and defaults of spandrel 0.4.2's class): img_size (unused by the computation; the
    ``attn_mask_*`` buffers are always for 64 x 64 maps, as in the authors' code), in_chans, embed_dim, depth
    (blocks per group), num_heads, mlp_ratio, qkv_bias, qk_scale, drop_rate, attn_drop_rate, drop_path_rate,
    act_layer, norm_layer, use_chk (activation checkpointing), upscale (1, 2**n or 3), img_range, resi_connection
    ('1conv' / '3conv'), split_size (window rows, columns), c_ratio (RG-SA's key width relative to dim), rgb_mean
    (RGB input mean, by default DIV2K's; neosr's: 0.5 each).
    """

    pads_input = False  # L-SA pads inside each block

    def __init__(self, *, img_size: int = 64, in_chans: int = 3, embed_dim: int = 180,
                 depth: Sequence[int] = (2, 2, 2, 2), num_heads: Sequence[int] = (2, 2, 2, 2), mlp_ratio: float = 4.0,
                 qkv_bias: bool = True, qk_scale: float | None = None, drop_rate: float = 0.0,
                 attn_drop_rate: float = 0.0, drop_path_rate: float = 0.1, act_layer: type[nn.Module] = nn.GELU,
                 norm_layer: type[nn.Module] = nn.LayerNorm, use_chk: bool = False, upscale: int = 2,
                 img_range: float = 1.0, resi_connection: str = "1conv", split_size: Sequence[int] = (8, 8),
                 c_ratio: float = 0.5, rgb_mean: Sequence[float] | None = None) -> None:
        super().__init__()
        _check_args(embed_dim, depth, num_heads, upscale, resi_connection, split_size)
        num_feat = 64
        self.init_shallow(in_chans, embed_dim, len(depth), img_range, upscale, "pixelshuffle", rgb_mean)
        self.tile_multiple: int = max(split_size)  # sides for which L-SA's padding is empty
        self.use_chk = use_chk
        self.before_RG = nn.Sequential(_ToTokens(), nn.LayerNorm(embed_dim))
        rates = drop_path_rates(drop_path_rate, sum(depth))
        self.layers = nn.ModuleList()
        for i, d in enumerate(depth):
            start = sum(depth[:i])
            self.layers.append(ResidualGroup(
                embed_dim, img_size, num_heads[i], mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, qk_scale=qk_scale,
                drop=drop_rate, attn_drop=attn_drop_rate, drop_paths=rates[start:start + d], act_layer=act_layer,
                norm_layer=norm_layer, depth=d, use_chk=use_chk, resi_connection=resi_connection, rs_id=i,
                split_size=split_size, c_ratio=c_ratio))
        self.norm = norm_layer(embed_dim)
        self.conv_after_body = residual_conv(embed_dim, resi_connection)
        self.init_reconstruction(embed_dim, in_chans, upscale, None, num_feat)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        y = self.before_RG(x)
        for layer in self.layers:
            y = layer(y, (h, w))
        return to_feature_map(self.norm(y), h, w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        minimum = TRAIN_MIN_SIZE if self.training else EVAL_MIN_SIZE
        if min(h, w) >= minimum:
            return super().forward(x)
        out = super().forward(pad_to_min_size(x, minimum))
        return out[..., : h * self.upscale, : w * self.upscale]


def _check_args(embed_dim: int, depth: Sequence[int], num_heads: Sequence[int], upscale: int,
                resi_connection: str, split_size: Sequence[int]) -> None:
    if resi_connection not in ("1conv", "3conv"):
        raise ArchArgumentError("resi_connection", f"RGT: unknown resi_connection {resi_connection!r}; use '1conv' "
                                "or '3conv'")
    check_upscale(upscale)
    if len(num_heads) != len(depth):
        raise ArchArgumentError("num_heads", f"RGT: num_heads has {len(num_heads)} entries but depth has "
                                f"{len(depth)}; give one head count per group")
    if len(split_size) != 2 or min(split_size) < 2 or max(split_size) % min(split_size):
        raise ArchArgumentError("split_size", f"RGT: split_size must be two window sides >= 2, the larger a "
                                f"multiple of the smaller, got {list(split_size)!r}")
    if embed_dim % 2 or any(h < 2 or (embed_dim // 2) % (h // 2) for h in num_heads):
        raise ArchArgumentError("num_heads", f"RGT: each window half ({embed_dim // 2} channels) needs a whole "
                                f"number of heads (num_heads // 2 each), got num_heads {list(num_heads)}")


__all__ = ["RGT", "L_SA", "RG_SA"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("RGT", scale_arg="upscale", presets={
    # 13.37 M parameters at x4
    "rgt": {"upscale": 4, "split_size": (8, 32), "depth": (6,) * 8, "num_heads": (6,) * 8, "mlp_ratio": 2.0},
    # 10.20 M parameters at x4
    "rgt_s": {"upscale": 4, "split_size": (8, 32), "depth": (6,) * 6, "num_heads": (6,) * 6, "mlp_ratio": 2.0},
})


def _split_size(s: StateShapes, attn: str) -> list[int]:
    """The window sides (h, w) of an L-SA half from its tables: h * w tokens, (2h - 1)(2w - 1) bias rows. Which
    side is the rows shows in no tensor (the halves take both orders): the smaller first, as published."""
    n, rows = s.dim(f"{attn}relative_position_index", 0), s.dim(f"{attn}rpe_biases", 0)
    total = (4 * n + 1 - rows) // 2  # h + w
    root = round(max(total * total - 4 * n, 0) ** 0.5)
    return [(total - root) // 2, (total + root) // 2]


def _recognise(s: StateShapes) -> dict:
    """RGT from its tensors: image channels and width from the first conv, the blocks per group, the heads of
    each group (twice those of an L-SA half: its position-bias MLP outputs one per head), the window sides, the
    MLP ratio, the qkv bias, RG-SA's key width (``c_ratio``), the residual conv and the scale from the upsampler."""
    cin, dim = s.dim("conv_first.weight", 1), s.dim("conv_first.weight", 0)
    groups = s.indices("layers.")
    first = "layers.0.blocks.0."
    p: dict = {"in_chans": cin, "embed_dim": dim, "depth": [s.count(f"layers.{i}.blocks.") for i in groups],
               "num_heads": [2 * s.dim(f"layers.{i}.blocks.0.attn.attns.0.pos.pos3.2.weight", 0) for i in groups],
               "mlp_ratio": width_ratio(s.dim(f"{first}mlp.fc1.weight", 0), dim, 4.0),
               "qkv_bias": f"{first}attn.qkv.bias" in s, "split_size": _split_size(s, f"{first}attn.attns.0."),
               "resi_connection": "3conv" if "conv_after_body.0.weight" in s else "1conv"}
    rg = next((f"layers.{i}.blocks.1.attn.conv.weight" for i in groups if f"layers.{i}.blocks.1.attn.conv.weight" in s),
              None)
    if rg is not None:
        p["c_ratio"] = width_ratio(s.dim(rg, 0), dim, 0.5)
    feat = s.dim("conv_before_upsample.0.weight", 0)
    p["upscale"] = upsample_scale(s, "upsample.", feat) if s.has_prefix("upsample.") else 1
    return p


register_recogniser("RGT", _recognise)

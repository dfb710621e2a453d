"""ATD: Transcending the Limit of Local Window — advanced super-resolution transformer with an adaptive token
dictionary (Zhang, Zhang and Yu, CVPR 2024).

SwinIR's layout (shallow conv, residual groups, reconstruction) whose layers add two global branches to the
(shifted-)window self attention: token-dictionary cross attention (ATD-CA: every pixel attends, by cosine
similarity in a reduced space, to a small learned dictionary of tokens that each layer refines from the image)
and adaptive category-based attention (AC-MSA: pixels are sorted by their most similar dictionary token and
attend within fixed-size groups of that order). A convolutional feed-forward closes each layer. One class covers
ATD and ATD-light (they differ in arguments).

Constructor arguments, module names and buffers follow spandrel 0.4.2's ``ATD`` (the authors' names), so released
checkpoints load with ``strict=True``.

Size requirement: any size. As spandrel's call API, inputs below 8 pixels are first padded at the bottom / right
(reflect, then replicate); then, as the authors' forward, the input is extended by its mirror image to a multiple
of ``window_size`` and the output cropped back.

Determinism note: AC-MSA orders pixels with an unstable sort of their categories, as the authors do. Pixels of
equal category come in the order the device's sort kernel gives, which decides the group boundaries: outputs equal
the reference on the CPU (same kernel) and may differ slightly on other devices (as the reference's do).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import (
    ArchArgumentError,
    PatchUnEmbed,
    SwinSRBase,
    check_upscale,
    nearest_upsample,
    pad_to_min_size,
    relative_position_index,
    residual_conv,
    shifted_window_mask,
    to_2tuple,
    to_feature_map,
    to_tokens,
    window_attention,
    window_partition,
    window_reverse,
)
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.recognition.recognise_util import (
    clean,
    reconstruction,
    resi_connection,
    square_side,
    window_from_index,
)
from anysr.archs.swin2sr_arch import LOGIT_SCALE_MAX
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

UPSAMPLERS = ("pixelshuffle", "pixelshuffledirect", "nearest+conv", "")
MIN_SIZE = 8  # spandrel's size requirement


def mirror_pad(x: torch.Tensor, pad_h: int, pad_w: int) -> torch.Tensor:
    """Extend the bottom / right of an NCHW map by its mirror image (edge repeated: row h-1, h-2, ...); a pad
    longer than the side continues with the map again, then its mirror (a periodic continuation)."""
    for dim, pad in ((2, pad_h), (3, pad_w)):
        if pad:
            size = x.shape[dim]
            reps = math.ceil((size + pad) / size)
            parts = [x if i % 2 == 0 else x.flip(dim) for i in range(reps)]
            x = torch.cat(parts, dim=dim).narrow(dim, 0, size + pad)
    return x


class ConvFFNDepthwise(nn.Module):
    """Depth-wise ``kernel_size`` conv + GELU on tokens (``depthwise_conv`` Sequential, the authors' keys)."""

    def __init__(self, hidden_features: int, kernel_size: int = 5) -> None:
        super().__init__()
        self.hidden_features = hidden_features
        self.depthwise_conv = nn.Sequential(
            nn.Conv2d(hidden_features, hidden_features, kernel_size, 1, (kernel_size - 1) // 2,
                      groups=hidden_features),
            nn.GELU())

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        return to_tokens(self.depthwise_conv(to_feature_map(x, *x_size)))


class ConvFFN(nn.Module):
    """Linear, GELU, plus a residual depth-wise conv branch, linear."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 kernel_size: int = 5, act_layer: type[nn.Module] = nn.GELU) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.dwconv = ConvFFNDepthwise(hidden_features, kernel_size)
        self.fc2 = nn.Linear(hidden_features, out_features or in_features)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        x = self.act(self.fc1(x))
        return self.fc2(x + self.dwconv(x, x_size))


class WindowAttentionQKV(nn.Module):
    """Window self attention on precomputed q/k/v (``relative_position_bias_table`` and ``proj``; the network
    passes the position index)."""

    def __init__(self, dim: int, window_size: tuple[int, int], num_heads: int, qkv_bias: bool = True) -> None:
        super().__init__()
        self.dim = dim
        self.window_size = window_size
        self.num_heads = num_heads
        self.qkv_bias = qkv_bias
        self.scale = (dim // num_heads) ** -0.5
        wh, ww = window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * wh - 1) * (2 * ww - 1), num_heads))
        self.proj = nn.Linear(dim, dim)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, qkv: torch.Tensor, rpi: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b_, n, c3 = qkv.shape
        c = c3 // 3
        t = qkv.reshape(b_, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        bias = self.relative_position_bias_table[rpi.reshape(-1)].view(n, n, -1).permute(2, 0, 1)
        out = window_attention(t[0], t[1], t[2], bias, mask, scale=self.scale)
        return self.proj(out.transpose(1, 2).reshape(b_, n, c))


class ATD_CA(nn.Module):  # noqa: N801 - the authors' class name
    """Token-dictionary cross attention: cosine similarity of reduced queries (pixels) and keys (dictionary
    tokens), sharpened per token by ``1 + clamp(scale, 0, 1) * log(num_tokens)``; returns the attended values and
    the attention map (b, n, num_tokens)."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], num_tokens: int = 64, reducted_dim: int = 10,
                 qkv_bias: bool = True) -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.num_tokens = num_tokens
        self.rc = reducted_dim
        self.qkv_bias = qkv_bias
        self.wq = nn.Linear(dim, reducted_dim, bias=qkv_bias)
        self.wk = nn.Linear(dim, reducted_dim, bias=qkv_bias)
        self.wv = nn.Linear(dim, dim, bias=qkv_bias)
        self.scale = nn.Parameter(torch.full((num_tokens,), 0.5))

    def forward(self, x: torch.Tensor, td: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q = F.normalize(self.wq(x), dim=-1)
        k = F.normalize(self.wk(td), dim=-1)
        sharpen = 1 + torch.clamp(self.scale, 0, 1) * math.log(self.num_tokens)
        attn = torch.softmax((q @ k.transpose(-2, -1)) * sharpen.to(q.dtype), dim=-1)
        return attn @ self.wv(td), attn


class AC_MSA(nn.Module):  # noqa: N801 - the authors' class name
    """Category-based attention: pixels sorted by their most similar dictionary token, cut into groups of
    ``category_size`` (the last one completed by the mirrored tail), multi-head attention within each group with a
    learned, clamped temperature, then put back in place and projected."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], num_tokens: int = 64, num_heads: int = 4,
                 category_size: int = 128, qkv_bias: bool = True) -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.num_tokens = num_tokens
        self.num_heads = num_heads
        self.category_size = category_size
        self.proj = nn.Linear(dim, dim, bias=qkv_bias)
        self.logit_scale = nn.Parameter(torch.full((1, 1), math.log(10.0)))

    def forward(self, qkv: torch.Tensor, sim: torch.Tensor) -> torch.Tensor:
        b, n, c3 = qkv.shape
        c = c3 // 3
        heads = self.num_heads
        gs = min(n, self.category_size)
        ng = (n + gs - 1) // gs
        pad_n = ng * gs - n
        order = torch.sort(torch.argmax(sim, dim=-1), dim=-1, stable=False).indices  # (b, n); see the module doc
        grouped = torch.gather(qkv, 1, order.unsqueeze(-1).expand(b, n, c3))
        if pad_n:
            grouped = torch.cat([grouped, grouped[:, n - pad_n:].flip(1)], dim=1)
        t = grouped.reshape(b, ng, gs, 3, heads, c // heads).permute(3, 0, 1, 4, 2, 5)  # (3, b, ng, heads, gs, d)
        temperature = torch.clamp(self.logit_scale, max=LOGIT_SCALE_MAX).exp().to(qkv.dtype)
        y = F.scaled_dot_product_attention(t[0] * temperature, t[1], t[2], scale=1.0)
        y = y.permute(0, 1, 3, 2, 4).reshape(b, ng * gs, c)[:, :n]
        out = torch.zeros_like(y).scatter(1, order.unsqueeze(-1).expand(b, n, c), y)  # back to image order
        return self.proj(out)


class ATDTransformerLayer(nn.Module):
    """Pre-norm layer: (shifted-)window attention + ATD-CA + AC-MSA on one normed input (summed onto the
    shortcut), then a pre-norm ConvFFN; all but the last layer of a block refine the token dictionary."""

    def __init__(self, dim: int, idx: int, input_resolution: tuple[int, int], num_heads: int, window_size: int,
                 shift_size: int, category_size: int, num_tokens: int, reducted_dim: int, convffn_kernel_size: int,
                 mlp_ratio: float, qkv_bias: bool = True, act_layer: type[nn.Module] = nn.GELU,
                 norm_layer: type[nn.Module] = nn.LayerNorm, is_last: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.num_heads = num_heads
        self.window_size = window_size
        self.shift_size = shift_size
        self.mlp_ratio = mlp_ratio
        self.convffn_kernel_size = convffn_kernel_size
        self.num_tokens = num_tokens
        self.reducted_dim = reducted_dim
        self.is_last = is_last
        self.norm1 = norm_layer(dim)
        self.norm2 = norm_layer(dim)
        if not is_last:
            self.norm3 = nn.InstanceNorm1d(num_tokens, affine=True)
            self.sigma = nn.Parameter(torch.zeros(num_tokens, 1))
        self.wqkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
        self.attn_win = WindowAttentionQKV(dim, to_2tuple(window_size), num_heads, qkv_bias)
        self.attn_atd = ATD_CA(dim, input_resolution, num_tokens, reducted_dim, qkv_bias)
        self.attn_aca = AC_MSA(dim, input_resolution, num_tokens, num_heads, category_size, qkv_bias)
        self.convffn = ConvFFN(dim, int(dim * mlp_ratio), kernel_size=convffn_kernel_size, act_layer=act_layer)

    def forward(self, x: torch.Tensor, td: torch.Tensor, x_size: tuple[int, int], rpi: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        h, w = x_size
        b, n, c = x.shape
        ws, shift = self.window_size, self.shift_size
        normed = self.norm1(x)
        qkv = self.wqkv(normed)
        x_atd, sim = self.attn_atd(normed, td)
        x_aca = self.attn_aca(qkv, sim)
        grid = qkv.view(b, h, w, 3 * c)
        mask = None
        if shift > 0:
            grid = torch.roll(grid, shifts=(-shift, -shift), dims=(1, 2))
            mask = shifted_window_mask(h, w, ws, shift, x.device, x.dtype)
        windows = self.attn_win(window_partition(grid, ws).view(-1, ws * ws, 3 * c), rpi, mask)
        y = window_reverse(windows.view(-1, ws, ws, c), ws, h, w)
        if shift > 0:
            y = torch.roll(y, shifts=(shift, shift), dims=(1, 2))
        x = x + y.reshape(b, n, c) + x_atd + x_aca
        x = x + self.convffn(self.norm2(x), x_size)
        if not self.is_last:
            weights = torch.softmax(self.norm3(sim.transpose(-1, -2)), dim=-1)  # (b, tokens, n)
            keep = torch.sigmoid(self.sigma)
            td = keep * td + (1 - keep) * (weights @ x)
        return x, td


class BasicBlock(nn.Module):
    """``depth`` ATD layers (plain and shifted windows in turn) sharing a token dictionary ``td`` that starts from
    a learned one for every image."""

    def __init__(self, dim: int, input_resolution: tuple[int, int], idx: int, depth: int, num_heads: int,
                 window_size: int, category_size: int, num_tokens: int, convffn_kernel_size: int, reducted_dim: int,
                 mlp_ratio: float = 4.0, qkv_bias: bool = True, norm_layer: type[nn.Module] = nn.LayerNorm) -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.depth = depth
        self.idx = idx
        self.layers = nn.ModuleList([
            ATDTransformerLayer(dim, i, input_resolution, num_heads, window_size,
                                0 if i % 2 == 0 else window_size // 2, category_size, num_tokens, reducted_dim,
                                convffn_kernel_size, mlp_ratio, qkv_bias, norm_layer=norm_layer,
                                is_last=i == depth - 1)
            for i in range(depth)
        ])
        self.downsample = None
        self.td = nn.Parameter(torch.randn(num_tokens, dim))

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], rpi: torch.Tensor) -> torch.Tensor:
        td = self.td.expand(x.shape[0], -1, -1)
        for layer in self.layers:
            x, td = layer(x, td, x_size, rpi)
        return x


class ATDB(nn.Module):
    """Residual group: a BasicBlock, a conv on the feature map and a shortcut."""

    def __init__(self, dim: int, idx: int, input_resolution: tuple[int, int], depth: int, num_heads: int,
                 window_size: int, category_size: int, num_tokens: int, reducted_dim: int, convffn_kernel_size: int,
                 mlp_ratio: float, qkv_bias: bool = True, norm_layer: type[nn.Module] = nn.LayerNorm,
                 img_size: int | Sequence[int] = 224, patch_size: int | Sequence[int] = 4,
                 resi_connection: str = "1conv") -> None:
        super().__init__()
        self.dim = dim
        self.input_resolution = input_resolution
        self.patch_unembed = PatchUnEmbed(img_size, patch_size, in_chans=0, embed_dim=dim)
        self.residual_group = BasicBlock(dim, input_resolution, idx, depth, num_heads, window_size, category_size,
                                         num_tokens, convffn_kernel_size, reducted_dim, mlp_ratio, qkv_bias,
                                         norm_layer)
        self.conv = residual_conv(dim, resi_connection)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int], rpi: torch.Tensor) -> torch.Tensor:
        return to_tokens(self.conv(self.patch_unembed(self.residual_group(x, x_size, rpi), x_size))) + x


@ARCH_REGISTRY.register()
class ATD(SwinSRBase):
    """ATD / ATD-light (arguments and defaults of spandrel 0.4.2's class): img_size, patch_size (1), in_chans,
    embed_dim, depths, num_heads, window_size, category_size (pixels per AC-MSA group), num_tokens (dictionary
    size), reducted_dim (ATD-CA's query / key width), convffn_kernel_size, mlp_ratio, qkv_bias, norm_layer, ape,
    patch_norm, upscale, img_range, upsampler (one of ``UPSAMPLERS``), resi_connection ('1conv' / '3conv'), norm
    (False: no mean shift / range scaling, recorded by a ``no_norm`` buffer).
    """

    pads_input = False

    def __init__(self, *, img_size: int | Sequence[int] = 64, patch_size: int | Sequence[int] = 1,
                 in_chans: int = 3, embed_dim: int = 90, depths: Sequence[int] = (6, 6, 6, 6),
                 num_heads: Sequence[int] = (6, 6, 6, 6), window_size: int = 8, category_size: int = 256,
                 num_tokens: int = 64, reducted_dim: int = 4, convffn_kernel_size: int = 5, mlp_ratio: float = 2.0,
                 qkv_bias: bool = True, norm_layer: type[nn.Module] = nn.LayerNorm, ape: bool = False,
                 patch_norm: bool = True, upscale: int = 1, img_range: float = 1.0, upsampler: str | None = "",
                 resi_connection: str = "1conv", norm: bool = True) -> None:
        super().__init__()
        upsampler = upsampler or ""
        _check_args(upsampler, upscale, resi_connection, depths, num_heads, embed_dim, window_size, patch_size)
        num_feat = 64
        self.no_norm: torch.Tensor | None
        if norm:
            self.no_norm = None
        else:
            self.register_buffer("no_norm", torch.zeros(1))
        self.init_shallow(in_chans, embed_dim, len(depths), img_range, upscale, upsampler)
        self.mlp_ratio = mlp_ratio
        self.window_size = window_size
        resolution = self.init_token_embed(img_size, patch_size, embed_dim, norm_layer, patch_norm, ape, 0.0)
        self.patch_unembed = PatchUnEmbed(img_size, patch_size, in_chans=embed_dim, embed_dim=embed_dim)
        self.register_buffer("relative_position_index_SA", relative_position_index(window_size))
        self.layers = nn.ModuleList([
            ATDB(embed_dim, i, resolution, depths[i], num_heads[i], window_size, category_size, num_tokens,
                 reducted_dim, convffn_kernel_size, mlp_ratio, qkv_bias, norm_layer, img_size, patch_size,
                 resi_connection)
            for i in range(len(depths))
        ])
        self.norm = norm_layer(self.num_features)
        self.conv_after_body = residual_conv(embed_dim, resi_connection)
        if upsampler == "nearest+conv":
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(embed_dim, num_feat, 3, 1, 1),
                                                      nn.LeakyReLU(inplace=True))
            self.conv_up1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_up2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_hr = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
            self.conv_last = nn.Conv2d(num_feat, in_chans, 3, 1, 1)
            self.lrelu = nn.LeakyReLU(negative_slope=0.2, inplace=True)
        elif not upsampler:
            self.conv_last = nn.Conv2d(embed_dim, in_chans, 3, 1, 1)
        else:
            self.init_reconstruction(embed_dim, in_chans, upscale, resolution, num_feat)
        self.init_swin_weights()

    @property
    def is_norm(self) -> bool:
        return self.no_norm is None

    @property
    def tile_multiple(self) -> int:
        return self.window_size

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x_size = (x.shape[2], x.shape[3])
        y = self.embed_tokens(x)
        for layer in self.layers:
            y = layer(y, x_size, self.relative_position_index_SA)
        return self.patch_unembed(self.norm(y), x_size)

    def reconstruct(self, x: torch.Tensor) -> torch.Tensor:
        if self.upsampler == "nearest+conv":
            x = self.conv_before_upsample(self.deep_features(self.conv_first(x)))
            x = self.lrelu(self.conv_up1(nearest_upsample(x, 2)))
            x = self.lrelu(self.conv_up2(nearest_upsample(x, 2)))
            return self.conv_last(self.lrelu(self.conv_hr(x)))
        if not self.upsampler:
            return x + self.conv_last(self.deep_features(self.conv_first(x)))
        return super().reconstruct(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x = pad_to_min_size(x, MIN_SIZE)
        ws = self.window_size
        x = mirror_pad(x, -x.shape[-2] % ws, -x.shape[-1] % ws)
        if self.is_norm:
            mean = self.mean.to(dtype=x.dtype)
            x = self.reconstruct((x - mean) * self.img_range) / self.img_range + mean
        else:
            x = self.reconstruct(x)
        scale = self.upscale if self.upsampler else 1
        return x[..., : h * scale, : w * scale]


def _check_args(upsampler: str, upscale: int, resi_connection: str, depths: Sequence[int], num_heads: Sequence[int],
                embed_dim: int, window_size: int, patch_size: int | Sequence[int]) -> None:
    if upsampler not in UPSAMPLERS:
        raise ArchArgumentError("upsampler", f"ATD: unknown upsampler {upsampler!r}; use one of {UPSAMPLERS}")
    if upsampler == "nearest+conv" and upscale != 4:
        raise ArchArgumentError("upscale", f"ATD: upsampler 'nearest+conv' supports upscale 4 only, got {upscale!r}")
    if upsampler == "pixelshuffle":
        check_upscale(upscale)
    if resi_connection not in ("1conv", "3conv"):
        raise ArchArgumentError("resi_connection", f"ATD: unknown resi_connection {resi_connection!r}; use '1conv' "
                                "or '3conv'")
    if len(num_heads) != len(depths):
        raise ArchArgumentError("num_heads", f"ATD: num_heads has {len(num_heads)} entries but depths has "
                                f"{len(depths)}; give one head count per group")
    if any(embed_dim % h for h in num_heads):
        raise ArchArgumentError("num_heads", f"ATD: embed_dim {embed_dim} is not divisible by every head count "
                                f"{list(num_heads)}")
    if not isinstance(window_size, int) or window_size < 2:
        raise ArchArgumentError("window_size", f"ATD: window_size must be an integer >= 2, got {window_size!r}")
    if to_2tuple(patch_size) != (1, 1):
        raise ArchArgumentError("patch_size", f"ATD: only patch_size 1 can run, got {patch_size!r}")


__all__ = ["ATD", "AC_MSA", "ATD_CA", "ATDTransformerLayer"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("ATD", scale_arg="upscale", presets={
    # 20.26 M parameters at x4
    "atd": {
        "upscale": 4, "img_size": 96, "embed_dim": 210, "depths": (6,) * 6, "num_heads": (6,) * 6, "window_size": 16,
        "num_tokens": 128, "reducted_dim": 20, "upsampler": "pixelshuffle"
    },
    # 0.81 M parameters at x4
    "atd_light": {
        "upscale": 4, "embed_dim": 48, "window_size": 16, "category_size": 128, "reducted_dim": 8,
        "convffn_kernel_size": 7, "mlp_ratio": 1, "upsampler": "pixelshuffledirect"
    },
})


def _recognise(s: StateShapes) -> list[dict]:
    """ATD from its tensors: width and channels from the first conv, layers per block, heads from the window
    attention's tables, the window from the index buffer, the token dictionary (tokens x width), the reduced
    dimension, the ConvFFN's kernel and ratio, switches (mean shift off: a ``no_norm`` buffer), the
    reconstruction. The category size changes no tensor: the published 256 (128 for ATD-light, the one with the
    one-step upsampler)."""
    embed, cin = s.dim("conv_first.weight", 0), s.dim("conv_first.weight", 1)
    groups = s.indices("layers.")
    layer = "layers.0.residual_group.layers.0"
    tokens = s.dim("layers.0.residual_group.td", 0)
    common = {"in_chans": cin, "embed_dim": embed,
              "depths": [s.count(f"layers.{i}.residual_group.layers.") for i in groups],
              "num_heads": [s.dim(f"layers.{i}.residual_group.layers.0.attn_win.relative_position_bias_table", 1)
                            for i in groups],
              "window_size": window_from_index(s, "relative_position_index_SA"), "num_tokens": tokens,
              "reducted_dim": s.dim(f"{layer}.attn_atd.wq.weight", 0),
              "convffn_kernel_size": s.dim(f"{layer}.convffn.dwconv.depthwise_conv.0.weight", 2),
              "mlp_ratio": clean(s.dim(f"{layer}.convffn.fc1.weight", 0) / embed),
              "qkv_bias": f"{layer}.wqkv.bias" in s, "ape": "absolute_pos_embed" in s,
              "patch_norm": "patch_embed.norm.weight" in s, "resi_connection": resi_connection(s, "conv_after_body"),
              "norm": "no_norm" not in s}
    if common["ape"]:
        common["img_size"] = square_side(s.dim("absolute_pos_embed", 1), "absolute_pos_embed")
    return [{**common, "upscale": r["upscale"], "upsampler": r["upsampler"],
             "category_size": 128 if r["upsampler"] == "pixelshuffledirect" else 256}
            for r in reconstruction(s, cin) if r["out"] == cin]


register_recogniser("ATD", _recognise)

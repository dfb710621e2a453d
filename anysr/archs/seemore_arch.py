"""SeemoRe: "See More Details: Efficient Image Super-Resolution by Experts Mining" (Zamfir et
al., ICML 2024).

Module names and constructor arguments follow spandrel 0.4.2's ``SeemoRe``, so released checkpoints (Tiny,
Big, Large) load with ``strict=True`` and give the same output. Each residual group has a local block (a
mixture of low-rank experts, gated by a per-image router, modulated by a calibration map pooled 4x per
``recursive`` step and upsampled bilinearly) and a global block (striped depth-wise convs of
``global_kernel_size``), each followed by a gated feed-forward.

The router picks the ``topk`` best experts per image. The original runs only those in eval mode and all of
them, with the unchosen ones weighted 0, in training; the two give the same numbers, so this implementation
always runs every expert at once (one concatenated conv per expert stage, weighted by the masked router
output): no data-dependent control flow, and any batch size in eval mode (the original's eval path takes
batch 1 only).

Size requirement: the calibration pooling needs ``4**recursive`` pixels per side (16 for the released
models); smaller inputs are grown by reflect / edge padding and the output is cropped. Other sizes run as
they are (the strided pooling drops a remainder, as in the original); ``tile_multiple`` is ``4**recursive``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, pad_to_min_size
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser, shuffle_splits
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

RGB_MEAN = (0.4488, 0.4371, 0.4040)
LR_SPACES = {"linear": lambda i: i + 2, "exp": lambda i: 2 ** (i + 1), "double": lambda i: 2 * i + 2}


def _bilinear_matrix(n_in: int, n_out: int, like: torch.Tensor) -> torch.Tensor:
    """(n_out, n_in) weights of 1-d linear interpolation, ``align_corners=False`` (PyTorch's convention)."""
    dst = torch.arange(n_out, device=like.device, dtype=torch.float32)
    src = ((dst + 0.5) * (n_in / n_out) - 0.5).clamp(min=0)
    lo = src.floor().clamp(max=n_in - 1)
    hi = (lo + 1).clamp(max=n_in - 1)
    frac = src - lo
    cols = torch.arange(n_in, device=like.device, dtype=torch.float32)[None, :]
    weights = (cols == lo[:, None]) * (1 - frac)[:, None] + (cols == hi[:, None]) * frac[:, None]
    return weights.to(like.dtype)


def resize_bilinear(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``F.interpolate(x, (h, w), mode="bilinear", align_corners=False)`` as two small matrix products (the same
    numbers; XLA has no lowering of upsample_bilinear2d's backward and would run it on the CPU)."""
    rows = _bilinear_matrix(x.shape[-2], h, x)
    cols = _bilinear_matrix(x.shape[-1], w, x)
    return rows @ x @ cols.t()


class StripedConv2d(nn.Module):
    """A ``1 x k`` conv followed by a ``k x 1`` conv (depth-wise when ``depthwise``), in ``self.conv``."""

    def __init__(self, in_ch: int, kernel_size: int, depthwise: bool = False) -> None:
        super().__init__()
        groups = in_ch if depthwise else 1
        p = kernel_size // 2
        self.conv = nn.Sequential(
            nn.Conv2d(in_ch, in_ch, (1, kernel_size), padding=(0, p), groups=groups),
            nn.Conv2d(in_ch, in_ch, (kernel_size, 1), padding=(p, 0), groups=groups),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class GatedFFN(nn.Module):
    """1x1 conv to ``mlp_ratio`` x channels + GELU; one half gates the other through a depth-wise conv; 1x1 + GELU."""

    def __init__(self, in_ch: int, mlp_ratio: int = 2, kernel_size: int = 3) -> None:
        super().__init__()
        hidden = in_ch * mlp_ratio
        self.fn_1 = nn.Sequential(nn.Conv2d(in_ch, hidden, 1), nn.GELU())
        self.fn_2 = nn.Sequential(nn.Conv2d(in_ch, in_ch, 1), nn.GELU())
        self.gate = nn.Conv2d(hidden // 2, hidden // 2, kernel_size, padding=kernel_size // 2, groups=hidden // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        value, gate = self.fn_1(x).chunk(2, dim=1)
        return self.fn_2(value * self.gate(gate))


class Expert(nn.Module):
    """A low-rank expert: ``conv_3(conv_1(x) * conv_2(k))`` with 1x1 convs through ``low_dim`` channels."""

    def __init__(self, in_ch: int, low_dim: int) -> None:
        super().__init__()
        self.conv_1 = nn.Conv2d(in_ch, low_dim, 1)
        self.conv_2 = nn.Conv2d(in_ch, low_dim, 1)
        self.conv_3 = nn.Conv2d(low_dim, in_ch, 1)

    def forward(self, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.conv_3(self.conv_1(x) * self.conv_2(k))


class Router(nn.Module):
    """Per-image expert logits: global average pool, then a bias-free linear layer (``body.2``)."""

    def __init__(self, in_ch: int, num_experts: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(1), nn.Linear(in_ch, num_experts, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class MoELayer(nn.Module):
    """``x + sum_e w_e * expert_e(x, k)`` where ``w`` is the router's softmax kept on the ``num_expert`` largest
    entries (zero elsewhere). All experts run as three grouped 1x1 convolutions over their concatenated
    weights (the same numbers as running the chosen ones one by one)."""

    def __init__(self, experts: list[Expert], gate: Router, num_expert: int = 1) -> None:
        super().__init__()
        self.experts = nn.ModuleList(experts)
        self.gate = gate
        self.num_expert = num_expert
        owner = [i for i, e in enumerate(experts) for _ in range(e.conv_1.out_channels)]
        self.register_buffer("channel_expert", torch.tensor(owner), persistent=False)  # expert of each low channel

    def forward(self, x: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(self.gate(x), dim=1, dtype=torch.float32).to(x.dtype)
        top = torch.topk(probs, self.num_expert, dim=1)
        weights = torch.zeros_like(probs).scatter(1, top.indices, top.values)  # (b, experts)
        cat = torch.cat
        w1 = cat([e.conv_1.weight for e in self.experts])
        b1 = cat([e.conv_1.bias for e in self.experts])
        w2 = cat([e.conv_2.weight for e in self.experts])
        b2 = cat([e.conv_2.bias for e in self.experts])
        low = F.conv2d(x, w1, b1) * F.conv2d(k, w2, b2)  # (b, sum(low_dims), h, w)
        per_channel = weights.index_select(1, self.channel_expert)
        w3 = cat([e.conv_3.weight for e in self.experts], dim=1)
        b3 = torch.stack([e.conv_3.bias for e in self.experts], dim=1)  # (in_ch, experts)
        out = F.conv2d(low * per_channel[:, :, None, None], w3)
        return x + out + (weights @ b3.t())[:, :, None, None]


class MoEBlock(nn.Module):
    """The local mixture-of-experts block: 1x1-expanded features split into an expert input (striped conv) and
    a calibration key ``k`` (strided depth-wise pooling ``recursive`` times, a conv pair, bilinear upsampling
    back, added to ``k``)."""

    def __init__(self, in_ch: int, num_experts: int, topk: int, use_shuffle: bool = False, lr_space: str = "linear",
                 recursive: int = 2) -> None:
        super().__init__()
        self.use_shuffle = use_shuffle
        self.recursive = recursive
        self.conv_1 = nn.Sequential(nn.Conv2d(in_ch, in_ch, 3, padding=1), nn.GELU(), nn.Conv2d(in_ch, 2 * in_ch, 1))
        self.agg_conv = nn.Sequential(nn.Conv2d(in_ch, in_ch, 4, stride=4, groups=in_ch), nn.GELU())
        self.conv = nn.Sequential(nn.Conv2d(in_ch, in_ch, 3, padding=1, groups=in_ch), nn.Conv2d(in_ch, in_ch, 1))
        self.conv_2 = nn.Sequential(StripedConv2d(in_ch, 3, depthwise=True), nn.GELU())
        grow = LR_SPACES[lr_space]
        self.moe_layer = MoELayer([Expert(in_ch, grow(i)) for i in range(num_experts)], Router(in_ch, num_experts),
                                  num_expert=topk)
        self.proj = nn.Conv2d(in_ch, in_ch, 1)

    def calibrate(self, k: torch.Tensor) -> torch.Tensor:
        pooled = k
        for _ in range(self.recursive):
            pooled = self.agg_conv(pooled)
        return k + resize_bilinear(self.conv(pooled), k.shape[-2], k.shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_1(x)
        if self.use_shuffle:  # interleave the two halves' channels (channel shuffle with 2 groups)
            b, c, h, w = x.shape
            x = x.reshape(b, 2, c // 2, h, w).transpose(1, 2).reshape(b, c, h, w)
        x, k = x.chunk(2, dim=1)
        return self.proj(self.moe_layer(self.conv_2(x), self.calibrate(k)))


class RME(nn.Module):
    """Residual mixture-of-experts block: ``x + MoEBlock(norm_1(x))``, then ``+ GatedFFN(norm_2(.))``."""

    def __init__(self, in_ch: int, num_experts: int, topk: int, lr_space: str = "linear", recursive: int = 2,
                 use_shuffle: bool = False) -> None:
        super().__init__()
        self.norm_1 = LayerNorm2d(in_ch)
        self.block = MoEBlock(in_ch, num_experts, topk, use_shuffle, lr_space, recursive)
        self.norm_2 = LayerNorm2d(in_ch)
        self.ffn = GatedFFN(in_ch, 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(self.norm_1(x)) + x
        return self.ffn(self.norm_2(x)) + x


class StripedConvFormer(nn.Module):
    """``proj(striped_dwconv(q) * v)`` with ``q, v`` from a 1x1 conv + GELU."""

    def __init__(self, in_ch: int, kernel_size: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(in_ch, in_ch, 1)
        self.to_qv = nn.Sequential(nn.Conv2d(in_ch, in_ch * 2, 1), nn.GELU())
        self.attn = StripedConv2d(in_ch, kernel_size, depthwise=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, v = self.to_qv(x).chunk(2, dim=1)
        return self.proj(self.attn(q) * v)


class SME(nn.Module):
    """Striped-convolution block: ``x + StripedConvFormer(norm_1(x))``, then ``+ GatedFFN(norm_2(.))``."""

    def __init__(self, in_ch: int, kernel_size: int = 11) -> None:
        super().__init__()
        self.norm_1 = LayerNorm2d(in_ch)
        self.block = StripedConvFormer(in_ch, kernel_size)
        self.norm_2 = LayerNorm2d(in_ch)
        self.ffn = GatedFFN(in_ch, 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block(self.norm_1(x)) + x
        return self.ffn(self.norm_2(x)) + x


class ResGroup(nn.Module):
    """A local (RME) then a global (SME) block."""

    def __init__(self, in_ch: int, num_experts: int, global_kernel_size: int = 11, lr_space: str = "linear",
                 topk: int = 2, recursive: int = 2, use_shuffle: bool = False) -> None:
        super().__init__()
        self.local_block = RME(in_ch, num_experts, topk, lr_space, recursive, use_shuffle)
        self.global_block = SME(in_ch, global_kernel_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.global_block(self.local_block(x))


@ARCH_REGISTRY.register()
class SeemoRe(nn.Module):
    """SeemoRe: mean shift, 3x3 conv, ``num_layers`` residual groups, layer norm, 3x3 conv + long shortcut,
    conv + PixelShuffle. RGB in and out.

    Args:
        scale: integer scale >= 1. in_chans: 3 (the mean shift is RGB). num_experts: experts per MoE layer.
        num_layers: residual groups. embedding_dim: width. img_range: input multiplier after the mean shift.
        use_shuffle: channel shuffle before the expert / key split. global_kernel_size: striped conv length.
        recursive: 4x poolings of the calibration key. lr_space: expert rank growth "linear" (2, 3, 4, ...),
        "exp" (2, 4, 8, ...) or "double" (2, 4, 6, ...). topk: experts used per image.
        Released: Tiny (36 dim, 6 layers), Big (48, 8) and Large (48, 16, recursive 1, no shuffle).
    """

    def __init__(self, scale: int = 4, in_chans: int = 3, num_experts: int = 6, num_layers: int = 6,
                 embedding_dim: int = 64, img_range: float = 1.0, use_shuffle: bool = True,
                 global_kernel_size: int = 11, recursive: int = 2, lr_space: str = "linear", topk: int = 1) -> None:
        super().__init__()
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ArchArgumentError("scale", f"SeemoRe needs an integer scale >= 1, got {scale!r}")
        if in_chans != len(RGB_MEAN):
            raise ArchArgumentError("in_chans", f"SeemoRe subtracts an RGB mean: in_chans must be 3, got {in_chans!r}")
        if lr_space not in LR_SPACES:
            raise ArchArgumentError("lr_space", f"SeemoRe knows the lr_space values {sorted(LR_SPACES)}, "
                                    f"got {lr_space!r}")
        if not isinstance(num_experts, int) or num_experts < 1:
            raise ArchArgumentError("num_experts", f"SeemoRe needs at least one expert, got {num_experts!r}")
        if not isinstance(topk, int) or not 1 <= topk <= num_experts:
            raise ArchArgumentError("topk", f"SeemoRe needs 1 <= topk <= num_experts ({num_experts}), got {topk!r}")
        if not isinstance(recursive, int) or recursive < 1:
            raise ArchArgumentError("recursive", f"SeemoRe needs an integer recursive >= 1, got {recursive!r}")
        if use_shuffle and embedding_dim % 2:
            raise ArchArgumentError("embedding_dim", f"SeemoRe's channel shuffle needs an even embedding_dim, "
                                    f"got {embedding_dim}")
        self.scale = scale
        self.img_range = img_range
        self.tile_multiple = 4**recursive
        self.register_buffer("mean", torch.tensor(RGB_MEAN).view(1, 3, 1, 1), persistent=False)
        self.conv_1 = nn.Conv2d(in_chans, embedding_dim, 3, padding=1)
        self.body = nn.ModuleList([
            ResGroup(embedding_dim, num_experts, global_kernel_size, lr_space, topk, recursive, use_shuffle)
            for _ in range(num_layers)
        ])
        self.norm = LayerNorm2d(embedding_dim)
        self.conv_2 = nn.Conv2d(embedding_dim, embedding_dim, 3, padding=1)
        self.upsampler = nn.Sequential(nn.Conv2d(embedding_dim, scale**2 * in_chans, 3, padding=1),
                                       nn.PixelShuffle(scale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x = pad_to_min_size(x, self.tile_multiple)
        mean = self.mean.to(x.dtype)
        feat = self.conv_1((x - mean) * self.img_range)
        deep = feat
        for group in self.body:
            deep = group(deep)
        out = self.upsampler(self.conv_2(self.norm(deep)) + feat) / self.img_range + mean
        return out[..., : h * self.scale, : w * self.scale]


__all__ = ["SeemoRe", "MoELayer"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("SeemoRe", scale_arg="scale", presets={
    "seemore_t": {"num_experts": 3, "embedding_dim": 36, "lr_space": "exp"},  # 0.23 M parameters at x4
})


def _recognise(s: StateShapes) -> dict:
    """SeemoRe from its tensors: width from the first conv, groups from the body, experts and their rank growth
    (``lr_space``) and the striped kernel length from the first group, the scale from the upsampler (RGB).
    The channel shuffle and the key's pooling count show in no tensor: the published Large's (48 wide, 16
    groups: none, 1) for that size, else the class's defaults."""
    dim = s.dim("conv_1.weight", 0)
    experts = "body.0.local_block.block.moe_layer.experts."
    ranks = [s.dim(f"{experts}{i}.conv_1.weight", 0) for i in s.indices(experts)]
    spaces = [name for name, grow in LR_SPACES.items() if ranks == [grow(i) for i in range(len(ranks))]]
    if not spaces:
        raise NotThisFamily(f"{experts}: expert ranks {ranks} follow no lr_space")
    scale = [sc for _, sc in shuffle_splits(s.dim("upsampler.0.weight", 0), (3,))]
    p = {"scale": scale[0], "in_chans": 3, "num_experts": len(ranks), "num_layers": s.count("body."),
         "embedding_dim": dim, "global_kernel_size": s.dim("body.0.global_block.block.attn.conv.0.weight", 3),
         "lr_space": spaces[0]}
    if dim == 48 and p["num_layers"] == 16:
        p.update(recursive=1, use_shuffle=False)
    return p


register_recogniser("SeemoRe", _recognise)

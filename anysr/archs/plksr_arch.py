"""PLKSR and RealPLKSR: Partial Large Kernel CNNs for Efficient Super-Resolution (Lee et al., arXiv 2024).

``PLKSR`` is the paper's network: blocks of a channel mixer (``ccm_type`` CCM / ICCM / DCCM, GELU), a large
kernel conv on a share of the channels (``lk_type``: one dense kernel, a sum of dilated sparse kernels, or
SLaK-style rectangular kernels), element-wise attention and a 1x1 refinement, with a PixelShuffle head that adds
the channel-repeated input. Module names and constructor arguments follow spandrel 0.4.2's ``PLKSR`` (including
its ``channe_mixer`` spelling), so released checkpoints load with ``strict=True``.

``RealPLKSR`` is the real-world variant. Module names, buffers and constructor arguments follow spandrel
0.4.2's ``RealPLKSR`` (neosr / traiNNer), so released checkpoints of all its variants load with ``strict=True``
and give the same output:

* ``layer_norm=False``: each block ends with a GroupNorm (``norm_groups`` groups);
  ``layer_norm=True``: each block starts with a channel layer norm instead;
* ``dysample=False``: PixelShuffle head; ``dysample=True``: the learned DySample upsampler (``to_img``).

The network is fully convolutional: any input size works without padding (``tile_multiple = 1``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.accelerators.hardware import resamples_by_gathers
from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d
from anysr.archs.recognition.recognise import (
    NotThisFamily,
    StateShapes,
    register_recogniser,
    shuffle_splits,
    width_ratio,
)
from anysr.ops.dcn import sample_bilinear
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


class DCCM(nn.Sequential):
    """Doubled convolutional channel mixer: 3x3 conv to 2x channels, Mish, 3x3 conv back."""

    def __init__(self, dim: int) -> None:
        super().__init__(nn.Conv2d(dim, dim * 2, 3, 1, 1), nn.Mish(), nn.Conv2d(dim * 2, dim, 3, 1, 1))
        nn.init.trunc_normal_(self[-1].weight, std=0.02)


class PLKConv2d(nn.Module):
    """Partial large-kernel conv: a ``kernel_size`` conv on the first ``dim`` channels, the rest passed through."""

    def __init__(self, dim: int, kernel_size: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, kernel_size, 1, kernel_size // 2)
        nn.init.trunc_normal_(self.conv.weight, std=0.02)
        self.idx = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (The original writes the eval result into x in place; concatenating gives the same values.)
        head, rest = x[:, : self.idx], x[:, self.idx:]
        return torch.cat([self.conv(head), rest], dim=1)


class EA(nn.Module):
    """Element-wise attention: ``x * sigmoid(conv3x3(x))``."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.f = nn.Sequential(nn.Conv2d(dim, dim, 3, 1, 1), nn.Sigmoid())
        nn.init.trunc_normal_(self.f[0].weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.f(x)


class PLKBlock(nn.Module):
    """[layer norm] -> DCCM -> partial large-kernel conv -> [EA] -> 1x1 refine -> [GroupNorm], plus the input."""

    def __init__(self, dim: int, kernel_size: int, split_ratio: float, use_ea: bool = True, norm_groups: int = 4,
                 use_layer_norm: bool = False) -> None:
        super().__init__()
        self.layer_norm = LayerNorm2d(dim) if use_layer_norm else nn.Identity()
        self.channel_mixer = DCCM(dim)
        self.lk = PLKConv2d(int(dim * split_ratio), kernel_size)
        self.attn = EA(dim) if use_ea else nn.Identity()
        self.refine = nn.Conv2d(dim, dim, 1, 1, 0)
        nn.init.trunc_normal_(self.refine.weight, std=0.02)
        self.norm = nn.Identity() if use_layer_norm else nn.GroupNorm(norm_groups, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lk(self.channel_mixer(self.layer_norm(x)))
        return self.norm(self.refine(self.attn(y))) + x


class DySample(nn.Module):
    """DySample (Liu et al., 2023, "Learning to Upsample by Learning to Sample"): a learned point sampler.

    For every output pixel and channel group, a 2-d offset ``offset(x) * sigmoid(scope(x)) / 2`` (1x1 convs
    on the low-resolution features) is added to the pixel's sub-pixel centre (the ``init_pos`` buffer); the
    group's features are sampled there bilinearly (border padding). An optional 1x1 ``end_conv`` maps the
    ``in_channels`` to ``out_ch``.

    Sampling positions are computed in float32 even under bf16 autocast (bf16 cannot address a pixel of a
    large image); the sampled result has the input's dtype.
    """

    def __init__(self, in_channels: int, out_ch: int, scale: int = 2, groups: int = 4,
                 end_convolution: bool = True) -> None:
        super().__init__()
        if in_channels < groups or in_channels % groups:
            raise ArchArgumentError(
                "groups", f"DySample needs in_channels ({in_channels}) to be a multiple of groups ({groups})")
        self.scale = scale
        self.groups = groups
        self.end_convolution = end_convolution
        if end_convolution:
            self.end_conv = nn.Conv2d(in_channels, out_ch, kernel_size=1)
        offsets = 2 * groups * scale**2
        self.offset = nn.Conv2d(in_channels, offsets, 1)
        self.scope = nn.Conv2d(in_channels, offsets, 1, bias=False)
        nn.init.trunc_normal_(self.offset.weight, std=0.02)
        nn.init.zeros_(self.scope.weight)
        self.register_buffer("init_pos", self._initial_positions())

    def _initial_positions(self) -> torch.Tensor:
        """Sub-pixel centres relative to the LR pixel, laid out as (x/y, group, row, column) channels."""
        s = self.scale
        steps = (torch.arange(s, dtype=torch.float32) - (s - 1) / 2) / s
        dx = steps.view(1, s).expand(s, s)  # varies along the column
        dy = steps.view(s, 1).expand(s, s)  # varies along the row
        pos = torch.stack([dx, dy]).unsqueeze(1).expand(2, self.groups, s, s)
        return pos.reshape(1, -1, 1, 1).clone()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        s, g = self.scale, self.groups
        work = torch.promote_types(x.dtype, torch.float32)
        offset = self.offset(x) * self.scope(x).sigmoid() * 0.5 + self.init_pos
        offset = offset.to(work).reshape(b, 2, g * s * s, h, w)
        cols = torch.arange(w, device=x.device, dtype=work) + 0.5
        rows = torch.arange(h, device=x.device, dtype=work) + 0.5
        # Normalised sampling positions in [-1, 1] (grid_sample's align_corners=False convention).
        gx = 2 * (cols.view(1, 1, 1, w) + offset[:, 0]) / w - 1
        gy = 2 * (rows.view(1, 1, h, 1) + offset[:, 1]) / h - 1
        grid = torch.stack([gx, gy], 1).reshape(b, 2 * g * s * s, h, w)
        grid = F.pixel_shuffle(grid, s).reshape(b, 2, g, s * h, s * w)
        grid = grid.permute(0, 2, 3, 4, 1).reshape(b * g, s * h, s * w, 2)
        if resamples_by_gathers(x.device):  # no grid_sample lowering there: the same samples from gathers
            px = ((grid[..., 0] + 1) * (w / 2) - 0.5).reshape(b, g, -1).transpose(1, 2)
            py = ((grid[..., 1] + 1) * (h / 2) - 0.5).reshape(b, g, -1).transpose(1, 2)
            out = sample_bilinear(x.to(work), px, py, padding_mode="border")  # (b, s*h*s*w, g, c // g)
            out = out.permute(0, 2, 3, 1).reshape(b, c, s * h, s * w).to(x.dtype)
        else:
            feats = x.reshape(b * g, c // g, h, w).to(work)
            out = F.grid_sample(feats, grid, mode="bilinear", padding_mode="border", align_corners=False)
            out = out.reshape(b, c, s * h, s * w).to(x.dtype)
        return self.end_conv(out) if self.end_convolution else out


@ARCH_REGISTRY.register()
class RealPLKSR(nn.Module):
    """RealPLKSR: 3x3 stem, ``n_blocks`` PLK blocks, dropout, 3x3 conv to ``3 * upscaling_factor**2`` channels
    plus the channel-repeated input, then PixelShuffle or DySample. RGB in and out (as the original).

    Args:
        dim: body width. n_blocks: PLK blocks. upscaling_factor: integer scale >= 1.
        kernel_size: odd size of the partial large kernel. split_ratio: share of channels it sees.
        use_ea: element-wise attention in each block. norm_groups: GroupNorm groups (without layer_norm).
        dropout: Dropout2d rate before the last conv (training only). dysample: DySample head.
        layer_norm: a channel layer norm at the start of each block instead of the GroupNorm at its end.
    """

    tile_multiple: int = 1

    def __init__(self, dim: int = 64, n_blocks: int = 28, upscaling_factor: int = 4, kernel_size: int = 17,
                 split_ratio: float = 0.25, use_ea: bool = True, norm_groups: int = 4, dropout: float = 0,
                 dysample: bool = False, layer_norm: bool = False) -> None:
        super().__init__()
        s = upscaling_factor
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ArchArgumentError("upscaling_factor", f"RealPLKSR needs an integer upscaling_factor >= 1, "
                                    f"got {s!r}")
        if not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
            raise ArchArgumentError("kernel_size", f"RealPLKSR needs an odd kernel_size, got {kernel_size!r}")
        if not 1 <= int(dim * split_ratio) <= dim:
            raise ArchArgumentError("split_ratio", f"RealPLKSR: int(dim * split_ratio) = {int(dim * split_ratio)} "
                                    f"channels for the large kernel; it must be between 1 and dim ({dim})")
        if not layer_norm and (norm_groups < 1 or dim % norm_groups):
            raise ArchArgumentError("norm_groups", f"RealPLKSR: dim ({dim}) must be a multiple of norm_groups "
                                    f"({norm_groups})")
        if not 0 <= dropout < 1:
            raise ArchArgumentError("dropout", f"RealPLKSR needs 0 <= dropout < 1, got {dropout!r}")
        in_ch = out_ch = 3
        self.upscale = s
        self.feats = nn.Sequential(
            nn.Conv2d(in_ch, dim, 3, 1, 1),
            *[PLKBlock(dim, kernel_size, split_ratio, use_ea, norm_groups, layer_norm) for _ in range(n_blocks)],
            nn.Dropout2d(dropout),
            nn.Conv2d(dim, out_ch * s**2, 3, 1, 1),
        )
        nn.init.trunc_normal_(self.feats[0].weight, std=0.02)
        nn.init.trunc_normal_(self.feats[-1].weight, std=0.02)
        if dysample:
            groups = out_ch if s % 2 else 4
            self.to_img = DySample(in_ch * s**2, out_ch, s, groups=groups, end_convolution=s != 1)
        else:
            self.to_img = nn.PixelShuffle(s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.to_img(self.feats(x) + x.repeat_interleave(self.upscale**2, dim=1))


class _GeluMixer(nn.Sequential):
    """PLKSR's channel mixers: conv (k1) -> GELU -> conv (k2), twice the width in between."""

    def __init__(self, dim: int, k1: int, k2: int) -> None:
        super().__init__(nn.Conv2d(dim, dim * 2, k1, 1, k1 // 2), nn.GELU(), nn.Conv2d(dim * 2, dim, k2, 1, k2 // 2))
        nn.init.trunc_normal_(self[-1].weight, std=0.02)


_MIXER_KERNELS = {"CCM": (3, 1), "ICCM": (1, 3), "DCCM": (3, 3)}


class _PartialConv(nn.Module):
    """Base of PLKSR's large-kernel layers: ``_mix`` on the first ``idx`` channels, the rest passed through."""

    idx: int

    def _mix(self, head: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (The original overwrites x in place at eval; concatenating computes the same values, autograd-safe.)
        head, rest = x[:, : self.idx], x[:, self.idx:]
        return torch.cat([self._mix(head), rest], dim=1)


class PLKDenseConv(_PartialConv):
    """One ``kernel_size`` conv on the partial channels, plus them when ``with_idt`` (key: ``conv``)."""

    def __init__(self, dim: int, kernel_size: int, with_idt: bool) -> None:
        super().__init__()
        self.idx = dim
        self.with_idt = with_idt
        self.conv = nn.Conv2d(dim, dim, kernel_size, 1, kernel_size // 2)
        nn.init.trunc_normal_(self.conv.weight, std=0.02)

    def _mix(self, head: torch.Tensor) -> torch.Tensor:
        out = self.conv(head)
        return out + head if self.with_idt else out


class PLKSparseConv(_PartialConv):
    """Sum of dilated ``sparse_kernels`` convs (RepLKNet / UniRepLKNet style) on the partial channels, plus a dense
    conv of the largest covered size when ``use_max_kernel``, plus the channels when ``with_idt`` (keys:
    ``convs.<i>``)."""

    def __init__(self, dim: int, kernel_size: int, sparse_kernels: Sequence[int], sparse_dilations: Sequence[int],
                 use_max_kernel: bool, with_idt: bool) -> None:
        super().__init__()
        self.idx = dim
        self.with_idt = with_idt
        pairs = list(zip(sparse_kernels, sparse_dilations))
        self.max_kernel_size = max([kernel_size] + [(k - 1) * d + 1 for k, d in pairs])
        convs = [nn.Conv2d(dim, dim, k, 1, (k // 2) * d, dilation=d) for k, d in pairs]
        if use_max_kernel:
            convs.append(nn.Conv2d(dim, dim, self.max_kernel_size, 1, self.max_kernel_size // 2))
        self.convs = nn.ModuleList(convs)
        for conv in self.convs:
            nn.init.trunc_normal_(conv.weight, std=0.02)

    def _mix(self, head: torch.Tensor) -> torch.Tensor:
        total = sum(conv(head) for conv in self.convs[1:]) + self.convs[0](head)
        return total + head if self.with_idt else total


class PLKRectConv(_PartialConv):
    """SLaK-style rectangular kernels m x n + n x m + n x n (m = ``kernel_size``, n = m // 3) on the partial
    channels (keys: ``mn_conv``, ``nm_conv``, ``nn_conv``)."""

    def __init__(self, dim: int, kernel_size: int) -> None:
        super().__init__()
        self.idx = dim
        m, n = kernel_size, kernel_size // 3
        self.mn_conv = nn.Conv2d(dim, dim, (m, n), 1, (m // 2, n // 2))
        self.nm_conv = nn.Conv2d(dim, dim, (n, m), 1, (n // 2, m // 2))
        self.nn_conv = nn.Conv2d(dim, dim, (n, n), 1, (n // 2, n // 2))
        for conv in (self.mn_conv, self.nm_conv, self.nn_conv):
            nn.init.trunc_normal_(conv.weight, std=0.02)

    def _mix(self, head: torch.Tensor) -> torch.Tensor:
        return self.mn_conv(head) + self.nm_conv(head) + self.nn_conv(head)


class PLKSRBlock(nn.Module):
    """PLKSR block: channel mixer -> partial large-kernel layer -> [EA] -> 1x1 refine, plus the input."""

    def __init__(self, dim: int, ccm_type: str, kernel_size: int, split_ratio: float, lk_type: str,
                 use_max_kernel: bool, sparse_kernels: Sequence[int], sparse_dilations: Sequence[int],
                 with_idt: bool, use_ea: bool) -> None:
        super().__init__()
        self.channe_mixer = _GeluMixer(dim, *_MIXER_KERNELS[ccm_type])  # (sic: the checkpoints' key)
        part = int(dim * split_ratio)
        self.lk: nn.Module
        if lk_type == "PLK":
            self.lk = PLKDenseConv(part, kernel_size, with_idt)
        elif lk_type == "SparsePLK":
            self.lk = PLKSparseConv(part, kernel_size, sparse_kernels, sparse_dilations, use_max_kernel, with_idt)
        else:
            self.lk = PLKRectConv(part, kernel_size)
        self.attn = EA(dim) if use_ea else nn.Identity()
        self.refine = nn.Conv2d(dim, dim, 1, 1, 0)
        nn.init.trunc_normal_(self.refine.weight, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.refine(self.attn(self.lk(self.channe_mixer(x)))) + x


@ARCH_REGISTRY.register()
class PLKSR(nn.Module):
    """PLKSR: 3x3 stem, ``n_blocks`` PLKSR blocks, 3x3 conv to ``3 * upscaling_factor**2`` channels plus the
    channel-repeated input, PixelShuffle. RGB in and out. Fully convolutional (``tile_multiple = 1``).

    Args:
        dim: body width. n_blocks: blocks. upscaling_factor: integer scale >= 1.
        ccm_type: channel mixer, "CCM" (3x3, 1x1), "ICCM" (1x1, 3x3) or "DCCM" (3x3, 3x3).
        kernel_size: odd large-kernel size. split_ratio: share of channels the large kernel sees.
        lk_type: "PLK" (dense), "SparsePLK" (dilated sparse kernels) or "RectSparsePLK" (rectangular).
        use_max_kernel, sparse_kernels, sparse_dilations: SparsePLK's kernels (odd sizes) and dilations.
        with_idt: add the partial channels to the large-kernel result (PLK and SparsePLK).
        use_ea: element-wise attention in each block.
    """

    tile_multiple: int = 1

    def __init__(self, *, dim: int = 64, n_blocks: int = 28, upscaling_factor: int = 4, ccm_type: str = "CCM",
                 kernel_size: int = 17, split_ratio: float = 0.25, lk_type: str = "PLK",
                 use_max_kernel: bool = False, sparse_kernels: Sequence[int] = (5, 5, 5, 5),
                 sparse_dilations: Sequence[int] = (1, 2, 3, 4), with_idt: bool = False,
                 use_ea: bool = True) -> None:
        super().__init__()
        s = upscaling_factor
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise ArchArgumentError("upscaling_factor", f"PLKSR needs an integer upscaling_factor >= 1, got {s!r}")
        if ccm_type not in _MIXER_KERNELS:
            raise ArchArgumentError("ccm_type", f"PLKSR: ccm_type must be CCM, ICCM or DCCM, got {ccm_type!r}")
        if lk_type not in ("PLK", "SparsePLK", "RectSparsePLK"):
            raise ArchArgumentError("lk_type", f"PLKSR: lk_type must be PLK, SparsePLK or RectSparsePLK, "
                                    f"got {lk_type!r}")
        if not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
            raise ArchArgumentError("kernel_size", f"PLKSR needs an odd kernel_size, got {kernel_size!r}")
        if lk_type == "RectSparsePLK" and (kernel_size // 3) % 2 == 0:
            raise ArchArgumentError("kernel_size", f"PLKSR: RectSparsePLK needs kernel_size // 3 to be odd (the "
                                    f"short side), got {kernel_size} // 3 = {kernel_size // 3}")
        if lk_type == "SparsePLK":
            if len(sparse_kernels) != len(sparse_dilations) or any(k % 2 == 0 or k < 1 for k in sparse_kernels):
                raise ArchArgumentError("sparse_kernels", "PLKSR: sparse_kernels must be odd sizes, one per entry "
                                        f"of sparse_dilations; got {list(sparse_kernels)} / {list(sparse_dilations)}")
            if not sparse_kernels and not use_max_kernel:
                raise ArchArgumentError("sparse_kernels", "PLKSR: SparsePLK needs sparse_kernels or use_max_kernel")
            if any(d < 1 for d in sparse_dilations):
                raise ArchArgumentError("sparse_dilations", f"PLKSR: dilations must be >= 1, got "
                                        f"{list(sparse_dilations)}")
        if not 1 <= int(dim * split_ratio) <= dim:
            raise ArchArgumentError("split_ratio", f"PLKSR: int(dim * split_ratio) = {int(dim * split_ratio)} "
                                    f"channels for the large kernel; it must be between 1 and dim ({dim})")
        self.upscale = s
        blocks = [PLKSRBlock(dim, ccm_type, kernel_size, split_ratio, lk_type, use_max_kernel, sparse_kernels,
                             sparse_dilations, with_idt, use_ea) for _ in range(n_blocks)]
        self.feats = nn.Sequential(nn.Conv2d(3, dim, 3, 1, 1), *blocks, nn.Conv2d(dim, 3 * s**2, 3, 1, 1))
        nn.init.trunc_normal_(self.feats[0].weight, std=0.02)
        nn.init.trunc_normal_(self.feats[-1].weight, std=0.02)
        self.to_img = nn.PixelShuffle(s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.to_img(self.feats(x) + x.repeat_interleave(self.upscale**2, dim=1))


__all__ = ["PLKSR", "RealPLKSR", "PLKBlock", "PLKSRBlock", "DySample"]


def _trainner_upsampler(args: dict[str, Any]) -> dict[str, Any]:
    """traiNNer-redux's ``upsampler: pixelshuffle | dysample`` -> anysr's (and spandrel's) ``dysample`` flag."""
    up = args.pop("upsampler", None)
    if up is None:
        return args
    if up not in ("pixelshuffle", "dysample"):
        raise ValueError(f"upsampler: {up!r} is not available in RealPLKSR; use pixelshuffle or dysample (the two "
                         "layouts whose weights spandrel loads)")
    return {**args, "dysample": up == "dysample"}


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("RealPLKSR", scale_arg="upscaling_factor",
                 fixed={"in_ch": 3, "out_ch": 3},
                 translate=_trainner_upsampler, accepts=("upsampler",),
                 presets={
    "realplksr": {"layer_norm": True},  # 7.39 M parameters at x4
    "realplksr_large": {"dim": 96, "layer_norm": True},  # 16.59 M parameters at x4
    # 2.37 M parameters at x4
    "realplksr_tiny": {"n_blocks": 12, "kernel_size": 13, "use_ea": False, "layer_norm": True},
})

register_presets("PLKSR", scale_arg="upscaling_factor", presets={
    "plksr": {"ccm_type": "DCCM"},  # 7.39 M parameters at x4
    "plksr_tiny": {"n_blocks": 12, "kernel_size": 13, "use_ea": False, "ccm_type": "DCCM"},  # 2.37 M at x4
})

# neosr's names (tests/test_neosr_names.py checks them against the networks neosr builds): neosr's RealPLKSR ends
# each block with the GroupNorm (``layer_norm=False``; its ``realplksr`` name here is traiNNer-redux's)
register_presets("RealPLKSR", scale_arg="upscaling_factor", fixed={"in_ch": 3, "out_ch": 3}, source="neosr",
                 presets={
    "realplksr_s": {"n_blocks": 12, "kernel_size": 13, "use_ea": False},  # 2.37 M parameters at x4
    "realplksr_l": {"dim": 96},  # 16.59 M parameters at x4
})


def dysample_scale(s: StateShapes, prefix: str, groups: int = 4) -> int:
    """The scale of a DySample at ``prefix`` from its offset conv (``2 * groups * scale**2`` outputs)."""
    offsets = s.dim(f"{prefix}offset.weight", 0)
    scale = round((offsets / (2 * groups)) ** 0.5)
    if 2 * groups * scale * scale != offsets:
        raise NotThisFamily(f"{prefix}offset: {offsets} outputs fit no DySample scale")
    return scale



def _scale_of_last_conv(s: StateShapes, last: str) -> int:
    """The scale of a head conv feeding PixelShuffle with 3 * scale**2 channels (RGB)."""
    splits = shuffle_splits(s.dim(last, 0), (3,))
    if not splits:
        raise NotThisFamily(f"{last}: not 3 * scale**2 channels")
    return splits[0][1]


def _recognise_real(s: StateShapes) -> dict:
    """RealPLKSR from its tensors: width from the first conv, the blocks (count, large kernel and the share of
    channels it sees, attention, layer or group norm) from the body, the scale from the last conv, the head
    (DySample or PixelShuffle) from its names. GroupNorm's group count shows in no tensor (4 when it divides)."""
    dim = s.dim("feats.0.weight", 0)
    blocks = [i for i in s.indices("feats.") if f"feats.{i}.refine.weight" in s]
    p: dict = {"dim": dim, "n_blocks": len(blocks),
               "upscaling_factor": _scale_of_last_conv(s, f"feats.{max(s.indices('feats.'))}.weight"),
               "dysample": "to_img.offset.weight" in s}
    if blocks:
        b = f"feats.{blocks[0]}."
        s.shape(f"{b}channel_mixer.0.weight")
        p.update(kernel_size=s.dim(f"{b}lk.conv.weight", 2),
                 split_ratio=width_ratio(s.dim(f"{b}lk.conv.weight", 0), dim, 0.25),
                 use_ea=f"{b}attn.f.0.weight" in s, layer_norm=f"{b}layer_norm.weight" in s)
        if not p["layer_norm"]:
            p["norm_groups"] = next(g for g in (4, 3, 2, 1) if dim % g == 0)
    return p


def _recognise_plksr(s: StateShapes) -> list[dict]:
    """PLKSR from its tensors: width from the first conv, the scale from the last, the blocks' channel mixer
    (its two kernel sizes), large-kernel kind and size, the share of channels it sees and the attention from the
    first block. SparsePLK's dilations and ``with_idt`` show in no tensor (the class's defaults are proposed);
    its kernels are read, a last larger one proposed first as the max kernel."""
    dim = s.dim("feats.0.weight", 0)
    blocks = [i for i in s.indices("feats.") if f"feats.{i}.refine.weight" in s]
    last = max(s.indices("feats."))
    common: dict = {"dim": dim, "n_blocks": len(blocks),
                    "upscaling_factor": _scale_of_last_conv(s, f"feats.{last}.weight")}
    if not blocks:
        return [common]
    b = f"feats.{blocks[0]}."
    kernels = (s.dim(f"{b}channe_mixer.0.weight", 2), s.dim(f"{b}channe_mixer.2.weight", 2))
    ccm = [k for k, v in _MIXER_KERNELS.items() if v == kernels]
    if not ccm:
        raise NotThisFamily(f"{b}channe_mixer: kernels {kernels} are no channel mixer's")
    common["ccm_type"] = ccm[0]
    common["use_ea"] = f"{b}attn.f.0.weight" in s
    if f"{b}lk.conv.weight" in s:
        part = s.dim(f"{b}lk.conv.weight", 0)
        return [{**common, "lk_type": "PLK", "kernel_size": s.dim(f"{b}lk.conv.weight", 2),
                 "split_ratio": width_ratio(part, dim, 0.25)}]
    if f"{b}lk.mn_conv.weight" in s:
        part = s.dim(f"{b}lk.mn_conv.weight", 0)
        return [{**common, "lk_type": "RectSparsePLK", "kernel_size": s.dim(f"{b}lk.mn_conv.weight", 2),
                 "split_ratio": width_ratio(part, dim, 0.25)}]
    part = s.dim(f"{b}lk.convs.0.weight", 0)
    sizes = [s.dim(f"{b}lk.convs.{i}.weight", 2) for i in s.indices(f"{b}lk.convs.")]
    common.update(lk_type="SparsePLK", split_ratio=width_ratio(part, dim, 0.25))

    def sparse(ks: list[int]) -> dict:
        dilations = (1, 2, 3, 4) if len(ks) == 4 else tuple(range(1, len(ks) + 1))
        return {"sparse_kernels": ks, "sparse_dilations": dilations}

    plain = {**common, **sparse(sizes), "use_max_kernel": False}
    with_max = {**common, **sparse(sizes[:-1]), "use_max_kernel": True, "kernel_size": sizes[-1]}
    if len(sizes) >= 2 and sizes[-1] > max(sizes[:-1]):
        return [with_max, plain]
    return [plain, with_max] if len(sizes) >= 2 else [plain]


register_recogniser("RealPLKSR", _recognise_real)
register_recogniser("PLKSR", _recognise_plksr)

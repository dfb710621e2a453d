"""DITN: "Unfolding Once is Enough: A Deployment-Friendly Transformer Unit for Super-Resolution" (Liu et
al., ACM Multimedia 2023), the real-world variant (``DITN_Real``) that spandrel 0.4.2 loads as DITN.

Module names and constructor arguments follow spandrel 0.4.2, so released checkpoints load with
``strict=True`` and give the same output. A 3x3 stem feeds ``UFONE_blocks`` units; each unfolds the map
into ``patch_size`` patches once, runs ``ITL_blocks`` inner-patch transformer layers there (channel
self-attention with a learned temperature, as ``F.scaled_dot_product_attention``, and a gated depth-wise
feed-forward), folds back and runs ``SAL_blocks`` spatial-aware layers (large dilated depth-wise convs) on the
whole map; a 3x3 conv, the long shortcut and a conv + PixelShuffle head follow.

Size requirement: the input is padded at the bottom / right to a multiple of 8 (reflect, then edge
replication where reflect cannot reach), as the original does, and the output cropped; ``patch_size`` must
divide 8. ``tile_multiple`` is 8.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, pad_to_multiple
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

PAD_MULTIPLE = 8  # the original pads to lcm(8, 8), independent of patch_size


class FeedForward(nn.Module):
    """1x1 conv to 2 x hidden, depth-wise 3x3, ``gelu(a) * b``, 1x1 back."""

    def __init__(self, dim: int, ffn_expansion_factor: float, bias: bool) -> None:
        super().__init__()
        hidden = int(dim * ffn_expansion_factor)
        self.project_in = nn.Conv2d(dim, hidden * 2, 1, bias=bias)
        self.dwconv = nn.Conv2d(hidden * 2, hidden * 2, 3, 1, 1, groups=hidden * 2, bias=bias)
        self.project_out = nn.Conv2d(hidden, dim, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.dwconv(self.project_in(x)).chunk(2, dim=1)
        return self.project_out(F.gelu(a) * b)


class ISA(nn.Module):
    """Inner-patch (channel) self-attention: tokens are the channels, each a vector over the patch's pixels;
    ``softmax(temperature * q_hat k_hat^T) v`` with L2-normalised ``q``, ``k`` (one head)."""

    def __init__(self, dim: int, bias: bool) -> None:
        super().__init__()
        self.temperature = nn.Parameter(torch.ones(1, 1, 1))
        self.qkv = nn.Linear(dim, dim * 3)
        self.project_out = nn.Conv2d(dim, dim, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        qkv = self.qkv(x.reshape(b, c, h * w).transpose(1, 2)).transpose(1, 2)  # (b, 3c, hw)
        q, k, v = qkv.chunk(3, dim=1)
        q = F.normalize(q, dim=-1) * self.temperature.reshape(1, 1, 1)
        k = F.normalize(k, dim=-1)
        out = F.scaled_dot_product_attention(q, k, v, scale=1.0)
        return self.project_out(out.reshape(b, c, h, w))


class SDA(nn.Module):
    """Spatial-aware depth-wise attention: half of a 1x1 expansion passes a 5x5 and a dilated (3) 7x7
    depth-wise conv and a 1x1 conv and gates the other half; 1x1 projection times a learned per-channel scale."""

    def __init__(self, n_feats: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.zeros(1, n_feats, 1, 1))
        self.DConvs = nn.Sequential(
            nn.Conv2d(n_feats, n_feats, 5, 1, 2, groups=n_feats),
            nn.Conv2d(n_feats, n_feats, 7, 1, 9, groups=n_feats, dilation=3),
            nn.Conv2d(n_feats, n_feats, 1, 1, 0),
        )
        self.proj_first = nn.Sequential(nn.Conv2d(n_feats, 2 * n_feats, 1, 1, 0))
        self.proj_last = nn.Sequential(nn.Conv2d(n_feats, n_feats, 1, 1, 0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, x = self.proj_first(x).chunk(2, dim=1)
        return self.proj_last(x * self.DConvs(a)) * self.scale


class _TanhResidualLayer(nn.Module):
    """``x + mixer(conv1(tanh(x)))``, then ``+ ffn(conv2(tanh(.)))`` (the layer shape ITL and SAL share)."""

    mixer: nn.Module

    def __init__(self, n_feats: int, ffn_expansion_factor: float, bias: bool) -> None:
        super().__init__()
        self.act = nn.Tanh()
        self.conv1 = nn.Conv2d(n_feats, n_feats, 1)
        self.conv2 = nn.Conv2d(n_feats, n_feats, 1)
        self.ffn = FeedForward(n_feats, ffn_expansion_factor, bias)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mix(self.conv1(self.act(x)))
        return x + self.ffn(self.conv2(self.act(x)))


class ITL(_TanhResidualLayer):
    """Inner-patch transformer layer (channel attention ``attn``)."""

    def __init__(self, n_feats: int, ffn_expansion_factor: float, bias: bool) -> None:
        super().__init__(n_feats, ffn_expansion_factor, bias)
        self.attn = ISA(n_feats, bias)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)


class SAL(_TanhResidualLayer):
    """Spatial-aware layer (depth-wise ``SDA``)."""

    def __init__(self, n_feats: int, ffn_expansion_factor: float, bias: bool) -> None:
        super().__init__(n_feats, ffn_expansion_factor, bias)
        self.SDA = SDA(n_feats)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        return self.SDA(x)


class UFONE(nn.Module):
    """Unfold once into ``patch_size`` patches, run the ITLs per patch, fold back, run the SALs."""

    def __init__(self, dim: int, ffn_expansion_factor: float, bias: bool, ITL_blocks: int, SAL_blocks: int,
                 patch_size: int) -> None:
        super().__init__()
        self.ITLs = nn.Sequential(*[ITL(dim, ffn_expansion_factor, bias) for _ in range(ITL_blocks)])
        self.SALs = nn.Sequential(*[SAL(dim, ffn_expansion_factor, bias) for _ in range(SAL_blocks)])
        self.patch_size = patch_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        p = self.patch_size
        nh, nw = h // p, w // p
        patches = x.reshape(b, c, nh, p, nw, p).permute(0, 2, 4, 1, 3, 5).reshape(b * nh * nw, c, p, p)
        patches = self.ITLs(patches)
        x = patches.reshape(b, nh, nw, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
        return self.SALs(x)


@ARCH_REGISTRY.register()
class DITN(nn.Module):
    """DITN (real-world variant): 3x3 stem, UFONE units, 3x3 conv plus the stem's features, conv + PixelShuffle
    to RGB.

    Args:
        inp_channels: input channels (the output is RGB). dim: width (60). ITL_blocks / SAL_blocks: layers per
        unit (4 / 4). UFONE_blocks: units (1). ffn_expansion_factor: feed-forward hidden factor (2).
        bias: biases in the feed-forward and attention projections. LayerNorm_type: accepted for option
        compatibility; the network has no layer norm. patch_size: ITL patch side (a divisor of 8).
        upscale: integer scale >= 1.
    """

    tile_multiple: int = PAD_MULTIPLE

    def __init__(self, inp_channels: int = 3, dim: int = 60, ITL_blocks: int = 4, SAL_blocks: int = 4,  # noqa: N803
                 UFONE_blocks: int = 1, ffn_expansion_factor: float = 2, bias: bool = False,  # noqa: N803
                 LayerNorm_type: str = "WithBias", patch_size: int = 8, upscale: int = 4) -> None:  # noqa: N803
        super().__init__()
        if isinstance(upscale, bool) or not isinstance(upscale, int) or upscale < 1:
            raise ArchArgumentError("upscale", f"DITN needs an integer upscale >= 1, got {upscale!r}")
        if not isinstance(patch_size, int) or patch_size < 1 or PAD_MULTIPLE % patch_size:
            raise ArchArgumentError("patch_size", f"DITN pads its input to a multiple of {PAD_MULTIPLE}: "
                                    f"patch_size must divide it, got {patch_size!r}")
        self.patch_size = patch_size
        self.scale = upscale
        self.sft = nn.Conv2d(inp_channels, dim, 3, 1, 1)
        self.UFONE = nn.Sequential(*[UFONE(dim, ffn_expansion_factor, bias, ITL_blocks, SAL_blocks, patch_size)
                                     for _ in range(UFONE_blocks)])
        self.conv_after_body = nn.Conv2d(dim, dim, 3, 1, 1)
        self.upsample = nn.Sequential(nn.Conv2d(dim, upscale**2 * 3, 3, 1, 1), nn.PixelShuffle(upscale))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, PAD_MULTIPLE)
        feat = self.sft(x)
        out = self.upsample(self.conv_after_body(self.UFONE(feat)) + feat)
        return out[..., : h * self.scale, : w * self.scale]


__all__ = ["DITN"]


# Published variants by name (traiNNer-redux's names); tests/test_presets.py checks each against the network
# traiNNer-redux builds.
register_presets("DITN", scale_arg="upscale", presets={
    "ditn_real": {},  # 0.44 M parameters at x4
})


def _recognise(s: StateShapes) -> dict:
    """DITN from its tensors: width and input channels from the stem, units and layers per unit, the feed-forward
    factor from its (doubled) hidden width, the bias switch, the scale from the output conv (RGB x scale**2). The
    patch size changes no tensor (the published 8 is kept)."""
    dim = s.dim("sft.weight", 0)
    return {"inp_channels": s.dim("sft.weight", 1), "dim": dim, "ITL_blocks": s.count("UFONE.0.ITLs."),
            "SAL_blocks": s.count("UFONE.0.SALs."), "UFONE_blocks": s.count("UFONE."),
            "ffn_expansion_factor": s.dim("UFONE.0.ITLs.0.ffn.project_in.weight", 0) / 2 / dim,
            "bias": "UFONE.0.ITLs.0.ffn.project_in.bias" in s,
            "upscale": round((s.dim("upsample.0.weight", 0) // 3) ** 0.5)}


register_recogniser("DITN", _recognise)

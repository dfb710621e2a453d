"""Retinexformer: One-stage Retinex-based Transformer for low-light image enhancement (Cai, Bian, Lin, Wang, Timofte,
Zhang; ICCV 2023).

Module names and constructor arguments follow the authors' code (as in spandrel 0.4.2), so released checkpoints
load with ``strict=True`` and give the same output.

Each stage estimates an illumination map and feature from the image and its channel mean, lights the image up
(``img * map + img``) and restores it with a two-level U-Net of illumination-guided attention blocks: channel-wise
("transposed") self-attention whose values are gated by the illumination feature. Stages are chained. Scale 1,
RGB in and out. The U-Net halves the size twice: inputs are padded (reflect, then edge) at the bottom / right to a
multiple of 8 inside ``forward`` (spandrel's size requirement) and the output cropped; ``tile_multiple`` is 8.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, pad_to_multiple
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY

SIZE_MULTIPLE = 8
LEVELS = 2  # fixed in the authors' network


class IlluminationEstimator(nn.Module):
    """1x1 conv of (image, channel mean), 5x5 grouped conv -> illumination feature, 1x1 conv -> 3-channel map."""

    def __init__(self, n_fea_middle: int, n_fea_in: int = 4, n_fea_out: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(n_fea_in, n_fea_middle, 1)
        self.depth_conv = nn.Conv2d(n_fea_middle, n_fea_middle, 5, padding=2, groups=n_fea_in)
        self.conv2 = nn.Conv2d(n_fea_middle, n_fea_out, 1)

    def forward(self, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feat = self.depth_conv(self.conv1(torch.cat([img, img.mean(1, keepdim=True)], 1)))
        return feat, self.conv2(feat)


class IGMSA(nn.Module):
    """Illumination-guided multi-head self-attention over channels, on channels-last maps (b, h, w, c).

    Per head, queries and keys are L2-normalised along the pixels, the (d x d) attention ``softmax(k q^T *
    rescale)`` mixes the illumination-gated values; a depth-wise conv branch on the raw values adds position.
    """

    def __init__(self, dim: int, dim_head: int = 64, heads: int = 8) -> None:
        super().__init__()
        self.num_heads = heads
        self.dim_head = dim_head
        inner = dim_head * heads
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.rescale = nn.Parameter(torch.ones(heads, 1, 1))
        self.proj = nn.Linear(inner, dim)
        self.pos_emb = nn.Sequential(nn.Conv2d(dim, dim, 3, 1, 1, bias=False, groups=dim), nn.GELU(),
                                     nn.Conv2d(dim, dim, 3, 1, 1, bias=False, groups=dim))

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(b, n, heads * d) -> (b, heads, d, n)."""
        b, n, _ = t.shape
        return t.reshape(b, n, self.num_heads, self.dim_head).permute(0, 2, 3, 1)

    def forward(self, x: torch.Tensor, illu: torch.Tensor) -> torch.Tensor:
        b, h, w, c = x.shape
        tokens = x.reshape(b, h * w, c)
        v_raw = self.to_v(tokens)
        q = F.normalize(self._heads(self.to_q(tokens)), dim=-1)
        k = F.normalize(self._heads(self.to_k(tokens)), dim=-1)
        v = self._heads(v_raw * illu.reshape(b, h * w, -1))
        # softmax(k q^T * rescale) v: the per-head scale is folded into the "query" (here k), SDPA's scale is 1
        out = F.scaled_dot_product_attention(k * self.rescale.to(k.dtype), q, v, scale=1.0)
        out = self.proj(out.permute(0, 3, 1, 2).reshape(b, h * w, -1)).reshape(b, h, w, c)
        pos = self.pos_emb(v_raw.reshape(b, h, w, c).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
        return out + pos


class FeedForward(nn.Module):
    """1x1 conv to ``mult`` x width, GELU, 3x3 depth-wise conv, GELU, 1x1 conv back; channels-last in and out."""

    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        hidden = dim * mult
        self.net = nn.Sequential(nn.Conv2d(dim, hidden, 1, bias=False), nn.GELU(),
                                 nn.Conv2d(hidden, hidden, 3, 1, 1, bias=False, groups=hidden), nn.GELU(),
                                 nn.Conv2d(hidden, dim, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class PreNorm(nn.Module):
    """``fn(LayerNorm(x))`` on channels-last maps."""

    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x))


class IGAB(nn.Module):
    """``num_blocks`` x (IG-MSA + residual, pre-norm feed-forward + residual) on NCHW maps."""

    def __init__(self, dim: int, dim_head: int = 64, heads: int = 8, num_blocks: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleList([IGMSA(dim, dim_head, heads), PreNorm(dim, FeedForward(dim))]) for _ in range(num_blocks))

    def forward(self, x: torch.Tensor, illu: torch.Tensor) -> torch.Tensor:
        x = x.permute(0, 2, 3, 1)
        illu = illu.permute(0, 2, 3, 1)
        for attn, ff in self.blocks:  # type: ignore[misc]
            x = attn(x, illu) + x
            x = ff(x) + x
        return x.permute(0, 3, 1, 2)


class Denoiser(nn.Module):
    """U-Net of IGABs: ``level`` encoder stages (IGAB, then 4x4 stride-2 convs for the features and the
    illumination), a bottleneck IGAB, decoder stages (2x2 transposed conv, 1x1 fusion with the skip, IGAB)."""

    def __init__(self, in_dim: int = 3, out_dim: int = 3, dim: int = 31, level: int = 2,
                 num_blocks: Sequence[int] = (2, 4, 4)) -> None:
        super().__init__()
        self.level = level
        self.embedding = nn.Conv2d(in_dim, dim, 3, 1, 1, bias=False)
        self.encoder_layers = nn.ModuleList()
        width = dim
        for i in range(level):
            self.encoder_layers.append(nn.ModuleList([
                IGAB(width, dim_head=dim, heads=width // dim, num_blocks=num_blocks[i]),
                nn.Conv2d(width, width * 2, 4, 2, 1, bias=False),
                nn.Conv2d(width, width * 2, 4, 2, 1, bias=False),
            ]))
            width *= 2
        self.bottleneck = IGAB(width, dim_head=dim, heads=width // dim, num_blocks=num_blocks[-1])
        self.decoder_layers = nn.ModuleList()
        for i in range(level):
            self.decoder_layers.append(nn.ModuleList([
                nn.ConvTranspose2d(width, width // 2, 2, stride=2),
                nn.Conv2d(width, width // 2, 1, bias=False),
                IGAB(width // 2, dim_head=dim, heads=width // 2 // dim, num_blocks=num_blocks[level - 1 - i]),
            ]))
            width //= 2
        self.mapping = nn.Conv2d(dim, out_dim, 3, 1, 1, bias=False)
        self.lrelu = nn.LeakyReLU(0.1, inplace=True)  # unused in forward (kept as in the authors' module)
        self.apply(_init_weights)

    def forward(self, x: torch.Tensor, illu: torch.Tensor) -> torch.Tensor:
        fea = self.embedding(x)
        skips: list[tuple[torch.Tensor, torch.Tensor]] = []
        for igab, down_fea, down_illu in self.encoder_layers:  # type: ignore[misc]
            fea = igab(fea, illu)
            skips.append((fea, illu))
            fea, illu = down_fea(fea), down_illu(illu)
        fea = self.bottleneck(fea, illu)
        for up, fuse, igab in self.decoder_layers:  # type: ignore[misc]
            skip, illu = skips.pop()
            fea = igab(fuse(torch.cat([up(fea), skip], 1)), illu)
        return self.mapping(fea) + x


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02, a=-2.0, b=2.0)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


class RetinexFormerSingleStage(nn.Module):
    """One stage: illumination estimate, lit image ``img * map + img``, denoised by the U-Net."""

    def __init__(self, in_channels: int = 3, out_channels: int = 3, n_feat: int = 31, level: int = 2,
                 num_blocks: Sequence[int] = (1, 1, 1)) -> None:
        super().__init__()
        self.estimator = IlluminationEstimator(n_feat)
        self.denoiser = Denoiser(in_channels, out_channels, n_feat, level, num_blocks)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        illu_fea, illu_map = self.estimator(img)
        return self.denoiser(img * illu_map + img, illu_fea)


@ARCH_REGISTRY.register()
class RetinexFormer(nn.Module):
    """Retinexformer: ``stage`` chained single-stage networks (x1, RGB in and out).

    Args:
        in_channels / out_channels: 3 (the illumination estimator reads RGB plus its mean, and each stage adds its
            input to its output). n_feat: width (a multiple of 4; 40 in the released models).
        stage: number of stages (1 for the released LOL / SDSD / SID / SMID / FiveK / NTIRE models).
        num_blocks: attention blocks at level 1, level 2 and in the bottleneck.
    """

    tile_multiple: int = SIZE_MULTIPLE
    other_names = ("Retinexformer",)

    def __init__(self, *, in_channels: int = 3, out_channels: int = 3, n_feat: int = 40, stage: int = 3,
                 num_blocks: Sequence[int] = (1, 1, 1)) -> None:
        super().__init__()
        if in_channels != 3 or out_channels != 3:
            raise ArchArgumentError("in_channels" if in_channels != 3 else "out_channels",
                                    f"RetinexFormer works on RGB images (in_channels = out_channels = 3), got "
                                    f"{in_channels} -> {out_channels}")
        if isinstance(n_feat, bool) or not isinstance(n_feat, int) or n_feat < 4 or n_feat % 4:
            raise ArchArgumentError("n_feat", f"RetinexFormer needs n_feat to be a positive multiple of 4 (the "
                                    f"illumination conv has 4 groups), got {n_feat!r}")
        if len(num_blocks) != LEVELS + 1 or any(isinstance(n, bool) or not isinstance(n, int) or n < 0
                                               for n in num_blocks):
            raise ArchArgumentError("num_blocks", f"RetinexFormer needs {LEVELS + 1} block counts (level 1, "
                                    f"level 2, bottleneck), got {num_blocks!r}")
        if isinstance(stage, bool) or not isinstance(stage, int) or stage < 1:
            raise ArchArgumentError("stage", f"RetinexFormer needs an integer stage >= 1, got {stage!r}")
        self.stage = stage
        self.in_channels = in_channels  # what the network reads (its first conv reads 4: RGB and the mean)
        self.body = nn.Sequential(*(RetinexFormerSingleStage(in_channels, out_channels, n_feat, LEVELS,
                                                             list(num_blocks)) for _ in range(stage)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, SIZE_MULTIPLE)
        return self.body(x)[..., :h, :w]


__all__ = ["IGAB", "IGMSA", "RetinexFormer"]


def _recognise(s: StateShapes) -> dict:
    """RetinexFormer from its tensors: width from the first stage's embedding conv, stages from the body, the
    blocks of the two encoder levels and of the bottleneck from their IGABs (RGB in and out)."""
    d = "body.0.denoiser."
    return {"in_channels": 3, "out_channels": 3, "n_feat": s.dim(f"{d}embedding.weight", 0), "stage": s.count("body."),
            "num_blocks": [s.count(f"{d}encoder_layers.{i}.0.blocks.") for i in range(LEVELS)]
            + [s.count(f"{d}bottleneck.blocks.")]}


register_recogniser("RetinexFormer", _recognise)

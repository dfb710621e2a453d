"""Restormer ("Restormer: Efficient Transformer for High-Resolution Image Restoration", Zamir et al., CVPR 2022)
and traiNNer-redux's DocRes, a Restormer-shaped document restorer.

``Restormer``: module names and constructor arguments follow the authors' code as spandrel-extra-arches carries it
(``patch_embed.proj``, ``encoder_level1.N.{norm1,attn,norm2,ffn}``, ``down1_2.body.0``, ...), so released
checkpoints (deraining, motion / defocus deblurring, denoising) load with ``strict=True``. Four levels of
transformer blocks (multi-dconv transposed attention: channel x channel attention per head over L2-normalised
q / k with a learned temperature, fused as ``scaled_dot_product_attention``; gated depth-wise feed-forward),
3x3 conv + pixel-unshuffle down, 3x3 conv + pixel-shuffle up, the finest decoder and refinement at twice the
width, a 3x3 output conv plus the input (``dual_pixel_task``: a 1x1 skip of the embedding instead, for 6-channel
dual-pixel input). The authors need sides that are multiples of 8; here any input is padded at the bottom / right
(reflection, then edge replication) and the output cropped.

``DocRes`` (traiNNer-redux's ``docres_base`` / ``docres_large``): the same blocks, but the finest decoder and
refinement at the base width (a 1x1 ``reduce_chan_level1`` after the skip), no global residual, and with 3 input
channels two coordinate planes (x then y, in [-1, 1] over the padded image) are appended before the embedding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, pad_to_multiple
from anysr.archs.ditn_arch import FeedForward
from anysr.archs.kbnet_arch import TransAttention, _Body
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

PAD_MULTIPLE = 8  # three x2 levels


class BiasFreeNorm(nn.Module):
    """Channel layer norm without centring or bias: ``x / sqrt(var + eps) * weight`` (Restormer's 'BiasFree')."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        var = xf.var(1, keepdim=True, unbiased=False)
        return (xf / torch.sqrt(var + self.eps) * self.weight.to(xf.dtype).view(-1, 1, 1)).to(x.dtype)


def channel_norm(dim: int, kind: str) -> _Body:
    """The authors' ``LayerNorm(dim, LayerNorm_type)``: the norm under ``body`` (eps 1e-5)."""
    if kind == "BiasFree":
        return _Body(BiasFreeNorm(dim))
    if kind == "WithBias":
        return _Body(LayerNorm2d(dim, eps=1e-5))
    raise ArchArgumentError("LayerNorm_type", f"must be 'WithBias' or 'BiasFree', got {kind!r}")


class TransformerBlock(nn.Module):
    """``x + attn(norm1(x))``, then ``x + ffn(norm2(x))``."""

    def __init__(self, dim: int, num_heads: int, ffn_expansion_factor: float, bias: bool, norm: str) -> None:
        super().__init__()
        self.norm1 = channel_norm(dim, norm)
        self.attn = TransAttention(dim, num_heads, bias)
        self.norm2 = channel_norm(dim, norm)
        self.ffn = FeedForward(dim, ffn_expansion_factor, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


class _RestormerBody(nn.Module):
    """The U-Net both networks share; ``fine_width``: the width of the finest decoder and refinement (Restormer:
    2 x dim without a channel reduction; DocRes: dim after ``reduce_chan_level1``)."""

    def __init__(self, name: str, embed_channels: int, out_channels: int, dim: int, num_blocks: Sequence[int],
                 num_refinement_blocks: int, heads: Sequence[int], ffn_expansion_factor: float, bias: bool,
                 norm: str, reduce_level1: bool) -> None:
        super().__init__()
        if len(num_blocks) != 4 or len(heads) != 4:
            raise ArchArgumentError("num_blocks", f"{name} needs 4 num_blocks and 4 heads, not {len(num_blocks)} "
                                    f"and {len(heads)}")
        dims = [dim, dim * 2, dim * 4, dim * 8]
        for d, h in zip(dims, heads, strict=True):
            if h < 1 or d % h:
                raise ArchArgumentError("heads", f"{name}'s level widths {dims} must each be a multiple of their "
                                        f"heads {list(heads)}")
        fine = dims[0] if reduce_level1 else dims[1]

        def level(width: int, n: int, h: int) -> nn.Sequential:
            return nn.Sequential(*[TransformerBlock(width, h, ffn_expansion_factor, bias, norm) for _ in range(n)])

        def down(width: int) -> _Body:
            return _Body(nn.Sequential(nn.Conv2d(width, width // 2, 3, 1, 1, bias=False), nn.PixelUnshuffle(2)))

        def up(width: int) -> _Body:
            return _Body(nn.Sequential(nn.Conv2d(width, width * 2, 3, 1, 1, bias=False), nn.PixelShuffle(2)))

        self.patch_embed = _Body(nn.Conv2d(embed_channels, dim, 3, 1, 1, bias=False), "proj")  # bias-free there
        self.encoder_level1 = level(dims[0], num_blocks[0], heads[0])
        self.down1_2 = down(dims[0])
        self.encoder_level2 = level(dims[1], num_blocks[1], heads[1])
        self.down2_3 = down(dims[1])
        self.encoder_level3 = level(dims[2], num_blocks[2], heads[2])
        self.down3_4 = down(dims[2])
        self.latent = level(dims[3], num_blocks[3], heads[3])
        self.up4_3 = up(dims[3])
        self.reduce_chan_level3 = nn.Conv2d(dims[3], dims[2], 1, bias=bias)
        self.decoder_level3 = level(dims[2], num_blocks[2], heads[2])
        self.up3_2 = up(dims[2])
        self.reduce_chan_level2 = nn.Conv2d(dims[2], dims[1], 1, bias=bias)
        self.decoder_level2 = level(dims[1], num_blocks[1], heads[1])
        self.up2_1 = up(dims[1])
        self.reduce_chan_level1: nn.Module | None = (
            nn.Conv2d(dims[1], dims[0], 1, bias=bias) if reduce_level1 else None)
        self.decoder_level1 = level(fine, num_blocks[0], heads[0])
        self.refinement = level(fine, num_refinement_blocks, heads[0])
        self.output = nn.Conv2d(fine, out_channels, 3, 1, 1, bias=bias)
        self.tile_multiple = PAD_MULTIPLE

    def features(self, embedded: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The refinement's input (finest decoder output) and the level-1 encoder input (the embedding)."""
        enc1 = self.encoder_level1(embedded)
        enc2 = self.encoder_level2(self.down1_2(enc1))
        enc3 = self.encoder_level3(self.down2_3(enc2))
        x = self.latent(self.down3_4(enc3))
        x = self.decoder_level3(self.reduce_chan_level3(torch.cat([self.up4_3(x), enc3], 1)))
        x = self.decoder_level2(self.reduce_chan_level2(torch.cat([self.up3_2(x), enc2], 1)))
        x = torch.cat([self.up2_1(x), enc1], 1)
        if self.reduce_chan_level1 is not None:
            x = self.reduce_chan_level1(x)
        return self.decoder_level1(x), embedded


@ARCH_REGISTRY.register()
class Restormer(_RestormerBody):
    """Restormer (the authors' arguments; ``dual_pixel_task``: 6-channel dual-pixel defocus deblurring, no
    global residual, a 1x1 skip of the embedding into the refinement's output)."""

    def __init__(self, *, inp_channels: int = 3, out_channels: int = 3, dim: int = 48,
                 num_blocks: Sequence[int] = (4, 6, 6, 8), num_refinement_blocks: int = 4,
                 heads: Sequence[int] = (1, 2, 4, 8), ffn_expansion_factor: float = 2.66, bias: bool = False,
                 LayerNorm_type: str = "WithBias", dual_pixel_task: bool = False) -> None:  # noqa: N803
        super().__init__("Restormer", inp_channels, out_channels, dim, num_blocks, num_refinement_blocks, heads,
                         ffn_expansion_factor, bias, LayerNorm_type, reduce_level1=False)
        if not dual_pixel_task and inp_channels != out_channels:
            raise ArchArgumentError("out_channels", f"Restormer adds the input to its output: out_channels must "
                                    f"equal inp_channels ({inp_channels}) unless dual_pixel_task")
        self.num_in_ch = inp_channels
        self.dual_pixel_task = dual_pixel_task
        self.skip_conv = nn.Conv2d(dim, dim * 2, 1, bias=bias) if dual_pixel_task else None

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        h, w = inp.shape[-2:]
        inp, _, _ = pad_to_multiple(inp, PAD_MULTIPLE)
        x, embedded = self.features(self.patch_embed(inp))
        x = self.refinement(x)
        if self.skip_conv is not None:
            out = self.output(x + self.skip_conv(embedded))
        else:
            out = self.output(x) + inp
        return out[:, :, :h, :w]


@ARCH_REGISTRY.register()
class DocRes(_RestormerBody):
    """traiNNer-redux's DocRes (its arguments; ``dual_pixel_task`` is accepted and changes nothing, as there)."""

    def __init__(self, *, inp_channels: int = 3, out_channels: int = 3, dim: int = 48,
                 num_blocks: Sequence[int] = (2, 3, 3, 4), num_refinement_blocks: int = 4,
                 heads: Sequence[int] = (1, 2, 4, 8), ffn_expansion_factor: float = 2.66, bias: bool = False,
                 LayerNorm_type: str = "WithBias", dual_pixel_task: bool = True) -> None:  # noqa: N803
        self.coords = inp_channels == 3  # RGB gets two coordinate planes (the embedding takes 5 channels)
        super().__init__("DocRes", inp_channels + 2 * self.coords, out_channels, dim, num_blocks,
                         num_refinement_blocks, heads, ffn_expansion_factor, bias, LayerNorm_type,
                         reduce_level1=True)
        self.num_in_ch = inp_channels
        self.dual_pixel_task = dual_pixel_task

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        h, w = inp.shape[-2:]
        x, _, _ = pad_to_multiple(inp, PAD_MULTIPLE)
        if self.coords:
            b, _, hh, ww = x.shape
            ys = torch.linspace(-1, 1, hh, device=x.device, dtype=x.dtype)
            xs = torch.linspace(-1, 1, ww, device=x.device, dtype=x.dtype)
            planes = torch.stack((xs.view(1, ww).expand(hh, ww), ys.view(hh, 1).expand(hh, ww)))
            x = torch.cat([x, planes.unsqueeze(0).expand(b, 2, hh, ww)], 1)
        feat, _ = self.features(self.patch_embed(x))
        return self.output(self.refinement(feat))[:, :, :h, :w]


# traiNNer-redux's names (its docres_base / docres_large functions)
register_presets("DocRes", scale_arg=None, presets={
    "docres_base": {},
    "docres_large": {"dim": 64, "num_blocks": [3, 4, 4, 6], "num_refinement_blocks": 6, "heads": [2, 4, 8, 16]},
})


@ARCH_REGISTRY.register()
class DocResDiscriminator(nn.Module):
    """The discriminator of traiNNer-redux's DocRes GAN template (``docres_discriminator``): ``num_blocks`` 3x3
    convs of ``dim`` channels with LeakyReLU(0.2), then a 3x3 conv to ``out_channels`` (a per-pixel map);
    ``norm_type: spectral`` puts spectral normalisation on every conv. traiNNer-redux's own function iterates over
    ``num_blocks`` (a list there: one conv per item) and takes no ``norm_type``, so its template (``num_blocks: 4``,
    ``norm_type: spectral``) fails there; here a count or a list (its length) both work."""

    def __init__(self, *, inp_channels: int = 3, out_channels: int = 1, dim: int = 64,
                 num_blocks: int | Sequence[int] = (1, 2, 2, 3), norm_type: str | None = None,
                 bias: bool = False, heads: Sequence[int] | None = None, ffn_expansion_factor: float | None = None,
                 LayerNorm_type: str | None = None) -> None:  # noqa: N803 - accepted as traiNNer-redux's, unused
        super().__init__()
        n = num_blocks if isinstance(num_blocks, int) else len(num_blocks)
        if n < 1:
            raise ArchArgumentError("num_blocks", f"DocResDiscriminator needs at least one conv block, got {n}")
        if norm_type not in (None, "none", "spectral"):
            raise ArchArgumentError("norm_type", f"must be 'spectral' or none, got {norm_type!r}")
        wrap = nn.utils.spectral_norm if norm_type == "spectral" else (lambda m: m)
        layers: list[nn.Module] = []
        for i in range(n):
            layers += [wrap(nn.Conv2d(inp_channels if i == 0 else dim, dim, 3, 1, 1, bias=bias)),
                       nn.LeakyReLU(0.2, inplace=True)]
        layers.append(wrap(nn.Conv2d(dim, out_channels, 3, 1, 1, bias=bias)))
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


# the name of traiNNer-redux's template (its builder is test-only there and fails on the template's arguments)
register_presets("DocResDiscriminator", scale_arg=None, presets={"docres_discriminator": {}},
                 source="traiNNer-redux's DocRes GAN template")


def _common(s: StateShapes) -> dict:
    """Width, depths, refinement blocks, bias and norm kind of either network."""
    dim = s.dim("patch_embed.proj.weight", 0)
    depths = [s.count(f"{n}.") for n in ("encoder_level1", "encoder_level2", "encoder_level3", "latent")]
    heads = [s.dim(f"{n}.0.attn.temperature", 0) for n in ("encoder_level1", "encoder_level2", "encoder_level3",
                                                              "latent")]
    hidden = s.dim("encoder_level1.0.ffn.project_out.weight", 1)
    norm = "WithBias" if "encoder_level1.0.norm1.body.bias" in s else "BiasFree"
    return {"dim": dim, "num_blocks": depths, "num_refinement_blocks": s.count("refinement."), "heads": heads,
            "ffn_expansion_factor": _expansion(hidden, dim), "bias": "output.bias" in s, "LayerNorm_type": norm}


def _expansion(hidden: int, dim: int) -> float:
    """The expansion factor whose ``int(dim * f)`` is ``hidden`` (2.66 as published when it fits)."""
    for f in (2.66, 2.0, 1.5, 3.0, 4.0, 1.0):
        if int(dim * f) == hidden:
            return f
    return round(hidden / dim, 4) if int(dim * round(hidden / dim, 4)) == hidden else hidden / dim


def _recognise_restormer(s: StateShapes) -> list[dict]:
    """Restormer: no reduce_chan_level1, the output conv at twice the width."""
    if "reduce_chan_level1.weight" in s:
        raise NotThisFamily("DocRes's layout")
    common = _common(s)
    dual = "skip_conv.weight" in s
    return [{"inp_channels": s.dim("patch_embed.proj.weight", 1), "out_channels": s.dim("output.weight", 0),
             "dual_pixel_task": dual, **common}]


def _recognise_docres(s: StateShapes) -> list[dict]:
    """DocRes: reduce_chan_level1; 5 embedded channels are RGB plus the two coordinate planes."""
    s.shape("reduce_chan_level1.weight")
    embed = s.dim("patch_embed.proj.weight", 1)
    if embed == 3:
        raise NotThisFamily("3 embedded channels: DocRes appends coordinates to RGB (5)")
    return [{"inp_channels": 3 if embed == 5 else embed, "out_channels": s.dim("output.weight", 0), **_common(s)}]


register_recogniser("Restormer", _recognise_restormer)
register_recogniser("DocRes", _recognise_docres)

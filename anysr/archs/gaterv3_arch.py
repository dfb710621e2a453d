"""GateRV3 (umzi2, 2025; traiNNer-redux's ``GateRV3``, no paper): a gated U-Net beside a SPAN branch.

Module names, buffers and constructor arguments follow traiNNer-redux's ``GateRV3``, so its checkpoints load with
``strict=True`` and give the same output. A 3x3 stem feeds two branches that meet before the head:

* a SPAN-like branch at full resolution (re-parameterisable ``Conv3XC`` blocks with parameter-free attention,
  their outputs fused by a 1x1 conv);
* a U-Net of ``MetaGated`` blocks (a gated local conv with channel attention, then a MambaOut-style gated CNN
  block with Inception depth-wise convs), ``len(enc_blocks)`` halvings by conv + PixelUnshuffle, ``num_latent``
  gated blocks at the bottom, and PixelShuffle ups with 1x1-fused skip connections.

Their sum goes through one of traiNNer-redux's ``UniUpsample`` heads (with its ``MetaUpsample`` record) and a
learned ``gamma`` times the nearest-upscaled input is added. ``attention=True`` mixes the latent blocks with
attention instead of Inception convs: with ``flash`` (the persistent ``flash`` buffer, which a loaded checkpoint
sets) spatial attention over all positions through ``scaled_dot_product_attention``, else the transposed
(channel) attention with a learned temperature, as the reference computes them (with flash the unused
temperature does not train). The ``gamma`` parameters get ten times their gradient (the reference's gradient
hooks, here written into the forward). The input is padded (bottom / right, reflect) to a multiple of
``2 ** len(enc_blocks)`` and the output cropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, NearestUpsample, pad_to_multiple
from anysr.archs.moesr_arch import SAMPLE_MODS, InceptionDWConv2d, UniUpsample, uniupsample_heads
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.archs.rtmosr_arch import RMSNorm
from anysr.archs.span_arch import Conv3XC, fold_conv3xc
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


def grad_times_10(p: Tensor) -> Tensor:
    """``p`` in value, ten times its gradient (the reference's ``register_hook(lambda g: g * 10)``)."""
    boost = p * 9
    return p + (boost - boost.detach())


class SPAB(nn.Module):
    """SPAN's block without biases: three Conv3XC (SiLU between), ``(y + x) * (sigmoid(y) - 0.5)``; ``end``
    also returns the first conv's activated output."""

    def __init__(self, dim: int, end: bool = False) -> None:
        super().__init__()
        self.c1_r = Conv3XC(dim, dim, gain1=2, bias=False)
        self.c2_r = Conv3XC(dim, dim, gain1=2, bias=False)
        self.c3_r = Conv3XC(dim, dim, gain1=2, bias=False)
        self.act1 = nn.SiLU()
        self.end = end

    def forward(self, x: Tensor) -> Any:
        out1 = self.act1(self.c1_r(x))
        out3 = self.c3_r(self.act1(self.c2_r(out1)))
        out = (out3 + x) * (torch.sigmoid(out3) - 0.5)
        return (out, out1) if self.end else out


class Attention(nn.Module):
    """1x1 + depth-wise 3x3 qkv, ``num_heads`` heads, 1x1 out: spatial SDPA (``flash``) or channel attention."""

    def __init__(self, dim: int, num_heads: int, flash: bool = True) -> None:
        super().__init__()
        if dim % num_heads:
            raise ArchArgumentError("dim", f"GateRV3's attention needs a latent width divisible by {num_heads} "
                                    f"heads, got {dim}")
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.set_flash(flash)
        self.register_buffer("flash", torch.tensor([bool(flash)]))
        self.qkv = nn.Conv2d(dim, dim * 3, 1, bias=False)
        self.qkv_dwconv = nn.Conv2d(dim * 3, dim * 3, 3, 1, 1, groups=dim * 3)
        self.project_out = nn.Conv2d(dim, dim, 1, bias=False)

    def set_flash(self, flash: bool) -> None:
        """Pick the attention; the temperature only scales the channel form (with flash it does not train, so no
        parameter goes without a gradient under DDP)."""
        self.use_flash = bool(flash)
        self.temperature.requires_grad_(not self.use_flash)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        value = state_dict.get(prefix + "flash")
        if isinstance(value, Tensor) and value.device.type != "meta" and value.numel() == 1:
            self.set_flash(bool(value.item()))  # the checkpoint says which attention it was trained with
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, x: Tensor) -> Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv_dwconv(self.qkv(x)).reshape(b, 3, self.num_heads, c // self.num_heads, h * w).unbind(1)
        if self.use_flash:
            out = F.scaled_dot_product_attention(q.transpose(2, 3), k.transpose(2, 3), v.transpose(2, 3))
            out = out.transpose(2, 3)
        else:
            attn = F.normalize(q, dim=3) @ F.normalize(k, dim=3).transpose(2, 3) * self.temperature
            out = attn.softmax(dim=3) @ v
        return self.project_out(out.reshape(b, c, h, w))


class GatedCNNBlock(nn.Module):
    """``mish(fc2(mish(g) * cat(i, mix(c))))`` with ``g, i, c`` split from ``fc1(rmsnorm(x))`` (no shortcut);
    ``mix``: Inception depth-wise convs, or attention."""

    def __init__(self, dim: int = 64, expansion_ratio: float = 1.5, conv_ratio: float = 1.0, att: bool = False,
                 flash: bool = True) -> None:
        super().__init__()
        self.norm = RMSNorm(dim)
        hidden = int(expansion_ratio * dim)
        conv_channels = int(conv_ratio * dim)
        self.fc1 = nn.Conv2d(dim, hidden * 2, 1)
        self.act = nn.Mish()
        self.split_indices = [hidden, hidden - conv_channels, conv_channels]
        self.token_mix = Attention(conv_channels, 16, flash) if att else InceptionDWConv2d(dim)
        self.fc2 = nn.Conv2d(hidden, dim, 1)
        for m in (self.fc1, self.fc2):
            nn.init.trunc_normal_(m.weight, std=0.02)
            nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        g, i, c = torch.split(self.fc1(self.norm(x)), self.split_indices, dim=1)
        return self.act(self.fc2(self.act(g) * torch.cat((i, self.token_mix(c)), dim=1)))


class SimpleGate(nn.Module):
    """The product of the two channel halves."""

    def forward(self, x: Tensor) -> Tensor:
        a, b = x.chunk(2, dim=1)
        return a * b


class MetaGated(nn.Module):
    """``y = x + gamma0 * sca(local(x))``; ``y + gamma1 * glob(y)`` (local: RMS norm, 1x1, grouped 3x3, gate)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.local = nn.Sequential(RMSNorm(dim), nn.Conv2d(dim, dim * 2, 1),
                                   nn.Conv2d(dim * 2, dim * 2, 3, 1, 1, groups=dim), SimpleGate())
        self.sca = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(dim, dim, 1))
        self.glob = GatedCNNBlock(dim)
        self.gamma0 = nn.Parameter(torch.ones(1, dim, 1, 1))
        self.gamma1 = nn.Parameter(torch.ones(1, dim, 1, 1))
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        y = self.local(x)
        x = (y * self.sca(y)) * grad_times_10(self.gamma0) + x
        return self.glob(x) * grad_times_10(self.gamma1) + x


class Block(nn.Module):
    """Encoder stage (``down``: gated blocks, then conv to dim/2 + PixelUnshuffle(2); returns both) or decoder
    stage (conv to 2 dim + PixelShuffle(2), concatenated with the skip, 1x1 to dim/2, gated blocks)."""

    def __init__(self, dim: int, num_gated: int, down: bool = True) -> None:
        super().__init__()
        self.down = down
        if down:
            self.gated = nn.Sequential(*[MetaGated(dim) for _ in range(num_gated)])
            self.scale = nn.Sequential(nn.Conv2d(dim, dim // 2, 3, 1, 1, bias=False), nn.PixelUnshuffle(2))
        else:
            self.scale = nn.Sequential(nn.Conv2d(dim, dim * 2, 3, 1, 1, bias=False), nn.PixelShuffle(2))
            self.gated = nn.Sequential(*[MetaGated(dim // 2) for _ in range(num_gated)])
            self.shor = nn.Conv2d(dim, dim // 2, 1)

    def forward(self, x: Tensor, short: Tensor | None = None) -> Any:
        if self.down:
            x = self.gated(x)
            return self.scale(x), x
        return self.gated(self.shor(torch.cat([self.scale(x), short], dim=1)))


@ARCH_REGISTRY.register()
class GateRV3(nn.Module):
    """GateRV3.

    Args: in_ch: image channels. dim: width at full resolution (doubles per stage; a multiple of 8).
    enc_blocks / dec_blocks: MetaGated blocks per encoder / decoder stage (as many of each). num_latent: gated
    blocks at the bottom. scale: integer >= 1 (2**n or 3 for the "pixelshuffle" and "nearest+conv" heads).
    upsample: conv (scale 1), pixelshuffledirect, pixelshuffle, nearest+conv or dysample. upsample_mid_dim: the
    "pixelshuffle" head's width. end_gamma_init: initial weight of the upscaled input. attention: attention in
    the latent blocks. sisr_blocks: SPAN blocks between the first and the last. flash: which attention.
    """

    def __init__(self, in_ch: int = 3, dim: int = 32, enc_blocks: Sequence[int] = (2, 2, 4, 6),
                 dec_blocks: Sequence[int] = (2, 2, 2, 2), num_latent: int = 8, scale: int = 2,
                 upsample: str = "pixelshuffle", upsample_mid_dim: int = 48, end_gamma_init: float = 1,
                 attention: bool = False, sisr_blocks: int = 4, flash: bool = True) -> None:
        super().__init__()
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ArchArgumentError("scale", f"GateRV3 needs an integer scale >= 1, got {scale!r}")
        if upsample not in SAMPLE_MODS:
            raise ArchArgumentError("upsample", f"GateRV3 knows the upsamplers {list(SAMPLE_MODS)}, got {upsample!r}")
        if upsample == "conv" and scale != 1:
            raise ArchArgumentError("upsample", f"GateRV3's conv head is for scale 1, got scale {scale}")
        if upsample in ("pixelshuffle", "nearest+conv") and scale != 3 and scale & (scale - 1):
            raise ArchArgumentError("scale", f"GateRV3's {upsample} head supports scales 2**n and 3, got {scale}")
        if len(enc_blocks) != len(dec_blocks) or not enc_blocks:
            raise ArchArgumentError("dec_blocks", f"GateRV3 needs as many decoder as encoder stages (at least one), "
                                    f"got {list(enc_blocks)} and {list(dec_blocks)}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 8 or dim % 8:
            raise ArchArgumentError("dim", f"GateRV3 needs dim to be a multiple of 8 (the Inception convs take "
                                    f"dim / 8 channels each), got {dim!r}")
        n = len(enc_blocks)
        self.scale = scale
        self.tile_multiple: int = 2**n
        self.in_to_dim = nn.Conv2d(in_ch, dim, 3, 1, 1)
        self.gater_encode = nn.ModuleList([Block(dim * 2**i, enc_blocks[i]) for i in range(n)])
        self.span_block0 = SPAB(dim)
        self.span_n_b = nn.Sequential(*[SPAB(dim) for _ in range(sisr_blocks)])
        self.span_end = SPAB(dim, end=True)
        self.sisr_end_conv = Conv3XC(dim, dim, bias=True)
        self.sisr_cat_conv = nn.Conv2d(dim * 4, dim, 1)
        nn.init.trunc_normal_(self.sisr_cat_conv.weight, std=0.02)
        self.latent = nn.Sequential(*[GatedCNNBlock(dim * 2**n, 1.5, 1.0, att=attention, flash=flash)
                                      for _ in range(num_latent)])
        self.decode = nn.ModuleList([Block(dim * 2 ** (n - i), dec_blocks[i], False) for i in range(n)])
        self.gamma = nn.Parameter(torch.ones(1, in_ch, 1, 1) * end_gamma_init)
        self.short_to_dim: nn.Module
        self.dim_to_in: nn.Module
        if scale != 1:
            self.short_to_dim = NearestUpsample(scale)
            self.dim_to_in = UniUpsample(upsample, scale, dim, in_ch, upsample_mid_dim)
        else:
            self.short_to_dim = nn.Identity()
            self.dim_to_in = nn.Conv2d(dim, in_ch, 3, 1, 1)

    def reparameterize(self) -> GateRV3:
        """The deployment form: every Conv3XC folded into its ``eval_conv`` once (what ONNX export traces; see
        SPAN.reparameterize). The state dict is unchanged; do not train it further."""
        fold_conv3xc(self)
        return self

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        # As the reference: the head's MetaUpsample record is the network's own, and a file without ``gamma``
        # (earlier versions) keeps the initial one.
        meta = prefix + "dim_to_in.MetaUpsample"
        if meta in state_dict and hasattr(self.dim_to_in, "MetaUpsample"):
            state_dict[meta] = self.dim_to_in.MetaUpsample
        state_dict.setdefault(prefix + "gamma", self.gamma.detach())
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, inp: Tensor) -> Tensor:
        h, w = inp.shape[-2:]
        inp, pad_h, pad_w = pad_to_multiple(inp, self.tile_multiple)
        x = self.in_to_dim(inp)
        sisr_short = self.span_block0(x)
        sisr, sisr_out = self.span_end(self.span_n_b(sisr_short))
        sisr = self.sisr_cat_conv(torch.cat([x, self.sisr_end_conv(sisr), sisr_short, sisr_out], dim=1))
        shorts = []
        for block in self.gater_encode:
            x, short = block(x)
            shorts.append(short)
        x = self.latent(x)
        for block, short in zip(self.decode, reversed(shorts), strict=True):
            x = block(x, short)
        out = self.dim_to_in(x + sisr) + grad_times_10(self.gamma) * self.short_to_dim(inp)
        return out[..., : h * self.scale, : w * self.scale] if pad_h or pad_w else out


__all__ = ["GateRV3"]


# traiNNer-redux's builders (its GateRV3 class default is "gaterv3", the class itself).
register_presets("GateRV3", scale_arg="scale", presets={
    "gaterv3_s": {"enc_blocks": (2, 2, 4), "dec_blocks": (2, 2, 2)},
    "gaterv3_r": {},
})


def _recognise(s: StateShapes) -> list[dict]:
    """GateRV3 from its tensors: width and image channels from the stem, the stages and their blocks from the
    encoder / decoder lists, the latent and SPAN blocks by count, attention from the latent mixer, and the head
    (the UniUpsample kinds that fit its tensors; a lone 3x3 conv to the image channels is scale 1)."""
    dim, in_ch = s.shape("in_to_dim.weight")[:2]
    enc = [s.count(f"gater_encode.{i}.gated.") for i in s.indices("gater_encode.")]
    dec = [s.count(f"decode.{i}.gated.") for i in s.indices("decode.")]
    common = {"in_ch": in_ch, "dim": dim, "enc_blocks": enc, "dec_blocks": dec,
              "num_latent": s.count("latent."), "sisr_blocks": s.count("span_n_b."),
              "attention": "latent.0.token_mix.qkv.weight" in s}
    flash = s.integers("latent.0.token_mix.flash")
    if flash is not None:
        common["flash"] = bool(flash[0])
    if "dim_to_in.weight" in s:
        return [{**common, "scale": 1, "upsample": "conv"}]
    heads = [h for h in uniupsample_heads(s, "dim_to_in.", (in_ch,))
             if h["scale"] not in (None, 1) and h["upsampler"] in SAMPLE_MODS]
    if not heads:
        raise NotThisFamily("dim_to_in: no head")
    return [{**common, "scale": h["scale"], "upsample": h["upsampler"],
             **({"upsample_mid_dim": h["mid_dim"]} if "mid_dim" in h else {})} for h in heads]


register_recogniser("GateRV3", _recognise)

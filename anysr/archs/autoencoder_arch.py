"""AutoEncoder: traiNNer-redux's image autoencoder (the network of its AE model and of the AESOP loss; the-database,
traiNNer-redux, after AESOP, "Auto-Encoded Supervision for Perceptual Image Super-Resolution", Lee et al. 2024).

Encoder: two 3x3 convs to ``nf / scale**2`` channels, a PixelUnshuffle by ``scale`` (``nf`` channels at
1/``scale`` size), two ESRGAN RRDBs (spandrel's old-ESRGAN layout: ``RDBk.convj.0``), two 3x3 convs to an RGB
latent. Decoder: any anysr network named by ``decoder_opt`` (``{type: ..., ...}``) built at ``scale`` (its scale
argument is set to ``scale``, as traiNNer-redux passes ``scale`` to every network), upscaling the latent back.

Module names are traiNNer-redux's, including the ``encoder`` Sequential that holds the same convs and blocks a
second time (``conv_first.*`` and ``encoder.0.*`` are the same tensors, both saved), so its files load strictly.
Sides must be multiples of ``scale`` (the PixelUnshuffle).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, default_init_weights
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, recognise_all, register_recogniser
from anysr.registry import ARCH_REGISTRY, constructor_args

# the names networks take their scale under (as anysr.options.trainner maps traiNNer-redux's ``scale``)
_SCALE_ARGUMENTS = ("scale", "upscale", "upscaling_factor", "up_scale", "upscale_factor")


class _DenseBlock(nn.Module):
    """ESRGAN's five-conv residual dense block with spandrel's names (``convj.0``: a conv in a Sequential)."""

    def __init__(self, nf: int, gc: int = 32) -> None:
        super().__init__()
        for i in range(1, 5):
            setattr(self, f"conv{i}", nn.Sequential(nn.Conv2d(nf + (i - 1) * gc, gc, 3, 1, 1)))
        self.conv5 = nn.Sequential(nn.Conv2d(nf + 4 * gc, nf, 3, 1, 1))
        self.act = nn.LeakyReLU(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feats = [x]
        for conv in (self.conv1, self.conv2, self.conv3, self.conv4):
            feats.append(self.act(conv(torch.cat(feats, 1))))
        return self.conv5(torch.cat(feats, 1)) * 0.2 + x


class _RRDB(nn.Module):
    """Three dense blocks (``RDB1``..``RDB3``), scaled by 0.2, plus identity."""

    def __init__(self, nf: int) -> None:
        super().__init__()
        self.RDB1, self.RDB2, self.RDB3 = _DenseBlock(nf), _DenseBlock(nf), _DenseBlock(nf)  # noqa: N815

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.RDB3(self.RDB2(self.RDB1(x))) * 0.2 + x


def decoder_options(decoder_opt: Mapping[str, Any], scale: int) -> dict[str, Any]:
    """``decoder_opt`` with ``scale`` set on its scale argument (a preset's ``scale``, a class's own name)."""
    from anysr.presets import find_preset  # noqa: PLC0415 - presets register with the arch modules

    if not isinstance(decoder_opt, Mapping) or not isinstance(decoder_opt.get("type"), str):
        raise ArchArgumentError("decoder_opt", "expected a mapping with a 'type' naming the decoder network")
    opt = dict(decoder_opt)
    preset = find_preset(opt["type"], ARCH_REGISTRY.keys())
    if preset is not None:
        if preset.scale_arg:
            opt["scale"] = scale
        return opt
    try:
        cls = ARCH_REGISTRY.get(opt["type"], "decoder_opt.type")
    except KeyError as exc:
        raise ArchArgumentError("decoder_opt", str(exc)) from None
    params = constructor_args(cls)[0]
    name = next((a for a in _SCALE_ARGUMENTS if a in params), None)
    if name is not None:
        opt[name] = scale
    return opt


@ARCH_REGISTRY.register()
class AutoEncoder(nn.Module):
    """traiNNer-redux's AutoEncoder (see the module docstring); ``freeze_*``: no gradients (and eval mode) for
    that half."""

    def __init__(self, decoder_opt: Mapping[str, Any], freeze_decoder: bool = False, freeze_encoder: bool = False,
                 scale: int = 4, nf: int = 64) -> None:
        super().__init__()
        from anysr.archs import build_network  # noqa: PLC0415 - the registry's builder (this module is an arch)

        if not isinstance(scale, int) or scale < 1:
            raise ArchArgumentError("scale", f"must be a positive integer, got {scale!r}")
        if not isinstance(nf, int) or nf < scale * scale or nf % (scale * scale):
            raise ArchArgumentError("nf", f"must be a positive multiple of scale**2 = {scale * scale}, got {nf!r}")
        self.scale = scale
        mid = nf // scale**2
        self.conv_first = nn.Sequential(nn.Conv2d(3, mid, 3, 1, 1), nn.Conv2d(mid, mid, 3, 1, 1))
        self.down = nn.PixelUnshuffle(scale)
        self.body = nn.Sequential(_RRDB(nf), _RRDB(nf))
        self.conv_last = nn.Sequential(nn.Conv2d(nf, nf, 3, 1, 1), nn.Conv2d(nf, 3, 3, 1, 1))
        self.encoder = nn.Sequential(self.conv_first, self.down, self.body, self.conv_last)
        self.decoder = build_network(decoder_options(decoder_opt, scale), "decoder_opt")
        default_init_weights([self.conv_first, self.conv_last], 0.1)
        self.encoder_is_frozen = bool(freeze_encoder)
        self.decoder_is_frozen = bool(freeze_decoder)
        if freeze_encoder:
            self.encoder.requires_grad_(False)
        if freeze_decoder:
            self.decoder.requires_grad_(False)
        self.train(True)

    def train(self, mode: bool = True) -> AutoEncoder:
        """A frozen half stays in eval mode."""
        super().train(mode)
        if self.encoder_is_frozen:
            self.encoder.eval()
        if self.decoder_is_frozen:
            self.decoder.eval()
        return self

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The RGB latent at 1/``scale`` size."""
        if x.shape[-2] % self.scale or x.shape[-1] % self.scale:
            raise ValueError(f"AutoEncoder: image sides must be multiples of scale {self.scale}, "
                             f"got {tuple(x.shape[-2:])}")
        return self.encoder(x)

    def decode(self, latent: torch.Tensor) -> torch.Tensor:
        """The decoder network's image from a latent."""
        return self.decoder(latent)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.encode(x))


def _recognise(s: StateShapes) -> list[dict]:
    """``nf`` from the last encoder conv, ``scale`` from the first conv's width (nf / scale**2); the decoder from
    the ``decoder.*`` tensors by the other families' recognisers."""
    s.shape("encoder.0.0.weight")
    nf, mid = s.dim("conv_last.0.weight", 0), s.dim("conv_first.0.weight", 0)
    scale = round((nf // mid) ** 0.5)
    if scale * scale * mid != nf:
        raise NotThisFamily("conv_first width is not nf / scale**2")
    sub = {k[len("decoder."):]: s.shape(k) for k in s.keys() if k.startswith("decoder.")}
    if not sub:
        raise NotThisFamily("no decoder")
    out = []
    for found in recognise_all(sub):
        dec = dict(found.opt)
        for a in _SCALE_ARGUMENTS:  # AutoEncoder passes its own scale
            dec.pop(a, None)
        out.append({"decoder_opt": dec, "scale": scale, "nf": nf})
    return out


register_recogniser("AutoEncoder", _recognise)

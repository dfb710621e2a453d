"""TSCUNet: temporal Swin-Conv-UNet (aaf6aa/SCUNet's network_tscunet, as traiNNer-redux's ``tscunet``): clip in,
centre frame out (input (b, t, c, h, w), output (b, c, h * scale, w * scale)).

Every frame is embedded by a 3x3 conv; each of the ``(clip_size - 1) / 2`` temporal layers maps every 3 consecutive
frames' features to one with a whole SCUNet U-Net (``nb`` swin-conv blocks per stage, blocks from
``anysr.archs.scunet_arch``; the windows run as one batch here), until one map is left; plus a conv of the centre
frame's features (``residual``), two RRDBs and nearest x2 steps (``scale`` 1, 2, 4 or 8), and a 3x3 conv. Frames are
reflect-padded, centred, to a multiple of 64 (in eval mode 64 more, as the original). In training every swin-conv
block adds Gaussian noise (sigma 0.05) to its output, kept out of the gradient (the original's regulariser);
``sigma: true`` adds the original's uncertainty head, whose training output is ``(image, sigma)``.

Module names and constructor arguments are the original's, so its checkpoints load with ``strict=True`` and give
its outputs.
"""

from __future__ import annotations

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError, NearestUpsample, drop_path_rates
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.rrdbnet_arch import RRDB
from anysr.archs.scunet_arch import HEAD_DIM, WINDOW_SIZE, ConvTransBlock
from anysr.archs.temporal_span_arch import PAD_MULTIPLE, check_clip, pad_centred, windows_of_three
from anysr.registry import ARCH_REGISTRY

NOISE_SIGMA = 0.05


class NoisyConvTransBlock(ConvTransBlock):
    """SCUNet's swin-conv block plus, in training, Gaussian noise (``NOISE_SIGMA``) added outside the gradient."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        if self.training:
            out = out + (torch.randn_like(out) * NOISE_SIGMA).detach()
        return out


def _stage(dim: int, n: int, dpr: list[float], resolution: int) -> list[nn.Module]:
    return [NoisyConvTransBlock(dim, dim, HEAD_DIM, WINDOW_SIZE, dpr[i], "W" if i % 2 == 0 else "SW", resolution)
            for i in range(n)]


class _Up(nn.Module):
    """A module whose ``up`` sequence is the whole forward (the original's Upconv / RRDBUpsample names)."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.up = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)


def upconv(dim: int, out_dim: int) -> _Up:
    """The original's ``Upconv`` at x2: nearest x2, 3x3 conv, LeakyReLU, 3x3 conv to ``out_dim``, LeakyReLU."""
    return _Up([NearestUpsample(2), nn.Conv2d(dim, dim, 3, 1, 1), nn.LeakyReLU(0.2),
                nn.Conv2d(dim, out_dim, 3, 1, 1), nn.LeakyReLU(0.2)])


def rrdb_upsample(dim: int, nb: int, scale: int) -> _Up:
    """The original's ``RRDBUpsample``: ``nb`` RRDBs (growth 32), per x2 a nearest x2, conv and LeakyReLU, then a
    conv and LeakyReLU."""
    layers: list[nn.Module] = [RRDB(dim, 32) for _ in range(nb)]
    for _ in range(scale.bit_length() - 1):
        layers += [NearestUpsample(2), nn.Conv2d(dim, dim, 3, 1, 1), nn.LeakyReLU(0.2)]
    return _Up([*layers, nn.Conv2d(dim, dim, 3, 1, 1), nn.LeakyReLU(0.2)])


class TSCUNetBlock(nn.Module):
    """One temporal layer: SCUNet's U-Net on ``in_nc`` channels (3 frames' features) to ``out_nc``, with the
    original's residual conv around the U-Net and a LeakyReLU(0.2) tail."""

    def __init__(self, in_nc: int, out_nc: int, config: list[int], dim: int, drop_path_rate: float,
                 input_resolution: int) -> None:
        super().__init__()
        dpr = drop_path_rates(drop_path_rate, sum(config))
        starts = [sum(config[:i]) for i in range(7)]
        r = input_resolution

        def stage(i: int, width: int, res: int) -> list[nn.Module]:
            return _stage(width, config[i], dpr[starts[i]:starts[i] + config[i]], res)

        self.m_head = nn.Sequential(nn.Conv2d(in_nc, dim, 3, 1, 1, bias=False))
        self.m_down1 = nn.Sequential(*stage(0, dim // 2, r), nn.Conv2d(dim, 2 * dim, 2, 2, 0, bias=False))
        self.m_down2 = nn.Sequential(*stage(1, dim, r // 2), nn.Conv2d(2 * dim, 4 * dim, 2, 2, 0, bias=False))
        self.m_down3 = nn.Sequential(*stage(2, 2 * dim, r // 4), nn.Conv2d(4 * dim, 8 * dim, 2, 2, 0, bias=False))
        self.m_body = nn.Sequential(*stage(3, 4 * dim, r // 8))
        self.m_up3 = nn.Sequential(upconv(8 * dim, 4 * dim), *stage(4, 2 * dim, r // 4))
        self.m_up2 = nn.Sequential(upconv(4 * dim, 2 * dim), *stage(5, dim, r // 2))
        self.m_up1 = nn.Sequential(upconv(2 * dim, dim), *stage(6, dim // 2, r))
        self.m_res = nn.Sequential(nn.Conv2d(dim, dim, 3, 1, 1, bias=False))
        self.m_tail = nn.Sequential(nn.Conv2d(dim, out_nc, 3, 1, 1, bias=False), nn.LeakyReLU(0.2))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x1 = self.m_head(x0)
        x2 = self.m_down1(x1)
        x3 = self.m_down2(x2)
        x4 = self.m_down3(x3)
        x = self.m_body(x4)
        x = self.m_up3(x + x4)
        x = self.m_up2(x + x3)
        x = self.m_up1(x + x2)
        return self.m_tail(x + self.m_res(x1))


@ARCH_REGISTRY.register()
class TSCUNet(nn.Module):
    """TSCUNet (see the module docstring). ``dim`` must be a multiple of 64 (the first stage's attention half has
    32-channel heads); ``state`` (the original's build-from-weights argument) must be null: weights load after
    construction (``anysr`` recognises the arguments from a file)."""

    tile_multiple: int = PAD_MULTIPLE  # frames are padded to it
    video_window = True  # clip in, centre frame out (num_frame frames): a window network

    def __init__(self, in_nc: int = 3, out_nc: int = 3, clip_size: int = 5, nb: int = 2, dim: int = 64,
                 drop_path_rate: float = 0.0, input_resolution: int = 256, scale: int = 2, residual: bool = True,
                 sigma: bool = False, state: object = None) -> None:
        super().__init__()
        if state is not None:
            raise ArchArgumentError("state", "TSCUNet builds from its arguments; load weights afterwards (anysr "
                                   "recognises the arguments from a weights file)")
        if isinstance(clip_size, bool) or not isinstance(clip_size, int) or clip_size < 3 or clip_size % 2 == 0:
            raise ArchArgumentError("clip_size", f"TSCUNet needs an odd clip_size >= 3, got {clip_size!r}")
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1 or scale & (scale - 1):
            raise ArchArgumentError("scale", f"TSCUNet upsamples by nearest x2 steps: scale must be 1, 2, 4 or 8, "
                                    f"got {scale!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 2 * HEAD_DIM or dim % (2 * HEAD_DIM):
            raise ArchArgumentError("dim", f"TSCUNet needs dim to be a positive multiple of {2 * HEAD_DIM} (its "
                                    f"first stage has {HEAD_DIM}-channel attention heads on dim / 2), got {dim!r}")
        if isinstance(nb, bool) or not isinstance(nb, int) or nb < 1:
            raise ArchArgumentError("nb", f"TSCUNet needs an integer nb >= 1, got {nb!r}")
        self.num_frame = self.clip_size = clip_size
        self.dim, self.scale, self.residual, self.sigma = dim, scale, residual, sigma
        self.m_head = nn.Sequential(nn.Conv2d(in_nc, dim, 3, 1, 1, bias=False))
        self.m_tail = nn.Sequential(nn.Conv2d(dim, out_nc, 3, 1, 1, bias=False))
        self.m_layers = nn.ModuleList([TSCUNetBlock(dim * 3, dim, [nb] * 7, dim, drop_path_rate, input_resolution)
                                       for _ in range((clip_size - 1) // 2)])
        if residual:
            self.m_res = nn.Sequential(nn.Conv2d(dim, dim, 3, 1, 1, bias=False))
        self.m_upsample = nn.Sequential(rrdb_upsample(dim, 2, scale))
        if sigma:
            layers: list[nn.Module] = []
            for _ in range(4):
                layers += [nn.Conv2d(dim, dim, 3, 1, 1, bias=True), nn.PReLU()]
            self.m_sigma = nn.Sequential(*layers)
            self.m_sigma_tail = nn.Sequential(nn.Conv2d(dim, out_nc, 3, 1, 1, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        check_clip("TSCUNet", x, self.clip_size)
        b, t, c, h, w = x.shape
        extra = 0 if self.training else PAD_MULTIPLE
        x, top, left = pad_centred(x.reshape(b * t, c, h, w), (-h) % PAD_MULTIPLE + extra,
                                   (-w) % PAD_MULTIPLE + extra)
        hp, wp = x.shape[-2:]
        feats = self.m_head(x).view(b, t, self.dim, hp, wp)
        center = feats[:, t // 2]
        for layer in self.m_layers:
            n = feats.shape[1] - 2
            feats = layer(windows_of_three(feats)).view(b, n, self.dim, hp, wp)
        out = feats[:, 0]
        if self.residual:
            out = out + self.m_res(center)
        out = self.m_upsample(out)
        s = self.scale
        rows, cols = slice(top * s, (top + h) * s), slice(left * s, (left + w) * s)
        image = self.m_tail(out)[..., rows, cols]
        if self.sigma and self.training:
            return image, self.m_sigma_tail(self.m_sigma(out) + out)[..., rows, cols]
        return image


__all__ = ["TSCUNet", "TSCUNetBlock"]


def _recognise(s: StateShapes) -> dict:
    """TSCUNet from its tensors: channels and width from the head and tail, frames from the temporal layers,
    blocks per stage from the body, the scale from the nearest x2 steps of the upsampler (after its two RRDBs)."""
    dim, cin = s.dim("m_head.0.weight", 0), s.dim("m_head.0.weight", 1)
    convs = [i for i in s.indices("m_upsample.0.up.") if f"m_upsample.0.up.{i}.weight" in s]
    return {"in_nc": cin, "out_nc": s.dim("m_tail.0.weight", 0), "clip_size": 2 * s.count("m_layers.") + 1,
            "nb": s.count("m_layers.0.m_body."), "dim": dim, "scale": 2 ** (len(convs) - 1),
            "residual": "m_res.0.weight" in s, "sigma": "m_sigma.0.weight" in s}


register_recogniser("TSCUNet", _recognise)

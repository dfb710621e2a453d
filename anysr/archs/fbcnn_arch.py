"""FBCNN: Flexible Blind CNN for JPEG artifact removal (Jiang, Zhang and Timofte, "Towards Flexible Blind JPEG
Artifacts Removal", ICCV 2021).

A four-level residual U-Net (DRUNet's layout, with biases) whose bottleneck also feeds a small quality-factor
predictor (residual blocks, global average pooling, three linear layers, sigmoid). The predicted (or a given)
quality factor is embedded by three linear layers and modulates every decoder block (``x + gamma * res(x) + beta``,
per-level ``gamma`` / ``beta`` from the embedding).

Quality factor: the network's unit is ``qf = 1 - JPEG quality / 100`` (the authors' scripts pass
``1 - quality / 100``; the predicted quality is ``100 * (1 - qf)``). ``forward(x)`` returns the restored image
only, with the predicted ``qf`` (what spandrel's call returns); ``forward(x, qf_input)`` uses the given one
instead (the authors' "flexible control"); ``forward_with_qf`` also returns the predicted ``qf``, (b, 1).

Layer names follow the authors' code (as in spandrel 0.4.2), so released checkpoints load with ``strict=True``.
The predictor's first linear layer reads ``nc[3]`` features (the authors fix 512, which every released model
uses: the same layer there). Size: sides are padded at the bottom / right to a multiple of 8 by edge replication
inside ``forward`` (the authors' padding) and the output cropped (``tile_multiple`` = 8). Scale 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.dpir_util import ResBlock, chain, check_act_mode, downsample, layers, upsample
from anysr.archs.drunet_arch import check_widths, unet_modes
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY

EMBED = 512  # width of the quality-factor predictor's hidden layers and of the embedding (fixed by the authors)


class QFAttention(nn.Module):
    """A residual block modulated by the quality-factor embedding: ``x + gamma * res(x) + beta``."""

    def __init__(self, channels: int, mode: str = "CRC") -> None:
        super().__init__()
        if mode[0] in "RL":
            mode = mode[0].lower() + mode[1:]
        self.res = chain(layers(mode, channels, channels, bias=True))

    def forward(self, x: torch.Tensor, gamma: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
        return x + gamma[:, :, None, None] * self.res(x) + beta[:, :, None, None]


@ARCH_REGISTRY.register()
class FBCNN(nn.Module):
    """FBCNN (see the module docstring for the quality-factor input and output).

    Args:
        in_nc / out_nc: channels in and out (3; 1 for the grayscale models).
        nc: widths of the four U-Net levels. nb: residual blocks per level (and in the predictor).
        act_mode: activation letters inside the blocks ('R': ReLU).
        downsample_mode: 'strideconv' or 'avgpool'. upsample_mode: 'convtranspose', 'pixelshuffle' or 'upconv'.
    """

    tile_multiple: int = 8

    def __init__(self, *, in_nc: int = 3, out_nc: int = 3, nc: Sequence[int] = (64, 128, 256, 512), nb: int = 4,
                 act_mode: str = "R", downsample_mode: str = "strideconv",
                 upsample_mode: str = "convtranspose") -> None:
        super().__init__()
        check_act_mode(act_mode)
        c = check_widths(nc)
        self.nb = nb
        self.nc = c
        self.in_channels = in_nc
        block = "C" + act_mode + "C"

        def blocks(width: int) -> list[nn.Module]:
            return [ResBlock(width, block, bias=True) for _ in range(nb)]

        def decoder(cin: int, cout: int) -> nn.ModuleList:
            return nn.ModuleList([chain(upsample(upsample_mode, cin, cout, True)),
                                  *[QFAttention(cout, block) for _ in range(nb)]])

        self.m_head = nn.Conv2d(in_nc, c[0], 3, 1, 1)
        self.m_down1 = chain(*blocks(c[0]), downsample(downsample_mode, c[0], c[1], True))
        self.m_down2 = chain(*blocks(c[1]), downsample(downsample_mode, c[1], c[2], True))
        self.m_down3 = chain(*blocks(c[2]), downsample(downsample_mode, c[2], c[3], True))
        self.m_body_encoder = chain(*blocks(c[3]))
        self.m_body_decoder = chain(*blocks(c[3]))
        self.m_up3 = decoder(c[3], c[2])
        self.m_up2 = decoder(c[2], c[1])
        self.m_up1 = decoder(c[1], c[0])
        self.m_tail = nn.Conv2d(c[0], out_nc, 3, 1, 1)
        self.qf_pred = chain(*blocks(c[3]), nn.AdaptiveAvgPool2d((1, 1)), nn.Flatten(),
                             nn.Linear(c[3], EMBED), nn.ReLU(), nn.Linear(EMBED, EMBED), nn.ReLU(),
                             nn.Linear(EMBED, 1), nn.Sigmoid())
        self.qf_embed = chain(nn.Linear(1, EMBED), nn.ReLU(), nn.Linear(EMBED, EMBED), nn.ReLU(),
                              nn.Linear(EMBED, EMBED), nn.ReLU())
        for level, width in ((3, c[2]), (2, c[1]), (1, c[0])):
            self.add_module(f"to_gamma_{level}", chain(nn.Linear(EMBED, width), nn.Sigmoid()))
            self.add_module(f"to_beta_{level}", chain(nn.Linear(EMBED, width), nn.Tanh()))

    def _decode(self, stage: nn.ModuleList, x: torch.Tensor, embedding: torch.Tensor, level: int) -> torch.Tensor:
        gamma = getattr(self, f"to_gamma_{level}")(embedding)
        beta = getattr(self, f"to_beta_{level}")(embedding)
        x = stage[0](x)
        for block in stage[1:]:
            x = block(x, gamma, beta)
        return x

    def forward_with_qf(self, x: torch.Tensor, qf_input: torch.Tensor | float | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """The restored image and the predicted ``qf`` (b, 1). ``qf_input`` (float, or (b, 1) tensor, in
        ``1 - quality / 100`` units) replaces the prediction in the decoder when given."""
        h, w = x.shape[-2:]
        x = F.pad(x, (0, (-w) % 8, 0, (-h) % 8), mode="replicate") if h % 8 or w % 8 else x
        x1 = self.m_head(x)
        x2 = self.m_down1(x1)
        x3 = self.m_down2(x2)
        x4 = self.m_down3(x3)
        y = self.m_body_encoder(x4)
        qf = self.qf_pred(y)
        y = self.m_body_decoder(y)
        embedding = self.qf_embed(qf if qf_input is None else self._qf_tensor(qf_input, x))
        y = self._decode(self.m_up3, y + x4, embedding, 3)
        y = self._decode(self.m_up2, y + x3, embedding, 2)
        y = self._decode(self.m_up1, y + x2, embedding, 1)
        return self.m_tail(y + x1)[..., :h, :w], qf

    @staticmethod
    def _qf_tensor(qf: torch.Tensor | float, x: torch.Tensor) -> torch.Tensor:
        if isinstance(qf, torch.Tensor):
            return qf.to(device=x.device, dtype=x.dtype).reshape(-1, 1).expand(x.shape[0], 1)
        return torch.full((x.shape[0], 1), float(qf), device=x.device, dtype=x.dtype)

    def forward(self, x: torch.Tensor, qf_input: torch.Tensor | float | None = None) -> torch.Tensor:
        """The restored image (the predicted quality factor steers the decoder unless ``qf_input`` is given)."""
        return self.forward_with_qf(x, qf_input)[0]


__all__ = ["FBCNN", "QFAttention"]


def _recognise(s: StateShapes) -> dict:
    """FBCNN from its tensors: the four level widths from each level's first block, blocks per level from the
    encoder bottleneck, channels from the head / tail convs, the resampling kinds from the layer shapes."""
    nb = s.count("m_body_encoder.") or 1  # one block is the stage itself (no index)
    body = "m_body_encoder.0" if nb > 1 else "m_body_encoder"
    nc = [s.dim("m_head.weight", 0), s.dim("m_down2.0.res.0.weight", 0), s.dim("m_down3.0.res.0.weight", 0),
          s.dim(f"{body}.res.0.weight", 0)]
    down, up = unet_modes(s, "m_down1", "m_up3.0", nb)
    if "qf_embed.0.weight" not in s:
        return {}
    return {"in_nc": s.dim("m_head.weight", 1), "out_nc": s.dim("m_tail.weight", 0), "nc": nc, "nb": nb,
            "downsample_mode": down, "upsample_mode": up}


register_recogniser("FBCNN", _recognise)

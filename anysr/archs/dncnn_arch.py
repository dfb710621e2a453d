"""DnCNN: a plain convolutional denoiser with residual learning (Zhang, Zuo, Chen, Meng and Zhang, "Beyond a
Gaussian Denoiser", IEEE TIP 2017), and its flexible form FDnCNN (Zhang, Zuo and Zhang, FFDNet, IEEE TIP 2018).

``nb`` 3x3 convolutions of ``nc`` channels (conv + activation, ``nb - 2`` times conv + norm / activation as
``act_mode`` says, conv). ``mode="DnCNN"`` predicts the noise and returns ``x - noise`` (``in_nc == out_nc``);
``mode="FDnCNN"`` returns the network's output directly and reads a noise-level map as its last input channel:
give it ``in_nc - 1`` image channels and the map is appended (``noise_level``, default 15/255 as spandrel's call),
or all ``in_nc`` channels to supply your own. Layer names follow the authors' KAIR code (as in spandrel 0.4.2), so
released checkpoints load with ``strict=True``. Fully convolutional, scale 1, any input size (``tile_multiple``
1).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.dpir_util import append_noise_map, chain, check_act_mode, layers
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY


@ARCH_REGISTRY.register()
class DnCNN(nn.Module):
    """DnCNN / FDnCNN (KAIR's ``model.<i>`` layer list).

    Args:
        in_nc / out_nc: channels in and out (FDnCNN: ``in_nc`` counts the noise-level map).
        nc: width. nb: number of convolutions (>= 2; 17 for DnCNN-S, 20 for the blind colour / FDnCNN models).
        act_mode: norm / activation letters after each body conv ('BR': batch norm + ReLU, 'R': ReLU only,
            'L': LeakyReLU); the head conv gets the last letter.
        mode: 'DnCNN' (residual: ``x - net(x)``) or 'FDnCNN' (direct output, noise map input).
    """

    tile_multiple: int = 1
    noise_level: float = 15 / 255

    def __init__(self, *, in_nc: int = 1, out_nc: int = 1, nc: int = 64, nb: int = 17, act_mode: str = "BR",
                 mode: Literal["DnCNN", "FDnCNN"] = "DnCNN") -> None:
        super().__init__()
        check_act_mode(act_mode)
        if mode not in ("DnCNN", "FDnCNN"):
            raise ArchArgumentError("mode", f"expected 'DnCNN' or 'FDnCNN', got {mode!r}")
        if mode == "DnCNN" and in_nc != out_nc:
            raise ArchArgumentError("in_nc", f"DnCNN subtracts the predicted noise from its input, so in_nc "
                                    f"({in_nc}) must equal out_nc ({out_nc}); use mode='FDnCNN' otherwise")
        if isinstance(nb, bool) or not isinstance(nb, int) or nb < 2:
            raise ArchArgumentError("nb", f"DnCNN needs at least 2 convolutions (head and tail), got {nb!r}")
        self.mode = mode
        self.in_nc = in_nc
        # What a caller feeds: FDnCNN's last input channel is the noise map it appends itself.
        self.in_channels = in_nc - 1 if mode == "FDnCNN" and in_nc > 1 else in_nc
        head = layers("C" + act_mode[-1], in_nc, nc)
        body = [layers("C" + act_mode, nc, nc) for _ in range(nb - 2)]
        self.model = chain(head, *body, layers("C", nc, out_nc))

    def forward(self, x: torch.Tensor, noise_level: float | torch.Tensor | None = None) -> torch.Tensor:
        """Denoise ``x``. FDnCNN: ``noise_level`` (float or per-sample tensor, [0, 1] units) fills the appended
        noise map when ``x`` has ``in_nc - 1`` channels (default ``self.noise_level``)."""
        if self.mode == "DnCNN":
            return x - self.model(x)
        level = self.noise_level if noise_level is None else noise_level
        return self.model(append_noise_map(x, self.in_nc, level))


__all__ = ["DnCNN"]


def _recognise(s: StateShapes) -> list[dict]:
    """DnCNN from its tensors: ``model.<i>`` convs (with batch norms after the body convs for 'BR'), the width and
    channels from the first / last conv; in != out channels (or a noise-map channel) means FDnCNN."""
    convs = [i for i in s.indices("model.") if len(s.shape(f"model.{i}.weight")) == 4]
    norm = any(f"model.{i}.running_mean" in s for i in s.indices("model."))
    nc, cin = s.dim("model.0.weight", 0), s.dim("model.0.weight", 1)
    cout = s.dim(f"model.{convs[-1]}.weight", 0)
    act = "BR" if norm else "R"
    modes = ["DnCNN", "FDnCNN"] if cin == cout else ["FDnCNN"]
    return [{"in_nc": cin, "out_nc": cout, "nc": nc, "nb": len(convs), "act_mode": act, "mode": m} for m in modes]


register_recogniser("DnCNN", _recognise)

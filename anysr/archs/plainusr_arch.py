"""PlainUSR: "Chasing Faster ConvNet for Efficient Super-Resolution" (Wang et al., ACCV 2024), as neosr trains it.

Module names and constructor arguments follow neosr's ``plainusr`` (``plainusr_arch.py``), so its checkpoints (the
training-time layout it saves) load with ``strict=True`` and give its inference output. A 3x3 head to ``n_feat + 3``
channels (the last three start as a copy of the image), a U of blocks on the leading ``im_feat[k]`` channels (block1
on ``im_feat[0]``, block2 on ``im_feat[1]``, ..., blockm on the narrowest, then back out; ``n_feat <= 32``: three
blocks on two widths), a 3x3 conv + PixelShuffle tail. A block is re-parameterisable convs with LeakyReLU(0.05) and,
above ``n_feat`` 32, a PConv (channel 0 replaced by a 1x1 mix) and a local-importance attention.

Re-parameterisation: each MBConv (1x1 expand, 3x3 on the bias-padded expansion scaled per channel by an SE of a
learned vector, identity, 1x1 reduce, identity) is one linear map of its input, so anysr always runs it as one
3x3 conv whose kernel and bias are folded from the branches (differentiable: the same function and gradients in
training, one conv instead of three), with a following PConv folded into the same conv. ``reparameterize()`` freezes
the folds (for export); the state dict keeps the training-time keys either way. neosr's ``switch_to_deploy`` layout
(plain convs) is not read: neosr never saves it.

neosr's training forward of the ``n_feat <= 32`` layout (``plainusr_ultra``) drops blockm's and block2's output
(it concatenates block1's); its inference path uses them. anysr trains and runs the inference path (the paper's
network), so a neosr ``ultra`` checkpoint gives neosr's inference output, and anysr trains all of it.

Any input size of at least 7 pixels (the attention's 7x7 soft pooling); no padding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.resize_util import resize_bilinear
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

Folded = tuple[torch.Tensor, torch.Tensor]


def _centre_identity(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (o, i, 3, 3) plus the identity on its centre taps (o == i)."""
    eye = torch.eye(weight.shape[0], weight.shape[1], dtype=weight.dtype, device=weight.device)
    return weight + F.pad(eye[:, :, None, None], (1, 1, 1, 1))


class ASR(nn.Module):
    """A per-channel scale ``sigmoid(fc(silu(fc(tensor))))`` of a learned vector (``se.1``, ``se.3``: the fcs)."""

    def __init__(self, n_feat: int) -> None:
        super().__init__()
        self.n_feat = n_feat
        self.tensor = nn.Parameter(0.1 * torch.ones(1, n_feat, 1, 1))
        self.se = nn.Sequential(nn.Identity(), nn.Linear(n_feat, n_feat // 4, bias=False), nn.SiLU(),
                                nn.Linear(n_feat // 4, n_feat, bias=False), nn.Sigmoid(), nn.Identity())
        nn.init.ones_(self.se[1].weight)  # the scale starts at 0.5 everywhere
        nn.init.ones_(self.se[3].weight)

    def scale(self) -> torch.Tensor:
        """The (n_feat,) scale."""
        return self.se(self.tensor.reshape(1, self.n_feat)).reshape(self.n_feat)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale().reshape(1, -1, 1, 1)


class MBConv(nn.Module):
    """``x + reduce(asr(fea(pad_b(expand(x)))) + expand(x))``, run as one 3x3 conv (``folded``)."""

    def __init__(self, n_feat: int, ratio: int = 2) -> None:
        super().__init__()
        i_feat = n_feat * ratio
        self.expand_conv = nn.Conv2d(n_feat, i_feat, 1)
        self.fea_conv = nn.Conv2d(i_feat, i_feat, 3)
        self.reduce_conv = nn.Conv2d(i_feat, n_feat, 1)
        self.se = ASR(i_feat)

    def folded(self) -> Folded:
        """The 3x3 kernel and bias of the whole block (zero padding of the input = the bias padding of the
        expansion)."""
        k0, b0 = self.expand_conv.weight[:, :, 0, 0], self.expand_conv.bias
        k2, b2 = self.reduce_conv.weight[:, :, 0, 0], self.reduce_conv.bias
        a = self.se.scale()
        k1 = _centre_identity(self.fea_conv.weight * a[:, None, None, None])
        b1 = self.fea_conv.bias * a
        inner_b = k1.sum((2, 3)) @ b0 + b1
        weight = torch.einsum("om,mckl,ci->oikl", k2, k1, k0)
        return _centre_identity(weight), k2 @ inner_b + b2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = self.folded()
        return F.conv2d(x, weight, bias, padding=1)


class PConv(nn.Module):
    """Channel 0 replaced by a 1x1 mix of all channels (folded into the conv before it)."""

    def __init__(self, n_feat: int) -> None:
        super().__init__()
        self.n_feat = n_feat
        self.conv = nn.Conv2d(n_feat, 1, 1)
        nn.init.constant_(self.conv.weight, 1 / n_feat)
        nn.init.zeros_(self.conv.bias)

    def fold(self, weight: torch.Tensor, bias: torch.Tensor) -> Folded:
        """The kernel and bias of ``self`` after a conv of ``weight`` / ``bias``."""
        k = self.conv.weight[0, :, 0, 0]
        w0 = torch.einsum("c,cikl->ikl", k, weight)[None]
        b0 = (k @ bias + self.conv.bias).reshape(1)
        return torch.cat([w0, weight[1:]]), torch.cat([b0, bias[1:]])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.conv(x), x[:, 1:]], dim=1)


class SoftPooling2D(nn.Module):
    """Soft pooling: ``avg(exp(x) * x) / avg(exp(x))`` over the windows."""

    def __init__(self, kernel_size: int, stride: int | None = None, padding: int = 0) -> None:
        super().__init__()
        self.avgpool = nn.AvgPool2d(kernel_size, stride, padding, count_include_pad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e = torch.exp(x)
        return self.avgpool(e * x) / self.avgpool(e)


class LocalAttention(nn.Module):
    """``x * w * sigmoid(x[:, :1])``; w: sigmoid of a coarse importance map (1x1 conv to ``f``, 7x7 soft pooling every
    3 pixels, a stride-2 conv, a conv back; bilinear upsampling), or with ``speed`` of one 3x3 conv."""

    def __init__(self, channels: int, f: int = 16, speed: bool = False) -> None:
        super().__init__()
        self.speed = speed
        if speed:
            self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, 1, 1), nn.Sigmoid())
        else:
            self.body = nn.Sequential(nn.Conv2d(channels, f, 1), SoftPooling2D(7, stride=3),
                                      nn.Conv2d(f, f, 3, stride=2, padding=1), nn.Conv2d(f, channels, 3, padding=1),
                                      nn.Sigmoid())
        self.gate = nn.Sequential(nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.body(x)
        if not self.speed:
            w = resize_bilinear(w, (x.shape[-2], x.shape[-1]), align_corners=False)  # XLA: by gathers
        return x * w * self.gate(x[:, :1])


class Block(nn.Module):
    """neosr's ``Block``: version 1 MBConv, LeakyReLU, MBConv; 2 and 3 add a PConv and the attention (3: the
    ``speed`` one); 4 three MBConvs with LeakyReLUs, PConv, attention."""

    def __init__(self, n_feat: int, version: int, f: int = 16) -> None:
        super().__init__()
        self.version = version

        def act() -> nn.Module:
            return nn.LeakyReLU(0.05, inplace=True)

        layers: list[nn.Module] = [MBConv(n_feat), act(), MBConv(n_feat)]
        if version >= 4:
            layers += [act(), MBConv(n_feat)]
        if version >= 2:
            layers += [PConv(n_feat), LocalAttention(n_feat, f, speed=version == 3)]
        self.body = nn.Sequential(*layers)
        self._frozen: list[Folded] | None = None

    def convs(self) -> list[Folded]:
        """The block's folded 3x3 convs in order (a PConv folded into the conv before it)."""
        if self._frozen is not None:
            return self._frozen
        out: list[Folded] = []
        for module in self.body:
            if isinstance(module, MBConv):
                out.append(module.folded())
            elif isinstance(module, PConv):
                out[-1] = module.fold(*out[-1])
        return out

    @torch.no_grad()
    def reparameterize(self) -> None:
        """Fold once and keep the folds (non-persistent buffers: the state dict keeps its keys)."""
        self._frozen = None
        for i, (w, b) in enumerate(self.convs()):
            self.register_buffer(f"deploy_weight{i}", w.detach().clone(), persistent=False)
            self.register_buffer(f"deploy_bias{i}", b.detach().clone(), persistent=False)
        n = sum(isinstance(m, MBConv) for m in self.body)
        self._frozen = [(getattr(self, f"deploy_weight{i}"), getattr(self, f"deploy_bias{i}")) for i in range(n)]

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 - keep the frozen folds pointing at moved buffers
        super()._apply(fn, recurse)
        if self._frozen is not None:
            self._frozen = [(getattr(self, f"deploy_weight{i}"), getattr(self, f"deploy_bias{i}"))
                            for i in range(len(self._frozen))]
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        convs = iter(self.convs())
        for module in self.body:
            if isinstance(module, MBConv):
                weight, bias = next(convs)
                x = F.conv2d(x, weight, bias, padding=1)
            elif not isinstance(module, PConv):
                x = module(x)
        return x


def _check_args(n_feat: int, im_feat: Sequence[int], attn_feat: int, scale: int) -> list[int]:
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ArchArgumentError("scale", f"PlainUSR needs an integer scale >= 1, got {scale!r}")
    if isinstance(n_feat, bool) or not isinstance(n_feat, int) or n_feat < 2:
        raise ArchArgumentError("n_feat", f"PlainUSR needs an integer n_feat >= 2, got {n_feat!r}")
    if isinstance(attn_feat, bool) or not isinstance(attn_feat, int) or attn_feat < 1:
        raise ArchArgumentError("attn_feat", f"PlainUSR needs an integer attn_feat >= 1, got {attn_feat!r}")
    levels = 2 if n_feat <= 32 else 3
    widths = list(im_feat) if isinstance(im_feat, Sequence) and not isinstance(im_feat, str) else []
    if (len(widths) < levels or any(isinstance(w, bool) or not isinstance(w, int) or w < 2 for w in widths)
            or widths[0] > n_feat or any(a < b for a, b in zip(widths[:levels], widths[1:levels], strict=False))):
        raise ArchArgumentError("im_feat", f"PlainUSR with n_feat={n_feat} needs {levels} block widths >= 2, "
                                f"non-increasing, the first at most n_feat, got {im_feat!r}")
    return widths[:levels]


@ARCH_REGISTRY.register()
class PlainUSR(nn.Module):
    """PlainUSR (neosr's ``plainusr``).

    Args (neosr's): n_feat (width; <= 32: the three-block layout of version-1/3 blocks, >= 80: five version-4
    blocks, else five version-2 blocks), im_feat (the blocks' widths, widest first: 2 for n_feat <= 32, else 3;
    the first at most n_feat: neosr trains only with it equal), attn_feat (the attention's inner width), scale
    (integer >= 1). RGB only, as neosr.
    """

    def __init__(self, n_feat: int = 64, im_feat: Sequence[int] = (64, 48, 32), attn_feat: int = 16,
                 scale: int = 4) -> None:
        super().__init__()
        widths = _check_args(n_feat, im_feat, attn_feat, scale)
        self.n_feat = n_feat
        self.scale = scale
        self.im_feat = tuple(widths)
        self.head = nn.Conv2d(3, n_feat + 3, 3, 1, 1)
        if n_feat <= 32:
            self.block1 = Block(widths[0], 1, attn_feat)
            self.blockm = Block(widths[1], 3, attn_feat)
            self.block2 = Block(widths[0], 1, attn_feat)
            self._order = [("block1", widths[0]), ("blockm", widths[1]), ("block2", widths[0])]
        else:
            version = 4 if n_feat >= 80 else 2
            self.block1 = Block(widths[0], version, attn_feat)
            self.block2 = Block(widths[1], version, attn_feat)
            self.blockm = Block(widths[2], version, attn_feat)
            self.block3 = Block(widths[1], version, attn_feat)
            self.block4 = Block(widths[0], version, attn_feat)
            self._order = [("block1", widths[0]), ("block2", widths[1]), ("blockm", widths[2]),
                           ("block3", widths[1]), ("block4", widths[0])]
        self.tail = nn.Sequential(nn.Conv2d(n_feat + 3, 3 * scale**2, 3, 1, 1), nn.PixelShuffle(scale))
        with torch.no_grad():  # the head's last three channels copy the image; the tail adds them to each output
            for c in range(3):
                self.head.weight[n_feat + c, c, 1, 1] += 1
                self.tail[0].weight[c * scale**2:(c + 1) * scale**2, n_feat + c, 1, 1] += 1

    def reparameterize(self) -> PlainUSR:
        """The deployment form: every block's convs folded once and kept (what export traces). The state dict
        keeps its keys; do not train it further."""
        for module in self.modules():
            if isinstance(module, Block):
                module.reparameterize()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(x)
        for name, width in self._order:
            x = torch.cat([getattr(self, name)(x[:, :width]), x[:, width:]], dim=1)
        return self.tail(x)


__all__ = ["PlainUSR"]


# neosr's named variants (its builders pass the scale on).
register_presets("PlainUSR", scale_arg="scale", source="neosr", presets={
    "plainusr": {},  # neosr's name: the class defaults, the top-level scale
    "plainusr_ultra": {"n_feat": 32, "im_feat": (32, 16), "attn_feat": 4},
    "plainusr_large": {"n_feat": 80, "im_feat": (80, 64, 48), "attn_feat": 16},
})


def _recognise(s: StateShapes) -> dict | None:
    """PlainUSR from its tensors: width from the head (``n_feat + 3`` channels from RGB), the blocks' widths from
    their first convs, the attention's inner width (the ultra layout's speed attention has none: the default is
    kept), the scale from the tail."""
    if len(s.shape("head.weight")) != 4 or "block1.body.0.expand_conv.weight" not in s:
        return None
    head_out, head_in = s.shape("head.weight")[:2]
    n_feat = head_out - 3
    if head_in != 3:
        return None
    names = ("block1", "blockm") if n_feat <= 32 else ("block1", "block2", "blockm")
    im_feat = [s.dim(f"{b}.body.0.expand_conv.weight", 1) for b in names]
    attn = [k for k in s.keys() if k.startswith("block1.body.") and k.endswith(".body.0.weight")]
    args: dict = {"n_feat": n_feat, "im_feat": im_feat}
    if attn and n_feat > 32:
        args["attn_feat"] = s.dim(attn[0], 0)
    scale = round((s.dim("tail.0.weight", 0) / 3) ** 0.5)
    return {**args, "scale": scale}


register_recogniser("PlainUSR", _recognise)

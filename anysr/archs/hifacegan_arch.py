"""HiFaceGAN (Yang et al., "HiFaceGAN: Face Renovation via Collaborative Suppression and Replenishment",
ACM MM 2020) with BasicSR 1.4.2's arguments and parameter names, so BasicSR's option files and weights work as
they are.

* ``HiFaceGAN``: a face restorer at the input's size (x1). A local-importance-pooling encoder (LIP) takes the
  image down 32x to 16 * ``num_feat`` channels; SPADE residual blocks, each normalising its features and
  re-modulating them with a scale and shift computed from the input image at that block's size, bring it back
  up (nearest x2 per level) to an RGB image through ``tanh``. ``norm_g`` names the blocks' normalisation as
  BasicSR does: ``[spectral]spade<instance|batch|syncbatch><k>x<k>`` (``spectral``: spectral normalisation on
  the convolutions; ``syncbatch`` is instance normalisation, as in BasicSR; ``k``: the modulation's kernel).
* ``HiFaceGANDiscriminator``: pix2pixHD's multi-scale PatchGAN: ``num_d`` discriminators, each on the input
  average-pooled once more than the last; each returns its intermediate features (``keep_features``) for the
  feature-matching loss, the last being the patch scores. ``conditional_d``: it judges (input, image) pairs.

Written for anysr: any input size (padded at the bottom / right by reflection to a multiple of 32 and cropped;
the reference needs a multiple of 32 and gives another size otherwise), the image's per-level copies taken by
striding (what nearest resizing to an exact fraction reads) and upsampling through ``nearest_upsample``, so the
network compiles once under XLA with no CPU fallback and exports to ONNX. Parameters the reference keeps but
never runs (``fc``, the to-RGB convs of the progressive-training phases) are loaded and saved but frozen: an
unused trainable parameter would stop distributed training.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import spectral_norm

from anysr.archs.arch_util import ArchArgumentError, nearest_upsample, pad_to_multiple
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

LEVELS = 5  # the encoder halves the size this many times (BasicSR's ``scale_ratio``, fixed)
PHASES = 4  # up levels after the middle blocks (progressive training's last phase)
_NORM_G = re.compile(r"^(spectral)?spade(instance|syncbatch|batch)(\d)x\d$")
_NORM_D = ("instance", "batch", "sync_batch", "syncbatch", "none", "")


def parse_norm_g(norm_g: object) -> tuple[bool, str, int]:
    """``(spectral, norm, kernel)`` from a ``norm_g`` string; ArchArgumentError for another value."""
    m = _NORM_G.match(norm_g) if isinstance(norm_g, str) else None
    if m is None or int(m.group(3)) % 2 == 0:
        raise ArchArgumentError("norm_g", f"expected [spectral]spade<instance|batch|syncbatch><k>x<k> with an odd k "
                                f"(e.g. 'spectralspadebatch3x3'), got {norm_g!r}")
    return m.group(1) is not None, "batch" if m.group(2) == "batch" else "instance", int(m.group(3))


def _maybe_spectral(conv: nn.Module, spectral: bool) -> nn.Module:
    return spectral_norm(conv) if spectral else conv


class SPADE(nn.Module):
    """Parameter-free normalisation, then ``x * gamma + beta`` with gamma, beta computed by convolutions from the
    guide image (given at ``x``'s size)."""

    def __init__(self, norm: str, kernel: int, channels: int, guide_channels: int) -> None:
        super().__init__()
        self.param_free_norm = nn.BatchNorm2d(channels, affine=False) if norm == "batch" \
            else nn.InstanceNorm2d(channels)
        hidden = 128 if channels > 128 else channels  # the reference's fixed embedding width
        pad = kernel // 2
        self.mlp_shared = nn.Sequential(nn.Conv2d(guide_channels, hidden, kernel, padding=pad), nn.ReLU())
        self.mlp_gamma = nn.Conv2d(hidden, channels, kernel, padding=pad, bias=False)
        self.mlp_beta = nn.Conv2d(hidden, channels, kernel, padding=pad, bias=False)

    def forward(self, x: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
        actv = self.mlp_shared(guide)
        return self.param_free_norm(x) * self.mlp_gamma(actv) + self.mlp_beta(actv)


class SPADEResnetBlock(nn.Module):
    """Two (SPADE, leaky ReLU, 3x3 conv) steps plus the input, through a SPADE + 1x1 conv where widths differ."""

    def __init__(self, fin: int, fout: int, spectral: bool, norm: str, kernel: int, guide_channels: int) -> None:
        super().__init__()
        self.learned_shortcut = fin != fout
        fmiddle = min(fin, fout)
        self.conv_0 = _maybe_spectral(nn.Conv2d(fin, fmiddle, 3, padding=1), spectral)
        self.conv_1 = _maybe_spectral(nn.Conv2d(fmiddle, fout, 3, padding=1), spectral)
        if self.learned_shortcut:
            self.conv_s = _maybe_spectral(nn.Conv2d(fin, fout, 1, bias=False), spectral)
        self.norm_0 = SPADE(norm, kernel, fin, guide_channels)
        self.norm_1 = SPADE(norm, kernel, fmiddle, guide_channels)
        if self.learned_shortcut:
            self.norm_s = SPADE(norm, kernel, fin, guide_channels)

    def forward(self, x: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
        skip = self.conv_s(self.norm_s(x, guide)) if self.learned_shortcut else x
        dx = self.conv_0(F.leaky_relu(self.norm_0(x, guide), 0.2))
        dx = self.conv_1(F.leaky_relu(self.norm_1(dx, guide), 0.2))
        return skip + dx


class SoftGate(nn.Module):
    """``12 * sigmoid(x)``: the LIP logits' range."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(x) * 12.0


class SimplifiedLIP(nn.Module):
    """Local importance pooling (Gao et al., ICCV 2019): a 3x3 stride-2 average weighted by ``exp`` of learned
    logits."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.logit = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                                   nn.InstanceNorm2d(channels, affine=True), SoftGate())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.logit(x).exp()
        return F.avg_pool2d(x * weight, 3, 2, 1) / F.avg_pool2d(weight, 3, 2, 1)


class LIPEncoder(nn.Module):
    """Conv + instance norm, then per level: LIP pooling, a conv doubling the width (up to 16x), instance norm."""

    def __init__(self, in_ch: int, num_feat: int, levels: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(in_ch, num_feat, 3, padding=1, bias=False), nn.InstanceNorm2d(num_feat),
                                   nn.ReLU()]
        ratio = 1
        for i in range(levels):
            nxt = min(ratio * 2, 16)
            layers += [SimplifiedLIP(num_feat * ratio), nn.Conv2d(num_feat * ratio, num_feat * nxt, 3, padding=1),
                       nn.InstanceNorm2d(num_feat * nxt)]
            ratio = nxt
            if i < levels - 1:
                layers.append(nn.ReLU())
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def _check_int(name: str, value: object, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ArchArgumentError(name, f"expected an integer of at least {least}, got {value!r}")
    return value


@ARCH_REGISTRY.register()
class HiFaceGAN(nn.Module):
    """HiFaceGAN's generator (BasicSR's ``HiFaceGAN``: SPADEGenerator with the LIP encoder); x1, output through
    ``tanh``.

    Args:
        num_in_ch: input channels (also the guide image's; BasicSR's blocks take 3).
        num_feat: base width (16x at the bottom; BasicSR's option files use 48, the class default is 64).
        use_vae, z_dim, crop_size: shape the reference's unused ``fc`` layer (a linear map from ``z_dim`` to a
            ``crop_size / 32`` square when ``use_vae``, else a 3x3 conv); kept for its weights, frozen.
        norm_g: the blocks' normalisation (see the module's docstring).
        is_train, init_train_phase: BasicSR's progressive-training switch; the network runs all four up levels
            (``is_train: false``, or ``init_train_phase: 3``), other phases are refused.
    """

    scale = 1
    tile_multiple = 2**LEVELS

    def __init__(self, num_in_ch: int = 3, num_feat: int = 64, use_vae: bool = False, z_dim: int = 256,
                 crop_size: int = 512, norm_g: str = "spectralspadesyncbatch3x3", is_train: bool = True,
                 init_train_phase: int = 3) -> None:
        super().__init__()
        _check_int("num_in_ch", num_in_ch, 1)
        nf = _check_int("num_feat", num_feat, 1)
        spectral, norm, kernel = parse_norm_g(norm_g)
        phases = (int(init_train_phase) + 1) if is_train else PHASES
        if phases != PHASES:
            raise ArchArgumentError("init_train_phase", f"progressive training (phase {init_train_phase}) is not "
                                    "supported: the network runs all four up levels; set init_train_phase: 3 or "
                                    "is_train: false")
        side = _check_int("crop_size", crop_size, 2**LEVELS) // 2**LEVELS
        self.num_in_ch = num_in_ch
        self.fc = nn.Linear(_check_int("z_dim", z_dim, 1), 16 * nf * side * side) if use_vae \
            else nn.Conv2d(num_in_ch, 16 * nf, 3, padding=1)

        def block(fin: int, fout: int) -> SPADEResnetBlock:
            return SPADEResnetBlock(fin, fout, spectral, norm, kernel, num_in_ch)

        self.head_0 = block(16 * nf, 16 * nf)
        self.g_middle_0 = block(16 * nf, 16 * nf)
        self.g_middle_1 = block(16 * nf, 16 * nf)
        widths = [16 * nf, 8 * nf, 4 * nf, 2 * nf, nf]
        self.ups = nn.ModuleList(block(a, b) for a, b in zip(widths, widths[1:], strict=False))
        self.to_rgbs = nn.ModuleList(nn.Conv2d(w, 3, 3, padding=1) for w in widths[1:])
        self.lip_encoder = LIPEncoder(num_in_ch, nf, LEVELS)
        for p in (*self.fc.parameters(), *[q for m in self.to_rgbs[:-1] for q in m.parameters()]):
            p.requires_grad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x, _, _ = pad_to_multiple(x, self.tile_multiple)
        if self.training and min(x.shape[-2:]) < 2 * self.tile_multiple:
            raise ValueError(f"HiFaceGAN trains on images of at least {2 * self.tile_multiple}x"
                             f"{2 * self.tile_multiple} (its instance norms need 2x2 values at 1/32 of the size), got "
                             f"{h}x{w}; raise datasets.train.gt_size")
        guides = [x[..., :: 2**k, :: 2**k] for k in range(LEVELS + 1)]  # the guide at 1, 1/2, ... 1/32 of the size
        y = self.head_0(self.lip_encoder(x), guides[LEVELS])
        y = nearest_upsample(y, 2)
        y = self.g_middle_1(self.g_middle_0(y, guides[LEVELS - 1]), guides[LEVELS - 1])
        for i, up in enumerate(self.ups):
            y = up(nearest_upsample(y, 2), guides[LEVELS - 2 - i])
        y = torch.tanh(self.to_rgbs[-1](F.leaky_relu(y, 0.2)))
        return y[..., :h, :w]


def _norm_layer(norm_d: str) -> tuple[bool, str]:
    spectral = norm_d.startswith("spectral")
    sub = norm_d[len("spectral"):] if spectral else norm_d
    if sub not in _NORM_D:
        raise ArchArgumentError("norm_d", f"expected [spectral]<instance|batch|sync_batch|none> (e.g. "
                                f"'spectralinstance'), got {norm_d!r}")
    return spectral, "none" if sub == "" else sub


class NLayerDiscriminator(nn.Module):
    """pix2pixHD's PatchGAN: 4x4 convs (stride 2 but the last two), widths doubling up to 512, each group's output
    kept (``model0`` ... ``model<n_layers_d>``)."""

    def __init__(self, in_ch: int, n_layers_d: int, num_feat: int, norm_d: str, keep_features: bool) -> None:
        super().__init__()
        spectral, sub = _norm_layer(norm_d)
        self.keep_features = keep_features
        nf = num_feat
        groups: list[list[nn.Module]] = [[nn.Conv2d(in_ch, nf, 4, 2, 2), nn.LeakyReLU(0.2)]]
        for n in range(1, n_layers_d):
            prev, nf = nf, min(nf * 2, 512)
            conv = nn.Conv2d(prev, nf, 4, 1 if n == n_layers_d - 1 else 2, 2, bias=sub == "none")
            conv = _maybe_spectral(conv, spectral)
            if sub == "batch":
                layer: nn.Module = nn.Sequential(conv, nn.BatchNorm2d(nf))
            elif sub == "none":
                layer = conv
            else:  # instance (BasicSR's sync_batch too)
                layer = nn.Sequential(conv, nn.InstanceNorm2d(nf))
            groups.append([layer, nn.LeakyReLU(0.2)])
        groups.append([nn.Conv2d(nf, 1, 4, 1, 2)])
        for n, group in enumerate(groups):
            self.add_module(f"model{n}", nn.Sequential(*group))

    def forward(self, x: torch.Tensor) -> list[torch.Tensor] | torch.Tensor:
        features = []
        for group in self.children():
            x = group(x)
            features.append(x)
        return features if self.keep_features else x


@ARCH_REGISTRY.register()
class HiFaceGANDiscriminator(nn.Module):
    """Multi-scale conditional PatchGAN (BasicSR's ``HiFaceGANDiscriminator``): a list with one entry per scale,
    each the list of that discriminator's features (``keep_features``; the last is the patch scores) or the
    scores alone. With ``conditional_d`` the input is (condition, image) stacked on channels
    (``num_in_ch + num_out_ch`` channels); ``conditional`` tells the training model so."""

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, conditional_d: bool = True, num_d: int = 2,
                 n_layers_d: int = 4, num_feat: int = 64, norm_d: str = "spectralinstance",
                 keep_features: bool = True) -> None:
        super().__init__()
        in_ch = _check_int("num_in_ch", num_in_ch, 1) + (_check_int("num_out_ch", num_out_ch, 1) if conditional_d
                                                          else 0)
        _check_int("num_d", num_d, 1)
        _check_int("n_layers_d", n_layers_d, 1)
        if not isinstance(norm_d, str):
            raise ArchArgumentError("norm_d", f"expected a string such as 'spectralinstance', got {norm_d!r}")
        self.conditional = bool(conditional_d)
        self.num_d = num_d
        for i in range(num_d):
            self.add_module(f"discriminator_{i}", NLayerDiscriminator(in_ch, n_layers_d,
                                                                      _check_int("num_feat", num_feat, 1), norm_d,
                                                                      keep_features))

    def forward(self, x: torch.Tensor) -> list[Any]:
        out = []
        for i, net in enumerate(self.children()):
            if i:
                x = F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
            out.append(net(x))
        return out


def _recognise(s: StateShapes) -> dict:
    """HiFaceGAN from its tensors: width and input channels from the encoder's first conv; ``use_vae`` (and then
    ``z_dim`` and ``crop_size``) from ``fc``; ``norm_g`` from spectral norm's ``weight_orig``, batch norm's running
    statistics and the modulation's kernel (instance and syncbatch are the same network: instance is proposed)."""
    nf, in_ch = s.dim("lip_encoder.model.0.weight", 0), s.dim("lip_encoder.model.0.weight", 1)
    fc = s.shape("fc.weight")
    opt: dict[str, Any] = {"num_in_ch": in_ch, "num_feat": nf, "is_train": False}
    if len(fc) == 2:
        side = round((fc[0] / (16 * nf)) ** 0.5)
        if side * side * 16 * nf != fc[0]:
            raise NotThisFamily("fc")
        opt.update(use_vae=True, z_dim=fc[1], crop_size=side * 2**LEVELS)
    spectral = "head_0.conv_0.weight_orig" in s
    norm = "batch" if "head_0.norm_0.param_free_norm.running_mean" in s else "instance"
    k = s.dim("head_0.norm_0.mlp_shared.0.weight", -1)
    opt["norm_g"] = f"{'spectral' if spectral else ''}spade{norm}{k}x{k}"
    return opt


register_recogniser("HiFaceGAN", _recognise)

# BasicSR's train_hifacegan.yml network (the size FFHQ 512 faces were trained with).
register_presets("HiFaceGAN", scale_arg=None, fixed={"scale": 1}, source="BasicSR", presets={
    "hifacegan": {"num_feat": 48, "norm_g": "spectralspadebatch3x3", "is_train": False, "crop_size": 512}})

"""More GAN discriminators: traiNNer-redux's MetaGan2, MetaGAN3, PatchGANDiscriminatorSN and
MultiscalePatchGANDiscriminatorSN, and neosr's ``metagan`` (``MetaGAN``) and ``patchgan`` (``PatchGAN``).

Module names and constructor arguments are the references', so their weights load strictly. Every spectral norm is
``torch.nn.utils.spectral_norm`` as in the references (keys ``weight_orig`` / ``weight_u`` / ``weight_v``; one power
iteration per training-mode forward, none in eval mode). neosr's ``metagan`` is its own network (attention in the
last two stages, GroupNorm downsamplers, a 1x1 conv head), not traiNNer-redux's MetaGan2 or MetaGAN3.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import spectral_norm

from anysr.archs.arch_util import ArchArgumentError, DropPath
from anysr.registry import ARCH_REGISTRY


def _sn_conv(cin: int, cout: int, k: int, stride: int = 1, padding: int = 0, bias: bool = True) -> nn.Conv2d:
    return spectral_norm(nn.Conv2d(cin, cout, k, stride, padding, bias=bias))


def _positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ArchArgumentError(name, f"needs an integer >= 1, got {value!r}")


def _int_list(name: str, value: object, n: int | None = None, *, minimum: int = 1) -> list[int]:
    items = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else None
    if not items or any(not isinstance(v, int) or isinstance(v, bool) or v < minimum for v in items):
        raise ArchArgumentError(name, f"needs a list of integers >= {minimum}, got {value!r}")
    if n is not None and len(items) != n:
        raise ArchArgumentError(name, f"needs {n} entries (one per stage), got {len(items)}")
    return items


def _trunc_init(m: nn.Module) -> None:
    if isinstance(m, nn.Conv2d | nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


# ----------------------------------------------------------------------------- PatchGAN (traiNNer-redux)

def _patchgan_layers(input_nc: int, ndf: int, n_layers: int, use_sigmoid: bool) -> nn.Sequential:
    """pix2pixHD's N-layer PatchGAN, every conv spectrally normalised: ``model.<i>`` of traiNNer-redux."""
    layers: list[nn.Module] = []
    prev, nf = input_nc, ndf
    for i in range(n_layers + 1):
        stride = 2 if i < n_layers else 1
        layers += [_sn_conv(prev, nf, 4, stride, 1), nn.LeakyReLU(0.2, True)]
        prev, nf = nf, min(nf * 2, 512)
    layers.append(_sn_conv(prev, 1, 4, 1, 1))
    if use_sigmoid:
        layers.append(nn.Sigmoid())
    return nn.Sequential(*layers)


def _check_patchgan(input_nc: int, ndf: int, n_layers: int) -> None:
    _positive("input_nc", input_nc)
    _positive("ndf", ndf)
    _positive("n_layers", n_layers)


@ARCH_REGISTRY.register()
class PatchGANDiscriminatorSN(nn.Module):
    """traiNNer-redux's spectral-norm PatchGAN: ``n_layers`` stride-2 4x4 convs, one stride-1, a 1-channel 4x4
    conv (width doubling up to 512): one logit per patch.

    Args:
        input_nc: image channels. ndf: first width. n_layers: stride-2 convs. use_sigmoid: end with a sigmoid.
    """

    def __init__(self, input_nc: int = 3, ndf: int = 64, n_layers: int = 3, use_sigmoid: bool = False) -> None:
        super().__init__()
        _check_patchgan(input_nc, ndf, n_layers)
        self.n_layers = n_layers
        self.model = _patchgan_layers(input_nc, ndf, n_layers, use_sigmoid)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


@ARCH_REGISTRY.register()
class MultiscalePatchGANDiscriminatorSN(nn.Module):
    """``num_d`` PatchGANs on the image and its 3x3 average-pooled halvings; returns the mean of their mean
    logits (one scalar, as traiNNer-redux's).

    Args:
        input_nc, ndf, n_layers, use_sigmoid: as PatchGANDiscriminatorSN. num_d: scales.
    """

    def __init__(self, input_nc: int = 3, ndf: int = 64, n_layers: int = 3, use_sigmoid: bool = False,
                 num_d: int = 3) -> None:
        super().__init__()
        _check_patchgan(input_nc, ndf, n_layers)
        _positive("num_d", num_d)
        self.num_d = num_d
        self.layers = nn.ModuleList(_patchgan_layers(input_nc, ndf, n_layers, use_sigmoid) for _ in range(num_d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        means = []
        for i, model in enumerate(self.layers):
            if i:
                x = F.avg_pool2d(x, 3, stride=2, padding=1, count_include_pad=False)
            means.append(model(x).mean())
        return torch.stack(means).mean()


# ----------------------------------------------------------------------------- PatchGAN (neosr)

_NORMS = ("batch", "instance", "batchnorm2d", "none")


@ARCH_REGISTRY.register()
class PatchGAN(nn.Module):
    """neosr's ``patchgan``: the N-layer PatchGAN with an optional norm after each inner conv and optional
    spectral norm on every conv (``model.<i>`` as neosr's).

    Args:
        num_in_ch: image channels. num_feat: first width. num_layers: stride-2 convs. max_nf_mult: width cap
        (times num_feat). norm_type: batch, instance, batchnorm2d or none. use_sigmoid: end with a sigmoid.
        use_sn: spectral norm on every conv.
    """

    def __init__(self, num_in_ch: int = 3, num_feat: int = 64, num_layers: int = 3, max_nf_mult: int = 8,
                 norm_type: str = "none", use_sigmoid: bool = False, use_sn: bool = True) -> None:
        super().__init__()
        for name, v in (("num_in_ch", num_in_ch), ("num_feat", num_feat), ("num_layers", num_layers),
                        ("max_nf_mult", max_nf_mult)):
            _positive(name, v)
        if norm_type not in _NORMS:
            raise ArchArgumentError("norm_type", f"needs one of {', '.join(_NORMS)}, got {norm_type!r}")
        batch = norm_type in ("batch", "batchnorm2d")

        def conv(cin: int, cout: int, stride: int, bias: bool = True) -> nn.Conv2d:
            c = nn.Conv2d(cin, cout, 4, stride, 1, bias=bias)
            return spectral_norm(c) if use_sn else c

        def norm(c: int) -> nn.Module:
            if batch:
                return nn.BatchNorm2d(c)
            return nn.InstanceNorm2d(c) if norm_type == "instance" else nn.Identity()

        layers: list[nn.Module] = [conv(num_in_ch, num_feat, 2), nn.LeakyReLU(0.2, True)]
        mult = 1
        for n in range(1, num_layers + 1):
            prev, mult = mult, min(2 ** n, max_nf_mult)
            layers += [conv(num_feat * prev, num_feat * mult, 2 if n < num_layers else 1, bias=not batch),
                       norm(num_feat * mult), nn.LeakyReLU(0.2, True)]
        layers.append(conv(num_feat * mult, 1, 1))
        if use_sigmoid:
            layers.append(nn.Sigmoid())
        self.model = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


# ----------------------------------------------------------------------------- MetaGan2 (traiNNer-redux)

class _InceptionDW(nn.Module):
    """Depth-wise 3x3, 1x11 and 11x1 convs on three slices of ``branch_ratio`` of the channels; the rest passes."""

    def __init__(self, channels: int, square: int = 3, band: int = 11, branch_ratio: float = 0.125) -> None:
        super().__init__()
        gc = int(channels * branch_ratio)
        self.dwconv_hw = nn.Conv2d(gc, gc, square, padding=square // 2, groups=gc)
        self.dwconv_w = nn.Conv2d(gc, gc, (1, band), padding=(0, band // 2), groups=gc)
        self.dwconv_h = nn.Conv2d(gc, gc, (band, 1), padding=(band // 2, 0), groups=gc)
        self.split = [channels - 3 * gc, gc, gc, gc]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_id, x_hw, x_w, x_h = torch.split(x, self.split, dim=1)
        return torch.cat((x_id, self.dwconv_hw(x_hw), self.dwconv_w(x_w), self.dwconv_h(x_h)), dim=1)


class _ChannelsLastDW(nn.Module):
    """``_InceptionDW`` on a (B, H, W, C) tensor (key ``conv``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = _InceptionDW(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class _GatedBlock2(nn.Module):
    """Gated CNN block on (B, H, W, C): RMSNorm, a spectral-normalised linear to gate / identity / conv parts,
    SiLU gate, spectral-normalised linear back, layer scale ``gamma``, residual."""

    def __init__(self, dim: int, expansion_ratio: float = 8 / 3) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        hidden = int(expansion_ratio * dim)
        self.fc1 = spectral_norm(nn.Linear(dim, hidden * 2))
        self.act = nn.SiLU()
        self.split = [hidden, hidden - dim, dim]
        self.conv = _ChannelsLastDW(dim)
        self.fc2 = spectral_norm(nn.Linear(hidden, dim))
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))
        self.apply(_trunc_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, i, c = torch.split(self.fc1(self.norm(x)), self.split, dim=-1)
        return x + self.fc2(self.act(g) * torch.cat((i, self.conv(c)), dim=-1)) * self.gamma


class _Stem2(nn.Module):
    """Two spectral-normalised stride-2 3x3 convs (SiLU between), then channels-last RMSNorm."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = _sn_conv(cin, cout // 2, 3, 2, 1)
        self.act = nn.SiLU()
        self.conv2 = _sn_conv(cout // 2, cout, 3, 2, 1)
        self.norm2 = nn.RMSNorm(cout, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm2(self.conv2(self.act(self.conv1(x))).permute(0, 2, 3, 1))


class _Down2(nn.Module):
    """Channels-last RMSNorm, then a spectral-normalised stride-2 3x3 conv."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(cin)
        self.conv = _sn_conv(cin, cout, 3, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.norm(x).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class _Stage2(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int, down: int) -> None:
        super().__init__()
        self.down = _Down2(cin, cout) if down == 2 else _Stem2(cin, cout)
        self.blocks = nn.Sequential(*(_GatedBlock2(cout) for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.down(x))


@ARCH_REGISTRY.register()
class MetaGan2(nn.Module):
    """traiNNer-redux's MetaGan2: gated-CNN stages (a stem of two stride-2 convs where ``downs`` is not 2, else a
    norm + stride-2 conv), then a spectral-normalised MLP head on the last stage's channels-last features. The
    output is (B, H/32, W/32, dims[-1]) at the default downs, as the reference's (``n_class`` is unused there too).

    Args:
        in_ch: image channels. n_class: unused. dims: stage widths. blocks: gated blocks per stage. downs: 2 for
        a norm + stride-2 conv, anything else for the two-conv stem (4x).
    """

    def __init__(self, in_ch: int = 3, n_class: int = 1, dims: Sequence[int] = (32, 64, 128, 192),
                 blocks: Sequence[int] = (3, 3, 15, 3), downs: Sequence[int] = (4, 2, 2, 2)) -> None:
        super().__init__()
        _positive("in_ch", in_ch)
        blocks = _int_list("blocks", blocks, minimum=0)
        dims = _int_list("dims", dims, len(blocks))
        downs = _int_list("downs", downs, len(blocks))
        if any(d < 8 for d in dims):
            raise ArchArgumentError("dims", f"needs widths >= 8 (the depth-wise branches take 1/8), got {dims}")
        chans = [in_ch, *dims]
        self.stages = nn.Sequential(*(_Stage2(chans[i], chans[i + 1], blocks[i], downs[i])
                                      for i in range(len(blocks))))
        self.head = nn.Sequential(spectral_norm(nn.Linear(dims[-1], dims[-1] * 4)), nn.Mish(True),
                                  nn.Linear(dims[-1] * 4, dims[-1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(x))


# ----------------------------------------------------------------------------- MetaGAN3 (traiNNer-redux)

class _DilatedContext(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=2, dilation=2, groups=dim)
        self.conv4 = nn.Conv2d(dim, dim, 3, padding=4, dilation=4, groups=dim)
        self.conv8 = nn.Conv2d(dim, dim, 3, padding=8, dilation=8, groups=dim)
        self.fuse = nn.Conv2d(dim * 3, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fuse(torch.cat((self.conv2(x), self.conv4(x), self.conv8(x)), dim=1))


class _ShiftConv(nn.Module):
    """The map and its four one-pixel shifts (zero-filled), fused by a 1x1 conv."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fuse = nn.Conv2d(dim * 5, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fuse(torch.cat((x, F.pad(x[..., 1:], (0, 1)), F.pad(x[..., :-1], (1, 0)),
                                    F.pad(x[..., 1:, :], (0, 0, 0, 1)), F.pad(x[..., :-1, :], (0, 0, 1, 0))), dim=1))


class _GatedConv3(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(1, dim)
        self.conv1 = _sn_conv(dim, dim * 2, 1)
        self.depthwise = _InceptionDW(dim)
        self.conv2 = _sn_conv(dim * 2, dim, 1)
        self.split = [dim, dim]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        i, c = torch.split(self.conv1(self.norm(x)), self.split, dim=1)
        return x + self.conv2(torch.cat((i, self.depthwise(c)), dim=1))


class _DualPath(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.local = _GatedConv3(dim)
        self.global_context = _DilatedContext(dim)
        self.shift = _ShiftConv(dim)
        self.fusion = nn.Conv2d(dim * 3, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fusion(torch.cat((self.local(x), self.global_context(x), self.shift(x)), dim=1))


class _Stem3(nn.Module):
    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv1 = _sn_conv(cin, cout // 2, 3, 2, 1)
        self.act = nn.SiLU()
        self.conv2 = _sn_conv(cout // 2, cout, 3, 2, 1)
        self.norm = nn.GroupNorm(1, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv2(self.act(self.conv1(x))))


class _DownBlock3(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int) -> None:
        super().__init__()
        self.down = _sn_conv(cin, cout, 3, 2, 1)
        self.blocks = nn.Sequential(*(_DualPath(cout) for _ in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.down(x))


@ARCH_REGISTRY.register()
class MetaGAN3(nn.Module):
    """traiNNer-redux's MetaGAN3: a 4x stem, then ``len(blocks) - 1`` stride-2 stages of dual-path blocks (gated
    inception conv, dilated context, shift conv); returns the last stage's (B, dims[-2], H/32, W/32) map at the
    defaults. As the reference, ``blocks[-1]`` and ``dims[-1]`` build nothing.

    Args:
        in_ch: image channels. dims: widths (stem, then stages). blocks: dual-path blocks per stage.
    """

    def __init__(self, in_ch: int = 3, dims: Sequence[int] = (64, 128, 192, 256),
                 blocks: Sequence[int] = (2, 3, 5, 2)) -> None:
        super().__init__()
        _positive("in_ch", in_ch)
        blocks = _int_list("blocks", blocks, minimum=0)
        dims = _int_list("dims", dims)
        if len(dims) < len(blocks):
            raise ArchArgumentError("dims", f"needs at least {len(blocks)} widths (one per blocks entry), got {dims}")
        if any(d < 8 for d in dims):
            raise ArchArgumentError("dims", f"needs widths >= 8 (the depth-wise branches take 1/8), got {dims}")
        self.stem = _Stem3(in_ch, dims[0])
        self.stages = nn.Sequential(*(_DownBlock3(dims[i], dims[i + 1], blocks[i]) for i in range(len(blocks) - 1)))
        self.apply(_trunc_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))


# ----------------------------------------------------------------------------- metagan (neosr)

class _Attention(nn.Module):
    """Multi-head self-attention over all positions of a (B, H, W, C) map (32-channel heads, no biases)."""

    def __init__(self, dim: int, head_dim: int = 32) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.num_heads = max(dim // head_dim, 1)
        self.attention_dim = self.num_heads * head_dim
        self.qkv = nn.Linear(dim, self.attention_dim * 3, bias=False)
        self.proj = nn.Linear(self.attention_dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, h * w, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)  # scale head_dim ** -0.5, the default
        return self.proj(x.transpose(1, 2).reshape(b, h, w, self.attention_dim))


class _DW7(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class _GatedBlockN(nn.Module):
    """neosr's gated CNN block on (B, H, W, C): RMSNorm, linear, Mish gate, a 7x7 depth-wise conv (or attention,
    with expansion 1.5) on the conv part, linear back, drop path, residual."""

    def __init__(self, dim: int, att: bool, drop_path: float) -> None:
        super().__init__()
        hidden = int((1.5 if att else 8 / 3) * dim)
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.fc1 = nn.Linear(dim, hidden * 2)
        self.act = nn.Mish()
        self.split = [hidden, hidden - dim, dim]
        self.conv = _Attention(dim) if att else _DW7(dim)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.apply(_trunc_init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, i, c = torch.split(self.fc1(self.norm(x)), self.split, dim=-1)
        return x + self.drop_path(self.fc2(self.act(g) * torch.cat((i, self.conv(c)), dim=-1)))


def _down_n(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(_sn_conv(cin, cout, 3, 2, 1), nn.GroupNorm(4, cout))


class _StageN(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int, down: int, att: bool, drops: list[float]) -> None:
        super().__init__()
        self.down = _down_n(cin, cout) if down == 2 else nn.Sequential(
            _down_n(cin, cout // 2), nn.Mish(inplace=True), _down_n(cout // 2, cout))
        self.blocks = nn.Sequential(*(_GatedBlockN(cout, att, drops[j]) for j in range(blocks)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.down(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


@ARCH_REGISTRY.register()
class MetaGAN(nn.Module):
    """neosr's ``metagan``: four gated-CNN stages (7x7 depth-wise mixing in the first two, self-attention in the
    last two; GroupNorm(4) spectral-normalised downsamplers, two where ``downs`` is not 2), then a 1x1 conv head
    (100 channels, Mish, dropout ``end_drop``) to ``n_class`` logits per position (H/32 x W/32 at the defaults).

    Args:
        in_ch: image channels. n_class: output channels. dims: stage widths (multiples of 8). blocks: blocks per
        stage. downs: 2 for one stride-2 conv, else two. drop_path: stochastic depth rising to this.
        end_drop: dropout before the last conv.
    """

    def __init__(self, in_ch: int = 3, n_class: int = 1, dims: Sequence[int] = (48, 96, 192, 288),
                 blocks: Sequence[int] = (3, 3, 9, 3), downs: Sequence[int] = (4, 4, 2, 2),
                 drop_path: float = 0.02, end_drop: float = 0.2) -> None:
        super().__init__()
        _positive("in_ch", in_ch)
        _positive("n_class", n_class)
        blocks = _int_list("blocks", blocks, minimum=0)
        dims = _int_list("dims", dims, len(blocks))
        downs = _int_list("downs", downs, len(blocks))
        for i, (d, s) in enumerate(zip(dims, downs, strict=True)):
            if d % 4 or (s != 2 and d % 8):
                raise ArchArgumentError("dims", f"needs multiples of 4 (8 where downs is not 2: GroupNorm(4) of "
                                                f"half the width), got {dims[i]}")
        for name, v in (("drop_path", drop_path), ("end_drop", end_drop)):
            if not isinstance(v, int | float) or not 0 <= v < 1:
                raise ArchArgumentError(name, f"needs a rate in [0, 1), got {v!r}")
        total = sum(blocks)
        rates = [drop_path * k / (total - 1) if total > 1 else 0.0 for k in range(total)]
        chans = [in_ch, *dims]
        stages: list[nn.Module] = []
        start = 0
        for i, n in enumerate(blocks):
            stages.append(_StageN(chans[i], chans[i + 1], n, downs[i], i > 1, rates[start:start + n]))
            start += n
        stages += [_sn_conv(dims[-1], 100, 1), nn.Mish(inplace=True), nn.Dropout(end_drop), _sn_conv(100, n_class, 1)]
        self.stages = nn.Sequential(*stages)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(x)

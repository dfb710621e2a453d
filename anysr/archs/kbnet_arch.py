"""KBNet: kernel basis network for image restoration (Zhang et al., "KBNet: Kernel Basis Network for Image
Restoration", 2023): the U-Net ``KBNet_s`` and the Restormer-shaped ``KBNet_l``.

Module names and constructor arguments follow spandrel 0.4.2's ``KBNet_s`` / ``KBNet_l``, so released checkpoints
(denoising, deraining, deblurring) load with ``strict=True`` and give the same output. ``KBNet_s`` is a NAFNet-like
U-Net: a 3x3 stem, encoder
stages of KB blocks each followed by a stride-2 2x2 conv, middle blocks, decoder stages after a 1x1 conv and a
pixel shuffle plus the encoder's map, a 3x3 conv back to the image, plus the input.

A KB block applies *kernel basis attention* (KBA): every pixel mixes its ``k x k`` neighbourhood with a per-pixel
kernel, a blend (by ``nset`` predicted coefficients) of ``nset`` learned grouped kernels and biases; the result is
gated by a depth-wise branch and channel attention, then a gated feed-forward follows. Here KBA is plain tensor
algebra (the neighbourhoods from padded slices rather than ``unfold``, autograd instead of the reference's
hand-written backward): the same numbers, and it runs on XLA and exports to ONNX.

Size requirement: none. ``KBNet_s`` zero-pads the input at the bottom / right to ``2 ** len(enc_blk_nums)`` (as
the reference pads) and crops the output; ``KBNet_l`` pads to 8 (see its class).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, pad_bottom_right
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY


class SimpleGate(nn.Module):
    """The first half of the channels times the second."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=1)
        return a * b


def neighbourhoods(x: torch.Tensor, k: int) -> torch.Tensor:
    """(b, c, h, w) -> (b, c, k*k, h, w): each pixel's zero-padded ``k x k`` neighbourhood, row-major (the values and
    order of ``F.unfold(x, k, padding=k // 2)``)."""
    h, w = x.shape[-2:]
    p = k // 2
    padded = F.pad(x, (p, p, p, p))
    return torch.stack([padded[:, :, i:i + h, j:j + w] for i in range(k) for j in range(k)], dim=2)


def kernel_basis_attention(x: torch.Tensor, att: torch.Tensor, k: int, groups: int, bias: torch.Tensor,
                           weight: torch.Tensor) -> torch.Tensor:
    """Per pixel, ``sum_s att_s * (W_s * neighbourhood + b_s)`` with grouped kernels ``W_s``.

    ``x``: (b, c, h, w); ``att``: (b, nset, h, w) coefficients; ``bias``: (1, nset, c); ``weight``: (1, nset,
    c * (c / groups) * k * k), each set's kernel as (group, output channel, input channel, tap).
    """
    b, c, h, w = x.shape
    nset, cg, taps = att.shape[1], c // groups, k * k
    coeff = att.reshape(b, nset, h * w).transpose(1, 2)  # (b, hw, nset)
    kernels = (coeff @ weight).reshape(b, h * w, groups, cg, cg * taps)
    patches = neighbourhoods(x, k).reshape(b, groups, cg * taps, h * w).permute(0, 3, 1, 2).unsqueeze(-1)
    out = (kernels @ patches).reshape(b, h * w, c) + coeff @ bias
    return out.transpose(1, 2).reshape(b, c, h, w)


class KBBlock_s(nn.Module):  # noqa: N801 - the original's module name
    """KB block: ``y = x + beta * conv3(KBA-gated(norm1(x)))``, then ``y + gamma * conv5(gate(conv4(norm2(y))))``."""

    def __init__(self, c: int, DW_Expand: int = 2, FFN_Expand: int = 2, nset: int = 32, k: int = 3,  # noqa: N803
                 gc: int = 4, lightweight: bool = False) -> None:
        super().__init__()
        self.k, self.c, self.nset = k, c, nset
        dw_ch, ffn_ch = int(c * DW_Expand), int(FFN_Expand * c)
        self.g = c // gc
        self.w = nn.Parameter(torch.zeros(1, nset, c * c // self.g * k**2))
        self.b = nn.Parameter(torch.zeros(1, nset, c))
        nn.init.kaiming_uniform_(self.w, a=math.sqrt(5))
        bound = 1 / math.sqrt(nn.init._calculate_fan_in_and_fan_out(self.w)[0])
        nn.init.uniform_(self.b, -bound, bound)
        self.norm1 = LayerNorm2d(c)
        self.norm2 = LayerNorm2d(c)
        self.sca = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c, 1))
        if lightweight:
            self.conv11 = nn.Sequential(nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 3, 1, 1, groups=c))
        else:
            self.conv11 = nn.Sequential(nn.Conv2d(c, c, 1), nn.Conv2d(c, c, 5, 1, 2, groups=c // 4))
        self.conv1 = nn.Conv2d(c, c, 1)
        self.conv21 = nn.Conv2d(c, c, 3, 1, 1, groups=c)
        interc = min(c, 32)
        self.conv2 = nn.Sequential(nn.Conv2d(c, interc, 3, 1, 1, groups=interc), SimpleGate(),
                                   nn.Conv2d(interc // 2, nset, 1))
        self.conv211 = nn.Conv2d(c, nset, 1)
        self.conv3 = nn.Conv2d(dw_ch // 2, c, 1)
        self.conv4 = nn.Conv2d(c, ffn_ch, 1)
        self.conv5 = nn.Conv2d(ffn_ch // 2, c, 1)
        self.ga1 = nn.Parameter(torch.full((1, c, 1, 1), 1e-2))
        self.attgamma = nn.Parameter(torch.full((1, nset, 1, 1), 1e-2))
        self.sg = SimpleGate()
        self.beta = nn.Parameter(torch.full((1, c, 1, 1), 1e-2))
        self.gamma = nn.Parameter(torch.full((1, c, 1, 1), 1e-2))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        x = self.norm1(inp)
        sca = self.sca[1](x.mean(dim=(2, 3), keepdim=True))  # the adaptive pool as a mean: the same numbers
        x1 = self.conv11(x)
        att = self.conv2(x) * self.attgamma + self.conv211(x)
        uf = self.conv21(self.conv1(x))
        x = kernel_basis_attention(uf, att, self.k, self.g, self.b, self.w) * self.ga1 + uf
        y = inp + self.conv3(x * x1 * sca) * self.beta
        return y + self.conv5(self.sg(self.conv4(self.norm2(y)))) * self.gamma


@ARCH_REGISTRY.register()
class KBNet_s(nn.Module):  # noqa: N801 - the original's class name
    """KBNet's U-Net (see the module docstring)."""

    def __init__(self, *, img_channel: int = 3, width: int = 64, middle_blk_num: int = 12,
                 enc_blk_nums: Sequence[int] = (2, 2, 4, 8), dec_blk_nums: Sequence[int] = (2, 2, 2, 2),
                 lightweight: bool = False, ffn_scale: int = 2) -> None:
        super().__init__()
        if len(enc_blk_nums) != len(dec_blk_nums):
            raise ArchArgumentError("dec_blk_nums", f"KBNet_s needs one decoder stage per encoder stage: "
                                    f"enc_blk_nums {list(enc_blk_nums)}, dec_blk_nums {list(dec_blk_nums)}")
        stages = [width * 2**i for i in range(len(enc_blk_nums) + 1)]
        if width < 4 or width % 4 or any(c > 32 and c % 32 for c in stages):
            raise ArchArgumentError("width", f"KBNet_s needs a width that is a multiple of 4 whose stage widths "
                                    f"{stages} are each at most 32 or a multiple of 32 (its grouped convs), not "
                                    f"{width}")
        self.num_in_ch = img_channel
        self.intro = nn.Conv2d(img_channel, width, 3, 1, 1)
        self.ending = nn.Conv2d(width, img_channel, 3, 1, 1)
        self.encoders, self.downs, self.ups, self.decoders = (nn.ModuleList() for _ in range(4))
        chan = width
        for num in enc_blk_nums:
            self.encoders.append(nn.Sequential(*[KBBlock_s(chan, FFN_Expand=ffn_scale, lightweight=lightweight)
                                                 for _ in range(num)]))
            self.downs.append(nn.Conv2d(chan, 2 * chan, 2, 2))
            chan *= 2
        self.middle_blks = nn.Sequential(*[KBBlock_s(chan, FFN_Expand=ffn_scale, lightweight=lightweight)
                                           for _ in range(middle_blk_num)])
        for num in dec_blk_nums:
            self.ups.append(nn.Sequential(nn.Conv2d(chan, chan * 2, 1, bias=False), nn.PixelShuffle(2)))
            chan //= 2
            self.decoders.append(nn.Sequential(*[KBBlock_s(chan, FFN_Expand=ffn_scale, lightweight=lightweight)
                                                 for _ in range(num)]))
        self.padder_size = 2 ** len(self.encoders)
        self.tile_multiple = self.padder_size

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        h, w = inp.shape[-2:]
        m = self.padder_size
        inp = F.pad(inp, (0, (-w) % m, 0, (-h) % m))
        x = self.intro(inp)
        skips = []
        for encoder, down in zip(self.encoders, self.downs, strict=True):
            x = encoder(x)
            skips.append(x)
            x = down(x)
        x = self.middle_blks(x)
        for decoder, up, skip in zip(self.decoders, self.ups, skips[::-1], strict=True):
            x = decoder(up(x) + skip)
        return (self.ending(x) + inp)[:, :, :h, :w]


class TransAttention(nn.Module):
    """Transposed (channel x channel) attention per head over L2-normalised q / k, scaled by a learned
    temperature (Restormer's MDTA), fused."""

    def __init__(self, dim: int, num_heads: int, bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.qkv = nn.Conv2d(dim, dim * 3, 1, bias=bias)
        self.qkv_dwconv = nn.Conv2d(dim * 3, dim * 3, 3, 1, 1, groups=dim * 3, bias=bias)
        self.project_out = nn.Conv2d(dim, dim, 1, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        nh = self.num_heads
        q, k, v = self.qkv_dwconv(self.qkv(x)).reshape(b, 3, nh, c // nh, h * w).unbind(1)
        q = F.normalize(q, dim=-1) * self.temperature.to(q.dtype)
        out = F.scaled_dot_product_attention(q, F.normalize(k, dim=-1), v, scale=1.0)
        return self.project_out(out.reshape(b, c, h, w))


class MFF(nn.Module):
    """KBNet_l's feed-forward: a depth-wise branch (GELU) times a KBA branch, times channel attention."""

    def __init__(self, dim: int, ffn_expansion_factor: float, bias: bool, act: bool = True, gc: int = 2,
                 nset: int = 32, k: int = 3) -> None:
        super().__init__()
        self.act, self.k, self.nset = act, k, nset
        hidden = int(dim * ffn_expansion_factor)
        self.dwconv = nn.Sequential(nn.Conv2d(dim, hidden, 1, bias=bias),
                                    nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden, bias=bias))
        self.project_out = nn.Conv2d(hidden, dim, 1, bias=bias)
        self.sca = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(dim, hidden, 1))
        self.conv1 = nn.Sequential(nn.Conv2d(dim, hidden, 1, bias=bias),
                                   nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden, bias=bias))
        self.g = hidden // gc
        self.w = nn.Parameter(torch.zeros(1, nset, hidden * hidden // self.g * k**2))
        self.b = nn.Parameter(torch.zeros(1, nset, hidden))
        nn.init.kaiming_uniform_(self.w, a=math.sqrt(5))
        bound = 1 / math.sqrt(nn.init._calculate_fan_in_and_fan_out(self.w)[0])
        nn.init.uniform_(self.b, -bound, bound)
        interc = min(dim, 24)
        self.conv2 = nn.Sequential(nn.Conv2d(dim, interc, 3, 1, 1, groups=interc), SimpleGate(),
                                   nn.Conv2d(interc // 2, nset, 1))
        self.conv211 = nn.Conv2d(dim, nset, 1)
        self.attgamma = nn.Parameter(torch.full((1, nset, 1, 1), 1e-2))
        self.ga1 = nn.Parameter(torch.full((1, hidden, 1, 1), 1e-2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sca = self.sca[1](x.mean(dim=(2, 3), keepdim=True))
        x1 = self.dwconv(x)
        att = self.conv2(x) * self.attgamma + self.conv211(x)
        uf = self.conv1(x)
        x2 = kernel_basis_attention(uf, att, self.k, self.g, self.b, self.w) * self.ga1 + uf
        y = F.gelu(x1) * x2 if self.act else x1 * x2
        return self.project_out(y * sca)


class KBBlock_l(nn.Module):  # noqa: N801 - the original's module name
    """``x + attn(norm1(x))`` (the MFF, under the reference's name ``attn``), then ``x + ffn(norm2(x))`` (the
    transposed attention, under ``ffn``)."""

    def __init__(self, dim: int, num_heads: int, ffn_expansion_factor: float, bias: bool) -> None:
        super().__init__()
        self.norm1 = LayerNorm2d(dim)
        self.ffn = TransAttention(dim, num_heads, bias)
        self.norm2 = LayerNorm2d(dim)
        self.attn = MFF(dim, ffn_expansion_factor, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.ffn(self.norm2(x))


@ARCH_REGISTRY.register()
class KBNet_l(nn.Module):  # noqa: N801 - the original's class name
    """KBNet's Restormer-shaped variant: three x2 levels (3x3 conv + pixel-unshuffle down, 3x3 conv + pixel-shuffle
    up, 1x1 channel reductions after the skips), refinement blocks, a 3x3 conv plus the input. The reference takes
    sides that are multiples of 8; here any input is padded at the bottom / right to 8 (reflection, edge
    replication past the side) and the output cropped."""

    def __init__(self, *, inp_channels: int = 3, out_channels: int = 3, dim: int = 48,
                 num_blocks: Sequence[int] = (4, 6, 6, 8), num_refinement_blocks: int = 4,
                 heads: Sequence[int] = (1, 2, 4, 8), ffn_expansion_factor: float = 1.5, bias: bool = False) -> None:
        super().__init__()
        if len(num_blocks) != 4 or len(heads) != 4:
            raise ArchArgumentError("num_blocks", f"KBNet_l needs 4 num_blocks and 4 heads, not {len(num_blocks)} "
                                    f"and {len(heads)}")
        dims = [dim, dim * 2, dim * 4, dim * 8]
        for d, h in [*zip(dims, heads, strict=True), (dim * 2, heads[0])]:
            if h < 1 or d % h or (d > 24 and d % 24):
                raise ArchArgumentError("dim", f"KBNet_l's level widths {dims} must each be a multiple of their "
                                        f"heads {list(heads)} and at most 24 or a multiple of 24 (its grouped "
                                        f"convs); dim {dim} does not fit")
        self.num_in_ch = inp_channels
        self.tile_multiple = 8

        def level(width: int, n: int, h: int) -> nn.Sequential:
            return nn.Sequential(*[KBBlock_l(width, h, ffn_expansion_factor, bias) for _ in range(n)])

        def down(width: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(width, width // 2, 3, 1, 1, bias=False), nn.PixelUnshuffle(2))

        def up(width: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(width, width * 2, 3, 1, 1, bias=False), nn.PixelShuffle(2))

        self.patch_embed = _Body(nn.Conv2d(inp_channels, dim, 3, 1, 1, bias=False), "proj")  # bias-free there
        self.encoder_level1 = level(dims[0], num_blocks[0], heads[0])
        self.down1_2 = _Body(down(dims[0]))
        self.encoder_level2 = level(dims[1], num_blocks[1], heads[1])
        self.down2_3 = _Body(down(dims[1]))
        self.encoder_level3 = level(dims[2], num_blocks[2], heads[2])
        self.down3_4 = _Body(down(dims[2]))
        self.latent = level(dims[3], num_blocks[3], heads[3])
        self.up4_3 = _Body(up(dims[3]))
        self.reduce_chan_level3 = nn.Conv2d(dims[3], dims[2], 1, bias=bias)
        self.decoder_level3 = level(dims[2], num_blocks[2], heads[2])
        self.up3_2 = _Body(up(dims[2]))
        self.reduce_chan_level2 = nn.Conv2d(dims[2], dims[1], 1, bias=bias)
        self.decoder_level2 = level(dims[1], num_blocks[1], heads[1])
        self.up2_1 = _Body(up(dims[1]))
        self.decoder_level1 = level(dims[1], num_blocks[0], heads[0])
        self.refinement = level(dims[1], num_refinement_blocks, heads[0])
        self.output = nn.Conv2d(dims[1], out_channels, 3, 1, 1, bias=bias)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        h, w = inp.shape[-2:]
        inp = pad_bottom_right(inp, (-h) % 8, (-w) % 8)
        enc1 = self.encoder_level1(self.patch_embed(inp))
        enc2 = self.encoder_level2(self.down1_2(enc1))
        enc3 = self.encoder_level3(self.down2_3(enc2))
        x = self.latent(self.down3_4(enc3))
        x = self.decoder_level3(self.reduce_chan_level3(torch.cat([self.up4_3(x), enc3], 1)))
        x = self.decoder_level2(self.reduce_chan_level2(torch.cat([self.up3_2(x), enc2], 1)))
        x = self.refinement(self.decoder_level1(torch.cat([self.up2_1(x), enc1], 1)))
        return (self.output(x) + inp)[:, :, :h, :w]


class _Body(nn.Module):
    """One module under the reference's attribute name (``body`` or ``proj``)."""

    def __init__(self, module: nn.Module, name: str = "body") -> None:
        super().__init__()
        self.name = name
        self.add_module(name, module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self, self.name)(x)


def _recognise(s: StateShapes) -> dict[str, object]:
    """KBNet_s from its tensors: image channels, width, blocks per stage, the FFN width and the light 3x3 branch."""
    width = s.dim("intro.weight", 0)
    first = next((k for k in s.keys() if k.endswith(".conv4.weight")), None)
    if first is None:
        raise NotThisFamily("no KB block")
    first = first[: -len("conv4.weight")]
    c = s.dim(first + "conv4.weight", 1)
    return {"img_channel": s.dim("intro.weight", 1), "width": width,
            "middle_blk_num": s.count("middle_blks."),
            "enc_blk_nums": [s.count(f"encoders.{i}.") for i in range(s.count("downs."))],
            "dec_blk_nums": [s.count(f"decoders.{i}.") for i in range(s.count("ups."))],
            "lightweight": s.dim(first + "conv11.1.weight", 2) == 3,
            "ffn_scale": s.dim(first + "conv4.weight", 0) // c}


register_recogniser("KBNet_s", _recognise)


def _recognise_l(s: StateShapes) -> dict[str, object]:
    """KBNet_l from its tensors: channels, width, blocks and heads per level (a level with no blocks shows no
    heads: 1), the MFF width and the conv biases."""
    dim = s.dim("patch_embed.proj.weight", 0)
    levels = ("encoder_level1", "encoder_level2", "encoder_level3", "latent")
    seen = {0: ("encoder_level1", "decoder_level1", "refinement"), 1: ("encoder_level2", "decoder_level2"),
            2: ("encoder_level3", "decoder_level3"), 3: ("latent",)}
    heads = [next((s.dim(f"{n}.0.ffn.temperature", 0) for n in names if f"{n}.0.ffn.temperature" in s), 1)
             for names in seen.values()]
    project = next((k for k in s.keys() if k.endswith(".attn.project_out.weight")), None)
    if project is None:
        raise NotThisFamily("no KB block")
    widths = {"encoder_level1": 1, "encoder_level2": 2, "encoder_level3": 4, "latent": 8, "decoder_level3": 4,
              "decoder_level2": 2, "decoder_level1": 2, "refinement": 2}
    scale = widths[project.split(".", 1)[0]]
    return {"inp_channels": s.dim("patch_embed.proj.weight", 1), "out_channels": s.dim("output.weight", 0),
            "dim": dim, "num_blocks": [s.count(f"{n}.") for n in levels],
            "num_refinement_blocks": s.count("refinement."), "heads": heads,
            "ffn_expansion_factor": s.dim(project, 1) / (dim * scale), "bias": "output.bias" in s}


register_recogniser("KBNet_l", _recognise_l)

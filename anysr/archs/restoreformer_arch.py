"""RestoreFormer and RestoreFormer++: blind face restoration with multi-head cross-attention over a face codebook.

"RestoreFormer: High-Quality Blind Face Restoration from Undegraded Key-Value Pairs" (Wang, Wu, Li, Dong, Shan,
Lin; CVPR 2022) and "RestoreFormer++: Towards Real-World Blind Face Restoration from Undegraded Key-Value Pairs"
(Wang, Li, Zhang, Wu, Shan, Lin; TPAMI 2023). Module names and constructor arguments follow the authors' code
(RestoreFormer as spandrel 0.4.2 carries it; RestoreFormer++ as wzhouxiff/RestoreFormerPlusPlus's
``VQVAEGANMultiHeadTransformer``, of which the 2022 model is the case ``ex_multi_scale_num=0``), so the released
checkpoints load with ``strict=True`` and give the same output.

A VQGAN-style encoder (GroupNorm-Swish residual blocks, strided-conv downsampling, multi-head self-attention at
``attn_resolutions`` and in the middle) maps the degraded face to a latent grid that is snapped to the nearest
entries of a learned codebook (``n_embed`` x ``embed_dim``, frozen by default). The decoder mirrors the encoder;
its attention blocks are cross-attentions whose queries come from the encoder's (degraded) features at the same
level and whose keys / values come from the decoded high-quality priors. RestoreFormer++ adds cross-attentions at
a larger size (``ex_multi_scale_num``: the authors' rule replaces the decoder's sizes by ``[attn_resolutions[0],
attn_resolutions[-1] * 2 ** ex_multi_scale_num]``, 16 and 32 in the released model).

Images are in [-1, 1] (the authors normalise with mean 0.5, std 0.5). Size requirement: a multiple of
``2 ** (len(ch_mult) - 1)`` (32 for the released 512x512 models); other sizes are padded by reflection /
replication inside ``forward`` and the output cropped.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, nearest_upsample, pad_to_multiple
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY


def group_norm(channels: int) -> nn.GroupNorm:
    """GroupNorm with 32 groups and eps 1e-6 (the VQGAN normalisation)."""
    if channels % 32:
        raise ArchArgumentError("ch", f"RestoreFormer normalises with 32 groups: every width (ch * ch_mult) must be "
                                f"a multiple of 32, got {channels}")
    return nn.GroupNorm(32, channels, eps=1e-6, affine=True)


class VectorQuantizer(nn.Module):
    """Nearest-codebook-entry quantisation with a straight-through gradient. Parameter ``embedding.weight``
    (n_e, e_dim). ``forward`` returns (quantised map, codebook + commitment loss, (perplexity, one-hot codes,
    indices, distances)) as the authors' module."""

    def __init__(self, n_e: int, e_dim: int, beta: float) -> None:
        super().__init__()
        self.n_e, self.e_dim, self.beta = n_e, e_dim, beta
        self.embedding = nn.Embedding(n_e, e_dim)
        nn.init.uniform_(self.embedding.weight, -1.0 / n_e, 1.0 / n_e)

    def distances(self, z_flat: torch.Tensor) -> torch.Tensor:
        """Squared distance of every vector (n, e_dim) to every codebook entry: (n, n_e), in float32 at least
        (also under autocast: a low-precision matmul would pick other codes)."""
        dtype = torch.promote_types(z_flat.dtype, torch.float32)
        device_type = z_flat.device.type
        outside = (torch.autocast(device_type, enabled=False) if torch.amp.is_autocast_available(device_type)
                   else contextlib.nullcontext())
        with outside:
            z32, codebook = z_flat.to(dtype), self.embedding.weight.to(dtype)
            return (z32.square().sum(1, keepdim=True) + codebook.square().sum(1)
                    - 2 * torch.matmul(z32, codebook.t()))

    def nearest(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(straight-through quantised map (b, c, h, w), codebook indices (b*h*w,), distances (b*h*w, n_e))."""
        z = z.permute(0, 2, 3, 1)  # (b, h, w, c)
        d = self.distances(z.reshape(-1, self.e_dim))
        indices = d.argmin(1)
        z_q = self.embedding(indices).to(z.dtype).view(z.shape)
        return (z + (z_q - z).detach()).permute(0, 3, 1, 2), indices, d

    def forward(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        z_q, indices, d = self.nearest(z)
        chosen = self.embedding(indices).to(z.dtype).view(z.shape[0], z.shape[2], z.shape[3], -1).permute(0, 3, 1, 2)
        loss = (chosen.detach() - z).square().mean() + self.beta * (chosen - z.detach()).square().mean()
        one_hot = F.one_hot(indices, self.n_e).to(z.dtype)
        usage = one_hot.mean(0)
        perplexity = torch.exp(-(usage * torch.log(usage + 1e-10)).sum())
        return z_q, loss, (perplexity, one_hot, indices[:, None], d)

    def get_codebook_entry(self, indices: torch.Tensor, shape: Sequence[int] | None) -> torch.Tensor:
        """Codebook vectors of ``indices``; with ``shape`` (b, h, w, c) as a (b, c, h, w) map."""
        z_q = self.embedding(indices)
        return z_q if shape is None else z_q.view(*shape).permute(0, 3, 1, 2)


def swish(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x)


class Upsample(nn.Module):
    """Nearest x2, then a 3x3 conv (``with_conv``)."""

    def __init__(self, in_channels: int, with_conv: bool) -> None:
        super().__init__()
        self.with_conv = with_conv
        if with_conv:
            self.conv = nn.Conv2d(in_channels, in_channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nearest_upsample(x, 2)
        return self.conv(x) if self.with_conv else x


class Downsample(nn.Module):
    """Halve the size: zero-pad bottom / right by one and a stride-2 3x3 conv (``with_conv``), else 2x2 mean."""

    def __init__(self, in_channels: int, with_conv: bool) -> None:
        super().__init__()
        self.with_conv = with_conv
        if with_conv:
            self.conv = nn.Conv2d(in_channels, in_channels, 3, 2, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.with_conv:
            return self.conv(F.pad(x, (0, 1, 0, 1)))
        return F.avg_pool2d(x, 2, 2)


class ResnetBlock(nn.Module):
    """norm-swish-conv, norm-swish-dropout-conv, plus the input (through a 1x1 ``nin_shortcut`` or a 3x3
    ``conv_shortcut`` when the width changes). No time embedding (``temb_channels`` 0)."""

    def __init__(self, *, in_channels: int, out_channels: int | None = None, conv_shortcut: bool = False,
                 dropout: float, temb_channels: int = 512) -> None:
        super().__init__()
        out_channels = in_channels if out_channels is None else out_channels
        self.in_channels, self.out_channels, self.use_conv_shortcut = in_channels, out_channels, conv_shortcut
        self.norm1 = group_norm(in_channels)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, 1, 1)
        if temb_channels > 0:
            self.temb_proj = nn.Linear(temb_channels, out_channels)
        self.norm2 = group_norm(out_channels)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1)
        if in_channels != out_channels:
            if conv_shortcut:
                self.conv_shortcut = nn.Conv2d(in_channels, out_channels, 3, 1, 1)
            else:
                self.nin_shortcut = nn.Conv2d(in_channels, out_channels, 1, 1, 0)

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None = None) -> torch.Tensor:
        h = self.conv1(swish(self.norm1(x)))
        if temb is not None:
            h = h + self.temb_proj(swish(temb))[:, :, None, None]
        h = self.conv2(self.dropout(swish(self.norm2(h))))
        if self.in_channels != self.out_channels:
            x = self.conv_shortcut(x) if self.use_conv_shortcut else self.nin_shortcut(x)
        return x + h


class MultiHeadAttnBlock(nn.Module):
    """Multi-head attention over the pixels of a map, with a residual: keys / values from ``norm1(x)``; queries
    from ``norm2(y)`` when a second map ``y`` is given (cross-attention), else from ``norm1(x)``.
    ``head_size`` is the number of heads (the authors' name)."""

    def __init__(self, in_channels: int, head_size: int = 1) -> None:
        super().__init__()
        if head_size < 1 or in_channels % head_size:
            raise ArchArgumentError("head_size", f"RestoreFormer: {in_channels} channels cannot be split into "
                                    f"{head_size} heads")
        self.in_channels, self.head_size, self.att_size = in_channels, head_size, in_channels // head_size
        self.norm1 = group_norm(in_channels)
        self.norm2 = group_norm(in_channels)
        self.q = nn.Conv2d(in_channels, in_channels, 1)
        self.k = nn.Conv2d(in_channels, in_channels, 1)
        self.v = nn.Conv2d(in_channels, in_channels, 1)
        self.proj_out = nn.Conv2d(in_channels, in_channels, 1)

    def heads(self, t: torch.Tensor) -> torch.Tensor:
        """(b, c, h, w) -> (b, heads, h*w, att_size)."""
        b, _, h, w = t.shape
        return t.reshape(b, self.head_size, self.att_size, h * w).transpose(2, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        kv = self.norm1(x)
        query = kv if y is None else self.norm2(y)
        b, c, h, w = x.shape
        out = F.scaled_dot_product_attention(self.heads(self.q(query)), self.heads(self.k(kv)), self.heads(self.v(kv)))
        return x + self.proj_out(out.transpose(2, 3).reshape(b, c, h, w))


def _level(blocks: list[nn.Module], attns: list[nn.Module]) -> nn.Module:
    level = nn.Module()
    level.block = nn.ModuleList(blocks)
    level.attn = nn.ModuleList(attns)
    return level


def _middle(width: int, dropout: float, head_size: int) -> nn.Module:
    mid = nn.Module()
    mid.block_1 = ResnetBlock(in_channels=width, out_channels=width, temb_channels=0, dropout=dropout)
    mid.attn_1 = MultiHeadAttnBlock(width, head_size)
    mid.block_2 = ResnetBlock(in_channels=width, out_channels=width, temb_channels=0, dropout=dropout)
    return mid


class MultiHeadEncoder(nn.Module):
    """The encoder; ``forward`` returns its features by name: 'in', 'block_<level>' (before each downsampling),
    'block_<last>_atten' (after the middle's first block), 'mid_atten' and 'out'."""

    def __init__(self, ch: int, out_ch: int, ch_mult: Sequence[int] = (1, 2, 4, 8), num_res_blocks: int = 2,
                 attn_resolutions: Sequence[int] = (16,), dropout: float = 0.0, resamp_with_conv: bool = True,
                 in_channels: int = 3, resolution: int = 512, z_channels: int = 256, double_z: bool = True,
                 enable_mid: bool = True, head_size: int = 1) -> None:
        super().__init__()
        self.ch, self.temb_ch = ch, 0
        self.num_resolutions, self.num_res_blocks = len(ch_mult), num_res_blocks
        self.resolution, self.in_channels, self.enable_mid = resolution, in_channels, enable_mid
        self.conv_in = nn.Conv2d(in_channels, ch, 3, 1, 1)
        res = resolution
        widths = [ch] + [ch * m for m in ch_mult]
        self.down = nn.ModuleList()
        for i, out_w in enumerate(widths[1:]):
            blocks, attns = [], []
            in_w = widths[i]
            for _ in range(num_res_blocks):
                blocks.append(ResnetBlock(in_channels=in_w, out_channels=out_w, temb_channels=0, dropout=dropout))
                in_w = out_w
                if res in attn_resolutions:
                    attns.append(MultiHeadAttnBlock(out_w, head_size))
            level = _level(blocks, attns)
            if i != self.num_resolutions - 1:
                level.downsample = Downsample(out_w, resamp_with_conv)
                res //= 2
            self.down.append(level)
        width = widths[-1]
        if enable_mid:
            self.mid = _middle(width, dropout, head_size)
        self.norm_out = group_norm(width)
        self.conv_out = nn.Conv2d(width, 2 * z_channels if double_z else z_channels, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        hs: dict[str, torch.Tensor] = {}
        h = self.conv_in(x)
        hs["in"] = h
        last = self.num_resolutions - 1
        for i, level in enumerate(self.down):
            for j, block in enumerate(level.block):
                h = block(h)
                if len(level.attn) > 0:
                    h = level.attn[j](h)
            if i != last:
                hs[f"block_{i}"] = h
                h = level.downsample(h)
        if self.enable_mid:
            h = self.mid.block_1(h)
            hs[f"block_{last}_atten"] = h
            h = self.mid.block_2(self.mid.attn_1(h))
            hs["mid_atten"] = h
        hs["out"] = self.conv_out(swish(self.norm_out(h)))
        return hs


class MultiHeadDecoderTransformer(nn.Module):
    """The decoder: its attention blocks attend from the encoder's features (``hs``) at the same level to the
    decoded priors."""

    def __init__(self, ch: int, out_ch: int, ch_mult: Sequence[int] = (1, 2, 4, 8), num_res_blocks: int = 2,
                 attn_resolutions: Sequence[int] = (16,), dropout: float = 0.0, resamp_with_conv: bool = True,
                 in_channels: int = 3, resolution: int = 512, z_channels: int = 256, give_pre_end: bool = False,
                 enable_mid: bool = True, head_size: int = 1) -> None:
        super().__init__()
        self.ch, self.temb_ch = ch, 0
        self.num_resolutions, self.num_res_blocks = len(ch_mult), num_res_blocks
        self.resolution, self.in_channels = resolution, in_channels
        self.give_pre_end, self.enable_mid = give_pre_end, enable_mid
        width = ch * ch_mult[-1]
        res = resolution // 2 ** (self.num_resolutions - 1)
        self.conv_in = nn.Conv2d(z_channels, width, 3, 1, 1)
        if enable_mid:
            self.mid = _middle(width, dropout, head_size)
        levels: list[nn.Module] = []
        last = self.num_resolutions - 1
        for i in reversed(range(self.num_resolutions)):
            out_w = ch * ch_mult[i]
            blocks, attns = [], []
            if res in attn_resolutions and i == last and not enable_mid:
                raise ArchArgumentError(
                    "attn_resolutions", f"RestoreFormer: the decoder's attention at the lowest level attends to the "
                    f"encoder's middle features, which exist only with enable_mid; resolution {res} is level {i}: "
                    "remove it from attn_resolutions or set enable_mid: true")
            for _ in range(num_res_blocks + 1):
                blocks.append(ResnetBlock(in_channels=width, out_channels=out_w, temb_channels=0, dropout=dropout))
                width = out_w
                if res in attn_resolutions:
                    attns.append(MultiHeadAttnBlock(width, head_size))
            level = _level(blocks, attns)
            if i != 0:
                level.upsample = Upsample(width, resamp_with_conv)
                res *= 2
            levels.insert(0, level)
        self.up = nn.ModuleList(levels)
        self.norm_out = group_norm(width)
        self.conv_out = nn.Conv2d(width, out_ch, 3, 1, 1)

    def forward(self, z: torch.Tensor, hs: dict[str, torch.Tensor] | None) -> torch.Tensor:
        """The decoded image; ``hs`` None: every attention block attends within the decoder's own features (the
        authors' ``MultiHeadDecoder`` of the HQ-dictionary network ``VQVAEGAN``, the same modules)."""
        h = self.conv_in(z)
        if self.enable_mid:
            h = self.mid.block_2(self.mid.attn_1(self.mid.block_1(h), None if hs is None else hs["mid_atten"]))
        last = self.num_resolutions - 1
        for i in reversed(range(self.num_resolutions)):
            level = self.up[i]
            # the encoder's features at this level: after the middle's first block at the lowest, else the level's
            # output before its downsampling (the authors' choice, by which names the encoder stored)
            query = hs[f"block_{i}_atten" if i == last else f"block_{i}"] if len(level.attn) > 0 and hs else None
            for j, block in enumerate(level.block):
                h = block(h)
                if len(level.attn) > 0:
                    h = level.attn[j](h, query)
            if i != 0:
                h = level.upsample(h)
        if self.give_pre_end:
            return h
        return self.conv_out(swish(self.norm_out(h)))


def decoder_attn_resolutions(attn_resolutions: Sequence[int], ex_multi_scale_num: int) -> tuple[int, ...]:
    """The sizes at which RestoreFormer++'s decoder attends: the authors' rule, applied ``ex_multi_scale_num`` times,
    replaces the list by its first entry and twice its last (``[16]`` -> ``[16, 32]`` -> ``[16, 64]``)."""
    out = tuple(attn_resolutions)
    for _ in range(ex_multi_scale_num):
        out = (out[0], out[-1] * 2)
    return out


@ARCH_REGISTRY.register()
class RestoreFormer(nn.Module):
    """RestoreFormer: encoder, codebook quantiser, cross-attending decoder; (b, 3, h, w) -> (b, 3, h, w) in
    [-1, 1].

    Args (keyword-only; defaults of the released RestoreFormer; the authors' ``VQVAEGANMultiHeadTransformer``):
        n_embed / embed_dim: codebook entries / width. ch: base width; ch_mult: width factor per level (one
        level per entry, halving the size between them). num_res_blocks: blocks per level. attn_resolutions:
        sizes (relative to ``resolution``) with attention. dropout: in the residual blocks. in_channels /
        out_ch: image channels. resolution: the training face size. z_channels: latent width; double_z: the
        encoder outputs twice that (the authors keep False). enable_mid: middle blocks with attention.
        fix_decoder / fix_codebook / fix_encoder: freeze parts (the codebook by default; fix_encoder also freezes
        quant_conv, as the authors' RestoreFormer++ code). head_size: heads.
        ex_multi_scale_num: RestoreFormer++'s extra decoder attention (``decoder_attn_resolutions``); 0: none.
    """

    image_range = (-1.0, 1.0)  # the authors' images; anysr's pipeline feeds [0, 1] (arch_util.unit_range)

    def __init__(self, *, n_embed: int = 1024, embed_dim: int = 256, ch: int = 64, out_ch: int = 3,
                 ch_mult: Sequence[int] = (1, 2, 2, 4, 4, 8), num_res_blocks: int = 2,
                 attn_resolutions: Sequence[int] = (16,), dropout: float = 0.0, in_channels: int = 3,
                 resolution: int = 512, z_channels: int = 256, double_z: bool = False, enable_mid: bool = True,
                 fix_decoder: bool = False, fix_codebook: bool = True, fix_encoder: bool = False,
                 head_size: int = 8, ex_multi_scale_num: int = 0) -> None:
        super().__init__()
        if not ch_mult:
            raise ArchArgumentError("ch_mult", "RestoreFormer needs at least one level in ch_mult")
        if double_z:
            raise ArchArgumentError("double_z", "RestoreFormer quantises z_channels features: with double_z the "
                                    "encoder's 2 * z_channels outputs do not fit quant_conv (the original fails too)")
        ch_mult, attn_resolutions = tuple(ch_mult), tuple(attn_resolutions)
        dec_attn = self._decoder_attn(attn_resolutions, ex_multi_scale_num, resolution, len(ch_mult))
        common = dict(ch=ch, out_ch=out_ch, ch_mult=ch_mult, num_res_blocks=num_res_blocks, dropout=dropout,
                      in_channels=in_channels, resolution=resolution, z_channels=z_channels, enable_mid=enable_mid,
                      head_size=head_size)
        self.encoder = MultiHeadEncoder(double_z=double_z, attn_resolutions=attn_resolutions, **common)
        self.decoder = MultiHeadDecoderTransformer(attn_resolutions=dec_attn, **common)
        self.quantize = VectorQuantizer(n_embed, embed_dim, beta=0.25)
        self.quant_conv = nn.Conv2d(z_channels, embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(embed_dim, z_channels, 1)
        self.in_channels = in_channels
        self.tile_multiple = 2 ** (len(ch_mult) - 1)
        if fix_decoder:
            for module in (self.decoder, self.post_quant_conv, self.quantize):
                module.requires_grad_(False)
        elif fix_codebook:
            self.quantize.requires_grad_(False)
        if fix_encoder:
            for module in (self.encoder, self.quant_conv):
                module.requires_grad_(False)

    @staticmethod
    def _decoder_attn(attn_resolutions: tuple[int, ...], ex_multi_scale_num: int, resolution: int,
                      levels: int) -> tuple[int, ...]:
        """The decoder's attention sizes, refused in one line when ``ex_multi_scale_num`` adds none."""
        if ex_multi_scale_num < 0:
            raise ArchArgumentError("ex_multi_scale_num", f"RestoreFormer: ex_multi_scale_num must be 0 or more, "
                                    f"got {ex_multi_scale_num}")
        if not ex_multi_scale_num:
            return attn_resolutions
        if not attn_resolutions:
            raise ArchArgumentError("ex_multi_scale_num", "RestoreFormer++: the extra attention doubles the last "
                                    "entry of attn_resolutions, which is empty: give attn_resolutions or set "
                                    "ex_multi_scale_num: 0")
        sizes = [(resolution // 2 ** (levels - 1)) * 2 ** i for i in range(levels)]
        dec_attn = decoder_attn_resolutions(attn_resolutions, ex_multi_scale_num)
        if dec_attn[-1] not in sizes:
            raise ArchArgumentError("ex_multi_scale_num", f"RestoreFormer++: ex_multi_scale_num {ex_multi_scale_num} "
                                    f"puts the extra attention at size {dec_attn[-1]}, where the decoder has no level "
                                    f"(its levels: {sizes[::-1]}); lower ex_multi_scale_num")
        return dec_attn

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...],
                                                dict[str, torch.Tensor]]:
        """(quantised latents, codebook loss, quantiser info, the encoder's named features)."""
        hs = self.encoder(x)
        quant, emb_loss, info = self.quantize(self.quant_conv(hs["out"]))
        return quant, emb_loss, info, hs

    def decode(self, quant: torch.Tensor, hs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(quant), hs if self.cross_attention else None)

    cross_attention = True  # the decoder attends from the encoder's features (False: VQVAEGAN's self-attention)

    def forward(self, x: torch.Tensor, return_loss: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The restored face (the authors return ``(face, None)``; the face alone here); with ``return_loss``
        ``(face, codebook loss)``, the authors' training forward (codebook + commitment loss of the quantiser)."""
        h, w = x.shape[-2:]
        x, pad_h, pad_w = pad_to_multiple(x, self.tile_multiple)
        hs = self.encoder(x)
        if return_loss:
            quant, loss, _ = self.quantize(self.quant_conv(hs["out"]))
        else:
            quant, _, _ = self.quantize.nearest(self.quant_conv(hs["out"]))
        out = self.decode(quant, hs)
        out = out[..., :h, :w] if (pad_h or pad_w) else out
        return (out, loss) if return_loss else out


@ARCH_REGISTRY.register()
class RestoreFormerPlusPlus(RestoreFormer):
    """RestoreFormer++ (TPAMI 2023): ``RestoreFormer`` with the defaults of the authors'
    ``VQVAEGANMultiHeadTransformer`` and of their released model (``head_size`` 4, ``ex_multi_scale_num`` 1: the
    decoder also cross-attends at size 32, with the encoder's features there); the same arguments and names."""

    def __init__(self, *, n_embed: int = 1024, embed_dim: int = 256, ch: int = 64, out_ch: int = 3,
                 ch_mult: Sequence[int] = (1, 2, 2, 4, 4, 8), num_res_blocks: int = 2,
                 attn_resolutions: Sequence[int] = (16,), dropout: float = 0.0, in_channels: int = 3,
                 resolution: int = 512, z_channels: int = 256, double_z: bool = False, enable_mid: bool = True,
                 fix_decoder: bool = False, fix_codebook: bool = True, fix_encoder: bool = False,
                 head_size: int = 4, ex_multi_scale_num: int = 1) -> None:
        super().__init__(n_embed=n_embed, embed_dim=embed_dim, ch=ch, out_ch=out_ch, ch_mult=ch_mult,
                         num_res_blocks=num_res_blocks, attn_resolutions=attn_resolutions, dropout=dropout,
                         in_channels=in_channels, resolution=resolution, z_channels=z_channels, double_z=double_z,
                         enable_mid=enable_mid, fix_decoder=fix_decoder, fix_codebook=fix_codebook,
                         fix_encoder=fix_encoder, head_size=head_size, ex_multi_scale_num=ex_multi_scale_num)


@ARCH_REGISTRY.register()
class VQVAEGAN(RestoreFormer):
    """The authors' HQ-dictionary network (``VQVAEGAN``; stage 1 of their recipe, configs HQ_Dictionary.yaml and
    ROHQD.yaml): the same encoder, quantiser and decoder modules as ``RestoreFormer`` (the same state-dict keys,
    so its weights start RestoreFormer / RestoreFormer++), but a plain autoencoder of high-quality faces: the
    decoder's attention blocks attend within its own features (the authors' ``MultiHeadDecoder``), and the codebook
    trains (``fix_codebook`` false). Defaults: the authors' configs (``head_size`` 1 as HQ_Dictionary.yaml; ROHQD.yaml
    sets 4). No ``ex_multi_scale_num`` / ``fix_encoder`` (the authors' class has neither)."""

    cross_attention = False

    def __init__(self, *, n_embed: int = 1024, embed_dim: int = 256, ch: int = 64, out_ch: int = 3,
                 ch_mult: Sequence[int] = (1, 2, 2, 4, 4, 8), num_res_blocks: int = 2,
                 attn_resolutions: Sequence[int] = (16,), dropout: float = 0.0, in_channels: int = 3,
                 resolution: int = 512, z_channels: int = 256, double_z: bool = False, enable_mid: bool = True,
                 fix_decoder: bool = False, fix_codebook: bool = False, head_size: int = 1) -> None:
        super().__init__(n_embed=n_embed, embed_dim=embed_dim, ch=ch, out_ch=out_ch, ch_mult=ch_mult,
                         num_res_blocks=num_res_blocks, attn_resolutions=attn_resolutions, dropout=dropout,
                         in_channels=in_channels, resolution=resolution, z_channels=z_channels, double_z=double_z,
                         enable_mid=enable_mid, fix_decoder=fix_decoder, fix_codebook=fix_codebook,
                         head_size=head_size)


__all__ = ["MultiHeadAttnBlock", "MultiHeadDecoderTransformer", "MultiHeadEncoder", "RestoreFormer",
           "RestoreFormerPlusPlus", "VQVAEGAN", "VectorQuantizer", "decoder_attn_resolutions"]


def _attended(s: StateShapes, part: str, levels: list[int]) -> list[int]:
    """The sizes (of a 512 input, largest first) of the levels of ``encoder.down`` / ``decoder.up`` with attention."""
    return [512 >> i for i in levels if s.count(f"{part}.{i}.attn.")]


def _common(s: StateShapes) -> dict:
    """The arguments RestoreFormer and RestoreFormer++ show alike: codebook size and width from the quantiser, image
    channels, base width, the widths of the levels and their blocks from the encoder, the sizes the encoder attends
    at (of a 512 input: ``attn_resolutions``), the latent width and whether the middle blocks exist."""
    ch = s.dim("encoder.conv_in.weight", 0)
    levels = s.indices("encoder.down.")
    return {"n_embed": s.dim("quantize.embedding.weight", 0), "embed_dim": s.dim("quantize.embedding.weight", 1),
            "ch": ch, "in_channels": s.dim("encoder.conv_in.weight", 1), "out_ch": s.dim("decoder.conv_out.weight", 0),
            "ch_mult": [s.dim(f"encoder.down.{i}.block.0.conv1.weight", 0) // ch for i in levels],
            "num_res_blocks": s.count("encoder.down.0.block."),
            "attn_resolutions": _attended(s, "encoder.down", levels),
            "z_channels": s.dim("encoder.conv_out.weight", 0), "enable_mid": "encoder.mid.block_1.conv1.weight" in s}


def _recognise(s: StateShapes) -> dict | None:
    """RestoreFormer: the decoder attends at the encoder's sizes. The head count shows in no tensor (the class's
    default, the published 8, is proposed)."""
    args = _common(s)
    if _attended(s, "decoder.up", s.indices("encoder.down.")) != args["attn_resolutions"]:
        return None  # RestoreFormer++
    return args


def _recognise_plus_plus(s: StateShapes) -> list[dict]:
    """RestoreFormer++: the decoder attends at other sizes than the encoder (``ex_multi_scale_num``, read as the
    number of doublings that give the decoder's sizes; both orders of ``attn_resolutions`` tried, its first and last
    entries decide). The head count shows in no tensor (the class's default, the published 4, is proposed)."""
    args = _common(s)
    levels = s.indices("encoder.down.")
    decoder, sizes = set(_attended(s, "decoder.up", levels)), {512 >> i for i in levels}
    enc = args["attn_resolutions"]
    if not enc or decoder == set(enc):
        return []
    return [{**args, "type": "RestoreFormerPlusPlus", "attn_resolutions": order, "ex_multi_scale_num": n}
            for n in range(1, len(levels)) for order in ([enc, enc[::-1]] if len(enc) > 1 else [enc])
            if set(decoder_attn_resolutions(order, n)) & sizes == decoder]


register_recogniser("RestoreFormer", _recognise)
register_recogniser("RestoreFormerPlusPlus", _recognise_plus_plus)

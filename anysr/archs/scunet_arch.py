"""SCUNet: practical blind denoising via Swin-Conv-UNet (Zhang et al., 2022).

Module names and constructor arguments follow cszn/SCUNet (as spandrel 0.4.2 reproduces it), so the released
SCUNet checkpoints load with ``strict=True``. The relative-position index is a non-persistent buffer (the
original computes it on every call), so the state dict is the original's.

A U-Net (three 2x2 stride-2 downsamplings, transposed-conv upsamplings) of swin-conv blocks: a 1x1 conv splits
the features into a residual-conv half and a (shifted-)window-attention half (head dim 32, window 8), and
another 1x1 conv merges them. The input is padded at the bottom/right to a multiple of 64 (three halvings times
the window) and the output cropped back: reflect padding, as spandrel does; for an image side shorter than the
padding, where reflection is undefined, edge replication (the original authors' choice).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import (
    ArchArgumentError,
    DropPath,
    drop_path_rates,
    relative_position_index,
    shifted_window_blocked,
    window_partition,
    window_reverse,
)
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.registry import ARCH_REGISTRY

HEAD_DIM = 32
WINDOW_SIZE = 8


class WMSA(nn.Module):
    """Multi-head self attention inside ``window_size`` windows ('W') or windows shifted by half ('SW'), with a
    learned relative-position bias. Input and output: (b, h, w, c)."""

    def __init__(self, input_dim: int, output_dim: int, head_dim: int, window_size: int, type: str) -> None:  # noqa: A002
        super().__init__()
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.head_dim = head_dim
        self.scale = head_dim**-0.5
        self.n_heads = input_dim // head_dim
        self.window_size = window_size
        self.type = type
        self.embedding_layer = nn.Linear(input_dim, 3 * input_dim, bias=True)
        span = 2 * window_size - 1
        table = torch.empty(self.n_heads, span, span)
        nn.init.trunc_normal_(table, std=0.02)
        self.relative_position_params = nn.Parameter(table)
        self.linear = nn.Linear(input_dim, output_dim)
        self.register_buffer("relative_index", relative_position_index(window_size).flatten(), persistent=False)

    def relative_embedding(self) -> torch.Tensor:
        """The bias added to the attention logits: (n_heads, n, n) for n = window_size**2 tokens."""
        n = self.window_size * self.window_size
        return self.relative_position_params.flatten(1)[:, self.relative_index].view(self.n_heads, n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.window_size
        shifted = self.type != "W"
        if shifted:
            x = torch.roll(x, shifts=(-(p // 2), -(p // 2)), dims=(1, 2))
        b, h, w, c = x.shape
        nh, nw = h // p, w // p
        x = window_partition(x, p).view(b, nh * nw, p * p, c)
        qkv = self.embedding_layer(x).view(b, nh * nw, p * p, 3 * self.n_heads, self.head_dim)
        qkv = qkv.permute(3, 0, 1, 2, 4)  # (3 * heads, b, windows, tokens, head_dim)
        q, k, v = qkv.chunk(3, dim=0)
        sim = (q @ k.transpose(-2, -1)) * self.scale
        sim = sim + self.relative_embedding()[:, None, None]
        if shifted:
            sim = sim.masked_fill(shifted_window_blocked(h, w, p, p // 2, x.device), float("-inf"))
        out = sim.softmax(dim=-1) @ v  # (heads, b, windows, tokens, head_dim)
        out = out.permute(1, 2, 3, 0, 4).reshape(b, nh * nw, p * p, self.n_heads * self.head_dim)
        out = self.linear(out)
        out = window_reverse(out.view(b * nh * nw, p, p, -1), p, h, w)
        if shifted:
            out = torch.roll(out, shifts=(p // 2, p // 2), dims=(1, 2))
        return out

    def extra_repr(self) -> str:
        return f"dim={self.input_dim}, heads={self.n_heads}, window_size={self.window_size}, type={self.type}"


class Block(nn.Module):
    """Swin block on (b, h, w, c): pre-norm window attention and pre-norm MLP (x4), each with a residual.

    A map not larger than the window (``input_resolution <= window_size``) gets plain windows ('W').
    """

    def __init__(self, input_dim: int, output_dim: int, head_dim: int, window_size: int, drop_path: float,
                 type: str = "W", input_resolution: int | None = None) -> None:  # noqa: A002
        super().__init__()
        if type not in ("W", "SW"):
            raise ArchArgumentError("type", f"SCUNet block type must be 'W' or 'SW', got {type!r}")
        self.input_dim = input_dim
        self.output_dim = output_dim
        self.type = "W" if input_resolution is not None and input_resolution <= window_size else type
        self.ln1 = nn.LayerNorm(input_dim)
        self.msa = WMSA(input_dim, input_dim, head_dim, window_size, self.type)
        self.drop_path = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.ln2 = nn.LayerNorm(input_dim)
        self.mlp = nn.Sequential(nn.Linear(input_dim, 4 * input_dim), nn.GELU(), nn.Linear(4 * input_dim, output_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.msa(self.ln1(x)))
        return x + self.drop_path(self.mlp(self.ln2(x)))


class ConvTransBlock(nn.Module):
    """Swin-conv block on (b, c, h, w): 1x1 conv, split into ``conv_dim`` channels for a residual conv pair and
    ``trans_dim`` channels for a swin block, concatenate, 1x1 conv, plus the input."""

    def __init__(self, conv_dim: int, trans_dim: int, head_dim: int, window_size: int, drop_path: float,
                 type: str = "W", input_resolution: int | None = None) -> None:  # noqa: A002
        super().__init__()
        self.conv_dim = conv_dim
        self.trans_dim = trans_dim
        self.head_dim = head_dim
        self.window_size = window_size
        self.drop_path = drop_path
        self.input_resolution = input_resolution
        self.trans_block = Block(trans_dim, trans_dim, head_dim, window_size, drop_path, type, input_resolution)
        self.type = self.trans_block.type
        both = conv_dim + trans_dim
        self.conv1_1 = nn.Conv2d(both, both, 1, 1, 0, bias=True)
        self.conv1_2 = nn.Conv2d(both, both, 1, 1, 0, bias=True)
        self.conv_block = nn.Sequential(
            nn.Conv2d(conv_dim, conv_dim, 3, 1, 1, bias=False), nn.ReLU(True),
            nn.Conv2d(conv_dim, conv_dim, 3, 1, 1, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv_x, trans_x = torch.split(self.conv1_1(x), (self.conv_dim, self.trans_dim), dim=1)
        conv_x = self.conv_block(conv_x) + conv_x
        trans_x = self.trans_block(trans_x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return x + self.conv1_2(torch.cat((conv_x, trans_x), dim=1))


@ARCH_REGISTRY.register()
class SCUNet(nn.Module):
    """SCUNet denoiser (scale 1).

    Args (the original's): in_nc (image channels), config (swin-conv blocks per stage: down1, down2, down3,
    body, up3, up2, up1; block i of a stage uses shifted windows when i is odd), dim (channels of the first
    stage, a multiple of 64), drop_path_rate (stochastic depth rising linearly over all blocks to this),
    input_resolution (training patch size; stages whose map is not larger than the window use plain windows).
    The default config is that of all released models ([4] * 7).
    """

    def __init__(self, in_nc: int = 3, config: Sequence[int] = (4, 4, 4, 4, 4, 4, 4), dim: int = 64,
                 drop_path_rate: float = 0.0, input_resolution: int = 256) -> None:
        super().__init__()
        config = list(config)
        if len(config) != 7 or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in config):
            raise ArchArgumentError("config", f"SCUNet needs 7 block counts >= 0 (down1, down2, down3, body, "
                                    f"up3, up2, up1), got {config!r}")
        if not isinstance(dim, int) or dim < 2 * HEAD_DIM or dim % (2 * HEAD_DIM):
            raise ArchArgumentError("dim", f"SCUNet needs dim to be a multiple of {2 * HEAD_DIM} (half of it feeds "
                                    f"attention heads of {HEAD_DIM} channels), got {dim!r}")
        self.config = config
        self.dim = dim
        self.head_dim = HEAD_DIM
        self.window_size = WINDOW_SIZE
        self.tile_multiple: int = 8 * WINDOW_SIZE  # three halvings, then whole windows
        rates = drop_path_rates(drop_path_rate, sum(config))
        starts = [sum(config[:i]) for i in range(7)]

        def stage(i: int, channels: int, resolution: int) -> list[nn.Module]:
            half = channels // 2
            return [ConvTransBlock(half, half, HEAD_DIM, WINDOW_SIZE, rates[starts[i] + j],
                                   "W" if j % 2 == 0 else "SW", resolution) for j in range(config[i])]

        def down(cin: int) -> nn.Module:
            return nn.Conv2d(cin, 2 * cin, 2, 2, 0, bias=False)

        def up(cin: int) -> nn.Module:
            return nn.ConvTranspose2d(cin, cin // 2, 2, 2, 0, bias=False)

        r = input_resolution
        self.m_head = nn.Sequential(nn.Conv2d(in_nc, dim, 3, 1, 1, bias=False))
        self.m_down1 = nn.Sequential(*stage(0, dim, r), down(dim))
        self.m_down2 = nn.Sequential(*stage(1, 2 * dim, r // 2), down(2 * dim))
        self.m_down3 = nn.Sequential(*stage(2, 4 * dim, r // 4), down(4 * dim))
        self.m_body = nn.Sequential(*stage(3, 8 * dim, r // 8))
        self.m_up3 = nn.Sequential(up(8 * dim), *stage(4, 4 * dim, r // 4))
        self.m_up2 = nn.Sequential(up(4 * dim), *stage(5, 2 * dim, r // 2))
        self.m_up1 = nn.Sequential(up(2 * dim), *stage(6, dim, r))
        self.m_tail = nn.Sequential(nn.Conv2d(dim, in_nc, 3, 1, 1, bias=False))

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        h, w = x0.shape[-2:]
        m = self.tile_multiple
        pad_h, pad_w = (-h) % m, (-w) % m
        if pad_h or pad_w:
            mode = "reflect" if pad_h < h and pad_w < w else "replicate"
            x0 = F.pad(x0, (0, pad_w, 0, pad_h), mode=mode)
        x1 = self.m_head(x0)
        x2 = self.m_down1(x1)
        x3 = self.m_down2(x2)
        x4 = self.m_down3(x3)
        x = self.m_body(x4)
        x = self.m_up3(x + x4)
        x = self.m_up2(x + x3)
        x = self.m_up1(x + x2)
        x = self.m_tail(x + x1)
        return x[..., :h, :w] if (pad_h or pad_w) else x


__all__ = ["Block", "ConvTransBlock", "SCUNet", "WMSA"]


def _recognise(s: StateShapes) -> dict:
    """SCUNet from its tensors: image channels and width from the head conv, the blocks of the seven stages
    from the down / body / up sequences (each down and up stage also holds its resampling conv)."""
    s.shape("m_tail.0.weight")
    stages = [s.count(f"m_down{i}.") - 1 for i in (1, 2, 3)] + [s.count("m_body.")] \
        + [s.count(f"m_up{i}.") - 1 for i in (3, 2, 1)]
    return {"in_nc": s.dim("m_head.0.weight", 1), "config": stages, "dim": s.dim("m_head.0.weight", 0)}


register_recogniser("SCUNet", _recognise)

"""TOPIQ full-reference (Chen et al., "TOPIQ: A Top-down Approach from Semantics to Distortions for Image Quality
Assessment", 2023), as neosr's ``calculate_topiq`` computes it (IQA-PyTorch's CFANet-FR, ResNet-50 backbone).

A ResNet-50 (torchvision's layout) gives five feature levels of the distorted and the reference image (ImageNet-
normalised). Per level, coarse to fine: the features of both and their gap ``sqrt((x - y)^2 + 1e-12)`` are stacked,
gated by a small conv net of the gap (``weight_pool``), average-pooled to the coarsest level's size when larger,
reduced to ``inter_dim`` channels, given a learned position embedding (bicubically resized) and passed through a
pre-norm transformer encoder layer; the coarsest level's tokens then attend to each finer level in turn (decoder
layers), a last encoder layer pools them, and an MLP of the mean token gives the score. Higher is better; one value
per pair, a tensor ``(N,)``.

The weights are the user's file (IQA-PyTorch's ``cfanet_fr_kadid_res50-2c4cc61d.pth``, whose ``params`` this
module's state dict equals key for key). Attention runs through ``F.scaled_dot_product_attention``; the adaptive
pooling and the bicubic resize of the position embedding are matrix products with weights fixed by the shapes, so
nothing depends on tensor values on the host.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from anysr.errors import DataError
from anysr.metrics.backbones import FrozenMetricNet
from anysr.metrics.info import TOPIQ_INFO

__all__ = ["TOPIQ", "ResNet50Features", "METRIC_INFO", "BETTER"]

METRIC_INFO = TOPIQ_INFO
BETTER = METRIC_INFO.better

_LEVELS = (64, 256, 512, 1024, 2048)  # channels of the stem and the four stages
_BLOCKS = (3, 4, 6, 3)
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


class _Bottleneck(nn.Module):
    """torchvision's ResNet-50 bottleneck (stride on the 3x3 conv)."""

    def __init__(self, c_in: int, width: int, stride: int) -> None:
        super().__init__()
        c_out = width * 4
        self.conv1 = nn.Conv2d(c_in, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, c_out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.downsample = (nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
                           if stride != 1 or c_in != c_out else None)

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet50Features(nn.Module):
    """torchvision's ``resnet50`` without its head: the stem's (after the max pool) and the four stages' outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        c_in = 64
        for i, (blocks, width) in enumerate(zip(_BLOCKS, (64, 128, 256, 512), strict=True), start=1):
            layers = []
            for b in range(blocks):
                layers.append(_Bottleneck(c_in, width, 2 if (b == 0 and i > 1) else 1))
                c_in = width * 4
            self.add_module(f"layer{i}", nn.Sequential(*layers))

    def forward(self, x: Tensor) -> list[Tensor]:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        feats = [x]
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = layer(x)
            feats.append(x)
        return feats


class _Attention(nn.Module):
    """Multi-head attention on sequence-first tokens ``(L, N, E)`` with ``nn.MultiheadAttention``'s parameters
    (``in_proj_weight``, ``in_proj_bias``, ``out_proj``), computed by ``F.scaled_dot_product_attention``."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * dim))
        self.out_proj = nn.Linear(dim, dim)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def forward(self, query: Tensor, memory: Tensor) -> Tensor:
        lq, n, e = query.shape
        lk = memory.shape[0]
        wq, wk, wv = self.in_proj_weight.chunk(3)
        bq, bk, bv = self.in_proj_bias.chunk(3)
        d = e // self.heads

        def heads(t: Tensor, length: int) -> Tensor:  # (L, N, E) -> (N, heads, L, d)
            return t.reshape(length, n, self.heads, d).permute(1, 2, 0, 3)

        q = heads(F.linear(query, wq, bq), lq)
        k = heads(F.linear(memory, wk, bk), lk)
        v = heads(F.linear(memory, wv, bv), lk)
        out = F.scaled_dot_product_attention(q, k, v)  # (N, heads, Lq, d)
        return self.out_proj(out.permute(2, 0, 1, 3).reshape(lq, n, e))


class _EncoderLayer(nn.Module):
    """Pre-norm self-attention and GELU MLP (TOPIQ's, no dropout)."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.self_attn = _Attention(dim, heads)
        self.linear1 = nn.Linear(dim, hidden)
        self.linear2 = nn.Linear(hidden, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        h = self.norm1(x)
        x = x + self.self_attn(h, h)
        return x + self.linear2(F.gelu(self.linear1(self.norm2(x))))


class _DecoderLayer(nn.Module):
    """Pre-norm cross-attention of the query tokens to the (normalised) memory, then a GELU MLP; ``self_attn`` is
    in TOPIQ's weights but not used."""

    def __init__(self, dim: int, heads: int, hidden: int) -> None:
        super().__init__()
        self.self_attn = _Attention(dim, heads)
        self.multihead_attn = _Attention(dim, heads)
        self.linear1 = nn.Linear(dim, hidden)
        self.linear2 = nn.Linear(hidden, dim)
        self.norm1 = nn.LayerNorm(dim)
        self.norm2 = nn.LayerNorm(dim)
        self.norm3 = nn.LayerNorm(dim)

    def forward(self, x: Tensor, memory: Tensor) -> Tensor:
        x = x + self.multihead_attn(self.norm1(x), self.norm2(memory))
        return x + self.linear2(F.gelu(self.linear1(self.norm3(x))))


class _Stack(nn.Module):
    """``layers``: the layers applied in turn (the keys ``<name>.layers.<i>.*``)."""

    def __init__(self, *layers: nn.Module) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


@lru_cache(maxsize=64)
def _pool_matrix(size: int, out: int) -> Tensor:
    """``(out, size)`` weights of adaptive average pooling along one axis (bin i: floor(i size / out) to
    ceil((i + 1) size / out))."""
    m = torch.zeros(out, size, dtype=torch.float64)
    for i in range(out):
        a, b = (i * size) // out, -((-(i + 1) * size) // out)
        m[i, a:b] = 1.0 / (b - a)
    return m.float()


@lru_cache(maxsize=64)
def _bicubic_matrix(size: int, out: int) -> Tensor:
    """``(out, size)`` weights of PyTorch's bicubic resize along one axis (align_corners False)."""
    basis = torch.eye(size, dtype=torch.float64).view(size, 1, size, 1)
    return F.interpolate(basis, size=(out, 1), mode="bicubic", align_corners=False)[:, 0, :, 0].t().float()


def _separable(x: Tensor, mh: Tensor, mw: Tensor) -> Tensor:
    """``mh @ x @ mw^T`` over the last two axes."""
    return torch.einsum("ih,nchw,jw->ncij", mh.to(x), x, mw.to(x))


class TOPIQ(FrozenMetricNet):
    """TOPIQ-FR between distorted ``x`` and reference ``y`` (RGB NCHW on [0, 1]) -> ``(N,)``, higher is better.

    neosr's / IQA-PyTorch's arguments (``num_class``, ``inter_dim``, ``num_heads``, ``num_attn_layers``); load the
    weights with ``load_weights`` (IQA-PyTorch's file: its ``params`` or the state dict itself). Frozen, eval mode.
    """

    def __init__(self, num_class: int = 1, inter_dim: int = 256, num_heads: int = 4, num_attn_layers: int = 1,
                 weights: Mapping[str, Tensor] | None = None) -> None:
        super().__init__()
        hidden = min(4 * inter_dim, 2048)
        self.semantic_model = ResNet50Features()
        self.weight_pool = nn.ModuleList(
            nn.Sequential(nn.Conv2d(c, 64, 1), nn.GELU(), nn.Conv2d(64, 64, 3, 1, 1), nn.GELU(),
                          nn.Conv2d(64, 1, 3, 1, 1), nn.Sigmoid()) for c in _LEVELS)
        self.dim_reduce = nn.ModuleList(nn.Sequential(nn.Conv2d(3 * c, inter_dim, 1), nn.GELU()) for c in _LEVELS)
        self.sa_attn_blks = nn.ModuleList(
            _Stack(*(_EncoderLayer(inter_dim, num_heads, hidden) for _ in range(num_attn_layers))) for _ in _LEVELS)
        self.attn_blks = nn.ModuleList(
            _Stack(*(_DecoderLayer(inter_dim, num_heads, hidden) for _ in range(num_attn_layers)))
            for _ in _LEVELS[1:])
        self.attn_pool = _EncoderLayer(inter_dim, num_heads, hidden)
        self.score_linear = nn.Sequential(nn.LayerNorm(inter_dim), nn.Linear(inter_dim, inter_dim), nn.GELU(),
                                          nn.LayerNorm(inter_dim), nn.Linear(inter_dim, inter_dim), nn.GELU(),
                                          nn.Linear(inter_dim, num_class))
        self.h_emb = nn.Parameter(torch.zeros(1, inter_dim // 2, 32, 1))
        self.w_emb = nn.Parameter(torch.zeros(1, inter_dim // 2, 1, 32))
        self.register_buffer("mean", torch.tensor(_IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(_IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.freeze()
        if weights is not None:
            self.load_weights(weights)

    def load_weights(self, *state_dicts: Mapping[str, Tensor]) -> TOPIQ:
        """Load IQA-PyTorch's TOPIQ-FR weights (a file's ``params``, or the state dict itself) strictly."""
        merged: dict[str, Tensor] = {}
        for sd in state_dicts:
            inner = sd.get("params", sd) if isinstance(sd, Mapping) else sd
            merged.update({k.removeprefix("module."): v for k, v in inner.items()})  # type: ignore[union-attr]
        own = self.state_dict()
        missing = sorted(k for k in own if k not in merged)
        self.load_checked(merged, missing, "TOPIQ", "give IQA-PyTorch's cfanet_fr_kadid_res50 weights (params)")
        return self

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        if x.dim() != 4 or x.shape != y.shape or x.shape[1] != 3:
            raise DataError(f"TOPIQ: expected two RGB batches (N, 3, H, W) of the same shape on [0, 1], got "
                            f"{tuple(x.shape)} and {tuple(y.shape)}")
        dist = self.semantic_model((x - self.mean) / self.std)
        ref = self.semantic_model((y - self.mean) / self.std)
        th, tw = dist[-1].shape[2:]
        e_h, e_w = self.h_emb.shape[2], self.w_emb.shape[3]
        pos = torch.cat([self.h_emb.expand(-1, -1, -1, e_w), self.w_emb.expand(-1, -1, e_h, -1)], dim=1)
        tokens = []
        for i in reversed(range(len(_LEVELS))):
            gap = torch.sqrt((dist[i] - ref[i]) ** 2 + 1e-12)
            feat = torch.cat([dist[i], ref[i], gap], dim=1) * self.weight_pool[i](gap)
            h, w = feat.shape[2:]
            if h > th and w > tw:
                feat = _separable(feat, _pool_matrix(h, th), _pool_matrix(w, tw))
            h, w = feat.shape[2:]
            emb = _separable(pos, _bicubic_matrix(e_h, h), _bicubic_matrix(e_w, w)).flatten(2).permute(2, 0, 1)
            t = self.dim_reduce[i](feat).flatten(2).permute(2, 0, 1) + emb  # (h w, N, inter_dim)
            for layer in self.sa_attn_blks[i].layers:
                t = layer(t)
            tokens.append(t)
        query = tokens[0]
        for i, memory in enumerate(tokens[1:]):
            for layer in self.attn_blks[i].layers:
                query = layer(query, memory)
        final = self.attn_pool(query)
        return self.score_linear(final.mean(dim=0)).mean(dim=1)

"""IPT: the Image Processing Transformer (Chen et al., "Pre-Trained Image Processing Transformer", CVPR 2021).

One network for several tasks: a convolutional head per task (``scale`` lists each task's factor: 2, 3, 4 for
super-resolution, 1 for denoising or deraining), a shared transformer body (an encoder and a decoder whose
queries are a learned embedding per task) over non-overlapping ``patch_dim`` x ``patch_dim`` patches of a
``patch_size`` square, and a tail per task (sub-pixel upsampling and a conv). ``scale_idx`` picks the task that
runs. Parameter names and layout are the authors' / spandrel 0.4.2's, so their files load strictly.

Written for anysr: the attention is ``scaled_dot_product_attention`` on the stored ``in_proj_weight`` (fused where
the device has it), patches are reshapes rather than ``unfold``/``fold`` (XLA, ONNX), and any input size runs: the
input is padded to a multiple of ``patch_size`` and the body runs on each ``patch_size`` square (the reference
takes exactly one square; on one the two agree). Images are [0, 1]; the network scales them by ``rgb_range``
around the mean shift as the authors' code expects (spandrel's call does the same).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import DIV2K_RGB_MEAN, ArchArgumentError, Upsample, pad_to_multiple
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY


class _MeanShift(nn.Conv2d):
    """A fixed 1x1 conv adding ``sign * rgb_range * mean`` (the authors' ``sub_mean`` / ``add_mean``)."""

    def __init__(self, rgb_range: float, sign: int) -> None:
        super().__init__(3, 3, 1)
        with torch.no_grad():
            self.weight.copy_(torch.eye(3).view(3, 3, 1, 1))
            self.bias.copy_(sign * rgb_range * torch.tensor(DIV2K_RGB_MEAN))
        for p in self.parameters():
            p.requires_grad = False


class _ResBlock(nn.Module):
    """conv 5x5, ReLU, conv 5x5, plus the input (keys ``body.0`` / ``body.2``)."""

    def __init__(self, n_feats: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(n_feats, n_feats, 5, padding=2), nn.ReLU(True),
                                  nn.Conv2d(n_feats, n_feats, 5, padding=2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + x


class _Attention(nn.Module):
    """Multi-head attention without biases, with ``nn.MultiheadAttention``'s parameter names, on batch-first
    tokens (b, n, dim)."""

    def __init__(self, dim: int, num_heads: int, dropout: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.dropout = dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * dim, dim))
        self.out_proj = nn.Linear(dim, dim, bias=False)
        nn.init.kaiming_uniform_(self.in_proj_weight, a=math.sqrt(5))

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.num_heads, d // self.num_heads).transpose(1, 2)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        wq, wk, wv = self.in_proj_weight.chunk(3)
        q, k, v = (self._heads(F.linear(t, w)) for t, w in ((query, wq), (key, wk), (value, wv)))
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.out_proj(out.transpose(1, 2).flatten(2))


def _norm(dim: int, no_norm: bool) -> nn.Module:
    return nn.Identity() if no_norm else nn.LayerNorm(dim)


def _with(x: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
    return x if pos is None else x + pos


class _EncoderLayer(nn.Module):
    """Pre-norm self-attention (position added to queries and keys) and a ReLU feed-forward."""

    def __init__(self, dim: int, num_heads: int, hidden: int, dropout: float, no_norm: bool) -> None:
        super().__init__()
        self.self_attn = _Attention(dim, num_heads, dropout)
        self.linear1, self.linear2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.norm1, self.norm2 = _norm(dim, no_norm), _norm(dim, no_norm)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, pos: torch.Tensor | None) -> torch.Tensor:
        y = self.norm1(x)
        x = x + self.dropout(self.self_attn(_with(y, pos), _with(y, pos), y))
        return x + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(self.norm2(x))))))


class _DecoderLayer(nn.Module):
    """Pre-norm self-attention with the task queries, cross-attention to the encoder's tokens, feed-forward."""

    def __init__(self, dim: int, num_heads: int, hidden: int, dropout: float, no_norm: bool) -> None:
        super().__init__()
        self.self_attn = _Attention(dim, num_heads, dropout)
        self.multihead_attn = _Attention(dim, num_heads, dropout)
        self.linear1, self.linear2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.norm1, self.norm2, self.norm3 = (_norm(dim, no_norm) for _ in range(3))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, pos: torch.Tensor | None,
                query_pos: torch.Tensor | None) -> torch.Tensor:
        y = self.norm1(x)
        x = x + self.dropout(self.self_attn(_with(y, query_pos), _with(y, query_pos), y))
        x = x + self.dropout(self.multihead_attn(_with(self.norm2(x), query_pos), _with(memory, pos), memory))
        return x + self.dropout(self.linear2(self.dropout(F.relu(self.linear1(self.norm3(x))))))


class _Layers(nn.Module):
    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)


class _PositionEncoding(nn.Module):
    def __init__(self, seq_length: int, dim: int) -> None:
        super().__init__()
        self.pe = nn.Embedding(seq_length, dim)
        self.register_buffer("position_ids", torch.arange(seq_length).expand((1, -1)))


class _Body(nn.Module):
    """The transformer over the patches of one ``patch_size`` square (keys as the authors' ``VisionTransformer``)."""

    def __init__(self, patch_size: int, patch_dim: int, n_feats: int, num_heads: int, num_layers: int,
                 num_queries: int, dropout: float, mlp: bool, pos_every: bool, no_pos: bool, no_norm: bool) -> None:
        super().__init__()
        dim = n_feats * patch_dim * patch_dim
        hidden = 4 * dim
        self.patch_dim, self.patch_size, self.dim = patch_dim, patch_size, dim
        self.seq_length = (patch_size // patch_dim) ** 2
        self.mlp, self.pos_every, self.no_pos = mlp, pos_every, no_pos
        if mlp:
            self.linear_encoding = nn.Linear(dim, dim)
            self.mlp_head = nn.Sequential(nn.Linear(dim, hidden), nn.Dropout(dropout), nn.ReLU(),
                                          nn.Linear(hidden, dim), nn.Dropout(dropout))
            self.query_embed = nn.Embedding(num_queries, dim * self.seq_length)
        self.encoder = _Layers([_EncoderLayer(dim, num_heads, hidden, dropout, no_norm) for _ in range(num_layers)])
        self.decoder = _Layers([_DecoderLayer(dim, num_heads, hidden, dropout, no_norm) for _ in range(num_layers)])
        if not no_pos:
            self.position_encoding = _PositionEncoding(self.seq_length, dim)
        self.dropout_layer1 = nn.Dropout(dropout)
        if no_norm:
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, std=1 / m.weight.size(1))

    def forward(self, x: torch.Tensor, query_idx: int) -> torch.Tensor:
        b, c, h, w = x.shape  # h == w == patch_size
        p = self.patch_dim
        # Non-overlapping p x p patches, each flattened (channel, row, column) as ``unfold`` orders them.
        tokens = x.view(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * p * p)
        query_pos = None
        if self.mlp:
            tokens = self.dropout_layer1(self.linear_encoding(tokens)) + tokens
            query_pos = self.query_embed.weight[query_idx].view(1, self.seq_length, self.dim)
        pos = None if self.no_pos else self.position_encoding.pe.weight.unsqueeze(0)
        enc_pos = pos if self.pos_every else None
        y = tokens if self.no_pos or self.pos_every else tokens + pos
        for layer in self.encoder.layers:
            y = layer(y, enc_pos)
        memory = y
        for layer in self.decoder.layers:
            y = layer(y, memory, enc_pos, query_pos)
        if self.mlp:
            y = self.mlp_head(y) + y
        return y.view(b, h // p, w // p, c, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def _scales(scale: int | Sequence[int]) -> list[int]:
    scales = [scale] if isinstance(scale, int) and not isinstance(scale, bool) else scale
    if (not isinstance(scales, Sequence) or isinstance(scales, str) or not scales
            or any(isinstance(s, bool) or not isinstance(s, int) for s in scales)):
        raise ArchArgumentError("scale", f"IPT takes a task's factor or a list of them (one head per task), "
                                f"got {scale!r}")
    return list(scales)


@ARCH_REGISTRY.register()
class IPT(nn.Module):
    """IPT (Chen et al., CVPR 2021), the authors' / spandrel's arguments and keys.

    Args:
        patch_size: side of the square the body runs on (48); inputs are padded to a multiple of it.
        patch_dim: side of a token's patch (3). n_feats: conv width (64); the token width is
        ``n_feats * patch_dim**2``. rgb_range: the pixel range the network was trained on (255).
        n_colors: image channels (3: the mean shift is RGB). scale: a factor, or one per task head ([2, 3, 4,
        1, 1, 1] for the published pre-trained model). num_heads / num_layers: attention heads (12) and encoder /
        decoder layers (12). num_queries: task query embeddings (one per task that runs). dropout_rate: dropout.
        mlp: the token encoding and MLP head (True). pos_every: the position added in every layer rather than
        once. no_pos / no_norm: without position encoding / layer norms. scale_idx: the task that runs (anysr's
        addition; the authors set it with ``set_scale``).
    """

    def __init__(self, patch_size: int = 48, patch_dim: int = 3, n_feats: int = 64, rgb_range: float = 255,
                 n_colors: int = 3, scale: int | Sequence[int] = 1, num_heads: int = 12, num_layers: int = 12,
                 num_queries: int = 1, dropout_rate: float = 0, mlp: bool = True, pos_every: bool = False,
                 no_pos: bool = False, no_norm: bool = False, scale_idx: int = 0) -> None:
        super().__init__()
        scales = _scales(scale)
        for s in scales:
            if s & (s - 1) and s != 3:
                raise ArchArgumentError("scale", f"IPT's heads upscale by a power of two or 3, got {s}")
        if n_colors != 3:
            raise ArchArgumentError("n_colors", f"IPT's mean shift is RGB: n_colors must be 3, got {n_colors!r}")
        if patch_dim < 1 or patch_size % patch_dim:
            raise ArchArgumentError("patch_dim", f"must divide patch_size ({patch_size}), got {patch_dim!r}")
        if isinstance(rgb_range, bool) or not isinstance(rgb_range, (int, float)) or not rgb_range > 0:
            raise ArchArgumentError("rgb_range", f"the pixel range the network works in (255, or 1): > 0, got "
                                    f"{rgb_range!r}")
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1 or (
                n_feats * patch_dim * patch_dim) % num_heads:
            raise ArchArgumentError("num_heads", f"must divide the token width n_feats * patch_dim**2 = "
                                    f"{n_feats * patch_dim * patch_dim}, got {num_heads!r}")
        if not 0 <= scale_idx < len(scales):
            raise ArchArgumentError("scale_idx", f"picks one of the {len(scales)} task heads (scale {scales}): "
                                    f"0..{len(scales) - 1}, got {scale_idx!r}")
        if mlp and not 0 <= scale_idx < num_queries:
            raise ArchArgumentError("num_queries", f"task {scale_idx} needs a query embedding: num_queries must "
                                    f"be more than scale_idx, got {num_queries!r}")
        self.scale_idx = scale_idx
        self.upscale = scales[scale_idx]
        self.rgb_range = rgb_range
        self.tile_multiple = patch_size
        self.sub_mean = _MeanShift(rgb_range, -1)
        self.add_mean = _MeanShift(rgb_range, 1)
        self.head = nn.ModuleList(
            nn.Sequential(nn.Conv2d(n_colors, n_feats, 3, padding=1), _ResBlock(n_feats), _ResBlock(n_feats))
            for _ in scales)
        self.body = _Body(patch_size, patch_dim, n_feats, num_heads, num_layers, num_queries, dropout_rate, mlp,
                          pos_every, no_pos, no_norm)
        self.tail = nn.ModuleList(
            nn.Sequential(Upsample(s, n_feats), nn.Conv2d(n_feats, n_colors, 3, padding=1)) for s in scales)
        # The other tasks' heads and tails are kept (the authors' files carry them) but frozen: this network trains
        # one task, and an unused trainable parameter would stop distributed training.
        for i in range(len(scales)):
            if i != scale_idx:
                for p in (*self.head[i].parameters(), *self.tail[i].parameters()):
                    p.requires_grad = False

    def reparameterize(self) -> IPT:
        """The deployment form, in place: the task that runs alone (its head, tail and query embedding become
        task 0; the other tasks' are dropped), so a plain export is a single-task IPT that any loader runs as
        this task (spandrel runs task 0 and reads the scale from the first tail). ``deployed_arguments`` gives
        the constructor arguments that rebuild it."""
        i = self.scale_idx
        self.head = nn.ModuleList([self.head[i]])
        self.tail = nn.ModuleList([self.tail[i]])
        if self.body.mlp and self.body.query_embed.num_embeddings > 1:
            row = self.body.query_embed.weight.detach()[i: i + 1].clone()
            self.body.query_embed = nn.Embedding.from_pretrained(row, freeze=False)
        self.scale_idx = 0
        for p in self.parameters():
            p.requires_grad_(True)
        return self

    def deployed_arguments(self) -> dict[str, Any]:
        """What ``reparameterize`` changed in the constructor's arguments: one task at this scale."""
        return {"scale": self.upscale, "scale_idx": 0, "num_queries": 1}

    @staticmethod
    def scale_from_arguments(args: Mapping[str, Any]) -> int:
        """The factor a network built with ``args`` runs at (the chosen task's), for the options checker."""
        scales = _scales(args.get("scale", 1))
        idx = args.get("scale_idx", 0)
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < len(scales):
            raise ArchArgumentError("scale_idx", f"picks one of the {len(scales)} task heads, got {idx!r}")
        return scales[idx]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        ps = self.tile_multiple
        x, _, _ = pad_to_multiple(x, ps)
        x = self.head[self.scale_idx](self.sub_mean(x * self.rgb_range))
        b, c, hp, wp = x.shape
        squares = x.view(b, c, hp // ps, ps, wp // ps, ps).permute(0, 2, 4, 1, 3, 5).reshape(-1, c, ps, ps)
        res = self.body(squares, self.scale_idx)
        res = res.view(b, hp // ps, wp // ps, c, ps, ps).permute(0, 3, 1, 4, 2, 5).reshape(b, c, hp, wp)
        out = self.add_mean(self.tail[self.scale_idx](res + x)) / self.rgb_range
        return out[..., : h * self.upscale, : w * self.upscale]


__all__ = ["IPT"]


# The published models (the authors' IPT_sr2 / sr3 / sr4, denoise30 / 50, derain): one task each, at the class's
# defaults; the file's top-level ``scale`` is the task's factor.
register_presets("IPT", scale_arg="scale", source="the IPT authors", presets={"ipt": {}})


def _recognise(s: StateShapes) -> dict:
    """IPT from its tensors: width from the head, token width and so ``patch_dim``, layers, the task heads' scales
    from their upsamplers, the switches from which names exist, ``patch_size`` from the position ids or the
    query embedding. ``rgb_range`` (a value inside the mean shift's bias, not its shape), ``num_heads`` and
    ``pos_every`` change no tensor: the published 255, 12 (or the largest divisor of the token width up to 16)
    and False."""
    n_feats = s.dim("head.0.0.weight", 0)
    dim = s.dim("body.encoder.layers.0.self_attn.in_proj_weight", 1)
    patch_dim = math.isqrt(dim // n_feats)
    if patch_dim * patch_dim * n_feats != dim:
        raise NotThisFamily(f"token width {dim} is not {n_feats} x a square")
    scales = []
    for i in range(s.count("tail.")):
        factor = 1
        for j in range(0, 10, 2):
            key = f"tail.{i}.0.{j}.weight"
            if key in s:
                factor *= math.isqrt(s.dim(key, 0) // s.dim(key, 1))
        scales.append(factor)
    mlp = "body.linear_encoding.weight" in s
    no_pos = "body.position_encoding.position_ids" not in s
    seq = (s.dim("body.position_encoding.position_ids", 1) if not no_pos
           else s.dim("body.query_embed.weight", 1) // dim if mlp else 256)
    side = math.isqrt(seq)
    if side * side != seq:
        raise NotThisFamily(f"{seq} patches do not make a square")
    heads = 12 if dim % 12 == 0 else next(h for h in range(min(dim, 16), 0, -1) if dim % h == 0)
    return {"patch_size": side * patch_dim, "patch_dim": patch_dim, "n_feats": n_feats, "rgb_range": 255,
            "scale": scales[0] if len(scales) == 1 else scales, "num_heads": heads,
            "num_layers": s.count("body.encoder.layers."),
            "num_queries": s.dim("body.query_embed.weight", 0) if mlp else 1, "mlp": mlp, "no_pos": no_pos,
            "no_norm": "body.encoder.layers.0.norm1.weight" not in s}


register_recogniser("IPT", _recognise)

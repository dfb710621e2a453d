"""CATANet: content-aware token aggregation for lightweight SR (Liu et al., "CATANet: Efficient Content-Aware
Token Aggregation for Lightweight Image Super-Resolution", CVPR 2025), as neosr trains it.

Module names, buffers and constructor arguments follow neosr's ``catanet`` (``catanet_arch.py``), so its
checkpoints load with ``strict=True`` (the token centres ``means`` and the ``initted`` flag included) and give the
same output. A 3x3 conv, ``block_num`` blocks (a token-aggregation block ``TAB``, a local-region attention ``LRSA``,
a 3x3 conv with a shortcut), a long skip, a PixelShuffle head (x4 as two x2 steps, x2 / x3 one step, x1 none) and a
bilinear image skip.

TAB: tokens are assigned to the most similar of ``num_tokens`` centres (cosine similarity), sorted by centre (a
stable order), cut into groups of ``group_size``; each group attends to its own and the next group's tokens, and
every token to the centres (two softmaxes, summed). The centres are the ``means`` buffer, or before the first
training step the means of ``num_tokens`` consecutive token runs. In training the centres are refined by
``n_iters`` k-means steps (the last one differentiable) and ``means`` follows them by an EMA (decay 0.999; the
first step copies them and sets ``initted``). All of it is branch-free on tensor values: static shapes, no host
syncs, one graph per input shape on XLA.

LRSA: attention inside overlapping ``patch_size`` windows (stride ``patch_size - 2``, the last window moved
inside the image; overlaps halved as neosr does), then a convolutional FFN. Where a side is shorter than the
window, the window is the whole side (neosr's code fails there or drops rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError
from anysr.archs.recognition.recognise import NotThisFamily, StateShapes, register_recogniser
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

DEFAULT_GROUP_SIZE = (256, 128, 64, 32)
DEFAULT_NUM_TOKENS = (16, 32, 64, 128)
DEFAULT_N_ITERS = (5,)
DEFAULT_PATCH_SIZE = (16, 20, 24, 28)
EMA_DECAY = 0.999


def _assign(x_n: torch.Tensor, centres_n: torch.Tensor) -> torch.Tensor:
    """One-hot assignment ``(b, n, k)`` of normalised tokens to the most similar normalised centre."""
    best = torch.einsum("bnd,kd->bnk", x_n, centres_n).argmax(-1, keepdim=True)
    return (best == torch.arange(centres_n.shape[0], device=x_n.device)).to(x_n.dtype)


def centre_step(x_n: torch.Tensor, centres_n: torch.Tensor) -> torch.Tensor:
    """One k-means step over the whole batch: the normalised sum of each centre's tokens (a centre nobody chose
    stays). ``x_n`` (b, n, d) and ``centres_n`` (k, d) normalised."""
    onehot = _assign(x_n, centres_n)
    sums = torch.einsum("bnk,bnd->kd", onehot, x_n)
    used = onehot.sum((0, 1)) > 0
    return torch.where(used.unsqueeze(-1), F.normalize(sums, dim=-1), centres_n)


class PreNorm(nn.Module):
    """A layer norm before ``fn``."""

    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x: torch.Tensor, *args: object) -> torch.Tensor:
        return self.fn(self.norm(x), *args)


class DWConv(nn.Module):
    """Depth-wise conv and GELU on tokens ``(b, h*w, c)``."""

    def __init__(self, hidden_features: int, kernel_size: int = 5) -> None:
        super().__init__()
        self.depthwise_conv = nn.Sequential(
            nn.Conv2d(hidden_features, hidden_features, kernel_size, padding=kernel_size // 2,
                      groups=hidden_features), nn.GELU())

    def forward(self, x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        b, n, c = x.shape
        y = self.depthwise_conv(x.transpose(1, 2).reshape(b, c, *size))
        return y.flatten(2).transpose(1, 2)


class ConvFFN(nn.Module):
    """``fc2(y + dw(y))`` with ``y = gelu(fc1(x))``."""

    def __init__(self, dim: int, hidden: int, kernel_size: int = 5) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.dwconv = DWConv(hidden, kernel_size)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
        x = self.act(self.fc1(x))
        return self.fc2(x + self.dwconv(x, size))


class IRCA(nn.Module):
    """Keys and values of the token centres."""

    def __init__(self, dim: int, qk_dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_k = nn.Linear(dim, qk_dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)

    def forward(self, centres: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self.to_k(centres).unflatten(-1, (self.heads, -1)).transpose(0, 1)
        v = self.to_v(centres).unflatten(-1, (self.heads, -1)).transpose(0, 1)
        return k, v  # (heads, k, d)


class IASA(nn.Module):
    """Attention inside groups of sorted tokens (each group: its own and the next group's keys) plus attention to
    the centres."""

    def __init__(self, dim: int, qk_dim: int, heads: int, group_size: int) -> None:
        super().__init__()
        self.heads = heads
        self.group_size = group_size
        self.to_q = nn.Linear(dim, qk_dim, bias=False)
        self.to_k = nn.Linear(dim, qk_dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, order: torch.Tensor, k_c: torch.Tensor, v_c: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        gs = min(n, self.group_size)
        ng = (n + gs - 1) // gs  # positive operands: ONNX divides integers truncating
        pad = ng * gs - n
        # the sorted tokens, then the last ones mirrored: pad for the queries, pad + gs for the keys (wrapping
        # round where the sequence is shorter than that)
        ext = torch.cat([torch.arange(n, device=x.device),
                         (n - 1 - torch.arange(pad + gs, device=x.device)).remainder(n)])
        xs = torch.gather(x, 1, order[:, ext].unsqueeze(-1).expand(-1, -1, c))
        h = self.heads
        q = self.to_q(xs[:, : ng * gs]).reshape(b, ng, gs, h, -1).transpose(2, 3)
        k = self.to_k(xs).reshape(b, ng + 1, gs, h, -1).transpose(2, 3)
        v = self.to_v(xs).reshape(b, ng + 1, gs, h, -1).transpose(2, 3)
        k = torch.cat([k[:, :ng], k[:, 1:]], dim=3)
        v = torch.cat([v[:, :ng], v[:, 1:]], dim=3)
        out = F.scaled_dot_product_attention(q, k, v)  # (b, ng, h, gs, d)
        qg = q.transpose(1, 2).reshape(b, h, ng * gs, -1)
        out_c = F.scaled_dot_product_attention(qg, k_c.unsqueeze(0).expand(b, -1, -1, -1),
                                               v_c.unsqueeze(0).expand(b, -1, -1, -1))
        out = out.transpose(1, 2).reshape(b, h, ng * gs, -1) + out_c
        out = out.transpose(1, 2).reshape(b, ng * gs, -1)[:, :n]
        # the inverse permutation: each token's place in the sorted sequence
        back = torch.zeros_like(order).scatter(1, order, torch.arange(n, device=x.device).expand(b, n))
        out = torch.gather(out, 1, back.unsqueeze(-1).expand(-1, -1, out.shape[-1]))
        return self.proj(out)


class TAB(nn.Module):
    """Token aggregation block: grouped attention over content-sorted tokens, a 1x1 conv, a ConvFFN."""

    means: torch.Tensor
    initted: torch.Tensor

    def __init__(self, dim: int, qk_dim: int, mlp_dim: int, heads: int, n_iter: int = 3, num_tokens: int = 8,
                 group_size: int = 128, ema_decay: float = EMA_DECAY) -> None:
        super().__init__()
        self.n_iter = n_iter
        self.ema_decay = ema_decay
        self.num_tokens = num_tokens
        self.norm = nn.LayerNorm(dim)
        self.mlp = PreNorm(dim, ConvFFN(dim, mlp_dim))
        self.irca_attn = IRCA(dim, qk_dim, heads)
        self.iasa_attn = IASA(dim, qk_dim, heads, group_size)
        self.register_buffer("means", torch.randn(num_tokens, dim))
        self.register_buffer("initted", torch.tensor(False))
        self.conv1x1 = nn.Conv2d(dim, dim, 1, bias=False)

    def _first_centres(self, x: torch.Tensor) -> torch.Tensor:
        """Before any training step: the means of ``num_tokens`` consecutive runs of the tokens (padded by the
        last tokens mirrored to a multiple of ``num_tokens``, one whole run more at a multiple), over the batch."""
        b, n, c = x.shape
        k = self.num_tokens
        pad = k - n % k
        tail = (n - 1 - torch.arange(pad, device=x.device)).remainder(n)
        xp = torch.cat([x, x[:, tail]], dim=1)
        return xp.reshape(b, k, -1, c).mean((0, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, _, hh, ww = x.shape
        x = x.flatten(2).transpose(1, 2)
        residual = x
        x = self.norm(x)
        with torch.no_grad():
            means = self.means.to(x.dtype)
            centres = torch.where(self.initted, means, self._first_centres(x.detach()))
        x_n = F.normalize(x, dim=-1)
        if self.training:
            with torch.no_grad():
                xd = x_n.detach()
                for _ in range(self.n_iter - 1):
                    centres = centre_step(xd, F.normalize(centres, dim=-1))
            centres = centre_step(x_n, F.normalize(centres, dim=-1))  # differentiable in the tokens
        k_c, v_c = self.irca_attn(centres)
        centres = centres.detach()
        with torch.no_grad():
            belong = torch.einsum("bnd,kd->bnk", x_n, F.normalize(centres, dim=-1)).argmax(-1)
            n = belong.shape[1]
            order = torch.argsort(belong * n + torch.arange(n, device=x.device))  # stable: unique keys
        y = self.iasa_attn(x, order, k_c, v_c)
        y = self.conv1x1(y.transpose(1, 2).reshape(y.shape[0], -1, hh, ww))
        x = residual + y.flatten(2).transpose(1, 2)
        x = self.mlp(x, (hh, ww)) + x
        if self.training:
            with torch.no_grad():
                new = centres.to(self.means.dtype)
                ema = self.means * self.ema_decay + new * (1 - self.ema_decay)
                self.means.copy_(torch.where(self.initted, ema, new))
                self.initted.fill_(True)
        return x.transpose(1, 2).reshape(x.shape[0], -1, hh, ww)


def _windows(size: int, ps: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Along one side: the pixel index of every window position ``(n * p,)``, each pixel's divisor (neosr's
    halving of the overlaps: once per overlap region a pixel lies in) and the window length ``p``. Sizes stay
    symbolic where the side exceeds the window (ONNX's dynamic export)."""
    if size <= ps:
        return torch.arange(size, device=device), torch.ones(size, device=device), size
    step = ps - 2
    n = (size - 3) // step + 1  # len(range(0, size - 2, step))
    j = torch.arange(n, device=device)
    starts = (j * step).clamp(max=size - ps)
    index = (starts.unsqueeze(1) + torch.arange(ps, device=device)).flatten()
    r = torch.arange(size, device=device).unsqueeze(1)
    inside = (r >= starts[1:]) & (r < j[1:] * step + 2)  # the overlap region each window after the first starts
    return index, torch.pow(2.0, inside.sum(1).float()), ps


class Attention(nn.Module):
    """Multi-head self-attention over tokens."""

    def __init__(self, dim: int, heads: int, qk_dim: int) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, qk_dim, bias=False)
        self.to_k = nn.Linear(dim, qk_dim, bias=False)
        self.to_v = nn.Linear(dim, dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (f(x).unflatten(-1, (self.heads, -1)).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).flatten(2))


class LRSA(nn.Module):
    """Attention in overlapping windows (averaged back as neosr does), then a ConvFFN."""

    def __init__(self, dim: int, qk_dim: int, mlp_dim: int, heads: int = 1) -> None:
        super().__init__()
        self.layer = nn.ModuleList([PreNorm(dim, Attention(dim, heads, qk_dim)), PreNorm(dim, ConvFFN(dim, mlp_dim))])

    def forward(self, x: torch.Tensor, ps: int) -> torch.Tensor:
        b, c, h, w = x.shape
        (ri, div_h, ph), (ci, div_w, pw) = _windows(h, ps, x.device), _windows(w, ps, x.device)
        crops = x.index_select(2, ri).index_select(3, ci)  # (b, c, nh*ph, nw*pw)
        nh, nw = crops.shape[2] // ph, crops.shape[3] // pw
        t = crops.reshape(b, c, nh, ph, nw, pw).permute(0, 2, 4, 3, 5, 1).reshape(b * nh * nw, ph * pw, c)
        attn, ff = self.layer
        t = attn(t) + t
        t = t.reshape(b, nh, nw, ph, pw, c).permute(0, 5, 1, 3, 2, 4).reshape(b, c, nh * ph, nw * pw)
        # the windows added back in place (scatter-adds: ONNX's index_add cannot take repeated indices)
        t = x.new_zeros(b, c, h, nw * pw).scatter_add(2, ri.view(1, 1, -1, 1).expand_as(t), t)
        y = x.new_zeros(b, c, h, w).scatter_add(3, ci.view(1, 1, 1, -1).expand_as(t), t)
        y = y / (div_h.to(y.dtype).unsqueeze(1) * div_w.to(y.dtype))
        tok = y.flatten(2).transpose(1, 2)
        tok = ff(tok, (h, w)) + tok
        return tok.transpose(1, 2).reshape(b, c, h, w)


def _per_block(name: str, value: Sequence[int] | None, default: Sequence[int], block_num: int) -> list[int]:
    if value is None:
        return [default[i % len(default)] for i in range(block_num)]
    if isinstance(value, int | str) or len(value) != block_num or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
        raise ArchArgumentError(name, f"CATANet needs a list of {block_num} (block_num) integers >= 1, got {value!r}")
    return list(value)


@ARCH_REGISTRY.register()
class CATANet(nn.Module):
    """CATANet (neosr's ``catanet``): see the module docstring. ``patch_size``, ``n_iters``, ``num_tokens`` and
    ``group_size`` are per-block lists (``None``: neosr's pattern, repeated)."""

    def __init__(self, in_chans: int = 3, dim: int = 40, block_num: int = 8, qk_dim: int = 36, mlp_dim: int = 96,
                 heads: int = 4, patch_size: Sequence[int] | None = None, n_iters: Sequence[int] | None = None,
                 num_tokens: Sequence[int] | None = None, group_size: Sequence[int] | None = None,
                 upscale: int = 4) -> None:
        super().__init__()
        for name, value in (("in_chans", in_chans), ("dim", dim), ("block_num", block_num), ("qk_dim", qk_dim),
                            ("mlp_dim", mlp_dim), ("heads", heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArchArgumentError(name, f"CATANet needs an integer {name} >= 1, got {value!r}")
        if dim % heads or qk_dim % heads:
            raise ArchArgumentError("heads", f"CATANet needs heads dividing dim and qk_dim, got {heads}")
        if isinstance(upscale, bool) or upscale not in (1, 2, 3, 4):
            raise ArchArgumentError("upscale", f"CATANet's upscale is 1, 2, 3 or 4, got {upscale!r}")
        self.patch_size = _per_block("patch_size", patch_size, DEFAULT_PATCH_SIZE, block_num)
        if min(self.patch_size) < 3:
            raise ArchArgumentError("patch_size", f"CATANet needs patch sizes >= 3, got {patch_size!r}")
        self.n_iters = _per_block("n_iters", n_iters, DEFAULT_N_ITERS, block_num)
        self.num_tokens = _per_block("num_tokens", num_tokens, DEFAULT_NUM_TOKENS, block_num)
        self.group_size = _per_block("group_size", group_size, DEFAULT_GROUP_SIZE, block_num)
        self.upscale = upscale
        self.block_num = block_num
        self.first_conv = nn.Conv2d(in_chans, dim, 3, 1, 1)
        self.blocks = nn.ModuleList([
            nn.ModuleList([TAB(dim, qk_dim, mlp_dim, heads, self.n_iters[i], self.num_tokens[i], self.group_size[i]),
                           LRSA(dim, qk_dim, mlp_dim, heads)]) for i in range(block_num)])
        self.mid_convs = nn.ModuleList([nn.Conv2d(dim, dim, 3, 1, 1) for _ in range(block_num)])
        if upscale == 4:
            self.upconv1 = nn.Conv2d(dim, dim * 4, 3, 1, 1)
            self.upconv2 = nn.Conv2d(dim, dim * 4, 3, 1, 1)
            self.pixel_shuffle = nn.PixelShuffle(2)
        elif upscale in (2, 3):
            self.upconv = nn.Conv2d(dim, dim * upscale**2, 3, 1, 1)
            self.pixel_shuffle = nn.PixelShuffle(upscale)
        self.last_conv = nn.Conv2d(dim, in_chans, 3, 1, 1)
        self.lrelu = nn.LeakyReLU(0.1)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The blocks, each with its 3x3 conv and shortcut."""
        for (tab, lrsa), conv, ps in zip(self.blocks, self.mid_convs, self.patch_size, strict=True):
            x = x + conv(lrsa(tab(x), ps))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = x if self.upscale == 1 else F.interpolate(x, scale_factor=self.upscale, mode="bilinear",
                                                         align_corners=False)
        x = self.first_conv(x)
        x = self.forward_features(x) + x
        if self.upscale == 4:
            x = self.lrelu(self.pixel_shuffle(self.upconv1(x)))
            x = self.lrelu(self.pixel_shuffle(self.upconv2(x)))
        elif self.upscale != 1:
            x = self.lrelu(self.pixel_shuffle(self.upconv(x)))
        return self.last_conv(x) + base


__all__ = ["CATANet"]


def _recognise(s: StateShapes) -> list[dict] | None:
    """CATANet from its tensors: width and image channels from ``first_conv``, the blocks, ``qk_dim`` and
    ``mlp_dim`` from the first block, ``num_tokens`` from each ``means`` buffer, the scale from the head. Heads,
    patch and group sizes and k-means steps are in no tensor: neosr's defaults (heads 4 where it divides)."""
    if "first_conv.weight" not in s or "last_conv.weight" not in s or "blocks.0.0.means" not in s:
        return None
    dim, in_chans = s.shape("first_conv.weight")[:2]
    blocks = s.indices("mid_convs.")
    if blocks != list(range(len(blocks))):
        raise NotThisFamily("block numbering")
    qk_dim = s.dim("blocks.0.0.iasa_attn.to_q.weight", 0)
    args: dict = {"in_chans": in_chans, "dim": dim, "block_num": len(blocks), "qk_dim": qk_dim,
                  "mlp_dim": s.dim("blocks.0.0.mlp.fn.fc1.weight", 0),
                  "num_tokens": [s.dim(f"blocks.{i}.0.means", 0) for i in blocks]}
    if dim % 4 or qk_dim % 4:
        args["heads"] = 1
    if "upconv1.weight" in s:
        return [{**args, "upscale": 4}]
    if "upconv.weight" in s:
        ratio = s.dim("upconv.weight", 0) // dim
        return [{**args, "upscale": sc} for sc in (2, 3) if sc * sc == ratio]
    return [{**args, "upscale": 1}]


register_recogniser("CATANet", _recognise)
# neosr's name: the class defaults (neosr's), the option file's top-level scale
register_presets("CATANet", scale_arg="upscale", source="neosr", presets={"catanet": {}})

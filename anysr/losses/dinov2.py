"""DINOv2's vision transformer (Oquab et al., "DINOv2: Learning Robust Visual Features without Supervision", 2023)
as a frozen feature network: the official torch-hub checkpoints' key layout (``dinov2_vits14`` / ``vitb14`` /
``vitl14``, and their ``_reg`` variants), its architecture read from the state dict's shapes (width, depth, MLP
width, patch size, position-embedding grid, register tokens; 64-wide heads as all hub models have).

``intermediate_layers`` returns what the hub model's ``get_intermediate_layers(x, n=layers, reshape=True,
norm=True)`` returns: the final-norm'd patch tokens of the listed blocks (in block order) as (N, C, H/p, W/p)
maps. The position embedding is resized to the input's patch grid as DINOv2 does it (bicubic, scale factor
``(grid + 0.1) / M`` for the plain models, size-based and antialiased for the register ones), here as two small
interpolation matrices built once per grid size on the host: one compile per input shape on XLA, no CPU fallback.
Attention through ``F.scaled_dot_product_attention``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["DINOv2", "dinov2_config"]

_HEAD_DIM = 64  # every hub DINOv2 model's attention head width


def dinov2_config(sd: Mapping[str, torch.Tensor], owner: str = "DINOv2") -> dict[str, int]:
    """The architecture of a hub DINOv2 state dict: ``dim``, ``depth``, ``hidden`` (MLP), ``patch``, ``grid`` (the
    position embedding's side), ``registers``. Raises ValueError naming what does not fit."""
    need = ("cls_token", "pos_embed", "patch_embed.proj.weight", "norm.weight")
    lacking = [k for k in need if k not in sd]
    if lacking:
        raise ValueError(f"{owner}: not a DINOv2 hub state dict (lacks {', '.join(lacking)}); give DINOv2's official "
                         "checkpoint, e.g. dinov2_vitb14_pretrain.pth")
    if any(k.startswith("blocks.") and ".mlp.w12." in k for k in sd):
        raise ValueError(f"{owner}: SwiGLU DINOv2 models (dinov2_vitg14) are not supported; use vits14 / vitb14 / "
                         "vitl14")
    if any(k.startswith("blocks.") and k.split(".")[1].isdigit() and k.split(".")[2].isdigit() for k in sd):
        raise ValueError(f"{owner}: chunked-block DINOv2 state dicts (blocks.i.j.*) are not supported; give the hub "
                         "checkpoint's layout (blocks.j.*)")
    dim = int(sd["cls_token"].shape[-1])
    depth = 1 + max((int(k.split(".")[1]) for k in sd if k.startswith("blocks.")), default=-1)
    n_pos = int(sd["pos_embed"].shape[1]) - 1
    grid = math.isqrt(n_pos)
    if depth < 1 or grid * grid != n_pos or dim % _HEAD_DIM:
        raise ValueError(f"{owner}: the DINOv2 state dict does not describe a hub model (width {dim}, {depth} blocks, "
                         f"{n_pos} position embeddings)")
    return {"dim": dim, "depth": depth, "hidden": int(sd["blocks.0.mlp.fc1.weight"].shape[0]),
            "patch": int(sd["patch_embed.proj.weight"].shape[-1]), "grid": grid,
            "registers": int(sd["register_tokens"].shape[1]) if "register_tokens" in sd else 0}


class _PatchEmbed(nn.Module):
    def __init__(self, dim: int, patch: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dim, patch, patch)


class _Attention(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.heads = dim // _HEAD_DIM
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        return self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c))


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class _LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))


class _Block(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = _Attention(dim)
        self.ls1 = _LayerScale(dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = _Mlp(dim, hidden)
        self.ls2 = _LayerScale(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x)) * self.ls1.gamma
        return x + self.mlp(self.norm2(x)) * self.ls2.gamma


def _resize_matrices(grid: int, rows: int, cols: int, offset: float, antialias: bool) -> tuple[torch.Tensor, ...]:
    """(rows, grid) and (cols, grid) matrices doing DINOv2's separable bicubic resize of a grid x grid map."""
    kwargs: dict = ({"scale_factor": ((rows + offset) / grid, (cols + offset) / grid)} if offset
                    else {"size": (rows, cols)})
    eye = torch.eye(grid, dtype=torch.float32)
    row_basis = eye[:, None, :, None].expand(grid, 1, grid, grid)  # image b: row b ones
    col_basis = eye[:, None, None, :].expand(grid, 1, grid, grid)  # image b: column b ones
    a = F.interpolate(row_basis, mode="bicubic", antialias=antialias, **kwargs)
    b = F.interpolate(col_basis, mode="bicubic", antialias=antialias, **kwargs)
    if a.shape[-2:] != (rows, cols):
        raise ValueError(f"DINOv2: the position embedding resize gives {tuple(a.shape[-2:])}, not {(rows, cols)}")
    return a[:, 0, :, 0].T.contiguous(), b[:, 0, 0, :].T.contiguous()


class DINOv2(nn.Module):
    """A hub DINOv2 ViT (no head), built for ``dinov2_config(sd)``; load the state dict with ``load_state_dict``.
    Frozen: parameters without gradients, always in eval mode."""

    def __init__(self, dim: int, depth: int, hidden: int, patch: int = 14, grid: int = 37, registers: int = 0) -> None:
        super().__init__()
        self.patch, self.grid, self.registers = patch, grid, registers
        # the hub models: plain ones resize with a 0.1 offset, no antialias; the register ones by size, antialiased
        self.offset, self.antialias = (0.0, True) if registers else (0.1, False)
        self.patch_embed = _PatchEmbed(dim, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, grid * grid + 1, dim))
        if registers:
            self.register_tokens = nn.Parameter(torch.zeros(1, registers, dim))
        self.mask_token = nn.Parameter(torch.zeros(1, dim))
        self.blocks = nn.ModuleList(_Block(dim, hidden) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self._resize: dict[tuple[int, int, str], tuple[torch.Tensor, ...]] = {}  # per grid and device
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> DINOv2:
        """Always eval: the network is fixed."""
        return super().train(False)

    def _pos_embed(self, rows: int, cols: int, square: bool) -> torch.Tensor:
        pos = self.pos_embed
        if rows * cols == self.grid * self.grid and square:  # DINOv2 keeps it as it is then
            return pos
        key = (rows, cols, str(pos.device))
        if key not in self._resize:
            mats = _resize_matrices(self.grid, rows, cols, self.offset, self.antialias)
            self._resize[key] = tuple(m.to(pos.device) for m in mats)
        a, b = self._resize[key]
        grid = pos[0, 1:].float().reshape(self.grid, self.grid, -1)
        patches = torch.einsum("ri,ijd,cj->rcd", a, grid, b).reshape(1, rows * cols, -1)
        return torch.cat((pos[:, :1].float(), patches), dim=1).to(pos.dtype)

    def intermediate_layers(self, x: torch.Tensor, layers: Sequence[int]) -> list[torch.Tensor]:
        """The final-norm'd patch tokens after each block in ``layers`` (taken in block order), as (N, C, h, w)
        maps; ``x``: (N, 3, H, W) with H, W multiples of the patch size."""
        n, _, h, w = x.shape
        rows, cols = h // self.patch, w // self.patch
        t = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
        t = torch.cat((self.cls_token.expand(n, -1, -1), t), dim=1) + self._pos_embed(rows, cols, h == w)
        if self.registers:
            t = torch.cat((t[:, :1], self.register_tokens.expand(n, -1, -1), t[:, 1:]), dim=1)
        wanted = set(layers)
        out = []
        for i, block in enumerate(self.blocks[: max(wanted) + 1]):
            t = block(t)
            if i in wanted:
                p = self.norm(t[:, 1 + self.registers:])
                out.append(p.reshape(n, rows, cols, -1).permute(0, 3, 1, 2))
        return out

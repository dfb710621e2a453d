"""A batched JPEG round trip in torch (BasicSR 1.4.2's ``DiffJPEG`` numbers), differentiable if asked.

What it computes, per image of a (B, 3, H, W) RGB batch in [0, 1] (each sample with its own quality):

1. zero-pad the bottom/right to multiples of 16 (two 8x8 chroma blocks per 16 pixels);
2. full-range BT.601 RGB -> YCbCr on [0, 255] (JFIF), chroma averaged over 2x2 pixels;
3. per 8x8 block of each plane: subtract 128, orthonormal 2-D DCT-II;
4. divide by the quantisation table times ``factor(quality)`` and round (``torch.round``, or with
   ``differentiable=True`` BasicSR's ``round(x) + (x - round(x))**3``, whose gradient is not zero);
5. multiply back, inverse DCT, add 128, nearest 2x chroma upsampling, YCbCr -> RGB, clamp to [0, 255],
   divide by 255 and crop the padding.

``factor(q) = 50 / q`` below quality 50 and ``2 - q / 50`` from 50 on (libjpeg's scaling, without its
integer rounding of the table entries). The tables are the JPEG standard's (ITU-T T.81, Annex K) luminance and
chrominance tables, the chroma one with its top-left 4x4 only and 99 elsewhere, both transposed with respect
to the block layout as BasicSR's DiffJPEG (from mlomnitz/DiffJPEG) uses them. The result is close to, not
equal to, a real codec's (:func:`anysr.data.degradation.jpeg.jpeg_cv2`): no integer tables, no entropy coding
rounding paths, different chroma filters.

Everything is tensor arithmetic on the input's device (no host sync, no ``.item()``); quality may be a number
or a (B,) tensor in (0, 100) on any device. Autocast is switched off inside, so the round trip runs in the
input's dtype whatever precision the model trains in.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anysr.errors import DataError, OptionError
from anysr.ops.autocast import autocast_off

__all__ = ["DiffJPEG", "quality_to_factor", "diff_round"]

# ITU-T T.81 Annex K, Table K.1 (luminance) and the top-left 4x4 of Table K.2 (chrominance); row = vertical freq.
_LUMA_TABLE = (
    (16, 11, 10, 16, 24, 40, 51, 61),
    (12, 12, 14, 19, 26, 58, 60, 55),
    (14, 13, 16, 24, 40, 57, 69, 56),
    (14, 17, 22, 29, 51, 87, 80, 62),
    (18, 22, 37, 56, 68, 109, 103, 77),
    (24, 35, 55, 64, 81, 104, 113, 92),
    (49, 64, 78, 87, 103, 121, 120, 101),
    (72, 92, 95, 98, 112, 100, 103, 99),
)
_CHROMA_CORNER = ((17, 18, 24, 47), (18, 21, 26, 66), (24, 26, 56, 99), (47, 66, 99, 99))
# JFIF full-range BT.601: rows give Y, Cb, Cr from R, G, B; and the inverse rows give R, G, B from Y, Cb, Cr.
_RGB_TO_YCC = ((0.299, 0.587, 0.114), (-0.168736, -0.331264, 0.5), (0.5, -0.418688, -0.081312))
_YCC_TO_RGB = ((1.0, 0.0, 1.402), (1.0, -0.344136, -0.714136), (1.0, 1.772, 0.0))


def diff_round(x: Tensor) -> Tensor:
    """``round(x) + (x - round(x))**3``: BasicSR's rounding with a non-zero gradient."""
    r = torch.round(x)
    return r + (x - r) ** 3


def quality_to_factor(quality: float | Tensor) -> float | Tensor:
    """The table scale of a JPEG quality: ``50 / q`` for ``q < 50``, else ``2 - q / 50`` (element-wise)."""
    if isinstance(quality, Tensor):
        return torch.where(quality < 50, 5000.0 / quality, 200.0 - quality * 2) / 100.0
    q = float(quality)
    return (5000.0 / q if q < 50 else 200.0 - q * 2) / 100.0


def _dct_basis(inverse: bool) -> Tensor:
    """(64, 64) float32: row ``8x + y`` (pixel), column ``8u + v`` (frequency) for the forward transform,
    the roles swapped for the inverse, of ``cos((2x+1) u pi / 16) cos((2y+1) v pi / 16)``."""
    n = torch.arange(8, dtype=torch.float64)
    c = torch.cos((2 * n[:, None] + 1) * n[None, :] * math.pi / 16)  # c[x, u]
    basis = torch.einsum("xu,yv->xyuv", c, c) if not inverse else torch.einsum("ux,vy->xyuv", c, c)
    return basis.float().reshape(64, 64)


def _alpha() -> Tensor:
    a = torch.tensor([1.0 / math.sqrt(2.0)] + [1.0] * 7, dtype=torch.float64)
    return torch.outer(a, a)


class DiffJPEG(nn.Module):
    """JPEG compression and decompression of an RGB batch in [0, 1] at a per-sample quality.

    ``differentiable=False`` rounds with ``torch.round`` (what Real-ESRGAN's data synthesis uses);
    ``True`` uses :func:`diff_round`. The constants are non-persistent buffers: ``.to(device)`` moves them
    and nothing appears in a state dict. Call as ``jpeg(x, quality)``.
    """

    def __init__(self, differentiable: bool = True) -> None:
        super().__init__()
        self.differentiable = bool(differentiable)
        luma = torch.tensor(_LUMA_TABLE, dtype=torch.float32).T.contiguous()
        chroma = torch.full((8, 8), 99.0)
        chroma[:4, :4] = torch.tensor(_CHROMA_CORNER, dtype=torch.float32)
        chroma = chroma.T.contiguous()
        buffers = {
            "y_table": luma, "c_table": chroma,
            "rgb_to_ycc": torch.tensor(_RGB_TO_YCC, dtype=torch.float32).T.contiguous(),
            "ycc_shift": torch.tensor([0.0, 128.0, 128.0]),
            "ycc_to_rgb": torch.tensor(_YCC_TO_RGB, dtype=torch.float32).T.contiguous(),
            "rgb_shift": torch.tensor([0.0, -128.0, -128.0]),
            "dct": _dct_basis(inverse=False), "dct_scale": (_alpha() * 0.25).float(),
            "idct": _dct_basis(inverse=True), "idct_alpha": _alpha().float(),
        }
        for name, value in buffers.items():
            self.register_buffer(name, value, persistent=False)

    def extra_repr(self) -> str:
        return f"differentiable={self.differentiable}"

    def _round(self, x: Tensor) -> Tensor:
        return diff_round(x) if self.differentiable else torch.round(x)

    def _code_plane(self, plane: Tensor, table: Tensor, c: dict[str, Tensor]) -> Tensor:
        """Blocks, DCT, quantise, dequantise, inverse DCT, merge: (B, h, w) -> (B, h, w); h, w multiples of 8."""
        b, h, w = plane.shape
        blocks = plane.reshape(b, h // 8, 8, w // 8, 8).permute(0, 1, 3, 2, 4).reshape(b, -1, 8, 8)
        blocks = blocks - 128
        coeff = c["dct_scale"] * (blocks.reshape(-1, 64) @ c["dct"]).reshape(blocks.shape)
        coeff = self._round(coeff / table) * table
        coeff = coeff * c["idct_alpha"]
        blocks = 0.25 * (coeff.reshape(-1, 64) @ c["idct"]).reshape(coeff.shape) + 128
        return blocks.reshape(b, h // 8, w // 8, 8, 8).permute(0, 1, 3, 2, 4).reshape(b, h, w)

    def forward(self, x: Tensor, quality: float | Tensor) -> Tensor:
        """``x``: (B, 3, H, W) RGB in [0, 1]; ``quality``: a number or B values in (0, 100). Same shape out."""
        if x.dim() != 4 or x.shape[1] != 3 or not x.is_floating_point():
            raise DataError(f"DiffJPEG: expected a float RGB batch (B, 3, H, W), got {x.dtype} {tuple(x.shape)}")
        b, _, h, w = x.shape
        # Half types cannot hold 0..255 with the precision the quantiser needs: work in float32 then.
        work = torch.float64 if x.dtype == torch.float64 else torch.float32
        c = {name: buf.to(device=x.device, dtype=work) for name, buf in self.named_buffers()}
        if isinstance(quality, Tensor):
            q = quality.to(device=x.device, dtype=work).reshape(-1)
            if q.numel() not in (1, b):
                raise DataError(f"DiffJPEG: quality has {q.numel()} values for a batch of {b}")
            factor = quality_to_factor(q).expand(b).reshape(b, 1, 1, 1)
            y_table = c["y_table"].expand(b, 1, 8, 8) * factor
            c_table = c["c_table"].expand(b, 1, 8, 8) * factor
        else:
            if not 0 < float(quality) < 100:
                raise OptionError(f"DiffJPEG: quality must lie in (0, 100), got {quality!r}")
            factor = quality_to_factor(quality)
            y_table, c_table = c["y_table"] * factor, c["c_table"] * factor
        with autocast_off(x):
            img = F.pad(x.to(work), (0, -w % 16, 0, -h % 16)) * 255
            ycc = img.permute(0, 2, 3, 1) @ c["rgb_to_ycc"] + c["ycc_shift"]
            chroma = F.avg_pool2d(ycc[..., 1:].permute(0, 3, 1, 2), kernel_size=2, stride=2)
            y = self._code_plane(ycc[..., 0], y_table, c)
            cb = self._code_plane(chroma[:, 0], c_table, c)
            cr = self._code_plane(chroma[:, 1], c_table, c)
            hh, ww = cb.shape[1:]
            up = torch.stack((cb, cr), dim=-1)[:, :, None, :, None, :].expand(b, hh, 2, ww, 2, 2)
            ycc = torch.cat((y.unsqueeze(-1), up.reshape(b, 2 * hh, 2 * ww, 2)), dim=-1)
            rgb = (ycc + c["rgb_shift"]) @ c["ycc_to_rgb"]
            rgb = rgb.permute(0, 3, 1, 2).clamp(0, 255) / 255
            return rgb[:, :, :h, :w].to(x.dtype)

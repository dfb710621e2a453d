"""Modulated deformable convolution (DCNv2) and bilinear warping in plain PyTorch.

No compiled extension and no torchvision: for each kernel tap the input is sampled bilinearly at the deformed
positions with ``torch.gather`` (zero outside the image, as torchvision and mmcv do), weighted by the mask and
multiplied into the output with one matmul. Every shape depends only on the input shapes and there is no
data-dependent Python control flow, so the same code runs on CPU, CUDA, MPS and XLA (one compiled graph per
shape) and under ``torch.autocast``; gradients come from autograd.

Offset / mask layout (the layout of torchvision, mmcv and BasicSR's CUDA op): for ``G`` deformable groups and a
``kh x kw`` kernel, ``offset`` has ``2 * G * kh * kw`` channels ordered (group, kernel row, kernel column,
[dy, dx]) and ``mask`` has ``G * kh * kw`` channels ordered (group, kernel row, kernel column). Input channel
``c`` belongs to deformable group ``c // (C / G)``.

``torchvision.ops.deform_conv2d`` is used instead when ``backend='torchvision'``, or with ``backend='auto'``
when torchvision imports and the tensors are on a CPU or CUDA device; ``'pure'`` forces this implementation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.nn import functional as F

BACKENDS = ("auto", "pure", "torchvision")
PADDING_MODES = ("zeros", "border")


def _pair(x: int | Iterable[int], name: str) -> tuple[int, int]:
    if isinstance(x, Iterable):
        vals = tuple(int(v) for v in x)
        if len(vals) != 2:
            raise ValueError(f"{name}: expected an int or a pair of ints, got {x!r}")
        return vals  # type: ignore[return-value]
    return int(x), int(x)


_TORCHVISION_OP: Callable[..., torch.Tensor] | None | bool = False  # False: not looked up yet


def _torchvision_deform_conv2d() -> Callable[..., torch.Tensor] | None:
    """torchvision's compiled op, or None when torchvision is missing or broken (it is optional).

    Looked up once, never while ``torch.compile`` traces (the pure path is traced then).
    """
    global _TORCHVISION_OP
    if _TORCHVISION_OP is False:
        if torch.compiler.is_compiling():
            return None
        try:
            from torchvision.ops import deform_conv2d  # type: ignore[import-not-found]  # noqa: PLC0415 - optional dependency
        except (ImportError, RuntimeError, AttributeError, OSError):
            deform_conv2d = None
        _TORCHVISION_OP = deform_conv2d
    return _TORCHVISION_OP  # type: ignore[return-value]


def sample_bilinear(x: torch.Tensor, px: torch.Tensor, py: torch.Tensor, padding_mode: str = "zeros",
                    weight: torch.Tensor | None = None) -> torch.Tensor:
    """Bilinear samples of ``x`` at pixel coordinates ``(px, py)``, one set of points per channel group.

    Args:
        x: (b, c, h, w) image or features.
        px, py: (b, n, g) column / row coordinates in pixels (0 is the centre of the first pixel); the ``g``
            groups split the channels into ``g`` equal parts, each sampled at its own points.
        padding_mode: ``'zeros'`` (corners outside the image count as 0) or ``'border'`` (coordinates are
            clamped into the image first).
        weight: optional (b, n, g) factor applied to every sample (the DCNv2 mask).

    Returns:
        (b, n, g, c // g) samples in ``x``'s dtype. Each corner is one gather of whole rows (contiguous
        channel vectors) from a zero-bordered channels-last copy of ``x``; coordinates and
        interpolation weights are computed in at least float32, so bf16 inputs do not round the positions.
    """
    if padding_mode not in PADDING_MODES:
        raise ValueError(f"padding_mode: {padding_mode!r} is not supported; use one of {', '.join(PADDING_MODES)}")
    g = px.shape[2]
    if x.shape[1] % g:
        raise ValueError(f"sample_bilinear: {x.shape[1]} channels cannot be split into {g} groups")
    return _sample_rows(_padded_rows(x, g), x.shape, px, py, padding_mode, weight)


def _padded_rows(x: torch.Tensor, g: int) -> torch.Tensor:
    """x (b, c, h, w) as rows of channel vectors (b * (h + 4) * (w + 4) * g, c // g): channels last, a 2-pixel
    zero border, row = (batch * (h + 4) * (w + 4) + pixel) * g + group."""
    b, c, h, w = x.shape
    return F.pad(x.permute(0, 2, 3, 1), (0, 0, 2, 2, 2, 2)).reshape(b * (h + 4) * (w + 4) * g, c // g)


def _sample_rows(rows: torch.Tensor, shape: torch.Size, px: torch.Tensor, py: torch.Tensor, padding_mode: str,
                 weight: torch.Tensor | None) -> torch.Tensor:
    """``sample_bilinear`` on ``_padded_rows`` of an input of ``shape``."""
    b, c, h, w = shape
    n, g = px.shape[1], px.shape[2]
    cdtype = torch.promote_types(px.dtype, torch.float32)
    px, py = px.to(cdtype), py.to(cdtype)
    if padding_mode == "border":
        px = px.clamp(0, w - 1)
        py = py.clamp(0, h - 1)
    x0f = torch.floor(px.detach())
    y0f = torch.floor(py.detach())
    lx, ly = px - x0f, py - y0f
    # Top-left corners are clamped to [-2, size] (a clamped corner lies outside the image on both sides), so all
    # four corners index the zero-bordered rows and the ones outside the image read zeros: no validity masks.
    wp = w + 4
    base = (torch.arange(b, device=rows.device).view(b, 1, 1) * ((h + 4) * wp * g)
            + torch.arange(g, device=rows.device).view(1, 1, g))
    idx00 = base + ((y0f.clamp(-2, h) + 2).long() * wp + (x0f.clamp(-2, w) + 2).long()) * g
    hy, hx = 1 - ly, 1 - lx
    if weight is not None:
        weight = weight.to(cdtype)
        hy, ly = hy * weight, ly * weight
    # The four corners in one gather (one scatter-add in backward): (b * n * g, 4) rows, then their weighted sum.
    corner = torch.arange(4, device=rows.device)
    steps = (corner % 2 + corner // 2 * wp) * g  # (y0, x0), (y0, x0 + 1), (y0 + 1, x0), (y0 + 1, x0 + 1)
    idx = (idx00.unsqueeze(-1) + steps).reshape(-1, 1).expand(-1, c // g)
    val = rows.gather(0, idx).view(b * n * g, 4, c // g)
    corner_w = torch.stack((hy * hx, hy * lx, ly * hx, ly * lx), dim=-1).to(rows.dtype).view(b * n * g, 4, 1)
    return (val * corner_w).sum(1).view(b, n, g, c // g)


def _deform_conv2d_pure(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor | None, weight: torch.Tensor,
                        bias: torch.Tensor | None, stride: tuple[int, int], padding: tuple[int, int],
                        dilation: tuple[int, int]) -> torch.Tensor:
    b, c, _, _ = x.shape
    c_out, c_per_group, kh, kw = weight.shape
    groups = c // c_per_group
    kk = kh * kw
    dg = offset.shape[1] // (2 * kk)
    ho, wo = offset.shape[-2:]
    cdtype = torch.promote_types(offset.dtype, torch.float32)
    dev = x.device
    rows = _padded_rows(x, dg)
    out_y = (torch.arange(ho, device=dev, dtype=cdtype) * stride[0] - padding[0]).view(1, 1, ho, 1)
    out_x = (torch.arange(wo, device=dev, dtype=cdtype) * stride[1] - padding[1]).view(1, 1, 1, wo)
    # Sampling positions of every tap, (b, kk, ho * wo, dg) each, split per tap with unbind (whose backward is
    # one stack, where per-tap slicing would add a zero-filled offset-sized gradient per tap).
    off_y, off_x = offset.to(cdtype).view(b, dg, kk, 2, ho, wo).unbind(3)
    tap_y = (torch.arange(kh, device=dev, dtype=cdtype) * dilation[0]).repeat_interleave(kw).view(1, kk, 1, 1, 1)
    tap_x = (torch.arange(kw, device=dev, dtype=cdtype) * dilation[1]).repeat(kh).view(1, kk, 1, 1, 1)
    pys = (off_y.permute(0, 2, 3, 4, 1) + (out_y.unsqueeze(-1) + tap_y)).reshape(b, kk, ho * wo, dg)
    pxs = (off_x.permute(0, 2, 3, 4, 1) + (out_x.unsqueeze(-1) + tap_x)).reshape(b, kk, ho * wo, dg)
    masks: tuple[torch.Tensor | None, ...] = (None,) * kk
    if mask is not None:
        masks = mask.view(b, dg, kk, ho, wo).permute(0, 2, 3, 4, 1).reshape(b, kk, ho * wo, dg).unbind(1)
    # weight as (tap, group, in channel of the group, out channel of the group)
    w_taps = weight.view(groups, c_out // groups, c_per_group, kk).permute(3, 0, 2, 1).unbind(0)
    acc: torch.Tensor | None = None
    # One kernel tap at a time: its samples (b, ho * wo, c) are multiplied into the output as they come, so the
    # full column matrix (kk times larger) never exists.
    for py, px, mk, w_k in zip(pys.unbind(1), pxs.unbind(1), masks, w_taps):
        cols = _sample_rows(rows, x.shape, px, py, "zeros", mk)  # (b, ho * wo, dg, c / dg)
        cols = cols.reshape(b, ho * wo, groups, c_per_group).transpose(1, 2)  # (b, groups, ho * wo, c / groups)
        part = torch.matmul(cols, w_k)  # (b, groups, ho * wo, c_out / groups)
        acc = part if acc is None else acc + part
    assert acc is not None
    out = acc.permute(0, 1, 3, 2).reshape(b, c_out, ho, wo)
    if bias is not None:
        out = out + bias.to(out.dtype).view(1, c_out, 1, 1)
    return out


def modulated_deform_conv2d(x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor | None, weight: torch.Tensor,
                            bias: torch.Tensor | None = None, stride: int | Iterable[int] = 1,
                            padding: int | Iterable[int] = 0, dilation: int | Iterable[int] = 1,
                            backend: str = "auto") -> torch.Tensor:
    """Modulated deformable convolution (DCNv2); ``mask=None`` gives plain deformable convolution (DCNv1).

    Args:
        x: (b, c, h, w) input. weight: (c_out, c // groups, kh, kw); ``groups`` follows from the shapes.
        offset: (b, 2 * dg * kh * kw, h_out, w_out), ordered (group, tap, [dy, dx]); ``dg`` deformable groups
            follow from the shape. mask: (b, dg * kh * kw, h_out, w_out) or None. bias: (c_out,) or None.
        stride, padding, dilation: ints or (h, w) pairs, as for ``nn.Conv2d``.
        backend: ``'auto'``, ``'pure'`` or ``'torchvision'`` (see the module docstring).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: {backend!r} is not a DCN backend; use one of {', '.join(BACKENDS)}")
    stride, padding, dilation = _pair(stride, "stride"), _pair(padding, "padding"), _pair(dilation, "dilation")
    if x.dim() != 4:
        raise ValueError(f"modulated_deform_conv2d: x must be (b, c, h, w), got shape {tuple(x.shape)}")
    b, c, h, w = x.shape
    c_out, c_per_group, kh, kw = weight.shape
    if c_per_group == 0 or c % c_per_group or c_out % (c // c_per_group):
        raise ValueError(f"modulated_deform_conv2d: weight {tuple(weight.shape)} does not fit {c} input channels "
                         f"(in_channels / groups must divide both channel counts)")
    ho = (h + 2 * padding[0] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    wo = (w + 2 * padding[1] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    kk = kh * kw
    dg = offset.shape[1] // (2 * kk)
    if offset.dim() != 4 or dg == 0 or offset.shape[1] != 2 * dg * kk or c % dg or tuple(offset.shape) != (
            b, 2 * dg * kk, ho, wo):
        raise ValueError(f"modulated_deform_conv2d: offset must be (b={b}, 2 * groups * {kk}, {ho}, {wo}) with "
                         f"groups dividing {c} channels, got {tuple(offset.shape)}")
    if mask is not None and tuple(mask.shape) != (b, dg * kk, ho, wo):
        raise ValueError(f"modulated_deform_conv2d: mask must be {(b, dg * kk, ho, wo)} for {dg} deformable "
                         f"group(s), got {tuple(mask.shape)}")
    if backend == "torchvision" or (backend == "auto" and x.device.type in ("cpu", "cuda")):
        tv = _torchvision_deform_conv2d()
        if tv is not None:
            return tv(x, offset, weight, bias, stride, padding, dilation, mask)
        if backend == "torchvision":
            raise ValueError("backend: 'torchvision' was asked for but torchvision does not import; "
                             "use backend='pure' (or 'auto')")
    return _deform_conv2d_pure(x, offset, mask, weight, bias, stride, padding, dilation)


class ModulatedDeformConv2d(nn.Module):
    """DCNv2 layer taking offsets and mask as inputs; parameters ``weight`` (c_out, c_in / groups, kh, kw) and
    ``bias`` as in BasicSR's / mmcv's ``ModulatedDeformConv``.

    ``backend`` (an attribute, not a constructor argument, so the signature stays BasicSR's) picks the
    implementation: ``'auto'`` (default), ``'pure'`` or ``'torchvision'``.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Iterable[int], stride: int = 1,
                 padding: int = 0, dilation: int = 1, groups: int = 1, deformable_groups: int = 1,
                 bias: bool = True) -> None:
        super().__init__()
        if groups < 1 or in_channels % groups or out_channels % groups:
            raise ValueError(f"groups: {groups} does not divide in_channels {in_channels} and "
                             f"out_channels {out_channels}")
        if deformable_groups < 1 or in_channels % deformable_groups:
            raise ValueError(f"deformable_groups: {deformable_groups} does not divide in_channels {in_channels}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size, "kernel_size")
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.groups = groups
        self.deformable_groups = deformable_groups
        self.with_bias = bias
        self.backend = "auto"
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels // groups, *self.kernel_size))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Uniform weights in +-1/sqrt(c_in * kh * kw), zero bias."""
        bound = 1.0 / math.sqrt(self.in_channels * self.kernel_size[0] * self.kernel_size[1])
        self.weight.uniform_(-bound, bound)
        if self.bias is not None:
            self.bias.zero_()

    def deform(self, x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """The deformable convolution of ``x`` with this layer's weight at the given offsets and mask."""
        return modulated_deform_conv2d(x, offset, mask, self.weight, self.bias, self.stride, self.padding,
                                       self.dilation, backend=self.backend)

    def forward(self, x: torch.Tensor, offset: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.deform(x, offset, mask)


class ModulatedDeformConv2dPack(ModulatedDeformConv2d):
    """DCNv2 that predicts its own offsets and mask with ``conv_offset`` (zero-initialised), as BasicSR's
    ``ModulatedDeformConvPack``.

    ``conv_offset`` has ``3 * deformable_groups * kh * kw`` output channels, split into thirds ``o1, o2, m``:
    ``cat(o1, o2)`` *is* the offset tensor in the (group, tap, [dy, dx]) layout (it is not "x offsets then y
    offsets"), and ``sigmoid(m)`` is the mask.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Iterable[int], stride: int = 1,
                 padding: int = 0, dilation: int = 1, groups: int = 1, deformable_groups: int = 1,
                 bias: bool = True) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups,
                         deformable_groups, bias)
        kh, kw = self.kernel_size
        self.conv_offset = nn.Conv2d(in_channels, deformable_groups * 3 * kh * kw, kernel_size=(kh, kw),
                                     stride=_pair(stride, "stride"), padding=_pair(padding, "padding"),
                                     dilation=_pair(dilation, "dilation"), bias=True)
        nn.init.zeros_(self.conv_offset.weight)
        nn.init.zeros_(self.conv_offset.bias)

    def offset_and_mask(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Split the ``conv_offset`` output into the offset (first two thirds) and the sigmoid mask."""
        n = out.shape[1] // 3
        return out[:, : 2 * n], torch.sigmoid(out[:, 2 * n:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        offset, mask = self.offset_and_mask(self.conv_offset(x))
        return self.deform(x, offset, mask)


def flow_grid(flow: torch.Tensor, align_corners: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Pixel sampling coordinates ``(px, py)``, each (b, h*w), of a dense flow (b, h, w, 2) in pixels.

    The coordinates go through the same normalise / unnormalise round trip as BasicSR's ``flow_warp`` with
    ``F.grid_sample``, so sampling positions agree with it to the last bit in float32.
    """
    b, h, w, _ = flow.shape
    cdtype = torch.promote_types(flow.dtype, torch.float32)
    gy = torch.arange(h, device=flow.device, dtype=cdtype).view(1, h, 1)
    gx = torch.arange(w, device=flow.device, dtype=cdtype).view(1, 1, w)
    fl = flow.to(cdtype)
    nx = 2.0 * (gx + fl[..., 0]) / max(w - 1, 1) - 1.0
    ny = 2.0 * (gy + fl[..., 1]) / max(h - 1, 1) - 1.0
    if align_corners:
        px = (nx + 1) * ((w - 1) / 2)
        py = (ny + 1) * ((h - 1) / 2)
    else:
        px = (nx + 1) * (w / 2) - 0.5
        py = (ny + 1) * (h / 2) - 0.5
    return px.reshape(b, h * w), py.reshape(b, h * w)


def warp(x: torch.Tensor, flow: torch.Tensor, interp_mode: str = "bilinear", padding_mode: str = "zeros",
         align_corners: bool = True) -> torch.Tensor:
    """Warp ``x`` (b, c, h, w) backwards with ``flow`` (b, h, w, 2; x then y displacement in pixels).

    Same result as BasicSR's ``flow_warp`` (``F.grid_sample`` on the normalised grid) for
    ``interp_mode`` 'bilinear' / 'nearest' and ``padding_mode`` 'zeros' / 'border', built from gathers so it
    also lowers on XLA (where ``grid_sample`` falls back to the CPU).
    """
    if x.shape[-2:] != flow.shape[1:3] or flow.shape[-1] != 2 or flow.shape[0] != x.shape[0]:
        raise ValueError(f"flow_warp: flow must be (b, h, w, 2) matching x {tuple(x.shape)}, got {tuple(flow.shape)}")
    if interp_mode not in ("bilinear", "nearest"):
        raise ValueError(f"interp_mode: {interp_mode!r} is not supported; use 'bilinear' or 'nearest'")
    b, c, h, w = x.shape
    px, py = flow_grid(flow, align_corners)
    if interp_mode == "nearest":
        if padding_mode == "border":
            px, py = px.clamp(0, w - 1), py.clamp(0, h - 1)
        # Rounding half to even, as grid_sample's nearest mode; a corner exactly on a pixel has weight one.
        px, py = torch.round(px).detach(), torch.round(py).detach()
    out = sample_bilinear(x, px.unsqueeze(-1), py.unsqueeze(-1), padding_mode)  # (b, h * w, 1, c)
    return out.view(b, h, w, c).permute(0, 3, 1, 2).contiguous()


__all__ = [
    "BACKENDS",
    "ModulatedDeformConv2d",
    "ModulatedDeformConv2dPack",
    "flow_grid",
    "modulated_deform_conv2d",
    "sample_bilinear",
    "warp",
]

"""LAWFFT: Local Adaptive Weighted Fourier Feature Transformer (traiNNer-redux's ``LAWFFT``, a test architecture
there; no paper).

Module names and constructor arguments follow traiNNer-redux, so its checkpoints load with ``strict=True`` (the
``window_size`` uint8 buffer and the head's ``upscale.MetaUpsample`` record included; the record is replaced by
the network's own, as the original does) and give the same output.

A 3x3 stem (after a pixel-unshuffle with ``unshuffle_mod`` at scales 1 and 2) feeds ``n_rblock`` residual groups of
``n_mblock`` meta blocks and a dynamic depth-wise conv; one of traiNNer-redux's ``UniUpsampleV3`` heads follows.
A meta block is ``x + SFSAS(norm x)`` then ``x + FFN(norm x)``. SFSAS splits the channels: a ``split`` share goes
through two dynamic depth-wise convs (3x3, then 5x5, per image kernels from a squeeze of the map), the rest
through FSAS, a frequency-domain self-attention: the queries' and keys' spectra multiplied (a circular convolution
of q and k), back to pixels, layer-normed, gating the values. Odd blocks do that per ``window_size`` window, even
blocks over the whole (padded) image.

FFTs without FFT kernels: the per-window transforms are exact real DFT matrix products (FFTformer's
``dft_bases`` for any window size: plain matmuls on XLA, in ONNX and under autocast). The whole-image transforms are
separable DFT matrix products built per input size inside the graph (a real DFT along the width, a complex one
along the height, and back), exact to float32 rounding; they cost O(h w (h + w)) per channel against the FFT's
O(h w log(h w)), which the matrix units of an accelerator absorb at training crops, so on CPU / CUDA / MPS outside
an ONNX export ``torch.fft`` computes them (the same numbers within float rounding) and the matrices are used on
XLA and in ONNX exports (plain MatMuls with the sizes symbolic: the index vectors come from the map itself). At a
64x64 input the default network runs 7% slower on a CPU with the matrices than with ``torch.fft``.

Size requirement: the input is padded at the bottom / right (reflect, then edge beyond the side) to a multiple of
``window_size`` (times the unshuffle factor) and the output cropped (the original crops with scale 4 after an
unshuffle, leaving x1 / x2 outputs padded: anysr crops to the real scale); ``tile_multiple`` is that multiple. The
whole-image blocks mix every pixel with every other (circularly), so tiles do not give the whole image's output.
traiNNer-redux's irfft without a size returns an odd padded width one column short (and then fails); anysr
transforms back to the padded size (an odd ``window_size`` works at every size).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, pad_bottom_right
from anysr.archs.ditn_arch import FeedForward  # Restormer's gated FFN
from anysr.archs.fdat_arch import SAMPLE_MODS3, UniUpsampleV3
from anysr.archs.fftformer_arch import dft_bases, from_patches, to_patches, unit_circle
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, width_ratio
from anysr.archs.recognition.recognise_util import fitting_heads, head_mid
from anysr.registry import ARCH_REGISTRY

_NATIVE_FFT = frozenset({"cpu", "cuda", "mps"})


def _float32_math(x: torch.Tensor) -> contextlib.AbstractContextManager:
    """Autocast off (the transforms run in float32, as the original's ``.float()`` FFTs)."""
    if torch.amp.is_autocast_available(x.device.type):
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


def uses_fft_kernels(x: torch.Tensor) -> bool:
    """Whether whole-image transforms of ``x`` run as ``torch.fft`` (a device with FFT kernels, outside an ONNX
    export / trace) rather than as DFT matrix products."""
    return x.device.type in _NATIVE_FFT and not torch.onnx.is_in_onnx_export() and not torch.jit.is_tracing()


def _positions(x: torch.Tensor, dim: int) -> torch.Tensor:
    """0, 1, ..., n - 1 along ``dim`` of ``x`` (int64), from the map itself so a traced ONNX graph keeps the size
    symbolic."""
    ones = torch.ones_like(x.select(0, 0).select(0, 0).select(1 if dim == -2 else 0, 0), dtype=torch.int64)
    return ones.cumsum(0) - 1


def circular_conv2d_dft(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``irfft2(rfft2(q) * rfft2(k), s=(h, w))`` (float32) as separable DFT matrix products built for this size."""
    h, w = q.shape[-2:]
    ih, iw = _positions(q, -2), _positions(q, -1)
    n_w = w // 2 + 1
    cos_w, sin_w = unit_circle(iw.view(-1, 1) * iw[:n_w].view(1, -1), w)  # (w, w // 2 + 1)
    cos_h, sin_h = unit_circle(ih.view(-1, 1) * ih.view(1, -1), h)  # (h, h), symmetric
    rfft_w = torch.cat([cos_w, -sin_w], 1)  # pixels -> [real | imag] along the width
    dft_h = torch.cat([torch.cat([cos_h, sin_h], 1), torch.cat([-sin_h, cos_h], 1)], 0)  # [re; im] -> [re; im]
    idft_h = torch.cat([torch.cat([cos_h, -sin_h], 1), torch.cat([sin_h, cos_h], 1)], 0) / h
    col = iw[:n_w].view(-1, 1)
    weight = torch.where((col == 0) | (2 * col == w), 1.0, 2.0) / w
    irfft_w = torch.cat([cos_w.t() * weight, -sin_w.t() * weight], 0)  # (2 (w // 2 + 1), w)

    def spectrum(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        half = x.float() @ rfft_w  # (b, c, h, 2 n_w)
        full = dft_h @ torch.cat(half.chunk(2, -1), -2)  # (b, c, 2h, n_w)
        return full.chunk(2, -2)

    qr, qi = spectrum(q)
    kr, ki = spectrum(k)
    prod = idft_h @ torch.cat([qr * kr - qi * ki, qr * ki + qi * kr], -2)
    return torch.cat(prod.chunk(2, -2), -1) @ irfft_w


def circular_conv2d(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The circular convolution of ``q`` and ``k`` over their last two dims (float32): ``torch.fft`` where the
    device has FFT kernels (``uses_fft_kernels``), DFT matrix products elsewhere."""
    if uses_fft_kernels(q):
        return torch.fft.irfft2(torch.fft.rfft2(q.float()) * torch.fft.rfft2(k.float()), s=tuple(q.shape[-2:]))
    return circular_conv2d_dft(q, k)


class DynamicLocal(nn.Module):
    """A depth-wise ``kernel_size`` conv whose kernels (one set per image) come from the map's mean through two
    1x1 convs; computed as a sum of shifted products (no per-batch grouped conv: any batch, one graph)."""

    def __init__(self, channels: int = 64, kernel_size: int = 3) -> None:
        super().__init__()
        self.kernel_gen = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, channels, 1), nn.ReLU(),
                                        nn.Conv2d(channels, channels * kernel_size * kernel_size, 1))
        self.kernel_size = kernel_size
        self.padding = kernel_size // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ks, pad = self.kernel_size, self.padding
        pooled = x.mean((2, 3), keepdim=True)
        kernels = self.kernel_gen[1:](pooled).unflatten(1, (-1, ks * ks))  # (b, c, k*k, 1, 1)
        xp = F.pad(x, (pad, pad, pad, pad))
        out = None
        for i in range(ks):
            rows = xp[:, :, i: i - 2 * pad or None]
            for j in range(ks):
                term = rows[:, :, :, j: j - 2 * pad or None] * kernels[:, :, i * ks + j]
                out = term if out is None else out + term
        return out


class FSAS(nn.Module):
    """Frequency-domain self-attention: q, k, v from a 1x1 and a 3x3 depth-wise conv; the circular convolution of
    q and k (per ``window_size`` window when ``windowed``, else over the whole map), layer-normed, gates v."""

    def __init__(self, dim: int = 64, mid_factor: float = 1.0, window_size: int = 8, windowed: bool = False) -> None:
        super().__init__()
        mid = int(dim * 3 * mid_factor)
        self.to_hidden = nn.Conv2d(dim, mid, 1, bias=True)
        self.to_hidden_dw = nn.Conv2d(mid, mid, 3, 1, 1, groups=mid, bias=True)
        self.project_out = nn.Conv2d(int(dim * mid_factor), dim, 1, bias=True)
        self.patch = windowed
        self.norm = LayerNorm2d(int(dim * mid_factor), eps=1e-6)
        self.patch_size = window_size
        self.window_size = window_size  # what tiling checks the tile multiple against (not a state-dict key)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.to_hidden_dw(self.to_hidden(x)).chunk(3, dim=1)
        with _float32_math(q):
            if self.patch:
                p = self.patch_size
                fwd, inv = dft_bases(q.device, p)
                qr, qi = (to_patches(q, p) @ fwd).chunk(2, -1)
                kr, ki = (to_patches(k, p) @ fwd).chunk(2, -1)
                corr = from_patches(torch.cat([qr * kr - qi * ki, qr * ki + qi * kr], -1) @ inv, p)
            else:
                corr = circular_conv2d(q, k)
            gated = (v * self.norm(corr)).to(v.dtype)
        return self.project_out(gated)


class SFSAS(nn.Module):
    """The first ``split`` share of the channels through two dynamic depth-wise convs (3x3, 5x5), the rest through
    FSAS, then a 1x1 conv of both."""

    def __init__(self, dim: int = 64, split: float = 0.25, t_mid_factor: float = 1.0, window_size: int = 8,
                 windowed: bool = True) -> None:
        super().__init__()
        local = int(split * dim)
        self.local = nn.Sequential(DynamicLocal(local), DynamicLocal(local, 5))
        self.att = FSAS(dim - local, t_mid_factor, window_size, windowed)
        self.last = nn.Conv2d(dim, dim, 1)
        self.split = [local, dim - local]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.split(self.split, dim=1)
        return self.last(torch.cat([self.local(x1), self.att(x2)], dim=1))


class MetaBlock(nn.Module):
    """``x + SFSAS(norm x)``, then ``x + FeedForward(norm x)`` (channel layer norms, eps 1e-6)."""

    def __init__(self, dim: int = 64, split: float = 0.25, t_mid_factor: float = 1.0, window_size: int = 8,
                 windowed: bool = True, mlp: float = 2.66) -> None:
        super().__init__()
        self.token_mix = nn.Sequential(LayerNorm2d(dim, eps=1e-6),
                                       SFSAS(dim, split, t_mid_factor, window_size, windowed))
        self.channel_mix1 = nn.Sequential(LayerNorm2d(dim, eps=1e-6), FeedForward(dim, mlp, True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.token_mix(x) + x
        return self.channel_mix1(x) + x


class ResidualMeta(nn.Module):
    """``meta_b`` meta blocks (whole-image FSAS in even ones, windowed in odd ones), a dynamic 3x3 depth-wise conv,
    plus the input."""

    def __init__(self, dim: int = 64, meta_b: int = 6, split: float = 0.25, t_mid_factor: float = 1.0,
                 window_size: int = 8, mlp: float = 2.66) -> None:
        super().__init__()
        self.residual = nn.Sequential(*[MetaBlock(dim, split, t_mid_factor, window_size, bool(i % 2), mlp)
                                        for i in range(meta_b)], DynamicLocal(dim))
        self.apply(_init_weights)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.residual(x) + x


def _init_weights(m: nn.Module) -> None:
    if isinstance(m, (nn.Conv2d, nn.Linear)):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)


def _keep_own_meta(module: nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """A checkpoint's ``upscale.MetaUpsample`` is replaced by the network's own (as the original's
    ``load_state_dict`` does)."""
    key = prefix + "upscale.MetaUpsample"
    if key in state_dict:
        state_dict[key] = module.upscale.MetaUpsample


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArchArgumentError(name, f"LAWFFT needs an integer {name} >= 1, not {value!r}")


@ARCH_REGISTRY.register()
class LAWFFT(nn.Module):
    """LAWFFT (see the module docstring).

    Args:
        in_ch: image channels (in and out). dim: width. split: share of each block's channels in the dynamic
            local branch. scale: upscale factor. n_rblock / n_mblock: residual groups / meta blocks per group.
        t_mid_factor: FSAS's q / k / v width factor. window_size: FSAS window (and the padding multiple).
        mlp_factor: feed-forward hidden factor. unshuffle_mod: pixel-unshuffle stem at scales 1 and 2 (the body
            then runs at a quarter of x4's output). upsampler: traiNNer-redux's head kind. mid_dim: its mid width.
    """

    def __init__(self, *, in_ch: int = 3, dim: int = 60, split: float = 0.25, scale: int = 4, n_rblock: int = 4,
                 n_mblock: int = 6, t_mid_factor: float = 1.0, window_size: int = 8, mlp_factor: float = 2.66,
                 unshuffle_mod: bool = False, upsampler: str = "pixelshuffle", mid_dim: int = 64) -> None:
        super().__init__()
        for name, value in (("in_ch", in_ch), ("dim", dim), ("scale", scale), ("n_rblock", n_rblock),
                            ("n_mblock", n_mblock), ("window_size", window_size), ("mid_dim", mid_dim)):
            _positive_int(name, value)
        if window_size > 255:
            raise ArchArgumentError("window_size", f"LAWFFT stores window_size as uint8: at most 255, not "
                                    f"{window_size}")
        if upsampler not in SAMPLE_MODS3:
            raise ArchArgumentError("upsampler", f"LAWFFT has no upsampler {upsampler!r}; choose one of "
                                    f"{', '.join(SAMPLE_MODS3)}")
        local = int(split * dim)
        if not 0 < local < dim:
            raise ArchArgumentError("split", f"LAWFFT needs 0 < int(split * dim) < dim (both branches), got "
                                    f"{local} of {dim}")
        if int((dim - local) * t_mid_factor) < 1:
            raise ArchArgumentError("t_mid_factor", f"LAWFFT needs int((dim - local) * t_mid_factor) >= 1, not "
                                    f"{t_mid_factor}")
        if int(dim * mlp_factor) < 1:
            raise ArchArgumentError("mlp_factor", f"LAWFFT needs int(dim * mlp_factor) >= 1, not {mlp_factor}")
        self.upscale_factor = scale  # what the output is cropped to (the original's `scale` becomes 4 below)
        self.in_ch = in_ch
        if unshuffle_mod and scale < 3:
            factor = 4 // scale
            self.in_to_dim = nn.Sequential(nn.PixelUnshuffle(factor), nn.Conv2d(in_ch * factor**2, dim, 3, 1, 1))
            self.pad = factor * window_size
            scale = 4
        else:
            self.in_to_dim = nn.Conv2d(in_ch, dim, 3, 1, 1)
            self.pad = window_size
        self.tile_multiple = self.pad
        self.register_buffer("window_size", torch.tensor(window_size, dtype=torch.uint8))
        self.body = nn.Sequential(*[ResidualMeta(dim, n_mblock, split, t_mid_factor, window_size, mlp_factor)
                                    for _ in range(n_rblock)])
        self.upscale = UniUpsampleV3(upsampler, scale, dim, in_ch, mid_dim)
        self.scale = self.upscale_factor
        self.register_load_state_dict_pre_hook(_keep_own_meta)

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        h, w = inp.shape[-2:]
        x = self.in_to_dim(pad_bottom_right(inp, (-h) % self.pad, (-w) % self.pad))
        out = self.upscale(self.body(x) + x)
        return out[:, :, : h * self.upscale_factor, : w * self.upscale_factor]


__all__ = ["LAWFFT", "circular_conv2d", "circular_conv2d_dft", "uses_fft_kernels"]


def _recognise(s: StateShapes) -> list[dict]:
    """LAWFFT from its tensors: the stem (pixel-unshuffled for x1 / x2), width, groups and blocks, the local split
    (the dynamic convs' width), FSAS's and the feed-forward's factors, the window (its uint8 buffer; 8 when only
    shapes are known) and the head (kind, scale, mid width: the candidates whose head builds the file's tensors;
    the file's ``MetaUpsample`` record, when present, orders them and gives the mid width where no tensor does)."""
    if s.shape("window_size") != ():
        return []
    unshuffle = "in_to_dim.1.weight" in s
    stem = s.shape("in_to_dim.1.weight" if unshuffle else "in_to_dim.weight")
    dim = stem[0]
    block = "body.0.residual.0."
    local = s.dim(block + "token_mix.1.local.0.kernel_gen.1.weight", 0)
    mid = s.dim(block + "token_mix.1.att.project_out.weight", 1)
    common = {"dim": dim, "split": width_ratio(local, dim, 0.25), "n_rblock": s.count("body."),
              "n_mblock": s.count("body.0.residual.") - 1, "t_mid_factor": width_ratio(mid, dim - local, 1.0),
              "window_size": (s.integers("window_size") or (8,))[0],
              "mlp_factor": width_ratio(s.dim(block + "channel_mix1.1.project_out.weight", 1), dim, 2.66),
              "unshuffle_mod": unshuffle}
    if unshuffle:  # (image channels, scale) per unshuffle factor the stem allows (16: 4 at x2 or 1 at x1)
        folds = [(stem[1] // (f * f), 4 // f) for f in (2, 4) if stem[1] % (f * f) == 0 and stem[1] // (f * f) in
                 (3, 1, 4)]
        scales: tuple[int, ...] = (4,)
    else:
        folds, scales = [(stem[1], 0)], (4, 2, 3, 1, 8)
    record = s.integers("upscale.MetaUpsample")
    record = record if record is not None and len(record) == 7 else None
    found = []
    for cin, folded in folds:
        heads = fitting_heads(s, "upscale", lambda kind, scale, out, m: UniUpsampleV3(kind, scale, dim, out, m),
                              ("pixelshuffle", *(k for k in SAMPLE_MODS3 if k != "pixelshuffle")), scales, [cin],
                              lambda kind: head_mid(s, "upscale", kind, dim, record[5] if record else 64))
        if record is not None:  # the head the file was saved with first
            heads.sort(key=lambda h: (SAMPLE_MODS3.index(str(h["kind"])) != record[1], h["scale"] != record[2]))
        found += [{"in_ch": cin, **common, "scale": folded or head["scale"], "upsampler": head["kind"],
                   "mid_dim": head["mid"]} for head in heads]
    return found


register_recogniser("LAWFFT", _recognise)

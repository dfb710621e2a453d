"""ESC-Real: "Emulating Self-attention with Convolution for Efficient Image Super-Resolution" (Lee, Yoon, Lee;
ICCV 2025), in traiNNer-redux's multi-scale ``ESCRealM`` form (several heads, optional pixel-unshuffle stem).

Module names, the ``to_img.MetaUpsample`` buffer and constructor arguments follow traiNNer-redux's ``ESCRealM``
so its checkpoints load with ``strict=True`` and give the same output. A 3x3 stem and a depth-wise 7x7 side
branch feed ``n_blocks`` blocks; each runs one window self-attention (relative position bias) and then
``conv_blocks`` convolutional "attention emulation" units: on the first ``pdim`` channels a large kernel
shared by every block (the mean of the kernel's eight flips / rotations) plus a 3x3 depth-wise kernel predicted
per image from its pooled features. A long shortcut and one of the heads "conv", "pixelshuffledirect",
"pixelshuffle", "nearest+conv" or "transpose+conv" follow, or "dysample_direct": a DySample straight on the
features (``to_img.offset`` / ``scope`` / ``end_conv``, no ``MetaUpsample``), neosr's ``esc`` layout.
traiNNer-redux's three attention back-ends ("Naive", "SDPA", "Flex") compute the same softmax; here all run as
``F.scaled_dot_product_attention``.

Size requirement: none for the caller. Each attention pads its input to a multiple of ``window_size`` (reflect,
then edge replication past one side length) and crops back; with ``unshuffle_mod`` (scale 1 or 2) the input is
padded to a multiple of the unshuffle factor first; inputs below 4 pixels are grown to 4 (the 7x7 reflect conv
needs it). ``tile_multiple`` is the window size (times the unshuffle factor), where tiles pad as training crops.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, LayerNorm2d, NearestUpsample, pad_to_min_size, pad_to_multiple
from anysr.archs.plksr_arch import DySample, dysample_scale
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.recognition.recognise_util import clean, fitting_heads, head_mid, square_side
from anysr.presets import register_presets
from anysr.registry import ARCH_REGISTRY

# traiNNer-redux's SampleMods3 order; the index is stored in the MetaUpsample buffer.
HEADS = ("conv", "pixelshuffledirect", "pixelshuffle", "nearest+conv", "dysample", "transpose+conv", "lda", "pa_up")
SUPPORTED_HEADS = ("conv", "pixelshuffledirect", "pixelshuffle", "nearest+conv", "transpose+conv")
DIRECT_HEAD = "dysample_direct"  # neosr's esc head: not a UniUpsampleV3 (no MetaUpsample record)
ATTN_TYPES = ("Naive", "SDPA", "Flex")
DYN_K = 3  # side of the predicted depth-wise kernel


def _steps(scale: int) -> list[int]:
    return [3] if scale == 3 else [2] * (scale.bit_length() - 1)


class UniUpsampleV3(nn.Sequential):
    """Upsampling head (traiNNer-redux's version-3 layout) with a ``MetaUpsample`` uint8 record
    (3, head index, scale, in_dim, out_dim, mid_dim, group) that checkpoints carry."""

    def __init__(self, upsample: str, scale: int, in_dim: int, out_dim: int, mid_dim: int, group: int = 4) -> None:
        layers: list[nn.Module] = []
        if scale == 1 or upsample == "conv":
            layers.append(nn.Conv2d(in_dim, out_dim, 3, 1, 1))
        elif upsample == "pixelshuffledirect":
            layers += [nn.Conv2d(in_dim, out_dim * scale * scale, 3, 1, 1), nn.PixelShuffle(scale)]
        elif upsample == "pixelshuffle":
            layers += [nn.Conv2d(in_dim, mid_dim, 3, 1, 1), nn.LeakyReLU(inplace=True)]
            for s in _steps(scale):
                layers += [nn.Conv2d(mid_dim, s * s * mid_dim, 3, 1, 1), nn.PixelShuffle(s)]
            layers.append(nn.Conv2d(mid_dim, out_dim, 3, 1, 1))
        elif upsample == "nearest+conv":
            for s in _steps(scale):
                layers += [nn.Conv2d(in_dim, in_dim, 3, 1, 1), NearestUpsample(s), nn.LeakyReLU(0.2, inplace=True)]
            layers += [nn.Conv2d(in_dim, in_dim, 3, 1, 1), nn.LeakyReLU(0.2, inplace=True),
                       nn.Conv2d(in_dim, out_dim, 3, 1, 1)]
        else:  # transpose+conv, scale 2, 3 or 4
            if scale == 4:
                layers += [nn.ConvTranspose2d(in_dim, in_dim, 4, 2, 1), nn.GELU(),
                           nn.ConvTranspose2d(in_dim, out_dim, 4, 2, 1)]
            elif scale == 3:
                layers.append(nn.ConvTranspose2d(in_dim, out_dim, 3, 3, 0))
            else:
                layers.append(nn.ConvTranspose2d(in_dim, out_dim, 4, 2, 1))
            layers.append(nn.Conv2d(out_dim, out_dim, 3, 1, 1))
        super().__init__(*layers)
        meta = [3, HEADS.index(upsample), scale, in_dim, out_dim, mid_dim, group]
        self.register_buffer("MetaUpsample", torch.tensor([v % 256 for v in meta], dtype=torch.uint8))


class ConvFFN(nn.Module):
    """1x1 expansion, GELU, residual depth-wise ``kernel_size`` conv with GELU, 1x1 projection back."""

    def __init__(self, dim: int, kernel_size: int, exp_ratio: float) -> None:
        super().__init__()
        hidden = int(dim * exp_ratio)
        self.proj = nn.Conv2d(dim, hidden, 1)
        self.dwc = nn.Conv2d(hidden, hidden, kernel_size, 1, kernel_size // 2, groups=hidden)
        self.aggr = nn.Conv2d(hidden, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.proj(x))
        return self.aggr(h + F.gelu(self.dwc(h)))


class ConvolutionalAttention(nn.Module):
    """On the first ``pdim`` channels: the shared large kernel plus a per-image 3x3 depth-wise kernel predicted
    from the globally pooled channels (``dwc_proj``); the other channels pass unchanged."""

    def __init__(self, pdim: int) -> None:
        super().__init__()
        self.pdim = pdim
        self.dwc_proj = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(pdim, pdim // 2, 1), nn.GELU(),
            nn.Conv2d(pdim // 2, pdim * DYN_K * DYN_K, 1))
        nn.init.zeros_(self.dwc_proj[-1].weight)
        nn.init.zeros_(self.dwc_proj[-1].bias)

    def forward(self, x: torch.Tensor, lk_filter: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        part, rest = x[:, :self.pdim], x[:, self.pdim:]
        # (b, pdim, 9, 1, 1): every (image, channel) pair has its own 3x3 kernel. Applied as nine shifted
        # multiply-adds (the same cross-correlation as a grouped conv over the batch; ONNX cannot export a conv
        # whose weight shape depends on the batch, and this needs no reshape of the batch into channels).
        kernels = self.dwc_proj(part).unflatten(1, (self.pdim, DYN_K * DYN_K))
        padded = F.pad(part, (DYN_K // 2,) * 4)
        dynamic = sum(padded[:, :, i:i + h, j:j + w] * kernels[:, :, i * DYN_K + j]
                      for i in range(DYN_K) for j in range(DYN_K))
        static = F.conv2d(part, lk_filter, padding=lk_filter.shape[-1] // 2)
        return torch.cat((static + dynamic, rest), dim=1)


class ConvAttnWrapper(nn.Module):
    """ConvolutionalAttention followed by a 1x1 channel mix."""

    def __init__(self, dim: int, pdim: int) -> None:
        super().__init__()
        self.plk = ConvolutionalAttention(pdim)
        self.aggr = nn.Conv2d(dim, dim, 1)

    def forward(self, x: torch.Tensor, lk_filter: torch.Tensor) -> torch.Tensor:
        return self.aggr(self.plk(x, lk_filter))


def _relative_index(ws: int) -> torch.Tensor:
    """(ws*ws, ws*ws) index into the (2ws-1)^2 bias table for each (query, key) pair of a window."""
    rows, cols = torch.meshgrid(torch.arange(ws), torch.arange(ws), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    dh = rows[None, :] - rows[:, None] + ws - 1  # key minus query
    dw = cols[None, :] - cols[:, None] + ws - 1
    return dh * (2 * ws - 1) + dw


class WindowAttention(nn.Module):
    """Multi-head self-attention in non-overlapping ``window_size`` windows with a learned relative position
    bias (``relative_position_bias``: heads x (2ws-1)^2); q, k, v from one 1x1 conv, ``to_out`` 1x1 after."""

    def __init__(self, dim: int, window_size: int, num_heads: int) -> None:
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        self.to_qkv = nn.Conv2d(dim, dim * 3, 1)
        self.to_out = nn.Conv2d(dim, dim, 1)
        self.relative_position_bias = nn.Parameter(
            torch.randn(num_heads, (2 * window_size - 1) ** 2) * 0.001)
        self.register_buffer("rpe_index", _relative_index(window_size), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        ws, heads = self.window_size, self.num_heads
        x, _, _ = pad_to_multiple(x, ws)
        b, c, hp, wp = x.shape
        nh, nw, hc = hp // ws, wp // ws, c // heads
        qkv = self.to_qkv(x).reshape(b, 3, heads, hc, nh, ws, nw, ws)
        # -> (3, b*nh*nw, heads, ws*ws, hc)
        qkv = qkv.permute(1, 0, 4, 6, 2, 5, 7, 3).reshape(3, b * nh * nw, heads, ws * ws, hc)
        bias = self.relative_position_bias[:, self.rpe_index].unsqueeze(0).to(qkv.dtype)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=bias)
        out = out.reshape(b, nh, nw, heads, ws, ws, hc).permute(0, 3, 6, 1, 4, 2, 5).reshape(b, c, hp, wp)
        return self.to_out(out[:, :, :h, :w])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, window_size={self.window_size}, num_heads={self.num_heads}"


class Block(nn.Module):
    """ConvFFN, window attention, ``conv_blocks`` (ConvFFN, convolutional attention) pairs, norm + 3x3 conv;
    each step pre-normalised, the whole block residual."""

    def __init__(self, dim: int, pdim: int, conv_blocks: int, window_size: int, num_heads: int,
                 exp_ratio: float) -> None:
        super().__init__()
        self.ln_proj = LayerNorm2d(dim)
        self.proj = ConvFFN(dim, 3, 2)
        self.ln_attn = LayerNorm2d(dim)
        self.attn = WindowAttention(dim, window_size, num_heads)
        self.lns = nn.ModuleList(LayerNorm2d(dim) for _ in range(conv_blocks))
        self.pconvs = nn.ModuleList(ConvAttnWrapper(dim, pdim) for _ in range(conv_blocks))
        self.convffns = nn.ModuleList(ConvFFN(dim, 3, exp_ratio) for _ in range(conv_blocks))
        self.ln_out = LayerNorm2d(dim)
        self.conv_out = nn.Conv2d(dim, dim, 3, 1, 1)

    def forward(self, x: torch.Tensor, lk_filter: torch.Tensor) -> torch.Tensor:
        y = self.proj(self.ln_proj(x))
        y = y + self.attn(self.ln_attn(y))
        for ln, pconv, ffn in zip(self.lns, self.pconvs, self.convffns, strict=True):
            y = y + pconv(ffn(ln(y)), lk_filter)
        return x + self.conv_out(self.ln_out(y))


def dihedral_mean(k: torch.Tensor) -> torch.Tensor:
    """Mean of a kernel's eight flips / 90-degree rotations (over its last two dims)."""
    t = k.transpose(-1, -2)
    views = [k, k.flip(-1), k.flip(-2), k.flip(-2, -1), t, t.flip(-1), t.flip(-2), t.flip(-2, -1)]
    return torch.stack(views).mean(0)


@ARCH_REGISTRY.register()
class ESCRealM(nn.Module):
    """ESC-Real with a choice of upsampling head (traiNNer-redux's ``ESCRealM``)."""

    def __init__(self, dim: int = 64, pdim: int = 16, kernel_size: int = 13, n_blocks: int = 10,
                 conv_blocks: int = 5, window_size: int = 32, num_heads: int = 4, scale: int = 4,
                 exp_ratio: float = 2.0, attn_type: str = "Flex", mid_dim: int = 64,
                 upsampler: str = "transpose+conv", unshuffle_mod: bool = False) -> None:
        super().__init__()
        if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1:
            raise ArchArgumentError("scale", f"ESCRealM needs an integer scale >= 1, got {scale!r}")
        if attn_type not in ATTN_TYPES:
            raise ArchArgumentError("attn_type", f"ESCRealM: attn_type {attn_type!r} is not one of {ATTN_TYPES}")
        if upsampler not in (*SUPPORTED_HEADS, DIRECT_HEAD):
            why = " (not implemented in anysr)" if upsampler in HEADS else ""
            raise ArchArgumentError("upsampler", f"ESCRealM: upsampler {upsampler!r}{why}; use one of "
                                                 f"{(*SUPPORTED_HEADS, DIRECT_HEAD)}")
        if not isinstance(pdim, int) or not 2 <= pdim <= dim:
            raise ArchArgumentError("pdim", f"ESCRealM needs 2 <= pdim <= dim ({dim}), got {pdim!r}")
        if not isinstance(kernel_size, int) or kernel_size < 1 or kernel_size % 2 == 0:
            raise ArchArgumentError("kernel_size", f"ESCRealM needs an odd kernel_size, got {kernel_size!r}")
        if dim % num_heads:
            raise ArchArgumentError("num_heads", f"ESCRealM: dim ({dim}) must be a multiple of num_heads")
        if not isinstance(window_size, int) or window_size < 1:
            raise ArchArgumentError("window_size", f"ESCRealM needs an integer window_size >= 1, got {window_size!r}")
        self.upscaling_factor = scale
        self.in_channels = 3  # what the exporter feeds (the first conv may read an unshuffled input)
        self.plk_filter = nn.Parameter(torch.empty(pdim, pdim, kernel_size, kernel_size))
        nn.init.orthogonal_(self.plk_filter)

        head_scale, in_ch = scale, 3
        self.padding = 0
        if unshuffle_mod and scale < 3:
            self.padding = 4 // scale
            head_scale, in_ch = 4, 3 * self.padding**2
        side = [nn.Conv2d(in_ch, dim * 2, 1),
                nn.Conv2d(dim * 2, dim * 2, 7, 1, 3, groups=dim * 2, padding_mode="reflect"),
                nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(dim * 2, dim, 1)]
        if self.padding:
            self.proj = nn.Sequential(nn.PixelUnshuffle(self.padding), nn.Conv2d(in_ch, dim, 3, 1, 1))
            self.skip = nn.Sequential(nn.PixelUnshuffle(self.padding), *side)
        else:
            self.proj = nn.Conv2d(3, dim, 3, 1, 1)
            self.skip = nn.Sequential(*side)
        self.blocks = nn.ModuleList(
            Block(dim, pdim, conv_blocks, window_size, num_heads, exp_ratio) for _ in range(n_blocks))
        self.last = nn.Conv2d(dim, dim, 3, 1, 1)
        if upsampler == "transpose+conv" and head_scale not in (2, 3, 4):
            raise ArchArgumentError("scale", f"ESCRealM's transpose+conv head supports scale 2, 3 or 4, not {scale}")
        if upsampler in ("pixelshuffle", "nearest+conv") and head_scale & (head_scale - 1) and head_scale != 3:
            raise ArchArgumentError("scale", f"ESCRealM's {upsampler} head needs a power of two or 3, not {scale}")
        self.to_img: nn.Module
        if upsampler == DIRECT_HEAD:  # neosr's esc: 4 sampling groups on the features, a 1x1 conv to RGB
            if dim % 4:
                raise ArchArgumentError("dim", f"ESCRealM's dysample_direct head needs a dim divisible by 4, not {dim}")
            self.to_img = DySample(dim, 3, head_scale, groups=4, end_convolution=True)
        else:
            self.to_img = UniUpsampleV3(upsampler, head_scale, dim, 3, mid_dim, 4)
        self.tile_multiple = window_size * max(self.padding, 1)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args, **kwargs) -> None:  # noqa: ANN002
        # the head's record comes from the constructor arguments (traiNNer-redux overwrites it on load too)
        key = prefix + "to_img.MetaUpsample"
        if key in state_dict and isinstance(self.to_img, UniUpsampleV3):
            state_dict[key] = self.to_img.MetaUpsample
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        x = pad_to_min_size(x, 4 * max(self.padding, 1))
        if self.padding:
            x, _, _ = pad_to_multiple(x, self.padding)
        feat = self.proj(x)
        lk = dihedral_mean(self.plk_filter)
        out = feat
        for block in self.blocks:
            out = block(out, lk)
        out = self.last(out) + feat + self.skip(x)
        s = self.upscaling_factor
        return self.to_img(out)[:, :, :h * s, :w * s]


# traiNNer-redux's named variant (tests/test_presets.py checks it against the network traiNNer-redux builds)
register_presets("ESCRealM", scale_arg="scale", presets={
    "escrealm_xl": {"dim": 128, "pdim": 32, "n_blocks": 16, "num_heads": 8, "upsampler": "pixelshuffle"},
})


def _neosr_attn_type(args: dict[str, Any]) -> dict[str, Any]:
    """neosr's lower-case ``attn_type`` spellings (``sdpa``, ``flex``, ``naive``) -> anysr's."""
    spelled = {t.lower(): t for t in ATTN_TYPES}
    attn = args.get("attn_type")
    return {**args, "attn_type": spelled.get(attn.lower(), attn)} if isinstance(attn, str) else args


# neosr's names (tests/test_neosr_names.py checks them against the networks neosr builds): its ``esc`` is the
# ESC-Real layout with a DySample head; ``realsr``, ``is_fp`` and ``use_dysample`` name that layout
register_presets("ESCRealM", scale_arg="scale", renames={"upscaling_factor": "scale"},
                 fixed={"realsr": True, "is_fp": False, "use_dysample": True}, translate=_neosr_attn_type,
                 source="neosr", presets={
    "esc": {"n_blocks": 5, "exp_ratio": 1.25, "attn_type": "SDPA", "upsampler": "dysample_direct"},  # 0.97 M at x4
    "esc_light": {"n_blocks": 3, "exp_ratio": 1.25, "attn_type": "SDPA", "upsampler": "dysample_direct"},  # 0.63 M
    "esc_large": {"n_blocks": 10, "exp_ratio": 2.0, "attn_type": "SDPA", "upsampler": "dysample_direct"},  # 2.17 M
})


def _recognise(s: StateShapes) -> list[dict]:
    """ESCRealM from its tensors: width, the large-kernel filter (``pdim`` x ``kernel_size``), blocks and
    conv blocks per block, heads and window from the attention's bias, the ConvFFN ratio, the pixel-unshuffled
    stem (x1 / x2), and the head (kind, scale and mid width: the candidates whose head builds the file's tensors;
    a nearest+conv head is the same at x2 and x3: x2 is proposed first; neosr's DySample head by its offset conv).
    The attention kernel choice changes no tensor (the default is kept)."""
    pdim, _, kernel, _ = s.shape("plk_filter")
    dim = s.dim("blocks.0.ln_proj.weight", 0)
    bias = s.shape("blocks.0.attn.relative_position_bias")
    common = {"dim": dim, "pdim": pdim, "kernel_size": kernel, "n_blocks": s.count("blocks."),
              "conv_blocks": s.count("blocks.0.pconvs."),
              "window_size": (square_side(bias[1], "relative_position_bias") + 1) // 2,
              "num_heads": bias[0], "exp_ratio": clean(s.dim("blocks.0.convffns.0.proj.weight", 0) / dim)}
    scales: tuple[int, ...] = (4, 2, 3, 1, 8)
    unshuffle = "proj.1.weight" in s
    if unshuffle:  # the stem folds the input by 4 // scale, the head then upsamples x4
        fold = square_side(s.dim("proj.1.weight", 1) // 3, "proj.1.weight")
        if fold not in (2, 4):
            return []
        scales = (4,)
    if "to_img.offset.weight" in s:  # neosr's esc: a DySample straight on the features
        head_scale = dysample_scale(s, "to_img.")
        if unshuffle and head_scale != 4:
            return []
        return [{**common, "scale": 4 // fold if unshuffle else head_scale, "upsampler": DIRECT_HEAD,
                 "unshuffle_mod": unshuffle}]
    heads = fitting_heads(s, "to_img", lambda kind, scale, out, mid: UniUpsampleV3(kind, scale, dim, out, mid, 4),
                          ("transpose+conv", *(h for h in SUPPORTED_HEADS if h != "transpose+conv")), scales, (3,),
                          lambda kind: head_mid(s, "to_img", kind, dim))
    out = []
    for head in heads:
        scale = 4 // fold if unshuffle else head["scale"]
        out.append({**common, "scale": scale, "upsampler": head["kind"], "mid_dim": head["mid"],
                    "unshuffle_mod": unshuffle})
    return out


register_recogniser("ESCRealM", _recognise)

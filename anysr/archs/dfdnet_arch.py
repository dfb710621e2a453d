"""DFDNet (Li et al., "Blind Face Restoration via Deep Multi-scale Component Dictionaries", ECCV 2020) with
BasicSR 1.4.2's constructor arguments and parameter names, so BasicSR-converted DFDNet weights load strictly.

A VGG19 (``vgg_extractor``, frozen, anysr's perceptual-loss VGG) reads the face at 1/2, 1/4, 1/8 and 1/16 of its
size (``relu2_2``, ``relu3_4``, ``relu4_4``, ``conv5_4``; BasicSR names these scales by their size at a 512 input:
256, 128, 64, 32). At each scale the four facial components (left eye, right eye, nose, mouth) are cropped from the
features, resized to the dictionary's entry size, and matched against the component dictionary (each entry
re-normalised to the crop's channel means and deviations, adaptive instance normalisation; the best inner
product wins); the winning entry, resized back to the crop, is blended in through a per-component attention
block. A multi-scale dilated block on ``conv5_4`` and four spatial-feature-transform up blocks, modulated by the
updated features, decode the restored face (``tanh``; images in [-1, 1]).

``forward(x, part_locations)``: ``part_locations`` are the four components' boxes ``(x1, y1, x2, y2)`` in input
pixels, in the order left eye, right eye, nose, mouth (BasicSR's inference script derives them from dlib's 68
landmarks); each a (4,) or (b, 4) tensor / sequence ((1, 4) applies to every image of the batch). Without it the
boxes are ``FFHQ_PART_BOXES`` scaled to the input's size, for FFHQ-aligned faces (what ``anysr infer`` and
training use). Where the reference works (batch 1, boxes inside the image) the result is BasicSR's; beyond it:
a batch with per-image boxes, a box starting left of / above the image is clamped to it (the reference's
negative slice wraps around), a box thinner than one feature pixel is widened to one (the reference fails), and
any size (padded at the bottom / right by reflection to a multiple of 16, output cropped).

``FFHQ_PART_BOXES`` (512 x 512): OpenFace's mean 68-landmark face (dlib's 68-point layout) placed on FFHQ's
five-point alignment template at 512 (facexlib's ``FaceRestoreHelper``, which BasicSR's DFDNet inference script
aligns with: eye centres, nose tip, mouth corners; least-squares similarity, 2.3 px worst residual), then BasicSR
inference's box rule (the component's landmark mean +- max(half its larger extent, 16)). The boxes are 87, 90,
54 and 110 pixels wide; DFDNet's authors give 80, 80, 50 and 110. ``tools/fixtures/make_dfdnet_fixtures.py``
recomputes them.

The component dictionary (``dict_path``) is read here (the one architecture file input: it is the network's
fixed data, not its weights) with ``torch.load(weights_only=True)`` (BasicSR's ``.pth``: ``{'256': {'left_eye':
(n, c, h, w), ...}, ...}``) or from ``.safetensors`` (keys ``256.left_eye``, ...). It is kept as non-persistent
buffers (moved with the network, not in the state dict: BasicSR's weights load strictly, and so do anysr's).
``dict_path: null`` builds the network without it (recognising and loading weights); its forward then says so.

Written for anysr: the crop resizes (bilinear to the entry, nearest back) are small constant matrices, the
dictionary match an ``argmax`` and a one-hot product (no ``.item()``, no host round trip), the 2x upsampling from
slices (XLA lowers it forward and backward). The boxes are Python integers when the graph is built, so XLA
compiles one graph per input shape and set of boxes (the default boxes: one per input shape); boxes given as
tensors on the XLA device are read to the host first (a synchronisation). An ONNX export holds the boxes it was
traced with (the default boxes of the export size): run it at that size.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn.utils import spectral_norm

from anysr.archs.arch_util import ArchArgumentError, pad_to_multiple
from anysr.archs.discriminator_arch import upsample2x
from anysr.archs.recognition.recognise import StateShapes, register_recogniser
from anysr.archs.vgg_features import VGGFeatureExtractor
from anysr.registry import ARCH_REGISTRY

PARTS = ("left_eye", "right_eye", "nose", "mouth")
SIZES = (256, 128, 64, 32)  # BasicSR's names of the four scales (their size at a 512 input); stride 512 // size
VGG_LAYERS = ("relu2_2", "relu3_4", "relu4_4", "conv5_4")
FACE_SIZE = 512
# (x1, y1, x2, y2) of left eye, right eye, nose, mouth on a 512 x 512 FFHQ-aligned face (see the module docstring)
FFHQ_PART_BOXES: tuple[tuple[int, int, int, int], ...] = (
    (148, 180, 235, 267), (276, 178, 366, 267), (229, 296, 283, 350), (202, 324, 312, 434))
MULTIPLE = FACE_SIZE // SIZES[-1]  # the deepest scale's stride
_EPS = 1e-5  # adaptive instance normalisation's variance floor

Box = tuple[int, int, int, int]


def _sn_conv(c_in: int, c_out: int, dilation: int = 1) -> nn.Module:
    return spectral_norm(nn.Conv2d(c_in, c_out, 3, 1, dilation, dilation=dilation))


def _conv_pair(c: int, dilation: int = 1) -> nn.Sequential:
    """SN conv - leaky ReLU 0.2 - SN conv (an attention block, a dilation branch)."""
    return nn.Sequential(_sn_conv(c, c, dilation), nn.LeakyReLU(0.2), _sn_conv(c, c, dilation))


class Blur(nn.Module):
    """Depthwise 3x3 binomial blur ([1, 2, 1] outer [1, 2, 1] / 16, zero padding); no parameters."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        k = torch.tensor([1.0, 2.0, 1.0])
        self.register_buffer("kernel", (k[:, None] * k[None, :] / 16).expand(channels, 1, 3, 3).clone(),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.conv2d(x, self.kernel.to(x.dtype), padding=1, groups=x.shape[1])


class Upsample2x(nn.Module):
    """Bilinear x2 (``align_corners=False``) from slices: XLA lowers its backward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return upsample2x(x)


class SFTUpBlock(nn.Module):
    """Blur - SN conv - leaky ReLU, modulated by (scale, shift) maps of the updated VGG features (the shift through
    a sigmoid, as the authors'), then bilinear x2 - SN conv - leaky ReLU."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(Blur(c_in), _sn_conv(c_in, c_out), nn.LeakyReLU(0.04))  # the authors' 0.2 twice
        self.convup = nn.Sequential(Upsample2x(), _sn_conv(c_out, c_out), nn.LeakyReLU(0.2))
        self.scale_block = nn.Sequential(_sn_conv(c_in, c_out), nn.LeakyReLU(0.2), _sn_conv(c_out, c_out))
        self.shift_block = nn.Sequential(_sn_conv(c_in, c_out), nn.LeakyReLU(0.2), _sn_conv(c_out, c_out),
                                         nn.Sigmoid())

    def forward(self, x: torch.Tensor, guide: torch.Tensor) -> torch.Tensor:
        return self.convup(self.conv1(x) * self.scale_block(guide) + self.shift_block(guide))


class MSDilationBlock(nn.Module):
    """Four dilated conv pairs (dilations 4, 3, 2, 1) side by side, fused by an SN conv, plus the input."""

    def __init__(self, c: int, dilations: Sequence[int] = (4, 3, 2, 1)) -> None:
        super().__init__()
        self.conv_blocks = nn.ModuleList(_conv_pair(c, d) for d in dilations)
        self.conv_fusion = _sn_conv(c * len(dilations), c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_fusion(torch.cat([blk(x) for blk in self.conv_blocks], 1)) + x


class UpResBlock(nn.Module):
    """x + conv - leaky ReLU 0.2 - conv."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, 1, 1), nn.LeakyReLU(0.2), nn.Conv2d(c, c, 3, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


# ----------------------------------------------------------------------------- the component dictionary

def _dict_error(path: object, why: str) -> ArchArgumentError:
    return ArchArgumentError("dict_path", f"{path}: not a DFDNet component dictionary ({why}); expected BasicSR's "
                             "{'256'|'128'|'64'|'32': {'left_eye'|'right_eye'|'nose'|'mouth': (n, c, h, w) "
                             "tensor}} (.pth) or keys '256.left_eye', ... (.safetensors)")


def _read_failure(exc: BaseException) -> str:
    """What went wrong reading a dictionary file, in a few words: torch's refusal of a non-tensor object (its
    ``Unsupported global`` line), else the first sentence of the message, without terminal colour codes."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in str(exc).splitlines()]
    lines = [ln for ln in lines if ln]
    unsupported = next((ln for ln in lines if "Unsupported" in ln), None)
    if unsupported is not None:
        what = unsupported[unsupported.index("Unsupported"):].split(" was not")[0]
        return f"it holds objects other than tensors [{what}]"
    return f"{type(exc).__name__}: " + (lines[0].split(". ")[0] if lines else "")


def load_component_dictionary(path: str | Path, channels: Sequence[int] | None = None
                              ) -> dict[int, dict[str, torch.Tensor]]:
    """DFDNet's component dictionary from ``path`` (BasicSR's ``.pth``, read with ``weights_only=True``, or a
    ``.safetensors`` file with keys ``<size>.<part>``) as ``{size: {part: float32 (n, c, h, w)}}``; ``channels``:
    the width each scale must have. ArchArgumentError (``dict_path``) naming the path when it is missing or
    malformed."""
    p = Path(path)
    if p.is_dir():
        raise ArchArgumentError("dict_path", f"{path}: is a folder; give the component dictionary file in it (e.g. "
                                "BasicSR's DFDNet_dict_512.pth)")
    if not p.is_file():
        raise ArchArgumentError("dict_path", f"{path}: no such file (DFDNet's component dictionary, e.g. BasicSR's "
                                "DFDNet_dict_512.pth)")
    try:
        if p.suffix == ".safetensors":
            from safetensors.torch import load_file  # noqa: PLC0415 - only this file format needs it

            raw: Any = load_file(str(p))
        else:
            raw = torch.load(str(p), map_location="cpu", weights_only=True)
    except (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError) as e:
        raise _dict_error(path, f"unreadable: {_read_failure(e)}") from None
    return component_dictionary(raw, channels, str(path))


def component_dictionary(raw: object, channels: Sequence[int] | None = None, source: str = "the dictionary"
                         ) -> dict[int, dict[str, torch.Tensor]]:
    """A component dictionary checked and as ``{size: {part: float32 (n, c, h, w)}}`` from BasicSR's nested
    mapping (sizes as strings or integers) or flat ``<size>.<part>`` keys; ArchArgumentError naming ``source``."""
    if not isinstance(raw, Mapping):
        raise _dict_error(source, f"holds a {type(raw).__name__}")
    nested: dict[str, Any] = {}
    for key, value in raw.items():
        if isinstance(value, Mapping):
            nested.setdefault(str(key), {}).update({str(k): v for k, v in value.items()})
        else:
            size, _, part = str(key).partition(".")
            nested.setdefault(size, {})[part] = value
    out: dict[int, dict[str, torch.Tensor]] = {}
    for i, size in enumerate(SIZES):
        if str(size) not in nested:
            raise _dict_error(source, f"no scale '{size}'")
        out[size] = {}
        for part in PARTS:
            t = nested[str(size)].get(part)
            if not isinstance(t, torch.Tensor) or t.ndim != 4 or t.shape[0] < 1 or t.shape[2] * t.shape[3] < 2:
                what = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise _dict_error(source, f"'{size}.{part}' is {what}, not an (n, c, h, w) tensor of h * w >= 2")
            if channels is not None and t.shape[1] != channels[i]:
                raise _dict_error(source, f"'{size}.{part}' has {t.shape[1]} channels, the network {channels[i]} "
                                        "(num_feat does not fit this dictionary)")
            out[size][part] = t.detach().to(torch.float32).contiguous()
    return out


def _normalised(entries: torch.Tensor) -> torch.Tensor:
    """Each entry's channels to zero mean and unit deviation (unbiased variance + 1e-5: adaptive instance
    normalisation's content side, the same for every input, so done once)."""
    flat = entries.flatten(2)
    mean = flat.mean(2)[..., None, None]
    std = (flat.var(2) + _EPS).sqrt()[..., None, None]
    return (entries - mean) / std


# ----------------------------------------------------------------------------- resizing matrices

def _bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) weights of ``F.interpolate(mode='bilinear', align_corners=False)`` along one axis (float32
    source positions as PyTorch computes them)."""
    scale = np.float32(n_in) / np.float32(n_out)
    src = np.maximum(scale * (np.arange(n_out, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5), 0)
    i0 = src.astype(np.int64)
    i1 = np.where(i0 < n_in - 1, i0 + 1, i0)
    lam = (src - i0).astype(np.float32)
    m = np.zeros((n_out, n_in), np.float32)
    np.add.at(m, (np.arange(n_out), i0), 1 - lam)
    np.add.at(m, (np.arange(n_out), i1), lam)
    return m


def _nearest_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_out, n_in) one-hot rows of ``F.interpolate(mode='nearest')`` along one axis."""
    scale = np.float32(n_in) / np.float32(n_out)
    src = np.minimum(np.floor(np.arange(n_out, dtype=np.float32) * scale).astype(np.int64), n_in - 1)
    m = np.zeros((n_out, n_in), np.float32)
    m[np.arange(n_out), src] = 1
    return m


def _resize(x: torch.Tensor, rows: np.ndarray, cols: np.ndarray) -> torch.Tensor:
    r = torch.as_tensor(rows).to(device=x.device, dtype=x.dtype)
    c = torch.as_tensor(cols).to(device=x.device, dtype=x.dtype)
    return torch.einsum("yi,bcij,xj->bcyx", r, x, c)


def _replace(x: torch.Tensor, box: Box, patch: torch.Tensor) -> torch.Tensor:
    """``x`` with ``patch`` at ``box`` (feature pixels), from slices and concatenations (no in-place write)."""
    x1, y1, x2, y2 = box
    band = torch.cat([x[:, :, y1:y2, :x1], patch, x[:, :, y1:y2, x2:]], 3)
    return torch.cat([x[:, :, :y1], band, x[:, :, y2:]], 2)


def default_part_boxes(h: int, w: int) -> tuple[Box, ...]:
    """``FFHQ_PART_BOXES`` scaled to an ``h`` x ``w`` face (rounded to pixels)."""
    sy, sx = h / FACE_SIZE, w / FACE_SIZE
    return tuple((round(a * sx), round(b * sy), round(c * sx), round(d * sy)) for a, b, c, d in FFHQ_PART_BOXES)


def _as_boxes(part_locations: Sequence[Any], batch: int) -> list[tuple[Box, ...]]:
    """Per image, the four boxes as Python integers (BasicSR's ``part_locations``: four (1, 4) tensors)."""
    if len(part_locations) != len(PARTS):
        raise ValueError(f"part_locations: expected {len(PARTS)} boxes (left eye, right eye, nose, mouth), got "
                         f"{len(part_locations)}")
    per_part = []
    for name, loc in zip(PARTS, part_locations, strict=True):
        arr = loc.detach().cpu().tolist() if isinstance(loc, torch.Tensor) else np.asarray(loc).tolist()
        arr = arr if arr and isinstance(arr[0], list) else [arr]
        if any(len(r) != 4 for r in arr) or len(arr) not in (1, batch):
            raise ValueError(f"part_locations: the {name} box must be (4,), (1, 4) or ({batch}, 4) "
                             "(x1, y1, x2, y2)")
        rows = [tuple(int(np.floor(float(v))) for v in r) for r in arr]
        per_part.append(rows * batch if len(rows) == 1 else rows)
    return [tuple(per_part[p][i] for p in range(len(PARTS))) for i in range(batch)]  # type: ignore[misc]


# ----------------------------------------------------------------------------- the network

@ARCH_REGISTRY.register()
class DFDNet(nn.Module):
    """DFDNet: a face restorer at the input's size (x1), images in [-1, 1].

    Args:
        num_feat: base width of the decoder (64 in BasicSR: the only width its fixed VGG19 fits). The VGG19's
            block widths are ``num_feat`` x (1, 2, 4, 8, 8), VGG19's own at 64; a smaller width is a narrower VGG
            (anysr only: tests, experiments).
        dict_path: the component dictionary (see the module docstring); None builds the network without one.
    """

    scale = 1
    tile_multiple = MULTIPLE
    image_range = (-1.0, 1.0)  # the authors' images; anysr's pipeline feeds [0, 1] (arch_util.unit_range)

    def __init__(self, num_feat: int = 64, dict_path: str | Path | None = None) -> None:
        super().__init__()
        if isinstance(num_feat, bool) or not isinstance(num_feat, int) or num_feat < 1:
            raise ArchArgumentError("num_feat", f"expected a positive integer (64 for BasicSR's weights), got "
                                    f"{num_feat!r}")
        nf = self.num_feat = num_feat
        self.channels = (2 * nf, 4 * nf, 8 * nf, 8 * nf)  # the four VGG layers' widths
        self.vgg_extractor = VGGFeatureExtractor(list(VGG_LAYERS), "vgg19", use_input_norm=True, range_norm=True,
                                                 widths=(nf, 2 * nf, 4 * nf, 8 * nf, 8 * nf))
        pairs = zip(SIZES, self.channels, strict=True)
        self.attn_blocks = nn.ModuleDict({f"{part}_{size}": _conv_pair(c) for size, c in pairs for part in PARTS})
        self.multi_scale_dilation = MSDilationBlock(nf * 8)
        self.upsample0 = SFTUpBlock(nf * 8, nf * 8)
        self.upsample1 = SFTUpBlock(nf * 8, nf * 4)
        self.upsample2 = SFTUpBlock(nf * 4, nf * 2)
        self.upsample3 = SFTUpBlock(nf * 2, nf)
        self.upsample4 = nn.Sequential(_sn_conv(nf, nf), nn.LeakyReLU(0.2), UpResBlock(nf), UpResBlock(nf),
                                       nn.Conv2d(nf, 3, 3, 1, 1), nn.Tanh())
        self.has_dictionary = False
        if dict_path:
            self.load_dictionary(dict_path)

    def load_dictionary(self, source: str | Path | Mapping[int | str, Mapping[str, torch.Tensor]]) -> None:
        """Attach the component dictionary: a file (``load_component_dictionary``) or ``{size: {part: tensor}}``;
        kept normalised, as non-persistent buffers on the network's device."""
        if isinstance(source, (str, Path)):
            entries = load_component_dictionary(source, self.channels)
        else:
            entries = component_dictionary(source, self.channels)
        device = self.attn_blocks[f"{PARTS[0]}_{SIZES[0]}"][0].weight_orig.device
        for size in SIZES:
            for part in PARTS:
                self.register_buffer(f"dict_{size}_{part}", _normalised(entries[size][part]).to(device),
                                     persistent=False)
        self.has_dictionary = True

    def _swap(self, feat: torch.Tensor, boxes: Sequence[Box], size: int) -> torch.Tensor:
        """``feat`` (one scale, images sharing ``boxes`` in input pixels) with each component blended with its
        best dictionary entry."""
        stride = FACE_SIZE // size
        fh, fw = feat.shape[-2:]
        out = feat
        for part, (x1, y1, x2, y2) in zip(PARTS, boxes, strict=True):
            bx1, by1 = min(max(x1 // stride, 0), fw - 1), min(max(y1 // stride, 0), fh - 1)
            bx2, by2 = min(max(x2 // stride, bx1 + 1), fw), min(max(y2 // stride, by1 + 1), fh)
            crop = feat[:, :, by1:by2, bx1:bx2]
            entries: torch.Tensor = getattr(self, f"dict_{size}_{part}").to(feat.dtype)
            n, _, dh, dw = entries.shape
            ph, pw = by2 - by1, bx2 - bx1
            resized = _resize(crop, _bilinear_matrix(ph, dh), _bilinear_matrix(pw, dw))
            flat = resized.flatten(2)
            mean = flat.mean(2)
            std = (flat.var(2) + _EPS).sqrt()
            with torch.no_grad():  # the choice (an argmax) carries no gradient; the shared mean term is left out
                score = (torch.einsum("bcyx,ncyx->bnc", resized, entries) * std[:, None, :]).sum(2)
                pick = (score.argmax(1)[:, None] == torch.arange(n, device=feat.device)).to(feat.dtype)
            chosen = torch.einsum("bn,ncyx->bcyx", pick, entries) * std[..., None, None] + mean[..., None, None]
            swapped = _resize(chosen, _nearest_matrix(dh, ph), _nearest_matrix(dw, pw))
            attn = self.attn_blocks[f"{part}_{size}"](swapped - crop)
            out = _replace(out, (bx1, by1, bx2, by2), attn * swapped + crop)
        return out

    def forward(self, x: torch.Tensor, part_locations: Sequence[Any] | None = None) -> torch.Tensor:
        """Restore (b, 3, h, w) faces in [-1, 1]; ``part_locations``: see the module docstring (None: the FFHQ
        default boxes at this size)."""
        if not self.has_dictionary:
            raise ArchArgumentError("dict_path", "DFDNet has no component dictionary (it is not in the weights): "
                                    "build it with one (network_g.dict_path, or --arch DFDNet --arch-opt "
                                    f"num_feat={self.num_feat} dict_path=FILE)")
        b, h, w = int(x.shape[0]), int(x.shape[-2]), int(x.shape[-1])  # the boxes are Python integers
        if part_locations is None:
            groups = [(None, default_part_boxes(h, w))]
        else:
            per_image = _as_boxes(part_locations, b)
            groups = [(None, per_image[0])] if len(set(per_image)) == 1 else \
                [(i, boxes) for i, boxes in enumerate(per_image)]
        x, _, _ = pad_to_multiple(x, MULTIPLE)
        feats = self.vgg_extractor(x)
        updated = []
        for layer, size in zip(VGG_LAYERS, SIZES, strict=True):
            f = feats[layer]
            parts = [self._swap(f if i is None else f[i:i + 1], boxes, size) for i, boxes in groups]
            updated.append(parts[0] if len(parts) == 1 else torch.cat(parts, 0))
        y = self.multi_scale_dilation(feats["conv5_4"])
        y = self.upsample0(y, updated[3])
        y = self.upsample1(y, updated[2])
        y = self.upsample2(y, updated[1])
        y = self.upsample3(y, updated[0])
        return self.upsample4(y)[..., :h, :w]


def _recognise(s: StateShapes) -> dict:
    """DFDNet from its tensors: the width from the last decoder conv (the VGG, the attention blocks and the
    dictionary follow from it; the dictionary is not in the weights: pass dict_path to run it)."""
    return {"num_feat": s.dim("upsample4.0.weight_orig", 0)}


register_recogniser("DFDNet", _recognise)

__all__ = ["FFHQ_PART_BOXES", "DFDNet", "component_dictionary", "default_part_boxes", "load_component_dictionary"]

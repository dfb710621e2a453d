"""traiNNer-redux's temporal SPANs: clip in, centre frame out (input (b, t, c, h, w), output (b, c, sh, sw)).

* ``TemporalSPAN`` (traiNNer-redux's ``temporalspan``): early fusion. The centre frame gets a full-width Conv3XC,
  every other frame its own narrow one (``history_channels``); the concatenation goes through two Conv3XC and then
  SPAN's body (six SPAB blocks, here with GroupNorm after each conv) and a PixelShuffle head.
* ``TemporalSPANv2`` (traiNNer-redux's ``temporalspanv2``, class TSPANv2 there): TSCUNet's temporal pyramid with
  SPAN blocks. Each frame is normalised (``(x - rgb_mean) * img_range``) and embedded by a 3x3 conv; each of the
  ``(num_frames - 1) / 2`` temporal layers maps every 3 consecutive frames' features to one (the windows run as one
  batch here), until one map is left; plus a conv of the centre frame's features, PixelShuffle, a 3x3 conv, and
  the normalisation undone. Frames are reflect-padded, centred, to a multiple of 64 first (as the original).

Module names and constructor arguments are those of traiNNer-redux's builders, so its checkpoints load with
``strict=True`` and give its outputs. Convs are SPAN's re-parameterisable ``Conv3XC`` (refolded on every eval call).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from anysr.archs.arch_util import ArchArgumentError, run_checkpointed
from anysr.archs.recognition.recognise import StateShapes, register_recogniser, shuffle_splits
from anysr.archs.span_arch import SPAB, Conv3XC, check_int, fold_conv3xc
from anysr.registry import ARCH_REGISTRY

PAD_MULTIPLE = 64  # TemporalSPANv2 / TSCUNet pad frames to this multiple


def _check_frames(arch: str, name: str, frames: object) -> None:
    check_int(arch, name, frames, 1)
    if frames % 2 == 0:  # type: ignore[operator]
        raise ArchArgumentError(name, f"{arch} predicts the centre frame: {name} must be odd, got {frames}")


def check_clip(arch: str, x: torch.Tensor, frames: int | None) -> None:
    """One-line error for an input that is not a (b, t, c, h, w) clip of ``frames`` frames (shapes only)."""
    if x.dim() != 5:
        raise ValueError(f"{arch} takes clips (b, t, c, h, w), got a {x.dim()}-D input {tuple(x.shape)}")
    if frames is not None and x.shape[1] != frames:
        raise ValueError(f"{arch} was built for {frames}-frame clips, got {x.shape[1]} frames")


def pad_centred(x: torch.Tensor, pad_h: int, pad_w: int) -> tuple[torch.Tensor, int, int]:
    """Pad a (n, c, h, w) map by ``pad_h`` rows / ``pad_w`` columns, the larger half at the top / left (the
    originals' split): reflection as far as it goes, then edge replication. Returns the map, top and left pads."""
    top, left = -(-pad_h // 2), -(-pad_w // 2)
    bottom, right = pad_h - top, pad_w - left
    if not (pad_h or pad_w):
        return x, 0, 0
    h, w = x.shape[-2:]
    ref = (min(left, w - 1), min(right, w - 1), min(top, h - 1), min(bottom, h - 1))
    if any(ref):
        x = F.pad(x, ref, mode="reflect")
    rest = (left - ref[0], right - ref[1], top - ref[2], bottom - ref[3])
    if any(rest):
        x = F.pad(x, rest, mode="replicate")
    return x, top, left


def windows_of_three(x: torch.Tensor) -> torch.Tensor:
    """(b, t, c, h, w) -> (b * (t - 2), 3c, h, w): every 3 consecutive frames, channels concatenated."""
    b, t, c, h, w = x.shape
    return torch.stack([x[:, i:i + 3] for i in range(t - 2)], dim=1).reshape(b * (t - 2), 3 * c, h, w)


def _icnr_(conv: nn.Conv2d, scale: int) -> None:
    """ICNR initialisation (every sub-pixel of a PixelShuffle output starts with the same kernel)."""
    with torch.no_grad():
        sub = torch.empty(conv.out_channels // scale**2, *conv.weight.shape[1:])
        nn.init.kaiming_normal_(sub)
        conv.weight.copy_(sub.repeat_interleave(scale**2, dim=0))
        if conv.bias is not None:
            conv.bias.zero_()


class NormSPAB(nn.Module):
    """TemporalSPAN's SPAB: three Conv3XC, each followed by GroupNorm(8) (SiLU after the first two), attention
    ``sigmoid(y) - 0.5`` on ``y + x``. Returns ``(output, first activated features, attention)`` like SPAB."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.in_channels = channels
        self.c1_r = Conv3XC(channels, channels, gain1=2, s=1)
        self.c2_r = Conv3XC(channels, channels, gain1=2, s=1)
        self.c3_r = Conv3XC(channels, channels, gain1=2, s=1)
        self.norm1 = nn.GroupNorm(8, channels)
        self.norm2 = nn.GroupNorm(8, channels)
        self.norm3 = nn.GroupNorm(8, channels)
        self.act1 = nn.SiLU()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # The original's in-place SiLU also changes the normalised first conv it returns: return it activated.
        out1 = self.act1(self.norm1(self.c1_r(x)))
        out3 = self.norm3(self.c3_r(self.act1(self.norm2(self.c2_r(out1)))))
        att = torch.sigmoid(out3) - 0.5
        return (out3 + x) * att, out1, att


@ARCH_REGISTRY.register()
class TemporalSPAN(nn.Module):
    """TemporalSPAN (see the module docstring). ``bias`` is accepted for the original signature (the convs always
    have biases). Input (b, num_frames, num_in_ch, h, w); output (b, num_out_ch, h * scale, w * scale)."""

    tile_multiple: int = 1
    video_window = True  # clip in, centre frame out (num_frame frames): a window network

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, num_frames: int = 5, feature_channels: int = 48,
                 scale: int = 4, bias: bool = True, history_channels: int = 12) -> None:
        super().__init__()
        del bias
        check_int("TemporalSPAN", "scale", scale, 1)
        _check_frames("TemporalSPAN", "num_frames", num_frames)
        check_int("TemporalSPAN", "history_channels", history_channels, 1)
        if feature_channels < 8 or feature_channels % 8:
            raise ArchArgumentError("feature_channels", f"TemporalSPAN's GroupNorm has 8 groups: feature_channels "
                                    f"must be a positive multiple of 8, got {feature_channels}")
        f = feature_channels
        self.num_frame = self.num_frames = num_frames
        self.in_channels, self.out_channels, self.upscale = num_in_ch, num_out_ch, scale
        self.center_idx = num_frames // 2
        self.center_conv = Conv3XC(num_in_ch, f, gain1=2, s=1)
        self.history_convs = nn.ModuleList([Conv3XC(num_in_ch, history_channels, gain1=2, s=1)
                                            for _ in range(num_frames - 1)])
        self.fusion_conv = nn.Sequential(Conv3XC(f + history_channels * (num_frames - 1), f, gain1=2, s=1),
                                         Conv3XC(f, f, gain1=2, s=1))
        for i in range(1, 7):
            setattr(self, f"block_{i}", NormSPAB(f))
        self.conv_cat = nn.Conv2d(f * 4, f, 1, padding=0, bias=True)
        self.conv_2 = Conv3XC(f, f, gain1=2, s=1)
        self.upsampler = nn.Sequential(nn.Conv2d(f, num_out_ch * scale**2, 3, padding=1), nn.PixelShuffle(scale))
        _icnr_(self.upsampler[0], scale)

    def reparameterize(self) -> TemporalSPAN:
        """The deployment form: every Conv3XC folded once (see SPAN.reparameterize)."""
        fold_conv3xc(self)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_clip("TemporalSPAN", x, self.num_frames)
        history = iter(self.history_convs)
        feats = [self.center_conv(x[:, i]) if i == self.center_idx else next(history)(x[:, i])
                 for i in range(self.num_frames)]
        feat = self.fusion_conv(torch.cat(feats, dim=1))
        b1, _, _ = self.block_1(feat)
        b = b1
        for block in (self.block_2, self.block_3, self.block_4, self.block_5):
            b, _, _ = block(b)
        b6, b6_first, _ = self.block_6(b)
        out = self.conv_cat(torch.cat([feat, self.conv_2(b6), b1, b6_first], 1))
        return self.upsampler(out)


class TemporalSPANBlock(nn.Module):
    """One temporal layer of TemporalSPANv2 on 3 frames' concatenated features: a Conv3XC to ``dim``, SPAB
    blocks (the first six used, SPAN's wiring), a 1x1 fusion of four maps, a 3x3 conv to ``out_nc`` and
    LeakyReLU(0.2). Blocks past the sixth are built (they are in the original's checkpoints) but never run."""

    def __init__(self, in_nc: int, out_nc: int, dim: int, num_blocks: int, bias: bool,
                 use_checkpoint: bool = False) -> None:
        super().__init__()
        self.use_checkpoint = use_checkpoint
        self.m_head = Conv3XC(in_nc, dim, gain1=2, s=1)
        self.blocks = nn.ModuleList([SPAB(dim, bias=bias) for _ in range(num_blocks)])
        for block in self.blocks[6:]:
            block.requires_grad_(False)  # unused, as in the original (and so never an unused DDP parameter)
        self.conv_cat = nn.Conv2d(dim * 4, dim, 1, padding=0, bias=True)
        self.conv_post = Conv3XC(dim, dim, gain1=2, s=1)
        self.m_tail = nn.Sequential(nn.Conv2d(dim, out_nc, 3, 1, 1, bias=False), nn.LeakyReLU(0.2))

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.m_head(x)
        b1, _, _ = self.blocks[0](feat)
        b = b1
        for block in self.blocks[1:5]:
            b, _, _ = block(b)
        b6, b6_first, _ = self.blocks[5](b)
        return self.m_tail(self.conv_cat(torch.cat([feat, self.conv_post(b6), b1, b6_first], 1)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_checkpointed(self._body, x, enabled=self.use_checkpoint and self.training)


@ARCH_REGISTRY.register()
class TemporalSPANv2(nn.Module):
    """TemporalSPANv2 (see the module docstring). Input (b, num_frames, 3, h, w); output (b, 3, h * scale,
    w * scale). ``use_checkpoint``: recompute each temporal layer in backward (less memory)."""

    tile_multiple: int = PAD_MULTIPLE  # frames are padded to it
    video_window = True  # clip in, centre frame out (num_frame frames): a window network

    def __init__(self, num_in_ch: int = 3, num_out_ch: int = 3, num_frames: int = 5, feature_channels: int = 48,
                 scale: int = 4, bias: bool = False, num_blocks: int = 6, residual: bool = True,
                 img_range: float = 255.0, use_checkpoint: bool = False,
                 rgb_mean: tuple[float, float, float] = (0.4488, 0.4371, 0.4040)) -> None:
        super().__init__()
        check_int("TemporalSPANv2", "scale", scale, 1)
        _check_frames("TemporalSPANv2", "num_frames", num_frames)
        check_int("TemporalSPANv2", "num_blocks", num_blocks, 6)
        if num_in_ch != 3 or num_out_ch != 3 or len(rgb_mean) != 3:
            raise ArchArgumentError("num_in_ch", "TemporalSPANv2 normalises RGB frames by an RGB mean: num_in_ch and "
                                    f"num_out_ch must be 3, got {num_in_ch} and {num_out_ch}")
        dim = feature_channels
        self.num_frame = self.clip_size = num_frames
        self.dim, self.upscale, self.residual, self.img_range = dim, scale, residual, img_range
        self.register_buffer("mean", torch.tensor([float(v) for v in rgb_mean]).view(1, 3, 1, 1), persistent=False)
        self.m_head = nn.Conv2d(num_in_ch, dim, 3, 1, 1, bias=False)
        self.m_layers = nn.ModuleList([TemporalSPANBlock(dim * 3, dim, dim, num_blocks, bias, use_checkpoint)
                                       for _ in range((num_frames - 1) // 2)])
        if residual:
            self.m_res = nn.Conv2d(dim, dim, 3, 1, 1, bias=False)
        self.m_upsample = nn.Sequential(nn.Conv2d(dim, dim * scale**2, 3, padding=1), nn.PixelShuffle(scale))
        self.m_tail = nn.Conv2d(dim, num_out_ch, 3, 1, 1, bias=False)

    def reparameterize(self) -> TemporalSPANv2:
        """The deployment form: every Conv3XC folded once (see SPAN.reparameterize)."""
        fold_conv3xc(self)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_clip("TemporalSPANv2", x, self.clip_size)
        b, t, c, h, w = x.shape
        mean = self.mean.to(x.dtype)
        x, top, left = pad_centred(((x - mean) * self.img_range).reshape(b * t, c, h, w),
                                   (-h) % PAD_MULTIPLE, (-w) % PAD_MULTIPLE)
        hp, wp = x.shape[-2:]
        feats = self.m_head(x).view(b, t, self.dim, hp, wp)
        center = feats[:, t // 2]
        for layer in self.m_layers:
            n = feats.shape[1] - 2
            feats = layer(windows_of_three(feats)).view(b, n, self.dim, hp, wp)
        out = feats[:, 0]
        if self.residual:
            out = out + self.m_res(center)
        out = self.m_tail(self.m_upsample(out))
        s = self.upscale
        out = out[..., top * s: (top + h) * s, left * s: (left + w) * s]
        return out / self.img_range + mean


__all__ = ["NormSPAB", "TemporalSPAN", "TemporalSPANBlock", "TemporalSPANv2", "check_clip", "pad_centred",
           "windows_of_three"]


def _recognise_v1(s: StateShapes) -> list[dict]:
    """TemporalSPAN from its tensors: width and channels from the centre conv, frames from the history convs, the
    history width, output channels and scale from the PixelShuffle conv."""
    feat, cin = s.dim("center_conv.sk.weight", 0), s.dim("center_conv.sk.weight", 1)
    s.shape("block_6.norm3.weight")
    frames = s.count("history_convs.") + 1
    hist = s.dim("history_convs.0.sk.weight", 0) if frames > 1 else 12
    return [{"num_in_ch": cin, "num_out_ch": cout, "num_frames": frames, "feature_channels": feat, "scale": scale,
             "history_channels": hist}
            for cout, scale in shuffle_splits(s.dim("upsampler.0.weight", 0), (cin, 3, 1))]


def _recognise_v2(s: StateShapes) -> list[dict]:
    """TemporalSPANv2 from its tensors: width from the head, frames from the temporal layers, SPAB blocks per
    layer, the residual conv, the scale from the PixelShuffle conv (``dim * scale**2`` wide)."""
    dim = s.dim("m_head.weight", 0)
    s.shape("m_layers.0.conv_post.sk.weight")
    up = s.dim("m_upsample.0.weight", 0)
    scale = round((up // dim) ** 0.5)
    if scale * scale * dim != up:
        return []
    return [{"num_frames": 2 * s.count("m_layers.") + 1, "feature_channels": dim, "scale": scale,
             "num_blocks": s.count("m_layers.0.blocks."), "residual": "m_res.weight" in s}]


register_recogniser("TemporalSPAN", _recognise_v1)
register_recogniser("TemporalSPANv2", _recognise_v2)

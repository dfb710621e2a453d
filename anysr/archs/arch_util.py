"""Building blocks shared by several architectures (names and parameter layout as in BasicSR)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils import checkpoint

from anysr.errors import ArchArgumentError as ArchArgumentError  # re-exported: the families raise it from here
from anysr.ops.dcn import ModulatedDeformConv2dPack, warp

# oneDNN (torch 2.13, AVX-512 CPUs) spends minutes generating its depth-wise kernel when the filter is 17 or more
# wide and the input is bf16 channels_last with few channels (measured, 8-16 channels: 1x13 in 5 ms; 1x17, 1x20,
# 1x31, 17x17 not done after 15 s; 17x1 and 24+ channels fast). The channel bound depends on the CPU's instruction
# set, so every such conv takes NCHW on CPU at low precision: the same values in another memory layout.
ONEDNN_SLOW_DW_WIDTH = 17


class PlainLayoutDepthwiseConv2d(nn.Conv2d):
    """A wide depth-wise ``nn.Conv2d`` that runs in NCHW on CPU below fp32 (see ``ONEDNN_SLOW_DW_WIDTH``);
    elsewhere, and in its state dict, it is the plain conv."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type == "cpu" and (x.dtype != torch.float32 or torch.is_autocast_enabled("cpu")):
            # Either operand in NHWC strides makes oneDNN choose NHWC. A (C, 1, 1, K) weight in NHWC strides counts
            # as contiguous (its size-1 dims), so ``contiguous()`` would keep them: the copy sets NCHW strides.
            return self._conv_forward(x.contiguous(), self.weight.clone(memory_format=torch.contiguous_format),
                                      self.bias)
        return super().forward(x)


def avoid_slow_cpu_kernels(net: nn.Module) -> list[str]:
    """Make every plain depth-wise ``nn.Conv2d`` of ``net`` with a filter ``ONEDNN_SLOW_DW_WIDTH`` or more wide a
    ``PlainLayoutDepthwiseConv2d`` (same parameters and keys); returns the names of the convs changed."""
    changed = []
    for name, m in net.named_modules():
        if (type(m) is nn.Conv2d and m.groups > 1 and m.groups == m.in_channels == m.out_channels
                and m.kernel_size[1] >= ONEDNN_SLOW_DW_WIDTH):
            m.__class__ = PlainLayoutDepthwiseConv2d
            changed.append(name)
    return changed


@torch.no_grad()
def default_init_weights(
    module_list: nn.Module | Iterable[nn.Module], scale: float = 1.0, bias_fill: float = 0.0, **kwargs
) -> None:
    """Kaiming-normal init of every Conv2d / Linear in ``module_list``, scaled by ``scale``.

    Biases are filled with ``bias_fill``; batch-norm layers get weight 1. ``kwargs`` go to
    ``nn.init.kaiming_normal_`` (for example ``a`` or ``mode``).
    """
    modules = [module_list] if isinstance(module_list, nn.Module) else list(module_list)
    for module in modules:
        for m in module.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, **kwargs)
                m.weight.mul_(scale)
                if m.bias is not None:
                    m.bias.fill_(bias_fill)
            elif isinstance(m, _BatchNorm):
                nn.init.constant_(m.weight, 1.0)
                if m.bias is not None:
                    m.bias.fill_(bias_fill)


def make_layer(basic_block: type[nn.Module], num_basic_block: int, **kwargs) -> nn.Sequential:
    """``num_basic_block`` instances of ``basic_block(**kwargs)`` chained in an ``nn.Sequential``."""
    return nn.Sequential(*(basic_block(**kwargs) for _ in range(num_basic_block)))


class ResidualBlockNoBN(nn.Module):
    """conv-ReLU-conv with an identity shortcut and no batch norm: ``x + res_scale * body(x)``.

    With ``pytorch_init=False`` the convolutions get Kaiming init scaled by 0.1 (as BasicSR does).
    """

    def __init__(self, num_feat: int = 64, res_scale: float = 1, pytorch_init: bool = False) -> None:
        super().__init__()
        self.res_scale = res_scale
        self.conv1 = nn.Conv2d(num_feat, num_feat, 3, 1, 1, bias=True)
        self.conv2 = nn.Conv2d(num_feat, num_feat, 3, 1, 1, bias=True)
        self.relu = nn.ReLU(inplace=True)
        if not pytorch_init:
            default_init_weights([self.conv1, self.conv2], 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.relu(self.conv1(x))) * self.res_scale


def _to_signed(_module: nn.Module, args: tuple) -> tuple:
    return (args[0] * 2.0 - 1.0, *args[1:])


def _to_unit(_module: nn.Module, _args: tuple, out: Any) -> Any:
    if isinstance(out, tuple):  # the authors' (image, extras) tuples: the image is first
        return ((out[0] + 1.0) * 0.5, *out[1:])
    return (out + 1.0) * 0.5


def unit_range(net: nn.Module) -> nn.Module:
    """``net`` taking and giving [0, 1] images like every other anysr network, when its authors feed [-1, 1]
    (its class says ``image_range = (-1.0, 1.0)``: GFPGAN, RestoreFormer, MixDehazeNet): forward hooks map the
    input by ``2x - 1`` and the output by ``(y + 1) / 2``, so the state dict keeps the reference's names (the
    weights still load in spandrel and the authors' code) and ONNX exports carry the mapping. Other networks are
    returned as they are; applying it twice changes nothing."""
    if tuple(getattr(net, "image_range", (0.0, 1.0))) != (-1.0, 1.0) or getattr(net, "_unit_range", False):
        return net
    net.register_forward_pre_hook(_to_signed)
    net.register_forward_hook(_to_unit)
    net._unit_range = True  # type: ignore[assignment]
    return net


def check_upscale(scale: int, arg: str = "upscale") -> None:
    """Raise ArchArgumentError unless ``scale`` is a power of two (1, 2, 4, 8, ...) or 3."""
    if not isinstance(scale, int) or isinstance(scale, bool) or scale < 1 or (
        scale & (scale - 1) and scale != 3
    ):
        raise ArchArgumentError(
            arg, f"scale {scale!r} is not supported; use a power of two (1, 2, 4, 8) or 3"
        )


class Upsample(nn.Sequential):
    """Sub-pixel upsampling: (conv to 4x channels, PixelShuffle(2)) per factor 2, or one x3 step.

    Supports scale = 2**n and 3; the layer layout (and hence the state-dict keys) is BasicSR's.
    """

    def __init__(self, scale: int, num_feat: int) -> None:
        check_upscale(scale, "upscale")
        layers: list[nn.Module] = []
        if scale == 3:
            layers += [nn.Conv2d(num_feat, 9 * num_feat, 3, 1, 1), nn.PixelShuffle(3)]
        else:
            for _ in range(int(math.log2(scale))):
                layers += [nn.Conv2d(num_feat, 4 * num_feat, 3, 1, 1), nn.PixelShuffle(2)]
        super().__init__(*layers)


def nearest_upsample(x: torch.Tensor, factor: int) -> torch.Tensor:
    """``F.interpolate(x, scale_factor=factor, mode="nearest")`` for an integer ``factor``, as a broadcast and a
    reshape: the same values, and a backward (a sum) that XLA lowers, where ``upsample_nearest2d_backward`` falls
    back to the CPU. Every network upsampling in its gradient path uses this."""
    if factor == 1:
        return x
    # ONNX: Resize (the same values) keeps the channel count known to the exporter; a traced factor broadcasts
    if isinstance(factor, int) and torch.onnx.is_in_onnx_export():
        return F.interpolate(x, scale_factor=factor, mode="nearest")
    b, c, h, w = x.shape
    return x[:, :, :, None, :, None].expand(b, c, h, factor, w, factor).reshape(b, c, h * factor, w * factor)


class NearestUpsample(nn.Module):
    """``nn.Upsample(scale_factor=scale, mode="nearest")`` as ``nearest_upsample`` (no parameters)."""

    def __init__(self, scale: int) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nearest_upsample(x, self.scale)


def pixel_unshuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """Fold each ``scale x scale`` patch into channels: (b, c, h*s, w*s) -> (b, c*s*s, h, w).

    Same channel order as BasicSR's ``pixel_unshuffle`` (channel, row offset, column offset).
    """
    return F.pixel_unshuffle(x, scale)


def flow_warp(x: torch.Tensor, flow: torch.Tensor, interp_mode: str = "bilinear", padding_mode: str = "zeros",
              align_corners: bool = True) -> torch.Tensor:
    """Warp ``x`` (n, c, h, w) with optical flow ``flow`` (n, h, w, 2), in pixels, x displacement first.

    BasicSR's ``flow_warp`` (same arguments and result); built from gathers (``anysr.ops.dcn.warp``) instead of
    ``F.grid_sample``, which has no XLA lowering. ``padding_mode`` is 'zeros' or 'border'.
    """
    return warp(x, flow, interp_mode, padding_mode, align_corners)


class DCNv2Pack(ModulatedDeformConv2dPack):
    """DCNv2 whose offsets and mask come from a second feature map: ``forward(x, feat)`` deforms ``x`` with
    ``conv_offset(feat)`` (the alignment block of EDVR; "Delving Deep into Deformable Alignment in Video
    Super-Resolution"). Parameters ``weight``, ``bias``, ``conv_offset.{weight,bias}`` as in BasicSR.

    BasicSR logs a warning when the mean absolute offset exceeds 50; that needs a host sync per call, so it is
    left to the training loop here.
    """

    def forward(self, x: torch.Tensor, feat: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        offset, mask = self.offset_and_mask(self.conv_offset(feat))
        return self.deform(x, offset, mask)


def refuse_weights_path(arg: str, path: object, what: str) -> None:
    """Raise ArchArgumentError when a pretrained-weights file is given to an architecture.

    Architectures do no file I/O (BasicSR's ``load_path`` / ``spynet_path`` / ``edvr_path`` opened files in the
    constructor); the argument is accepted for option-file compatibility and must be None / empty.
    """
    if path:
        raise ArchArgumentError(
            arg, f"{what} weights are not read by the architecture (got {path!r}); remove {arg} and load "
                 f"pretrained weights through path.pretrain_network_g (the engine reads weight files)")


def to_2tuple(x: int | Iterable[int]) -> tuple[int, int]:
    """``x`` as a pair: an int is repeated, an iterable of two is returned as a tuple."""
    if isinstance(x, Iterable):
        a, b = tuple(x)
        return int(a), int(b)
    return int(x), int(x)


# ----------------------------------------------------------------- window-attention pieces

def to_tokens(x: torch.Tensor) -> torch.Tensor:
    """A feature map as a token sequence: (b, c, h, w) -> (b, h*w, c) (a view)."""
    return x.flatten(2).transpose(1, 2)


def to_feature_map(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """A token sequence as a feature map: (b, h*w, c) -> (b, c, h, w)."""
    return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], h, w)


def drop_path(x: torch.Tensor, drop_prob: float = 0.0, training: bool = False) -> torch.Tensor:
    """Stochastic depth: zero whole samples with probability ``drop_prob`` and rescale the rest."""
    if drop_prob == 0.0 or not training:
        return x
    keep = 1.0 - drop_prob
    mask = torch.empty((x.shape[0],) + (1,) * (x.ndim - 1), dtype=x.dtype, device=x.device).bernoulli_(keep)
    return x / keep * mask


def drop_path_rates(max_rate: float, n: int) -> list[float]:
    """Stochastic-depth rates rising linearly from 0 to ``max_rate`` over ``n`` blocks (plain floats, so
    that a network can be built on the meta device)."""
    return [max_rate * i / (n - 1) for i in range(n)] if n > 1 else [0.0] * n


class DropPath(nn.Module):
    """``drop_path`` as a module (active only in training mode)."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        self.drop_prob = drop_prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return drop_path(x, self.drop_prob, self.training)


class Mlp(nn.Module):
    """Linear - activation - dropout - linear - dropout."""

    def __init__(self, in_features: int, hidden_features: int | None = None, out_features: int | None = None,
                 act_layer: type[nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        hidden_features = hidden_features or in_features
        out_features = out_features or in_features
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features, out_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


def relative_position_index(window_size: int | tuple[int, int]) -> torch.Tensor:
    """(n, n) row of each query/key pair of an (wh, ww) window, n = wh*ww, in a ``(2wh-1)(2ww-1)``-row
    relative-position bias table (Swin's layout: row offset major, column offset minor; int64)."""
    wh, ww = to_2tuple(window_size)
    coords = torch.stack(torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")).flatten(1)  # (2, n)
    rel = coords[:, :, None] - coords[:, None, :]
    return (rel[0] + wh - 1) * (2 * ww - 1) + (rel[1] + ww - 1)


def window_partition(x: torch.Tensor, window_size: int) -> torch.Tensor:
    """(b, h, w, c) -> (b * h/ws * w/ws, ws, ws, c), windows in row-major order; contiguous (callers ``view`` it:
    with one image and one row of windows a bare ``reshape`` would return a strided view)."""
    b, h, w, c = x.shape
    x = x.view(b, h // window_size, window_size, w // window_size, window_size, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, c)


def window_reverse(windows: torch.Tensor, window_size: int, h: int, w: int) -> torch.Tensor:
    """Inverse of ``window_partition``: (b * nw, ws, ws, c) -> (b, h, w, c)."""
    nh, nw = h // window_size, w // window_size
    b = windows.shape[0] // (nh * nw)
    x = windows.view(b, nh, nw, window_size, window_size, -1)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, -1)


def shifted_window_blocked(h: int, w: int, window_size: int | tuple[int, int], shift_size: int | tuple[int, int],
                           device: torch.device | None = None) -> torch.Tensor:
    """Which token pairs of shifted windows on an ``h x w`` map must not attend: (num_windows, wh*ww, wh*ww) bool.

    After the cyclic shift (``torch.roll`` by ``-shift_size``), the last ``window_size`` rows (columns) hold two
    regions that were not neighbours in the image: the band before the last ``shift_size`` rows and the
    wrapped-around band. Tokens of different regions must not attend to each other. ``window_size`` /
    ``shift_size`` may be (rows, columns) pairs for rectangular windows; ``h`` and ``w`` must be multiples of the
    window. Windows in ``window_partition``'s order.
    """
    (wh, ww), (sh, sw) = to_2tuple(window_size), to_2tuple(shift_size)

    def region(n: int, win: int, shift: int) -> torch.Tensor:
        idx = torch.arange(n, device=device)
        return (idx >= n - win).long() + (idx >= n - shift).long()

    label = region(h, wh, sh)[:, None] * 3 + region(w, ww, sw)[None, :]  # (h, w)
    windows = label.view(h // wh, wh, w // ww, ww).permute(0, 2, 1, 3).reshape(-1, wh * ww)
    return windows.unsqueeze(1) != windows.unsqueeze(2)


def shifted_window_mask(h: int, w: int, window_size: int | tuple[int, int], shift_size: int | tuple[int, int],
                        device: torch.device | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The additive attention mask of ``shifted_window_blocked``: (num_windows, wh*ww, wh*ww) of 0 / -100."""
    blocked = shifted_window_blocked(h, w, window_size, shift_size, device)
    zeros = torch.zeros(blocked.shape, dtype=dtype, device=blocked.device)
    return torch.where(blocked, torch.full_like(zeros, -100.0), zeros)


def window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                     mask: torch.Tensor | None = None, scale: float | None = None,
                     dropout_p: float = 0.0) -> torch.Tensor:
    """Attention inside windows, ``softmax(q k^T * scale + bias [+ mask]) v``, with torch's fused kernel.

    ``q``: (windows * b, heads, nq, d) with the windows of each image consecutive (``window_partition``'s
    order); ``k``, ``v``: (windows * b, heads, nk, d); ``bias``: (heads, nq, nk) relative-position bias;
    ``mask``: (windows, nq, nk) of 0 / -100 (shifted windows) or None; ``scale``: default ``d ** -0.5``;
    ``dropout_p``: dropout on the attention weights (pass 0 outside training).
    """
    attn_mask = bias.unsqueeze(0)
    if mask is not None:
        nw = mask.shape[0]
        attn_mask = attn_mask + mask.unsqueeze(1).to(bias.dtype)  # (windows, heads, nq, nk)
        attn_mask = attn_mask.expand(q.shape[0] // nw, *attn_mask.shape).reshape(q.shape[0], *attn_mask.shape[1:])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask.to(q.dtype), dropout_p=dropout_p,
                                          scale=scale)


def swin_init_weights(m: nn.Module, norm_types: tuple[type[nn.Module], ...] = (nn.LayerNorm,)) -> None:
    """The Swin family's init of one module (for ``net.apply``): a Linear gets a truncated-normal weight (std
    0.02) and a zero bias, a norm layer of ``norm_types`` weight 1 and bias 0; other modules are left alone."""
    if isinstance(m, nn.Linear):
        nn.init.trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, norm_types):
        nn.init.zeros_(m.bias)
        nn.init.ones_(m.weight)


class SwinWeightsMixin(nn.Module):
    """What the Swin family's networks share besides their blocks: the weight init and the no-weight-decay names.

    A network subclasses it instead of ``nn.Module`` and calls ``self.init_swin_weights()`` at the end of its
    ``__init__``. The class attributes say which norm layers the init resets (``swin_init_norms``) and which
    parameter names (``no_weight_decay_names``) and name fragments (``no_weight_decay_fragments``)
    ``no_weight_decay()`` / ``no_weight_decay_keywords()`` report (timm's and the authors' convention).
    """

    swin_init_norms: ClassVar[tuple[type[nn.Module], ...]] = (nn.LayerNorm,)
    no_weight_decay_names: ClassVar[frozenset[str]] = frozenset({"absolute_pos_embed"})
    no_weight_decay_fragments: ClassVar[frozenset[str]] = frozenset({"relative_position_bias_table"})

    def init_swin_weights(self) -> None:
        """``swin_init_weights`` on every submodule, children before parents (``nn.Module.apply``'s order)."""
        self.apply(partial(swin_init_weights, norm_types=self.swin_init_norms))

    def no_weight_decay(self) -> set[str]:
        """Parameter names usually excluded from weight decay."""
        return set(self.no_weight_decay_names)

    def no_weight_decay_keywords(self) -> set[str]:
        """Parameter-name fragments usually excluded from weight decay."""
        return set(self.no_weight_decay_fragments)


class WindowAttention(nn.Module):
    """Multi-head self attention inside windows with a learned relative-position bias (Swin's block; parameters
    ``relative_position_bias_table``, ``qkv``, ``proj``, and the ``relative_position_index`` buffer).

    ``window_size``: (rows, columns). With ``position_index=False`` there is no index buffer: the network passes
    one to ``forward`` (``rpi``), as HAT shares one between all its blocks.
    """

    def __init__(self, dim: int, window_size: tuple[int, int], num_heads: int, qkv_bias: bool = True,
                 qk_scale: float | None = None, attn_drop: float = 0.0, proj_drop: float = 0.0,
                 position_index: bool = True) -> None:
        super().__init__()
        self.dim = dim
        self.window_size = window_size
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        wh, ww = window_size
        self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * wh - 1) * (2 * ww - 1), num_heads))
        if position_index:
            self.register_buffer("relative_position_index", relative_position_index(window_size))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)
        nn.init.trunc_normal_(self.relative_position_bias_table, std=0.02)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                rpi: torch.Tensor | None = None) -> torch.Tensor:
        """x: (num_windows * b, n, c); mask: (num_windows, n, n) of 0 / -100, or None; rpi: the (n, n) table
        index when the module keeps none."""
        b_, n, c = x.shape
        qkv = self.qkv(x).reshape(b_, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        index = self.relative_position_index if rpi is None else rpi
        bias = self.relative_position_bias_table[index.reshape(-1)].view(n, n, -1).permute(2, 0, 1)
        out = window_attention(qkv[0], qkv[1], qkv[2], bias, mask, scale=self.scale,
                               dropout_p=self.attn_drop.p if self.training else 0.0)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b_, n, c)))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, window_size={self.window_size}, num_heads={self.num_heads}"


def residual_conv(dim: int, resi_connection: str) -> nn.Module:
    """The conv closing a residual group: '1conv' (3x3), '3conv' (3x3 to dim/4, 1x1, 3x3 back; LeakyReLU 0.2
    between) or 'identity' (none)."""
    if resi_connection == "1conv":
        return nn.Conv2d(dim, dim, 3, 1, 1)
    if resi_connection == "identity":
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(dim, dim // 4, 3, 1, 1), nn.LeakyReLU(negative_slope=0.2, inplace=True),
        nn.Conv2d(dim // 4, dim // 4, 1, 1, 0), nn.LeakyReLU(negative_slope=0.2, inplace=True),
        nn.Conv2d(dim // 4, dim, 3, 1, 1),
    )


def pad_to_multiple(x: torch.Tensor, multiple: int) -> tuple[torch.Tensor, int, int]:
    """Pad the bottom/right of a (b, c, h, w) map to a multiple of ``multiple``; also return the pads.

    Reflect padding as the original window-attention model classes apply it before the network; a pad
    of at least the side length (which reflect cannot do) continues with replicate, so any size works.
    """
    h, w = x.shape[-2:]
    pad_h, pad_w = (-h) % multiple, (-w) % multiple
    return pad_bottom_right(x, pad_h, pad_w), pad_h, pad_w


def pad_bottom_right(x: torch.Tensor, pad_h: int, pad_w: int) -> torch.Tensor:
    """Add ``pad_h`` rows and ``pad_w`` columns at the bottom / right: reflect as far as it goes (side - 1
    pixels), then edge replication, so any size can be padded (what the originals and spandrel do)."""
    if not (pad_h or pad_w):
        return x
    h, w = x.shape[-2:]
    ref_h, ref_w = min(pad_h, h - 1), min(pad_w, w - 1)
    if ref_h or ref_w:
        x = F.pad(x, (0, ref_w, 0, ref_h), mode="reflect")
    if pad_h > ref_h or pad_w > ref_w:
        x = F.pad(x, (0, pad_w - ref_w, 0, pad_h - ref_h), mode="replicate")
    return x


def run_checkpointed(module: Callable[..., torch.Tensor], *args: object, enabled: bool) -> torch.Tensor:
    """``module(*args)``, recomputed in backward (non-reentrant activation checkpointing) when ``enabled`` and
    gradients are on."""
    if enabled and torch.is_grad_enabled():
        return checkpoint.checkpoint(module, *args, use_reentrant=False)
    return module(*args)


def block_drop_rates(drop_path: float | Sequence[float], depth: int) -> list[float]:
    """Per-block stochastic-depth rates of a stage: the given sequence, or one float repeated ``depth`` times."""
    return list(drop_path) if isinstance(drop_path, Sequence) else [drop_path] * depth


class WindowBlockBase(nn.Module):
    """What a (shifted-)window transformer block records about itself (SwinIR's attribute names and
    ``extra_repr``): ``dim``, ``input_resolution``, ``num_heads``, ``window_size``, ``shift_size``,
    ``mlp_ratio``."""

    def init_block_attrs(self, dim: int, input_resolution: tuple[int, int], num_heads: int, window_size: int,
                         shift_size: int, mlp_ratio: float) -> None:
        """Set the attributes (a block may then adjust ``window_size`` / ``shift_size``)."""
        self.dim = dim
        self.input_resolution = input_resolution
        self.num_heads = num_heads
        self.window_size = window_size
        self.shift_size = shift_size
        self.mlp_ratio = mlp_ratio

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, input_resolution={self.input_resolution}, num_heads={self.num_heads}, "
                f"window_size={self.window_size}, shift_size={self.shift_size}, mlp_ratio={self.mlp_ratio}")


class ShiftedWindowStage(nn.Module):
    """A stage of ``depth`` window-attention blocks, plain and shifted (by half a window) in turn: attributes
    ``dim``, ``input_resolution``, ``depth``, ``use_checkpoint`` and the ``blocks`` list (SwinIR's names)."""

    def init_blocks(self, dim: int, input_resolution: tuple[int, int], depth: int, window_size: int,
                    drop_path: float | Sequence[float], use_checkpoint: bool,
                    make_block: Callable[[int, float], nn.Module]) -> None:
        """``blocks[i] = make_block(shift_size, drop_path_rate)`` for each block, in order."""
        self.dim = dim
        self.input_resolution = input_resolution
        self.depth = depth
        self.use_checkpoint = use_checkpoint
        rates = block_drop_rates(drop_path, depth)
        self.blocks = nn.ModuleList([make_block(0 if i % 2 == 0 else window_size // 2, rates[i])
                                     for i in range(depth)])

    def run_blocks(self, x: torch.Tensor, *args: object) -> torch.Tensor:
        """``x`` through every block (``block(x, *args)``), each checkpointed when ``use_checkpoint``."""
        for blk in self.blocks:
            x = run_checkpointed(blk, x, *args, enabled=self.use_checkpoint)
        return x


class _PatchGeometry(nn.Module):
    """Image / patch sizes shared by PatchEmbed and PatchUnEmbed (BasicSR's attributes)."""

    def __init__(self, img_size: int | Sequence[int] = 224, patch_size: int | Sequence[int] = 4,
                 in_chans: int = 3, embed_dim: int = 96) -> None:
        super().__init__()
        self.img_size = to_2tuple(img_size)
        self.patch_size = to_2tuple(patch_size)
        self.patches_resolution = [self.img_size[0] // self.patch_size[0],
                                   self.img_size[1] // self.patch_size[1]]
        self.num_patches = self.patches_resolution[0] * self.patches_resolution[1]
        self.in_chans = in_chans
        self.embed_dim = embed_dim


class PatchEmbed(_PatchGeometry):
    """(b, c, h, w) -> (b, h*w, c) tokens, with an optional norm (patch_size 1: no projection; key ``norm``)."""

    def __init__(self, img_size: int | Sequence[int] = 224, patch_size: int | Sequence[int] = 4,
                 in_chans: int = 3, embed_dim: int = 96, norm_layer: type[nn.Module] | None = None) -> None:
        super().__init__(img_size, patch_size, in_chans, embed_dim)
        self.norm = norm_layer(embed_dim) if norm_layer is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = to_tokens(x)
        return self.norm(x) if self.norm is not None else x


class PatchUnEmbed(_PatchGeometry):
    """(b, h*w, c) tokens -> (b, c, h, w) feature map."""

    def __init__(self, img_size: int | Sequence[int] = 224, patch_size: int | Sequence[int] = 4,
                 in_chans: int = 3, embed_dim: int = 96, norm_layer: type[nn.Module] | None = None) -> None:
        del norm_layer  # accepted for BasicSR's signature; un-embedding has no norm
        super().__init__(img_size, patch_size, in_chans, embed_dim)

    def forward(self, x: torch.Tensor, x_size: tuple[int, int]) -> torch.Tensor:
        return x.transpose(1, 2).reshape(x.shape[0], self.embed_dim, x_size[0], x_size[1])


class UpsampleOneStep(nn.Sequential):
    """One conv to ``scale**2 * num_out_ch`` channels and a PixelShuffle (lightweight SR)."""

    def __init__(self, scale: int, num_feat: int, num_out_ch: int,
                 input_resolution: tuple[int, int] | None = None) -> None:
        self.num_feat = num_feat
        self.input_resolution = input_resolution
        super().__init__(nn.Conv2d(num_feat, scale**2 * num_out_ch, 3, 1, 1), nn.PixelShuffle(scale))


DIV2K_RGB_MEAN = (0.4488, 0.4371, 0.4040)


def rgb_mean_of(rgb_mean: Sequence[float] | None) -> tuple[float, ...]:
    """An RGB network's input mean: ``rgb_mean`` (three numbers; neosr's transformers use 0.5 each), by default
    DIV2K's."""
    if rgb_mean is None:
        return DIV2K_RGB_MEAN
    if isinstance(rgb_mean, str) or len(rgb_mean) != 3 or not all(isinstance(v, (int, float)) for v in rgb_mean):
        raise ArchArgumentError("rgb_mean", f"needs three numbers (one per RGB channel), got {rgb_mean!r}")
    return tuple(float(v) for v in rgb_mean)


class SwinSRBase(SwinWeightsMixin):
    """The skeleton the Swin-family SR networks share (SwinIR's layout, kept by HAT, DRCT, DAT and their
    relatives): mean shift and ``img_range`` scaling, a shallow ``conv_first``, the deep features
    (``forward_features``, defined by each network) with ``conv_after_body`` and a long skip, and the
    reconstruction, on an input padded to ``tile_multiple`` and cropped back.

    A network calls, in its ``__init__``, ``init_shallow`` (before its body), ``init_token_embed`` (when its
    body runs on ``patch_embed`` tokens) and ``init_reconstruction`` (after ``conv_after_body``); attribute
    names, and so the state-dict keys, are SwinIR's. ``pads_input = False`` runs on the input as it is (the
    network pads inside its blocks); ``reconstruct`` may be overridden for other upsamplers.
    """

    pads_input: ClassVar[bool] = True
    tile_multiple: int

    def init_shallow(self, in_chans: int, embed_dim: int, num_layers: int, img_range: float, upscale: int,
                     upsampler: str, rgb_mean: Sequence[float] | None = None) -> None:
        """The mean buffer (``rgb_mean``, by default DIV2K's RGB mean; zero for other channel counts), scaling
        attributes and ``conv_first``."""
        self.img_range = img_range
        mean = torch.tensor(rgb_mean_of(rgb_mean)) if in_chans == 3 else torch.zeros(1)
        self.register_buffer("mean", mean.view(1, -1, 1, 1), persistent=False)
        self.upscale = upscale
        self.upsampler = upsampler
        self.conv_first = nn.Conv2d(in_chans, embed_dim, 3, 1, 1)
        self.num_layers = num_layers
        self.num_features = self.embed_dim = embed_dim

    def init_token_embed(self, img_size: int | Sequence[int], patch_size: int | Sequence[int], embed_dim: int,
                         norm_layer: type[nn.Module], patch_norm: bool, ape: bool, drop_rate: float
                         ) -> tuple[int, int]:
        """``patch_embed`` (normed by ``norm_layer`` when ``patch_norm``), the optional absolute position
        embedding and ``pos_drop``; returns the token grid of ``img_size`` (rows, columns)."""
        self.ape = ape
        self.patch_norm = patch_norm
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans=embed_dim, embed_dim=embed_dim,
                                      norm_layer=norm_layer if patch_norm else None)
        self.patches_resolution = self.patch_embed.patches_resolution
        if ape:
            self.absolute_pos_embed = nn.Parameter(torch.zeros(1, self.patch_embed.num_patches, embed_dim))
            nn.init.trunc_normal_(self.absolute_pos_embed, std=0.02)
        self.pos_drop = nn.Dropout(p=drop_rate)
        return self.patches_resolution[0], self.patches_resolution[1]

    def embed_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """(b, c, h, w) map -> tokens, plus the absolute position embedding, then dropout."""
        x = self.patch_embed(x)
        if self.ape:
            x = x + self.absolute_pos_embed
        return self.pos_drop(x)

    def init_reconstruction(self, embed_dim: int, num_out_ch: int, upscale: int,
                            input_resolution: tuple[int, int] | None = None, num_feat: int = 64) -> None:
        """The upsampler of ``self.upsampler``: 'pixelshuffle' (``conv_before_upsample``, ``upsample``,
        ``conv_last``) or 'pixelshuffledirect' (``upsample`` alone, ``input_resolution`` its attribute)."""
        if self.upsampler == "pixelshuffle":
            self.conv_before_upsample = nn.Sequential(nn.Conv2d(embed_dim, num_feat, 3, 1, 1),
                                                      nn.LeakyReLU(inplace=True))
            self.upsample = Upsample(upscale, num_feat)
            self.conv_last = nn.Conv2d(num_feat, num_out_ch, 3, 1, 1)
        elif self.upsampler == "pixelshuffledirect":
            self.upsample = UpsampleOneStep(upscale, embed_dim, num_out_ch, input_resolution)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """The deep features of a (b, embed_dim, h, w) map, same shape."""
        raise NotImplementedError

    def deep_features(self, x: torch.Tensor) -> torch.Tensor:
        """``conv_after_body(forward_features(x)) + x`` (the long skip)."""
        return self.conv_after_body(self.forward_features(x)) + x

    def reconstruct(self, x: torch.Tensor) -> torch.Tensor:
        """The network on a normalised input: shallow conv, deep features, upsampler."""
        x = self.deep_features(self.conv_first(x))
        if self.upsampler == "pixelshuffledirect":
            return self.upsample(x)
        return self.conv_last(self.upsample(self.conv_before_upsample(x)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        pad_h = pad_w = 0
        if self.pads_input:
            x, pad_h, pad_w = pad_to_multiple(x, self.tile_multiple)
        mean = self.mean.to(dtype=x.dtype)
        x = self.reconstruct((x - mean) * self.img_range)
        x = x / self.img_range + mean
        scale = self.upscale if self.upsampler else 1
        return x[..., : h * scale, : w * scale] if (pad_h or pad_w) else x


def check_swin_sr_args(owner: str, depths: Sequence[int], num_heads: Sequence[int], window_size: int,
                       upscale: int, upsampler: str, resi_connection: str) -> None:
    """Refuse what the authors' pixel-shuffle-only Swin relatives (HAT, DRCT) cannot run: another upsampler
    (they silently skip the reconstruction), a ``resi_connection`` other than '1conv' / 'identity', an
    unsupported scale, one head count per stage missing, a window that is not a positive integer."""
    if upsampler != "pixelshuffle":
        raise ArchArgumentError("upsampler", f"{owner}: upsampler must be 'pixelshuffle', got {upsampler!r} (the "
                                "original builds no reconstruction for other values)")
    if resi_connection not in ("1conv", "identity"):
        raise ArchArgumentError("resi_connection", f"{owner}: unknown resi_connection {resi_connection!r}; "
                                "use '1conv' or 'identity'")
    check_upscale(upscale)
    if len(num_heads) != len(depths):
        raise ArchArgumentError("num_heads", f"{owner}: num_heads has {len(num_heads)} entries but depths has "
                                f"{len(depths)}; give one head count per group")
    if not isinstance(window_size, int) or window_size < 1:
        raise ArchArgumentError("window_size", f"{owner}: window_size must be a positive integer, got "
                                f"{window_size!r}")


class MeanShiftSR(nn.Module):
    """EDSR's layout, shared with RCAN: mean shift and ``img_range`` scaling, ``conv_first``, a ``body``,
    ``conv_after_body`` with a long skip, ``upsample`` and ``conv_last`` (BasicSR's keys)."""

    def init_layers(self, num_in_ch: int, num_out_ch: int, num_feat: int, upscale: int, img_range: float,
                    mean: torch.Tensor, make_body: Callable[[], nn.Module]) -> None:
        """Build the layers in BasicSR's order (``make_body`` is called between ``conv_first`` and
        ``conv_after_body``, so seeded initialisation matches)."""
        self.img_range = img_range
        self.register_buffer("mean", mean, persistent=False)
        self.conv_first = nn.Conv2d(num_in_ch, num_feat, 3, 1, 1)
        self.body = make_body()
        self.conv_after_body = nn.Conv2d(num_feat, num_feat, 3, 1, 1)
        self.upsample = Upsample(upscale, num_feat)
        self.conv_last = nn.Conv2d(num_feat, num_out_ch, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = self.mean.to(dtype=x.dtype)
        feat = self.conv_first((x - mean) * self.img_range)
        res = self.conv_after_body(self.body(feat)) + feat
        return self.conv_last(self.upsample(res)) / self.img_range + mean


class LayerNorm2d(nn.Module):
    """Layer norm over the channels of an NCHW map: per pixel, ``(x - mean) / sqrt(var + eps) * weight + bias``.

    Parameters ``weight`` / ``bias`` of shape (C,), as the channel-first layer norms of OmniSR, SAFMN and
    RealPLKSR. Statistics are taken in float32 (bf16 under autocast loses too much in the variance); the
    result has the input's dtype. Works for any memory format.
    """

    def __init__(self, num_channels: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_channels))
        self.bias = nn.Parameter(torch.zeros(num_channels))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        centred = xf - xf.mean(1, keepdim=True)
        normed = centred / torch.sqrt(centred.square().mean(1, keepdim=True) + self.eps)
        out = normed * self.weight.to(xf.dtype).view(-1, 1, 1) + self.bias.to(xf.dtype).view(-1, 1, 1)
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class ImageLayerNorm(nn.Module):
    """i-LN (image restoration transformer tailored layer norm; Lee et al. 2025, traiNNer-redux's ``iLN``): one mean
    and one standard deviation per image over all its tokens and channels (the tokens' relative magnitudes survive),
    then the per-channel ``weight`` / ``bias``. ``forward`` returns ``(normed, scale)``: the block multiplies its
    residual branch by ``scale`` (b, 1, 1), the image's standard deviation, to put the lost magnitude back.

    ``scale`` is clamped to twice ``std_ema`` (a non-persistent buffer: a loaded network starts at 0, meaning
    unclamped), an EMA of the batch's mean standard deviation that each training-mode forward updates first: copied
    on the first one, then ``lerp`` by 1e-3 towards it, the batch value itself clamped to twice the EMA (a spike
    guard). Branch-free (``where``, no host read), so it runs as one graph on XLA. Statistics in float32.
    """

    def __init__(self, normalized_shape: int, eps: float = 1e-4) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))
        self.register_buffer("std_ema", torch.zeros(1), persistent=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.to(torch.promote_types(x.dtype, torch.float32))
        var, mean = torch.var_mean(xf.reshape(x.shape[0], -1), dim=1, correction=0, keepdim=True)
        stat_shape = (x.shape[0],) + (1,) * (x.ndim - 1)
        std = torch.sqrt(var + self.eps).view(stat_shape)
        if self.training:
            with torch.no_grad():
                ema = self.std_ema
                batch = std.mean().to(ema.dtype)
                fresh = ema < self.eps
                target = torch.where(fresh, batch, torch.minimum(batch, ema * 2.0))
                weight = torch.where(fresh, torch.ones_like(ema), torch.full_like(ema, 1e-3))
                self.std_ema.lerp_(target, weight)
        ema = self.std_ema.detach().to(std.dtype)
        scale = torch.where(ema < self.eps, std, torch.minimum(std, ema * 2.0))
        normed = (xf - mean.view(stat_shape)) / std
        out = self.weight.to(xf.dtype) * normed + self.bias.to(xf.dtype)
        return out.to(x.dtype), scale.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class AffineTransform(nn.Module):
    """``weight * x + bias`` over the last dimension, no normalisation (the i-LN networks' entry and final norm)."""

    def __init__(self, normalized_shape: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x + self.bias


def pre_norm(norm: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A block's pre-norm: ``(norm(x), None)`` for a plain norm, ``(normed, scale)`` for ``ImageLayerNorm``."""
    out = norm(x)
    return out if isinstance(out, tuple) else (out, None)


def rescaled(branch: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """A residual branch times the i-LN ``scale`` (unchanged after a plain norm)."""
    return branch if scale is None else scale * branch


def pad_to_min_size(x: torch.Tensor, min_size: int) -> torch.Tensor:
    """Grow the bottom / right of an NCHW tensor to at least ``min_size`` per side (unchanged if large enough).

    Reflect padding as far as it goes (at most side - 1 pixels), then edge replication for the rest: what
    spandrel's call API does for a model's minimum size, so small tiles give the same output as there.
    """
    h, w = x.shape[-2:]
    return pad_bottom_right(x, max(min_size - h, 0), max(min_size - w, 0))


__all__ = [
    "AffineTransform",
    "ArchArgumentError",
    "DCNv2Pack",
    "DropPath",
    "ImageLayerNorm",
    "LayerNorm2d",
    "MeanShiftSR",
    "Mlp",
    "PatchEmbed",
    "PatchUnEmbed",
    "ResidualBlockNoBN",
    "ShiftedWindowStage",
    "SwinSRBase",
    "SwinWeightsMixin",
    "Upsample",
    "UpsampleOneStep",
    "WindowAttention",
    "WindowBlockBase",
    "block_drop_rates",
    "check_swin_sr_args",
    "check_upscale",
    "default_init_weights",
    "drop_path",
    "drop_path_rates",
    "flow_warp",
    "make_layer",
    "pad_bottom_right",
    "pad_to_min_size",
    "pad_to_multiple",
    "pixel_unshuffle",
    "pre_norm",
    "refuse_weights_path",
    "relative_position_index",
    "rgb_mean_of",
    "rescaled",
    "residual_conv",
    "run_checkpointed",
    "shifted_window_blocked",
    "shifted_window_mask",
    "swin_init_weights",
    "to_2tuple",
    "to_feature_map",
    "to_tokens",
    "window_attention",
    "window_partition",
    "window_reverse",
]


def input_channels(net: nn.Module, default: int | None = 3) -> int | None:
    """The channels a network reads: its declared ``in_channels`` / ``num_in_ch`` (RRDBNet at scale 1 / 2
    pixel-unshuffles its input before the first convolution), else those of its first ``nn.Conv2d`` (``default``
    when it has none)."""
    for attr in ("in_channels", "num_in_ch"):
        value = getattr(net, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    for module in net.modules():
        if isinstance(module, nn.Conv2d):
            return int(module.in_channels)
    return default

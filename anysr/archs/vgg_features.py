"""VGG19 / VGG19-BN feature extractor: our own module laid out as torchvision's ``vgg19().features`` so its state
dict (``features.N.weight``) loads into it. Used by the perceptual losses (anysr.losses) and by DFDNet."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import torch
from torch import nn

# torchvision vgg19 ``features`` layers in order; the position is torchvision's index N of ``features.N``.
_VGG19_BLOCKS = (2, 2, 4, 4, 4)


def _vgg_names(batch_norm: bool) -> tuple[str, ...]:
    """BasicSR's layer names for vgg19 (``conv1_1, relu1_1, ..., pool5``) or vgg19_bn (``bn1_1`` after each conv)."""
    names: list[str] = []
    for block, convs in enumerate(_VGG19_BLOCKS, start=1):
        for i in range(1, convs + 1):
            names += [f"conv{block}_{i}", *([f"bn{block}_{i}"] if batch_norm else []), f"relu{block}_{i}"]
        names.append(f"pool{block}")
    return tuple(names)


VGG19_NAMES: tuple[str, ...] = _vgg_names(False)
VGG19_BN_NAMES: tuple[str, ...] = _vgg_names(True)
VGG_NAMES = {"vgg19": VGG19_NAMES, "vgg19_bn": VGG19_BN_NAMES}
_VGG19_WIDTHS = (64, 128, 256, 512, 512)
_IMAGENET_MEAN = (0.485, 0.456, 0.406)
_IMAGENET_STD = (0.229, 0.224, 0.225)


class VGGFeatureExtractor(nn.Module):
    """VGG19 (or VGG19-BN) truncated after the deepest requested layer; returns ``{layer name: features}``.

    Layer names as BasicSR's (``conv1_1``, [``bn1_1``,] ``relu1_1``, ..., ``pool5``): a ``conv``/``bn`` layer
    gives pre-activation features, a ``relu`` layer post-activation ones. Load weights with
    ``load_torchvision_state_dict`` (torchvision's ``features.N.*`` keys; classifier keys are ignored).
    The parameters are frozen and the module stays in eval mode (batch norm uses its running statistics).
    ``first_padding``: the padding mode of the first conv (``replicate`` as traiNNer-redux's VGG; the others pad
    with zeros). ``widths``: the five blocks' conv widths (VGG19's 64, 128, 256, 512, 512; DFDNet scales them).
    """

    def __init__(self, layer_name_list: list[str], vgg_type: str = "vgg19", use_input_norm: bool = True,
                 range_norm: bool = False, first_padding: str = "zeros",
                 widths: tuple[int, ...] = _VGG19_WIDTHS) -> None:
        super().__init__()
        if len(widths) != len(_VGG19_BLOCKS) or any(int(c) < 1 for c in widths):
            raise ValueError(f"widths must be {len(_VGG19_BLOCKS)} positive conv widths, got {widths!r}")
        if vgg_type not in VGG_NAMES:
            raise ValueError(f"vgg_type '{vgg_type}' is not supported; use one of {', '.join(VGG_NAMES)}")
        all_names = VGG_NAMES[vgg_type]
        unknown = [n for n in layer_name_list if n not in all_names]
        if unknown:
            label = "VGG19" if vgg_type == "vgg19" else "VGG19-BN"
            raise ValueError(f"unknown {label} layer(s) {unknown}; valid names: {', '.join(all_names)}")
        if not layer_name_list:
            raise ValueError("layer_weights is empty; name at least one VGG19 layer, e.g. {conv5_4: 1.0}")
        self.layer_name_list = list(layer_name_list)
        self.vgg_type = vgg_type
        self.use_input_norm = use_input_norm
        self.range_norm = range_norm
        last = max(all_names.index(n) for n in layer_name_list)
        layers: list[tuple[str, nn.Module]] = []
        c_in = 3
        for name in all_names[: last + 1]:
            if name.startswith("conv"):
                c_out = int(widths[int(name[4]) - 1])
                pad = first_padding if name == "conv1_1" else "zeros"
                layers.append((name, nn.Conv2d(c_in, c_out, 3, 1, 1, padding_mode=pad)))
                c_in = c_out
            elif name.startswith("bn"):
                layers.append((name, nn.BatchNorm2d(c_in)))
            elif name.startswith("relu"):
                layers.append((name, nn.ReLU(inplace=False)))
            else:
                layers.append((name, nn.MaxPool2d(kernel_size=2, stride=2)))
        self.vgg_net = nn.Sequential(OrderedDict(layers))
        self.register_buffer("mean", torch.tensor(_IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(_IMAGENET_STD).view(1, 3, 1, 1))
        self.requires_grad_(False)
        self.eval()

    def train(self, mode: bool = True) -> VGGFeatureExtractor:
        """Always eval: the feature extractor is fixed."""
        return super().train(False)

    @torch.no_grad()
    def load_torchvision_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy torchvision vgg19 / vgg19_bn weights (``features.N.weight`` / ``.bias``, and a batch norm's
        ``running_mean`` / ``running_var``)."""
        label, tv_name = ("VGG19", "vgg19") if self.vgg_type == "vgg19" else ("VGG19-BN", "vgg19_bn")
        for idx, (name, module) in enumerate(self.vgg_net.named_children()):
            if isinstance(module, nn.Conv2d):
                parts = ("weight", "bias")
            elif isinstance(module, nn.BatchNorm2d):
                parts = ("weight", "bias", "running_mean", "running_var")
            else:
                continue
            for part in parts:
                key = f"features.{idx}.{part}"
                if key not in state_dict:
                    raise KeyError(f"{label} weights lack '{key}' (layer {name}); give torchvision's {tv_name} "
                                   "state dict")
                src = state_dict[key]
                dst = getattr(module, part)
                if tuple(src.shape) != tuple(dst.shape):
                    raise ValueError(f"{label} weights '{key}' have shape {tuple(src.shape)}, layer {name} needs "
                                     f"{tuple(dst.shape)}; give torchvision's {tv_name} (not vgg16 / another "
                                     "variant) state dict")
                dst.copy_(src)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        if self.range_norm:
            x = (x + 1) / 2
        if self.use_input_norm:
            x = (x - self.mean) / self.std
        out: dict[str, torch.Tensor] = {}
        wanted = set(self.layer_name_list)
        for name, layer in self.vgg_net.named_children():
            x = layer(x)
            if name in wanted:
                out[name] = x.clone() if not name.startswith(("relu", "pool")) else x
        return out

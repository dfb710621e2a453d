"""Weights recognised from names and shapes (anysr/archs/recognition/recognise.py), part a: for each family,
configurations other than the defaults and presets (odd widths and depths, x1 / x3 where the class has them, other image
channels, other layer kinds) are recognised as the same class with arguments that build exactly the same tensors,
and files as anysr's loader accepts them (published layouts) are recognised too."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from anysr.archs.recognition.recognise import recognise
from anysr.engine.checkpoint import load_weights
from anysr.registry import ARCH_REGISTRY
from tests.test_recognise import _layout

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FAMILIES = ("ATD", "ArtCNN", "BasicVSR", "BasicVSRPlusPlus", "CRAFT", "CascadedGaze", "DAT", "DCTLSA", "DIS", "DITN",
            "DFDNet",  # tests/archs/test_dfdnet.py
            "DAT_iLN", "DRCT", "DRUNet", "DUF", "DWT", "DnCNN", "ECBSR", "EDSR", "EDVR", "EIMN", "ELAN", "EMT",
            "ESCRealM", "ESCFP",  # ESCFP: neosr's esc_fp, tests/archs/test_neosr_archs.py
            "CFSR", "HASN", "KRGN",  # neosr's: tests/archs/test_neosr_light.py
            "CATANet",  # neosr's: tests/archs/test_catanet.py
            "DCT",  # neosr's: tests/archs/test_neosr_dct.py
            "FBCNN", "FDAT", "FFTformer", "FlexNet", "GFPGANv1Clean", "GRFormer", "HAT", "HMA", "HVICIDNet",
            "HiT_SIR", "HiT_SNG", "HiT_SRF", "IconVSR", "LKFMixer", "LMLT",
            "LAWFFT")  # tests/archs/test_lawfft.py

CONFIGS: list[dict] = [
    {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3},
    {"type": "EDSR", "num_in_ch": 1, "num_out_ch": 1, "num_feat": 24, "num_block": 3, "upscale": 3, "rgb_mean": [0.5]},
    {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 256, "num_block": 32, "upscale": 2,
     "res_scale": 0.1},
    {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 16, "num_block": 2, "upscale": 8},
    {"type": "DnCNN", "nc": 32, "nb": 5},
    {"type": "DnCNN", "in_nc": 3, "out_nc": 3, "nb": 20, "act_mode": "R"},
    {"type": "DnCNN", "in_nc": 4, "out_nc": 3, "nc": 24, "nb": 6, "act_mode": "R", "mode": "FDnCNN"},
    {"type": "DRUNet", "in_nc": 4, "out_nc": 3},
    {"type": "DRUNet", "in_nc": 2, "out_nc": 1, "nc": [16, 24, 40, 48], "nb": 2, "downsample_mode": "avgpool",
     "upsample_mode": "pixelshuffle"},
    {"type": "DRUNet", "nc": [8, 16, 32, 64], "nb": 1, "upsample_mode": "upconv"},
    {"type": "FBCNN", "in_nc": 1, "out_nc": 1, "nc": [16, 24, 40, 48], "nb": 2},
    {"type": "FBCNN", "nc": [8, 16, 32, 64], "nb": 1, "downsample_mode": "avgpool", "upsample_mode": "pixelshuffle"},
    {"type": "FBCNN", "nc": [8, 16, 32, 64], "nb": 1, "upsample_mode": "upconv"},
    {"type": "ECBSR", "num_in_ch": 1, "num_out_ch": 1, "num_block": 4, "num_channel": 16, "with_idt": False,
     "act_type": "prelu", "scale": 2},
    {"type": "ECBSR", "num_in_ch": 3, "num_out_ch": 3, "num_block": 2, "num_channel": 8, "with_idt": False,
     "act_type": "relu", "scale": 3},
    {"type": "ECBSR", "num_in_ch": 1, "num_out_ch": 1, "num_block": 1, "num_channel": 12, "with_idt": False,
     "act_type": "prelu", "scale": 4, "reparameterized": True},
    {"type": "ArtCNN", "in_ch": 1, "scale": 2, "filters": 24, "n_block": 3},
    {"type": "ArtCNN", "scale": 3, "filters": 20, "n_block": 2, "kernel_size": 5},
    {"type": "ArtCNN", "scale": 1, "filters": 8, "n_block": 1},
    {"type": "DIS", "scale": 1, "num_features": 16, "num_blocks": 2},
    {"type": "DIS", "in_channels": 1, "out_channels": 1, "scale": 3, "num_blocks": 3, "use_depthwise": True},
    {"type": "DIS", "scale": 2, "num_features": 24, "num_blocks": 5},
    {"type": "BasicVSR", "num_feat": 16, "num_block": 2},
    {"type": "IconVSR", "num_feat": 16, "num_block": 3, "temporal_padding": 3},
    {"type": "BasicVSRPlusPlus", "mid_channels": 16, "num_blocks": 2},
    {"type": "BasicVSRPlusPlus", "mid_channels": 24, "num_blocks": 1, "is_low_res_input": False},
    {"type": "EDVR", "num_feat": 32, "num_frame": 7, "deformable_groups": 4, "num_extract_block": 2,
     "num_reconstruct_block": 3},
    {"type": "EDVR", "num_in_ch": 1, "num_out_ch": 1, "num_feat": 16, "num_frame": 3, "deformable_groups": 2,
     "num_extract_block": 1, "num_reconstruct_block": 1, "with_tsa": False},
    {"type": "EDVR", "num_feat": 128, "num_frame": 5, "num_reconstruct_block": 40, "hr_in": True,
     "with_predeblur": True},
    {"type": "DUF", "scale": 2, "num_layer": 16},
    {"type": "DUF", "scale": 3, "num_layer": 28},
    {"type": "LMLT", "dim": 24, "n_blocks": 3, "ffn_scale": 1.5, "scale": 3},
    {"type": "LMLT", "dim": 8, "n_blocks": 1, "scale": 1},
    {"type": "LKFMixer", "in_channels": 1, "out_channels": 1, "channels": 16, "num_block": 2, "large_kernel": 7,
     "split_factor": 0.5, "upscale": 2},
    {"type": "LKFMixer", "in_channels": 3, "out_channels": 3, "channels": 20, "num_block": 1, "large_kernel": 11,
     "split_factor": 0.25, "upscale": 3},
    {"type": "DITN", "inp_channels": 1, "dim": 24, "ITL_blocks": 2, "SAL_blocks": 1, "UFONE_blocks": 2,
     "ffn_expansion_factor": 1.5, "bias": True, "upscale": 3},
    {"type": "DCTLSA", "in_nc": 1, "out_nc": 1, "nf": 30, "upscale": 2},
    {"type": "DCTLSA", "nf": 24, "num_head": 4, "upscale": 3},
    {"type": "DFDNet", "num_feat": 3},  # a narrower VGG (no dictionary: not in the weights)
    {"type": "EIMN", "embed_dims": 32, "scale": 3, "depths": 2, "num_stages": 3, "mlp_ratios": 2.0},
    {"type": "EIMN", "embed_dims": 48, "scale": 4, "num_stages": 2},
    {"type": "ELAN", "scale": 2, "colors": 1, "m_elan": 4, "c_elan": 24, "n_share": 1, "r_expand": 3},
    {"type": "ELAN", "scale": 3, "norm": True, "m_elan": 3, "c_elan": 12, "n_share": 2},
    {"type": "HVICIDNet", "channels": [16, 16, 32, 64], "heads": [1, 2, 2, 4], "norm": True},
    {"type": "CascadedGaze", "img_channel": 1, "width": 8, "middle_blk_num": 2, "enc_blk_nums": [1, 0, 2],
     "dec_blk_nums": [1, 1, 0], "GCE_CONVS_nums": [2, 3, 3]},
    {"type": "CascadedGaze", "width": 12, "middle_blk_num": 0, "enc_blk_nums": [3], "dec_blk_nums": [2],
     "GCE_CONVS_nums": [3]},
    {"type": "FlexNet", "inp_channels": 1, "out_channels": 1, "dim": 12, "num_blocks": [2, 0, 1], "hidden_rate": 1.5,
     "scale": 3, "upsampler": "nearest+conv", "channel_norm": True},
    {"type": "FlexNet", "dim": 8, "num_blocks": [1, 1], "scale": 8, "upsampler": "nearest+conv"},
    {"type": "FlexNet", "dim": 8, "num_blocks": [1], "scale": 3, "upsampler": "dysample", "out_channels": 1},
    {"type": "FlexNet", "inp_channels": 4, "out_channels": 3, "dim": 8, "num_blocks": [1], "scale": 1},
    {"type": "FlexNet", "dim": 16, "num_blocks": [2, 1, 0, 1], "hidden_rate": 2, "scale": 2, "pipeline_type": "meta",
     "upsampler": "dysample"},
    {"type": "FlexNet", "dim": 6, "num_blocks": [1, 1, 1, 1], "scale": 1, "pipeline_type": "meta",
     "channel_norm": True},
    {"type": "FFTformer", "inp_channels": 1, "out_channels": 1, "dim": 16, "num_blocks": [1, 2, 1],
     "num_refinement_blocks": 1, "ffn_expansion_factor": 2, "bias": True},
    {"type": "GFPGANv1Clean", "out_size": 128, "num_style_feat": 64, "channel_multiplier": 1, "narrow": 0.5,
     "num_mlp": 2, "different_w": False, "sft_half": False},
    {"type": "GFPGANv1Clean", "out_size": 32, "num_style_feat": 32, "channel_multiplier": 1, "narrow": 0.25},
    {"type": "HAT", "in_chans": 1, "embed_dim": 24, "depths": [2, 3], "num_heads": [2, 3], "window_size": 4,
     "img_size": 16, "compress_ratio": 2, "squeeze_factor": 4, "overlap_ratio": 1, "mlp_ratio": 1.5,
     "upscale": 3, "qkv_bias": False, "resi_connection": "identity"},
    {"type": "HAT", "embed_dim": 16, "depths": [1], "num_heads": [2], "window_size": 8, "img_size": 16,
     "compress_ratio": 2, "squeeze_factor": 8, "upscale": 1, "ape": True, "patch_norm": False},
    # HMA: odd depths (a fused conv before each even step), groups of other depths and heads, x3 / x8 / x1
    {"type": "HMA", "in_chans": 1, "img_size": 16, "embed_dim": 16, "depths": [3, 2], "num_heads": [4, 2],
     "window_size": 4, "mlp_ratio": 1.5, "upscale": 3, "resi_connection": "identity", "qkv_bias": False},
    {"type": "HMA", "embed_dim": 8, "depths": [1], "num_heads": [2], "window_size": 8, "img_size": 8, "upscale": 8,
     "ape": True, "patch_norm": False, "interval_size": 2},
    {"type": "HMA", "embed_dim": 12, "depths": [4], "num_heads": [6], "window_size": 2, "img_size": 4, "upscale": 1},
    # GRFormer: square and turned windows, no shifted block (img_size unseen: the default), x1 / x3
    {"type": "GRFormer", "in_chans": 1, "img_size": 16, "embed_dim": 12, "depths": [3, 2], "num_heads": [3, 2],
     "window_size": [4, 8], "mlp_ratio": 1.5, "upscale": 3},
    {"type": "GRFormer", "embed_dim": 8, "depths": [1], "num_heads": [2], "window_size": [4, 4], "upscale": 1},
    # DWT with layer kinds SwinIR cannot build (masks on even blocks; a window shrunk to the patch, masked)
    {"type": "DWT", "in_chans": 1, "img_size": 16, "embed_dim": 12, "depths": [3, 2], "num_heads": [3, 2],
     "window_size": 4, "mlp_ratio": 1.5, "upscale": 3, "resi_connection": "3conv", "qkv_bias": False,
     "layer_kinds": [[-1, -1, 0], [2, 2]]},
    {"type": "DWT", "embed_dim": 8, "depths": [2], "num_heads": [2], "window_size": 8, "img_size": 8, "upscale": 1,
     "layer_kinds": [[1, 0]], "ape": True, "patch_norm": False},
    {"type": "EMT", "dim": 20, "n_blocks": 2, "n_layers": 4, "num_heads": 2, "mlp_ratio": 3, "n_GTLs": 3, "scale": 8},
    {"type": "EMT", "dim": 10, "n_blocks": 1, "n_layers": 1, "num_heads": 1, "mlp_ratio": 1, "n_GTLs": 0, "scale": 3,
     "upsampler": "pixelshuffledirect"},
    {"type": "DRCT", "in_chans": 1, "embed_dim": 24, "depths": [6, 6], "num_heads": [3, 4], "window_size": 4,
     "img_size": 20, "mlp_ratio": 1.5, "upscale": 8, "gc": 16, "resi_connection": "identity"},
    {"type": "DRCT", "embed_dim": 16, "depths": [6], "num_heads": [2], "window_size": 8, "img_size": 8,
     "upscale": 1},
    {"type": "DAT", "in_chans": 1, "embed_dim": 36, "split_size": [2, 8], "depth": [2, 1], "num_heads": [2, 4],
     "expansion_factor": 1.5, "upscale": 3, "img_size": 32, "resi_connection": "3conv"},
    {"type": "DAT", "embed_dim": 48, "split_size": [4, 4], "depth": [4], "num_heads": [6], "upscale": 2,
     "upsampler": "pixelshuffledirect", "qkv_bias": False},
    {"type": "DAT_iLN", "in_chans": 1, "embed_dim": 36, "split_size": [2, 8], "depth": [2, 1], "num_heads": [2, 4],
     "expansion_factor": 1.5, "upscale": 3, "img_size": 32, "resi_connection": "3conv"},
    {"type": "DAT_iLN", "embed_dim": 48, "split_size": [4, 4], "depth": [4], "num_heads": [6], "upscale": 2,
     "upsampler": "pixelshuffledirect", "qkv_bias": False},
    {"type": "ATD", "in_chans": 1, "embed_dim": 24, "depths": [2, 1], "num_heads": [2, 3], "window_size": 4,
     "num_tokens": 16, "reducted_dim": 6, "convffn_kernel_size": 3, "mlp_ratio": 1.5, "upscale": 4,
     "upsampler": "nearest+conv", "norm": False},
    {"type": "ATD", "embed_dim": 16, "depths": [2], "num_heads": [2], "window_size": 8, "num_tokens": 8,
     "upscale": 2, "upsampler": "pixelshuffle", "resi_connection": "3conv", "qkv_bias": False},
    {"type": "CRAFT", "in_chans": 1, "embed_dim": 40, "depths": [1, 2], "num_heads": [2, 4], "split_size_0": 2,
     "split_size_1": 8, "mlp_ratio": 1.5, "upscale": 3, "resi_connection": "identity"},
    {"type": "CRAFT", "embed_dim": 36, "depths": [1], "num_heads": [3], "split_size_0": 4, "split_size_1": 4,
     "upscale": 1, "qkv_bias": False},
    {"type": "HiT_SIR", "in_chans": 1, "embed_dim": 24, "depths": [2, 4], "num_heads": [2, 3], "mlp_ratio": 1.5,
     "upscale": 3, "upsampler": "pixelshuffle", "resi_connection": "3conv"},
    {"type": "HiT_SNG", "embed_dim": 16, "depths": [3], "num_heads": [2], "base_win_size": [4, 4], "upscale": 2},
    {"type": "HiT_SRF", "embed_dim": 16, "depths": [2, 2], "num_heads": [2, 2], "upscale": 4,
     "upsampler": "nearest+conv", "ape": True, "img_size": 16},
    {"type": "HiT_SRF", "embed_dim": 16, "depths": [1], "num_heads": [2], "upscale": 1, "upsampler": ""},
    {"type": "ESCRealM", "dim": 32, "pdim": 8, "kernel_size": 7, "n_blocks": 2, "conv_blocks": 1, "window_size": 8,
     "num_heads": 2, "scale": 2, "exp_ratio": 1.5, "upsampler": "pixelshuffle", "mid_dim": 24},
    {"type": "ESCRealM", "dim": 16, "pdim": 4, "n_blocks": 1, "conv_blocks": 2, "num_heads": 2, "scale": 1,
     "unshuffle_mod": True},
    {"type": "ESCRealM", "dim": 16, "pdim": 4, "n_blocks": 1, "conv_blocks": 1, "num_heads": 2, "scale": 3},
    # neosr's esc: a DySample head straight on the features
    {"type": "ESCRealM", "dim": 12, "pdim": 4, "n_blocks": 2, "conv_blocks": 1, "num_heads": 3, "scale": 3,
     "exp_ratio": 1.25, "upsampler": "dysample_direct"},
    {"type": "ESCRealM", "dim": 16, "pdim": 4, "n_blocks": 1, "conv_blocks": 2, "num_heads": 2, "scale": 1,
     "unshuffle_mod": True, "upsampler": "dysample_direct"},
    # neosr's esc_fp: decomposed large-kernel units, a pixel-shuffle head plus the bicubic input
    {"type": "ESCFP", "dim": 12, "pdim": 4, "n_blocks": 2, "conv_blocks": 1, "num_heads": 3, "window_size": 4,
     "upscaling_factor": 3},
    {"type": "ESCFP", "dim": 8, "pdim": 8, "kernel_size": 5, "n_blocks": 1, "conv_blocks": 2, "num_heads": 2,
     "window_size": 4, "upscaling_factor": 2},
    {"type": "FDAT", "num_in_ch": 1, "num_out_ch": 1, "embed_dim": 24, "num_groups": 2, "depth_per_group": 1,
     "num_heads": 2, "window_size": 4, "ffn_expansion_ratio": 1.5, "aim_reduction_ratio": 4,
     "group_block_pattern": ["channel", "spatial", "spatial"], "scale": 3, "upsampler_type": "pixelshuffledirect"},
    {"type": "FDAT", "embed_dim": 24, "num_groups": 1, "depth_per_group": 2, "num_heads": 3, "scale": 2,
     "upsampler_type": "pa_up", "mid_dim": 16},
    {"type": "FDAT", "embed_dim": 24, "num_groups": 1, "depth_per_group": 1, "num_heads": 3, "scale": 1,
     "unshuffle_mod": True, "upsampler_type": "dysample", "mid_dim": 16},
    {"type": "CFSR", "in_chans": 1, "embed_dim": 12, "depths": [2, 0, 1], "dw_size": 7, "mlp_ratio": 3.0,
     "upscale": 3},
    {"type": "CFSR", "embed_dim": 16, "depths": [1], "upsampler": "", "upscale": 1},
    {"type": "CFSR", "in_chans": 4, "embed_dim": 8, "depths": [0], "upscale": 8},
    {"type": "DCT", "in_chans": 1, "embed_dim": 64, "split_size": [2, 8], "depth": [3, 2], "num_heads": [4, 8],
     "expansion_factor": 1.5, "qkv_bias": False, "resi_connection": "1conv", "upscale": 3, "img_size": 48},
    {"type": "DCT", "embed_dim": 128, "split_size": [4, 4], "depth": [1], "num_heads": [16], "upscale": 1,
     "upsampler": "pixelshuffle"},
    {"type": "HASN", "feature_channels": 40, "upscale": 2},
    {"type": "HASN", "in_channels": 1, "out_channels": 3, "feature_channels": 30, "upscale": 1},
    {"type": "KRGN", "n_feats": 32, "n_resgroups": 2, "scale": 3, "act": "prelu"},
    {"type": "KRGN", "n_feats": 96, "n_resgroups": 0, "scale": 1},
    {"type": "CATANet", "in_chans": 1, "dim": 12, "block_num": 3, "qk_dim": 6, "mlp_dim": 20, "heads": 2,
     "num_tokens": [3, 9, 4], "upscale": 3},
    {"type": "CATANet", "dim": 8, "block_num": 1, "qk_dim": 8, "mlp_dim": 8, "num_tokens": [5], "upscale": 1},
    {"type": "CATANet", "in_chans": 4, "dim": 6, "block_num": 2, "qk_dim": 3, "mlp_dim": 6, "heads": 1,
     "upscale": 2},
    {"type": "LAWFFT", "dim": 16, "n_rblock": 2, "n_mblock": 1, "scale": 3, "upsampler": "pa_up", "mid_dim": 12},
    {"type": "LAWFFT", "in_ch": 1, "dim": 12, "split": 0.5, "n_rblock": 1, "n_mblock": 3, "t_mid_factor": 2.0,
     "mlp_factor": 1.0, "scale": 1, "unshuffle_mod": True, "upsampler": "dysample", "mid_dim": 8},
    {"type": "LAWFFT", "dim": 8, "n_rblock": 1, "n_mblock": 2, "scale": 8, "upsampler": "pixelshuffledirect"},
]


def _id(opt: dict) -> str:
    return "-".join(f"{v}" if k == "type" else f"{k}={v}" for k, v in opt.items()).replace(" ", "")


@pytest.mark.parametrize("opt", CONFIGS, ids=_id)
def test_other_configurations_recognised(opt: dict) -> None:
    layout = _layout(opt)
    assert layout is not None, f"{opt} does not build"
    _check(layout, opt["type"], str(opt))


def _check(layout: dict[str, tuple[int, ...]], arch: str, source: str) -> str:
    found = recognise(layout, source=source)
    assert ARCH_REGISTRY.get(found.opt["type"]) is ARCH_REGISTRY.get(arch), f"{source} recognised as {found.describe()}"
    assert _layout(found.opt) == layout, f"{source}: {found.describe()} builds other tensors"
    assert not found.others, f"{source}: {found.others} fit too"
    return found.describe()


def _reference_cases() -> list[tuple[str, str, Path, dict]]:
    """(fixture folder, case, manifest folder, case) of every reference-implementation fixture of these families."""
    cases = []
    for manifest in sorted(FIXTURES.glob("*/manifest.json")):
        listed = json.loads(manifest.read_text()).get("cases", {})
        for name, case in listed.items() if isinstance(listed, dict) else ():  # loss fixtures list their cases
            if isinstance(case, dict) and case.get("type") in FAMILIES:
                cases.append((manifest.parent.name, name, manifest.parent, case))
    return cases


def _file_layout(folder: Path, name: str, case: dict) -> dict[str, tuple[int, ...]]:
    """Names and shapes of a fixture's weights as anysr's loader reads them (the reference implementation's state
    dict); the recorded state table (video cases) or shape table (synthetic-weight cases); safetensors' header for
    fp8-stored fixtures, which the loader's finiteness check cannot read."""
    if "state" in case:
        return {entry["key"]: tuple(entry["shape"]) for entry in case["state"]}
    if "synthetic" in case:
        return {k: tuple(v) for k, v in case["synthetic"]["shapes"].items()}
    if case.get("seeded"):  # seeded reference weights, loaded strictly with the buffers the network computes
        from arch_checks import load_case

        net, _ = load_case(folder.name, name)
        return {k: tuple(v.shape) for k, v in net.state_dict().items()}
    for path in (folder / f"{name}_params.safetensors", folder / f"{name}.pth"):
        if path.exists():
            try:
                sd, _ = load_weights(path)
            except NotImplementedError:
                with safe_open(str(path), "pt") as f:
                    return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
            return {k: tuple(v.shape) for k, v in sd.items()}
    raise AssertionError(f"{folder.name}/{name}: no weights fixture")


REFERENCE = _reference_cases()


def test_every_family_has_reference_weights() -> None:
    assert {case["type"] for *_, case in REFERENCE} == set(FAMILIES)


@pytest.mark.parametrize(("folder", "name", "path", "case"), REFERENCE, ids=[f"{f}/{n}" for f, n, *_ in REFERENCE])
def test_reference_weights_recognised(folder: str, name: str, path: Path, case: dict) -> None:
    """The weights the authors' / traiNNer-redux's / spandrel's implementation saved (the fixtures the arch tests
    compare outputs with) are recognised as the same class, and what it builds loads them strictly."""
    layout = _file_layout(path, name, case)
    assert _layout({"type": case["type"], **case.get("kwargs", {})}) == layout, f"{folder}/{name}: fixture layout"
    _check(layout, case["type"], f"{folder}/{name}")


PUBLISHED = json.loads(gzip.decompress((FIXTURES / "attention" / "published_keys.json.gz").read_bytes()))["configs"]


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_layouts_recognised(name: str) -> None:
    """The released models' layouts (names and shapes of the authors' option files through spandrel 0.4.2: HAT-L,
    HAT-S, DAT, DAT-light, DRCT-L, ...) are recognised, with their scale and size."""
    cfg = PUBLISHED[name]
    layout = {k: tuple(shape) for k, (shape, _) in cfg["keys"].items()}
    described = _check(layout, cfg["type"], name)
    assert f"upscale={cfg['kwargs']['upscale']}" in described


def test_recognised_weights_load_strictly() -> None:
    """A real (tiny) file: saved, read back by the loader, recognised, and loaded strictly into what was built."""
    from anysr.archs import build_network
    from anysr.engine.checkpoint.weights import load_into

    torch.manual_seed(0)
    opt = {"type": "HAT", "embed_dim": 16, "depths": [2], "num_heads": [2], "window_size": 4, "img_size": 16,
           "upscale": 3, "compress_ratio": 2, "squeeze_factor": 4}
    sd = build_network(opt).state_dict()
    found = recognise(sd, source="hat.pth")
    net = build_network(found.opt)
    load_into(net, sd, strict=True, source="hat.pth")
    assert "upscale=3" in found.describe() and "window_size=4" in found.describe()

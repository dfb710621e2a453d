"""Weights recognised from names and shapes alone, beyond the defaults and presets that tests/test_recognise.py
checks: odd widths, depths and scales, other image channels, and files as the published weights have them (keys
that a fresh build has and the files lack, or the other way round), for the second half of anysr's families."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise_all
from anysr.engine.checkpoint import load_weights
from anysr.registry import ARCH_REGISTRY
from tests.test_recognise import _layout

ROOT = Path(__file__).resolve().parents[1]

# family -> extra constructor arguments, each checked like the defaults: recognised as the same class with
# arguments that build exactly the same tensors.
EXTRA: dict[str, list[dict]] = {
    "MSRResNet": [{"num_feat": 24, "num_block": 3, "upscale": s} for s in (1, 2, 3)]
    + [{"num_in_ch": 1, "num_out_ch": 1, "num_feat": 16, "num_block": 1}],
    "RCAN": [{"num_in_ch": 3, "num_out_ch": 3, "num_feat": 32, "num_group": 2, "num_block": 3, "upscale": s}
             for s in (2, 3, 8)]
    + [{"num_in_ch": 1, "num_out_ch": 1, "num_feat": 48, "num_group": 1, "num_block": 1, "squeeze_factor": 5,
        "rgb_mean": (0.4,)}],
    "RIDNet": [{"in_channels": 3, "mid_channels": 16, "out_channels": 3, "num_block": 2},
               {"in_channels": 3, "mid_channels": 64, "out_channels": 3}],
    "SwiftSRGAN": [{"num_channels": 20, "num_blocks": 3, "upscale_factor": s} for s in (1, 2, 8)]
    + [{"in_channels": 1, "num_channels": 8, "num_blocks": 1}],
    "TOFlow": [{"adapt_official_weights": True}],
    "NinaSR": [{"n_resblocks": 3, "n_feats": 12, "scale": s, "expansion": e} for s, e in ((1, 1.5), (3, 2.0), (8, 0.5))]
    + [{"n_resblocks": 1, "n_feats": 6, "n_colors": 1, "scale": 2, "expansion": 1.3}],
    "PlainUSR": [{"n_feat": 24, "im_feat": (24, 8), "scale": 3}, {"n_feat": 40, "im_feat": (40, 40, 8), "scale": 1},
                 {"n_feat": 96, "im_feat": (64, 32, 32), "attn_feat": 5, "scale": 2}],
    "MSDAN": [{"channels": 12, "num_DFEB": 3}, {"channels": 4, "num_DFEB": 0}],  # the scale is in no tensor
    "ASID": [{"num_feat": 12, "window_size": 4, "scale": s, "pe": True, "bias": False} for s in (1, 3)]
    + [{"num_in_ch": 1, "num_out_ch": 1, "num_feat": 16, "d8": True, "res_num": 8, "scale": 2}],
    "LightSAFMNPP": [{"dim": 12, "n_blocks": 3, "ffn_scale": 2.0, "upscaling_factor": s} for s in (1, 3)]
    + [{"dim": 6, "n_blocks": 0}],
    "NAFNet": [{"img_channel": 1, "width": 8, "middle_blk_num": 0, "enc_blk_nums": (1, 0, 3),
                "dec_blk_nums": (2, 1, 0)},
               {"width": 12, "middle_blk_num": 2, "enc_blk_nums": (1,), "dec_blk_nums": (1,)}],
    "SAFMN": [{"dim": 20, "n_blocks": 3, "ffn_scale": 1.5, "upscaling_factor": s} for s in (1, 3)]
    + [{"dim": 36, "n_blocks": 1, "ffn_scale": 2.3}],
    "SAFMNBCIE": [{"dim": 36}, {"dim": 20, "n_blocks": 2, "num_layers": 3, "ffn_scale": 1.7, "upscaling_factor": 1},
                  {"dim": 8, "n_blocks": 1, "num_layers": 1, "upscaling_factor": 4}],
    "Sebica": [{"scale": s, "N": 5} for s in (1, 3)],
    "SPAN": [{"feature_channels": 20, "upscale": s} for s in (1, 2, 3)]
    + [{"num_in_ch": 1, "num_out_ch": 1, "feature_channels": 16, "rgb_mean": (0.5,)},
       {"num_in_ch": 4, "num_out_ch": 3, "feature_channels": 8, "norm": False, "upscale": 2}],
    "SpanPlus": [{"blocks": [1, 0, 2], "feature_channels": 12, "upscale": s} for s in (1, 3)]
    + [{"num_in_ch": 1, "num_out_ch": 1, "feature_channels": 16, "upsampler": "ps", "upscale": 2},
       {"feature_channels": 8, "blocks": [1], "upsampler": "conv", "upscale": 1},
       {"num_in_ch": 3, "num_out_ch": 1, "feature_channels": 8, "blocks": [3]}],
    "SPANF": [{"feature_channels": 20, "upscale": s} for s in (1, 2, 3)]
    + [{"num_in_ch": 1, "num_out_ch": 1, "feature_channels": 1, "upscale": 2},
       {"num_in_ch": 4, "num_out_ch": 4, "feature_channels": 8, "upscale": 8}],
    "SPANF3": [{"feature_channels": 12, "num_blocks": n, "upscale": s, "unshuffle_mod": u}
               for n, s, u in ((1, 1, True), (2, 2, True), (3, 1, False), (0, 3, False), (4, 8, True))]
    + [{"num_in_ch": 1, "num_out_ch": 1, "feature_channels": 8, "num_blocks": 2, "upscale": 2, "unshuffle_mod": True},
       {"num_in_ch": 4, "num_out_ch": 3, "feature_channels": 8, "num_blocks": 1, "upscale": 1, "unshuffle_mod": True},
       {"num_in_ch": 3, "num_out_ch": 1, "feature_channels": 8, "num_blocks": 7, "upscale": 4}],
    "MoSR": [{"in_ch": 1, "n_block": 2, "dim": 16, "upsampler": u, "upscale": sc, "kernel_size": 5,
              "expansion_ratio": 8 / 3, "conv_ratio": 0.5} for u, sc in (("ps", 3), ("gps", 2), ("dys", 1))]
    + [{"in_ch": 3, "out_ch": 1, "n_block": 0, "dim": 8, "upsampler": "dys", "upscale": 2}],
    "MoSRv2": [{"in_ch": 3, "n_block": 2, "dim": 16, "upsampler": u, "scale": sc, "mid_dim": 8}
               for u in ("conv", "pixelshuffledirect", "pixelshuffle", "nearest+conv", "transpose+conv")
               for sc in (1, 2, 3, 4)]
    + [{"in_ch": 1, "n_block": 1, "dim": 8, "scale": 2, "unshuffle_mod": False, "expansion_ratio": 2.5,
        "rms_norm": True}, {"n_block": 1, "dim": 8, "scale": 8, "upsampler": "pixelshuffle"}],
    "RTMoSR": [{"scale": sc, "dim": 16, "n_blocks": 1, "ffn_expansion": 1.5, "dccm": False, "se": False}
               for sc in (1, 3, 4)]
    + [{"scale": sc, "dim": 8, "n_blocks": 3, "unshuffle_mod": True} for sc in (1, 2)],
    "MoESR": [{"in_ch": 1, "out_ch": 1, "dim": 16, "n_blocks": 2, "n_block": 1, "expansion_factor": 2.0,
               "expansion_msg": 1.25, "upsampler": u, "scale": sc, "upsample_dim": 8}
              for u in ("conv", "pixelshuffledirect", "pixelshuffle", "nearest+conv", "dysample") for sc in (2, 3)]
    + [{"dim": 8, "n_blocks": 1, "n_block": 0, "scale": 1}, {"dim": 12, "n_blocks": 1, "scale": 8}],
    "RealPLKSR": [{"dim": 16, "n_blocks": 2, "upscaling_factor": sc, "kernel_size": 7, "split_ratio": 0.3,
                   "use_ea": False, "dysample": True} for sc in (1, 2, 3)]
    + [{"dim": 12, "n_blocks": 1, "norm_groups": 3},
       {"dim": 16, "n_blocks": 1, "layer_norm": True, "upscaling_factor": 2}],
    "PLKSR": [{"dim": 16, "n_blocks": 2, "upscaling_factor": sc, "ccm_type": c, "kernel_size": 9, "lk_type": lk,
               "split_ratio": 0.5, "use_ea": sc == 1}
              for sc, c, lk in ((1, "CCM", "PLK"), (2, "ICCM", "RectSparsePLK"), (3, "DCCM", "SparsePLK"))]
    + [{"dim": 16, "n_blocks": 1, "lk_type": "SparsePLK", "use_max_kernel": True},
       {"dim": 16, "n_blocks": 1, "lk_type": "SparsePLK", "sparse_kernels": (3, 7), "sparse_dilations": (2, 1)}],
    "OmniSR": [{"num_feat": 16, "block_num": 2, "res_num": 2, "window_size": 4, "up_scale": sc, "bias": sc != 3}
               for sc in (1, 2, 3)]
    + [{"num_in_ch": 1, "num_out_ch": 1, "num_feat": 8, "pe": False, "window_size": 8}],
    "MAN": [{"n_resblocks": 2, "n_resgroups": g, "n_feats": 12, "scale": sc} for g, sc in ((1, 1), (3, 3), (2, 4))],
    "SeemoRe": [{"scale": sc, "num_experts": n, "num_layers": 2, "embedding_dim": 12, "lr_space": lr,
                 "global_kernel_size": 7, "use_shuffle": False}
                for sc, n, lr in ((1, 1, "linear"), (2, 3, "exp"), (3, 4, "double"), (4, 3, "linear"))]
    + [{"num_experts": 3, "num_layers": 16, "embedding_dim": 48, "recursive": 1, "use_shuffle": False}],
    "MixDehazeNet": [{"in_chans": 1, "out_chans": 2, "embed_dims": (8, 16, 24, 16, 8), "depths": (2, 1, 3, 1, 2)},
                     {"embed_dims": (16, 32, 64, 32, 16), "depths": (0, 1, 1, 1, 0)}],
    "RetinexFormer": [{"n_feat": 8, "stage": 1, "num_blocks": (1, 2, 2)},
                      {"n_feat": 12, "stage": 2, "num_blocks": (2, 0, 1)}],
    "RestoreFormer": [{"n_embed": 16, "embed_dim": 8, "ch": 32, "ch_mult": (1, 2), "num_res_blocks": 1,
                       "attn_resolutions": (256,), "z_channels": 32},
                      {"n_embed": 8, "embed_dim": 4, "ch": 32, "out_ch": 1, "in_channels": 1, "ch_mult": (1, 1, 2),
                       "num_res_blocks": 2, "attn_resolutions": (), "z_channels": 8, "enable_mid": False}],
    "SCUNet": [{"in_nc": 1, "config": (0, 2, 1, 2, 1, 0, 2), "dim": 64}, {"config": (1,) * 7, "dim": 128}],
    "SCUNet_aaf6aa": [{"config": (1, 0, 0, 2, 0, 0, 1), "scale": sc, "residual": sc != 2, "input_resolution": 64}
                      for sc in (1, 2, 8)] + [{"in_nc": 1, "out_nc": 3, "config": (0,) * 7}],
    "RCANOriginal": [{"scale": sc, "n_resgroups": 2, "n_resblocks": 1, "n_feats": 16, "unshuffle_mod": u}
                     for sc, u in ((1, True), (2, True), (1, False), (3, False), (8, False))]
    + [{"n_colors": 1, "n_feats": 24, "reduction": 5, "kernel_size": 5, "n_resgroups": 1, "n_resblocks": 1},
       {"norm": True, "n_resgroups": 1, "n_resblocks": 2, "n_feats": 16, "scale": 2}],
    "GateRV3": [{"dim": 16, "enc_blocks": (1, 2), "dec_blocks": (2, 1), "num_latent": 1, "sisr_blocks": 1,
                 "scale": sc, "upsample": up} for sc, up in ((2, "pixelshuffle"), (3, "pixelshuffledirect"),
                                                             (4, "nearest+conv"), (2, "dysample"), (1, "conv"))]
    + [{"in_ch": 1, "dim": 8, "enc_blocks": (1,), "dec_blocks": (1,), "attention": True, "upsample_mid_dim": 16,
        "scale": 4}],
    "UpCunet2x": [{"pro": True}, {"in_channels": 1, "out_channels": 1}],
    "UpCunet3x": [{"pro": True}, {"in_channels": 1, "out_channels": 3}],
    "UpCunet4x": [{"pro": True}, {"in_channels": 4, "out_channels": 4}],
    "UpCunet2x_fast": [{"in_channels": 1, "out_channels": 1}],
    "StyleGAN2Generator": [{"out_size": 32, "num_style_feat": 16, "num_mlp": 1, "narrow": 0.25},
                           {"out_size": 128, "num_style_feat": 8, "num_mlp": 3, "channel_multiplier": 1,
                            "narrow": 0.125}],
    "StyleGAN2GeneratorClean": [{"out_size": 16, "num_style_feat": 16, "num_mlp": 1, "narrow": 0.5},
                                {"out_size": 64, "num_style_feat": 8, "num_mlp": 4, "channel_multiplier": 3,
                                 "narrow": 0.0625}],
    "SwinIR": [{"img_size": 32, "embed_dim": 12, "depths": (2, 1, 3), "num_heads": (2, 3, 1), "window_size": 4,
                "mlp_ratio": 1.5, "upscale": sc, "upsampler": up, "resi_connection": rc}
               for sc, up, rc in ((3, "pixelshuffle", "1conv"), (2, "pixelshuffledirect", "3conv"),
                                  (4, "nearest+conv", "1conv"), (1, "", "3conv"), (8, "pixelshuffle", "3conv"),
                                  (1, "pixelshuffle", "1conv"))]
    + [{"in_chans": 1, "img_size": 8, "embed_dim": 8, "depths": (2,), "num_heads": (2,), "window_size": 8,
        "qkv_bias": False, "ape": True, "patch_norm": False, "upsampler": "", "upscale": 1},
       {"img_size": 126, "embed_dim": 12, "depths": (2,), "num_heads": (2,), "window_size": 7, "upsampler": ""}],
    "SRFormer": [{"img_size": 32, "embed_dim": 12, "depths": (2, 1), "num_heads": (2, 3), "window_size": 8,
                  "mlp_ratio": 1.5, "upscale": sc, "upsampler": up, "resi_connection": rc}
                 for sc, up, rc in ((3, "pixelshuffle", "1conv"), (2, "pixelshuffledirect", "3conv"),
                                    (4, "nearest+conv", "1conv"), (1, "", "3conv"))]
    + [{"in_chans": 1, "img_size": 20, "embed_dim": 8, "depths": (2,), "num_heads": (4,), "window_size": 6,
        "ape": True, "qkv_bias": False, "upsampler": ""}],
    # SRFormerV2: the first group without a shifted block (the mask in the second), every upsampler; the Swin window
    # shrunk to the patch (no mask anywhere); an unseen patch (the default); ape without qkv bias
    "SRFormerv2": [{"img_size": 32, "embed_dim": 12, "squeeze_dim": 3, "depths": (1, 2), "num_heads": (2, 3),
                    "window_size": 8, "mlp_ratio": 1.5, "upscale": sc, "upsampler": up, "resi_connection": rc}
                   for sc, up, rc in ((3, "pixelshuffle", "1conv"), (2, "pixelshuffledirect", "3conv"),
                                      (4, "nearest+conv", "1conv"), (1, "", "3conv"), (8, "pixelshuffle", "1conv"))]
    + [{"img_size": 8, "embed_dim": 8, "squeeze_dim": 2, "depths": (1,), "num_heads": (2,), "window_size": 4,
        "upscale": 2, "upsampler": "pixelshuffledirect", "patch_norm": False},
       {"embed_dim": 8, "squeeze_dim": 5, "depths": (1, 1), "num_heads": (1, 2), "window_size": 12, "upscale": 4,
        "upsampler": "pixelshuffle"},
       {"in_chans": 1, "img_size": 12, "embed_dim": 8, "squeeze_dim": 4, "depths": (2,), "num_heads": (4,),
        "window_size": 6, "ape": True, "qkv_bias": False, "upsampler": ""}],
    "Swin2SR": [{"img_size": 32, "embed_dim": 12, "depths": (2, 1), "num_heads": (2, 3), "window_size": 4,
                 "mlp_ratio": 1.5, "upscale": sc, "upsampler": up, "resi_connection": rc}
                for sc, up, rc in ((3, "pixelshuffle", "1conv"), (2, "pixelshuffledirect", "3conv"),
                                   (4, "nearest+conv", "1conv"), (1, "", "3conv"), (2, "pixelshuffle_aux", "1conv"),
                                   (1, "pixelshuffle_aux", "3conv"))]
    + [{"in_chans": 1, "img_size": 16, "embed_dim": 8, "depths": (3,), "num_heads": (2,), "window_size": 8,
        "qkv_bias": False, "ape": True, "patch_norm": False}],
    "RGT": [{"embed_dim": 16, "depth": (2, 1, 3), "num_heads": (2, 4, 2), "mlp_ratio": 1.5, "upscale": sc,
             "split_size": split, "c_ratio": 0.25, "resi_connection": rc, "qkv_bias": sc != 3}
            for sc, split, rc in ((1, (4, 4), "1conv"), (2, (4, 8), "3conv"), (3, (2, 8), "1conv"),
                                  (8, (8, 8), "1conv"))]
    + [{"in_chans": 1, "embed_dim": 8, "depth": (1,), "num_heads": (4,), "split_size": (2, 4)}],
}

CASES = [(arch, args) for arch, configs in EXTRA.items() for args in configs]


@pytest.mark.parametrize(("arch", "args"), CASES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(CASES)])
def test_recognised_beyond_the_defaults(arch: str, args: dict) -> None:
    """Recognised as the same class with arguments that build exactly the same tensors, no other family fits
    (and no recogniser fails on the file: recognise_all lets any other exception through)."""
    opt = {"type": arch, **args}
    layout = _layout(opt)
    assert layout is not None, f"{opt} does not build"
    found = recognise_all(layout)
    assert found, f"{opt} is not recognised"
    assert ARCH_REGISTRY.get(found[0].opt["type"]) is ARCH_REGISTRY.get(arch), f"{opt} recognised as " \
        f"{found[0].describe()}"
    assert _layout(found[0].opt) == layout, f"{opt}: {found[0].describe()} builds other tensors"
    assert len(found) == 1, f"{opt} fits several families: {[f.describe() for f in found]}"


@pytest.mark.slow
def test_a_file_saved_inside_a_wrapper_is_recognised(tmp_path: Path) -> None:
    """What the loader accepts is recognised: names under a wrapper prefix (``netG.``: stripped by the loader
    when every name has it) and DDP's ``module.`` (stripped when read) run with no --arch."""
    torch.manual_seed(0)
    net = build_network({"type": "SPAN", "feature_channels": 8, "upscale": 2, "norm": False})
    torch.save({"params_ema": {f"netG.module.{k}": v for k, v in net.state_dict().items()}}, tmp_path / "w.pth")
    img = ROOT / "datasets" / "Set5" / "HR" / "bird.png"
    r = subprocess.run([sys.executable, "-m", "anysr", "infer", "--weights", str(tmp_path / "w.pth"), "-i",
                        str(img), "-o", str(tmp_path / "out")], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    log = r.stdout + r.stderr
    assert "recognised from the weights' names and shapes: SPAN" in log
    assert "feature_channels=8" in log and "upscale=2" in log and "norm=False" in log
    (out,) = sorted((tmp_path / "out").rglob("*.png"))
    assert Image.open(out).size == tuple(2 * n for n in Image.open(img).size)


# The reference implementations' own state dicts (tests/fixtures/*: made by BasicSR, spandrel, traiNNer-redux or
# the authors' code): recognised as the class the fixture names, with its arguments, except those whose value
# builds the same network (listed, with why).
SAME_NETWORK = {
    ("scunet_aaf6aa_x2_nores", "input_resolution"): "shows only in computed masks, which a seeded case takes from "
                                                    "the network itself (no stored reference file any more)",
    ("swinir_smallimg_x2", "window_size"): "the window shrinks to the 4-pixel training patch either way",
    ("realplksr_x3_dysample_noea", "norm_groups"): "GroupNorm's group count shows in no tensor",
    ("mosrv2_x3_no_unshuffle", "unshuffle_mod"): "nothing is unshuffled at x3 either way",
    ("restoreformer_mid", "attn_resolutions"): "the same level: given for a 16 input there, a 512 one here",
    ("moesr_x1_conv", "upsampler"): "at x1 both heads are the one conv",
    ("srformer_x3_direct_3conv", "img_size"): "the class rounds img_size up to the window (8)",
    ("rcan_x8_gray", "reduction"): "only n_feats // reduction shows (and counts): 8 // 5 == 8 // 8",
}


def _reference_cases() -> list[tuple[str, Path, dict]]:
    cases = []
    for folder in sorted((ROOT / "tests" / "fixtures").iterdir()):
        manifest = folder / "manifest.json"
        if not manifest.is_file():
            continue
        listed = json.loads(manifest.read_text())
        listed = listed.get("cases", listed)
        for name, case in listed.items() if isinstance(listed, dict) else ():  # loss fixtures list their cases
            if not isinstance(case, dict) or case.get("type") not in EXTRA:
                continue
            if case.get("seeded"):  # seeded reference weights: the case loaded strictly gives the state
                cases.append((name, folder / f"{name}.seeded", case))
                continue
            for file in (folder / f"{name}_params.safetensors", folder / f"{name}.pth"):
                if file.is_file():
                    cases.append((name, file, case))
    return cases


REFERENCE_CASES = _reference_cases()


def _same(a: object, b: object) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize(("name", "file", "case"), REFERENCE_CASES, ids=[c[0] for c in REFERENCE_CASES])
def test_reference_files_are_recognised_with_their_arguments(name: str, file: Path, case: dict) -> None:
    if file.suffix == ".seeded":
        from arch_checks import load_case

        sd = load_case(file.parent.name, name)[0].state_dict()
    else:
        sd = load_file(str(file)) if file.suffix == ".safetensors" else load_weights(file, "auto")[0]
    found = recognise_all(sd)
    assert [ARCH_REGISTRY.get(f.opt["type"]) for f in found] == [ARCH_REGISTRY.get(case["type"])], \
        f"{file.name}: recognised as {[f.describe() for f in found]}"
    differ = {k: (v, found[0].opt[k]) for k, v in case["kwargs"].items()
              if k in found[0].opt and not _same(v, found[0].opt[k]) and (name, k) not in SAME_NETWORK}
    assert not differ, f"{file.name}: (reference, recognised) differ: {differ}"


def test_the_reference_files_cover_the_families() -> None:
    assert len({c["type"] for _, _, c in REFERENCE_CASES}) >= 25

"""Architectures: BasicSR 1.4.2 checkpoints (seeded weights saved as BasicSR saves networks,
``tools/fixtures/make_basicsr_fixtures.py``) load strictly and give BasicSR's outputs; build errors."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import fixture_kit  # tools/fixtures (on the path: tests/conftest.py)
import numpy as np
import pytest
import torch
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file
from torch.nn import functional as F

from anysr.archs import REQUIRED, arch_kwargs, build_network
from anysr.archs.arch_util import ArchArgumentError, pixel_unshuffle, shifted_window_mask
from anysr.archs.swinir_arch import SwinTransformerBlock
from anysr.errors import OptionError
from anysr.registry import ARCH_REGISTRY

FIXTURES = ROOT / "tests" / "fixtures" / "basicsr"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
PRETRAINED = ROOT / "pretrained" / "realesr-animevideov3.pth"


def _bird_path() -> Path:
    return ROOT / "datasets" / "Set5" / "HR" / "bird.png"  # bundled


def _build(name: str) -> torch.nn.Module:
    case = MANIFEST[name]
    return build_network({"type": case["type"], **case["kwargs"]}).eval()


def _checkpoint(name: str, folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Case ``name``'s BasicSR checkpoint (``params``, and ``params_ema`` where the case has a second seed: the
    seeded weights over the buffers the network computes), saved with ``torch.save`` as BasicSR saves networks and
    read back."""
    case, own = MANIFEST[name], _build(name).state_dict()
    ckpt = {}
    for key, entry in (("params", "seeded"), ("params_ema", "seeded_ema")):
        if entry in case:
            seeded = fixture_kit.seeded_state_dict(case[entry]["shapes"], case[entry]["seed"])
            assert fixture_kit.abs_sum(seeded) == pytest.approx(case[entry]["abs_sum"], rel=1e-9)
            ckpt[key] = {**own, **seeded}
    torch.save(ckpt, folder / f"{name}.pth")
    return torch.load(folder / f"{name}.pth", map_location="cpu", weights_only=True)


def _io(name: str) -> dict[str, torch.Tensor]:
    io = load_file(str(FIXTURES / f"{name}_io.safetensors"))
    return {**io, **{k: fixture_kit.seeded_input(v["shape"], v["seed"]) for k, v in MANIFEST[name]["inputs"].items()}}


# ----------------------------------------------------------------------------- BasicSR parity

@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_basicsr_checkpoint_matches(name: str, tmp_path: Path) -> None:
    ckpt = _checkpoint(name, tmp_path)
    io = _io(name)
    net = _build(name)
    assert set(net.state_dict()) == set(ckpt["params"]), "state-dict keys differ from BasicSR's"
    for inp, out, key in MANIFEST[name]["compare"]:
        net.load_state_dict(ckpt[key], strict=True)
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {inp} ({key}) differs from BasicSR")


def test_ema_fixture_has_both_keys(tmp_path: Path) -> None:
    ckpt = _checkpoint("msrresnet_x4", tmp_path)
    assert set(ckpt) == {"params", "params_ema"}
    assert any(not torch.equal(ckpt["params"][k], ckpt["params_ema"][k]) for k in ckpt["params"])


def test_swinir_pads_non_window_multiple_like_basicsr(tmp_path: Path) -> None:
    # input2 is 10x13 with window 4: BasicSR's SwinIRModel.test pads (reflect) and crops; our forward does.
    for name in ("swinir_pixelshuffle_x2", "swinir_nearestconv_x4", "swinir_denoise_gray"):
        ckpt = _checkpoint(name, tmp_path)
        io = _io(name)
        assert tuple(io["input2"].shape[-2:]) == (10, 13)
        net = _build(name)
        net.load_state_dict(ckpt["params"], strict=True)
        with torch.no_grad():
            got = net(io["input2"])
        torch.testing.assert_close(got, io["output2"], **FIXTURE_TOL)


def test_swinir_mask_is_computed_per_size_and_deterministic() -> None:
    net = _build("swinir_pixelshuffle_x2")
    torch.manual_seed(0)
    a, b = torch.rand(1, 3, 8, 12), torch.rand(1, 3, 16, 8)
    with torch.no_grad():
        first = net(a)
        net(b)  # a different size in between must leave no state behind
        again = net(a)
    assert torch.equal(first, again)
    # the mask for img_size equals the persistent buffer BasicSR stores
    blk = net.layers[0].residual_group.blocks[1]
    assert torch.equal(blk.attn_mask, shifted_window_mask(8, 8, 4, 2))
    mask = shifted_window_mask(8, 12, 4, 2)
    assert mask.shape == (6, 16, 16) and set(mask.unique().tolist()) == {-100.0, 0.0}
    assert not mask[0].any()  # a window away from the wrap-around sees no mask


def test_swinir_defaults_build_and_run() -> None:
    # BasicSR's SwinIR() fails here (img_size 64 is not a multiple of window 7); ours rounds the buffer up.
    net = build_network({"type": "SwinIR"}).eval()
    assert net.layers[0].residual_group.blocks[1].attn_mask.shape == (100, 49, 49)
    with torch.no_grad():
        out = net(torch.rand(1, 3, 9, 10))
    assert out.shape == (1, 3, 9, 10) and torch.isfinite(out).all()


def test_swinir_batch_and_sizes_independent() -> None:
    net = _build("swinir_pixelshuffledirect_x3")
    x = torch.rand(2, 3, 12, 8)
    with torch.no_grad():
        both = net(x)
        single = net(x[1:])
    assert torch.allclose(both[1:], single, atol=1e-6)


def test_pixel_unshuffle_channel_order() -> None:
    x = torch.arange(2 * 8 * 12, dtype=torch.float32).view(1, 2, 8, 12)
    # BasicSR's layout: view (b, c, h, s, w, s) -> permute (0, 1, 3, 5, 2, 4)
    ref = x.view(1, 2, 4, 2, 6, 2).permute(0, 1, 3, 5, 2, 4).reshape(1, 8, 4, 6)
    assert torch.equal(pixel_unshuffle(x, 2), ref)


@pytest.mark.parametrize("name", ["msrresnet_x4", "edsr_x2", "rcan_x4", "rrdbnet_x2", "srvgg_x4_prelu",
                                  "swinir_pixelshuffle_x2", "swinir_nearestconv_x4", "swinir_denoise_gray"])
def test_forward_creates_no_tensor_off_the_input_device(name: str) -> None:
    # On the meta device every tensor made on the CPU (instead of device=x.device) would raise.
    net = _build(name).to("meta")
    channels = MANIFEST[name]["kwargs"].get("num_in_ch", MANIFEST[name]["kwargs"].get("in_chans", 3))
    out = net(torch.empty(1, channels, 10, 13, device="meta") if name.startswith("swinir")
              else torch.empty(1, channels, 8, 12, device="meta"))
    assert out.device.type == "meta"


@pytest.mark.parametrize("name", ["edsr_x2", "rrdbnet_x4", "swinir_pixelshuffle_x2", "swinir_denoise_gray"])
def test_bf16_weights_and_autocast_stay_close(name: str) -> None:
    net = _build(name)
    channels = 1 if name.endswith("gray") else 3
    x = torch.rand(1, channels, 10, 12) if name.startswith("swinir") else torch.rand(1, channels, 8, 12)
    with torch.no_grad():
        ref = net(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = net(x).float()
        pure = net.to(torch.bfloat16)(x.bfloat16()).float()
    # measured: at most 0.006 (autocast) and 0.008 (bf16 weights) on these fixtures
    assert (mixed - ref).abs().max().item() < 0.03
    assert (pure - ref).abs().max().item() < 0.03


def test_mean_is_not_in_state_dict_but_follows_the_module() -> None:
    net = _build("edsr_x2")
    assert "mean" not in net.state_dict()
    assert net.to(torch.float64).mean.dtype == torch.float64


def test_swinir_checkpointing_matches_plain_forward() -> None:
    case = MANIFEST["swinir_pixelshuffle_x2"]
    plain = _build("swinir_pixelshuffle_x2")
    ckpt = build_network({"type": "SwinIR", **case["kwargs"], "use_checkpoint": True}).eval()
    ckpt.load_state_dict(plain.state_dict(), strict=True)
    x = torch.rand(1, 3, 8, 8, requires_grad=True)
    y1 = plain(x)
    y2 = ckpt(x)
    assert torch.allclose(y1, y2, atol=1e-6)
    y2.sum().backward()
    assert x.grad is not None


# ----------------------------------------------------------------------------- build_network errors

def test_registry_has_every_arch() -> None:
    assert {"MSRResNet", "EDSR", "RCAN", "RRDBNet", "SRVGGNetCompact", "SwinIR"} <= set(ARCH_REGISTRY.keys())


def test_arch_kwargs_lists_defaults_in_order() -> None:
    kw = arch_kwargs("EDSR")
    assert list(kw) == ["num_in_ch", "num_out_ch", "num_feat", "num_block", "upscale", "res_scale",
                        "img_range", "rgb_mean"]
    assert kw["num_in_ch"] is REQUIRED and kw["img_range"] == 255.0
    assert arch_kwargs(ARCH_REGISTRY.get("RRDBNet"))["scale"] == 4
    assert list(arch_kwargs("SwinIR"))[-4:] == ["img_range", "upsampler", "resi_connection", "rgb_mean"]


def test_unknown_type() -> None:
    pattern = r"network_g\.type: unknown arch 'RRDBNett' \(did you mean 'RRDBNet'\?\); known: .*SwinIR"
    with pytest.raises(OptionError, match=pattern):
        build_network({"type": "RRDBNett", "num_in_ch": 3, "num_out_ch": 3})


def test_missing_type_and_not_a_mapping() -> None:
    pattern = r"network_d\.type: missing; name one of the architectures: .*RRDBNet"
    with pytest.raises(OptionError, match=pattern):
        build_network({"num_in_ch": 3}, key_path="network_d")
    with pytest.raises(OptionError, match=r"network_g: expected a mapping .*got list"):
        build_network(["RRDBNet"])  # type: ignore[arg-type]


def test_misspelled_kwarg_names_key_path_and_nearest() -> None:
    with pytest.raises(OptionError) as err:
        build_network({"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "num_feats": 32})
    msg = str(err.value)
    assert msg.startswith("network_g.num_feats: unknown argument of RRDBNet (did you mean 'num_feat'?)")
    assert "valid arguments: num_in_ch, num_out_ch, scale, num_feat, num_block, num_grow_ch" in msg


def test_missing_required_kwarg() -> None:
    with pytest.raises(OptionError, match=r"network_g\.num_out_ch: required argument of EDSR is missing"):
        build_network({"type": "EDSR", "num_in_ch": 3})


@pytest.mark.parametrize(
    ("opt", "pattern"),
    [
        ({"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "scale": 3},
         r"network_g\.scale: RRDBNet supports scale 1, 2 or 4, got 3"),
        ({"type": "MSRResNet", "upscale": 8}, r"network_g\.upscale: MSRResNet supports upscale 1, 2, 3 or 4"),
        ({"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "upscale": 5},
         r"network_g\.upscale: scale 5 is not supported; use a power of two"),
        ({"type": "EDSR", "num_in_ch": 1, "num_out_ch": 1},
         r"network_g\.rgb_mean: EDSR has num_in_ch=1 but rgb_mean has 3 values; give 1 values"),
        ({"type": "RCAN", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8},
         r"network_g\.squeeze_factor: RCAN needs num_feat // squeeze_factor >= 1"),
        ({"type": "SRVGGNetCompact", "act_type": "gelu"},
         r"network_g\.act_type: SRVGGNetCompact: unknown act_type 'gelu'; use one of relu, prelu, leakyrelu"),
        ({"type": "SRVGGNetCompact", "upscale": 0}, r"network_g\.upscale: SRVGGNetCompact needs an integer"),
        ({"type": "SwinIR", "upsampler": "pixelshufle"},
         r"network_g\.upsampler: SwinIR: unknown upsampler 'pixelshufle'"),
        ({"type": "SwinIR", "resi_connection": "2conv"},
         r"network_g\.resi_connection: SwinIR: unknown resi_connection '2conv'"),
        ({"type": "SwinIR", "depths": [2, 2], "num_heads": [2]},
         r"network_g\.num_heads: SwinIR: num_heads has 1 entries but depths has 2"),
        ({"type": "SwinIR", "upsampler": "nearest+conv", "upscale": 2},
         r"network_g\.upscale: SwinIR: upsampler 'nearest\+conv' supports upscale 4 only"),
        ({"type": "SwinIR", "depths": 6}, r"network_g: cannot build SwinIR with .*depths"),
        ({"type": "Bicubic", "upscale": 1.5}, r"network_g\.upscale: Bicubic needs an integer upscale >= 1"),
    ],
)
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


def test_bicubic_is_matlab_imresize_without_parameters() -> None:
    from anysr.ops.imresize import imresize_torch

    net = build_network({"type": "Bicubic", "upscale": 3})
    assert net.state_dict() == {} and net.upscale == 3
    x = torch.rand(1, 3, 5, 7)
    assert torch.equal(net(x), imresize_torch(x, 3))
    assert net(x).shape == (1, 3, 15, 21)
    assert torch.equal(build_network({"type": "Bicubic", "upscale": 1})(x), x)


def test_swin_block_rejects_shift_not_smaller_than_window() -> None:
    with pytest.raises(ArchArgumentError, match=r"window_size: shift 4 must be in \[0, window 4\)"):
        SwinTransformerBlock(12, (8, 8), 2, window_size=4, shift_size=4)


# ----------------------------------------------------------------------------- real published model

def _rgb_tensor(img_bgr: np.ndarray) -> torch.Tensor:
    rgb = img_bgr[:, :, ::-1].astype(np.float32) / 255.0
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1).unsqueeze(0)


def _psnr_y(a: torch.Tensor, b: torch.Tensor, border: int) -> float:
    """PSNR on the BT.601 Y channel (0..255 scale) of two RGB [0,1] tensors, ``border`` pixels cropped."""
    w = torch.tensor([65.481, 128.553, 24.966]).view(1, 3, 1, 1)
    ya = (a.clamp(0, 1) * w).sum(1) + 16.0
    yb = (b.clamp(0, 1) * w).sum(1) + 16.0
    ya, yb = ya[..., border:-border, border:-border], yb[..., border:-border, border:-border]
    ya, yb = ya.round(), yb.round()  # as images saved in uint8
    mse = ((ya - yb) ** 2).mean().item()
    return 10.0 * float(np.log10(255.0**2 / mse))


def test_realesr_animevideov3_loads_and_upscales_bird() -> None:
    ckpt = torch.load(PRETRAINED, map_location="cpu", weights_only=True)
    assert list(ckpt) == ["params"]
    net = build_network({"type": "SRVGGNetCompact", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 64,
                         "num_conv": 16, "upscale": 4, "act_type": "prelu"}).eval()
    net.load_state_dict(ckpt["params"], strict=True)

    hr_bgr = cv2.imread(str(_bird_path()), cv2.IMREAD_COLOR)
    assert hr_bgr is not None and hr_bgr.shape == (288, 288, 3)
    hr = _rgb_tensor(hr_bgr)
    # antialiased bicubic (a = -0.5 like MATLAB's imresize), x1/4, quantised to uint8 like a saved LR image
    lr = F.interpolate(hr, scale_factor=0.25, mode="bicubic", antialias=True, align_corners=False)
    lr = (lr.clamp(0, 1) * 255).round() / 255
    with torch.no_grad():
        sr = net(lr)
    assert sr.shape == hr.shape
    psnr = _psnr_y(sr, hr, border=4)
    nearest = F.interpolate(lr, scale_factor=4, mode="nearest")  # the base the network adds its residual to
    psnr_nearest = _psnr_y(nearest, hr, border=4)
    # measured (torch 2.13 CPU): 29.35 dB; nearest 27.50 dB; plain bicubic upsampling 30.43 dB (this is an
    # anime-style model, smoothing textures as published, so it is not expected to beat bicubic on a photo)
    assert psnr > 28.8, f"PSNR_Y {psnr:.2f} dB"
    assert psnr > psnr_nearest + 1.0, f"PSNR_Y {psnr:.2f} dB vs nearest {psnr_nearest:.2f} dB"

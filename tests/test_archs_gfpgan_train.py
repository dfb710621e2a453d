"""The networks of GFPGAN's training (its ``options/train_gfpgan_v1.yml``): GFPGANv1, FacialComponentDiscriminator
and ResNetArcFace, against the GFPGAN repository's code (on BasicSR 1.4.2's StyleGAN2 layers).

Fixtures: ``tools/fixtures/make_gfpgan_train_fixtures.py``. GFPGANv1's weights and noise maps come from fixture_kit
seeds (``arch_checks.stored_params``, the noise as io ``state.<key>``); the fixed-width discriminator and ArcFace use
seeded weights (``seeded_state`` below, the same function as the script's, checked by its sum), ArcFace's batch-norm
statistics as they were after a training-mode pass of the reference. The state dicts load strictly and give the
reference's outputs (GFPGANv1: the fixture's noise, and its U-Net
RGB pyramid; the discriminator: its features), a training step reaches every trainable parameter with a finite
gradient (GFPGANv1's decoder frozen by ``fix_decoder``), bf16 autocast stays close, channels_last and the meta
device change nothing, bad arguments are one clear error, and the weights are recognised from their names and shapes.
"""

from __future__ import annotations

import functools
import json
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from arch_checks import check_channels_last, check_meta_device, fixture_io, stored_params
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file
from torch import nn

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise, recognise_all
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "gfpgan_train"
MANIFEST: dict[str, dict[str, Any]] = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
GFPGAN = sorted(n for n, c in MANIFEST.items() if c["type"] == "GFPGANv1")
ARCFACE = sorted(n for n, c in MANIFEST.items() if c["type"] == "ResNetArcFace")
# GFPGAN's train_gfpgan_v1.yml network_g (its decoder_load_path aside)
TRAIN_G = {"type": "GFPGANv1", "out_size": 512, "num_style_feat": 512, "channel_multiplier": 1,
           "resample_kernel": [1, 3, 3, 1], "fix_decoder": True, "num_mlp": 8, "lr_mlp": 0.01,
           "input_is_latent": True, "different_w": True, "narrow": 1, "sft_half": True}


def seeded_state(shapes: dict[str, list[int]], seed: int, weights: str) -> dict[str, torch.Tensor]:
    """The fixture script's seeded weights (same function): numpy's generator seeded by the name's CRC-32 plus
    ``seed``; multi-dim weights N(0, 1) ('unit') or N(0, 2 / fan_in) ('kaiming'), biases and running means
    N(0, 0.01), running variances exp(N(0, 0.09)), PReLU slopes 0.25 + N(0, 0.01), other 1-D weights 1 + N(0, 0.01),
    batch counters 7."""
    out = {}
    for key, shape in shapes.items():
        leaf = key.rsplit(".", 1)[-1]
        if leaf == "num_batches_tracked":
            out[key] = torch.full(shape, 7, dtype=torch.int64)
            continue
        rs = np.random.RandomState((zlib.crc32(key.encode()) + seed) % 2**32)
        n = rs.standard_normal(int(np.prod(shape))).reshape(shape)
        if len(shape) >= 2:
            v = n if weights == "unit" else n * math.sqrt(2.0 / float(np.prod(shape[1:])))
        elif leaf == "running_var":
            v = np.exp(0.3 * n)
        elif leaf in ("bias", "running_mean"):
            v = 0.1 * n
        elif "prelu" in key or key.endswith("se.fc.1.weight"):
            v = 0.25 + 0.1 * n
        else:
            v = 1.0 + 0.1 * n
        if key.startswith("bn5."):  # ArcFace's embedding within +-1: see the fixture script's docstring
            v = 0.05 * v
        out[key] = torch.from_numpy(v.astype(np.float32))
    return out


@functools.cache
def _seeded(name: str) -> dict[str, torch.Tensor]:
    spec = MANIFEST[name]["seeded"]
    if "weights" not in spec:  # fixture_kit's seeds
        return stored_params("gfpgan_train", name)
    state = seeded_state(spec["shapes"], spec["seed"], spec["weights"])
    abs_sum = float(sum(v.double().abs().sum() for v in state.values()))
    assert abs_sum == pytest.approx(spec["abs_sum"], rel=1e-9), "seeded weights differ from the fixture script's"
    return state


@functools.cache
def _params(name: str) -> dict[str, torch.Tensor]:
    """The reference's state dict: seeded, with the stored (batch-norm) tensors or the io's ``state.<key>`` (seeded
    noise maps) over it."""
    path = FIXTURES / f"{name}_params.safetensors"
    stored = load_file(str(path)) if path.exists() else {}
    state = {k[len("state."):]: v for k, v in _io(name).items() if k.startswith("state.")}
    return {**_seeded(name), **stored, **state}


@functools.cache
def _io(name: str) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in fixture_io("gfpgan_train", name).items()}


def _net(name: str) -> nn.Module:
    case = MANIFEST[name]
    return build_network({"type": case["type"], **case["kwargs"]})


def _case(name: str) -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """The fixture network (eval mode, the reference's weights loaded strictly, stored noise) and its io."""
    net = _net(name).eval()
    net.load_state_dict(_params(name), strict=True)
    if hasattr(net, "randomize_noise"):
        net.randomize_noise = False
    return net, dict(_io(name))


def _feats(io: dict[str, torch.Tensor], j: int) -> list[str]:
    return sorted(k for k in io if k.startswith(f"feat{j}_"))


class FirstOutput(nn.Module):
    """A network returning a tuple (the discriminator's (scores, features)), seen as its first output."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)[0]


# ----------------------------------------------------------------------------- reference parity

@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    net = _net(name).eval()
    ref_shapes = {k: list(v.shape) for k, v in _params(name).items()}
    assert set(case["seeded"]["shapes"]) <= set(ref_shapes)
    assert {k: list(v.shape) for k, v in net.state_dict().items()} == ref_shapes, "keys or shapes differ"
    net.load_state_dict(_params(name), strict=True)
    io = _io(name)
    for j, (inp, out) in enumerate(case["compare"]):
        with torch.no_grad():
            if case["type"] == "GFPGANv1":
                got, rgbs = net(io[inp], randomize_noise=False, return_rgb=True)
                refs = sorted((k for k in io if k.startswith(f"rgb{j}_")), key=lambda k: int(k.rsplit("_", 1)[1]))
                for k in refs:
                    torch.testing.assert_close(rgbs[int(k.rsplit("_", 1)[1])], io[k], **FIXTURE_TOL, msg=k)
            elif case["type"] == "FacialComponentDiscriminator":
                got, feats = net(io[inp], return_feats=True)
                for k in _feats(io, j):
                    f = feats[int(k.split("_")[1])]
                    f = f.mean(1) if k.endswith("_cmean") else f.mean((2, 3)) if k.endswith("_smean") else f
                    torch.testing.assert_close(f, io[k], **FIXTURE_TOL, msg=k)
            else:
                got = net(io[inp])
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out}")


def test_gfpganv1_returns_the_unet_rgb_pyramid_of_the_reference() -> None:
    net, io = _case("gfpganv1_32")
    with torch.no_grad():
        image, rgbs = net(io["input0"], return_rgb=True)
        alone = net(io["input0"])
    refs = [io[f"rgb0_{k}"] for k in range(3)]
    assert [r.shape[-1] for r in rgbs] == [8, 16, 32] == [r.shape[-1] for r in refs]
    for got, ref in zip(rgbs, refs, strict=True):
        torch.testing.assert_close(got, ref, **FIXTURE_TOL)
    assert isinstance(alone, torch.Tensor) and torch.equal(alone, image)  # the image alone, like every anysr net
    torch.testing.assert_close(image, io["output0"], **FIXTURE_TOL)


def test_gfpganv1_pads_smaller_faces_and_refuses_larger_ones() -> None:
    net, io = _case("gfpganv1_32")
    with torch.no_grad():
        image = net(io["input1"])  # 27x30: grown to 32 (reflect, then edge), the output cropped
    assert image.shape == io["input1"].shape
    torch.testing.assert_close(image, io["output1"], **FIXTURE_TOL)
    with pytest.raises(ValueError, match=r"GFPGANv1\(out_size=32\) restores 32x32 faces, got 33x32"):
        net(torch.rand(1, 3, 33, 32))


def test_gfpganv1_noise_is_fresh_by_default_and_stored_on_request() -> None:
    net, io = _case("gfpganv1_32")
    net.randomize_noise = True  # the authors' default
    x = io["input0"]
    with torch.no_grad():
        a, b = net(x), net(x)
        stored = net(x, randomize_noise=False)
    assert not torch.equal(a, b), "fresh noise per call: two calls differ"
    torch.testing.assert_close(stored, io["output0"], **FIXTURE_TOL)
    assert "stylegan_decoder.noises.noise0" in net.state_dict()


def test_decoder_load_path_is_kept_for_the_model_not_read(tmp_path: Path) -> None:
    """Architectures read no files: the path (GFPGAN's option file sets it) stays on the network for the training
    model, which loads it into ``stylegan_decoder``; a missing file is no error here."""
    path = str(tmp_path / "StyleGAN2_512_Cmul1_FFHQ_B12G4_scratch_800k.pth")
    with torch.device("meta"):
        net = build_network({**TRAIN_G, "decoder_load_path": path})
        plain = build_network(TRAIN_G)
    assert net.decoder_load_path == path and plain.decoder_load_path is None
    assert not (tmp_path / "StyleGAN2_512_Cmul1_FFHQ_B12G4_scratch_800k.pth").exists()


def test_component_discriminator_returns_features_only_on_request() -> None:
    net, io = _case("component_d")
    with torch.no_grad():
        out, feats = net(io["input2"])
        _, with_feats = net(io["input2"], return_feats=True)
    assert feats is None and [f.shape[1:] for f in with_feats] == [(128, 8, 8), (256, 4, 4)]
    torch.testing.assert_close(out, io["output2"], **FIXTURE_TOL)


def test_arcface_training_pass_moves_batch_norms_as_the_reference() -> None:
    """The reference ran one training-mode pass on input0 and its mirror (2-D batch norms with momentum 1) from the
    seeded statistics: the same pass here gives its statistics (``bn5`` follows dropout's random mask: left out)."""
    for name in ARCFACE:
        net = _net(name)
        net.load_state_dict(_seeded(name), strict=True)
        for m in net.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.momentum = 1.0
        x = _io(name)["input0"]
        net.train()
        with torch.no_grad():
            net(torch.cat([x, x.flip(-1)]))
        got, ref = net.state_dict(), _params(name)
        moved = [k for k in ref if k.endswith(("running_mean", "running_var")) and not k.startswith("bn5.")]
        assert len(moved) > 10
        for k in moved:
            torch.testing.assert_close(got[k], ref[k], **FIXTURE_TOL, msg=f"{name} {k}")
            assert not torch.equal(ref[k], _seeded(name)[k])
        assert int(got["bn1.num_batches_tracked"]) == 8


# ----------------------------------------------------------------------------- training, precision, devices

def test_gfpganv1_training_step_trains_all_but_the_fixed_decoder() -> None:
    """GFPGAN's training layout (input_is_latent, fix_decoder): every U-Net, SFT and to-RGB parameter gets a
    finite gradient through the image and the RGB pyramid; the decoder is frozen (no gradient at all)."""
    net, io = _case("gfpganv1_32")
    net.train()
    image, rgbs = net(io["input0"], randomize_noise=True, return_rgb=True)
    (image.square().mean() + sum(r.square().mean() for r in rgbs)).backward()
    trained = {n for n, p in net.named_parameters() if p.requires_grad}
    assert trained == {n for n, _ in net.named_parameters() if not n.startswith("stylegan_decoder.")}
    bad = [n for n, p in net.named_parameters() if p.requires_grad and (p.grad is None or
                                                                         not torch.isfinite(p.grad).all())]
    assert not bad, bad
    assert all(p.grad is None for n, p in net.named_parameters() if n.startswith("stylegan_decoder."))


def test_gfpganv1_trainable_decoder_gets_gradients_everywhere() -> None:
    net, io = _case("gfpganv1_64_mlp_fullsft")  # fix_decoder false, the mapping MLP in use
    net.train()
    image, rgbs = net(io["input0"], return_rgb=True)
    (image.square().mean() + sum(r.square().mean() for r in rgbs)).backward()
    params = list(net.named_parameters())
    assert all(p.requires_grad for _, p in params)
    bad = [n for n, p in params if p.grad is None or not torch.isfinite(p.grad).all() or not p.grad.abs().sum() > 0]
    assert not bad, bad


@pytest.mark.parametrize("name", ["component_d", "arcface_ir_se"])
def test_training_step_gives_finite_gradients(name: str) -> None:
    net, io = _case(name)
    net.train()
    x = io["input0"]
    if name == "component_d":
        out, feats = net(x, return_feats=True)
        loss = out.mean() + sum(f.square().mean() for f in feats)
    else:  # batch norm in training mode needs two samples
        loss = net(torch.cat([x, x.flip(-1)])).square().mean()
    loss.backward()
    bad = [n for n, p in net.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not bad, bad


def _bf16_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert got.shape == ref.shape and torch.isfinite(got).all()
    return (got.float() - ref).abs().max().item() / ref.abs().max().item()


# bounds relative to the output's range, about 3x the measured error (0.012, 0.021, 0.016; ArcFace: 0.03, sixteen
# 3x3 convolutions deep)
@pytest.mark.parametrize(("name", "bound"), [("gfpganv1_32", 0.05), ("gfpganv1_64_mlp_fullsft", 0.06),
                                             ("component_d", 0.05), ("arcface_ir18", 0.1)])
def test_bf16_autocast_stays_close(name: str, bound: float) -> None:
    net, io = _case(name)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = net(io["input0"])
    err = _bf16_error(got[0] if isinstance(got, tuple) else got, io["output0"])
    assert err < bound, f"{name}: bf16 autocast off by {err:.3g} of the output range"


@pytest.mark.parametrize("name", ["gfpganv1_32", "component_d", "arcface_ir_se"])
def test_channels_last_and_meta_device(name: str) -> None:
    net, io = _case(name)
    wrapped = FirstOutput(net) if name == "component_d" else net
    check_channels_last(wrapped, io["input0"], io["output0"])
    if hasattr(net, "randomize_noise"):
        net.randomize_noise = True  # fresh noise must be made on the input's device too
    last = max(int(k[len("input"):]) for k in io if k.startswith("input"))
    check_meta_device(wrapped, io[f"input{last}"].shape, io[f"output{last}"].shape)


# ----------------------------------------------------------------------------- arguments and sizes

@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "ResNetArcFace", "block": "Bottleneck"},
     r"network_g\.block: ResNetArcFace: block must be one of 'IRBlock', 'BasicBlock', got 'Bottleneck'"),
    ({"type": "ResNetArcFace", "layers": [2, 2, 2]}, r"network_g\.layers: ResNetArcFace: layers must be four"),
    ({"type": "GFPGANv1", "out_size": 500}, r"network_g\.out_size: GFPGANv1 needs a power-of-two"),
])
def test_bad_arguments_are_one_clear_error(opt: dict, pattern: str) -> None:
    with torch.device("meta"), pytest.raises(OptionError, match=pattern) as err:
        build_network(opt)
    assert "\n" not in str(err.value)


def test_arcface_takes_128_pixel_faces() -> None:
    with torch.device("meta"):
        net = build_network({"type": "ResNetArcFace", "layers": [1, 1, 1, 1]})
        with pytest.raises(ValueError, match=r"ResNetArcFace takes 128x128 gray faces .* got \(112, 112\)"):
            net(torch.empty(1, 1, 112, 112))


def test_published_training_networks() -> None:
    """Sizes of train_gfpgan_v1.yml's networks (the reference's counts: the same classes built there)."""
    with torch.device("meta"):
        sizes = {o["type"]: sum(p.numel() for p in build_network(o).parameters()) for o in (
            TRAIN_G, {"type": "FacialComponentDiscriminator"},
            {"type": "ResNetArcFace", "block": "IRBlock", "layers": [2, 2, 2, 2], "use_se": False})}
    assert sizes == {"GFPGANv1": 76_207_244, "FacialComponentDiscriminator": 1_110_785,
                     "ResNetArcFace": 25_627_081}


# ----------------------------------------------------------------------------- recognised weights

def test_training_layout_is_recognised_with_its_arguments() -> None:
    with torch.device("meta"):
        layout = {k: tuple(v.shape) for k, v in build_network(TRAIN_G).state_dict().items()}
        clean = {k: tuple(v.shape) for k, v in build_network({"type": "GFPGANv1Clean"}).state_dict().items()}
    found = recognise(layout)
    assert not found.others
    assert found.opt == {"type": "GFPGANv1", "out_size": 512, "num_style_feat": 512, "narrow": 1,
                         "channel_multiplier": 1, "num_mlp": 8, "input_is_latent": True, "different_w": True,
                         "sft_half": True}
    assert [f.opt["type"] for f in recognise_all(clean)] == ["GFPGANv1Clean"]


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_files_are_recognised(name: str) -> None:
    case = MANIFEST[name]
    layout = {k: tuple(v.shape) for k, v in _params(name).items()}
    (found,) = recognise_all(layout)
    assert found.opt["type"] == case["type"]
    shown = {k: v for k, v in case["kwargs"].items() if k not in ("resample_kernel", "lr_mlp", "fix_decoder",
                                                                     "input_is_latent")}
    if case["kwargs"].get("block") == "BasicBlock":
        shown.pop("use_se")  # a BasicBlock has no squeeze-and-excitation either way
    assert {k: found.opt[k] for k in shown} == shown

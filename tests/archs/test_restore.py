"""Restoration archs Real-CUGAN (UpCunet2x / 3x / 4x / 2x_fast, "pro"), DRUNet, FBCNN, DnCNN / FDnCNN and
Swift-SRGAN against spandrel 0.4.2 (tests/fixtures/restore, made by tools/fixtures/make_restore_fixtures.py).

Parity on tiny (and for Real-CUGAN full-width) networks with seeded weights, including inputs that need padding; keys
and parameter counts of the published configurations; noise-map / quality-factor inputs; ONNX and XLA:CPU (``-m
xla``). The checks every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs,
2 gloo ranks == 1 process) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step, fixture_io, load_case, manifest, stored_params
from conftest import FIXTURE_TOL, run_cli

from anysr.archs import build_network
from anysr.archs.arch_util import input_channels
from anysr.engine import checkpoint as ck
from anysr.errors import OptionError

GROUP = "restore"
MANIFEST = manifest(GROUP)
CASES = MANIFEST["cases"]
FULL_SIZE = MANIFEST["full_size"]
ONE_PER_ARCH = {"UpCunet2x": "cugan_2x", "UpCunet3x": "cugan_3x", "UpCunet4x": "cugan_4x",
                "UpCunet2x_fast": "cugan_2x_fast", "DRUNet": "drunet_color", "FBCNN": "fbcnn_color",
                "DnCNN": "dncnn_gray_br", "SwiftSRGAN": "swiftsrgan_x4"}


def _params(name: str) -> dict[str, torch.Tensor]:
    return stored_params(GROUP, name)


def _io(name: str) -> dict[str, torch.Tensor]:
    return fixture_io(GROUP, name)


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The fixture network (eval mode, weights loaded strictly) and its inputs / outputs."""
    return load_case(GROUP, name)


def _call(net: torch.nn.Module, item: dict, x: torch.Tensor) -> torch.Tensor:
    net.train(bool(item.get("train")))
    try:
        with torch.no_grad():
            if item.get("qf"):
                return net.forward_with_qf(x)[1]
            if "qf_input" in item:
                return net(x, torch.tensor(item["qf_input"]).reshape(-1, 1))
            if "alpha" in item:
                return net(x, alpha=item["alpha"])
            return net(x)
    finally:
        net.eval()


# ----------------------------------------------------------------------------- spandrel parity

@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = CASES[name]
    params = _params(name)
    net = build_network({"type": case["type"], **case["kwargs"]})
    assert set(net.state_dict()) == set(params), "state-dict keys differ from spandrel's"
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    net.load_state_dict(params, strict=True)
    io = _io(name)
    for item in case["compare"]:
        got = _call(net, item, io[item["input"]])
        want = io[item["output"]]
        assert got.shape == want.shape, item
        torch.testing.assert_close(got, want, **FIXTURE_TOL, msg=f"{name} {item} differs from spandrel")


@pytest.mark.parametrize(("name", "inp", "why"), [
    ("cugan_2x", "input0", "21x35: grown to the 32-pixel minimum, 35 reflect-padded to 36 inside, cropped"),
    ("cugan_3x", "input0", "33x10: 10 grown to 32; 33 reflect-padded to a multiple of 4 inside"),
    ("cugan_4x", "input0", "9x33: grown to 32, 33 reflect-padded to 34 inside"),
    ("cugan_2x_fast", "input0", "23x42: grown to 40 and to a multiple of 4 (44)"),
    ("cugan_2x_fast", "input1", "10x41: grown to 40 x 44"),
    ("drunet_color", "input1", "13x10: padded to 16x16 (multiple of 8), cropped"),
    ("drunet_upconv_leaky", "input1", "11x7: padded to 16x8"),
    ("fbcnn_color", "input1", "13x21: edge-padded to 16x24 by FBCNN itself"),
    ("fbcnn_gray_avgpool_upconv", "input1", "9x17: edge-padded to 16x24"),
])
def test_padded_inputs_match_reference(name: str, inp: str, why: str) -> None:
    net, io = _case(name)
    x = io[inp]
    needs = min(x.shape[-2:]) < getattr(net, "min_size", 0) or x.shape[-2] % net.tile_multiple \
        or x.shape[-1] % net.tile_multiple
    assert needs, why
    with torch.no_grad():
        got = net(x)
    torch.testing.assert_close(got, io[inp.replace("input", "output")], **FIXTURE_TOL, msg=why)


@pytest.mark.parametrize("label", sorted(FULL_SIZE))
def test_published_configurations_have_reference_keys_and_sizes(label: str) -> None:
    spec = FULL_SIZE[label]
    with torch.device("meta"):
        net = build_network({"type": spec["type"], **spec["kwargs"]})
    sd = net.state_dict()
    lines = "\n".join(f"{k}:{list(v.shape)}" for k, v in sorted(sd.items()))
    assert len(sd) == spec["state_dict_entries"]
    assert hashlib.sha256(lines.encode()).hexdigest() == spec["digest"], f"{label}: keys / shapes differ"
    assert sum(p.numel() for p in net.parameters()) == spec["num_params"]


def test_tile_multiples_and_input_channels() -> None:
    multiples = {"UpCunet2x": 2, "UpCunet3x": 4, "UpCunet4x": 2, "UpCunet2x_fast": 4, "DRUNet": 8, "FBCNN": 8,
                 "DnCNN": 1, "SwiftSRGAN": 1}
    for arch, name in ONE_PER_ARCH.items():
        net = build_network({"type": arch, **CASES[name]["kwargs"]})
        assert net.tile_multiple == multiples[arch], arch
        assert "tile_multiple" not in "".join(net.state_dict())
    # the noise-map channel is appended by the network: callers (inference, export, calibration) feed images
    assert input_channels(build_network({"type": "DRUNet", **CASES["drunet_color"]["kwargs"]})) == 3
    assert input_channels(build_network({"type": "FBCNN", **CASES["fbcnn_gray_avgpool_upconv"]["kwargs"]})) == 1
    assert input_channels(build_network({"type": "DnCNN", **CASES["fdncnn_color"]["kwargs"]})) == 3
    assert input_channels(build_network({"type": "DnCNN", **CASES["dncnn_gray_br"]["kwargs"]})) == 1
    assert input_channels(build_network({"type": "UpCunet2x_fast"})) == 3


# ----------------------------------------------------------------------------- generic checks


# ----------------------------------------------------------------------------- noise map (DRUNet, FDnCNN)

@pytest.mark.parametrize("name", ["drunet_color", "fdncnn_color"])
def test_noise_map_level_float_tensor_and_raw_input_agree(name: str) -> None:
    net, io = _case(name)
    x = io["input0"]
    with torch.no_grad():
        default = net(x)
        raw = net(torch.cat([x, torch.full_like(x[:, :1], 15 / 255)], dim=1))
        as_float = net(x, noise_level=0.2)
        batch = torch.cat([x, x.flip(-1)])
        per_sample = net(batch, noise_level=torch.tensor([0.2, 15 / 255]))
    torch.testing.assert_close(default, io["output0"], **FIXTURE_TOL)
    torch.testing.assert_close(raw, default, rtol=0, atol=0)
    assert (as_float - default).abs().max() > 1e-3, "the noise level must reach the network"
    torch.testing.assert_close(per_sample[:1], as_float, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(per_sample[1:], net(x.flip(-1)), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="image channels"):
        net(torch.rand(1, 2, 8, 8))


def test_dncnn_subtracts_the_predicted_noise() -> None:
    net, io = _case("dncnn_gray_br")
    x = io["input0"]
    with torch.no_grad():
        torch.testing.assert_close(net(x), x - net.model(x), rtol=0, atol=0)


# ----------------------------------------------------------------------------- FBCNN quality factor

def test_fbcnn_forward_returns_the_image_and_quality_factor_steers_it() -> None:
    net, io = _case("fbcnn_color")
    x = io["input1"]
    with torch.no_grad():
        image, qf = net.forward_with_qf(x)
        plain = net(x)
        given_float = net(x[:1], 0.3)
        given_tensor = net(x[:1], torch.tensor([[0.3]]))
        predicted_as_input = net(x, qf)
    assert qf.shape == (2, 1) and bool(((qf > 0) & (qf < 1)).all())
    torch.testing.assert_close(plain, image, rtol=0, atol=0)
    torch.testing.assert_close(given_float, given_tensor, rtol=0, atol=0)
    torch.testing.assert_close(predicted_as_input, image, rtol=1e-6, atol=1e-6)
    assert (given_float - image[:1]).abs().max() > 1e-4, "qf_input must change the result"


# ----------------------------------------------------------------------------- Real-CUGAN

def test_realcugan_pro_buffer_and_input_range() -> None:
    plain = build_network({"type": "UpCunet2x"})
    pro = build_network({"type": "UpCunet2x", "pro": True})
    assert "pro" not in plain.state_dict() and not plain.is_pro
    assert torch.equal(pro.state_dict()["pro"], torch.zeros(1)) and pro.is_pro
    assert set(pro.state_dict()) - set(plain.state_dict()) == {"pro"}
    assert "pro" not in build_network({"type": "UpCunet4x"}).state_dict()
    # pro = the plain network on the input mapped to [0.15, 0.85], the output mapped back
    pro.load_state_dict({**plain.state_dict(), "pro": torch.zeros(1)}, strict=True)
    x = torch.rand(1, 3, 32, 34)
    with torch.no_grad():
        torch.testing.assert_close(pro(x), (plain(x * 0.7 + 0.15) - 0.15) / 0.7, rtol=1e-5, atol=1e-5)


def test_realcugan_alpha_one_is_the_default() -> None:
    net, io = _case("cugan_4x")
    with torch.no_grad():
        torch.testing.assert_close(net(io["input0"], alpha=1.0), io["output0"], **FIXTURE_TOL)


# ----------------------------------------------------------------------------- Swift-SRGAN

def test_swiftsrgan_unused_activations_are_frozen_but_kept() -> None:
    net, io = _case("swiftsrgan_x4")
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen == {"convblock.act.weight", "residual.0.block2.act.weight", "residual.1.block2.act.weight"}
    assert frozen <= set(net.state_dict())
    net.train()
    net(io["input0"]).mean().backward()
    assert all(p.grad is None for n, p in net.named_parameters() if n in frozen)


# ----------------------------------------------------------------------------- build errors

@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "DnCNN", "in_nc": 3, "out_nc": 1}, r"network_g\.in_nc: DnCNN subtracts .* use mode='FDnCNN'"),
    ({"type": "DnCNN", "nb": 1}, r"network_g\.nb: DnCNN needs at least 2 convolutions"),
    ({"type": "DnCNN", "act_mode": "BX"}, r"network_g\.act_mode: expected norm / activation letters"),
    ({"type": "DnCNN", "mode": "FFDNet"}, r"network_g\.mode: expected 'DnCNN' or 'FDnCNN'"),
    ({"type": "DRUNet", "nc": [8, 16, 32]}, r"network_g\.nc: expected the widths of the four U-Net levels"),
    ({"type": "DRUNet", "downsample_mode": "maxpool"}, r"network_g\.downsample_mode: the authors' 'maxpool'"),
    ({"type": "DRUNet", "upsample_mode": "bilinear"}, r"network_g\.upsample_mode: expected one of upconv"),
    ({"type": "FBCNN", "downsample_mode": "stride"}, r"network_g\.downsample_mode: expected one of avgpool"),
    ({"type": "FBCNN", "act_mode": "B"}, r"network_g\.act_mode: expected norm / activation letters"),
    ({"type": "SwiftSRGAN", "upscale_factor": 3}, r"network_g\.upscale_factor: SwiftSRGAN upsamples by factors"),
    ({"type": "UpCunet2x_fast", "pro": True}, r"network_g\.pro: unknown"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


# ----------------------------------------------------------------------------- ONNX

ONNX_NETS = {
    "DRUNet": "drunet_color", "FBCNN": "fbcnn_color", "DnCNN": "fdncnn_color", "SwiftSRGAN": "swiftsrgan_x4",
    "UpCunet2x": pytest.param("cugan_2x", marks=pytest.mark.slow),
}


@pytest.mark.parametrize("name", list(ONNX_NETS.values()), ids=list(ONNX_NETS))
def test_onnx_export_runs_at_unseen_sizes(name: str, tmp_path: Path) -> None:
    """``anysr export weights --to m.onnx``'s path (the network rebuilt from the file's metadata), then
    onnxruntime at a size the export never traced or checked."""
    net, io = _case(name)
    case = CASES[name]
    scale = io["output0"].shape[-1] // io["input0"].shape[-1]
    # not a size the export saw, not a multiple of 8; gray networks get gray input
    rep = check_onnx_at_unseen_size(net, {"type": case["type"], **case["kwargs"]}, scale, tmp_path, size=(37, 50),
                                    channels=input_channels(net))
    assert max(c.max_diff for c in rep.checks) < 1e-4


@pytest.mark.slow
def test_onnx_realcugan_fast_falls_back_to_a_fixed_size(tmp_path: Path) -> None:
    """Sides below 40 are grown by a size-dependent branch, which a traced graph cannot hold: fixed size."""
    pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net, _ = _case("cugan_2x_fast")
    rep = export_onnx(net, tmp_path / "fast.onnx", scale=2, size=48)
    assert rep.dynamic is False and rep.size == 48 and "dynamic sizes failed" in rep.note
    assert rep.checks[0].max_diff < 1e-4


# ----------------------------------------------------------------------------- inference through the CLI

@pytest.mark.slow
def test_cli_infer_feeds_drunet_rgb_images(tmp_path: Path) -> None:
    """``anysr infer`` sizes its inputs by the network's image channels (3: DRUNet appends the noise map)."""
    cv2 = pytest.importorskip("cv2")
    net, _ = _case("drunet_color")
    case = CASES["drunet_color"]
    src = ck.save_weights(tmp_path / "w.safetensors", {"params": _params("drunet_color")},
                          {"network_g": {"type": case["type"], **case["kwargs"]}, "scale": 1})
    rgb = torch.rand(1, 3, 21, 30, generator=torch.Generator().manual_seed(0))
    img = (rgb[0].permute(1, 2, 0).numpy()[..., ::-1] * 255).round().astype(np.uint8)
    cv2.imwrite(str(tmp_path / "in.png"), img)
    run_cli("infer", "--weights", str(src), "-i", str(tmp_path / "in.png"), "-o", str(tmp_path / "out"),
            "--precision", "fp32", cwd=tmp_path)
    out = cv2.imread(str(tmp_path / "out" / "in.png"))
    assert out.shape == (21, 30, 3)
    x = torch.from_numpy(img[..., ::-1].copy()).permute(2, 0, 1)[None].float() / 255
    with torch.no_grad():
        want = (net(x).clamp(0, 1) * 255).round()[0].permute(1, 2, 0).numpy()[..., ::-1]
    assert np.abs(out.astype(int) - want.astype(int)).max() <= 1


# ----------------------------------------------------------------------------- training through the CLI


# ----------------------------------------------------------------------------- XLA:CPU

XLA_NETS = {
    "UpCunet2x": ({"type": "UpCunet2x"}, (1, 3, 32, 32)),
    "UpCunet3x": ({"type": "UpCunet3x"}, (1, 3, 32, 32)),
    "UpCunet4x": ({"type": "UpCunet4x", "pro": True}, (1, 3, 32, 32)),
    "UpCunet2x_fast": ({"type": "UpCunet2x_fast"}, (1, 3, 40, 40)),
    "DRUNet": ({"type": "DRUNet", "in_nc": 4, "out_nc": 3, "nc": [4, 8, 8, 16], "nb": 1}, (1, 3, 12, 16)),
    "FBCNN": ({"type": "FBCNN", "nc": [4, 8, 8, 16], "nb": 1}, (2, 3, 12, 16)),
    "DnCNN": ({"type": "DnCNN", "in_nc": 4, "out_nc": 3, "nc": 8, "nb": 4, "act_mode": "BR", "mode": "FDnCNN"},
              (2, 3, 8, 8)),
    "SwiftSRGAN": ({"type": "SwiftSRGAN", "num_channels": 8, "num_blocks": 1, "upscale_factor": 2}, (2, 3, 8, 8)),
}


@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(XLA_NETS))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    opt, shape = XLA_NETS[arch]
    # Batch norm updates its running statistics in place; with the moved buffers made device data before the
    # first step (arch_checks), every step runs the first step's graph: one compile over three steps.
    compiles = check_xla_train_step(opt, shape, steps=3).compiles
    assert compiles == [compiles[0]] * 3, f"{arch}: {compiles}"

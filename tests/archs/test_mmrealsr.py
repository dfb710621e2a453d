"""MMRealSR (Mou et al., ECCV 2022; the authors' MMRRDBNet_test) against spandrel 0.4.2.

Fixtures come from spandrel 0.4.2 (``tools/fixtures/make_mmrealsr_fixtures.py``): the image and the estimated
degrees, with and without ``custom_degrees``, two and three degradations, sigmoid and tanh, RGB and gray, at x4
(the only scale the reference runs). The common checks (channels_last, bf16, the meta device, gradients, a training
run, 2 ranks = 1 process) are in tests/archs/test_standard.py; here: strict loading and parity (degrees too),
recognition, x2 / x1 through pixel unshuffle, the modulation, build errors, the published size, ONNX at unseen
sizes and XLA:CPU compile-once without CPU fallbacks (``-m xla``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from arch_checks import check_xla_train_step, load_case, manifest, stored_params
from conftest import FIXTURE_TOL

from anysr.archs import build_network
from anysr.archs.arch_util import pad_to_multiple, pixel_unshuffle
from anysr.archs.recognition.recognise import recognise
from anysr.errors import OptionError

CASES = sorted(manifest("mmrealsr")["cases"])
TINY = {"type": "MMRealSR", "num_feat": 8, "num_block": 1, "num_grow_ch": 4, "num_feats": [8, 16],
        "num_blocks": [1, 1], "downscales": [2, 1]}


@pytest.mark.parametrize("name", CASES)
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = manifest("mmrealsr")["cases"][name]
    params = stored_params("mmrealsr", name)
    net = build_network({"type": "MMRealSR", **case["kwargs"]})
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    net, io = load_case("mmrealsr", name)
    for j, (inp, out, _) in enumerate(case["compare"]):
        with torch.no_grad():
            got, degrees = net.forward_with_degrees(io[inp])
            image = net(io[inp])
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} differs from spandrel")
        torch.testing.assert_close(image, got, rtol=0, atol=0)
        torch.testing.assert_close(degrees, io[f"degrees{j}"], **FIXTURE_TOL, msg=f"{name} degrees differ")


@pytest.mark.parametrize("name", CASES)
def test_fixture_weights_are_recognised(name: str) -> None:
    params = stored_params("mmrealsr", name)
    found = recognise(params)
    assert found.opt["type"] == "MMRealSR"
    kwargs = manifest("mmrealsr")["cases"][name]["kwargs"]
    for key in ("num_in_ch", "num_out_ch", "scale", "num_feat", "num_block", "num_grow_ch", "num_feats",
                "num_blocks", "downscales"):
        assert found.opt[key] == kwargs[key], key
    with torch.device("meta"):
        layout = {k: v.shape for k, v in build_network(found.opt).state_dict().items()}
    assert layout == {k: v.shape for k, v in params.items()}


@pytest.mark.parametrize("scale", [2, 1])
def test_x2_and_x1_unshuffle_the_input_for_the_trunk_and_the_estimator(scale: int) -> None:
    torch.manual_seed(0)
    net = build_network({**TINY, "scale": scale}).eval()
    factor = 4 // scale
    assert net.tile_multiple == factor and net.de_net.conv_first[0].in_channels == 3 * factor**2
    recognised = recognise(net.state_dict()).opt
    assert (recognised["scale"], recognised["num_in_ch"]) == (scale, 3)
    x = torch.rand(2, 3, 13, 18)
    with torch.no_grad():
        out, degrees = net.forward_with_degrees(x)
        padded, _, _ = pad_to_multiple(x, factor)
        want_degrees = net.de_net(pixel_unshuffle(padded, factor))
        whole = net(padded)
    assert out.shape == (2, 3, 13 * scale, 18 * scale)
    torch.testing.assert_close(degrees, want_degrees, rtol=0, atol=0)
    torch.testing.assert_close(out, whole[..., : 13 * scale, : 18 * scale], rtol=0, atol=0)


def test_custom_degrees_steer_the_trunk_not_the_estimate() -> None:
    net, io = load_case("mmrealsr", "mmrealsr_x4")
    weights = net.state_dict()
    steered = build_network({"type": "MMRealSR", **manifest("mmrealsr")["cases"]["mmrealsr_x4"]["kwargs"],
                             "custom_degrees": [1.0, None]}).eval()
    steered.load_state_dict(weights)
    x = io["input1"]
    with torch.no_grad():
        free, d_free = net.forward_with_degrees(x)
        fixed, d_fixed = steered.forward_with_degrees(x)
    torch.testing.assert_close(d_free, d_fixed, rtol=0, atol=0)
    assert (fixed - free).abs().max() > 1e-4


def test_the_estimators_learn_unless_their_degree_is_given() -> None:
    """The image loss reaches every estimator through the modulation; one whose degree is given by hand gets a
    zero gradient (the estimate is still returned)."""
    given = ("de_net.conv_first.0.", "de_net.body.0.", "de_net.fc_degree.0.")
    for custom, frozen in ((None, ()), ([1.0, None], given)):
        torch.manual_seed(0)
        net = build_network({**TINY, "custom_degrees": custom}).train()
        net(torch.rand(2, 3, 12, 12)).square().mean().backward()
        for n, p in net.named_parameters():
            assert p.grad is not None and torch.isfinite(p.grad).all(), n
            assert (p.grad.abs().sum() == 0) == n.startswith(frozen), n


def test_published_size() -> None:
    with torch.device("meta"):
        net = build_network({"type": "mmrealsr", "scale": 4})
    # MMRealSRNet / MMRealSRGAN x4: ESRGAN's trunk (16.7 M), 23 modulations (7.1 M) and two estimators
    assert sum(p.numel() for p in net.parameters()) == 52_486_277
    assert net.scale == 4


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"scale": 3}, r"network_g\.scale: MMRealSR upscales x4 \(x2 / x1 through pixel unshuffle\), got 3"),
    ({"de_net_type": "DEUNet"}, r"network_g\.de_net_type: MMRealSR's degree estimator is 'DEResNet'"),
    ({"degradation_degree_actv": "relu"}, r"network_g\.degradation_degree_actv: one of sigmoid, tanh"),
    ({"num_blocks": [1]}, r"network_g\.num_feats: MMRealSR's estimator needs one num_feats, num_blocks"),
    ({"downscales": [4, 1]}, r"network_g\.downscales: each stage downscales by 1 or 2"),
    ({"custom_degrees": [0.5]}, r"network_g\.custom_degrees: one number or null per degradation \(2\)"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network({**TINY, **opt})


def test_onnx_runs_at_unseen_sizes(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx  # noqa: PLC0415

    net = build_network({**TINY, "scale": 2}).eval()
    rep = export_onnx(net, tmp_path / "m.onnx", scale=2, net_opt={**TINY, "scale": 2})
    assert rep.dynamic is True, rep.note
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for x in (torch.rand(1, 3, 13, 22), torch.rand(2, 3, 16, 16)):
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        with torch.no_grad():
            torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)


# MMRealSR, and ESRGAN's and SwinIR's nearest+conv heads: their nearest x2 upsampling ran its backward on the CPU
# under XLA (F.interpolate; now arch_util.nearest_upsample).
XLA_NETS = {
    "MMRealSR-x4": {**TINY, "scale": 4},
    "MMRealSR-x2": {**TINY, "scale": 2},
    "RRDBNet-x4": {"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1, "num_grow_ch": 4},
    "SwinIR-nearest": {"type": "SwinIR", "upscale": 4, "img_size": 16, "window_size": 4, "embed_dim": 8,
                       "depths": [1], "num_heads": [2], "mlp_ratio": 1.0, "upsampler": "nearest+conv"},
}


@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(XLA_NETS))
def test_xla_train_step_compiles_once(arch: str) -> None:
    check_xla_train_step(XLA_NETS[arch])

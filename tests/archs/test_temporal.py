"""traiNNer-redux's temporal networks (clip in, centre frame out): TemporalSPAN, TemporalSPANv2, TSCUNet, TFDAT.

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_temporal_fixtures.py``): the state dicts load
strictly and give its outputs (eval mode, sizes that need the networks' internal padding, and the training-mode
branches of the re-parameterised SPANs). The image-network checks of ``tests/archs/test_standard.py`` (channels_last
inputs, its image training runs) do not apply to 5-D clips; their equivalents are here: bf16 autocast, the meta
device, gradients, ONNX with a dynamic frame size, and an XLA:CPU train step that compiles once with no aten op left
to the CPU (``-m xla``). Training through the command line on a folder of frames: ``tests/test_trainner_video.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from arch_checks import check_bf16_autocast, check_finite_gradients, check_meta_device, check_xla_train_step
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "temporal"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
ARCHS = ["TemporalSPAN", "TemporalSPANv2", "TSCUNet", "TFDAT"]
ONE = {"TemporalSPAN": "temporalspan_x2_t3", "TemporalSPANv2": "temporalspanv2_x2_t3", "TSCUNet": "tscunet_x1_t3",
       "TFDAT": "tfdat_x4_t5"}
# TemporalSPAN's eval form folds each re-parameterised conv, and GroupNorm after it magnifies the fold's fp32
# rounding: the reference's own eval output is 1.3e-5 from the float64 result (measured), ours 6e-6 from it, so the
# two differ by up to 1.5e-5 (training form, no fold: equal bit for bit).
FOLD_TOL = {"rtol": 1e-4, "atol": 5e-5}

# Tiny x2 networks of each arch (gradients, ONNX, XLA)
TINY = {
    "TemporalSPAN": {"type": "TemporalSPAN", "num_frames": 3, "feature_channels": 8, "history_channels": 4,
                     "scale": 2},
    "TemporalSPANv2": {"type": "TemporalSPANv2", "num_frames": 3, "feature_channels": 8, "scale": 2},
    "TSCUNet": {"type": "TSCUNet", "clip_size": 3, "nb": 1, "dim": 64, "scale": 2},
    "TFDAT": {"type": "TFDAT", "clip_size": 3, "scale": 2, "embed_dim": 8, "num_groups": 1, "depth_per_group": 1,
              "num_heads": 2, "window_size": 4, "aim_reduction_ratio": 4, "flow_base_ch": 4, "mid_dim": 8},
}


def seeded_state(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """The fixture script's seeded parameters (same draw order, same generator)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for k in sorted(shapes):
        v = torch.randn(shapes[k], generator=gen)
        out[k] = 1 + 0.05 * v if k.endswith(".weight") and len(shapes[k]) == 1 else 0.02 * v
    return out


def _params(name: str, net: torch.nn.Module) -> dict[str, torch.Tensor]:
    case = MANIFEST[name]
    if case["seeded"] is not None:
        own = net.state_dict()
        return {**own, **seeded_state({k: tuple(v.shape) for k, v in own.items() if v.is_floating_point()},
                                      case["seeded"])}
    return {k: v.float() if v.is_floating_point() else v
            for k, v in load_file(str(FIXTURES / f"{name}_params.safetensors")).items()}


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The fixture network (eval mode, weights loaded strictly) and its inputs (float32) / outputs."""
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]})
    net.load_state_dict(_params(name, net), strict=True)
    io = {k: v.float() for k, v in load_file(str(FIXTURES / f"{name}_io.safetensors")).items()}
    return net.eval(), io


# ----------------------------------------------------------------------------- traiNNer-redux parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == set(ARCHS) == set(ONE)
    assert sum(p.stat().st_size for p in FIXTURES.iterdir()) < 1_000_000


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]})
    params = _params(name, net)
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}, \
        "state-dict keys or shapes differ from traiNNer-redux's"
    net.load_state_dict(params, strict=True)
    io = {k: v.float() for k, v in load_file(str(FIXTURES / f"{name}_io.safetensors")).items()}
    for inp, out, mode in case["compare"]:
        net.train(mode == "train")
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        tol = FOLD_TOL if case["type"] == "TemporalSPAN" and mode == "eval" else FIXTURE_TOL
        torch.testing.assert_close(got, io[out], **tol, msg=f"{name} {out} ({mode}) differs")


@pytest.mark.parametrize("name", ["temporalspan_x2_t3", "temporalspanv2_x2_t3"])
def test_span_eval_refolds_and_reparameterize_freezes_it(name: str) -> None:
    net, io = _case(name)
    with torch.no_grad():
        evaluated = net(io["input0"])
        net.reparameterize()
        torch.testing.assert_close(net(io["input0"]), evaluated, rtol=0, atol=0)
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen and all("eval_conv" in n for n in frozen)


@pytest.mark.parametrize("opt", [
    *({"type": c["type"], **c["kwargs"]} for c in MANIFEST.values()),
    {"type": "TSCUNet", "clip_size": 7, "nb": 3, "dim": 128, "scale": 8, "residual": False, "sigma": True},
    {"type": "TemporalSPANv2", "num_frames": 7, "feature_channels": 16, "scale": 3, "num_blocks": 8},
    {"type": "TFDAT", "scale": 1, "embed_dim": 16, "num_groups": 1, "depth_per_group": 2, "num_heads": 2,
     "group_block_pattern": ["channel"], "upsampler_type": "pa_up", "mid_dim": 8},
    {"type": "TFDAT", "scale": 3, "embed_dim": 12, "num_groups": 2, "depth_per_group": 1, "num_heads": 3,
     "window_size": 4, "aim_reduction_ratio": 4, "upsampler_type": "pixelshuffle", "mid_dim": 8, "flow_base_ch": 8},
], ids=lambda o: f"{o['type']}-{len(o)}-{o.get('scale')}")
def test_recognised_from_names_and_shapes(opt: dict) -> None:
    with torch.device("meta"):
        layout = {k: v.shape for k, v in build_network(dict(opt)).state_dict().items()}
        found = recognise(build_network(dict(opt)).state_dict())
        assert found.opt["type"] == opt["type"]
        assert {k: v.shape for k, v in build_network(dict(found.opt)).state_dict().items()} == layout


# ----------------------------------------------------------------------------- the checks every arch gets

@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a == "TSCUNet" else a for a in ARCHS])
def test_bf16_autocast_stays_close(arch: str) -> None:
    """(TSCUNet in -m slow: its eval form pads to at least 128x128 and runs a 64-channel U-Net there.)"""
    net, io = _case(ONE[arch])
    check_bf16_autocast(net, io["input0"], io["output0"])


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_creates_no_tensor_off_the_input_device(arch: str) -> None:
    net, io = _case(ONE[arch])
    check_meta_device(net, io["input0"].shape, io["output0"].shape)


@pytest.mark.parametrize("arch", ARCHS)
def test_training_step_gives_finite_gradients(arch: str) -> None:
    net = build_network(TINY[arch])
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    x = torch.rand(1 if arch == "TSCUNet" else 2, 3, 3, 16, 12)
    check_finite_gradients(net, x, frozen=frozen, no_drop_path=True)


@pytest.mark.slow
def test_tscunet_training_noise_and_sigma_head() -> None:
    """In training the swin-conv blocks add noise (the original's; eval is deterministic: the fixture matches); the
    sigma head gives (image, sigma)."""
    net = build_network({**TINY["TSCUNet"], "sigma": True, "scale": 1}).train()
    x = torch.rand(1, 3, 3, 16, 16)
    with torch.no_grad():
        a, sigma = net(x)
        b, _ = net(x)
    assert a.shape == sigma.shape == (1, 3, 16, 16) and not torch.equal(a, b)


def test_temporalspanv2_extra_blocks_are_frozen() -> None:
    net = build_network({**TINY["TemporalSPANv2"], "num_blocks": 7})
    assert {n.split(".c")[0] for n, p in net.named_parameters() if not p.requires_grad and "eval_conv" not in n} \
        == {"m_layers.0.blocks.6"}


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "TemporalSPAN", "num_frames": 4}, r"network_g\.num_frames: TemporalSPAN predicts the centre frame"),
    ({"type": "TemporalSPAN", "feature_channels": 12}, r"network_g\.feature_channels: .*multiple of 8"),
    ({"type": "TemporalSPANv2", "num_blocks": 4}, r"network_g\.num_blocks: .*num_blocks >= 6"),
    ({"type": "TemporalSPANv2", "num_in_ch": 1}, r"network_g\.num_in_ch: .*must be 3"),
    ({"type": "TSCUNet", "dim": 48}, r"network_g\.dim: TSCUNet needs dim to be a positive multiple of 64"),
    ({"type": "TSCUNet", "scale": 3}, r"network_g\.scale: TSCUNet upsamples by nearest x2 steps"),
    ({"type": "TSCUNet", "clip_size": 4}, r"network_g\.clip_size: TSCUNet needs an odd clip_size"),
    ({"type": "TSCUNet", "state": {"a": 1}}, r"network_g\.state: TSCUNet builds from its arguments"),
    ({"type": "TFDAT", "group_block_pattern": ["local"]}, r"network_g\.group_block_pattern: TFDAT's blocks"),
    ({"type": "TFDAT", "clip_size": 2}, r"network_g\.clip_size: TFDAT predicts the centre frame"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


@pytest.mark.parametrize("arch", ["TemporalSPAN", "TemporalSPANv2", "TSCUNet"])
def test_wrong_clip_is_refused_in_one_line(arch: str) -> None:
    net = build_network(TINY[arch]).eval()
    with pytest.raises(ValueError, match=r"built for 3-frame clips, got 5 frames"):
        net(torch.rand(1, 5, 3, 8, 8))
    with pytest.raises(ValueError, match=r"takes clips \(b, t, c, h, w\), got a 4-D input"):
        net(torch.rand(1, 3, 8, 8))


COUNTS = {"temporalspan": 2_597_544, "temporalspanv2": 5_535_360, "tscunet": 29_193_624, "tfdat": 4_288_984}


def test_published_sizes() -> None:
    """Parameter counts of traiNNer-redux's builders at their defaults (x4; counted with traiNNer-redux's classes)."""
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network(opt).parameters())

    assert count({"type": "temporalspan", "scale": 4}) == COUNTS["temporalspan"]
    assert count({"type": "temporalspanv2", "scale": 4}) == COUNTS["temporalspanv2"]
    assert count({"type": "tscunet", "scale": 4}) == COUNTS["tscunet"]
    assert count({"type": "tfdat", "scale": 4}) == COUNTS["tfdat"]


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", ["TemporalSPAN", "TemporalSPANv2", "TFDAT"])
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    import inspect

    torch.manual_seed(0)
    net = build_network(TINY[arch]).eval()
    if hasattr(net, "reparameterize"):
        net.reparameterize()
    kwargs: dict = {"input_names": ["input"], "output_names": ["output"], "opset_version": 17,
                    "dynamic_axes": {"input": {0: "b", 3: "h", 4: "w"}, "output": {0: "b", 2: "H", 3: "W"}}}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    path = tmp_path / "m.onnx"
    with torch.no_grad():
        # TFDAT: traced at a size its bottom / right padding reaches (so the graph pads; by 0 where none is needed)
        torch.onnx.export(net, (torch.rand(1, 3, 3, *((14, 10) if arch == "TFDAT" else (16, 16))),), str(path),
                          **kwargs)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = torch.rand(1, 3, 3, 45, 38)  # not the traced size, not a multiple of any padding
    got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
    with torch.no_grad():
        want = net(x)
    assert got.shape == want.shape == (1, 3, 90, 76)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
@pytest.mark.parametrize("arch", ARCHS)
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    # a clip of three 16x16 frames; TSCUNet's blocks add noise in training, so its two losses differ
    run = check_xla_train_step(TINY[arch], (1, 3, 3, 16, 16), scale=2, same_loss=arch != "TSCUNet")
    with torch.no_grad():
        assert run.net(run.x).shape == (1, 3, 32, 32)  # the shape only: nothing runs

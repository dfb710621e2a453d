"""Lightweight SR architectures MoSR, SeemoRe, DITN, SAFMNBCIE, MoESR and DCTLSA.

Fixtures come from spandrel 0.4.2 (``tools/fixtures/make_lightweight_fixtures.py``): the state dicts load strictly
and give spandrel's outputs, also for sizes that need padding. Also: ONNX export (onnxruntime on a size the export
never saw), build errors, and one XLA:CPU compile-once / no-CPU-fallback check per architecture (``-m xla`` in the
XLA venv). The checks every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training
runs, 2 gloo ranks == 1 process) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from arch_checks import check_xla_train_step, load_case, manifest
from conftest import FIXTURE_TOL

from anysr.archs import build_network
from anysr.errors import OptionError

GROUP = "lightweight"
MANIFEST = manifest(GROUP)["cases"]


def _scale(net: torch.nn.Module) -> int:
    s = getattr(net, "scale", None)
    return s if isinstance(s, int) else net.upscale


# ----------------------------------------------------------------------------- spandrel parity

@pytest.mark.parametrize(("name", "inp", "why"), [
    ("seemore_x2", "input1", "17x18: not a multiple of 16: runs unpadded, the strided pooling drops the rest"),
    ("seemore_x2", "input2", "9x6: grown to the 16-pixel minimum of two 4x poolings, cropped"),
    ("seemore_x4_exp_top2", "input1", "3x5: grown to the 4-pixel minimum of one 4x pooling, cropped"),
    ("ditn_x4", "input1", "13x10: padded to a multiple of 8 inside forward, cropped"),
    ("ditn_x4", "input2", "3x2: reflect, then edge padding to 8, cropped"),
    ("ditn_x2_bias_p4", "input1", "11x9: padded to 16x16, folded into 4x4 patches"),
    ("safmnbcie_f2", "input1", "19x23: padded to even sides for the pixel unshuffle"),
    ("safmnbcie_f2", "input2", "7x9: grown to the 16-pixel minimum (8 after unshuffling)"),
    ("safmnbcie_f1", "input1", "5x9: grown to 8"),
    ("moesr_x4_psdirect", "input1", "7x5: odd sides padded by one for the half-resolution gate"),
    ("moesr_x2_ps", "input1", "5x1: a 1-pixel side replicated"),
    ("dctlsa_x2", "input1", "17x18: every layer pads to the 16-pixel window and crops"),
    ("dctlsa_x2", "input2", "9x6: grown to 16 first"),
])
def test_padded_inputs_match_reference(name: str, inp: str, why: str) -> None:
    net, io = load_case(GROUP, name)
    x = io[inp]
    assert x.shape[-2] % net.tile_multiple or x.shape[-1] % net.tile_multiple, why
    with torch.no_grad():
        got = net(x)
    s = _scale(net)
    assert got.shape[-2:] == (x.shape[-2] * s, x.shape[-1] * s)
    torch.testing.assert_close(got, io[inp.replace("input", "output")], **FIXTURE_TOL, msg=why)


def test_tile_multiples() -> None:
    assert build_network({"type": "MoSR", "dim": 8, "n_block": 1}).tile_multiple == 1
    assert build_network({"type": "SeemoRe", "embedding_dim": 8, "num_layers": 1}).tile_multiple == 16
    assert build_network({"type": "SeemoRe", "embedding_dim": 8, "num_layers": 1, "recursive": 1}).tile_multiple == 4
    assert build_network({"type": "DITN", "dim": 8, "ITL_blocks": 1, "SAL_blocks": 1}).tile_multiple == 8
    assert build_network({"type": "SAFMNBCIE", "dim": 8, "n_blocks": 1, "num_layers": 1}).tile_multiple == 16
    assert build_network({"type": "SAFMNBCIE", "dim": 8, "n_blocks": 1, "num_layers": 1,
                          "upscaling_factor": 4}).tile_multiple == 32
    assert build_network({"type": "MoESR", "dim": 8, "n_blocks": 1, "n_block": 1}).tile_multiple == 2
    assert build_network({"type": "DCTLSA", "nf": 8, "num_head": 2}).tile_multiple == 16


# ----------------------------------------------------------------------------- SeemoRe's experts

@pytest.mark.parametrize("name", ["seemore_x2", "seemore_x4_exp_top2"])
def test_seemore_train_mode_equals_eval_mode(name: str) -> None:
    """The original runs only the chosen experts in eval mode and all (weighted 0 when unchosen) in training."""
    net, io = load_case(GROUP, name)
    with torch.no_grad():
        trained = net.train()(io["input0"])
    torch.testing.assert_close(trained, io["output0"], **FIXTURE_TOL)


def test_seemore_unchosen_experts_do_not_count() -> None:
    net, io = load_case(GROUP, "seemore_x2")  # topk 1 of 3
    moe = net.body[0].local_block.block.moe_layer
    x = torch.rand(1, 8, 6, 7)
    k = torch.rand(1, 8, 6, 7)
    with torch.no_grad():
        probs = torch.softmax(moe.gate(x), dim=1)
        best = int(probs.argmax())
        ref = x + moe.experts[best](x, k) * probs[0, best]
        torch.testing.assert_close(moe(x, k), ref, rtol=1e-5, atol=1e-6)
        for i, expert in enumerate(moe.experts):
            if i != best:
                expert.conv_3.bias.add_(100.0)  # an unchosen expert's weights change nothing
        torch.testing.assert_close(moe(x, k), ref, rtol=1e-5, atol=1e-6)


def test_seemore_low_rank_spaces() -> None:
    def ranks(space: str) -> list[int]:
        net = build_network({"type": "SeemoRe", "embedding_dim": 8, "num_layers": 1, "num_experts": 4,
                             "lr_space": space})
        return [e.conv_1.out_channels for e in net.body[0].local_block.block.moe_layer.experts]
    assert ranks("linear") == [2, 3, 4, 5] and ranks("exp") == [2, 4, 8, 16] and ranks("double") == [2, 4, 6, 8]


# ----------------------------------------------------------------------------- variants

def test_variants_differ_in_keys() -> None:
    def keys(opt: dict) -> set[str]:
        return set(build_network(opt).state_dict())
    mosr = {"type": "MoSR", "dim": 8, "n_block": 1}
    assert "upsampler.0.weight" in keys(mosr)
    assert "upsampler.in_to_k.weight" in keys({**mosr, "upsampler": "gps"})
    assert {"upsampler.init_pos", "upsampler.offset.weight", "upsampler.end_conv.weight"} <= keys(
        {**mosr, "upsampler": "dys"})
    moesr = {"type": "MoESR", "dim": 8, "n_blocks": 1, "n_block": 1}
    assert "upscale.MetaUpsample" in keys(moesr) and "upscale.1.weight" not in keys(moesr)
    assert "upscale.4.weight" in keys({**moesr, "upsampler": "pixelshuffle", "scale": 2})
    meta = build_network({**moesr, "upsampler": "nearest+conv", "scale": 3, "out_ch": 1}).upscale.MetaUpsample
    assert meta.dtype == torch.uint8 and meta.tolist() == [1, 3, 3, 8, 1, 64, 4]
    ditn = {"type": "DITN", "dim": 8, "ITL_blocks": 1, "SAL_blocks": 1}
    assert "UFONE.0.ITLs.0.attn.project_out.bias" not in keys(ditn)
    assert "UFONE.0.ITLs.0.attn.project_out.bias" in keys({**ditn, "bias": True})
    dct = keys({"type": "DCTLSA", "nf": 8, "num_head": 2})
    assert "B6.body.1.transformer_body.0.blocks.1.attn.local.pointwise_prenorm_1.running_var" in dct


# ----------------------------------------------------------------------------- build errors

@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "MoSR", "upsampler": "bilinear"}, r"network_g\.upsampler: MoSR knows the upsamplers"),
    ({"type": "MoSR", "upscale": 0}, r"network_g\.upscale: MoSR needs an integer upscale >= 1"),
    ({"type": "MoSR", "dim": 6, "upsampler": "dys"}, r"network_g\.dim: MoSR's DySample head needs dim"),
    ({"type": "MoSR", "conv_ratio": 2.0}, r"network_g\.conv_ratio: MoSR: int\(conv_ratio \* dim\) = 128"),
    ({"type": "SeemoRe", "in_chans": 1}, r"network_g\.in_chans: SeemoRe subtracts an RGB mean"),
    ({"type": "SeemoRe", "lr_space": "log"}, r"network_g\.lr_space: SeemoRe knows the lr_space values"),
    ({"type": "SeemoRe", "num_experts": 2, "topk": 3}, r"network_g\.topk: SeemoRe needs 1 <= topk <= num_experts"),
    ({"type": "SeemoRe", "recursive": 0}, r"network_g\.recursive: SeemoRe needs an integer recursive >= 1"),
    ({"type": "DITN", "patch_size": 6}, r"network_g\.patch_size: DITN pads its input to a multiple of 8"),
    ({"type": "DITN", "upscale": 1.5}, r"network_g\.upscale: DITN needs an integer upscale"),
    ({"type": "SAFMNBCIE", "dim": 30}, r"network_g\.dim: SAFMNBCIE needs dim to be a multiple of 4"),
    ({"type": "SAFMNBCIE"}, r"network_g\.dim: required argument of SAFMNBCIE is missing"),
    ({"type": "SAFMNBCIE", "dim": 8, "upscaling_factor": 0}, r"network_g\.upscaling_factor: SAFMNBCIE needs"),
    ({"type": "MoESR", "upsampler": "pixelshuffle", "scale": 5}, r"network_g\.scale: MoESR's pixelshuffle head"),
    ({"type": "MoESR", "dim": 4}, r"network_g\.dim: MoESR needs dim to be a multiple of 4 \(at least 8"),
    ({"type": "MoESR", "upsampler": "ps"}, r"network_g\.upsampler: MoESR knows the upsamplers"),
    ({"type": "DCTLSA", "num_modules": 4}, r"network_g\.num_modules: DCTLSA always has 6 blocks"),
    ({"type": "DCTLSA", "nf": 8, "num_head": 3}, r"network_g\.num_head: DCTLSA needs nf \(8\) to be a multiple"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


# ----------------------------------------------------------------------------- ONNX

# Two cheap ones always; the others (2-15 s to trace and check each) with the slow tests.
ONNX_DYNAMIC = ["mosr_x2_gps_half", "ditn_x2_bias_p4"] + [
    pytest.param(name, marks=pytest.mark.slow) for name in ("mosr_x3_dys", "seemore_x4_exp_top2", "moesr_x4_dys",
                                                             "dctlsa_x2")]


@pytest.mark.parametrize("name", ONNX_DYNAMIC)
def test_onnx_export_has_dynamic_sizes(name: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net, _ = load_case(GROUP, name)
    case = MANIFEST[name]
    rep = export_onnx(net, tmp_path / "m.onnx", scale=_scale(net), net_opt={"type": case["type"], **case["kwargs"]},
                      size=32)
    assert rep.dynamic is True and max(c.max_diff for c in rep.checks) < 1e-4, rep.note
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.rand(1, net_in(net), 21, 26)  # a size the export never saw, off every tile multiple
    got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
    with torch.no_grad():
        torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)


def net_in(net: torch.nn.Module) -> int:
    from anysr.archs.arch_util import input_channels
    return input_channels(net) or 3


def test_onnx_safmnbcie_falls_back_to_a_fixed_size(tmp_path: Path) -> None:
    """The pooling pyramid (adaptive max pooling to sizes computed from the input) has no dynamic ONNX form, as
    for SAFMN: the export is for one size, which onnxruntime runs as PyTorch does."""
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net, _ = load_case(GROUP, "safmnbcie_f2")
    rep = export_onnx(net, tmp_path / "m.onnx", scale=1, size=40)
    assert rep.dynamic is False and rep.size == 48 and "adaptive pooling" in rep.note
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.rand(1, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(session.run(None, {"input": x.numpy()})[0]), net(x),
                                   rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- CLI training

TRAIN_NETS = {
    "MoSR": {"type": "MoSR", "dim": 8, "n_block": 1, "upscale": 2, "kernel_size": 5},
    "SeemoRe": {"type": "SeemoRe", "scale": 2, "embedding_dim": 8, "num_layers": 1, "num_experts": 2,
                "global_kernel_size": 5},
    "DITN": {"type": "DITN", "dim": 8, "ITL_blocks": 1, "SAL_blocks": 1, "upscale": 2},
    "SAFMNBCIE": {"type": "SAFMNBCIE", "dim": 8, "n_blocks": 1, "num_layers": 1, "upscaling_factor": 2},
    "MoESR": {"type": "MoESR", "dim": 8, "n_blocks": 1, "n_block": 1, "scale": 2},
    "DCTLSA": {"type": "DCTLSA", "nf": 8, "num_head": 2, "upscale": 2},
}


# ----------------------------------------------------------------------------- XLA:CPU

# DySample heads (MoSR "dys", MoESR "dysample") are left out: F.grid_sample and its backward run on the CPU
# under XLA (aten::grid_sampler_2d fallback; RealPLKSR's DySample is the same module).
XLA_NETS = {
    "MoSR": ({**TRAIN_NETS["MoSR"], "upsampler": "gps"}, (1, 3, 8, 8)),
    "SeemoRe": ({**TRAIN_NETS["SeemoRe"], "topk": 1}, (2, 3, 16, 16)),
    "DITN": (TRAIN_NETS["DITN"], (1, 3, 16, 8)),
    "SAFMNBCIE": (TRAIN_NETS["SAFMNBCIE"], (1, 3, 16, 16)),
    "MoESR": ({**TRAIN_NETS["MoESR"], "upsampler": "pixelshuffle", "upsample_dim": 8}, (1, 3, 8, 8)),
    "MoESR-nearest": ({**TRAIN_NETS["MoESR"], "upsampler": "nearest+conv", "scale": 3}, (1, 3, 6, 8)),
    "DCTLSA": (TRAIN_NETS["DCTLSA"], (1, 3, 16, 16)),
}


@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(XLA_NETS))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    check_xla_train_step(*XLA_NETS[arch])

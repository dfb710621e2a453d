"""traiNNer-redux's ESCRealM (ESC-Real, choice of heads), LKFMixer, Sebica, EIMN, MoSRv2; its MoESR2 = anysr's MoESR.

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_escmix_fixtures.py``): the state dicts load
strictly and give its outputs (eval mode, sizes that need the window / unshuffle / multiple-of-8 padding, batches
in the training-mode path, batch-norm batch statistics).
Also: ONNX through anysr's exporter, and per architecture an XLA:CPU train step
that compiles once with no aten op left to the CPU (``-m xla``).
The checks every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs,
2 gloo ranks == 1 process) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.escreal_arch import WindowAttention, dihedral_mean
from anysr.archs.lkfmixer_arch import bilinear_resize
from anysr.archs.moesr_arch import MoESR
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "escmix"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
ONE = "escrealm_x4"
ONE_PER_ARCH = [ONE, "lkfmixer_x4", "sebica_x4", "eimn_x2", "mosrv2_x4_ln"]

TINY = {"ESCRealM": {"type": "ESCRealM", "dim": 8, "pdim": 4, "kernel_size": 5, "n_blocks": 1, "conv_blocks": 1,
                     "window_size": 4, "num_heads": 2, "scale": 2, "mid_dim": 8},
        "LKFMixer": {"type": "LKFMixer", "in_channels": 3, "channels": 8, "out_channels": 3, "upscale": 2,
                     "num_block": 1, "large_kernel": 7, "split_factor": 0.25},
        "Sebica": {"type": "Sebica", "scale": 2, "N": 4},
        "EIMN": {"type": "EIMN", "embed_dims": 8, "scale": 2, "num_stages": 2, "mlp_ratios": 2.0},
        "MoSRv2": {"type": "MoSRv2", "dim": 8, "n_block": 1, "scale": 2, "mid_dim": 8, "rms_norm": True}}


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The fixture network (eval mode, weights loaded strictly) and its inputs / outputs."""
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]}).eval()
    net.load_state_dict(load_file(str(FIXTURES / f"{name}_params.safetensors")), strict=True)
    return net, load_file(str(FIXTURES / f"{name}_io.safetensors"))


# ----------------------------------------------------------------------------- traiNNer-redux parity

@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    params = load_file(str(FIXTURES / f"{name}_params.safetensors"))
    net = build_network({"type": case["type"], **case["kwargs"]})
    assert set(net.state_dict()) == set(params), "state-dict keys differ from traiNNer-redux's"
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    # the head record is rebuilt from the arguments; it must be what traiNNer-redux stores
    meta = [k for k in params if k.endswith("MetaUpsample")]
    assert len(meta) == (case["type"] in ("ESCRealM", "MoESR2", "MoSRv2"))
    assert all(torch.equal(net.state_dict()[k], params[k]) for k in meta)
    net.load_state_dict(params, strict=True)
    io = load_file(str(FIXTURES / f"{name}_io.safetensors"))
    for inp, out, mode in case["compare"]:
        net.train(mode == "train")
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        # A training-mode pass normalises by the batch's own statistics: rounding grows with the output's scale
        # (Sebica x2 reaches 8; with one thread and AVX2 kernels one value was 1.6e-5 off), so absolute error
        # is measured against that scale.
        tol = FIXTURE_TOL if mode == "eval" else {
            "rtol": FIXTURE_TOL["rtol"], "atol": FIXTURE_TOL["atol"] * max(1.0, float(io[out].abs().max()))}
        torch.testing.assert_close(got, io[out], **tol, msg=f"{name} {out} ({mode}) differs")


def test_moesr2_is_moesr() -> None:
    from anysr.archs import ARCH_REGISTRY

    assert ARCH_REGISTRY.get("MoESR2") is MoESR and ARCH_REGISTRY.get("moesr2") is MoESR
    assert {MANIFEST[n]["type"] for n in MANIFEST if n.startswith("moesr2")} == {"MoESR2"}


@pytest.mark.parametrize(("name", "inp", "why"), [
    ("escrealm_x4", "input1", "9x7: reflect-padded to the 4-pixel window inside each attention, cropped"),
    ("escrealm_x2_unshuffle_ps", "input1", "9x7: padded to the unshuffle factor 2, then to the window"),
    ("escrealm_x1_unshuffle_psd", "input1", "17x18: padded to the unshuffle factor 4, then to the window 2"),
    ("escrealm_x3_nearest", "input1", "6x7: window padding at x3"),
    ("lkfmixer_x4", "input1", "13x10: reflect-padded to a multiple of 8, cropped"),
    ("lkfmixer_x3", "input1", "11x7: reflect-padded to a multiple of 8, cropped"),
    ("mosrv2_x2_unshuffle_rms_ps", "input1", "7x9: reflect-padded to the unshuffle factor 2, cropped"),
    ("mosrv2_x1_unshuffle_tc", "input1", "10x6: reflect-padded to the unshuffle factor 4, cropped"),
])
def test_padded_inputs_match_reference(name: str, inp: str, why: str) -> None:
    net, io = _case(name)
    x = io[inp]
    assert x.shape[-2] % net.tile_multiple or x.shape[-1] % net.tile_multiple, why
    with torch.no_grad():
        got = net(x)
    torch.testing.assert_close(got, io[inp.replace("input", "output")], **FIXTURE_TOL, msg=why)


def test_tiny_inputs_run() -> None:
    """Below traiNNer-redux's limits (its reflect pads need more pixels than the pad): grown, then cropped."""
    net, _ = _case("escrealm_x2_unshuffle_ps")
    with torch.no_grad():
        assert net(torch.rand(1, 3, 1, 3)).shape == (1, 3, 2, 6)
        assert net(torch.rand(1, 3, 5, 2)).shape == (1, 3, 10, 4)


def test_tile_multiples() -> None:
    assert build_network(TINY["ESCRealM"]).tile_multiple == 4
    assert build_network({**TINY["ESCRealM"], "unshuffle_mod": True}).tile_multiple == 8  # unshuffle 2 x window 4
    assert build_network({**TINY["ESCRealM"], "unshuffle_mod": True, "scale": 4}).tile_multiple == 4  # no unshuffle
    assert build_network(TINY["LKFMixer"]).tile_multiple == 8
    assert build_network(TINY["Sebica"]).tile_multiple == 1
    assert build_network(TINY["EIMN"]).tile_multiple == 1
    assert build_network(TINY["MoSRv2"]).tile_multiple == 2
    assert build_network({**TINY["MoSRv2"], "unshuffle_mod": False}).tile_multiple == 1


@pytest.mark.parametrize("name", ONE_PER_ARCH)
def test_batch_entries_are_independent(name: str) -> None:
    """ESCRealM predicts kernels per image, the others pool per image: image i must only see its own."""
    net, io = _case(name)
    x = next(v for k, v in sorted(io.items()) if k.startswith("input") and v.shape[0] == 2)  # two images
    with torch.no_grad():
        both = net(x)
        torch.testing.assert_close(both[1:], net(x[1:]), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(both[:1], net(x[:1]), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- pieces

def test_dihedral_mean_is_invariant_under_flips_and_rotations() -> None:
    k = torch.randn(2, 3, 5, 5)
    m = dihedral_mean(k)
    for t in (m.flip(-1), m.flip(-2), m.transpose(-1, -2), torch.rot90(m, 1, (-2, -1))):
        torch.testing.assert_close(t, m)
    assert not torch.allclose(m, k)
    sym = dihedral_mean(m)
    torch.testing.assert_close(sym, m)


def test_window_attention_bias_is_relative() -> None:
    """A bias table that is non-zero only at offset (0, +1) adds its value exactly to the right neighbour."""
    attn = WindowAttention(4, 3, 1)
    idx = attn.rpe_index
    ws = 3
    # query (1, 1) -> key (1, 2): dh = 0, dw = +1
    assert idx[1 * ws + 1, 1 * ws + 2] == (0 + ws - 1) * (2 * ws - 1) + (1 + ws - 1)
    assert idx.diagonal().unique().tolist() == [(ws - 1) * (2 * ws - 1) + ws - 1]


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"upsampler": "dysample"}, r"network_g\.upsampler: ESCRealM: upsampler 'dysample' \(not implemented"),
    ({"upsampler": "bogus"}, r"network_g\.upsampler: ESCRealM: upsampler 'bogus'; use one of"),
    ({"attn_type": "Fast"}, r"network_g\.attn_type: ESCRealM: attn_type 'Fast'"),
    ({"kernel_size": 4}, r"network_g\.kernel_size: ESCRealM needs an odd kernel_size"),
    ({"pdim": 9}, r"network_g\.pdim: ESCRealM needs 2 <= pdim <= dim"),
    ({"num_heads": 3}, r"network_g\.num_heads: ESCRealM: dim \(8\) must be a multiple of num_heads"),
    ({"scale": 8, "upsampler": "transpose+conv"}, r"network_g\.scale: ESCRealM's transpose\+conv head"),
    ({"scale": 5, "upsampler": "pixelshuffle"}, r"network_g\.scale: ESCRealM's pixelshuffle head"),
    ({"scale": 0}, r"network_g\.scale: ESCRealM needs an integer scale >= 1"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network({**TINY["ESCRealM"], **opt})


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"large_kernel": 8}, r"network_g\.large_kernel: LKFMixer needs an odd large_kernel"),
    ({"split_factor": 0.1}, r"network_g\.split_factor: LKFMixer: split_factor 0\.1 leaves no channel"),
    ({"channels": 9}, r"network_g\.channels: LKFMixer needs an even number of channels"),
    ({"upscale": 1.5}, r"network_g\.upscale: LKFMixer needs an integer upscale"),
])
def test_lkfmixer_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network({**TINY["LKFMixer"], **opt})


def test_published_sizes() -> None:
    """Parameter counts of published configurations (x4; traiNNer-redux's defaults / builders, counted here)."""
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network(opt).parameters())

    assert count({"type": "ESCRealM"}) == 2_221_551
    assert count({"type": "escrealm_xl"}) == 13_029_763
    assert count({"type": "lkfmixer_t"}) == 207_008
    assert count({"type": "lkfmixer_b"}) == 372_816
    assert count({"type": "lkfmixer_l"}) == 927_152
    assert count({"type": "Sebica"}) == 40_896
    assert count({"type": "sebica_mini"}) == 11_568
    assert count({"type": "eimn_l"}) == 981_724  # x2, as the builders default
    assert count({"type": "eimn_a"}) == 860_098
    assert count({"type": "MoSRv2"}) == 4_179_888  # traiNNer-redux's defaults (x4, 24 blocks)


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", sorted(TINY))
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = build_network(TINY[arch])
    check_onnx_at_unseen_size(net, TINY[arch], 2, tmp_path, size=(23, 30))  # not a window multiple


# ----------------------------------------------------------------------------- real training runs (CLI)


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(TINY))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    # window / multiple-of-8 padding inside, batch of two. Sebica's / EIMN's batch norms: torch_xla compiles a plain
    # nn.BatchNorm2d twice (num_batches_tracked starts as a constant, then is step output), then never again: 3 steps,
    # nothing new after the second.
    check_xla_train_step(TINY[arch], (2, 3, 10, 9), scale=2, steps=3 if arch in ("Sebica", "EIMN") else 2)


@pytest.mark.parametrize(("size", "out"), [((1, 2), (8, 16)), ((3, 5), (24, 40)), ((4, 4), (7, 13)), ((5, 3), (2, 3))])
def test_bilinear_resize_is_interpolate(size: tuple[int, int], out: tuple[int, int]) -> None:
    x = torch.randn(2, 3, *size)
    ref = F.interpolate(x, size=out, mode="bilinear", align_corners=False)
    torch.testing.assert_close(bilinear_resize(x, *out), ref, rtol=1e-5, atol=1e-6)


def test_sebica_channel_weight_is_one_number_per_image() -> None:
    """The reference pools its (B, 1, C) channel means over the channels: a weight shared by all channels."""
    net, _ = _case("sebica_x2")
    csa = net.body[0].attn
    x = torch.randn(2, 4, 5, 6)
    with torch.no_grad():
        out = csa(x)
        spatial = csa.spatial_attention(torch.cat((x.mean(1, keepdim=True), x.amax(1, keepdim=True)), 1))
        ratio = out / (x * spatial)
    assert torch.allclose(ratio, ratio[:, :1, :1, :1].expand_as(ratio), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(ratio[0, 0, 0, 0], ratio[1, 0, 0, 0])


def test_eimn_freeze_param_trains_the_tail_only() -> None:
    net = build_network({**TINY["EIMN"], "freeze_param": True})
    trained = {n for n, p in net.named_parameters() if p.requires_grad}
    assert trained == {"tail.0.weight", "tail.0.bias"}
    with pytest.raises(OptionError, match=r"network_g\.embed_dims: EIMN needs embed_dims to be a multiple of 8"):
        build_network({**TINY["EIMN"], "embed_dims": 12})


def test_mosrv2_is_not_mosr() -> None:
    """traiNNer-redux's MoSRv2 is a network of its own: anysr's MoSR (spandrel's MoSR) has other keys."""
    v2 = set(build_network(TINY["MoSRv2"]).state_dict())
    v1 = set(build_network({"type": "MoSR", "dim": 8, "n_block": 1, "upscale": 2}).state_dict())
    assert "to_img.MetaUpsample" in v2 and not v1 & v2


def test_lkfmixer_bf16_channels_last_step_ends() -> None:
    """oneDNN generated its kernel for LKFMixer's 1x31 depth-wise conv on bf16 channels_last input for minutes (on
    AVX-512 CPUs, torch 2.13): training LKFMixer-B at precision auto did not get past its first step. A step under
    bf16 autocast in channels_last now ends within seconds (a minute's limit here)."""
    code = ("import torch\n"
            "from anysr.archs import build_network\n"
            "net = build_network({'type': 'lkfmixer_b', 'scale': 4}).to(memory_format=torch.channels_last)\n"
            "x = torch.rand(1, 3, 32, 32).to(memory_format=torch.channels_last)\n"
            "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
            "    y = net(x)\n"
            "y.float().mean().backward()\n"
            "assert y.shape == (1, 3, 128, 128) and torch.isfinite(y.float()).all()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]

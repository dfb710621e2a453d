"""HiT-SR's HiT_SIR, HiT_SNG and HiT_SRF (Zhang et al., ECCV 2024).

Fixtures come from traiNNer-redux's source (``tools/fixtures/make_hitsr_fixtures.py``): the state dicts load
strictly and give its outputs in eval mode, sizes the blocks must pad included (SNG's twice-the-window padding with
two reflections too). Also: ONNX through anysr's exporter and per architecture an XLA:CPU train step that
compiles once with no aten op left to the CPU (``-m xla``).
The checks every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs,
2 gloo ranks == 1 process) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file

from anysr.archs import build_network
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "hitsr"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
ARCHS = ["HiT_SIR", "HiT_SNG", "HiT_SRF"]

# Tiny x2 networks of each arch (training runs, ONNX, XLA): windows 2 and 4
TINY = {a: {"type": a, "embed_dim": 16, "depths": [2], "num_heads": [2], "upscale": 2, "base_win_size": [2, 2],
            "hier_win_ratios": [1, 2]} for a in ARCHS}


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]}).eval()
    net.load_state_dict(load_file(str(FIXTURES / f"{name}_params.safetensors")), strict=True)
    return net, load_file(str(FIXTURES / f"{name}_io.safetensors"))


# ----------------------------------------------------------------------------- traiNNer-redux parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == set(ARCHS)
    assert sum(p.stat().st_size for p in FIXTURES.iterdir()) < 1_500_000


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    params = load_file(str(FIXTURES / f"{name}_params.safetensors"))
    net = build_network({"type": case["type"], **case["kwargs"]})
    assert set(net.state_dict()) == set(params), "state-dict keys differ from traiNNer-redux's"
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    net.load_state_dict(params, strict=True)
    net.eval()
    io = load_file(str(FIXTURES / f"{name}_io.safetensors"))
    for inp, out, _ in case["compare"]:
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} differs")


def test_fixtures_include_sizes_that_need_padding() -> None:
    """Each arch has an input that is not a multiple of its largest window (8 px; SNG pads to 16)."""
    padded = {MANIFEST[n]["type"] for n in MANIFEST
              if any(s % 8 for s in load_file(str(FIXTURES / f"{n}_io.safetensors"))["input1"].shape[-2:])}
    assert padded == set(ARCHS)


# ----------------------------------------------------------------------------- other behaviour

@pytest.mark.parametrize("arch", ARCHS)
def test_small_inputs_reflect_again(arch: str) -> None:
    """3x2 is grown to 8 (SNG: 16) per side for the largest windows by repeated reflection; 1 pixel by
    replication."""
    net = build_network({**TINY[arch], "hier_win_ratios": [1, 4]}).eval()
    with torch.no_grad():
        out = net(torch.rand(1, 3, 3, 2))
        one = net(torch.rand(1, 3, 1, 5))
    assert out.shape == (1, 3, 6, 4) and torch.isfinite(out).all()
    assert one.shape == (1, 3, 2, 10) and torch.isfinite(one).all()


def test_sng_adds_the_ngram_context_and_the_others_do_not() -> None:
    keys = {a: set(build_network(TINY[a]).state_dict()) for a in ARCHS}
    assert any("ngram_context.ngram_attn.relative_position_index" in k for k in keys["HiT_SNG"])
    assert any("mlp.dwconv.depthwise_conv.0.weight" in k for k in keys["HiT_SRF"])
    assert keys["HiT_SIR"] < keys["HiT_SNG"] and keys["HiT_SIR"] < keys["HiT_SRF"]


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "HiT_SIR", "embed_dim": 30}, r"network_g\.embed_dim: .*multiple of 2 \* num_heads"),
    ({"type": "HiT_SNG", "num_heads": [6]}, r"network_g\.num_heads: needs one entry per group"),
    ({"type": "HiT_SRF", "depths": [7], "num_heads": [6]}, r"network_g\.depths: a group has at most"),
    ({"type": "HiT_SIR", "hier_win_ratios": [1, 1.5], "depths": [2], "num_heads": [6]},
     r"network_g\.hier_win_ratios: window \(12, 12\)"),
    ({"type": "HiT_SIR", "upsampler": "nearest+conv", "upscale": 2}, r"network_g\.upsampler: .*upscale 4 only"),
    ({"type": "HiT_SIR", "upsampler": "bicubic"}, r"network_g\.upsampler: must be"),
    ({"type": "HiT_SIR", "resi_connection": "2conv"}, r"network_g\.resi_connection: must be"),
    ({"type": "HiT_SIR", "expansion_factor": 4}, r"network_g\.expansion_factor: .*ignores it"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


def test_published_sizes() -> None:
    """Parameter counts of the published x4 networks (traiNNer-redux's builders, counted with these classes)."""
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network(opt).parameters())

    assert count({"type": "hit_sir", "scale": 4}) == 791_540
    assert count({"type": "hit_sng", "scale": 4}) == 1_032_060
    assert count({"type": "hit_srf", "scale": 4}) == 866_420


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", ["HiT_SIR", *(pytest.param(a, marks=pytest.mark.slow) for a in ARCHS[1:])])
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = build_network(TINY[arch])
    # not a multiple of 4 (SNG: 8): every block pads
    check_onnx_at_unseen_size(net, TINY[arch], 2, tmp_path, size=(21, 34))


# ----------------------------------------------------------------------------- real training runs (CLI)


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
@pytest.mark.parametrize("arch", ARCHS)
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    check_xla_train_step(TINY[arch], (1, 3, 7, 10))  # the blocks pad

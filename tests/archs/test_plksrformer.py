"""PLKSR (spandrel 0.4.2), SRFormer and ELAN (traiNNer-redux).

Fixtures: ``tools/fixtures/make_plksrformer_fixtures.py``. State dicts load strictly and give the reference
outputs (padded sizes too); ONNX and an XLA:CPU compile-once / no-fallback check per
architecture (``-m xla`` in the XLA venv).
The checks every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs,
2 gloo ranks == 1 process) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from arch_checks import check_xla_train_step
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file

from anysr.archs import build_network
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "plksrformer"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
# Tiny configurations for training runs and XLA (type -> (network_g at x2, an input shape)).
TINY: dict[str, tuple[dict[str, Any], tuple[int, ...]]] = {
    "PLKSR": ({"type": "PLKSR", "dim": 8, "n_blocks": 1, "kernel_size": 5, "upscaling_factor": 2,
               "ccm_type": "DCCM"}, (1, 3, 8, 8)),
    "SRFormer": ({"type": "SRFormer", "img_size": 16, "embed_dim": 8, "depths": [2], "num_heads": [2],
                  "window_size": 4, "upscale": 2, "upsampler": "pixelshuffledirect"}, (1, 3, 8, 8)),
    "ELAN": ({"type": "ELAN", "scale": 2, "m_elan": 2, "c_elan": 6, "n_share": 1, "r_expand": 1,
              "window_sizes": [2, 4, 4]}, (1, 3, 8, 8)),
}


def _tol(ref: torch.Tensor) -> dict[str, float]:
    """FIXTURE_TOL with the absolute part relative to the output's range: ELAN with a 255 image range gives outputs
    up to ~350, where AVX2 and AVX-512 kernels differ by 9e-5 (2.6e-7 of the range)."""
    return {"rtol": FIXTURE_TOL["rtol"], "atol": FIXTURE_TOL["atol"] * max(1.0, ref.abs().max().item())}

def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]}).eval()
    net.load_state_dict(load_file(str(FIXTURES / f"{name}_params.safetensors")), strict=True)
    return net, load_file(str(FIXTURES / f"{name}_io.safetensors"))


# ----------------------------------------------------------------------------- reference parity

@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    params = load_file(str(FIXTURES / f"{name}_params.safetensors"))
    net = build_network({"type": case["type"], **case["kwargs"]})
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    net.load_state_dict(params, strict=True)
    net.eval()
    io = load_file(str(FIXTURES / f"{name}_io.safetensors"))
    for inp, out, _ in case["compare"]:
        x = io[inp]
        with torch.no_grad():
            got = net(x)
        assert torch.equal(x, io[inp]), "forward changed its input"
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **_tol(io[out]), msg=f"{name} {out} differs from the reference")


def test_fixtures_cover_the_variants() -> None:
    kinds = {(c["type"], c["kwargs"].get("lk_type", "PLK"), c["kwargs"].get("ccm_type", "CCM"))
             for c in MANIFEST.values() if c["type"] == "PLKSR"}
    assert {k[1] for k in kinds} == {"PLK", "SparsePLK", "RectSparsePLK"}
    assert {k[2] for k in kinds} == {"CCM", "ICCM", "DCCM"}


# ----------------------------------------------------------------------------- PLKSR

def test_plksr_train_and_eval_agree() -> None:
    """The reference's eval branch writes into its input; anysr's one path must equal both modes."""
    net, io = _case("plksr_x3_iccm_idt")
    with torch.no_grad():
        trained = net.train()(io["input0"])
    torch.testing.assert_close(trained, io["output0"], **FIXTURE_TOL)


def test_plksr_keys_per_large_kernel_type() -> None:
    base = {"type": "PLKSR", "dim": 8, "n_blocks": 1, "kernel_size": 9}
    dense = build_network(base).state_dict()
    sparse = build_network({**base, "lk_type": "SparsePLK", "use_max_kernel": True}).state_dict()
    rect = build_network({**base, "lk_type": "RectSparsePLK"}).state_dict()
    assert "feats.1.lk.conv.weight" in dense and "feats.1.channe_mixer.0.weight" in dense
    # 4 dilated 5x5 kernels (default) cover up to 17 pixels: the dense extra kernel grows to 17
    assert sparse["feats.1.lk.convs.4.weight"].shape == (2, 2, 17, 17) and "feats.1.lk.convs.5.weight" not in sparse
    assert rect["feats.1.lk.mn_conv.weight"].shape == (2, 2, 9, 3)
    assert rect["feats.1.lk.nm_conv.weight"].shape == (2, 2, 3, 9)


def test_plksr_is_fully_convolutional() -> None:
    net = build_network({"type": "PLKSR", "dim": 8, "n_blocks": 1, "kernel_size": 5}).eval()
    assert net.tile_multiple == 1
    with torch.no_grad():
        assert net(torch.rand(1, 3, 3, 5)).shape == (1, 3, 12, 20)


# ----------------------------------------------------------------------------- ELAN

@pytest.mark.parametrize(("name", "inp", "why"), [
    ("elan_x4", "input1", "7x5: reflect-padded to 8x8 (lcm of 2, 4, 4) inside forward, cropped"),
    ("elan_x2_share_norm", "input1", "10x7: reflect-padded to 12x12 (lcm of 2, 3, 6), cropped"),
])
def test_elan_padded_inputs_match_reference(name: str, inp: str, why: str) -> None:
    net, io = _case(name)
    x = io[inp]
    assert x.shape[-2] % net.tile_multiple or x.shape[-1] % net.tile_multiple, why
    with torch.no_grad():
        got = net(x)
    ref = io[inp.replace("input", "output")]
    torch.testing.assert_close(got, ref, **_tol(ref), msg=why)


def test_elan_tiny_inputs_are_padded_past_reflection() -> None:
    """The original's reflect pad fails below the window; anysr continues with edge replication."""
    net, _ = _case("elan_x4")
    with torch.no_grad():
        out = net(torch.rand(1, 3, 2, 3))
    assert out.shape == (1, 3, 8, 12) and torch.isfinite(out).all()


def test_elan_shared_blocks_reuse_attention_and_freeze_masks() -> None:
    net = build_network({"type": "ELAN", "m_elan": 4, "c_elan": 6, "n_share": 1, "norm": True})
    keys = net.state_dict()
    assert len(net.body) == 2 and net.tile_multiple == 16
    assert keys["body.0.modules_gmsa.gmsa_0.project_inp.0.weight"].shape == (12, 6, 1, 1)
    assert keys["body.0.modules_gmsa.gmsa_1.project_inp.0.weight"].shape == (6, 6, 1, 1)
    assert "body.1.modules_lfe.lfe_1.conv0.shift_conv.weight" in keys and "sub_mean.bias" in keys
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen == {n for n in keys if n.endswith("shift_conv.weight") or "_mean." in n}
    assert net.body[0].modules_gmsa["gmsa_0"].keep_attn and not build_network(
        {"type": "ELAN", "m_elan": 2, "c_elan": 6}).body[0].modules_gmsa["gmsa_0"].keep_attn


def test_elan_sdpa_path_equals_explicit_attention() -> None:
    net, io = _case("elan_x4")
    with torch.no_grad():
        ref = net(io["input0"])
        for block in net.body:
            block.modules_gmsa["gmsa_0"].keep_attn = True
        explicit = net(io["input0"])
    torch.testing.assert_close(explicit, ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- SRFormer

@pytest.mark.parametrize(("name", "inp", "why"), [
    ("srformer_x2", "input1", "7x10: reflect-padded to 8x12 (window 4) inside forward, cropped"),
    ("srformer_x2", "input2", "16x8: not img_size: the shifted-window mask is computed for the input"),
    ("srformer_x1_gray", "input1", "11x9: reflect-padded to 12x12 (window 6, odd half-window shift), cropped"),
])
def test_srformer_other_sizes_match_reference(name: str, inp: str, why: str) -> None:
    net, io = _case(name)
    with torch.no_grad():
        got = net(io[inp])
    ref = io[inp.replace("input", "output")]
    torch.testing.assert_close(got, ref, **_tol(ref), msg=why)


@pytest.mark.parametrize("name", [n for n in MANIFEST if n.startswith("srformer")])
def test_srformer_buffers_equal_the_reference(name: str) -> None:
    """The index and mask buffers are built, not learned: a fresh network has the reference's values."""
    case = MANIFEST[name]
    fresh = build_network({"type": "SRFormer", **case["kwargs"]}).state_dict()
    ref = load_file(str(FIXTURES / f"{name}_params.safetensors"))
    buffers = [k for k in ref if k.endswith(("aligned_relative_position_index", "attn_mask"))]
    assert any(k.endswith("attn_mask") for k in buffers)
    for k in buffers:
        assert torch.equal(fresh[k], ref[k].to(fresh[k].dtype)), k


def test_srformer_small_img_size_shrinks_the_window() -> None:
    # img_size 6 rounds up to the window (4) -> 8; a window not smaller than the map shrinks to it, unshifted
    net = build_network({"type": "SRFormer", "img_size": 3, "embed_dim": 8, "depths": [2], "num_heads": [2],
                         "window_size": 4})
    blocks = net.layers[0].residual_group.blocks
    assert [b.window_size for b in blocks] == [4, 4] and [b.shift_size for b in blocks] == [0, 0]
    assert "layers.0.residual_group.blocks.1.attn_mask" not in net.state_dict()


# ----------------------------------------------------------------------------- presets and build errors

@pytest.mark.parametrize(("preset", "params"), [("plksr", 7386096), ("plksr_tiny", 2370544),
                                              ("elan", 8487408), ("elan_light", 640368),
                                              ("srformer", 10543503), ("srformer_light", 6894948)])
def test_published_configurations(preset: str, params: int) -> None:
    net = build_network({"type": preset})
    assert sum(p.numel() for p in net.parameters()) == params


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "PLKSR", "kernel_size": 16}, r"network_g\.kernel_size: PLKSR needs an odd kernel_size"),
    ({"type": "PLKSR", "ccm_type": "XCCM"}, r"network_g\.ccm_type: PLKSR: ccm_type must be"),
    ({"type": "PLKSR", "lk_type": "Big"}, r"network_g\.lk_type: PLKSR: lk_type must be"),
    ({"type": "PLKSR", "lk_type": "RectSparsePLK", "kernel_size": 13}, r"network_g\.kernel_size: .*13 // 3 = 4"),
    ({"type": "PLKSR", "lk_type": "SparsePLK", "sparse_kernels": [5, 4], "sparse_dilations": [1, 2]},
     r"network_g\.sparse_kernels: PLKSR: sparse_kernels must be odd"),
    ({"type": "PLKSR", "lk_type": "SparsePLK", "sparse_kernels": [], "sparse_dilations": []},
     r"network_g\.sparse_kernels: PLKSR: SparsePLK needs"),
    ({"type": "PLKSR", "dim": 8, "split_ratio": 0.1}, r"network_g\.split_ratio: .*between 1 and dim"),
    ({"type": "PLKSR", "upscaling_factor": 0}, r"network_g\.upscaling_factor: PLKSR needs an integer"),
    ({"type": "SRFormer", "window_size": 7}, r"network_g\.window_size: SRFormer's permuted windows need an even"),
    ({"type": "SRFormer", "embed_dim": 90, "window_size": 8}, r"network_g\.embed_dim: SRFormer needs embed_dim"),
    ({"type": "SRFormer", "upsampler": "bicubic"}, r"network_g\.upsampler: SRFormer: unknown upsampler"),
    ({"type": "SRFormer", "resi_connection": "2conv"}, r"network_g\.resi_connection: SRFormer: unknown"),
    ({"type": "ELAN", "c_elan": 64}, r"network_g\.c_elan: ELAN splits c_elan into three groups"),
    ({"type": "ELAN", "window_sizes": [4, 8]}, r"network_g\.window_sizes: ELAN needs three positive"),
    ({"type": "ELAN", "norm": True, "colors": 1}, r"network_g\.norm: ELAN's mean shift is for RGB"),
    ({"type": "ELAN", "scale": 1.5}, r"network_g\.scale: ELAN needs an integer scale"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", sorted(TINY))
def test_onnx_export_runs_at_unseen_sizes(arch: str, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    from anysr.engine.inference.export import export_onnx

    opt = dict(TINY[arch][0])
    torch.manual_seed(0)
    net = build_network(dict(opt)).eval()
    rep = export_onnx(net, tmp_path / "m.onnx", scale=2, net_opt=opt)
    assert rep.dynamic is True and max(c.max_diff for c in rep.checks) < 1e-4
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.rand(1, 3, 19, 26)
    got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
    with torch.no_grad():
        torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- CLI training


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(TINY))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    # ELAN's batch norms: torch_xla compiles a plain nn.BatchNorm2d twice (its running statistics change from
    # initial values to step outputs), then never again: 3 steps, nothing new after the second.
    check_xla_train_step(*TINY[arch], steps=3 if arch == "ELAN" else 2)

"""PLKSR (spandrel 0.4.2), SRFormer and ELAN (traiNNer-redux).

Fixtures: ``tools/fixtures/make_plksrformer_fixtures.py``. State dicts load strictly and give the reference outputs
(padded sizes too); ONNX and an XLA:CPU compile-once / no-fallback check per architecture (``-m xla`` in the XLA
venv). Where they are tested: reference parity over the fixture manifest, bad arguments, ONNX at unseen sizes, the
XLA:CPU step and the checks every architecture gets run from ``tests/archs/test_standard.py`` over the family's
cards (``tests/archs/cards.py``); this module keeps what is particular to the family.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from arch_checks import fixture_io, load_case, manifest, stored_params
from cards import CARDS
from conftest import FIXTURE_TOL

from anysr.archs import build_network

GROUP = "plksrformer"
MANIFEST = manifest(GROUP)["cases"]


def _tol(ref: torch.Tensor) -> dict[str, float]:
    """FIXTURE_TOL with the absolute part relative to the output's range: ELAN with a 255 image range gives outputs
    up to ~350, where AVX2 and AVX-512 kernels differ by 9e-5 (2.6e-7 of the range)."""
    return {"rtol": FIXTURE_TOL["rtol"], "atol": FIXTURE_TOL["atol"] * max(1.0, ref.abs().max().item())}


def _reference_state(name: str) -> dict[str, torch.Tensor]:
    """The reference's state dict: the seeded weights and the entries it built (stored as ``state.<key>``)."""
    io = fixture_io(GROUP, name)
    return {**stored_params(GROUP, name), **{k[6:]: v for k, v in io.items() if k.startswith("state.")}}


# ----------------------------------------------------------------------------- reference parity

def test_fixtures_cover_the_variants() -> None:
    kinds = {(c["type"], c["kwargs"].get("lk_type", "PLK"), c["kwargs"].get("ccm_type", "CCM"))
             for c in MANIFEST.values() if c["type"] == "PLKSR"}
    assert {k[1] for k in kinds} == {"PLK", "SparsePLK", "RectSparsePLK"}
    assert {k[2] for k in kinds} == {"CCM", "ICCM", "DCCM"}


# ----------------------------------------------------------------------------- PLKSR

def test_plksr_train_and_eval_agree() -> None:
    """The reference's eval branch writes into its input; anysr's one path must equal both modes."""
    net, io = load_case(GROUP, "plksr_x3_iccm_idt")
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
    net, io = load_case(GROUP, name)
    x = io[inp]
    assert x.shape[-2] % net.tile_multiple or x.shape[-1] % net.tile_multiple, why
    with torch.no_grad():
        got = net(x)
    ref = io[inp.replace("input", "output")]
    torch.testing.assert_close(got, ref, **_tol(ref), msg=why)


def test_elan_tiny_inputs_are_padded_past_reflection() -> None:
    """The original's reflect pad fails below the window; anysr continues with edge replication."""
    net, _ = load_case(GROUP, "elan_x4")
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
    net, io = load_case(GROUP, "elan_x4")
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
    net, io = load_case(GROUP, name)
    with torch.no_grad():
        got = net(io[inp])
    ref = io[inp.replace("input", "output")]
    torch.testing.assert_close(got, ref, **_tol(ref), msg=why)


@pytest.mark.parametrize("name", [n for n in MANIFEST if n.startswith("srformer")])
def test_srformer_buffers_equal_the_reference(name: str) -> None:
    """The index and mask buffers are built, not learned: a fresh network has the reference's values."""
    case = MANIFEST[name]
    fresh = build_network({"type": "SRFormer", **case["kwargs"]}).state_dict()
    ref = _reference_state(name)
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


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", ["ELAN", "PLKSR", "SRFormer"])
def test_onnx_export_runs_at_unseen_sizes(arch: str, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    from anysr.engine.inference.export import export_onnx

    opt = dict(CARDS[arch].net)  # tests/archs/cards.py
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


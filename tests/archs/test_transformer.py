"""Transformer SR architectures Swin2SR, RGT (RGT / RGT-S), CRAFT and ATD (ATD / ATD-light).

Fixtures come from spandrel 0.4.2 (``tools/fixtures/make_transformer_fixtures.py``): the state dicts load strictly
and give spandrel's outputs, also for inputs that must be padded. Also: the published layouts' sizes, ONNX, build
errors, and one XLA:CPU compile per shape without CPU fallbacks (``-m xla`` in the XLA venv). The checks every
architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs, 2 gloo ranks == 1
process) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
import torch
from arch_checks import check_xla_train_step, fixture_io, load_case, manifest, stored_params
from conftest import FIXTURE_TOL
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.arch_util import nearest_upsample
from anysr.archs.atd_arch import mirror_pad
from anysr.archs.craft_arch import mirror_extend
from anysr.archs.rgt_arch import reduction_steps
from anysr.archs.swin2sr_arch import log_spaced_coords
from anysr.errors import OptionError

MANIFEST = manifest("transformer")["cases"]
LAYOUTS = manifest("transformer")["layouts"]
# Tiny trainable configurations (x2) for the CLI and XLA runs.
TINY = {
    "Swin2SR": {"type": "Swin2SR", "img_size": 8, "window_size": 4, "embed_dim": 12, "depths": [2], "num_heads": [2],
                "mlp_ratio": 2.0, "upscale": 2, "upsampler": "pixelshuffledirect"},
    "RGT": {"type": "RGT", "img_size": 16, "embed_dim": 32, "depth": [2], "num_heads": [2], "mlp_ratio": 2.0,
            "upscale": 2, "split_size": [2, 4]},
    "CRAFT": {"type": "CRAFT", "embed_dim": 32, "depths": [1], "num_heads": [2], "window_size": 8,
              "split_size_0": 2, "split_size_1": 8, "upscale": 2},
    "ATD": {"type": "ATD", "img_size": 8, "embed_dim": 16, "depths": [2], "num_heads": [2], "window_size": 4,
            "category_size": 24, "num_tokens": 8, "reducted_dim": 4, "convffn_kernel_size": 3, "mlp_ratio": 2.0,
            "upscale": 2, "upsampler": "pixelshuffledirect"},
}


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The fixture network (eval mode, weights loaded strictly) and its inputs / outputs."""
    return load_case("transformer", name)


def _sha256(v: torch.Tensor) -> str:
    """A buffer's values as the fixture script hashes them (float64 / int64)."""
    canon = v.detach().to(torch.float64 if v.is_floating_point() else torch.int64).contiguous()
    return hashlib.sha256(canon.numpy().tobytes()).hexdigest()


# ----------------------------------------------------------------------------- spandrel parity

@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]})
    stored = stored_params("transformer", name)  # the seeded entries
    shapes = {**{k: list(v.shape) for k, v in stored.items()}, **case["buffers"]}
    assert set(net.state_dict()) == set(shapes), "state-dict keys differ from spandrel's"
    assert {k: list(v.shape) for k, v in net.state_dict().items()} == shapes
    # buffers are the reference's exactly (position indices, coordinate tables, masks for img_size)
    params = dict(net.named_parameters())
    for k, v in net.state_dict().items():
        if k in case["buffer_sha256"]:
            assert _sha256(v) == case["buffer_sha256"][k], f"buffer {k} differs from spandrel's"
        elif k not in params:
            assert torch.equal(v, stored[k].to(v.dtype)), f"buffer {k} differs from spandrel's"
    net, io = _case(name)
    for inp, out, _ in case["compare"]:
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} differs from spandrel")


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_reference_layouts(name: str) -> None:
    """Configurations stored as key -> shape only (their 64-feature upsamplers would make large fixtures)."""
    case = LAYOUTS[name]
    net = build_network({"type": case["type"], **case["kwargs"]})
    assert {k: list(v.shape) for k, v in net.state_dict().items()} == case["shapes"]


def test_fixtures_cover_padding_and_the_variants() -> None:
    kinds = {(c["type"], c["kwargs"].get("upsampler")) for c in MANIFEST.values()}
    assert {("Swin2SR", u) for u in ("pixelshuffle", "pixelshuffledirect", "nearest+conv", "pixelshuffle_aux", "")} \
        <= kinds
    for name, case in MANIFEST.items():
        net, io = _case(name)
        multiple = net.tile_multiple
        shapes = [io[i].shape[-2:] for i, _, _ in case["compare"]]
        assert any(h % multiple or w % multiple for h, w in shapes), f"{name}: no input needs padding"
    rgt_small = fixture_io("transformer", "rgt_x2_rect")["input2"]
    assert min(rgt_small.shape[-2:]) < 16  # below RG-SA's minimum: grown, run, cropped


@pytest.mark.parametrize(("type_name", "kwargs", "params"), [
    # published configurations; counts equal spandrel 0.4.2's classes (counted with both)
    ("Swin2SR", dict(upscale=2, img_size=64, window_size=8, depths=[6] * 6, embed_dim=180, num_heads=[6] * 6,
                     mlp_ratio=2, upsampler="pixelshuffle"), 12_091_571),
    ("Swin2SR", dict(upscale=2, img_size=64, window_size=8, depths=[6] * 4, embed_dim=60, num_heads=[6] * 4,
                     mlp_ratio=2, upsampler="pixelshuffledirect"), 1_005_348),
    ("Swin2SR", dict(upscale=4, img_size=64, window_size=8, depths=[6] * 6, embed_dim=180, num_heads=[6] * 6,
                     mlp_ratio=2, upsampler="nearest+conv"), 12_054_643),
    ("RGT", dict(upscale=2, embed_dim=180, depth=[6] * 8, num_heads=[6] * 8, mlp_ratio=2.0, split_size=[8, 32]),
     13_217_831),
    ("RGT", dict(upscale=2, embed_dim=180, depth=[6] * 6, num_heads=[6] * 6, mlp_ratio=2.0, split_size=[8, 32]),
     10_051_055),
    ("CRAFT", dict(upscale=4), 753_344),  # the defaults are the published CRAFT
    ("CRAFT", dict(upscale=2), 737_756),
    ("ATD", dict(upscale=2, embed_dim=210, depths=[6] * 6, num_heads=[6] * 6, window_size=16, category_size=256,
                 num_tokens=128, reducted_dim=20, convffn_kernel_size=5, mlp_ratio=2.0, upsampler="pixelshuffle"),
     20_113_217),
    ("ATD", dict(upscale=4, embed_dim=48, depths=[6] * 4, num_heads=[4] * 4, window_size=16, category_size=128,
                 num_tokens=64, reducted_dim=8, convffn_kernel_size=7, mlp_ratio=1.0, upsampler="pixelshuffledirect"),
     768_792),  # ATD-light
])
def test_published_layouts(type_name: str, kwargs: dict, params: int) -> None:
    with torch.device("meta"):
        net = build_network({"type": type_name, **kwargs})
    assert sum(p.numel() for p in net.parameters()) == params


def test_tile_multiples() -> None:
    assert build_network(TINY["Swin2SR"]).tile_multiple == 4
    assert build_network({**TINY["Swin2SR"], "img_size": 3}).tile_multiple == 3  # window shrinks to img_size
    assert build_network(TINY["RGT"]).tile_multiple == 4  # pads inside its window attention, to 4
    assert build_network(TINY["CRAFT"]).tile_multiple == 8
    assert build_network(TINY["ATD"]).tile_multiple == 4


@pytest.mark.parametrize("arch", ["Swin2SR", "RGT"])  # CRAFT has no checkpointing option
def test_checkpointing_matches_plain_forward(arch: str) -> None:
    flag = "use_chk" if arch == "RGT" else "use_checkpoint"
    torch.manual_seed(0)
    plain = build_network({**TINY[arch], "drop_path_rate": 0.0}).train()
    chk = build_network({**TINY[arch], "drop_path_rate": 0.0, flag: True}).train()
    chk.load_state_dict(plain.state_dict())
    x = torch.rand(2, 3, 16, 18)
    y1, y2 = plain(x), chk(x)
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-6)
    y2.mean().backward()
    assert all(p.grad is not None for p in chk.parameters())


# ----------------------------------------------------------------------------- Swin2SR details

def test_swin2sr_coordinate_table_is_log_spaced() -> None:
    table = log_spaced_coords((4, 4))
    assert table.shape == (1, 7, 7, 2)
    # offsets -3..3 scaled to [-8, 8], then sign * log2(1 + |t|) / log2(8)
    assert table[0, 3, 3].tolist() == [0.0, 0.0]
    torch.testing.assert_close(table[0, 6, 3], torch.tensor([math.log2(9) / 3, 0.0]))  # offset +3 -> t = 8
    torch.testing.assert_close(table[0, 0, 3], -table[0, 6, 3])
    torch.testing.assert_close(table[0, 3, 4], torch.tensor([0.0, math.log2(1 + 8 / 3) / 3]))


def test_swin2sr_temperature_is_clamped() -> None:
    torch.manual_seed(0)
    net = build_network(TINY["Swin2SR"]).eval()
    attn = net.layers[0].residual_group.blocks[0].attn
    x = torch.rand(1, 3, 8, 8)
    with torch.no_grad():
        attn.logit_scale.fill_(20.0)  # exp(20) unclamped; clamped at 100
        high = net(x)
        attn.logit_scale.fill_(torch.log(torch.tensor(100.0)).item())
        at_max = net(x)
    torch.testing.assert_close(high, at_max)


@pytest.mark.parametrize("factor", [1, 2, 3, 4])
def test_nearest_upsample_is_nearest_interpolation(factor: int) -> None:
    """arch_util.nearest_upsample (Swin2SR, ATD, SwinIR's and ESRGAN's nearest+conv, ...): F.interpolate's values
    and gradient."""
    x = torch.rand(2, 3, 5, 7, requires_grad=True)
    ref = F.interpolate(x, scale_factor=factor, mode="nearest")
    assert torch.equal(nearest_upsample(x, factor), ref)
    g = torch.rand(ref.shape)
    (a,) = torch.autograd.grad(nearest_upsample(x, factor), x, g)
    (b,) = torch.autograd.grad(ref, x, g)
    torch.testing.assert_close(a, b)


def test_swin2sr_without_shift_has_no_mask_buffer() -> None:
    # img_size == window: the windows cover the whole training patch, no shift, no attn_mask buffers
    net = build_network({**TINY["Swin2SR"], "img_size": 4})
    assert not any(k.endswith("attn_mask") for k in net.state_dict())
    assert "layers.0.residual_group.blocks.1.attn_mask" in build_network(TINY["Swin2SR"]).state_dict()


# ----------------------------------------------------------------------------- RGT details

def test_rgt_reduction_steps() -> None:
    assert reduction_steps(16, 16, training=False) == 2  # at least 2 at inference
    assert reduction_steps(1024, 64, training=False) == 3
    assert reduction_steps(64, 64, training=True) == 2
    assert reduction_steps(32, 20, training=True) == 1
    assert reduction_steps(8, 8, training=True) == 0


def test_rgt_small_inputs_are_grown_to_the_minimum() -> None:
    torch.manual_seed(0)
    net = build_network(TINY["RGT"]).eval()
    with torch.no_grad():
        assert net(torch.rand(1, 3, 5, 9)).shape == (1, 3, 10, 18)
        assert net.train()(torch.rand(1, 3, 5, 9)).shape == (1, 3, 10, 18)  # training: RG-SA shrinks once


def test_rgt_items_of_a_batch_are_independent() -> None:
    net, io = _case("rgt_x2_rect")
    x = io["input1"]
    with torch.no_grad():
        one = net(x[1:])
    torch.testing.assert_close(one, io["output1"][1:], **FIXTURE_TOL)


# ----------------------------------------------------------------------------- CRAFT details

def test_craft_mirror_extend() -> None:
    x = torch.arange(12.0).view(1, 1, 3, 4)
    out = mirror_extend(x, 2, 3)
    assert out.shape == (1, 1, 5, 7)
    assert out[0, 0, :, 0].tolist() == [0, 4, 8, 8, 4]  # edge row repeated, then the one before
    assert out[0, 0, 0].tolist() == [0, 1, 2, 3, 3, 2, 1]


def test_craft_always_adds_a_mirrored_window() -> None:
    """The authors pad a multiple of the window by a whole window more: the output of a 16x16 input depends on
    the mirrored window (it differs from the same input's top-left of a larger image)."""
    net, io = _case("craft_x4")
    x = io["input0"]  # 16x16, window 8
    with torch.no_grad():
        big = net(torch.cat([x, torch.rand(1, 3, 16, 16)], dim=-1))[..., :64]
    assert not torch.allclose(big, io["output0"], atol=1e-3)


# ----------------------------------------------------------------------------- ATD details

def test_atd_mirror_pad() -> None:
    x = torch.arange(3.0).view(1, 1, 1, 3)
    assert mirror_pad(x, 0, 2)[0, 0, 0].tolist() == [0, 1, 2, 2, 1]
    assert mirror_pad(x, 0, 7)[0, 0, 0].tolist() == [0, 1, 2, 2, 1, 0, 0, 1, 2, 2]  # longer than the side
    assert mirror_pad(x, 2, 0).shape == (1, 1, 3, 3)


def test_atd_no_norm_buffer_decides_normalisation() -> None:
    normed = build_network(TINY["ATD"])
    plain = build_network({**TINY["ATD"], "norm": False})
    assert normed.is_norm and "no_norm" not in normed.state_dict()
    assert not plain.is_norm and torch.equal(plain.state_dict()["no_norm"], torch.zeros(1))


def test_atd_groups_follow_the_dictionary_categories() -> None:
    """AC-MSA attends within groups of pixels of the same (sorted) category: with one category per group, each
    pixel's output depends only on its own group."""
    torch.manual_seed(0)
    aca = build_network(TINY["ATD"]).layers[0].residual_group.layers[0].attn_aca.eval()
    aca.category_size = 4
    n, c = 8, 16
    qkv = torch.randn(1, n, 3 * c)
    cats = torch.tensor([1, 0, 1, 0, 1, 0, 1, 0])  # pixels 1,3,5,7 -> group 0; 0,2,4,6 -> group 1
    sim = F.one_hot(cats, 8).float().unsqueeze(0)
    out = aca(qkv, sim)
    changed = qkv.clone()
    changed[0, 0] += 1.0  # a pixel of group 1
    out2 = aca(changed, sim)
    same = (out2 - out).abs().amax(-1)[0] < 1e-6
    assert same.tolist() == [False, True, False, True, False, True, False, True]


# ----------------------------------------------------------------------------- build errors

@pytest.mark.parametrize(("opt", "pattern"), [
    ({**TINY["Swin2SR"], "upsampler": "pixelshuffle_hf"}, r"network_g\.upsampler: Swin2SR: .*returns three images"),
    ({**TINY["Swin2SR"], "upsampler": "bilinear"}, r"network_g\.upsampler: Swin2SR: unknown upsampler"),
    ({**TINY["Swin2SR"], "upsampler": "nearest+conv"}, r"network_g\.upscale: Swin2SR: upsampler 'nearest\+conv'"),
    ({**TINY["Swin2SR"], "resi_connection": "2conv"}, r"network_g\.resi_connection: Swin2SR: unknown"),
    ({**TINY["Swin2SR"], "patch_size": 2}, r"network_g\.patch_size: Swin2SR: only patch_size 1"),
    ({**TINY["Swin2SR"], "num_heads": [5]}, r"network_g\.num_heads: Swin2SR: embed_dim 12 is not divisible"),
    ({**TINY["Swin2SR"], "depths": [2, 2]}, r"network_g\.num_heads: Swin2SR: num_heads has 1 entries"),
    ({**TINY["Swin2SR"], "window_size": 1}, r"network_g\.window_size: Swin2SR: window_size must be an integer >= 2"),
    ({**TINY["Swin2SR"], "upsampler": "pixelshuffle", "upscale": 5}, r"network_g\.upscale: scale 5"),
    ({**TINY["RGT"], "upscale": 6}, r"network_g\.upscale: scale 6 is not supported"),
    ({**TINY["RGT"], "split_size": [3, 4]}, r"network_g\.split_size: RGT: split_size must be"),
    ({**TINY["RGT"], "embed_dim": 36, "num_heads": [8]}, r"network_g\.num_heads: RGT: each window half \(18 "),
    ({**TINY["RGT"], "num_heads": [3]}, r"network_g\.num_heads: RGT: 3 heads must divide dim 32 and c_ratio"),
    ({**TINY["RGT"], "depth": [2, 2]}, r"network_g\.num_heads: RGT: num_heads has 1 entries but depth has 2"),
    ({**TINY["RGT"], "resi_connection": "identity"}, r"network_g\.resi_connection: RGT: unknown"),
    ({**TINY["CRAFT"], "resi_connection": "3conv"}, r"network_g\.resi_connection: CRAFT: unknown"),
    ({**TINY["CRAFT"], "window_size": 12}, r"network_g\.window_size: CRAFT: window_size 12 must be a multiple"),
    ({**TINY["CRAFT"], "num_heads": [3]}, r"network_g\.num_heads: CRAFT: 3 heads must divide embed_dim 32"),
    ({**TINY["CRAFT"], "embed_dim": 16}, r"network_g\.embed_dim: CRAFT: embed_dim must be at least 32"),
    ({**TINY["CRAFT"], "upscale": 0}, r"network_g\.upscale: CRAFT: upscale must be a positive integer"),
    ({**TINY["CRAFT"], "depths": [1, 1]}, r"network_g\.num_heads: CRAFT: num_heads has 1 entries"),
    ({**TINY["ATD"], "upsampler": "pixelshuffle_aux"}, r"network_g\.upsampler: ATD: unknown upsampler"),
    ({**TINY["ATD"], "upsampler": "nearest+conv"}, r"network_g\.upscale: ATD: upsampler 'nearest\+conv'"),
    ({**TINY["ATD"], "num_heads": [3]}, r"network_g\.num_heads: ATD: embed_dim 16 is not divisible"),
    ({**TINY["ATD"], "patch_size": 4}, r"network_g\.patch_size: ATD: only patch_size 1"),
    ({**TINY["ATD"], "resi_connection": "identity"}, r"network_g\.resi_connection: ATD: unknown"),
])
def test_bad_arguments_name_the_option(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("name", ["swin2sr_x2_pixelshuffle",
                                  pytest.param("craft_x2_identity", marks=pytest.mark.slow)])
def test_onnx_runs_at_unseen_sizes(name: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net, io = _case(name)
    scale = MANIFEST[name]["kwargs"]["upscale"]
    rep = export_onnx(net, tmp_path / "m.onnx", scale=scale, net_opt={"type": MANIFEST[name]["type"],
                                                                      **MANIFEST[name]["kwargs"]})
    assert rep.dynamic is True, rep.note
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for x in (torch.rand(1, 3, 13, 22), io["input1"]):  # sizes the export never saw, not window multiples
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        with torch.no_grad():
            torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_rgt_onnx_export(tmp_path: Path) -> None:
    """RG-SA's number of 4x reductions is computed from the input size in Python and traced as a constant (2, the
    value for every side from 16 to 1023 pixels at inference): the dynamic graph holds within that range."""
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net, io = _case("rgt_x1_3conv")
    rep = export_onnx(net, tmp_path / "rgt.onnx", scale=1, size=32)
    assert rep.dynamic is True, rep.note
    session = ort.InferenceSession(str(tmp_path / "rgt.onnx"), providers=["CPUExecutionProvider"])
    for x in (torch.rand(1, 3, 21, 27), io["input1"]):
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        with torch.no_grad():
            torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)


def test_atd_onnx_export_is_refused_clearly(tmp_path: Path) -> None:
    """AC-MSA sorts pixels by category (``torch.sort``), which torch's ONNX exporter cannot express: the export
    stops with an OptionError naming the operator, and writes no file."""
    pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net, _ = _case("atd_x3_direct")
    with pytest.raises(OptionError, match="ONNX export of operator Sort"):
        export_onnx(net, tmp_path / "atd.onnx", scale=3)
    assert not (tmp_path / "atd.onnx").exists()


# ----------------------------------------------------------------------------- training through the CLI


# ----------------------------------------------------------------------------- XLA:CPU

XLA_NETS = {
    "Swin2SR": ({**TINY["Swin2SR"], "upsampler": "pixelshuffle"}, (2, 3, 7, 10)),
    "Swin2SR-nearest": ({**TINY["Swin2SR"], "upsampler": "nearest+conv", "upscale": 4}, (1, 3, 8, 8)),
    "RGT": (TINY["RGT"], (2, 3, 17, 18)),
    "CRAFT": (TINY["CRAFT"], (2, 3, 9, 13)),
    "ATD": (TINY["ATD"], (2, 3, 7, 10)),
}


@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(XLA_NETS))
def test_xla_train_step_compiles_once(arch: str) -> None:
    opt, shape = XLA_NETS[arch]
    opt = {**opt, **({"drop_path_rate": 0.0} if arch.split("-")[0] in ("Swin2SR", "RGT") else {})}
    # and the eval graph at another size
    check_xla_train_step(opt, shape, eval_shape=(1, 3, 16, 20), scale=build_network(dict(opt)).upscale)

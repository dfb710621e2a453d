"""Video SR building blocks: the pure-PyTorch DCNv2 against torchvision, BasicSR 1.4.2's video architectures
(strict keys, outputs), weight-path arguments, any clip length, bf16 autocast, and XLA:CPU (marked xla).

Fixtures: tools/fixtures/make_video_fixtures.py (weights and inputs of the architecture cases are derived from
their names by the hash in that script, outputs come from BasicSR).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import FIXTURE_TOL, FIXTURE_TOOLS, ROOT
from safetensors.torch import load_file
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.arch_util import ArchArgumentError, DCNv2Pack, flow_warp
from anysr.archs.basicvsr_arch import IconVSR, temporal_pad_indices
from anysr.archs.basicvsrpp_arch import bicubic_quarter
from anysr.archs.spynet_arch import SpyNet
from anysr.errors import OptionError
from anysr.ops import dcn
from anysr.ops.dcn import ModulatedDeformConv2dPack, modulated_deform_conv2d

FIXTURES = ROOT / "tests" / "fixtures" / "video"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = MANIFEST["cases"]
DCN_IO = load_file(str(FIXTURES / "dcn.safetensors"))


def _load_maker():
    spec = importlib.util.spec_from_file_location("make_video_fixtures", FIXTURE_TOOLS / "make_video_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKER = _load_maker()


# ----------------------------------------------------------------------------------------------- DCN op

@pytest.mark.parametrize("name", sorted(MANIFEST["dcn"]))
def test_dcn_matches_torchvision_forward_and_gradients(name: str) -> None:
    cfg = MANIFEST["dcn"][name]
    t = {k.split("/", 1)[1]: v for k, v in DCN_IO.items() if k.startswith(f"{name}/")}
    leaves = {k: t[k].clone().requires_grad_(True) for k in ("x", "offset", "weight", "mask", "bias") if k in t}
    out = modulated_deform_conv2d(leaves["x"], leaves["offset"], leaves.get("mask"), leaves["weight"],
                                  leaves.get("bias"), cfg["stride"], cfg["padding"], cfg["dilation"], backend="pure")
    torch.testing.assert_close(out, t["out"], **FIXTURE_TOL, msg=f"{name}: output differs from torchvision")
    out.backward(t["grad_out"])
    for k, v in leaves.items():
        torch.testing.assert_close(v.grad, t[f"grad_{k}"], **FIXTURE_TOL, msg=f"{name}: grad of {k} differs")


def test_dcn_fixture_pushes_samples_outside_the_image() -> None:
    off = DCN_IO["dcn_far_outside/offset"]
    assert off.abs().max() > 10 and off.shape[-1] == 6  # reaches well beyond a 5x6 image


def test_dcn_with_zero_offsets_is_a_convolution() -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 6, 9, 11, generator=g)
    w = torch.randn(4, 3, 3, 3, generator=g)
    b = torch.randn(4, generator=g)
    for stride, pad, dil in ((1, 1, 1), (2, 1, 1), (1, 2, 2), ((2, 1), (0, 1), (1, 2))):
        ref = F.conv2d(x, w, b, stride, pad, dil, groups=2)
        ho, wo = ref.shape[-2:]
        offset = torch.zeros(2, 2 * 3 * 9, ho, wo)
        got = modulated_deform_conv2d(x, offset, torch.ones(2, 3 * 9, ho, wo), w, b, stride, pad, dil, backend="pure")
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        # A mask of one half halves the convolution (without bias).
        half = modulated_deform_conv2d(x, offset, torch.full((2, 3 * 9, ho, wo), 0.5), w, None, stride, pad, dil)
        torch.testing.assert_close(half, 0.5 * (ref - b.view(1, -1, 1, 1)), rtol=1e-5, atol=1e-5)


def test_dcn_integer_offset_shifts_the_sampling_grid() -> None:
    x = torch.randn(1, 2, 8, 8)
    w = torch.randn(3, 2, 3, 3)
    offset = torch.zeros(1, 18, 8, 8)
    offset[:, 1::2] = 1.0  # every tap one pixel to the right: (dy, dx) pairs
    got = modulated_deform_conv2d(x, offset, None, w, None, 1, 1, 1, backend="pure")
    ref = F.conv2d(F.pad(x, (0, 2, 1, 1)), w)  # column j sees columns j .. j + 2 (zero beyond the image)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_dcn_rejects_bad_shapes_with_named_argument() -> None:
    x, w = torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3)
    with pytest.raises(ValueError, match="offset"):
        modulated_deform_conv2d(x, torch.zeros(1, 17, 6, 6), None, w, padding=1)
    with pytest.raises(ValueError, match="mask"):
        modulated_deform_conv2d(x, torch.zeros(1, 18, 6, 6), torch.ones(1, 8, 6, 6), w, padding=1)
    with pytest.raises(ValueError, match="backend"):
        modulated_deform_conv2d(x, torch.zeros(1, 18, 6, 6), None, w, padding=1, backend="cuda")


def test_dcn_torchvision_backend_is_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dcn, "_torchvision_deform_conv2d", lambda: None)
    x, w, off = torch.randn(1, 4, 6, 6), torch.randn(4, 4, 3, 3), torch.randn(1, 18, 6, 6)
    with pytest.raises(ValueError, match="torchvision does not import"):
        modulated_deform_conv2d(x, off, None, w, padding=1, backend="torchvision")
    auto = modulated_deform_conv2d(x, off, None, w, padding=1)
    assert torch.equal(auto, modulated_deform_conv2d(x, off, None, w, padding=1, backend="pure"))


def test_dcn_traces_as_one_graph() -> None:
    """No data-dependent Python control flow and no host reads: torch.compile captures the op in one graph (what
    XLA needs too)."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(1, 8, 6, 7, generator=g), torch.randn(4, 8, 3, 3, generator=g)
    off, m = torch.randn(1, 2 * 2 * 9, 6, 7, generator=g), torch.rand(1, 2 * 9, 6, 7, generator=g)
    traced = torch.compile(lambda *a: modulated_deform_conv2d(*a, padding=1), backend="eager", fullgraph=True)
    assert torch.equal(traced(x, off, m, w), modulated_deform_conv2d(x, off, m, w, padding=1))


def test_dcn_pack_channel_order_matches_basicsr() -> None:
    """BasicSR's DCNv2Pack: cat(o1, o2) of the conv_offset output is the offset, the last third the mask."""
    case = CASES["dcnv2pack"]
    net = DCNv2Pack(**case["kwargs"]).eval()
    net.backend = "pure"
    _check_keys(net, case)
    net.load_state_dict(MAKER.hashed_state_dict(case["state"], case["gain"]), strict=True)
    inputs = MAKER.case_inputs("dcnv2pack", case["inputs"])
    with torch.no_grad():
        got = net(*inputs)
    torch.testing.assert_close(got, load_file(str(FIXTURES / "dcnv2pack.safetensors"))["output"], **FIXTURE_TOL)


def test_modulated_deform_conv_pack_starts_as_a_convolution() -> None:
    pack = ModulatedDeformConv2dPack(4, 6, 3, padding=1, deformable_groups=2)
    assert pack.conv_offset.out_channels == 2 * 3 * 9 and not pack.conv_offset.weight.any()
    x = torch.randn(1, 4, 5, 7)
    # Zero offsets and a mask of sigmoid(0) = 0.5.
    torch.testing.assert_close(pack(x), 0.5 * F.conv2d(x, pack.weight, None, 1, 1) + pack.bias.view(1, -1, 1, 1),
                               rtol=1e-5, atol=1e-5)


def test_flow_warp_matches_grid_sample() -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 9, 11, generator=g)
    flow = torch.randn(2, 9, 11, 2, generator=g) * 3
    gx = 2 * (torch.arange(11) + flow[..., 0]) / 10 - 1
    gy = 2 * (torch.arange(9).view(9, 1) + flow[..., 1]) / 8 - 1
    grid = torch.stack((gx, gy), -1)
    for mode, pad in (("bilinear", "zeros"), ("bilinear", "border"), ("nearest", "zeros"), ("nearest", "border")):
        ref = F.grid_sample(x, grid, mode=mode, padding_mode=pad, align_corners=True)
        torch.testing.assert_close(flow_warp(x, flow, mode, pad), ref, rtol=1e-5, atol=1e-5, msg=f"{mode} {pad}")
    with pytest.raises(ValueError, match="padding_mode"):
        flow_warp(x, flow, padding_mode="reflection")


def test_bicubic_quarter_matches_interpolate() -> None:
    x = torch.rand(2, 3, 16, 20)
    ref = F.interpolate(x, scale_factor=0.25, mode="bicubic")
    torch.testing.assert_close(bicubic_quarter(x), ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------------- BasicSR parity

def _check_keys(net: torch.nn.Module, case: dict) -> None:
    ours = {k: list(v.shape) for k, v in net.state_dict().items()}
    theirs = {e["key"]: e["shape"] for e in case["state"]}
    assert set(ours) == set(theirs), (f"missing {sorted(set(theirs) - set(ours))[:5]}, "
                                      f"unexpected {sorted(set(ours) - set(theirs))[:5]}")
    assert ours == theirs, "state-dict shapes differ from BasicSR's"


ARCH_CASES = sorted(k for k in CASES if k != "dcnv2pack")


@pytest.mark.parametrize("name", ARCH_CASES)
def test_basicsr_video_arch_matches(name: str) -> None:
    case = CASES[name]
    net = build_network({"type": case["type"], **case["kwargs"]}).eval()
    _check_keys(net, case)
    net.load_state_dict(MAKER.hashed_state_dict(case["state"], case["gain"]), strict=True)
    inputs = MAKER.case_inputs(name, case["inputs"])
    with torch.no_grad():
        out = net(*inputs)
    assert list(out.shape) == case["output_shape"]
    s = case["stride"]
    ref = load_file(str(FIXTURES / f"{name}.safetensors"))["output"]
    torch.testing.assert_close(out[..., ::s, ::s], ref, **FIXTURE_TOL, msg=f"{name} differs from BasicSR")


def test_hashed_weights_are_not_trivial() -> None:
    sd = MAKER.hashed_state_dict(CASES["basicvsr_t3"]["state"], 1.0)
    w = sd["spynet.basic_module.0.basic_module.0.weight"]
    assert w.std() > 0.01 and not torch.equal(w, sd["spynet.basic_module.1.basic_module.0.weight"])
    assert torch.equal(sd["spynet.mean"], torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1))


# ------------------------------------------------------------------------- arguments and weight paths

@pytest.mark.parametrize(("opt", "arg"), [
    ({"type": "SpyNet", "load_path": "spynet.pth"}, "load_path"),
    ({"type": "BasicVSR", "num_feat": 8, "num_block": 1, "spynet_path": "spynet.pth"}, "spynet_path"),
    ({"type": "IconVSR", "num_feat": 8, "num_block": 1, "edvr_path": "edvr.pth"}, "edvr_path"),
    ({"type": "BasicVSRPlusPlus", "mid_channels": 8, "num_blocks": 1, "spynet_path": "s.pth"}, "spynet_path"),
])
def test_weight_paths_are_refused_with_the_engine_option(opt: dict, arg: str) -> None:
    with pytest.raises(OptionError, match=rf"network_g\.{arg}: .*path\.pretrain_network_g"):
        build_network(opt)


def test_spynet_path_none_is_accepted_and_nothing_is_read(tmp_path: Path) -> None:
    SpyNet(load_path=None)
    with pytest.raises(ArchArgumentError):
        SpyNet(load_path=str(tmp_path / "missing.pth"))  # refused, not opened


@pytest.mark.parametrize(("opt", "key"), [
    ({"type": "EDVR", "num_feat": 8, "deformable_groups": 3}, "deformable_groups"),
    ({"type": "EDVR", "num_feat": 8, "deformable_groups": 2, "hr_in": True}, "hr_in"),
    ({"type": "EDVR", "num_feat": 8, "deformable_groups": 2, "num_out_ch": 1}, "num_out_ch"),
    ({"type": "DUF", "num_layer": 20}, "num_layer"),
    ({"type": "BasicVSRPlusPlus", "mid_channels": 12}, "mid_channels"),
    ({"type": "IconVSR", "num_feat": 12}, "num_feat"),
])
def test_bad_arguments_name_the_key(opt: dict, key: str) -> None:
    with pytest.raises(OptionError, match=rf"network_g\.{key}"):
        build_network(opt)


def test_temporal_padding_indices() -> None:
    # BasicSR's IconVSR (t >= 5): frames 4, 3 before and t-4, t-5 after (padding 2); 6, 5, 4 / t-5.. (padding 3).
    assert temporal_pad_indices(7, 2) == [4, 3, 0, 1, 2, 3, 4, 5, 6, 3, 2]
    assert temporal_pad_indices(8, 3) == [6, 5, 4, *range(8), 3, 2, 1]
    assert temporal_pad_indices(2, 2) == [0, 1, 0, 1, 0, 1]  # short clips reflect into range


# ------------------------------------------------------------------------------ clip lengths, autocast

TINY = {
    "BasicVSR": dict(num_feat=8, num_block=1),
    "IconVSR": dict(num_feat=8, num_block=1, keyframe_stride=2),
    "BasicVSRPlusPlus": dict(mid_channels=8, num_blocks=1),
}


@pytest.mark.parametrize("name", sorted(TINY))
@pytest.mark.parametrize("t", [2, 4])
def test_recurrent_archs_take_any_clip_length(name: str, t: int) -> None:
    torch.manual_seed(0)
    net = build_network({"type": name, **TINY[name]}).eval()
    x = torch.rand(1, t, 3, 10, 12)
    with torch.no_grad():
        out = net(x)
    assert out.shape == (1, t, 3, 40, 48) and torch.isfinite(out).all()
    with pytest.raises(ValueError, match=r"t >= 2"):
        net(x[:, :1])


def test_edvr_refuses_sizes_it_cannot_align() -> None:
    net = build_network({"type": "EDVR", "num_feat": 8, "num_frame": 3, "deformable_groups": 2,
                         "num_extract_block": 1, "num_reconstruct_block": 1})
    with pytest.raises(ValueError, match="multiples of 4"):
        net(torch.rand(1, 3, 3, 10, 12))


def test_basicvsrpp_bf16_autocast_forward_and_backward() -> None:
    """Under CPU bf16 autocast the DCN, warps and SPyNet run in bf16 and the result stays close to fp32."""
    torch.manual_seed(0)
    net = build_network({"type": "BasicVSRPlusPlus", "mid_channels": 8, "num_blocks": 1})
    with torch.no_grad():  # non-zero offsets, so the deformable sampling is exercised
        for m in net.deform_align.values():
            m.conv_offset[-1].weight.normal_(0, 0.05)
    x = torch.rand(1, 2, 3, 8, 8)
    with torch.no_grad():
        ref = net(x)
    dtypes = []
    net.deform_align["forward_1"].register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(x)
    assert dtypes == [torch.bfloat16] and torch.isfinite(out).all()
    assert (out.float() - ref).abs().mean() < 0.05
    out.float().mean().backward()
    grads = [p.grad for p in net.deform_align["forward_1"].parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert net.deform_align["forward_1"].weight.grad.abs().sum() > 0


def test_iconvsr_pads_spatially_and_crops_back() -> None:
    torch.manual_seed(0)
    net = IconVSR(num_feat=8, num_block=1, keyframe_stride=2).eval()
    x = torch.rand(1, 3, 3, 9, 10)
    with torch.no_grad():
        out = net(x)
    assert out.shape == (1, 3, 3, 36, 40)


# ---------------------------------------------------------------------------------------------- XLA

@pytest.mark.xla
def test_basicvsr_on_xla_compiles_once_and_dcn_matches_cpu() -> None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    import torch_xla.debug.metrics as met

    dev = torch_xla.device()

    # The DCN op on XLA equals the CPU one.
    name = "dcn_groups_stride2"
    cfg = MANIFEST["dcn"][name]
    t = {k.split("/", 1)[1]: v for k, v in DCN_IO.items() if k.startswith(f"{name}/")}
    args = (t["x"], t["offset"], t["mask"], t["weight"], t["bias"])
    cpu = modulated_deform_conv2d(*args, cfg["stride"], cfg["padding"], cfg["dilation"], backend="pure")
    xla = modulated_deform_conv2d(*(a.to(dev) for a in args), cfg["stride"], cfg["padding"], cfg["dilation"],
                                  backend="pure")
    torch_xla.sync()
    torch.testing.assert_close(xla.cpu(), cpu, **FIXTURE_TOL)

    # Tiny BasicVSR: forward + backward + step twice with one shape; the second step compiles nothing.
    torch.manual_seed(0)
    net = build_network({"type": "BasicVSR", "num_feat": 8, "num_block": 1}).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    clips = [torch.rand(1, 3, 3, 8, 8, generator=g) for _ in range(2)]
    targets = [torch.rand(1, 3, 3, 32, 32, generator=g) for _ in range(2)]
    compiles = []
    for lq, gt in zip(clips, targets):
        loss = F.l1_loss(net(lq.to(dev)), gt.to(dev))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        torch_xla.sync()
        compiles.append(met.metric_data("CompileTime")[0])
    assert compiles[1] == compiles[0], f"the second step compiled again ({compiles})"

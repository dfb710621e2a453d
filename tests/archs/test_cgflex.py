"""traiNNer-redux's CascadedGaze and FlexNet / MetaFlexNet.

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_cgflex_fixtures.py``): the state dicts load
strictly and give its outputs (eval mode, sizes that need the networks' internal padding, FlexNet's training-mode
OmniShift branches) and its training-mode gradients (CascadedGaze's hand-written layer-norm backward, the unfolded
OmniShift). Also: the deployment fold, the minimum size, nearest resizing by gathers, ONNX through anysr's exporter,
and an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``). The checks every
architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs) run from
``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs import cascadedgaze_arch as cg
from anysr.archs.flexnet_arch import OmniShift, RMSNorm
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "cgflex"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]

# Tiny networks of each kind (ONNX, XLA, the training rows in tests/archs/test_standard.py)
TINY = {
    "CascadedGaze": {"type": "CascadedGaze", "width": 4, "middle_blk_num": 1, "enc_blk_nums": [1, 1],
                     "dec_blk_nums": [1, 1], "GCE_CONVS_nums": [3, 2]},
    "FlexNet": {"type": "FlexNet", "dim": 8, "num_blocks": [1], "hidden_rate": 2, "scale": 2},
    "MetaFlexNet": {"type": "metaflexnet", "dim": 2, "num_blocks": [1, 1, 1, 1], "hidden_rate": 1, "scale": 2},
}
SCALES = {"CascadedGaze": 1, "FlexNet": 2, "MetaFlexNet": 2}


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The fixture network (eval mode, weights loaded strictly) and its inputs / outputs."""
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]}).eval()
    net.load_state_dict(load_file(str(FIXTURES / f"{name}_params.safetensors")), strict=True)
    return net, load_file(str(FIXTURES / f"{name}_io.safetensors"))


# ----------------------------------------------------------------------------- traiNNer-redux parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == {"CascadedGaze", "FlexNet"}
    assert any(c["kwargs"].get("pipeline_type") == "meta" for c in MANIFEST.values())
    assert sum(p.stat().st_size for p in FIXTURES.iterdir()) < 1_000_000


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    params = load_file(str(FIXTURES / f"{name}_params.safetensors"))
    net = build_network({"type": case["type"], **case["kwargs"]})
    assert set(net.state_dict()) == set(params), "state-dict keys differ from traiNNer-redux's"
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    net.load_state_dict(params, strict=True)
    io = load_file(str(FIXTURES / f"{name}_io.safetensors"))
    for inp, out, mode in case["compare"]:
        net.train(mode == "train")
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} ({mode}) differs")


@pytest.mark.parametrize(("name", "inp", "why"), [
    ("cgnet_2levels", "input1", "33x37: zero-padded to 36x40 (a multiple of 4), cropped"),
    ("cgnet_3levels_gray", "input1", "29x30: zero-padded to 32x32, cropped"),
    ("flexnet_x4_ps", "input1", "13x10: reflect-padded to 16x16 (8x8 windows), cropped"),
    ("flexnet_x2_dysample_gray", "input1", "7x12: padded to 8x16, cropped"),
    ("flexnet_x8_nearest", "input0", "5x6: padded to 8x8, cropped"),
    ("metaflexnet_x1_ps", "input0", "40x50: padded to 64x64 (8x8 windows at 1/8 size), cropped"),
])
def test_padded_inputs_match_reference(name: str, inp: str, why: str) -> None:
    net, io = _case(name)
    x = io[inp]
    assert x.shape[-2] % net.tile_multiple or x.shape[-1] % net.tile_multiple, why
    with torch.no_grad():
        got = net(x)
    want = io[inp.replace("input", "output")]
    assert got.shape[-2:] == want.shape[-2:]
    torch.testing.assert_close(got, want, **FIXTURE_TOL, msg=why)


@pytest.mark.parametrize("name", ["cgnet_2levels", "flexnet_x3_nearest_cn"])
def test_training_gradients_match_reference(name: str) -> None:
    """Gradients of ``mean(output ** 2)``: CascadedGaze's layer norms are plain differentiable ops here (the
    reference writes the backward by hand); FlexNet's OmniShift trains as one folded conv (the reference: 3
    convs)."""
    net, io = _case(name)
    x = io["input0"].clone().requires_grad_(True)
    net.train()(x).square().mean().backward()
    assert x.grad is not None
    scale = io["grad_input0"].abs().max().item()
    torch.testing.assert_close(x.grad, io["grad_input0"], rtol=1e-4, atol=1e-5 * scale)
    grads = {k[len("grad."):]: v for k, v in io.items() if k.startswith("grad.")}
    trained = {n: p for n, p in net.named_parameters() if p.requires_grad}
    assert set(grads) == set(trained)
    for n, p in trained.items():
        assert p.grad is not None, n
        bound = 1e-5 * max(grads[n].abs().max().item(), 1e-3)
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=bound, msg=f"{name}: {n}")


def test_tile_multiples_and_minimum_size() -> None:
    assert build_network(TINY["FlexNet"]).tile_multiple == 8
    assert build_network(TINY["MetaFlexNet"]).tile_multiple == 64
    tiny = build_network(TINY["CascadedGaze"])
    assert (tiny.tile_multiple, tiny.min_size) == (4, 32)  # level 0: 3 extractor convs need 31 pixels
    with torch.device("meta"):
        published = build_network({"type": "cascadedgaze"})
    assert (published.tile_multiple, published.min_size) == (16, 64)  # level 1 (3 convs at 1/2 size): 62
    assert cg._smallest_side(*cg.GCE_LAYOUTS[2]) == 7 and cg._smallest_side(*cg.GCE_LAYOUTS[3]) == 31


def test_cascadedgaze_below_its_minimum_size_is_zero_padded() -> None:
    """The original fails below the size its extractors need; here the input is zero-padded up to it."""
    net, _ = _case("cgnet_2levels")
    x = torch.rand(1, 3, 9, 20)
    with torch.no_grad():
        got = net(x)
        want = net(F.pad(x, (0, 12, 0, 23)))[..., :9, :20]
    assert got.shape == x.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(("n_in", "n_out"), [(16, 32), (7, 33), (2, 37), (3, 9), (5, 5), (11, 96), (13, 200)])
def test_nearest_resize_by_gathers_equals_interpolate(n_in: int, n_out: int, monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(2, 3, n_in, n_in + 1, requires_grad=True)
    size = (n_out, n_out + 3)
    want = F.interpolate(x, size=size, mode="nearest")
    monkeypatch.setattr(cg, "resamples_by_gathers", lambda _device: True)
    got = cg.resize_nearest(x, size)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    g = torch.randn_like(want)
    (gw,) = torch.autograd.grad(want, x, g)
    (gg,) = torch.autograd.grad(got, x, g)
    torch.testing.assert_close(gg, gw, rtol=1e-5, atol=1e-4)  # the same sums in another order


@pytest.mark.parametrize(("x_dtype", "w_dtype"), [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
                                                  (torch.bfloat16, torch.bfloat16), (torch.float64, torch.float64)])
def test_rms_norm_is_torchs(x_dtype: torch.dtype, w_dtype: torch.dtype) -> None:
    """The same values and result type as torch.nn.RMSNorm (machine epsilon of float32 for a bf16 input too, which
    matters for FlexNet's narrow channels under bf16 autocast); written out for the ONNX exporter."""
    torch.manual_seed(0)
    mine, ref = RMSNorm(6).to(w_dtype), torch.nn.RMSNorm(6).to(w_dtype)
    with torch.no_grad():
        mine.weight.normal_()
        ref.weight.copy_(mine.weight)
    x = (torch.randn(4, 5, 6) * torch.tensor([1e-3, 1.0, 30.0, 1e-4, 1.0]).view(1, 5, 1)).to(x_dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: mixed dtypes cannot use its fused kernel
        want = ref(x)
    got = mine(x)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


# ----------------------------------------------------------------------------- re-parameterised FlexNet

@pytest.mark.parametrize("name", ["flexnet_x4_ps", "flexnet_x2_dysample_gray"])
def test_eval_refolds_from_the_branches_and_reparameterize_freezes_it(name: str) -> None:
    net, io = _case(name)
    stale = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        evaluated = net(io["input0"])
    folded = net.state_dict()
    changed = {k for k in folded if not torch.equal(folded[k], stale[k])}
    # only the derived convs were rewritten (the stored ones in the fixture are stale, as in checkpoints)
    assert changed and all("conv5x5_reparam" in k for k in changed)
    net.reparameterize()
    with torch.no_grad():
        for module in net.modules():  # a change of the folded branches no longer reaches the network
            if isinstance(module, OmniShift):
                module.alpha.add_(0.5)
        frozen = net(io["input0"])
        assert not torch.equal(net.train()(io["input0"]), frozen)
    torch.testing.assert_close(frozen, evaluated, rtol=0, atol=0)


def test_derived_convs_are_never_trained() -> None:
    net = build_network(TINY["FlexNet"]).train()
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen and frozen == {n for n in net.state_dict() if "conv5x5_reparam" in n}
    net(torch.rand(1, 3, 8, 8)).mean().backward()
    assert all(p.grad is not None for n, p in net.named_parameters() if n not in frozen)


def test_training_and_eval_forms_agree() -> None:
    net, io = _case("flexnet_x3_nearest_cn")
    with torch.no_grad():
        torch.testing.assert_close(net.train()(io["input1"]), net.eval()(io["input1"]), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- names, arguments, sizes

def test_trainner_names_build_the_classes() -> None:
    with torch.device("meta"):
        assert type(build_network({"type": "cascadedgaze"})).__name__ == "CascadedGaze"
        flex = build_network({"type": "flexnet", "scale": 2})
    meta = build_network({"type": "metaflexnet", "scale": 3, "upsampler": "nearest+conv", "dim": 2})
    assert (flex.pipeline_type, flex.scale, len(flex.pipeline.att)) == ("linear", 2, 6)
    assert (meta.pipeline_type, meta.scale, int(meta.scale_factor)) == ("meta", 3, 3)
    assert [len(getattr(meta.pipeline, f"enc{i}")[0].t_blocks) for i in range(4)] == [4, 6, 6, 8]


def test_published_sizes() -> None:
    """Parameter counts and state-dict sizes of traiNNer-redux's defaults (x4; counted with its classes)."""
    def count(opt: dict) -> tuple[int, int]:
        with torch.device("meta"):
            net = build_network(opt)
        return sum(p.numel() for p in net.parameters()), len(net.state_dict())

    assert count({"type": "cascadedgaze"}) == (119_223_063, 656)
    assert count({"type": "flexnet"}) == (3_045_136, 875)
    assert count({"type": "metaflexnet"}) == (67_205_424, 979)
    assert count({"type": "flexnet", "upsampler": "dysample"}) == (3_023_075, 879)
    assert count({"type": "flexnet", "upsampler": "nearest+conv"}) == (3_176_099, 884)


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "CascadedGaze", "scale": 2}, r"network_g\.scale: CascadedGaze restores at scale 1 only"),
    ({"type": "CascadedGaze", "enc_blk_nums": [1, 1]}, r"network_g\.dec_blk_nums: .*one decoder level per"),
    ({"type": "CascadedGaze", "GCE_CONVS_nums": [3, 3]}, r"network_g\.GCE_CONVS_nums: .*4 levels, .* 2 entries"),
    ({"type": "CascadedGaze", "GCE_CONVS_nums": [3, 4, 2, 2]}, r"network_g\.GCE_CONVS_nums: .*2 or 3 convs"),
    ({"type": "CascadedGaze", "enc_blk_nums": [1, -1, 1, 1]}, r"network_g\.enc_blk_nums: .*block counts >= 0"),
    ({"type": "FlexNet", "upsampler": "conv"}, r"network_g\.upsampler: FlexNet has no upsampler 'conv'"),
    ({"type": "FlexNet", "upsampler": "nearest+conv", "scale": 6}, r"network_g\.scale: .*3 or a power of 2"),
    ({"type": "FlexNet", "upsampler": "dysample", "dim": 5}, r"network_g\.dim: .*dim must be even, got 5"),
    ({"type": "FlexNet", "window_size": 16}, r"network_g\.window_size: .*must be 8, got 16"),
    ({"type": "FlexNet", "pipeline_type": "unet"}, r"network_g\.pipeline_type: FlexNet has no pipeline_type"),
    ({"type": "metaflexnet", "num_blocks": [2, 2]}, r"network_g\.num_blocks: .*4 levels"),
    ({"type": "metaflexnet", "dim": 7}, r"network_g\.dim: .*meta pipeline halves dim"),
    ({"type": "FlexNet", "num_blocks": []}, r"network_g\.num_blocks: FlexNet needs a non-empty list"),
    ({"type": "FlexNet", "scale": 0}, r"network_g\.scale: FlexNet needs an integer scale >= 1"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err:
        build_network(opt)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a == "MetaFlexNet" else a
                                  for a in TINY])
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = build_network(TINY[arch]).eval()
    with torch.no_grad():  # away from the zero init of CascadedGaze's block scales, so the blocks count
        for name, p in net.named_parameters():
            if name.endswith(("beta", "gamma")):
                p.normal_(0, 0.5)
    check_onnx_at_unseen_size(net, TINY[arch], SCALES[arch], tmp_path)


# ----------------------------------------------------------------------------- XLA:CPU

XLA_SHAPES = {"CascadedGaze": (1, 3, 32, 36), "FlexNet": (1, 3, 8, 16), "MetaFlexNet": (1, 3, 16, 16)}


@pytest.mark.xla
@pytest.mark.parametrize("arch", list(TINY))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    # and the eval form (FlexNet: the folded OmniShift) lowers too
    check_xla_train_step(TINY[arch], XLA_SHAPES[arch], scale=SCALES[arch])

"""traiNNer-redux's CascadedGaze and FlexNet / MetaFlexNet.

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_cgflex_fixtures.py``): the state dicts load
strictly and give its outputs (eval mode, sizes that need the networks' internal padding, FlexNet's training-mode
OmniShift branches) and its training-mode gradients (CascadedGaze's hand-written layer-norm backward, the unfolded
OmniShift). Also: the deployment fold, the minimum size, nearest resizing by gathers, ONNX through anysr's exporter,
and an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``). Where they are tested:
reference parity over the fixture manifest, bad arguments, ONNX at unseen sizes, the XLA:CPU step and the checks
every architecture gets run from ``tests/archs/test_standard.py`` over the family's cards
(``tests/archs/cards.py``); this module keeps what is particular to the family.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from arch_checks import FIXTURES, load_case, manifest
from cards import CARDS
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs import cascadedgaze_arch as cg
from anysr.archs.flexnet_arch import OmniShift, RMSNorm

GROUP = "cgflex"
MANIFEST = manifest(GROUP)["cases"]

# The tiny networks of each kind and their scales (tests/archs/cards.py)
TINY = {a: CARDS[a].net for a in ("CascadedGaze", "FlexNet", "MetaFlexNet")}
SCALES = {a: CARDS[a].scale for a in TINY}


# ----------------------------------------------------------------------------- traiNNer-redux parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == {"CascadedGaze", "FlexNet"}
    assert any(c["kwargs"].get("pipeline_type") == "meta" for c in MANIFEST.values())
    assert sum(p.stat().st_size for p in (FIXTURES / GROUP).iterdir()) < 1_000_000


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
    net, _ = load_case(GROUP, "cgnet_2levels")
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
    net, io = load_case(GROUP, name)
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
    net, io = load_case(GROUP, "flexnet_x3_nearest_cn")
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





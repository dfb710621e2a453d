"""traiNNer-redux's SPANF and SPANF3 (SPAN variants).

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_spanf_fixtures.py``): the state dicts load
strictly and give its outputs in eval mode (sizes SPANF3's unshuffle pads) and in training mode (SPANF3's unfolded
branches), and its training gradients (SPANF: only its grouped near conv and 1x1 fusion train, as in
traiNNer-redux). Also: SPANF3's re-parameterisation, traiNNer-redux's names (``spanf``, ``spanf3``: functions taking
``scale``) and sizes, recognition from the weights apart from SPAN and SpanPlus, bad arguments, ONNX through
anysr's exporter at unseen sizes, and an XLA:CPU train step that compiles once with no aten op left to the CPU
(``-m xla``). The checks every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training
runs) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step, fixture_io, load_case, stored_params
from conftest import FIXTURE_TOL, ROOT

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise_all
from anysr.archs.span_arch import Conv3XC
from anysr.archs.spanf_arch import SPANF3, EvalConv3XC
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "spanf"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
GROUP = "spanf"

# Tiny networks (ONNX, XLA, the training rows in archs/test_standard.py); SPANF3 with and without the unshuffled stem
TINY = {
    "SPANF": {"type": "SPANF", "feature_channels": 8, "upscale": 2},
    "SPANF3": {"type": "SPANF3", "feature_channels": 8, "num_blocks": 2, "upscale": 2, "unshuffle_mod": True},
    "SPANF3-x1": {"type": "SPANF3", "feature_channels": 4, "num_blocks": 1, "upscale": 1, "unshuffle_mod": True},
    "SPANF3-x3": {"type": "SPANF3", "feature_channels": 4, "num_blocks": 1, "upscale": 3},
}


# ----------------------------------------------------------------------------- traiNNer-redux parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == {"SPANF", "SPANF3"}
    unshuffled = {c["kwargs"]["upscale"] for c in MANIFEST.values() if c["kwargs"].get("unshuffle_mod")}
    assert {1, 2} <= unshuffled  # both unshuffle factors (4 and 2)
    assert all(p.stat().st_size < 200_000 for p in FIXTURES.iterdir())


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    """Eval mode (SPANF3: the convs refolded from the branches; the stored folded convs are stale) and training
    mode (SPANF3: the two branches)."""
    case = MANIFEST[name]
    params = stored_params(GROUP, name)
    net = build_network({"type": case["type"], **case["kwargs"]})
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    net.load_state_dict(params, strict=True)
    io = fixture_io(GROUP, name)
    assert any(mode == "train" for *_, mode in case["compare"])
    for inp, out, mode in case["compare"]:
        net.train(mode == "train")
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} ({mode}) differs")


@pytest.mark.parametrize(("name", "why"), [
    ("spanf3_x2_unshuffle", "7x5: reflect-padded to 8x6 (unshuffle 2) inside forward, cropped"),
    ("spanf3_x1_unshuffle", "10x7: padded to 12x8 (unshuffle 4), cropped"),
])
def test_padded_inputs_match_reference(name: str, why: str) -> None:
    net, io = load_case(GROUP, name)
    x = io["input1"]
    assert x.shape[-2] % net.tile_multiple or x.shape[-1] % net.tile_multiple, why
    with torch.no_grad():
        got = net(x)
    torch.testing.assert_close(got, io["output1"], **FIXTURE_TOL, msg=why)


GRADIENT_CASES = sorted(n for n in MANIFEST if "grad_input0" in fixture_io(GROUP, n))


def test_gradient_cases_cover_both_archs() -> None:
    assert {MANIFEST[n]["type"] for n in GRADIENT_CASES} == {"SPANF", "SPANF3"}


@pytest.mark.parametrize("name", GRADIENT_CASES)
def test_training_gradients_match_reference(name: str) -> None:
    """Gradients of ``mean(output ** 2)`` in training mode, for the input and exactly the parameters traiNNer-redux
    trains."""
    net, io = load_case(GROUP, name)
    x = io["input0"].clone().requires_grad_(True)
    net.train()(x).square().mean().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, io["grad_input0"], rtol=1e-4, atol=1e-5 * io["grad_input0"].abs().max().item())
    grads = {k[len("grad."):]: v for k, v in io.items() if k.startswith("grad.")}
    assert set(grads) == {n for n, p in net.named_parameters() if p.requires_grad}
    for n, p in net.named_parameters():
        if n in grads:
            bound = 1e-5 * max(grads[n].abs().max().item(), 1e-3)
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=bound, msg=f"{name}: {n}")
        else:
            assert p.grad is None, n


def test_spanf_trains_only_its_near_conv_and_fusion() -> None:
    """SPANF's convs are traiNNer-redux's folded convs only, frozen there: they never train here either."""
    net = build_network(TINY["SPANF"]).train()
    assert {n for n, p in net.named_parameters() if p.requires_grad} == {"conv_near.weight", "conv_cat.weight",
                                                                         "conv_cat.bias"}
    assert all(isinstance(m, EvalConv3XC) for n, m in net.named_modules() if n.endswith(("_r", "conv_2")))
    with torch.no_grad():  # and training changes nothing in the forward
        x = torch.rand(1, 3, 6, 5)
        torch.testing.assert_close(net(x), net.eval()(x), rtol=0, atol=0)


# ----------------------------------------------------------------------------- SPANF3's re-parameterisation

def test_spanf3_derived_convs_are_never_trained() -> None:
    net = build_network(TINY["SPANF3"]).train()
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen and frozen == {n for n in net.state_dict() if "eval_conv" in n}
    net(torch.rand(1, 3, 8, 8)).mean().backward()
    assert all(p.grad is not None for n, p in net.named_parameters() if n not in frozen)


@pytest.mark.parametrize("name", ["spanf3_x4", "spanf3_x1_unshuffle"])
def test_eval_refolds_from_the_branches_and_reparameterize_freezes_it(name: str) -> None:
    net, io = load_case(GROUP, name)
    stale = {k: v.clone() for k, v in net.state_dict().items()}
    with torch.no_grad():
        evaluated = net(io["input0"])
    folded = net.state_dict()
    changed = {k for k in folded if not torch.equal(folded[k], stale[k])}
    assert changed and all("eval_conv" in k for k in changed)  # the fixture's stored folds are stale
    assert isinstance(net, SPANF3) and net.reparameterize() is net
    with torch.no_grad():
        for module in net.modules():  # a change of the branches no longer reaches the eval form
            if isinstance(module, Conv3XC):
                for p in module.parameters():
                    if p.requires_grad:
                        p.add_(0.5)
        frozen = net(io["input0"])
        assert not torch.equal(net.train()(io["input0"]), frozen)
    torch.testing.assert_close(frozen, evaluated, rtol=0, atol=0)


def test_attention_starts_near_one() -> None:
    """SPABV2's learned attention starts at tanh(3) everywhere (zero weights, bias 3), as traiNNer-redux's."""
    net = build_network(TINY["SPANF3"])
    assert not net.block_1.att_conv.weight.any()
    with torch.no_grad():
        att = net.block_1.attention(torch.randn(1, 8, 3, 4))
    torch.testing.assert_close(att, torch.full_like(att, torch.tanh(torch.tensor(3.0)).item()))


# ----------------------------------------------------------------------------- names, sizes, recognition

def test_tile_multiples_and_any_size() -> None:
    assert build_network(TINY["SPANF"]).tile_multiple == 1
    assert build_network(TINY["SPANF3"]).tile_multiple == 2
    assert build_network(TINY["SPANF3-x1"]).tile_multiple == 4
    assert build_network(TINY["SPANF3-x3"]).tile_multiple == 1
    assert build_network({**TINY["SPANF3"], "upscale": 4}).tile_multiple == 1  # no unshuffle at x4
    net = build_network(TINY["SPANF3-x1"]).eval()
    with torch.no_grad():  # below the unshuffle factor: reflect cannot pad 3 rows of 1, edge replication does
        assert net(torch.rand(1, 3, 1, 2)).shape == (1, 3, 1, 2)


def test_trainner_names_build_the_classes_with_its_defaults() -> None:
    with torch.device("meta"):
        f = build_network({"type": "spanf", "scale": 2})
        f3 = build_network({"type": "spanf3", "scale": 2})
        f3_x4 = build_network({"type": "spanf3"})
        cls = build_network({"type": "SPANF3", "upscale": 2})  # the class: traiNNer-redux's class defaults
    assert (type(f).__name__, f.upscale, f.block_2.in_channels) == ("SPANF", 2, 32)
    assert (type(f3).__name__, f3.upscale, f3.tile_multiple, f3.num_blocks) == ("SPANF3", 2, 2, 6)
    assert "conv_1.1.sk.weight" in f3.state_dict() and "conv_1.sk.weight" in cls.state_dict()
    assert f3_x4.upscale == 4 and f3_x4.tile_multiple == 1


def test_published_sizes() -> None:
    """Parameter counts (all / trained) of traiNNer-redux's ``spanf`` / ``spanf3`` (counted with its classes)."""
    def count(opt: dict) -> tuple[int, int]:
        with torch.device("meta"):
            net = build_network(opt)
        return sum(p.numel() for p in net.parameters()), sum(p.numel() for p in net.parameters() if p.requires_grad)

    assert count({"type": "spanf", "scale": 4}) == (148_288, 4_048)
    assert count({"type": "spanf", "scale": 2}) == (136_408, 2_572)
    assert count({"type": "spanf3", "scale": 4}) == (2_230_056, 1_833_816)
    assert count({"type": "spanf3", "scale": 2}) == (2_250_216, 1_850_088)
    assert count({"type": "spanf3", "scale": 1}) == (2_334_096, 1_918_416)


# Each family of SPAN's blocks, in several layouts: its weights are recognised as itself and nothing else.
SPAN_FAMILIES = [
    {"type": "SPAN", "feature_channels": 8, "upscale": 2},
    {"type": "SPAN", "feature_channels": 8, "upscale": 1, "norm": False},
    {"type": "SpanPlus", "feature_channels": 8, "blocks": [1], "upscale": 2},
    {"type": "SpanPlus", "feature_channels": 8, "blocks": [1], "upscale": 2, "upsampler": "ps"},
    {"type": "SPANF", "feature_channels": 8, "upscale": 4},
    {"type": "SPANF", "feature_channels": 3, "upscale": 1},
    {"type": "SPANF", "num_in_ch": 1, "num_out_ch": 1, "feature_channels": 4, "upscale": 3},
    {"type": "SPANF3", "feature_channels": 8, "num_blocks": 6, "upscale": 4},
    {"type": "SPANF3", "feature_channels": 8, "num_blocks": 2, "upscale": 2, "unshuffle_mod": True},
    {"type": "SPANF3", "feature_channels": 8, "num_blocks": 1, "upscale": 1, "unshuffle_mod": True},
    {"type": "SPANF3", "num_in_ch": 1, "num_out_ch": 1, "feature_channels": 4, "num_blocks": 3, "upscale": 2},
    {"type": "SPANF3", "num_in_ch": 3, "num_out_ch": 1, "feature_channels": 4, "num_blocks": 0, "upscale": 3},
    {"type": "spanf"}, {"type": "spanf3", "scale": 2}, {"type": "span_s"}, {"type": "spanplus_s"},
]


@pytest.mark.parametrize("opt", SPAN_FAMILIES, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_each_span_family_is_recognised_as_itself(opt: dict) -> None:
    with torch.device("meta"):
        net = build_network(opt)
    layout = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    found = recognise_all(layout)
    assert [f.opt["type"] for f in found] == [type(net).__name__], [f.describe() for f in found]
    with torch.device("meta"):
        again = build_network(found[0].opt)
    assert {k: tuple(v.shape) for k, v in again.state_dict().items()} == layout


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_files_are_recognised(name: str) -> None:
    """traiNNer-redux's own state dicts: the class and the arguments that change the network."""
    case = MANIFEST[name]
    (found,) = recognise_all(stored_params(GROUP, name))
    assert found.opt["type"] == case["type"]
    kwargs = dict(case["kwargs"])
    if kwargs.get("unshuffle_mod") and kwargs["upscale"] > 2:
        del kwargs["unshuffle_mod"]  # nothing is unshuffled at x3 / x4 either way
    assert {k: found.opt.get(k, False if k == "unshuffle_mod" else None) for k in kwargs} == kwargs


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "SPANF", "upscale": 0}, r"network_g\.upscale: SPANF needs an integer upscale >= 1, got 0"),
    ({"type": "SPANF", "num_out_ch": 1}, r"network_g\.num_out_ch: SPANF outputs its input's channels"),
    ({"type": "SPANF3", "upscale": 1.5}, r"network_g\.upscale: SPANF3 needs an integer upscale >= 1"),
    ({"type": "SPANF3", "num_blocks": -1}, r"network_g\.num_blocks: SPANF3 needs an integer num_blocks >= 0"),
    ({"type": "spanf3", "scale": True}, r"network_g\.scale: the scale is a whole number .*, got True"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err:
        build_network(opt)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", list(TINY))
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    """45x70 at unshuffle 2 / 4: the padding to the unshuffle factor is computed from the input's size."""
    torch.manual_seed(0)
    opt = TINY[arch]
    check_onnx_at_unseen_size(build_network(opt), opt, opt["upscale"], tmp_path)


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
@pytest.mark.parametrize("arch", list(TINY))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    """9x7 inputs: SPANF3's unshuffle pads them (reflect, in the gradient's path too); the eval form (SPANF3's folds)
    lowers too."""
    opt = TINY[arch]
    check_xla_train_step(opt, (1, 3, 9, 7), eval_form=True, scale=opt["upscale"])

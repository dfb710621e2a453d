"""neosr's lightweight CNNs: CFSR (``cfsr``), HASN (``hasn``), KRGN (``krgn``) and MSDAN (``msdan``).

Fixtures come from neosr's own source (``tools/fixtures/make_neosr_light_fixtures.py``): the seeded weights (HASN at
the width of 52 its code needs) load strictly and give neosr's outputs in eval and in training mode (the
same computation: none of them has batch norm or dropout; CFSR's folded edge filters and KRGN's unused
re-parameterised conv leave no training-only branch), at sizes that are no multiple of any pooling stride, and its
training gradients. Also: neosr's lower-case names and published sizes, recognition from the state dict, MSDAN's
resampling by gathers (XLA's and ONNX's path) equal to PyTorch's, bad arguments, ONNX through anysr's exporter, and
an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``). The checks every architecture
gets (channels_last, bf16 autocast, the meta device, gradients, training runs) run from
``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import pytest
import torch
from arch_checks import FIXTURES, load_case, manifest, stored_params, weight_cases
from cards import CARDS
from conftest import FIXTURE_TOL
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs import msdan_arch as msdan
from anysr.archs.recognition.recognise import recognise, recognise_all
from anysr.archs.resize_util import adaptive_max_gather

GROUP = "neosr_light"
MANIFEST = manifest(GROUP)["cases"]
FAMILIES = ("CFSR", "HASN", "KRGN", "MSDAN")
NEOSR_NAMES = {"CFSR": "cfsr", "HASN": "hasn", "KRGN": "krgn", "MSDAN": "msdan"}
SCALE_ARG = {"CFSR": "upscale", "HASN": "upscale", "KRGN": "scale", "MSDAN": "upscale_factor"}

# Tiny networks of each kind (ONNX, XLA, the training rows in tests/archs/test_standard.py)
TINY = {a: CARDS[a].net for a in FAMILIES}  # tests/archs/cards.py


# ----------------------------------------------------------------------------- neosr parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == set(FAMILIES)
    assert all(p.stat().st_size < 200_000 for p in (FIXTURES / GROUP).iterdir())
    scales = {(c["type"], c["kwargs"][SCALE_ARG[c["type"]]]) for c in MANIFEST.values()}
    assert {(f, s) for f in ("HASN", "MSDAN") for s in (2, 3, 4)} <= scales


@pytest.mark.parametrize("name", ["cfsr_x1_conv_last", "cfsr_x2", "hasn_x2", "krgn_x2", "msdan_x2"])
def test_training_gradients_match_reference(name: str) -> None:
    """Gradients of ``mean(output ** 2)`` in training mode (HASN: the stored subset of its parameters; MSDAN: the
    upsampler's layers of other scales get none, in neosr too, and do not train here)."""
    net, io = load_case(GROUP, name)
    x = io["input0"].clone().requires_grad_(True)
    net.train()(x).square().mean().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, io["grad_input0"], rtol=1e-4, atol=1e-5 * io["grad_input0"].abs().max().item())
    grads = {k[len("grad."):]: v for k, v in io.items() if k.startswith("grad.")}
    trained = {n for n, p in net.named_parameters() if p.requires_grad}
    if MANIFEST[name]["type"] == "HASN":
        assert len(grads) > 10 and set(grads) < trained
    else:
        assert set(grads) == trained
    for n, p in net.named_parameters():
        if n in grads:
            assert p.grad is not None, n
            bound = 1e-5 * max(grads[n].abs().max().item(), 1e-3)
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=bound, msg=f"{name}: {n}")


def test_small_inputs_are_padded_and_cropped() -> None:
    """HASN below 15 pixels and MSDAN below 8 (where neosr's pooling fails): the network sees the input grown by
    reflect padding; the output is cropped back (MSDAN's bicubic skip on the unpadded input)."""
    from anysr.archs.arch_util import pad_to_min_size

    torch.manual_seed(0)
    for opt, need in ((TINY["HASN"], 15), (TINY["MSDAN"], 8)):
        net = build_network(opt).eval()
        x = torch.rand(1, 3, need - 3, need + 2)
        with torch.no_grad():
            got = net(x)
            full = net(pad_to_min_size(x, need))
        assert got.shape == (1, 3, 2 * (need - 3), 2 * (need + 2))
        if opt["type"] == "HASN":
            torch.testing.assert_close(got, full[..., : got.shape[-2], :], **FIXTURE_TOL)


# ----------------------------------------------------------------------------- MSDAN's resampling

@pytest.mark.parametrize(("h", "w"), [(8, 8), (9, 23), (17, 11), (45, 70)])
def test_msdan_gathers_equal_pytorchs_resampling(h: int, w: int) -> None:
    """The gather forms (XLA, ONNX) of adaptive max pooling and nearest upsampling give PyTorch's values exactly;
    the bicubic upscaling (every device) within float rounding."""
    x = torch.rand(2, 3, h, w)
    for f in (2, 4, 8):
        pooled = F.adaptive_max_pool2d(x, (h // f, w // f))
        taps = 2 * f + 1  # MSDAN's and Light-SAFMN++'s (17 at f = 8) pools share resize_util's gather
        assert torch.equal(adaptive_max_gather(adaptive_max_gather(x, 2, h // f, taps), 3, w // f, taps), pooled)
        want = F.interpolate(pooled, size=(h, w), mode="nearest")
        assert torch.equal(msdan._nearest_1d(msdan._nearest_1d(pooled, 2, h), 3, w), want)
    for s in (2, 3, 4):
        torch.testing.assert_close(msdan.bicubic_upscale(x, s), F.interpolate(x, scale_factor=s, mode="bicubic"),
                                   rtol=1e-5, atol=1e-5)


def test_msdan_gather_path_matches_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(msdan, "_by_gathers", lambda x: True)
    net, io = load_case(GROUP, "msdan_x2")
    x = io["input0"].clone().requires_grad_(True)
    out = net.train()(x)
    torch.testing.assert_close(out.detach(), io["output0"], **FIXTURE_TOL)
    out.square().mean().backward()
    torch.testing.assert_close(x.grad, io["grad_input0"], rtol=1e-4, atol=1e-5 * io["grad_input0"].abs().max().item())


# ----------------------------------------------------------------------------- names, sizes, recognition

@pytest.mark.parametrize(("family", "scale", "params"), [
    # neosr's classes at their defaults (counted with them)
    ("CFSR", 4, 306_912), ("CFSR", 2, 291_324), ("HASN", 4, 435_272), ("HASN", 3, 425_423),
    ("KRGN", 4, 610_960), ("KRGN", 2, 590_188), ("MSDAN", 4, 231_258), ("MSDAN", 3, 231_258),
])
def test_published_sizes(family: str, scale: int, params: int) -> None:
    with torch.device("meta"):
        net = build_network({"type": NEOSR_NAMES[family], SCALE_ARG[family]: scale})
    assert type(net).__name__ == family
    assert sum(p.numel() for p in net.parameters()) == params


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_fixture_files_are_recognised_as_their_family(name: str) -> None:
    case = MANIFEST[name]
    params = load_case(GROUP, name)[0].state_dict()
    found = recognise(params)
    assert found.opt["type"] == case["type"]
    if case["type"] != "MSDAN":  # MSDAN's files hold every scale's layers: the scale is in no tensor
        want = case["kwargs"][SCALE_ARG[case["type"]]]
        if case["kwargs"].get("upsampler", "pixelshuffledirect") != "pixelshuffledirect":
            want = 1  # CFSR without its sub-pixel head: a same-size network whatever upscale says
        assert found.opt[SCALE_ARG[case["type"]]] == want
    with torch.device("meta"):
        net = build_network(found.opt)
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}


def test_no_other_fixture_is_recognised_as_these_families() -> None:
    for group, name in weight_cases(skip=GROUP)[::6]:  # a sixth of the other groups' cases (build time)
        got = {r.opt["type"] for r in recognise_all(stored_params(group, name))}
        assert not got & set(FAMILIES), f"{group}/{name}: {got & set(FAMILIES)}"


# ----------------------------------------------------------------------------- arguments

# ----------------------------------------------------------------------------- ONNX

# ----------------------------------------------------------------------------- XLA:CPU


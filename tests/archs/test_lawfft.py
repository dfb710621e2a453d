"""traiNNer-redux's LAWFFT.

Fixtures come from traiNNer-redux's own source (``tools/fixtures/make_lawfft_fixtures.py``): the state dicts load
strictly and give its outputs (input sizes no multiple of the window, windows 4, 6 and 8, the unshuffle stem, four
head kinds) and its gradients, with the whole-image transforms as ``torch.fft`` and as DFT matrix products (the XLA
/ ONNX form). Also: the DFT helpers against ``torch.fft``, recognition, bad arguments, ONNX through anysr's exporter
at a size it never saw, and an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``).
The checks every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs) run
from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_checks import load_case
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file

import anysr.archs.lawfft_arch as lawfft
from anysr.archs import build_network
from anysr.archs.fftformer_arch import dft_bases, from_patches, to_patches
from anysr.archs.recognition.recognise import recognise

FIXTURES = ROOT / "tests" / "fixtures" / "lawfft"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]


@pytest.fixture(params=["fft", "dft"])
def transform(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Whole-image transforms as torch.fft (CPU default) or as DFT matrix products (what XLA and ONNX run)."""
    if request.param == "dft":
        monkeypatch.setattr(lawfft, "_NATIVE_FFT", frozenset())
    return request.param


def test_fixtures_cover_the_variants() -> None:
    kw = [c["kwargs"] for c in MANIFEST.values()]
    assert {k["window_size"] for k in kw} == {4, 6, 8}
    assert {k["upsampler"] for k in kw} == {"pixelshuffle", "pixelshuffledirect", "transpose+conv", "nearest+conv"}
    assert any(k.get("unshuffle_mod") for k in kw) and any(k["in_ch"] == 1 for k in kw)
    assert all(p.stat().st_size < 200_000 for p in FIXTURES.iterdir())


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str, transform: str) -> None:
    net, io = load_case("lawfft", name)
    params = load_file(str(FIXTURES / f"{name}_params.safetensors"))
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    for inp, out, _ in MANIFEST[name]["compare"]:
        with torch.no_grad():
            got = net(io[inp])
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} ({transform}) differs")


@pytest.mark.parametrize("name", ["lawfft_x2_ps", "lawfft_x3_w6_direct"])
def test_training_gradients_match_reference(name: str, transform: str) -> None:
    net, io = load_case("lawfft", name)
    x = io["input0"].clone().requires_grad_(True)
    net.train()(x).square().mean().backward()
    torch.testing.assert_close(x.grad, io["grad_input0"], rtol=1e-4, atol=1e-5 * io["grad_input0"].abs().max().item())
    grads = {k[len("grad."):]: v for k, v in io.items() if k.startswith("grad.")}
    assert set(grads) == {n for n, p in net.named_parameters() if p.requires_grad}
    for n, p in net.named_parameters():
        bound = 1e-5 * max(grads[n].abs().max().item(), 1e-3)
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=bound, msg=f"{name}: {n}")


@pytest.mark.parametrize(("h", "w"), [(16, 16), (12, 18), (7, 9), (5, 6), (1, 4)])
def test_dft_circular_convolution_equals_fft(h: int, w: int) -> None:
    gen = torch.Generator().manual_seed(h * 100 + w)
    q, k = torch.randn(2, 3, h, w, generator=gen), torch.randn(2, 3, h, w, generator=gen)
    want = torch.fft.irfft2(torch.fft.rfft2(q) * torch.fft.rfft2(k), s=(h, w))
    torch.testing.assert_close(lawfft.circular_conv2d_dft(q, k), want, rtol=1e-5, atol=2e-5 * want.abs().max())


@pytest.mark.parametrize("size", [4, 5, 6, 8])
def test_window_dft_bases_equal_fft(size: int) -> None:
    x = torch.randn(1, 2, 2 * size, 3 * size, generator=torch.Generator().manual_seed(size))
    fwd, inv = dft_bases(x.device, size)
    spec = to_patches(x, size) @ fwd
    patches = x.unflatten(3, (-1, size)).unflatten(2, (-1, size)).transpose(3, 4)
    want = torch.fft.rfft2(patches)
    torch.testing.assert_close(spec, torch.cat([want.real.flatten(-2), want.imag.flatten(-2)], -1),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(from_patches(spec @ inv, size), x, rtol=1e-5, atol=1e-5)


def test_checkpoint_meta_record_is_replaced_and_files_are_recognised() -> None:
    for name, case in MANIFEST.items():
        params = load_file(str(FIXTURES / f"{name}_params.safetensors"))
        found = recognise(params)
        assert found.opt["type"] == "LAWFFT", name
        want = {"in_ch": 3, "split": 0.25, "t_mid_factor": 1.0, "unshuffle_mod": False, "mid_dim": 64,
                **case["kwargs"]}
        got = {k: found.opt[k] for k in want}  # mid_dim from the MetaUpsample record where no tensor holds it
        assert int(got["split"] * want["dim"]) == int(want["split"] * want["dim"]), name
        got.pop("split"), want.pop("split")  # 1/3 of 12 is found as 4/12
        assert got == pytest.approx(want), name
    params = load_file(str(FIXTURES / "lawfft_x2_ps_params.safetensors"))
    params["upscale.MetaUpsample"] = torch.zeros(7, dtype=torch.uint8)
    net = build_network({"type": "LAWFFT", **MANIFEST["lawfft_x2_ps"]["kwargs"]})
    net.load_state_dict(params, strict=True)
    assert net.upscale.MetaUpsample.tolist() == [3, 2, 2, 12, 3, 8, 4]


def test_published_default_size() -> None:
    """traiNNer-redux's defaults (dim 60, 4 x 6 blocks, pixelshuffle head with 64 mid channels) at x4: counted
    with its class (x2: 1,638,659; x1 with unshuffle_mod: 1,810,671)."""
    with torch.device("meta"):
        net = build_network({"type": "LAWFFT"})
    assert sum(p.numel() for p in net.parameters()) == 1_786_371


def test_unshuffle_output_is_cropped_to_the_real_scale() -> None:
    net, io = load_case("lawfft", "lawfft_x2_unshuffle")
    with torch.no_grad():
        assert net(io["input1"]).shape[-2:] == (22, 26)


# ----------------------------------------------------------------------------- ONNX

# ----------------------------------------------------------------------------- XLA:CPU


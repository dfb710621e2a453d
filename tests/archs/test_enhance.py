"""x1 enhancement / restoration architectures RetinexFormer, HVICIDNet (CIDNet), FFTformer and MixDehazeNet.

Fixtures come from spandrel 0.4.2 (``tools/fixtures/make_enhance_fixtures.py``): the state dicts load strictly and
give spandrel's outputs; inputs off the size requirement give spandrel's outputs for the same padding. Also: the
pieces rewritten for XLA (HVI colour transforms with ``torch.where``, the 8x8 FFTs as DFT matrices, bilinear resizes
by gathers), ONNX and one XLA:CPU compile-once / no-CPU-fallback check per architecture (``-m xla`` in the XLA
venv). Where they are tested: reference parity over the fixture manifest, bad arguments, ONNX at unseen sizes, the
XLA:CPU step and the checks every architecture gets run from ``tests/archs/test_standard.py`` over the family's
cards (``tests/archs/cards.py``); this module keeps what is particular to the family.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from arch_checks import check_xla_train_step, load_case, manifest, stored_params
from cards import CARDS
from conftest import FIXTURE_TOL
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.fftformer_arch import dft_bases, from_patches, to_patches
from anysr.archs.resize_util import resize_bilinear_gather

GROUP = "enhance"
MANIFEST = manifest(GROUP)["cases"]

TINY = {a: CARDS[a].net for a in ("RetinexFormer", "HVICIDNet", "FFTformer", "MixDehazeNet")}  # tests/archs/cards.py


# ----------------------------------------------------------------------------- spandrel parity

def test_tile_multiples_and_channels() -> None:
    assert {a: build_network(dict(o)).tile_multiple for a, o in TINY.items()} == {
        "RetinexFormer": 8, "HVICIDNet": 8, "FFTformer": 32, "MixDehazeNet": 4}
    assert build_network(dict(TINY["RetinexFormer"])).in_channels == 3  # not the estimator's 4 (RGB + mean)


def test_type_aliases() -> None:
    for alias in ("CIDNet", "HVI-CIDNet", "hvicidnet"):
        assert type(build_network({"type": alias, "channels": [4, 4, 8, 8], "heads": [1, 1, 2, 2]})).__name__ \
            == "HVICIDNet"
    assert type(build_network({"type": "Retinexformer", "n_feat": 4, "stage": 1})).__name__ == "RetinexFormer"


@pytest.mark.parametrize(("name", "prefix"), [("hvicidnet", "I_LCA5."), ("fftformer", "reduce_chan_level2.")])
def test_frozen_modules_do_not_change_the_output(name: str, prefix: str) -> None:
    """The authors' forward never uses these weights: they are frozen (DDP would report them unused)."""
    net, io = load_case(GROUP, name)
    params = stored_params(GROUP, name)
    assert any(k.startswith(prefix) for k in params)
    scrambled = {k: (v + 1.0 if k.startswith(prefix) else v) for k, v in params.items()}
    net.load_state_dict(scrambled, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(net(io["input0"]), io["output0"], **FIXTURE_TOL)


# ----------------------------------------------------------------------------- rewritten pieces

def test_hvi_transform_round_trips_and_k_gets_its_gradient() -> None:
    net = build_network(dict(TINY["HVICIDNet"]))
    gen = torch.Generator().manual_seed(0)
    img = torch.rand(2, 3, 9, 7, generator=gen)
    img[0, :, 0, 0] = 0.5  # grey: hue 0
    img[0, :, 0, 1] = 0.0  # black: saturation 0
    img[1, :, 1, 1] = torch.tensor([0.9, 0.9, 0.2])  # ties between the max channels
    hvi = net.trans.HVIT(img)
    assert hvi.shape == img.shape and torch.equal(hvi[:, 2], img.amax(1))
    assert hvi[0, :2, 0, 0].abs().max() < 1e-6 and hvi[0, :2, 0, 1].abs().max() < 1e-6
    torch.testing.assert_close(net.trans.PHVIT(hvi), img, rtol=1e-4, atol=2e-5)
    # HSV hue of pure red / green / blue after the transform: angles 0, 1/3, 2/3 of a turn
    prim = torch.eye(3).view(3, 3, 1, 1)
    xy = net.trans.HVIT(prim)[:, :2, 0, 0]
    angles = torch.atan2(xy[:, 1], xy[:, 0]) % (2 * math.pi)
    torch.testing.assert_close(angles, torch.tensor([0.0, 2 * math.pi / 3, 4 * math.pi / 3]))
    net.trans.PHVIT(net.trans.HVIT(img)).sum().backward()
    assert net.trans.density_k.grad is not None  # from HVIT; PHVIT reads k as a constant (as the authors' code)


def test_dft_matrices_match_torch_fft() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 16, 24, generator=gen)
    fwd, inv = dft_bases(x.device)
    spec = to_patches(x) @ fwd
    ref = torch.fft.rfft2(x.unflatten(3, (-1, 8)).unflatten(2, (-1, 8)).transpose(3, 4))
    torch.testing.assert_close(spec[..., :40], ref.real.flatten(-2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(spec[..., 40:], ref.imag.flatten(-2), rtol=1e-5, atol=1e-5)
    assert torch.equal(from_patches(to_patches(x)), x)
    # any spectrum (not Hermitian in the DC / Nyquist columns) goes back as irfft2 takes it back
    z = torch.randn(2, 3, 2, 3, 80, generator=gen)
    want = torch.fft.irfft2(torch.complex(z[..., :40], z[..., 40:]).unflatten(-1, (8, 5)), s=(8, 8)).flatten(-2)
    torch.testing.assert_close(z @ inv, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("shape", "size", "align"), [
    ((1, 2, 8, 12), (4, 6), True), ((1, 2, 9, 5), (4, 2), True), ((2, 3, 4, 6), (8, 12), True),
    ((2, 3, 4, 6), (8, 12), False), ((1, 1, 5, 3), (10, 6), False), ((1, 2, 2, 1), (4, 2), False),
])
def test_gather_resize_matches_interpolate(shape: tuple[int, ...], size: tuple[int, int], align: bool) -> None:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1), requires_grad=True)
    got = resize_bilinear_gather(x, size, align)
    ref = F.interpolate(x, size=size, mode="bilinear", align_corners=align)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)
    w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(2))
    g_got, = torch.autograd.grad((got * w).sum(), x)
    g_ref, = torch.autograd.grad((ref * w).sum(), x)
    torch.testing.assert_close(g_got, g_ref, rtol=1e-5, atol=1e-6)


def test_fftformer_halving_is_the_bilinear_one() -> None:
    x = torch.randn(1, 2, 8, 12)
    down = build_network(dict(TINY["FFTformer"])).down1_2.body[0]
    torch.testing.assert_close(down(x), F.interpolate(x, scale_factor=0.5, mode="bilinear", align_corners=False),
                               rtol=1e-6, atol=1e-6)


def test_mixdehazenet_batch_norm_statistics_update_in_training_only() -> None:
    net, io = load_case(GROUP, "mixdehazenet")
    before = net.layer1.blocks[0].norm1.running_mean.clone()
    with torch.no_grad():
        net(io["input0"])
        assert torch.equal(net.layer1.blocks[0].norm1.running_mean, before)
        net.train()(io["input0"])
    assert not torch.equal(net.layer1.blocks[0].norm1.running_mean, before)


# ----------------------------------------------------------------------------- build errors

# ----------------------------------------------------------------------------- ONNX

@pytest.mark.slow
@pytest.mark.parametrize("arch", ["RetinexFormer", "HVICIDNet", "FFTformer"])
def test_onnx_export_has_dynamic_sizes(arch: str, tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    from anysr.engine.inference.export import export_onnx

    torch.manual_seed(0)
    net = build_network(dict(TINY[arch])).eval()
    rep = export_onnx(net, tmp_path / "m.onnx", scale=1, net_opt=TINY[arch])
    assert rep.dynamic is True and len(rep.checks) == 3 and max(c.max_diff for c in rep.checks) < 1e-4
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.rand(1, 3, 45, 70)  # a size the export never saw, off every multiple
    got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
    with torch.no_grad():
        torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_onnx_mixdehazenet_is_exported_for_a_fixed_size(tmp_path: Path) -> None:
    """Inputs under 40 pixels are grown to 40 by a size-dependent branch: no dynamic graph (the check at 35 rows
    fails), so the exporter falls back to a fixed size, which onnxruntime reproduces."""
    pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    torch.manual_seed(0)
    net = build_network(dict(TINY["MixDehazeNet"])).eval()
    rep = export_onnx(net, tmp_path / "m.onnx", scale=1, net_opt=TINY["MixDehazeNet"], size=48)
    assert rep.dynamic is False and rep.size == 48 and "dynamic sizes failed" in rep.note
    assert rep.checks[0].shape == (1, 3, 48, 48) and rep.checks[0].max_diff < 1e-4


# ----------------------------------------------------------------------------- CLI training


# ----------------------------------------------------------------------------- XLA:CPU

XLA_SHAPES = {"RetinexFormer": (1, 3, 16, 16), "HVICIDNet": (1, 3, 16, 16), "FFTformer": (1, 3, 32, 32),
              "MixDehazeNet": (1, 3, 40, 40)}


@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(TINY))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    # the CPU twin: the shared check seeds 0, builds, then draws its input, the same weights and input
    torch.manual_seed(0)
    cpu_net = build_network(dict(TINY[arch])).train()
    x_cpu = torch.rand(XLA_SHAPES[arch])
    # MixDehazeNet's batch norms: torch_xla compiles a plain nn.BatchNorm2d twice (its running statistics change
    # from initial values to step outputs), then never again: 3 steps, nothing new after the second.
    run = check_xla_train_step(TINY[arch], XLA_SHAPES[arch], steps=3 if arch == "MixDehazeNet" else 2)
    assert torch.equal(run.x.cpu(), x_cpu)
    # the XLA graph (gather resizes, DFT matrices) computes what the CPU computes
    torch.testing.assert_close(run.losses[0].cpu(), cpu_net(x_cpu).square().mean().detach(), rtol=1e-4, atol=1e-6)

"""traiNNer-redux's i-LN variants of DAT and HAT (``DAT_iLN``: ``dat_iln``, ``dat_iln_s``, ``dat_iln_2``,
``dat_iln_light``; ``HAT_iLN``: ``hat_iln_s``, ``hat_iln_m``, ``hat_iln_l``, ``hat_iln_m_aligned``,
``hat_iln_l_aligned``), built from DAT's and HAT's own blocks with ``ImageLayerNorm`` as their norm.

Fixtures come from traiNNer-redux's own code (``python tools/fixtures/regen.py iln``): its seeded weights load
strictly and give its eval outputs (EMA unset: scales unclamped), then four training-mode forwards in sequence give
its outputs, input gradients and every i-LN's ``std_ema`` step by step (initialisation, the slow EMA, a spike the
guard clamps, a dip), its parameter gradients, and its eval outputs with the EMAs set. Also: the EMA rule itself,
plain DAT / HAT untouched, recognition from the state dict, presets, bad arguments, ONNX at a size never traced, and
an XLA:CPU train step that compiles once with no aten op left to the CPU and the same EMAs as the CPU (``-m xla``).
The checks every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs) run
from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step, load_case
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file

from anysr.archs import build_network
from anysr.archs.arch_util import AffineTransform, ImageLayerNorm
from anysr.archs.recognition.recognise import recognise, recognise_all
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "iln"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]

# Tiny networks (ONNX, XLA, the training rows in tests/archs/test_standard.py)
TINY = {
    "DAT_iLN": {"type": "DAT_iLN", "img_size": 8, "embed_dim": 32, "split_size": [2, 4], "depth": [2],
                "num_heads": [2], "expansion_factor": 1.0, "upscale": 2, "upsampler": "pixelshuffledirect",
                "drop_path_rate": 0.0},
    "HAT_iLN": {"type": "HAT_iLN", "img_size": 8, "embed_dim": 12, "depths": [2], "num_heads": [2], "window_size": 4,
                "compress_ratio": 3, "squeeze_factor": 4, "mlp_ratio": 2.0, "upscale": 1, "drop_path_rate": 0.0},
}
SCALES = {"DAT_iLN": 2, "HAT_iLN": 1}


def _emas(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: m.std_ema for n, m in net.named_modules() if isinstance(m, ImageLayerNorm)}


# ----------------------------------------------------------------------------- traiNNer-redux parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == {"DAT_iLN", "HAT_iLN"}
    assert all(p.stat().st_size < 200_000 for p in FIXTURES.iterdir())


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    net, io = load_case("iln", name)
    assert type(net).__name__ == MANIFEST[name]["type"]
    assert sorted(_emas(net)) == MANIFEST[name]["norms"]
    for j in range(MANIFEST[name]["evals"]):
        with torch.no_grad():
            got = net(io[f"input{j}"])
        torch.testing.assert_close(got, io[f"output{j}"], **FIXTURE_TOL, msg=f"{name} output{j}")


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_training_sequence_matches_reference_step_by_step(name: str) -> None:
    """Training-mode forwards in sequence (no optimiser step): outputs, input gradients and every ``std_ema`` after
    each step as traiNNer-redux's; step 2's spike is clamped (the batch std above twice the EMA somewhere, and some
    image's scale held at twice the EMA); the parameters' gradients of the last step; eval outputs with the EMAs
    set."""
    case = MANIFEST[name]
    net, io = load_case("iln", name)
    norms = {n: m for n, m in net.named_modules() if isinstance(m, ImageLayerNorm)}
    seen: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def record(module: ImageLayerNorm, args: tuple[torch.Tensor, ...], key: str = "") -> None:
        x = args[0].detach().reshape(args[0].shape[0], -1)
        seen[key] = (module.std_ema.clone(), torch.sqrt(x.var(1, unbiased=False) + module.eps))

    for n, m in norms.items():
        m.register_forward_pre_hook(lambda mod, args, key=n: record(mod, args, key))
    net.train()
    for k in range(case["train_steps"]):
        factors = torch.tensor(case["train_scales"][k]).view(-1, 1, 1, 1)  # per image (step 2: the spike)
        x = (io[f"train{k}_input"] * factors).requires_grad_(True)
        net.zero_grad(set_to_none=True)
        out = net(x)
        out.square().mean().backward()
        torch.testing.assert_close(out, io[f"train{k}_output"], **FIXTURE_TOL, msg=f"{name} step {k} output")
        scale = io[f"train{k}_grad_input"].abs().max().item()
        torch.testing.assert_close(x.grad, io[f"train{k}_grad_input"], rtol=1e-4, atol=1e-5 * scale,
                                   msg=f"{name} step {k} input gradient")
        for n, m in norms.items():
            torch.testing.assert_close(m.std_ema, io[f"train{k}_ema.{n}"], rtol=1e-5, atol=1e-7,
                                       msg=f"{name} step {k}: {n}.std_ema")
        if k == 0:
            assert all(float(seen[n][0]) == 0.0 for n in norms)  # the first forward copies the batch std
        if k == 2:
            assert any(float(std.mean()) > 2 * float(before) for before, std in seen.values()), "no spike clamped"
            assert any(bool((std > 2 * norms[n].std_ema).any()) for n, (_, std) in seen.items()), \
                "no image scale clamped"
    if case["param_grads"]:
        grads = load_file(str(FIXTURES / f"{name}_grads.safetensors"))
        trained = dict(net.named_parameters())
        assert {k[len("grad."):] for k in grads} == set(trained)
        for n, p in trained.items():
            want = grads[f"grad.{n}"]
            bound = 1e-5 * max(want.abs().max().item(), 1e-3)
            torch.testing.assert_close(p.grad, want, rtol=1e-4, atol=bound, msg=f"{name}: {n}")
    net.eval()
    for j in range(case["evals"]):
        with torch.no_grad():
            got = net(io[f"input{j}"])
        torch.testing.assert_close(got, io[f"after_train_output{j}"], **FIXTURE_TOL, msg=f"{name} after training")


def test_ema_rule_step_by_step() -> None:
    """``ImageLayerNorm``'s EMA and scale, written out: copy on the first training forward, then ``ema + 1e-3 *
    (min(batch, 2 ema) - ema)``; the scale ``min(std, 2 ema)`` (``std`` while the EMA is 0); eval leaves it."""
    torch.manual_seed(0)
    norm = ImageLayerNorm(4)
    steps = [torch.rand(2, 5, 4), torch.rand(2, 5, 4), torch.rand(2, 5, 4) * torch.tensor([9.0, 1.0]).view(2, 1, 1),
             torch.rand(2, 5, 4) * 0.1]
    ema = 0.0
    for i, x in enumerate(steps):
        flat = x.reshape(2, -1).double()
        std = torch.sqrt(flat.var(1, unbiased=False) + 1e-4)
        batch = float(std.mean())
        ema = batch if i == 0 else ema + 1e-3 * (min(batch, 2 * ema) - ema)
        normed, scale = norm.train()(x)
        assert float(norm.std_ema) == pytest.approx(ema, rel=1e-6)
        torch.testing.assert_close(scale.view(-1).double(), torch.minimum(std, torch.tensor(2 * ema)), rtol=1e-6,
                                   atol=0)
        want = (flat - flat.mean(1, keepdim=True)) / std[:, None]
        torch.testing.assert_close(normed.reshape(2, -1).double(), want, rtol=1e-5, atol=1e-6)
        if i == 2:
            assert batch > 2 * ema / (1 + 1e-3) and float(scale[0]) < float(std[0])  # spike and image clamped
    before = norm.std_ema.clone()
    _, scale = norm.eval()(steps[0] * 20)
    assert torch.equal(norm.std_ema, before)
    torch.testing.assert_close(scale.view(-1), (2 * before).expand(2))
    assert "std_ema" not in norm.state_dict()  # non-persistent, as traiNNer-redux's


def test_plain_dat_and_hat_keep_layer_norms_and_mean_shift() -> None:
    for arch, layer_norms in (("DAT", "DAT"), ("HAT", "HAT")):
        opt = {**TINY[f"{arch}_iLN"], "type": arch}
        plain = build_network(opt)
        assert not any(isinstance(m, (ImageLayerNorm, AffineTransform)) for m in plain.modules()), layer_norms
        assert plain.mean.abs().sum() > 0 and plain.img_range == 1.0
        iln = build_network(TINY[f"{arch}_iLN"])
        assert float(iln.mean.abs().sum()) == 0.0
        assert isinstance(iln.norm, AffineTransform)
        assert all(not isinstance(m, torch.nn.LayerNorm) or ".sg." in n or ".pos." in n
                   for n, m in iln.named_modules()), "a layer norm left in an i-LN network's blocks"
        plain_keys = {k: v.shape for k, v in plain.state_dict().items()}
        iln_keys = {k: v.shape for k, v in iln.state_dict().items()}
        if arch == "HAT":
            assert plain_keys == iln_keys  # the same names and shapes: files cannot tell them apart
        else:
            assert set(plain_keys) ^ set(iln_keys) == {"before_RG.1.weight", "before_RG.1.bias",
                                                      "before_RG.norm.weight", "before_RG.norm.bias"}


# ----------------------------------------------------------------------------- recognition

@pytest.mark.parametrize("name", sorted(n for n in MANIFEST if MANIFEST[n]["type"] == "DAT_iLN"))
def test_dat_iln_file_is_recognised_as_dat_iln(name: str) -> None:
    params = load_case("iln", name)[0].state_dict()  # the reference's file: seeded weights, computed buffers
    found = recognise(params, source=name)
    assert found.opt["type"] == "DAT_iLN" and not found.others, found
    net = build_network(found.opt)
    net.load_state_dict(params, strict=True)
    plain = {k: v.shape for k, v in build_network({**found.opt, "type": "DAT"}).state_dict().items()}
    found_plain = recognise(plain, source="dat")
    assert found_plain.opt["type"] == "DAT" and not found_plain.others


def test_hat_iln_file_has_hats_layout() -> None:
    """A HAT_iLN file holds HAT's names and shapes exactly (i-LN and the affine norms have a LayerNorm's weight and
    bias, the EMA is not saved): it is read as HAT, and naming HAT_iLN (``--arch HAT_iLN`` / ``hat_iln_*``) loads it
    strictly with traiNNer-redux's output."""
    net, io = load_case("iln", "hat_iln_x1")
    params = net.state_dict()  # the reference's file: seeded weights, computed buffers
    found = recognise_all(params)
    assert [r.opt["type"] for r in found] == ["HAT"]
    named = build_network({**found[0].opt, "type": "HAT_iLN"}).eval()
    named.load_state_dict(params, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(named(io["input0"]), io["output0"], **FIXTURE_TOL)


# ----------------------------------------------------------------------------- presets

@pytest.mark.parametrize(("name", "arch", "params"), [
    ("dat_iln", "DAT_iLN", 14_802_051), ("dat_iln_s", "DAT_iLN", 11_212_131), ("dat_iln_2", "DAT_iLN", 11_212_131),
    ("dat_iln_light", "DAT_iLN", 878_577), ("hat_iln_s", "HAT_iLN", 9_621_183), ("hat_iln_m", "HAT_iLN", 20_772_507),
    ("hat_iln_l", "HAT_iLN", 40_846_575), ("hat_iln_m_aligned", "HAT_iLN", 23_536_983),
    ("hat_iln_l_aligned", "HAT_iLN", 46_328_043),
])
def test_presets_build_trainner_sizes(name: str, arch: str, params: int) -> None:
    """traiNNer-redux's builders at x4 (their counts; tests/test_presets.py checks every tensor's shape)."""
    with torch.device("meta"):
        net = build_network({"type": name})
    assert type(net).__name__ == arch
    assert sum(p.numel() for p in net.parameters()) == params
    with torch.device("meta"):
        assert build_network({"type": name, "scale": 2}).upscale == 2


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "dat_iln", "unshuffle_mod": True}, r"network_g\.unshuffle_mod: .*set it to False"),
    ({"type": "hat_iln_s", "num_feat": 32}, r"network_g\.num_feat: .*set it to 64"),
    ({**TINY["DAT_iLN"], "img_range": 255.0}, r"network_g\.img_range"),
    ({**TINY["HAT_iLN"], "img_range": 255.0}, r"network_g\.img_range"),
    ({**TINY["DAT_iLN"], "num_heads": [3]}, r"network_g\.num_heads: DAT: each head count must be even"),
    ({**TINY["HAT_iLN"], "upsampler": "pixelshuffledirect"}, r"network_g\.upsampler: HAT: upsampler must be"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err, torch.device("meta"):
        build_network(opt)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", list(TINY))
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = build_network(TINY[arch]).eval()
    with torch.no_grad():  # norms away from their identity init
        for n, p in net.named_parameters():
            if n.endswith(("norm1.weight", "norm2.weight", "norm.weight")):
                p.add_(torch.randn_like(p) * 0.2)
    check_onnx_at_unseen_size(net, TINY[arch], SCALES[arch], tmp_path, size=(13, 18))


# ----------------------------------------------------------------------------- XLA:CPU

XLA_SHAPES = {"DAT_iLN": (2, 3, 8, 12), "HAT_iLN": (2, 3, 8, 8)}


@pytest.mark.xla
@pytest.mark.parametrize("arch", list(TINY))
def test_xla_train_step_compiles_once_and_keeps_the_cpus_emas(arch: str) -> None:
    """Three steps: one compile (the EMA buffers turn from zeros into step outputs without a second graph), no CPU
    fallback, and the EMAs the CPU computes for the same network and input."""
    got = check_xla_train_step(TINY[arch], XLA_SHAPES[arch], scale=SCALES[arch], steps=3)
    assert got.compiles == [got.compiles[0]] * 3, got.compiles
    torch.manual_seed(0)
    net = build_network(TINY[arch]).train()
    x = torch.rand(XLA_SHAPES[arch])
    for _ in range(3):
        net.zero_grad(set_to_none=True)
        net(x).square().mean().backward()
    want = _emas(net)
    emas = {n: e.cpu() for n, e in _emas(got.net).items()}
    assert set(emas) == set(want) and all(float(v) > 0 for v in want.values())
    for n, v in want.items():
        torch.testing.assert_close(emas[n], v, rtol=1e-5, atol=1e-7, msg=n)

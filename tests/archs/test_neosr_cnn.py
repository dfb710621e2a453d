"""neosr's NinaSR and PlainUSR.

Fixtures come from neosr's own source (``tools/fixtures/make_neosr_cnn_fixtures.py``): the state dicts (PlainUSR's
training-time layout, the one neosr saves) load strictly and give neosr's inference outputs (sizes that are no
multiple of NinaSR's 16-pixel gate stride or PlainUSR's pooling) and its gradients. Also: PlainUSR's folded convs
(training = eval = ``reparameterize()``), neosr's names and published sizes, bad arguments, ONNX through anysr's
exporter, and an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``). The checks every
architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs) run from
``tests/archs/test_standard.py``.
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
from anysr.archs.plainusr_arch import PlainUSR
from anysr.archs.recognise import recognise
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "neosr_cnn"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]

# Tiny networks of each kind (ONNX, XLA, the training rows in tests/archs/test_standard.py)
TINY = {
    "NinaSR": {"type": "NinaSR", "n_resblocks": 2, "n_feats": 8, "scale": 2},
    "PlainUSR": {"type": "PlainUSR", "n_feat": 33, "im_feat": [6, 4, 2], "attn_feat": 2, "scale": 2},
}


# ----------------------------------------------------------------------------- neosr parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == {"NinaSR", "PlainUSR"}
    n_feats = {c["kwargs"]["n_feat"] for c in MANIFEST.values() if c["type"] == "PlainUSR"}
    assert min(n_feats) <= 32 < max(n_feats) and max(n_feats) >= 80  # block versions 1 + 3, 2 and 4
    assert all(p.stat().st_size < 200_000 for p in FIXTURES.iterdir())


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    params = load_file(str(FIXTURES / f"{name}_params.safetensors"))
    net = build_network({"type": case["type"], **case["kwargs"]})
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    net.load_state_dict(params, strict=True)
    io = load_file(str(FIXTURES / f"{name}_io.safetensors"))
    modes = ("eval", "train") if case["type"] == "PlainUSR" else ("eval",)  # PlainUSR: neosr's inference path
    for mode in modes:  # in both modes (the same folded convs)
        net.train(mode == "train")
        for inp, out, _ in case["compare"]:
            with torch.no_grad():
                got = net(io[inp])
            torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} ({mode}) differs")


@pytest.mark.parametrize("name", ["ninasr_x2", "plainusr_x2_ultra", "plainusr_x2_v2"])
def test_training_gradients_match_reference(name: str) -> None:
    """Gradients of ``mean(output ** 2)``: PlainUSR's MBConvs and PConvs train as folded 3x3 convs (neosr: three
    convs, an SE and a 1x1 each)."""
    net, io = load_case("neosr_cnn", name)
    x = io["input0"].clone().requires_grad_(True)
    net.train()(x).square().mean().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, io["grad_input0"], rtol=1e-4, atol=1e-5 * io["grad_input0"].abs().max().item())
    grads = {k[len("grad."):]: v for k, v in io.items() if k.startswith("grad.")}
    assert set(grads) == {n for n, p in net.named_parameters() if p.requires_grad}
    for n, p in net.named_parameters():
        assert p.grad is not None, n
        bound = 1e-5 * max(grads[n].abs().max().item(), 1e-3)
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=bound, msg=f"{name}: {n}")


def test_reparameterize_freezes_the_folds_and_keeps_the_keys() -> None:
    net, io = load_case("neosr_cnn", "plainusr_x3_v4")
    keys = set(net.state_dict())
    net.reparameterize()
    assert set(net.state_dict()) == keys
    with torch.no_grad():
        torch.testing.assert_close(net(io["input0"]), io["output0"], **FIXTURE_TOL)
        next(iter(net.block1.body[0].parameters())).add_(1.0)  # frozen: later changes to the branches do not count
        torch.testing.assert_close(net(io["input0"]), io["output0"], **FIXTURE_TOL)


def test_neosr_names_build_the_classes_and_files_are_recognised() -> None:
    with torch.device("meta"):
        assert type(build_network({"type": "ninasr", "scale": 2})).__name__ == "NinaSR"
        assert type(build_network({"type": "plainusr", "scale": 2})).__name__ == "PlainUSR"
        b0 = build_network({"type": "ninasr_b0", "scale": 3})
        ultra = build_network({"type": "plainusr_ultra", "scale": 2})
    assert (len(b0.body), b0.scale, ultra.im_feat) == (10, 3, (32, 16))
    for name in ("ninasr_x3_gray", "plainusr_x2_ultra", "plainusr_x3_v4"):
        found = recognise(load_file(str(FIXTURES / f"{name}_params.safetensors")))
        assert found.opt["type"] == MANIFEST[name]["type"] and found.opt["scale"] == MANIFEST[name]["kwargs"]["scale"]


def test_published_sizes() -> None:
    """Parameter counts of neosr's presets at x4 (counted with its classes)."""
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network({**opt, "scale": 4}).parameters())

    assert count({"type": "ninasr"}) == 1_030_194
    assert count({"type": "ninasr_b0"}) == 105_394
    assert count({"type": "ninasr_b2"}) == 10_057_034
    assert count({"type": "plainusr"}) == 1_248_825
    assert count({"type": "plainusr_ultra"}) == 213_141
    assert count({"type": "plainusr_large"}) == 3_046_697


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "NinaSR", "scale": 0}, r"network_g\.scale: NinaSR needs an integer scale >= 1"),
    ({"type": "NinaSR", "n_resblocks": 0}, r"network_g\.n_resblocks: NinaSR needs an integer n_resblocks >= 1"),
    ({"type": "NinaSR", "n_feats": 2, "expansion": 1.0}, r"network_g\.expansion: .*n_feats \* expansion >= 4"),
    ({"type": "PlainUSR", "im_feat": [64, 48]}, r"network_g\.im_feat: .*needs 3 block widths"),
    ({"type": "PlainUSR", "im_feat": [64, 32, 48]}, r"network_g\.im_feat: .*non-increasing"),
    ({"type": "PlainUSR", "im_feat": [72, 48, 32]}, r"network_g\.im_feat: .*the first at most n_feat"),
    ({"type": "PlainUSR", "attn_feat": 0}, r"network_g\.attn_feat: PlainUSR needs an integer attn_feat >= 1"),
    ({"type": "PlainUSR", "scale": 1.5}, r"network_g\.scale: PlainUSR needs an integer scale >= 1"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err:
        build_network(opt)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", list(TINY))
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = build_network(TINY[arch]).eval()
    if isinstance(net, PlainUSR):
        net.reparameterize()
    check_onnx_at_unseen_size(net, TINY[arch], TINY[arch]["scale"], tmp_path)


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
@pytest.mark.parametrize("arch", list(TINY))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    check_xla_train_step(TINY[arch], (1, 3, 12, 10), eval_form=True, scale=TINY[arch]["scale"],
                         prepare=_off_special_scalars)


@torch.no_grad()
def _off_special_scalars(net: torch.nn.Module) -> None:
    """NinaSR's scalar shifts away from their initial -1 and 1: torch_xla bakes a moved 0-d tensor holding 0 or
    +-1 into the first graph as a constant, and once a step has returned it, it is data (one more graph at step 2,
    then none; measured: 1, 2, 2 compiles over 3 steps at the initial values, 1, 1, 1 at -0.5 / 0.5)."""
    for name, p in net.named_parameters():
        if p.dim() == 0:
            p.fill_(-0.5 if name.startswith("head") else 0.5)

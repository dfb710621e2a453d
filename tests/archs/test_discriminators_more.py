"""traiNNer-redux's and neosr's other GAN discriminators: MetaGan2, MetaGAN3, PatchGANDiscriminatorSN,
MultiscalePatchGANDiscriminatorSN (traiNNer-redux), ``metagan`` (MetaGAN) and ``patchgan`` (PatchGAN) (neosr), and
neosr's DUnet checkpoints (old spectral-norm names, read through a layout rename).

Fixtures come from the references' own source (``python tools/fixtures/regen.py discriminators``): seeded weights
with the spectral-norm vectors / batch-norm statistics the reference reached (``state.*``) load strictly and give
the eval outputs; in training mode (one power iteration per spectral norm) the output, the gradients of
``mean(out ** 2)`` and every buffer after the step (the updated ``weight_u`` / ``weight_v``, batch-norm
statistics). Also: bad arguments, an XLA:CPU train step (``-m xla``) and one GAN iteration through the command line
with each as ``network_d``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from arch_checks import check_xla_train_step, fixture_io, stored_params
from conftest import FIXTURE_TOL, ROOT, write_options
from test_gan import gan_options

from anysr.archs import build_network
from anysr.archs.discriminator_more_arch import MetaGAN, PatchGAN
from anysr.archs.dunet_arch import DUnet
from anysr.archs.recognition.layouts import to_known_layout
from anysr.cli import main
from anysr.engine.checkpoint.weights import load_weights
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "discriminators"
CASES: dict[str, dict[str, Any]] = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
GRAD_RTOL = 1e-4

# tiny settings per type for the XLA step and the training run (32-pixel crops)
TINY: dict[str, dict[str, Any]] = {
    "PatchGANDiscriminatorSN": {"input_nc": 3, "ndf": 4, "n_layers": 2},
    "MultiscalePatchGANDiscriminatorSN": {"input_nc": 3, "ndf": 4, "n_layers": 2, "num_d": 2},
    "MetaGan2": {"dims": [8, 16], "blocks": [1, 1], "downs": [4, 2]},
    "MetaGAN3": {"dims": [8, 16, 16], "blocks": [1, 1, 0]},
    "metagan": {"dims": [8, 16, 16, 16], "blocks": [1, 1, 1, 1], "downs": [4, 2, 2, 2], "drop_path": 0.0,
                "end_drop": 0.0},
    "patchgan": {"num_feat": 4, "num_layers": 2, "norm_type": "instance"},  # not the graph of the one above
}


def _reference_state(name: str) -> dict[str, torch.Tensor]:
    """The reference's state dict of ``name`` in its own names: seeded weights, the buffers it reached."""
    io = fixture_io("discriminators", name)
    return {**stored_params("discriminators", name), **{k[6:]: v for k, v in io.items() if k.startswith("state.")}}


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """anysr's network (eval), the reference's state dict in anysr's names, and the fixture's tensors."""
    case = CASES[name]
    net = build_network({"type": case["type"], **case["anysr_kwargs"]}, "network_d").eval()
    params, layout = to_known_layout(_reference_state(name))
    assert (layout is not None) == (case["type"] == "DUnet")
    return net, params, fixture_io("discriminators", name)


def _renamed(io: dict[str, torch.Tensor], prefix: str, name: str) -> dict[str, torch.Tensor]:
    """``prefix.<key>`` entries of ``io`` by key, in anysr's names (neosr's DUnet: the layout's rename)."""
    part = {k[len(prefix):]: v for k, v in io.items() if k.startswith(prefix)}
    if CASES[name]["type"] == "DUnet":
        part = {k.replace("weight_orig", "parametrizations.weight.original")
                .replace("weight_u", "parametrizations.weight.0._u")
                .replace("weight_v", "parametrizations.weight.0._v"): v for k, v in part.items()}
    return part


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    net, params, io = _case(name)
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}
    net.load_state_dict(params, strict=True)
    with torch.no_grad():
        for j in range(len(CASES[name]["inputs"])):
            torch.testing.assert_close(net(io[f"input{j}"]), io[f"output{j}"], **FIXTURE_TOL, msg=f"{name} {j}")


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c["type"] != "DUnet"))
def test_training_step_matches_the_reference(name: str) -> None:
    """One training-mode forward (power iteration first), its gradients and the buffers it leaves. Not neosr's
    DUnet: its old spectral-norm hooks iterate v first, then u; anysr's DUnet (traiNNer-redux's parametrisation)
    u first, then v: its weights load and give neosr's eval outputs, its training continues traiNNer-redux's way."""
    net, params, io = _case(name)
    net.load_state_dict(params, strict=True)
    net.train()
    x = io["input0"].clone().requires_grad_(True)
    out = net(x)
    torch.testing.assert_close(out, io["train_output"], **FIXTURE_TOL)
    out.square().mean().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, io["grad_input0"], rtol=GRAD_RTOL,
                               atol=1e-5 * io["grad_input0"].abs().max().item())
    grads = _renamed(io, "grad.", name)
    assert grads.keys() == {n for n, p in net.named_parameters() if p.grad is not None}
    for n, g in grads.items():
        # a bias just before a GroupNorm has a zero gradient in exact arithmetic: rounding noise of ~1e-8 here
        torch.testing.assert_close(net.get_parameter(n).grad, g, rtol=GRAD_RTOL,
                                   atol=max(1e-5 * g.abs().max().item(), 1e-7), msg=n)
    after = _renamed(io, "after.", name)
    buffers = dict(net.named_buffers())
    assert after.keys() == buffers.keys()
    for n, b in after.items():
        torch.testing.assert_close(buffers[n], b, **FIXTURE_TOL, msg=n)
    if any(k.endswith("_u") for k in after):  # the power iteration moved the vectors
        assert any(not torch.equal(after[k], params[k]) for k in after if k.endswith("_u"))


def test_neosr_names_build_neosrs_classes() -> None:
    with torch.device("meta"):
        assert isinstance(build_network({"type": "metagan"}, "network_d"), MetaGAN)
        assert isinstance(build_network({"type": "patchgan"}, "network_d"), PatchGAN)
        assert isinstance(build_network({"type": "dunet"}, "network_d"), DUnet)
        assert type(build_network({"type": "metagan2"}, "network_d")).__name__ == "MetaGan2"
        assert type(build_network({"type": "metagan3"}, "network_d")).__name__ == "MetaGAN3"


def test_old_spectral_norm_layout_is_only_neosrs_dunet() -> None:
    """UNetDiscriminatorSN's ``weight_orig`` names are its own: not renamed."""
    unet = build_network({"type": "UNetDiscriminatorSN", "num_in_ch": 3, "num_feat": 4}, "network_d").state_dict()
    assert to_known_layout(unet)[1] is None
    _, params, _ = _case("neosr_dunet_f4")
    assert to_known_layout(params)[1] is None  # already anysr's names


def test_neosr_dunet_file_loads_through_the_weights_reader(tmp_path: Path) -> None:
    """A neosr ``net_d`` file as ``path.pretrain_network_d`` reads it: renamed, strictly loaded."""
    name = "neosr_dunet_f4"
    raw = _reference_state(name)
    assert "e_x1.0.weight_orig" in raw
    torch.save({"params": raw}, tmp_path / "net_d.pth")
    sd, _ = load_weights(tmp_path / "net_d.pth")
    net = build_network({"type": "dunet", **CASES[name]["anysr_kwargs"]}, "network_d").eval()
    net.load_state_dict(sd, strict=True)
    io = fixture_io("discriminators", name)
    with torch.no_grad():
        torch.testing.assert_close(net(io["input1"]), io["output1"], **FIXTURE_TOL)


@pytest.mark.parametrize(("opt", "arg"), [
    ({"type": "PatchGANDiscriminatorSN", "ndf": 0}, "ndf"),
    ({"type": "MultiscalePatchGANDiscriminatorSN", "num_d": 0}, "num_d"),
    ({"type": "MetaGan2", "dims": [8, 16]}, "dims"),
    ({"type": "MetaGan2", "dims": [4, 8, 8, 8]}, "dims"),
    ({"type": "MetaGAN3", "blocks": [1, -1]}, "blocks"),
    ({"type": "metagan", "dims": [10, 16, 16, 16]}, "dims"),
    ({"type": "metagan", "end_drop": 1.0}, "end_drop"),
    ({"type": "patchgan", "norm_type": "layer"}, "norm_type"),
    ({"type": "patchgan", "num_layers": 0}, "num_layers"),
])
def test_bad_arguments_name_the_argument(opt: dict, arg: str) -> None:
    with pytest.raises(OptionError, match=rf"network_d\.{arg}: ") as err:
        build_network(opt, "network_d")
    assert "\n" not in str(err.value)


def test_default_sizes() -> None:
    with torch.device("meta"):
        counts = {t: sum(p.numel() for p in build_network({"type": t}, "network_d").parameters())
                  for t in TINY}
    assert all(c > 0 for c in counts.values()), counts


@pytest.mark.parametrize("arch", sorted(TINY))
def test_one_gan_iteration_through_the_cli(arch: str, tmp_path: Path, small_train_dir: Path) -> None:
    opt = gan_options("d", small_train_dir, None, total_iter=1)
    opt["network_d"] = {"type": arch, **TINY[arch]}
    del opt["train"]["perceptual_opt"]
    opt["logger"]["save_checkpoint_freq"] = 1
    path = write_options(tmp_path / "d.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    state = torch.load(tmp_path / "experiments" / "d" / "training_states" / "1.state", weights_only=True)["model"]
    d = state["nets"]["net_d"]
    assert state["optimizers"]["net_d"]["state"][0]["step"] == 1
    want = build_network(opt["network_d"], "network_d").state_dict()
    assert d.keys() == want.keys()
    assert all(torch.isfinite(v).all() for v in d.values() if v.is_floating_point())


@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(TINY))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    """The power iteration rewrites the spectral-norm vectors every step: the loss changes, the graph does not
    (after the first step turns the initial vectors into step outputs)."""
    check_xla_train_step({"type": arch, **TINY[arch]}, (2, 3, 32, 32), steps=3, same_loss=False)

"""RCAN in its authors' layout (``RCANOriginal``: traiNNer-redux's and spandrel's RCAN), GateRV3 and SCUNet_aaf6aa.

Fixtures come from traiNNer-redux's source and spandrel 0.4.2 (``tools/fixtures/make_rcan_gater_scunet_fixtures.py``):
the state dicts load strictly and give their outputs (eval mode, sizes that need the networks' padding, and the
training forms of GateRV3 and of SCUNet_aaf6aa with its noise off). The weights are the fixture script's seeded
ones (tests/arch_checks.py draws them again), not stored. Also: which class each RCAN
name builds, recognition, ONNX through anysr's exporter (not SCUNet_aaf6aa: its padding, reflection as far as it
reaches then edge replication, exports for one size only, as SCUNet's), and per architecture an XLA:CPU train step
that compiles once with no aten op left to the CPU (``-m xla``). The checks every architecture gets run from
``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step, fixture_io, stored_params
from conftest import FIXTURE_TOL, ROOT

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise
from anysr.archs.scunet_aaf6aa_arch import NoisyConvTransBlock
from anysr.errors import OptionError

GROUP = "rcan_gater_scunet"
FIXTURES = ROOT / "tests" / "fixtures" / GROUP
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
ARCHS = ["RCANOriginal", "GateRV3", "SCUNet_aaf6aa"]

TINY = {
    "RCANOriginal": {"type": "RCANOriginal", "scale": 2, "n_resgroups": 1, "n_resblocks": 1, "n_feats": 8,
                     "reduction": 2},
    "GateRV3": {"type": "GateRV3", "scale": 2, "dim": 8, "enc_blocks": [1], "dec_blocks": [1], "num_latent": 1,
                "sisr_blocks": 0, "upsample_mid_dim": 8, "attention": True},
    "SCUNet_aaf6aa": {"type": "SCUNet_aaf6aa", "scale": 2, "config": [1, 0, 0, 0, 0, 0, 0], "residual": True},
}


def _reference_state(name: str) -> dict[str, torch.Tensor]:
    """The reference's state dict: the seeded weights and the entries it computed (stored as ``state.<key>``)."""
    io = fixture_io(GROUP, name)
    return {**stored_params(GROUP, name), **{k[6:]: v for k, v in io.items() if k.startswith("state.")}}


def _params(name: str, net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The fixture's state dict (seeded; integer buffers, such as GateRV3's ``flash`` switch: the network's own, as
    the fixture script kept them)."""
    own = net.state_dict()
    return {k: v.to(own[k].dtype) if own[k].is_floating_point() else own[k]
            for k, v in _reference_state(name).items()}


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]}).eval()
    net.load_state_dict(_params(name, net), strict=True)
    return net, fixture_io(GROUP, name)


def _silence(net: torch.nn.Module) -> None:
    for m in net.modules():
        if isinstance(m, NoisyConvTransBlock):
            m.sigma = 0.0


# ----------------------------------------------------------------------------- reference parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == set(ARCHS)
    assert any(c["source"] == "spandrel 0.4.2" for c in MANIFEST.values())
    assert sum(p.stat().st_size for p in FIXTURES.iterdir()) < 1_000_000


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]})
    want = {k: tuple(v.shape) for k, v in _reference_state(name).items()}
    assert {k: tuple(v.shape) for k, v in net.state_dict().items()} == want, "keys or shapes differ from the reference"
    net.load_state_dict(_params(name, net), strict=True)
    _silence(net)
    io = fixture_io(GROUP, name)
    for inp, out, mode in case["compare"]:
        net.train(mode == "train")
        x = io[inp].clone()
        with torch.no_grad():
            got = net(x)
        assert torch.equal(x, io[inp]), "the input was changed in place"
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} ({mode}) differs")


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_are_recognised(name: str) -> None:
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]})
    params = _params(name, net)
    found = recognise(params)
    assert found.opt["type"] == case["type"], found.describe()
    with torch.device("meta"):
        layout = {k: tuple(v.shape) for k, v in build_network(found.opt).state_dict().items()}
    assert layout == {k: tuple(v.shape) for k, v in params.items()}


# ----------------------------------------------------------------------------- RCAN: two layouts, one name each

def test_rcan_names() -> None:
    """``RCAN`` is BasicSR's layout (its option files); traiNNer-redux's lower-case names the authors' layout."""
    with torch.device("meta"):
        basicsr = build_network({"type": "RCAN", "num_in_ch": 3, "num_out_ch": 3, "num_group": 1, "num_block": 1})
        assert type(basicsr).__name__ == "RCAN" and "conv_first.weight" in basicsr.state_dict()
        for name, feats, unshuffle in (("rcan", 64, False), ("rcan_l", 96, False), ("rcan_unshuffle", 64, True)):
            net = build_network({"type": name, "scale": 2})
            assert type(net).__name__ == "RCANOriginal"
            assert net.head[-1].out_channels == feats and (net.downscale_factor == 2) == unshuffle
            assert not hasattr(net.sub_mean, "weight")  # traiNNer-redux's default: norm off


def test_rcan_mean_shift_is_frozen_and_scales_the_input() -> None:
    net = build_network({**TINY["RCANOriginal"], "norm": True, "rgb_range": 1})
    assert {"sub_mean.weight", "add_mean.bias"} <= set(net.state_dict())
    assert not any(p.requires_grad for n, p in net.named_parameters() if "_mean." in n)
    assert torch.allclose(net.sub_mean.bias, -torch.tensor([0.4488, 0.4371, 0.4040]))


def test_published_sizes() -> None:
    """Parameter counts of traiNNer-redux's builders (x4 unless said)."""
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network(opt).parameters())

    assert count({"type": "rcan"}) == 15_592_355
    assert count({"type": "rcan_l"}) == 35_049_843
    assert count({"type": "rcan_unshuffle", "scale": 2}) == 15_597_539
    assert count({"type": "gaterv3_s", "scale": 4}) == 6_152_838
    assert count({"type": "gaterv3_r", "scale": 4}) == 22_441_862
    assert count({"type": "scunet_aaf6aa"}) == 9_699_756
    assert count({"type": "scunet_aaf6aa", "scale": 4}) == 15_207_468


# ----------------------------------------------------------------------------- GateRV3

def test_gaterv3_checkpoint_chooses_the_attention() -> None:
    """The ``flash`` buffer a file carries sets which attention runs (the reference reads it in forward)."""
    name = "gaterv3_x3_psd_channel_att"
    net, io = _case(name)
    flash = build_network({"type": "GateRV3", **{**MANIFEST[name]["kwargs"], "flash": True}}).eval()
    mix = flash.latent[0].token_mix
    assert mix.use_flash and not mix.temperature.requires_grad  # unused by the spatial form: not trained
    flash.load_state_dict(_params(name, net), strict=True)
    assert not mix.use_flash and mix.temperature.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(flash(io["input0"]), io["output0"], **FIXTURE_TOL)


def test_gaterv3_gammas_get_ten_times_their_gradient() -> None:
    torch.manual_seed(0)
    net = build_network(TINY["GateRV3"]).train()
    x = torch.rand(1, 3, 8, 8)
    net(x).square().mean().backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters() if n.endswith(("gamma", "gamma0", "gamma1"))}
    assert len(grads) == 5  # gamma, and gamma0 / gamma1 of the two MetaGated blocks
    net.zero_grad()
    # the same network without the boost: the boosted gradient is 10 times the plain one
    from anysr.archs import gaterv3_arch
    plain = gaterv3_arch.grad_times_10
    gaterv3_arch.grad_times_10 = lambda p: p
    try:
        net(x).square().mean().backward()
    finally:
        gaterv3_arch.grad_times_10 = plain
    for n, g in grads.items():
        torch.testing.assert_close(g, 10 * dict(net.named_parameters())[n].grad, rtol=1e-4, atol=1e-7)


def test_gaterv3_loads_files_without_gamma_and_keeps_its_meta_record() -> None:
    net = build_network(TINY["GateRV3"])
    sd = {k: v.clone() for k, v in net.state_dict().items() if k != "gamma"}
    sd["dim_to_in.MetaUpsample"] = torch.zeros_like(sd["dim_to_in.MetaUpsample"])
    other = build_network(TINY["GateRV3"])
    other.load_state_dict(sd, strict=True)
    assert torch.equal(other.dim_to_in.MetaUpsample, net.dim_to_in.MetaUpsample)


# ----------------------------------------------------------------------------- SCUNet_aaf6aa

def test_scunet_aaf6aa_pads_more_in_eval_and_runs_small_images() -> None:
    """Eval pads 64 pixels more each way than training (so the two differ); a side shorter than the padding
    continues with edge replication (the reference fails there)."""
    net, io = _case("scunet_aaf6aa_x1")
    _silence(net)
    with torch.no_grad():
        assert not torch.allclose(net.train()(io["input0"]), io["output0"], atol=1e-3)
        assert net.eval()(torch.rand(1, 3, 5, 9)).shape == (1, 3, 5, 9)


def test_scunet_layout_stays_scunet() -> None:
    """Without ``m_res`` and at x1, SCUNet_aaf6aa has SCUNet's tensors: such a file is SCUNet's."""
    with torch.device("meta"):
        net = build_network({"type": "SCUNet_aaf6aa", "residual": False, "config": [1, 1, 1, 1, 1, 1, 1]})
    assert recognise(net.state_dict()).opt["type"] == "SCUNet"


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "RCANOriginal", "scale": 5}, r"network_g\.scale: RCANOriginal supports scale 3 and powers of two"),
    ({"type": "RCANOriginal", "act_mode": "prelu"}, r"network_g\.act_mode: RCANOriginal has no activation 'prelu'"),
    ({"type": "RCANOriginal", "n_feats": 8}, r"network_g\.reduction: RCANOriginal needs n_feats // reduction >= 1"),
    ({"type": "rcan", "norm": True, "n_colors": 1}, r"network_g\.norm: RCANOriginal's mean shift is RGB"),
    ({"type": "GateRV3", "upsample": "conv"}, r"network_g\.upsample: GateRV3's conv head is for scale 1"),
    ({"type": "GateRV3", "upsample": "lp"}, r"network_g\.upsample: GateRV3 knows the upsamplers"),
    ({"type": "GateRV3", "dec_blocks": [2, 2]}, r"network_g\.dec_blocks: GateRV3 needs as many decoder"),
    ({"type": "GateRV3", "dim": 12}, r"network_g\.dim: GateRV3 needs dim to be a multiple of 8"),
    ({"type": "SCUNet_aaf6aa", "scale": 3}, r"network_g\.scale: SCUNet_aaf6aa supports scale 1 and powers of two"),
    ({"type": "SCUNet_aaf6aa", "dim": 32}, r"network_g\.dim: SCUNet_aaf6aa needs dim to be a multiple of 64"),
    ({"type": "SCUNet_aaf6aa", "config": [2, 2]}, r"network_g\.config: SCUNet_aaf6aa needs 7 block counts"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("arch", ["RCANOriginal", "GateRV3"])
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    check_onnx_at_unseen_size(build_network(TINY[arch]), TINY[arch], 2, tmp_path)


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
@pytest.mark.parametrize("arch", ARCHS)
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    # _silence: the noise would make the two losses differ; the eval form (folds GateRV3's convs; SCUNet_aaf6aa pads
    # more) lowers too
    check_xla_train_step(TINY[arch], (1, 3, 8, 8), scale=2, prepare=_silence)

"""Restoration / efficient archs ECBSR, RIDNet, NAFNet, SCUNet against their references (tests/fixtures/restoration,
made by tools/fixtures/make_restoration_fixtures.py: BasicSR 1.4.2 for ECBSR and RIDNet, spandrel 0.4.2 for
NAFNet and SCUNet), plus ECBSR's re-parameterisation, padding, bf16 autocast, channels_last and XLA."""

from __future__ import annotations

import hashlib
import os

import pytest
import torch
from arch_checks import fixture_io, load_case, manifest, stored_params
from conftest import FIXTURE_TOL
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.ecbsr_arch import ECBSR
from anysr.archs.nafnet_arch import NAFNET_CONFIGS
from anysr.errors import OptionError

GROUP = "restoration"
MANIFEST = manifest(GROUP)
CASES = MANIFEST["cases"]
FULL_SIZE = MANIFEST["full_size"]
ECBSR_CASES = sorted(n for n, c in CASES.items() if c["type"] == "ECBSR")
# The smallest case of each family (for the generic checks).
SMALL = {"ECBSR": "ecbsr_x2_rgb_idt_relu", "RIDNet": "ridnet_range1_std", "NAFNet": "nafnet_2lvl",
         "SCUNet": "scunet_gray_plainwindows"}


def _params(name: str) -> dict[str, torch.Tensor]:
    return stored_params(GROUP, name)


def _io(name: str) -> dict[str, torch.Tensor]:
    return fixture_io(GROUP, name)


def _build(name: str, **extra: object) -> torch.nn.Module:
    case = CASES[name]
    return build_network({"type": case["type"], **case["kwargs"], **extra}).eval()


def _loaded(name: str) -> torch.nn.Module:
    return load_case(GROUP, name)[0]


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


# ----------------------------------------------------------------------------- reference parity

@pytest.mark.parametrize("name", sorted(CASES))
def test_state_dict_matches_reference(name: str) -> None:
    ours = {k: tuple(v.shape) for k, v in _build(name).state_dict().items()}
    case = CASES[name]  # the seeded entries and those the reference computes (kept)
    ref = {k: tuple(v) for k, v in {**case.get("buffers", {}), **case["seeded"]["shapes"]}.items()}
    assert set(ours) == set(ref), f"keys only ours: {set(ours) - set(ref)}; only reference: {set(ref) - set(ours)}"
    assert ours == ref


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_matches_reference(name: str) -> None:
    net = _loaded(name)
    io = _io(name)
    for inp, out, mode in CASES[name]["compare"]:
        net.train(mode == "train")
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL,
                                   msg=lambda m, o=out: f"{name} {o}: {m}")  # noqa: B023


@pytest.mark.parametrize("name", sorted(FULL_SIZE))
def test_published_configurations_have_the_reference_structure(name: str) -> None:
    """Full-size models (NAFNet-SIDD/GoPro width 32/64, SCUNet, ECBSR-M4C16, RIDNet): same keys, shapes and
    trainable-parameter count as the reference, so their released checkpoints load strictly."""
    spec = FULL_SIZE[name]
    with torch.device("meta"):
        net = build_network({"type": spec["type"], **spec["kwargs"]})
    sd = net.state_dict()
    lines = "\n".join(f"{k}:{list(v.shape)}" for k, v in sorted(sd.items()))
    assert len(sd) == spec["state_dict_entries"]
    assert sum(p.numel() for p in net.parameters() if p.requires_grad) == spec["num_params"]
    assert hashlib.sha256(lines.encode()).hexdigest() == spec["digest"]


def test_nafnet_configs_are_the_published_ones() -> None:
    for name in ("NAFNet-SIDD-width32", "NAFNet-SIDD-width64", "NAFNet-GoPro-width32", "NAFNet-GoPro-width64"):
        assert {"img_channel": 3, **NAFNET_CONFIGS[name]} == FULL_SIZE[name]["kwargs"]


# ----------------------------------------------------------------------------- ECBSR re-parameterisation

@pytest.mark.parametrize("name", ECBSR_CASES)
def test_ecbsr_rep_params_match_basicsr(name: str) -> None:
    net = _loaded(name)
    io = _io(name)
    with torch.no_grad():
        for i, block in enumerate(net.backbone):
            weight, bias = block.rep_params()
            torch.testing.assert_close(weight, io[f"rep{i}_weight"], **FIXTURE_TOL)
            torch.testing.assert_close(bias, io[f"rep{i}_bias"], **FIXTURE_TOL)


@pytest.mark.parametrize("name", ECBSR_CASES)
def test_ecbsr_reparameterized_gives_the_same_output(name: str) -> None:
    net = _loaded(name)
    io = _io(name)
    x, ref = io["input0"], io["output0"]
    plain = net.reparameterize()
    assert plain is net and net.reparameterized
    assert net.reparameterize() is net  # idempotent
    sd = net.state_dict()
    # The ECBSR authors' PlainSR layout: one conv3x3 (+ PReLU weight) per layer, no training branches.
    assert all(k.split(".")[2] in ("conv3x3", "act") for k in sd), sorted(sd)
    assert len(net.backbone) == CASES[name]["kwargs"]["num_block"] + 2
    with torch.no_grad():
        got = net(x)
        torch.testing.assert_close(got, ref, **FIXTURE_TOL)
        if CASES[name]["kwargs"]["act_type"] != "rrelu":
            assert torch.equal(net.train()(x), got)  # the plain form has no training branches
    # The deployed form is built directly and loads the exported state dict strictly.
    deployed = _build(name, reparameterized=True)
    assert set(deployed.state_dict()) == set(sd)
    deployed.load_state_dict(sd, strict=True)
    with torch.no_grad():
        assert torch.equal(deployed.eval()(x), got)


def test_ecbsr_reparameterized_is_smaller_and_trains() -> None:
    net = _loaded("ecbsr_x4_y_prelu")
    before = sum(p.numel() for p in net.parameters())
    net.reparameterize().train()
    after = sum(p.numel() for p in net.parameters())
    assert after < before / 3
    x = torch.rand(1, 1, 8, 8)
    net(x).mean().backward()
    assert all(p.grad is not None for p in net.parameters())


def test_ecbsr_train_and_eval_forms_agree_on_random_weights() -> None:
    # Border handling: the branch sum (zero-padded 1x1 input) and the folded conv agree at the image edges.
    torch.manual_seed(3)
    net = ECBSR(3, 3, num_block=2, num_channel=6, with_idt=True, act_type="prelu", scale=2)
    x = torch.rand(2, 3, 5, 7)
    with torch.no_grad():
        train_out = net.train()(x)
        eval_out = net.eval()(x)
    torch.testing.assert_close(train_out, eval_out, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- padding and tile_multiple

def test_tile_multiple() -> None:
    assert _build("ecbsr_x4_y_prelu").tile_multiple == 1
    assert _build("ridnet_255").tile_multiple == 1
    assert _build("nafnet_2lvl").tile_multiple == 4
    assert _build("nafnet_3lvl_gray").tile_multiple == 8
    assert _build("nafnet_flat").tile_multiple == 1
    assert _build("scunet_rgb").tile_multiple == 64
    with torch.device("meta"):
        assert build_network({"type": "NAFNet", **NAFNET_CONFIGS["NAFNet-SIDD-width32"]}).tile_multiple == 16


def test_padded_fixture_sizes_are_not_multiples() -> None:
    # The fixtures include inputs the archs must pad (the reference padded them the same way).
    for name, j in (("nafnet_2lvl", 1), ("nafnet_3lvl_gray", 1), ("scunet_rgb", 1), ("scunet_gray_plainwindows", 0)):
        h, w = _io(name)[f"input{j}"].shape[-2:]
        m = _build(name).tile_multiple
        assert h % m or w % m, name


def test_nafnet_padding_is_zero_padding_and_crop() -> None:
    net = _loaded("nafnet_2lvl")
    x = torch.rand(1, 3, 10, 13)
    with torch.no_grad():
        got = net(x)
        padded = net(F.pad(x, (0, 3, 0, 2)))
    assert got.shape == x.shape
    assert torch.equal(got, padded[..., :10, :13])


def test_scunet_small_inputs_use_edge_replication() -> None:
    # Sides shorter than the padding cannot be reflected (spandrel fails there); the original authors replicate.
    net = _loaded("scunet_gray_plainwindows")
    x = torch.rand(1, 1, 20, 30)
    with torch.no_grad():
        got = net(x)
        ref = net(F.pad(x, (0, 34, 0, 44), mode="replicate"))
    assert got.shape == x.shape
    assert torch.equal(got, ref[..., :20, :30])


# ----------------------------------------------------------------------------- devices, dtypes, layouts

@pytest.mark.parametrize("family", sorted(SMALL))
def test_bf16_autocast_stays_close(family: str) -> None:
    name = SMALL[family]
    net = _loaded(name)
    x = _io(name)["input0"]
    with torch.no_grad():
        ref = net(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = net(x)
    assert mixed.shape == ref.shape
    assert torch.isfinite(mixed).all()
    # bf16 keeps 8 bits of mantissa (measured: 0.3% (ECBSR) to 0.75% (SCUNet) of the largest output value)
    assert _max_diff(mixed, ref) < 0.05 * float(ref.abs().max())


def test_ecbsr_rep_params_stay_fp32_under_autocast() -> None:
    net = _loaded("ecbsr_x4_y_prelu")
    with torch.no_grad():
        ref = [b.rep_params() for b in net.backbone]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = [b.rep_params() for b in net.backbone]
    for (w0, b0), (w1, b1) in zip(ref, mixed):
        assert w1.dtype == torch.float32 and b1.dtype == torch.float32
        assert torch.equal(w0, w1) and torch.equal(b0, b1)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_channels_last_input(family: str) -> None:
    name = SMALL[family]
    net = _loaded(name)
    x = _io(name)["input0"]
    with torch.no_grad():
        ref = net(x)
        got = net(x.contiguous(memory_format=torch.channels_last))
        both = net.to(memory_format=torch.channels_last)(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(both, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", sorted(SMALL))
def test_forward_creates_no_tensor_off_the_input_device(family: str) -> None:
    # On the meta device every tensor made on the CPU (instead of on the input's device) would fail.
    name = SMALL[family]
    net = _build(name).to("meta")
    x = torch.empty(_io(name)["input0"].shape, device="meta")
    assert net(x).device.type == "meta"
    if family == "ECBSR":
        assert net.train()(x).device.type == "meta"


@pytest.mark.parametrize("family", sorted(SMALL))
def test_backward_reaches_every_parameter(family: str) -> None:
    net = _loaded(SMALL[family]).train()
    x = _io(SMALL[family])["input0"]
    net(x).square().mean().backward()
    missing = [n for n, p in net.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing


# ----------------------------------------------------------------------------- build errors

@pytest.mark.parametrize(
    ("opt", "pattern"),
    [
        ({"type": "ECBSR", "num_in_ch": 1, "num_out_ch": 1, "num_block": 1, "num_channel": 4, "with_idt": False,
          "act_type": "gelu", "scale": 2}, r"network_g\.act_type: ECBSR: unknown act_type 'gelu'; use one of prelu"),
        ({"type": "ECBSR", "num_in_ch": 1, "num_out_ch": 1, "num_block": 1, "num_channel": 4, "with_idt": False,
          "act_type": "relu", "scale": 0}, r"network_g\.scale: ECBSR needs an integer scale >= 1, got 0"),
        ({"type": "ECBSR", "num_in_ch": 3, "num_out_ch": 1, "num_block": 1, "num_channel": 4, "with_idt": False,
          "act_type": "relu", "scale": 2}, r"network_g\.num_out_ch: ECBSR adds the input to the output"),
        ({"type": "ECBSR", "num_in_ch": 1, "num_out_ch": 1}, r"network_g\.num_block: required argument of ECBSR"),
        ({"type": "RIDNet", "in_channels": 3, "mid_channels": 8, "out_channels": 3},
         r"network_g\.mid_channels: RIDNet needs mid_channels >= 16"),
        ({"type": "RIDNet", "in_channels": 1, "mid_channels": 16, "out_channels": 1},
         r"network_g\.in_channels: RIDNet works on RGB images"),
        ({"type": "RIDNet", "in_channels": 3, "mid_channels": 16, "out_channels": 3, "rgb_mean": [0.5]},
         r"network_g\.rgb_mean: RIDNet needs 3 values"),
        ({"type": "NAFNet", "enc_blk_nums": [1, 1], "dec_blk_nums": [1]},
         r"network_g\.dec_blk_nums: NAFNet needs one decoder level per encoder level"),
        ({"type": "NAFNet", "enc_blk_nums": [1, -1], "dec_blk_nums": [1, 1]},
         r"network_g\.enc_blk_nums: NAFNet needs a list of block counts >= 0"),
        ({"type": "SCUNet", "dim": 32}, r"network_g\.dim: SCUNet needs dim to be a multiple of 64"),
        ({"type": "SCUNet", "config": [2, 2, 2]}, r"network_g\.config: SCUNet needs 7 block counts"),
    ],
)
def test_bad_arguments_name_the_option(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


# ----------------------------------------------------------------------------- XLA (XLA:CPU here)

XLA_NETS = {
    "ECBSR": ({"type": "ECBSR", "num_in_ch": 3, "num_out_ch": 3, "num_block": 1, "num_channel": 8,
               "with_idt": True, "act_type": "prelu", "scale": 2}, (2, 3, 8, 8)),
    "RIDNet": ({"type": "RIDNet", "in_channels": 3, "mid_channels": 16, "out_channels": 3, "num_block": 1,
                "img_range": 1.0}, (2, 3, 8, 8)),
    "NAFNet": ({"type": "NAFNet", "width": 8, "middle_blk_num": 1, "enc_blk_nums": [1, 1],
                "dec_blk_nums": [1, 1]}, (2, 3, 10, 13)),
    "SCUNet": ({"type": "SCUNet", "in_nc": 1, "config": [2, 0, 0, 0, 0, 0, 2], "dim": 64}, (1, 1, 40, 50)),
}


@pytest.mark.xla
@pytest.mark.parametrize("family", sorted(XLA_NETS))
def test_xla_train_step_compiles_once(family: str) -> None:
    """Forward + backward twice with one shape on the XLA device: the second step compiles nothing new."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    import torch_xla.debug.metrics as met

    dev = torch_xla.device()
    opt, shape = XLA_NETS[family]
    torch.manual_seed(0)
    net = build_network(dict(opt)).train().to(dev)
    optim = torch.optim.SGD(net.parameters(), lr=1e-3)
    x = torch.rand(shape).to(dev)
    compiles = []
    for _ in range(2):
        optim.zero_grad(set_to_none=True)
        loss = net(x).square().mean()
        loss.backward()
        optim.step()
        torch_xla.sync()
        data = met.metric_data("CompileTime")
        compiles.append(data[0] if data else 0)
    assert compiles[0] >= 1
    assert compiles[1] == compiles[0], f"{family}: the second step compiled again ({compiles})"
    assert torch.isfinite(loss.detach().cpu())

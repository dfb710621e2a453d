"""GRL (global, regional and local modelling; Li et al., CVPR 2023), Uformer (Wang et al., CVPR 2022) and KBNet's
KBNet_s / KBNet_l (kernel basis network; Zhang et al., 2023) against spandrel 0.4.2.

Fixtures come from spandrel 0.4.2 (``tools/fixtures/make_{grl,uformer,kbnet}_fixtures.py``): for GRL
every head, q/k/v and anchor projection, stage conv, stripe groups, shifted stripes, local connection and the
Euclidean ablation; for Uformer each feed-forward, both projections, the modulators and the small-stage windows;
for KBNet both conv branches, conv biases and empty stages.
The state dicts load strictly and give spandrel's outputs, also at sizes off the padding multiple. Also:
channels_last, bf16 autocast, the meta device, a training step, GRL's stale buffers dropped on load, recognition
of every fixture's weights, ONNX, build errors, and XLA:CPU compile-once without CPU fallbacks (``-m xla`` in the XLA
venv). The real training runs: ``tests/archs/test_standard.py`` over the cards (``tests/archs/cards.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from arch_checks import check_xla_train_step, fixture_io, load_case, manifest
from cards import CARDS
from conftest import FIXTURE_TOL
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise
from anysr.errors import OptionError

GROUP = {case: group for group in ("grl", "uformer", "kbnet") for case in manifest(group)["cases"]}
MANIFEST = {case: manifest(group)["cases"][case] for case, group in GROUP.items()}
SOME = ["grl_x1_stripes_shifted", "grl_x2_direct_groups_local", "grl_x4_nearest_twostage", "grl_x3_maxpool_euclid",
        "uformer_leff_linear", "uformer_fastleff_conv_modulators", "uformer_mlp_gray_noshift", "kbnet_s_tiny",
        "kbnet_s_light_gray", "kbnet_l_tiny", "kbnet_l_bias_gray"]
# The tiny networks (tests/archs/cards.py; their training runs: tests/archs/test_standard.py)
TINY, TINY_UFORMER, TINY_KBNET, TINY_KBNET_L = (CARDS[a].net for a in ("GRL", "Uformer", "KBNet_s", "KBNet_l"))


def _params(name: str) -> dict[str, torch.Tensor]:
    """The fixture's full state dict: the seeded weights and the computed buffers."""
    return {k: v.clone() for k, v in _case(name)[0].state_dict().items()}


def _io(name: str) -> dict[str, torch.Tensor]:
    return fixture_io(GROUP[name], name)


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The fixture network (eval mode, weights loaded strictly) and its inputs / outputs."""
    return load_case(GROUP[name], name)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]})
    own = net.state_dict()
    shapes = {**case["seeded"]["shapes"], **case["buffers"]}
    assert set(own) == set(shapes), "state-dict keys differ from spandrel's"
    assert {k: list(v.shape) for k, v in own.items()} == shapes
    net, io = _case(name)
    off_multiple = 0
    for inp, out, _ in case["compare"]:
        x = io[inp]
        off_multiple += bool(x.shape[-2] % net.tile_multiple or x.shape[-1] % net.tile_multiple)
        with torch.no_grad():
            got = net(x)
        assert got.shape == io[out].shape
        tol = FIXTURE_TOL["atol"] * max(1.0, io[out].abs().max().item())
        torch.testing.assert_close(got, io[out], rtol=FIXTURE_TOL["rtol"], atol=tol,
                                   msg=f"{name} {out} differs from spandrel")
    assert off_multiple, f"{name}: no input needs padding"


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_fixture_weights_are_recognised(name: str) -> None:
    params = _params(name)
    found = recognise(params)
    assert found.opt["type"] == MANIFEST[name]["type"]
    with torch.device("meta"):
        layout = {k: v.shape for k, v in build_network(found.opt).state_dict().items()}
    assert layout == {k: v.shape for k, v in params.items()}


def test_authors_checkpoint_buffers_are_dropped_on_load() -> None:
    """The authors' files carry the reference's precomputed tables and masks; they load strictly here."""
    net, io = _case("grl_x1_stripes_shifted")
    stale = {"table_w": torch.zeros(1, 7, 7, 2), "index_sh_a2w": torch.zeros(8, 32, dtype=torch.long),
             "mask_sv_w2a": torch.zeros(4, 32, 8)}
    net.load_state_dict({**_params("grl_x1_stripes_shifted"), **stale}, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(net(io["input0"]), io["output0"], **FIXTURE_TOL)


def test_tile_multiple_and_published_sizes() -> None:
    assert build_network(dict(TINY)).tile_multiple == 8
    with torch.device("meta"):
        counts = {n: sum(p.numel() for p in build_network({"type": n}).parameters())
                  for n in ("grl_t", "grl_s", "grl_b")}
        base = build_network({"type": "grl_b", "scale": 2})
    # the paper's GRL-T / GRL-S / GRL-B (x4): 0.91 M, 3.49 M, 20.2 M parameters
    assert counts == {"grl_t": 906_192, "grl_s": 3_487_715, "grl_b": 20_201_299}
    assert base.upscale == 2 and base.tile_multiple == 16


@pytest.mark.parametrize("name", SOME)
def test_channels_last_input_gives_the_same_output(name: str) -> None:
    net, io = _case(name)
    x = io["input0"].contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        got = net.to(memory_format=torch.channels_last)(x)
    torch.testing.assert_close(got, io["output0"], **FIXTURE_TOL)


@pytest.mark.parametrize("name", SOME)
def test_bf16_autocast_stays_close(name: str) -> None:
    net, io = _case(name)
    x, ref = io["input1"], io["output1"]
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = net(x).float()
    assert mixed.shape == ref.shape and torch.isfinite(mixed).all()
    err = (mixed - ref).abs().max().item() / ref.abs().max().item()
    assert err < 0.05, f"{name}: bf16 autocast off by {err:.3g} of the output range"


@pytest.mark.parametrize("name", SOME)
def test_forward_creates_no_tensor_off_the_input_device(name: str) -> None:
    net, io = _case(name)
    net = net.to("meta")
    out = net(torch.empty(io["input1"].shape, device="meta"))
    assert out.device.type == "meta" and out.shape == io["output1"].shape


@pytest.mark.parametrize("name", SOME)
def test_training_step_gives_finite_gradients(name: str) -> None:
    net, io = _case(name)
    net.train()
    net(io["input1"]).square().mean().backward()
    missing = [n for n, p in net.named_parameters()
               if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all())]
    assert not missing, missing


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    torch.manual_seed(0)
    plain = build_network({**TINY, "drop_path_rate": 0.0}).train()
    ckpt = build_network({**TINY, "drop_path_rate": 0.0, "fairscale_checkpoint": True}).train()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.rand(1, 3, 8, 12)
    for net in (plain, ckpt):
        net(x).square().mean().backward()
    for (n, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=n)


def test_drop_path_rises_over_all_blocks() -> None:
    net = build_network({**TINY, "depths": [2, 2], "num_heads_window": [2, 2], "num_heads_stripe": [2, 2],
                         "drop_path_rate": 0.3})
    rates = [getattr(b.drop_path, "drop_prob", 0.0) for layer in net.layers for b in layer.blocks]
    assert rates == pytest.approx([0.0, 0.1, 0.2, 0.3])


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"upsampler": "bicubic"}, r"network_g\.upsampler: GRL has no upsampler 'bicubic'"),
    ({"upsampler": "nearest+conv", "upscale": 2}, r"network_g\.upscale: GRL's 'nearest\+conv' upsampler is x4"),
    ({"upsampler": "", "upscale": 2}, r"network_g\.upsampler: GRL without an upsampler is x1"),
    ({"num_heads_window": [3]}, r"network_g\.num_heads_window: GRL needs embed_dim / 2 \(4\)"),
    ({"depths": [3, 3]}, r"network_g\.depths: GRL needs one num_heads_window and num_heads_stripe per stage"),
    ({"stripe_size": [5, 4]}, r"network_g\.stripe_size: .*multiple of anchor_window_down_factor \(2\)"),
    ({"stripe_size": [None, 4]}, r"network_g\.stripe_size: GRL needs two stripe sizes and two stripe groups"),
    ({"anchor_window_down_factor": 3}, r"network_g\.anchor_window_down_factor: GRL needs a power-of-two"),
    ({"anchor_proj_type": "pool"}, r"network_g\.anchor_proj_type: GRL's anchor_proj_type is one of"),
    ({"conv_type": "2conv"}, r"network_g\.conv_type: GRL's conv_type is one of"),
    ({"local_connection": True}, r"network_g\.embed_dim: GRL's local_connection needs embed_dim >= 18"),
    ({"offload_to_cpu": True}, r"network_g\.offload_to_cpu: GRL in anysr does not offload"),
    ({"init_method": "x"}, r"network_g\.init_method: GRL's init_method is"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network({**TINY, **opt})


def test_uformer_stage_windows_and_tile_multiple() -> None:
    assert build_network(dict(TINY_UFORMER)).tile_multiple == 32
    assert build_network({**TINY_UFORMER, "win_size": 8}).tile_multiple == 128  # the reference's 128
    # at img_size 32 the bottleneck (2 x 2) is one unshifted window: the layout follows img_size
    small = build_network({**TINY_UFORMER, "win_size": 4, "img_size": 32})
    assert small.tile_multiple == 32 and small.conv.blocks[0].win_size == 2
    assert [b.shift_size for b in small.encoderlayer_1.blocks] == [0, 2]
    assert small.conv.blocks[0].attn.relative_position_bias_table.shape == (9, 1)


def test_uformer_unused_cross_norm_is_never_trained() -> None:
    """The reference computes ``norm_cross`` and discards it: its weights are kept (checkpoints carry them) but
    frozen, so DDP sees no unused trainable parameter."""
    net = build_network({**TINY_UFORMER, "cross_modulator": True, "modulator": True}).train()
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen and all(".norm_cross." in n for n in frozen)
    net(torch.rand(1, 3, 20, 40)).mean().backward()
    assert all(p.grad is not None for n, p in net.named_parameters() if n not in frozen)


def test_uformer_drop_path_rates_mirror_the_encoder() -> None:
    net = build_network({**TINY_UFORMER, "depths": [1, 1, 1, 1, 2, 1, 1, 1, 1], "drop_path_rate": 0.3})
    rate = [getattr(b.drop_path, "drop_prob", 0.0) for n in ("encoderlayer_0", "encoderlayer_1", "encoderlayer_2",
                                                             "encoderlayer_3", "conv", "decoderlayer_0",
                                                             "decoderlayer_1", "decoderlayer_2", "decoderlayer_3")
            for b in getattr(net, n).blocks]
    assert rate == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.3, 0.3, 0.3, 0.2, 0.1, 0.0])


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"depths": [1] * 8}, r"network_g\.depths: Uformer needs 9 depths and 9 num_heads"),
    ({"num_heads": [3] + [1] * 8}, r"network_g\.num_heads: Uformer's stage 0 has 2 channels, not a multiple of its 3"),
    ({"token_mlp": "conv"}, r"network_g\.token_mlp: Uformer's token_mlp is one of"),
    ({"token_projection": "dw"}, r"network_g\.token_projection: Uformer's token_projection is"),
    ({"depths": [1, 1, 1, 1, 1, 5, 1, 1, 1]}, r"network_g\.depths: Uformer's decoder stages take their drop-path"),
])
def test_uformer_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network({**TINY_UFORMER, **opt})


@pytest.mark.parametrize("name", ["uformer_leff_linear", pytest.param("uformer_fastleff_conv_modulators",
                                                                     marks=pytest.mark.slow)])
def test_uformer_onnx(name: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net, io = _case(name)
    kwargs = MANIFEST[name]["kwargs"]
    rep = export_onnx(net, tmp_path / "m.onnx", scale=1, net_opt={"type": "Uformer", **kwargs})
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    shapes = [(1, 3, 37, 70), tuple(io["input1"].shape)] if rep.dynamic else [(1, 3, rep.size, rep.size)]
    for shape in shapes:
        x = torch.rand(shape)
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        with torch.no_grad():
            torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)
    assert rep.dynamic, rep.note


def test_kbnet_kernel_basis_attention_is_unfold_with_blended_kernels() -> None:
    """The blended per-pixel kernels applied to ``F.unfold``'s neighbourhoods, written out as loops."""
    from anysr.archs.kbnet_arch import kernel_basis_attention

    torch.manual_seed(0)
    b, c, h, w, nset, k, groups = 2, 8, 3, 5, 4, 3, 2
    x, att = torch.randn(b, c, h, w), torch.randn(b, nset, h, w)
    bias, weight = torch.randn(1, nset, c), torch.randn(1, nset, c * (c // groups) * k * k)
    got = kernel_basis_attention(x, att, k, groups, bias, weight)
    cg = c // groups
    patches = F.unfold(x, k, padding=k // 2).reshape(b, groups, cg * k * k, h * w)
    kern = torch.einsum("bsp,sn->bpn", att.reshape(b, nset, h * w), weight[0]).reshape(b, h * w, groups, cg,
                                                                                           cg * k * k)
    want = torch.einsum("bpgoj,bgjp->bpgo", kern, patches).reshape(b, h * w, c)
    want = want + torch.einsum("bsp,sc->bpc", att.reshape(b, nset, h * w), bias[0])
    torch.testing.assert_close(got, want.transpose(1, 2).reshape(b, c, h, w), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"dec_blk_nums": [1]}, r"network_g\.dec_blk_nums: KBNet_s needs one decoder stage per encoder stage"),
    ({"width": 6}, r"network_g\.width: KBNet_s needs a width that is a multiple of 4"),
    ({"width": 12, "enc_blk_nums": [1, 1, 1], "dec_blk_nums": [1, 1, 1]}, r"stage widths \[12, 24, 48, 96\]"),
    ({"type": "KBNet_l", "dim": 4}, r"network_g\.dim: KBNet_l's level widths \[4, 8, 16, 32\] must each"),
    ({"type": "KBNet_l", "dim": 2, "heads": [1, 2]}, r"network_g\.num_blocks: KBNet_l needs 4 num_blocks and 4 heads"),
])
def test_kbnet_bad_argument_values(opt: dict, pattern: str) -> None:
    base = TINY_KBNET_L if opt.get("type") == "KBNet_l" else TINY_KBNET
    with pytest.raises(OptionError, match=pattern):
        build_network({**base, **opt})


@pytest.mark.parametrize("name", ["kbnet_s_tiny", "kbnet_l_tiny"])
def test_kbnet_onnx_runs_at_unseen_sizes(name: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net, io = _case(name)
    opt = {"type": MANIFEST[name]["type"], **MANIFEST[name]["kwargs"]}
    rep = export_onnx(net, tmp_path / "m.onnx", scale=1, net_opt=opt)
    assert rep.dynamic is True, rep.note
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for x in (torch.rand(1, 3, 13, 22), io["input1"]):
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        with torch.no_grad():
            torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["grl_x1_stripes_shifted", pytest.param("grl_x2_direct_groups_local",
                                                                        marks=pytest.mark.slow)])
def test_onnx_runs_at_its_fixed_size(name: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net, io = _case(name)
    kwargs = MANIFEST[name]["kwargs"]
    rep = export_onnx(net, tmp_path / "m.onnx", scale=kwargs.get("upscale", 1), net_opt={"type": "GRL", **kwargs})
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    # GRL's masks and stripe tables are laid out from the padded size in Python: the export is at one fixed size
    assert rep.dynamic is False and rep.size, rep.note
    for shape in [(1, 3, rep.size, rep.size)]:
        x = torch.rand(shape)
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        with torch.no_grad():
            torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)


XLA_NETS = {
    "GRL-stripes": (TINY, (2, 3, 7, 10)),
    "GRL-groups-local": ({**TINY, "embed_dim": 18, "num_heads_window": [3], "num_heads_stripe": [3],
                          "stripe_size": [8, None], "stripe_groups": [None, 4], "anchor_window_down_factor": 4,
                          "local_connection": True, "upsampler": "pixelshuffle"}, (1, 3, 16, 16)),
    "GRL-nearest-twostage": ({**TINY, "upscale": 4, "upsampler": "nearest+conv", "anchor_proj_type": "conv2d",
                              "anchor_one_stage": False}, (1, 3, 8, 6)),
    "Uformer-leff": (TINY_UFORMER, (2, 3, 20, 33)),
    "Uformer-conv-modulators": ({**TINY_UFORMER, "token_projection": "conv", "token_mlp": "fastleff",
                                 "modulator": True, "cross_modulator": True}, (1, 3, 32, 32)),
    "KBNet_s": (TINY_KBNET, (2, 3, 7, 10)),
    "KBNet_s-light": ({**TINY_KBNET, "lightweight": True, "ffn_scale": 1}, (1, 3, 8, 8)),
    "KBNet_l": (TINY_KBNET_L, (2, 3, 7, 10)),
}


@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(XLA_NETS))
def test_xla_train_step_compiles_once(arch: str) -> None:
    opt, shape = XLA_NETS[arch]
    no_drop = {"drop_path_rate": 0.0} if opt["type"] in ("GRL", "Uformer") else {}
    opt = {**opt, **no_drop}
    # and the eval graph at another size
    scale = getattr(build_network(dict(opt)), "upscale", 1)
    check_xla_train_step(opt, shape, eval_shape=(1, 3, 16, 20), scale=scale)

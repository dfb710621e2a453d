"""FDAT (Fast Dual Aggregation Transformer) with every ``UniUpsampleV3`` head (LDA-AQU included).

Fixtures come from spandrel 0.4.2 (``tools/fixtures/make_fdatgrl_fixtures.py``): the state dicts load strictly
and give spandrel's outputs, also at sizes off the window / unshuffle multiple. Also: the ``MetaUpsample``
buffer, ONNX at unseen sizes, build errors, and XLA:CPU compile-once without CPU fallbacks
(``-m xla`` in the XLA venv).
The checks every architecture gets (channels_last, bf16 autocast, the meta device, gradients, training runs,
2 gloo ranks == 1 process) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from arch_checks import check_xla_train_step, fixture_io, load_case, manifest, net_opt, stored_params

from anysr.archs import build_network
from anysr.archs.arch_util import input_channels
from anysr.errors import OptionError

GROUP = "fdatgrl"
MANIFEST = manifest(GROUP)["cases"]
TINY = {"FDAT": {"type": "FDAT", "embed_dim": 8, "num_groups": 1, "depth_per_group": 1, "num_heads": 2,
                 "window_size": 4, "aim_reduction_ratio": 4, "mid_dim": 8, "scale": 2}}


# ----------------------------------------------------------------------------- spandrel parity

def test_tile_multiples() -> None:
    assert build_network(dict(TINY["FDAT"])).tile_multiple == 4
    assert build_network({**TINY["FDAT"], "unshuffle_mod": True}).tile_multiple == 8
    assert build_network({**TINY["FDAT"], "unshuffle_mod": True, "scale": 1}).tile_multiple == 16
    assert build_network({**TINY["FDAT"], "unshuffle_mod": True, "scale": 3}).tile_multiple == 4  # no unshuffle
    # the exporter / inference read the input channels before the stem's pixel-unshuffle
    assert input_channels(build_network({**TINY["FDAT"], "unshuffle_mod": True, "num_in_ch": 1})) == 1


def test_checkpoint_meta_record_is_replaced_by_the_networks_own() -> None:
    """As in the original: a checkpoint's ``MetaUpsample`` (e.g. written by another version) does not overwrite
    the record of the head this network was built with, and strict loading still requires the key."""
    net, io = load_case(GROUP, "fdat_x3_pa_up")
    params = stored_params(GROUP, "fdat_x3_pa_up")
    own = net.upsampler.MetaUpsample.clone()
    net.load_state_dict({**params, "upsampler.MetaUpsample": torch.zeros(7, dtype=torch.uint8)}, strict=True)
    assert torch.equal(net.upsampler.MetaUpsample, own) and own.tolist() == [3, 7, 3, 8, 3, 6, 4]
    with pytest.raises(RuntimeError, match="Missing key"):
        net.load_state_dict({k: v for k, v in params.items() if k != "upsampler.MetaUpsample"}, strict=True)
    # pa_up at a power-of-two scale records mid_dim as in_dim, as the original does
    x4 = build_network({"type": "FDAT", **MANIFEST["fdat_x4_pa_up"]["kwargs"]})
    assert x4.upsampler.MetaUpsample.tolist() == [3, 7, 4, 6, 3, 6, 4]


def test_published_layout_sizes() -> None:
    """Parameter counts of traiNNer-redux's presets at x4 (counted with spandrel's FDAT: the same)."""
    with torch.device("meta"):
        counts = {name: sum(p.numel() for p in build_network({"type": name}).parameters())
                  for name in ("fdat_tiny", "fdat_light", "fdat_medium", "fdat_large")}
    assert counts == {"fdat_tiny": 1_009_347, "fdat_light": 1_909_467, "fdat_medium": 4_030_623,
                      "fdat_large": 11_121_579}


def test_unused_gate_of_each_block_is_never_trained() -> None:
    """A spatial block gates with ``cg`` only and a channel block with ``sg`` only; the other gate's weights are
    kept (checkpoints carry them) but frozen, so DDP sees no unused trainable parameter."""
    net = build_network({**TINY["FDAT"], "group_block_pattern": ["spatial", "channel", "channel"]}).train()
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen == {"groups.0.blocks.0.inter.sg.0.weight", "groups.0.blocks.1.inter.cg.1.weight",
                      "groups.0.blocks.1.inter.cg.3.weight", "groups.0.blocks.2.inter.cg.1.weight",
                      "groups.0.blocks.2.inter.cg.3.weight"}
    net(torch.rand(1, 3, 5, 6)).mean().backward()
    assert all(p.grad is None for n, p in net.named_parameters() if n in frozen)
    assert all(p.grad is not None for n, p in net.named_parameters() if n not in frozen)


def test_drop_path_rises_over_all_blocks() -> None:
    net = build_network({**TINY["FDAT"], "num_groups": 2, "depth_per_group": 2, "drop_path_rate": 0.3})
    rates = [getattr(b.dp, "drop_prob", 0.0) for g in net.groups for b in g.blocks]
    assert rates == pytest.approx([0.3 * i / 7 for i in range(8)])


# ----------------------------------------------------------------------------- build errors

@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_head_record_is_the_references(name: str) -> None:
    """The head's record (a buffer the network computes) is the one spandrel writes for the same arguments (the io
    file's ``MetaUpsample``; reference parity itself: tests/archs/test_standard.py)."""
    own = build_network(net_opt(GROUP, name)).state_dict()
    assert torch.equal(own["upsampler.MetaUpsample"], fixture_io(GROUP, name)["MetaUpsample"])


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"upsampler_type": "lda", "mid_dim": 12}, r"network_g\.mid_dim: FDAT's 'lda' upsampler needs mid_dim \(12\) "
                                               r"to be a multiple of 8"),
    ({"upsampler_type": "bicubic"}, r"network_g\.upsampler_type: FDAT has no upsampler 'bicubic'"),
    ({"upsampler_type": "transpose+conv", "scale": 8}, r"network_g\.scale: .*'transpose\+conv' upsampler supports"),
    ({"upsampler_type": "pa_up", "scale": 6}, r"network_g\.scale: .*'pa_up' upsampler supports scales 2\^n and 3"),
    ({"scale": 0}, r"network_g\.scale: FDAT needs an integer scale >= 1"),
    ({"num_heads": 3}, r"network_g\.num_heads: FDAT needs embed_dim \(8\) to be a multiple of num_heads \(3\)"),
    ({"group_block_pattern": ["spatial", "window"]}, r"network_g\.group_block_pattern: FDAT's blocks are"),
    ({"aim_reduction_ratio": 16}, r"network_g\.aim_reduction_ratio: FDAT needs 1 <= aim_reduction_ratio"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network({**TINY["FDAT"], **opt})


# ----------------------------------------------------------------------------- ONNX

@pytest.mark.parametrize("name", [pytest.param("fdat_x4_transpose", marks=pytest.mark.slow),
                                  "fdat_x2_unshuffle_pixelshuffle",
                                  pytest.param("fdat_x2_lda", marks=pytest.mark.slow)])
def test_onnx_runs_at_unseen_sizes(name: str, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net, io = load_case(GROUP, name)
    kwargs = MANIFEST[name]["kwargs"]
    rep = export_onnx(net, tmp_path / "m.onnx", scale=kwargs["scale"], net_opt={"type": "FDAT", **kwargs})
    assert rep.dynamic is True, rep.note
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for x in (torch.rand(1, 3, 13, 22), io["input1"]):  # sizes the export never saw, off the window multiple
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        with torch.no_grad():
            torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- training through the CLI


# ----------------------------------------------------------------------------- XLA:CPU

XLA_NETS = {
    "FDAT-transpose": (TINY["FDAT"], (2, 3, 7, 10)),
    "FDAT-unshuffle-dysample": ({**TINY["FDAT"], "unshuffle_mod": True, "upsampler_type": "dysample"}, (1, 3, 9, 8)),
    "FDAT-pa_up": ({**TINY["FDAT"], "upsampler_type": "pa_up", "scale": 4}, (1, 3, 8, 6)),
    "FDAT-lda": ({**TINY["FDAT"], "upsampler_type": "lda", "mid_dim": 16, "scale": 3}, (1, 3, 6, 5)),
}


@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(XLA_NETS))
def test_xla_train_step_compiles_once(arch: str) -> None:
    opt, shape = XLA_NETS[arch]
    opt = {**opt, "drop_path_rate": 0.0}
    # and the eval graph at another size
    check_xla_train_step(opt, shape, eval_shape=(1, 3, 16, 20), scale=build_network(dict(opt)).upscale)

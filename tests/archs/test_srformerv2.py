"""traiNNer-redux's SRFormerV2 (``SRFormerv2``, preset ``srformerv2``).

Fixtures come from traiNNer-redux's own class (``tools/fixtures/make_srformerv2_fixtures.py``): the state dicts load
strictly and give its outputs in eval mode (inputs that are not a multiple of the window included) and its
training-mode gradients; the buffers anysr computes equal its. The cases with its fixed 64-channel reconstruction
(``pixelshuffle``, ``nearest+conv``) store every tensor but those convs, which are seeded. Also: the preset builds
traiNNer-redux's size under its spelling, padding to the least common multiple of the two windows, bad arguments
refused naming the argument, recognition without ``--arch`` (and never as SRFormer, SwinIR or HAT, nor those as
it), ONNX through anysr's exporter at a size never traced, and an XLA:CPU train step that compiles once with no aten
op left to the CPU (``-m xla``). The checks every architecture gets (channels_last, bf16 autocast, the meta
device, gradients, training runs) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step, fixture_io, stored_params
from conftest import FIXTURE_TOL, ROOT

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise_all
from anysr.errors import OptionError

GROUP = "srformerv2"
FIXTURES = ROOT / "tests" / "fixtures" / GROUP
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())["cases"]

# a tiny network (ONNX, XLA, the training row in archs/test_standard.py): window 8 on an 8-pixel patch, so the Swin
# blocks' window is 8 too
TINY = {"type": "SRFormerv2", "img_size": 8, "embed_dim": 8, "squeeze_dim": 2, "depths": [2], "num_heads": [2],
        "window_size": 8, "upscale": 2, "upsampler": "pixelshuffledirect", "drop_path_rate": 0.0}


def _reference_state(name: str) -> dict[str, torch.Tensor]:
    """The case's state dict as traiNNer-redux had it: the seeded weights and the buffers it built (stored as
    ``state.<key>``, in compact dtypes)."""
    io = fixture_io(GROUP, name)
    return {**stored_params(GROUP, name), **{k[6:]: v for k, v in io.items() if k.startswith("state.")}}


def _reference_net(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """anysr's network of case ``name`` with traiNNer-redux's weights (strict; buffers stored in compact dtypes)."""
    case = MANIFEST[name]
    net = build_network({"type": case["type"], **case["kwargs"]}).eval()
    own = net.state_dict()
    state = _reference_state(name)
    assert {k: tuple(v.shape) for k, v in own.items()} == {k: tuple(v.shape) for k, v in state.items()}
    net.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=True)
    return net, fixture_io(GROUP, name)


# ----------------------------------------------------------------------------- traiNNer-redux parity

def test_fixtures_cover_every_upsampler_and_residual_conv() -> None:
    kwargs = [c["kwargs"] for c in MANIFEST.values()]
    assert {k["upsampler"] for k in kwargs} == {"pixelshuffle", "pixelshuffledirect", "nearest+conv", ""}
    assert {k.get("resi_connection", "1conv") for k in kwargs} == {"1conv", "3conv"}
    assert all(p.stat().st_size < 200_000 for p in FIXTURES.iterdir())


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    net, io = _reference_net(name)
    for inp, out, _ in MANIFEST[name]["compare"]:
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} differs")


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_buffers_equal_the_reference(name: str) -> None:
    """Position indices and the shifted blocks' masks (for img_size) as traiNNer-redux computes them (a strict load
    overwrites them, a fresh network must have them right)."""
    fresh = build_network({"type": "SRFormerv2", **MANIFEST[name]["kwargs"]})
    stored = _reference_state(name)
    buffers = dict(fresh.named_buffers())
    persistent = {k for k in fresh.state_dict() if k in buffers}
    assert persistent, "no persistent buffer"
    for key in persistent:
        assert torch.equal(buffers[key], stored[key].to(buffers[key].dtype)), key


def test_block_layout_follows_the_reference() -> None:
    """Swin blocks (window 12 unless the patch is smaller, never shifted) at 0, 3, 6 of the block list, appended
    past its end; PSA windows never shrink, every second one shifts."""
    from anysr.archs.srformer_arch import PSABlock  # noqa: PLC0415
    from anysr.archs.swinir_arch import SwinTransformerBlock  # noqa: PLC0415

    net = build_network({**TINY, "img_size": 24, "window_size": 24, "depths": [4, 1], "num_heads": [2, 2]})
    kinds = [["S" if isinstance(b, SwinTransformerBlock) else "P" for b in layer.residual_group.blocks]
             for layer in net.layers]
    assert kinds == [list("SPPSPPS"), list("SPSS")]
    first = net.layers[0].residual_group.blocks
    assert {b.window_size for b in first if isinstance(b, SwinTransformerBlock)} == {12}
    assert [b.shift_size for b in first if isinstance(b, PSABlock)] == [0, 12, 0, 12]
    assert all(b.window_size == 24 for b in first if isinstance(b, PSABlock))  # the window equals the patch: kept
    assert net.tile_multiple == 24


def test_checkpointed_blocks_give_the_same_gradients() -> None:
    x = torch.rand(1, 3, 8, 16)
    grads = []
    for flag in (False, True):
        torch.manual_seed(0)
        net = build_network({**TINY, "use_checkpoint": flag}).train()
        net(x).square().mean().backward()
        grads.append(net.layers[0].residual_group.blocks[2].attn.kv.weight.grad)
    torch.testing.assert_close(grads[0], grads[1])


# ----------------------------------------------------------------------------- padding

def test_padding_to_both_windows() -> None:
    """Inputs are padded to lcm(window_size, Swin window): where traiNNer-redux runs, that is its own padding to
    window_size; where its Swin blocks cannot partition (window 8, Swin window 12: 16 x 16 inputs) anysr pads
    further, and the result is the network on the explicitly padded input, cropped."""
    torch.manual_seed(0)
    net = build_network({**TINY, "img_size": 16}).eval()
    assert net.tile_multiple == 24
    x = torch.rand(1, 3, 16, 13)
    padded = torch.nn.functional.pad(x, (0, 11, 0, 8), mode="reflect")
    with torch.no_grad():
        got, whole = net(x), net(padded)
    assert got.shape == (1, 3, 32, 26)
    torch.testing.assert_close(got, whole[..., :32, :26])


def test_one_row_of_windows() -> None:
    """One image whose windows form a single row (a strided view in the window partition once): SRFormerV2, SRFormer
    and SwinIR run it."""
    for opt in (TINY, {"type": "SRFormer", "img_size": 8, "embed_dim": 8, "depths": [2], "num_heads": [2],
                       "window_size": 4, "upscale": 2, "upsampler": "pixelshuffledirect"},
                {"type": "SwinIR", "img_size": 8, "embed_dim": 8, "depths": [2], "num_heads": [2], "window_size": 4,
                 "upscale": 2, "upsampler": "pixelshuffledirect"}):
        net = build_network(opt).eval()
        m = net.tile_multiple
        with torch.no_grad():
            assert net(torch.rand(1, 3, m, 3 * m)).shape == (1, 3, 2 * m, 6 * m)
            assert net(torch.rand(1, 3, 3 * m, m)).shape == (1, 3, 6 * m, 2 * m)


# ----------------------------------------------------------------------------- preset

def test_preset_builds_trainner_redux_size() -> None:
    """traiNNer-redux's ``srformerv2`` (counted with its code: 22,066,755 parameters at x4, 21,919,043 at x2), under
    its spelling (``scale``); the exact class name keeps the class's defaults."""
    with torch.device("meta"):
        x4 = build_network({"type": "srformerv2"})
        x2 = build_network({"type": "srformerv2", "scale": 2})
        other_case = build_network({"type": "SRFormerV2", "scale": 3})
    assert type(x4).__name__ == "SRFormerv2" and x4.upscale == 4 and x2.upscale == 2 and other_case.upscale == 3
    assert sum(p.numel() for p in x4.parameters()) == 22_066_755
    assert sum(p.numel() for p in x2.parameters()) == 21_919_043
    assert x4.tile_multiple == 36
    with pytest.raises(OptionError, match=r"network_g\.window_size: SRFormerv2's permuted windows need an even"):
        build_network({"type": "SRFormerv2"})  # the original class's default window 7


def test_trainner_option_file_network(tmp_path: Path) -> None:
    """traiNNer-redux's ``network_g: {type: srformerv2}`` with the file's top-level scale."""
    from anysr.options.loader import validate_options  # noqa: PLC0415

    opt = {"name": "s", "model_type": "SRModel", "scale": 2, "num_gpu": 0, "path": {"root": str(tmp_path)},
           "network_g": {"type": "srformerv2", "use_checkpoint": True}}
    net = validate_options(opt, is_train=False, root=tmp_path)["network_g"]
    assert (net["type"], net["upscale"], net["squeeze_dim"], net["use_checkpoint"]) == ("SRFormerv2", 2, 60, True)


# ----------------------------------------------------------------------------- bad arguments

@pytest.mark.parametrize(("opt", "pattern"), [
    ({"window_size": 7}, r"network_g\.window_size: SRFormerv2's permuted windows need an even window_size"),
    ({"window_size": 0}, r"network_g\.window_size: "),
    ({"img_size": 0}, r"network_g\.img_size: SRFormerv2: img_size must be a positive integer"),
    ({"squeeze_dim": 0}, r"network_g\.squeeze_dim: SRFormerv2: squeeze_dim must be a positive integer"),
    ({"squeeze_dim": 3, "num_heads": [8], "embed_dim": 16},
     r"network_g\.squeeze_dim: SRFormerv2 needs 4 \* squeeze_dim \(12\) to be a multiple"),
    ({"embed_dim": 9}, r"network_g\.embed_dim: SRFormerv2 needs embed_dim \(9\) to be a multiple"),
    ({"depths": [2, 0], "num_heads": [2, 2]}, r"network_g\.depths: SRFormerv2: every group needs at least one PSA"),
    ({"num_heads": [2, 2]}, r"network_g\.num_heads: .*num_heads has 2 entries"),
    ({"upsampler": "bicubic"}, r"network_g\.upsampler: .*unknown upsampler"),
    ({"resi_connection": "2conv"}, r"network_g\.resi_connection: .*unknown resi_connection"),
    ({"upsampler": "nearest+conv"}, r"network_g\.upscale: .*'nearest\+conv' supports upscale 4 only"),
    ({"upsampler": "pixelshuffle", "upscale": 5}, r"network_g\.upscale: "),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err:
        build_network({**TINY, **opt})
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- recognition

def _layout(opt: dict) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        net = build_network(opt)
    return {k: tuple(v.shape) for k, v in net.state_dict().items()}


LOOK_ALIKES = [
    {"type": "SRFormer", "img_size": 8, "embed_dim": 16, "depths": [4], "num_heads": [2], "window_size": 4},
    {"type": "SRFormer", "img_size": 24, "embed_dim": 8, "depths": [2], "num_heads": [2], "window_size": 12,
     "upsampler": "pixelshuffledirect"},
    {"type": "SwinIR", "img_size": 12, "embed_dim": 8, "depths": [7], "num_heads": [2], "window_size": 12},
    {"type": "SwinIR", "img_size": 8, "embed_dim": 12, "depths": [4, 4], "num_heads": [2, 2], "window_size": 4,
     "upscale": 2, "upsampler": "pixelshuffle"},
    {"type": "HAT", "img_size": 8, "embed_dim": 12, "depths": [2], "num_heads": [2], "window_size": 4,
     "squeeze_factor": 4, "mlp_ratio": 2.0},
    {"type": "srformer"}, {"type": "swinir_m"}, {"type": "hat_s"},
]


@pytest.mark.parametrize("opt", LOOK_ALIKES, ids=lambda o: o["type"])
def test_relatives_are_not_taken_for_srformerv2(opt: dict) -> None:
    found = [r.opt["type"] for r in recognise_all(_layout(opt))]
    assert found and "SRFormerv2" not in found, found


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_srformerv2_is_not_taken_for_its_relatives(name: str) -> None:
    """Every fixture's network is recognised as SRFormerv2 alone, with arguments building its tensors."""
    layout = _layout({"type": "SRFormerv2", **MANIFEST[name]["kwargs"]})
    found = recognise_all(layout)
    assert [r.opt["type"] for r in found] == ["SRFormerv2"], [r.describe() for r in found]
    assert _layout(found[0].opt) == layout


def test_the_preset_is_recognised() -> None:
    layout = _layout({"type": "srformerv2", "scale": 2})
    found = recognise_all(layout)
    assert [r.opt["type"] for r in found] == ["SRFormerv2"] and found[0].opt["squeeze_dim"] == 60
    assert _layout(found[0].opt) == layout


# ----------------------------------------------------------------------------- ONNX

def test_onnx_export_runs_at_sizes_it_never_saw(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = build_network(TINY).eval()
    check_onnx_at_unseen_size(net, TINY, 2, tmp_path, size=(13, 18))


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
def test_xla_train_step_compiles_once_without_cpu_fallback() -> None:
    """Two windows per side (masks of the shifted PSA blocks), padded eval input."""
    check_xla_train_step(TINY, (2, 3, 16, 8), scale=2, eval_shape=(1, 3, 13, 9))

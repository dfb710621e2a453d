"""HAT, DAT and DRCT: the reference implementations' weights load strictly and give their outputs; any input
size, bf16 autocast, channels_last, the published layouts, argument errors, and one XLA compile per shape; the
Swin-family helpers of arch_util (init, no-weight-decay names, position index, shifted-window masks)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from arch_checks import fixture_io, load_case, manifest
from conftest import FIXTURE_TOL, ROOT
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.arch_util import (
    SwinWeightsMixin,
    pad_to_multiple,
    relative_position_index,
    shifted_window_blocked,
    shifted_window_mask,
    window_partition,
)
from anysr.archs.hat_arch import overlap_position_index, overlapping_windows
from anysr.errors import OptionError

FIXTURES = ROOT / "tests" / "fixtures" / "attention"
MANIFEST = manifest("attention")["cases"]
TINY = {
    "HAT": {"type": "HAT", "img_size": 8, "embed_dim": 12, "depths": [2], "num_heads": [2], "window_size": 4,
            "squeeze_factor": 4, "mlp_ratio": 2.0, "upscale": 2},
    "DAT": {"type": "DAT", "img_size": 8, "embed_dim": 32, "depth": [2], "num_heads": [2], "split_size": [2, 4],
            "expansion_factor": 2.0, "upscale": 2},
    "DRCT": {"type": "DRCT", "img_size": 8, "embed_dim": 12, "depths": [1], "num_heads": [2], "window_size": 4,
             "gc": 4, "mlp_ratio": 2.0, "upscale": 2},
    # SwinIR shares the window attention (arch_util.window_attention); checked here on XLA only.
    "SwinIR": {"type": "SwinIR", "img_size": 8, "embed_dim": 12, "depths": [2], "num_heads": [2], "window_size": 4,
               "mlp_ratio": 2.0, "upscale": 2, "upsampler": "pixelshuffle"},
}


def _build(name: str) -> torch.nn.Module:
    case = MANIFEST[name]
    return build_network({"type": case["type"], **case["kwargs"]}).eval()


def _tiny(arch: str, **kwargs: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_network({**TINY[arch], **kwargs}).eval()


# ----------------------------------------------------------------------------- reference parity

@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_checkpoint_matches(name: str, tmp_path: Path) -> None:
    case = MANIFEST[name]
    reference = {**case["seeded"]["shapes"], **case["buffers"]}  # the reference's state dict: seeded + computed
    seeded, io = load_case("attention", name)
    net = _build(name)
    assert set(net.state_dict()) == set(reference), "state-dict keys differ from the reference's"
    for key, value in net.state_dict().items():
        assert list(value.shape) == reference[key], key
    torch.save({"params": seeded.state_dict()}, tmp_path / f"{name}.pth")  # as the authors release weights
    ckpt = torch.load(tmp_path / f"{name}.pth", map_location="cpu", weights_only=True)
    for inp, out, key in MANIFEST[name]["compare"]:
        net.load_state_dict(ckpt[key], strict=True)
        with torch.no_grad():
            got = net(io[inp])
        assert got.shape == io[out].shape
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {inp} differs from the reference")


def test_fixtures_cover_padding_and_batches() -> None:
    """Every arch has a case with a non-multiple input size and one with batch 2."""
    for arch in ("HAT", "DAT", "DRCT"):
        shapes = [fixture_io("attention", name)[inp].shape
                  for name, case in MANIFEST.items() if case["type"] == arch for inp, _, _ in case["compare"]]
        multiple = _build(next(n for n, c in MANIFEST.items() if c["type"] == arch)).tile_multiple
        assert any(s[-1] % multiple or s[-2] % multiple for s in shapes), arch
        assert any(s[0] == 2 for s in shapes), arch


def test_published_layouts_match() -> None:
    """The authors' option-file configurations: the same state-dict keys, shapes and dtypes (no weights)."""
    configs = json.loads(gzip.decompress((FIXTURES / "published_keys.json.gz").read_bytes()))["configs"]
    assert {"HAT-S_SRx4", "HAT-L_SRx4", "DAT_x2", "DAT_light_x4", "DRCT-L_SRx2"} <= set(configs)
    for name, cfg in configs.items():
        with torch.device("meta"):  # layouts only: no memory, no initialisation
            net = build_network({"type": cfg["type"], **cfg["kwargs"]})
        got = {k: [list(v.shape), str(v.dtype).removeprefix("torch.")] for k, v in net.state_dict().items()}
        assert got == cfg["keys"], f"{name}: state-dict layout differs from the reference's"


# ----------------------------------------------------------------------------- any size, tiles

@pytest.mark.parametrize("arch", ["HAT", "DAT", "DRCT"])
def test_tile_multiple_and_any_size(arch: str) -> None:
    net = _tiny(arch)
    assert isinstance(net.tile_multiple, int) and net.tile_multiple == 4
    with torch.no_grad():
        for h, w in ((8, 8), (9, 6), (3, 2), (1, 1)):
            out = net(torch.rand(1, 3, h, w))
            assert out.shape == (1, 3, 2 * h, 2 * w) and torch.isfinite(out).all()


@pytest.mark.parametrize("arch", ["HAT", "DRCT"])
@pytest.mark.parametrize("upscale", [2, 3, 4])
def test_padding_then_crop_at_every_scale(arch: str, upscale: int) -> None:
    # forward(x) is the network on the reflect-padded input, cropped to x's size times the scale.
    net = _tiny(arch, upscale=upscale)
    x = torch.rand(1, 3, 6, 7)
    with torch.no_grad():
        padded = net(F.pad(x, (0, 1, 0, 2), mode="reflect"))
        got = net(x)
    assert padded.shape == (1, 3, 8 * upscale, 8 * upscale)
    assert torch.equal(got, padded[..., : 6 * upscale, : 7 * upscale])


@pytest.mark.parametrize(("arch", "multiple"), [("HAT", 16), ("DAT", 4), ("DRCT", 7)])
def test_defaults_build_and_run(arch: str, multiple: int) -> None:
    with torch.device("meta"):  # shapes only: the default sizes are millions of parameters
        net = build_network({"type": arch}).eval()
        out = net(torch.empty(1, 3, 9, 10))
    assert net.tile_multiple == multiple and out.shape == (1, 3, 18, 20)


def test_pad_to_multiple_reflects_then_replicates() -> None:
    x = torch.arange(6.0).view(1, 1, 2, 3)
    same, ph, pw = pad_to_multiple(x, 1)
    assert same is x and (ph, pw) == (0, 0)
    y, ph, pw = pad_to_multiple(x, 4)
    assert (ph, pw) == (2, 1) and y.shape == (1, 1, 4, 4)
    assert y[0, 0, :2, 3].tolist() == [1.0, 4.0]  # reflect of the last column
    assert y[0, 0, 2].tolist() == [0.0, 1.0, 2.0, 1.0]  # reflect of row 0 (the one reflect can reach)
    assert y[0, 0, 3].tolist() == [0.0, 1.0, 2.0, 1.0]  # then replicate


def test_dat_pads_inside_like_the_reference() -> None:
    # No padding around the network: a non-multiple input is not the crop of a padded one.
    net = _tiny("DAT")
    x = torch.rand(1, 3, 6, 7)
    with torch.no_grad():
        got = net(x)
        padded = net(F.pad(x, (0, 1, 0, 2), mode="reflect"))[..., :12, :14]
    assert got.shape == (1, 3, 12, 14) and not torch.allclose(got, padded)


@pytest.mark.parametrize("arch", ["HAT", "DAT", "DRCT"])
def test_batch_items_independent_and_no_state_between_sizes(arch: str) -> None:
    net = _tiny(arch)
    x = torch.rand(2, 3, 8, 12)
    with torch.no_grad():
        both = net(x)
        net(torch.rand(1, 3, 12, 8))
        single = net(x[1:])
        again = net(x)
    torch.testing.assert_close(both[1:], single, atol=1e-6, rtol=1e-5)
    assert torch.equal(both, again)


@pytest.mark.parametrize(("h", "w", "ws", "margin"), [(8, 12, 4, 1), (16, 8, 8, 4), (8, 8, 4, 0), (8, 16, 4, 4)])
def test_overlapping_windows_equal_unfold(h: int, w: int, ws: int, margin: int) -> None:
    x = torch.randn(2, h, w, 5)
    k = ws + 2 * margin
    ref = F.unfold(x.permute(0, 3, 1, 2), k, stride=ws, padding=margin)  # (b, c*k*k, windows)
    ref = ref.view(2, 5, k * k, -1).permute(0, 3, 2, 1).reshape(-1, k * k, 5)
    assert torch.equal(overlapping_windows(x, ws, margin), ref)


def test_hat_overlap_index_wraps_like_the_reference() -> None:
    # The authors' index is partly negative (torch indexing wraps it); the buffer keeps their values.
    index = overlap_position_index(4, 6)
    assert index.shape == (16, 36) and index.min() < 0 and index.max() < 9 * 9
    assert set(index.remainder(81).unique().tolist()) <= set(range(81))


# ----------------------------------------------------------------------------- Swin-family helpers

def _reference_swin_init(norms: tuple[type[torch.nn.Module], ...]) -> Callable[[torch.nn.Module], None]:
    """The authors' ``_init_weights``, spelt out."""

    def init(m: torch.nn.Module) -> None:
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                torch.nn.init.constant_(m.bias, 0)
        elif isinstance(m, norms):
            torch.nn.init.constant_(m.bias, 0)
            torch.nn.init.constant_(m.weight, 1.0)
    return init


@pytest.mark.parametrize("arch", sorted(TINY))
def test_swin_init_is_the_authors_init(arch: str) -> None:
    """With one seed, ``init_swin_weights`` draws exactly what the authors' ``self.apply(self._init_weights)`` does."""
    net = _tiny(arch)
    assert isinstance(net, SwinWeightsMixin)
    norms = (torch.nn.LayerNorm, torch.nn.BatchNorm2d, torch.nn.GroupNorm, torch.nn.InstanceNorm2d) \
        if arch == "DAT" else (torch.nn.LayerNorm,)
    torch.manual_seed(3)
    net.init_swin_weights()
    ours = {k: v.clone() for k, v in net.state_dict().items()}
    torch.manual_seed(3)
    net.apply(_reference_swin_init(norms))
    for key, value in net.state_dict().items():
        assert torch.equal(ours[key], value), key


def test_no_weight_decay_names() -> None:
    for arch in ("SwinIR", "HAT", "DRCT"):
        net = _tiny(arch, ape=True)
        assert net.no_weight_decay() == {"absolute_pos_embed"}
        assert net.no_weight_decay_keywords() == {"relative_position_bias_table"}
        names = [name for name, _ in net.named_parameters()]
        assert "absolute_pos_embed" in names and any("relative_position_bias_table" in n for n in names)
    dat = _tiny("DAT")
    assert dat.no_weight_decay() == set() and dat.no_weight_decay_keywords() == set()


@pytest.mark.parametrize("window", [1, 4, (2, 3), (3, 2)])
def test_relative_position_index_counts_offsets(window: int | tuple[int, int]) -> None:
    wh, ww = (window, window) if isinstance(window, int) else window
    tokens = [(y, x) for y in range(wh) for x in range(ww)]
    expected = [[(qy - ky + wh - 1) * (2 * ww - 1) + (qx - kx + ww - 1) for ky, kx in tokens] for qy, qx in tokens]
    index = relative_position_index(window)
    assert index.dtype == torch.int64 and index.tolist() == expected


@pytest.mark.parametrize(("h", "w", "window", "shift"), [(8, 12, 4, 2), (8, 8, 4, 1), (6, 12, (2, 4), (1, 2))])
def test_shifted_window_blocked_separates_what_the_roll_brought_together(h: int, w: int, window: int | tuple,
                                                                           shift: int | tuple) -> None:
    """Two tokens of a shifted window may attend iff the roll did not join them from different image bands (the
    authors' slicing of the last window and the wrapped-around shift)."""
    (wh, ww), (sh, sw) = ((window, window) if isinstance(window, int) else window,
                          (shift, shift) if isinstance(shift, int) else shift)
    label = torch.zeros(1, h, w, 1)
    count = 0
    for ys in (slice(0, -wh), slice(-wh, -sh), slice(-sh, None)):
        for xs in (slice(0, -ww), slice(-ww, -sw), slice(-sw, None)):
            label[:, ys, xs, :] = count
            count += 1
    windows = label.view(h // wh, wh, w // ww, ww).permute(0, 2, 1, 3).reshape(-1, wh * ww)  # row-major windows
    if wh == ww:
        assert torch.equal(windows, window_partition(label, wh).reshape(-1, wh * ww))
    expected = windows[:, None, :] != windows[:, :, None]
    blocked = shifted_window_blocked(h, w, window, shift)
    assert blocked.dtype == torch.bool and torch.equal(blocked, expected)
    mask = shifted_window_mask(h, w, window, shift, dtype=torch.bfloat16)
    assert mask.dtype == torch.bfloat16 and torch.equal(mask, torch.where(expected, -100.0, 0.0).bfloat16())


# ----------------------------------------------------------------------------- dtypes, layouts, devices

@pytest.mark.parametrize("name", ["hat_x1", "dat_x1", "drct_x1"])
def test_bf16_autocast_stays_close(name: str) -> None:
    net, _ = load_case("attention", name)
    x = torch.rand(1, 3, 10, 13)
    with torch.no_grad():
        ref = net(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            mixed = net(x)
    assert mixed.shape == ref.shape and torch.isfinite(mixed).all()
    scale = ref.abs().max().item()
    assert (mixed.float() - ref).abs().max().item() < 0.05 * max(scale, 1.0)


@pytest.mark.parametrize("name", ["hat_x1", "dat_x1", "drct_x1"])
def test_channels_last_input_and_weights(name: str) -> None:
    net, _ = load_case("attention", name)
    x = torch.rand(2, 3, 10, 13)
    with torch.no_grad():
        ref = net(x)
        got = net.to(memory_format=torch.channels_last)(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", ["HAT", "DAT", "DRCT"])
def test_forward_creates_no_tensor_off_the_input_device(arch: str) -> None:
    net = _tiny(arch).to("meta")
    out = net(torch.empty(1, 3, 6, 7, device="meta"))
    assert out.device.type == "meta" and out.shape == (1, 3, 12, 14)


@pytest.mark.parametrize("arch", ["HAT", "DAT", "DRCT"])
def test_checkpointing_matches_plain_forward_and_trains(arch: str) -> None:
    flag = "use_chk" if arch == "DAT" else "use_checkpoint"
    plain = _tiny(arch).train()
    ckpt = _tiny(arch, **{flag: True}).train()
    ckpt.load_state_dict(plain.state_dict())
    # no dropout / drop path in the tiny configs except drop_path_rate 0.1: disable it for a deterministic check
    for m in (*plain.modules(), *ckpt.modules()):
        if hasattr(m, "drop_prob"):
            m.drop_prob = 0.0
    x = torch.rand(2, 3, 8, 8, requires_grad=True)
    y1, y2 = plain(x), ckpt(x)
    torch.testing.assert_close(y1, y2, atol=1e-6, rtol=1e-5)
    y2.square().mean().backward()
    grads = [p.grad for p in ckpt.parameters() if p.requires_grad]
    assert x.grad is not None and all(g is not None and torch.isfinite(g).all() for g in grads)


def test_dat_trains_on_a_single_image() -> None:
    # The pooled batch norm has one value per channel at batch 1: running statistics instead of an error;
    # with two images it is plain batch norm (batch statistics, running statistics updated).
    net = _tiny("DAT").train()
    bn = net.layers[0].blocks[0].attn.channel_interaction[2]
    before = bn.running_mean.clone()
    net(torch.rand(1, 3, 8, 8)).mean().backward()
    assert torch.equal(bn.running_mean, before)
    net(torch.rand(2, 3, 8, 8))
    assert not torch.equal(bn.running_mean, before)


# ----------------------------------------------------------------------------- build errors

@pytest.mark.parametrize(("opt", "pattern"), [
    ({**TINY["HAT"], "upsampler": ""}, r"network_g\.upsampler: HAT: upsampler must be 'pixelshuffle'"),
    ({**TINY["HAT"], "resi_connection": "3conv"}, r"network_g\.resi_connection: HAT: unknown"),
    ({**TINY["HAT"], "img_size": 2}, r"network_g\.img_size: HAT: img_size 2 .* at least window_size 4"),
    ({**TINY["HAT"], "window_size": 6}, r"network_g\.overlap_ratio: .* = 3 must be even"),
    ({**TINY["HAT"], "overlap_ratio": 2.5}, r"network_g\.overlap_ratio: HAT: overlap_ratio must be in \[0, 2\]"),
    ({**TINY["HAT"], "num_heads": [5]}, r"network_g\.num_heads: HAT: embed_dim 12 is not divisible by 5"),
    ({**TINY["HAT"], "squeeze_factor": 30}, r"network_g\.squeeze_factor: HAT: squeeze_factor must be"),
    ({**TINY["DAT"], "upsampler": "nearest+conv"}, r"network_g\.upsampler: DAT: unknown upsampler"),
    ({**TINY["DAT"], "num_heads": [3]}, r"network_g\.num_heads: DAT: each head count must be even"),
    ({**TINY["DAT"], "embed_dim": 16}, r"network_g\.embed_dim: DAT: embed_dim must be even and at least 32"),
    ({**TINY["DAT"], "depth": [2, 2]}, r"network_g\.num_heads: DAT: num_heads has 1 entries but depth has 2"),
    ({**TINY["DRCT"], "embed_dim": 20, "num_heads": [6], "gc": 6}, r"network_g\.gc: DRCT: block 2 .* 26 channels"),
    ({**TINY["DRCT"], "upscale": 5}, r"network_g\.upscale: scale 5 is not supported"),
])
def test_bad_arguments_name_the_option(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


def test_drct_accepts_the_authors_unused_options() -> None:
    net = build_network({**TINY["DRCT"], "compress_ratio": 3, "squeeze_factor": 30, "conv_scale": 0.01,
                         "overlap_ratio": 0.5})
    assert net.tile_multiple == 4


# ----------------------------------------------------------------------------- XLA

@pytest.mark.xla
@pytest.mark.parametrize("arch", ["HAT", "DAT", "DRCT", "SwinIR"])
def test_xla_one_compile_per_shape(arch: str) -> None:
    pytest.importorskip("torch_xla")
    import torch_xla
    import torch_xla.debug.metrics as met

    dev = torch_xla.device()
    net = _tiny(arch).train().to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    x = torch.rand(2, 3, 6, 7).to(dev)  # not a window multiple: the padding is part of the one graph
    counts = []
    for _ in range(3):
        opt.zero_grad()
        loss = net(x).abs().mean()
        loss.backward()
        opt.step()
        torch_xla.sync()
        counts.append(met.metric_data("CompileTime")[0])
    assert torch.isfinite(loss.cpu())
    assert counts[2] == counts[1], f"{arch}: a later step compiled again ({counts})"
    if arch != "DAT":
        assert counts[1] == counts[0], f"{arch}: the second step compiled again ({counts})"
    else:
        # DAT's batch norms start with num_batches_tracked = 0, which XLA inlines as a constant in the first
        # graph; from the second step on it is device data: at most one more graph, then none.
        assert counts[1] <= counts[0] + 1, f"DAT: the second step compiled more than once ({counts})"

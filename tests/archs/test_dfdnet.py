"""DFDNet against BasicSR 1.4.2 (``tools/fixtures/make_dfdnet_fixtures.py``: BasicSR's own modules with a
seeded stand-in for torchvision's VGG19, ``num_feat: 2`` and a tiny random component dictionary in BasicSR's
``.pth`` layout; weights and inputs from fixture_kit seeds, the spectral norms' vectors after BasicSR's training
passes stored).

Eval outputs with given boxes and with anysr's default FFHQ boxes, a training-mode pass (the spectral norms' power
iteration, the output, the input's and the parameters' gradients), strict loading and recognition at BasicSR's full
size (its state dict's names and shapes), the default boxes' derivation, batches with per-image boxes, the
dictionary's file formats and errors, ONNX at the traced size, a training run through ``anysr train``, and an
XLA:CPU training step (``-m xla`` in the XLA venv). The checks every architecture gets (channels_last, bf16, the
meta device, gradients) run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import functools
import pickle
from pathlib import Path

import pytest
import torch
from arch_checks import (
    FIXTURES,
    check_trained_weights,
    check_xla_train_step,
    fixture_io,
    load_case,
    manifest,
    saved_groups,
    train,
)
from conftest import FIXTURE_TOL, tiny_train_options
from safetensors.torch import save_file

from anysr.archs import build_network
from anysr.archs.arch_util import ArchArgumentError, unit_range
from anysr.archs.dfdnet_arch import FFHQ_PART_BOXES, DFDNet, default_part_boxes, load_component_dictionary
from anysr.archs.recognition.recognise import recognise
from anysr.errors import OptionError

GROUP = "dfdnet"
CASES = sorted(manifest(GROUP)["cases"])
TRAIN_CASE = "nf2_128x96"
DICT = FIXTURES / GROUP / "dict_nf2.pth"
TINY = {"type": "DFDNet", "num_feat": 2, "dict_path": str(DICT)}


@functools.cache
def _net(name: str) -> DFDNet:
    net, _ = load_case(GROUP, name)
    return net  # type: ignore[return-value]


def _state() -> dict[str, torch.Tensor]:
    """The fixture network's whole state dict (seeded weights, buffers, the spectral norms' vectors)."""
    return load_case(GROUP, CASES[0])[0].state_dict()


def _basicsr_locations(boxes: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """BasicSR's ``part_locations``: four (1, 4) int64 tensors."""
    return tuple(b[None].long() for b in boxes)


# ----------------------------------------------------------------------------- reference parity

@pytest.mark.parametrize("name", CASES)
def test_weights_load_strictly_and_match_with_given_and_default_boxes(name: str) -> None:
    net, io = _net(name), fixture_io(GROUP, name)
    with torch.no_grad():
        given = net(io["input1"], _basicsr_locations(io["boxes1"]))
        default = net(io["input0"])
        explicit_default = net(io["input0"], [b.tolist() for b in io["boxes0"]])
    torch.testing.assert_close(given, io["output1"], **FIXTURE_TOL, msg=f"{name}: given boxes")
    torch.testing.assert_close(default, io["output0"], **FIXTURE_TOL, msg=f"{name}: default boxes")
    torch.testing.assert_close(explicit_default, default, rtol=0, atol=0)


def test_training_pass_matches_basicsr() -> None:
    """Training mode: one power iteration per spectral norm (the vectors after it), the output, the gradient of
    ``(output * linspace).sum()`` for the input and every trainable parameter; the VGG stays frozen."""
    net, _ = load_case(GROUP, TRAIN_CASE)
    io = fixture_io(GROUP, TRAIN_CASE)
    net.train()
    x = io["input1"].clone().requires_grad_(True)
    out = net(x, _basicsr_locations(io["boxes1"]))
    (out * torch.linspace(-1, 1, out.numel()).reshape(out.shape)).sum().backward()
    torch.testing.assert_close(out, io["train_output"], **FIXTURE_TOL)
    torch.testing.assert_close(x.grad, io["grad_input"], rtol=1e-4, atol=1e-5 * io["grad_input"].abs().max().item())
    trainable = {n: p for n, p in net.named_parameters() if p.requires_grad}
    assert {k[len("gradsum."):] for k in io if k.startswith("gradsum.")} == set(trainable)
    assert all(p.grad is None for n, p in net.named_parameters() if n.startswith("vgg_extractor."))
    for n, p in trainable.items():
        got = torch.stack([p.grad.double().sum(), p.grad.double().abs().sum()])
        want = io[f"gradsum.{n}"]
        assert (got - want).abs().max() <= 1e-5 * want[1] + 1e-9, f"{n}: {got.tolist()} vs {want.tolist()}"
        if f"grad.{n}" in io:
            ref = io[f"grad.{n}"]  # float32 sums in another order: bounded at the gradient's own scale
            torch.testing.assert_close(p.grad, ref, rtol=1e-4, atol=1e-5 * max(ref.abs().max().item(), 1e-3), msg=n)
    buffers = dict(net.named_buffers())
    after = {k[len("after."):]: v for k, v in io.items() if k.startswith("after.")}
    assert after and all(torch.equal(buffers[k], v) for k, v in after.items())


def test_full_size_layout_is_basicsrs_and_recognised() -> None:
    """DFDNet(64) has exactly the names and shapes of BasicSR's (released weights load strictly); they are
    recognised as it from names and shapes alone; the dictionary is not in the state dict."""
    want = {k: tuple(v) for k, v in manifest(GROUP)["basicsr_layout_64"].items()}
    with torch.device("meta"):
        net = build_network({"type": "DFDNet"})
    assert {k: tuple(v.shape) for k, v in net.state_dict().items()} == want
    assert "vgg_extractor.vgg_net.conv5_4.weight" in want and "vgg_extractor.mean" in want
    assert recognise(want).opt == {"type": "DFDNet", "num_feat": 64}


def test_fixture_weights_are_recognised() -> None:
    params = _state()
    assert recognise(params).opt == {"type": "DFDNet", "num_feat": 2}
    net = build_network(dict(TINY))
    net.load_state_dict(params, strict=True)
    assert not any(k.startswith("dict_") for k in net.state_dict())


# ----------------------------------------------------------------------------- default boxes, batches, sizes

def test_default_boxes_are_the_derived_ffhq_boxes_scaled_to_the_input() -> None:
    assert [list(b) for b in FFHQ_PART_BOXES] == manifest(GROUP)["ffhq_part_boxes_512"]
    assert default_part_boxes(512, 512) == FFHQ_PART_BOXES
    for name in CASES:
        io = fixture_io(GROUP, name)
        assert [list(b) for b in default_part_boxes(*io["input0"].shape[-2:])] == io["boxes0"].tolist()


def test_a_batch_with_per_image_boxes_is_each_image_alone() -> None:
    net, io = _net(CASES[0]), fixture_io(GROUP, CASES[0])
    x = torch.cat([io["input1"], io["input0"]])
    boxes = [torch.stack([a, b]) for a, b in zip(io["boxes1"], io["boxes0"], strict=True)]  # (2, 4) per part
    with torch.no_grad():
        got = net(x, boxes)
        shared = net(x, [b[None] for b in io["boxes1"]])  # (1, 4): every image
    torch.testing.assert_close(got[:1], io["output1"], **FIXTURE_TOL)
    torch.testing.assert_close(got[1:], io["output0"], **FIXTURE_TOL)
    torch.testing.assert_close(shared[1:], net(io["input0"], [b[None] for b in io["boxes1"]]), **FIXTURE_TOL)


def test_any_size_is_padded_to_16_and_boxes_are_kept_inside() -> None:
    net = _net(CASES[0])
    x = torch.rand(1, 3, 50, 37) * 2 - 1
    with torch.no_grad():
        out = net(x)
        odd = net(x, [(-20, -5, 10, 12), (30, 0, 200, 20), (5, 5, 5, 5), (0, 30, 37, 50)])
    assert out.shape == odd.shape == x.shape and torch.isfinite(out).all() and torch.isfinite(odd).all()


def test_unit_range_pipeline_maps_zero_one_images() -> None:
    net = build_network(dict(TINY)).eval()
    wrapped = unit_range(build_network(dict(TINY)).eval())
    wrapped.load_state_dict(net.state_dict())
    x = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(wrapped(x), (net(x * 2 - 1) + 1) / 2)


# ----------------------------------------------------------------------------- the dictionary and arguments

def test_dictionary_from_safetensors_equals_the_pth(tmp_path: Path) -> None:
    nested = torch.load(DICT, weights_only=True)
    flat = {f"{size}.{part}": t for size, parts in nested.items() for part, t in parts.items()}
    save_file(flat, str(tmp_path / "d.safetensors"))
    a = load_component_dictionary(DICT)
    b = load_component_dictionary(tmp_path / "d.safetensors", channels=(4, 8, 16, 16))
    assert a.keys() == b.keys() and all(torch.equal(a[s][p], b[s][p]) for s in a for p in a[s])
    net = DFDNet(2)
    net.load_dictionary({int(s): parts for s, parts in nested.items()})
    assert net.has_dictionary and net.dict_256_left_eye.shape == nested["256"]["left_eye"].shape
    with pytest.raises(ArchArgumentError, match="the dictionary: not a DFDNet component dictionary .*no scale '32'"):
        DFDNet(2).load_dictionary({s: p for s, p in nested.items() if s != "32"})


class _NotATensor:
    pass


@pytest.mark.parametrize(("content", "pattern"), [
    (None, r"no such file"),
    (b"not a pickle", r"unreadable"),
    ([1, 2], r"holds a list"),
    ({"256": {}}, r"'256\.left_eye' is NoneType"),
    ("channels", r"'256\.left_eye' has 3 channels, the network 4"),
    ("object", r"unreadable: it holds objects other than tensors \[Unsupported global"),  # weights_only refuses
])
def test_bad_dictionary_files_say_which_path_and_why(tmp_path: Path, content: object, pattern: str) -> None:
    path = tmp_path / "dict.pth"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "channels":
        nested = torch.load(DICT, weights_only=True)
        nested["256"]["left_eye"] = torch.zeros(2, 3, 4, 4)
        torch.save(nested, path)
    elif content == "object":
        path.write_bytes(pickle.dumps({"256": _NotATensor()}, protocol=2))
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(OptionError, match=pattern) as err:
        build_network({**TINY, "dict_path": str(path)})
    msg = str(err.value)
    assert msg.startswith(f"network_g.dict_path: {path}: ") and "\n" not in msg
    with pytest.raises(ArchArgumentError, match=pattern):
        DFDNet(2, str(path))


def test_without_a_dictionary_it_builds_loads_and_says_what_is_missing() -> None:
    net = build_network({"type": "DFDNet", "num_feat": 2})
    net.load_state_dict(_state(), strict=True)
    with pytest.raises(ArchArgumentError, match="no component dictionary .* --arch-opt num_feat=2 dict_path=FILE"):
        net(torch.zeros(1, 3, 32, 32))


@pytest.mark.parametrize(("opt", "pattern"), [({"num_feat": 0}, "num_feat"), ({"num_feat": 2.5}, "num_feat")])
def test_bad_arguments(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=f"network_g.{pattern}"):
        build_network({"type": "DFDNet", **opt})


def test_bad_part_locations() -> None:
    net, x = _net(CASES[0]), torch.zeros(1, 3, 32, 32)
    with pytest.raises(ValueError, match="expected 4 boxes"):
        net(x, [(0, 0, 8, 8)] * 3)
    with pytest.raises(ValueError, match=r"the nose box must be \(4,\)"):
        net(x, [(0, 0, 8, 8), (0, 0, 8, 8), (0, 0, 8), (0, 0, 8, 8)])


# ----------------------------------------------------------------------------- ONNX, training, XLA

def test_onnx_at_the_traced_size(tmp_path: Path) -> None:
    """The boxes are traced in (the default ones of the export size): a fixed-size export, equal to PyTorch."""
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net = _net(CASES[0])
    rep = export_onnx(net, tmp_path / "m.onnx", scale=1, net_opt=dict(TINY), size=64, dynamic=False)
    assert rep.dynamic is False and rep.checks and max(c.max_diff for c in rep.checks) < 1e-4
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(session.run(None, {"input": x.numpy()})[0]), net(x),
                                   rtol=1e-4, atol=1e-4)


def test_trains_through_the_paired_model(tmp_path: Path, small_train_dir: Path) -> None:
    """Two SRModel iterations at x1 on 64-pixel crops (default boxes at that size), from the fixture's weights:
    the saved weights load strictly, are finite and moved; the frozen VGG did not."""
    start = {k: v.float() for k, v in _state().items()}
    save_file(start, str(tmp_path / "start.safetensors"))
    opt = tiny_train_options("dfdnet", small_train_dir, None, total_iter=2, train__ema_decay=0,
                             train__warmup_iter=-1)
    opt.update(scale=1, network_g=dict(TINY))
    opt["path"]["pretrain_network_g"] = str(tmp_path / "start.safetensors")
    opt["datasets"]["train"].update(gt_size=64, batch_size_per_gpu=2)
    opt["logger"]["save_checkpoint_freq"] = 2
    exp, log = train(tmp_path, opt)
    assert "l_pix" in log
    check_trained_weights(exp, 2, TINY)
    params = saved_groups(exp, 2)["params"]
    vgg = [k for k in start if k.startswith("vgg_extractor.")]
    assert vgg and all(torch.equal(params[k], start[k]) for k in vgg)
    assert not torch.equal(params["upsample4.4.weight"], start["upsample4.4.weight"])


@pytest.mark.xla
def test_xla_train_step_compiles_once_per_shape_without_fallbacks() -> None:
    """Default boxes: three training steps (spectral norm power iterations) compile one graph (the first step's
    initial u / v turn into step outputs: one more at most) and run no op on the CPU; an eval forward at another
    size is another graph and equals the CPU's; the same boxes given reuse it, another set of boxes compiles one
    more."""
    res = check_xla_train_step(dict(TINY), (2, 3, 64, 48), steps=3, same_loss=False, eval_shape=(1, 3, 48, 64))
    assert res.compiles[-1] <= 2, res.compiles
    import torch_xla
    from torch_xla.debug import metrics

    def compiles() -> int:
        data = metrics.metric_data("CompileTime")
        return int(data[0]) if data else 0

    cpu = build_network(dict(TINY)).eval()
    cpu.load_state_dict({k: v.cpu() for k, v in res.net.state_dict().items()})
    x = torch.rand(1, 3, 48, 64) * 2 - 1
    xd = x.to(res.x.device)
    with torch.no_grad():
        torch.testing.assert_close(res.net(xd).cpu(), cpu(x), rtol=1e-4, atol=1e-4)
        before = compiles()
        res.net(xd, default_part_boxes(48, 64)).cpu()  # the same boxes given: the same graph
        assert compiles() == before
        other = [(4, 6, 30, 20), (30, 6, 60, 20), (20, 16, 40, 34), (14, 30, 50, 46)]
        got = res.net(xd, other)
        torch_xla.sync()
        assert compiles() == before + 1  # another set of boxes: one more graph
        torch.testing.assert_close(got.cpu(), cpu(x, other), rtol=1e-4, atol=1e-4)

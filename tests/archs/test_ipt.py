"""IPT (the Image Processing Transformer; Chen et al., CVPR 2021) against spandrel 0.4.2.

Fixtures come from spandrel 0.4.2 (``tools/fixtures/make_ipt_fixtures.py``): one task and several (a chosen
``scale_idx``: its head, query embedding and tail), the position added once or in every layer, without the
token MLP and layer norms, without position encoding, x1 to x4 and ``rgb_range`` 255 or 1. The reference takes
exactly one ``patch_size`` square; anysr's IPT pads other sizes to squares, so that is checked separately. The
common checks (channels_last, bf16, the meta device, gradients, a training run, 2 ranks = 1 process) are in
tests/archs/test_standard.py; here: strict loading and parity, recognition, the padded sizes, build errors, the
published size, ONNX at unseen sizes and XLA:CPU compile-once without CPU fallbacks (``-m xla``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from arch_checks import check_xla_train_step, load_case, manifest
from conftest import tiny_train_options, write_options

from anysr.archs import build_network
from anysr.archs.arch_util import pad_to_multiple
from anysr.archs.recognition.recognise import recognise
from anysr.errors import OptionError
from anysr.options import load_options

CASES = sorted(manifest("ipt")["cases"])
TINY = {"type": "IPT", "patch_size": 8, "patch_dim": 2, "n_feats": 8, "scale": 2, "num_heads": 2, "num_layers": 1}


@pytest.mark.parametrize("name", CASES)
def test_fixture_weights_are_recognised(name: str) -> None:
    params = load_case("ipt", name)[0].state_dict()  # the seeded weights and the mean shifts, as a file has them
    found = recognise(params)
    assert found.opt["type"] == "IPT"
    kwargs = manifest("ipt")["cases"][name]["kwargs"]
    scale = kwargs["scale"]
    assert found.opt["scale"] == (scale[0] if len(scale) == 1 else scale)
    for key in ("patch_size", "patch_dim", "n_feats", "num_layers"):
        assert found.opt[key] == kwargs[key], key
    with torch.device("meta"):
        layout = {k: v.shape for k, v in build_network(found.opt).state_dict().items()}
    assert layout == {k: v.shape for k, v in params.items()}


def test_any_size_is_padded_to_squares() -> None:
    """Off the square: the input is padded (reflect, as ``pad_to_multiple``) to a multiple of patch_size, the body
    runs on each square and the output is cropped; several squares at once give what each gives alone through the
    body."""
    net, io = load_case("ipt", "ipt_x2")
    side = net.tile_multiple
    assert side == 12
    odd = torch.rand(2, 3, side + 5, 2 * side - 1)
    padded, _, _ = pad_to_multiple(odd, side)
    with torch.no_grad():
        got = net(odd)
        want = net(padded)[..., : 2 * (side + 5), : 2 * (2 * side - 1)]
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        squares = torch.rand(3, 8, side, side)
        together = net.body(squares, 0)
        alone = torch.cat([net.body(sq[None], 0) for sq in squares])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)


def test_tasks_and_published_size() -> None:
    with torch.device("meta"):
        x4 = build_network({"type": "ipt", "scale": 4})
        denoise = build_network({"type": "ipt"})
        tasks = build_network({"type": "IPT", "scale": [2, 3, 4, 1, 1, 1], "num_queries": 6, "scale_idx": 2})
    # the paper's 115.5 M parameters (the x4 model; the frozen mean shifts not counted)
    assert sum(p.numel() for p in x4.parameters() if p.requires_grad) == 115_608_131
    assert (x4.upscale, denoise.upscale, tasks.upscale) == (4, 1, 4)
    assert x4.tile_multiple == 48
    trained = {n.split(".")[0] + "." + n.split(".")[1] for n, p in tasks.named_parameters()
               if p.requires_grad and n.startswith(("head.", "tail."))}
    assert trained == {"head.2", "tail.2"}


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"scale": [2, 5]}, r"network_g\.scale: IPT's heads upscale by a power of two or 3, got 5"),
    ({"scale": "x2"}, r"network_g\.scale: IPT takes a task's factor or a list of them"),
    ({"scale_idx": 1}, r"network_g\.scale_idx: picks one of the 1 task heads"),
    ({"scale": [2, 4], "scale_idx": 1}, r"network_g\.num_queries: task 1 needs a query embedding"),
    ({"patch_dim": 3}, r"network_g\.patch_dim: must divide patch_size \(8\)"),
    ({"num_heads": 3}, r"network_g\.num_heads: must divide the token width"),
    ({"n_colors": 1}, r"network_g\.n_colors: IPT's mean shift is RGB"),
    ({"num_heads": 0}, r"network_g\.num_heads: must divide the token width"),
    ({"rgb_range": 0}, r"network_g\.rgb_range: the pixel range the network works in \(255, or 1\): > 0, got 0"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network({**TINY, **opt})


@pytest.mark.parametrize(("net", "scale", "problem"), [
    ({"scale": [2, 3], "num_queries": 2, "scale_idx": 1}, 3, None),
    ({"scale": [2, 3], "num_queries": 2}, 3, r"network_g\.scale: IPT with these arguments runs at x2, which differs "
                                             r"from the top-level scale \(3\)"),
    ({"scale": 4}, 2, r"network_g\.scale: IPT with these arguments runs at x4"),
])
def test_options_check_the_chosen_tasks_scale(tmp_path: Path, small_train_dir: Path, net: dict, scale: int,
                                              problem: str | None) -> None:
    opt = tiny_train_options("ipt", small_train_dir, None)
    opt["scale"] = scale
    opt["datasets"]["train"]["gt_size"] = 24 * scale
    opt["network_g"] = {**TINY, **net}
    path = write_options(tmp_path / "o.yml", opt)
    if problem is None:
        assert load_options(path, is_train=True, root=tmp_path).network_g["scale"] == [2, 3]
    else:
        with pytest.raises(OptionError, match=problem):
            load_options(path, is_train=True, root=tmp_path)


def test_plain_export_of_a_multitask_file_is_the_running_task_alone(tmp_path: Path) -> None:
    """``anysr export`` of a 4-task IPT running task 1 (x3) writes a single-task IPT: head, tail and query
    embedding of that task as task 0 (spandrel runs task 0 and reads the scale from the first tail), the same
    output, recognised as x3 without being told."""
    from safetensors import safe_open  # noqa: PLC0415

    from anysr.engine.inference.export import export_weights  # noqa: PLC0415

    net, io = load_case("ipt", "ipt_multitask_x3")
    kwargs = manifest("ipt")["cases"]["ipt_multitask_x3"]["kwargs"]
    src = tmp_path / "multi.pth"
    torch.save({"params": net.state_dict()}, src)  # the seeded reference weights with the mean shifts
    out = tmp_path / "single.safetensors"
    export_weights(str(src), [str(out)], network_opt={"type": "IPT", **kwargs})
    with safe_open(str(out), "pt") as f:
        keys = set(f.keys())
        opt = __import__("json").loads(f.metadata()["network_g"])
    assert not any(k.startswith(("head.1.", "tail.1.")) for k in keys) and "tail.0.1.weight" in keys
    assert (opt["scale"], opt["scale_idx"], opt["num_queries"]) == (3, 0, 1)
    from safetensors.torch import load_file  # noqa: PLC0415

    sd = load_file(str(out))
    assert sd["body.query_embed.weight"].shape[0] == 1
    torch.testing.assert_close(sd["body.query_embed.weight"][0], net.state_dict()["body.query_embed.weight"][1],
                               rtol=0, atol=0)
    single = build_network(opt).eval()
    single.load_state_dict(sd, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(single(io["input0"]), net(io["input0"]), rtol=0, atol=0)
    found = recognise(sd).opt
    assert found["scale"] in (3, [3]) and found.get("scale_idx", 0) == 0
    spandrel = pytest.importorskip("spandrel")
    model = spandrel.ModelLoader().load_from_file(str(out))
    assert model.scale == 3


def test_onnx_runs_at_unseen_sizes(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx  # noqa: PLC0415

    net, io = load_case("ipt", "ipt_multitask_x3")
    kwargs = manifest("ipt")["cases"]["ipt_multitask_x3"]["kwargs"]
    rep = export_onnx(net, tmp_path / "m.onnx", scale=3, net_opt={"type": "IPT", **kwargs})
    assert rep.dynamic is True, rep.note
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for x in (torch.rand(1, 3, 13, 22), io["input1"]):
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        with torch.no_grad():
            torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)


@pytest.mark.xla
@pytest.mark.parametrize("opt", [TINY, {**TINY, "pos_every": True, "scale": [1, 3], "num_queries": 2,
                                        "scale_idx": 1}], ids=["x2", "pos-every-x3"])
def test_xla_train_step_compiles_once(opt: dict) -> None:
    check_xla_train_step(opt)

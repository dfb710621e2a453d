"""``anysr export``: plain state dicts that load back (and rebuild the network), ONNX checked by onnxruntime
(dynamic sizes where the network allows, a fixed size where it does not, fp16), and training's plain exports."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli, tiny_train_options, write_options
from safetensors import safe_open

from anysr.archs import build_network
from anysr.engine import checkpoint as ck
from anysr.engine.inference.export import export_onnx, export_weights, save_deployable
from anysr.engine.inference.network import resolve_network

SWIN = {"type": "SwinIR", "upscale": 2, "embed_dim": 12, "depths": [2], "num_heads": [2], "window_size": 8,
        "mlp_ratio": 2.0, "img_size": 16, "upsampler": "pixelshuffle"}
EDSR = {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1, "upscale": 2}
ECBSR = {"type": "ECBSR", "num_in_ch": 1, "num_out_ch": 1, "num_block": 2, "num_channel": 8, "with_idt": False,
         "act_type": "prelu", "scale": 2}


def _saved(tmp_path: Path, opt: dict, name: str = "w.safetensors", seed: int = 0) -> tuple[Path, dict, dict]:
    """An anysr weights file with different params / params_ema groups."""
    torch.manual_seed(seed)
    params = build_network(opt).state_dict()
    ema = {k: v + 0.01 if v.is_floating_point() else v for k, v in params.items()}
    path = tmp_path / name
    ck.save_weights(path, {"params": params, "params_ema": ema}, {"network_g": opt, "scale": 2})
    return path, params, ema


def test_plain_exports_load_back_as_the_ema_weights(tmp_path: Path) -> None:
    src, _, ema = _saved(tmp_path, EDSR)
    reports = export_weights(str(src), [str(tmp_path / "plain.pth"), str(tmp_path / "plain.safetensors")])
    assert [r.group for r in reports] == ["params_ema", "params_ema"]
    bare = torch.load(tmp_path / "plain.pth", weights_only=True)  # one bare state dict, as spandrel reads it
    assert set(bare) == set(ema) and all(torch.equal(bare[k], ema[k]) for k in ema)
    with safe_open(str(tmp_path / "plain.safetensors"), "pt") as f:
        meta = f.metadata()
        assert set(f.keys()) == set(ema)
    assert json.loads(meta["network_g"]) == EDSR and json.loads(meta["scale"]) == 2
    for plain in ("plain.pth", "plain.safetensors"):
        sd, _ = ck.load_weights(tmp_path / plain, "auto")
        assert all(torch.equal(sd[k], ema[k]) for k in ema)
    # the plain .safetensors says what it is: no --arch needed
    res = resolve_network(weights=str(tmp_path / "plain.safetensors"), arch=None, arch_opts={}, network_opt=None,
                          scale=None, param_key="auto")
    assert res.scale == 2 and res.net_opt == EDSR
    assert all(torch.equal(res.net.state_dict()[k], ema[k]) for k in ema)


def test_fp16_plain_export(tmp_path: Path) -> None:
    src, _, ema = _saved(tmp_path, EDSR)
    export_weights(str(src), [str(tmp_path / "half.pth")], fp16=True)
    half = torch.load(tmp_path / "half.pth", weights_only=True)
    assert all(t.dtype == torch.float16 for t in half.values())
    torch.testing.assert_close(half["conv_first.weight"].float(), ema["conv_first.weight"], rtol=1e-3, atol=1e-3)


def test_foreign_file_exports_without_a_network(tmp_path: Path) -> None:
    """A wrapped BasicSR-style file with no metadata: the group is taken and the wrapper prefix removed; an
    architecture anysr recognises is named (and recorded), a file of no known architecture is copied as it is."""
    torch.manual_seed(0)
    sd = build_network(EDSR).state_dict()
    torch.save({"params": {f"netG.{k}": v for k, v in sd.items()}}, tmp_path / "foreign.pth")
    (rep,) = export_weights(str(tmp_path / "foreign.pth"), [str(tmp_path / "plain.pth")])
    assert rep.group == "params" and rep.arch == "EDSR"
    out = torch.load(tmp_path / "plain.pth", weights_only=True)
    assert set(out) == set(sd)
    unknown = {"netG.head.weight": torch.rand(4, 3, 3, 3), "netG.tail.bias": torch.rand(4)}
    torch.save({"params": unknown}, tmp_path / "unknown.pth")
    (rep,) = export_weights(str(tmp_path / "unknown.pth"), [str(tmp_path / "plain2.pth")])
    assert rep.group == "params" and rep.arch is None
    assert set(torch.load(tmp_path / "plain2.pth", weights_only=True)) == {"head.weight", "tail.bias"}


def test_ecbsr_is_exported_reparameterised(tmp_path: Path) -> None:
    src, _, ema = _saved(tmp_path, ECBSR)
    export_weights(str(src), [str(tmp_path / "ecbsr.safetensors")])
    res = resolve_network(weights=str(tmp_path / "ecbsr.safetensors"), arch=None, arch_opts={}, network_opt=None,
                          scale=None, param_key="auto")
    assert res.net_opt is not None and res.net_opt["reparameterized"] is True
    assert len(res.net.state_dict()) < len(ema)  # plain convs only
    trained = build_network(ECBSR).eval()
    trained.load_state_dict(ema)
    x = torch.rand(1, 1, 24, 20)
    with torch.no_grad():
        torch.testing.assert_close(res.net.eval()(x), trained(x), rtol=1e-5, atol=1e-5)


def test_training_writes_plain_exports(tmp_path: Path, small_train_dir: Path) -> None:
    from anysr.cli import main

    opt = tiny_train_options("plain", small_train_dir, None, total_iter=2)
    opt["logger"]["save_format"] = ["safetensors", "plain.pth", "plain.safetensors"]
    opt["path"]["root"] = str(tmp_path)
    assert main(["train", "-opt", str(write_options(tmp_path / "o.yml", opt))]) == 0
    models = tmp_path / "experiments" / "plain" / "models"
    ema, _ = ck.load_weights(models / "net_g_2.safetensors", "params_ema")
    for name in ("net_g_2.plain.pth", "net_g_2.plain.safetensors", "net_g_latest.plain.pth"):
        sd, _ = ck.load_weights(models / name, "auto")
        assert set(sd) == set(ema) and all(torch.equal(sd[k], ema[k]) for k in ema), name


def test_save_deployable_folds_ecbsr(tmp_path: Path) -> None:
    torch.manual_seed(0)
    sd = build_network(ECBSR).state_dict()
    save_deployable([tmp_path / "e.safetensors"], sd, ECBSR, 2)
    with safe_open(str(tmp_path / "e.safetensors"), "pt") as f:
        assert json.loads(f.metadata()["network_g"])["reparameterized"] is True


def test_export_cli_and_its_errors(tmp_path: Path) -> None:
    src, _, _ = _saved(tmp_path, EDSR)
    proc = run_cli("export", str(src), "--to", str(tmp_path / "p.pth"), cwd=tmp_path)
    assert "wrote" in proc.stdout and "group 'params_ema'" in proc.stdout and (tmp_path / "p.pth").is_file()
    bad = run_cli("export", str(src), "--to", str(tmp_path / "p.bin"), cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "use .pth, .safetensors or .onnx" in bad.stderr and "Traceback" not in bad.stderr


# --------------------------------------------------------------------------------------------- ONNX
def _ort() -> None:
    pytest.importorskip("onnxruntime")


def test_trainner_onnx_option_file_exports_as_it_asks(tmp_path: Path) -> None:
    """traiNNer-redux's ONNX files (``onnx:`` section, weights in path.pretrain_network_g): ``anysr export -opt``
    writes its file name and settings; bf16 (TensorRT's strongly typed graph) is written as fp32 with a note."""
    _ort()
    import onnx

    src, _, _ = _saved(tmp_path, EDSR)
    base = {"name": "2x_edsr", "scale": 2, "num_gpu": "auto",
            "network_g": {k: v for k, v in EDSR.items() if k != "upscale"},
            "path": {"pretrain_network_g": str(src)}}
    dyn = dict(base, onnx={"dynamo": False, "dtype": "bf16", "bf16_exclude_depthwise": True, "opset": 17,
                           "shape": "1x3xHxW", "wrap_5d_to_4d": True, "verify": True, "optimize": False})
    proc = run_cli("export", "-opt", str(write_options(tmp_path / "dyn.yml", dyn)), cwd=tmp_path)
    out = tmp_path / "onnx" / "2x_edsr_1x3xHxW_dyn-HW_fp32_op17.onnx"
    assert out.is_file() and "onnx.dtype bf16: anysr writes fp32" in proc.stdout + proc.stderr
    model = onnx.load(str(out))
    assert model.opset_import[0].version == 17
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    static = dict(base, onnx={"dtype": "fp16", "opset": 17, "shape": "1x3x32x32", "verify": True})
    run_cli("export", "-opt", str(write_options(tmp_path / "st.yml", static)), cwd=tmp_path)
    out16 = tmp_path / "onnx" / "2x_edsr_1x3x32x32_static_strong_fp16_op17.onnx"
    dims = onnx.load(str(out16)).graph.input[0].type.tensor_type
    assert dims.elem_type == onnx.TensorProto.FLOAT16 and [d.dim_value for d in dims.shape.dim] == [1, 3, 32, 32]
    bad = dict(base, onnx={"shape": "1x3x32x48"})
    proc = run_cli("export", "-opt", str(write_options(tmp_path / "bad.yml", bad)), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "square (H = W)" in proc.stderr and "Traceback" not in proc.stderr
    none = {k: v for k, v in dyn.items() if k != "path"}
    proc = run_cli("export", "-opt", str(write_options(tmp_path / "none.yml", none)), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "path.pretrain_network_g" in proc.stderr and "Traceback" not in proc.stderr


def test_onnx_window_arch_has_dynamic_sizes(tmp_path: Path) -> None:
    _ort()
    import onnxruntime as ort

    torch.manual_seed(0)
    net = build_network(SWIN).eval()
    rep = export_onnx(net, tmp_path / "swin.onnx", scale=2, net_opt=SWIN)
    assert rep.dynamic is True and len(rep.checks) == 3 and max(c.max_diff for c in rep.checks) < 1e-4
    session = ort.InferenceSession(str(tmp_path / "swin.onnx"), providers=["CPUExecutionProvider"])
    x = torch.rand(1, 3, 27, 50)  # a size the export never saw, not a multiple of the window
    got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
    with torch.no_grad():
        torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)
    meta = {p.key: p.value for p in __import__("onnx").load(str(tmp_path / "swin.onnx")).metadata_props}
    assert json.loads(meta["anysr_network_g"]) == SWIN and meta["anysr_scale"] == "2"


def test_onnx_fp16(tmp_path: Path) -> None:
    _ort()
    torch.manual_seed(0)
    net = build_network(EDSR).eval()
    rep = export_onnx(net, tmp_path / "edsr16.onnx", scale=2, fp16=True)
    assert rep.dtype == "fp16" and rep.dynamic and max(c.max_diff for c in rep.checks) < 1e-2


def test_onnx_falls_back_to_a_fixed_size(tmp_path: Path) -> None:
    """SAFMN pools to sizes computed from the input: no dynamic ONNX graph; the fixed size works."""
    _ort()
    torch.manual_seed(0)
    net = build_network({"type": "SAFMN", "dim": 8, "n_blocks": 1, "upscaling_factor": 2}).eval()
    rep = export_onnx(net, tmp_path / "safmn.onnx", scale=2, size=40)
    assert rep.dynamic is False and rep.size == 40 and "dynamic sizes failed" in rep.note
    assert len(rep.checks) == 1 and rep.checks[0].shape == (1, 3, 40, 40) and rep.checks[0].max_diff < 1e-4


def test_onnx_through_the_cli(tmp_path: Path) -> None:
    _ort()
    src, _, _ = _saved(tmp_path, EDSR)
    proc = run_cli("export", str(src), "--to", str(tmp_path / "m.onnx"), str(tmp_path / "m.pth"), cwd=tmp_path)
    assert "dynamic batch/height/width" in proc.stdout and "onnxruntime vs PyTorch max |diff|" in proc.stdout
    assert (tmp_path / "m.onnx").is_file() and (tmp_path / "m.pth").is_file()


def test_exported_plain_file_loads_in_spandrel(tmp_path: Path) -> None:
    """What chaiNNer / ComfyUI do with the file (runs where spandrel is installed: anysr[spandrel])."""
    spandrel = pytest.importorskip("spandrel")
    opt = {"type": "SRVGGNetCompact", "num_feat": 16, "num_conv": 4, "upscale": 4, "act_type": "prelu"}
    src, _, _ = _saved(tmp_path, opt)
    export_weights(str(src), [str(tmp_path / "plain.pth")])
    desc = spandrel.ModelLoader().load_from_file(str(tmp_path / "plain.pth"))
    ours = resolve_network(weights=str(src), arch=None, arch_opts={}, network_opt=None, scale=None,
                           param_key="auto").net.eval()
    x = torch.rand(1, 3, 12, 16)
    with torch.no_grad():
        torch.testing.assert_close(desc.model.eval()(x), ours(x), rtol=1e-5, atol=1e-5)
    assert desc.scale == 4


def test_onnx_without_the_onnx_package_says_what_to_install(tmp_path: Path) -> None:
    """With or without the onnxruntime check, a machine without onnx is told to install anysr[onnx] (not that
    the network does not run on a 64x64 input)."""
    src, _, _ = _saved(tmp_path, EDSR)
    hide = tmp_path / "hide"
    (hide / "onnx").mkdir(parents=True)
    (hide / "onnx" / "__init__.py").write_text("raise ImportError('onnx hidden by the test')\n")
    for extra in ((), ("--no-check",)):
        proc = run_cli("export", str(src), "--to", str(tmp_path / "m.onnx"), *extra, cwd=tmp_path, check=False,
                       env={"PYTHONPATH": f"{hide}{os.pathsep}{ROOT}"})
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and "pip install 'anysr[onnx]'" in lines[0], proc.stderr
        assert not (tmp_path / "m.onnx").exists()

"""``anysr infer --backend``: onnxruntime / OpenVINO run the exported network with the same tiles, alpha, gray and
16-bit handling as torch; the export is cached by weights; ``auto`` measures, picks and says; a missing package
or a fixed-size export is one line."""

from __future__ import annotations

import os
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import DATASETS, ROOT, run_cli
from torch import nn

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.archs import build_network
from anysr.engine import checkpoint as ck
from anysr.engine.inference import backends
from anysr.engine.inference import export as export_mod
from anysr.engine.inference.backends import RuntimeNetwork, choose_backend, exported_model, pick_fastest
from anysr.engine.inference.images import InferSettings, process_image
from anysr.errors import OptionError

pytest.importorskip("onnxruntime")

SRVGG_X4 = {"type": "SRVGGNetCompact", "num_feat": 8, "num_conv": 2, "upscale": 4, "act_type": "prelu"}
SWIN = {"type": "SwinIR", "upscale": 2, "embed_dim": 12, "depths": [2], "num_heads": [2], "window_size": 8,
        "mlp_ratio": 2.0, "img_size": 16, "upsampler": "pixelshuffle"}
# Stated tolerance: onnxruntime / OpenVINO fp32 vs torch fp32 differ by ~1e-6 in [0, 1]; after rounding to the
# stored type a sample may land one step off (a value near .5), never more: at most 0.1 % of 8-bit samples and
# 5 % of 16-bit ones (a 16-bit step is 1.5e-5, so ~1e-6 moves a few percent of them).
MAX_STEP = 1
MAX_OFF_FRACTION = {np.dtype(np.uint8): 1e-3, np.dtype(np.uint16): 5e-2}


def _runtimes() -> list[str]:
    return [b for b in backends.RUNTIMES if backends.missing_package(b) is None]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ANYSR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _net(opt: dict, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = build_network(opt).eval()
    with torch.no_grad():  # not the near-identity of a fresh init: every weight matters
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return net


def _acc():  # type: ignore[no-untyped-def]
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    return acc


def _images(tmp_path: Path) -> dict[str, Path]:
    """Real photos: 8-bit BGR, BGRA (a gradient alpha), 16-bit gray, at sizes that are not window multiples."""
    bird = cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))[:45, :53]
    alpha = np.tile(np.linspace(0, 255, 53, dtype=np.float64), (45, 1)).round().astype(np.uint8)
    gray16 = (cv2.cvtColor(cv2.imread(str(DATASETS / "Set5" / "HR" / "butterfly.png"))[:38, :41],
                           cv2.COLOR_BGR2GRAY).astype(np.uint16) * 257 + np.arange(41, dtype=np.uint16))
    out = {"rgb": tmp_path / "rgb.png", "rgba": tmp_path / "rgba.png", "gray16": tmp_path / "gray16.png"}
    cv2.imwrite(str(out["rgb"]), bird)
    cv2.imwrite(str(out["rgba"]), np.dstack([bird, alpha]))
    cv2.imwrite(str(out["gray16"]), gray16)
    return out


def _assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape and got.dtype == want.dtype
    diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
    assert diff.max() <= MAX_STEP, diff.max()
    assert (diff > 0).mean() <= MAX_OFF_FRACTION[want.dtype], (diff > 0).mean()


@pytest.mark.parametrize("backend", backends.RUNTIMES)
@pytest.mark.parametrize("opt", [SRVGG_X4, pytest.param(SWIN, marks=pytest.mark.slow)], ids=["srvgg_x4", "swinir_x2"])
def test_runtime_equals_torch_on_real_images(tmp_path: Path, backend: str, opt: dict) -> None:
    if backends.missing_package(backend) is not None:
        pytest.skip(f"{backend} not installed")
    net = _net(opt)
    scale = opt["upscale"]
    model, how = exported_model(net, opt, scale)
    assert model is not None, how
    runtime = RuntimeNetwork(backend, model, in_channels=3, multiple=getattr(net, "tile_multiple", 1))
    acc = _acc()
    for tile in (None, 16):  # whole, and tiles (edge tiles read the image padded)
        settings = InferSettings(scale=scale, tile=tile, tile_pad=4)
        for kind, path in _images(tmp_path).items():
            want = process_image(net, path, acc, settings, 3)
            got = process_image(runtime, path, acc, settings, 3)
            assert want.dtype == (np.uint16 if kind == "gray16" else np.uint8)
            assert want.shape[2:] == {"rgb": (3,), "rgba": (4,), "gray16": ()}[kind]
            _assert_close(got, want)


def test_export_is_cached_by_weights_options_and_opset(monkeypatch: pytest.MonkeyPatch) -> None:
    net = _net(SRVGG_X4)
    first, how = exported_model(net, SRVGG_X4, 4)
    assert first is not None and how.startswith("exported to"), how
    calls: list[int] = []

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(*args, **kwargs)

    original = export_mod.export_onnx
    monkeypatch.setattr(export_mod, "export_onnx", counting)
    again, how = exported_model(net, SRVGG_X4, 4)
    assert again == first and how.startswith("cached export") and not calls
    other = _net(SRVGG_X4, seed=1)  # other weights: another export
    third, _ = exported_model(other, SRVGG_X4, 4)
    fourth, _ = exported_model(net, SRVGG_X4, 4, opset=18)  # another opset: another export
    assert len(calls) == 2 and len({first, third, fourth}) == 3


class _FixedSize(nn.Module):
    """A network whose trace bakes its input size in (``int()`` of a shape): exports only at that size."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = int(x.shape[2]), int(x.shape[3])
        return F.interpolate(self.conv(x), scale_factor=2) + torch.zeros(1, 1, 2 * h, 2 * w)


def test_fixed_size_export_is_refused_in_one_line_and_auto_keeps_torch() -> None:
    net = _FixedSize().eval()
    with pytest.raises(OptionError) as info:
        choose_backend("onnxruntime", net, None, 2, (1, 3, 32, 32))
    text = str(info.value)
    assert "\n" not in text and "only" in text and "--backend torch" in text, text
    chosen, name, notes = choose_backend("auto", net, None, 2, (1, 3, 32, 32))
    assert chosen is net and name == "torch" and len(notes) == 1, notes
    assert notes[0].startswith("--backend auto: torch ("), notes


class _Sleepy(nn.Module):
    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x


def test_auto_picks_the_fastest_and_caches_it() -> None:
    slow, fast = _Sleepy(0.05), _Sleepy(0.0)
    best, line = pick_fastest(slow, {"onnxruntime": fast}, "k1", (1, 3, 8, 8))
    assert best == "onnxruntime" and line.startswith("--backend auto: onnxruntime (measured in"), line
    assert "torch 5" in line  # both timings said
    best, line = pick_fastest(fast, {"onnxruntime": slow}, "k2", (1, 3, 8, 8))
    assert best == "torch", line
    # cached: the slow one is not run again, and the line says where the choice was kept
    best, line = pick_fastest(_Sleepy(1.0), {"onnxruntime": fast}, "k1", (1, 3, 8, 8))
    assert best == "onnxruntime" and "measured on" in line and "kept in" in line


def _weights(tmp_path: Path, opt: dict) -> Path:
    path = tmp_path / "w.safetensors"
    ck.save_weights(path, {"params": _net(opt).state_dict()}, {"network_g": opt, "scale": opt["upscale"]})
    return path


@pytest.mark.slow
def test_cli_backends_equal_torch_and_reuse_the_export(tmp_path: Path) -> None:
    weights = _weights(tmp_path, SRVGG_X4)
    src = tmp_path / "in"
    src.mkdir()
    for p in _images(tmp_path).values():
        p.rename(src / p.name)
    env = {"ANYSR_CACHE_DIR": str(tmp_path / "cache")}
    common = ("infer", "--weights", str(weights), "-i", str(src), "--tile", "24", "--no-progress")
    run_cli(*common, "-o", str(tmp_path / "torch"), cwd=tmp_path, env=env)
    for backend in [*_runtimes(), "auto"]:
        proc = run_cli(*common, "-o", str(tmp_path / backend), "--backend", backend, cwd=tmp_path, env=env)
        log = proc.stdout + proc.stderr
        if backend == "auto":
            assert "--backend auto: " in log and "ms" in log, log
        else:
            assert f"the forward runs in {backend}" in log, log
        for name in ("rgb.png", "rgba.png", "gray16.png"):
            want = cv2.imread(str(tmp_path / "torch" / name), cv2.IMREAD_UNCHANGED)
            got = cv2.imread(str(tmp_path / backend / name), cv2.IMREAD_UNCHANGED)
            _assert_close(got, want)
    assert len(list((tmp_path / "cache" / "onnx").glob("*.onnx"))) == 1  # exported once, then reused
    assert "cached export" in log


@pytest.mark.slow
def test_missing_package_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    weights = _weights(tmp_path, SRVGG_X4)
    img = tmp_path / "a.png"
    cv2.imwrite(str(img), cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))[:16, :16])
    hide = tmp_path / "hide"
    for module in ("onnxruntime", "openvino"):
        (hide / module).mkdir(parents=True)
        (hide / module / "__init__.py").write_text(f"raise ImportError('{module} hidden by the test')\n")
    for backend, extra in (("onnxruntime", "anysr[onnx]"), ("openvino", "anysr[openvino]")):
        proc = run_cli("infer", "--weights", str(weights), "-i", str(img), "-o", str(tmp_path / "out"), "--backend",
                       backend, cwd=tmp_path, check=False, env={"PYTHONPATH": f"{hide}{os.pathsep}{ROOT}"})
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and f"pip install '{extra}'" in lines[0], proc.stderr
    proc = run_cli("infer", "--weights", str(weights), "-i", str(img), "-o", str(tmp_path / "out"), "--backend",
                   "auto", "--no-progress", cwd=tmp_path, env={"PYTHONPATH": f"{hide}{os.pathsep}{ROOT}"})
    assert "--backend auto: torch (neither onnxruntime nor openvino is installed" in proc.stdout + proc.stderr


def test_plan_refuses_what_the_runtimes_cannot_do(tmp_path: Path) -> None:
    from anysr.engine.inference.command import InferRequest, plan_infer  # noqa: PLC0415

    weights = _weights(tmp_path, SRVGG_X4)
    img = tmp_path / "a.png"
    cv2.imwrite(str(img), cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))[:16, :16])
    base = {"input": str(img), "output": str(tmp_path / "out"), "weights": str(weights), "progress": False}
    with pytest.raises(OptionError, match="videos run with --backend torch"):
        plan_infer(InferRequest(**{**base, "output": str(tmp_path / "out.mp4")}, backend="onnxruntime"))
    with pytest.raises(OptionError, match="choose one of"):
        plan_infer(InferRequest(**base, backend="tensorrt"))
    with pytest.raises(OptionError, match="runs in fp32"):
        plan_infer(InferRequest(**base, backend="onnxruntime", precision="bf16"))
    job = plan_infer(InferRequest(**base, backend="onnxruntime"))
    assert isinstance(job.args[0], RuntimeNetwork) and job.plan.precision == "fp32" and not job.plan.channels_last
    assert any("the forward runs in onnxruntime" in n for n in job.plan.notes), job.plan.notes

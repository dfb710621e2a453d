"""``anysr infer`` at Real-ESRGAN's level: tiles on the network's window grid, alpha kept, any final scale,
other formats, weight interpolation, weights that say what they are."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import DATASETS, run_cli

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.archs import build_network
from anysr.engine import checkpoint as ck
from anysr.engine.inference.images import (
    InferSettings,
    _Pixels,
    process_image,
    resize_result,
    upscale_image,
)
from anysr.engine.inference.network import measure_scale, resolve_network
from anysr.ops.imresize import imresize
from anysr.ops.tiling import tile_forward, tile_multiple

SWIN = {"type": "SwinIR", "upscale": 2, "embed_dim": 12, "depths": [2], "num_heads": [2], "window_size": 8,
        "mlp_ratio": 2.0, "img_size": 16, "upsampler": "pixelshuffle"}
SRVGG_X4 = {"type": "SRVGGNetCompact", "num_feat": 8, "num_conv": 2, "upscale": 4, "act_type": "prelu"}


def _net(opt: dict, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_network(opt).eval()


def _acc():  # type: ignore[no-untyped-def]
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    return acc


def _save(tmp_path: Path, opt: dict, name: str, seed: int = 0) -> Path:
    path = tmp_path / name
    ck.save_weights(path, {"params": _net(opt, seed).state_dict()}, {"network_g": opt, "scale": 2})
    return path


# --------------------------------------------------------------------------------------------- tiles
@pytest.mark.slow
def test_window_arch_tiled_equals_untiled_on_its_window_grid() -> None:
    net = _net(SWIN)
    assert tile_multiple(net) == 8
    x = torch.rand(1, 3, 100, 90)  # not multiples of the window: padded as the network pads
    shapes: set[tuple[int, ...]] = set()

    def fn(t: torch.Tensor) -> torch.Tensor:
        shapes.add(tuple(t.shape))
        return net(t)

    with torch.no_grad():
        full = net(x)
        tiled = tile_forward(fn, x, 2, 20, 17, multiple=8)  # rounded up to tile 24, pad 24
        off_grid = tile_forward(net, x, 2, 20, 17)  # the same tiles without the grid
    assert shapes == {(1, 3, 72, 72)}  # one shape, a multiple of the window: no padding inside the network
    torch.testing.assert_close(tiled, full, rtol=0, atol=1e-5)
    assert (off_grid - full).abs().max() > 1e-3  # windows off the grid attend over other pixels


def test_streamed_infer_tiles_equal_the_whole_image() -> None:
    net, acc = _net(SWIN), _acc()
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))[:61, :75]
    px = _Pixels(255.0, 255, np.uint8, False)
    kw = {"scale": 2, "tile_pad": 17, "channels": 3, "path": Path("bird.png")}
    whole = upscale_image(net, img, px, acc, tile=None, **kw)
    calls: list[tuple[int, int]] = []
    tiled = upscale_image(net, img, px, acc, tile=20, on_tile=lambda d, n: calls.append((d, n)), **kw)
    assert tiled.shape == whole.shape == (122, 150, 3)
    assert np.abs(tiled.astype(int) - whole.astype(int)).max() <= 1  # float rounding before 8-bit rounding
    assert calls and calls[-1][0] == calls[-1][1] == len(calls)  # the progress callback saw every tile


# --------------------------------------------------------------------------------------------- alpha, outscale
def _rgba(h: int = 24, w: int = 30) -> np.ndarray:
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "butterfly.png"))[:h, :w]
    yy, xx = np.mgrid[0:h, 0:w]
    alpha = ((xx * 255) // (w - 1)).astype(np.uint8)  # a horizontal ramp
    alpha[yy < h // 3] = 0
    return np.dstack([img, alpha])


@pytest.mark.parametrize("mode", ["network", "bicubic"])
def test_rgba_keeps_its_alpha(tmp_path: Path, mode: str) -> None:
    cv2.imwrite(str(tmp_path / "a.png"), _rgba())
    settings = InferSettings(scale=2, alpha=mode, progress=False)
    out = process_image(build_network({"type": "Bicubic", "upscale": 2}), tmp_path / "a.png", _acc(), settings,
                        None)
    assert out.shape == (48, 60, 4) and out.dtype == np.uint8
    want = np.clip(np.round(imresize(_rgba()[:, :, 3], 2)), 0, 255)
    assert np.abs(out[:, :, 3].astype(int) - want).max() <= 1  # the alpha, upscaled (not dropped, not opaque)
    colour = np.clip(np.round(imresize(_rgba()[:, :, :3], 2)), 0, 255)
    assert np.abs(out[:, :, :3].astype(int) - colour).max() <= 1


def test_rgba_through_the_cli_with_a_network(tmp_path: Path) -> None:
    weights = _save(tmp_path, SRVGG_X4, "srvgg.safetensors")
    cv2.imwrite(str(tmp_path / "a.png"), _rgba())
    run_cli("infer", "--weights", str(weights), "-i", str(tmp_path / "a.png"), "-o", str(tmp_path / "o"),
            "--precision", "fp32", "--tile", "16", cwd=tmp_path)
    out = cv2.imread(str(tmp_path / "o" / "a.png"), cv2.IMREAD_UNCHANGED)
    assert out.shape == (96, 120, 4)
    assert out[:20, :, 3].max() < out[40:, :, 3].max()  # the transparent top stays more transparent


@pytest.mark.parametrize("suffix", ["/x", "../up", "a\\b", ".."])
def test_a_suffix_cannot_leave_the_output_folder(tmp_path: Path, suffix: str) -> None:
    """--suffix '/x' wrote into a new subfolder, '../up' beside the output folder: refused before any work."""
    cv2.imwrite(str(tmp_path / "a.png"), _rgba()[:, :, :3])
    proc = run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(tmp_path / "a.png"), "-o",
                   str(tmp_path / "o"), "--suffix", suffix, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "--suffix" in proc.stderr and "without '/'" in proc.stderr, proc.stderr
    assert not (tmp_path / "o").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a.png"]


def test_outscale_3_5_on_an_x4_network(tmp_path: Path) -> None:
    weights = _save(tmp_path, SRVGG_X4, "srvgg.safetensors")
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))[:37, :50]
    cv2.imwrite(str(tmp_path / "b.png"), img)
    for method in ("bicubic", "area", "lanczos"):
        run_cli("infer", "--weights", str(weights), "-i", str(tmp_path / "b.png"), "-o", str(tmp_path / method),
                "--outscale", "3.5", "--resize", method, "--precision", "fp32", cwd=tmp_path)
        out = cv2.imread(str(tmp_path / method / "b.png"))
        assert out.shape == (129, 175, 3), method  # int(37 * 3.5), 50 * 3.5 (as Real-ESRGAN)


def test_matlab_resize_of_results_matches_imresize() -> None:
    img = np.random.default_rng(0).integers(0, 65536, (40, 52, 3), dtype=np.uint16)
    out = resize_result(img, 35, 45, "bicubic", 65535)
    want = np.clip(np.round(imresize(img.astype(np.float64), 35 / 40)), 0, 65535)  # 52 * 35/40 = 45.5 -> 46
    assert out.dtype == np.uint16 and out.shape == (35, 45, 3)
    want_45 = np.clip(np.round(_imresize_to(img.astype(np.float64), 35, 45)), 0, 65535)
    assert np.abs(out.astype(int) - want_45).max() <= 1
    assert want.shape[1] == 46


def _imresize_to(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    from anysr.ops.imresize import resize_weights

    rows = np.tensordot(resize_weights(img.shape[0], out_h / img.shape[0], out_h), img, axes=([1], [0]))
    cols = np.tensordot(resize_weights(img.shape[1], out_w / img.shape[1], out_w), rows, axes=([1], [1]))
    return np.swapaxes(cols, 0, 1)


def test_ext_auto_and_formats_that_cannot_hold_the_result(tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    cv2.imwrite(str(src / "photo.jpg"), cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))[:20, :20])
    cv2.imwrite(str(src / "logo.png"), _rgba(20, 20))
    run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(src), "-o", str(tmp_path / "auto"), "--ext", "auto",
            cwd=tmp_path)
    assert sorted(p.name for p in (tmp_path / "auto").iterdir()) == ["logo.png", "photo.jpg"]
    proc = run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(src), "-o", str(tmp_path / "jpg"), "--ext",
                   "jpg", cwd=tmp_path)
    assert sorted(p.name for p in (tmp_path / "jpg").iterdir()) == ["logo.png", "photo.jpg"]
    assert "cannot hold an alpha channel" in proc.stdout + proc.stderr
    assert cv2.imread(str(tmp_path / "jpg" / "logo.png"), cv2.IMREAD_UNCHANGED).shape == (40, 40, 4)


# --------------------------------------------------------------------------------------------- weights
def test_dni_interpolates_two_checkpoints(tmp_path: Path) -> None:
    a, b = _save(tmp_path, SRVGG_X4, "a.safetensors", 1), _save(tmp_path, SRVGG_X4, "b.safetensors", 2)
    res = resolve_network(weights=str(a), arch=None, arch_opts={}, network_opt=None, scale=None, param_key="auto",
                          dni=(str(b), 0.3))
    sa, sb = _net(SRVGG_X4, 1).state_dict(), _net(SRVGG_X4, 2).state_dict()
    for k, v in res.net.state_dict().items():
        torch.testing.assert_close(v, 0.3 * sa[k] + 0.7 * sb[k])
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))[:16, :16]
    cv2.imwrite(str(tmp_path / "b.png"), img)
    run_cli("infer", "--weights", str(a), "--dni", str(b), "0.3", "-i", str(tmp_path / "b.png"), "-o",
            str(tmp_path / "o"), "--precision", "fp32", cwd=tmp_path)
    assert cv2.imread(str(tmp_path / "o" / "b.png")).shape == (64, 64, 3)
    other = _save(tmp_path, {**SRVGG_X4, "num_feat": 4}, "c.safetensors")
    proc = run_cli("infer", "--weights", str(a), "--dni", str(other), "0.5", "-i", str(tmp_path / "b.png"), "-o",
                   str(tmp_path / "o2"), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "does not match --weights" in proc.stderr and "shape" in proc.stderr


def test_infer_without_arch_when_the_file_says_what_it_is(tmp_path: Path) -> None:
    weights = _save(tmp_path, SWIN, "swin.safetensors")
    cv2.imwrite(str(tmp_path / "b.png"), cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))[:20, :28])
    proc = run_cli("infer", "--weights", str(weights), "-i", str(tmp_path / "b.png"), "-o", str(tmp_path / "o"),
                   "--precision", "fp32", cwd=tmp_path)
    assert "rebuilt from the weights' metadata: SwinIR" in proc.stdout + proc.stderr
    assert cv2.imread(str(tmp_path / "o" / "b.png")).shape == (40, 56, 3)


@pytest.mark.skipif(importlib.util.find_spec("spandrel") is not None, reason="spandrel would recognise the file")
def test_a_foreign_file_of_no_known_architecture_asks_for_arch(tmp_path: Path) -> None:
    """A bare state dict of an architecture anysr has is recognised (tests/test_recognise.py); one of no known
    architecture is refused in one line asking for --arch."""
    torch.save({"head.weight": torch.rand(4, 3, 3, 3), "tail.weight": torch.rand(3, 4, 3, 3)},
               tmp_path / "foreign.pth")
    proc = run_cli("infer", "--weights", str(tmp_path / "foreign.pth"), "-i", str(DATASETS / "Set5" / "HR"), "-o",
                   str(tmp_path / "o"), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "--arch" in proc.stderr and "fit none" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_scale_is_measured_not_guessed() -> None:
    assert measure_scale(_net({**SWIN, "upsampler": ""})) == 1  # SwinIR's upscale argument is unused at x1
    assert measure_scale(_net({"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1,
                               "upscale": 3})) == 3  # EDSR keeps no scale attribute

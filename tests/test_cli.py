"""The command line as a user runs it (subprocess): prepare -> infer -> eval, test, infer with a real model."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import DATASETS, ROOT, run_cli

PRETRAINED = ROOT / "pretrained" / "realesr-animevideov3.pth"
SRVGG = ["--arch", "SRVGGNetCompact", "--arch-opt", "num_feat=64", "num_conv=16", "upscale=4", "act_type=prelu"]


def _average(stdout: str) -> tuple[float, float, int]:
    last = next(ln for ln in reversed(stdout.strip().splitlines()) if ln.startswith("average"))  # then "wrote"s
    m = re.fullmatch(r"average PSNR=([\d.]+) SSIM=([\d.]+) n=(\d+)", last)
    assert m, last
    return float(m.group(1)), float(m.group(2)), int(m.group(3))


def test_prepare_infer_eval_reproduces_published_bicubic_set5_x2(tmp_path: Path) -> None:
    run_cli("prepare", "lr", "--hr", str(DATASETS / "Set5" / "HR"), "--out", str(tmp_path / "lr"), "--scale", "2",
            cwd=tmp_path)
    run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(tmp_path / "lr"), "-o", str(tmp_path / "sr"),
            cwd=tmp_path)
    proc = run_cli("eval", "--gt", str(DATASETS / "Set5" / "HR"), "--sr", str(tmp_path / "sr"), "--scale", "2",
                   "--json", str(tmp_path / "r.json"), cwd=tmp_path)
    psnr, ssim, n = _average(proc.stdout)
    assert n == 5
    assert psnr == pytest.approx(33.66, abs=0.03)
    assert 0.92 < ssim < 0.94
    assert json.loads((tmp_path / "r.json").read_text())


def test_anysr_test_bicubic_matches_published_numbers(tmp_path: Path) -> None:
    shutil.copytree(DATASETS / "Set5", tmp_path / "datasets" / "Set5")
    shutil.copytree(DATASETS / "Set14", tmp_path / "datasets" / "Set14")
    run_cli("test", "-opt", str(ROOT / "options" / "test" / "test_Bicubic_x2.yml"), "--force_yml",
            f"path.root={tmp_path}", "accelerator=cpu", cwd=tmp_path)
    summary = json.loads((tmp_path / "results" / "Bicubic_x2" / "summary.json").read_text())
    assert summary["datasets"]["Set5"]["psnr"] == pytest.approx(33.66, abs=0.03)
    assert summary["datasets"]["Set14"]["psnr"] == pytest.approx(30.24, abs=0.03)
    assert summary["datasets"]["Set14"]["n"] == 14
    saved = tmp_path / "results" / "Bicubic_x2" / "visualization" / "Set14"
    bridge = cv2.imread(str(next(saved.glob("bridge*.png"))), cv2.IMREAD_UNCHANGED)
    assert bridge.ndim == 2  # a grayscale input stays grayscale


def test_two_rank_test_equals_one_rank(tmp_path: Path) -> None:
    shutil.copytree(DATASETS / "Set5", tmp_path / "datasets" / "Set5")
    shutil.copytree(DATASETS / "Set14", tmp_path / "datasets" / "Set14")
    opt = str(ROOT / "options" / "test" / "test_Bicubic_x2.yml")
    run_cli("test", "-opt", opt, "--force_yml", f"path.root={tmp_path}", "accelerator=cpu", "num_gpu=2",
            "name=two", "val.save_img=false", cwd=tmp_path)
    two = json.loads((tmp_path / "results" / "two" / "summary.json").read_text())
    assert two["world_size"] == 2
    assert two["datasets"]["Set14"]["n"] == 14  # padding items are not counted
    assert two["datasets"]["Set5"]["psnr"] == pytest.approx(33.66, abs=0.03)
    assert two["datasets"]["Set14"]["psnr"] == pytest.approx(30.24, abs=0.03)


def test_infer_real_model_tiled_equals_untiled(tmp_path: Path) -> None:
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))
    lr = cv2.resize(img, (72, 60), interpolation=cv2.INTER_AREA)
    cv2.imwrite(str(tmp_path / "bird_lr.png"), lr)
    # fp32 both times: auto may time a different precision for the two input shapes
    run_cli("infer", "--weights", str(PRETRAINED), *SRVGG, "--param-key", "params", "-i",
            str(tmp_path / "bird_lr.png"), "-o", str(tmp_path / "full"), "--precision", "fp32", cwd=tmp_path)
    # 18 3x3 convs: a 20-pixel pad covers the receptive field.
    run_cli("infer", "--weights", str(PRETRAINED), *SRVGG, "-i", str(tmp_path / "bird_lr.png"), "-o",
            str(tmp_path / "tiled"), "--tile", "24", "--tile-pad", "20", "--precision", "fp32", cwd=tmp_path)
    full = cv2.imread(str(tmp_path / "full" / "bird_lr.png"))
    tiled = cv2.imread(str(tmp_path / "tiled" / "bird_lr.png"))
    assert full.shape == (240, 288, 3)
    assert np.abs(full.astype(int) - tiled.astype(int)).max() <= 1  # float rounding before 8-bit rounding


def test_infer_from_options_file(tmp_path: Path) -> None:
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "butterfly.png"))[:64, :48]
    cv2.imwrite(str(tmp_path / "b.png"), img)
    run_cli("infer", "-opt", str(ROOT / "options" / "infer" / "realesr-animevideov3.yml"), "--weights",
            str(PRETRAINED), "-i", str(tmp_path / "b.png"), "-o", str(tmp_path / "out"), "--suffix", "x4",
            cwd=ROOT)
    out = cv2.imread(str(tmp_path / "out" / "b_x4.png"))
    assert out.shape == (256, 192, 3)


@pytest.mark.parametrize(("args", "message"), [
    (["infer", "--weights", "nope.pth", *SRVGG, "-i", "x.png", "-o", "o"], "nope.pth"),
    (["infer", "--weights", str(PRETRAINED), "--arch", "SRVGGNetCompakt", "-i", "x.png", "-o", "o"],
     "did you mean 'SRVGGNetCompact'"),
    (["infer", "--weights", str(PRETRAINED), *SRVGG[:-1], "act_type=relu", "num_feats=3", "-i", "x", "-o", "o"],
     "num_feats"),
    (["infer", "--arch", "bicubic", "-i", "x.png", "-o", "o"], "--scale"),
    (["infer", "--arch", "bicubic", "--scale", "2", "-i", "missing_dir", "-o", "o"], "missing_dir"),
    (["eval", "--gt", "nowhere", "--sr", "nowhere", "--scale", "2"], "nowhere"),
    (["test", "-opt", "missing.yml"], "missing.yml"),
])
def test_cli_errors_are_one_clear_line(tmp_path: Path, args: list[str], message: str) -> None:
    proc = run_cli(*args, cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_corrupt_image_is_named(tmp_path: Path) -> None:
    good = (DATASETS / "Set5" / "HR" / "bird.png").read_bytes()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "broken.png").write_bytes(good[: len(good) // 3])
    proc = run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(tmp_path / "in"), "-o",
                   str(tmp_path / "o"), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "broken.png" in proc.stderr


def test_help_for_every_command(tmp_path: Path) -> None:
    for cmd in (["--help"], ["train", "--help"], ["test", "--help"], ["infer", "--help"], ["eval", "--help"],
                ["bench", "--help"], ["prepare", "lr", "--help"], ["prepare", "subimages", "--help"],
                ["prepare", "lmdb", "--help"]):
        text = run_cli(*cmd, cwd=tmp_path).stdout
        usage, _, rest = text.partition("\n\n")
        # every command says what it does (a description paragraph after the usage lines)
        assert rest.strip() and not rest.lstrip().startswith(("options:", "positional")), cmd
    sub = run_cli("prepare", "subimages", "--help", cwd=tmp_path).stdout
    for default in ("(default: 480)", "(default: 240)", "(default: 0)", "(default: 1)"):
        assert default in sub
    # each command's --force_yml example names keys that command reads (a test file has no train section)
    test_help = " ".join(run_cli("test", "--help", cwd=tmp_path).stdout.split())
    assert "train.total_iter" not in test_help and "val.save_img=false" in test_help


def test_infer_refuses_to_overwrite_inputs_or_collide(tmp_path: Path) -> None:
    src = tmp_path / "imgs"
    src.mkdir()
    shutil.copy(DATASETS / "Set5" / "HR" / "bird.png", src / "a.png")
    before = (src / "a.png").read_bytes()
    proc = run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(src), "-o", str(src), cwd=tmp_path,
                   check=False)
    assert proc.returncode == 2 and "would overwrite the input" in proc.stderr
    assert (src / "a.png").read_bytes() == before
    cv2.imwrite(str(src / "a.jpg"), cv2.imread(str(src / "a.png")))
    proc = run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(src), "-o", str(tmp_path / "o"),
                   cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "would both be written" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_infer_keeps_16_bit_precision(tmp_path: Path) -> None:
    img = (np.linspace(0, 65535, 24 * 32).reshape(24, 32).astype(np.uint16))
    cv2.imwrite(str(tmp_path / "deep.png"), np.stack([img, img[::-1], img[:, ::-1]], axis=2))
    run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(tmp_path / "deep.png"), "-o",
            str(tmp_path / "o"), cwd=tmp_path)
    out = cv2.imread(str(tmp_path / "o" / "deep.png"), cv2.IMREAD_UNCHANGED)
    assert out.dtype == np.uint16 and out.shape == (48, 64, 3)
    assert np.any(out % 257 != 0)  # not 8-bit values scaled up


def test_train_a_shipped_file_on_your_own_folder(tmp_path: Path) -> None:
    """`--data DIR`: a shipped BasicSR file (DIV2K paths) trains on a folder of HR images as it is, the LQ made from
    them; --force_yml still wins; files whose dataset cannot take a folder are refused in one line."""
    from anysr.options import data_overrides
    from anysr.plugins import load_plugins

    load_plugins()
    mine = tmp_path / "mine"
    mine.mkdir()
    for p in sorted((DATASETS / "T91" / "HR").glob("*.png"))[:6]:
        shutil.copy(p, mine / p.name)
    msr = ROOT / "options" / "train" / "train_MSRResNet_x4.yml"
    assert data_overrides(msr, mine) == [f'datasets.train.dataroot_gt="{mine}"', "datasets.train.lq_from_gt=true",
                                         "datasets.train.dataroot_lq=~", "datasets.train.meta_info_file=~"]
    real = data_overrides(ROOT / "options" / "train" / "train_RealESRNet_x4plus.yml", mine)
    assert real[0] == f'datasets.train.dataroot_gt="{mine}"' and not any("lq_from_gt" in o for o in real)
    proc = run_cli("train", "-opt", str(ROOT / "options" / "train" / "video" / "train_BasicVSR_REDS.yml"), "--data",
                   str(mine), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "--data works with PairedImageDataset and Real-ESRGAN's datasets" in proc.stderr
    proc = run_cli("train", "-opt", str(msr), "--data", str(mine), "--force_yml",
                   f"path.experiments_root={tmp_path / 'exp'}", "train.total_iter=2", "network_g.num_block=1",
                   "network_g.num_feat=8", "datasets.train.batch_size_per_gpu=2", "datasets.train.gt_size=64",
                   "datasets.train.num_worker_per_gpu=0", "train.precision=fp32", "val=~", "datasets.val=~",
                   "datasets.val_2=~", cwd=ROOT)
    assert (tmp_path / "exp" / "models" / "net_g_2.safetensors").is_file(), proc.stdout[-2000:]

"""``anysr eval --metrics``: NIQE, LPIPS, DISTS and FID through the command line equal the reference
implementations (BasicSR's ``calculate_niqe``, the ``lpips`` and ``DISTS_pytorch`` packages, pytorch-fid's
features; fixtures in tests/fixtures/metrics/), several folders side by side, CSV / JSON, the comparison page."""

from __future__ import annotations

import argparse
import csv
import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import DATASETS, FIXTURE_TOL, run_cli
from metric_files import write_metric_weights
from safetensors.torch import load_file

from anysr.engine.evaluation.folder_eval import evaluate_folders, parse_metrics
from anysr.engine.evaluation.val_metrics import read_fid_reference
from anysr.errors import DataError, OptionError
from anysr.metrics.fid import fid_from_features

FIX = Path(__file__).resolve().parent / "fixtures" / "metrics"
NIQE_CASES = json.loads((FIX / "niqe.json").read_text())["cases"]
NIQE_TOL = 1e-3


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Path]]:
    return write_metric_weights(tmp_path_factory.mktemp("metric_weights"), ("lpips", "dists", "fid"))


def _write_rgb(folder: Path, name: str, chw: torch.Tensor) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(folder / f"{name}.png"), chw.permute(1, 2, 0).numpy()[:, :, ::-1])


def _flags(w: dict[str, list[Path]], *names: str) -> list[str]:
    out: list[str] = []
    for name in names:
        out += [f"--{name}-weights", *map(str, w[name])]
    return out


@pytest.mark.slow
def test_niqe_through_eval_equals_basicsr(tmp_path: Path) -> None:
    """``--metrics niqe`` measures the result (here: the HR images themselves) with BasicSR's crop_border."""
    proc = run_cli("eval", "--gt", str(DATASETS / "Set5" / "HR"), "--sr", str(DATASETS / "Set5" / "HR"), "--scale",
                   "4", "--metrics", "calculate_niqe", "--json", str(tmp_path / "r.json"), cwd=tmp_path)
    result = json.loads((tmp_path / "r.json").read_text())
    expected = {Path(c["image"]).name: c["niqe"] for c in NIQE_CASES
                if "/Set5/" in c["image"] and c["crop_border"] == 4 and c["convert_to"] == "y"}
    assert len(expected) == 5 and result["metrics"] == ["niqe"]
    for row in result["images"]:
        assert abs(row["niqe"] - expected[row["name"]]) <= NIQE_TOL, row
    assert proc.stdout.strip().splitlines()[-2:] == [f"average NIQE={result['niqe']:.4f} n=5",
                                                      f"wrote {tmp_path / 'r.json'}"]


@pytest.mark.slow
def test_lpips_and_dists_through_eval_equal_the_packages(tmp_path: Path, weights: dict[str, list[Path]]) -> None:
    lp, ds = load_file(str(FIX / "lpips_alex.safetensors")), load_file(str(FIX / "dists.safetensors"))
    for i in range(lp["x"].shape[0]):
        _write_rgb(tmp_path / "lp_gt", f"im{i}", lp["x"][i])
        _write_rgb(tmp_path / "lp_sr", f"im{i}", lp["y"][i])
        _write_rgb(tmp_path / "ds_gt", f"im{i}", ds["x"][i])
        _write_rgb(tmp_path / "ds_sr", f"im{i}", ds["y"][i])
    run_cli("eval", "--gt", str(tmp_path / "lp_gt"), "--sr", str(tmp_path / "lp_sr"), "--scale", "1",
            "--crop-border", "0", "--metrics", "lpips,psnr", *_flags(weights, "lpips"), "--accelerator", "cpu",
            "--json", str(tmp_path / "lp.json"), cwd=tmp_path)
    got = [r["lpips"] for r in json.loads((tmp_path / "lp.json").read_text())["images"]]
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), lp["dist"].double(), **FIXTURE_TOL)
    run_cli("eval", "--gt", str(tmp_path / "ds_gt"), "--sr", str(tmp_path / "ds_sr"), "--scale", "1",
            "--crop-border", "0", "--metrics", "dists", *_flags(weights, "dists"), "--accelerator", "cpu",
            "--json", str(tmp_path / "ds.json"), cwd=tmp_path)
    got = [r["dists"] for r in json.loads((tmp_path / "ds.json").read_text())["images"]]
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float64), ds["score"].double(), **FIXTURE_TOL)


@pytest.mark.slow
def test_fid_through_eval_uses_pytorch_fid_features(tmp_path: Path, weights: dict[str, list[Path]]) -> None:
    """FID needs no pixel pairing: a 75x90 result against a 64x64 ground truth is fine."""
    data = load_file(str(FIX / "fid.safetensors"))
    _write_rgb(tmp_path / "gt", "a", data["images"][0])
    _write_rgb(tmp_path / "gt", "b", data["images"][1])
    _write_rgb(tmp_path / "sr", "a", data["images"][0])
    _write_rgb(tmp_path / "sr", "b", data["odd_image"][0])
    result = evaluate_folders(tmp_path / "gt", tmp_path / "sr", 1, metrics=["fid"], weights={"fid": weights["fid"]},
                              echo=lambda _: None)
    feats = data["features"].double().numpy()
    expected = fid_from_features(np.stack([feats[0], data["odd_features"][0].double().numpy()]), feats)
    assert result["fid"] == pytest.approx(expected, rel=1e-3)


def test_fid_statistics_files_of_basicsr_and_pytorch_fid(tmp_path: Path) -> None:
    """BasicSR's .pth (numpy mean / cov, read with weights_only) and pytorch-fid's .npz give the same reference."""
    rng = np.random.default_rng(0)
    feats = rng.standard_normal((20, 8))
    mu, sigma = feats.mean(axis=0), np.cov(feats, rowvar=False)
    torch.save({"name": "ref", "size": 64, "mean": mu, "cov": sigma}, tmp_path / "ref.pth")
    np.savez(tmp_path / "ref.npz", mu=mu, sigma=sigma)
    for name in ("ref.pth", "ref.npz"):
        m, s = read_fid_reference(tmp_path / name, "--fid-stats")
        np.testing.assert_array_equal(m, mu)
        np.testing.assert_array_equal(s, sigma)
    torch.save({"what": torch.zeros(3)}, tmp_path / "odd.pth")
    with pytest.raises(DataError, match="mean / cov"):
        read_fid_reference(tmp_path / "odd.pth", "--fid-stats")
    torch.save({"mean": mu, "cov": sigma, "obj": argparse.Namespace(a=1)}, tmp_path / "pickled.pth")
    with pytest.raises(DataError, match=r"refused by torch.load\(weights_only=True\): it holds something other "
                                        r"than tensors.*\.npz with mu / sigma") as info:
        read_fid_reference(tmp_path / "pickled.pth", "--fid-stats")
    assert "\n" not in str(info.value) and "weights_only` to `False`" not in str(info.value)


@pytest.mark.slow
def test_several_folders_side_by_side_with_csv_json_and_report(tmp_path: Path) -> None:
    gt = tmp_path / "gt"
    gt.mkdir()
    for name in ("baby", "bird"):
        shutil.copy(DATASETS / "Set5" / "HR" / f"{name}.png", gt / f"{name}.png")
    folders = {}
    for label, sigma in (("soft", 1.0), ("sharp", 0.0)):
        folders[label] = tmp_path / label
        folders[label].mkdir()
        for p in sorted(gt.glob("*.png")):
            img = cv2.imread(str(p))
            out = cv2.GaussianBlur(img, (5, 5), sigma) if sigma else img
            cv2.imwrite(str(folders[label] / f"{p.stem}_x2.png"), out)
    proc = run_cli("eval", "--gt", str(gt), "--sr", str(folders["soft"]), str(folders["sharp"]), "--scale", "2",
                   "--metrics", "psnr,ssim", "--json", str(tmp_path / "r.json"), "--csv", str(tmp_path / "r.csv"),
                   "--report", str(tmp_path / "cmp.html"), cwd=tmp_path)
    lines = proc.stdout.strip().splitlines()
    assert lines[-5].startswith("average soft: PSNR=") and lines[-4].startswith("average sharp: PSNR=inf")
    assert lines[-3:] == [f"wrote {tmp_path / n}" for n in ("r.json", "r.csv", "cmp.html")]  # each file said
    header = next(line for line in lines if line.startswith("image"))
    assert header.split() == ["image", "PSNR[soft]", "PSNR[sharp]", "SSIM[soft]", "SSIM[sharp]"]
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["labels"] == ["soft", "sharp"] and [r["n"] for r in result["results"]] == [2, 2]
    single = evaluate_folders(gt, folders["soft"], 2, echo=lambda _: None)
    assert result["results"][0]["psnr"] == single["psnr"] and result["results"][0]["images"] == single["images"]
    rows = list(csv.DictReader((tmp_path / "r.csv").open()))
    assert [(r["folder"], r["image"]) for r in rows] == [
        ("soft", "baby_x2.png"), ("soft", "bird_x2.png"), ("soft", "(average)"),
        ("sharp", "baby_x2.png"), ("sharp", "bird_x2.png"), ("sharp", "(average)")]
    assert float(rows[0]["psnr"]) == pytest.approx(single["images"][0]["psnr"], abs=1e-6)
    page = (tmp_path / "cmp.html").read_text()
    assert page.count('"label": "soft"') == 2 and page.count('"label": "ground truth"') == 2
    assert 'href=\\"soft/baby_x2.png\\"' in page  # relative links
    assert "<h2>Averages over 2 images: PSNR, SSIM</h2>" in page


def test_metric_names_and_missing_weights_are_one_line_errors(tmp_path: Path) -> None:
    assert parse_metrics("psnr, calculate_niqe,LPIPS,psnr") == ["psnr", "niqe", "lpips"]
    with pytest.raises(OptionError, match="unknown metric 'psnrr'.*did you mean 'psnr'"):
        parse_metrics("psnrr")
    hr = str(DATASETS / "Set5" / "HR")
    proc = run_cli("eval", "--gt", hr, "--sr", hr, "--scale", "2", "--metrics", "psnr,lpips", "--accelerator", "cpu",
                   cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert ("--lpips-weights: torchvision's AlexNet (alexnet-owt-7be5be79.pth) is not on this machine and "
            "downloading is off (ANYSR_OFFLINE=1)") in proc.stderr  # found by name: the tests' cache is empty
    bad = tmp_path / "bad.pth"
    torch.save({"foo.weight": torch.zeros(2)}, bad)
    proc = run_cli("eval", "--gt", hr, "--sr", hr, "--scale", "2", "--metrics", "dists", "--dists-weights",
                   str(bad), "--accelerator", "cpu", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "--dists-weights" in proc.stderr and "bad.pth" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_wrong_metric_weights_are_one_line_saying_what_is_wrong(tmp_path: Path) -> None:
    """A weight file of another network: how it differs and which file is wanted, not torch's first line."""
    from anysr.engine.evaluation.val_metrics import build_metric_module
    from anysr.errors import CheckpointError
    from anysr.metrics import metric_info

    torch.save({"a": torch.zeros(3)}, tmp_path / "wrong.pth")
    with pytest.raises(CheckpointError) as info:
        build_metric_module(metric_info("fid"), [tmp_path / "wrong.pth"], where="--fid-weights")
    text = str(info.value)
    assert "\n" not in text and "not fid's weights (" in text and "missing keys (Conv2d_1a_3x3.conv.weight" in text
    assert "1 unexpected key (a)" in text and "pytorch-fid's Inception" in text, text

"""``evaluate_folders`` (``anysr eval``) and THE reference test: the published bicubic baselines.

The classic pipeline - LR = MATLAB imresize(mod-cropped HR, 1/s) rounded to uint8; SR = imresize(LR, s)
rounded; PSNR on MATLAB's Y (unrounded, the gray ``bridge`` is its own Y) with s pixels shaved - run through
``prepare_lr``, the ``Bicubic`` arch and ``evaluate_folders`` must give the numbers every SR paper quotes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from anysr.data.imageio import list_images, read_image, write_image
from anysr.engine.evaluation.folder_eval import evaluate_folders, pair_by_stem
from anysr.engine.prepare.command import prepare_lr
from anysr.errors import DataError, OptionError
from anysr.metrics import calculate_psnr, calculate_ssim
from anysr.ops.color import full_range_luma
from anysr.registry import ARCH_REGISTRY

DATASETS = Path(__file__).resolve().parents[1] / "datasets"

# Bicubic PSNR (dB, Y channel) as published (SRCNN / VDSR / EDSR tables).
PUBLISHED = {
    ("Set5", 2): 33.66, ("Set5", 3): 30.39, ("Set5", 4): 28.42,
    ("Set14", 2): 30.24, ("Set14", 3): 27.55, ("Set14", 4): 26.00,
}
LAST_LINE = re.compile(r"^average PSNR=(\d+\.\d{4}) SSIM=(\d\.\d{4}) n=(\d+)$")


def E(path: object) -> str:
    """A path as a regular expression that matches it literally."""
    return re.escape(str(path))


@pytest.fixture(scope="session")
def work_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bicubic_reference")


def _bicubic_sr_folder(lr_dir: Path, out_dir: Path, scale: int) -> None:
    """Upscale every LR image with the registered ``Bicubic`` arch, save as ``<stem>_x<scale>.png``."""
    import anysr.archs.bicubic_arch  # noqa: F401  (registers Bicubic when anysr.archs is not imported)

    net = ARCH_REGISTRY.get("Bicubic")(upscale=scale).eval()
    for path in list_images(lr_dir):
        img = read_image(path)
        x = torch.from_numpy(img).float() / 255
        x = x[None, None] if img.ndim == 2 else x.permute(2, 0, 1)[None]
        with torch.no_grad():
            y = (net(x).clamp(0, 1) * 255).round().to(torch.uint8)[0]
        write_image(out_dir / f"{path.stem}_x{scale}.png", y[0].numpy() if img.ndim == 2 else
                    y.permute(1, 2, 0).numpy())


@pytest.mark.parametrize(("dataset", "scale"), sorted(PUBLISHED))
def test_bicubic_baseline_reproduces_published_psnr(work_dir: Path, dataset: str, scale: int) -> None:
    hr = DATASETS / dataset / "HR"
    lr = work_dir / f"{dataset}_LRx{scale}"
    sr = work_dir / f"{dataset}_SRx{scale}"
    prepare_lr(hr, lr, scale, progress=False)
    _bicubic_sr_folder(lr, sr, scale)
    lines: list[str] = []
    result = evaluate_folders(hr, sr, scale, echo=lines.append)
    n = len(list_images(hr))
    assert result["n"] == n and len(result["images"]) == n
    assert result["crop_border"] == scale and result["y_channel"] is True
    assert abs(result["psnr"] - PUBLISHED[(dataset, scale)]) < 0.03, result["psnr"]
    match = LAST_LINE.match(lines[-1])
    assert match, lines[-1]
    assert float(match.group(1)) == round(result["psnr"], 4) and int(match.group(3)) == n
    assert 0.6 < result["ssim"] < 0.95
    assert sum(1 for line in lines if "_x" in line) == n  # one table row per image


# ------------------------------------------------------------------------------------ behaviour
def _noise(h: int, w: int, c: int | None = 3, seed: int = 0) -> np.ndarray:
    shape = (h, w) if c is None else (h, w, c)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _blur(img: np.ndarray) -> np.ndarray:
    """A deterministic 'SR' close to the GT (so SSIM and PSNR are meaningful)."""
    out = img.astype(np.int16)
    out[1:-1] = (out[:-2] + 2 * out[1:-1] + out[2:]) // 4
    return out.astype(np.uint8)


def test_pairing_by_stem_with_suffixes(tmp_path: Path) -> None:
    gt = [tmp_path / n for n in ("img.png", "img_2.png", "baby.png")]
    sr = [tmp_path / n for n in ("img_x2.png", "img_2_bicubic.png", "baby.png")]
    pairs = pair_by_stem(gt, sr)
    assert [(g.name, s.name) for g, s in pairs] == [
        ("baby.png", "baby.png"), ("img.png", "img_x2.png"), ("img_2.png", "img_2_bicubic.png")]


def test_pairing_errors_name_the_files(tmp_path: Path) -> None:
    gt = [tmp_path / n for n in ("a.png", "b.png")]
    with pytest.raises(DataError, match=r"SR files without a ground-truth image: ab\.png.*; ground-truth "
                                        r"images without an SR file: a\.png, b\.png"):
        pair_by_stem(gt, [tmp_path / "ab.png"])
    with pytest.raises(DataError, match=r"ground-truth images matched by several SR files: "
                                        r"a\.png <- a_x2\.png, a_bicubic\.png"):
        pair_by_stem(gt, [tmp_path / n for n in ("a_x2.png", "a_bicubic.png", "b.png")])
    with pytest.raises(DataError, match=r"ground-truth files .*a\.png and .*a\.bmp share the stem 'a'"):
        pair_by_stem([tmp_path / "a.png", tmp_path / "a.bmp"], [tmp_path / "a.png"])


def test_table_json_modcrop_and_defaults(tmp_path: Path) -> None:
    gt_dir, sr_dir = tmp_path / "gt", tmp_path / "sr"
    gt1, gt2 = _noise(50, 45), _noise(40, 40, seed=1)
    write_image(gt_dir / "one.png", gt1)
    write_image(gt_dir / "two.png", gt2)
    sr1 = _blur(gt1[:48, :44])  # SR of a mod-cropped (x4) GT: 2 and 1 pixels smaller
    write_image(sr_dir / "one_SRx4.png", sr1)
    write_image(sr_dir / "two_SRx4.png", _blur(gt2))
    lines: list[str] = []
    result = evaluate_folders(gt_dir, sr_dir, 4, json_path=tmp_path / "out" / "r.json", echo=lines.append)
    psnr1 = calculate_psnr(sr1, gt1[:48, :44], 4, test_y_channel=True)
    ssim1 = calculate_ssim(sr1, gt1[:48, :44], 4, test_y_channel=True)
    assert result["images"][0]["psnr"] == pytest.approx(psnr1, abs=1e-12)
    assert result["images"][0]["ssim"] == pytest.approx(ssim1, abs=1e-12)
    assert result["psnr"] == pytest.approx(np.mean([r["psnr"] for r in result["images"]]), abs=1e-12)
    assert lines[-2] == f"average PSNR={result['psnr']:.4f} SSIM={result['ssim']:.4f} n=2"
    assert lines[-1] == f"wrote {tmp_path / 'out' / 'r.json'}"  # the files written are said after the table
    assert any(line.startswith("one_SRx4.png") for line in lines)
    saved = json.loads((tmp_path / "out" / "r.json").read_text())
    assert saved["n"] == 2 and saved["psnr"] == pytest.approx(result["psnr"])
    assert [r["name"] for r in saved["images"]] == ["one_SRx4.png", "two_SRx4.png"]
    rgb = evaluate_folders(gt_dir, sr_dir, 4, crop_border=0, y_channel=False, echo=lambda _: None)
    assert rgb["crop_border"] == 0
    assert rgb["images"][1]["psnr"] == pytest.approx(calculate_psnr(_blur(gt2), gt2, 0), abs=1e-12)


def test_gray_gt_against_colour_sr_uses_full_range_luma(tmp_path: Path) -> None:
    gt = _noise(40, 36, None, seed=2)
    sr_gray = _blur(gt)
    write_image(tmp_path / "gt" / "g.png", gt)
    write_image(tmp_path / "gray" / "g.png", sr_gray)
    write_image(tmp_path / "rep" / "g.png", np.repeat(sr_gray[..., None], 3, axis=2))  # gray saved as RGB
    tinted = np.stack([sr_gray, np.clip(sr_gray.astype(int) + 9, 0, 255), sr_gray], axis=-1).astype(np.uint8)
    write_image(tmp_path / "tint" / "g.png", tinted)
    quiet = {"echo": lambda _: None}
    gray = evaluate_folders(tmp_path / "gt", tmp_path / "gray", 2, **quiet)
    rep = evaluate_folders(tmp_path / "gt", tmp_path / "rep", 2, **quiet)
    assert rep["psnr"] == pytest.approx(gray["psnr"], abs=1e-9)
    assert rep["ssim"] == pytest.approx(gray["ssim"], abs=1e-9)
    tint = evaluate_folders(tmp_path / "gt", tmp_path / "tint", 2, **quiet)
    assert tint["psnr"] == pytest.approx(calculate_psnr(full_range_luma(tinted), gt, 2), abs=1e-9)


def test_evaluate_folders_errors_name_the_files(tmp_path: Path) -> None:
    gt_dir, sr_dir = tmp_path / "gt", tmp_path / "sr"
    write_image(gt_dir / "a.png", _noise(40, 40))
    write_image(sr_dir / "a_x2.png", _noise(36, 40))
    quiet = {"echo": lambda _: None}
    with pytest.raises(DataError, match=rf"size mismatch: {E(sr_dir / 'a_x2.png')} is 40x36 but "
                                        rf"{E(gt_dir / 'a.png')} is 40x40; .*check the scale"):
        evaluate_folders(gt_dir, sr_dir, 2, **quiet)
    write_image(sr_dir / "a_x2.png", _noise(40, 40))
    write_image(sr_dir / "stray.png", _noise(40, 40))
    with pytest.raises(DataError, match=r"SR files without a ground-truth image: stray\.png"):
        evaluate_folders(gt_dir, sr_dir, 2, **quiet)
    (sr_dir / "stray.png").unlink()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=rf"image folder {E(tmp_path / 'empty')} holds no image files"):
        evaluate_folders(gt_dir, tmp_path / "empty", 2, **quiet)
    with pytest.raises(DataError, match=rf"image folder {E(tmp_path / 'nope')}: it does not exist"):
        evaluate_folders(tmp_path / "nope", sr_dir, 2, **quiet)
    with pytest.raises(OptionError, match=r"scale: must be a positive integer, got 0"):
        evaluate_folders(gt_dir, sr_dir, 0, **quiet)
    with pytest.raises(OptionError, match=r"crop_border: must be an integer >= 0, got -1"):
        evaluate_folders(gt_dir, sr_dir, 2, crop_border=-1, **quiet)
    with pytest.raises(DataError, match=rf"{E(sr_dir / 'a_x2.png')} vs {E(gt_dir / 'a.png')}: "
                                        r"calculate_ssim: a 8x8 image \(after crop_border\) is smaller than "
                                        r"the 11x11 window"):
        evaluate_folders(gt_dir, sr_dir, 2, crop_border=16, **quiet)
    (sr_dir / "a_x2.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    with pytest.raises(DataError, match=rf"image {E(sr_dir / 'a_x2.png')} cannot be decoded"):
        evaluate_folders(gt_dir, sr_dir, 2, **quiet)
    write_image(sr_dir / "a_x2.png", _noise(40, 40).astype(np.uint16) * 257)
    with pytest.raises(DataError, match=r"a_x2\.png has uint16 pixels; the metrics need 8-bit images"):
        evaluate_folders(gt_dir, sr_dir, 2, **quiet)

"""docs/realworld.md's CPU example: a few hundred iterations of Real-ESRGAN-style training on T91, then a look.

1. ``anysr train`` of ``options/train/example_RealESRNet_T91_x4.yml`` (RealESRNetModel, a small SRVGGNetCompact x4,
   x4plus degradations synthesised on the fly);
2. a degraded test set from Set14 made by ``anysr prepare degrade`` with the same degradations (another seed,
   192-pixel GT crops, no pool, the plain GT instead of the USM-sharpened one): images the network never saw;
3. ``anysr infer`` of bicubic, the trained network and the published realesr-animevideov3, ``anysr eval`` of each;
4. a picture: degraded input (nearest x4) | bicubic | trained | animevideov3 | ground truth, for three pairs.

Run from the repository root: ``python examples/realworld.py``. Writes under ``results/realworld_example`` and
``experiments/example_RealESRNet_T91_x4``; the picture goes to ``docs/img/realworld_example.jpg``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from anysr.data.imageio import read_image, write_image  # noqa: E402

TRAIN = "options/train/example_RealESRNet_T91_x4.yml"
NAME = "example_RealESRNet_T91_x4"
OUT = ROOT / "results" / "realworld_example"
PICTURE = ROOT / "docs" / "img" / "realworld_example.jpg"
ANIME = ["--weights", "pretrained/realesr-animevideov3.pth", "--arch", "SRVGGNetCompact",
         "--arch-opt", "num_feat=64", "num_conv=16", "upscale=4", "act_type=prelu"]


def anysr(*args: str) -> None:
    print("$ anysr " + " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "anysr", *args], cwd=ROOT, check=True)


def test_set() -> tuple[Path, Path]:
    """Degraded Set14 crops, split into lq/ and gt/ folders with matching names."""
    raw = OUT / "degraded"
    if not (raw / "degrade.json").is_file():
        shutil.rmtree(raw, ignore_errors=True)
        anysr("prepare", "degrade", "-opt", TRAIN, "--out", str(raw.relative_to(ROOT)), "-n", "14", "--force_yml",
              "datasets.train.dataroot_gt=datasets/Set14/HR", "manual_seed=2024", "queue_size=0", "gt_usm=false",
              "gt_size=192", "datasets.train.gt_size=192", "datasets.train.crop_pad_size=256",
              "datasets.train.use_hflip=false")
    lq, gt = OUT / "lq", OUT / "gt"
    for folder, tag in ((lq, "lq"), (gt, "gt")):
        folder.mkdir(parents=True, exist_ok=True)
        for p in sorted(raw.glob(f"*_{tag}.png")):
            shutil.copy(p, folder / f"{p.stem[:-len(tag) - 1]}.png")
    return lq, gt


def evaluate(name: str, gt: Path) -> dict:
    out = OUT / f"{name}.json"
    anysr("eval", "--gt", str(gt), "--sr", str(OUT / name), "--scale", "4", "--json", str(out))
    return json.loads(out.read_text())


def picture(lq: Path, gt: Path, stems: list[str], names: list[str]) -> None:
    rows = []
    for stem in stems:
        low = read_image(lq / f"{stem}.png", flag="color")
        tiles = [np.repeat(np.repeat(low, 4, axis=0), 4, axis=1)]
        tiles += [read_image(OUT / n / f"{stem}.png", flag="color") for n in names]
        tiles.append(read_image(gt / f"{stem}.png", flag="color"))
        h = min(t.shape[0] for t in tiles)
        w = min(t.shape[1] for t in tiles)
        rows.append(np.concatenate([np.pad(t[:h, :w], ((2, 2), (2, 2), (0, 0)), constant_values=255)
                                    for t in tiles], axis=1))
    write_image(PICTURE, np.concatenate(rows, axis=0))


def _average(scores: dict, key: str) -> float:
    for k in (key, key.lower(), f"average_{key.lower()}"):
        if k in scores:
            return float(scores[k])
    return float(scores["average"][key.lower()])


def main() -> int:
    anysr("train", "-opt", TRAIN, "--auto_resume")
    run = json.loads((ROOT / "experiments" / NAME / "summary.json").read_text())
    minutes = run["wall_time_s"] / 60
    lq, gt = test_set()
    weights = ROOT / "experiments" / NAME / "models" / "net_g_300.safetensors"
    runs = {"bicubic": ["--arch", "bicubic", "--scale", "4"],
            "trained": ["--weights", str(weights.relative_to(ROOT)), "--arch", "SRVGGNetCompact", "--arch-opt",
                        "num_feat=32", "num_conv=8", "upscale=4", "act_type=prelu"],
            "animevideov3": ANIME}
    scores = {}
    for name, args in runs.items():
        shutil.rmtree(OUT / name, ignore_errors=True)
        anysr("infer", *args, "-i", str(lq.relative_to(ROOT)), "-o", str((OUT / name).relative_to(ROOT)),
              "--accelerator", "cpu", "--precision", "fp32")
        scores[name] = evaluate(name, gt)
    picture(lq, gt, ["0001", "0004", "0009"], list(runs))
    print()
    print(f"degraded Set14 crops (x4plus degradations, 14 pairs), Y channel, 4 px shaved   "
          f"(training took {minutes:.1f} min)")
    print(f"{'method':<14} {'PSNR':>7} {'SSIM':>7}")
    for name, s in scores.items():
        print(f"{name:<14} {_average(s, 'PSNR'):7.2f} {_average(s, 'SSIM'):7.4f}")
    print(f"picture: {PICTURE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

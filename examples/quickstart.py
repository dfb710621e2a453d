"""The README's first command: train a small EDSR x2 on T91 (CPU), then compare it with bicubic.

Runs the CLI exactly as a user would (`anysr train`, `anysr test`) and prints a table from the two
``results/<name>/summary.json`` files. Run from the repository root: ``python examples/quickstart.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = "options/train/quickstart_EDSR_x2.yml"
TEST_NET = "options/test/test_quickstart_EDSR_x2.yml"
TEST_BICUBIC = "options/test/test_Bicubic_x2.yml"


def anysr(*args: str) -> None:
    cmd = [sys.executable, "-m", "anysr", *args]
    print("$ anysr " + " ".join(args), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def summary(name: str) -> dict:
    return json.loads((ROOT / "results" / name / "summary.json").read_text())


def main() -> int:
    t0 = time.perf_counter()
    anysr("train", "-opt", TRAIN, "--auto_resume")
    minutes = (time.perf_counter() - t0) / 60
    anysr("test", "-opt", TEST_BICUBIC)
    anysr("test", "-opt", TEST_NET)
    bic, net = summary("Bicubic_x2"), summary("quickstart_EDSR_x2")
    print()
    print(f"x2, Y channel, {2} px shaved   (training took {minutes:.1f} min)")
    print(f"{'dataset':<8} {'bicubic PSNR':>13} {'EDSR PSNR':>10} {'gain':>7} {'bicubic SSIM':>13} {'EDSR SSIM':>10}")
    for ds in bic["datasets"]:
        b, n = bic["datasets"][ds], net["datasets"][ds]
        print(f"{ds:<8} {b['psnr']:13.2f} {n['psnr']:10.2f} {n['psnr'] - b['psnr']:+7.2f} "
              f"{b['ssim']:13.4f} {n['ssim']:10.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

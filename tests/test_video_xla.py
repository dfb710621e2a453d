"""Video training and clip validation on XLA:CPU (run in the XLA venv: PJRT_DEVICE=CPU python -m pytest -m xla).

Fixed ``num_frame`` and ``gt_size`` give one training graph per phase (SPyNet frozen by ``fix_flow``, then
trained); clip validation in temporal chunks of one window length compiles nothing new on a later round.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.xla
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_basicvsr_trains_and_validates_with_fixed_graphs(tmp_path: Path) -> None:
    pytest.importorskip("torch_xla")
    from video_data import make_reds

    reds = make_reds(tmp_path / "reds", clips=("001", "002"), frames=4, size=(32, 32))
    val = make_reds(tmp_path / "reds4", clips=("000", "011"), frames=3, size=(32, 32))
    total, print_freq = 6, 1
    over = [f"path.root={tmp_path}", "name=xla_bvsr", "accelerator=xla", "num_gpu=1", "logger.use_tb_logger=false",
            f"datasets.train.dataroot_gt={reds['gt']}", f"datasets.train.dataroot_lq={reds['lq']}",
            f"datasets.train.meta_info_file={reds['meta']}", f"datasets.val.dataroot_gt={val['gt']}",
            f"datasets.val.dataroot_lq={val['lq']}", "network_g.spynet_path=null", "network_g.num_feat=8",
            "network_g.num_block=1", "datasets.train.num_frame=2", "datasets.train.gt_size=32",
            "datasets.train.batch_size_per_gpu=1", "datasets.train.num_worker_per_gpu=0",
            "datasets.train.dataset_enlarge_ratio=2", "train.fix_flow=3", "train.precision=fp32",
            f"train.total_iter={total}", f"logger.print_freq={print_freq}", "val.val_freq=3", "val.chunk=1",
            "val.chunk_pad=1"]
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "anysr", "train", "-opt",
                           str(ROOT / "options" / "train" / "video" / "train_BasicVSR_REDS.yml"), "--force_yml", *over],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1500, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = tmp_path / "experiments" / "xla_bvsr"
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["finished"] and summary["accelerator"]["kind"] == "xla"
    assert 5 < summary["validation"]["REDS4"]["psnr"]["value"] < 60
    log = "\n".join(p.read_text() for p in (exp / "log").glob("train_*.log"))
    stats = [ast.literal_eval(line.split("xla stats: ", 1)[1]) for line in log.splitlines() if "xla stats: " in line]
    compiles = [s["compiles"] for s in stats]
    assert len(compiles) == total // print_freq
    # Iterations 4 and 5 (after the switch at 3 and the first validation) compile nothing; the second validation
    # round (iteration 6) adds no graph either: the final count equals the one at iteration 5's print.
    assert compiles[3] == compiles[4], compiles
    assert summary["stats"]["compiles"] == compiles[4], (compiles, summary["stats"])

"""RestoreFormer++'s training on XLA:CPU (run in the XLA venv: PJRT_DEVICE=CPU python -m pytest -m xla
tests/test_xla_restoreformer.py).

The authors' recipe (tiny RestoreFormer++ file, its component losses from the 3rd iteration: the adaptive GAN weight
from the gradients at the decoder's last layer, the component discriminators on RoIAligned crops) trains on one XLA
device with nothing falling back to the CPU, and compiles no more graphs in 5 iterations than in 3 (the adaptive
weight stays in the graph: no host sync, no graph per value). LPIPS' VGG16 and ArcFace are left out for time (plain
convolutions; tests/test_xla_gfpgan.py runs ArcFace on XLA).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
pytest.importorskip("torch_xla")

from test_restoreformer_train import RFPP, _train, root  # noqa: E402, F401 - the module's fixture, reused

pytestmark = pytest.mark.xla


def test_no_cpu_fallbacks_and_no_graph_after_the_warm_up(root: Path) -> None:  # noqa: F811
    common = ["accelerator=xla", "train.disc_start=1", "logger.print_freq=100", "logger.save_checkpoint_freq=100",
              "train.perceptual_weight=0", "train.identity_weight=0", "network_identity=null"]
    env = {"CPU_NUM_DEVICES": "1"}
    short = json.loads((_train(root, RFPP, "xla_3", *common, "train.total_iter=3", env=env) /
                        "summary.json").read_text())
    long = json.loads((_train(root, RFPP, "xla_5", *common, "train.total_iter=5", env=env) /
                       "summary.json").read_text())
    assert long["iterations_done"] == 5 and long["stats"]["cpu_fallbacks"] == {}, long["stats"]
    assert long["stats"]["compiles"] == short["stats"]["compiles"], (short["stats"], long["stats"])
    assert long["final_losses"]["g_mouth_loss"] > 0 and long["final_losses"]["d_weight"] > 0

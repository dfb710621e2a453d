"""GFPGAN's training on XLA:CPU (run in the XLA venv: PJRT_DEVICE=CPU python -m pytest -m xla tests/test_xla_gfpgan.py).

RoIAlign on the device equals the CPU's with the shape-only sub-grid bound; GFPGAN's full option file (every loss:
the facial components cut by RoIAlign at each sample's boxes, identity, R1) trains on one XLA device with nothing
falling back to the CPU.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
pytest.importorskip("torch_xla")

import torch  # noqa: E402
from test_gfpgan_model import FULL, root, train_gfpgan  # noqa: E402, F401 - the module's fixture, reused
from test_roi_align import CASES, TENSORS  # noqa: E402

from anysr.ops.roi_align import roi_align, static_grid  # noqa: E402

pytestmark = pytest.mark.xla


def test_roi_align_on_the_device_equals_the_cpu() -> None:
    import torch_xla.core.xla_model as xm

    dev = xm.xla_device()
    for name in ("gfpgan_eyes", "gfpgan_mouth"):
        case = CASES[name]
        x = TENSORS[case["input"]]
        bound = static_grid(x.shape[-1], case["output_size"])
        src = x.to(dev).requires_grad_(True)
        out = roi_align(src, TENSORS[f"{name}.boxes"].to(dev), case["output_size"], max_grid=bound)
        (out * TENSORS[f"{name}.up"].to(dev)).sum().backward()
        torch.testing.assert_close(out.cpu(), TENSORS[f"{name}.out"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(src.grad.cpu(), TENSORS[f"{name}.grad"], rtol=1e-5, atol=1e-5)


def test_released_file_trains_on_xla_without_cpu_fallbacks(root: Path) -> None:  # noqa: F811
    exp = train_gfpgan(root, FULL, "run_xla", "accelerator=xla", "train.total_iter=2", "train.net_d_reg_every=2",
                       "logger.print_freq=1", "logger.save_checkpoint_freq=2", "val.val_freq=2",
                       env={"CPU_NUM_DEVICES": "1"})
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["finished"] and summary["iterations_done"] == 2
    assert summary["stats"]["cpu_fallbacks"] == {}, summary["stats"]
    losses = summary["final_losses"]
    assert losses["l_d_r1"] > 0 and "l_g_gan_mouth" in losses and "l_identity" in losses

"""MMRealSR's loader synthesis on XLA:CPU (run in the XLA venv: PJRT_DEVICE=CPU python -m pytest -m xla
tests/test_xla_mmrealsr_degradation.py).

With ``degrade_in: loader`` the anchored synthesis runs in the DataLoader workers on the CPU: every batch the
device sees has the same shapes, so a step on it compiles once, whatever resizes the samples drew.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
torch_xla = pytest.importorskip("torch_xla")

import torch  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402
import yaml  # noqa: E402
from conftest import DATASETS  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from anysr.data import collate  # noqa: E402
from anysr.data.degradation.mmrealsr import AnchoredLoaderSynthesis, AnchoredSettings  # noqa: E402
from anysr.data.mmrealsr_dataset import MMRealSRGANDataset  # noqa: E402
from anysr.options import load_options  # noqa: E402
from anysr.options.realesrgan import X4PLUS_MODEL  # noqa: E402

pytestmark = pytest.mark.xla


def _compiles() -> int:
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def _dataset(tmp: Path) -> MMRealSRGANDataset:
    """MMRealSRGANDataset from a validated Real-ESRGAN dataset section (its keys plus the authors' two)."""
    root = tmp / "gt"
    root.mkdir()
    for p in sorted((DATASETS / "T91" / "HR").glob("*.png"))[:4]:
        shutil.copy(p, root / p.name)
    opt = {"name": "x", "model_type": "RealESRNetModel", "scale": 4, "accelerator": "cpu", "num_gpu": 1,
           "gt_size": 32, "queue_size": 0,
           "datasets": {"train": {"name": "t", "type": "RealESRGANDataset", "dataroot_gt": str(root),
                                  "io_backend": {"type": "disk"}, "crop_pad_size": 96, "use_hflip": True,
                                  "batch_size_per_gpu": 2}},
           "network_g": {"type": "SRVGGNetCompact", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_conv": 2,
                         "upscale": 4, "act_type": "prelu"},
           "train": {"optim_g": {"type": "Adam", "lr": 1e-3}, "total_iter": 2,
                     "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0}}}
    path = tmp / "x.yml"
    path.write_text(yaml.safe_dump(opt))
    section = dict(load_options(path, [f"path.root={tmp}"], is_train=True).datasets.train)
    section.update(type="MMRealSRGANDataset", random_scale=0.8, blur_kernel_diff_lower_bound=0.1)
    return MMRealSRGANDataset(section, "datasets.train")


def test_loader_synthesis_gives_fixed_shapes_and_one_graph(tmp_path: Path) -> None:
    ds = _dataset(tmp_path)
    settings = AnchoredSettings.from_options({**X4PLUS_MODEL, "scale": 4, "gt_size": 32,
                                              "jpeg_diff_range": [5, 60]}, anchor_usm=True)
    ds.attach_synthesis(AnchoredLoaderSynthesis(settings))
    loader = DataLoader(ds, batch_size=2, sampler=[(i % 4, 100 + i) for i in range(8)], collate_fn=collate,
                        num_workers=1)
    device = torch_xla.device()
    weight = torch.ones(3, 3, 3, 3).to(device) / 27
    counts, shapes = [], set()
    for batch in loader:
        shapes.add((tuple(batch["lq"].shape), tuple(batch["anchor"].shape), tuple(batch["gt"].shape)))
        lq = batch["lq"].to(device).flatten(0, 1)
        anchor = batch["anchor"].to(device).flatten(0, 1)
        loss = torch.nn.functional.conv2d(torch.cat([lq, anchor]), weight, padding=1).mean() + batch["gt"].to(
            device).mean()
        torch_xla.sync()
        assert torch.isfinite(loss.cpu())
        counts.append(_compiles())
    assert shapes == {((2, 3, 3, 8, 8), (2, 2, 3, 8, 8), (2, 3, 32, 32))}, shapes
    assert counts[1:] == [counts[1]] * (len(counts) - 1), counts  # the first step also uploads the weight

"""NaN / Inf recovery on XLA:CPU (docs/nan_recovery.md): a NaN injected after the warm-up is recovered through the CLI
with no graph compiled after warm-up and no host read added to the steps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

pytest.importorskip("torch_xla")
pytestmark = pytest.mark.xla

from test_xla import PRINT, TOTAL, VAL, _cli, _final_weights, _images, _logged_stats  # noqa: E402
from test_xla import _options as xla_options  # noqa: E402


def test_xla_recovers_without_new_graphs(tmp_path: Path) -> None:
    data = {"root": tmp_path, "train": _images(tmp_path / "train", [(64, 64), (56, 72), (48, 64), (64, 48)] * 2, 3),
            "val": _images(tmp_path / "val", [(40, 40), (40, 40), (32, 48)], 4)}
    opt = xla_options("xnan", data)
    bad = 2 * VAL + 3  # after the warm-up (the first validation); found at the next print, back to the save at 2*VAL
    opt["train"]["nan_recovery"] = {"inject_at": [bad]}
    path = tmp_path / "xnan.yml"
    path.write_text(yaml.safe_dump(opt, sort_keys=False))
    proc = _cli(tmp_path, "anysr.train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}")
    exp = tmp_path / "experiments" / "xnan"
    found = (bad // PRINT + 1) * PRINT
    assert (f"NaN recovery 1/3: the loss became NaN or infinite at iteration {bad} (found at {found}); rolled back "
            f"to iteration {2 * VAL}") in proc.stdout
    assert "new graph(s) after warm-up" not in proc.stdout
    stats = _logged_stats(exp)
    assert len(stats) == TOTAL // PRINT  # the check that found the NaN reported nothing; the replay reports again
    assert stats[-1]["compiles_after_warmup"] == 0 and stats[-1]["cpu_fallbacks"] == {}
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["finished"] and summary["iterations_done"] == TOTAL
    assert all(torch.isfinite(v).all() for v in _final_weights(exp).values())
    assert math.isfinite(summary["validation"]["val"]["psnr"]["value"])

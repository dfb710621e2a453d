"""Optimizers and schedules on XLA:CPU: schedule-free (its weight switch around validation, saving and the EMA),
a torch schedule cycling momentum, and per-group lrs compile no new graph after warm-up and resume bit-exactly."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

pytest.importorskip("torch_xla")
pytestmark = [pytest.mark.xla, pytest.mark.skipif(importlib.util.find_spec("schedulefree") is None,
                                                   reason="schedulefree not installed (anysr[optim])")]

from test_xla import PRINT, TOTAL, VAL, _cli, _final_weights, _images, _logged_stats, _options  # noqa: E402


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("xla_optim")
    return {"root": root, "train": _images(root / "train", [(64, 64), (56, 72), (48, 64), (64, 48)] * 2, seed=3),
            "val": _images(root / "val", [(40, 40), (40, 40), (32, 48)], seed=4)}


def _run(data: dict[str, Path], name: str, train: dict[str, Any], *extra: str) -> Path:
    opt = _options(name, data)
    opt["train"].update(train)
    path = data["root"] / f"{name}.yml"
    path.write_text(yaml.safe_dump(opt, sort_keys=False))
    _cli(data["root"], "anysr.train", "-opt", str(path), "--force_yml", f"path.root={data['root']}", *extra)
    return data["root"] / "experiments" / name


TRAIN = {"optim_g": {"type": "AdamWScheduleFree", "lr": 2e-3, "warmup_steps": 3,
                     "param_groups": [{"params": ["body.*"], "lr": 1e-3}]},
         "scheduler": {"type": "OneCycleLR", "max_lr": 2e-3, "cycle_momentum": False}}


def test_schedule_free_compiles_once_and_resumes_bit_exact(data: dict[str, Path]) -> None:
    straight = _run(data, "sf", TRAIN)
    summary = json.loads((straight / "summary.json").read_text())
    assert summary["finished"] and summary["iterations_done"] == TOTAL
    log = "\n".join(p.read_text() for p in (straight / "log").glob("train_*.log"))
    assert "new graph(s) after warm-up" not in log
    stats = _logged_stats(straight)
    assert summary["stats"]["compiles"] == stats[-1]["compiles"]
    # no host read inside the step (schedule-free's and the schedules' values stay Python floats / on the device)
    reads = [b["host_transfers"] - a["host_transfers"] for a, b in zip(stats, stats[1:])]
    quiet = [r for i, r in enumerate(reads) if ((i + 1) * PRINT) % VAL != 0]
    assert quiet and all(0 < r <= 2 for r in quiet), reads
    split = _run(data, "sf_split", TRAIN, f"train.total_iter={2 * VAL}",
                 f"train.scheduler.total_steps={TOTAL}")
    _cli(data["root"], "anysr.train", "-opt", str(data["root"] / "sf_split.yml"), "--auto_resume", "--force_yml",
         f"path.root={data['root']}", f"train.scheduler.total_steps={TOTAL}")
    a, b = _final_weights(straight), _final_weights(split)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

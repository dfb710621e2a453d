"""Batch augmentations on XLA:CPU: one graph whatever is drawn, no CPU fallback, the eager CPU numbers (run in the
XLA venv: PJRT_DEVICE=CPU python -m pytest -m xla tests/test_xla_batch_augment.py)."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
torch_xla = pytest.importorskip("torch_xla")

import torch  # noqa: E402
import torch_xla.debug.metrics as met  # noqa: E402
from conftest import run_cli, tiny_train_options, write_options  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from anysr.data.batch_augment import draw_augment  # noqa: E402
from anysr.ops.augment import AUGMENTS, apply_augment  # noqa: E402

pytestmark = pytest.mark.xla


def _compiles() -> int:
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


def _fallbacks() -> dict[str, int]:
    return {n: int(met.counter_value(n) or 0) for n in met.counter_names() if n.startswith("aten::")}


def test_every_kind_runs_in_one_graph() -> None:
    """Steps drawing different augmentations (and boxes) compile nothing after the first, and match eager CPU."""
    device = torch_xla.device()
    before = _fallbacks()  # the counters are per process: earlier tests' fallbacks stay in them
    g = torch.Generator().manual_seed(0)
    lq, gt = torch.rand(4, 3, 8, 8, generator=g), torch.rand(4, 3, 16, 16, generator=g)
    xlq, xgt = lq.to(device), gt.to(device)
    counts = []
    for it in range(8):
        draw = draw_augment(list(AUGMENTS), [0, 1, 1, 1, 1, 1] if it else [0, 0, 0, 0, 1, 0], 7, it, 0, 0, 4, 3,
                            (8, 8))
        out_lq, (out_gt,) = apply_augment(xlq, [xgt], draw.to(device))
        torch_xla.sync()
        ref_lq, (ref_gt,) = apply_augment(lq, [gt], draw)
        torch.testing.assert_close(out_lq.cpu(), ref_lq, atol=1e-5, rtol=0)
        torch.testing.assert_close(out_gt.cpu(), ref_gt, atol=1e-5, rtol=0)
        counts.append(_compiles())
    assert counts[1:] == [counts[1]] * 7, counts
    assert _fallbacks() == before, (before, _fallbacks())


def _stats(exp: Path) -> list[dict[str, int]]:
    text = "\n".join(p.read_text() for p in sorted((exp / "log").glob("train_*.log")))
    return [ast.literal_eval(line.split("xla stats: ", 1)[1]) for line in text.splitlines() if "xla stats: " in line]


def test_cli_training_compiles_once(tmp_path: Path, small_train_dir: Path) -> None:
    """use_moa through the CLI on XLA:CPU: no new graph after warm-up, no fallback, eager CPU's weights."""
    total = 12
    for acc in ("xla", "cpu"):
        opt = tiny_train_options(acc, small_train_dir, None, total_iter=total)
        opt["accelerator"] = acc
        opt["logger"].update({"print_freq": 3, "save_checkpoint_freq": total})
        opt["train"].update(scheduler=None, warmup_iter=-1)  # a constant rate: only the augmentation varies
        opt["train"].update(use_moa=True, moa_augs=list(AUGMENTS), moa_probs=[1, 1, 1, 1, 1, 1])
        path = write_options(tmp_path / f"{acc}.yml", opt)
        run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path,
                env={"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"}, timeout=300)
    exp = tmp_path / "experiments" / "xla"
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["finished"] and summary["accelerator"]["kind"] == "xla"
    stats = _stats(exp)
    assert len(stats) == total // 3
    log = "\n".join(p.read_text() for p in (exp / "log").glob("train_*.log"))
    assert "new graph(s) after warm-up" not in log
    assert stats[1]["compiles"] == stats[-1]["compiles"], stats  # iterations 4..12: no new graph
    assert summary["stats"]["cpu_fallbacks"] == {}
    a = load_file(str(exp / "models" / f"net_g_{total}.safetensors"))
    b = load_file(str(tmp_path / "experiments" / "cpu" / "models" / f"net_g_{total}.safetensors"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-4, rtol=1e-4, msg=k)

"""``anysr bench``: it runs, its numbers are sane, its FLOP count is the arithmetic (no timing thresholds)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_train_options, write_options
from torch import nn

from anysr.archs.arch_util import input_channels
from anysr.cli import main
from anysr.engine.bench import _train_crop, forward_flops
from anysr.errors import OptionError
from anysr.options.typed import freeze

# tiny EDSR (8 features, 1 block, x2) on a 16x16 LR crop, multiply-adds per image:
# conv_first 3->8, 3 convs 8->8 (block + after body), upsample 8->32 at 16x16; conv_last 8->3 at 32x32.
TINY_EDSR_MACS = 16 * 16 * 9 * (3 * 8 + 3 * 8 * 8 + 8 * 32) + 32 * 32 * 9 * 8 * 3


def test_bench_cli_writes_sane_json(tmp_path: Path, small_train_dir: Path) -> None:
    opt = write_options(tmp_path / "tiny.yml", tiny_train_options("tiny", small_train_dir, None))
    out = tmp_path / "bench" / "r.json"
    proc = run_cli("bench", "-opt", str(opt), "--iters", "2", "--warmup", "1", "--infer-size", "24",
                   "--json", str(out), "--force_yml", "train.precision=bf16", "train.channels_last=true",
                   cwd=tmp_path)
    assert "train" in proc.stdout and "infer" in proc.stdout and str(out) in proc.stdout
    r = json.loads(out.read_text())
    assert r["accelerator"] == "cpu" and r["precision"] == "bf16" and r["channels_last"] is True
    assert r["network"] == "EDSR" and r["params"] > 0 and r["overrides"]
    tr, inf = r["train"], r["infer"]
    assert (tr["batch_size"], tr["gt_size"], tr["lq_size"], tr["iters"]) == (4, 32, 16, 2)
    for key in ("ms_per_iter", "ms_per_iter_mean", "ms_per_iter_best", "images_per_s", "gflops_per_s"):
        assert math.isfinite(tr[key]) and tr[key] > 0, key
    assert tr["ms_per_iter_best"] <= tr["ms_per_iter"]
    assert tr["images_per_s"] == pytest.approx(4 / tr["ms_per_iter"] * 1e3)
    assert tr["gflop_per_iter"] == pytest.approx(3 * 2 * TINY_EDSR_MACS * 4 / 1e9)
    assert math.isfinite(tr["loss"])
    assert inf["size"] == 24 and inf["output"] == [3, 48, 48]
    assert r["choices"]["precision"]["requested"] == "bf16" and "warnings" in r
    for key in ("ms_per_image", "ms_per_image_best", "gflop_per_image", "gflops_per_s", "output_megapixels_per_s"):
        assert math.isfinite(inf[key]) and inf[key] > 0, key


def test_bench_beside_runs_copies_at_once(tmp_path: Path, small_train_dir: Path) -> None:
    opt = write_options(tmp_path / "tiny.yml", tiny_train_options("tiny", small_train_dir, None))
    out = tmp_path / "beside.json"
    proc = run_cli("bench", "-opt", str(opt), "--iters", "2", "--warmup", "1", "--beside", "1", "--json", str(out),
                   "--force_yml", "train.precision=fp32", "train.channels_last=false", cwd=tmp_path)
    r = json.loads(out.read_text())
    assert r["copies"] == 2 and len(r["together"]) == 2 and r["alone"]["ms_per_iter"] > 0
    for copy in r["together"]:
        assert copy["slowdown"] == pytest.approx(copy["ms_per_iter"] / r["alone"]["ms_per_iter"])
        assert copy["threads"] >= 1
    assert "2 identical jobs at once" in proc.stdout and len(re.findall(r"\d\.\d\dx alone", proc.stdout)) == 2
    bad = run_cli("bench", "-opt", str(opt), "--beside", "-1", cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "--beside: -1 copies" in bad.stderr


def test_bench_reads_no_data_and_takes_precision(tmp_path: Path, root: Path) -> None:
    """A BasicSR file whose DIV2K folders do not exist here: bench times a synthetic batch and needs none."""
    proc = run_cli("bench", "-opt", str(root / "options" / "train" / "train_MSRResNet_x4.yml"), "--iters", "1",
                   "--warmup", "0", "--infer-size", "0", "--precision", "fp32", "--json", str(tmp_path / "r.json"),
                   "--force_yml", "datasets.train.batch_size_per_gpu=1", "accelerator=cpu", cwd=tmp_path)
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["precision"] == "fp32" and r["choices"]["precision"]["requested"] == "fp32"
    assert r["choices"]["channels_last"]["requested"] == "auto" and "measured on this CPU" in proc.stdout


def test_bench_remeasure_times_the_cached_choice_again(tmp_path: Path, small_train_dir: Path) -> None:
    """The first run measures and caches; the next reads the cache; ``--remeasure`` times it again and replaces it."""
    opt = write_options(tmp_path / "tiny.yml", tiny_train_options("tiny", small_train_dir, None))
    env = {"ANYSR_CACHE_DIR": str(tmp_path / "cache")}
    args = ("bench", "-opt", str(opt), "--iters", "1", "--warmup", "0", "--infer-size", "0", "--precision", "fp32",
            "--force_yml", "train.channels_last=auto")  # the tiny file fixes it: left open, it is measured
    fresh = re.compile(r"measured on this CPU for this network in \d+\.\d s")
    cached = re.compile(r"measured on \d{4}-\d\d-\d\d [\d:]+ on this CPU for this network")
    first = run_cli(*args, cwd=tmp_path, env=env)
    assert fresh.search(first.stdout + first.stderr) and "--remeasure" in first.stdout + first.stderr
    stored = json.loads((tmp_path / "cache" / "choices.json").read_text())
    again = run_cli(*args, cwd=tmp_path, env=env)
    assert cached.search(again.stdout + again.stderr) and not fresh.search(again.stdout + again.stderr)
    remeasured = run_cli(*args, "--remeasure", cwd=tmp_path, env=env)
    assert fresh.search(remeasured.stdout + remeasured.stderr)
    replaced = json.loads((tmp_path / "cache" / "choices.json").read_text())
    assert replaced.keys() == stored.keys()  # the same entry, measured anew


def test_flop_count_is_the_arithmetic() -> None:
    net = nn.Sequential(nn.Conv2d(4, 6, 3, padding=1), nn.Conv2d(6, 6, (1, 3), padding=(0, 1), groups=3),
                        nn.Flatten(2), nn.Linear(25, 7))
    flops, shape = forward_flops(net, (2, 4, 5, 5))
    macs = 2 * 25 * 6 * 4 * 9 + 2 * 25 * 6 * 2 * 3 + 2 * 6 * 7 * 25
    assert (flops, shape) == (2 * macs, (2, 6, 7))
    assert input_channels(net) == 4 and input_channels(nn.Identity()) == 3
    assert all(p.device.type == "cpu" for p in net.parameters())  # the network itself is untouched


def test_flop_count_falls_back_to_the_cpu() -> None:
    class NeedsData(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x) * float(x.sum() >= 0)  # reads a value: impossible on the meta device

    assert forward_flops(NeedsData(), (1, 1, 3, 3)) == (2 * 9 * 2, (1, 2, 3, 3))


def test_bench_errors_name_the_culprit(tmp_path: Path, small_train_dir: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    opt = write_options(tmp_path / "tiny.yml", tiny_train_options("tiny", small_train_dir, None))
    assert main(["bench", "-opt", str(opt), "--iters", "0"]) == 2
    assert "--iters (0)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--help"])
    assert exc.value.code == 0 and "--infer-size" in capsys.readouterr().out
    with pytest.raises(OptionError, match=r"datasets\.train\.gt_size"):
        _train_crop(freeze({"datasets": {"train": {"gt_size": None, "batch_size_per_gpu": 2}}}))
    with pytest.raises(OptionError, match="exactly one train dataset"):
        _train_crop(freeze({"datasets": {"val": {}}}))

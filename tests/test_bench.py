"""``anysr bench``: it runs, its numbers are sane, its FLOP count is the arithmetic (no timing thresholds)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli, tiny_train_options, write_options
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
    for n in ("-1", "17", "50"):  # 50 once started 51 processes
        bad = run_cli("bench", "-opt", str(opt), "--beside", n, cwd=tmp_path, check=False)
        assert bad.returncode == 2 and f"--beside: {n} copies; give a number from 1 to 16" in bad.stderr, bad.stderr
    big = run_cli("bench", "-opt", str(opt), "--infer-size", "20000", "--iters", "1", "--warmup", "0", cwd=tmp_path,
                  check=False)
    assert big.returncode != 0 and "--infer-size 20000: bench times one untiled image of at most 4096" in big.stderr
    assert "Traceback" not in big.stderr


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_bench_beside_ends_its_copies_on_sigterm(tmp_path: Path, small_train_dir: Path) -> None:
    """SIGTERM to `bench --beside` ends every copy within seconds and leaves no temporary folder."""
    opt = write_options(tmp_path / "tiny.yml", tiny_train_options("tiny", small_train_dir, None))
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    parent = subprocess.Popen([sys.executable, "-m", "anysr", "bench", "-opt", str(opt), "--iters", "100000",
                               "--warmup", "0", "--beside", "1"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    children: list[int] = []
    while not children and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.5)
        children = [int(c) for c in Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()]
    assert children, "bench --beside started no copy"
    parent.send_signal(signal.SIGTERM)
    _, err = parent.communicate(timeout=60)
    assert parent.returncode != 0 and "stopped by SIGTERM; its copies were ended" in err and "Traceback" not in err
    time.sleep(0.5)
    assert not [c for c in children if Path(f"/proc/{c}").exists() and
                "Z" not in Path(f"/proc/{c}/stat").read_text().split(")")[1][:3]], "a copy runs on"
    assert not list(tmp_path.glob("anysr-beside-*")), "the temporary folder was left behind"


def test_bench_reads_no_data_and_takes_precision(tmp_path: Path, root: Path) -> None:
    """A BasicSR file whose DIV2K folders do not exist here: bench times a synthetic batch and needs none."""
    proc = run_cli("bench", "-opt", str(root / "options" / "train" / "train_MSRResNet_x4.yml"), "--iters", "1",
                   "--warmup", "0", "--infer-size", "0", "--precision", "fp32", "--json", str(tmp_path / "r.json"),
                   "--force_yml", "datasets.train.batch_size_per_gpu=1", "accelerator=cpu", cwd=tmp_path)
    r = json.loads((tmp_path / "r.json").read_text())
    assert r["precision"] == "fp32" and r["choices"]["precision"]["requested"] == "fp32"
    assert r["choices"]["channels_last"]["requested"] == "auto" and "measured in " in proc.stdout


def test_remeasure_times_a_cached_choice_again(tmp_path: Path, small_train_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached choice is read back; with ANYSR_REMEASURE (what ``anysr bench --remeasure`` sets for its workers) it
    is timed again. In-process and on a seeded cache, so a busy machine (whose measurements are provisional, not
    cached) cannot change the answer."""
    from anysr.accelerators import calibrate
    from anysr.accelerators.precision import Variant

    monkeypatch.setenv("ANYSR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("ANYSR_REMEASURE", raising=False)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 3, 3, padding=1))
    shape, variants = (1, 3, 8, 8), [Variant("fp32", False), Variant("fp32", True)]
    key = calibrate.fingerprint(net, shape, True, variants)
    calibrate._write_cache(key, {"best": variants[1].label(), "timings": "seeded", "measured": "2026-01-01 00:00:00"})
    chosen, reason = calibrate.fastest(net, shape, variants, train=True)
    assert chosen == variants[1] and "seeded" in reason and "--remeasure" in reason
    monkeypatch.setenv("ANYSR_REMEASURE", "1")
    _, reason = calibrate.fastest(net, shape, variants, train=True)
    assert "seeded" not in reason and re.search(r"^measured in \d+\.\d s", reason), reason
    monkeypatch.delenv("ANYSR_REMEASURE")
    opt = write_options(tmp_path / "tiny.yml", tiny_train_options("tiny", small_train_dir, None))
    assert main(["bench", "-opt", str(opt), "--iters", "1", "--warmup", "0", "--infer-size", "0",
                 "--remeasure"]) == 0
    assert os.environ.get("ANYSR_REMEASURE") == "1"  # set before the workers start: they inherit it


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

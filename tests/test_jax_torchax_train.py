"""``anysr train`` with ``accelerator: xla`` through torchax, end to end (run in the JAX venv: ``.ci/jax.sh``).

Every run is ``python -m anysr train`` in a subprocess. Exact resume through torchax (train N, stop, resume to N+M ==
train N+M, bit for bit), a torchax checkpoint resumed on the CPU and the reverse (to fp32 tolerance), the persistent
compile cache hit by the second run, and BasicSR's EDSR-M file, shrunk, trained and validated through torchax.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchax")

import cv2  # noqa: E402
import torch  # noqa: E402
from conftest import ROOT, run_cli, tiny_train_options, write_options  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

pytestmark = pytest.mark.jax

N, M = 4, 4
TOL = 2e-5
_STATS = re.compile(r"xla stats: (\{.*\})")


def _train(root: Path, name: str, train_dir: Path, *, accelerator: str, total: int, resume: bool = False,
           cache: Path | None = None, devices: int = 1) -> str:
    """One ``anysr train`` of the tiny EDSR (global batch 4, saving every N) in a fresh process; its output."""
    opt = tiny_train_options(name, train_dir, None, total_iter=total)
    opt["accelerator"] = accelerator
    opt["logger"].update({"print_freq": 2, "save_checkpoint_freq": N})
    opt["train"]["scheduler"]["milestones"] = [N + 2]  # the restored scheduler halves the rate after N
    opt["train"]["grad_clip_norm"] = 0.5
    if accelerator == "xla":
        opt["xla"] = {"backend": "torchax", "matmul_precision": "highest"}
        opt["num_gpu"] = "auto"
        opt["datasets"]["train"]["batch_size_per_gpu"] = 4 // devices  # times the devices: still 4
    path = write_options(root / f"{name}_{accelerator}_{total}.yml", opt)
    env = {"XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
           "ANYSR_JAX_CACHE": str(cache or root / "jax_cache")}
    args = ["train", "-opt", str(path), *(["--auto_resume"] if resume else []), "--force_yml", f"path.root={root}"]
    proc = run_cli(*args, cwd=root, env=env, timeout=600)
    return proc.stdout + proc.stderr


def _exp(root: Path, name: str) -> Path:
    return root / "experiments" / name


def _weights(root: Path, name: str, it: int) -> dict[str, torch.Tensor]:
    return load_file(str(_exp(root, name) / "models" / f"net_g_{it}.safetensors"))


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], tol: float = TOL) -> None:
    assert a.keys() == b.keys() and any(k.startswith("params_ema.") for k in a)
    for k in a:
        diff = (a[k] - b[k]).abs().max().item()
        assert diff <= tol, f"{k}: max difference {diff:.2e} > {tol}"


def _stats(output: str) -> list[dict[str, Any]]:
    return [ast.literal_eval(m) for m in _STATS.findall(output)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, small_train_dir: Path) -> dict[str, Any]:
    """A straight torchax run of N+M iterations and one stopped at N (copied per test)."""
    root = tmp_path_factory.mktemp("torchax_train")
    straight = _train(root, "tx_straight", small_train_dir, accelerator="xla", total=N + M)
    first = _train(root, "tx_first", small_train_dir, accelerator="xla", total=N)
    return {"root": root, "train": small_train_dir, "straight": straight, "first": first,
            "reference": _weights(root, "tx_straight", N + M)}


def _copy(root: Path, src: str, dst: str) -> None:
    shutil.copytree(_exp(root, src), _exp(root, dst))


def _assert_resumed(output: str, root: Path, name: str) -> None:
    state = _exp(root, name) / "training_states" / f"{N}.state"
    assert f"resumed from {state} at iteration {N}" in output, output[-3000:]
    assert f"training iterations {N} -> {N + M}" in output, output[-3000:]


def test_runs_through_torchax_with_flat_compiles_and_the_cache(runs: dict[str, Any]) -> None:
    out = runs["straight"]
    assert "xla (torchax on JAX" in out and "compile cache" in out, out[-2000:]
    stats = _stats(out)
    assert len(stats) >= 3 and stats[0]["compiles"] >= 1
    assert len({s["compiles"] for s in stats}) == 1, stats  # every graph compiled by the first report
    # the second process (same graphs) found them in JAX's persistent cache
    assert _stats(runs["first"])[0]["persistent_cache"]["hits"] >= 1, runs["first"][-2000:]
    state = torch.load(_exp(runs["root"], "tx_straight") / "training_states" / f"{N + M}.state", weights_only=True)
    key = state["rng"]["device"]
    assert key.dtype == torch.int64 and key.shape == (2,)  # the step's JAX key is part of the training state
    opt_state = state["model"]["optimizers"]["net_g"]["state"][0]
    assert set(opt_state) == {"step", "exp_avg", "exp_avg_sq"} and float(opt_state["step"]) == N + M


def test_exact_resume_through_torchax(runs: dict[str, Any]) -> None:
    root = runs["root"]
    _copy(root, "tx_first", "tx_resumed")
    out = _train(root, "tx_resumed", runs["train"], accelerator="xla", total=N + M, resume=True)
    _assert_resumed(out, root, "tx_resumed")
    resumed = _weights(root, "tx_resumed", N + M)
    assert resumed.keys() == runs["reference"].keys()
    for k, v in runs["reference"].items():
        assert torch.equal(v, resumed[k]), k


def test_torchax_state_resumes_on_cpu(runs: dict[str, Any]) -> None:
    root = runs["root"]
    _copy(root, "tx_first", "tx_then_cpu")
    out = _train(root, "tx_then_cpu", runs["train"], accelerator="cpu", total=N + M, resume=True)
    _assert_resumed(out, root, "tx_then_cpu")
    _assert_close(runs["reference"], _weights(root, "tx_then_cpu", N + M))


def test_cpu_state_resumes_on_torchax(runs: dict[str, Any]) -> None:
    root = runs["root"]
    _train(root, "cpu_then_tx", runs["train"], accelerator="cpu", total=N)
    out = _train(root, "cpu_then_tx", runs["train"], accelerator="xla", total=N + M, resume=True)
    _assert_resumed(out, root, "cpu_then_tx")
    assert "xla (torchax on JAX" in out
    _assert_close(runs["reference"], _weights(root, "cpu_then_tx", N + M))


def test_two_virtual_devices_train_as_one(runs: dict[str, Any]) -> None:
    """num_gpu: auto over two virtual CPU devices, 2 samples each: the weights of one device with 4."""
    root = runs["root"]
    out = _train(root, "tx_two", runs["train"], accelerator="xla", total=N + M, devices=2)
    assert "over 2 device(s)" in out, out[-2000:]
    _assert_close(runs["reference"], _weights(root, "tx_two", N + M))


def test_basicsr_edsr_file_trains_and_validates(tmp_path: Path, small_train_dir: Path, small_val_dir: Path) -> None:
    """BasicSR's EDSR-M x2 file as it is, shrunk on the command line, with accelerator: xla through torchax."""
    over = [f"path.root={ROOT}", f"path.experiments_root={tmp_path / 'experiments' / 'run'}",
            f"datasets.train.dataroot_gt={small_train_dir}", "datasets.train.dataroot_lq=null",
            "datasets.train.lq_from_gt=true", "datasets.train.meta_info_file=null", "train.total_iter=2",
            "datasets.train.batch_size_per_gpu=2", "datasets.train.gt_size=32", "datasets.train.num_worker_per_gpu=0",
            "datasets.train.dataset_enlarge_ratio=1", f"datasets.val.dataroot_gt={small_val_dir}",
            f"datasets.val_2.dataroot_gt={small_val_dir}", "network_g.num_feat=8", "network_g.num_block=1",
            "val.val_freq=2", "logger.save_checkpoint_freq=2", "logger.use_tb_logger=false",
            "accelerator=xla", "xla.backend=torchax", "train.precision=auto"]
    path = ROOT / "options" / "train" / "train_EDSR_Mx2.yml"
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1", "ANYSR_JAX_CACHE": str(tmp_path / "cache")}
    proc = run_cli("train", "-opt", str(path), "--force_yml", *over, cwd=tmp_path, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    assert "xla (torchax on JAX" in out and "precision fp32 (auto:" in out, out[-3000:]  # auto: fp32 on JAX CPU
    assert re.search(r"psnr: \d", out, re.IGNORECASE), out[-3000:]
    exp = tmp_path / "experiments" / "run"
    weights = exp / "models" / "net_g_2.safetensors"
    assert weights.is_file() and (exp / "training_states" / "2.state").is_file()
    # anysr infer from the torchax-trained weights, tiled, through torchax and on the CPU: the same images
    outs = {}
    for accelerator in ("xla", "cpu"):
        outs[accelerator] = tmp_path / f"infer_{accelerator}"
        run_cli("infer", "--weights", str(weights), "-i", str(small_val_dir), "-o", str(outs[accelerator]),
                "--tile", "32", "--tile-pad", "8", "--accelerator", accelerator, "--precision", "fp32",
                "--no-progress", cwd=tmp_path, env=env, timeout=600)
    names = sorted(p.name for p in outs["cpu"].iterdir())
    assert names and names == sorted(p.name for p in outs["xla"].iterdir())
    for name in names:
        a = cv2.imread(str(outs["cpu"] / name), cv2.IMREAD_UNCHANGED).astype(int)
        b = cv2.imread(str(outs["xla"] / name), cv2.IMREAD_UNCHANGED).astype(int)
        assert a.shape == b.shape and abs(a - b).max() <= 1, name  # 8-bit rounding of fp32 results


def test_bad_backend_is_one_clear_line(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("bad", small_train_dir, None)
    opt.update({"accelerator": "xla", "xla": {"backend": "torchx"}})
    path = write_options(tmp_path / "bad.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path, check=False,
                   env={"ANYSR_JAX_CACHE": str(tmp_path / "cache")})
    assert proc.returncode != 0
    assert "xla.backend" in proc.stderr + proc.stdout and "Traceback" not in proc.stderr, proc.stderr[-2000:]


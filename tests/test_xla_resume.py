"""Resume across accelerators through the CLI: a state saved on XLA resumes on the CPU and the reverse, and
``--auto_resume`` picks up a one-device XLA state under SPMD (run in the XLA venv with PJRT_DEVICE=CPU).

Every run is ``python -m anysr train`` in a subprocess (each needs its own XLA runtime). The reference is a
straight eager-CPU run of N+M iterations; a run split at N on one accelerator and finished on another must
end with the same weights and EMA to float tolerance (XLA:CPU and eager CPU differ by rounding only).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
pytest.importorskip("torch_xla")

import torch  # noqa: E402
from conftest import run_cli, tiny_train_options, write_options  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

pytestmark = pytest.mark.xla

N, M = 6, 6  # save at N on one accelerator, resume to N + M on another
ATOL = 1e-5


def _options(name: str, train_dir: Path, *, accelerator: str, total: int, spmd_devices: int = 0) -> dict[str, Any]:
    """The tiny EDSR run (8 features, 1 block, 32-pixel crops, global batch 4), saving at N and at the end."""
    opt = tiny_train_options(name, train_dir, None, total_iter=total)
    opt["accelerator"] = accelerator
    opt["logger"].update({"print_freq": 3, "save_checkpoint_freq": N})
    opt["train"]["scheduler"]["milestones"] = [N + 2]  # the restored scheduler must halve the rate after N
    if spmd_devices:
        opt.update({"num_gpu": "auto", "xla": {"spmd": True}})
        opt["datasets"]["train"]["batch_size_per_gpu"] = 4 // spmd_devices  # times the devices: still 4
    return opt


def _train(root: Path, name: str, train_dir: Path, *, accelerator: str, total: int, resume: bool = False,
           spmd_devices: int = 0, cpu_ranks: int = 0) -> str:
    """One ``anysr train`` in a fresh process; returns its console output (the log goes there too)."""
    opt = _options(name, train_dir, accelerator=accelerator, total=total, spmd_devices=spmd_devices)
    if cpu_ranks:  # torch.multiprocessing.spawn of gloo ranks, the global batch still 4
        opt["num_gpu"] = cpu_ranks
        opt["datasets"]["train"]["batch_size_per_gpu"] = 4 // cpu_ranks
    path = write_options(root / f"{name}_{accelerator}_{total}.yml", opt)
    env = {"PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(max(spmd_devices, 1))}
    args = ["train", "-opt", str(path), *(["--auto_resume"] if resume else []), "--force_yml", f"path.root={root}"]
    proc = run_cli(*args, cwd=root, env=env, timeout=300)
    return proc.stdout + proc.stderr


def _exp(root: Path, name: str) -> Path:
    return root / "experiments" / name


def _weights(root: Path, name: str, it: int) -> dict[str, torch.Tensor]:
    return load_file(str(_exp(root, name) / "models" / f"net_g_{it}.safetensors"))


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and any(k.startswith("params_ema.") for k in a)
    for k in a:
        diff = (a[k] - b[k]).abs().max().item()
        assert diff <= ATOL, f"{k}: max difference {diff:.2e} > {ATOL}"


def _assert_resumed(output: str, root: Path, name: str) -> None:
    """The resumed process loaded the state of iteration N and trained only N -> N + M."""
    state = _exp(root, name) / "training_states" / f"{N}.state"
    assert f"resumed from {state} at iteration {N}" in output, output[-3000:]
    assert f"training iterations {N} -> {N + M}" in output, output[-3000:]
    final = torch.load(_exp(root, name) / "training_states" / f"{N + M}.state", weights_only=True)
    assert final["iter"] == N + M


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, small_train_dir: Path) -> dict[str, Any]:
    """The straight eager-CPU reference (N+M) and a one-device XLA run stopped at N (copied per test)."""
    root = tmp_path_factory.mktemp("xla_resume")
    _train(root, "cpu_straight", small_train_dir, accelerator="cpu", total=N + M)
    out = _train(root, "xla_first", small_train_dir, accelerator="xla", total=N)
    assert "xla (CPU) rank 0/1" in out, out[-2000:]
    assert (_exp(root, "xla_first") / "training_states" / f"{N}.state").is_file()
    return {"root": root, "train": small_train_dir, "reference": _weights(root, "cpu_straight", N + M)}


def _copy_experiment(root: Path, src: str, dst: str) -> None:
    """Continue ``src`` under another name (the name is only the folder; nothing inside refers to it)."""
    shutil.copytree(_exp(root, src), _exp(root, dst))


def test_xla_state_resumes_on_cpu(runs: dict[str, Any]) -> None:
    root = runs["root"]
    _copy_experiment(root, "xla_first", "xla_then_cpu")
    out = _train(root, "xla_then_cpu", runs["train"], accelerator="cpu", total=N + M, resume=True)
    _assert_resumed(out, root, "xla_then_cpu")
    _assert_close(runs["reference"], _weights(root, "xla_then_cpu", N + M))


def test_cpu_state_resumes_on_xla(runs: dict[str, Any]) -> None:
    root = runs["root"]
    _train(root, "cpu_then_xla", runs["train"], accelerator="cpu", total=N)
    out = _train(root, "cpu_then_xla", runs["train"], accelerator="xla", total=N + M, resume=True)
    _assert_resumed(out, root, "cpu_then_xla")
    assert "xla (CPU) rank 0/1" in out
    _assert_close(runs["reference"], _weights(root, "cpu_then_xla", N + M))


def test_spmd_auto_resumes_one_device_state(runs: dict[str, Any]) -> None:
    root = runs["root"]
    _copy_experiment(root, "xla_first", "xla_then_spmd")
    out = _train(root, "xla_then_spmd", runs["train"], accelerator="xla", total=N + M, resume=True,
                 spmd_devices=2)
    _assert_resumed(out, root, "xla_then_spmd")
    assert "SPMD over 2 devices" in out
    _assert_close(runs["reference"], _weights(root, "xla_then_spmd", N + M))


def test_spawned_cpu_ranks_auto_resume_xla_state(runs: dict[str, Any]) -> None:
    """launcher spawn: two gloo CPU ranks (batch 2 each) continue the one-device XLA run."""
    root = runs["root"]
    _copy_experiment(root, "xla_first", "xla_then_gloo")
    out = _train(root, "xla_then_gloo", runs["train"], accelerator="cpu", total=N + M, resume=True, cpu_ranks=2)
    _assert_resumed(out, root, "xla_then_gloo")
    assert "cpu rank 0/2" in out
    _assert_close(runs["reference"], _weights(root, "xla_then_gloo", N + M))

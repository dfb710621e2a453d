"""Launch planning and the torch.distributed accelerators (main env: no torch_xla, no GPU needed).

Hardware is faked by monkeypatching the probes in ``anysr.accelerators.launcher``; the gloo test is real:
two spawned CPU ranks through ``launch()``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from anysr.accelerators import create_accelerator, launch, resolve_plan
from anysr.accelerators.base import LaunchPlan
from anysr.accelerators.torch_dist import env_world, slurm_world
from anysr.errors import AcceleratorError

K = importlib.import_module("anysr.accelerators.kinds")  # the table of kinds and its hardware probes
X = importlib.import_module("anysr.accelerators.xla_plan")
_REAL_FIND_SPEC = importlib.util.find_spec


def _fake_hardware(monkeypatch: pytest.MonkeyPatch, *, cuda: int = 0, mps: bool = False, xla: bool = False,
                   pjrt: str | None = None, cores: int = 8, torchax: bool = False) -> None:
    """Pretend this machine has ``cuda`` GPUs, MPS, torch_xla (and PJRT_DEVICE), ``cores`` CPUs, torchax + jax."""
    monkeypatch.setattr(K, "cuda_count", lambda: cuda)
    monkeypatch.setattr(K, "mps_available", lambda: mps)
    monkeypatch.setattr(K, "cpu_cores", lambda: cores)

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "torch_xla":
            return object() if xla else None
        if name in ("torchax", "jax"):
            return object() if torchax else None
        return _REAL_FIND_SPEC(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(X.glob, "glob", lambda pattern: [])  # no TPU device files
    for var in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "TPU_WORKER_HOSTNAMES", "TPU_VISIBLE_CHIPS",
                "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    if pjrt:
        monkeypatch.setenv("PJRT_DEVICE", pjrt)


# ---------------------------------------------------------------------------------------------- errors
def test_unknown_accelerator_suggests(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_hardware(monkeypatch)
    with pytest.raises(AcceleratorError, match=r"accelerator: 'cdua' is not one of .*did you mean 'cuda'"):
        resolve_plan("cdua")


@pytest.mark.parametrize(("kind", "words"), [
    ("cuda", ["cuda was asked for", "CUDA_VISIBLE_DEVICES", "accelerator: cpu"]),
    ("mps", ["mps was asked for", "accelerator: cpu"]),
    ("xla", ["torch_xla is not installed", "pip install", "accelerator: cpu"]),
])
def test_missing_device_kind(monkeypatch: pytest.MonkeyPatch, kind: str, words: list[str]) -> None:
    _fake_hardware(monkeypatch)
    with pytest.raises(AcceleratorError) as info:
        resolve_plan(kind)
    for word in words:
        assert word in str(info.value)


def test_too_many_cuda_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_hardware(monkeypatch, cuda=2)
    with pytest.raises(AcceleratorError, match=r"num_gpu: 4 CUDA devices asked for, 2 visible.*auto"):
        resolve_plan("cuda", 4)


def test_too_many_cpu_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_hardware(monkeypatch, cores=2)
    with pytest.raises(AcceleratorError, match="num_gpu: 3 CPU ranks asked for but this machine has 2 cores"):
        resolve_plan("cpu", 3)


@pytest.mark.parametrize("bad", [-1, 1.5, "two", True])
def test_bad_num_gpu(monkeypatch: pytest.MonkeyPatch, bad: Any) -> None:
    _fake_hardware(monkeypatch)
    with pytest.raises(AcceleratorError, match=r"num_gpu: .* is not 'auto' or a whole number >= 0"):
        resolve_plan("cpu", bad)


def test_precision_and_launcher_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_hardware(monkeypatch, mps=True)
    with pytest.raises(AcceleratorError, match="train.precision: fp16 on the CPU.*bf16"):
        resolve_plan("cpu", precision="fp16")
    with pytest.raises(AcceleratorError, match="train.precision: 'fp8' is not one of auto, fp32, bf16, fp16"):
        resolve_plan("cpu", precision="fp8")
    with pytest.raises(AcceleratorError, match="--launcher: 'mpi' is not one of"):
        resolve_plan("cpu", launcher="mpi")
    with pytest.raises(AcceleratorError, match="train.compile: torch.compile is supported here on cpu and"):
        resolve_plan("mps", compile=True)
    with pytest.raises(AcceleratorError, match="num_gpu: 2 asked for on mps.*num_gpu: 1"):
        resolve_plan("mps", 2)


@pytest.mark.parametrize("count", [2, 3, 7])
def test_xla_count_in_between(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    _fake_hardware(monkeypatch, xla=True, pjrt="TPU")
    with pytest.raises(AcceleratorError) as info:
        resolve_plan("xla", count)
    text = str(info.value)
    assert f"num_gpu: {count} XLA devices" in text
    assert "TPU_VISIBLE_CHIPS" in text and "TPU_PROCESS_BOUNDS" in text and "num_gpu: auto" in text


def test_xla_plans_without_touching_torch_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_hardware(monkeypatch, xla=True, pjrt="CPU")
    monkeypatch.delitem(sys.modules, "torch_xla", raising=False)
    plan = resolve_plan("auto", "auto", precision="bf16")
    assert (plan.accelerator, plan.launcher, plan.precision) == ("xla", "xla", "bf16")
    assert resolve_plan("xla", 1).nprocs == 1
    assert resolve_plan("xla", "auto", spmd=True).launcher == "none"
    with pytest.raises(AcceleratorError, match="train.precision: fp16 is not supported on XLA.*bf16"):
        resolve_plan("xla", precision="fp16")
    with pytest.raises(AcceleratorError, match="train.compile: true is not used on XLA"):
        resolve_plan("xla", compile=True)
    assert "torch_xla" not in sys.modules


# ---------------------------------------------------------------------------------------------- picking
@pytest.mark.parametrize(("hw", "expected"), [
    ({"xla": True, "pjrt": "TPU", "cuda": 2, "mps": True}, "xla"),
    ({"xla": True, "cuda": 2, "mps": True}, "cuda"),  # torch_xla, but no PJRT_DEVICE and no TPU
    ({"cuda": 1, "mps": True}, "cuda"),
    ({"mps": True}, "mps"),
    ({}, "cpu"),
])
def test_auto_order(monkeypatch: pytest.MonkeyPatch, hw: dict[str, Any], expected: str) -> None:
    _fake_hardware(monkeypatch, **hw)
    assert resolve_plan("auto").accelerator == expected


def test_auto_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_hardware(monkeypatch, cuda=4)
    plan = resolve_plan("auto", "auto")
    assert (plan.accelerator, plan.nprocs, plan.launcher) == ("cuda", 4, "spawn") and plan.master_port
    assert resolve_plan("cuda", 1).launcher == "none"
    _fake_hardware(monkeypatch)
    assert resolve_plan("cpu", "auto").nprocs == 1
    assert resolve_plan("cpu", 2).launcher == "spawn"


# ---------------------------------------------------------------------------------------------- launchers
def test_torchrun_environment_is_detected(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_hardware(monkeypatch, cuda=8)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert env_world() == (3, 4, 1)
    plan = resolve_plan("cuda", 8)  # torchrun decides the count: num_gpu is not checked against it
    assert (plan.launcher, plan.nprocs) == ("torchrun", 1)
    acc = create_accelerator(LaunchPlan("cpu", launcher="torchrun"))
    assert acc.strategy._world() == (3, 4, 1)  # noqa: SLF001 - the worker's view of the torchrun world
    monkeypatch.delenv("RANK")
    assert env_world() is None
    assert resolve_plan("cpu", 1).launcher == "none"


def test_slurm(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_hardware(monkeypatch)
    for var in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        monkeypatch.delenv(var, raising=False)
    assert resolve_plan("cpu", 1, launcher="slurm").launcher == "slurm"
    with pytest.raises(AcceleratorError, match="--launcher slurm: SLURM_PROCID is not set; start"):
        slurm_world()
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    assert slurm_world() == (5, 8, 1)


def test_slurm_without_master_addr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    acc = create_accelerator(LaunchPlan("cpu", launcher="slurm"))
    with pytest.raises(AcceleratorError, match=r"set MASTER_ADDR to the first node's host name.*scontrol"):
        acc.setup()


def test_single_process_launch_runs_in_process() -> None:
    result = launch(LaunchPlan("cpu"), _describe, "x")
    assert result == ("x", 0, 1, "cpu")


def _describe(acc: Any, tag: str) -> tuple[str, int, int, str]:
    return tag, acc.rank, acc.world_size, acc.device.type


# ------------------------------------------------------------------------------------------ real gloo ranks
class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.relu(self.a(x)))


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return torch.rand(4, 3, 6, 6, generator=g), torch.rand(4, 3, 6, 6, generator=g)


def _gloo_worker(acc: Any, out: str) -> None:
    """Runs in each spawned rank: collectives, then one DDP step on this rank's half of the batch."""
    r, n = acc.rank, acc.world_size
    summed = acc.strategy.all_reduce(torch.tensor([float(r + 1)]), "sum")
    mean = acc.strategy.all_reduce(torch.tensor([float(r + 1)]), "mean")
    biggest = acc.strategy.all_reduce(torch.tensor([float(r + 1)]), "max")
    told = acc.strategy.broadcast_object({"from": r, "cfg": [1, 2]} if r == 0 else None)
    gathered = acc.strategy.all_gather_object(f"rank{r}")
    acc.strategy.barrier()

    acc.manual_seed(11)
    net = acc.prepare_model(_Net())
    x, y = _batch()
    half = x.shape[0] // n
    loss = F.mse_loss(net(x[r * half:(r + 1) * half]), y[r * half:(r + 1) * half])
    acc.precision.backward(loss)
    grads = {k: p.grad.clone() for k, p in acc.strategy.unwrap(net).named_parameters()}
    written: list[Any] = []
    acc.save(lambda: {"rank": r}, written.append)
    torch.save({"rank": r, "world": n, "sum": summed, "mean": mean, "max": biggest, "told": told,
                "gathered": gathered, "wrapped": type(net).__name__, "grads": grads, "wrote": written},
               Path(out) / f"rank{r}.pt")


def test_two_gloo_ranks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    plan = resolve_plan("cpu", 2, launcher="auto")
    assert plan.launcher == "spawn" and plan.nprocs == 2
    assert launch(plan, _gloo_worker, str(tmp_path)) is None
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    torch.manual_seed(11)
    ref = _Net()
    x, y = _batch()
    F.mse_loss(ref(x), y).backward()
    for r, got in enumerate(ranks):
        assert (got["rank"], got["world"]) == (r, 2)
        assert got["sum"].item() == 3.0 and got["mean"].item() == 1.5 and got["max"].item() == 2.0
        assert got["told"] == {"from": 0, "cfg": [1, 2]}
        assert got["gathered"] == ["rank0", "rank1"]
        assert got["wrapped"] == "DistributedDataParallel"
        assert got["wrote"] == ([{"rank": 0}] if r == 0 else [])  # only rank 0 writes
        for name, p in ref.named_parameters():
            torch.testing.assert_close(got["grads"][name], p.grad, rtol=1e-5, atol=1e-6)


def test_two_slurm_tasks(tmp_path: Path) -> None:
    """What ``srun --ntasks 2 ... --launcher slurm`` does on one node: two processes, SLURM variables."""
    port = str(K.free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                              os.environ.get("PYTHONPATH", "")])}
        for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(var, None)
        procs.append(subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "slurm", str(tmp_path)],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert [(g["rank"], g["world"]) for g in ranks] == [(0, 2), (1, 2)]
    assert all(g["sum"].item() == 3.0 and g["told"] == {"from": 0, "cfg": [1, 2]} for g in ranks)


if __name__ == "__main__":
    if sys.argv[1] == "slurm":  # one SLURM task (see test_two_slurm_tasks)
        launch(resolve_plan("cpu", 1, launcher="slurm"), _gloo_worker, sys.argv[2])


# ---------------------------------------------------------------------------------------------- XLA backends
@pytest.mark.parametrize(("xla", "matches", "torchax", "asked", "chosen"), [
    (True, True, True, "auto", "torch_xla"),  # torch_xla built for this torch: it stays
    (True, False, True, "auto", "torchax"),  # torch newer than torch_xla supports: torchax
    (False, False, True, "auto", "torchax"),
    (True, False, False, "auto", "torch_xla"),  # nothing else there: torch_xla says itself what does not fit
    (True, True, True, "torchax", "torchax"),
])
def test_xla_backend_choice(monkeypatch: pytest.MonkeyPatch, xla: bool, matches: bool, torchax: bool, asked: str,
                            chosen: str) -> None:
    _fake_hardware(monkeypatch, xla=xla, torchax=torchax, pjrt="CPU")
    B = importlib.import_module("anysr.accelerators.xla_backends")
    monkeypatch.setattr(B, "torch_xla_matches_torch", lambda: matches)
    plan = resolve_plan("xla", 1, xla_backend=asked)
    assert plan.extra["backend"] == chosen
    if chosen == "torchax":  # one process over the JAX devices (num_gpu 1: the first only)
        assert (plan.launcher, plan.nprocs, plan.extra["all_devices"]) == ("none", 1, False)


def test_xla_backend_errors_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_hardware(monkeypatch, torchax=True, pjrt="CPU")
    with pytest.raises(AcceleratorError, match=r"xla.backend: torch_xla is not installed here; pip install"):
        resolve_plan("xla", 1, xla_backend="torch_xla")
    with pytest.raises(AcceleratorError, match=r"xla.backend: 'jax' is not one of auto, torch_xla, torchax"):
        resolve_plan("xla", 1, xla_backend="jax")
    with pytest.raises(AcceleratorError, match=r"num_gpu: 2 with xla.backend torchax: set num_gpu: auto"):
        resolve_plan("xla", 2, xla_backend="torchax")
    with pytest.raises(AcceleratorError, match=r"xla.spmd: true is torch_xla's mode"):
        resolve_plan("xla", "auto", spmd=True, xla_backend="torchax")

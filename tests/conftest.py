"""Shared fixtures: the repository root, a small real training set, option-file writers, float tolerances.

Float tolerances (one place, used by every comparison with data made elsewhere)
------------------------------------------------------------------------------
Results computed on *this* machine and compared with *this* machine stay exact (bit-identical resume, the same
weights from two identical runs, two data-loader worker counts): those are one kernel against itself.

Results compared with fixtures made on another machine or by another library (BasicSR, reference
implementations, published tables) cannot be exact: convolution, matmul and reduction kernels sum in an order
that depends on the CPU's vector width (AVX2 vs AVX-512 vs none, ``ATEN_CPU_CAPABILITY``), on oneDNN's kernel
choice and on the library version. fp32 rounds at u = 2**-24 ~ 6e-8 relative; a K-term sum may move by about
K * u times the sum of its absolute terms. The fixture networks have at most a few hundred terms per output
(64 channels x 3 x 3 = 576) over a handful of layers with activations of magnitude <= ~10, so differences stay
far below 1e-5 (observed: 5.2e-8 between an AVX2 and an AVX-512 CPU). ``FIXTURE_TOL`` is that bound; metric
values in dB get ``PSNR_TOL`` (1e-4 dB is about 2e-5 relative error in the MSE).

``.ci/run`` runs the suite a second time as an AVX2 CPU would compute (``ATEN_CPU_CAPABILITY=avx2``,
``ONEDNN_MAX_CPU_ISA=AVX2``), so an exact comparison across kernels cannot slip in unnoticed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from anysr.plugins import load_plugins

load_plugins()  # the options read the registries these packages fill (as the command line does before validating)

ROOT = Path(__file__).resolve().parents[1]
# The XLA modules need torch_xla (the second environment, `make test-xla`): not collected without it, rather than
# listed as skipped in every run of the main suite.
collect_ignore_glob = [] if importlib.util.find_spec("torch_xla") else ["test_xla*.py"]
# The torchax modules need torchax and jax (the JAX environment, `.ci/jax.sh`): likewise not collected without them.
if not (importlib.util.find_spec("torchax") and importlib.util.find_spec("jax")):
    collect_ignore_glob.append("test_jax*.py")
DATASETS = ROOT / "datasets"
# The fixture generators and their shared module (tools/fixtures/fixture_kit.py: the seeded weights both sides
# rebuild) are importable by name from every test module.
FIXTURE_TOOLS = ROOT / "tools" / "fixtures"
if str(FIXTURE_TOOLS) not in sys.path:
    sys.path.insert(0, str(FIXTURE_TOOLS))
# A CPU run's thread count is each process's fair share of the cores here, not also reduced by what else the
# machine runs at that moment (cpu_share.py): runs compared bit for bit must use the same count. The tests of that
# choice (tests/test_cpu_share.py) set ANYSR_THREADS=auto themselves.
os.environ.setdefault("ANYSR_THREADS", "fair")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest -n N: N test processes share the cores, so each (and every run it starts) takes one thread; two
    # processes with a thread per core each would slow each other several times over (benchmarks/contention.md).
    os.environ["ANYSR_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
FIXTURE_TOL = {"rtol": 1e-5, "atol": 1e-5}  # fp32 results vs fixtures made with other kernels (see above)
PSNR_TOL = 1e-4  # dB


@pytest.fixture(scope="session", autouse=True)
def _private_choice_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Measured precision / memory-format choices go to a per-session folder, not the user's ~/.cache; no download."""
    os.environ["ANYSR_CACHE_DIR"] = str(tmp_path_factory.mktemp("anysr_cache"))
    # Each test process its own job claims (cpu_share.JobClaim): the other xdist worker's runs are "other programs"
    # measured on /proc, never claimed peers that would change a thread count a test compares.
    os.environ["ANYSR_JOBS_DIR"] = str(tmp_path_factory.mktemp("anysr_jobs"))
    # Standard weight files (VGG, LPIPS, ...) are never downloaded by a test, nor read from the user's torch hub
    # cache: an empty one per session (tests/test_weights_resolver.py sets its own and serves the files itself).
    os.environ["ANYSR_OFFLINE"] = "1"
    os.environ["TORCH_HOME"] = str(tmp_path_factory.mktemp("torch_home"))
    os.environ.pop("ANYSR_WEIGHTS_MIRROR", None)


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def small_train_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Eight real T91 images (a real training set, small enough for seconds-long runs)."""
    out = tmp_path_factory.mktemp("t91_small")
    for p in sorted((DATASETS / "T91" / "HR").glob("*.png"))[:8]:
        shutil.copy(p, out / p.name)
    return out


@pytest.fixture(scope="session")
def small_val_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three Set5 images (one of them small) for validation."""
    out = tmp_path_factory.mktemp("set5_small")
    for name in ("bird", "butterfly", "woman"):
        shutil.copy(DATASETS / "Set5" / "HR" / f"{name}.png", out / f"{name}.png")
    return out


def tiny_train_options(name: str, train_dir: Path, val_dir: Path | None, *, total_iter: int = 6,
                       workers: int = 0, **extra: Any) -> dict[str, Any]:
    """A real but tiny training configuration (EDSR with 8 features, x2, 32-pixel crops)."""
    opt: dict[str, Any] = {
        "name": name, "model_type": "SRModel", "scale": 2, "accelerator": "cpu", "num_gpu": 1, "manual_seed": 7,
        "datasets": {"train": {"name": "tiny", "type": "PairedImageDataset", "dataroot_gt": str(train_dir),
                               "lq_from_gt": True, "io_backend": {"type": "disk"}, "gt_size": 32,
                               "use_hflip": True, "use_rot": True, "use_shuffle": True,
                               "num_worker_per_gpu": workers, "batch_size_per_gpu": 4,
                               "dataset_enlarge_ratio": 2}},
        "network_g": {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1,
                      "upscale": 2, "res_scale": 1, "img_range": 255.0, "rgb_mean": [0.4488, 0.4371, 0.4040]},
        "path": {"pretrain_network_g": None},
        # Pinned (not auto): the numbers of these runs must not depend on whether the CPU has native bf16.
        "train": {"precision": "fp32", "channels_last": False,
                  "ema_decay": 0.9, "optim_g": {"type": "Adam", "lr": 2e-3, "betas": [0.9, 0.99]},
                  "scheduler": {"type": "MultiStepLR", "milestones": [4], "gamma": 0.5},
                  "total_iter": total_iter, "warmup_iter": 2,
                  "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0, "reduction": "mean"}},
        "logger": {"print_freq": 2, "save_checkpoint_freq": 2, "use_tb_logger": False},
    }
    if val_dir is not None:
        opt["datasets"]["val"] = {"name": "val", "type": "PairedImageDataset", "dataroot_gt": str(val_dir),
                                  "lq_from_gt": True, "io_backend": {"type": "disk"}}
        opt["val"] = {"val_freq": 3, "save_img": False,
                      "metrics": {"psnr": {"type": "calculate_psnr", "crop_border": 2, "test_y_channel": True}}}
    for key, value in extra.items():
        section, _, sub = key.partition("__")
        if sub:
            opt.setdefault(section, {})[sub] = value
        else:
            opt[key] = value
    return opt


def write_options(path: Path, opt: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(opt, sort_keys=False))
    return path


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None, check: bool = True,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run ``python -m anysr ARGS`` as a user would; the repo is importable through PYTHONPATH."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.setdefault("OMP_NUM_THREADS", "2")
    if env:
        full_env.update(env)
    proc = subprocess.run([sys.executable, "-m", "anysr", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"anysr {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def kill_then_resume(path: Path, root: Path, name: str, *, after_states: int = 3) -> int:
    """Train ``path`` (``path.root`` = ``root``) in a subprocess, ``kill -9`` it once ``after_states`` training states
    of experiment ``name`` are on disk, then finish the run with ``--auto_resume``; returns how many states the
    killed run had written."""
    states = root / "experiments" / name / "training_states"
    proc = subprocess.Popen([sys.executable, "-m", "anysr", "train", "-opt", str(path), "--force_yml",
                             f"path.root={root}"], cwd=root, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(list(states.glob("*.state"))) < after_states:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    written = len(list(states.glob("*.state")))
    run_cli("train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={root}", cwd=root)
    return written


def saved_weights(exp: Path, it: int) -> dict[str, Any]:
    """The generator weights experiment ``exp`` saved at iteration ``it`` (``models/net_g_<it>.safetensors``)."""
    from safetensors.torch import load_file

    return load_file(str(exp / "models" / f"net_g_{it}.safetensors"))


def assert_same_weights(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Bit-identical state dicts (a run compared with itself on this machine), naming the first tensor that differs."""
    import torch

    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


def assert_seeded_samples(make: Any, order: list[tuple[int, int]], *, via_loader: tuple[str, ...]) -> dict:
    """A counter-seeded dataset (``ds[(index, seed)]``) gives the same sample for the same seed whatever the order,
    the dataset instance or the loader worker that reads it, and other samples for other seeds; ``make()`` builds
    the dataset, ``via_loader`` names the items compared after two loader workers. Returns the first reads."""
    from torch.utils.data import DataLoader, Subset

    ds = make()
    first = {ix: ds[ix] for ix in order}
    again = make()
    for ix in reversed(order):
        b = again[ix]
        for k, v in first[ix].items():
            assert torch.equal(v, b[k]) if torch.is_tensor(v) else v == b[k], f"{ix}: {k} differs"
    seeds = sorted({s for _, s in order})
    assert not torch.equal(ds[(0, seeds[0])][via_loader[0]], ds[(0, seeds[1])][via_loader[0]])
    assert ds[0]["seed"] == 0 and torch.equal(ds[0][via_loader[0]], ds[(0, 0)][via_loader[0]])
    for ix, b in zip(order, DataLoader(Subset(ds, order), batch_size=None, num_workers=2)):  # type: ignore[arg-type]
        for k in via_loader:
            assert torch.equal(b[k], first[ix][k]), f"{ix}: {k} differs in a loader worker"
        assert b["seed"] == ix[1]
    return first


_COMPARES_NUMBERS = ("FIXTURE_TOL", "PSNR_TOL", "tests/fixtures", "FIXTURES", '"fixtures"')


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``ANYSR_TEST_KERNELS_ONLY=1`` (``make test-avx2``): keep the modules that compare numbers with fixtures made
    elsewhere or between kernels (the point of running the suite again as an AVX2 CPU computes); options, CLI and
    report tests do not depend on the instruction set and ran once already."""
    if os.environ.get("ANYSR_TEST_KERNELS_ONLY") != "1":
        return
    keep, drop, seen = [], [], {}
    for item in items:
        path = Path(str(item.fspath))
        if path not in seen:
            seen[path] = any(marker in path.read_text(encoding="utf-8") for marker in _COMPARES_NUMBERS)
        (keep if seen[path] else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep

"""SIGTERM on XLA:CPU: the run finishes the step, syncs the pending graph, saves, exits 143; --auto_resume then
gives the weights of a run that was never stopped (run in the XLA venv with PJRT_DEVICE=CPU)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
pytest.importorskip("torch_xla")

import torch  # noqa: E402
from conftest import ROOT, run_cli, tiny_train_options, write_options  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

pytestmark = pytest.mark.xla


def _options(tmp_path: Path, name: str, train_dir: Path) -> Path:
    opt = tiny_train_options(name, train_dir, None, total_iter=5000)
    opt["accelerator"] = "xla"
    opt["logger"].update(print_freq=1, save_checkpoint_freq=100000)
    return write_options(tmp_path / f"{name}.yml", opt)


def test_sigterm_on_xla_saves_and_resumes_exactly(tmp_path: Path, small_train_dir: Path) -> None:
    path = _options(tmp_path, "xsig", small_train_dir)
    env = dict(os.environ, PYTHONPATH=str(ROOT), PJRT_DEVICE="CPU", OMP_NUM_THREADS="2")
    proc = subprocess.Popen([sys.executable, "-m", "anysr", "train", "-opt", str(path), "--force_yml",
                             f"path.root={tmp_path}"], cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    seen, deadline = 0, time.time() + 300
    while seen < 5 and time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += bool(re.search(r"iter:\s+\d+", line))
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    stop = int(re.search(r"SIGTERM: stopped after iteration (\d+) and saved", out).group(1))  # type: ignore[union-attr]
    end = stop + 2
    run_cli("train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
            f"train.total_iter={end}", cwd=tmp_path, env={"PJRT_DEVICE": "CPU"}, timeout=300)
    ref = _options(tmp_path, "xref", small_train_dir)
    run_cli("train", "-opt", str(ref), "--force_yml", f"path.root={tmp_path}", f"train.total_iter={end}",
            cwd=tmp_path, env={"PJRT_DEVICE": "CPU"}, timeout=300)
    a = load_file(str(tmp_path / "experiments" / "xsig" / "models" / f"net_g_{end}.safetensors"))
    b = load_file(str(tmp_path / "experiments" / "xref" / "models" / f"net_g_{end}.safetensors"))
    for k in a:  # XLA:CPU compiled twice (two processes) runs the same graphs: equal to float rounding
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)

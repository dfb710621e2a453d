"""What happens around a run: failing or killed ranks, a killed parent, signals, a second run in the same folder,
finished weights, bad data found before training, and the one-line messages for what users and machines cause.

Every run here is real (tiny EDSR x2 on real T91 images, CPU, 1 process or 2 gloo ranks) and started as a user
starts it, through the command line in a subprocess; signals are real signals.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from conftest import DATASETS, ROOT, run_cli, tiny_train_options, write_options
from safetensors.torch import load_file

from anysr.accelerators.launcher import _cause
from anysr.accelerators.process import Interrupted, StopSignals, WorkerExit
from anysr.engine import checkpoint as ckpt
from anysr.engine.report.history import History
from anysr.engine.training.runlock import RunLock
from anysr.errors import PEER_FAILED, CheckpointError, DataError, OptionError, describe_os_error

ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="2")  # as run_cli: same kernels, same sums


def _start(*args: str, cwd: Path, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "anysr", *args], cwd=cwd, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)  # type: ignore[call-overload]


def _wait_for(proc: subprocess.Popen[str], pattern: str, count: int = 1, timeout: float = 120) -> list[str]:
    """Read the process's output until ``pattern`` was seen ``count`` times; returns the lines read."""
    lines: list[str] = []
    deadline = time.time() + timeout
    assert proc.stdout is not None
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if sum(bool(re.search(pattern, x)) for x in lines) >= count:
            return lines
    raise AssertionError(f"'{pattern}' not seen {count} time(s):\n{''.join(lines)}")


def _finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def _long_run(tmp_path: Path, train_dir: Path, name: str, *, num_gpu: int = 1, **extra: object) -> Path:
    opt = tiny_train_options(name, train_dir, None, total_iter=5000)
    opt["num_gpu"] = num_gpu
    opt["logger"].update(print_freq=1, save_checkpoint_freq=100000)
    opt["train"]["scheduler"] = {"type": "MultiStepLR", "milestones": [4], "gamma": 0.5}
    for key, value in extra.items():
        opt["train" if key != "batch" else "datasets"][key] = value
    return write_options(tmp_path / f"{name}.yml", opt)


def _weights(tmp_path: Path, name: str, it: int) -> dict[str, torch.Tensor]:
    return load_file(str(tmp_path / "experiments" / name / "models" / f"net_g_{it}.safetensors"))


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k  # the same machine compared with itself: bit-exact


def _corrupt_body(src: Path, dst: Path) -> None:
    """A PNG whose header and end marker are intact but whose pixel data is damaged (found only by decoding)."""
    data = bytearray(src.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 64] = bytes(64)
    dst.write_bytes(bytes(data))


# ------------------------------------------------------------------------------------------ signals
@pytest.mark.slow
@pytest.mark.parametrize("num_gpu", [1, 2])
def test_sigterm_saves_and_resume_is_bit_exact(tmp_path: Path, small_train_dir: Path, num_gpu: int) -> None:
    path = _long_run(tmp_path, small_train_dir, "sig", num_gpu=num_gpu)
    proc = _start("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    _wait_for(proc, r"iter:\s+\d+", count=6)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    code, out = _finish(proc)
    assert time.time() - t0 < 30 and code == 128 + signal.SIGTERM, out
    found = re.search(r"SIGTERM: stopped after iteration (\d+) and saved (\S+); continue with --auto_resume", out)
    assert found and "Traceback" not in out, out
    stop = int(found.group(1))
    assert Path(found.group(2)).is_file()
    end = stop + 2
    run_cli("train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
            f"train.total_iter={end}", cwd=tmp_path)
    ref = _long_run(tmp_path, small_train_dir, "ref", num_gpu=num_gpu)
    run_cli("train", "-opt", str(ref), "--force_yml", f"path.root={tmp_path}", f"train.total_iter={end}",
            cwd=tmp_path)
    _same(_weights(tmp_path, "sig", end), _weights(tmp_path, "ref", end))


@pytest.mark.slow
def test_sigint_before_training_exits_at_once(tmp_path: Path, small_train_dir: Path) -> None:
    path = _long_run(tmp_path, small_train_dir, "early")
    proc = _start("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    _wait_for(proc, r"anysr training 'early'")
    proc.send_signal(signal.SIGINT)
    code, out = _finish(proc)
    assert code == 128 + signal.SIGINT and "Traceback" not in out, out
    assert not list((tmp_path / "experiments" / "early" / "models").glob("*.safetensors"))


def test_second_signal_aborts_at_once(tmp_path: Path) -> None:
    script = ("import os, signal, time\n"
              "from anysr.accelerators.process import StopSignals\n"
              "s = StopSignals().install()\n"
              "with s.graceful_section():\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    os.kill(os.getpid(), signal.SIGTERM)  # the same event delivered twice: ignored\n"
              "    assert s.signum == signal.SIGTERM\n"
              "    time.sleep(1.2)\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n"
              "    time.sleep(30)\n")
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 128 + signal.SIGINT and time.time() - t0 < 20
    assert "second SIGINT: stopping now without saving" in proc.stderr


def test_signal_outside_the_loop_raises() -> None:
    stop = StopSignals()
    with pytest.raises(Interrupted, match="interrupted by SIGTERM") as info:
        stop._handle(signal.SIGTERM, None)  # noqa: SLF001
    assert info.value.exit_code == 143


# ------------------------------------------------------------------------------------------ failing ranks
@pytest.mark.slow
def test_a_rank_that_fails_mid_run_ends_the_job(tmp_path: Path) -> None:
    train = tmp_path / "train"
    train.mkdir()
    for p in sorted((DATASETS / "T91" / "HR").glob("*.png"))[:6]:
        shutil.copy(p, train / p.name)
    _corrupt_body(DATASETS / "T91" / "HR" / "t10.png", train / "zz_broken.png")  # headers fine, pixels not
    path = _long_run(tmp_path, train, "fail", num_gpu=2)
    t0 = time.time()
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path, check=False,
                   timeout=300)
    assert proc.returncode == 2 and time.time() - t0 < 120, proc.stdout + proc.stderr
    # Native libraries may print their own diagnostics: libpng first ("libpng error: ..."), and now and then the
    # C++ runtime of the rank whose gloo connection the failing rank closed ("terminate called ...", then SIGABRT;
    # the parent still reports the error rank 0 told). anysr says one line.
    native = ("libpng", "terminate called")
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(native)]
    assert len(errors) == 1 and "zz_broken.png cannot be decoded" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_nan_on_two_ranks_is_told_once(tmp_path: Path, small_train_dir: Path) -> None:
    path = _long_run(tmp_path, small_train_dir, "nan", num_gpu=2)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "train.optim_g.lr=1e30",
                   "train.total_iter=6", "logger.save_checkpoint_freq=3", cwd=tmp_path, check=False)
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(errors) == 1 and "NaN or infinite" in errors[0], proc.stderr


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    kids = []
    for child in map(int, out):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmd:
            kids.append(child)
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("pgrep") is None, reason="Linux /proc")
def test_a_killed_rank_ends_the_job(tmp_path: Path, small_train_dir: Path) -> None:
    path = _long_run(tmp_path, small_train_dir, "killed", num_gpu=2)
    proc = _start("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    _wait_for(proc, r"iter:\s+\d+", count=3)
    workers = _children(proc.pid)
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    t0 = time.time()
    code, out = _finish(proc)
    assert code == 2 and time.time() - t0 < 30, out
    assert re.search(r"error: rank \d was killed by SIGKILL .*the other ranks were stopped", out), out
    assert not any(_alive(w) for w in workers)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("pgrep") is None, reason="Linux /proc")
def test_workers_die_with_their_parent(tmp_path: Path, small_train_dir: Path) -> None:
    path = _long_run(tmp_path, small_train_dir, "orphan", num_gpu=2)
    # as from a script: started in the background with SIGINT ignored
    proc = _start("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path,
                  preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    _wait_for(proc, r"iter:\s+\d+", count=3)
    workers = _children(proc.pid)
    assert len(workers) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers)
    models = tmp_path / "experiments" / "orphan" / "models"
    before = sorted(models.iterdir())
    time.sleep(1.0)
    assert sorted(models.iterdir()) == before  # nothing written after the parent died


# ------------------------------------------------------------------------------------------ the folder
@pytest.mark.slow
def test_one_run_per_experiment_folder(tmp_path: Path, small_train_dir: Path) -> None:
    path = _long_run(tmp_path, small_train_dir, "busy")
    first = _start("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    _wait_for(first, r"iter:\s+\d+", count=2)
    for extra in ([], ["--auto_resume"]):
        second = run_cli("train", "-opt", str(path), *extra, "--force_yml", f"path.root={tmp_path}", cwd=tmp_path,
                         check=False)
        assert second.returncode == 2, second.stdout + second.stderr
        assert re.search(rf"is in use by another anysr training \(pid {first.pid} on .*, started ", second.stderr)
    first.send_signal(signal.SIGTERM)
    code, out = _finish(first)
    assert code == 143
    stop = int(re.search(r"stopped after iteration (\d+)", out).group(1))  # type: ignore[union-attr]
    # released on exit (also after kill -9: the kernel drops the lock), so the run continues
    run_cli("train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
            f"train.total_iter={stop + 1}", cwd=tmp_path)


def test_run_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    with RunLock(tmp_path / "exp", what="training"):
        script = ("import sys\nfrom anysr.engine.training.runlock import RunLock\n"
                  "from anysr.errors import OptionError\n"
                  f"try:\n    RunLock({str(tmp_path / 'exp')!r}).acquire()\nexcept OptionError as e:\n"
                  "    print(e); sys.exit(3)\n")
        proc = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True)
        assert proc.returncode == 3 and f"pid {os.getpid()}" in proc.stdout
    proc = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True)
    assert proc.returncode == 0


def test_finished_weights_are_never_overwritten(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("done", small_train_dir, None, total_iter=4)
    path = write_options(tmp_path / "done.yml", opt)
    root = f"path.root={tmp_path}"
    run_cli("train", "-opt", str(path), "--force_yml", root, cwd=tmp_path)
    exp = tmp_path / "experiments" / "done"
    latest = (exp / "models" / "net_g_latest.safetensors").read_bytes()
    for state in (exp / "training_states").glob("*.state"):  # every state corrupt
        state.write_bytes(state.read_bytes()[:100])
    logs = sorted((exp / "log").iterdir())
    proc = run_cli("train", "-opt", str(path), "--force_yml", root, cwd=tmp_path, check=False)  # refused
    assert proc.returncode == 2 and "already holds training states" in proc.stderr, proc.stderr
    assert sorted((exp / "log").iterdir()) == logs  # a refused run leaves no (empty) log file behind
    proc = run_cli("train", "-opt", str(path), "--auto_resume", "--force_yml", root, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "holds trained weights (net_g_2.safetensors" in proc.stderr, proc.stderr
    assert "no usable training state is left" in proc.stderr and "--start-over" in proc.stderr
    assert "skipping training state" in "".join(p.read_text() for p in (exp / "log").glob("*.log"))
    shutil.rmtree(exp / "training_states")
    proc = run_cli("train", "-opt", str(path), "--force_yml", root, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "it holds no training state" in proc.stderr
    assert (exp / "models" / "net_g_latest.safetensors").read_bytes() == latest
    (exp / "notes.txt").write_text("lr 2e-3 was too high")  # the user's own files: not the run's to move
    shutil.copy(path, exp / "my_options.yml")
    run_cli("train", "-opt", str(path), "--start-over", "--force_yml", root, cwd=tmp_path)
    archived = list(exp.glob("archived_*"))
    assert len(archived) == 1 and (archived[0] / "models" / "net_g_latest.safetensors").read_bytes() == latest
    assert (exp / "notes.txt").read_text() == "lr 2e-3 was too high" and (exp / "my_options.yml").is_file()
    assert {p.name for p in archived[0].iterdir()} >= {"models", "log", "history.json", "summary.json"}
    assert not {"notes.txt", "my_options.yml"} & {p.name for p in archived[0].iterdir()}
    assert (exp / "models" / "net_g_4.safetensors").is_file()


# ------------------------------------------------------------------------------------------ data found early
def test_bad_data_is_found_before_training_all_at_once(tmp_path: Path, small_train_dir: Path) -> None:
    train, val = tmp_path / "train", tmp_path / "val"
    shutil.copytree(small_train_dir, train)
    val.mkdir()
    cv2.imwrite(str(train / "tiny.png"), np.zeros((20, 40, 3), np.uint8))  # smaller than the 32 patch
    (train / "cut.png").write_bytes((DATASETS / "T91" / "HR" / "t1.png").read_bytes()[:500])  # truncated
    hdr = cv2.imread(str(DATASETS / "T91" / "HR" / "t2.png")).astype(np.float32) / 255.0
    assert cv2.imwrite(str(train / "float.tif"), hdr)  # a float32 TIFF: decodable, but not a training image
    shutil.copy(DATASETS / "Set5" / "HR" / "bird.png", val / "bird.png")
    _corrupt_body(DATASETS / "Set5" / "HR" / "baby.png", val / "baby.png")
    path = write_options(tmp_path / "o.yml", tiny_train_options("early", train, val, total_iter=4))
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr
    assert "4 problem(s) found in the datasets before training (nothing was trained)" in err, err
    assert "float.tif: unsupported pixel type float32" in err
    assert "tiny.png is 40x20 (WxH), smaller than the 32x32 GT patch" in err
    assert "cut.png is truncated" in err and "baby.png cannot be decoded" in err
    assert not list((tmp_path / "experiments" / "early" / "training_states").glob("*"))


# ------------------------------------------------------------------------------------------ one line each
def test_user_caused_os_errors_are_one_line(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("x" * 300, small_train_dir, None, total_iter=2)
    path = write_options(tmp_path / "long.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "of at most 200 bytes" in proc.stderr and "Traceback" not in proc.stderr
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    opt = tiny_train_options("ok", small_train_dir, None, total_iter=2)
    path = write_options(tmp_path / "o.yml", opt)
    for num_gpu in ("1", "2"):
        proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", f"num_gpu={num_gpu}",
                       f"path.experiments_root={blocker}/exp", cwd=tmp_path, check=False)
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert proc.returncode == 2 and len(lines) == 1 and "Not a directory" in lines[0], proc.stderr
    proc = run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(DATASETS / "Set5" / "HR" / "bird.png"),
                   "-o", str(blocker / "out"), cwd=tmp_path, check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_disk_full_during_a_save_keeps_the_last_state(tmp_path: Path, small_train_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from anysr.cli import main

    path = write_options(tmp_path / "o.yml", tiny_train_options("full", small_train_dir, None, total_iter=4))
    integrity = importlib.import_module("anysr.engine.checkpoint.integrity")  # where states are written
    real = integrity.atomic_write
    calls = {"n": 0}

    def full_after_first_save(target: object, fn: object) -> Path:
        if str(target).endswith(".state"):
            calls["n"] += 1
            if calls["n"] > 1:
                raise OSError(28, "No space left on device", str(target))
        return real(target, fn)  # type: ignore[arg-type]

    monkeypatch.setattr(integrity, "atomic_write", full_after_first_save)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "No space left on device" in err and "the disk is full" in err and len(err.strip().splitlines()) == 1
    states = tmp_path / "experiments" / "full" / "training_states"
    assert ckpt.find_resume_state(states) is not None  # the first state is still whole
    assert not [p for p in states.iterdir() if p.name.startswith(".")]  # no temp file left behind


def test_describe_os_error() -> None:
    assert describe_os_error(OSError(30, "Read-only file system", "/x")) == \
        "Read-only file system (/x): the file system is read-only; choose a writable folder (path.root / -o)"


def test_messages_that_tell_the_truth(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("acc", small_train_dir, None)
    opt["accelerator"] = "tpu"
    proc = run_cli("train", "-opt", str(write_options(tmp_path / "a.yml", opt)), cwd=tmp_path, check=False)
    assert "(TPUs are accelerator: xla)" in proc.stderr and "did you mean 'cpu'" not in proc.stderr
    bad_yaml = tmp_path / "py.yml"
    bad_yaml.write_text("name: !!python/object/apply:os.system ['true']\nscale: 2\n")
    proc = run_cli("train", "-opt", str(bad_yaml), cwd=tmp_path, check=False)
    assert "the tag !!python/object/apply:os.system is refused" in proc.stderr and "syntax" not in proc.stderr
    path = write_options(tmp_path / "r.yml", tiny_train_options("resume", small_train_dir, None, total_iter=2))
    run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    proc = run_cli("train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                   "train.total_iter=4", "network_g.num_feat=16", cwd=tmp_path, check=False)
    assert "does not fit this run's net_g: shape mismatches" in proc.stderr
    assert "conv_first.weight: file (8, 3, 3, 3)" in proc.stderr
    state = tmp_path / "experiments" / "resume" / "training_states" / "2.state"
    proc = run_cli("infer", "--weights", str(state), "--arch", "EDSR", "-i", str(DATASETS / "Set5" / "HR"),
                   "-o", str(tmp_path / "o"), cwd=tmp_path, check=False)
    assert "is a training state" in proc.stderr and "net_g_<iteration>.safetensors" in proc.stderr
    weights = tmp_path / "experiments" / "resume" / "models" / "net_g_2.safetensors"
    proc = run_cli("infer", "--weights", str(weights), "--param-key", "nope", "-i", str(DATASETS / "Set5" / "HR"),
                   "-o", str(tmp_path / "o"), cwd=tmp_path, check=False)
    assert "set --param-key to one of them" in proc.stderr and "param_key_g" not in proc.stderr


# ------------------------------------------------------------------------------------------ no silent wrong output
def test_float_tiff_is_read_as_zero_to_one(tmp_path: Path) -> None:
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))
    cv2.imwrite(str(tmp_path / "f.tif"), img.astype(np.float32) / 255)
    run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(tmp_path / "f.tif"), "-o", str(tmp_path / "o"),
            cwd=tmp_path)
    run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(DATASETS / "Set5" / "HR" / "bird.png"),
            "-o", str(tmp_path / "o8"), cwd=tmp_path)
    out16 = cv2.imread(str(tmp_path / "o" / "f.png"), cv2.IMREAD_UNCHANGED)
    out8 = cv2.imread(str(tmp_path / "o8" / "bird.png"))
    assert out16.dtype == np.uint16 and out16.shape == out8.shape
    assert np.abs(out16.astype(np.float64) / 257 - out8).max() <= 1.0  # the same picture, not black
    cv2.imwrite(str(tmp_path / "hdr.tif"), img.astype(np.float32))  # 0..255 as float: refused, not clipped
    proc = run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(tmp_path / "hdr.tif"), "-o",
                   str(tmp_path / "o2"), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "values from 0 to 255" in proc.stderr


def test_flipped_byte_and_nan_weights_are_refused(tmp_path: Path) -> None:
    net = torch.nn.Conv2d(3, 3, 3)
    good = tmp_path / "foreign.pth"
    torch.save({"params": net.state_dict()}, good)
    data = bytearray(good.read_bytes())
    raw = net.weight.detach().numpy().tobytes()
    at = bytes(data).index(raw[:16]) + 5  # inside the weight record's data
    data[at] ^= 0x40
    flipped = tmp_path / "flipped.pth"
    flipped.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"fails its zip CRC check"):
        ckpt.load_weights(flipped)
    assert ckpt.load_weights(good)[0].keys() == net.state_dict().keys()
    sd = net.state_dict()
    sd["bias"][1] = float("nan")
    torch.save({"params": sd}, tmp_path / "nan.pth")
    with pytest.raises(CheckpointError, match=r"tensor 'bias' holds NaN or infinite values"):
        ckpt.load_weights(tmp_path / "nan.pth")


def test_options_name_too_long_is_an_option_error(tmp_path: Path) -> None:
    from anysr.options import validate_options

    with pytest.raises(OptionError, match=r"name: must be a non-empty name without '/' of at most 200 bytes"):
        validate_options({"name": "n" * 201, "scale": 2, "network_g": {"type": "EDSR", "upscale": 2}},
                         is_train=False, root=tmp_path)


def test_the_told_error_is_reported_before_a_peers_death() -> None:
    # a peer aborted by the broken collective was seen first; rank 0 had told its error
    assert _cause([WorkerExit(1, -6), WorkerExit(0, 2)]) == WorkerExit(0, 2)
    # a killed rank is the cause of its peer's lost contact
    assert _cause([WorkerExit(0, PEER_FAILED), WorkerExit(1, -9)]) == WorkerExit(1, -9)
    assert _cause([WorkerExit(1, PEER_FAILED), WorkerExit(0, PEER_FAILED)]) == WorkerExit(1, PEER_FAILED)
    # seen in one poll: rank 0's gloo aborted (SIGABRT) because rank 1 was SIGKILLed (CI, 2026-12-05)
    assert _cause([WorkerExit(0, -6), WorkerExit(1, -9)]) == WorkerExit(1, -9)
    assert _cause([WorkerExit(0, -6), WorkerExit(1, 1)]) == WorkerExit(0, -6)


def test_corrupt_image_met_in_a_dataloader_worker_is_one_line(tmp_path: Path, small_train_dir: Path) -> None:
    """Pixel data is only decoded when a batch needs it (headers are checked at start): a worker that meets a
    corrupt image ends the run with the image's name in one line, not torch's worker traceback."""
    train = tmp_path / "train"
    shutil.copytree(small_train_dir, train)
    for png in train.glob("*.png"):
        _corrupt_body(png, png)
    path = write_options(tmp_path / "o.yml", tiny_train_options("w", train, None, total_iter=4, workers=2))
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path, check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "cannot be decoded" in lines[0] and ".png" in lines[0] and "Traceback" not in proc.stderr, lines


_BAD_HISTORIES = [
    [], None, {"train": 5}, {"train": [1]}, {"train": [{"iter": "2"}]},
    {"train": [{"iter": 2, "epoch": 0, "lr": 1e-3, "losses": {"l_pix": "0.1"}}]},  # a string loss value
    {"val": [{"iter": 2, "dataset": "v", "metrics": {"psnr": 30.0}, "better": {"psnr": "up"}}]},
]


@pytest.mark.parametrize("bad", _BAD_HISTORIES)
def test_history_of_the_wrong_shape_is_refused(tmp_path: Path, bad: Any) -> None:
    (tmp_path / "history.json").write_text(json.dumps(bad))
    with pytest.raises(DataError, match=r"history.json is not an anysr history \(.+\); delete it"):
        History.load(tmp_path)


def test_history_of_the_wrong_shape_is_one_line(tmp_path: Path, small_train_dir: Path) -> None:
    """history.json that is valid JSON but not what anysr writes: `report` and `--auto_resume` say so in one line
    naming the file (before any training), instead of a traceback or a failure at the run's end."""
    opt = tiny_train_options("h", small_train_dir, None, total_iter=2)
    path = write_options(tmp_path / "o.yml", opt)
    run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    exp = tmp_path / "experiments" / "h"
    for bad in (_BAD_HISTORIES[0], _BAD_HISTORIES[5]):
        (exp / "history.json").write_text(json.dumps(bad))
        for args in (("report", str(exp)), ("train", "-opt", str(path), "--auto_resume", "--force_yml",
                                            f"path.root={tmp_path}", "train.total_iter=4")):
            proc = run_cli(*args, cwd=tmp_path, check=False)
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            assert proc.returncode == 2 and len(lines) == 1, (bad, args[0], proc.stderr)
            assert "history.json is not an anysr history" in lines[0] and "delete it" in lines[0], lines
    assert not (exp / "models" / "net_g_4.safetensors").exists()


def test_infer_checks_every_input_before_writing(tmp_path: Path) -> None:
    """A bad file among the inputs is refused before any result is written; hidden files (macOS's ._name) are not
    inputs; 16-bit inputs are upscaled in fp32 when the precision is auto (bf16 would keep ~8 of their bits)."""
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(DATASETS / "Set5" / "HR" / "bird.png", src / "a.png")
    (src / "._a.png").write_bytes(b"\x00\x05\x16\x07 AppleDouble resource fork")
    (src / "z.png").write_bytes((DATASETS / "Set5" / "HR" / "baby.png").read_bytes()[:300])  # truncated
    out = tmp_path / "out"
    args = ("infer", "--arch", "bicubic", "--scale", "2", "-i", str(src), "-o", str(out))
    proc = run_cli(*args, cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "z.png is truncated" in proc.stderr and "._a.png" not in proc.stderr, proc.stderr
    assert not out.exists() or not any(out.iterdir())
    (src / "z.png").unlink()
    img16 = (cv2.imread(str(src / "a.png")).astype(np.uint16) * 257)
    assert cv2.imwrite(str(src / "b16.png"), img16)
    assert cv2.imwrite(str(src / "photo.jpg"), cv2.imread(str(src / "a.png")))
    proc = run_cli(*args, cwd=tmp_path)
    assert sorted(p.name for p in out.iterdir()) == ["a.png", "b16.png", "photo.png"]
    said = proc.stdout + proc.stderr
    assert "16-bit input images: precision fp32" in said
    assert "results are written as PNG (lossless; the default --ext png) from .jpg inputs too" in said


def test_messages_name_the_real_cause(tmp_path: Path) -> None:
    """eval with several --sr folders names the one that lacks a file; --json under a file says so; an --outscale
    whose result cannot fit in memory is refused before work, not reported as 'out of memory; use --tile'."""
    hr = DATASETS / "Set5" / "HR"
    run_cli("prepare", "lr", "--hr", str(hr), "--out", str(tmp_path / "lr"), "--scale", "2", cwd=tmp_path)
    run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(tmp_path / "lr"), "-o", str(tmp_path / "sr"),
            cwd=tmp_path)
    shutil.copytree(tmp_path / "sr", tmp_path / "sr2")
    (tmp_path / "sr2" / "bird.png").unlink()
    proc = run_cli("eval", "--gt", str(hr), "--sr", str(tmp_path / "sr"), "--sr", str(tmp_path / "sr2"), "--scale",
                   "2", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and f"cannot pair --sr {tmp_path / 'sr2'} with --gt" in proc.stderr, proc.stderr
    assert "bird.png" in proc.stderr and "woman" not in proc.stdout  # paired (and refused) before any scoring
    (tmp_path / "A").write_text("a file")
    proc = run_cli("eval", "--gt", str(hr), "--sr", str(tmp_path / "sr"), "--scale", "2", "--json",
                   str(tmp_path / "A" / "r.json"), cwd=tmp_path, check=False)
    assert proc.returncode == 2 and f"{tmp_path / 'A'} is a file, not a folder; fix the path" in proc.stderr
    assert "--json" in proc.stderr and "woman" not in proc.stdout  # refused before any scoring
    proc = run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(tmp_path / "lr" / "bird.png"), "-o",
                   str(tmp_path / "big"), "--outscale", "1000", cwd=tmp_path, check=False)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "--outscale 1000: the result of" in lines[0], proc.stderr
    assert "give a smaller --outscale" in lines[0] and "--tile" not in lines[0]


def test_patch_size_problems_are_said_once_with_the_size_that_fits(tmp_path: Path, small_train_dir: Path) -> None:
    """Several images smaller than the patch: one line naming them and the largest gt_size all of them allow
    (rather than one refusal per image and a guess); the override that removes a key is named where it helps."""
    train = tmp_path / "train"
    shutil.copytree(small_train_dir, train)
    cv2.imwrite(str(train / "small1.png"), np.zeros((27, 40, 3), np.uint8))  # 26 after the crop to scale 2
    cv2.imwrite(str(train / "small2.png"), np.zeros((30, 31, 3), np.uint8))
    opt = tiny_train_options("fit", train, None, total_iter=2, datasets__train={
        **tiny_train_options("x", train, None)["datasets"]["train"], "dataroot_lq": str(train)})
    path = write_options(tmp_path / "o.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "datasets.train.dataroot_lq: set together with lq_from_gt: true" in proc.stderr
    assert "--force_yml datasets.train.dataroot_lq=~ removes the key" in proc.stderr, proc.stderr
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "datasets.train.dataroot_lq=~",
                   cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "1 problem(s) found in the datasets before training" in proc.stderr, proc.stderr
    assert ("2 of 10 images are smaller than the 32x32 GT patch (gt_size) (small1.png, small2.png); the largest "
            "gt_size every image allows is 26: set datasets.train.gt_size: 26 (on the command line: --force_yml "
            "datasets.train.gt_size=26)") in proc.stderr, proc.stderr

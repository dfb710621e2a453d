"""Hostile and careless input, round two (issue 20, items 1, 2 and 8's full-disk messages): the first checkpoint can
always be continued from what is on disk, and small files cannot make anysr allocate without bound.

Every case was reproduced by its test before the fix. Training runs are real (tiny EDSR x2 on real T91 images).
"""

from __future__ import annotations

import errno
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DATASETS, ROOT, run_cli, tiny_train_options, write_options
from safetensors.torch import save_file

from anysr.archs import build_network
from anysr.engine import checkpoint as ckpt
from anysr.errors import OptionError
from anysr.options.loader import read_yaml

_TINY_EDSR = {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1, "upscale": 2}


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _disk_full(target: object = None) -> OSError:
    if target is None:
        return OSError(errno.ENOSPC, "No space left on device")
    return OSError(errno.ENOSPC, "No space left on device", str(target))


# ------------------------------------------------------------------------------------ the first checkpoint
def test_disk_full_at_the_first_checkpoint_then_auto_resume(tmp_path: Path, small_train_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from anysr.cli import main

    path = write_options(tmp_path / "o.yml", tiny_train_options("first", small_train_dir, None, total_iter=4))
    integrity = importlib.import_module("anysr.engine.checkpoint.integrity")  # where states are written
    real = integrity.atomic_write

    def no_room_for_states(target: object, fn: object) -> Path:
        if str(target).endswith(".state"):
            raise _disk_full(target)
        return real(target, fn)  # type: ignore[arg-type]

    with monkeypatch.context() as m:
        m.setattr(integrity, "atomic_write", no_room_for_states)
        assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "No space left on device" in line and "the disk is full" in line
    assert "--auto_resume" in line and "iteration 0" in line, line  # nothing complete yet: it says so
    exp = tmp_path / "experiments" / "first"
    assert not list((exp / "models").glob("net_g_*")), "weights landed without their training state"
    # the advice holds: --auto_resume continues (from iteration 0 here) and finishes the run
    assert main(["train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}"]) == 0, \
        capsys.readouterr().err
    assert [it for it, _ in ckpt.list_training_states(exp / "training_states")] == [2, 4]


def test_disk_full_writing_weights_after_a_state_resumes_from_it(tmp_path: Path, small_train_dir: Path,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from anysr.cli import main

    path = write_options(tmp_path / "o.yml", tiny_train_options("weights", small_train_dir, None, total_iter=4))
    weights_mod = importlib.import_module("anysr.engine.checkpoint.weights")
    real = weights_mod.atomic_write_bytes

    def no_room_for_weights(target: object, data: bytes) -> Path:
        raise _disk_full(target)

    with monkeypatch.context() as m:
        m.setattr(weights_mod, "atomic_write_bytes", no_room_for_weights)
        assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "the disk is full" in line and "--auto_resume" in line and "iteration 2" in line, line
    exp = tmp_path / "experiments" / "weights"
    assert weights_mod.atomic_write_bytes is real
    assert main(["train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}"]) == 0, \
        capsys.readouterr().err
    assert (exp / "models" / "net_g_4.safetensors").is_file()


_KILL_IN_STATE = """
import importlib, os, signal, sys
integrity = importlib.import_module("anysr.engine.checkpoint.integrity")
real = integrity.atomic_write
def dying(target, fn):
    if not str(target).endswith(".state"):
        return real(target, fn)
    def half(f):
        f.write(b"PK half a state")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real(target, half)
integrity.atomic_write = dying
from anysr.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_kill_9_while_the_first_state_is_a_temp_file(tmp_path: Path, small_train_dir: Path) -> None:
    path = write_options(tmp_path / "o.yml", tiny_train_options("killed", small_train_dir, None, total_iter=4))
    proc = subprocess.run([sys.executable, "-c", _KILL_IN_STATE, "train", "-opt", str(path), "--force_yml",
                           f"path.root={tmp_path}"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    states = tmp_path / "experiments" / "killed" / "training_states"
    assert [p.name for p in states.iterdir() if p.name.startswith(".2.state.tmp-")]  # killed mid-write
    run_cli("train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    assert [it for it, _ in ckpt.list_training_states(states)] == [2, 4]


def test_full_disk_outside_training_does_not_point_to_auto_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from anysr.cli import main

    net = build_network(_TINY_EDSR)
    weights = ckpt.save_weights(tmp_path / "w.safetensors", {"params": net.state_dict()},
                                {"network_g": _TINY_EDSR, "scale": 2})

    def full(fd: int) -> None:  # every atomic write ends in an fsync: the disk fills there
        raise _disk_full()

    sr = DATASETS / "Set5" / "HR"
    monkeypatch.setattr(os, "fsync", full)
    for argv in (["export", str(weights), "--to", str(tmp_path / "x.pth")],
                 ["eval", "--gt", str(DATASETS / "Set5" / "HR"), "--sr", str(sr), "--scale", "2",
                  "--json", str(tmp_path / "r.json")]):
        assert main(argv) == 2
        line = _one_line(capsys.readouterr().err)
        assert "the disk is full" in line and "--auto_resume" not in line, line


# ------------------------------------------------------------------------------------ YAML aliases
def _laughs(levels: int = 9) -> str:
    lines = ["name: laughs", "scale: 2", 'l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", '
             '"lol"]']
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]")
    lines.append(f"network_g: {{type: EDSR, junk: *l{levels}}}")
    return "\n".join(lines) + "\n"


def test_yaml_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    bomb = tmp_path / "laughs.yml"
    bomb.write_text(_laughs())
    assert bomb.stat().st_size < 1500
    t0 = time.perf_counter()
    with pytest.raises(OptionError, match="aliases") as err:
        read_yaml(bomb)
    assert time.perf_counter() - t0 < 2.0
    assert str(bomb) in str(err.value) and "\n" not in str(err.value)
    proc = run_cli("train", "-opt", str(bomb), cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2 and "aliases" in _one_line(proc.stderr)


def test_yaml_alias_cycle_and_deep_nesting_are_one_line(tmp_path: Path) -> None:
    cycle = tmp_path / "cycle.yml"
    cycle.write_text("name: x\nscale: 2\nnetwork_g: &a {type: EDSR, inner: *a}\n")
    with pytest.raises(OptionError, match="inside itself"):
        read_yaml(cycle)
    deep = tmp_path / "deep.yml"
    deep.write_text("name: x\nscale: 2\nnetwork_g: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(OptionError, match="nested"):
        read_yaml(deep)
    for f in (cycle, deep):
        proc = run_cli("train", "-opt", str(f), cwd=tmp_path, check=False, timeout=120)
        assert proc.returncode == 2, proc.stderr
        _one_line(proc.stderr)


def test_ordinary_yaml_aliases_still_load(tmp_path: Path) -> None:
    f = tmp_path / "ok.yml"
    f.write_text("name: x\nscale: 2\nval_set: &v {name: a, mode: b}\nval2: *v\nlist: &l [1, 2, 3]\n"
                 "more: [*l, *l, *l]\nbase: &b {x: 1}\nderived: {<<: *b, y: 2}\n")
    data = read_yaml(f)
    assert data["val2"] == {"name": "a", "mode": "b"} and data["more"] == [[1, 2, 3]] * 3
    assert data["derived"] == {"x": 1, "y": 2}


# ------------------------------------------------------------------------------------ weights metadata
def _plain_safetensors(path: Path, network_g: object) -> Path:
    net = build_network(_TINY_EDSR)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path),
              metadata={"network_g": json.dumps(network_g), "scale": "2"})
    return path


def test_metadata_that_disagrees_with_the_tensors_is_refused_before_building(tmp_path: Path) -> None:
    huge = _plain_safetensors(tmp_path / "huge.safetensors", {**_TINY_EDSR, "num_feat": 1000000})
    out = tmp_path / "out"
    t0 = time.perf_counter()
    proc = run_cli("infer", "--weights", str(huge), "-i", str(DATASETS / "Set5" / "HR" / "bird.png"),
                   "-o", str(out), cwd=tmp_path, check=False, timeout=120)
    assert time.perf_counter() - t0 < 60
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert str(huge) in line and "metadata" in line and "conv_first.weight" in line and "--arch" in line, line
    assert not out.exists() or not any(out.iterdir())
    proc = run_cli("export", str(huge), "--to", str(tmp_path / "x.pth"), cwd=tmp_path, check=False, timeout=120)
    assert proc.returncode == 2 and "metadata" in _one_line(proc.stderr)


@pytest.mark.parametrize("network_g", [[1, 2], "EDSR", {"num_feat": 8}, {"type": 5}])
def test_metadata_network_g_of_the_wrong_shape_is_one_line(tmp_path: Path, network_g: object,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from anysr.cli import main

    bad = _plain_safetensors(tmp_path / "bad.safetensors", network_g)
    for argv in (["infer", "--weights", str(bad), "-i", str(DATASETS / "Set5" / "HR" / "bird.png"),
                  "-o", str(tmp_path / "out")],
                 ["export", str(bad), "--to", str(tmp_path / "x.pth")]):
        assert main(argv) == 2  # in this process: a TypeError would fail the test with its traceback
        line = _one_line(capsys.readouterr().err)
        assert str(bad) in line and "network_g" in line, line


def test_metadata_that_fits_still_rebuilds_the_network(tmp_path: Path) -> None:
    from anysr.cli import main

    good = _plain_safetensors(tmp_path / "good.safetensors", _TINY_EDSR)
    out = tmp_path / "out"
    assert main(["infer", "--weights", str(good), "-i", str(DATASETS / "Set5" / "HR" / "bird.png"), "-o", str(out),
                 "--no-progress"]) == 0
    assert len(list(out.iterdir())) == 1


# ------------------------------------------------------------------------------------ calibration size
def test_a_tile_larger_than_any_image_is_timed_at_a_bounded_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    from anysr.cli import main

    net = build_network(_TINY_EDSR)
    weights = ckpt.save_weights(tmp_path / "w.safetensors", {"params": net.state_dict()},
                                {"network_g": _TINY_EDSR, "scale": 2})
    base = importlib.import_module("anysr.accelerators.base")
    shapes: list[tuple[int, ...]] = []
    with monkeypatch.context() as m:  # record what would be timed (100000 x 100000 was 120 GB of torch.rand)
        m.setattr(base.Accelerator, "calibrate", lambda self, net, shape, *, train: shapes.append(tuple(shape)))
        assert main(["infer", "--weights", str(weights), "-i", str(DATASETS / "Set5" / "HR" / "bird.png"),
                     "-o", str(tmp_path / "rec"), "--tile", "100000", "--no-progress"]) == 0
    assert shapes and max(s[-1] for s in shapes) <= 256, shapes
    t0 = time.perf_counter()
    run_cli("infer", "--weights", str(weights), "-i", str(DATASETS / "Set5" / "HR" / "bird.png"), "-o",
            str(tmp_path / "out"), "--tile", "100000", "--no-progress", cwd=tmp_path, timeout=300)
    assert len(list((tmp_path / "out").iterdir())) == 1 and time.perf_counter() - t0 < 120


@pytest.mark.parametrize(("override", "expect"), [
    ({"num_feat": 0}, r"network_g: EDSR with these arguments has an empty weight conv_first\.weight of shape "
                      r"\[0, 3, 3, 3\]: an argument is 0 \(network_g\.num_feat=0\)$"),
    ({"num_feat": -3}, r"network_g: cannot build EDSR with .*negative dimension -3"),
])
def test_a_width_of_zero_is_an_option_error_before_training(override: dict, expect: str,
                                                            recwarn: pytest.WarningsRecorder) -> None:
    """A width of 0 built a network with empty weights that failed in the first forward, deep in torch (a
    traceback); a negative one raised torch's RuntimeError from the constructor. Both name network_g now, and torch's
    zero-element warning is not printed before the error."""
    with pytest.raises(OptionError, match=expect):
        build_network({**_TINY_EDSR, **override})
    assert not [w for w in recwarn if "zero-element" in str(w.message)]


def test_a_width_of_zero_ends_training_in_one_line(tmp_path: Path) -> None:
    opt = ROOT / "options" / "train" / "quickstart_EDSR_x2.yml"
    proc = run_cli("train", "-opt", str(opt), "--force_yml", f"path.root={ROOT}",
                   f"path.experiments_root={tmp_path / 'exp'}", "network_g.num_feat=0", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert "empty weight conv_first.weight" in _one_line(proc.stderr)


@pytest.mark.parametrize("suffix", ["../x", "a/b", ".."])
def test_a_validation_suffix_cannot_leave_the_images_folder(tmp_path: Path, suffix: str) -> None:
    """val.suffix names saved validation images ('{name}_{suffix}.png'): a separator would write elsewhere."""
    opt = ROOT / "options" / "train" / "quickstart_EDSR_x2.yml"
    proc = run_cli("train", "-opt", str(opt), "--force_yml", f"path.root={ROOT}",
                   f"path.experiments_root={tmp_path / 'exp'}", f"val.suffix={suffix}", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "val.suffix: a part of a file name" in proc.stderr, proc.stderr
    assert not (tmp_path / "exp").exists()

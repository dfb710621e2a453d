"""anysr.engine.checkpoint: atomic writes, verified training states, safe weight loading."""

from __future__ import annotations

import importlib
import io
import logging
import os
import signal
import subprocess
import sys
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from anysr.engine import checkpoint as ck
from anysr.errors import CheckpointError, OptionError

REPO = Path(__file__).resolve().parents[1]


class NotAllowed:
    """A custom class: torch.load(weights_only=True) refuses to unpickle it."""

    def __init__(self) -> None:
        self.value = 3


def make_state(it: int = 100) -> dict:
    torch.manual_seed(it)
    return {
        "iter": it,
        "epoch": 2,
        "networks": {"net_g": OrderedDict(w=torch.randn(4, 3), b=torch.randn(3).to(torch.bfloat16))},
        "optimizers": [{"state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.randn(4, 3)}},
                        "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.99), "params": [0, 1]}]}],
        "rng": {"python": [3, tuple(range(5)), None], "torch": torch.get_rng_state()[:32].clone()},
        "flags": {"done": False, "name": "x", "blob": b"\x00\x01",
                  "half": torch.ones(2, dtype=torch.float16)},
    }


def assert_same(a: dict, b: dict) -> None:
    assert ck.tree_digest(a) == ck.tree_digest(b)


def tiny_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 3, 3, padding=1))


# ------------------------------------------------------------------------------------------- atomic_write
def test_atomic_write_uses_temp_in_same_folder_and_publishes(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "a.bin"
    seen = []

    def write(f) -> None:
        seen.append(Path(f.name))
        assert not target.exists()  # nothing is published before the rename
        f.write(b"hello")

    assert ck.atomic_write(target, write) == target
    assert target.read_bytes() == b"hello"
    tmp = seen[0]
    assert tmp.parent == target.parent
    assert tmp.name.startswith(f".a.bin.tmp-{os.getpid()}-")
    assert not tmp.exists()
    assert ck.atomic_write_bytes(target, b"again").read_bytes() == b"again"
    assert sorted(p.name for p in target.parent.iterdir()) == ["a.bin"]


def test_atomic_write_failure_keeps_old_file_and_removes_temp(tmp_path: Path) -> None:
    target = tmp_path / "100.state"
    target.write_bytes(b"old")

    def boom(f) -> None:
        f.write(b"partial new content")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        ck.atomic_write(target, boom)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["100.state"]


def test_atomic_write_errors_name_the_target_not_the_temp_file(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder that cannot be written (read-only, a full disk at open) is reported under the file being written,
    with its errno; an error from elsewhere passes unchanged."""
    import builtins

    real_open = builtins.open

    def refuse(file, mode="r", *args, **kwargs):  # noqa: ANN001, ANN202 - open's own signature
        if "x" in mode:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", refuse)
    target = tmp_path / "x4.onnx"
    with pytest.raises(PermissionError) as info:
        ck.atomic_write_bytes(target, b"1")
    assert info.value.filename == str(target) and info.value.errno == 13 and ".tmp-" not in str(info.value)
    monkeypatch.setattr(builtins, "open", real_open)

    def elsewhere(f) -> None:
        raise FileNotFoundError(2, "No such file or directory", "/somewhere/else")

    with pytest.raises(FileNotFoundError, match="/somewhere/else"):
        ck.atomic_write(target, elsewhere)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(os.name == "nt", reason="SIGKILL is POSIX")
def test_kill_9_during_save_leaves_old_file_and_a_stale_temp(tmp_path: Path) -> None:
    old = ck.save_training_state(tmp_path / "100.state", make_state(100))
    before = old.read_bytes()
    script = (
        "import os, signal, sys\n"
        "from anysr.engine.checkpoint import atomic_write\n"
        "def write(f):\n"
        "    f.write(b'PK half a checkpoint'); f.flush(); os.fsync(f.fileno())\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "atomic_write(sys.argv[1], write)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", script, str(old)], env=env, capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    assert old.read_bytes() == before
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".100.state.tmp-")]
    assert len(leftovers) == 1
    assert ck.list_training_states(tmp_path) == [(100, old)]
    found = ck.find_resume_state(tmp_path)
    assert found is not None and found[0] == old
    assert ck.clean_stale_temps(tmp_path) == leftovers
    assert [p.name for p in tmp_path.iterdir()] == ["100.state"]


def test_clean_stale_temps_spares_live_writers_and_other_files(tmp_path: Path) -> None:
    mine = tmp_path / f".5.state.tmp-{os.getpid()}-abcd1234"
    dead = tmp_path / ".5.state.tmp-999999999-0badc0de"
    other = tmp_path / "notes.tmp-1-ab"
    for p in (mine, dead, other):
        p.write_bytes(b"x")
    assert ck.clean_stale_temps(tmp_path) == [dead]
    assert mine.exists() and other.exists()
    assert ck.clean_stale_temps(tmp_path / "missing") == []


# ------------------------------------------------------------------------------------------- tree_digest
def test_tree_digest_is_canonical_and_sensitive() -> None:
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    base = ck.tree_digest({"a": t, "b": [1, 2.0, "s", None, True, b"x"]})
    assert base == ck.tree_digest({"b": [1, 2.0, "s", None, True, b"x"], "a": t.t().contiguous().t()})
    assert base == ck.tree_digest(OrderedDict(b=[1, 2.0, "s", None, True, b"x"], a=t.clone()))
    variants = [
        {"a": t.double(), "b": [1, 2.0, "s", None, True, b"x"]},
        {"a": t.reshape(4, 3), "b": [1, 2.0, "s", None, True, b"x"]},
        {"a": t + 1e-6, "b": [1, 2.0, "s", None, True, b"x"]},
        {"a": t, "b": (1, 2.0, "s", None, True, b"x")},
        {"a": t, "b": [1.0, 2.0, "s", None, True, b"x"]},
        {"a": t, "b": [1, 2.0, "s", None, 1, b"x"]},
        {"a": t, "b": [1, 2.0, "s", None, True, "x"]},
        {"a": t.numpy(), "b": [1, 2.0, "s", None, True, b"x"]},
    ]
    digests = {ck.tree_digest(v) for v in variants}
    assert base not in digests and len(digests) == len(variants)
    bf = torch.randn(5).to(torch.bfloat16)
    assert ck.tree_digest(bf) == ck.tree_digest(bf.clone()) != ck.tree_digest(bf.half())
    assert ck.tree_digest(torch.tensor(3)) != ck.tree_digest(torch.tensor([3]))
    assert ck.tree_digest(np.arange(3)) == ck.tree_digest(np.arange(3)[::1].copy())
    assert ck.tree_digest({0: 1, "0": 1}) != ck.tree_digest({0: 1, "1": 1})
    with pytest.raises(TypeError, match=r"obj\['x'\]: cannot digest a .*NotAllowed"):
        ck.tree_digest({"x": NotAllowed()})


# ------------------------------------------------------------------------------------------- training state
def test_training_state_round_trip_and_plain_weights_only_load(tmp_path: Path) -> None:
    state = make_state()
    snapshot = ck.tree_digest(state)
    path = ck.save_training_state(tmp_path / "100.state", state)
    assert ck.tree_digest(state) == snapshot and "__anysr__" not in state  # caller's dict untouched
    raw = torch.load(path, weights_only=True)  # the plain safe loader reads it
    assert raw["__anysr__"]["format"] == 1
    assert raw["networks"]["net_g"]["b"].dtype == torch.bfloat16
    assert zipfile.ZipFile(path).testzip() is None  # still a valid zip (the stamp is a zip comment)
    loaded = ck.load_training_state(path)
    assert "__anysr__" not in loaded
    assert_same(loaded, state)
    assert loaded["optimizers"][0]["param_groups"][0]["betas"] == (0.9, 0.99)
    assert isinstance(loaded["networks"]["net_g"], OrderedDict)


def test_training_state_stores_views_compactly_and_detaches(tmp_path: Path) -> None:
    big = torch.arange(1_000_000, dtype=torch.float32)
    param = nn.Parameter(torch.ones(3))
    state = {"head": big[:4], "p": param, "size": torch.Size([2, 3])}
    path = ck.save_training_state(tmp_path / "1.state", state)
    assert path.stat().st_size < 10_000  # the view's 4 values, not the million behind it
    loaded = ck.load_training_state(path)
    assert torch.equal(loaded["head"], big[:4]) and not loaded["p"].requires_grad
    assert loaded["size"] == torch.Size([2, 3])


def test_save_training_state_refuses_what_weights_only_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as err:
        ck.save_training_state(tmp_path / "1.state", {"rng": {"numpy": np.zeros(3)}})
    msg = str(err.value)
    assert "1.state" in msg and "state['rng']['numpy']" in msg and "torch.from_numpy" in msg
    with pytest.raises(CheckpointError, match=r"state\['obj'\] is a .*NotAllowed.*weights_only"):
        ck.save_training_state(tmp_path / "1.state", {"obj": NotAllowed()})
    with pytest.raises(CheckpointError, match="expected a dict"):
        ck.save_training_state(tmp_path / "1.state", [1, 2])  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())


def _regions(data: bytes) -> dict[str, int]:
    """Byte positions inside the zip header, the pickle, a tensor's data and the end record."""
    z = zipfile.ZipFile(io.BytesIO(data))
    pos = {}
    for info in z.infolist():
        local = info.header_offset
        name_len = int.from_bytes(data[local + 26:local + 28], "little")
        extra_len = int.from_bytes(data[local + 28:local + 30], "little")
        start = local + 30 + name_len + extra_len
        if info.filename.endswith("data.pkl"):
            pos["pickle"] = start + info.file_size // 2
        elif info.filename.endswith("data/0") and "tensor" not in pos:
            pos["tensor"] = start + info.file_size // 2
    assert {"pickle", "tensor"} <= set(pos)
    pos.update(zip_header=10, zip_name=35, end_record=len(data) - 90, stamp=len(data) - 5)
    return pos


def test_flipped_byte_in_training_state_is_refused(tmp_path: Path) -> None:
    path = ck.save_training_state(tmp_path / "100.state", make_state())
    data = path.read_bytes()
    bad = tmp_path / "bad.state"
    for where, i in _regions(data).items():
        flipped = bytearray(data)
        flipped[i] ^= 0x04
        bad.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError) as err:
            ck.load_training_state(bad)
        msg = str(err.value)
        assert str(bad) in msg and "path.resume_state" in msg and "delete it" in msg, where
        assert "checksum mismatch" in msg or "truncated or corrupt" in msg, where


def test_every_single_byte_flip_is_refused(tmp_path: Path) -> None:
    path = ck.save_training_state(tmp_path / "7.state", {"iter": 7, "w": torch.randn(3, 2)})
    data = path.read_bytes()
    bad = tmp_path / "bad.state"
    bad.write_bytes(data)
    with open(bad, "r+b") as f:  # patch in place: rewriting the whole file each time is slow here
        for i in range(len(data)):
            f.seek(i)
            f.write(bytes([data[i] ^ 0xFF]))
            f.flush()
            with pytest.raises(CheckpointError):
                ck.load_training_state(bad)
            f.seek(i)
            f.write(data[i:i + 1])
    assert ck.load_training_state(bad)["iter"] == 7


def test_truncated_training_state_is_refused(tmp_path: Path) -> None:
    data = ck.save_training_state(tmp_path / "100.state", make_state()).read_bytes()
    bad = tmp_path / "short.state"
    for n in (0, 1, 30, len(data) // 3, len(data) // 2, len(data) - 78, len(data) - 1):
        bad.write_bytes(data[:n])
        with pytest.raises(CheckpointError, match=r"short\.state is unusable: truncated") as err:
            ck.load_training_state(bad)
        assert "path.resume_state" in str(err.value)


def test_unstamped_and_foreign_states(tmp_path: Path) -> None:
    # Re-saved with plain torch.save: the whole-file checksum (the one integrity check) is gone, so it is refused.
    raw = torch.load(ck.save_training_state(tmp_path / "1.state", make_state()), weights_only=True)
    resaved = tmp_path / "2.state"
    torch.save(raw, resaved)
    with pytest.raises(CheckpointError, match="2.state is unusable: it carries no anysr checksum"):
        ck.load_training_state(resaved)
    foreign = tmp_path / "3.state"
    torch.save({"iter": 3, "optimizers": []}, foreign)  # never unpickled: no checksum, refused before
    with pytest.raises(CheckpointError, match="3.state is unusable: it carries no anysr checksum"):
        ck.load_training_state(foreign)
    integrity = importlib.import_module("anysr.engine.checkpoint.integrity")
    integrity.save_stamped(tmp_path / "3b.state", {"iter": 3})  # a checksum, but not our record
    with pytest.raises(CheckpointError, match="3b.state is unusable: not an anysr training state"):
        ck.load_training_state(tmp_path / "3b.state")
    evil = tmp_path / "4.state"
    integrity.save_stamped(evil, {"iter": 4, "x": NotAllowed()})  # a valid checksum over a pickled object
    with pytest.raises(CheckpointError, match=r"4.state is unusable: refused by torch.load\(weights_only"):
        ck.load_training_state(evil)
    with pytest.raises(CheckpointError, match="5.state is unusable: does not exist"):
        ck.load_training_state(tmp_path / "5.state")


def test_list_find_and_prune(tmp_path: Path) -> None:
    assert ck.list_training_states(tmp_path / "nope") == []
    assert ck.find_resume_state(tmp_path / "nope") is None
    for it in (2, 10, 100):
        ck.save_training_state(tmp_path / f"{it}.state", make_state(it))
    for name in ("latest.state", "100.state.corrupt", ".100.state.tmp-1-ab", "net_g_100.safetensors"):
        (tmp_path / name).write_bytes(b"x")
    assert [it for it, _ in ck.list_training_states(tmp_path)] == [2, 10, 100]

    newest = tmp_path / "100.state"
    newest.write_bytes(newest.read_bytes()[:-200])  # a copy that was cut short
    warnings: list[str] = []
    found = ck.find_resume_state(tmp_path, warn=warnings.append)
    assert found is not None
    path, state = found
    assert path == tmp_path / "10.state" and state["iter"] == 10
    assert_same(state, make_state(10))
    assert len(warnings) == 1 and "100.state" in warnings[0] and "truncated" in warnings[0]
    assert "100.state.corrupt.1" in warnings[0]  # the earlier .corrupt file is not overwritten
    assert not newest.exists() and (tmp_path / "100.state.corrupt.1").exists()
    assert (tmp_path / "100.state.corrupt").read_bytes() == b"x"
    warnings.clear()
    assert ck.find_resume_state(tmp_path, warn=warnings.append)[0] == path and not warnings


def test_find_resume_state_when_all_are_bad(tmp_path: Path) -> None:
    (tmp_path / "5.state").write_bytes(b"garbage")
    warnings: list[str] = []
    assert ck.find_resume_state(tmp_path, warn=warnings.append) is None
    assert len(warnings) == 1 and (tmp_path / "5.state.corrupt").exists()


def test_prune_keeps_newest_valid(tmp_path: Path) -> None:
    for it in range(1, 6):
        ck.save_training_state(tmp_path / f"{it}.state", {"iter": it})
    assert ck.prune_training_states(tmp_path, None) == []
    removed = ck.prune_training_states(tmp_path, 3)
    assert sorted(p.name for p in removed) == ["1.state", "2.state"]
    bad = tmp_path / "5.state"
    flipped = bytearray(bad.read_bytes())
    flipped[40] ^= 1
    bad.write_bytes(bytes(flipped))
    removed = ck.prune_training_states(tmp_path, 2)  # 5 is corrupt: keep 4 and 3, leave 5 alone
    assert [p.name for p in removed] == []
    removed = ck.prune_training_states(tmp_path, 1)
    assert [p.name for p in removed] == ["3.state"]
    assert [it for it, _ in ck.list_training_states(tmp_path)] == [4, 5]
    with pytest.raises(OptionError, match="keep_last=0: keep at least 1"):
        ck.prune_training_states(tmp_path, 0)


# ------------------------------------------------------------------------------------------- weights
def test_safetensors_round_trip_with_metadata(tmp_path: Path) -> None:
    net, ema = tiny_net().state_dict(), {k: v * 2 for k, v in tiny_net().state_dict().items()}
    opts = {"type": "Tiny", "num_feat": 4, "upscale": 2}
    path = ck.save_weights(tmp_path / "net_g_10.safetensors", {"params": net, "params_ema": ema},
                           {"network_g": opts, "scale": 2, "iteration": 10})
    with safe_open(str(path), framework="pt") as f:
        assert set(f.keys()) == {f"params.{k}" for k in net} | {f"params_ema.{k}" for k in net}
        assert f.metadata()["network_g"] == '{"num_feat": 4, "type": "Tiny", "upscale": 2}'
    sd, meta = ck.load_weights(path)
    assert_same(sd, dict(net))
    assert meta["network_g"] == opts and meta["scale"] == 2 and meta["iteration"] == 10
    assert meta["groups"] == ["params", "params_ema"] and meta["anysr_format"] == 1
    assert_same(ck.load_weights(path, "params_ema")[0], ema)
    assert ck.read_weights_metadata(path) == meta
    with pytest.raises(CheckpointError, match=r"no 'params_x' entry; it holds: 'params', 'params_ema'"):
        ck.load_weights(path, "params_x")


def test_save_weights_refuses_bad_input(tmp_path: Path) -> None:
    sd = {"w": torch.ones(2)}
    with pytest.raises(CheckpointError, match="metadata key 'digest' is reserved"):
        ck.save_weights(tmp_path / "a.safetensors", {"params": sd}, {"digest": 1})
    with pytest.raises(CheckpointError, match="metadata 'net' is not JSON-serialisable"):
        ck.save_weights(tmp_path / "a.safetensors", {"params": sd}, {"net": NotAllowed()})
    with pytest.raises(CheckpointError, match="group name 'a.b'"):
        ck.save_weights(tmp_path / "a.safetensors", {"a.b": sd}, {})
    with pytest.raises(CheckpointError, match=r"params\.w is a str, not a tensor"):
        ck.save_weights(tmp_path / "a.safetensors", {"params": {"w": "x"}}, {})
    assert not list(tmp_path.iterdir())


def test_save_weights_handles_tied_and_view_tensors(tmp_path: Path) -> None:
    big = torch.arange(100.0)
    sd = {"a": big[:4], "b": big[:4], "c": torch.randn(2, 3).t()}
    path = ck.save_weights(tmp_path / "t.safetensors", {"params": sd, "params_ema": sd}, {})
    assert path.stat().st_size < 1000  # only the views' own values are stored
    assert_same(ck.load_weights(path, "params_ema")[0], sd)


def test_params_ema_falls_back_to_params(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sd = tiny_net().state_dict()
    path = ck.save_weights(tmp_path / "only.safetensors", {"params": sd}, {"scale": 1})
    with caplog.at_level(logging.INFO, logger="anysr.engine.checkpoint"):
        got, _ = ck.load_weights(path, "params_ema")
    assert_same(got, dict(sd))
    assert "holds no 'params_ema' (EMA) weights, as Real-ESRGAN's releases; loading 'params'" in caplog.text
    assert len(caplog.records) == 1 and caplog.records[0].levelno == logging.INFO  # one line, not a warning


def test_plain_safetensors_file_loads_all_tensors(tmp_path: Path) -> None:
    path = tmp_path / "other.safetensors"
    save_file({"module.conv.weight": torch.ones(2, 2), "module.conv.bias": torch.zeros(2)}, str(path),
              metadata={"format": "pt"})
    sd, meta = ck.load_weights(path, "params_ema")
    assert set(sd) == {"conv.weight", "conv.bias"} and meta == {"format": "pt"}


def test_corrupt_safetensors_are_refused(tmp_path: Path) -> None:
    sd = {"w": torch.randn(8, 4), "b": torch.randn(4).to(torch.bfloat16)}
    path = ck.save_weights(tmp_path / "w.safetensors", {"params": sd, "params_ema": sd},
                           {"network_g": {"type": "X", "num_feat": 64}})
    data = path.read_bytes()
    header_len = int.from_bytes(data[:8], "little")
    bad = tmp_path / "bad.safetensors"
    positions = {"length": 2, "json": 8 + 1, "metadata": data.index(b"num_feat") + 1,
                 "digest": data.index(b"digest") + 30, "tensor name": data.index(b"params.w") + 3,
                 "dtype": data.index(b"BF16") + 1, "data": 8 + header_len + 5, "last": len(data) - 1}
    for where, i in positions.items():
        flipped = bytearray(data)
        flipped[i] ^= 0x01
        bad.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError) as err:
            ck.load_weights(bad, "params_ema" if where == "last" else "params")
        msg = str(err.value)
        assert str(bad) in msg and "Fix:" in msg, where
    for n in (0, 5, 8 + header_len // 2, len(data) - 1):
        bad.write_bytes(data[:n])
        with pytest.raises(CheckpointError, match="truncated or corrupt"):
            ck.load_weights(bad)


def test_basicsr_pth_round_trip(tmp_path: Path) -> None:
    net, ema = tiny_net().state_dict(), {k: v + 1 for k, v in tiny_net().state_dict().items()}
    path = ck.save_weights_pth(tmp_path / "net_g_5.pth", {"params": net, "params_ema": ema})
    raw = torch.load(path, weights_only=True)  # exactly what BasicSR's load_network reads
    assert set(raw) == {"params", "params_ema"}
    assert_same(raw["params"], dict(net))
    assert_same(ck.load_weights(path)[0], dict(net))
    got, meta = ck.load_weights(path, "params_ema")
    assert_same(got, ema) and meta == {}
    assert ck.read_weights_metadata(path) == {}
    flipped = bytearray(path.read_bytes())
    flipped[len(flipped) // 2] ^= 0x10
    bad = tmp_path / "bad.pth"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="bad.pth: checksum mismatch"):
        ck.load_weights(bad)
    bad.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CheckpointError, match="bad.pth cannot be loaded: truncated"):
        ck.load_weights(bad)


def test_pth_variants_and_prefix_stripping(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sd = tiny_net().state_dict()
    ddp = tmp_path / "ddp.pth"
    torch.save({"params": {f"module.{k}": v for k, v in sd.items()}}, ddp)
    with caplog.at_level(logging.INFO, logger="anysr.engine.checkpoint"):
        got, _ = ck.load_weights(ddp, "params_ema")
    assert list(got) == list(sd) and "loading 'params'" in caplog.text
    bare = tmp_path / "bare.pt"
    torch.save({f"_orig_mod.module.{k}": v for k, v in sd.items()}, bare)
    assert_same(ck.load_weights(bare)[0], dict(sd))
    lightning = tmp_path / "l.ckpt"
    torch.save({"state_dict": dict(sd), "epoch": 3}, lightning)
    assert_same(ck.load_weights(lightning)[0], dict(sd))
    ema_only = tmp_path / "ema.pth"
    torch.save({"params_ema": dict(sd)}, ema_only)
    with pytest.raises(CheckpointError, match=r"ema.pth have no 'params' entry; it holds: 'params_ema'"):
        ck.load_weights(ema_only)
    clash = tmp_path / "clash.pth"
    torch.save({"module.w": torch.ones(1), "w": torch.ones(1)}, clash)
    with pytest.raises(CheckpointError, match="mixes wrapped and unwrapped names"):
        ck.load_weights(clash)


def test_unsafe_missing_and_odd_weight_files(tmp_path: Path) -> None:
    evil = tmp_path / "evil.pth"
    torch.save({"params": {"w": torch.ones(1)}, "payload": NotAllowed()}, evil)
    with pytest.raises(CheckpointError) as err:
        ck.load_weights(evil)
    msg = str(err.value)
    assert "evil.pth" in msg and "weights_only=True" in msg and "NotAllowed" in msg
    with pytest.raises(CheckpointError, match="missing.safetensors do not exist. Fix:"):
        ck.load_weights(tmp_path / "missing.safetensors")
    with pytest.raises(CheckpointError, match="missing.pth do not exist"):
        ck.read_weights_metadata(tmp_path / "missing.pth")
    tensor = tmp_path / "t.pth"
    torch.save(torch.ones(2), tensor)
    with pytest.raises(CheckpointError, match="t.pth hold a Tensor, not a state dict"):
        ck.load_weights(tensor)
    odd = tmp_path / "w.xyz"
    odd.write_bytes(b"hello world")
    with pytest.raises(CheckpointError, match="w.xyz: unknown format"):
        ck.load_weights(odd)
    with pytest.raises(CheckpointError, match="is not a file"):
        ck.load_weights(tmp_path)


# ------------------------------------------------------------------------------------------- load_into
def test_load_into_strict_and_lenient(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = tiny_net().state_dict()
    net = tiny_net()
    for p in net.parameters():
        nn.init.zeros_(p)
    ck.load_into(net, src, strict=True, source="net_g.pth")
    assert_same(net.state_dict(), dict(src))

    other = dict(src)
    other["0.weight"] = torch.zeros(5, 3, 3, 3)
    other.pop("2.bias")
    other["extra.weight"] = torch.ones(1)
    with pytest.raises(CheckpointError) as err:
        ck.load_into(tiny_net(), other, strict=True, source="net_g.pth")
    msg = str(err.value)
    assert msg.startswith("net_g.pth does not fit the network")
    assert "missing keys (1): 2.bias" in msg and "unexpected keys (1): extra.weight" in msg
    assert "0.weight: file (5, 3, 3, 3) vs network (4, 3, 3, 3)" in msg
    assert "set path.strict_load_g: false to load what matches" in msg

    net = tiny_net()
    for p in net.parameters():
        nn.init.zeros_(p)
    with caplog.at_level(logging.WARNING, logger="anysr.engine.checkpoint"):
        ck.load_into(net, other, strict=False, source="net_g.pth")
    assert torch.equal(net.state_dict()["2.weight"], src["2.weight"])
    assert torch.equal(net.state_dict()["0.weight"], torch.zeros(4, 3, 3, 3))  # mismatched: skipped
    assert "loaded 2 of 4 network tensors" in caplog.text and "2.bias" in caplog.text
    with pytest.raises(CheckpointError, match="none of its 1 entries match"):
        ck.load_into(tiny_net(), {"x": torch.ones(1)}, strict=False, source="wrong.pth")


def test_many_missing_keys_are_listed_briefly() -> None:
    net = nn.Sequential(*[nn.Linear(1, 1) for _ in range(8)])
    with pytest.raises(CheckpointError, match=r"missing keys \(16\): 0.weight, .*\(6 more\)"):
        ck.load_into(net, {}, strict=True, source="empty.safetensors")

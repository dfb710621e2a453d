"""Pretrained weights are read once, memory-mapped on the CPU, and reach the device before the optimizer."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import tiny_train_options, write_options
from safetensors.torch import load_file

from anysr.archs import build_network
from anysr.cli import main
from anysr.engine import checkpoint as ck
from anysr.errors import CheckpointError

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")


def _edsr() -> torch.nn.Module:
    torch.manual_seed(3)
    return build_network({"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1,
                          "upscale": 2, "res_scale": 1, "img_range": 255.0, "rgb_mean": [0.4488, 0.4371, 0.4040]})


def _basicsr_groups() -> dict[str, dict[str, torch.Tensor]]:
    params = _edsr().state_dict()
    return {"params": params, "params_ema": {k: v + 1 for k, v in params.items()}}


def _mapped_from(t: torch.Tensor, path: Path) -> bool:
    """Whether ``t``'s memory lies in a mapping of ``path`` (a view of the page cache, not a copy)."""
    ptr, real = t.untyped_storage().data_ptr(), os.path.realpath(path)
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and parts[5] == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= ptr < hi:
                    return True
    return False


@linux_only
@pytest.mark.parametrize("kind", ["safetensors", "pth"])
def test_weights_are_memory_mapped(tmp_path: Path, kind: str) -> None:
    groups = _basicsr_groups()
    if kind == "pth":
        path = tmp_path / "basicsr.pth"
        torch.save(groups, path)  # a BasicSR model-zoo file: a zip archive without anysr's stamp
    else:
        path = ck.save_weights(tmp_path / "w.safetensors", groups)
    sd, _ = ck.load_weights(path, "params_ema")
    assert sd.keys() == groups["params_ema"].keys()
    assert all(torch.equal(sd[k], groups["params_ema"][k]) for k in sd)
    big = max(sd, key=lambda k: sd[k].numel())
    assert _mapped_from(sd[big], path), f"{kind}: {big} was copied into memory instead of mapped"
    net = _edsr()
    ck.load_into(net, sd, strict=True, source=str(path))
    assert torch.equal(net.state_dict()[big], groups["params_ema"][big])


@linux_only
def test_stamped_pth_is_verified_then_mapped(tmp_path: Path) -> None:
    groups = _basicsr_groups()
    path = ck.save_weights_pth(tmp_path / "net_g_5.pth", groups)
    sd, _ = ck.load_weights(path, "params")
    assert all(torch.equal(sd[k], groups["params"][k]) for k in sd)
    assert _mapped_from(max(sd.values(), key=lambda t: t.numel()), path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="net_g_5.pth: checksum mismatch"):
        ck.load_weights(path, "params")


def test_legacy_pth_is_read_whole(tmp_path: Path) -> None:
    """Files from torch < 1.6 (not zip archives) cannot be mapped; they load the ordinary way."""
    groups = _basicsr_groups()
    path = tmp_path / "legacy.pth"
    torch.save(groups, path, _use_new_zipfile_serialization=False)
    sd, _ = ck.load_weights(path, "params_ema")
    assert all(torch.equal(sd[k], groups["params_ema"][k]) for k in groups["params_ema"])


def _rezip(src: Path, dst: Path, compression: int) -> Path:
    """``src`` (a torch.save archive) re-written with every record compressed, as some tools re-pack files."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", compression) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info.filename))
    return dst


@linux_only
def test_compressed_archive_is_read_not_mapped(tmp_path: Path) -> None:
    """torch.load(mmap=True) reads records at their file offsets: a deflated archive must not be mapped (it
    would give garbage or fail), so it is read the ordinary way and gives the right values."""
    groups = _basicsr_groups()
    torch.save(groups, tmp_path / "stored.pth")
    path = _rezip(tmp_path / "stored.pth", tmp_path / "deflated.pth", zipfile.ZIP_DEFLATED)
    sd, _ = ck.load_weights(path, "params_ema")
    assert all(torch.equal(sd[k], groups["params_ema"][k]) for k in groups["params_ema"])
    assert not any(_mapped_from(t, path) for t in sd.values())


def test_real_model_zoo_file_loads(root: Path) -> None:
    """Real-ESRGAN's released realesr-animevideov3.pth (CUDA-saved, deflated records) loads on the CPU."""
    path = root / "pretrained" / "realesr-animevideov3.pth"
    sd, _ = ck.load_weights(path, "params")
    net = build_network({"type": "SRVGGNetCompact", "num_feat": 64, "num_conv": 16, "upscale": 4,
                         "act_type": "prelu"})
    ck.load_into(net, sd, strict=True, source=str(path))
    assert all(t.device.type == "cpu" and torch.isfinite(t).all() for t in sd.values())


def test_empty_pth_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "empty.pth"
    path.write_bytes(b"")
    with pytest.raises(CheckpointError, match="empty.pth cannot be loaded: truncated or not a torch file"):
        ck.load_weights(path)


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_training_starts_from_the_pretrained_weights(tmp_path: Path, small_train_dir: Path, suffix: str) -> None:
    """One step at lr 1e-20 changes nothing (the values are near 1), so the saved weights must be the file's:
    they were in the net the optimizer steps (loaded on the CPU, moved with the net, before the optimizer)."""
    groups = _basicsr_groups()
    pre = tmp_path / f"pre{suffix}"
    if suffix == ".pth":
        torch.save(groups, pre)
    else:
        ck.save_weights(pre, groups)
    opt = tiny_train_options("pre", small_train_dir, None, total_iter=1)
    opt["path"].update({"pretrain_network_g": str(pre), "param_key_g": "params_ema"})
    opt["train"]["optim_g"]["lr"] = 1e-20
    path = write_options(tmp_path / "pre.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    saved = load_file(str(tmp_path / "experiments" / "pre" / "models" / "net_g_1.safetensors"))
    for k, v in groups["params_ema"].items():
        assert torch.equal(saved[f"params.{k}"], v), k
        assert torch.equal(saved[f"params_ema.{k}"], v), k
    log = "\n".join(p.read_text() for p in (tmp_path / "experiments" / "pre" / "log").glob("train_*.log"))
    assert f"loaded pretrained weights {pre} [params_ema]" in log

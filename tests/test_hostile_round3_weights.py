"""Hostile and careless input, round three: weights, inference and export with the new architectures.

Weights files of the wrong kind (a pickled module, a training state under a .pth name, a discriminator, an empty
or integer-only file, EMA weights of another shape than ``params``, metadata that lies), ``--arch-opt`` values of
the wrong type, video networks given image inputs, faces larger than a face restorer takes and ONNX export
settings that cannot work: each is refused before any work in one line naming the file or flag and the fix.

Every case was reproduced by its test before the fix (tiny networks on the host; a few CLI runs where the one-line
output matters).
"""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import pytest
import torch
from conftest import DATASETS, run_cli
from safetensors.torch import save_file

from anysr.archs import build_network
from anysr.archs.recognise import recognise
from anysr.engine import checkpoint as ckpt
from anysr.engine.inference.network import resolve_network
from anysr.errors import CheckpointError, OptionError

_COMPACT = {"type": "SRVGGNetCompact", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_conv": 2, "upscale": 2,
            "act_type": "prelu"}


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _state(opt: dict) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {k: v.contiguous() for k, v in build_network(opt).state_dict().items()}


def _resolve(weights: Path, **kw: object) -> object:
    args = {"arch": None, "arch_opts": {}, "network_opt": None, "scale": None, "param_key": "auto"}
    args.update(kw)
    return resolve_network(weights=str(weights), **args)  # type: ignore[arg-type]


def _images(folder: Path, *sizes: tuple[int, int]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "baby.png"))
    for i, (w, h) in enumerate(sizes):
        cv2.imwrite(str(folder / f"{i:04d}.png"), cv2.resize(img, (w, h), interpolation=cv2.INTER_AREA))
    return folder


# ------------------------------------------------------------------------------------------- weights files
def test_pickled_module_says_how_to_convert(tmp_path: Path) -> None:
    """A whole pickled nn.Module: refused unread (weights_only), with the one-line conversion to a state dict."""
    path = tmp_path / "model.pth"
    torch.save(build_network(_COMPACT), path)
    with pytest.raises(CheckpointError) as err:
        ckpt.read_weights(path, "auto")
    msg = str(err.value)
    assert "\n" not in msg and "SRVGGNetCompact" in msg and "weights_only=False" in msg and "state_dict()" in msg


def test_training_state_under_a_pth_name(tmp_path: Path) -> None:
    """A traiNNer-redux / BasicSR training state saved as .pth (no weights in it) was 'no params entry; it holds:
    none. Fix: set --param-key to one of them'."""
    path = tmp_path / "1000.pth"
    torch.save({"epoch": 3, "iter": 1000, "optimizers": [{"state": {}, "param_groups": []}], "schedulers": [{}]},
               path)
    with pytest.raises(CheckpointError, match=r"1000\.pth is a training state .*net_g_<iteration>") as err:
        ckpt.read_weights(path, "auto", key_option="--param-key")
    assert "\n" not in str(err.value)


def test_container_without_state_dict_lists_its_entries(tmp_path: Path) -> None:
    path = tmp_path / "odd.pth"
    torch.save({"note": "hello", "numbers": [1, 2]}, path)
    with pytest.raises(CheckpointError, match=r"hold no state dict .*entries: 'note', 'numbers'"):
        ckpt.read_weights(path, "auto")


@pytest.mark.parametrize(("tensors", "said"), [
    ({}, "holds no tensors"),
    ({"index": torch.arange(5)}, "hold no floating-point values (int64 only)"),
])
def test_files_of_no_network(tmp_path: Path, tensors: dict, said: str) -> None:
    """0 tensors, or integer tensors only: not 'fit none of 111 architectures (closest: none)'."""
    path = tmp_path / "w.safetensors"
    save_file(tensors, str(path))
    with pytest.raises(OptionError) as err:
        _resolve(path)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_one_unknown_tensor_in_the_singular(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.zeros(3)}, str(path))
    with pytest.raises(OptionError, match=r"its 1 tensor fit none of"):
        _resolve(path)


def test_discriminator_given_as_the_generator(tmp_path: Path) -> None:
    """UNetDiscriminatorSN's state dict (Real-ESRGAN's net_d) was 'closest: ArtCNN (6% of its names)'."""
    path = tmp_path / "net_d_1000.safetensors"
    save_file(_state({"type": "UNetDiscriminatorSN", "num_in_ch": 3, "num_feat": 8}), str(path))
    with pytest.raises(OptionError, match=r"names are those of UNetDiscriminatorSN \(a discriminator\).*net_g_"):
        _resolve(path)
    with pytest.raises(OptionError, match="UNetDiscriminatorSN"):
        recognise(_state({"type": "UNetDiscriminatorSN", "num_in_ch": 3, "num_feat": 16}))


def test_ema_of_other_shapes_names_the_group_that_fits(tmp_path: Path) -> None:
    """``params_ema`` (read first) of other shapes than ``params``: the error says --param-key params reads the
    group that fits (it was only 'fit none ... closest: SRVGGNetCompact (100% of its names)')."""
    sd = _state(_COMPACT)
    path = tmp_path / "mixed.pth"
    torch.save({"params": sd, "params_ema": {k: v[:1] for k, v in sd.items()}}, path)
    with pytest.raises(OptionError, match=r"'params' group .*--param-key params.* is SRVGGNetCompact") as err:
        _resolve(path)
    assert "\n" not in str(err.value)
    assert _resolve(path, param_key="params").scale == 2  # type: ignore[attr-defined]


def test_metadata_network_that_cannot_be_built_is_one_line(tmp_path: Path) -> None:
    """A file whose metadata names a network without its required arguments: three lines about 'network_g'
    (which the user never wrote) before; now one line naming the file's metadata and --arch."""
    path = tmp_path / "lies.safetensors"
    save_file(_state(_COMPACT), str(path), metadata={"network_g": json.dumps({"type": "EDSR", "num_feat": 64})})
    with pytest.raises(CheckpointError) as err:
        _resolve(path)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"weights {path}: the network its metadata records cannot be built")
    assert "num_in_ch" in msg and "--arch" in msg


@pytest.mark.parametrize(("opts", "key"), [({"num_feat": "eight", "num_conv": 2, "upscale": 2}, "num_feat"),
                                           ({"num_feat": 8, "num_conv": "2x", "upscale": 2}, "num_conv")])
def test_arch_opt_text_for_a_number(tmp_path: Path, opts: dict, key: str) -> None:
    """``--arch-opt num_feat=eight``: 'not all arguments converted during string formatting' before."""
    path = tmp_path / "w.safetensors"
    save_file(_state(_COMPACT), str(path))
    with pytest.raises(OptionError, match=rf"--arch-opt\.{key}: SRVGGNetCompact takes a number here, got the text"):
        _resolve(path, arch="SRVGGNetCompact", arch_opts=opts)


def test_cli_pickled_module_one_line(tmp_path: Path) -> None:
    torch.save(build_network(_COMPACT), tmp_path / "model.pth")
    _images(tmp_path / "in", (24, 20))
    proc = run_cli("infer", "--weights", "model.pth", "-i", "in", "-o", "out", "--no-progress", cwd=tmp_path,
                   check=False)
    assert proc.returncode != 0 and "convert it once to a state dict" in _one_line(proc.stderr)
    assert not (tmp_path / "out").exists()


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
from anysr.archs.recognition.recognise import recognise
from anysr.engine import checkpoint as ckpt
from anysr.engine.inference.network import resolve_network
from anysr.errors import CheckpointError, DataError, OptionError

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



# ------------------------------------------------------------------------------------- infer: the inputs
_BASICVSR = {"type": "BasicVSR", "num_feat": 8, "num_block": 1}


@pytest.fixture(scope="module")
def basicvsr_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vsr") / "basicvsr.safetensors"
    save_file(_state(_BASICVSR), str(path))
    return path


def _request(weights: Path, inp: Path, out: Path, **kw: object) -> object:
    from anysr.engine.inference.command import InferRequest  # noqa: PLC0415

    return InferRequest(input=str(inp), output=str(out), weights=str(weights), progress=False, **kw)  # type: ignore[arg-type]


def test_recognised_video_network_runs_a_folder_of_frames(tmp_path: Path, basicvsr_file: Path) -> None:
    """A bare BasicVSR state dict (no --arch, no metadata) and a folder of frames: the image path ran the video
    network on single images (a ValueError traceback from BasicVSR); now the frames go through it as a clip."""
    from anysr.engine.inference.command import plan_infer  # noqa: PLC0415
    from anysr.engine.inference.video import video_infer_worker  # noqa: PLC0415

    frames = _images(tmp_path / "frames", (24, 20), (24, 20), (24, 20))
    job = plan_infer(_request(basicvsr_file, frames, tmp_path / "out"))  # type: ignore[arg-type]
    assert job.worker is video_infer_worker and "frame(s)" in job.done


def test_video_network_backend_onnxruntime_refused(tmp_path: Path, basicvsr_file: Path) -> None:
    from anysr.engine.inference.command import plan_infer  # noqa: PLC0415

    frames = _images(tmp_path / "frames", (24, 20), (24, 20))
    with pytest.raises(OptionError, match=r"--backend onnxruntime: BasicVSR is a video network"):
        plan_infer(_request(basicvsr_file, frames, tmp_path / "out", backend="onnxruntime"))  # type: ignore[arg-type]


@pytest.mark.parametrize(("sizes", "said"), [
    (None, "one image, but BasicVSR is a video network"),
    ([(24, 20)], "1 frame, but BasicVSR runs on clips of 2 frames or more"),
    ([(24, 20), (22, 20), (24, 20)], "frame 0001.png is 22x20 but 0000.png is 24x20"),
])
def test_video_network_inputs_it_cannot_take(tmp_path: Path, basicvsr_file: Path, sizes: list | None,
                                             said: str) -> None:
    """One image file, a folder of one frame, frames of different sizes: tracebacks from BasicVSR's input check and
    torch.cat midway before; refused before any work now (also with --arch)."""
    from anysr.engine.inference.command import plan_infer  # noqa: PLC0415

    inp = _images(tmp_path / "frames", (24, 20)) / "0000.png" if sizes is None else _images(tmp_path / "f", *sizes)
    for arch in ({}, {"arch": "BasicVSR", "arch_opts": {"num_feat": 8, "num_block": 1}}):
        with pytest.raises(DataError, match=said) as err:
            plan_infer(_request(basicvsr_file, inp, tmp_path / "out", **arch))  # type: ignore[arg-type]
        assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_face_larger_than_the_face_network_takes(tmp_path: Path) -> None:
    """GFPGAN (out_size 64 here; 512 released) on a 100x80 image: a ValueError traceback from the forward, after
    the calibration; refused before any work, naming the image and the size."""
    from anysr.engine.inference.command import plan_infer  # noqa: PLC0415

    path = tmp_path / "gfpgan.safetensors"
    save_file(_state({"type": "GFPGANv1Clean", "out_size": 64, "num_style_feat": 32, "channel_multiplier": 1,
                      "num_mlp": 2, "narrow": 0.125}), str(path))
    folder = _images(tmp_path / "in", (48, 40), (100, 80))
    with pytest.raises(DataError, match=r"0001\.png is 100x80, but GFPGANv1Clean restores faces of at most 64x64"):
        plan_infer(_request(path, folder, tmp_path / "out"))  # type: ignore[arg-type]
    small = _images(tmp_path / "small", (48, 40))
    assert plan_infer(_request(path, small, tmp_path / "out")).worker.__name__ == "infer_worker"  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------- export
@pytest.mark.parametrize(("settings", "said"), [
    ({"size": -4, "dynamic": False}, r"--size -4: give the traced input side in pixels, 1 or more"),
    ({"size": 0}, r"--size 0: give the traced input side"),
    ({"opset": 3}, r"--opset 3: this torch exports ONNX opsets \d+ to \d+"),
    ({"opset": 99}, r"--opset 99: this torch exports ONNX opsets"),
])
def test_export_onnx_settings_refused_before_tracing(tmp_path: Path, settings: dict, said: str) -> None:
    """``--size -4 --static``: a RuntimeError traceback from torch.rand; ``--opset 3``: the exporter's graph dump
    (65 lines) and 'the network does not run on a 64x64 input'; ``--size 0`` was taken as the default silently."""
    from anysr.engine.inference.export import export_weights  # noqa: PLC0415

    path = tmp_path / "w.safetensors"
    save_file(_state(_COMPACT), str(path))
    with pytest.raises(OptionError, match=said) as err:
        export_weights(str(path), [str(tmp_path / "w.onnx")], **settings)
    assert "\n" not in str(err.value) and not (tmp_path / "w.onnx").exists()


def test_export_video_network_to_onnx_refused_before_writing(tmp_path: Path, basicvsr_file: Path) -> None:
    """A BasicVSR file to ONNX: 'does not run on a 64x64 input ... pass --size' (wrong advice) after tracing; now
    refused as a video network before any output (the .safetensors asked first included) is written."""
    from anysr.engine.inference.export import export_weights  # noqa: PLC0415

    outs = [str(tmp_path / "plain.safetensors"), str(tmp_path / "vsr.onnx")]
    with pytest.raises(OptionError, match=r"vsr\.onnx: BasicVSR is a video network \(recurrent"):
        export_weights(str(basicvsr_file), outs)
    assert not any(Path(o).exists() for o in outs)
    assert export_weights(str(basicvsr_file), outs[:1])[0].tensors > 0


def test_misspelt_arch_named_as_arch(tmp_path: Path) -> None:
    """``--arch SRVGGNetCompat``: the error named '--arch-opt.type' (a key the user never typed)."""
    path = tmp_path / "w.safetensors"
    save_file(_state(_COMPACT), str(path))
    with pytest.raises(OptionError, match=r"^--arch: unknown arch 'SRVGGNetCompat' \(did you mean 'SRVGGNetCompact'"):
        _resolve(path, arch="SRVGGNetCompat")
    assert _resolve(path, arch="compact", arch_opts={"num_feat": 8, "num_conv": 2, "upscale": 2}).scale == 2  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------- anysr test
@pytest.mark.parametrize("network", [{"type": "auto"}, _BASICVSR])
def test_video_weights_in_an_image_model_one_line(tmp_path: Path, basicvsr_file: Path, network: dict) -> None:
    """``anysr test`` of an SRModel file whose ``network_g: {type: auto}`` reads a BasicVSR file (or names BasicVSR):
    a ValueError traceback from BasicVSR's forward in the calibration; now one line naming model_type's fix."""
    import yaml  # noqa: PLC0415

    _images(tmp_path / "lq", (24, 20))
    opt = {"name": "t", "model_type": "SRModel", "scale": 4, "num_gpu": 0,
           "datasets": {"test_1": {"name": "s", "type": "SingleImageDataset", "dataroot_lq": "lq",
                                   "io_backend": {"type": "disk"}}},
           "network_g": network, "path": {"pretrain_network_g": str(basicvsr_file)}}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(opt))
    proc = run_cli("test", "-opt", "t.yml", cwd=tmp_path, check=False)
    line = _one_line(proc.stderr)
    assert proc.returncode != 0 and "BasicVSR is a video network" in line and "model_type: VideoRecurrentModel" in line


def test_training_state_outside_an_experiment_names_no_made_up_folder(tmp_path: Path) -> None:
    """``/tmp/w/1000.state`` was answered with '/tmp/models/net_g_<iteration>.safetensors' (a folder that is no
    experiment's); in an experiment's training_states/ the models folder beside it is still named."""
    loose = tmp_path / "w" / "1000.state"
    loose.parent.mkdir()
    torch.save({"iter": 1000}, loose)
    with pytest.raises(CheckpointError, match=r"saved with it are the experiment's models/net_g_<iteration>"):
        ckpt.read_weights(loose, "auto")
    exp = tmp_path / "exp" / "training_states" / "1000.state"
    exp.parent.mkdir(parents=True)
    torch.save({"iter": 1000}, exp)
    with pytest.raises(CheckpointError, match=rf"saved with it are {tmp_path / 'exp' / 'models'}/net_g_"):
        ckpt.read_weights(exp, "auto")


def test_colour_image_for_a_one_channel_network_refused_before_any_work(tmp_path: Path) -> None:
    """A grayscale network (num_in_ch 1) over a folder of a gray then a colour image: the gray result was written,
    then the colour one failed midway (after the calibration); refused before any work now."""
    from anysr.engine.inference.command import plan_infer  # noqa: PLC0415

    path = tmp_path / "gray.safetensors"
    save_file(_state({**_COMPACT, "num_in_ch": 1, "num_out_ch": 1}), str(path))
    folder = _images(tmp_path / "in", (24, 20), (24, 20))
    cv2.imwrite(str(folder / "0000.png"), cv2.imread(str(folder / "0000.png"), cv2.IMREAD_GRAYSCALE))
    with pytest.raises(DataError, match=r"0001\.png is a colour image, but this network takes one channel"):
        plan_infer(_request(path, folder, tmp_path / "out"))  # type: ignore[arg-type]
    (folder / "0001.png").unlink()
    assert plan_infer(_request(path, folder, tmp_path / "out")).worker.__name__ == "infer_worker"  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------- presets
@pytest.fixture(scope="module")
def ultracompact_x2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("uc") / "uc_x2.safetensors"
    save_file(_state({"type": "ultracompact", "scale": 2}), str(path))
    return path


def test_preset_scale_from_the_scale_flag(ultracompact_x2: Path) -> None:
    """``--arch ultracompact --scale 2`` over an x2 file: the preset was built at its default x4 (the strict load's
    table of the upsampler's shapes); --scale now picks the preset's scale, as an option file's scale does."""
    assert _resolve(ultracompact_x2, arch="ultracompact", scale=2).scale == 2  # type: ignore[attr-defined]


def test_preset_of_another_scale_names_the_scale(ultracompact_x2: Path) -> None:
    """``--arch ultracompact`` alone over an x2 file: one line naming the scale that fits (was the shape table)."""
    with pytest.raises(OptionError, match=r"^--arch ultracompact: the file holds x2 weights.*--arch-opt scale=2") \
            as err:
        _resolve(ultracompact_x2, arch="ultracompact")
    assert "\n" not in str(err.value)
    assert _resolve(ultracompact_x2, arch="ultracompact", arch_opts={"scale": 2}).scale == 2  # type: ignore[attr-defined]


def test_preset_scale_true_refused(ultracompact_x2: Path) -> None:
    """``--arch-opt scale=true`` built the network with upscale=True (x1) and failed on the shapes."""
    with pytest.raises(OptionError, match=r"--arch-opt\.scale: the scale is a whole number .* got True"):
        _resolve(ultracompact_x2, arch="ultracompact", arch_opts={"scale": True})


def test_arch_opt_list_for_a_number(tmp_path: Path) -> None:
    """``--arch-opt num_feat=[8]``: 'unsupported operand type(s) for %: 'list' and 'int''."""
    path = tmp_path / "w.safetensors"
    save_file(_state(_COMPACT), str(path))
    with pytest.raises(OptionError, match=r"--arch-opt\.num_feat: SRVGGNetCompact takes a number here, got a list"):
        _resolve(path, arch="SRVGGNetCompact", arch_opts={"num_feat": [8], "num_conv": 2, "upscale": 2})


@pytest.mark.parametrize(("section", "said"), [
    ({"shape": "1x3x0x0"}, r"^onnx\.shape '1x3x0x0': a fixed height and width of 1 pixel or more"),
    ({"opset": 25}, r"^onnx\.opset 25: this torch exports ONNX opsets"),
])
def test_onnx_section_values_named_as_the_file_writes_them(section: dict, said: str) -> None:
    """traiNNer-redux's ``onnx`` section: ``shape: 1x3x0x0`` and ``opset: 25`` were said as '--size 0' / '--opset 25'
    (flags the user never gave; the shape-0 case before this round was taken as the default size silently)."""
    from anysr.engine.inference.export import onnx_file_settings  # noqa: PLC0415

    onnx = {"shape": "1x3xHxW", "opset": 17, "dtype": "fp32", "verify": True, **section}
    with pytest.raises(OptionError, match=said):
        onnx_file_settings(onnx, "exp")


@pytest.mark.parametrize("argv", [["infer", "-i", "in", "-o", "out", "--scale", "0"],
                                  ["eval", "a", "b", "--scale", "-2"],
                                  ["prepare", "lr", "--hr", "a", "--out", "b", "--scale", "0"]])
def test_a_scale_below_one_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """--scale 0 was taken as "the network's scale" by infer; every --scale wants 1 or more."""
    from anysr.cli import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2 and "is not a scale; give 1 or more" in capsys.readouterr().err

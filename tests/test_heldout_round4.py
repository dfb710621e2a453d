"""Held-out checks, round four (issue 40): files written by other projects load and are read as their authors
read them (BasicSR's SpyNet weights without the buffers it computes, HAT of other widths, GRL in spandrel's and the
authors' layouts, traiNNer-redux's long argument spellings), and hostile input loses no data."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
from conftest import ROOT
from seeded_weights import seeded_state_dict

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise
from anysr.archs.spynet_arch import IMAGENET_MEAN, IMAGENET_STD
from anysr.atomic import atomic_write_bytes
from anysr.cli import main as cli_main
from anysr.engine.checkpoint import load_into, load_model_weights
from anysr.engine.inference.images import output_paths
from anysr.engine.prepare.command import extract_subimages, prepare_lr, prepare_modcrop
from anysr.errors import CheckpointError, DataError, OptionError
from anysr.models import build_model
from anysr.options import load_options

VIDEO = ROOT / "options" / "train" / "video"


# ------------------------------------------------------------------ 1. buffers a network computes are not demanded
def _basicsr_spynet(path: Path) -> dict[str, torch.Tensor]:
    """SpyNet weights as BasicSR publishes them: 'params' without ``mean`` / ``std`` (registered after loading)."""
    torch.manual_seed(0)
    sd = {k: v for k, v in build_network({"type": "SpyNet"}).state_dict().items() if k not in ("mean", "std")}
    torch.save({"params": sd}, path)
    return sd


def test_spynet_weights_without_computed_buffers_load(tmp_path: Path) -> None:
    sd = _basicsr_spynet(tmp_path / "spynet.pth")
    net = build_network({"type": "SpyNet"})
    load_into(net, sd, strict=True, source="spynet.pth")
    assert torch.equal(net.basic_module[0].basic_module[0].weight, sd["basic_module.0.basic_module.0.weight"])
    assert torch.allclose(net.mean.flatten(), torch.tensor(IMAGENET_MEAN))
    assert torch.allclose(net.std.flatten(), torch.tensor(IMAGENET_STD))


@pytest.mark.parametrize(("file", "shrink"), [
    ("train_BasicVSR_REDS.yml", ["network_g.num_feat=8", "network_g.num_block=1"]),
    ("train_IconVSR_REDS.yml", ["network_g.num_feat=8", "network_g.num_block=1", "network_g.edvr_path=null"]),
    ("train_BasicVSRPP_REDS.yml", ["network_g.mid_channels=8", "network_g.num_blocks=1"]),
])
def test_basicsr_video_files_start_with_basicsr_spynet_weights(file: str, shrink: list[str], tmp_path: Path) -> None:
    sd = _basicsr_spynet(tmp_path / "spynet.pth")
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    opt = load_options(VIDEO / file, [*shrink, f"network_g.spynet_path={tmp_path / 'spynet.pth'}", "accelerator=cpu",
                                      "num_gpu=1", "train.precision=fp32", "train.channels_last=false"],
                       is_train=True, check_paths=False)
    model = build_model(opt, acc)
    lines = load_model_weights(model, fresh=True)
    assert any("spynet" in line for line in lines)
    spynet = model.bare("net_g").spynet
    assert torch.equal(spynet.state_dict()["basic_module.5.basic_module.8.bias"],
                       sd["basic_module.5.basic_module.8.bias"])
    assert torch.allclose(spynet.mean.flatten(), torch.tensor(IMAGENET_MEAN))


def test_a_missing_learned_buffer_is_still_demanded() -> None:
    """Only declared computed buffers are optional: a missing parameter still fails the strict load."""
    sd = build_network({"type": "SpyNet"}).state_dict()
    del sd["basic_module.0.basic_module.0.weight"]
    with pytest.raises(CheckpointError, match="missing keys"):
        load_into(build_network({"type": "SpyNet"}), sd, strict=True, source="x.pth")


# ------------------------------------------------------------------ 2. HAT of other reconstruction widths
def _seeded(opt: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded weights in the layout of ``opt``'s network (built on the meta device: shapes only)."""
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in build_network(opt).state_dict().items()}
    return seeded_state_dict(shapes, seed)


HAT_TINY = {"type": "HAT", "upscale": 2, "depths": [2], "num_heads": [2], "window_size": 8, "img_size": 32}


@pytest.mark.parametrize(("num_feat", "embed_dim"), [(32, 48), (96, 60), (64, 60)])
def test_hat_width_is_read_from_its_weights(num_feat: int, embed_dim: int) -> None:
    """spandrel reads ``num_feat`` from ``conv_last``; a file of another width is recognised with it."""
    sd = _seeded({**HAT_TINY, "embed_dim": embed_dim, "num_feat": num_feat})
    found = recognise(sd)
    assert found.opt["type"] == "HAT"
    assert found.opt.get("num_feat", 64) == num_feat and found.opt["embed_dim"] == embed_dim
    build_network(dict(found.opt)).load_state_dict(sd)


def test_hat_preset_takes_num_feat() -> None:
    """traiNNer-redux's HAT builders pass num_feat on (spandrel's HAT takes it)."""
    with torch.device("meta"):
        net = build_network({"type": "hat_s", "num_feat": 32})
    assert net.conv_last.in_channels == 32


def test_an_unfitting_hat_file_is_not_called_a_non_image_network() -> None:
    sd = _seeded({**HAT_TINY, "embed_dim": 48})
    sd["conv_after_body.weight"] = torch.zeros(48, 48, 5, 5)  # no HAT has this
    with pytest.raises(OptionError) as err:
        recognise(sd, "hat.pth")
    assert "HAT_iLN" not in str(err.value) and "not run as an image network" not in str(err.value)
    assert "HAT" in str(err.value)


# ------------------------------------------------------------------ 3. GRL read as spandrel 0.4.2 reads it
GRL_BODY = {"type": "GRL", "embed_dim": 16, "depths": [2], "num_heads_window": [2], "num_heads_stripe": [2],
            "mlp_ratio": 2.0}
# case: (the file's network, the authors' table shapes it carries, what spandrel 0.4.2 reads from that file:
# window, stripe, anchor down factor; spandrel always sets stripe_shift)
GRL_CASES = {
    "sr_x2_pixelshuffle": ({"upscale": 2, "upsampler": "pixelshuffle", "anchor_window_down_factor": 4}, {},
                           (32, [64, 64], 4)),
    "sr_x2_direct": ({"upscale": 2, "upsampler": "pixelshuffledirect", "anchor_window_down_factor": 4}, {},
                     (32, [64, 64], 4)),
    "bsr_x4_nearest": ({"upscale": 4, "upsampler": "nearest+conv", "anchor_window_down_factor": 4}, {},
                       (16, [32, 64], 4)),
    "x1": ({"anchor_window_down_factor": 4}, {}, (8, [8, 8], 4)),
    "authors_x2": ({"upscale": 2, "upsampler": "pixelshuffle", "anchor_window_down_factor": 4},
                   {"table_w": (1, 31, 31, 2), "table_sh": (1, 39, 39, 2), "table_sv": (1, 39, 39, 2),
                    "index_w": (256, 256), "index_sh_a2w": (64, 1024), "mask_w": (16, 256, 256)},
                   (16, [32, 32], 4)),
    "authors_x1": ({"anchor_window_down_factor": 2},
                   {"table_w": (1, 15, 15, 2), "table_sh": (1, 23, 47, 2), "index_sh_a2w": (128, 512),
                    "index_sv_w2a": (512, 128), "mask_sh_a2w": (8, 128, 512)},
                   (8, [16, 32], 2)),
}


@pytest.mark.parametrize("case", sorted(GRL_CASES))
def test_grl_geometry_is_read_as_spandrel_reads_it(case: str) -> None:
    arch, tables, (window, stripe, down) = GRL_CASES[case]
    sd = _seeded({**GRL_BODY, **arch})
    sd.update({k: torch.zeros(shape, dtype=torch.long if k.startswith("index") else torch.float32)
               for k, shape in tables.items()})
    found = recognise(sd, f"{case}.pth")
    assert found.opt["type"] == "GRL"
    got = (found.opt["window_size"], list(found.opt["stripe_size"]), found.opt["anchor_window_down_factor"])
    assert got == (window, stripe, down)
    assert found.opt["stripe_shift"] is True
    net = build_network(dict(found.opt))
    load_into(net, sd, strict=True, source=f"{case}.pth")  # the authors' tables are dropped, not refused
    assert not set(tables) & set(net.state_dict())


# ------------------------------------------------------------------ 4. traiNNer-redux's long argument spellings
@pytest.mark.parametrize(("arch", "spelling", "head"), [
    ("mosr", "geoensemblepixelshuffle", "GPS"), ("mosr_t", "pixelshuffle", "Sequential"),
    ("mosr", "dysample", "DySample"), ("MoSR", "geoensemblepixelshuffle", "GPS"), ("MoSR", "gps", "GPS"),
])
def test_mosr_takes_trainner_redux_upsampler_spellings(arch: str, spelling: str, head: str) -> None:
    """traiNNer-redux maps pixelshuffle / geoensemblepixelshuffle / dysample to ps / gps / dys (its MoSR
    templates say ``upsampler: geoensemblepixelshuffle``)."""
    with torch.device("meta"):
        net = build_network({"type": arch, "upsampler": spelling, "upscale" if arch == "MoSR" else "scale": 2})
    assert type(net.upsampler).__name__ == head


# ------------------------------------------------------------------ 5. nothing already there is lost
def test_atomic_write_follows_a_symlink_and_keeps_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    with caplog.at_level(logging.INFO, logger="anysr"):
        written = atomic_write_bytes(link, b"new")
    assert link.is_symlink() and target.read_bytes() == b"new" and written == target.resolve()
    assert "symbolic link" in caplog.text


def test_atomic_write_writes_through_a_pipe(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # holds the pipe open: the writer does not wait
    try:
        assert atomic_write_bytes(fifo, b"row\n") == fifo
        assert os.read(reader, 100) == b"row\n"
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and not list(tmp_path.glob(".pipe.tmp-*"))


def test_atomic_write_writes_through_a_process_descriptor(tmp_path: Path) -> None:
    """``/dev/stdout`` links to ``/proc/self/fd/1``: the open file behind it is written, the link kept."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("no /proc/self/fd")
    out = tmp_path / "stdout.txt"
    out.write_bytes(b"before\n")
    fd = os.open(out, os.O_WRONLY | os.O_APPEND)
    link = tmp_path / "stdout"
    link.symlink_to(f"/proc/self/fd/{fd}")
    try:
        atomic_write_bytes(link, b"after\n")
    finally:
        os.close(fd)
    assert link.is_symlink() and out.read_bytes() == b"before\nafter\n"


def test_schema_output_to_a_symlink_says_which_file_it_wrote(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "schema.json"
    link = tmp_path / "schema-link.json"
    link.symlink_to(target)
    assert cli_main(["schema", "-o", str(link)]) == 0
    assert link.is_symlink() and json.loads(target.read_text())
    assert f"wrote {target.resolve()}" in capsys.readouterr().out


def _image(path: Path, value: int = 128, size: int = 16) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), np.full((size, size, 3), value, np.uint8))
    return path


def test_infer_into_the_inputs_folder_does_not_replace_an_original_beside_them(tmp_path: Path) -> None:
    photos = tmp_path / "photos"
    jpg, png = _image(photos / "a.jpg"), _image(photos / "a.png", 7)
    before = png.read_bytes()
    with pytest.raises(DataError, match=r"would replace .*a\.png, a file already in the inputs' folder"):
        output_paths([jpg], photos, None)
    assert png.read_bytes() == before
    assert output_paths([jpg], tmp_path / "out", None) == [tmp_path / "out" / "a.png"]


@pytest.mark.parametrize("command", ["lr", "modcrop", "subimages"])
def test_prepare_refuses_two_inputs_with_one_result_name(command: str, tmp_path: Path) -> None:
    src = tmp_path / "hr"
    _image(src / "a.png", 10, 32), _image(src / "a.jpg", 200, 32), _image(src / "b.png", 50, 32)
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"several files share a stem \(a\.jpg, a\.png -> a\)"):
        if command == "lr":
            prepare_lr(src, out, 2, progress=False)
        elif command == "modcrop":
            prepare_modcrop(src, out, 2, progress=False)
        else:
            extract_subimages(src, out, 16, 8, 0, progress=False)
    assert not out.exists() or not any(out.iterdir())


def test_subimages_refuses_a_div2k_lr_name_clash(tmp_path: Path) -> None:
    """0001.png and 0001x2.png give the same crop names (the scale suffix is dropped)."""
    src = tmp_path / "lr"
    _image(src / "0001.png", 10, 32), _image(src / "0001x2.png", 20, 32)
    with pytest.raises(DataError, match=r"0001\.png, 0001x2\.png -> 0001"):
        extract_subimages(src, tmp_path / "out", 16, 8, 0, progress=False)


def test_anysr_test_twice_archives_the_first_results(tmp_path: Path) -> None:
    _image(tmp_path / "datasets" / "Set5" / "HR" / "bird.png", 90, 32)
    args = ["test", "-opt", str(ROOT / "options" / "test" / "test_Bicubic_x2.yml"), "--force_yml",
            f"path.root={tmp_path}", "accelerator=cpu", "datasets.test_2=~", "val.metrics=~"]
    assert cli_main(args) == 0
    results = tmp_path / "results" / "Bicubic_x2"
    first = (results / "summary.json").read_bytes()
    (results / "notes.txt").write_text("mine")
    assert cli_main(args) == 0
    archived = list((tmp_path / "results").glob("Bicubic_x2_archived_*"))
    assert len(archived) == 1
    assert (archived[0] / "summary.json").read_bytes() == first
    assert (archived[0] / "notes.txt").read_text() == "mine"
    assert (archived[0] / "visualization" / "Set5").is_dir() and (results / "summary.json").is_file()


# ------------------------------------------------------------------ 6. seeds, validation crops, --start-over
QUICK = ROOT / "options" / "train" / "quickstart_EDSR_x2.yml"


def _train(tmp_path: Path, *over: str, start_over: bool = False) -> list[str]:
    """``anysr train`` of the quick start on 4 random 48x48 images, 1 iteration, no validation unless asked."""
    for i in range(4):
        _image(tmp_path / "imgs" / f"{i}.png", 40 * i + 20, 48)
    return ["train", "-opt", str(QUICK), "--data", str(tmp_path / "imgs"), *(["--start-over"] if start_over else []),
            "--force_yml", f"path.root={tmp_path}", "accelerator=cpu", "num_gpu=1", "train.total_iter=1",
            "logger.use_tb_logger=false", "datasets.train.gt_size=32", "datasets.train.batch_size_per_gpu=1",
            "train.precision=fp32", "train.channels_last=false", "network_g.num_feat=8", "network_g.num_block=1",
            "val=null", "datasets.val_1=null", "datasets.val_2=null", *over]


def test_a_seed_past_63_bits_is_one_line_and_the_largest_trains(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(_train(tmp_path, f"manual_seed={2**63}")) != 0
    err = capsys.readouterr().err
    assert "manual_seed: must be from 0 to 2**63 - 1" in err and "Traceback" not in err
    assert cli_main(_train(tmp_path, f"manual_seed={2**63 - 1}")) == 0


def test_a_validation_image_cropped_away_is_refused_at_start_up(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _image(tmp_path / "val" / "tiny.png", 99, 6)
    _image(tmp_path / "val" / "fine.png", 99, 32)
    args = _train(tmp_path, "val.val_freq=1", "datasets.val_1.name=V", f"datasets.val_1.dataroot_gt={tmp_path / 'val'}",
                  "datasets.val_1.type=PairedImageDataset", "datasets.val_1.lq_from_gt=true",
                  "datasets.val_1.io_backend.type=disk", "val.metrics.psnr.type=calculate_psnr",
                  "val.metrics.psnr.crop_border=3")
    args.remove("val=null")
    args.remove("datasets.val_1=null")
    assert cli_main(args) != 0
    err = capsys.readouterr().err
    assert "tiny.png is 6 pixels on its shorter side" in err and "val.metrics.psnr.crop_border 3" in err
    assert "fine.png" not in err and not list((tmp_path / "experiments" / "quickstart_EDSR_x2" / "models").glob("*"))


def test_start_over_with_training_states_outside_the_experiment_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    states = tmp_path / "elsewhere"
    outside = f"path.training_states={states}"
    assert cli_main(_train(tmp_path, outside, "logger.save_checkpoint_freq=1")) == 0
    exp = tmp_path / "experiments" / "quickstart_EDSR_x2"
    before = sorted(p.name for p in exp.iterdir())
    assert cli_main(_train(tmp_path, outside, start_over=True)) != 0
    err = capsys.readouterr().err
    assert f"path.training_states {states} is outside" in err and "nothing was changed" in err
    assert not list(exp.glob("archived_*")) and sorted(p.name for p in exp.iterdir()) == before
    assert (states / "1.state").is_file()

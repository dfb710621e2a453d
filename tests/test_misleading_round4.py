"""Held-out round four, the misleading messages (issue 40, item 24): each case now names the real culprit and the
fix in the user's own terms. Run in-process through ``anysr.cli.main`` (the same code as the command line)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import tiny_train_options

from anysr.cli import main

TOML = """name = "neo"
model_type = "otf"
scale = 2
[network_g]
type = "span"
[datasets.train]
type = "paired"
dataroot_gt = "{gt}"
dataroot_lq = "{gt}"
patch_size = 32
batch_size = 2
[train]
total_iter = 2
[train.optim_g]
type = "adamw"
lr = 1e-4
"""


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def _yaml(tmp_path: Path, opt: dict, name: str = "o.yml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(opt))
    return path


def test_dev_null_is_empty_not_a_folder(capsys: pytest.CaptureFixture[str]) -> None:
    err = _cli(capsys, "train", "-opt", "/dev/null")
    assert "'/dev/null' is empty; it needs at least name, scale and network_g" in err and "folder" not in err


def test_a_pipe_is_read(tmp_path: Path, small_train_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``-opt <(...)``: a pipe holds the options (here a FIFO standing in for bash's /dev/fd/N)."""
    import os
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    opt = tiny_train_options("piped", small_train_dir, None)
    opt["datasets"]["train"]["dataset_enlarge_ratio"] = 10**12

    def feed() -> None:
        with open(fifo, "w") as f:
            f.write(yaml.safe_dump(opt))

    threading.Thread(target=feed, daemon=True).start()
    err = _cli(capsys, "train", "-opt", str(fifo), "--force_yml", f"path.root={tmp_path}")
    assert "is a folder" not in err
    # ... and the ratio is what is blamed (not the batch size or gt_size), with its largest workable value
    assert "dataset_enlarge_ratio 1000000000000 x 8 image(s)" in err
    assert "dataset_enlarge_ratio at most 12,500,000" in err


def test_toml_named_yml_and_yaml_named_toml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "neo.yml").write_text(TOML.format(gt=tmp_path))
    err = _cli(capsys, "train", "-opt", str(tmp_path / "neo.yml"))
    assert "is TOML (neosr's format" in err and "rename it to neo.toml" in err
    (tmp_path / "basic.toml").write_text("name: x\nscale: 2\nnetwork_g:\n  type: EDSR\n")
    err = _cli(capsys, "train", "-opt", str(tmp_path / "basic.toml"))
    assert "is YAML ('key: value' lines) but named .toml" in err and "rename it to basic.yml" in err


def test_neosr_otf_with_pairs_says_neosr_names(tmp_path: Path, small_train_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "neo.toml").write_text(TOML.format(gt=small_train_dir))
    err = _cli(capsys, "train", "-opt", str(tmp_path / "neo.toml"))
    assert 'set model_type = "image"' in err and "high_order_degradation" not in err


def test_trainner_ganloss_without_network_d_names_it(tmp_path: Path, small_train_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    opt = tiny_train_options("gan", small_train_dir, None)
    opt["train"].pop("pixel_opt")
    opt["train"]["losses"] = [{"type": "l1loss", "loss_weight": 1.0},
                              {"type": "ganloss", "gan_type": "vanilla", "loss_weight": 0.1}]
    err = _cli(capsys, "train", "-opt", str(_yaml(tmp_path, opt)))
    assert "add network_d, the discriminator it trains against" in err


@pytest.mark.parametrize("scale", ["1.5", "x2"])
def test_prepare_lr_fractional_scale(tmp_path: Path, scale: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _cli(capsys, "prepare", "lr", "--hr", str(tmp_path), "--out", str(tmp_path / "o"), "--scale", scale)
    assert f"'{scale}' is not a whole scale factor" in err and "_positive" not in err


def test_anysr_test_honours_path_visualization_and_names_metrics_it_cannot_compute(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 23: ``path.visualization`` under ``anysr test`` is where the images go; ``val.metrics`` on a set
    without ground truth says so instead of an empty 'average n=5' line."""
    import shutil

    from conftest import DATASETS

    shutil.copytree(DATASETS / "Set5" / "HR", tmp_path / "lq")
    opt = {"name": "nogt", "model_type": "SRModel", "scale": 2, "accelerator": "cpu", "num_gpu": 1,
           "datasets": {"test_1": {"name": "Set5lq", "type": "SingleImageDataset", "dataroot_lq": str(tmp_path / "lq"),
                                   "io_backend": {"type": "disk"}}},
           "network_g": {"type": "Bicubic", "upscale": 2}, "path": {"pretrain_network_g": None,
                                                                     "visualization": str(tmp_path / "pictures")},
           "val": {"save_img": True, "metrics": {"psnr": {"type": "calculate_psnr", "crop_border": 2}}}}
    assert main(["test", "-opt", str(_yaml(tmp_path, opt)), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert len(list((tmp_path / "pictures" / "Set5lq").glob("*.png"))) == 5
    assert not (tmp_path / "results" / "nogt" / "visualization").exists()
    text = capsys.readouterr().out
    assert "Set5lq: psnr not computed: the set has no ground truth (dataroot_gt) and it needs it" in text
    assert "Set5lq: 5 images, no metrics" in text and "average  n=" not in text


def test_own_data_guesses(tmp_path: Path, small_train_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Item 9: a missing DIV2K names --data; a folder of albums says sub-folders are not read; --data says which
    of the file's settings (name, total_iter) it keeps."""
    from conftest import ROOT

    err = _cli(capsys, "train", "-opt", str(ROOT / "options" / "train" / "train_EDSR_Mx2.yml"), "--force_yml",
               f"path.root={tmp_path}", "accelerator=cpu")
    assert "`anysr prepare fetch" in err and "--data DIR` (a folder of HR images)" in err
    albums = tmp_path / "photos"
    for album in ("2023", "2024"):
        (albums / album).mkdir(parents=True)
        import shutil
        shutil.copy(next(small_train_dir.glob("*.png")), albums / album / "a.png")
    opt = tiny_train_options("albums", albums, None)
    err = _cli(capsys, "train", "-opt", str(_yaml(tmp_path, opt)), "--force_yml", f"path.root={tmp_path}")
    assert "its images are in sub-folders ('2023', '2024'), which are not read" in err
    err = _cli(capsys, "infer", "-i", str(albums), "-o", str(tmp_path / "out"), "--arch", "Bicubic", "--scale", "2")
    assert "its images are in sub-folders" in err
    import argparse

    from anysr.cli import _data_note, load_command_options
    from anysr.options.loader import data_overrides

    edsr = ROOT / "options" / "train" / "train_EDSR_Mx2.yml"
    for given, says in (([], ("name '201_EDSR_Mx2_f64b16_DIV2K_300k_B16G1'", "train.total_iter 300,000",
                              "--force_yml name=my_run train.total_iter=N")),
                        (["name=mine"], ("train.total_iter 300,000", "--force_yml train.total_iter=N"))):
        args = argparse.Namespace(data=str(small_train_dir), opt=str(edsr), force_yml=given)
        opt = load_command_options(edsr, data_overrides(edsr, small_train_dir) + given, is_train=True,
                                   check_paths=False)
        note = _data_note(args, opt)
        assert note.startswith(f"--data {small_train_dir}: training on its images with the rest of {edsr}")
        assert all(x in note for x in says), note
        assert ("name '" in note) == (not given)

"""Reading weights from anywhere: ``param_key: auto``, wrapper prefixes, the mismatch table, partial loads across
scales, and the BasicSR-repo model types (HAT, DAT, DRCT option files as their authors publish them)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import torch
import yaml
from conftest import tiny_train_options, write_options

from anysr.archs import build_network
from anysr.engine import checkpoint as ck
from anysr.errors import CheckpointError
from anysr.options import load_options


def _edsr(upscale: int = 2, seed: int = 3) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_network({"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1,
                          "upscale": upscale})


def _groups() -> dict[str, dict[str, torch.Tensor]]:
    params = _edsr().state_dict()
    return {"params": params, "params_ema": {k: v + 1 for k, v in params.items()}}


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_param_key_auto_prefers_ema_then_params_then_bare(tmp_path: Path, suffix: str) -> None:
    groups = _groups()
    both, only, bare = tmp_path / f"both{suffix}", tmp_path / f"params{suffix}", tmp_path / "bare.pth"
    save = ck.save_weights_pth if suffix == ".pth" else ck.save_weights
    save(both, groups)
    save(only, {"params": groups["params"]})
    torch.save(groups["params"], bare)
    sd, _, group = ck.read_weights(both, "auto")
    assert group == "params_ema" and torch.equal(sd["conv_first.weight"], groups["params_ema"]["conv_first.weight"])
    sd, _, group = ck.read_weights(only, "auto")
    assert group == "params" and torch.equal(sd["conv_first.weight"], groups["params"]["conv_first.weight"])
    sd, _, group = ck.read_weights(bare, "auto")
    assert group is None and set(sd) == set(groups["params"])
    assert ck.read_weights(both, "params")[2] == "params"  # an explicit key is obeyed


def test_param_key_auto_names_what_the_file_holds(tmp_path: Path) -> None:
    path = tmp_path / "odd.pth"
    torch.save({"gen": _edsr().state_dict(), "disc": _edsr().state_dict()}, path)
    with pytest.raises(CheckpointError, match=r"no 'params_ema' or 'params' entry; it holds: 'gen', 'disc'"):
        ck.read_weights(path, "auto")


@pytest.mark.parametrize("prefix", ["netG.", "model.", "module.", "generator."])
def test_wrapper_prefixes_are_stripped_when_loading(prefix: str) -> None:
    src = _edsr(seed=5).state_dict()
    wrapped = {prefix + k: v for k, v in src.items()}
    net = _edsr(seed=6)
    ck.load_into(net, wrapped, strict=True, source="wrapped.pth")
    assert all(torch.equal(net.state_dict()[k], v) for k, v in src.items())


def test_a_prefix_the_network_itself_uses_is_kept() -> None:
    class Holder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = torch.nn.Conv2d(3, 3, 3)

    src = Holder().state_dict()  # model.weight, model.bias: the network's own names
    net = Holder()
    ck.load_into(net, src, strict=True, source="own.pth")
    assert torch.equal(net.model.weight, src["model.weight"])


def test_mismatch_is_a_table_of_names_and_shapes() -> None:
    sd = _edsr(upscale=4).state_dict()
    x3 = build_network({"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1,
                        "upscale": 3})
    with pytest.raises(CheckpointError) as err:
        ck.load_into(x3, sd, strict=True, source="x4.pth")
    first, *table = str(err.value).splitlines()
    assert first.startswith("x4.pth does not fit the network (10 of 12 tensors fit)") and "Fix:" in first
    assert table[0].split() == ["name", "file", "network"]
    rows = [re.split(r"\s{2,}", line.strip()) for line in table[1:]]
    assert rows == [["upsample.0.weight", "(32, 8, 3, 3)", "(72, 8, 3, 3)", "shape differs"],
                    ["upsample.0.bias", "(32,)", "(72,)", "shape differs"],
                    ["upsample.2.weight", "(32, 8, 3, 3)", "-", "not in the network"],
                    ["upsample.2.bias", "(32,)", "-", "not in the network"]]


def test_long_mismatch_tables_are_cut() -> None:
    table = ck.mismatch_table(_edsr().state_dict(), {}, limit=3)
    assert table.splitlines()[-1].strip() == "... and 9 more" and len(table.splitlines()) == 5


def test_partial_load_fine_tunes_across_scales(caplog: pytest.LogCaptureFixture) -> None:
    x2 = _edsr(upscale=2, seed=1).state_dict()
    x4 = _edsr(upscale=4, seed=2)
    before = {k: v.clone() for k, v in x4.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="anysr.engine.checkpoint"):
        ck.load_into(x4, x2, strict=False, source="edsr_x2.pth")
    now = x4.state_dict()
    shared = [k for k in now if k in x2 and x2[k].shape == now[k].shape]
    assert "conv_first.weight" in shared and "body.0.conv1.weight" in shared and "conv_last.weight" in shared
    assert all(torch.equal(now[k], x2[k]) for k in shared)  # the body comes from the x2 network
    rest = [k for k in now if k not in shared]
    assert rest and all(torch.equal(now[k], before[k]) for k in rest)  # the x4 upsampler keeps its init
    assert f"loaded {len(shared)} of {len(now)} network tensors" in caplog.text
    assert "missing from the file" in caplog.text  # the table comes with the warning


def test_training_starts_from_another_scale_with_strict_load_false(tmp_path: Path, small_train_dir: Path) -> None:
    """The option path of a cross-scale fine-tune: x2 weights, an x4 run, strict_load_g: false."""
    from anysr.cli import main

    weights = tmp_path / "edsr_x2.safetensors"
    ck.save_weights(weights, {"params": _edsr(upscale=2, seed=1).state_dict()})
    opt = tiny_train_options("x2_to_x4", small_train_dir, None, total_iter=1, scale=4)
    opt["network_g"] = {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1,
                        "upscale": 4}
    opt["datasets"]["train"]["gt_size"] = 64
    opt["path"] = {"pretrain_network_g": str(weights), "strict_load_g": False, "param_key_g": "auto",
                   "root": str(tmp_path)}
    assert main(["train", "-opt", str(write_options(tmp_path / "o.yml", opt))]) == 0
    assert (tmp_path / "experiments" / "x2_to_x4" / "models" / "net_g_1.safetensors").is_file()


# --------------------------------------------------------------------------------------------- the authors' files
HAT_TEST = """
name: HAT_SRx4_ImageNet-pretrain
model_type: HATModel
scale: 4
num_gpu: 1  # set num_gpu: 0 for cpu mode
manual_seed: 0
tile: # use the tile mode for limited GPU memory when testing.
  tile_size: 256
  tile_pad: 32
datasets:
  test_1:
    name: Set5
    type: PairedImageDataset
    dataroot_gt: ./datasets/Set5/GTmod4
    dataroot_lq: ./datasets/Set5/LRbicx4
    io_backend:
      type: disk
network_g:
  type: HAT
  upscale: 4
  in_chans: 3
  img_size: 64
  window_size: 16
  compress_ratio: 3
  squeeze_factor: 30
  conv_scale: 0.01
  overlap_ratio: 0.5
  img_range: 1.
  depths: [6, 6, 6, 6, 6, 6]
  embed_dim: 180
  num_heads: [6, 6, 6, 6, 6, 6]
  mlp_ratio: 2
  upsampler: 'pixelshuffle'
  resi_connection: '1conv'
path:
  pretrain_network_g: ./experiments/pretrained_models/HAT_SRx4_ImageNet-pretrain.pth
  strict_load_g: true
  param_key_g: 'params_ema'
val:
  save_img: true
  suffix: ~
  metrics:
    psnr:
      type: calculate_psnr
      crop_border: 4
      test_y_channel: true
"""

DAT_TEST = """
name: test_DAT_x2
model_type: DATModel
scale: 2
num_gpu: 1
manual_seed: 10
datasets:
  test_1:
    task: SR
    name: Set5
    type: PairedImageDataset
    dataroot_gt: datasets/benchmark/Set5/HR
    dataroot_lq: datasets/benchmark/Set5/LR_bicubic/X2
    filename_tmpl: '{}x2'
    io_backend:
      type: disk
network_g:
  type: DAT
  upscale: 2
  in_chans: 3
  img_size: 64
  img_range: 1.
  split_size: [8,32]
  depth: [6,6,6,6,6,6]
  embed_dim: 180
  num_heads: [6,6,6,6,6,6]
  expansion_factor: 4
  resi_connection: '1conv'
path:
  pretrain_network_g: experiments/pretrained_models/DAT/DAT_x2.pth
  strict_load_g: True
val:
  save_img: True
  suffix: ~
  use_chop: False  # True to save memory, if img too large
  metrics:
    psnr:
      type: calculate_psnr
      crop_border: 2
      test_y_channel: True
"""


def test_hat_and_dat_test_files_load_as_published(tmp_path: Path) -> None:
    hat = load_options(write_text(tmp_path / "hat.yml", HAT_TEST), [], is_train=False, check_paths=False)
    assert hat.model_type == "HATModel" and (hat.val.tile, hat.val.tile_pad) == (256, 32)
    dat = load_options(write_text(tmp_path / "dat.yml", DAT_TEST), [], is_train=False, check_paths=False)
    assert dat.model_type == "DATModel" and "task" not in dat.datasets["test_1"] and dat.val.tile is None
    drct = yaml.safe_load(HAT_TEST)
    drct.update(model_type="DRCTModel", network_g={**drct["network_g"], "type": "DRCT"})
    opt = load_options(write_options(tmp_path / "drct.yml", drct), [], is_train=False, check_paths=False)
    assert opt.model_type == "DRCTModel"


def test_top_level_tile_and_val_tile_must_agree(tmp_path: Path) -> None:
    from anysr.errors import OptionError

    opt = yaml.safe_load(HAT_TEST)
    opt["val"]["tile"] = 128
    with pytest.raises(OptionError, match=r"tile.tile_size: 256 differs from val.tile \(128\)"):
        load_options(write_options(tmp_path / "o.yml", opt), [], is_train=False, check_paths=False)


def write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path

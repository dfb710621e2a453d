"""BasicSR-compatibility defects found by trying BasicSR / Real-ESRGAN files as a user would (one test each)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli, tiny_train_options, write_options

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.cli import build_parser
from anysr.options import load_options

PRETRAINED = ROOT / "pretrained" / "realesr-animevideov3.pth"


@pytest.mark.slow
def test_nccl_from_a_basicsr_file_on_cpu_ranks_becomes_gloo(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("nccl", small_train_dir, None, total_iter=2)
    opt.update(num_gpu=2, dist_params={"backend": "nccl", "port": 29500})
    opt["datasets"]["train"]["batch_size_per_gpu"] = 2
    path = write_options(tmp_path / "o.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "dist_params.port=null",
                   cwd=tmp_path)
    assert "dist_params.backend: nccl cannot serve CPU ranks; using gloo" in proc.stdout
    summary = json.loads((tmp_path / "experiments" / "nccl" / "summary.json").read_text())
    assert summary["accelerator"]["world_size"] == 2 and summary["iterations_done"] == 2


def test_repeated_flags_add_up(tmp_path: Path) -> None:
    args = build_parser().parse_args(["infer", "--arch", "SRVGGNetCompact", "--arch-opt", "num_feat=64",
                                      "--arch-opt", "num_conv=16", "upscale=4", "--arch-opt", "act_type=prelu",
                                      "-i", "x", "-o", "y"])
    assert args.arch_opt == ["num_feat=64", "num_conv=16", "upscale=4", "act_type=prelu"]
    args = build_parser().parse_args(["train", "-opt", "o.yml", "--force_yml", "a=1", "--force_yml", "b=2"])
    assert args.force_yml == ["a=1", "b=2"]
    # through the CLI: the released network is built with every repeated value (it loads strictly, so a width
    # left at its default would fail)
    img = ROOT / "datasets" / "Set5" / "HR" / "baby.png"
    run_cli("infer", "--weights", str(PRETRAINED), "--arch", "SRVGGNetCompact", "--arch-opt", "num_feat=64",
            "--arch-opt", "num_conv=16", "--arch-opt", "upscale=4", "act_type=prelu", "-i", str(img), "-o",
            str(tmp_path / "o"), "--tile", "64", "--precision", "fp32", cwd=tmp_path)
    assert (tmp_path / "o" / "baby.png").is_file()


def test_ddp_options_reach_ddp(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("ddp", small_train_dir, None)
    opt.update(find_unused_parameters=True, use_static_graph=True)
    loaded = load_options(write_options(tmp_path / "o.yml", opt), is_train=True)
    plan = resolve_plan("cpu", 1, find_unused_parameters=loaded.find_unused_parameters,
                        static_graph=loaded.use_static_graph)
    assert plan.ddp == {"find_unused_parameters": True, "static_graph": True}
    acc = create_accelerator(plan)
    acc.setup()
    acc.strategy.world_size = 2  # as a second rank would make it; DDP itself is tested with real ranks elsewhere
    seen: dict[str, object] = {}

    class FakeDDP(torch.nn.Module):
        def __init__(self, module: torch.nn.Module, **kwargs: object) -> None:
            super().__init__()
            self.module = module
            seen.update(kwargs)

    import anysr.accelerators.torch_dist as td

    real = td.DistributedDataParallel
    td.DistributedDataParallel = FakeDDP  # type: ignore[misc]
    try:
        acc.prepare_model(torch.nn.Conv2d(3, 3, 3))
    finally:
        td.DistributedDataParallel = real  # type: ignore[misc]
    assert seen["find_unused_parameters"] is True and seen["static_graph"] is True


def test_test_without_val_section_uses_the_schema_default(tmp_path: Path) -> None:
    """val.save_img has one default (false), whether or not the file has a val section."""
    opt = {"name": "t", "scale": 2, "network_g": {"type": "Bicubic", "upscale": 2},
           "datasets": {"test": {"type": "PairedImageDataset", "dataroot_gt": str(ROOT / "datasets" / "Set5" / "HR"),
                                 "lq_from_gt": True}}}
    loaded = load_options(write_options(tmp_path / "t.yml", opt), is_train=False)
    assert loaded.val.save_img is False and loaded.val.metrics is None


def test_bench_runs_a_gan_file_without_its_vgg_weights(tmp_path: Path) -> None:
    proc = run_cli("bench", "-opt", str(ROOT / "options" / "train" / "train_ESRGAN_x4.yml"), "--iters", "1",
                   "--warmup", "0", "--infer-size", "0", "--precision", "fp32", "--force_yml", "accelerator=cpu",
                   "datasets.train.batch_size_per_gpu=1", "train.channels_last=false", "network_d.num_feat=8",
                   "network_g.num_feat=8", "network_g.num_block=1", "network_g.num_grow_ch=4", cwd=tmp_path)
    assert "train" in proc.stdout and "ms (median)" in proc.stdout

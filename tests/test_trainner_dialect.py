"""traiNNer-redux's option files accepted as they are: each of its keys mapped onto anysr's (one note each, logged in
one line at start), refused with its reason, or accepted and ignored; BasicSR files unchanged; such files train."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import DATASETS, assert_same_weights, run_cli, saved_weights, tiny_train_options, write_options
from torch import nn

from anysr.errors import OptionError
from anysr.models.ema import EMA
from anysr.options import load_options, validate_options
from anysr.options.common import registered

T91 = DATASETS / "T91" / "HR"
SET5 = DATASETS / "Set5" / "HR"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "trainner"


def dialect(**changes: Any) -> dict[str, Any]:
    """A small option file in traiNNer-redux's dialect (SPAN x2, LQ made from T91 by bicubic). ``changes``:
    ``key=value`` at the top level, ``section__key=value`` inside a section, ``train_set__key`` in datasets.train."""
    opt: dict[str, Any] = {
        "name": "dialect", "scale": 2, "num_gpu": "auto", "accelerator": "cpu",
        "use_amp": False, "amp_bf16": False, "use_channels_last": False, "fast_matmul": False,
        "use_compile": False, "compile_mode": "default",
        "datasets": {
            "train": {"name": "Train Dataset", "type": "pairedimagedataset", "dataroot_gt": [str(T91)],
                      "lq_from_gt": True, "lq_size": 16, "use_hflip": True, "use_rot": True,
                      "num_worker_per_gpu": 0, "batch_size_per_gpu": 2, "accum_iter": 1},
            "val": {"name": "Val Dataset", "type": "pairedimagedataset", "dataroot_gt": [str(SET5)],
                    "lq_from_gt": True},
        },
        "network_g": {"type": "span", "upscale": 2, "feature_channels": 8},
        "path": {"param_key_g": None, "strict_load_g": True, "resume_state": None},
        "train": {"ema_decay": 0.999, "grad_clip": False, "grad_clip_max_norm": 100,
                  "optim_g": {"type": "AdamW", "lr": 5e-4, "weight_decay": 0, "betas": [0.9, 0.99]},
                  "scheduler": {"type": "MultiStepLR", "milestones": [1000], "gamma": 0.5},
                  "total_iter": 4, "warmup_iter": -1,
                  "losses": [{"type": "charbonnierloss", "loss_weight": 1.0}, {"type": "ldlloss", "loss_weight": 0}]},
        "val": {"val_enabled": True, "val_freq": 1000, "save_img": False, "tile_size": 0, "tile_overlap": 8,
                "metrics_enabled": True, "metrics": {"psnr": {"type": "calculate_psnr", "crop_border": 2}}},
        "logger": {"print_freq": 2, "save_checkpoint_freq": 2, "save_checkpoint_format": "safetensors",
                   "use_tb_logger": False},
    }
    for key, value in changes.items():
        section, _, sub = key.partition("__")
        if section == "train_set":
            opt["datasets"]["train"][sub] = value
        elif sub:
            opt[section][sub] = value
        else:
            opt[key] = value
    return opt


def valid(opt: dict[str, Any], *, is_train: bool = True) -> Any:
    return validate_options(opt, is_train=is_train, root=Path.cwd())


def problem(opt: dict[str, Any]) -> str:
    with pytest.raises(OptionError) as err:
        valid(opt)
    return str(err.value)


# ---------------------------------------------------------------- each mapping (options only, fast)

@pytest.mark.parametrize(("amp", "bf16", "precision"), [(True, False, "auto"), (True, True, "auto"),
                                                        (False, False, "fp32"), (False, True, "fp32")])
def test_use_amp_maps_onto_precision(amp: bool, bf16: bool, precision: str) -> None:
    opt = valid(dialect(use_amp=amp, amp_bf16=bf16))
    assert opt.train.precision == precision
    assert f"train.precision {precision}" in "; ".join(opt.mapped_keys)


def test_use_amp_and_precision_disagreeing_are_refused() -> None:
    text = problem(dialect(use_amp=False, train__precision="bf16"))
    assert "use_amp" in text and "train.precision" in text and "keep one" in text
    assert valid(dialect(use_amp=True, train__precision="auto")).train.precision == "auto"  # the same: fine


@pytest.mark.parametrize(("given", "expected"), [(True, "auto"), (False, False)])
def test_use_channels_last(given: bool, expected: Any) -> None:
    assert valid(dialect(use_channels_last=given)).train.channels_last == expected


def test_use_compile_and_ignored_tuning_keys() -> None:
    opt = valid(dialect(use_compile=True, compile_mode="max-autotune", fast_matmul=True, detect_anomaly=True,
                        deterministic=False))
    assert opt.train.compile is True
    assert opt.mapped_keys[-1] == "ignored: compile_mode max-autotune, fast_matmul, detect_anomaly"
    for key in ("use_amp", "fast_matmul", "compile_mode", "detect_anomaly"):
        assert key not in opt  # validated, then dropped
    assert "compile_mode" in problem(dialect(compile_mode="fastest"))


@pytest.mark.parametrize(("clip", "norm", "expected"), [(True, 5, 5.0), (True, None, 100.0), (False, 5, None)])
def test_grad_clip(clip: bool, norm: float | None, expected: float | None) -> None:
    opt = dialect(train__grad_clip=clip)
    if norm is None:
        del opt["train"]["grad_clip_max_norm"]
    else:
        opt["train"]["grad_clip_max_norm"] = norm
    assert valid(opt).train.grad_clip_norm == expected


def test_lq_size_gives_gt_size_and_disagreement_is_one_line() -> None:
    assert valid(dialect()).datasets.train.gt_size == 32
    assert valid(dialect(train_set__gt_size=32)).datasets.train.gt_size == 32
    text = problem(dialect(train_set__gt_size=48))
    lines = text.splitlines()
    assert len(lines) == 2 and lines[0].startswith("1 problem")
    assert "datasets.train.lq_size" in lines[1] and "datasets.train.gt_size" in lines[1] and "48" in lines[1]


def test_accum_iter_and_enlarge_ratio() -> None:
    opt = valid(dialect(train_set__accum_iter=3, train_set__dataset_enlarge_ratio="auto"))
    assert opt.train.accumulate == 3 and opt.datasets.train.dataset_enlarge_ratio == 1
    assert "accum_iter" not in opt.datasets.train
    assert "accum_iter" in problem(dialect(train_set__accum_iter=2, train__accumulate=4))


def test_val_enabled_false_means_no_validation_and_nothing_of_it_checked() -> None:
    opt = dialect(val__val_enabled=False)
    opt["val"]["metrics"] = {"topiq": {"type": "calculate_topiq"}}  # not an anysr metric: unchecked, as there
    opt["datasets"]["val"]["dataroot_gt"] = ["/no/such/folder"]
    out = valid(opt)
    assert out.val is None and list(out.datasets) == ["train"]
    assert "val.val_enabled false -> no validation (datasets.val ignored)" in out.mapped_keys
    assert valid(dialect(val__val_enabled=False), is_train=False).val is not None  # `anysr test` keeps its sets


def test_val_tiles_and_metrics_enabled() -> None:
    opt = valid(dialect(val__tile_size=64, val__tile_overlap=8))
    assert (opt.val.tile, opt.val.tile_pad) == (64, 8)
    opt = valid(dialect(val__metrics_enabled=False))
    assert opt.val.tile is None and opt.val.metrics is None


def test_save_checkpoint_format() -> None:
    assert valid(dialect(logger__save_checkpoint_format="pth")).logger.save_format == ["safetensors", "pth"]
    assert valid(dialect()).logger.save_format == ["safetensors"]
    assert "save_checkpoint_format" in problem(dialect(logger__save_checkpoint_format="ckpt"))


def test_dataroot_lists_and_lower_case_dataset_type() -> None:
    opt = valid(dialect())
    assert opt.datasets.train.dataroot_gt == str(T91) and opt.datasets.train.type == "PairedImageDataset"
    assert valid(dialect(train_set__dataroot_gt=[str(T91), str(SET5)])).datasets.train.dataroot_gt == \
        [str(T91), str(SET5)]  # several folders: one dataset (tests/test_folder_lists.py)


def test_the_top_level_scale_goes_to_a_class_as_trainner_redux_passes_it() -> None:
    opt = dialect(network_g={"type": "SPAN", "feature_channels": 8})  # the class: its default upscale is 4
    out = valid(opt)
    assert out.network_g.upscale == 2 and any("network_g.upscale unset -> 2" in n for n in out.mapped_keys)
    given = valid(dialect(network_g={"type": "SPAN", "feature_channels": 8, "upscale": 2}))
    assert not any("network_g.upscale" in n for n in given.mapped_keys)
    assert "network_g.upscale: 4 differs from the top-level scale (2)" in \
        problem(dialect(network_g={"type": "SPAN", "feature_channels": 8, "upscale": 4}))


def test_trainner_defaults_apply_to_trainner_files_only() -> None:
    opt = dialect()
    del opt["datasets"]["train"]["use_hflip"], opt["datasets"]["train"]["use_rot"]
    out = valid(opt)
    assert out.datasets.train.use_hflip and out.datasets.train.use_rot  # traiNNer-redux's defaults
    assert out.train.ema_power == 10.0 and out.path.param_key_g == "auto"
    basicsr = tiny_train_options("basicsr", T91, None)
    del basicsr["datasets"]["train"]["use_hflip"]
    basicsr["path"]["param_key_g"] = None
    out = valid(basicsr)
    assert list(out.mapped_keys) == [] and out.train.ema_power is None
    assert out.datasets.train.use_hflip is False and out.path.param_key_g is None


def test_refused_keys_say_why() -> None:
    assert "adaptive discriminator" in problem(dialect(train__adaptive_d=True))
    assert "ECO" in problem(dialect(train__eco={"enabled": True}))
    assert "autoencoder" in problem(dialect(train__optim_ae={"type": "AdamW", "lr": 1e-4}))
    assert "input_pixel_format" in problem(dialect(input_pixel_format="yuv444"))
    opt = valid(dialect(train__adaptive_d=False, train__eco={"enabled": False}, train__restart_scheduler=True,
                        input_pixel_format="rgb", auto_resume=False))
    assert opt.mapped_keys[-1] == "ignored: restart_scheduler"
    if registered("optimizer", "AdamWScheduleFree") is not None:
        text = problem(dialect(train__ema_switch_iter=10, train__optim_g={"type": "AdamWScheduleFree", "lr": 1e-3}))
        assert "train.ema_switch_iter" in text


# ---------------------------------------------------------------- the EMA schedule (traiNNer-redux's, exact on resume)

def _reference_decays(beta: float, power: float, after: int, steps: int) -> list[float]:
    """ema-pytorch's rule written out: update s (from 0) copies while s <= after + 1 (the first averaging step
    copies first), else averages with 1 - (1 + s - after) ** -power, at most beta. 0 stands for a copy."""
    return [0.0 if s <= after + 1 else min(beta, 1 - (1 + s - after) ** -power) for s in range(steps)]


@pytest.mark.parametrize(("power", "after"), [(0.75, 0), (10.0, 0), (0.5, 3)])
def test_ema_power_schedule(power: float, after: int) -> None:
    ema = EMA(nn.Linear(2, 2), 0.999, power=power, update_after=after)
    got = []
    for _ in range(12):
        got.append(ema.current_decay())
        ema.updates += 1
    assert got == _reference_decays(0.999, power, after, 12)
    plain = EMA(nn.Linear(2, 2), 0.999)
    assert plain.current_decay() == pytest.approx(0.1)  # anysr's warm-up (BasicSR files) unchanged


def _train_ema(ema: EMA, net: nn.Module, steps: range) -> None:
    for step in steps:
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.sin(torch.arange(p.numel(), dtype=p.dtype).view_as(p) + step))
        ema.update(net)


def test_ema_switch_and_exact_resume() -> None:
    torch.manual_seed(0)
    net = nn.Linear(3, 3)
    first = copy.deepcopy(net)
    ema = EMA(net, 0.9, power=0.75, update_after=1, switch_every=4)
    _train_ema(ema, net, range(10))
    part_net = copy.deepcopy(first)
    part = EMA(part_net, 0.9, power=0.75, update_after=1, switch_every=4)
    _train_ema(part, part_net, range(5))
    state, weights = copy.deepcopy(part.state_dict()), copy.deepcopy(part_net.state_dict())
    resumed_net = copy.deepcopy(first)
    resumed_net.load_state_dict(weights)
    resumed = EMA(resumed_net, 0.9, power=0.75, update_after=1, switch_every=4)
    resumed.load_state_dict(state)
    _train_ema(resumed, resumed_net, range(5, 10))
    for a, b in zip(list(net.parameters()) + list(ema.module.parameters()),
                    list(resumed_net.parameters()) + list(resumed.module.parameters())):
        assert torch.equal(a, b)
    # update 8 switched: the network took the EMA weights, then moved on by one step
    net2 = copy.deepcopy(first)
    ema2 = EMA(net2, 0.9, power=0.75, update_after=1, switch_every=4)
    _train_ema(ema2, net2, range(9))
    assert all(torch.equal(p, e) for p, e in zip(net2.parameters(), ema2.module.parameters()))


# ---------------------------------------------------------------- training through the command line

def _paired(tmp: Path, scale: int) -> tuple[Path, Path]:
    """GT (six T91 images cropped to a multiple of scale) and their LQ by OpenCV's area resize: a paired set."""
    import cv2

    gt_dir, lq_dir = tmp / "hr", tmp / "lr"
    gt_dir.mkdir()
    lq_dir.mkdir()
    for p in sorted(T91.glob("*.png"))[:6]:
        img = cv2.imread(str(p), cv2.IMREAD_COLOR)
        h, w = (img.shape[0] // scale) * scale, (img.shape[1] // scale) * scale
        cv2.imwrite(str(gt_dir / p.name), img[:h, :w])
        cv2.imwrite(str(lq_dir / p.name), cv2.resize(img[:h, :w], (w // scale, h // scale),
                                                     interpolation=cv2.INTER_AREA))
    return gt_dir, lq_dir


ARCHS = {
    "SPAN": {"type": "span", "upscale": 2, "feature_channels": 8},
    "RealPLKSR": {"type": "realplksr", "upscaling_factor": 2, "dim": 8, "n_blocks": 1, "kernel_size": 5},
    "Compact": {"type": "SRVGGNetCompact", "upscale": 2, "num_feat": 8, "num_conv": 2},
    "ESRGAN": {"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "scale": 2, "num_feat": 8, "num_block": 1,
               "num_grow_ch": 4},
}


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.slow
def test_dialect_file_trains_through_the_cli(arch: str, tmp_path: Path) -> None:
    gt_dir, lq_dir = _paired(tmp_path, 2)
    opt = dialect(name=f"dialect_{arch}", network_g=ARCHS[arch], use_amp=arch == "SPAN", use_channels_last=True,
                  train__grad_clip=True, train__grad_clip_max_norm=10, train__ema_power=0.75,
                  train__ema_update_after_step=1, train__ema_switch_iter=3, train__total_iter=4,
                  train_set__accum_iter=2, train_set__dataset_enlarge_ratio="auto",
                  val__val_enabled=arch != "ESRGAN", val__val_freq=4, val__tile_size=24, val__tile_overlap=4,
                  logger__save_checkpoint_format="pth")
    train = opt["datasets"]["train"]
    del train["lq_from_gt"], train["use_hflip"], train["use_rot"]
    train.update(dataroot_gt=[str(gt_dir)], dataroot_lq=[str(lq_dir)])
    if arch == "SPAN":
        opt["train"]["use_moa"] = True
        opt["train"]["moa_augs"] = ["none", "cutblur"]
        opt["train"]["moa_probs"] = [0.5, 0.5]
    path = write_options(tmp_path / f"{arch}.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    log = proc.stdout + proc.stderr
    mapped = [line for line in log.splitlines() if "traiNNer-redux keys mapped:" in line]
    assert len(mapped) == 1, log
    line = mapped[0]
    precision = "auto" if arch == "SPAN" else "fp32"
    for part in (f"use_amp -> train.precision {precision}", "use_channels_last -> train.channels_last auto",
                 "train.grad_clip -> train.grad_clip_norm 10", "datasets.train.lq_size 16 -> gt_size 32",
                 "datasets.train.accum_iter -> train.accumulate 2", "dataset_enlarge_ratio auto -> 1",
                 "use_hflip/use_rot unset -> true", "logger.save_checkpoint_format pth", "path.param_key_g null"):
        assert part in line, line
    assert ("no validation" in line) == (arch == "ESRGAN")
    exp = tmp_path / "experiments" / f"dialect_{arch}"
    assert saved_weights(exp, 4) and (exp / "models" / "net_g_4.pth").is_file()
    assert ("INFO: validation " in log) == (arch != "ESRGAN")
    recorded = yaml.safe_load(next(exp.glob("options_*.yml")).read_text())
    assert "use_amp" not in recorded and recorded["mapped_keys"] and recorded["train"]["accumulate"] == 2


@pytest.mark.slow
def test_dialect_ema_and_clipping_resume_bit_exact(tmp_path: Path) -> None:
    """traiNNer-redux's EMA schedule, weight switch, gradient clipping and accumulation: 6 iterations straight ==
    4, stop, resume, 2 (weights and EMA, bit for bit)."""
    from anysr.cli import main

    def opt(name: str, total: int) -> Path:
        return write_options(tmp_path / f"{name}.yml", dialect(
            name=name, train__total_iter=total, train__ema_power=0.75, train__ema_update_after_step=1,
            train__ema_switch_iter=3, train__grad_clip=True, train__grad_clip_max_norm=0.05,
            train_set__accum_iter=2, val__val_enabled=False))

    assert main(["train", "-opt", str(opt("straight", 6)), "--force_yml", f"path.root={tmp_path}"]) == 0
    split = opt("split", 4)
    assert main(["train", "-opt", str(split), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(split), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=6"]) == 0
    a, b = saved_weights(tmp_path / "experiments" / "straight", 6), saved_weights(tmp_path / "experiments" / "split", 6)
    assert_same_weights(a, b)
    assert any(k.startswith("params_ema") for k in a)


@pytest.mark.xla
def test_dialect_ema_switch_trains_on_xla(tmp_path: Path) -> None:
    """The EMA's copy phase and weight switch on XLA, with accumulation and clipping (a copy_ there aliased buffers
    the optimizer step gives away: "buffer ... is deleted")."""
    pytest.importorskip("torch_xla")
    path = write_options(tmp_path / "x.yml", dialect(
        name="xla", accelerator="xla", num_gpu=1, train__total_iter=4, train__ema_power=0.75,
        train__ema_switch_iter=2, train__grad_clip=True, train_set__accum_iter=2, val__val_enabled=False))
    run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path,
            env={"PJRT_DEVICE": "CPU"})
    assert any(k.startswith("params_ema") for k in saved_weights(tmp_path / "experiments" / "xla", 4))


# ---------------------------------------------------------------- paraphrased traiNNer-redux templates

@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.yml")))
def test_template_paraphrases_validate(name: str) -> None:
    raw = yaml.safe_load((FIXTURES / name).read_text())
    opt = load_options(FIXTURES / name, is_train=True, root=FIXTURES, check_paths=False)
    assert opt.train.precision == "auto" and opt.train.channels_last == "auto" and opt.val is None
    assert opt.datasets.train.gt_size == raw["datasets"]["train"]["lq_size"] * raw["scale"]
    assert opt.train.ema_power == 0.75 and opt.path.param_key_g == "auto"
    assert opt.logger.save_format == (["safetensors", "pth"] if "pth" in (FIXTURES / name).read_text()
                                      else ["safetensors"])

"""traiNNer-redux's on-the-fly (OTF) degradation keys in anysr's Real-ESRGAN pipeline: each new stage (resize
filters, LQ unsharp mask, ThickLines, blur / JPEG probabilities, kernel size ranges), the option mapping of its
templates, and one of its OTF templates training through the CLI (with the LQ/GT debug pairs written)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import run_cli, write_options
from safetensors.torch import load_file

from anysr.data.degradation.realesrgan import (
    BlurSettings,
    DegradeStage,
    SynthesisSettings,
    degrade,
    draw_batch_choices,
    draw_degradation_kernel_params,
    draw_samples,
    lq_usm_sharpener,
    step_rng,
    synthesise,
)
from anysr.errors import OptionError
from anysr.ops.degradation import TRAINNER_RESIZE_MODES, USMSharp, lanczos_resize, resize_filtered, thick_lines
from anysr.ops.diffjpeg import DiffJPEG
from anysr.options import load_options

# traiNNer-redux's templates (its text, not ours): TRAINNER_TEMPLATES names a checkout's options/_templates folder
TEMPLATES = Path(os.environ.get("TRAINNER_TEMPLATES", "") or "/nonexistent") / "train"
SPAN_OTF = TEMPLATES / "SPAN" / "SPAN_OTF_fidelity.yml"
KINDS = ["iso", "aniso", "generalized_iso", "generalized_aniso", "plateau_iso", "plateau_aniso"]


def _image(size: int = 48, seed: int = 0) -> torch.Tensor:
    """A textured RGB batch of one in [0, 1] (edges and fine detail, so every filter shows)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(1, 3, size, size, generator=g)
    x = F.avg_pool2d(x, 3, 1, 1)
    x[..., size // 3: size // 2, :] = 1.0
    return x


def _stage(**kw: Any) -> DegradeStage:
    base: dict[str, Any] = {"resize_prob": [0.2, 0.7, 0.1], "resize_range": [0.5, 1.5], "gaussian_noise_prob": 1.0,
                            "noise_range": [0.0, 0.0], "poisson_scale_range": [0.0, 0.0], "gray_noise_prob": 0.0,
                            "jpeg_range": [40.0, 60.0]}
    base.update(kw)
    return DegradeStage(**base)


def _settings(first: dict[str, Any] | None = None, second: dict[str, Any] | None = None,
              **kw: Any) -> SynthesisSettings:
    return SynthesisSettings(2, 32, _stage(**(first or {})), _stage(**(second or {})), kw.pop("second_blur_prob", 1.0),
                             **kw)


class _CountingJPEG(DiffJPEG):
    def __init__(self) -> None:
        super().__init__(differentiable=False)
        self.calls = 0

    def forward(self, x: torch.Tensor, quality: Any) -> torch.Tensor:  # type: ignore[override]
        self.calls += 1
        return super().forward(x, quality)


def _degrade(settings: SynthesisSettings, seed: int = 3, src: torch.Tensor | None = None,
             jpeger: DiffJPEG | None = None, kernel1: torch.Tensor | None = None) -> torch.Tensor:
    x = _image(64) if src is None else src
    choices = draw_batch_choices(step_rng(seed, 0, 0), settings, tuple(x.shape[-2:]))  # type: ignore[arg-type]
    k = torch.zeros(1, 21, 21)
    k[0, 10, 8:13] = 0.2  # a horizontal box blur: visible when applied
    pulse = torch.zeros(1, 21, 21)
    pulse[0, 10, 10] = 1
    draws = draw_samples([seed], settings)
    gens = [torch.Generator().manual_seed(draws.field_seeds[0])]
    return degrade(x, k if kernel1 is None else kernel1, k, pulse, choices=choices, draws=draws, settings=settings,
                   gens=gens, jpeger=jpeger or DiffJPEG(differentiable=False))


# ------------------------------------------------------------------------------------------------ resize filters
def test_every_resize_filter_differs() -> None:
    x = _image()
    outs = {m: resize_filtered(x, m, size=(20, 20)) for m in TRAINNER_RESIZE_MODES}
    for m, y in outs.items():
        assert y.shape == (1, 3, 20, 20) and 0 <= float(y.min()) and float(y.max()) <= 1, m
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert (outs[a] - outs[b]).abs().max() > 1e-3, f"{a} and {b} give the same image"
    # bilinear / bicubic are antialiased (traiNNer-redux), unlike BasicSR's plain interpolation
    plain = F.interpolate(x, size=(20, 20), mode="bicubic").clamp(0, 1)
    aa = F.interpolate(x, size=(20, 20), mode="bicubic", antialias=True).clamp(0, 1)
    assert torch.equal(outs["bicubic"], aa) and (outs["bicubic"] - plain).abs().max() > 1e-2
    assert torch.equal(outs["nearest-exact"], F.interpolate(x, size=(20, 20), mode="nearest-exact"))
    # the scale factor gives round(h * s) pixels
    assert resize_filtered(x, "lanczos", scale_factor=0.55).shape[-2:] == (round(48 * 0.55),) * 2
    with pytest.raises(OptionError, match="lanczos"):
        resize_filtered(x, "lanczos4", size=(8, 8))


def test_lanczos_matches_the_window_formula() -> None:
    """Shrinking one axis: a Lanczos-3 low-pass at the output rate, then bicubic sampling; growing: bicubic."""
    x = _image(30)
    up = lanczos_resize(x, (45, 45))
    assert torch.allclose(up, F.interpolate(x, size=(45, 45), mode="bicubic").clamp(0, 1))
    r = 15 / 30
    t = np.arange(-math.ceil(3 / r) + 1, math.ceil(3 / r)) * r
    w = np.sinc(t) * np.sinc(t / 3)
    w = torch.tensor(w / w.sum(), dtype=torch.float32)
    planes = x.reshape(3, 1, 30, 30)
    ref = F.conv2d(F.pad(planes, (0, 0, len(w) // 2, len(w) // 2), mode="reflect"), w.reshape(1, 1, -1, 1))
    ref = F.interpolate(ref, size=(15, 30), mode="bicubic").clamp(0, 1).reshape(1, 3, 15, 30)
    assert torch.allclose(lanczos_resize(x, (15, 30)), ref, atol=1e-6)
    flat = torch.full((1, 3, 40, 40), 0.25)
    assert torch.allclose(lanczos_resize(flat, (13, 17)), flat[..., :13, :17], atol=1e-6)


def test_resize_mode_list_picks_the_filter() -> None:
    """The pipeline resizes with the listed filter: one-filter lists give different LQ; weights choose."""
    outs = {m: _degrade(_settings({"resize_mode_list": [m], "jpeg_prob": 0.0}, {"resize_mode_list": [m],
                                                                                "jpeg_prob": 0.0},
                                  resize_mode_list3=[m]))
            for m in ("nearest-exact", "lanczos", "bilinear")}
    assert (outs["nearest-exact"] - outs["lanczos"]).abs().max() > 0.02
    assert (outs["bilinear"] - outs["lanczos"]).abs().max() > 0.01
    settings = _settings({"resize_mode_list": ["area", "lanczos"], "resize_mode_prob": [0, 1]},
                         {"resize_mode_list": ["area", "lanczos"], "resize_mode_prob": [1, 0]},
                         resize_mode_list3=["nearest-exact", "bicubic"], resize_mode_prob3=[0, 1])
    for seed in range(20):
        c = draw_batch_choices(step_rng(seed, 0, 0), settings, (64, 64))
        assert (c.mode1, c.mode2, c.final_mode) == ("lanczos", "area", "bicubic")
    with pytest.raises(OptionError, match="resize_mode_list"):
        _stage(resize_mode_list=["bicubic", "spline"])
    with pytest.raises(OptionError, match="weights"):
        _stage(resize_mode_list=["bicubic", "area"], resize_mode_prob=[1.0])


def test_basicsr_draws_unchanged_by_the_new_keys() -> None:
    """Without traiNNer-redux's keys the batch choices are BasicSR's; its coins come after them."""
    plain = _settings()
    redux = _settings({"jpeg_prob": 0.3}, {"jpeg_prob": 0.6}, blur_prob=0.5, thicklines_prob=0.5, lq_usm=True)
    for seed in range(10):
        a = draw_batch_choices(step_rng(seed, 1, 0), plain, (64, 64)).as_dict()
        b = draw_batch_choices(step_rng(seed, 1, 0), redux, (64, 64)).as_dict()
        new = ("blur1", "jpeg1", "jpeg2", "thick", "usm_radius")
        assert {k: v for k, v in a.items() if k not in new} == {k: v for k, v in b.items() if k not in new}
        assert (a["blur1"], a["jpeg1"], a["jpeg2"], a["thick"], a["usm_radius"]) == (True, True, True, False, 0)


# ------------------------------------------------------------------------------------- USM, ThickLines, coins
def _high_freq(x: torch.Tensor) -> float:
    lap = torch.tensor([[0.0, 1, 0], [1, -4, 1], [0, 1, 0]]).reshape(1, 1, 3, 3).repeat(3, 1, 1, 1)
    return float(F.conv2d(x, lap, groups=3).pow(2).mean())


def test_lq_usm_sharpens_with_the_drawn_radius() -> None:
    x = _image(64)
    for radius in (3, 10, 25):
        y = lq_usm_sharpener(radius)(x)
        assert _high_freq(y) > 1.05 * _high_freq(x), radius
        assert torch.equal(y, USMSharp(radius)(x))
    assert lq_usm_sharpener(4).radius == 5  # even radii are made odd
    settings = _settings(lq_usm=True, lq_usm_radius_range=(4, 7))
    radii = {draw_batch_choices(step_rng(s, 0, 0), settings, (64, 64)).usm_radius for s in range(60)}
    assert radii == {4, 5, 6, 7}


def _synth(settings: SynthesisSettings, gt: torch.Tensor, *, sharpen_input: bool) -> torch.Tensor:
    choices = draw_batch_choices(step_rng(5, 0, 0), settings, tuple(gt.shape[-2:]))  # type: ignore[arg-type]
    k = torch.zeros(1, 21, 21)
    k[0, 10, 10] = 1
    out = synthesise(gt, [k, k, k], settings=settings, choices=choices, seeds=[5], gens=[torch.Generator()],
                     usm=USMSharp(), jpeger=DiffJPEG(differentiable=False), sharpen_input=sharpen_input,
                     keep_sharpened=False)
    return out["lq"]


def test_lq_usm_decides_the_degradation_source() -> None:
    """lq_usm false degrades the plain GT even for Real-ESRGAN (which BasicSR sharpens first); true sharpens with
    the drawn radius; null keeps BasicSR's behaviour."""
    gt = _image(64)
    off = _settings(lq_usm=False)
    on = _settings(lq_usm=True, lq_usm_radius_range=(9, 9))
    basic = _settings()
    plain = _synth(off, gt, sharpen_input=True)
    assert torch.equal(plain, _synth(basic, gt, sharpen_input=False))
    assert torch.equal(_synth(basic, gt, sharpen_input=True), _synth(basic, USMSharp()(gt), sharpen_input=False))
    sharp = _synth(on, gt, sharpen_input=False)
    assert torch.equal(sharp, _synth(basic, USMSharp(9)(gt), sharpen_input=False))
    assert not torch.equal(sharp, plain)


def test_thick_lines_darkens_around_dark_strokes() -> None:
    x = torch.ones(1, 3, 9, 9)
    x[..., 4, 4] = 0.0
    y = thick_lines(x)
    assert float(y[0, 0, 4, 4]) == 0.0
    assert torch.allclose(y[0, :, 3:6, 3:6].sum(), torch.tensor(3 * (8 * 0.75)))  # the 8 neighbours lose 1/4
    assert float(y[0, 0, 0, 0]) == 1.0
    on = _settings(thicklines_prob=1.0, first={"jpeg_prob": 0.0}, second={"jpeg_prob": 0.0})
    off = _settings(thicklines_prob=0.0, first={"jpeg_prob": 0.0}, second={"jpeg_prob": 0.0})
    src = _image(64)
    assert torch.equal(_degrade(on, src=src), _degrade(off, src=thick_lines(src)))


def test_jpeg_prob_zero_leaves_the_image_uncompressed() -> None:
    none = _CountingJPEG()
    _degrade(_settings({"jpeg_prob": 0.0}, {"jpeg_prob": 0.0}), jpeger=none)
    assert none.calls == 0
    both = _CountingJPEG()
    _degrade(_settings({"jpeg_prob": 1.0}, {"jpeg_prob": 1.0}), jpeger=both)
    assert both.calls == 2
    half = _settings({"jpeg_prob": 0.5}, {"jpeg_prob": 0.5})
    coins = [(c.jpeg1, c.jpeg2) for c in (draw_batch_choices(step_rng(s, 0, 0), half, (64, 64)) for s in range(40))]
    assert {a for a, _ in coins} == {True, False} and {b for _, b in coins} == {True, False}
    assert not torch.equal(_degrade(_settings({"jpeg_prob": 0.0}, {"jpeg_prob": 0.0})),
                           _degrade(_settings({"jpeg_prob": 1.0}, {"jpeg_prob": 1.0})))


def test_blur_prob_zero_skips_the_first_blur() -> None:
    pulse = torch.zeros(1, 21, 21)
    pulse[0, 10, 10] = 1
    no_blur = _settings(blur_prob=0.0)
    assert torch.equal(_degrade(no_blur), _degrade(_settings(), kernel1=pulse))
    assert not torch.equal(_degrade(no_blur), _degrade(_settings()))


# ------------------------------------------------------------------------------------------------ kernel ranges
def _blur(kernel_range: Any = None, sinc_prob: float = 0.0) -> BlurSettings:
    return BlurSettings(KINDS, [1.0] * 6, (0.2, 2.0), (0.5, 4.0), (1.0, 2.0), sinc_prob, kernel_range=kernel_range)


def test_kernel_ranges_are_honoured() -> None:
    sizes: dict[str, set[int]] = {"kernel1": set(), "kernel2": set(), "sinc_kernel": set()}
    for seed in range(200):
        p = draw_degradation_kernel_params(np.random.default_rng(seed), first=_blur((3, 7)),
                                           second=_blur((11, 13), 0.5), final_sinc_prob=1.0, max_kernel_size=21,
                                           final_kernel_range=(5, 5))
        for k, v in p.items():
            sizes[k].add(v.size)
            assert v.pad_to == 21
    assert sizes == {"kernel1": {3, 5, 7}, "kernel2": {11, 13}, "sinc_kernel": {5}}
    # BasicSR's range [7, 21] written out draws exactly what the default draws
    for seed in range(20):
        a = draw_degradation_kernel_params(np.random.default_rng(seed), first=_blur(), second=_blur(),
                                           final_sinc_prob=0.5, max_kernel_size=21)
        b = draw_degradation_kernel_params(np.random.default_rng(seed), first=_blur((7, 21)), second=_blur((7, 21)),
                                           final_sinc_prob=0.5, max_kernel_size=21, final_kernel_range=(7, 21))
        assert a == b
    for bad in ((4, 9), (7, 5), (1, 3)):
        with pytest.raises(OptionError, match="kernel_range"):
            _blur(bad)
    with pytest.raises(OptionError, match="larger than the 21x21"):
        draw_degradation_kernel_params(np.random.default_rng(0), first=_blur((5, 23)), second=_blur(),
                                       final_sinc_prob=0.0, max_kernel_size=21)


# ------------------------------------------------------------------------------------------------ the options
def _template(train_dir: Path, name: str = "otf", template: Path = SPAN_OTF, **top: Any) -> dict[str, Any]:
    """traiNNer-redux's SPAN OTF template as it is, with tiny overrides (x2, 16-pixel LQ crops, 8 features)."""
    if not template.is_file():
        pytest.skip("traiNNer-redux's templates are not here (set TRAINNER_TEMPLATES to a checkout's "
                    "options/_templates)")
    opt = yaml.safe_load(template.read_text())
    opt.update(name=name, scale=2, use_amp=False, use_channels_last=False, num_gpu=1, manual_seed=3, **top)
    train = opt["datasets"]["train"]
    train.update(dataroot_gt=[str(train_dir)], lq_size=16, batch_size_per_gpu=2, num_worker_per_gpu=0)
    opt["network_g"]["feature_channels"] = 8
    opt["train"].update(total_iter=4)
    opt["logger"].update(print_freq=2, save_checkpoint_freq=2, use_tb_logger=False)
    return opt


def test_otf_template_maps_onto_the_realesrgan_pipeline(tmp_path: Path, small_train_dir: Path) -> None:
    opt = load_options(write_options(tmp_path / "o.yml", _template(small_train_dir)), is_train=True)
    assert opt["model_type"] == "RealESRNetModel"  # no network_d: traiNNer-redux's OTF model without a GAN
    assert opt["gt_usm"] is False and opt["lq_usm"] is False
    assert opt["resize_mode_list"] == ["bilinear", "bicubic", "nearest-exact", "lanczos"]
    assert opt["resize_mode_prob3"] == [0.25] * 4 and opt["jpeg_prob"] == 1.0 and opt["blur_prob"] == 0.0
    assert opt["second_blur_prob"] == 0.0  # blur_prob2
    assert opt["queue_size"] == 120 and "blur_prob2" not in opt
    train = opt["datasets"]["train"]
    assert train["type"] == "RealESRGANDataset" and train["kernel_range"] == [5, 17]
    assert train["final_kernel_range"] == [5, 17] and train["crop_pad_size"] == 32 + 32
    notes = " | ".join(opt["mapped_keys"])
    assert "high_order_degradation -> model_type RealESRNetModel" in notes
    assert "blur_prob2 -> second_blur_prob 0.0" in notes and "crop_pad_size unset -> 64" in notes
    settings = SynthesisSettings.from_options(opt)
    assert settings.first.resize_mode_list == ("bilinear", "bicubic", "nearest-exact", "lanczos")
    assert settings.lq_usm is False and settings.blur_prob == 0.0


def test_otf_gan_template_picks_realesrgan_and_rounds_the_queue(tmp_path: Path, small_train_dir: Path) -> None:
    gan = TEMPLATES / "SPAN" / "SPAN_OTF_gan.yml"
    opt = _template(small_train_dir, template=gan)
    opt["train"]["losses"] = [{"type": "charbonnierloss", "loss_weight": 1.0},
                              {"type": "ganloss", "gan_type": "vanilla", "loss_weight": 0.1}]
    opt["network_d"] = {"type": "UNetDiscriminatorSN", "num_in_ch": 3, "num_feat": 8}
    opt["datasets"]["train"]["batch_size_per_gpu"] = 16
    opt["path"].pop("pretrain_network_d", None)
    opt["path"].pop("pretrain_network_g", None)
    done = load_options(write_options(tmp_path / "g.yml", opt), is_train=True)
    assert done["model_type"] == "RealESRGANModel" and done["queue_size"] == 112
    assert done["l1_gt_usm"] is False and done["percep_gt_usm"] is False


@pytest.mark.parametrize("change, message", [
    ({"resize_mode_list": ["bicubic", "spline36"]}, "resize_mode_list"),
    ({"resize_mode_prob2": [0.5, 0.5]}, "resize_mode_list2"),
    ({"jpeg_prob": 1.5}, "jpeg_prob"),
    ({"lq_usm_radius_range": [5, 2]}, "lq_usm_radius_range"),
    ({"dataroot_lq_prob": 0.5}, "dataroot_lq_prob"),
    ({"blur_prob2": 0.3, "second_blur_prob": 0.4}, "blur_prob2"),
    ({"train_set__kernel_range": [4, 17]}, "kernel_range"),
    ({"train_set__final_kernel_range": [5, 23]}, "final_kernel_range"),
])
def test_bad_otf_keys_are_refused(tmp_path: Path, small_train_dir: Path, change: dict[str, Any],
                                  message: str) -> None:
    opt = _template(small_train_dir)
    for k, v in change.items():
        if k.startswith("train_set__"):
            opt["datasets"]["train"][k.removeprefix("train_set__")] = v
        else:
            opt[k] = v
    with pytest.raises(OptionError, match=message):
        load_options(write_options(tmp_path / "bad.yml", opt), is_train=True)


# ------------------------------------------------------------------------------------------------ training
@pytest.mark.slow
def test_otf_template_trains_through_the_cli(tmp_path: Path, small_train_dir: Path) -> None:
    """The SPAN OTF template trains a few iterations with every new stage switched on, and writes the debug pairs."""
    opt = _template(small_train_dir, lq_usm=True, lq_usm_radius_range=[3, 9], thicklines_prob=0.5, blur_prob=0.5,
                    blur_prob2=0.5, jpeg_prob=0.5, jpeg_prob2=0.5, high_order_degradations_debug=True,
                    high_order_degradations_debug_limit=3, queue_size=4)
    opt["datasets"]["train"].update(kernel_range=[3, 9], final_sinc_prob=0.5, final_kernel_range=[5, 11])
    path = write_options(tmp_path / "otf.yml", opt)
    out = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    assert "model_type RealESRNetModel" in out.stdout + out.stderr
    exp = tmp_path / "experiments" / "otf"
    weights = load_file(str(exp / "models" / "net_g_4.safetensors"))
    assert weights and all(torch.isfinite(t).all() for t in weights.values())
    debug = sorted(p.name for p in (exp / "debug" / "otf").iterdir())
    assert debug == ["000001_0_otf_gt.png", "000001_0_otf_lq.png", "000002_0_otf_gt.png", "000002_0_otf_lq.png",
                     "000003_0_otf_gt.png", "000003_0_otf_lq.png"]


def test_the_options_know_the_same_filters() -> None:
    from anysr.options.realesrgan import TRAINNER_RESIZE_MODES as listed

    assert listed == TRAINNER_RESIZE_MODES


@pytest.mark.slow
@pytest.mark.parametrize("where", ["step", "loader"])
def test_otf_resume_is_bit_exact(tmp_path: Path, small_train_dir: Path, where: str) -> None:
    """With every OTF stage drawing, 6 straight iterations == 4, stop, resume, 2 (pool and coins included)."""
    from anysr.cli import main

    def opt(name: str, total: int) -> dict[str, Any]:
        o = _template(small_train_dir, name=name, degrade_in=where, lq_usm=True, thicklines_prob=0.5, blur_prob=0.5,
                      jpeg_prob=0.5, jpeg_prob2=0.5, queue_size=4)
        o["train"]["total_iter"] = total
        o["logger"]["save_checkpoint_freq"] = 2
        return o

    straight = write_options(tmp_path / "a.yml", opt("a", 6))
    assert main(["train", "-opt", str(straight), "--force_yml", f"path.root={tmp_path}"]) == 0
    split = write_options(tmp_path / "b.yml", opt("b", 4))
    assert main(["train", "-opt", str(split), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(split), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=6"]) == 0
    a, b = (load_file(str(tmp_path / "experiments" / n / "models" / "net_g_6.safetensors")) for n in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.xla
@pytest.mark.slow
def test_otf_template_on_xla_compiles_once_and_runs_no_op_on_the_cpu(tmp_path: Path, small_train_dir: Path) -> None:
    """On XLA the OTF stages run in the loader workers (degrade_in auto): 12 iterations compile no more graphs than
    6, and nothing falls back to the CPU."""
    pytest.importorskip("torch_xla")
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    stats = {}
    for total in (6, 12):
        opt = _template(small_train_dir, name=f"x{total}", accelerator="xla", lq_usm=True, thicklines_prob=0.5,
                        blur_prob=0.5, jpeg_prob=0.5, queue_size=4)
        opt["train"]["total_iter"] = total
        opt["logger"].update(print_freq=3, save_checkpoint_freq=6)
        path = write_options(tmp_path / f"x{total}.yml", opt)
        env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1",
               "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
        env.pop("XLA_USE_SPMD", None)
        proc = subprocess.run([sys.executable, "-m", "anysr", "train", "-opt", str(path), "--force_yml",
                               f"path.root={tmp_path}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=900, check=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        summary = json.loads((tmp_path / "experiments" / f"x{total}" / "summary.json").read_text())
        assert summary["finished"] and summary["iterations_done"] == total
        stats[total] = summary["stats"]
    assert stats[12]["compiles"] == stats[6]["compiles"], stats
    assert stats[12]["cpu_fallbacks"] == {} and stats[6]["cpu_fallbacks"] == {}

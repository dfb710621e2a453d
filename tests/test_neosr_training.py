"""neosr's training-step options in anysr's models: ``train.wavelet_guided`` / ``wavelet_init`` (the discriminator
judges wavelet bands), ``train.match_lq_colors`` (colour losses compare with the upscaled LQ), ``train.clamp`` (the
output clamped to [1/255, 1]) and ``train.grad_clip_norm_d`` (neosr's gradient clipping of the discriminator).

The wavelet transform is checked against neosr's own (``tools/fixtures/make_neosr_training_fixtures.py``, run with
PyWavelets in the fixture environment); the upscaled LQ against ``F.interpolate(antialias=True)``. Training runs:
through the command line, an exact resume across ``wavelet_init`` and XLA:CPU's graphs around the switch (``-m xla``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import FIXTURE_TOL, run_cli, saved_weights, tiny_train_options, write_options
from safetensors.torch import load_file
from torch.nn import functional as F

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.cli import main
from anysr.engine import checkpoint as ckpt
from anysr.errors import OptionError
from anysr.losses import L1Loss
from anysr.models import build_model
from anysr.models.sr import eco_weight, upscale_lq
from anysr.ops.wavelet import SWT2d, WaveletGuide, wavelet_filters
from anysr.options import load_options
from anysr.options.typed import Options
from anysr.registry import LOSS_REGISTRY

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "neosr_training"
IO = load_file(str(FIXTURES / "wavelet_io.safetensors"))


# ----------------------------------------------------------------------------- the wavelet transform vs. neosr

@pytest.mark.parametrize("wavelet", ["db1", "sym19"])
def test_swt_matches_neosr(wavelet: str) -> None:
    x = IO[f"swt_{wavelet}_input"]
    got = SWT2d(wavelet)(x)
    assert got.shape == (*x.shape[:2], 4, *x.shape[2:])
    torch.testing.assert_close(got.flatten(1, 2), IO[f"swt_{wavelet}_output"], **FIXTURE_TOL)


def test_wavelet_guided_view_matches_neosr() -> None:
    guide = WaveletGuide()
    torch.testing.assert_close(guide(IO["guided_output"]), IO["guided_hf"], **FIXTURE_TOL)
    torch.testing.assert_close(guide(IO["guided_gt"]), IO["guided_hf_gt"], **FIXTURE_TOL)


@pytest.mark.parametrize(("wavelet", "shape"),
                         [("sym19", (1, 2, 5, 7)), ("db1", (2, 1, 1, 3)), ("sym19", (1, 1, 40, 3))])
def test_swt_wraps_at_any_size(wavelet: str, shape: tuple[int, ...]) -> None:
    """Sides shorter than the filter (neosr's circular padding refuses those): the periodic sums, written out."""
    x = torch.rand(*shape, dtype=torch.float64)
    lo, hi = wavelet_filters(wavelet)
    n = len(lo)

    def filt(t: torch.Tensor, f: list[float], dim: int) -> torch.Tensor:
        return sum(f[n - 1 - k] * torch.roll(t, -(k - n // 2 + 1), dims=dim) for k in range(n))

    rows = [filt(x, f, 3) for f in (lo, hi)]
    want = torch.stack([filt(r, f, 2) for r in rows for f in (lo, hi)], dim=2)
    # the taps are float32 (as neosr's): 1e-7 off the float64 sums
    torch.testing.assert_close(SWT2d(wavelet).double()(x), want, rtol=1e-6, atol=1e-6)


def test_wavelet_guide_gradient_fp32_under_autocast_and_bad_input() -> None:
    x = torch.rand(2, 3, 9, 11, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = WaveletGuide()(x)
    assert y.dtype == torch.float32 and y.shape == x.shape
    y.square().mean().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert WaveletGuide().state_dict() == {}
    with pytest.raises(ValueError, match="RGB"):
        WaveletGuide()(torch.rand(1, 1, 8, 8))
    with pytest.raises(ValueError, match="wavelet: 'db2' is not known"):
        SWT2d("db2")


def test_upscaled_lq_is_antialiased_bicubic_clamped() -> None:
    lq = torch.rand(2, 3, 7, 9) * 1.2 - 0.1
    want = F.interpolate(lq, scale_factor=3, mode="bicubic", antialias=True).clamp(1 / 255, 1)
    torch.testing.assert_close(upscale_lq(lq, 21, 27), want, **FIXTURE_TOL)


# ----------------------------------------------------------------------------- the models

def gan_options(name: str, train_dir: Path, total_iter: int = 4, **train: Any) -> dict[str, Any]:
    """A tiny SRGANModel: EDSR x2 (8 features), a 4-feature VGG-style discriminator on 32-pixel crops, the losses
    as a list (as the neosr mapping writes them)."""
    opt = tiny_train_options(name, train_dir, None, total_iter=total_iter)
    opt["model_type"] = "SRGANModel"
    opt["network_d"] = {"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 4, "input_size": 32}
    t = opt["train"]
    del t["pixel_opt"]
    t["ema_decay"] = 0
    t["optim_d"] = {"type": "Adam", "lr": 1e-3, "betas": [0.9, 0.99]}
    t["losses"] = [{"type": "L1Loss", "loss_weight": 1.0},
                   {"type": "GANLoss", "gan_type": "vanilla", "loss_weight": 0.005}]
    t.update(train)
    return opt


def _model(opt: dict[str, Any], tmp_path: Path) -> Any:
    path = write_options(tmp_path / f"{opt['name']}.yml", opt)
    options = load_options(str(path), is_train=True, root=str(tmp_path))
    model = build_model(options, create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False)))
    ckpt.load_model_weights(model, fresh=True, stand_ins=True)
    model.setup()
    return model


def test_discriminator_view_switches_at_wavelet_init(tmp_path: Path, small_train_dir: Path) -> None:
    model = _model(gan_options("view", small_train_dir, wavelet_guided=True, wavelet_init=3), tmp_path)
    x = torch.rand(2, 3, 32, 32)
    model.update_learning_rate(2)
    assert model.discriminator_view(x) is x
    model.update_learning_rate(3)
    torch.testing.assert_close(model.discriminator_view(x), WaveletGuide()(x), rtol=0, atol=0)


def test_match_lq_colors_gives_marked_losses_the_upscaled_lq(tmp_path: Path, small_train_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A loss class that says ``matches_lq_colors`` compares with the upscaled LQ; the others with the GT."""
    monkeypatch.setattr(L1Loss, "matches_lq_colors", True, raising=False)
    losses = [{"type": "L1Loss", "loss_weight": 1.0, "name": "lqmatch"}, {"type": "MSELoss", "loss_weight": 1.0},
              {"type": "GANLoss", "gan_type": "vanilla", "loss_weight": 0.005}]
    for match in (True, False):
        model = _model(gan_options(f"m{match}", small_train_dir, match_lq_colors=match, losses=losses), tmp_path)
        assert [s.target for s in model.loss_specs] == ["lq" if match else "gt", "gt", "gt"]
        out, lq, gt = torch.rand(2, 3, 16, 12), torch.rand(2, 3, 8, 6), torch.rand(2, 3, 16, 12)
        terms = model.loss_terms(out, lq, lambda role, t=gt: t)
        want = upscale_lq(lq, 16, 12) if match else gt
        torch.testing.assert_close(terms["l_g_lqmatch"], F.l1_loss(out, want))
        torch.testing.assert_close(terms["l_g_mse"], F.mse_loss(out, gt))


@pytest.mark.parametrize("name", ["consistency_loss", "msswd_loss"])
def test_neosr_colour_losses_follow_match_lq_colors(name: str) -> None:
    """neosr's two losses that match_lq_colors concerns say so (skipped where they are not registered)."""
    if name not in LOSS_REGISTRY:
        pytest.skip(f"{name} is not registered")
    assert getattr(LOSS_REGISTRY.get(name), "matches_lq_colors", False) is True


def test_clamp_clamps_the_output_the_losses_see(tmp_path: Path, small_train_dir: Path) -> None:
    for clamp in (True, False):
        model = _model(gan_options(f"c{clamp}", small_train_dir, clamp=clamp), tmp_path)
        x = torch.tensor([-0.5, 0.0, 0.5, 1.5]).reshape(1, 1, 2, 2).requires_grad_(True)
        y = model.training_output(x)
        y.sum().backward()
        if clamp:
            assert y.flatten().tolist() == pytest.approx([1 / 255, 1 / 255, 0.5, 1.0])
            assert x.grad.flatten().tolist() == [0.0, 0.0, 1.0, 0.0]
        else:
            assert torch.equal(y, x)


@pytest.mark.parametrize("model_type", ["SRGANModel", "ESRGANModel"])
def test_grad_clip_norm_d_clips_the_discriminator(tmp_path: Path, small_train_dir: Path, model_type: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Both optimizer steps clip with their own norm (a step on wavelet bands, ESRGAN's relativistic losses too)."""
    opt = gan_options("clip", small_train_dir, grad_clip_norm=1.0, grad_clip_norm_d=0.5, wavelet_guided=True,
                      wavelet_init=1)
    opt["model_type"] = model_type
    model = _model(opt, tmp_path)
    seen = []
    step = model.acc.optimizer_step

    def spy(opt: Any, clip: float | None = None, *args: Any) -> Any:
        seen.append((opt is model.optimizers["net_d"], clip))
        return step(opt, clip, *args)

    monkeypatch.setattr(model.acc, "optimizer_step", spy)
    model.update_learning_rate(1)
    model.train_step([{"lq": torch.rand(2, 3, 16, 16), "gt": torch.rand(2, 3, 32, 32)}])
    assert seen == [(False, 1.0), (True, 0.5)]
    assert all(torch.isfinite(p).all() for p in model.bare("net_d").parameters())


@pytest.mark.parametrize(("model_type", "train", "message"), [
    ("SRModel", {"wavelet_guided": True}, "train.wavelet_guided: model_type SRModel has no discriminator"),
    ("HiFaceGANModel", {"wavelet_guided": True}, "train.wavelet_guided: model_type HiFaceGANModel has no"),
    ("SRModel", {"grad_clip_norm_d": 1.0}, "train.grad_clip_norm_d: model_type SRModel does not clip"),
    ("StyleGAN2Model", {"clamp": True}, "train.clamp: model_type StyleGAN2Model does not train on"),
    ("GFPGANModel", {"match_lq_colors": True}, "train.match_lq_colors: model_type GFPGANModel does not"),
    ("SRGANModel", {"wavelet_init": -1}, "train.wavelet_init"),
    ("SRGANModel", {"eco_enabled": True, "eco_init": 5, "eco_iters": 4}, "train.eco_init: 5 is after"),
    ("SRGANModel", {"eco_schedule": "cosine"}, "train.eco_schedule"),
    ("EDVRModel", {"eco_enabled": True}, "train.eco_enabled: model_type EDVRModel does not train on"),
])
def test_impossible_combinations_are_refused(tmp_path: Path, small_train_dir: Path, model_type: str,
                                             train: dict[str, Any], message: str) -> None:
    opt = gan_options("bad", small_train_dir, **train)
    opt["model_type"] = model_type
    path = write_options(tmp_path / "bad.yml", opt)
    with pytest.raises(OptionError, match=message):
        load_options(str(path), is_train=True, root=str(tmp_path))


def test_model_refuses_wavelet_guided_without_options_check(tmp_path: Path, small_train_dir: Path) -> None:
    """The models check too (options built without the schema's rule)."""
    path = write_options(tmp_path / "direct.yml", gan_options("direct", small_train_dir))
    options = load_options(str(path), is_train=True, root=str(tmp_path))
    changed = Options({**options, "model_type": "SRModel",
                       "train": Options({**options["train"], "wavelet_guided": True}, where="train")})
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    with pytest.raises(OptionError, match="train.wavelet_guided: SRModel has no discriminator"):
        build_model(changed, acc)


def test_eco_weight_schedules() -> None:
    assert eco_weight(250, 1000, "sigmoid") == 0.5
    assert eco_weight(0, 1000, "sigmoid") == pytest.approx(1 / (1 + 2.718281828459045 ** 2.5))
    assert eco_weight(1000, 1000, "sigmoid") == pytest.approx(1 / (1 + 2.718281828459045 ** -7.5))
    assert [eco_weight(i, 4, "linear") for i in (0, 1, 4, 9)] == [0.0, 0.25, 1.0, 1.0]


def test_eco_pulls_the_pairs_towards_the_generator_output(tmp_path: Path, small_train_dir: Path) -> None:
    """neosr's eco_strategy written out with torch's own antialiased bicubic; off before eco_init and after
    eco_iters. The GAN's GT keys all move (SRGANModel's gt, l1_gt, percep_gt)."""
    model = _model(gan_options("eco", small_train_dir, eco_enabled=True, eco_init=2, eco_iters=10,
                               eco_schedule="linear", clamp=True), tmp_path)
    g = torch.Generator().manual_seed(5)
    batch = {"lq": torch.rand(2, 3, 9, 11, generator=g), "gt": torch.rand(2, 3, 18, 22, generator=g)}
    for it in (1, 11):
        model.update_learning_rate(it)
        assert model.augment_batches([batch])[0] is batch
    model.update_learning_rate(4)
    (got,) = model.augment_batches([{**batch, "l1_gt": batch["gt"]}], ("gt", "l1_gt", "percep_gt"))
    with torch.no_grad():
        sr = model.bare("net_g")(batch["lq"])
    a = 0.4
    want_gt = ((1 - a) * sr + a * batch["gt"]).clamp(1 / 255, 1)
    shrunk = F.interpolate(sr, scale_factor=1 / 2, mode="bicubic", antialias=True).clamp(0, 1)
    want_lq = (1 - a) * shrunk + a * batch["lq"]
    torch.testing.assert_close(got["gt"], want_gt, **FIXTURE_TOL)
    torch.testing.assert_close(got["l1_gt"], want_gt, **FIXTURE_TOL)
    torch.testing.assert_close(got["lq"], want_lq, **FIXTURE_TOL)
    assert "percep_gt" not in got


# ----------------------------------------------------------------------------- training runs

@pytest.mark.slow
def test_wavelet_guided_gan_trains_through_the_cli(tmp_path: Path, small_train_dir: Path) -> None:
    """4 iterations, the discriminator on wavelet bands from iteration 2, with neosr's clamp, clipping, ECO and its
    losses as its TOML mapping lists them (consistency_loss compared with the upscaled LQ: match_lq_colors)."""
    losses = [{"type": "L1Loss", "loss_weight": 1.0, "name": "pix"},
              {"type": "consistency_loss", "loss_weight": 0.5, "name": "consistency"},
              {"type": "gan_loss", "loss_weight": 0.1, "name": "gan"}]
    opt = gan_options("cli", small_train_dir, wavelet_guided=True, wavelet_init=2, clamp=True, match_lq_colors=True,
                      grad_clip_norm=1.0, grad_clip_norm_d=1.0, eco_enabled=True, eco_init=1, eco_iters=3,
                      losses=losses)
    path = write_options(tmp_path / "cli.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    log = proc.stdout + proc.stderr
    for name in ("l_g_pix", "l_g_consistency", "l_g_gan", "l_d_real", "l_d_fake"):
        assert name in log, (name, log[-3000:])
    exp = tmp_path / "experiments" / "cli"
    g = saved_weights(exp, 4)
    d = torch.load(exp / "training_states" / "4.state", weights_only=True)["model"]["nets"]["net_d"]
    assert all(torch.isfinite(v).all() for v in [*g.values(), *d.values()] if v.is_floating_point())
    losses = json.loads((exp / "summary.json").read_text())["final_losses"]
    assert all(v == v for v in losses.values())


def _state(exp: Path, it: int) -> dict[str, Any]:
    return torch.load(exp / "training_states" / f"{it}.state", weights_only=True)["model"]


def test_resume_across_wavelet_init_is_bit_exact(tmp_path: Path, small_train_dir: Path) -> None:
    """4 straight == 2, stop, resume, 2 more (the discriminator switches to wavelet bands at iteration 3; ECO on
    iterations 2 and 3)."""
    extra = {"wavelet_guided": True, "wavelet_init": 3, "clamp": True, "grad_clip_norm_d": 1.0,
             "eco_enabled": True, "eco_init": 2, "eco_iters": 3}
    a = write_options(tmp_path / "a.yml", gan_options("straight", small_train_dir, 4, **extra))
    assert main(["train", "-opt", str(a), "--force_yml", f"path.root={tmp_path}"]) == 0
    b = write_options(tmp_path / "b.yml", gan_options("split", small_train_dir, 2, **extra))
    assert main(["train", "-opt", str(b), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(b), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=4"]) == 0
    sa, sb = _state(tmp_path / "experiments" / "straight", 4), _state(tmp_path / "experiments" / "split", 4)
    for net in ("net_g", "net_d"):
        assert sa["nets"][net].keys() == sb["nets"][net].keys()
        for k, v in sa["nets"][net].items():
            assert torch.equal(v, sb["nets"][net][k]), f"{net}.{k}"


@pytest.mark.slow
def test_wavelet_guided_two_gloo_ranks_match_one_process(tmp_path: Path, small_train_dir: Path) -> None:
    """Data parallel with the wavelet-guided discriminator (a U-Net with spectral norm, no batch norm), ECO and
    the clamp: 2 ranks x 1 image == 1 process x 2 images."""
    runs = {}
    for name, ranks, batch in (("one", 1, 2), ("two", 2, 1)):
        opt = gan_options(name, small_train_dir, 3, wavelet_guided=True, wavelet_init=2, clamp=True,
                          grad_clip_norm=1.0, grad_clip_norm_d=1.0, eco_enabled=True, eco_init=1, eco_iters=2)
        opt["num_gpu"] = ranks
        opt["datasets"]["train"]["batch_size_per_gpu"] = batch
        opt["network_d"] = {"type": "UNetDiscriminatorSN", "num_in_ch": 3, "num_feat": 4}
        path = write_options(tmp_path / f"{name}.yml", opt)
        runs[name] = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    assert "rank 0/2" in runs["two"].stdout
    states = {n: _state(tmp_path / "experiments" / n, 3) for n in runs}
    for net in ("net_g", "net_d"):
        a, b = states["one"]["nets"][net], states["two"]["nets"][net]
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=f"{net}.{k}")


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
def test_xla_wavelet_switch_adds_one_graph_set_without_fallback(tmp_path: Path, small_train_dir: Path) -> None:
    """Training steps of the GAN on XLA:CPU: the step's graph before wavelet_init, exactly one more at the switch
    (the discriminator's input changes), none after; no aten fallback; finite losses."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics

    from anysr.accelerators.launcher import LaunchPlan

    opt = gan_options("xla", small_train_dir, 8, wavelet_guided=True, wavelet_init=4, clamp=True,
                      grad_clip_norm=1.0, grad_clip_norm_d=1.0)
    path = write_options(tmp_path / "xla.yml", opt)
    options = load_options(str(path), is_train=True, root=str(tmp_path))
    acc = create_accelerator(LaunchPlan("xla", 1, "xla", "fp32", extra={"pjrt_device": "CPU", "all_devices": False}))
    acc.setup()
    acc.manual_seed(0)
    model = build_model(options, acc)
    ckpt.load_model_weights(model, fresh=True, stand_ins=True)
    model.setup()
    g = torch.Generator().manual_seed(3)
    batches = [{"lq": torch.rand(2, 3, 16, 16, generator=g), "gt": torch.rand(2, 3, 32, 32, generator=g)}
               for _ in range(7)]
    metrics.clear_all()
    compiles = []
    for it, batch in enumerate(batches, 1):
        model.update_learning_rate(it)
        losses = model.train_step([{k: v.to(acc.device) for k, v in batch.items()}])
        acc.mark_step()
        compiles.append(acc.stats().get("compiles", 0))
    values = {k: float(v.cpu()) for k, v in losses.items()}
    assert all(v == v for v in values.values()), values
    fallbacks = [n for n in metrics.counter_names() if n.startswith("aten::")]
    assert not fallbacks, fallbacks
    # measured: [1, 2, 2, 3, 3, 3, 3] (step 2: the optimizers' state becomes device data; step 4: the switch)
    assert compiles[1] == compiles[2], f"recompiled before the switch: {compiles}"
    assert compiles[3] == compiles[2] + 1, f"the switch should add exactly one graph: {compiles}"
    assert len(set(compiles[3:])) == 1, f"graphs compiled after the switch: {compiles}"


@pytest.mark.xla
def test_xla_eco_compiles_one_graph_for_every_weight(tmp_path: Path, small_train_dir: Path) -> None:
    """ECO on XLA:CPU: its weight changes every iteration without a new graph; the phases (before, during, after)
    each have their step's graph; no aten fallback."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics

    from anysr.accelerators.launcher import LaunchPlan

    opt = gan_options("xla_eco", small_train_dir, 8, eco_enabled=True, eco_init=3, eco_iters=6, clamp=True)
    path = write_options(tmp_path / "xla_eco.yml", opt)
    options = load_options(str(path), is_train=True, root=str(tmp_path))
    acc = create_accelerator(LaunchPlan("xla", 1, "xla", "fp32", extra={"pjrt_device": "CPU", "all_devices": False}))
    acc.setup()
    model = build_model(options, acc)
    ckpt.load_model_weights(model, fresh=True, stand_ins=True)
    model.setup()
    g = torch.Generator().manual_seed(3)
    batches = [{"lq": torch.rand(2, 3, 16, 16, generator=g), "gt": torch.rand(2, 3, 32, 32, generator=g)}
               for _ in range(8)]
    metrics.clear_all()
    compiles = []
    for it, batch in enumerate(batches, 1):
        model.update_learning_rate(it)
        losses = model.train_step([{k: v.to(acc.device) for k, v in batch.items()}])
        acc.mark_step()
        compiles.append(acc.stats().get("compiles", 0))
    assert all(float(v.cpu()) == float(v.cpu()) for v in losses.values())
    fallbacks = [n for n in metrics.counter_names() if n.startswith("aten::")]
    assert not fallbacks, fallbacks
    # measured: [1, 2, 3, 3, 3, 3, 3, 3]: step 3 (ECO's first) adds its graph; after ECO the plain step's is reused
    assert compiles[2] == compiles[1] + 1, f"ECO should add exactly one graph: {compiles}"
    assert len(set(compiles[2:])) == 1, f"a new graph for a new ECO weight or after ECO: {compiles}"

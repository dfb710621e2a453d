"""HiFaceGAN, HiFaceGANDiscriminator, GANFeatLoss and HiFaceGANModel against BasicSR 1.4.2.

Fixtures come from BasicSR 1.4.2's own modules (``tools/fixtures/make_hifacegan_fixtures.py``): networks run a few
training-mode passes first (batch-norm statistics and spectral-norm vectors moved), then compared in eval mode,
every discriminator feature too. BasicSR's own HiFaceGAN option files (``tests/fixtures/basicsr_options``, as
released) are checked and trained through the command line. The checks every architecture gets (channels_last,
bf16, the meta device, gradients, a training run, 2 ranks = 1 process) run from tests/archs/test_standard.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from arch_checks import load_case, manifest, saved_groups, train
from conftest import DATASETS, FIXTURE_TOL, ROOT, run_cli, tiny_train_options, write_options
from safetensors.torch import load_file, save_file
from test_gan import fake_vgg19_state_dict

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise
from anysr.errors import OptionError
from anysr.losses import GANFeatLoss, MultiScaleGANLoss
from anysr.options import load_options

BASICSR_FILES = ROOT / "tests" / "fixtures" / "basicsr_options"
G_CASES = sorted(manifest("hifacegan")["cases"])
D_CASES = sorted(manifest("hifacegan_d")["cases"])
TINY_G = {"type": "HiFaceGAN", "num_feat": 2, "norm_g": "spectralspadeinstance3x3"}
TINY_D = {"type": "HiFaceGANDiscriminator", "num_feat": 4, "n_layers_d": 3}


# ----------------------------------------------------------------------------- reference parity

@pytest.mark.parametrize("name", G_CASES)
def test_generator_weights_load_strictly_and_match(name: str) -> None:
    net, io = load_case("hifacegan", name)
    for inp, out in manifest("hifacegan")["cases"][name]["compare"]:
        with torch.no_grad():
            torch.testing.assert_close(net(io[inp]), io[out], **FIXTURE_TOL, msg=f"{name} {out} differs from BasicSR")


@pytest.mark.parametrize("name", D_CASES)
def test_discriminator_weights_load_strictly_and_match_every_feature(name: str) -> None:
    net, io = load_case("hifacegan_d", name)
    keep = manifest("hifacegan_d")["cases"][name]["kwargs"].get("keep_features", True)
    for inp, out in manifest("hifacegan_d")["cases"][name]["compare"]:
        with torch.no_grad():
            got = net(io[inp])
        assert len(got) == net.num_d
        for d, scale in enumerate(got):
            if keep:
                want = [io[k] for k in sorted((k for k in io if k.startswith(f"{out}_{d}_")),
                                              key=lambda k: int(k.rsplit("_", 1)[1]))]
                assert len(scale) == len(want)
                for k, (a, b) in enumerate(zip(scale, want, strict=True)):
                    torch.testing.assert_close(a, b, **FIXTURE_TOL, msg=f"{name} scale {d} feature {k}")
            else:
                torch.testing.assert_close(scale, io[f"{out}_{d}"], **FIXTURE_TOL)


@pytest.mark.parametrize("name", G_CASES)
def test_generator_weights_are_recognised(name: str) -> None:
    params = load_case("hifacegan", name)[0].state_dict()  # seeded weights, the reference's spectral-norm vectors
    found = recognise(params).opt
    kwargs = manifest("hifacegan")["cases"][name]["kwargs"]
    assert found["type"] == "HiFaceGAN" and found["num_feat"] == kwargs["num_feat"]
    assert found.get("use_vae", False) == kwargs.get("use_vae", False)
    # BasicSR's syncbatch is instance normalisation: the same network, proposed as instance
    assert found["norm_g"] == kwargs["norm_g"].replace("syncbatch", "instance")
    with torch.device("meta"):
        layout = {k: v.shape for k, v in build_network(found).state_dict().items()}
    assert layout == {k: v.shape for k, v in params.items()}


# ----------------------------------------------------------------------------- the network

def test_any_size_is_padded_to_a_multiple_of_32_and_cropped() -> None:
    net, _ = load_case("hifacegan", "g_spectral_batch")
    x = torch.rand(1, 3, 45, 70)
    with torch.no_grad():
        out = net(x)
        padded = torch.nn.functional.pad(x, (0, 26, 0, 19), mode="reflect")
        whole = net(padded)
    assert out.shape == x.shape
    torch.testing.assert_close(out, whole[..., :45, :70], rtol=0, atol=0)


def test_unused_reference_parameters_are_kept_frozen_and_the_rest_train() -> None:
    torch.manual_seed(0)
    net = build_network(TINY_G).train()
    net(torch.rand(2, 3, 64, 64)).square().mean().backward()
    frozen = {n for n, p in net.named_parameters() if not p.requires_grad}
    assert frozen == {"fc.weight", "fc.bias", *(f"to_rgbs.{i}.{w}" for i in range(3) for w in ("weight", "bias"))}
    for n, p in net.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


def test_training_below_64_pixels_says_what_to_raise() -> None:
    net = build_network(TINY_G).train()
    with pytest.raises(ValueError, match=r"HiFaceGAN trains on images of at least 64x64 .* got 32x40; raise "
                                         r"datasets\.train\.gt_size"):
        net(torch.rand(2, 3, 32, 40))
    with torch.no_grad():
        assert net.eval()(torch.rand(1, 3, 32, 40)).shape == (1, 3, 32, 40)


def test_published_preset_size() -> None:
    with torch.device("meta"):
        net = build_network({"type": "hifacegan"})
    # BasicSR's train_hifacegan.yml network (num_feat 48, batch-norm SPADE, spectral norm)
    assert net.scale == 1 and net.ups[0].norm_0.param_free_norm.__class__.__name__ == "BatchNorm2d"
    # the same count as BasicSR's class; 39,657 of them (fc, three to-RGB convs) never run and stay frozen
    assert sum(p.numel() for p in net.parameters()) == 72_223_660
    assert sum(p.numel() for p in net.parameters() if p.requires_grad) == 72_184_003


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"norm_g": "spectralspadegroup3x3"}, r"network_g\.norm_g: expected \[spectral\]spade<instance\|batch\|syncbatch>"),
    ({"norm_g": "spadebatch4x4"}, r"network_g\.norm_g: .*odd k"),
    ({"is_train": True, "init_train_phase": 1}, r"network_g\.init_train_phase: progressive training \(phase 1\)"),
    ({"num_feat": 0}, r"network_g\.num_feat: expected an integer of at least 1, got 0"),
    ({"use_vae": True, "crop_size": 16}, r"network_g\.crop_size: expected an integer of at least 32, got 16"),
])
def test_bad_generator_arguments(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network({**TINY_G, **opt})


def test_bad_discriminator_arguments() -> None:
    with pytest.raises(OptionError, match=r"network_g\.norm_d: expected \[spectral\]<instance\|batch"):
        build_network({**TINY_D, "norm_d": "spectralgroup"})
    with pytest.raises(OptionError, match=r"network_g\.num_d: expected an integer of at least 1"):
        build_network({**TINY_D, "num_d": 0})


def test_discriminator_norms_beyond_the_reference() -> None:
    """Without the ``spectral`` prefix BasicSR's norm helper fails; here the plain convs (and ``none``) build."""
    for norm, conv_keys in (("instance", {"weight"}), ("none", {"weight", "bias"}), ("spectralnone",
                                                                                      {"weight_orig", "bias"})):
        net = build_network({**TINY_D, "norm_d": norm})
        keys = {k.rsplit(".", 1)[1] for k in net.state_dict() if k.startswith("discriminator_0.model1.")}
        assert conv_keys <= keys, (norm, keys)
        out = net(torch.rand(1, 6, 32, 32))
        assert len(out) == 2 and len(out[0]) == 4


def test_onnx_runs_at_unseen_sizes(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx  # noqa: PLC0415

    net, _ = load_case("hifacegan", "g_spectral_batch")
    rep = export_onnx(net, tmp_path / "m.onnx", scale=1, net_opt={"type": "HiFaceGAN",
                                                                 **manifest("hifacegan")["cases"]["g_spectral_batch"]
                                                                 ["kwargs"]})
    assert rep.dynamic is True, rep.note
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for x in (torch.rand(1, 3, 45, 70), torch.rand(2, 3, 64, 64)):
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        with torch.no_grad():
            torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- the losses

def _features(seed: int) -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(2, 4, 8, 8, generator=g) for _ in range(3)], [torch.randn(2, 4, 4, 4, generator=g)
                                                                       for _ in range(3)]]


@pytest.mark.parametrize(("criterion", "dist"), [("l1", lambda d: d.abs().mean()), ("l2", lambda d: d.square().mean()),
                                                 ("charbonnier", lambda d: (d.square() + 1e-12).sqrt().mean())])
def test_feature_matching_is_the_weighted_mean_over_scales_of_the_summed_layer_distances(criterion, dist) -> None:
    fake, real = _features(0), _features(1)
    for f in fake:
        for t in f:
            t.requires_grad_(True)
    for r in real:
        for t in r:
            t.requires_grad_(True)
    loss = GANFeatLoss(criterion=criterion, loss_weight=10.0)(fake, real)
    # pix2pixHD / SPADE / HiFaceGAN: lambda_feat * sum over D of sum over layers but the last of dist / num_D
    want = 10.0 * sum(dist(f - r) for fs, rs in zip(fake, real, strict=True)
                      for f, r in zip(fs[:-1], rs[:-1], strict=True)) / 2
    torch.testing.assert_close(loss, want)
    loss.backward()
    assert all(t.grad is None for rs in real for t in rs), "the real side must be detached"
    assert fake[0][-1].grad is None and fake[0][0].grad.abs().sum() > 0, "scores are left out, features are not"


def test_feature_matching_needs_the_features() -> None:
    with pytest.raises(ValueError, match="keep_features: true on network_d"):
        GANFeatLoss()([torch.rand(1, 1, 4, 4)], [torch.rand(1, 1, 4, 4)])
    with pytest.raises(ValueError, match="criterion 'l3' is not supported"):
        GANFeatLoss(criterion="l3")


def test_multiscale_gan_loss_judges_the_last_entry_of_each_scale() -> None:
    fake = _features(2)
    loss = MultiScaleGANLoss(gan_type="lsgan")(fake, True, is_disc=False)
    torch.testing.assert_close(loss, ((fake[0][-1] - 1) ** 2).mean() / 2 + ((fake[1][-1] - 1) ** 2).mean() / 2)


# ----------------------------------------------------------------------------- BasicSR's option files

@pytest.fixture(scope="module")
def face_pairs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Real 96x96 crops (GT) and their x4 bicubic-degraded copies at the same size (LQ), as BasicSR's
    HiFaceGAN data is prepared (``prepare_hifacegan_dataset.py``: degrade, then back to the GT size)."""
    root = tmp_path_factory.mktemp("faces")
    (root / "gt").mkdir()
    (root / "lq").mkdir()
    for p in sorted((DATASETS / "Set5" / "HR").glob("*.png"))[:3]:
        img = cv2.imread(str(p))[:96, :96]
        small = cv2.resize(img, (24, 24), interpolation=cv2.INTER_CUBIC)
        cv2.imwrite(str(root / "gt" / p.name), img)
        cv2.imwrite(str(root / "lq" / p.name), cv2.resize(small, (96, 96), interpolation=cv2.INTER_CUBIC))
    return root / "gt", root / "lq"


@pytest.fixture(scope="module")
def vgg19_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vgg") / "vgg19.safetensors"
    save_file({k: v for k, v in fake_vgg19_state_dict().items() if k.startswith("features.")}, str(path))
    return path


def _data(gt: Path, lq: Path) -> list[str]:
    return [f"datasets.train.dataroot_gt={gt}", f"datasets.train.dataroot_lq={lq}",
            f"datasets.val.dataroot_gt={gt}", f"datasets.val.dataroot_lq={lq}"]


def test_basicsr_train_file_validates_as_released(tmp_path: Path, face_pairs: tuple[Path, Path],
                                                  vgg19_file: Path) -> None:
    opt = load_options(BASICSR_FILES / "train_hifacegan.yml",
                       [f"path.root={tmp_path}", *_data(*face_pairs),
                        f"train.perceptual_opt.vgg_weights_path={vgg19_file}"], is_train=True)
    assert opt["model_type"] == "HiFaceGANModel" and opt["network_g"]["norm_g"] == "spectralspadebatch3x3"
    assert opt["train"]["feature_matching_opt"]["type"] == "GANFeatLoss"
    assert opt["train"]["gan_opt"]["type"] == "MultiScaleGANLoss"


def test_basicsr_test_file_validates_as_released(tmp_path: Path, face_pairs: tuple[Path, Path]) -> None:
    weights = tmp_path / "net_g_latest.pth"
    torch.save({"params": build_network({"type": "hifacegan"}).state_dict()}, weights)
    gt, lq = face_pairs
    opt = load_options(BASICSR_FILES / "test_hifacegan.yml",
                       [f"path.root={tmp_path}", f"path.pretrain_network_g={weights}",
                        f"datasets.test_gt.dataroot_gt={gt}", f"datasets.test_gt.dataroot_lq={lq}"], is_train=False)
    assert opt["network_g"]["type"] == "HiFaceGAN" and opt["model_type"] == "HiFaceGANModel"


@pytest.mark.slow
def test_basicsr_train_file_trains_resumes_and_tests_through_the_cli(tmp_path: Path, face_pairs: tuple[Path, Path],
                                                                      vgg19_file: Path) -> None:
    """BasicSR's file as released (its losses, its network's settings but a width of 8 to keep CI short: the
    full-size network is built by the published-size test) for 2 + 1 iterations on 64-pixel crops, then BasicSR's
    test file on the saved generator."""
    common = [f"path.root={tmp_path}", *_data(*face_pairs), f"train.perceptual_opt.vgg_weights_path={vgg19_file}",
              "network_g.num_feat=8",
              "datasets.train.gt_size=64", "datasets.train.num_worker_per_gpu=0", "logger.use_tb_logger=false",
              "train.precision=fp32", "train.channels_last=false", "logger.save_checkpoint_freq=2", "val.val_freq=2",
              "accelerator=cpu", "num_gpu=1", "logger.print_freq=1"]
    run_cli("train", "-opt", str(BASICSR_FILES / "train_hifacegan.yml"), "--force_yml", *common,
            "train.total_iter=2", cwd=tmp_path, timeout=900)
    exp = tmp_path / "experiments" / "HiFaceGAN_SR4x_train"
    log = "\n".join(p.read_text() for p in (exp / "log").glob("train_*.log"))
    for name in ("l_g_percep", "l_g_gan", "l_g_feat", "l_d_real", "l_d_fake"):
        assert re.search(rf"{name}: [-+0-9.e]+", log), f"{name} not logged"
    assert (exp / "models" / "net_g_2.safetensors").is_file() and (exp / "training_states" / "2.state").is_file()
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["iterations_done"] == 2 and np.isfinite(summary["validation"]["FFHQ_sr4x_val"]["psnr"]["value"])
    run_cli("train", "-opt", str(BASICSR_FILES / "train_hifacegan.yml"), "--force_yml", *common,
            "train.total_iter=3", "--auto_resume", cwd=tmp_path, timeout=900)
    assert json.loads((exp / "summary.json").read_text())["iterations_done"] == 3
    weights = load_file(str(exp / "models" / "net_g_3.safetensors"))
    assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())
    gt, lq = face_pairs
    proc = run_cli("test", "-opt", str(BASICSR_FILES / "test_hifacegan.yml"), "--force_yml", "network_g.num_feat=8",
                   f"path.root={tmp_path}", f"path.pretrain_network_g={exp / 'models' / 'net_g_3.safetensors'}",
                   f"datasets.test_gt.dataroot_gt={gt}", f"datasets.test_gt.dataroot_lq={lq}", "accelerator=cpu",
                   "num_gpu=1", cwd=tmp_path, timeout=600)
    assert "psnr" in proc.stdout.lower() and "ssim" in proc.stdout.lower()


@pytest.mark.slow
def test_tiny_hifacegan_model_run_with_ema_and_conditional_discriminator(tmp_path: Path,
                                                                         small_train_dir: Path) -> None:
    """HiFaceGANModel with the list form of the losses (traiNNer-redux's), EMA (BasicSR refuses it) and a
    non-conditional discriminator at x2 (the generator's output judged alone)."""
    opt = tiny_train_options("hfg", small_train_dir, None, total_iter=2, train__ema_decay=0.9)
    opt.update(model_type="HiFaceGANModel", scale=1)
    opt["network_g"] = {**TINY_G}
    opt["network_d"] = {**TINY_D, "conditional_d": False}
    opt["datasets"]["train"].update(gt_size=64, batch_size_per_gpu=2)
    opt["train"].pop("pixel_opt", None)
    opt["train"]["optim_d"] = {"type": "Adam", "lr": 1e-4}
    opt["train"]["losses"] = [{"type": "L1Loss", "loss_weight": 1.0},
                              {"type": "MultiScaleGANLoss", "gan_type": "hinge", "loss_weight": 0.1},
                              {"type": "GANFeatLoss", "loss_weight": 2.0, "name": "feat"}]
    opt["logger"]["save_checkpoint_freq"] = 2
    exp, log = train(tmp_path, opt)
    for name in ("l_g_l1", "l_g_multiscalegan", "l_g_feat", "l_d_real", "l_d_fake"):
        assert re.search(rf"{name}: [-+0-9.e]+", log), f"{name} not logged"
    assert set(saved_groups(exp, 2)) == {"params", "params_ema"}


def test_feature_matching_only_with_hifacegan_model(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("fm", small_train_dir, None, total_iter=1)
    opt["train"]["feature_matching_opt"] = {"type": "GANFeatLoss"}
    path = write_options(tmp_path / "o.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path, check=False)
    assert proc.returncode != 0
    assert "train.feature_matching_opt.type: GANFeatLoss (role feature_matching) is not trained by SRModel" in \
        proc.stdout + proc.stderr


# ----------------------------------------------------------------------------- XLA

@pytest.mark.xla
def test_xla_hifacegan_pair_compiles_once_without_cpu_fallbacks() -> None:
    """Generator (spectral norm, batch-norm SPADE) and conditional discriminator, three GAN steps on an XLA:CPU
    device: one graph after the first step, no aten op on the CPU."""
    import os  # noqa: PLC0415

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics  # noqa: PLC0415

    torch.manual_seed(0)
    dev = torch_xla.device()
    g = build_network({**TINY_G, "norm_g": "spectralspadebatch3x3"}).train().to(dev)
    d = build_network(TINY_D).train().to(dev)
    opt_g = torch.optim.Adam([p for p in g.parameters() if p.requires_grad], 1e-4)
    opt_d = torch.optim.Adam(d.parameters(), 1e-4)
    feat = GANFeatLoss(loss_weight=10.0)
    gan = MultiScaleGANLoss(gan_type="lsgan")
    lq, gt = torch.rand(2, 3, 64, 64).to(dev), torch.rand(2, 3, 64, 64).to(dev)
    metrics.clear_counters()
    compiles = []
    for _ in range(3):
        out = g(lq)
        pred = d(torch.cat([torch.cat([lq, out], 1), torch.cat([lq, gt], 1)], 0))
        fake = [[t[:2] for t in s] for s in pred]
        real = [[t[2:] for t in s] for s in pred]
        opt_g.zero_grad()
        (gan(fake, True) + feat(fake, real)).backward()
        opt_g.step()
        pred = d(torch.cat([torch.cat([lq, out.detach()], 1), torch.cat([lq, gt], 1)], 0))
        opt_d.zero_grad()
        ((gan([[t[2:] for t in s] for s in pred], True, is_disc=True)
          + gan([[t[:2] for t in s] for s in pred], False, is_disc=True)) / 2).backward()
        opt_d.step()
        torch_xla.sync()
        compiles.append(metrics.metric_data("CompileTime")[0])
    assert compiles[1] == compiles[2], f"recompiled: {compiles}"
    fallbacks = {n for n in metrics.counter_names() if n.startswith("aten::")}
    assert not fallbacks, f"ops fell back to the CPU: {fallbacks}"

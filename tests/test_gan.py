"""GAN training: discriminators, GAN / perceptual losses, SRGAN / ESRGAN models, exact resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fixture_kit
import pytest
import torch
from conftest import FIXTURE_TOL, tiny_train_options, write_options
from safetensors.torch import load_file, save_file
from torch.nn import functional as F

from anysr.archs import build_network
from anysr.archs.vgg_features import VGG19_NAMES, VGGFeatureExtractor
from anysr.cli import main
from anysr.losses import GANLoss, PerceptualLoss, build_loss

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "basicsr"

# torchvision vgg19 ``features`` conv indices and their (out, in) channels.
_VGG_CONVS = [(0, 64, 3), (2, 64, 64), (5, 128, 64), (7, 128, 128), (10, 256, 128), (12, 256, 256),
              (14, 256, 256), (16, 256, 256), (19, 512, 256), (21, 512, 512), (23, 512, 512), (25, 512, 512),
              (28, 512, 512), (30, 512, 512), (32, 512, 512), (34, 512, 512)]


def fake_vgg19_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """A random state dict shaped like torchvision's full vgg19 (features and classifier)."""
    g = torch.Generator().manual_seed(seed)
    sd: dict[str, torch.Tensor] = {}
    for idx, c_out, c_in in _VGG_CONVS:
        sd[f"features.{idx}.weight"] = torch.randn(c_out, c_in, 3, 3, generator=g) * (2 / (9 * c_in)) ** 0.5
        sd[f"features.{idx}.bias"] = torch.randn(c_out, generator=g) * 0.01
    for idx, c_out, c_in in ((0, 4096, 25088), (3, 4096, 4096), (6, 1000, 4096)):
        sd[f"classifier.{idx}.weight"] = torch.zeros(c_out, c_in)
        sd[f"classifier.{idx}.bias"] = torch.zeros(c_out)
    return sd


@pytest.fixture(scope="module")
def vgg_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vgg") / "vgg19.safetensors"
    save_file(fake_vgg19_state_dict(), str(path))
    return path


# ---------------------------------------------------------------- discriminators
def test_vgg_style_discriminator_layout() -> None:
    net = build_network({"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 4}, "network_d")
    keys = set(net.state_dict())
    assert {"conv0_0.weight", "conv0_0.bias", "conv0_1.weight", "bn0_1.running_mean", "conv4_1.weight",
            "bn4_1.num_batches_tracked", "linear1.weight", "linear2.bias"} <= keys
    assert not any(k.startswith("conv5") for k in keys)
    assert net.linear1.in_features == 4 * 8 * 4 * 4
    assert net(torch.rand(2, 3, 128, 128)).shape == (2, 1)
    big = build_network({"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 4, "input_size": 256})
    assert "conv5_1.weight" in big.state_dict() and big.linear1.in_features == 4 * 8 * 16
    small = build_network({"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 4, "input_size": 32})
    assert small(torch.rand(2, 3, 32, 32)).shape == (2, 1)
    with pytest.raises(ValueError, match=r"input_size=32\) got a \(1, 3, 64, 64\) batch"):
        small(torch.rand(1, 3, 64, 64))


def test_vgg_style_discriminator_bad_size() -> None:
    from anysr.errors import OptionError
    with pytest.raises(OptionError, match=r"network_d\.input_size: must be a multiple of 32 \(BasicSR: 128 or 256\)"):
        build_network({"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 4, "input_size": 100},
                      "network_d")


def test_unet_discriminator_sn_layout() -> None:
    net = build_network({"type": "UNetDiscriminatorSN", "num_in_ch": 3, "num_feat": 4}, "network_d")
    keys = set(net.state_dict())
    assert {"conv0.weight", "conv0.bias", "conv1.weight_orig", "conv1.weight_u", "conv1.weight_v",
            "conv8.weight_orig", "conv9.weight", "conv9.bias"} <= keys
    assert "conv1.weight" not in keys
    assert net(torch.rand(2, 3, 32, 32)).shape == (2, 1, 32, 32)
    plain = build_network({"type": "UNetDiscriminatorSN", "num_in_ch": 3, "num_feat": 4, "skip_connection": False})
    assert plain(torch.rand(1, 3, 16, 16)).shape == (1, 1, 16, 16)


def _gan_manifest() -> dict[str, Any]:
    manifest = FIXTURES / "gan_manifest.json"
    return json.loads(manifest.read_text()) if manifest.exists() else {"cases": {}}


def _basicsr_gan_cases() -> list[str]:
    return sorted(_gan_manifest()["cases"])


@pytest.mark.parametrize("case", _basicsr_gan_cases())
def test_discriminator_matches_basicsr(case: str) -> None:
    """BasicSR 1.4.2's weights (seeded, then moved by training passes: ``state.*``) load strictly and give
    BasicSR's outputs (eval mode)."""
    spec = _gan_manifest()["cases"][case]
    net = build_network({"type": spec["type"], **spec["kwargs"]}, "network_d")
    io = load_file(str(FIXTURES / f"{case}_io.safetensors"))
    seeded = fixture_kit.seeded_state_dict(spec["seeded"]["shapes"], spec["seeded"]["seed"])
    assert fixture_kit.abs_sum(seeded) == pytest.approx(spec["seeded"]["abs_sum"], rel=1e-9)
    state = {k[len("state."):]: v for k, v in io.items() if k.startswith("state.")}
    net.load_state_dict({**net.state_dict(), **seeded, **state}, strict=True)
    net.eval()
    with torch.no_grad():
        out = net(io["input"].float() / 255)
    torch.testing.assert_close(out, io["output"], **FIXTURE_TOL)


def _seeded_inputs(entry: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: fixture_kit.seeded_input(v["shape"], v["seed"], *v.get("range", (0.0, 1.0)))
            for k, v in entry["inputs"].items()}


@pytest.mark.skipif(not (FIXTURES / "gan_losses.safetensors").exists(), reason="BasicSR GAN fixtures missing")
def test_gan_loss_matches_basicsr() -> None:
    ref = load_file(str(FIXTURES / "gan_losses.safetensors"))
    x = _seeded_inputs(_gan_manifest()["gan_losses"])["input"]
    for gan_type in ("vanilla", "lsgan", "wgan", "wgan_softplus", "hinge"):
        loss = GANLoss(gan_type, real_label_val=0.9, fake_label_val=0.1, loss_weight=0.3)
        for real in (True, False):
            for disc in (True, False):
                torch.testing.assert_close(loss(x, real, is_disc=disc), ref[f"{gan_type}_{int(real)}{int(disc)}"],
                                           **FIXTURE_TOL, msg=f"{gan_type} real={real} disc={disc}")


@pytest.mark.skipif(not (FIXTURES / "perceptual_io.safetensors").exists(), reason="BasicSR GAN fixtures missing")
def test_perceptual_loss_matches_basicsr() -> None:
    ref = load_file(str(FIXTURES / "perceptual_io.safetensors"))
    spec = _gan_manifest()["perceptual"]
    ref.update(_seeded_inputs(spec))
    sd = fake_vgg19_state_dict()
    sd = {k: torch.zeros_like(v) for k, v in sd.items()}
    sd.update(fixture_kit.seeded_state_dict(spec["seeded"]["shapes"], spec["seeded"]["seed"]))
    for crit in ("l1", "fro"):
        loss = PerceptualLoss({"conv1_2": 0.3, "relu2_1": 1.0}, perceptual_weight=2.0, style_weight=0.5,
                              criterion=crit, vgg_state_dict=sd)
        with torch.no_grad():
            percep, style = loss(ref["x"], ref["gt"])
        torch.testing.assert_close(percep, ref[f"percep_{crit}"], **FIXTURE_TOL)
        torch.testing.assert_close(style, ref[f"style_{crit}"], **FIXTURE_TOL)


# ---------------------------------------------------------------- losses
def test_gan_loss_types() -> None:
    x = torch.tensor([[-1.5], [0.25], [2.0]])
    ones, zeros = torch.ones_like(x), torch.zeros_like(x)
    v = GANLoss("vanilla", loss_weight=0.1)
    assert torch.allclose(v(x, True, is_disc=True), F.binary_cross_entropy_with_logits(x, ones))
    assert torch.allclose(v(x, False), 0.1 * F.binary_cross_entropy_with_logits(x, zeros))
    ls = GANLoss("lsgan", real_label_val=0.9, fake_label_val=0.1)
    assert torch.allclose(ls(x, True, is_disc=True), ((x - 0.9) ** 2).mean())
    assert torch.allclose(ls(x, False, is_disc=True), ((x - 0.1) ** 2).mean())
    w = GANLoss("wgan", loss_weight=2.0)
    assert torch.allclose(w(x, True, is_disc=True), -x.mean()) and torch.allclose(w(x, False), 2 * x.mean())
    sp = GANLoss("wgan_softplus")
    assert torch.allclose(sp(x, True), F.softplus(-x).mean())
    assert torch.allclose(sp(x, False, is_disc=True), F.softplus(x).mean())
    h = GANLoss("hinge", loss_weight=0.5)
    assert torch.allclose(h(x, True, is_disc=True), F.relu(1 - x).mean())
    assert torch.allclose(h(x, False, is_disc=True), F.relu(1 + x).mean())
    assert torch.allclose(h(x, True), -0.5 * x.mean())


def test_gan_loss_unknown_type() -> None:
    with pytest.raises(ValueError, match="gan_type 'wgan-gp' is not supported; use one of vanilla, lsgan"):
        build_loss({"type": "GANLoss", "gan_type": "wgan-gp"}, "train.gan_opt")


def test_vgg_extractor_uses_torchvision_indexing() -> None:
    sd = fake_vgg19_state_dict(1)
    ext = VGGFeatureExtractor(["conv1_1", "relu2_1", "conv3_4"])
    ext.load_torchvision_state_dict(sd)  # the full vgg19 (features beyond conv3_4, classifier) is accepted
    assert [n for n, _ in ext.vgg_net.named_children()] == list(VGG19_NAMES[:17])
    assert VGG19_NAMES[16] == "conv3_4" and VGG19_NAMES[36] == "pool5" and len(VGG19_NAMES) == 37
    x = torch.rand(1, 3, 16, 16)
    out = ext(x)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    ref = F.conv2d((x - mean) / std, sd["features.0.weight"], sd["features.0.bias"], padding=1)
    torch.testing.assert_close(out["conv1_1"], ref)
    h = F.relu(ref)
    h = F.relu(F.conv2d(h, sd["features.2.weight"], sd["features.2.bias"], padding=1))
    h = F.max_pool2d(h, 2)
    h = F.relu(F.conv2d(h, sd["features.5.weight"], sd["features.5.bias"], padding=1))
    torch.testing.assert_close(out["relu2_1"], h)
    assert out["conv3_4"].shape == (1, 256, 4, 4)
    assert not any(p.requires_grad for p in ext.parameters())
    ext.train()
    assert not ext.training


def test_vgg_extractor_errors() -> None:
    with pytest.raises(ValueError, match=r"unknown VGG19 layer\(s\) \['conv6_1'\]"):
        VGGFeatureExtractor(["conv6_1"])
    with pytest.raises(ValueError, match="vgg_type 'vgg16' is not supported"):
        VGGFeatureExtractor(["conv1_1"], vgg_type="vgg16")
    ext = VGGFeatureExtractor(["conv1_2"])
    with pytest.raises(KeyError, match="VGG19 weights lack 'features.2.weight' \\(layer conv1_2\\)"):
        ext.load_torchvision_state_dict({"features.0.weight": torch.zeros(64, 3, 3, 3),
                                         "features.0.bias": torch.zeros(64)})
    sd = fake_vgg19_state_dict()
    sd["features.2.weight"] = torch.zeros(64, 32, 3, 3)
    with pytest.raises(ValueError, match=r"'features.2.weight' have shape \(64, 32, 3, 3\), layer conv1_2 needs"):
        ext.load_torchvision_state_dict(sd)


def test_perceptual_loss_values() -> None:
    sd = fake_vgg19_state_dict(2)
    x, y = torch.rand(2, 3, 16, 16), torch.rand(2, 3, 16, 16)
    loss = PerceptualLoss({"conv1_2": 0.5, "relu2_2": 1.0}, perceptual_weight=2.0, style_weight=3.0,
                          vgg_state_dict=sd)
    percep, style = loss(x, y)
    fx, fy = loss.vgg(x), loss.vgg(y)
    expect = 2.0 * (0.5 * F.l1_loss(fx["conv1_2"], fy["conv1_2"]) + F.l1_loss(fx["relu2_2"], fy["relu2_2"]))
    torch.testing.assert_close(percep, expect)

    def gram(t: torch.Tensor) -> torch.Tensor:
        n, c, h, w = t.shape
        f = t.reshape(n, c, h * w)
        return f @ f.transpose(1, 2) / (c * h * w)
    expect_s = 3.0 * (0.5 * F.l1_loss(gram(fx["conv1_2"]), gram(fy["conv1_2"]))
                      + F.l1_loss(gram(fx["relu2_2"]), gram(fy["relu2_2"])))
    torch.testing.assert_close(style, expect_s)
    only = PerceptualLoss({"conv1_1": 1.0}, style_weight=0, criterion="fro", vgg_state_dict=sd)
    p, s = only(x, y)
    assert s is None
    fx, fy = only.vgg(x), only.vgg(y)
    torch.testing.assert_close(p, torch.linalg.vector_norm(fx["conv1_1"] - fy["conv1_1"]))
    with pytest.raises(ValueError, match="needs vgg_state_dict"):
        PerceptualLoss({"conv1_1": 1.0})


# ---------------------------------------------------------------- models
def gan_options(name: str, train_dir: Path, vgg: Path | None, *, model_type: str = "ESRGANModel",
                total_iter: int = 6, **extra: Any) -> dict[str, Any]:
    """Tiny ESRGAN: RRDBNet x2 (8 features, 1 block), VGGStyleDiscriminator(input_size=32)."""
    opt = tiny_train_options(name, train_dir, None, total_iter=total_iter, **extra)
    opt["model_type"] = model_type
    opt["network_g"] = {"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "scale": 2, "num_feat": 8,
                        "num_block": 1, "num_grow_ch": 4}
    opt["network_d"] = {"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 4, "input_size": 32}
    train = opt["train"]
    train["optim_d"] = {"type": "Adam", "lr": 1e-3, "betas": [0.9, 0.99]}
    train["scheduler"] = {"type": "MultiStepLR", "milestones": [3], "gamma": 0.5}
    train["pixel_opt"] = {"type": "L1Loss", "loss_weight": 0.01, "reduction": "mean"}
    train["perceptual_opt"] = {"type": "PerceptualLoss", "layer_weights": {"conv3_4": 1.0},
                               "use_input_norm": True, "perceptual_weight": 1.0, "style_weight": 0,
                               "criterion": "l1"}
    if vgg is not None:
        train["perceptual_opt"]["vgg_weights_path"] = str(vgg)
    train["gan_opt"] = {"type": "GANLoss", "gan_type": "vanilla", "real_label_val": 1.0, "fake_label_val": 0.0,
                        "loss_weight": 0.005}
    train["net_d_iters"] = 1
    train["net_d_init_iters"] = 0
    return opt


def _state(exp: Path, it: int) -> dict[str, Any]:
    return torch.load(exp / "training_states" / f"{it}.state", weights_only=True)


def _assert_same(a: Any, b: Any, where: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), f"{where} differs"


@pytest.mark.slow
def test_esrgan_resume_is_bit_exact(tmp_path: Path, small_train_dir: Path, vgg_file: Path) -> None:
    """N+M straight == N, stop, resume, M for G, D, EMA, both optimisers and schedulers."""
    a = write_options(tmp_path / "a.yml", gan_options("straight", small_train_dir, vgg_file, total_iter=4))
    assert main(["train", "-opt", str(a), "--force_yml", f"path.root={tmp_path}"]) == 0
    b = write_options(tmp_path / "b.yml", gan_options("split", small_train_dir, vgg_file, total_iter=2))
    assert main(["train", "-opt", str(b), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(b), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=4"]) == 0
    exp_a, exp_b = tmp_path / "experiments" / "straight", tmp_path / "experiments" / "split"
    sa, sb = _state(exp_a, 4), _state(exp_b, 4)
    assert set(sa["model"]["nets"]) == {"net_g", "net_d"}
    assert set(sa["model"]["optimizers"]) == {"net_g", "net_d"} == set(sa["model"]["schedulers"])
    _assert_same(sa["model"], sb["model"], "model")
    wa = load_file(str(exp_a / "models" / "net_g_4.safetensors"))
    wb = load_file(str(exp_b / "models" / "net_g_4.safetensors"))
    _assert_same(wa, wb, "weights")
    losses = json.loads((exp_b / "summary.json").read_text())["final_losses"]
    assert {"l_g_pix", "l_g_percep", "l_g_gan", "l_d_real", "l_d_fake", "out_d_real", "out_d_fake"} <= set(losses)
    assert all(v == v for v in losses.values())


def test_srgan_unet_discriminator_warmup(tmp_path: Path, small_train_dir: Path, vgg_file: Path) -> None:
    """SRGANModel with UNetDiscriminatorSN, hinge loss, D-only warm-up and D every 2nd G step."""
    opt = gan_options("srgan", small_train_dir, vgg_file, model_type="SRGANModel", total_iter=4)
    opt["network_d"] = {"type": "UNetDiscriminatorSN", "num_in_ch": 3, "num_feat": 4}
    opt["train"]["gan_opt"]["gan_type"] = "hinge"
    opt["train"]["net_d_init_iters"] = 2
    opt["train"]["net_d_iters"] = 2
    opt["train"]["ema_decay"] = 0
    path = write_options(tmp_path / "s.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    exp = tmp_path / "experiments" / "srgan"
    s2, s4 = _state(exp, 2), _state(exp, 4)
    # Iterations 1-2: D only (G unchanged since init, its optimiser has no state); iteration 4: G stepped once.
    assert s2["model"]["optimizers"]["net_g"]["state"] == {}
    assert s4["model"]["optimizers"]["net_g"]["state"][0]["step"] == 1
    assert s4["model"]["optimizers"]["net_d"]["state"][0]["step"] == 4
    assert "conv1.weight_orig" in s4["model"]["nets"]["net_d"]


def test_pretrain_network_d_is_loaded(tmp_path: Path, small_train_dir: Path, vgg_file: Path) -> None:
    net_d = build_network({"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 4, "input_size": 32})
    pre = tmp_path / "net_d.pth"
    torch.save({"params": net_d.state_dict()}, pre)
    opt = gan_options("pre", small_train_dir, vgg_file, total_iter=1)
    opt["path"]["pretrain_network_d"] = str(pre)
    opt["train"]["optim_d"]["lr"] = 0.0  # D unchanged by its step: equal to the file afterwards
    opt["logger"]["save_checkpoint_freq"] = 1
    path = write_options(tmp_path / "p.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    saved = _state(tmp_path / "experiments" / "pre", 1)["model"]["nets"]["net_d"]
    for k, v in net_d.state_dict().items():
        if "running" not in k and "num_batches" not in k:
            assert torch.equal(saved[k], v), k


def test_missing_vgg_weights_path(tmp_path: Path, small_train_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_options(tmp_path / "n.yml", gan_options("novgg", small_train_dir, None, total_iter=1))
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 2
    err = capsys.readouterr().err  # not set: found by name; the tests' torch hub cache is empty and offline
    assert ("train.perceptual_opt.vgg_weights_path: torchvision's VGG19 (vgg19-dcbb9e9d.pth) is not on this machine "
            "and downloading is off (ANYSR_OFFLINE=1); download https://download.pytorch.org/models/vgg19-dcbb9e9d.pth "
            "to ") in err and err.strip().count("\n") == 0


def test_vgg_weights_path_must_exist(tmp_path: Path, small_train_dir: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = write_options(tmp_path / "m.yml", gan_options("gone", small_train_dir, tmp_path / "nope.safetensors",
                                                         total_iter=1))
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "train.perceptual_opt.vgg_weights_path" in err and "nope.safetensors" in err and "does not exist" in err


def test_missing_network_d(tmp_path: Path, small_train_dir: Path, vgg_file: Path,
                           capsys: pytest.CaptureFixture[str]) -> None:
    opt = gan_options("nod", small_train_dir, vgg_file, total_iter=1)
    del opt["network_d"]
    path = write_options(tmp_path / "d.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 2
    assert "network_d: ESRGANModel needs a discriminator; add network_d" in capsys.readouterr().err


def test_missing_optim_d(tmp_path: Path, small_train_dir: Path, vgg_file: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    opt = gan_options("noopt", small_train_dir, vgg_file, total_iter=1)
    del opt["train"]["optim_d"]
    path = write_options(tmp_path / "o.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 2
    assert "train.optim_d: the discriminator optimizer is missing" in capsys.readouterr().err


def test_esrgan_accumulate_and_bf16(tmp_path: Path, small_train_dir: Path, vgg_file: Path) -> None:
    """Two accumulated micro-batches per step under bf16 autocast: trains, losses finite, D and G both step."""
    opt = gan_options("acc", small_train_dir, vgg_file, total_iter=2)
    opt["train"]["accumulate"] = 2
    opt["train"]["precision"] = "bf16"
    path = write_options(tmp_path / "acc.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    exp = tmp_path / "experiments" / "acc"
    state = _state(exp, 2)["model"]["optimizers"]
    assert state["net_g"]["state"][0]["step"] == 2 and state["net_d"]["state"][0]["step"] == 2
    losses = json.loads((exp / "summary.json").read_text())["final_losses"]
    assert all(v == v and abs(v) < 1e6 for v in losses.values())

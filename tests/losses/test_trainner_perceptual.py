"""traiNNer-redux's perceptual loss (TraiNNerPerceptualLoss) against traiNNer-redux's own class (fixture from
tools/fixtures/make_trainner_perceptual_fixtures.py), and its mapping from traiNNer-redux option files."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import FIXTURE_TOOLS, ROOT, run_cli, saved_weights, write_options
from safetensors.torch import load_file
from test_trainner_dialect import dialect, valid

from anysr.engine.checkpoint.hub import KNOWN
from anysr.losses import build_loss
from anysr.losses.perceptual import FD_SEED, PerceptualLoss, TraiNNerPerceptualLoss, vgg19_stand_in
from anysr.models.loss_set import loss_specs, loss_weight_needs

FIXTURES = ROOT / "tests" / "fixtures"
_spec = importlib.util.spec_from_file_location("make_trainner_perceptual",
                                               FIXTURE_TOOLS / "make_trainner_perceptual_fixtures.py")
assert _spec is not None and _spec.loader is not None
maker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(maker)
TOL = {"rtol": 1e-4, "atol": 1e-6}  # fp32 VGG19 + FFT / sort against torch 2.9's kernels in another process
# fd's phase: the angle of FFT bins real in exact arithmetic is +-pi by the sign of rounding noise, which differs
# between FFT kernels (traiNNer-redux's own value moves the same way); measured 9.8e-4 relative (torch 2.13 vs 2.9)
PHASE_TOL = {"rtol": 3e-3, "atol": 1e-6}


@pytest.fixture(scope="module")
def ref() -> dict[str, torch.Tensor]:
    return load_file(str(FIXTURES / "trainner" / "perceptual.safetensors"))


@pytest.fixture(scope="module")
def vgg() -> dict[str, torch.Tensor]:
    return maker.hashed_vgg19()


def _loss(vgg: dict[str, torch.Tensor], **kwargs: Any) -> TraiNNerPerceptualLoss:
    loss = TraiNNerPerceptualLoss(vgg_state_dict=vgg, **kwargs)
    for i, p in enumerate(maker.hashed_projections(kwargs.get("num_proj_fd", maker.NUM_PROJ))):
        if i < loss.num_fd:
            getattr(loss, f"fd_proj_{i}").copy_(p)
    return loss


def test_the_hashed_weights_are_the_fixtures(ref: dict[str, torch.Tensor], vgg: dict[str, torch.Tensor]) -> None:
    want = torch.stack([maker._hashed_int8(64 * 3 * 9, 1).sum(), maker._hashed_int8(512 * 512 * 9, 31).sum()])
    assert torch.equal(ref["check.vgg"], want)
    torch.testing.assert_close(ref["check.weights"], torch.stack([v.double().sum() for v in vgg.values()]).float())
    torch.testing.assert_close(ref["check.proj"],
                               torch.stack([p.double().sum() for p in maker.hashed_projections()]).float())


@pytest.mark.parametrize("case", list(maker.CASES))
def test_matches_trainner_redux(case: str, ref: dict[str, torch.Tensor], vgg: dict[str, torch.Tensor]) -> None:
    x, y = ref["x"].float() / 255, ref["y"].float() / 255
    got = _loss(vgg, **maker.CASES[case])(x, y)
    assert got.dtype == torch.float32 and got.shape == ()
    phase = maker.CASES[case]["criterion"] in ("fd", "fd+l1") and maker.CASES[case].get("phase_weight_fd") != 0
    torch.testing.assert_close(got.reshape(1), ref[f"{case}.loss"], **(PHASE_TOL if phase else TOL))
    scaled = _loss(vgg, loss_weight=0.25, clip_min=0.0, **maker.CASES[case])(x, y)
    torch.testing.assert_close(scaled, got * 0.25, rtol=1e-6, atol=0)


def test_defaults_gradients_and_autocast(ref: dict[str, torch.Tensor], vgg: dict[str, torch.Tensor]) -> None:
    loss = _loss(vgg, criterion="fd+l1", num_proj_fd=maker.NUM_PROJ)
    assert list(loss.layer_weights) == ["conv1_2", "relu1_2", "conv2_2", "relu2_2", "conv3_4", "relu3_4",
                                        "conv4_4", "relu4_4", "conv5_4", "relu5_4"]
    assert loss.alpha == [0.0, 1.0] * 5 and loss.num_fd == 5
    assert loss.vgg.vgg_net.conv1_1.padding_mode == "replicate" and loss.vgg.vgg_net.conv1_2.padding_mode == "zeros"
    x = (ref["x"].float() / 255).requires_grad_(True)
    value = loss(x, ref["y"].float() / 255)
    value.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(p.grad is None and not p.requires_grad for p in loss.parameters())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        amp = loss(x.detach(), ref["y"].float() / 255)
    assert amp.dtype == torch.float32 and torch.equal(amp, value.detach())  # fp32 inside autocast: same kernels
    # the fd projections: seeded (FD_SEED), unit norm, in the state dict
    fresh = TraiNNerPerceptualLoss(criterion="fd", num_proj_fd=3, vgg_state_dict=vgg)
    again = TraiNNerPerceptualLoss(criterion="fd", num_proj_fd=3, vgg_state_dict=vgg)
    assert FD_SEED == 0 and torch.equal(fresh.fd_proj_4, again.fd_proj_4) and fresh.fd_proj_4.shape == (3, 512, 5, 5)
    torch.testing.assert_close(fresh.fd_proj_0.flatten(1).norm(dim=1), torch.ones(3))
    assert "fd_proj_0" in fresh.state_dict()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"antialiased": True}, "antialiased: true needs antialiased-cnns' VGG19"),
    ({"criterion": "l2"}, "criterion 'l2' is not supported; use charbonnier, l1, pd, fd, pd+l1 or fd+l1"),
    ({"alpha": [0.0]}, "alpha has 1 values for 5 layers"),
    ({"criterion": "pd", "layer_weights": {"conv3_4": 1.0}}, "criterion pd has no term for alpha < 1"),
    ({"criterion": "l1", "alpha": [1.0]}, "alpha has 1 values"),
    ({"criterion": "l1", "layer_weights": {"relu3_4": 1.0}, "alpha": [0.5]}, "criterion l1 has no term for alpha > 0"),
    ({"layer_weights": {"conv6_1": 1.0}}, "unknown VGG19 layer(s) ['conv6_1']"),
])
def test_refusals_are_one_line(kwargs: dict[str, Any], message: str, vgg: dict[str, torch.Tensor]) -> None:
    with pytest.raises(ValueError, match=r".*") as err:
        TraiNNerPerceptualLoss(vgg_state_dict=vgg, **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------- the dialect

def _gan(**changes: Any) -> dict[str, Any]:
    opt = dialect(model_type="SRGANModel", **changes)
    opt["network_d"] = {"type": "UNetDiscriminatorSN", "num_in_ch": 3, "num_feat": 8}
    opt["train"]["optim_d"] = {"type": "AdamW", "lr": 1e-4, "weight_decay": 0, "betas": [0.9, 0.99]}
    opt["train"]["losses"] = [{"type": "charbonnierloss", "loss_weight": 1.0},
                              {"type": "perceptualloss", "loss_weight": 0.03},
                              {"type": "ganloss", "gan_type": "vanilla", "loss_weight": 0.1}]
    return opt


def test_trainner_files_map_perceptualloss() -> None:
    out = valid(_gan())
    entry = out["train"]["losses"][1]
    assert entry["type"] == "TraiNNerPerceptualLoss" and entry["name"] == "perceptual"
    assert entry["criterion"] == "charbonnier"  # the class defaults filled in
    assert "train.losses[1] perceptualloss -> TraiNNerPerceptualLoss" in out["mapped_keys"]
    opt = _gan()
    opt["train"]["losses"][1] = {"type": "PerceptualFP16Loss", "loss_weight": 1, "criterion": "fd+l1"}
    assert valid(opt)["train"]["losses"][1]["type"] == "TraiNNerPerceptualLoss"
    opt["train"]["losses"][1]["antialiased"] = True  # checked when built (it needs the loss's weights)
    assert valid(opt)["train"]["losses"][1]["antialiased"] is True


def test_basicsr_perceptual_entries_keep_basicsr_loss() -> None:
    # BasicSR's keys in a traiNNer-redux file: BasicSR's class
    opt = _gan()
    opt["train"]["losses"][1] = {"type": "perceptualloss", "loss_weight": 1, "layer_weights": {"conv5_4": 1.0},
                                 "perceptual_weight": 1.0}
    out = valid(opt)
    assert out["train"]["losses"][1]["type"] == "PerceptualLoss"
    assert not any("TraiNNerPerceptualLoss" in n for n in out["mapped_keys"])
    # a file without traiNNer-redux's keys: today's PerceptualLoss, whatever the case
    opt = _gan()
    for key in ("use_amp", "amp_bf16", "use_channels_last", "fast_matmul", "use_compile", "compile_mode"):
        del opt[key]
    del opt["val"]["val_enabled"], opt["logger"]["save_checkpoint_format"]
    for data in opt["datasets"].values():
        data.pop("lq_size", None), data.pop("accum_iter", None)
    opt["datasets"]["train"]["gt_size"] = 32
    opt["train"]["losses"][1] = {"type": "perceptualloss", "loss_weight": 1, "layer_weights": {"conv5_4": 1.0}}
    out = valid(opt)
    assert out["train"]["losses"][1]["type"] == "PerceptualLoss"
    assert [n for n in out["mapped_keys"] if not n.startswith("network_g.type")] == []  # the preset's note only


def test_weight_zero_is_not_built_and_weights_are_found_by_name() -> None:
    train = {"losses": [{"type": "L1Loss"}, {"type": "TraiNNerPerceptualLoss", "loss_weight": 0},
                        {"type": "TraiNNerPerceptualLoss", "name": "p2", "loss_weight": 0.5}]}
    specs = loss_specs(train, "SRGANModel", ("pixel", "learned", "perceptual", "gan"))
    assert [s.name for s in specs] == ["l1", "p2"] and specs[1].role == "learned"
    needs = loss_weight_needs(specs, {})
    assert [(n.option, n.path, n.known) for n in needs] == [("train.losses[2].vgg_weights_path", None, "vgg19")]
    built = build_loss({"type": "TraiNNerPerceptualLoss", "loss_weight": 0.5, "vgg_state_dict": vgg19_stand_in()}, "x")
    assert isinstance(built, TraiNNerPerceptualLoss) and not isinstance(built, PerceptualLoss)


@pytest.mark.slow
def test_dialect_gan_file_trains_with_vgg_found_by_name(tmp_path: Path) -> None:
    """A traiNNer-redux GAN file with ``perceptualloss`` trains 2 iterations through the CLI, offline, the VGG19
    read from torch hub's cache by its name (random weights there: a cache hit is not re-hashed)."""
    home = tmp_path / "torch_home"
    cache = home / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    torch.save(vgg19_stand_in(seed=3), cache / KNOWN["vgg19"].file_name)
    opt = _gan(name="tperc", train__total_iter=2, val__val_enabled=False, logger__save_checkpoint_freq=2,
               logger__print_freq=1)
    path = write_options(tmp_path / "o.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--offline", "--force_yml", f"path.root={tmp_path}", cwd=tmp_path,
                   env={"TORCH_HOME": str(home)})
    log = proc.stdout + proc.stderr
    assert f"loaded pretrained weights {cache / KNOWN['vgg19'].file_name} [params] (perceptual (vgg19), found by " \
           "name)" in log, log
    mapped = [line for line in log.splitlines() if "traiNNer-redux keys mapped:" in line]
    assert len(mapped) == 1 and "train.losses[1] perceptualloss -> TraiNNerPerceptualLoss" in mapped[0]
    assert "l_g_perceptual" in log and "l_g_gan" in log, log
    assert saved_weights(tmp_path / "experiments" / "tperc", 2)

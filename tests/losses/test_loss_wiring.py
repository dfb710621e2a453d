"""Issue 17: losses wired into the models (BasicSR's ``*_opt`` keys and the ``train.losses`` list), traiNNer-redux's
lower-case names, LDL against the authors' artifact map."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    FIXTURE_TOL,
    ROOT,
    assert_same_weights,
    kill_then_resume,
    run_cli,
    saved_weights,
    tiny_train_options,
    write_options,
)
from safetensors.torch import load_file, save_file
from test_gan import fake_vgg19_state_dict, gan_options
from test_losses import _seeded
from test_realesrgan import real_options

from anysr.cli import main
from anysr.errors import OptionError
from anysr.losses import LDLLoss, artifact_map
from anysr.models.loss_set import LossSpec, loss_weight_needs
from anysr.options import validate_options
from anysr.registry import LOSS_REGISTRY

FIX = ROOT / "tests" / "fixtures" / "losses"


def test_ldl_matches_the_authors_map_loss_and_gradient() -> None:
    f = load_file(FIX / "ldl.safetensors")
    torch.testing.assert_close(artifact_map(f["gt"], f["out"], f["ema"], 7), f["map_k7"], **FIXTURE_TOL)
    torch.testing.assert_close(artifact_map(f["gt"], f["out"], f["ema"], 5), f["map_k5"], **FIXTURE_TOL)
    x = f["out"].clone().requires_grad_(True)
    loss = LDLLoss(loss_weight=1.0)(x, f["ema"], f["gt"])
    loss.backward()
    torch.testing.assert_close(loss.detach().reshape(1), f["loss_k7"], **FIXTURE_TOL)
    torch.testing.assert_close(x.grad, f["grad_k7"], **FIXTURE_TOL)
    assert LDLLoss(loss_weight=0.5)(f["out"], f["ema"], f["gt"]).item() == pytest.approx(0.5 * f["loss_k7"].item())


def test_ldl_map_is_zero_where_the_ema_is_worse() -> None:
    gt = torch.rand(1, 3, 9, 9)
    out = gt + 0.1
    assert artifact_map(gt, out, gt + 0.2).abs().sum() == 0  # every pixel: the EMA residual is larger


@pytest.mark.parametrize(("given", "expected"), [("l1loss", "L1Loss"), ("charbonnierloss", "CharbonnierLoss"),
                                                 ("MSELOSS", "MSELoss"), ("msssiml1loss", "MSSSIML1Loss"),
                                                 ("perceptualloss", "PerceptualLoss"), ("ganloss", "GANLoss"),
                                                 ("ffloss", "FFLoss"), ("ldlloss", "LDLLoss"),
                                                 ("distsloss", "DISTSLoss"), ("sobeledgeloss", "SobelLoss")])
def test_trainner_lower_case_names_resolve(given: str, expected: str) -> None:
    assert LOSS_REGISTRY.canonical(given) == expected
    assert LOSS_REGISTRY.get(given) is LOSS_REGISTRY.get(expected)


def test_unknown_loss_name_lists_what_we_have() -> None:
    with pytest.raises(OptionError,
                       match=r"train.losses\[0\].type: unknown loss 'bcewithlogitsdiceloss'.*known: .*L1Loss"):
        LOSS_REGISTRY.get("bcewithlogitsdiceloss", "train.losses[0].type")


# ---------------------------------------------------------------- options
def _validate(train: dict[str, Any], tmp_path: Path, model_type: str = "SRModel") -> Any:
    opt = tiny_train_options("o", tmp_path, None)
    opt["model_type"] = model_type
    opt["train"].pop("pixel_opt")
    opt["train"].update(train)
    if model_type != "SRModel":
        opt["network_d"] = {"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 4, "input_size": 32}
        opt["train"]["optim_d"] = {"type": "Adam", "lr": 1e-3}
    return validate_options(opt, is_train=True, root=tmp_path, check_paths=False)


def _problems(train: dict[str, Any], tmp_path: Path, model_type: str = "SRModel") -> str:
    with pytest.raises(OptionError) as err:
        _validate(train, tmp_path, model_type)
    return str(err.value)


def test_losses_list_validates_like_the_opt_keys(tmp_path: Path) -> None:
    opt = _validate({"losses": [{"type": "l1loss", "loss_weight": 1.0},
                                {"type": "charbonnierloss", "loss_weight": 0.5},
                                {"type": "ldlloss", "loss_weight": 1.0},
                                {"type": "bcewithlogitsdiceloss", "loss_weight": 0}]}, tmp_path)
    losses = opt["train"]["losses"].to_dict() if hasattr(opt["train"]["losses"], "to_dict") else [
        dict(e) if not hasattr(e, "to_dict") else e.to_dict() for e in opt["train"]["losses"]]
    assert [e["type"] for e in losses] == ["L1Loss", "CharbonnierLoss", "LDLLoss", "bcewithlogitsdiceloss"]
    assert losses[1]["eps"] == 1e-12 and losses[1]["reduction"] == "mean"  # the class's defaults filled in
    assert losses[2]["ksize"] == 7


def test_losses_list_errors_name_the_entry(tmp_path: Path) -> None:
    msg = _problems({"losses": [{"type": "l1loss"}, {"type": "MSELoss", "eps": 1.0},
                                {"type": "bcewithlogitsdiceloss", "loss_weight": 1.0}]}, tmp_path)
    assert "train.losses[1].eps: unknown argument of MSELoss" in msg
    assert "train.losses[2].type: unknown loss 'bcewithlogitsdiceloss'" in msg and "L1Loss" in msg
    msg = _problems({"pixel_opt": {"type": "L1Loss"}, "losses": [{"type": "l1loss"}]}, tmp_path)
    assert "train.losses: set together with train.pixel_opt" in msg
    msg = _problems({"losses": [{"type": "l1loss"}, {"type": "L1Loss", "loss_weight": 2}]}, tmp_path)
    assert "train.losses[1]: logged as 'l1' like train.losses[0]" in msg
    msg = _problems({"ema_decay": 0, "losses": [{"type": "ldlloss"}]}, tmp_path)
    assert "train.losses[0]: LDLLoss compares with the EMA generator's output; set train.ema_decay" in msg
    msg = _problems({"losses": [{"type": "ganloss", "loss_weight": 0.1}, {"type": "l1loss"}]}, tmp_path)
    assert "train.losses[0].type: GANLoss (role gan) is not trained by model_type SRModel" in msg
    assert "ESRGANModel" in msg
    assert _problems({"losses": [{"type": "fliploss", "loss_weight": 0}]}, tmp_path).count("no loss is set") == 1


def test_trainner_perceptual_loss_weight_scales_both_terms(tmp_path: Path) -> None:
    opt = _validate({"losses": [{"type": "perceptualloss", "loss_weight": 0.01, "layer_weights": {"conv3_4": 1.0},
                                 "style_weight": 2.0}, {"type": "ganloss", "loss_weight": 0.1}]},
                    tmp_path, "ESRGANModel")
    entry = opt["train"]["losses"][0]
    assert entry["type"] == "PerceptualLoss" and "loss_weight" not in entry
    assert entry["perceptual_weight"] == pytest.approx(0.01) and entry["style_weight"] == pytest.approx(0.02)


# ---------------------------------------------------------------- training runs
def _final_losses(exp: Path) -> dict[str, float]:
    return json.loads((exp / "summary.json").read_text())["final_losses"]




LIST = [{"type": "l1loss", "loss_weight": 1.0}, {"type": "charbonnierloss", "loss_weight": 0.5},
        {"type": "ldlloss", "loss_weight": 1.0}, {"type": "sobeledgeloss", "loss_weight": 0.1},
        {"type": "fliploss", "loss_weight": 0}]


def _list_options(name: str, train_dir: Path, total_iter: int) -> dict[str, Any]:
    opt = tiny_train_options(name, train_dir, None, total_iter=total_iter)
    opt["train"].pop("pixel_opt")
    opt["train"]["losses"] = LIST
    return opt


@pytest.mark.slow
def test_cli_run_with_a_list_logs_each_loss_and_resumes_exactly(tmp_path: Path, small_train_dir: Path) -> None:
    """SRModel with four losses (LDL on the EMA output among them): each logged under its name; N+M straight ==
    N, stop, resume, M."""
    a = write_options(tmp_path / "a.yml", _list_options("straight", small_train_dir, 4))
    proc = run_cli("train", "-opt", str(a), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    assert "l_ldl" in proc.stdout + proc.stderr  # the log line names each loss
    assert set(_final_losses(tmp_path / "experiments" / "straight")) >= {"l_l1", "l_charbonnier", "l_ldl", "l_sobel"}
    b = write_options(tmp_path / "b.yml", _list_options("split", small_train_dir, 2))
    # Both runs as subprocesses: an in-process run inherits the thread count earlier tests left, and a reduction
    # (a bias gradient) sums in another order over another number of threads.
    run_cli("train", "-opt", str(b), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    run_cli("train", "-opt", str(b), "--auto_resume", "--force_yml", f"path.root={tmp_path}", "train.total_iter=4",
            cwd=tmp_path)
    assert_same_weights(saved_weights(tmp_path / "experiments" / "straight", 4),
                        saved_weights(tmp_path / "experiments" / "split", 4))


def test_list_and_pixel_opt_build_the_same_loss(tmp_path: Path, small_train_dir: Path) -> None:
    a = write_options(tmp_path / "a.yml", tiny_train_options("opt", small_train_dir, None, total_iter=2))
    opt = tiny_train_options("list", small_train_dir, None, total_iter=2)
    opt["train"]["losses"] = [{**opt["train"].pop("pixel_opt"), "type": "l1loss", "name": "pix"}]
    b = write_options(tmp_path / "b.yml", opt)
    for path in (a, b):
        assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert_same_weights(saved_weights(tmp_path / "experiments" / "opt", 2),
                        saved_weights(tmp_path / "experiments" / "list", 2))
    assert set(_final_losses(tmp_path / "experiments" / "list")) == set(_final_losses(tmp_path / "experiments" / "opt"))


@pytest.mark.slow
def test_kill_minus_nine_with_a_list_then_resume_matches(tmp_path: Path, small_train_dir: Path) -> None:
    total = 8
    ref = write_options(tmp_path / "ref.yml", _list_options("ref", small_train_dir, total))
    run_cli("train", "-opt", str(ref), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    opt = _list_options("killed", small_train_dir, total)
    opt["logger"]["save_checkpoint_freq"] = 1
    path = write_options(tmp_path / "k.yml", opt)
    kill_then_resume(path, tmp_path, "killed")
    assert_same_weights(saved_weights(tmp_path / "experiments" / "killed", total),
                        saved_weights(tmp_path / "experiments" / "ref", total))


def _gan_list(opt: dict[str, Any], names: bool) -> dict[str, Any]:
    train = opt["train"]
    pix, percep, gan = train.pop("pixel_opt"), train.pop("perceptual_opt"), train.pop("gan_opt")
    if names:
        train["losses"] = [{**pix, "name": "pix"}, {**percep, "name": "percep"}, {**gan, "name": "gan"}]
    else:
        train["losses"] = [{**pix, "type": "l1loss"}, {**percep, "type": "perceptualloss"},
                           {**gan, "type": "ganloss"}, {"type": "ldlloss", "loss_weight": 1.0}]
    return opt


def test_esrgan_list_equals_opt_keys_and_logs_each_loss(tmp_path: Path, small_train_dir: Path) -> None:
    """The list with BasicSR's names builds the same losses as pixel_opt / perceptual_opt / gan_opt (same weights);
    with traiNNer-redux's lower-case names each loss is logged as l_g_<type without 'loss'>, LDL included."""
    vgg_file = tmp_path / "vgg19.safetensors"
    save_file(fake_vgg19_state_dict(), str(vgg_file))
    a = write_options(tmp_path / "a.yml", gan_options("opt", small_train_dir, vgg_file, total_iter=2))
    b = write_options(tmp_path / "b.yml", _gan_list(gan_options("list", small_train_dir, vgg_file, total_iter=2),
                                                    names=True))
    c = write_options(tmp_path / "c.yml", _gan_list(gan_options("ldl", small_train_dir, vgg_file, total_iter=2),
                                                    names=False))
    for path in (a, b, c):
        assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    exp = tmp_path / "experiments"
    assert_same_weights(saved_weights(exp / "opt", 2), saved_weights(exp / "list", 2))
    assert set(_final_losses(exp / "list")) == set(_final_losses(exp / "opt"))
    assert {"l_g_l1", "l_g_perceptual", "l_g_gan", "l_g_ldl", "l_d_real", "l_d_fake"} <= set(_final_losses(exp / "ldl"))


def test_lpips_from_the_list_reads_its_weight_files(tmp_path: Path, small_train_dir: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for key in ("backbone_shapes", "head_shapes"):
        files.append(str(tmp_path / f"lpips_{key}.safetensors"))
        save_file(_seeded("lpips_alex", key), files[-1])
    opt = tiny_train_options("lpips", small_train_dir, None, total_iter=2)
    opt["train"].pop("pixel_opt")
    opt["train"]["losses"] = [{"type": "l1loss"}, {"type": "lpipsloss", "loss_weight": 0.1, "weights": files},
                              {"type": "distsloss", "loss_weight": 0}]  # weight 0: not built, no files needed
    path = write_options(tmp_path / "l.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert {"l_l1", "l_lpips"} <= set(_final_losses(tmp_path / "experiments" / "lpips"))
    opt["train"]["losses"][1].pop("weights")
    opt["name"] = "nofiles"
    path = write_options(tmp_path / "n.yml", opt)
    capsys.readouterr()
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 2
    assert ("train.losses[1].weights: torchvision's AlexNet (alexnet-owt-7be5be79.pth) is not on this machine and "
            "downloading is off (ANYSR_OFFLINE=1)") in capsys.readouterr().err  # found by name: none in the cache


def test_realesrgan_list_equals_opt_keys(tmp_path: Path, small_train_dir: Path) -> None:
    """RealESRGANModel: the list (with LDL against the USM-sharpened GT as the pixel loss) runs; with BasicSR's
    names it trains exactly as pixel_opt + gan_opt."""
    a = real_options("opt", small_train_dir, model="RealESRGANModel", total_iter=2)
    b = real_options("list", small_train_dir, model="RealESRGANModel", total_iter=2)
    train = b["train"]
    train["losses"] = [{**train.pop("pixel_opt"), "name": "pix"}, {**train.pop("gan_opt"), "name": "gan"}]
    c = real_options("ldl", small_train_dir, model="RealESRGANModel", total_iter=2)
    c["train"]["losses"] = [{**c["train"].pop("pixel_opt"), "type": "l1loss"}, {"type": "ldlloss"},
                            {**c["train"].pop("gan_opt"), "type": "ganloss"}]
    for opt in (a, b, c):
        assert main(["train", "-opt", str(write_options(tmp_path / f"{opt['name']}.yml", opt)), "--force_yml",
                     f"path.root={tmp_path}"]) == 0
    exp = tmp_path / "experiments"
    assert_same_weights(saved_weights(exp / "opt", 2), saved_weights(exp / "list", 2))
    assert {"l_g_l1", "l_g_ldl", "l_g_gan"} <= set(_final_losses(exp / "ldl"))


def test_vgg_weight_need_follows_vgg_type() -> None:
    """A perceptual loss on vgg19_bn asks for VGG19-BN weights (and times with a VGG19-BN stand-in)."""
    spec = LossSpec("percep", "train.perceptual_opt", {"type": "PerceptualLoss", "vgg_type": "vgg19_bn",
                                                       "layer_weights": {"relu5_4": 1.0}}, "perceptual")
    (need,) = loss_weight_needs([spec], {})
    assert need.name == "vgg19" and need.option == "train.perceptual_opt.vgg_weights_path" and need.required
    assert "VGG19_BN weights file is required" in need.missing
    assert need.stand_in is not None and "features.1.running_var" in need.stand_in()

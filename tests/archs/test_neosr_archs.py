"""neosr's two networks anysr lacked: ``esc_fp`` (ESCFP) and the ``ea2fpn`` discriminator (EA2FPN).

Fixtures come from neosr's own source (``tools/fixtures/make_neosr_archs_fixtures.py``, ea2fpn's
``make_neosr_ea2fpn_fixtures.py``). esc_fp: neosr's seeded weights load strictly and give its eval outputs and
training gradients; files are recognised; ONNX at an unseen size; an XLA:CPU train step (``-m xla``). ea2fpn (12 M
parameters: seeded weights, ``tools/fixtures/seeded_weights.py``): its keys are neosr's (torchvision's resnet18
under ``base_model.*``), eval output, the training-mode output, gradients and every spectral-norm vector /
batch-norm statistic after the step; any input size; GAN iterations through the command line as ``network_d`` with
and without ``backbone_weights`` (the encoder's torchvision file); XLA:CPU.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step, load_case, manifest
from conftest import FIXTURE_TOL, ROOT, write_options
from safetensors.torch import load_file
from test_gan import gan_options

from anysr.archs import build_network
from anysr.archs.ea2fpn_arch import EA2FPN, ResNet18
from anysr.archs.escfp_arch import ESCFP
from anysr.archs.recognition.recognise import recognise
from anysr.cli import main
from anysr.engine.checkpoint.weights import load_model_weights
from anysr.errors import OptionError
from anysr.models.base import BaseModel

FIXTURES = ROOT / "tests" / "fixtures"
ESC_CASES: dict[str, dict[str, Any]] = manifest("neosr_archs")["cases"]
EA2FPN_CASE: dict[str, Any] = manifest("neosr_ea2fpn")["cases"]["ea2fpn"]
GRAD_RTOL = 1e-4

ESC_TINY = {"type": "ESCFP", "dim": 8, "pdim": 4, "kernel_size": 13, "n_blocks": 1, "conv_blocks": 1,
            "window_size": 4, "num_heads": 2, "upscaling_factor": 2}
EA2FPN_TINY = {"type": "ea2fpn", "pyramid_channels": 8, "segmentation_channels": 16, "class_num": 3}


def test_fixture_files_are_small() -> None:
    files = [*(FIXTURES / "neosr_archs").iterdir(), *(FIXTURES / "neosr_ea2fpn").iterdir()]
    assert all(p.stat().st_size < 200_000 for p in files)


# ----------------------------------------------------------------------------- esc_fp

@pytest.mark.parametrize("name", sorted(ESC_CASES))
def test_esc_fp_reference_weights_load_strictly_and_match(name: str) -> None:
    net, io = load_case("neosr_archs", name)
    assert isinstance(net, ESCFP)
    for inp, out, _ in ESC_CASES[name]["compare"]:
        with torch.no_grad():
            torch.testing.assert_close(net(io[inp]), io[out], **FIXTURE_TOL, msg=f"{name} {out}")


@pytest.mark.parametrize("name", sorted(n for n, c in ESC_CASES.items() if c["gradients"]))
def test_esc_fp_training_gradients_match_reference(name: str) -> None:
    net, io = load_case("neosr_archs", name)
    x = io["input0"].clone().requires_grad_(True)
    net.train()(x).square().mean().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, io["grad_input0"], rtol=GRAD_RTOL,
                               atol=1e-5 * io["grad_input0"].abs().max().item())
    grads = {k[len("grad."):]: v for k, v in io.items() if k.startswith("grad.")}
    assert set(grads) == {n for n, _ in net.named_parameters()}
    for n, p in net.named_parameters():
        assert p.grad is not None, n
        torch.testing.assert_close(p.grad, grads[n], rtol=GRAD_RTOL, atol=1e-5 * max(grads[n].abs().max().item(), 1e-3),
                                   msg=f"{name}: {n}")


@pytest.mark.parametrize("name", sorted(ESC_CASES))
def test_esc_fp_files_are_recognised(name: str) -> None:
    params = load_case("neosr_archs", name)[0].state_dict()  # the seeded weights and the computed buffers
    found = recognise(params)
    assert found.opt["type"] == "ESCFP"
    want = {"kernel_size": 13, "exp_ratio": 1.25, **ESC_CASES[name]["kwargs"]}
    assert {k: found.opt[k] for k in want if k != "attn_type"} == {k: v for k, v in want.items() if k != "attn_type"}
    build_network(found.opt).load_state_dict(params, strict=True)


def test_esc_fp_preset_is_neosrs_network() -> None:
    """neosr's esc_fp (built there with use_dysample=False, without which it refuses) has 539,263 parameters and
    455 state-dict entries at x4, 523,675 at x2."""
    with torch.device("meta"):
        nets = {s: build_network({"type": "esc_fp", "scale": s}) for s in (2, 4)}
        named = build_network({"type": "esc_fp", "upscaling_factor": 3, "attn_type": "flex", "use_dysample": False,
                               "is_fp": True, "realsr": False})
    assert {s: sum(p.numel() for p in n.parameters()) for s, n in nets.items()} == {2: 523_675, 4: 539_263}
    assert len(nets[4].state_dict()) == 455 and isinstance(nets[4], ESCFP)
    assert (named.upscaling_factor, len(named.blocks), named.tile_multiple) == (3, 5, 32)


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "esc_fp", "use_dysample": True}, r"network_g\.use_dysample: ESCFP has no such choice"),
    ({"type": "esc_fp", "realsr": True}, r"network_g\.realsr: ESCFP has no such choice"),
    ({"type": "esc_fp", "is_fp": False}, r"network_g\.is_fp: ESCFP has no such choice"),
    ({"type": "ESCFP", "pdim": 2}, r"network_g\.pdim: ESCFP needs 4 <= pdim <= dim"),
    ({"type": "ESCFP", "kernel_size": 12}, r"network_g\.kernel_size: ESCFP needs an odd kernel_size"),
    ({"type": "ESCFP", "num_heads": 5}, r"network_g\.num_heads: ESCFP: dim \(48\) must be a multiple"),
    ({"type": "ESCFP", "attn_type": "xformers"}, r"network_g\.attn_type: ESCFP: attn_type 'xformers'"),
    ({"type": "ESCFP", "upscaling_factor": 0}, r"network_g\.upscaling_factor: ESCFP needs an integer"),
])
def test_esc_fp_bad_arguments_are_one_line(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err:
        build_network(opt)
    assert "\n" not in str(err.value)


def test_esc_fp_onnx_export_runs_at_sizes_it_never_saw(tmp_path: Path) -> None:
    torch.manual_seed(0)
    check_onnx_at_unseen_size(build_network(ESC_TINY).eval(), ESC_TINY, 2, tmp_path)


@pytest.mark.xla
def test_esc_fp_xla_train_step_compiles_once_without_cpu_fallback() -> None:
    check_xla_train_step(ESC_TINY, (1, 3, 12, 10), eval_form=True, scale=2)


# ----------------------------------------------------------------------------- ea2fpn

def _ea2fpn() -> tuple[EA2FPN, dict[str, torch.Tensor]]:
    """anysr's ea2fpn with the fixture's weights (eval mode), loaded strictly, and the fixture's state file."""
    from seeded_weights import seeded_state_dict  # noqa: PLC0415

    shapes = EA2FPN_CASE["shapes"]
    state = load_file(str(FIXTURES / "neosr_ea2fpn" / "ea2fpn_state.safetensors"))
    only = [k for k in shapes if not k.startswith("layer_down")
            and not k.endswith(("_u", "_v", "init_pos", "num_batches_tracked"))]
    drawn = {**seeded_state_dict(shapes, EA2FPN_CASE["seed"], only=only),
             **{k[len("sn."):]: v for k, v in state.items() if k.startswith("sn.")}}
    net = build_network({"type": EA2FPN_CASE["type"], **EA2FPN_CASE["kwargs"]}, "network_d")
    assert isinstance(net, EA2FPN)
    missing, unexpected = net.load_state_dict(drawn, strict=False)
    assert not unexpected and all(k.startswith("layer_down") or k.endswith(("init_pos", "num_batches_tracked"))
                                  for k in missing)
    full = {k: v.clone() for k, v in net.state_dict().items()}
    net.load_state_dict(full, strict=True)  # every name and shape of neosr's file
    return net.eval(), state


def test_ea2fpn_has_neosrs_keys_and_torchvisions_encoder() -> None:
    with torch.device("meta"):
        net = build_network({"type": "ea2fpn"}, "network_d")
    shapes = {k: list(v.shape) for k, v in net.state_dict().items()}
    assert list(shapes.items()) == list(EA2FPN_CASE["shapes"].items())  # neosr's names, shapes and order
    assert sum(p.numel() for p in net.parameters()) == EA2FPN_CASE["params"] == 12_231_631
    with torch.device("meta"):
        resnet = {f"base_model.{k}": list(v.shape) for k, v in ResNet18().state_dict().items()}
    assert resnet == {k: v for k, v in shapes.items() if k.startswith("base_model.")}
    assert net.layer_down2 is net.base_model.layer2 and net.backbone() is net.base_model


def test_ea2fpn_eval_output_matches_neosr() -> None:
    net, _ = _ea2fpn()
    io = load_file(str(FIXTURES / "neosr_ea2fpn" / "ea2fpn_eval.safetensors"))
    with torch.no_grad():
        torch.testing.assert_close(net(io["input0"]), io["output0"], **FIXTURE_TOL)


def test_ea2fpn_training_step_matches_neosr() -> None:
    """Training mode: one power iteration per spectral norm, batch statistics; gradients of mean(out ** 2) and
    every spectral-norm vector and batch-norm statistic afterwards."""
    net, state = _ea2fpn()
    io = load_file(str(FIXTURES / "neosr_ea2fpn" / "ea2fpn_train.safetensors"))
    net.train()
    x = io["input0"].clone().requires_grad_(True)
    out = net(x)
    # batch statistics of a ResNet-18 in training mode: other CPU kernels move the output by 2.2e-5 of its largest
    # entry and the gradients by 1.7e-4 of theirs (measured with AVX2 kernels against these AVX-512 fixtures)
    ref = io["output0"]
    torch.testing.assert_close(out, ref, rtol=FIXTURE_TOL["rtol"], atol=1e-4 * ref.abs().max().item())
    out.square().mean().backward()
    assert x.grad is not None
    ref = state["grad_input0"]
    torch.testing.assert_close(x.grad, ref, rtol=GRAD_RTOL, atol=1e-3 * ref.abs().max().item())
    grads = {k[len("grad."):]: v for k, v in state.items() if k.startswith("grad.")}
    for n, g in grads.items():
        torch.testing.assert_close(net.get_parameter(n).grad, g, rtol=GRAD_RTOL, atol=1e-3 * g.abs().max().item(),
                                   msg=n)
    after = {k[len("after."):]: v for k, v in state.items() if k.startswith("after.")}
    now = net.state_dict()
    assert len(after) == 60  # 20 batch norms (mean, variance), 10 spectral norms (u, v)
    for n, v in after.items():
        torch.testing.assert_close(now[n], v, **FIXTURE_TOL, msg=n)
    assert not torch.equal(now["final_conv.weight_u"], state["sn.final_conv.weight_u"])  # the iteration ran
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)  # every trainable one
    frozen = {n for n, p in net.named_parameters(remove_duplicate=False) if not p.requires_grad}
    assert {n.split(".")[0] + "." + n.split(".")[1] for n in frozen} == {"base_model.fc", "s2.block"}


def test_ea2fpn_any_input_size() -> None:
    """neosr's network takes multiples of 32 only; other sizes are padded to one and the output cropped back."""
    torch.manual_seed(0)
    net = build_network(EA2FPN_TINY, "network_d").eval()
    x = torch.rand(1, 3, 50, 37)
    with torch.no_grad():
        out = net(x)
        padded = net(torch.nn.functional.pad(x, (0, 27, 0, 14), mode="reflect"))
    assert out.shape == (1, 3, 50, 37)
    torch.testing.assert_close(out, padded[:, :, :50, :37])


@pytest.mark.parametrize(("opt", "arg"), [
    ({"type": "ea2fpn", "class_num": 4}, "class_num"),
    ({"type": "ea2fpn", "encoder_channels": [256, 128, 64, 32]}, "encoder_channels"),
    ({"type": "ea2fpn", "pyramid_channels": 6}, "pyramid_channels"),
    ({"type": "ea2fpn", "segmentation_channels": 24}, "segmentation_channels"),
    ({"type": "ea2fpn", "dropout": 1.0}, "dropout"),
    ({"type": "ea2fpn", "backbone_weights": 3}, "backbone_weights"),
])
def test_ea2fpn_bad_arguments_name_the_argument(opt: dict, arg: str) -> None:
    with pytest.raises(OptionError, match=rf"network_d\.{arg}: ") as err:
        build_network(opt, "network_d")
    assert "\n" not in str(err.value)


def test_ea2fpn_backbone_need() -> None:
    """Without ``backbone_weights`` a fresh run logs one line saying the encoder starts from random weights (not
    when ``path.pretrain_network_d`` holds the whole discriminator, nor on resume); other discriminators have none."""
    with torch.device("meta"):
        net = build_network(EA2FPN_TINY, "network_d")
        other = build_network({"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 4}, "network_d")
    stub = SimpleNamespace(nets={"net_d": net}, opt={"path": {"pretrain_network_d": None}})
    needs = BaseModel.discriminator_backbone_needs(stub)  # type: ignore[arg-type]
    assert [(n.option, n.path, n.param_key, n.fresh_only) for n in needs] == [
        ("network_d.backbone_weights", None, "auto", True)]
    model = SimpleNamespace(weight_needs=lambda: needs)
    assert load_model_weights(model, fresh=True) == [
        "net_d encoder: random weights (network_d.backbone_weights not set; neosr starts EA2FPN's from torchvision's "
        "ImageNet file)"]
    assert load_model_weights(model, fresh=False) == []
    stub.opt["path"]["pretrain_network_d"] = "net_d.pth"
    assert load_model_weights(SimpleNamespace(weight_needs=lambda: BaseModel.discriminator_backbone_needs(stub)),
                              fresh=True) == []
    stub.nets["net_d"] = other
    assert BaseModel.discriminator_backbone_needs(stub) == []  # type: ignore[arg-type]


def test_ea2fpn_gan_iteration_reads_backbone_weights(tmp_path: Path, small_train_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """One GAN iteration through the command line with ea2fpn as network_d: a torchvision resnet18 state dict
    (bare, as torchvision saves it) loads into the encoder on a fresh run."""
    torch.manual_seed(5)
    resnet = ResNet18().state_dict()
    torch.save(resnet, tmp_path / "resnet18.pth")
    opt = gan_options("d", small_train_dir, None, total_iter=1)
    opt["network_d"] = {**EA2FPN_TINY, "backbone_weights": str(tmp_path / "resnet18.pth")}
    del opt["train"]["perceptual_opt"]
    opt["logger"]["save_checkpoint_freq"] = 1
    path = write_options(tmp_path / "d.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    log = capsys.readouterr().out
    state = torch.load(tmp_path / "experiments" / "d" / "training_states" / "1.state", weights_only=True)["model"]
    assert state["optimizers"]["net_d"]["state"], "the discriminator took no step"
    d = state["nets"]["net_d"]
    assert d.keys() == build_network(EA2FPN_TINY, "network_d").state_dict().keys()
    assert all(torch.isfinite(v).all() for v in d.values() if v.is_floating_point())
    assert re.search(r"loaded pretrained weights \S*resnet18\.pth \[auto\] \(net_d encoder\)", log), log
    assert "random weights" not in log
    # one Adam step (lr 1e-3) from the file's values; the frozen fc keeps them exactly
    for k in ("conv1.weight", "layer3.0.conv2.weight", "layer4.1.bn2.weight"):
        assert (d[f"base_model.{k}"] - resnet[k]).abs().max() <= 1.5e-3, k
    assert torch.equal(d["layer_down0.0.weight"], d["base_model.conv1.weight"])  # neosr's names for the same
    assert torch.equal(d["layer_down3.0.conv2.weight"], d["base_model.layer3.0.conv2.weight"])
    torch.testing.assert_close(d["base_model.fc.weight"], resnet["fc.weight"], rtol=0, atol=0)


@pytest.mark.xla
def test_ea2fpn_xla_train_step_compiles_once_without_cpu_fallback() -> None:
    """Power iterations rewrite the spectral-norm vectors and batch norm its statistics every step: the loss
    changes, the graph does not."""
    check_xla_train_step(EA2FPN_TINY, (2, 3, 32, 32), steps=3, same_loss=False)


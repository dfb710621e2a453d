"""traiNNer-redux's PerceptualAnimeLoss, LineDistillerLoss and AESOPLoss under its names: values and gradients equal
to its source's (fixtures from ``tools/fixtures/make_trainner_losses_c_fixtures.py``; the pretrained networks'
weights are the same seeded random tensors on both sides, never stored), the weight files taken as the engine
takes them (``weights`` / AESOP's ``pretrain_network_ae``; missing: one line naming the option), the AutoEncoder
network (traiNNer-redux's keys, recognised), a traiNNer-redux ``train.losses`` list (validated, trained through the
command line), bad arguments refused by name, and XLA:CPU (``-m xla``: forward + backward compile once, no CPU
fallback).
"""

from __future__ import annotations

import functools
import json
import os
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import ROOT, run_cli, saved_weights, write_options
from safetensors.torch import load_file, save_file
from test_trainner_dialect import dialect, valid

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise
from anysr.errors import OptionError
from anysr.losses import build_loss
from anysr.losses.feature_nets import LineDistiller, _resnet50_body
from anysr.models.loss_set import loss_specs, loss_weight_needs
from anysr.registry import LOSS_REGISTRY

FIXTURES = ROOT / "tests" / "fixtures" / "trainner_losses_c"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = MANIFEST["cases"]
# Values: rtol 1e-5. Gradients: rtol 1e-4 with atol 1e-5 of the largest entry (entries near 0 carry the
# summation-order noise of deep convolution stacks).
VALUE_TOL = {"rtol": 1e-5, "atol": 1e-7}
GRAD_RTOL, GRAD_ATOL_REL = 1e-4, 2e-4  # ResNet-50 on AVX2 kernels: 3.1e-5 of the largest entry (measured)
DECODER = {"type": "compact", "num_feat": 8, "num_conv": 2}
_CANON = (("encoder.0.", "conv_first."), ("encoder.2.", "body."), ("encoder.3.", "conv_last."))


def seeded_weights(shapes: dict, seed: int) -> dict:
    """The fixture script's deterministic weights by tensor name (the same function)."""
    out = {}
    for key, shape in shapes.items():
        name = key
        for a, b in _CANON:
            if name.startswith(a):
                name = b + name[len(a):]
        g = torch.Generator().manual_seed(seed * 1000003 + zlib.crc32(name.encode()))
        shape = tuple(shape)
        if key.endswith("num_batches_tracked"):
            out[key] = torch.zeros(shape, dtype=torch.long)
        elif key.endswith("running_var"):
            out[key] = 0.5 + torch.rand(shape, generator=g)
        elif key.endswith("running_mean") or (len(shape) == 1 and key.endswith("bias")):
            out[key] = 0.1 * torch.randn(shape, generator=g)
        elif len(shape) == 1:
            out[key] = 1 + 0.1 * torch.randn(shape, generator=g)
        else:
            fan_in = 1
            for d in shape[1:]:
                fan_in *= d
            out[key] = torch.randn(shape, generator=g) * (1.0 / fan_in) ** 0.5
    return out


def _shapes(net: torch.nn.Module) -> dict:
    return {k: tuple(v.shape) for k, v in net.state_dict().items()}


def _checksum(sd: dict) -> float:
    return float(sum(v.double().abs().sum() for v in sd.values() if v.is_floating_point()))


def _ae(scale: int) -> torch.nn.Module:
    return build_network({"type": "AutoEncoder", "decoder_opt": DECODER, "scale": scale})


@functools.cache
def _weights(loss: str, seed: int, scale: int = 4) -> dict:
    if loss == "PerceptualAnimeLoss":  # RF5's Danbooru layout: the body under 0., the head under 1.
        sd = {f"0.{k}": v for k, v in seeded_weights(_shapes(_resnet50_body()), seed).items()}
        return {**sd, "1.2.weight": torch.ones(4096)}
    if loss == "LineDistillerLoss":
        return seeded_weights(_shapes(LineDistiller()), seed)
    return seeded_weights(_shapes(_ae(scale)), seed)


def _build(case: dict, **extra: Any) -> torch.nn.Module:
    kwargs = dict(case["kwargs"])
    sd = _weights(case["loss"], case["weights_seed"], kwargs.get("scale", 4))
    return build_loss({"type": case["loss"].lower(), "loss_weight": 1.0, **kwargs, **extra,
                       "weight_state_dicts": [sd]}, "test")


@functools.cache
def _loss(case: str) -> torch.nn.Module:
    return _build(CASES[case])


@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_and_gradient_match_trainner(case: str) -> None:
    meta = CASES[case]
    data = load_file(str(FIXTURES / f"{case}.safetensors"))
    loss = _loss(case)
    assert _checksum(loss.net.state_dict()) == pytest.approx(meta["weights_checksum"], rel=1e-9)
    pred = data["pred"].clone().requires_grad_(True)
    value = loss(pred, data["target"])
    value.backward()
    torch.testing.assert_close(value.detach(), data["loss"], **VALUE_TOL)
    assert pred.grad is not None
    ref = data["grad"]
    torch.testing.assert_close(pred.grad, ref, rtol=GRAD_RTOL, atol=GRAD_ATOL_REL * float(ref.abs().max()))


def test_loss_weight_scales_and_networks_stay_frozen() -> None:
    meta = CASES["aesop_x4_charbonnier"]
    data = load_file(str(FIXTURES / "aesop_x4_charbonnier.safetensors"))
    loss = _build(meta, loss_weight=2.5).train()
    assert not loss.net.training and not any(p.requires_grad for p in loss.parameters())
    torch.testing.assert_close(loss(data["pred"], data["target"]), 2.5 * data["loss"], rtol=1e-5, atol=0)


def test_torchvision_named_resnet50_loads() -> None:
    body = seeded_weights(_shapes(_resnet50_body()), 1)
    tv_names = {"0": "conv1", "1": "bn1", "4": "layer1", "5": "layer2", "6": "layer3", "7": "layer4"}
    tv = {f"{tv_names[k.split('.', 1)[0]]}.{k.split('.', 1)[1]}": v for k, v in body.items()}
    tv["fc.weight"], tv["fc.bias"] = torch.zeros(1000, 2048), torch.zeros(1000)
    a = build_loss({"type": "perceptualanimeloss", "weight_state_dicts": [tv]}, "t")
    b = _loss("anime_default")
    x, y = torch.rand(1, 3, 24, 24), torch.rand(1, 3, 24, 24)
    torch.testing.assert_close(a(x, y), b(x, y))


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "perceptualanimeloss"}, "set the loss's `weights`"),
    ({"type": "linedistillerloss"}, "set the loss's `weights`"),
    ({"type": "aesoploss", "decoder_opt": DECODER, "scale": 4}, "set the loss's `pretrain_network_ae`"),
    ({"type": "perceptualanimeloss", "criterion": "l2", "weight_state_dicts": [{}]}, "criterion"),
    ({"type": "perceptualanimeloss", "verbose_logging": True}, "verbose_logging"),
    ({"type": "perceptualanimeloss", "layer_weights": {"4_9_conv1": 1.0}, "weight_state_dicts": [{}]},
     "layer_weights"),
    ({"type": "perceptualanimeloss", "layer_weights": {"4_1_downsample": 1.0}, "weight_state_dicts": [{}]},
     "layer_weights"),
    ({"type": "linedistillerloss", "debug": True}, "debug"),
    ({"type": "linedistillerloss", "weight_state_dicts": [{"x": torch.zeros(1)}]}, "do not fit"),
    ({"type": "aesoploss", "decoder_opt": None, "scale": 4}, "decoder_opt"),
])
def test_bad_arguments_are_refused_by_name(opt: dict, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        build_loss(opt, "t")


def test_line_distiller_sizes() -> None:
    loss = _loss("line_l1")
    with pytest.raises(ValueError, match="multiples of 16"):
        loss(torch.rand(1, 3, 30, 32), torch.rand(1, 3, 30, 32))


def test_autoencoder_keys_and_recogniser() -> None:
    ae = _ae(4)
    sd = ae.state_dict()
    assert "conv_first.0.weight" in sd and "encoder.0.0.weight" in sd and "body.0.RDB1.conv5.0.weight" in sd
    assert ae.encoder[0] is ae.conv_first
    found = recognise(sd)
    assert found.opt["type"] == "AutoEncoder" and found.opt["scale"] == 4
    rebuilt = build_network(found.opt)
    assert _shapes(rebuilt) == _shapes(ae)
    x = torch.rand(1, 3, 12, 20)
    assert ae(x).shape == x.shape
    with pytest.raises(OptionError, match="nf"):
        build_network({"type": "AutoEncoder", "decoder_opt": DECODER, "scale": 3})


def _losses(tmp: Path) -> list[dict[str, Any]]:
    ae = tmp / "ae.safetensors"
    save_file({k: v.contiguous() for k, v in _weights("AESOPLoss", 3).items()}, str(ae))
    line = tmp / "line_distiller_weights.pth"
    torch.save(_weights("LineDistillerLoss", 2), line)
    anime = tmp / "resnet50-13306192.pth"
    torch.save(_weights("PerceptualAnimeLoss", 1), anime)
    return [{"type": "charbonnierloss", "loss_weight": 1.0},
            {"type": "aesoploss", "loss_weight": 0.5, "decoder_opt": DECODER, "scale": 4,
             "pretrain_network_ae": str(ae)},
            {"type": "linedistillerloss", "loss_weight": 0.1, "weights": str(line)},
            {"type": "perceptualanimeloss", "loss_weight": 0.01, "weights": str(anime),
             "layer_weights": {"0": 0.1, "4_2_conv3": 1.0}}]


def test_trainner_losses_list_validates(tmp_path: Path) -> None:
    opt = valid(dialect(train__losses=_losses(tmp_path)))
    assert [e["type"] for e in opt["train"]["losses"]] == ["CharbonnierLoss", "AESOPLoss", "LineDistillerLoss",
                                                           "PerceptualAnimeLoss"]
    with pytest.raises(OptionError, match="pretrain_network_ae"):
        valid(dialect(train__losses=[{"type": "aesoploss", "loss_weight": 1.0, "decoder_opt": DECODER, "scale": 4,
                                      "pretrain_network_ae": str(tmp_path / "missing.safetensors")}]))
    with pytest.raises(OptionError, match="scale"):
        valid(dialect(train__losses=[{"type": "aesoploss", "loss_weight": 1.0, "decoder_opt": DECODER}]))
    with pytest.raises(OptionError, match=r"losses\[0\]\.weights"):
        valid(dialect(train__losses=[{"type": "linedistillerloss", "loss_weight": 1.0,
                                      "weights": str(tmp_path / "missing.pth")}]))


@pytest.mark.parametrize(("entry", "option"), [
    ({"type": "aesoploss", "decoder_opt": DECODER, "scale": 4}, "pretrain_network_ae"),
    ({"type": "linedistillerloss"}, "weights"), ({"type": "perceptualanimeloss"}, "weights")])
def test_weight_files_not_set_are_named(entry: dict, option: str) -> None:
    specs = loss_specs({"losses": [{"type": "l1loss", "loss_weight": 1.0}, {**entry, "loss_weight": 1.0}]},
                       "SRModel", ("pixel", "learned"))
    needs = loss_weight_needs(specs, {})
    assert [(n.option, n.path, n.missing) for n in needs] == [
        (f"train.losses[1].{option}", None, f"{LOSS_REGISTRY.canonical(entry['type'])} needs its weight files")]


@pytest.mark.slow
def test_trainner_losses_train_through_the_cli(tmp_path: Path) -> None:
    opt = dialect(name="lossc", train__total_iter=2, val__val_enabled=False, logger__print_freq=1,
                  logger__save_checkpoint_freq=2, train__losses=_losses(tmp_path)[:2])
    path = write_options(tmp_path / "lossc.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    log = proc.stdout + proc.stderr
    for name in ("l_charbonnier", "l_aesop"):
        assert name in log, (name, log[-3000:])
    weights = saved_weights(tmp_path / "experiments" / "lossc", 2)
    assert all(torch.isfinite(v).all() for v in weights.values() if v.is_floating_point())


# ----------------------------------------------------------------------------- XLA:CPU

# The AESOP case uses an EDSR decoder: SRVGGNetCompact's nearest-upsampled residual has its backward
# (upsample_nearest2d_backward) fall back to the CPU on XLA, and the loss differentiates through the decoder.
XLA_EDSR = {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1}


def _xla_case(case: str) -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    if case != "aesop_edsr":
        data = load_file(str(FIXTURES / f"{case}.safetensors"))
        return _build(CASES[case]), data["pred"], data["target"]
    ae = build_network({"type": "AutoEncoder", "decoder_opt": XLA_EDSR, "scale": 4})
    sd = seeded_weights(_shapes(ae), 5)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1, 3, 20, 28, generator=g)
    opt = {"type": "aesoploss", "decoder_opt": XLA_EDSR, "scale": 4, "weight_state_dicts": [sd]}
    return build_loss(opt, "t"), x, x.flip(-1)


@pytest.mark.xla
@pytest.mark.parametrize("case", ["anime_layers_charbonnier", "line_l1", "aesop_edsr"])
def test_xla_loss_compiles_once_without_fallback(case: str) -> None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics

    dev = torch_xla.device()  # before any backward: the autograd engine sizes its device queues on first use
    loss, x, y = _xla_case(case)
    cpu_pred = x.clone().requires_grad_(True)
    cpu_value = loss(cpu_pred, y)
    cpu_value.backward()
    loss = loss.to(dev)
    torch_xla.sync()  # the upload: 0-dim buffers (batch norms' num_batches_tracked) would join the first graph
    metrics.clear_all()
    compiles = []
    for _ in range(3):
        pred = x.to(dev).requires_grad_(True)
        value = loss(pred, y.to(dev))
        value.backward()
        torch_xla.sync()
        compiles.append(metrics.metric_data("CompileTime")[0])
    assert compiles[2] == compiles[1] == compiles[0], compiles
    torch.testing.assert_close(value.detach().cpu(), cpu_value.detach(), rtol=1e-4, atol=1e-6)
    assert cpu_pred.grad is not None and pred.grad is not None
    ref = cpu_pred.grad
    torch.testing.assert_close(pred.grad.cpu(), ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max()))
    fallbacks = [n for n in metrics.counter_names() if n.startswith("aten::")]
    assert not fallbacks, fallbacks

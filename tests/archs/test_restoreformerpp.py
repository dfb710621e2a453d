"""RestoreFormer++ (``RestoreFormerPlusPlus``; ``RestoreFormer`` with ``ex_multi_scale_num``) against the authors'
``VQVAEGANMultiHeadTransformer`` (wzhouxiff/RestoreFormerPlusPlus; fixtures: tests/fixtures/
make_restoreformerpp_fixtures.py, seeded synthetic weights): outputs, codes and codebook loss equal the authors' (also
RestoreFormer with attention at two levels, which the 2022 code could not run), in [0, 1] through ``unit_range``;
the published configurations have the authors' names, shapes and parameter counts; the authors' Lightning
checkpoint layout (``state_dict`` with ``vqvae.*`` and ``loss.*``, old Lightning's class-keyed ``callbacks``) loads
strictly, is recognised and runs in ``anysr infer`` without --arch and as ``path.pretrain_network_g`` of a training
run; the recogniser tells the two apart; one-line build errors; ONNX on an unseen size; XLA:CPU (``-m xla``)."""

from __future__ import annotations

import collections
import hashlib
import os
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from arch_checks import (
    check_channels_last,
    check_meta_device,
    fixture_io,
    load_case,
    manifest,
    net_opt,
    saved_groups,
    stored_params,
    train,
    train_options,
)
from conftest import FIXTURE_TOL, run_cli

from anysr.archs import build_network
from anysr.archs.arch_util import pad_to_multiple, unit_range
from anysr.archs.recognition.recognise import recognise_all
from anysr.data.imageio import read_image, write_image
from anysr.engine.checkpoint import load_weights, strip_container_prefix
from anysr.engine.checkpoint.weights import load_into
from anysr.errors import OptionError

GROUP = "restoreformerpp"
MANIFEST = manifest(GROUP)
CASES = sorted(MANIFEST["cases"])
# The fixture nets are deeper than conftest's bound assumes (up to 4 levels x 3 blocks with cross-attention, a residual
# stream of tens): measured worst |difference| 1.1e-5 (rfpp_ex2; AVX-512 and AVX2 kernels alike), so 5e-5 absolute.
OUT_TOL = {**FIXTURE_TOL, "atol": 5e-5}
ENCODER_SELF_ATTN_NORM2 = re.compile(r"encoder\.(mid\.attn_1|down\.\d+\.attn\.\d+)\.norm2\.")


def _padded(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return pad_to_multiple(x, net.tile_multiple)[0]


# ----------------------------------------------------------------------------- the authors' outputs

@pytest.mark.parametrize("name", CASES)
def test_outputs_codes_and_codebook_loss_match_the_authors(name: str) -> None:
    case = MANIFEST["cases"][name]
    net, io = load_case(GROUP, name)  # strict: the authors' names and shapes
    assert {k: list(v.shape) for k, v in net.state_dict().items()} == case["synthetic"]["shapes"]
    for j, (inp, out) in enumerate(case["compare"]):
        x = io[inp]
        with torch.no_grad():
            got = net(x)
            _, qloss, info, _ = net.encode(_padded(net, x))
        assert got.shape == x.shape
        torch.testing.assert_close(got, io[out], **OUT_TOL, msg=f"{name} {out}")
        assert torch.equal(info[2][:, 0], io[f"codes{j}"]), "other codebook entries chosen"
        torch.testing.assert_close(qloss.reshape(1), io[f"qloss{j}"], **FIXTURE_TOL)
        assert float(io[out].double().sum()) == pytest.approx(case["output_sums"][out], rel=1e-12)
    assert case["min_code_gap"] > 1e-3  # the codes are far from ties: kernel rounding cannot flip them


def test_unit_range_gives_the_authors_output_on_0_1_images() -> None:
    net, io = load_case(GROUP, "rfpp_two_scales")
    with torch.no_grad():
        got = unit_range(net)((io["input1"] + 1) / 2)
    torch.testing.assert_close(got, (io["output1"] + 1) / 2, **OUT_TOL)


def test_channels_last_and_the_meta_device() -> None:
    net, io = load_case(GROUP, "rfpp_two_scales")
    check_channels_last(net, io["input0"], io["output0"], tol=OUT_TOL)
    check_meta_device(net, io["input2"].shape, io["output2"].shape)  # 13x10: padded and cropped on the device


@pytest.mark.parametrize("name", ["rfpp_two_scales", "rfpp_nomid"])
def test_training_step_reaches_the_extra_cross_attention(name: str) -> None:
    """Every trainable parameter but the encoder self-attentions' unused norm2 gets a finite gradient (the decoder's
    attention above the lowest level, on the encoder's level features, included); the codebook stays frozen."""
    net, io = load_case(GROUP, name)
    net.train()
    net(io["input0"]).square().mean().backward()
    trained = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    assert all(p.grad is None for n, p in trained if ENCODER_SELF_ATTN_NORM2.match(n))
    used = [(n, p) for n, p in trained if not ENCODER_SELF_ATTN_NORM2.match(n)]
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for _, p in used), \
        [n for n, p in used if p.grad is None]
    assert any(n.startswith("decoder.up.1.attn.") for n, _ in used)
    assert not net.quantize.embedding.weight.requires_grad


# ----------------------------------------------------------------------------- published configurations

def _structure(sd: dict[str, torch.Tensor]) -> dict:
    lines = "\n".join(f"{k}:{list(v.shape)}" for k, v in sorted(sd.items()))
    return {"params": sum(v.numel() for v in sd.values()), "keys": len(sd),
            "shapes_sha256": hashlib.sha256(lines.encode()).hexdigest()}


@pytest.mark.parametrize("label", sorted(MANIFEST["published"]))
def test_published_configurations_have_the_authors_tensors(label: str) -> None:
    ref = MANIFEST["published"][label]
    with torch.device("meta"):
        net = build_network({"type": ref["type"]})
        same = build_network({"type": "RestoreFormer", **ref["kwargs"]})
    assert _structure(net.state_dict()) == {k: ref[k] for k in ("params", "keys", "shapes_sha256")}
    assert _structure(same.state_dict()) == _structure(net.state_dict())
    attended = [len(level.attn) for level in net.decoder.up]  # sizes 512 ... 16
    assert attended == ([0, 0, 0, 0, 3, 3] if label == "RestoreFormer++" else [0, 0, 0, 0, 0, 3])


def test_published_sizes() -> None:
    """RestoreFormer++ is RestoreFormer plus a cross-attention in each of the three decoder blocks at size 32
    (256 channels)."""
    counts = {label: MANIFEST["published"][label]["params"] for label in MANIFEST["published"]}
    assert counts == {"RestoreFormer++": 73_472_579, "RestoreFormer": 72_680_003}
    per_block = 2 * 256 * 2 + 4 * (256 * 256 + 256)  # two GroupNorms, q / k / v / proj_out 1x1 convs
    assert counts["RestoreFormer++"] - counts["RestoreFormer"] == 3 * per_block


# ----------------------------------------------------------------------------- recognised from the tensors

def _layout(opt: dict) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):
        return {k: tuple(v.shape) for k, v in build_network(dict(opt)).state_dict().items()}


@pytest.mark.parametrize("name", CASES)
def test_fixture_layouts_are_recognised_with_their_arguments(name: str) -> None:
    opt = net_opt(GROUP, name)
    found = recognise_all(_layout(opt))
    assert [f.opt["type"] for f in found] == [opt["type"]], [f.describe() for f in found]
    shown = {k: v for k, v in opt.items() if k not in ("type", "head_size", "resolution", "ex_multi_scale_num")}
    assert {k: found[0].opt[k] for k in shown} == shown
    assert found[0].opt.get("ex_multi_scale_num", 0) == opt["ex_multi_scale_num"]
    assert "head_size" not in found[0].opt  # shown by no tensor: the class's default (the published value)


@pytest.mark.parametrize(("opt", "args"), [
    ({"type": "RestoreFormerPlusPlus"}, {"ex_multi_scale_num": 1, "attn_resolutions": [16]}),
    ({"type": "RestoreFormer"}, {"attn_resolutions": [16]}),
    ({"type": "RestoreFormer", "ex_multi_scale_num": 2}, {"ex_multi_scale_num": 2, "attn_resolutions": [16]}),
    ({"type": "RestoreFormer", "ex_multi_scale_num": 1, "attn_resolutions": [32, 16]},  # the decoder: 32 only
     {"ex_multi_scale_num": 1, "attn_resolutions": [32, 16]}),
    ({"type": "RestoreFormer", "ex_multi_scale_num": 1, "attn_resolutions": [16, 32]},  # the decoder: 16 and 64
     {"ex_multi_scale_num": 1, "attn_resolutions": [16, 32]}),
    ({"type": "RestoreFormer", "attn_resolutions": [16, 32]}, {"attn_resolutions": [32, 16]}),  # same network
])
def test_published_and_variant_layouts_are_recognised(opt: dict, args: dict) -> None:
    layout = _layout(opt)
    found = recognise_all(layout)
    plus = "ex_multi_scale_num" in args
    assert [f.opt["type"] for f in found] == ["RestoreFormerPlusPlus" if plus else "RestoreFormer"]
    assert {k: found[0].opt[k] for k in args} == args and _layout(found[0].opt) == layout
    assert found[0].opt.get("ex_multi_scale_num", 0) == args.get("ex_multi_scale_num", 0)


# ----------------------------------------------------------------------------- the authors' Lightning checkpoint

def _lightning_checkpoint(path: Path, sd: dict[str, torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> None:
    """The layout of the authors' ``RestoreFormer++.ckpt`` (Lightning 1.0.8): the LightningModule's state dict
    (the generator under ``vqvae.``, the losses' networks under ``loss.``), the step counters, the optimizer and
    scheduler states, and ``callbacks`` keyed by the callback's class (pickled by name: a stand-in module here)."""
    names = ("pytorch_lightning", "pytorch_lightning.callbacks", "pytorch_lightning.callbacks.model_checkpoint")
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    checkpoint_cls = type("ModelCheckpoint", (), {"__module__": names[-1]})
    monkeypatch.setattr(sys.modules[names[-1]], "ModelCheckpoint", checkpoint_cls, raising=False)
    gen = torch.Generator().manual_seed(0)
    losses = {"loss.discriminator.main.0.weight": torch.randn(8, 3, 4, 4, generator=gen),
              "loss.discriminator.main.1.running_mean": torch.zeros(8),
              "loss.discriminator.main.1.num_batches_tracked": torch.tensor(5),
              "loss.perceptual_loss.net.slice1.0.weight": torch.randn(4, 3, 3, 3, generator=gen),
              "loss.identity.conv1.weight": torch.randn(4, 1, 3, 3, generator=gen)}
    torch.save({"epoch": 3, "global_step": 120, "pytorch-lightning_version": "1.0.8",
                "callbacks": {checkpoint_cls: {"best_model_score": torch.tensor(0.5), "best_model_path": "x.ckpt"}},
                "optimizer_states": [{"state": {}, "param_groups": [{"lr": 4.5e-6, "params": [0, 1]}]}],
                "lr_schedulers": [{"milestones": collections.Counter([4000000, 8000000]), "gamma": 0.5}],
                "state_dict": {**{f"vqvae.{k}": v for k, v in sd.items()}, **losses}}, path)


def test_the_lightning_checkpoint_loads_strictly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    sd = stored_params(GROUP, "rfpp_two_scales")
    path = tmp_path / "RestoreFormer++.ckpt"
    _lightning_checkpoint(path, sd, monkeypatch)
    with caplog.at_level("INFO", logger="anysr.engine.checkpoint"):
        got, meta = load_weights(path, "params")
    assert meta == {} and set(got) == set(sd) and all(torch.equal(got[k], sd[k]) for k in sd)
    assert "a Lightning checkpoint: its 5 'loss.' tensors" in caplog.text and "'vqvae.' entries" in caplog.text
    found = recognise_all(got)
    assert [f.opt["type"] for f in found] == ["RestoreFormerPlusPlus"]
    net = build_network(found[0].opt).eval()
    load_into(net, got, strict=True, source=str(path))
    io = fixture_io(GROUP, "rfpp_two_scales")
    with torch.no_grad():
        torch.testing.assert_close(net(io["input0"]), io["output0"], **OUT_TOL)


def test_a_lightning_state_dict_of_several_modules_keeps_their_names(tmp_path: Path) -> None:
    """Only the losses go: a LightningModule holding the network's parts directly (taming's VQModel) keeps them."""
    net = build_network({"type": "SRVGGNetCompact", "num_feat": 4, "num_conv": 1})
    torch.save({"state_dict": {**net.state_dict(), "loss.logvar": torch.zeros(1)}, "global_step": 1},
               tmp_path / "w.ckpt")
    got, _ = load_weights(tmp_path / "w.ckpt", "params")
    assert set(got) == set(net.state_dict()) and strip_container_prefix(got)[1] == ""
    torch.save({"state_dict": net.state_dict()}, tmp_path / "plain.ckpt")  # no losses: as before
    assert set(load_weights(tmp_path / "plain.ckpt", "params")[0]) == set(net.state_dict())
    bare = {f"vqvae.{k}": v for k, v in stored_params(GROUP, "rf_two_levels").items()}  # a bare wrapped file
    found = recognise_all(strip_container_prefix(bare)[0])
    assert strip_container_prefix(bare)[1] == "vqvae." and [f.opt["type"] for f in found] == ["RestoreFormer"]


def _face_png(path: Path, h: int = 20, w: int = 16) -> Path:
    write_image(path, np.random.default_rng(0).integers(0, 256, (h, w, 3), dtype=np.uint8))
    return path


@pytest.mark.slow
def test_infer_runs_the_lightning_checkpoint_without_arch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``anysr infer --weights RestoreFormer++.ckpt``: recognised (RestoreFormer++, one extra scale), the authors'
    [-1, 1] network applied to the [0, 1] image."""
    sd = stored_params(GROUP, "rfpp_two_scales")
    ckpt = tmp_path / "RestoreFormer++.ckpt"
    _lightning_checkpoint(ckpt, sd, monkeypatch)
    img = _face_png(tmp_path / "face.png")
    r = run_cli("infer", "--weights", str(ckpt), "-i", str(img), "-o", str(tmp_path / "out"), "--precision", "fp32",
                "--no-channels-last", cwd=tmp_path)  # pinned: no calibration run
    log = r.stdout + r.stderr
    assert "recognised from the weights' names and shapes: RestoreFormerPlusPlus" in log
    assert "ex_multi_scale_num=1" in log and "a Lightning checkpoint" in log
    (out,) = sorted((tmp_path / "out").rglob("*.png"))
    net, _ = load_case(GROUP, "rfpp_two_scales")
    rgb = np.ascontiguousarray(read_image(img)[..., ::-1])  # files are BGR, networks see RGB
    x = torch.from_numpy(rgb.astype(np.float32) / 255.0).permute(2, 0, 1)[None]
    with torch.no_grad():
        want = ((net(x * 2 - 1) + 1) / 2).clamp(0, 1)[0].permute(1, 2, 0).numpy() * 255.0
    got = np.ascontiguousarray(read_image(out)[..., ::-1]).astype(np.float64)
    assert got.shape == want.shape and np.abs(got - want).max() <= 0.51  # 8-bit rounding only


# ----------------------------------------------------------------------------- build errors

@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "RestoreFormerPlusPlus", "ex_multi_scale_num": 6},
     r"network_g\.ex_multi_scale_num: RestoreFormer\+\+: ex_multi_scale_num 6 puts the extra attention at size "
     r"1024, where the decoder has no level \(its levels: \[512, 256, 128, 64, 32, 16\]\)"),
    ({"type": "RestoreFormerPlusPlus", "ch": 32, "ch_mult": [1, 1], "resolution": 16, "attn_resolutions": [8],
      "ex_multi_scale_num": 2}, r"network_g\.ex_multi_scale_num: .* size 32, where the decoder has no level"),
    ({"type": "RestoreFormerPlusPlus", "attn_resolutions": []},
     r"network_g\.ex_multi_scale_num: RestoreFormer\+\+: the extra attention doubles the last entry of "
     r"attn_resolutions, which is empty"),
    ({"type": "RestoreFormer", "ex_multi_scale_num": -1}, r"network_g\.ex_multi_scale_num: .* 0 or more, got -1"),
    ({"type": "RestoreFormerPlusPlus", "enable_mid": False},
     r"network_g\.attn_resolutions: .*encoder's middle features, which exist only with enable_mid; resolution 16 "
     r"is level 5"),
    ({"type": "RestoreFormerPlusPlus", "head_size": 3},
     r"network_g\.head_size: RestoreFormer: 512 channels cannot be split into 3 heads"),
])
def test_impossible_arguments_are_refused_in_one_line(opt: dict, pattern: str) -> None:
    with torch.device("meta"), pytest.raises(OptionError, match=pattern) as e:
        build_network(opt)
    assert "\n" not in str(e.value)


def test_the_2022_model_accepts_attention_at_several_levels() -> None:
    with torch.device("meta"):
        net = build_network({"type": "RestoreFormer", "attn_resolutions": [16, 32]})
    assert [len(level.attn) for level in net.decoder.up] == [0, 0, 0, 0, 3, 3]
    assert [len(level.attn) for level in net.encoder.down] == [0, 0, 0, 0, 2, 2]


# ----------------------------------------------------------------------------- ONNX, training

def test_onnx_on_a_size_the_export_never_saw(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine.inference.export import export_onnx

    net, io = load_case(GROUP, "rfpp_two_scales")
    rep = export_onnx(net, tmp_path / "rfpp.onnx", scale=1, size=16)
    assert rep.dynamic is True and max(c.max_diff for c in rep.checks) < 1e-4, rep.note
    session = ort.InferenceSession(str(tmp_path / "rfpp.onnx"), providers=["CPUExecutionProvider"])
    x = io["input2"]  # 13x10: padded inside the graph
    got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
    torch.testing.assert_close(got, io["output2"], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_training_run_from_the_lightning_checkpoint(tmp_path: Path, small_train_dir: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``anysr train`` (a subprocess) with ``path.pretrain_network_g`` the authors' checkpoint layout: loaded
    strictly (the losses ignored), two GAN-free iterations with anysr's pixel loss, finite weights that moved; the
    codebook stays frozen."""
    sd = stored_params(GROUP, "rfpp_two_scales")
    ckpt = tmp_path / "RestoreFormer++.ckpt"
    _lightning_checkpoint(ckpt, sd, monkeypatch)
    net = net_opt(GROUP, "rfpp_two_scales")
    opt = train_options("rfpp", small_train_dir, net, scale=1, total_iter=2, train__ema_decay=0,
                        train__warmup_iter=-1, find_unused_parameters=True)
    opt["path"]["pretrain_network_g"] = str(ckpt)
    exp, log = train(tmp_path, opt, subprocess=True)
    assert "a Lightning checkpoint" in log + "".join(p.read_text() for p in exp.rglob("*.log"))
    params = saved_groups(exp, 2)["params"]
    assert set(params) == set(sd) and all(torch.isfinite(v).all() for v in params.values())
    build_network(dict(net)).load_state_dict(params, strict=True)
    assert any(not torch.equal(params[k], sd[k]) for k in params if k.startswith("decoder.up.1.attn."))
    assert torch.equal(params["quantize.embedding.weight"], sd["quantize.embedding.weight"])


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
def test_xla_train_step_compiles_once() -> None:
    """Three training steps on XLA:CPU: one graph, finite gradients, no op fallen back to the CPU (the encoder's
    self-attentions leave their norm2 without a gradient, so the common check's every-parameter demand is not
    made: as RestoreFormer's in tests/archs/test_face.py)."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics

    torch.manual_seed(0)
    dev = torch_xla.device()
    net = build_network({"type": "RestoreFormerPlusPlus", "n_embed": 16, "embed_dim": 8, "ch": 32, "ch_mult": [1, 1],
                         "num_res_blocks": 1, "attn_resolutions": [8], "resolution": 16, "z_channels": 8,
                         "head_size": 4}).train().to(dev)
    x = torch.rand(1, 3, 16, 12).to(dev)
    metrics.clear_all()
    compiles, losses = [], []
    for _ in range(3):
        net.zero_grad(set_to_none=True)
        loss = net(x).square().mean()
        loss.backward()
        torch_xla.sync()
        compiles.append(metrics.metric_data("CompileTime")[0])
        losses.append(loss.detach().cpu())
    assert compiles[0] >= 1 and compiles[2] == compiles[1] == compiles[0], f"recompiled: {compiles}"
    used = [(n, p) for n, p in net.named_parameters() if p.requires_grad and not ENCODER_SELF_ATTN_NORM2.match(n)]
    assert all(p.grad is not None for _, p in used) and any(n.startswith("decoder.up.0.attn.") for n, _ in used)
    assert torch.isfinite(torch.stack([p.grad.abs().sum() for _, p in used]).cpu()).all()
    assert all(torch.isfinite(v) for v in losses)
    fallbacks = [name for name in metrics.counter_names() if name.startswith("aten::")]
    assert not fallbacks, f"fell back to the CPU for {fallbacks}"
    assert not metrics.executed_fallback_ops()

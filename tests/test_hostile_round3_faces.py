"""Hostile and careless input, round three: faces and the authors' GAN recipes (GFPGAN, RestoreFormer, StyleGAN2,
MMRealSR, DFDNet).

Every case here was reproduced before its fix: landmark boxes outside the face trained silently (RoIAlign cropped
nothing), an unreadable landmarks file quoted torch's advice cut mid-sentence, an invalid ``disc_start`` or a
2-value ``mean`` also reported a second, wrong problem, ``disc_start`` past ``total_iter`` silently never trained
the discriminators, MMRealSR's ``custom_degrees`` took NaN (reported later as a NaN loss blamed on the learning rate)
and values outside the estimator's range, DFDNet's ``dict_path`` called a folder "no such file" and quoted torch's
refusal with terminal colour codes, and ``anysr infer`` on StyleGAN2 generator weights ended in a traceback. The
authors' published checkpoint layouts (RestoreFormer's Lightning ``.ckpt``, GFPGAN's ``params_ema``) load as
``pretrain_network_g``; a test keeps it so.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import ROOT, run_cli

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.archs import build_network
from anysr.data import build_dataset
from anysr.engine.checkpoint import load_into, load_weights
from anysr.engine.inference.network import resolve_network
from anysr.errors import DataError, OptionError
from anysr.models import build_model
from anysr.options import load_options
from anysr.options.loader import validate_dataset

FACES = ROOT / "tests" / "fixtures" / "ffhq_degradation" / "images"
NAMES = ("00000000", "00000001", "00000003")  # the 64x64 fixture faces
LANDMARKS = {"left_eye": [20.5, 24.25, 4.5], "right_eye": [42.75, 25.5, 4.0], "mouth": [31.0, 47.5, 7.25]}
RF_FILES = ROOT / "options" / "train" / "RestoreFormer"
GFPGAN_FILE = ROOT / "tests" / "fixtures" / "gfpgan_options" / "train_gfpgan_v1_simple.yml"
TINY_VQ = {"ch": 32, "ch_mult": [1, 1, 2, 2], "num_res_blocks": 1, "attn_resolutions": [16], "resolution": 64,
           "z_channels": 32, "embed_dim": 32, "n_embed": 16}
MMREALSR = {"type": "MMRealSR", "num_feat": 8, "num_block": 1, "num_grow_ch": 4, "num_feats": [8, 8, 8, 16],
            "num_blocks": [1, 1, 1, 1]}


def _one_line(exc: pytest.ExceptionInfo[BaseException], *parts: str) -> str:
    msg = str(exc.value)
    lines = [ln for ln in msg.splitlines() if ln.strip()]
    line = lines[-1] if isinstance(exc.value, OptionError) and lines[0].endswith(":") else msg
    assert len(lines) == 1 or (len(lines) == 2 and lines[0].endswith(":")), msg  # OptionError: a header + one
    for part in parts:
        assert part in line, (part, msg)
    return line


@pytest.fixture()
def faces(tmp_path: Path) -> Path:
    root = tmp_path / "faces"
    root.mkdir()
    for stem in NAMES:
        shutil.copy(FACES / f"{stem}.png", root / f"{stem}.png")
    return root


def _face_options(root: Path, landmarks: Path) -> Any:
    return validate_dataset({"type": "FFHQDegradationDataset", "dataroot_gt": str(root), "batch_size_per_gpu": 1,
                             "out_size": 64, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "use_hflip": True,
                             "crop_components": True, "component_path": str(landmarks)}, name="train")


def _landmarks(path: Path, **changed: list[float]) -> Path:
    torch.save({n: {part: [np.float64(v) for v in changed.get(part, vals)] for part, vals in LANDMARKS.items()}
                for n in NAMES}, path)
    return path


# ----------------------------------------------------------------------------- the landmarks file
@pytest.mark.parametrize(("part", "box"), [
    ("left_eye", [200.0, 24.0, 4.5]),  # centre right of a 64-pixel face (a 512-pixel face's landmarks)
    ("mouth", [-50.0, -50.0, 7.0]),  # centre above-left of the face
    ("right_eye", [42.0, 25.0, -4.0]),  # a negative half side
    ("mouth", [31.0, 47.5, 0.0]),  # an empty box
])
def test_component_boxes_outside_the_face_are_refused(faces: Path, tmp_path: Path, part: str,
                                                      box: list[float]) -> None:
    opt = _face_options(faces, _landmarks(tmp_path / "ok.pth"))
    bad = _landmarks(tmp_path / "bad.pth", **{part: box})
    with pytest.raises(DataError) as exc:
        build_dataset({**opt, "component_path": str(bad)}, "datasets.train")
    _one_line(exc, "datasets.train.component_path", str(bad), "'00000000'", part, "64x64 face", "half side be > 0")
    assert len(build_dataset(opt, "datasets.train")) == 3  # the same faces with boxes inside: fine


def test_truncated_landmarks_file_says_what_is_wrong_in_one_sentence(faces: Path, tmp_path: Path) -> None:
    ok = _landmarks(tmp_path / "ok.pth")
    cut = tmp_path / "cut.pth"
    cut.write_bytes(ok.read_bytes()[:200])
    opt = _face_options(faces, ok)
    with pytest.raises(DataError) as exc:
        build_dataset({**opt, "component_path": str(cut)}, "datasets.train")
    line = _one_line(exc, str(cut), "cannot be read", "failed finding central directory); give GFPGAN's")
    assert "likelihood" not in line  # torch's advice, cut mid-sentence before


# ----------------------------------------------------------------------------- options: one problem, one line
def _problems(file: Path, *over: str) -> list[str]:
    with pytest.raises(OptionError) as exc:
        load_options(file, ["path.pretrain_network_g=null", *over], is_train=True, check_paths=False)
    return [ln.strip() for ln in str(exc.value).splitlines()[1:] if ln.strip()]


@pytest.mark.parametrize(("value", "says"), [("-5", "must be >= 0"), ("1.5", "expected int >= 0")])
def test_invalid_disc_start_is_one_problem(value: str, says: str) -> None:
    problems = _problems(RF_FILES / "train_RestoreFormer.yml", f"train.disc_start={value}")
    assert len(problems) == 1 and problems[0].startswith("train.disc_start:") and says in problems[0], problems
    problems = _problems(RF_FILES / "train_RestoreFormer.yml", "train.disc_start=null")  # still required
    assert len(problems) == 1 and "required by RestoreFormerModel" in problems[0], problems


@pytest.mark.parametrize("key", ["mean", "std"])
def test_two_values_for_three_channels_is_one_problem(key: str) -> None:
    problems = _problems(GFPGAN_FILE, f"datasets.train.{key}=[0.5, 0.5]")
    assert problems == [f"datasets.train.{key}: expected a list of 3 float, got 2 items"], problems
    problems = _problems(GFPGAN_FILE, f"datasets.train.{key}=null")  # one of the two: still said
    assert any("set mean and std together" in p for p in problems), problems


# ----------------------------------------------------------------------------- RestoreFormer: disc_start
def test_disc_start_past_total_iter_is_warned(caplog: pytest.LogCaptureFixture) -> None:
    over = ["accelerator=cpu", "num_gpu=1", "train.precision=fp32", "train.channels_last=false", "network_d.num_feat=8",
            "train.perceptual_weight=0", "train.total_iter=10", "train.disc_start=10",
            *(f"network_g.{k}={json.dumps(v)}" for k, v in TINY_VQ.items())]
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    with caplog.at_level(logging.WARNING, logger="anysr"):
        build_model(load_options(RF_FILES / "train_HQ_Dictionary.yml", over, is_train=True, check_paths=False),
                    acc).setup()
    said = [r.getMessage() for r in caplog.records if "disc_start" in r.getMessage()]
    assert len(said) == 1 and "train.disc_start 10 is not below train.total_iter 10" in said[0], said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="anysr"):
        build_model(load_options(RF_FILES / "train_HQ_Dictionary.yml", [*over, "train.disc_start=9"],
                                 is_train=True, check_paths=False), acc).setup()
    assert not [r for r in caplog.records if "disc_start" in r.getMessage()]


# ----------------------------------------------------------------------------- the authors' checkpoint layouts
def test_restoreformer_lightning_checkpoint_loads_as_pretrain_network_g(tmp_path: Path) -> None:
    """The authors' published ``.ckpt``: ``state_dict`` with the network under ``vqvae.`` and their loss
    (discriminator, LPIPS, logvar) under ``loss.``: the network's tensors load strictly."""
    torch.manual_seed(0)
    hq = build_network({"type": "VQVAEGAN", **TINY_VQ})
    d = build_network({"type": "PatchGAN", "num_in_ch": 3, "num_feat": 8, "num_layers": 3, "norm_type": "batch",
                       "use_sn": False})
    sd = {f"vqvae.{k}": v for k, v in hq.state_dict().items()}
    sd |= {f"loss.discriminator.main.{k.split('.', 1)[1]}": v for k, v in d.state_dict().items()}
    sd |= {"loss.perceptual_loss.net.slice1.0.weight": torch.zeros(64, 3, 3, 3), "loss.logvar": torch.zeros(())}
    path = tmp_path / "last.ckpt"
    torch.save({"epoch": 3, "global_step": 100, "pytorch-lightning_version": "1.0.8", "state_dict": sd,
                "optimizer_states": [], "lr_schedulers": []}, path)
    weights, _ = load_weights(path)
    rf = build_network({"type": "RestoreFormer", **TINY_VQ})
    load_into(rf, weights, strict=True, source=str(path))
    assert all(torch.equal(rf.state_dict()[k], v) for k, v in hq.state_dict().items())


def test_gfpgan_params_ema_file_loads_as_pretrain_network_g(tmp_path: Path) -> None:
    net = {"type": "GFPGANv1", "out_size": 64, "num_style_feat": 32, "narrow": 0.125, "num_mlp": 2,
           "channel_multiplier": 1, "decoder_load_path": None, "fix_decoder": True, "input_is_latent": True,
           "different_w": True, "sft_half": True}
    torch.manual_seed(1)
    g = build_network(net)
    torch.save({"params_ema": g.state_dict()}, tmp_path / "GFPGANv1.pth")  # as the authors publish it
    weights, _ = load_weights(tmp_path / "GFPGANv1.pth", "params_ema")
    other = build_network(net)
    load_into(other, weights, strict=True, source="GFPGANv1.pth")
    assert all(torch.equal(other.state_dict()[k], v) for k, v in g.state_dict().items())


# ----------------------------------------------------------------------------- MMRealSR's custom_degrees
@pytest.mark.parametrize("degrees", [[float("nan"), None], [5.0, None], [None, -0.5], [float("inf"), 0.2]])
def test_custom_degrees_outside_the_estimators_range_are_refused(degrees: list[float | None]) -> None:
    with pytest.raises(OptionError) as exc:
        build_network({**MMREALSR, "custom_degrees": degrees})
    _one_line(exc, "network_g.custom_degrees", "each degree lies in [0, 1]", "sigmoid")


def test_custom_degrees_in_range_build() -> None:
    assert build_network({**MMREALSR, "custom_degrees": [0.0, 1]}).custom_degrees == [0.0, 1]
    net = build_network({**MMREALSR, "degradation_degree_actv": "tanh", "custom_degrees": [-0.5, None]})
    assert net.custom_degrees == [-0.5, None]  # tanh's estimates lie in [-1, 1]
    with pytest.raises(OptionError, match=r"custom_degrees: each degree lies in \[-1, 1\]"):
        build_network({**MMREALSR, "degradation_degree_actv": "tanh", "custom_degrees": [-1.5, None]})


# ----------------------------------------------------------------------------- DFDNet's dict_path
def test_dfdnet_dict_path_folder_and_foreign_pickle_are_named(tmp_path: Path) -> None:
    with pytest.raises(OptionError) as exc:
        build_network({"type": "DFDNet", "dict_path": str(tmp_path)})
    _one_line(exc, "network_g.dict_path", "is a folder")
    numpy_dict = tmp_path / "dict.pth"
    torch.save({"256": {"left_eye": np.zeros((2, 128, 4, 4), np.float32)}}, numpy_dict)
    with pytest.raises(OptionError) as exc:
        build_network({"type": "DFDNet", "dict_path": str(numpy_dict)})
    line = _one_line(exc, "network_g.dict_path", "holds objects other than tensors", "_reconstruct")
    assert "\x1b" not in line and "trust the source" not in line  # torch's advice and colour codes before


# ----------------------------------------------------------------------------- anysr infer on a StyleGAN2 generator
def test_infer_refuses_a_stylegan2_generator(tmp_path: Path) -> None:
    torch.manual_seed(0)
    sg = build_network({"type": "StyleGAN2Generator", "out_size": 32, "num_style_feat": 16, "num_mlp": 1,
                        "narrow": 0.25})
    path = tmp_path / "stylegan2.pth"
    torch.save({"params_ema": sg.state_dict()}, path)
    for scale in (None, 1):  # with --scale 1 it ran, and crashed in the forward
        with pytest.raises(OptionError) as exc:
            resolve_network(weights=str(path), arch=None, arch_opts={}, network_opt=None, scale=scale,
                            param_key="params_ema")
        _one_line(exc, "StyleGAN2Generator", "reads no input image")
    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(FACES / "00000000.png", src / "face.png")
    proc = run_cli("infer", "--weights", str(path), "--scale", "1", "-i", str(src), "-o", str(tmp_path / "out"),
                   "--no-progress", cwd=tmp_path, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "reads no input image" in proc.stderr.strip().splitlines()[-1], proc.stderr


# ----------------------------------------------------------------------------- GFPGAN's frozen decoder
def _gfpgan(*over: str) -> Any:
    small = ["network_g.out_size=64", "network_g.num_style_feat=32", "network_g.narrow=0.125", "network_g.num_mlp=2",
             "network_d.out_size=64", "network_d.narrow=0.125", "datasets.train.out_size=64", "accelerator=cpu",
             "num_gpu=1", "train.precision=fp32", "train.channels_last=false"]
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    return build_model(load_options(GFPGAN_FILE, [*small, *over], is_train=True, check_paths=False), acc)


def test_frozen_decoder_without_weights_is_refused() -> None:
    from anysr.engine.checkpoint import load_model_weights

    with pytest.raises(OptionError) as exc:  # it trained with a random, frozen StyleGAN2 decoder
        load_model_weights(_gfpgan("network_g.decoder_load_path=null"), fresh=True)
    _one_line(exc, "network_g.decoder_load_path: fix_decoder keeps GFPGAN's StyleGAN2 decoder frozen",
              "path.pretrain_network_g", "network_g.fix_decoder: false")
    need = next(n for n in _gfpgan("network_g.decoder_load_path=null").weight_needs()
                if n.option == "network_g.decoder_load_path")
    assert need.fresh_only  # a resumed run has the decoder in its state
    for over in (["network_g.fix_decoder=false"], ["path.pretrain_network_g=GFPGANv1.pth"]):
        needs = _gfpgan("network_g.decoder_load_path=null", *over).weight_needs()
        assert not [n for n in needs if n.option == "network_g.decoder_load_path"], over


# ----------------------------------------------------------------------------- HiFaceGAN's smallest crop
@pytest.mark.parametrize(("gt_size", "refused"), [(32, True), (24, True), (33, False), (64, False)])
def test_hifacegan_crop_too_small_is_named_before_training(gt_size: int, refused: bool) -> None:
    over = ["accelerator=cpu", "num_gpu=1", "train.precision=fp32", "train.channels_last=false", "network_g.num_feat=8",
            "train.perceptual_opt=null", "train.pixel_opt={type: L1Loss, loss_weight: 1.0}",
            f"datasets.train.gt_size={gt_size}"]
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    model = build_model(load_options(ROOT / "tests" / "fixtures" / "basicsr_options" / "train_hifacegan.yml", over,
                                     is_train=True, check_paths=False), acc)
    if not refused:  # padded to a multiple of 32 in the forward: 33 pixels train as 64
        model.setup()
        return
    with pytest.raises(OptionError) as exc:  # the first step's forward raised a ValueError: a traceback
        model.setup()
    _one_line(exc, "datasets.train.gt_size: HiFaceGAN trains on input crops of at least 64x64", "raise gt_size")


# ----------------------------------------------------------------------------- a discriminator of another size
@pytest.mark.parametrize("file", ["stylegan2", "gfpgan"])
def test_discriminator_of_another_size_is_named(file: str) -> None:
    common = ["accelerator=cpu", "num_gpu=1", "train.precision=fp32", "train.channels_last=false",
              "network_g.out_size=64", "network_g.num_style_feat=32", "network_d.out_size=128"]
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    if file == "stylegan2":
        path, over = (ROOT / "tests" / "fixtures" / "basicsr_options" / "train_StyleGAN2_256_Cmul2_FFHQ.yml",
                      ["network_g.narrow=0.0625", "network_d.narrow=0.0625"])
    else:
        path, over = GFPGAN_FILE, ["network_g.narrow=0.125", "network_g.num_mlp=2", "network_d.narrow=0.125",
                                   "datasets.train.out_size=64"]
    opt = load_options(path, [*common, *over], is_train=True, check_paths=False)
    with pytest.raises(OptionError) as exc:  # a ValueError traceback from the discriminator at the first step
        build_model(opt, acc)
    _one_line(exc, "network_d.out_size: 128", "64x64 (network_g.out_size)", "set network_d.out_size: 64")


# ----------------------------------------------------------------------------- RestoreFormer's frozen codebook
@pytest.mark.parametrize(("over", "refused"), [(["network_g.n_embed=32"], True), ([], False),
                                               (["network_g.n_embed=32", "network_g.fix_codebook=false"], False)])
def test_stage_two_refuses_a_dictionary_that_leaves_the_frozen_codebook_random(tmp_path: Path, over: list[str],
                                                                                refused: bool) -> None:
    from anysr.engine.checkpoint import load_model_weights

    torch.manual_seed(0)
    hq = tmp_path / "hq.ckpt"  # the HQ dictionary, as the authors' Lightning checkpoint
    torch.save({"state_dict": {f"vqvae.{k}": v for k, v in build_network({"type": "VQVAEGAN", **TINY_VQ})
                               .state_dict().items()}}, hq)
    common = ["accelerator=cpu", "num_gpu=1", "train.precision=fp32", "train.channels_last=false",
              "network_d.num_feat=8", "train.perceptual_weight=0", "train.identity_weight=0", "network_identity=null",
              f"path.pretrain_network_g={hq}", *(f"network_g.{k}={json.dumps(v)}" for k, v in TINY_VQ.items())]
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    model = build_model(load_options(RF_FILES / "train_RestoreFormer.yml", [*common, *over], is_train=True,
                                     check_paths=False), acc)
    if not refused:
        load_model_weights(model, fresh=True)
        return
    with pytest.raises(OptionError) as exc:  # a warning, then training with a random codebook that never learns
        load_model_weights(model, fresh=True)
    _one_line(exc, "path.pretrain_network_g", "(32, 32)", "the file: (16, 32)", "fix_codebook keeps it frozen",
              "network_g.n_embed / embed_dim")


def test_stage_two_without_a_dictionary_says_the_frozen_codebook_is_random() -> None:
    """A fresh stage-2 run with fix_codebook and no path.pretrain_network_g trains (the suite's small runs do), and
    its start-up lines say that the codebook stays random."""
    from anysr.engine.checkpoint import load_model_weights

    common = ["accelerator=cpu", "num_gpu=1", "train.precision=fp32", "train.channels_last=false",
              "network_d.num_feat=8", "train.perceptual_weight=0", "train.identity_weight=0", "network_identity=null",
              "path.pretrain_network_g=null", *(f"network_g.{k}={json.dumps(v)}" for k, v in TINY_VQ.items())]
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    model = build_model(load_options(RF_FILES / "train_RestoreFormer.yml", common, is_train=True,
                                     check_paths=False), acc)
    said = " ".join(load_model_weights(model, fresh=True))
    assert "codebook starts random and stays frozen" in said and "network_g.fix_codebook" in said

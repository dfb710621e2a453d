"""StyleGAN2Model and FFHQDataset: BasicSR 1.4.2's unconditional StyleGAN2 training.

The regularisers equal BasicSR's own functions on fixtures (``tools/fixtures/make_stylegan2_model_fixtures.py``);
BasicSR's StyleGAN2 option file (``tests/fixtures/basicsr_options``, as released) validates and trains through the
command line (a narrow network on 64-pixel images), on 2 gloo ranks too; a run stopped and resumed ends with the
same weights, EMA and path-length mean as one that ran straight through.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import DATASETS, ROOT, run_cli, tiny_train_options, write_options
from safetensors.torch import load_file

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.data.ffhq_dataset import FFHQDataset
from anysr.data.transforms import image_grid
from anysr.errors import OptionError
from anysr.losses import path_length_penalty, r1_penalty
from anysr.models.stylegan2 import BASICSR_EMA_DECAY, StyleGAN2Model, _lazy_regularised
from anysr.options import load_options

BASICSR_FILE = ROOT / "tests" / "fixtures" / "basicsr_options" / "train_StyleGAN2_256_Cmul2_FFHQ.yml"
FIXTURE = ROOT / "tests" / "fixtures" / "stylegan2_model" / "regularisers.safetensors"
# BasicSR's file with a narrow network at 64 pixels (everything else as released)
SMALL = ["network_g.out_size=64", "network_d.out_size=64", "network_g.narrow=0.0625", "network_d.narrow=0.0625",
         "network_g.num_style_feat=32", "accelerator=cpu", "datasets.train.io_backend.type=disk",
         "datasets.train.num_worker_per_gpu=0", "logger.use_tb_logger=false", "train.precision=fp32",
         "train.channels_last=false"]


@pytest.fixture(scope="module")
def faces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six real images as 64x64 squares (FFHQ-style: whole images of one size, numbered names)."""
    out = tmp_path_factory.mktemp("ffhq64")
    for i, p in enumerate(sorted((DATASETS / "Set14" / "HR").glob("*.png"))[:6]):
        img = cv2.imread(str(p))
        s = min(img.shape[:2])
        cv2.imwrite(str(out / f"{i:08d}.png"), cv2.resize(img[:s, :s], (64, 64), interpolation=cv2.INTER_AREA))
    return out


def _over(tmp: Path, faces: Path, *extra: str) -> list[str]:
    return [f"path.root={tmp}", f"datasets.train.dataroot_gt={faces}", *SMALL, *extra]


# ----------------------------------------------------------------------------- the regularisers

def test_path_length_penalty_equals_basicsr() -> None:
    f = load_file(str(FIXTURE))
    lat = f["latents"].clone().requires_grad_(True)
    fake = torch.tanh(lat.reshape(3, -1) @ f["weight"]).reshape(3, 3, 4, 5)
    penalty, lengths, mean = path_length_penalty(fake, lat, f["mean_in"], f["noise"])
    penalty.backward()
    torch.testing.assert_close(penalty, f["penalty"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(lengths, f["lengths"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(mean, f["mean_out"], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(lat.grad, f["latents_grad"], rtol=1e-4, atol=1e-7)


def test_r1_penalty_equals_basicsr() -> None:
    f = load_file(str(FIXTURE))
    conv = torch.nn.Conv2d(3, 1, 3)
    with torch.no_grad():
        conv.weight.copy_(f["conv_weight"])
        conv.bias.copy_(f["conv_bias"])
    real = f["real"].clone().requires_grad_(True)
    torch.testing.assert_close(r1_penalty(conv(real).mean((1, 2, 3)), real), f["r1"], rtol=1e-5, atol=1e-7)


def test_lazy_regularisation_scales_lr_and_betas_as_stylegan2() -> None:
    adam = _lazy_regularised({"type": "Adam", "lr": 2e-3}, 4, "train.optim_g")
    assert adam["lr"] == pytest.approx(2e-3 * 4 / 5) and adam["betas"] == [0.0, pytest.approx(0.99 ** 0.8)]
    given = _lazy_regularised({"type": "AdamW", "lr": 1e-3, "betas": [0.5, 0.9]}, 16, "train.optim_d")
    assert given["betas"] == [pytest.approx(0.5 ** (16 / 17)), pytest.approx(0.9 ** (16 / 17))]
    sgd = _lazy_regularised({"type": "SGD", "lr": 1e-2, "momentum": 0.9}, 4, "train.optim_g")
    assert "betas" not in sgd and sgd["momentum"] == 0.9
    assert BASICSR_EMA_DECAY == pytest.approx(0.5 ** (32 / 10000))


def test_mixing_layer_as_a_tensor_equals_the_sliced_mix() -> None:
    from anysr.archs.stylegan2_arch import mix_latents  # noqa: PLC0415

    a, b = torch.randn(2, 5), torch.randn(2, 5)
    for k in range(1, 8):
        torch.testing.assert_close(mix_latents([a, b], 8, torch.tensor(k)), mix_latents([a, b], 8, k), rtol=0, atol=0)
    torch.testing.assert_close(mix_latents([a, b], 8, torch.tensor(8)), mix_latents([a], 8, None), rtol=0, atol=0)


# ----------------------------------------------------------------------------- the dataset

def _dataset(root: Path, **extra: object) -> FFHQDataset:
    opt = {"name": "ffhq", "phase": "train", "type": "FFHQDataset", "dataroot_gt": str(root), "color": None,
           "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "io_backend": {"type": "disk"}, "meta_info_file": None,
           "use_hflip": True, **extra}
    return FFHQDataset(opt, "datasets.train")


def test_ffhq_dataset_normalises_and_flips_by_the_sample_seed(faces: Path) -> None:
    ds = _dataset(faces)
    assert len(ds) == 6 and not ds.check(decode=True, progress=False)
    img = cv2.imread(str(faces / "00000002.png"))[:, :, ::-1].astype(np.float32) / 255
    plain = torch.from_numpy(img.transpose(2, 0, 1).copy()) * 2 - 1
    seen = set()
    for seed in range(8):
        gt = ds[(2, seed)]["gt"]
        assert torch.equal(gt, ds[(2, seed)]["gt"])  # the seed decides
        flipped = torch.allclose(gt, plain.flip(-1), atol=1e-6)
        assert flipped or torch.allclose(gt, plain, atol=1e-6)
        seen.add(flipped)
    assert seen == {True, False}


def test_ffhq_dataset_refuses_images_of_two_sizes(tmp_path: Path, faces: Path) -> None:
    for p in faces.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    cv2.imwrite(str(tmp_path / "00000009.png"), np.zeros((48, 64, 3), np.uint8))
    problems = _dataset(tmp_path).check(decode=False, progress=False)
    assert any(re.search(r"FFHQDataset needs images of one size .* is 64x64 but .*00000009\.png is 64x48", p)
               for p in problems), problems


def test_image_grid_is_make_grids_layout() -> None:
    imgs = torch.arange(5 * 3 * 2 * 2, dtype=torch.float32).reshape(5, 3, 2, 2)
    grid = image_grid(imgs)
    assert grid.shape == (3, 2 * 4 + 2, 3 * 4 + 2)
    torch.testing.assert_close(grid[:, 2:4, 6:8], imgs[1])
    torch.testing.assert_close(grid[:, 6:8, 2:4], imgs[3])
    assert grid[:, 6:8, 10:12].abs().sum() == 0  # the empty sixth cell


# ----------------------------------------------------------------------------- the model

def _model(tmp: Path, faces: Path, *extra: str) -> StyleGAN2Model:
    opt = load_options(BASICSR_FILE, _over(tmp, faces, "num_gpu=1", *extra), is_train=True)
    return StyleGAN2Model(opt, create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False)))


def test_basicsr_file_validates_as_released(tmp_path: Path, faces: Path) -> None:
    opt = load_options(BASICSR_FILE, [f"path.root={tmp_path}", f"datasets.train.dataroot_gt={faces}",
                                      "datasets.train.io_backend.type=disk", "num_gpu=1", "accelerator=cpu"],
                       is_train=True)
    assert opt["model_type"] == "StyleGAN2Model" and opt["scale"] == 1  # no scale in the file: 1 for a generator
    train = opt["train"]
    assert (train["r1_reg_weight"], train["path_reg_weight"], train["path_batch_shrink"], train["net_g_reg_every"],
            train["net_d_reg_every"], train["mixing_prob"]) == (10, 2, 2, 4, 16, 0.9)


def test_codes_are_counter_based(tmp_path: Path, faces: Path) -> None:
    model = _model(tmp_path, faces)
    model.update_learning_rate(5)
    a, b = model.codes(3, 1), model.codes(3, 1)
    assert all(torch.equal(x, y) for x, y in zip(a["styles"] + a["noise"], b["styles"] + b["noise"], strict=True))
    model.update_learning_rate(6)
    c = model.codes(3, 1)
    assert not torch.equal(a["noise"][0], c["noise"][0])
    assert [n.shape[-1] for n in a["noise"]] == [4, 8, 8, 16, 16, 32, 32, 64, 64]
    draws = [model.codes(2, 2, k) for k in range(40)]
    mixed = [d["mixed"] for d in draws]
    assert 0.7 < sum(mixed) / 40 <= 1.0  # mixing_prob 0.9
    assert all((int(d["inject_index"]) < model.num_latent) == d["mixed"] for d in draws)


def test_model_refuses_other_generators_and_other_image_sizes(tmp_path: Path, faces: Path) -> None:
    for extra, said in (
            (["network_g={type: EDSR, num_in_ch: 3, num_out_ch: 3, num_feat: 8, num_block: 1, upscale: 1}"],
             "network_g.type: StyleGAN2Model trains a StyleGAN2 generator (StyleGAN2Generator, "
             "StyleGAN2GeneratorClean), got EDSR"),
            (["network_g.out_size=32", "network_d.out_size=32"],
             "the training images are 64x64 but network_g.out_size is 32")):
        proc = run_cli("train", "-opt", str(BASICSR_FILE), "--force_yml",
                       *_over(tmp_path, faces, "num_gpu=1", "train.total_iter=1", *extra), cwd=tmp_path, check=False)
        assert proc.returncode != 0
        out = proc.stdout + proc.stderr
        assert said in out and "Traceback" not in out, out[-2000:]


@pytest.mark.slow
def test_basicsr_file_trains_with_samples_and_resumes_exactly(tmp_path: Path, faces: Path) -> None:
    """8 iterations straight through vs 4, stop, resume to 8: the same generator, EMA, discriminator and path
    length mean, bit for bit (R1 at 16 is not reached; path length at 4 and 8; style mixing throughout)."""
    common = ["num_gpu=1", "logger.print_freq=1", "val.val_freq=4", "logger.save_checkpoint_freq=4",
              "train.net_d_reg_every=4"]
    run_cli("train", "-opt", str(BASICSR_FILE), "--force_yml", *_over(tmp_path / "a", faces, *common,
                                                                          "train.total_iter=8"), cwd=tmp_path)
    run_cli("train", "-opt", str(BASICSR_FILE), "--force_yml", *_over(tmp_path / "b", faces, *common,
                                                                          "train.total_iter=4"), cwd=tmp_path)
    run_cli("train", "-opt", str(BASICSR_FILE), "--force_yml", *_over(tmp_path / "b", faces, *common,
                                                                          "train.total_iter=8"), "--auto_resume",
            cwd=tmp_path)
    name = "501_StyleGAN2_256_Cmul2_FFHQ_800k_B24G8_scratch"
    exp_a, exp_b = tmp_path / "a" / "experiments" / name, tmp_path / "b" / "experiments" / name
    log = "\n".join(p.read_text() for p in (exp_a / "log").glob("train_*.log"))
    for key in ("l_d", "real_score", "fake_score", "l_d_r1", "l_g", "l_g_path", "path_length"):
        assert re.search(rf" {key}: [-+0-9.e]+", log), f"{key} not logged"
    assert re.search(r" l_d_r1: [1-9]", log) or re.search(r" l_d_r1: [0-9.]+e-", log)
    assert (exp_a / "visualization" / "samples" / "samples_8.png").is_file()
    grid = cv2.imread(str(exp_a / "visualization" / "samples" / "samples_8.png"))
    assert grid.shape == (4 * 66 + 2, 4 * 66 + 2, 3)  # 16 samples of 64 pixels, 2-pixel gaps
    a, b = load_file(str(exp_a / "models" / "net_g_8.safetensors")), load_file(str(exp_b / "models" /
                                                                                     "net_g_8.safetensors"))
    assert {k.split(".")[0] for k in a} == {"params", "params_ema"}
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ"
    sa = torch.load(exp_a / "training_states" / "8.state", weights_only=True)
    sb = torch.load(exp_b / "training_states" / "8.state", weights_only=True)
    ma, mb = sa["model"], sb["model"]
    assert torch.equal(ma["mean_path_length"], mb["mean_path_length"]) and ma["mean_path_length"] > 0
    assert all(torch.equal(ma["nets"]["net_d"][k], mb["nets"]["net_d"][k]) for k in ma["nets"]["net_d"])
    assert json.loads((exp_b / "summary.json").read_text())["iterations_done"] == 8


@pytest.mark.slow
def test_basicsr_file_trains_on_two_gloo_ranks(tmp_path: Path, faces: Path) -> None:
    """R1 and the path length penalty (double backward) under DDP, both on the last iteration."""
    run_cli("train", "-opt", str(BASICSR_FILE), "--force_yml",
            *_over(tmp_path, faces, "num_gpu=2", "train.total_iter=4", "train.net_d_reg_every=4",
                   "datasets.train.batch_size_per_gpu=2", "logger.print_freq=4", "val.val_freq=4"), cwd=tmp_path,
            timeout=600)
    exp = tmp_path / "experiments" / "501_StyleGAN2_256_Cmul2_FFHQ_800k_B24G8_scratch"
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["accelerator"]["world_size"] == 2 and summary["iterations_done"] == 4
    losses = summary["final_losses"]
    assert losses["l_d_r1"] > 0 and losses["l_g_path"] > 0 and all(np.isfinite(v) for v in losses.values())


def test_ffhq_dataset_with_a_pair_model_is_refused_in_one_line(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("sg", small_train_dir, None, total_iter=1)
    opt["datasets"]["train"]["type"] = "FFHQDataset"
    path = write_options(tmp_path / "o.yml", opt)
    with pytest.raises(OptionError, match=r"datasets\.train\.type: FFHQDataset gives images alone \(no LQ\) for "
                                          r"generative models \(StyleGAN2Model\); model_type SRModel trains on pairs"):
        load_options(path, [f"path.root={tmp_path}"], is_train=True)


@pytest.mark.xla
def test_xla_trains_without_cpu_fallbacks_and_stops_compiling(tmp_path: Path, faces: Path) -> None:
    """BasicSR's file on one XLA:CPU device (a narrow 32-pixel network, both regularisers every 3 iterations):
    no op falls back to the CPU, and the last 3 iterations (every step kind seen before, mixing or not) add at most
    one graph (the validation's samples)."""
    small = tmp_path / "ffhq32"
    small.mkdir()
    for p in faces.iterdir():
        cv2.imwrite(str(small / p.name), cv2.resize(cv2.imread(str(p)), (32, 32), interpolation=cv2.INTER_AREA))
    over = [f"path.root={tmp_path}", f"datasets.train.dataroot_gt={small}", "datasets.train.io_backend.type=disk",
            "num_gpu=1", "accelerator=xla", "network_g.out_size=32", "network_d.out_size=32",
            "network_g.narrow=0.03125", "network_d.narrow=0.03125", "network_g.num_style_feat=16",
            "network_g.num_mlp=2", "train.total_iter=9", "val.val_freq=9", "logger.print_freq=3",
            "logger.save_checkpoint_freq=9", "datasets.train.num_worker_per_gpu=0", "logger.use_tb_logger=false",
            "train.net_d_reg_every=3", "train.net_g_reg_every=3", "datasets.train.batch_size_per_gpu=2"]
    run_cli("train", "-opt", str(BASICSR_FILE), "--force_yml", *over, cwd=tmp_path, env={"PJRT_DEVICE": "CPU"},
            timeout=600)
    exp = tmp_path / "experiments" / "501_StyleGAN2_256_Cmul2_FFHQ_800k_B24G8_scratch"
    log = "\n".join(p.read_text() for p in (exp / "log").glob("train_*.log"))
    stats = re.findall(r"xla stats: \{'compiles': (\d+),.*'cpu_fallbacks': (\{[^}]*\})", log)
    assert len(stats) == 3, log[-3000:]
    assert all(fallbacks == "{}" for _, fallbacks in stats), stats
    compiles = [int(c) for c, _ in stats]
    assert compiles[2] - compiles[1] <= 1, compiles
    assert (exp / "visualization" / "samples" / "samples_9.png").is_file()

"""Real-ESRGAN training: datasets, options, the synthesis, the pair pool and the models' step (in process, CPU).

End-to-end runs (resume after kill -9, 2 gloo ranks, ``anysr prepare degrade``) are in test_realesrgan_train.py;
XLA in test_xla_realesrgan.py. The operators themselves are checked against BasicSR in test_degradations.py.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from conftest import DATASETS
from realesrgan_reference import SecondOrderDraw, StageDraw, apply_second_order

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.data import build_dataset, collate
from anysr.data.degradation.realesrgan import (
    BatchChoices,
    DegradeStage,
    LoaderSynthesis,
    SynthesisSettings,
    degrade,
    draw_batch_choices,
    draw_samples,
    step_rng,
    synthesise,
)
from anysr.data.pair_pool import TrainingPairPool, dequantise, quantise
from anysr.engine import checkpoint as ckpt
from anysr.errors import CheckpointError, OptionError
from anysr.models import build_model
from anysr.ops.degradation import USMSharp
from anysr.ops.diffjpeg import DiffJPEG
from anysr.options import load_options

KERNELS = ("kernel1", "kernel2", "sinc_kernel")


def real_options(name: str, train_dir: Path, *, model: str = "RealESRNetModel", crop: int = 96, gt_size: int = 32,
                 batch: int = 2, queue: int = 4, total_iter: int = 6, **top: Any) -> dict[str, Any]:
    """A tiny Real-ESRGAN configuration: SRVGGNetCompact x4 with 8 features, 96-pixel degraded crops."""
    opt: dict[str, Any] = {
        "name": name, "model_type": model, "scale": 4, "accelerator": "cpu", "num_gpu": 1, "manual_seed": 5,
        "gt_size": gt_size, "queue_size": queue,
        "datasets": {"train": {"name": "t91", "type": "RealESRGANDataset", "dataroot_gt": str(train_dir),
                               "io_backend": {"type": "disk"}, "crop_pad_size": crop, "use_hflip": True,
                               "use_rot": True, "num_worker_per_gpu": 0, "batch_size_per_gpu": batch,
                               "dataset_enlarge_ratio": 2}},
        "network_g": {"type": "SRVGGNetCompact", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_conv": 2,
                      "upscale": 4, "act_type": "prelu"},
        "path": {"pretrain_network_g": None},
        "train": {"precision": "fp32", "channels_last": False, "ema_decay": 0.9,
                  "optim_g": {"type": "Adam", "lr": 1e-3, "betas": [0.9, 0.99]}, "total_iter": total_iter,
                  "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0, "reduction": "mean"}},
        "logger": {"print_freq": 2, "save_checkpoint_freq": 2, "use_tb_logger": False},
    }
    if model == "RealESRGANModel":
        opt["network_d"] = {"type": "UNetDiscriminatorSN", "num_in_ch": 3, "num_feat": 4, "skip_connection": True}
        opt["train"]["optim_d"] = {"type": "Adam", "lr": 1e-3, "betas": [0.9, 0.99]}
        opt["train"]["gan_opt"] = {"type": "GANLoss", "gan_type": "vanilla", "loss_weight": 0.1}
    opt.update(top)
    return opt


def load(opt: dict[str, Any], tmp: Path, *over: str, is_train: bool = True) -> Any:
    path = tmp / f"{opt['name']}.yml"
    path.write_text(yaml.safe_dump(opt, sort_keys=False))
    return load_options(path, [f"path.root={tmp}", *over], is_train=is_train)


def problems(opt: dict[str, Any], tmp: Path, *over: str) -> str:
    with pytest.raises(OptionError) as info:
        load(opt, tmp, *over)
    return str(info.value)


@pytest.fixture(scope="module")
def t91(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six T91 images (all smaller than 400, some larger than 64 on both sides) and one gray image."""
    out = tmp_path_factory.mktemp("t91")
    for p in sorted((DATASETS / "T91" / "HR").glob("*.png"))[:6]:
        shutil.copy(p, out / p.name)
    import cv2

    gray = cv2.imread(str(out / sorted(x.name for x in out.iterdir())[0]), cv2.IMREAD_GRAYSCALE)
    cv2.imwrite(str(out / "zz_gray.png"), gray)
    return out


@pytest.fixture(scope="module")
def cpu() -> Any:
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    return acc


# ------------------------------------------------------------------------------------------------- options
def test_option_defaults_and_files(tmp_path: Path, t91: Path) -> None:
    opt = load(real_options("d", t91), tmp_path)
    assert list(opt.resize_prob) == [0.2, 0.7, 0.1] and opt.queue_size == 4 and opt.degrade_in == "auto"
    assert opt.high_order_degradation is True and opt.gt_usm is True and opt.gan_gt_usm is False
    ds = opt.datasets.train
    assert ds.kernel_prob == [0.45, 0.25, 0.12, 0.03, 0.12, 0.03] and ds.final_sinc_prob == 0.8
    assert ds.gt_size == 32 and ds.crop_pad_size == 96  # the dataset's gt_size follows the top-level one
    # BasicSR's key meta_info is accepted; blur_kernel_size is read and ignored as BasicSR does
    meta = tmp_path / "meta.txt"
    meta.write_text("".join(f"{p.name} (1,1,3)\n" for p in sorted(t91.iterdir())[:2]))
    raw = real_options("m", t91)
    raw["datasets"]["train"].update(meta_info=str(meta), blur_kernel_size=21)
    opt = load(raw, tmp_path)
    assert opt.datasets.train.meta_info_file == str(meta) and "blur_kernel_size" not in opt.datasets.train
    assert len(build_dataset(opt.datasets.train, "datasets.train")) == 2
    # other models carry none of these values
    plain = load_options(DATASETS.parent / "options" / "train" / "quickstart_EDSR_x2.yml",
                         [f"path.root={DATASETS.parent}"], is_train=True)
    assert plain.resize_prob is None and plain.queue_size is None


def test_shipped_real_esrgan_files_pair_what_they_say(t91: Path) -> None:
    """The example trains RealESRNet from scratch; the fine-tune's published weights load strictly into its net;
    x2plus is RRDBNet at scale 2; the paired fine-tune reads pairs without synthesis."""
    from anysr.archs import build_network
    from anysr.engine.checkpoint.weights import load_weights

    root = DATASETS.parent
    files = root / "options" / "train"

    def opt(name: str, *over: str) -> Any:
        return load_options(files / name, [f"path.root={root}", *over], is_train=True)

    ex = opt("example_RealESRNet_T91_x4.yml")
    assert ex.model_type == "RealESRNetModel" and ex.gt_usm is True and ex.train.total_iter == 300
    assert ex.queue_size % ex.datasets.train.batch_size_per_gpu == 0 and ex.datasets.train.crop_pad_size >= ex.gt_size
    ft = opt("train_finetune_realesr-animevideov3_x4.yml", f"datasets.train.dataroot_gt={t91}",
             "train.perceptual_opt.vgg_weights_path=null")
    assert ft.model_type == "RealESRGANModel" and ft.path.param_key_g == "params"
    net = build_network(ft.network_g)
    sd, _ = load_weights(root / ft.path.pretrain_network_g, ft.path.param_key_g)
    net.load_state_dict(sd, strict=True)
    x2 = opt("train_RealESRGAN_x2plus.yml", f"datasets.train.dataroot_gt={t91}", "datasets.train.meta_info_file=null",
             "train.perceptual_opt.vgg_weights_path=null")
    assert x2.scale == 2 and x2.network_g.scale == 2 and x2.high_order_degradation is True
    paired = opt("finetune_RealESRGAN_x4plus_pairdata.yml", f"datasets.train.dataroot_gt={t91}",
                 f"datasets.train.dataroot_lq={t91}", "datasets.train.meta_info_file=null",
                 "train.perceptual_opt.vgg_weights_path=null")
    assert paired.high_order_degradation is False and paired.datasets.train.type == "RealESRGANPairedDataset"


def test_input_channels_of_an_unshuffling_rrdbnet() -> None:
    """x2plus's RRDBNet reads 3-channel images (its first convolution sees 12): calibration and inference probe
    it with 3 channels."""
    from anysr.archs import build_network
    from anysr.archs.arch_util import input_channels

    for scale in (1, 2, 4):
        net = build_network({"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "scale": scale, "num_feat": 4,
                             "num_block": 1, "num_grow_ch": 4})
        assert input_channels(net) == 3
        assert net(torch.rand(1, 3, 8, 8)).shape[-1] == 8 * scale


def test_option_errors(tmp_path: Path, t91: Path) -> None:
    opt = real_options("e", t91, queue_size=5, jpeg_range=[30, 100], resize_range=[1.2, 1.5])
    opt["datasets"]["train"].update(kernel_list=["iso", "gauss"], kernel_prob2=[1.0, 2.0], crop_pad_size=30)
    text = problems(opt, tmp_path)
    for want in ("queue_size: 5 is not a multiple of batch_size_per_gpu (2)",
                 "jpeg_range: must be a range [low, high] with low <= high, low > 0, high < 100, got [30.0, 100.0]",
                 "resize_range: must be a range", "low <= 1 <= high",
                 "datasets.train.kernel_list: unknown kernel kind(s) ['gauss']",
                 "datasets.train.kernel_prob2: has 2 weights for the 6 kinds of kernel_list2",
                 "gt_size: 32 is larger than datasets.train.crop_pad_size (30)"):
        assert want in text, want
    opt = real_options("e2", t91, gt_size=32)
    opt["datasets"]["train"].update(gt_size=48, crop_pad_size=90)
    text = problems(opt, tmp_path)
    assert "gt_size: 32 differs from datasets.train.gt_size (48)" in text
    assert "datasets.train.crop_pad_size: 90 is not a multiple of scale (4); use e.g. 88" in text
    # gt_size is checked once, with the same message, under either key
    top_only = problems(real_options("e5", t91, gt_size=30), tmp_path)
    assert "\n  gt_size: 30 is not a multiple of scale (4); use e.g. 28" in top_only
    both = real_options("e6", t91, gt_size=30)
    both["datasets"]["train"]["gt_size"] = 30
    assert problems(both, tmp_path).count("is not a multiple of scale (4)") == 1
    small = real_options("e3", t91, crop=68)
    assert "crop_pad_size: 68 is too small for the degradation: the first resize can shrink it to 10 pixels" \
        in problems(small, tmp_path)
    # the dataset and the model go together
    wrong_model = real_options("e4", t91)
    wrong_model["model_type"] = "SRModel"
    assert "datasets.train.type: RealESRGANDataset gives GT images and blur kernels, no LQ images; train it with " \
           "model_type RealESRNetModel or RealESRGANModel" in problems(wrong_model, tmp_path)
    wrong_data = real_options("e5", t91)
    wrong_data["datasets"]["train"] = {"name": "p", "type": "PairedImageDataset", "dataroot_gt": str(t91),
                                       "lq_from_gt": True, "gt_size": 32, "batch_size_per_gpu": 2}
    assert "datasets.train.type: RealESRNetModel synthesises its LQ from RealESRGANDataset" \
        in problems(wrong_data, tmp_path)
    load(wrong_data, tmp_path, "high_order_degradation=false")  # the paired fine-tuning: fine
    assert "high_order_degradation: false trains on the dataset's LQ/GT pairs, and RealESRGANDataset has none" \
        in problems(real_options("e6", t91), tmp_path, "high_order_degradation=false")
    val = real_options("e7", t91)
    val["datasets"]["val"] = {"name": "v", "type": "RealESRGANDataset", "dataroot_gt": str(t91)}
    assert "datasets.val.type: RealESRGANDataset is a training set" in problems(val, tmp_path)
    lq = real_options("e8", t91)
    lq["datasets"]["train"].update(dataroot_lq=str(t91), mean=[0.5] * 3, std=[0.5] * 3)
    text = problems(lq, tmp_path)
    assert "datasets.train.dataroot_lq: RealESRGANDataset makes the LQ from the GT" in text
    assert "datasets.train.mean: is not supported by RealESRGANDataset" in text


# ------------------------------------------------------------------------------------------------ datasets
def test_dataset_items_depend_on_the_seed_only(tmp_path: Path, t91: Path) -> None:
    opt = load(real_options("ds", t91, crop=128), tmp_path)
    ds = build_dataset(opt.datasets.train, "datasets.train")
    assert len(ds) == 7
    a, b, c = ds[(2, 99)], ds[(2, 99)], ds[(2, 100)]
    assert set(a) == {"gt", *KERNELS, "gt_path", "seed", "bits"} and a["seed"] == 99
    assert a["gt"].shape == (3, 128, 128) and a["gt"].dtype == torch.float32
    for k in ("gt", *KERNELS):
        assert torch.equal(a[k], b[k]), k
    assert not all(torch.equal(a[k], c[k]) for k in ("gt", *KERNELS))
    for k in KERNELS:
        assert a[k].shape == (21, 21) and abs(float(a[k].sum()) - 1) < 1e-5
    # exactly 8-bit levels (what lets the pool store uint8), and a gray file becomes 3 equal channels
    assert torch.equal(dequantise(quantise(a["gt"])), a["gt"])
    g = ds[(6, 1)]["gt"]
    assert torch.equal(g[0], g[1]) and torch.equal(g[1], g[2])
    # a T91 image (at most ~300 pixels) is reflect-padded: its top-left corner is the image's own corner
    big = load(real_options("big", t91, crop=400, gt_size=256), tmp_path)
    item = build_dataset(big.datasets.train, "datasets.train")[(0, 3)]
    assert item["gt"].shape == (3, 400, 400)
    assert ds.kernel_params(99)["kernel1"].kind in ("iso", "aniso", "generalized_iso", "generalized_aniso",
                                                    "plateau_iso", "plateau_aniso", "sinc")


def test_dataset_lmdb_equals_folder(tmp_path: Path, t91: Path) -> None:
    pytest.importorskip("lmdb")
    from anysr.engine.prepare.command import make_lmdb

    db = make_lmdb(t91, tmp_path / "t91.lmdb")
    disk = build_dataset(load(real_options("disk", t91), tmp_path).datasets.train, "datasets.train")
    raw = real_options("lmdb", t91)
    raw["datasets"]["train"].update(dataroot_gt=str(db), io_backend={"type": "lmdb"})
    lm = build_dataset(load(raw, tmp_path).datasets.train, "datasets.train")
    assert len(lm) == len(disk)
    for i in range(len(lm)):
        a, b = lm[(i, 7 + i)], disk[(i, 7 + i)]
        assert all(torch.equal(a[k], b[k]) for k in ("gt", *KERNELS))


def test_paired_dataset_reads_real_esrgan_meta_info(tmp_path: Path, t91: Path) -> None:
    from anysr.engine.prepare.command import prepare_lr

    gt_dir, lq_dir = tmp_path / "gt", tmp_path / "lq"
    gt_dir.mkdir()
    names = sorted(p.name for p in t91.iterdir() if p.name != "zz_gray.png")[:3]
    for n in names:
        shutil.copy(t91 / n, gt_dir / n)
    prepare_lr(gt_dir, lq_dir, 4, progress=False)
    meta = tmp_path / "pairs.txt"
    meta.write_text("".join(f"{n}, {n}\n" for n in names[:2]))
    opt = real_options("pair", t91, model="RealESRGANModel", high_order_degradation=False)
    opt["datasets"]["train"] = {"name": "pairs", "type": "RealESRGANPairedDataset", "dataroot_gt": str(gt_dir),
                                "dataroot_lq": str(lq_dir), "meta_info": str(meta), "gt_size": 32,
                                "batch_size_per_gpu": 2, "use_hflip": True}
    ds = build_dataset(load(opt, tmp_path).datasets.train, "datasets.train")
    assert len(ds) == 2
    item = ds[(1, 5)]
    assert item["gt"].shape == (3, 32, 32) and item["lq"].shape == (3, 8, 8)
    meta.write_text(f"{names[0]}, {names[0]}, extra\n")
    with pytest.raises(Exception, match=r"line 1 of .* expected '<gt path>, <lq path>'"):
        build_dataset(load(opt, tmp_path).datasets.train, "datasets.train")


# ----------------------------------------------------------------------------------------------- synthesis
def _settings(**kw: Any) -> SynthesisSettings:
    model = dict(resize_prob=(0.2, 0.7, 0.1), resize_range=(0.15, 1.5), gaussian_noise_prob=0.5,
                 noise_range=(1, 30), poisson_scale_range=(0.05, 3), gray_noise_prob=0.4, jpeg_range=(30, 95))
    model.update(kw)
    second = dict(model, resize_prob=(0.3, 0.4, 0.3), resize_range=(0.3, 1.2))
    return SynthesisSettings(4, 32, DegradeStage(**model), DegradeStage(**second), 0.8)


def _batch(ds: Any, n: int, seed0: int = 10) -> dict[str, Any]:
    return collate([ds[(i % len(ds), seed0 + i)] for i in range(n)])


def test_degrade_equals_the_basicsr_checked_pipeline_without_noise(tmp_path: Path, t91: Path) -> None:
    """With zero noise, degrade() is the reference apply_second_order (checked against BasicSR's feed_data)
    step for step."""
    ds = build_dataset(load(real_options("z", t91, crop=96), tmp_path).datasets.train, "datasets.train")
    b = _batch(ds, 3)
    st = _settings(noise_range=(0, 0), poisson_scale_range=(0, 0))
    jpeger = DiffJPEG(differentiable=False)
    for n in range(6):
        ch = draw_batch_choices(step_rng(1, n, 0), st, (96, 96))
        draws = draw_samples(b["seed"], st)
        ours = degrade(b["gt"], *[b[k] for k in KERNELS], ch, draws, st, [torch.Generator() for _ in range(3)], jpeger)

        def stage(i: int, c: BatchChoices = ch, d: Any = draws) -> StageDraw:
            return StageDraw(getattr(c, f"updown{i}"), getattr(c, f"scale{i}"), getattr(c, f"mode{i}"),
                             getattr(c, f"gaussian{i}"), torch.zeros(3), torch.zeros(3, dtype=torch.bool),
                             torch.tensor(getattr(d, f"quality{i}"), dtype=torch.float32))

        draw = SecondOrderDraw(stage(1), stage(2), ch.second_blur, ch.sinc_first, ch.final_mode)
        ref = apply_second_order(b["gt"], *[b[k] for k in KERNELS], draw, scale=4,
                                 generator=torch.Generator().manual_seed(0), jpeger=jpeger)
        assert ours.shape == (3, 3, 24, 24) and torch.equal(ours, ref), ch


def test_synthesis_splits_over_ranks(tmp_path: Path, t91: Path) -> None:
    """A batch degraded whole equals its halves degraded apart (per-sample seeds, shared batch choices)."""
    ds = build_dataset(load(real_options("s", t91, crop=96), tmp_path).datasets.train, "datasets.train")
    b = _batch(ds, 4)
    st, usm, jpeger = _settings(), USMSharp(), DiffJPEG(differentiable=False)
    for n in range(4):
        ch = draw_batch_choices(step_rng(2, n, 0), st, (96, 96))

        def run(sl: slice, c: BatchChoices = ch) -> dict[str, Any]:
            seeds = b["seed"][sl]
            return synthesise(b["gt"][sl], [b[k][sl] for k in KERNELS], settings=st, choices=c, seeds=seeds,
                              gens=[torch.Generator() for _ in seeds], usm=usm, jpeger=jpeger, sharpen_input=True,
                              keep_sharpened=False)

        whole, lo, hi = run(slice(0, 4)), run(slice(0, 2)), run(slice(2, 4))
        assert whole["lq"].shape == (4, 3, 8, 8) and whole["gt"].shape == (4, 3, 32, 32)
        assert torch.equal(whole["gt"], torch.cat([lo["gt"], hi["gt"]]))
        # the same arithmetic on fewer images: equal up to a rare 8-bit rounding flip
        diff = (whole["lq"] - torch.cat([lo["lq"], hi["lq"]])).abs()
        assert float(diff.max()) <= 1 / 255 + 1e-7 and float((diff > 0).float().mean()) < 0.01, ch
        again = run(slice(0, 4))
        assert torch.equal(again["lq"], whole["lq"])  # generators re-seeded: nothing carries over


def test_loader_synthesis_is_a_batch_of_one(tmp_path: Path, t91: Path) -> None:
    ds = build_dataset(load(real_options("l", t91, crop=96), tmp_path).datasets.train, "datasets.train")
    st = _settings()
    synth = LoaderSynthesis(st, sharpen_input=True, keep_sharpened=False)
    plain = ds[(1, 42)]
    ds.attach_synthesis(synth)
    item = ds[(1, 42)]
    assert set(item) == {"lq", "gt", "gt_path", "seed", "bits"}
    assert item["lq"].shape == (3, 8, 8) and item["gt"].shape == (3, 32, 32)
    direct = synth(plain["gt"], [plain[k] for k in KERNELS], 42)
    assert torch.equal(direct["lq"], item["lq"]) and torch.equal(direct["gt"], item["gt"])
    # the raw GT crop is what trains (USM happens after the pool); it is a crop of the loaded image
    full = plain["gt"]
    c = direct["choices"]
    assert torch.equal(item["gt"], full[:, c.top * 4: c.top * 4 + 32, c.left * 4: c.left * 4 + 32])


# ---------------------------------------------------------------------------------------------------- pool
def _pairs(n: int, b: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [{"lq": quantise(torch.rand(b, 3, 2, 2, generator=g)).float() / 255,
             "gt": torch.rand(b, 3, 4, 4, generator=g)} for _ in range(n)]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_pool_fills_then_mixes_columns() -> None:
    pool = TrainingPairPool(6, {"lq": True, "gt": False})
    batches = _pairs(8, 2)
    outs = [pool.swap(bt, np.random.default_rng(i), offset=0, global_batch=2, to_device=lambda t: t)
            for i, bt in enumerate(batches)]
    assert pool.rows == 3 and pool.data["lq"].dtype == torch.uint8 and pool.data["gt"].dtype == torch.float32
    for i in range(3):  # filling: the batch trains as it is
        assert _same(outs[i], batches[i])
    seen = {j: [batches[i]["gt"][j] for i in range(8)] for j in range(2)}
    for out in outs[3:]:  # full: each position gets an older sample of its own column
        for j in range(2):
            assert any(torch.equal(out["gt"][j], s) for s in seen[j])
    with pytest.raises(OptionError, match="queue_size: 5 is not a multiple of the batch per device .2."):
        TrainingPairPool(5, {"lq": True}).swap({"lq": torch.zeros(2, 1)}, np.random.default_rng(0), offset=0,
                                               global_batch=2, to_device=lambda t: t)


def test_pool_splits_over_ranks_and_resumes() -> None:
    """Columns per batch position: two ranks with half the batch each keep one process's pool, exactly."""
    batches = _pairs(7, 4, seed=1)
    one = TrainingPairPool(8, {"lq": True, "gt": False})
    halves = [TrainingPairPool(4, {"lq": True, "gt": False}) for _ in range(2)]
    for i, bt in enumerate(batches[:5]):
        whole = one.swap(bt, np.random.default_rng([9, i]), offset=0, global_batch=4, to_device=lambda t: t)
        parts = [p.swap({k: v[2 * r: 2 * r + 2] for k, v in bt.items()}, np.random.default_rng([9, i]),
                        offset=2 * r, global_batch=4, to_device=lambda t: t) for r, p in enumerate(halves)]
        assert _same(whole, {k: torch.cat([parts[0][k], parts[1][k]]) for k in whole})

    def gather_of(pools: list[TrainingPairPool]) -> Any:
        return lambda _local: [p.data for p in pools]  # what all_gather_object returns on every rank

    state = halves[0].state_dict(gather_of(halves), lambda x: x)
    assert state["data"]["lq"].shape == (2, 4, 3, 2, 2) and state["filled"] == 2
    assert _same(state["data"], one.state_dict(lambda x: [x], lambda x: x)["data"])
    # resume the two-rank pool in one process (the same global batch): the same future
    resumed = TrainingPairPool(8, {"lq": True, "gt": False})
    resumed.load_state_dict(state, offset=0, batch=4)
    for i, bt in enumerate(batches[5:], 5):
        a = one.swap(bt, np.random.default_rng([9, i]), offset=0, global_batch=4, to_device=lambda t: t)
        b = resumed.swap(bt, np.random.default_rng([9, i]), offset=0, global_batch=4, to_device=lambda t: t)
        assert _same(a, b)
    with pytest.raises(CheckpointError, match="queue_size 8 per device.*queue_size is 12 now"):
        TrainingPairPool(12, {"lq": True, "gt": False}).load_state_dict(state, offset=0, batch=4)


# ---------------------------------------------------------------------------------------------------- models
def _model(opt: Any, acc: Any) -> Any:
    model = build_model(opt, acc)
    ckpt.load_model_weights(model, fresh=True, stand_ins=True)
    model.setup()
    return model


def test_realesrnet_step_pool_and_usm_flag(tmp_path: Path, t91: Path, cpu: Any) -> None:
    opt = load(real_options("n", t91, crop=96, degrade_in="step"), tmp_path)
    ds = build_dataset(opt.datasets.train, "datasets.train")
    for gt_usm in (True, False):
        model = _model(load(real_options("n", t91, crop=96, degrade_in="step", gt_usm=gt_usm), tmp_path), cpu)
        assert model.degrade_in == "step" and model.pool is not None
        model.update_learning_rate(1)
        batch = _batch(ds, 2)
        lq, gt = model.training_pair(batch, 0)
        assert lq.shape == (2, 3, 8, 8) and gt.shape == (2, 3, 32, 32)
        is_8bit = torch.equal(dequantise(quantise(gt)), gt)
        assert is_8bit is (not gt_usm)  # gt_usm: the sharpened crop trains (RealESRNet), else the raw one
        assert model.pool.data["gt"].dtype == (torch.float32 if gt_usm else torch.uint8)
    losses = model.train_step([_batch(ds, 2, 20)])
    assert set(losses) == {"l_pix"} and torch.isfinite(losses["l_pix"])
    assert model.pool.filled == 2 and "pool" in model.state_dict()


def test_realesrgan_targets_follow_the_usm_flags(tmp_path: Path, t91: Path, cpu: Any) -> None:
    opt = load(real_options("g", t91, model="RealESRGANModel", crop=96, l1_gt_usm=True, percep_gt_usm=False,
                            gan_gt_usm=False), tmp_path)
    model = _model(opt, cpu)
    gt = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    t = model.targets(torch.rand(2, 3, 8, 8), gt)
    sharp = USMSharp()(gt)
    assert torch.equal(t["l1_gt"], sharp) and torch.equal(t["percep_gt"], gt) and torch.equal(t["gt"], gt)
    opt = load(real_options("g2", t91, model="RealESRGANModel", crop=96, l1_gt_usm=False, percep_gt_usm=True,
                            gan_gt_usm=True), tmp_path)
    t = _model(opt, cpu).targets(torch.rand(2, 3, 8, 8), gt)
    assert torch.equal(t["l1_gt"], gt) and torch.equal(t["percep_gt"], sharp) and torch.equal(t["gt"], sharp)


def test_realesrgan_step_and_state_round_trip(tmp_path: Path, t91: Path, cpu: Any) -> None:
    """Two models: one trains 5 steps, the other 3, takes the first's state and trains 2: the same weights."""
    opt = load(real_options("r", t91, model="RealESRGANModel", crop=96, degrade_in="step",
                            train={**real_options("x", t91)["train"], "net_d_init_iters": 1,
                                   "optim_d": {"type": "Adam", "lr": 1e-3},
                                   "gan_opt": {"type": "GANLoss", "gan_type": "vanilla", "loss_weight": 0.1}}),
               tmp_path)
    ds = build_dataset(opt.datasets.train, "datasets.train")
    batches = [_batch(ds, 2, 100 + 10 * i) for i in range(5)]
    cpu.manual_seed(0)
    a = _model(opt, cpu)
    state = None
    for it, bt in enumerate(batches, 1):
        a.update_learning_rate(it)
        losses = a.train_step([bt])
        if it == 1:  # net_d_init_iters: 1 -> the first iteration trains the discriminator only
            assert float(losses["l_g_gan"]) == 0 and float(losses["l_d_real"]) > 0
        if it == 3:
            state = copy.deepcopy(a.state_dict())  # (on the CPU these are the live tensors)
    assert state is not None and state["pool"]["filled"] == 2
    cpu.manual_seed(0)
    b = _model(opt, cpu)
    b.load_state_dict(state)
    for it, bt in enumerate(batches[3:], 4):
        b.update_learning_rate(it)
        b.train_step([bt])
    for k, v in a.bare("net_g").state_dict().items():
        assert torch.equal(v, b.bare("net_g").state_dict()[k]), k


def test_loader_mode_attaches_to_the_dataset(tmp_path: Path, t91: Path, cpu: Any) -> None:
    opt = load(real_options("ld", t91, crop=96, degrade_in="loader"), tmp_path)
    model = _model(opt, cpu)
    ds = build_dataset(opt.datasets.train, "datasets.train")
    model.prepare_train_set(ds)
    batch = _batch(ds, 2)
    assert batch["lq"].shape == (2, 3, 8, 8) and "kernel1" not in batch
    model.update_learning_rate(1)
    lq, gt = model.training_pair(batch, 0)
    assert torch.equal(lq, batch["lq"]) and torch.equal(gt, batch["gt"])  # the pool is filling: as it came
    with pytest.raises(OptionError, match="degrade_in: loader needs a dataset that synthesises"):
        model.prepare_train_set(torch.utils.data.TensorDataset(torch.zeros(1)))

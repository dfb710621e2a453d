"""16-bit images end to end: decoding, transforms, datasets, LMDB, pair pool, metrics, training and validation.

The images used here carry their signal in the LOW byte (the high byte constant), so anything that rounds to 8 bits
on the way flattens them: the checks would then fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
import yaml
from conftest import DATASETS, run_cli, tiny_train_options, write_options
from safetensors.torch import load_file, save_file

from anysr.accelerators import resolve_plan
from anysr.accelerators.precision import Precision
from anysr.data import build_dataset
from anysr.data.degradation.bicubic import bicubic_degrade, bicubic_degrade_window
from anysr.data.file_backends import DiskBackend, LmdbBackend, decode_training_image, decode_uint8
from anysr.data.loaders import holds_16bit_images
from anysr.data.pair_pool import TrainingPairPool, dequantise, quantise, wide_keys
from anysr.data.transforms import augment, bgr_to_y, img2tensor, mod_crop, paired_random_crop, tensor2img
from anysr.engine.evaluation.forward import quantize
from anysr.engine.prepare.command import degrade_samples, make_lmdb
from anysr.errors import DataError
from anysr.metrics import calculate_psnr, calculate_ssim, psnr_torch, ssim_torch
from anysr.ops.imresize import imresize
from anysr.options import load_options
from anysr.registry import ARCH_REGISTRY

T91 = DATASETS / "T91" / "HR"
HIGH = 0x80  # the constant high byte: (0x80 << 8 | k) / 257 rounds to 128 for every low byte k (flat in 8 bits)


def low_byte_image(u8: np.ndarray) -> np.ndarray:
    """A 16-bit image whose high byte is HIGH everywhere and whose low byte is ``u8``."""
    return ((HIGH << 8) | u8.astype(np.uint16)).astype(np.uint16)


def _png(img: np.ndarray, ext: str = ".png") -> bytes:
    ok, buf = cv2.imencode(ext, img)
    assert ok
    return buf.tobytes()


@pytest.fixture(scope="module")
def t91_u8() -> list[np.ndarray]:
    return [cv2.imread(str(p)) for p in sorted(T91.glob("*.png"))[:4]]


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory: pytest.TempPathFactory, t91_u8: list[np.ndarray]) -> Path:
    """Four 16-bit PNGs (96x96) whose low byte is a T91 image and whose high byte is constant."""
    out = tmp_path_factory.mktemp("deep")
    for i, img in enumerate(t91_u8):
        assert cv2.imwrite(str(out / f"d{i}.png"), low_byte_image(img[:96, :96]))
    return out


@pytest.fixture(scope="module")
def cut_dir(tmp_path_factory: pytest.TempPathFactory, deep_dir: Path) -> Path:
    """The same images cut to 8 bits (what anysr trained on before): every pixel is 128."""
    out = tmp_path_factory.mktemp("cut")
    for p in sorted(deep_dir.glob("*.png")):
        cut = decode_uint8(p.read_bytes(), p.name)
        assert (cut == 128).all()
        assert cv2.imwrite(str(out / p.name), cut)
    return out


# ------------------------------------------------------------------------------------------------ decoding
def test_decode_keeps_16_bits_and_8_bit_files_are_unchanged(tmp_path: Path, t91_u8: list[np.ndarray]) -> None:
    u8 = t91_u8[0][:40, :50]
    deep = low_byte_image(u8)
    for ext in (".png", ".tif"):
        got = decode_training_image(_png(deep, ext), "d")
        assert got.dtype == np.uint16 and np.array_equal(got, deep), ext
        assert np.array_equal(decode_training_image(_png(deep[:, :, 0], ext), "g"), deep[:, :, 0])  # gray stays HW
    bgra = decode_training_image(_png(np.dstack([deep, deep[:, :, :1]])), "a")
    assert np.array_equal(bgra, deep)  # alpha dropped, 16 bits kept
    assert (decode_uint8(_png(deep), "d") == 128).all()  # the 8-bit view (video frames) flattens them
    # 8-bit files: exactly OpenCV's pixels, as before
    assert np.array_equal(decode_training_image(_png(u8), "u"), u8)
    assert decode_training_image(_png(u8), "u").dtype == np.uint8
    cv2.imwrite(str(tmp_path / "d.png"), deep)
    backend = DiskBackend(tmp_path)
    assert backend.read("d.png").dtype == np.uint16 and np.array_equal(backend.read("d.png"), deep)
    assert backend.read_uint8("d.png").dtype == np.uint8


def test_float_and_32_bit_files_are_refused_in_one_line(tmp_path: Path) -> None:
    for dtype in (np.float32, np.int32):
        buf = _png(np.zeros((8, 8), dtype=dtype), ".tiff")
        with pytest.raises(DataError, match=rf"^f\.tiff: unsupported pixel type {np.dtype(dtype).name}; training "
                                            r"reads 8- or 16-bit images: convert it to an 8- or 16-bit PNG$"):
            decode_training_image(buf, "f.tiff")


# ------------------------------------------------------------------------------------------------ transforms
def test_img2tensor_and_y_scale_16_bit_by_65535(t91_u8: list[np.ndarray]) -> None:
    deep = low_byte_image(t91_u8[0][:20, :30])
    t = img2tensor(deep)
    assert t.dtype == torch.float32 and t.shape == (3, 20, 30)
    want = torch.from_numpy(deep[:, :, ::-1].transpose(2, 0, 1).astype(np.float32) / np.float32(65535.0))
    assert torch.equal(t, want)
    assert (t * 65535).round().sub(HIGH << 8).std() > 10  # the low byte reaches the tensor
    assert torch.equal(img2tensor(deep[:, :, 0]), want[2:3])  # gray: channel 0 of BGR is B
    assert np.array_equal(bgr_to_y(deep), bgr_to_y(deep.astype(np.float32) / np.float32(65535.0)))
    u8 = t91_u8[0][:20, :30]
    assert torch.equal(img2tensor(u8), torch.from_numpy(u8[:, :, ::-1].transpose(2, 0, 1).astype(np.float32) / 255))


def test_tensor2img_and_quantize_at_16_bits(t91_u8: list[np.ndarray]) -> None:
    deep = low_byte_image(t91_u8[1][:16, :16])
    t = img2tensor(deep)
    assert np.array_equal(tensor2img(t, bits=16), deep)  # exact round trip
    assert np.array_equal(tensor2img(t), decode_uint8(_png(deep), "d"))  # 8 bits as before
    with pytest.raises(DataError, match="bits must be 8 or 16, got 12"):
        tensor2img(t, bits=12)
    x = torch.rand(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(quantize(x), (x * 255).round() / 255)
    assert torch.equal(quantize(x, [8, 8]), quantize(x))
    mixed = quantize(x, [16, 8])
    assert torch.equal(mixed[1], quantize(x[1:])[0]) and torch.equal(mixed[0], (x[0] * 65535).round() / 65535)


def test_crop_flip_and_bicubic_keep_the_depth(t91_u8: list[np.ndarray]) -> None:
    u8 = mod_crop(t91_u8[2][:62, :70], 2)
    deep = low_byte_image(u8)
    assert mod_crop(deep, 4).dtype == np.uint16
    lq8, lq16 = u8[::2, ::2].copy(), deep[::2, ::2].copy()
    g8, q8 = paired_random_crop(u8, lq8, 16, 2, np.random.default_rng(3))
    g16, q16 = paired_random_crop(deep, lq16, 16, 2, np.random.default_rng(3))
    a8 = augment([g8, q8], True, True, np.random.default_rng(5))
    a16 = augment([g16, q16], True, True, np.random.default_rng(5))
    for x8, x16 in zip(a8, a16):  # same geometry, low byte carried along
        assert x16.dtype == np.uint16 and np.array_equal(x16 & 0xFF, x8) and (x16 >> 8 == HIGH).all()
    # MATLAB bicubic of a 16-bit GT: a 16-bit LQ, rounded on its own levels
    lq = bicubic_degrade(deep, 2)
    assert lq.dtype == np.uint16
    assert np.array_equal(lq, np.clip(np.rint(imresize(deep, 0.5)), 0, 65535).astype(np.uint16))
    assert len(np.unique(lq & 0xFF)) > 50
    assert np.array_equal(bicubic_degrade_window(deep, 2, 3, 5, 8), lq[3:11, 5:13])  # patch == crop of the whole
    assert np.array_equal(bicubic_degrade(u8, 2), np.clip(np.rint(imresize(u8, 0.5)), 0, 255).astype(np.uint8))


# ------------------------------------------------------------------------------------------------ datasets
def _train_set(tmp_path: Path, root: Path, phase: str = "train") -> Any:
    opt = tiny_train_options("ds", root, root if phase == "val" else None)
    path = write_options(tmp_path / "o.yml", opt)
    o = load_options(path, [f"path.root={tmp_path}"], is_train=True)
    key = "train" if phase == "train" else "val"
    return build_dataset(o.datasets[key], f"datasets.{key}")


def test_paired_dataset_items_keep_16_bits(tmp_path: Path, deep_dir: Path, cut_dir: Path) -> None:
    for phase in ("train", "val"):
        ds = _train_set(tmp_path, deep_dir, phase)
        assert ds.check(decode=phase == "val") == []
        item = ds[(1, 11)]
        assert item["bits"] == 16
        for side in ("gt", "lq"):
            levels = item[side] * 65535
            assert torch.equal(levels, levels.round()), side  # on the 16-bit grid
            assert (levels.round().sub(HIGH << 8).abs() < 512).all()  # near the constant high byte (bicubic rings)
            assert levels.std() > 10, (phase, side)  # the low byte's texture is there (flat if cut to 8 bits)
        flat = _train_set(tmp_path, cut_dir, phase)[(1, 11)]
        assert flat["bits"] == 8 and float(flat["gt"].std()) == 0.0


def _real_options(tmp_path: Path, root: Path) -> Any:
    opt = {"name": "r", "model_type": "RealESRNetModel", "scale": 4, "accelerator": "cpu", "num_gpu": 1,
           "gt_size": 32, "queue_size": 4,
           "datasets": {"train": {"name": "d", "type": "RealESRGANDataset", "dataroot_gt": str(root),
                                  "io_backend": {"type": "disk"}, "crop_pad_size": 96, "use_hflip": True,
                                  "use_rot": True, "batch_size_per_gpu": 2}},
           "network_g": {"type": "SRVGGNetCompact", "num_feat": 8, "num_conv": 2, "upscale": 4},
           "train": {"optim_g": {"type": "Adam", "lr": 1e-3}, "total_iter": 2,
                     "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0}}}
    path = tmp_path / "r.yml"
    path.write_text(yaml.safe_dump(opt))
    return load_options(path, [f"path.root={tmp_path}"], is_train=True)


def test_realesrgan_dataset_and_degrade_preview_keep_a_16_bit_gt(tmp_path: Path, deep_dir: Path) -> None:
    o = _real_options(tmp_path, deep_dir)
    ds = build_dataset(o.datasets.train, "datasets.train")
    item = ds[(0, 3)]
    assert item["bits"] == 16
    levels = item["gt"] * 65535
    assert torch.equal(levels, levels.round()) and levels.std() > 10
    report = degrade_samples(o, tmp_path / "pairs", 6, progress=False)  # through the pool (queue_size 4)
    meta = json.loads((report.out / "degrade.json").read_text())
    assert all(p["bits"] == 16 for p in meta["pairs"])
    for j in range(6):
        gt = cv2.imread(str(report.out / f"{j:04d}_gt.png"), cv2.IMREAD_UNCHANGED)
        lq = cv2.imread(str(report.out / f"{j:04d}_lq.png"), cv2.IMREAD_UNCHANGED)
        assert gt.dtype == np.uint16 and len(np.unique(gt & 0xFF)) > 50 and lq.dtype == np.uint8


def test_pair_pool_keeps_a_16_bit_gt_exactly() -> None:
    assert wide_keys({"bits": [8, 16]}) == ("gt",) and wide_keys({"bits": [8, 8]}) == () and wide_keys({}) == ()
    g = torch.Generator().manual_seed(0)
    u8 = torch.randint(0, 256, (2, 3, 4, 4), generator=g).float() / 255
    u16 = torch.randint(0, 65536, (2, 3, 4, 4), generator=g).float() / 65535
    pool = TrainingPairPool(4, {"lq": True, "gt": True})
    rng = np.random.default_rng(0)
    pool.swap({"lq": u8, "gt": u8}, rng, offset=0, global_batch=2, to_device=lambda t: t)
    assert pool.data["gt"].dtype == torch.uint8  # 8-bit batches: stored as uint8 as before
    pool.swap({"lq": u8, "gt": u16}, rng, offset=0, global_batch=2, to_device=lambda t: t, wide=("gt",))
    assert pool.data["gt"].dtype == torch.float32 and pool.data["lq"].dtype == torch.uint8
    assert torch.equal(pool.data["gt"][0], u8) and torch.equal(pool.data["gt"][1], u16)  # nothing rounded
    out = pool.swap({"lq": u8, "gt": u8}, rng, offset=0, global_batch=2, to_device=lambda t: t)
    for j in range(2):
        assert any(torch.equal(out["gt"][j], src[j]) for src in (u8, u16))
    # a saved uint8 pool restored into a pool that holds 16-bit GTs (and back) converts exactly
    old = TrainingPairPool(4, {"lq": True, "gt": True})
    old.swap({"lq": u8, "gt": u8}, rng, offset=0, global_batch=2, to_device=lambda t: t)
    old.swap({"lq": u8, "gt": u8}, rng, offset=0, global_batch=2, to_device=lambda t: t)
    state = old.state_dict(lambda x: [x], lambda x: x)
    assert state["data"]["gt"].dtype == torch.uint8
    new = TrainingPairPool(4, {"lq": True, "gt": True})
    new.load_state_dict(state, offset=0, batch=2)
    new.swap({"lq": u8, "gt": u16}, rng, offset=0, global_batch=2, to_device=lambda t: t, wide=("gt",))
    assert new.data["gt"].dtype == torch.float32
    saved = dequantise(state["data"]["gt"])
    kept = [torch.equal(new.data["gt"][r, j], saved[r, j]) for r in range(2) for j in range(2)]
    fresh = [torch.equal(new.data["gt"][r, j], u16[j]) for r in range(2) for j in range(2)]
    assert all(k or f for k, f in zip(kept, fresh)) and sum(fresh) == 2  # one place per column took the 16-bit GT
    assert torch.equal(dequantise(quantise(u8)), u8)


def test_lmdb_round_trip_keeps_16_bits(tmp_path: Path, t91_u8: list[np.ndarray]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    deep = low_byte_image(t91_u8[0][:30, :40])
    cv2.imwrite(str(src / "a.png"), deep)
    cv2.imwrite(str(src / "b.tif"), deep[:, :, 1])
    cv2.imwrite(str(src / "c.png"), t91_u8[1][:20, :20])
    out = make_lmdb(src, tmp_path / "x.lmdb", progress=False)
    backend = LmdbBackend(out)
    assert backend.keys() == ["a", "b", "c"]
    assert backend.read("a").dtype == np.uint16 and np.array_equal(backend.read("a"), deep)
    assert np.array_equal(backend.read("b"), deep[:, :, 1])
    assert backend.read("c").dtype == np.uint8 and np.array_equal(backend.read("c"), t91_u8[1][:20, :20])
    backend.close()


def test_holds_16bit_images_reads_a_header_sample(tmp_path: Path, deep_dir: Path, cut_dir: Path) -> None:
    """What makes precision auto mean fp32 for training and `anysr test`."""
    def section(**kw: Any) -> dict[str, Any]:
        return {"type": "PairedImageDataset", "io_backend": {"type": "disk"}, **kw}

    assert holds_16bit_images(section(dataroot_gt=str(deep_dir)))
    assert not holds_16bit_images(section(dataroot_gt=str(cut_dir), dataroot_lq=str(cut_dir)))
    assert holds_16bit_images(section(dataroot_gt=str(cut_dir), dataroot_lq=str(deep_dir)))
    assert holds_16bit_images(section(dataroot_gt=[str(cut_dir), str(deep_dir)]))  # a list of folders
    assert not holds_16bit_images(section(dataroot_gt=str(tmp_path / "missing")))  # the dataset's checks say it
    assert not holds_16bit_images({"type": "REDSDataset", "dataroot_gt": str(deep_dir)})  # video frames read 8-bit
    lmdb = make_lmdb(deep_dir, tmp_path / "d.lmdb", progress=False)
    assert holds_16bit_images(section(dataroot_gt=str(lmdb), io_backend={"type": "lmdb"}))


# ------------------------------------------------------------------------------------------------ metrics
def test_psnr_ssim_on_16_bit_levels_match_the_float_0_255_scale(t91_u8: list[np.ndarray]) -> None:
    rng = np.random.default_rng(0)
    gt16 = low_byte_image(t91_u8[3][:40, :40])
    sr16 = np.clip(gt16.astype(np.int64) + rng.integers(-40, 41, gt16.shape), 0, 65535).astype(np.uint16)
    sr, gt = img2tensor(sr16)[None], img2tensor(gt16)[None]
    f_sr, f_gt = sr16.astype(np.float64) * 255 / 65535, gt16.astype(np.float64) * 255 / 65535
    for y in (False, True):
        p = float(psnr_torch(sr, gt, crop_border=2, test_y_channel=y, peak=65535.0)[0])
        assert p == pytest.approx(calculate_psnr(f_sr, f_gt, 2, test_y_channel=y), abs=1e-3), y
        s = float(ssim_torch(sr, gt, crop_border=2, test_y_channel=y, peak=65535.0)[0])
        assert s == pytest.approx(calculate_ssim(f_sr, f_gt, 2, test_y_channel=y), abs=1e-5), y
        assert 60 < p < 75  # errors below one 8-bit level are measured, not rounded away
        assert abs(float(psnr_torch(sr, gt, crop_border=2, test_y_channel=y)[0]) - p) > 1  # 8-bit rounding: another
    # 8-bit images score exactly as before; a per-image peak scores each image at its own depth
    u8 = torch.from_numpy(t91_u8[3][:40, :40].transpose(2, 0, 1).copy()).float()[None] / 255
    noisy = ((u8 * 255 + torch.from_numpy(rng.integers(-3, 4, u8.shape)).float()).clamp(0, 255)).round() / 255
    base = psnr_torch(noisy, u8)
    assert torch.equal(psnr_torch(noisy, u8, peak=255.0), base) and torch.equal(ssim_torch(noisy, u8, peak=255),
                                                                                 ssim_torch(noisy, u8))
    both = psnr_torch(torch.cat([noisy, sr]), torch.cat([u8, gt]), peak=torch.tensor([255.0, 65535.0]))
    assert float(both[0]) == pytest.approx(float(base[0]), abs=1e-4)
    assert float(both[1]) == pytest.approx(float(psnr_torch(sr, gt, peak=65535.0)[0]), abs=1e-4)
    # the same picture widened to 16 bits (x 257) scores the same on both conventions (docs/data.md)
    wide_n, wide_g = (noisy * 255).round() * 257 / 65535, (u8 * 255).round() * 257 / 65535
    for y in (False, True):
        assert float(psnr_torch(wide_n, wide_g, test_y_channel=y, peak=65535.0)[0]) == pytest.approx(
            float(psnr_torch(noisy, u8, test_y_channel=y)[0]), abs=1e-3)
        assert float(ssim_torch(wide_n, wide_g, test_y_channel=y, peak=65535.0)[0]) == pytest.approx(
            float(ssim_torch(noisy, u8, test_y_channel=y)[0]), abs=1e-5)
    with pytest.raises(DataError, match="peak: 255 .* or 65535 .*, got 1000"):
        psnr_torch(sr, gt, peak=1000.0)


# ------------------------------------------------------------------------------------------------ end to end
def _losses(exp: Path) -> list[float]:
    history = json.loads((exp / "history.json").read_text())
    return [e["losses"]["l_pix"] for e in history["train"]]


def _identity_compact(path: Path) -> dict[str, Any]:
    """A tiny SRVGGNetCompact x2 whose last conv is zero: it starts as nearest upsampling of its input, so on the
    flat 8-bit cut the loss is exactly 0 (and stays so: L1's gradient at 0 is 0), on the 16-bit images it is not."""
    cfg = {"type": "SRVGGNetCompact", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_conv": 2, "upscale": 2}
    net = ARCH_REGISTRY.get("SRVGGNetCompact")(**{k: v for k, v in cfg.items() if k != "type"})
    with torch.no_grad():
        net.body[-1].weight.zero_()
        net.body[-1].bias.zero_()
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    return cfg


@pytest.mark.parametrize("requested", ["auto", "bf16", "fp32"])
def test_16_bit_samples_are_an_input_of_the_precision_decision(requested: str) -> None:
    """16-bit samples (``deep_samples``) make ``auto`` fp32 on a device with native bf16, in ``Precision.decide``
    and nowhere else: the plan keeps what was asked for, a forced precision stays forced, and a CPU then times no
    bf16 candidate."""
    plan = resolve_plan("cpu", 1, precision=requested, deep_samples=("16-bit input images", "--precision bf16"))
    assert plan.precision == requested
    assert (plan.deep_samples is not None) == (requested == "auto")
    assert any("16-bit input images: precision fp32" in n for n in plan.notes) == (requested == "auto")
    decided = Precision(plan.precision, False, plan.deep_samples)
    decided.decide(torch.device("cpu"), "cpu", (True, "native bf16"))
    assert decided.name == ("fp32" if requested == "auto" else requested)
    assert not decided.precision_open
    plain = Precision("auto", False)
    plain.decide(torch.device("cpu"), "cpu", (True, "native bf16"))
    assert plain.name == "bf16" and plain.precision_open


@pytest.mark.slow
def test_training_and_validation_see_the_low_byte(tmp_path: Path, deep_dir: Path, cut_dir: Path,
                                                 small_val_dir: Path) -> None:
    """A run on 16-bit images whose signal is in the low byte trains on that signal (its loss is far above the
    flat 8-bit cut's, which is exactly 0), validation writes 16-bit PNGs whose low bytes vary, `anysr test` too."""
    start = tmp_path / "start.safetensors"
    net = _identity_compact(start)
    runs = {}
    for name, root, val in (("deep", deep_dir, deep_dir), ("cut", cut_dir, small_val_dir)):
        opt = tiny_train_options(name, root, val, total_iter=4)
        opt["network_g"] = dict(net)
        opt["path"]["pretrain_network_g"] = str(start)
        opt["logger"]["print_freq"] = 1
        opt["logger"]["save_checkpoint_freq"] = 4
        opt["val"] = {"val_freq": 4, "save_img": True,
                      "metrics": {"psnr": {"type": "calculate_psnr", "crop_border": 2}}}
        opt["train"]["precision"] = "auto"  # 16-bit data: fp32 (bf16 would keep ~8 bits); the 8-bit cut: as before
        proc = run_cli("train", "-opt", str(write_options(tmp_path / f"{name}.yml", opt)), "--force_yml",
                       f"path.root={tmp_path}", cwd=tmp_path)
        said = "16-bit images in the datasets: precision fp32" in proc.stdout + proc.stderr
        assert said == (name == "deep"), name
        runs[name] = tmp_path / "experiments" / name
    deep, cut = _losses(runs["deep"]), _losses(runs["cut"])
    assert len(deep) == len(cut) == 4
    assert cut == [0.0] * 4  # cut to 8 bits (what anysr trained on before) the images are flat: nothing to learn
    assert all(5e-5 < v < 1e-2 for v in deep), deep  # the low byte's texture is what the loss sees
    summary = json.loads((runs["deep"] / "summary.json").read_text())
    assert summary["accelerator"]["precision"] == "fp32"
    assert 40 < summary["validation"]["val"]["psnr"]["value"] < 100
    saved = sorted((runs["deep"] / "visualization").rglob("*.png"))
    assert len(saved) == 4
    for p in saved:
        img = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
        assert img.dtype == np.uint16, p
        assert len(np.unique(img & 0xFF)) > 16 and (img % 257 != 0).any(), p  # not an 8-bit result widened
    eight = sorted((runs["cut"] / "visualization").rglob("*.png"))
    assert eight and all(cv2.imread(str(p), cv2.IMREAD_UNCHANGED).dtype == np.uint8 for p in eight)  # as before
    weights = next((runs["deep"] / "models").glob("net_g_4.*"))
    test = {"name": "t16", "model_type": "SRModel", "scale": 2, "accelerator": "cpu", "num_gpu": 1,
            "datasets": {"test_1": {"name": "deep", "type": "PairedImageDataset", "dataroot_gt": str(deep_dir),
                                    "lq_from_gt": True, "io_backend": {"type": "disk"}}},
            "network_g": dict(net), "path": {"pretrain_network_g": str(weights)},
            "val": {"save_img": True, "metrics": {"psnr": {"type": "calculate_psnr", "crop_border": 2},
                                                  "ssim": {"type": "calculate_ssim", "crop_border": 2}}}}
    run_cli("test", "-opt", str(write_options(tmp_path / "t.yml", test)), "--force_yml", f"path.root={tmp_path}",
            cwd=tmp_path)
    results = tmp_path / "results" / "t16"
    out = json.loads((results / "summary.json").read_text())["datasets"]["deep"]
    assert out["n"] == 4 and 40 < out["psnr"] < 100 and 0 < out["ssim"] <= 1
    pngs = sorted((results / "visualization").rglob("*.png"))
    assert len(pngs) == 4
    for p in pngs:
        img = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
        assert img.dtype == np.uint16 and len(np.unique(img & 0xFF)) > 16, p


@pytest.mark.xla
def test_xla_validation_of_16_bit_images_equals_cpu_and_compiles_once(tmp_path: Path, deep_dir: Path) -> None:
    pytest.importorskip("torch_xla")
    import os  # noqa: PLC0415 - only this test needs the XLA environment

    os.environ.setdefault("PJRT_DEVICE", "CPU")
    from anysr.accelerators.base import LaunchPlan  # noqa: PLC0415
    from anysr.accelerators.launcher import create_accelerator, resolve_plan  # noqa: PLC0415
    from anysr.data import build_eval_loader  # noqa: PLC0415
    from anysr.engine.evaluation.evaluator import evaluate  # noqa: PLC0415
    from anysr.engine.evaluation.val_metrics import ValMetrics  # noqa: PLC0415

    opt = tiny_train_options("x", deep_dir, deep_dir)
    opt["val"]["metrics"] = {"psnr": {"type": "calculate_psnr", "crop_border": 2, "test_y_channel": True},
                             "ssim": {"type": "calculate_ssim", "crop_border": 2}}
    o = load_options(write_options(tmp_path / "x.yml", opt), [f"path.root={tmp_path}"], is_train=True)
    loader, _ = build_eval_loader(build_dataset(o.datasets.val, "datasets.val"), o.datasets.val, world_size=1, rank=0)
    start = tmp_path / "start.safetensors"
    _identity_compact(start)
    sd = load_file(str(start))
    results = {}
    for kind in ("cpu", "xla"):
        plan = (LaunchPlan("xla", 1, "xla", "fp32", extra={"pjrt_device": "CPU", "all_devices": False})
                if kind == "xla" else resolve_plan("cpu", 1, precision="fp32"))
        acc = create_accelerator(plan)
        acc.setup()
        net = ARCH_REGISTRY.get("SRVGGNetCompact")(num_feat=8, num_conv=2, upscale=2)
        net.load_state_dict(sd)
        net = net.to(acc.device)
        metrics = ValMetrics(o.val.metrics, acc)
        first = acc.stats()
        results[kind] = evaluate(net, loader, acc, dataset="deep", scale=2, metrics=metrics,
                                 save_dir=tmp_path / kind)
        if kind == "xla":
            before = acc.stats()
            evaluate(net, loader, acc, dataset="deep", scale=2, metrics=metrics)
            after = acc.stats()
            assert after["compiles"] == before["compiles"], (before, after)
            assert after["cpu_fallbacks"] == first["cpu_fallbacks"], (first, after)
    for key in ("psnr", "ssim"):
        assert results["xla"].metrics[key] == pytest.approx(results["cpu"].metrics[key], rel=1e-5), key
    assert 40 < results["cpu"].metrics["psnr"] < 100
    saved = sorted((tmp_path / "xla").glob("*.png"))
    assert len(saved) == 4
    for p in saved:
        a, b = (cv2.imread(str(d / p.name), cv2.IMREAD_UNCHANGED) for d in (tmp_path / "xla", tmp_path / "cpu"))
        assert a.dtype == b.dtype == np.uint16 and np.abs(a.astype(int) - b.astype(int)).max() <= 1, p.name

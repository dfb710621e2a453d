"""Tests of anysr.data on real images (T91 and Set5 HR from the repository's datasets/ folder)."""

from __future__ import annotations

import logging
import pickle
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from anysr.data import (
    DiskBackend,
    LmdbBackend,
    PairedImageDataset,
    SingleImageDataset,
    TrainSampler,
    augment,
    bicubic_degrade,
    build_dataset,
    build_eval_loader,
    build_train_loader,
    collate,
    decode_uint8,
    img2tensor,
    mod_crop,
    paired_random_crop,
    tensor2img,
)
from anysr.data.file_backends import build_backend
from anysr.data.transforms import bgr_to_y
from anysr.errors import DataError, OptionError
from anysr.options import Options, validate_dataset

DATASETS = Path(__file__).resolve().parents[1] / "datasets"
T91 = DATASETS / "T91" / "HR"
SET5 = DATASETS / "Set5" / "HR"
# A few small T91 images (all at least 78x78).
NAMES = ["t1.png", "t2.png", "t3.png", "t4.png", "t5.png", "t6.png"]


def block_mean(img: np.ndarray, s: int) -> np.ndarray:
    """Exact s x s box downscale of a mod-cropped uint8 image (commutes with flips and transposes)."""
    h, w = img.shape[0] // s, img.shape[1] // s
    x = img[: h * s, : w * s].astype(np.float64)
    x = x.reshape(h, s, w, s, *img.shape[2:]).mean(axis=(1, 3))
    return np.rint(x).astype(np.uint8)


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """GT: copies of six T91 images; LQ: their x2 box-downscales named '<stem>x2.png'."""
    root = tmp_path_factory.mktemp("pairs")
    gt, lq = root / "gt", root / "lq"
    gt.mkdir()
    lq.mkdir()
    for n in NAMES:
        shutil.copy(T91 / n, gt / n)
        img = cv2.imread(str(T91 / n), cv2.IMREAD_UNCHANGED)
        cv2.imwrite(str(lq / f"{Path(n).stem}x2.png"), block_mean(img, 2))
    return gt, lq


def _validated(opt: dict, kind: str) -> Options:
    """A dataset section through the options (the one place its rules live), as a run would build it."""
    opt = {"type": kind, **opt}
    phase = opt.pop("phase", "test" if kind == "SingleImageDataset" else "train")
    if phase.startswith("train"):
        opt.setdefault("batch_size_per_gpu", 2)  # required for a train set; these tests read items directly
    return validate_dataset(opt, name=phase)


def Paired(opt: dict) -> PairedImageDataset:  # noqa: N802 - reads like the class it builds
    return PairedImageDataset(_validated(opt, "PairedImageDataset"))


def Single(opt: dict) -> SingleImageDataset:  # noqa: N802
    return SingleImageDataset(_validated(opt, "SingleImageDataset"))


def paired_opt(gt: Path, lq: Path, **kw: object) -> dict:
    opt = {"type": "PairedImageDataset", "dataroot_gt": str(gt), "dataroot_lq": str(lq),
           "filename_tmpl": "{}x2", "io_backend": {"type": "disk"}, "scale": 2, "phase": "train",
           "gt_size": 32, "use_hflip": True, "use_rot": True}
    opt.update(kw)
    return opt


# ------------------------------------------------------------------ transforms

def test_mod_crop_and_tensor_round_trip() -> None:
    img = cv2.imread(str(SET5 / "bird.png"), cv2.IMREAD_UNCHANGED)
    assert mod_crop(img, 5).shape == (285, 285, 3)
    assert mod_crop(img[:, :, 0], 7).shape == (287, 287)
    t = img2tensor(img)
    assert t.dtype == torch.float32 and t.shape == (3, 288, 288)
    assert torch.equal(t[0], torch.from_numpy(img[:, :, 2].astype(np.float32) / 255))  # R first
    assert np.array_equal(tensor2img(t), img)
    assert np.array_equal(tensor2img(t[None]), img)
    gray = img[:, :, 1]
    g3 = img2tensor(gray, gray_to_rgb=True)
    assert g3.shape == (3, 288, 288) and torch.equal(g3[0], g3[2])
    assert img2tensor(gray).shape == (1, 288, 288)
    assert np.array_equal(tensor2img(img2tensor(gray)), gray)
    assert tensor2img(torch.tensor([[[-0.5, 0.5, 1.7]]])).tolist() == [[0, 128, 255]]


def test_img2tensor_is_every_level_divided() -> None:
    """The one-pass conversion gives exactly ``x.astype(float32) / 255`` (``/ 65535``) for every level, in CHW RGB
    order, from any HWC layout (a flipped or transposed view, as augment's output may be)."""
    for dtype, top in ((np.uint8, 255.0), (np.uint16, 65535.0)):
        levels = np.arange(int(top) + 1, dtype=dtype)
        img = np.resize(levels, (3, 64, len(levels) // 64 + 1)).transpose(1, 2, 0)[:, ::-1]  # HWC, strided
        want = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)[::-1]).astype(np.float32) / top)
        assert torch.equal(img2tensor(img), want)
        assert torch.equal(img2tensor(img[:, :, 0]), want[2:3])


def test_augment_is_consistent_and_seeded() -> None:
    img = cv2.imread(str(T91 / "t1.png"), cv2.IMREAD_UNCHANGED)[:40, :40]
    small = block_mean(img, 2)
    seen = set()
    for seed in range(40):
        a_gt, a_lq = augment([img, small], True, True, np.random.default_rng(seed))
        b_gt, b_lq = augment([img, small], True, True, np.random.default_rng(seed))
        assert np.array_equal(a_gt, b_gt) and np.array_equal(a_lq, b_lq)
        assert a_gt.flags["C_CONTIGUOUS"]
        assert np.array_equal(block_mean(a_gt, 2), a_lq)  # the same geometric op on both
        seen.add(a_gt.tobytes())
    assert len(seen) == 8  # all dihedral orientations occur
    one = augment(img, False, False, np.random.default_rng(0))
    assert isinstance(one, np.ndarray) and np.array_equal(one, img)


def test_paired_random_crop_alignment() -> None:
    gt = cv2.imread(str(SET5 / "woman.png"), cv2.IMREAD_UNCHANGED)  # 344x228
    lq = gt[::4, ::4]  # nearest downscale: lq[y, x] == gt[4y, 4x]
    for seed in range(10):
        g, q = paired_random_crop(gt, lq, 48, 4, np.random.default_rng(seed))
        assert g.shape == (48, 48, 3) and q.shape == (12, 12, 3)
        assert np.array_equal(g[::4, ::4], q)
    # GT with up to scale-1 extra border pixels is accepted (it pairs with the LQ of its mod-crop)
    g, q = paired_random_crop(gt[:343, :227], lq[:85, :56], 48, 4, np.random.default_rng(0))
    assert np.array_equal(g[::4, ::4], q)


def test_paired_random_crop_errors_name_the_files() -> None:
    gt = cv2.imread(str(SET5 / "head.png"), cv2.IMREAD_UNCHANGED)  # 280x280
    lq = gt[::2, ::2]
    with pytest.raises(DataError, match=r"lq/head\.png is 140x140.*smaller than the 160x160 LQ patch.*"
                                        r"gt/head\.png.*Lower gt_size"):
        paired_random_crop(gt, lq, 320, 2, np.random.default_rng(0), "gt/head.png", "lq/head.png")
    with pytest.raises(DataError, match=r"gt/head\.png is 280x280.*lq/head\.png is 140x140: with scale 4 "
                                        r"the GT should be 560x560.*'scale' option"):
        paired_random_crop(gt, lq, 32, 4, np.random.default_rng(0), "gt/head.png", "lq/head.png")
    with pytest.raises(OptionError, match="gt_size 30 is not a multiple of scale 4"):
        paired_random_crop(gt, gt[::4, ::4], 30, 4, np.random.default_rng(0))


# ------------------------------------------------------------------ backends

def test_disk_backend_and_decode(tmp_path: Path) -> None:
    b = DiskBackend(T91)
    assert len(b.keys()) == 91 and b.keys()[0] == "t1.png"
    assert b.get("t1.png") == (T91 / "t1.png").read_bytes()
    assert b.get(str(T91 / "t2.png")) == (T91 / "t2.png").read_bytes()  # absolute paths work too
    img = b.read("t1.png")
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    gray_png = cv2.imencode(".png", img[:, :, 0])[1].tobytes()
    assert decode_uint8(gray_png, "g").ndim == 2
    bgra = cv2.imencode(".png", np.dstack([img, img[:, :, :1]]))[1].tobytes()
    assert np.array_equal(decode_uint8(bgra, "a"), img)
    deep = cv2.imencode(".png", img.astype(np.uint16) * 257)[1].tobytes()
    assert np.array_equal(decode_uint8(deep, "d"), img)
    with pytest.raises(DataError, match=r"nope\.png: image file not found"):
        b.get("nope.png")
    with pytest.raises(DataError, match=r"broken\.png cannot be decoded: .*corrupt.*\(20 bytes\)"):
        decode_uint8(b.get("t1.png")[:20], "broken.png")
    assert isinstance(build_backend("disk", T91), DiskBackend)


def make_lmdb(path: Path, folder: Path, names: list[str]) -> None:
    lmdb = pytest.importorskip("lmdb")
    env = lmdb.open(str(path), map_size=64 << 20)
    meta = []
    with env.begin(write=True) as txn:
        for n in names:
            buf = (folder / n).read_bytes()
            img = cv2.imdecode(np.frombuffer(buf, np.uint8), cv2.IMREAD_UNCHANGED)
            key = Path(n).stem
            txn.put(key.encode(), buf)
            h, w = img.shape[:2]
            c = 1 if img.ndim == 2 else img.shape[2]
            meta.append(f"{key}.png ({h},{w},{c}) 1")
    env.close()
    (path / "meta_info.txt").write_text("\n".join(meta) + "\n")


def test_lmdb_round_trip(tmp_path: Path, pair_dirs: tuple[Path, Path]) -> None:
    gt_dir, lq_dir = pair_dirs
    gt_db, lq_db = tmp_path / "gt.lmdb", tmp_path / "lq.lmdb"
    make_lmdb(gt_db, gt_dir, NAMES)
    # The LQ lmdb uses the GT stems as keys (BasicSR's layout: same keys on both sides).
    renamed = tmp_path / "lq_renamed"
    renamed.mkdir()
    for n in NAMES:
        shutil.copy(lq_dir / f"{Path(n).stem}x2.png", renamed / n)
    make_lmdb(lq_db, renamed, NAMES)

    b = LmdbBackend(gt_db)
    assert b.keys() == sorted(Path(n).stem for n in NAMES)
    assert b.get("t3") == (gt_dir / "t3.png").read_bytes()
    clone = pickle.loads(pickle.dumps(b))  # what a spawned worker receives
    assert clone.get("t3") == b.get("t3")
    assert LmdbBackend(gt_db).get("t4") == b.get("t4")  # a second backend of the same LMDB shares the handle
    with pytest.raises(DataError, match=r"gt\.lmdb key 't9'.*key not in the LMDB.*rebuild"):
        b.get("t9")

    opt = paired_opt(gt_db, lq_db, io_backend={"type": "lmdb"}, filename_tmpl="{}")
    ds_lmdb = Paired(opt)
    ds_disk = Paired(paired_opt(gt_dir, lq_dir))
    assert len(ds_lmdb) == len(ds_disk) == len(NAMES)
    for i in range(len(NAMES)):
        a, d = ds_lmdb[(i, 7)], ds_disk[(i, 7)]
        assert torch.equal(a["gt"], d["gt"]) and torch.equal(a["lq"], d["lq"])
        assert a["gt_path"] == a["lq_path"] == Path(NAMES[i]).stem
    # the parent has opened the environment; forked workers must open their own
    loader, _ = build_train_loader(ds_lmdb, _validated({**opt, "num_worker_per_gpu": 2}, "PairedImageDataset"),
                                   batch_size=2, world_size=1, rank=0, seed=3)
    batches = list(loader)
    assert len(batches) == 3 and batches[0]["gt"].shape == (2, 3, 32, 32)

    single = Single({"dataroot_lq": str(lq_db), "io_backend": {"type": "lmdb"}})
    assert len(single) == len(NAMES) and single[0]["lq_path"] == "t1"


def test_lmdb_errors(tmp_path: Path, pair_dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    gt_dir, _ = pair_dirs
    gt_db, lq_db = tmp_path / "gt.lmdb", tmp_path / "lq.lmdb"
    make_lmdb(gt_db, gt_dir, NAMES)
    make_lmdb(lq_db, gt_dir, NAMES[:-1])
    with pytest.raises(DataError, match=r"datasets\.train: the LMDBs .*gt\.lmdb' and .*lq\.lmdb' hold "
                                        r"different keys \(only in GT: t6; only in LQ: -\)"):
        Paired(paired_opt(gt_db, lq_db, io_backend={"type": "lmdb"}))
    with pytest.raises(DataError, match=r"not an LMDB dataset.*io_backend\.type: disk"):
        Paired(paired_opt(gt_dir, lq_db, io_backend={"type": "lmdb"}))
    (lq_db / "meta_info.txt").unlink()
    with pytest.raises(DataError, match=r"lq\.lmdb/meta_info\.txt: LMDB meta_info\.txt not found"):
        LmdbBackend(lq_db)
    monkeypatch.setitem(sys.modules, "lmdb", None)  # as if lmdb were not installed
    with pytest.raises(DataError, match=r"needs the lmdb package: pip install anysr\[lmdb\]"):
        LmdbBackend(gt_db)


# ------------------------------------------------------------------ datasets

def test_pairing_from_folder_and_meta_info(pair_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    gt, lq = pair_dirs
    ds = Paired(paired_opt(gt, lq))
    assert len(ds) == len(NAMES)
    for i, n in enumerate(NAMES):
        assert ds.paths(i) == (str(gt / n), str(lq / f"{Path(n).stem}x2.png"))
    meta = tmp_path / "meta.txt"
    meta.write_text("t4.png (87,110,3)\nt2.png (96,96,3)\n")
    dm = Paired(paired_opt(gt, lq, meta_info_file=str(meta)))
    assert len(dm) == 2 and dm.paths(0) == (str(gt / "t4.png"), str(lq / "t4x2.png"))
    meta.write_text("t4.png\nt77.png\n")
    with pytest.raises(DataError, match=r"datasets\.train: 1 GT image\(s\) listed but not found in .*: "
                                        r"t77\.png"):
        Paired(paired_opt(gt, lq, meta_info_file=str(meta)))
    with pytest.raises(OptionError, match=r"datasets\.train\.meta_info_file: '.*missing\.txt' does not exist"):
        Paired(paired_opt(gt, lq, meta_info_file=str(tmp_path / "missing.txt")))


def test_unmatched_pairs_are_listed(pair_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    gt, lq = pair_dirs
    lq2 = tmp_path / "lq2"
    shutil.copytree(lq, lq2)
    (lq2 / "t3x2.png").unlink()
    shutil.copy(lq / "t1x2.png", lq2 / "extra.png")
    with pytest.raises(DataError) as err:
        Paired(paired_opt(gt, lq2))
    msg = str(err.value)
    assert "datasets.train: unmatched image pairs (filename_tmpl '{}x2')" in msg
    assert "1 GT image(s)" in msg and "t3.png (expected LQ 't3x2.*')" in msg
    assert "1 LQ image(s)" in msg and "extra.png" in msg
    with pytest.raises(DataError, match=r"6 GT image\(s\).*t1\.png \(expected LQ 't1\.\*'\)"):
        Paired(paired_opt(gt, lq, filename_tmpl="{}"))


def test_missing_folders_and_bad_options(pair_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    """The dataset's rules are the options' (one place): each bad value is named with its key path."""
    gt, lq = pair_dirs
    cases = [
        (dict(dataroot_gt=str(tmp_path / "nowhere")), r"datasets\.train\.dataroot_gt: '.*nowhere' does not exist"),
        (dict(dataroot_lq=str(tmp_path / "nowhere")), r"datasets\.train\.dataroot_lq: '.*nowhere' does not exist"),
        (dict(dataroot_lq=None), r"datasets\.train\.dataroot_lq: PairedImageDataset needs dataroot_lq .* or "
                                 r"lq_from_gt: true"),
        (dict(gt_size=None), r"datasets\.train\.gt_size: required for a train PairedImageDataset"),
        (dict(gt_size=33), r"datasets\.train\.gt_size: 33 is not a multiple of scale \(2\)"),
        (dict(filename_tmpl="x2"), r"datasets\.train\.filename_tmpl: must contain '\{\}' exactly once"),
        (dict(color="ycbcr"), r"datasets\.train\.color: expected 'y' \| null, got 'ycbcr'"),
        (dict(mean=[0.5, 0.5, 0.5]), r"datasets\.train\.std: set mean and std together"),
        (dict(dataroot_gt=str(gt / "t1.png")), r"datasets\.train\.dataroot_gt: '.*t1\.png' is a file; point it "
                                               r"to the folder of images"),
    ]
    for change, message in cases:
        with pytest.raises(OptionError, match=message):
            Paired(paired_opt(gt, lq, **change))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=r"datasets\.train\.dataroot_gt: no images .* in '.*empty'"):
        Paired(paired_opt(empty, lq))


def test_train_items_crop_align_and_are_deterministic(pair_dirs: tuple[Path, Path]) -> None:
    gt, lq = pair_dirs
    ds = Paired(paired_opt(gt, lq))
    for i in range(len(ds)):
        for seed in (0, 1, 2**62 + 5):
            item = ds[(i, seed)]
            assert item["gt"].shape == (3, 32, 32) and item["lq"].shape == (3, 16, 16)
            assert item["gray"] is False and item["gt_path"].endswith(NAMES[i])
            # the LQ crop is the box-downscale of the GT crop, through any flip / transpose
            assert np.array_equal(block_mean(tensor2img(item["gt"]), 2), tensor2img(item["lq"]))
            again = ds[(i, seed)]
            assert torch.equal(item["gt"], again["gt"]) and torch.equal(item["lq"], again["lq"])
    assert not torch.equal(ds[(0, 1)]["gt"], ds[(0, 2)]["gt"])
    assert torch.equal(ds[3]["gt"], ds[(3, 3)]["gt"])  # ds[i] in train means seed i


def test_val_items_are_whole_and_mod_cropped(tmp_path: Path) -> None:
    gt_dir, lq_dir = tmp_path / "gt", tmp_path / "lq"
    gt_dir.mkdir()
    lq_dir.mkdir()
    for n in ("woman.png", "bird.png"):
        img = cv2.imread(str(SET5 / n), cv2.IMREAD_UNCHANGED)
        cv2.imwrite(str(gt_dir / n), img[:343, :227])  # 343x227: GT has extra border at scale 3
        cv2.imwrite(str(lq_dir / n), block_mean(img[:343, :227], 3))
    ds = Paired({"dataroot_gt": str(gt_dir), "dataroot_lq": str(lq_dir), "scale": 3,
                             "phase": "val"})
    item = ds[1]
    assert item["lq"].shape == (3, 114, 75) and item["gt"].shape == (3, 342, 225)
    assert torch.equal(ds[(1, 99)]["gt"], item["gt"])  # no randomness outside training
    cv2.imwrite(str(lq_dir / "bird.png"), np.zeros((50, 50, 3), np.uint8))
    with pytest.raises(DataError, match=r"gt/bird\.png is 288x227 \(HxW\) but .*lq/bird\.png is 50x50: "
                                        r"with scale 3 the GT should be 150x150"):
        ds[0]


def test_gray_and_y_channel(tmp_path: Path) -> None:
    gt_dir = tmp_path / "gray"
    gt_dir.mkdir()
    img = cv2.imread(str(SET5 / "baby.png"), cv2.IMREAD_UNCHANGED)[:200, :200]
    cv2.imwrite(str(gt_dir / "g.png"), cv2.cvtColor(img, cv2.COLOR_BGR2GRAY))
    cv2.imwrite(str(gt_dir / "c.png"), img)
    opt = {"dataroot_gt": str(gt_dir), "lq_from_gt": True, "scale": 2, "phase": "val"}
    ds = Paired(opt)
    c, g = ds[0], ds[1]
    assert (c["gray"], g["gray"]) == (False, True)
    assert g["gt"].shape == (3, 200, 200) and g["lq"].shape == (3, 100, 100)
    assert torch.equal(g["gt"][0], g["gt"][1]) and torch.equal(g["lq"][0], g["lq"][2])
    y = Paired({**opt, "color": "y"})
    yc, yg = y[0], y[1]
    assert yc["gt"].shape == (1, 200, 200) and yg["lq"].shape == (1, 100, 100)
    assert torch.allclose(yc["gt"][0], torch.from_numpy(bgr_to_y(img)))
    assert torch.equal(yg["gt"], g["gt"][:1])  # a gray image is its own Y (full range)
    assert 16 / 255 - 1e-6 <= float(yc["gt"].min()) and float(yc["gt"].max()) <= 235 / 255 + 1e-6
    norm = Paired({**opt, "mean": [0.5] * 3, "std": [0.25] * 3})
    assert torch.allclose(norm[0]["gt"], (c["gt"] - 0.5) / 0.25)
    single = Single({"dataroot_lq": str(gt_dir)})
    assert len(single) == 2 and single[1]["gray"] is True and single[1]["lq"].shape == (3, 200, 200)
    assert set(single[0]) == {"lq", "lq_path", "gray", "bits"}


def test_lq_from_gt_matches_a_prepared_bicubic_folder(tmp_path: Path) -> None:
    gt_dir, lq_dir = tmp_path / "gt", tmp_path / "lq"
    gt_dir.mkdir()
    lq_dir.mkdir()
    for n in NAMES[:4]:
        shutil.copy(T91 / n, gt_dir / n)
        img = cv2.imread(str(T91 / n), cv2.IMREAD_UNCHANGED)
        cv2.imwrite(str(lq_dir / n), bicubic_degrade(mod_crop(img, 3), 3))
    base = {"dataroot_gt": str(gt_dir), "scale": 3, "gt_size": 48, "phase": "train"}
    on_the_fly = Paired({**base, "lq_from_gt": True})
    prepared = Paired({**base, "dataroot_lq": str(lq_dir)})
    for i in range(4):
        for seed in (11, 12):
            a, b = on_the_fly[(i, seed)], prepared[(i, seed)]
            assert torch.equal(a["gt"], b["gt"]) and torch.equal(a["lq"], b["lq"])
            assert a["lq_path"] == a["gt_path"]
    for phase in ("val", "test"):
        a = Paired({**base, "lq_from_gt": True, "phase": phase})[2]
        b = Paired({**base, "dataroot_lq": str(lq_dir), "phase": phase})[2]
        assert torch.equal(a["gt"], b["gt"]) and torch.equal(a["lq"], b["lq"])
    big = Paired({**base, "lq_from_gt": True, "gt_size": 180})
    with pytest.raises(DataError, match=r"t1\.png is 174x195 \(HxW after mod-crop to scale 3\), smaller "
                                        r"than the 180x180 GT patch"):
        big[(0, 0)]


def test_corrupt_image_names_the_file(pair_dirs: tuple[Path, Path], tmp_path: Path) -> None:
    gt, lq = pair_dirs
    gt2 = tmp_path / "gt2"
    shutil.copytree(gt, gt2)
    (gt2 / "t2.png").write_bytes((gt / "t2.png").read_bytes()[:100])
    ds = Paired(paired_opt(gt2, lq))
    ds[(0, 0)]
    with pytest.raises(DataError, match=r"gt2/t2\.png cannot be decoded: .*corrupt.*\(100 bytes\)"):
        ds[(1, 0)]


def test_build_dataset_via_registry(pair_dirs: tuple[Path, Path]) -> None:
    gt, lq = pair_dirs
    opt = _validated(paired_opt(gt, lq, phase="val_1", gt_size=None), "PairedImageDataset")
    ds = build_dataset(opt, "datasets.val_1")
    assert isinstance(ds, PairedImageDataset) and ds.phase == "val" and ds.key_path == "datasets.val_1"
    with pytest.raises(OptionError, match=r"datasets\.train\.type: unknown dataset type 'PairedImageDatset' "
                                          r"\(did you mean 'PairedImageDataset'\?\)"):
        validate_dataset({**paired_opt(gt, lq, phase=None), "type": "PairedImageDatset", "batch_size_per_gpu": 2},
                         name="train")


# ------------------------------------------------------------------ sampler and loaders

def test_sampler_sharding_matches_one_big_batch() -> None:
    one = TrainSampler(10, batch_size=4, world_size=1, rank=0, seed=5, enlarge_ratio=3)
    r0 = TrainSampler(10, batch_size=2, world_size=2, rank=0, seed=5, enlarge_ratio=3)
    r1 = TrainSampler(10, batch_size=2, world_size=2, rank=1, seed=5, enlarge_ratio=3)
    assert one.batches_per_epoch == r0.batches_per_epoch == 7  # 30 // 4, drop_last on the global batch
    for epoch in (0, 1):
        for s in (one, r0, r1):
            s.set_epoch(epoch)
        a, b0, b1 = list(one), list(r0), list(r1)
        assert len(a) == len(one) == 28 and len(b0) == len(b1) == len(r0) == 14
        merged = [x for k in range(7) for x in b0[2 * k: 2 * k + 2] + b1[2 * k: 2 * k + 2]]
        assert merged == a  # indices and per-sample seeds identical
        assert all(0 <= i < 10 for i, _ in a) and all(0 <= sd < 2**63 for _, sd in a)
    one.set_epoch(0)
    e0 = list(one)
    one.set_epoch(1)
    assert list(one) != e0
    unshuffled = TrainSampler(5, batch_size=2, seed=0, shuffle=False)
    assert [i for i, _ in unshuffled] == [0, 1, 2, 3]


def test_sampler_resume_yields_the_tail() -> None:
    s = TrainSampler(91, batch_size=4, world_size=2, rank=1, seed=123, enlarge_ratio=2)
    s.set_epoch(3)
    full = list(s)
    s.set_epoch(3, start_batch=9)
    assert len(s) == (s.batches_per_epoch - 9) * 4
    assert list(s) == full[9 * 4:]
    assert s.position(5 * s.batches_per_epoch + 9) == (5, 9)
    s.load_state_dict({"epoch": 3, "start_batch": 20})
    assert list(s) == full[20 * 4:]
    assert s.state_dict() == {"epoch": 3, "start_batch": 20}


def test_sampler_errors() -> None:
    with pytest.raises(DataError, match=r"T91: the dataset is empty"):
        TrainSampler(0, batch_size=4, name="T91")
    with pytest.raises(DataError, match=r"datasets\.train: 5 image\(s\) x dataset_enlarge_ratio 1 = 5 "
                                        r"samples.*global batch of 8 \(batch_size_per_gpu 4 x 2 "
                                        r"rank\(s\)\)\. Raise dataset_enlarge_ratio to at least 2 or lower "
                                        r"batch_size_per_gpu"):
        TrainSampler(5, batch_size=4, world_size=2, rank=0, name="datasets.train")
    with pytest.raises(OptionError, match="rank 2 is not below world_size 2"):
        TrainSampler(10, batch_size=1, world_size=2, rank=2)


def test_train_loader_same_batches_for_any_worker_count(pair_dirs: tuple[Path, Path]) -> None:
    gt, lq = pair_dirs
    ds = Paired(paired_opt(gt, lq))
    opt = _validated(paired_opt(gt, lq, dataset_enlarge_ratio=2), "PairedImageDataset")
    workers = _validated(paired_opt(gt, lq, dataset_enlarge_ratio=2, num_worker_per_gpu=2), "PairedImageDataset")
    loader0, sampler0 = build_train_loader(ds, opt, batch_size=2, world_size=1, rank=0, seed=9)
    loader2, _ = build_train_loader(ds, workers, batch_size=2, world_size=1, rank=0, seed=9)
    b0, b2 = list(loader0), list(loader2)
    assert len(b0) == len(b2) == len(loader0) == sampler0.batches_per_epoch == 6
    for x, y in zip(b0, b2):
        assert torch.equal(x["gt"], y["gt"]) and torch.equal(x["lq"], y["lq"])
        assert x["gt_path"] == y["gt_path"]
    assert b0[0]["gt"].shape == (2, 3, 32, 32) and isinstance(b0[0]["lq_path"], list)
    # resuming at global step 6 + 4 = epoch 1, batch 4 gives the tail of epoch 1
    resumed, rs = build_train_loader(ds, opt, batch_size=2, world_size=1, rank=0, seed=9, start_iter=10)
    assert (rs.epoch, rs.start_batch) == (1, 4)
    tail = list(resumed)
    sampler0.set_epoch(1)
    full = list(loader0)
    assert len(tail) == 2 and all(torch.equal(a["gt"], b["gt"]) for a, b in zip(tail, full[4:]))
    with pytest.raises(DataError, match=r"datasets\.train: 6 image\(s\).*global batch of 8"):
        build_train_loader(ds, _validated(paired_opt(gt, lq), "PairedImageDataset"), batch_size=8, world_size=1,
                           rank=0, seed=0)


def test_eval_loader_pads_every_rank_to_the_same_length() -> None:
    vopt = _validated({"dataroot_gt": str(SET5), "lq_from_gt": True, "scale": 4, "phase": "val"},
                      "PairedImageDataset")
    ds = PairedImageDataset(vopt)
    assert len(ds) == 5
    loaders = [build_eval_loader(ds, vopt, world_size=2, rank=r) for r in (0, 1)]
    assert [idx for _, idx in loaders] == [[0, 2, 4], [1, 3, 0]]
    seen = []
    for loader, _ in loaders:
        batches = list(loader)
        assert len(batches) == 3
        for b in batches:
            assert b["lq"].shape[0] == 1 and isinstance(b["pad"], list)
            if not b["pad"][0]:
                seen.append(b["index"][0])
        expected = [False] * 3 if loader is loaders[0][0] else [False, False, True]
        assert [b["pad"][0] for b in batches] == expected
    assert sorted(seen) == list(range(5))
    alone, idx = build_eval_loader(ds, vopt, world_size=1, rank=0)
    first = next(iter(alone))
    assert idx == [0, 1, 2, 3, 4] and first["lq"].shape == (1, 3, 128, 128)
    assert Path(first["lq_path"][0]).name == "baby.png"


def test_collate_keeps_lists() -> None:
    items = [{"lq": torch.zeros(3, 2, 2), "lq_path": "a.png", "gray": False},
             {"lq": torch.ones(3, 2, 2), "lq_path": "b.png", "gray": True}]
    out = collate(items)
    assert out["lq"].shape == (2, 3, 2, 2)
    assert out["lq_path"] == ["a.png", "b.png"] and out["gray"] == [False, True]


def test_no_global_rng_is_used(pair_dirs: tuple[Path, Path]) -> None:
    gt, lq = pair_dirs
    ds = Paired(paired_opt(gt, lq))
    np.random.seed(0)
    torch.manual_seed(0)
    before = (np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    ds[(0, 5)]
    list(TrainSampler(6, batch_size=2, seed=1))
    assert np.array_equal(np.random.get_state()[1], before[0])
    assert torch.equal(torch.get_rng_state(), before[1])


def test_loaders_leave_the_global_torch_rng_alone(pair_dirs: tuple[Path, Path]) -> None:
    gt, lq = pair_dirs
    ds = Paired(paired_opt(gt, lq))
    torch.manual_seed(0)
    before = torch.get_rng_state().clone()
    opt = _validated(paired_opt(gt, lq), "PairedImageDataset")
    loader, _ = build_train_loader(ds, opt, batch_size=2, world_size=1, rank=0, seed=4, start_iter=1)
    next(iter(loader))
    val, _ = build_eval_loader(ds, opt, world_size=1, rank=0)
    next(iter(val))
    assert torch.equal(torch.get_rng_state(), before)


def test_remaining_error_messages(tmp_path: Path, pair_dirs: tuple[Path, Path]) -> None:
    gt, lq = pair_dirs
    img = cv2.imread(str(T91 / "t5.png"), cv2.IMREAD_UNCHANGED)
    (tmp_path / "adir.png").mkdir()
    tiff = cv2.imencode(".tiff", img.astype(np.float32) / 255)[1].tobytes()
    empty_meta = tmp_path / "empty_meta.txt"
    empty_meta.write_text("\n")
    dup = tmp_path / "dup"
    shutil.copytree(lq, dup)
    cv2.imwrite(str(dup / "t1x2.jpg"), img)
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    cv2.imwrite(str(tiny / "tiny.png"), img[:3, :3])
    ds = Paired(paired_opt(gt, lq))
    cases = [
        (lambda: decode_uint8(b"", "x.png"), DataError, r"x\.png is empty \(0 bytes\)"),
        (lambda: decode_uint8(b"x", "x.png", flag="rgb"), OptionError, r"unknown image read mode 'rgb'"),
        (lambda: decode_uint8(tiff, "f.tiff"), DataError, r"f\.tiff: unsupported pixel type float32"),
        (lambda: DiskBackend(tmp_path / "nope").keys(), DataError, r"nope: image folder not found"),
        (lambda: DiskBackend(tmp_path).get("adir.png"), DataError, r"adir\.png: cannot read the image file"),
        (lambda: mod_crop(img, 0), OptionError, r"mod_crop: scale must be a positive integer, got 0"),
        (lambda: paired_random_crop([], [], 4, 2, np.random.default_rng(0)), DataError, r"no images given"),
        (lambda: img2tensor(np.zeros((4, 4, 4), np.uint8)), DataError, r"expected an HW or HWC \(3 chan"),
        (lambda: tensor2img(torch.zeros(2, 3, 4, 4)), DataError, r"expected one image, got a batch of 2"),
        (lambda: tensor2img(torch.zeros(2, 4, 4)), DataError, r"expected CHW with 1 or 3 channels"),
        (lambda: bicubic_degrade(img, 0), OptionError, r"scale must be a positive integer, got 0"),
        (lambda: bicubic_degrade(img.astype(np.float32), 2), DataError, r"expected a uint8 or uint16 image, got float"),
        (lambda: Paired(paired_opt(gt, lq, mean=[0.5, 0.5], std=[1, 1, 1])), OptionError,
         r"datasets\.train\.mean: expected a list of 3 float, got 2 items"),
        (lambda: Paired(paired_opt(gt, lq, mean=[0.5] * 3, std=[1, 0, 1])), OptionError,
         r"datasets\.train\.std: every value must be > 0"),
        (lambda: Paired(paired_opt(gt, lq, meta_info_file=str(empty_meta))), DataError,
         r"datasets\.train\.meta_info_file: '.*empty_meta\.txt' lists no images"),
        (lambda: Paired(paired_opt(gt, dup)), DataError,
         r"datasets\.train\.dataroot_lq: '.*dup' holds two images with stem 't1x2': t1x2\.jpg and t1x2\.png"),
        (lambda: Paired({"dataroot_gt": str(tiny), "lq_from_gt": True, "scale": 4,
                                     "phase": "val"})[0], DataError,
         r"tiny\.png: image is smaller than scale 4"),
        (lambda: Single({}), OptionError, r"datasets\.test\.dataroot_lq: required by SingleImageDataset"),
        (lambda: TrainSampler(10, batch_size=0), OptionError, r"batch_size must be an integer >= 1, got 0"),
        (lambda: TrainSampler(10, batch_size=2).set_epoch(0, start_batch=99), OptionError,
         r"start_batch 99 is past the 5 batches of an epoch"),
        (lambda: build_eval_loader([], {}, world_size=1, rank=0), DataError,  # type: ignore[arg-type]
         r"datasets\.val: the dataset is empty"),
        (lambda: build_eval_loader(ds, {}, world_size=2, rank=2), OptionError,
         r"rank 2 / world_size 2 is not a valid position"),
    ]
    for fn, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            fn()


def test_worker_count_is_capped_at_the_usable_cores_and_said_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from anysr.data import loaders

    monkeypatch.setattr(loaders, "usable_cpus", lambda: 2)
    monkeypatch.setattr(loaders, "_SAID", set())
    said: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append(record.getMessage())

    logger, keep = logging.getLogger("anysr"), Keep()
    level = logger.level
    logger.setLevel(logging.INFO)  # setLevel, not the attribute: it clears isEnabledFor's cache (an earlier test
    logger.addHandler(keep)  # may have left "INFO is off" in it)
    try:
        assert loaders.worker_count(1) == 1 and loaders.worker_count(2) == 2
        assert loaders.worker_count(6) == 2 and loaders.worker_count(6) == 2
    finally:
        logger.removeHandler(keep)
        logger.setLevel(level)
    assert said == ["num_worker_per_gpu 6 lowered to 2: this process may use 2 CPU cores"]

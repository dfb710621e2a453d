"""Hostile and careless input, round three, the data area: odd image files, traiNNer-redux's OTF keys, LMDBs, shard
sets and `anysr prepare shards`. Every case here failed before its fix (a traceback, a message naming the wrong
thing, a silently wrong result or a setting that was ignored).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from conftest import DATASETS, run_cli, tiny_train_options, write_options

from anysr.data import build_dataset
from anysr.data.file_backends import decode_training_image
from anysr.data.imageio import decode_image, probe_bytes, probe_image
from anysr.errors import DataError, OptionError
from anysr.options import load_options, validate_dataset

T91 = DATASETS / "T91" / "HR"


def _one_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _images(folder: Path, n: int = 3) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for p in sorted(T91.glob("*.png"))[:n]:
        shutil.copy(p, folder / p.name)
    return folder


# ------------------------------------------------------------------------------- EXIF-rotated JPEG photos
def _exif_jpeg(img: np.ndarray, orientation: int, gray: bool = False) -> bytes:
    from PIL import Image

    pil = Image.fromarray(img if gray else img[:, :, ::-1])
    exif = pil.getexif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    pil.save(out, "JPEG", exif=exif, quality=95)
    return out.getvalue()


@pytest.mark.parametrize("gray", [False, True])
def test_exif_orientation_is_applied_as_viewers_and_basicsr_read_it(gray: bool) -> None:
    """A phone photo stores its pixels sideways with an Exif orientation: training, testing and inference read it
    upright (as OpenCV's IMREAD_COLOR, which BasicSR decodes with, and every viewer), and the start-up size check's
    header agrees with the decoded size. Before: read as stored (sideways), pairing it against an upright LQ."""
    from PIL import Image, ImageOps

    rng = np.random.default_rng(0)
    base = cv2.GaussianBlur(rng.integers(0, 256, (24, 40, 3)).astype(np.uint8), (0, 0), 3)
    if gray:
        base = cv2.cvtColor(base, cv2.COLOR_BGR2GRAY)
    for orientation in range(1, 9):
        data = _exif_jpeg(base, orientation, gray)
        ours = decode_image(data)
        viewer = np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))))
        viewer = viewer if gray else viewer[:, :, ::-1]
        assert np.array_equal(ours, viewer), orientation
        assert np.array_equal(ours, decode_image(data, flag="gray" if gray else "color")), orientation
        info = probe_bytes(data)
        assert (info.height, info.width) == ours.shape[:2] == ((40, 24) if orientation >= 5 else (24, 40))
        assert np.array_equal(decode_training_image(data, "x.jpg"), ours)


def test_damaged_exif_block_is_ignored() -> None:
    """An Exif block cut short or pointing past its end decodes the pixels as stored (as OpenCV does)."""
    base = np.full((8, 16, 3), 100, np.uint8)
    data = bytearray(_exif_jpeg(base, 6))
    at = data.find(b"Exif\x00\x00") + 6
    data[at + 4:at + 8] = b"\xff\xff\xff\x7f" if data[at:at + 2] == b"II" else b"\x7f\xff\xff\xff"  # IFD0 far away
    assert decode_image(bytes(data)).shape == (8, 16, 3)
    assert (probe_bytes(bytes(data)).width, probe_bytes(bytes(data)).height) == (16, 8)


# ------------------------------------------------------------------------------------------- OTF options
def _realesrgan_options(tmp: Path, **top: Any) -> Path:
    opt: dict[str, Any] = {
        "name": "otf", "model_type": "RealESRNetModel", "scale": 2, "num_gpu": 1, "manual_seed": 1,
        "high_order_degradation": True,
        "datasets": {"train": {"name": "t", "type": "RealESRGANDataset", "dataroot_gt": str(_images(tmp / "gt")),
                               "io_backend": {"type": "disk"}, "gt_size": 32, "use_hflip": True, "use_rot": False,
                               "batch_size_per_gpu": 2, "num_worker_per_gpu": 0}},
        "network_g": {"type": "SRVGGNetCompact", "num_feat": 8, "num_conv": 2, "upscale": 2},
        "path": {"pretrain_network_g": None},
        "train": {"optim_g": {"type": "Adam", "lr": 1e-3}, "total_iter": 2,
                  "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0}},
        **top,
    }
    return write_options(tmp / "o.yml", opt)


@pytest.mark.parametrize("change, key", [
    ({"resize_mode_list": []}, "resize_mode_list"),
    ({"resize_mode_list": ["bicubic"], "resize_mode_prob": []}, "resize_mode_prob"),
    ({"resize_mode_list2": [], "resize_mode_prob2": []}, "resize_mode_list2"),
    ({"resize_mode_list3": "bicubic"}, "resize_mode_list3"),
])
def test_empty_or_scalar_resize_mode_lists_are_option_errors(tmp_path: Path, change: dict[str, Any],
                                                             key: str) -> None:
    """Before: TypeError ('_Missing' object is not iterable) from the cross-key check after the field's own
    problem was recorded."""
    with pytest.raises(OptionError, match=key):
        load_options(_realesrgan_options(tmp_path, **change), [f"path.root={tmp_path}"], is_train=True)


# -------------------------------------------------------------------------------------------------- LMDB
@pytest.fixture(scope="module")
def lmdb_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("lmdb")
    from anysr.engine.prepare.command import make_lmdb

    root = tmp_path_factory.mktemp("lmdb")
    return Path(make_lmdb(_images(root / "gt"), root / "gt.lmdb"))


def _single(root: Path, io_type: str) -> Any:
    return build_dataset(validate_dataset({"type": "SingleImageDataset", "dataroot_lq": str(root),
                                           "io_backend": {"type": io_type}}, name="test", scale=2), "datasets.test")


def test_lmdb_key_listed_but_absent_suggests_nothing_silly(tmp_path: Path, lmdb_set: Path) -> None:
    """Before: "key 'ghost' not in the LMDB (did you mean 'ghost'?)": the key's own name from meta_info.txt."""
    db = tmp_path / "extra.lmdb"
    shutil.copytree(lmdb_set, db)
    with open(db / "meta_info.txt", "a") as f:
        f.write("ghost.png (10,10,3) 1\n")
    problems = _single(db, "lmdb").check(decode=False, progress=False)
    assert len(problems) == 1 and "key 'ghost': key not in the LMDB;" in problems[0], problems


def test_damaged_lmdb_is_one_problem_not_one_per_image(tmp_path: Path, lmdb_set: Path) -> None:
    """Before: the start-up check listed the same 'data.mdb is truncated' line once per image (20 lines, then
    "... and N more" for a real set)."""
    db = tmp_path / "cut.lmdb"
    shutil.copytree(lmdb_set, db)
    os.truncate(db / "data.mdb", 8192)
    problems = _single(db, "lmdb").check(decode=False, progress=False)
    assert len(problems) == 1 and "data.mdb is truncated or damaged" in problems[0], problems


def test_empty_lmdb_listing_and_lmdb_read_as_a_folder_say_what_to_do(tmp_path: Path, lmdb_set: Path) -> None:
    """Before: "no images (.png, ...) in 'x.lmdb'" for both, which does not say that the LMDB's meta_info.txt is
    empty, or that the folder is an LMDB read with io_backend type disk."""
    db = tmp_path / "empty.lmdb"
    shutil.copytree(lmdb_set, db)
    (db / "meta_info.txt").write_text("")
    with pytest.raises(DataError, match="meta_info.txt lists no keys: rebuild it"):
        _single(db, "lmdb")
    with pytest.raises(DataError, match=r"it is an LMDB: set io_backend: \{type: lmdb\}"):
        _single(lmdb_set, "disk")


# ------------------------------------------------------------------------------------- shards: BSRGAN's
def test_bsrgan_dataset_reads_shards_with_its_storage_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: BSRGANDataset built its shard backend without io_backend's storage_options and cache: an S3
    endpoint given there was ignored (the run went to AWS itself) and cache_dir was never used."""
    pytest.importorskip("webdataset")
    pytest.importorskip("fsspec")
    from anysr.data import shards
    from anysr.engine.prepare.command import make_shards

    make_shards(_images(tmp_path / "gt"), str(tmp_path / "set"), progress=False)
    seen: list[Any] = []
    real = shards.ShardSet.__init__

    def spy(self: Any, root: str, storage_options: Any = None) -> None:
        seen.append(storage_options)
        real(self, root, storage_options)

    monkeypatch.setattr(shards.ShardSet, "__init__", spy)
    monkeypatch.setattr(shards, "_SETS", {}, raising=False)
    section = {"type": "BSRGANDataset", "dataroot_gt": str(tmp_path / "set"), "gt_size": 32,
               "io_backend": {"type": "shards", "storage_options": {"auto_mkdir": False},
                              "cache_dir": str(tmp_path / "cache")}, "batch_size_per_gpu": 1}
    ds = build_dataset(validate_dataset(section, name="train", scale=4), "datasets.train")
    assert {"auto_mkdir": False}.items() <= dict(seen[-1] or {}).items()
    assert ds[(0, 3)]["gt"].shape == (3, 32, 32)
    assert any((tmp_path / "cache").rglob("*")), "the shard cache was not used"


# -------------------------------------------------------------------------------- anysr prepare shards
@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("webdataset")
    pytest.importorskip("fsspec")
    return _images(tmp_path_factory.mktemp("shard_src") / "gt", 2)


def test_prepare_shards_refuses_a_scheme_it_cannot_write(tmp_path: Path, src: Path) -> None:
    """Before: ftp:// went to fsspec's FTP client: 'Name or service not known', naming no URL."""
    from anysr.engine.prepare.command import make_shards

    for out in ("ftp://host/set", "https://host/set"):
        with pytest.raises(DataError, match=r"cannot write to (ftp|https)://; write to a local folder or to s3://"):
            make_shards(src, out, progress=False)


def test_prepare_shards_into_a_file_says_it_is_a_file(tmp_path: Path, src: Path) -> None:
    """Before: "afile exists and is not empty; delete it": the output is a file, not a folder."""
    from anysr.engine.prepare.command import make_shards

    (tmp_path / "afile").write_text("x")
    with pytest.raises(DataError, match="OUT .*afile is a file; give a new or empty folder"):
        make_shards(src, str(tmp_path / "afile"), progress=False)


def test_prepare_shards_to_unreachable_s3_is_one_line(tmp_path: Path, src: Path) -> None:
    """Before: a botocore traceback (EndpointConnectionError, NoCredentialsError) from the first write."""
    pytest.importorskip("s3fs")
    opts = json.dumps({"endpoint_url": "http://127.0.0.1:9", "key": "a", "secret": "b"})
    proc = run_cli("prepare", "shards", str(src), "s3://bucket/set", "--storage-options", opts, cwd=tmp_path,
                   check=False, timeout=120)
    line = _one_line(proc.stderr)
    assert proc.returncode == 2 and "cannot write to s3://bucket/set (EndpointConnectionError" in line, line
    assert "--storage-options.endpoint_url" in line, line


def test_prepare_shards_storage_options_the_file_system_refuses(tmp_path: Path, src: Path) -> None:
    """Before: a TypeError traceback (AioSession got an unexpected keyword argument) from the first S3 call."""
    pytest.importorskip("s3fs")
    from anysr.engine.prepare.command import make_shards

    opts = {"endpoint_url": "http://127.0.0.1:9", "key": "a", "secret": "b", "bogus_kw": 1}
    with pytest.raises(DataError, match=r"--storage-options are not accepted by the file system of s3://b/set "
                                        r"\(.*bogus_kw"):
        make_shards(src, "s3://b/set", storage_options=opts, progress=False)


def test_prepare_shards_write_failure_names_the_output(tmp_path: Path, src: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing write (here a local one refused by the file system) names the output and what to check."""
    import fsspec.implementations.local as local

    from anysr.engine.prepare.command import make_shards

    def refuse(self: Any, path: str, mode: str = "rb", **kw: Any) -> Any:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(local.LocalFileSystem, "_open", refuse)
    with pytest.raises(DataError, match=r"prepare shards: cannot write to .*out \(PermissionError"):
        make_shards(src, str(tmp_path / "out"), progress=False)


def test_probe_image_of_an_exif_rotated_file(tmp_path: Path) -> None:
    """The start-up check reads headers only: a rotated photo's header size is its upright size."""
    (tmp_path / "p.jpg").write_bytes(_exif_jpeg(np.full((10, 30, 3), 50, np.uint8), 8))
    info = probe_image(tmp_path / "p.jpg")
    assert (info.width, info.height) == (10, 30)


def test_a_one_pixel_image_in_a_degradation_set_says_how_to_fix_it(tmp_path: Path) -> None:
    """Before: "x.png is 1x1; it cannot be reflect-padded" (what to do was left out)."""
    gt = _images(tmp_path / "gt", 2)
    cv2.imwrite(str(gt / "x.png"), np.zeros((1, 1, 3), np.uint8))
    section = {"type": "BSRGANDataset", "dataroot_gt": str(gt), "gt_size": 32, "io_backend": {"type": "disk"},
               "batch_size_per_gpu": 1}
    problems = build_dataset(validate_dataset(section, name="train", scale=4), "datasets.train").check(
        decode=False, progress=False)
    assert len(problems) == 1 and "x.png is 1x1" in problems[0] and "remove it from the folder" in problems[0]


# ----------------------------------------------------------------------------- prepare lmdb / subimages
def _float_tiff_folder(tmp: Path) -> Path:
    folder = _images(tmp / "floats", 1)
    cv2.imwrite(str(folder / "x.tif"), np.full((40, 40, 3), 0.5, np.float32))
    return folder


def test_prepare_lmdb_refuses_float_images_instead_of_storing_them_black(tmp_path: Path) -> None:
    """Before: a [0, 1] float32 TIFF was stored as an 8-bit PNG of 0s and 1s (black), and trained on."""
    pytest.importorskip("lmdb")
    from anysr.engine.prepare.command import make_lmdb

    with pytest.raises(DataError, match=r"prepare lmdb: .*x.tif \(float32\) to an 8- or 16-bit PNG"):
        make_lmdb(_float_tiff_folder(tmp_path), tmp_path / "out.lmdb", progress=False)
    assert not (tmp_path / "out.lmdb").exists()


def test_prepare_lmdb_leaves_nothing_behind_when_an_image_fails(tmp_path: Path) -> None:
    """Before: an unreadable image half-way left a half-written out.lmdb (data.mdb, no meta_info.txt), which the
    next run refused as existing. Now the LMDB is written under a temporary name and renamed when complete."""
    pytest.importorskip("lmdb")
    from anysr.engine.prepare.command import make_lmdb

    folder = _images(tmp_path / "in", 2)
    (folder / "zz.png").write_bytes(b"")  # found by the header check, before anything is written
    with pytest.raises(DataError, match="zz.png is empty"):
        make_lmdb(folder, tmp_path / "a.lmdb", progress=False)
    data = bytearray((folder / sorted(p.name for p in folder.glob("t*.png"))[0]).read_bytes())
    idat = data.find(b"IDAT")
    data[idat + 40] ^= 0xFF  # the pixel data fails its checksum: found only when decoded, after the first image
    (folder / "zz.png").write_bytes(bytes(data))
    with pytest.raises(DataError, match="zz.png cannot be decoded"):
        make_lmdb(folder, tmp_path / "b.lmdb", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]
    assert make_lmdb(_images(tmp_path / "ok", 1), tmp_path / "c.lmdb", progress=False).is_dir()


def test_prepare_subimages_refuses_float_images_before_writing(tmp_path: Path) -> None:
    """Before: crops of the other images were written, then write_image stopped on the float one with advice for
    Python code (np.clip(...)), leaving a half-filled output folder."""
    from anysr.engine.prepare.command import extract_subimages

    with pytest.raises(DataError, match=r"prepare subimages: .*x.tif \(float32\)"):
        extract_subimages(_float_tiff_folder(tmp_path), tmp_path / "out", 32, 16, 0, progress=False)
    assert not (tmp_path / "out").exists()


def test_a_mirror_that_is_not_a_url_is_refused_up_front(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "downloading benchmark.tar from notaurl/benchmark.tar failed (ValueError: unknown url type ...);
    check the network", twice (the warning, then the error), for a mirror given as a plain path."""
    from anysr.engine.prepare.fetch import fetch_dataset

    monkeypatch.delenv("ANYSR_OFFLINE", raising=False)
    for mirror in ("notaurl", "/data/mirror"):
        with pytest.raises(OptionError, match=f"--mirror / ANYSR_DATASET_MIRROR: '{mirror}' is not a URL"):
            fetch_dataset("benchmark", tmp_path, mirror=mirror, progress=False)


# ------------------------------------------------------------------------------------------ meta info files
_BOM = b"\xef\xbb\xbf"


def test_meta_info_saved_with_a_bom_reads_its_first_name(tmp_path: Path, lmdb_set: Path) -> None:
    """A meta info file saved by Notepad starts with a UTF-8 BOM. Before: the first name became '\\ufefft1' ("1 GT
    image(s) listed but not found: t1.png" with an invisible character; for an LMDB "key not in the LMDB (did you
    mean 't12'?)")."""
    gt = _images(tmp_path / "gt", 2)
    names = sorted(p.name for p in gt.iterdir())
    meta = tmp_path / "meta.txt"
    meta.write_bytes(_BOM + "".join(f"{n} (1,1,3)\r\n" for n in names).encode())
    section = {"type": "PairedImageDataset", "dataroot_gt": str(gt), "lq_from_gt": True, "meta_info_file": str(meta),
               "io_backend": {"type": "disk"}}
    ds = build_dataset(validate_dataset(section, name="val", scale=2), "datasets.val")
    assert len(ds) == 2 and ds.check(decode=False, progress=False) == []
    db = tmp_path / "bom.lmdb"
    shutil.copytree(lmdb_set, db)
    (db / "meta_info.txt").write_bytes(_BOM + (lmdb_set / "meta_info.txt").read_bytes())
    assert _single(db, "lmdb").check(decode=False, progress=False) == []


def test_real_esrgan_pair_list_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    """Before: a UnicodeDecodeError traceback from RealESRGANPairedDataset's meta_info reader."""
    gt = _images(tmp_path / "gt", 2)
    meta = tmp_path / "pairs.txt"
    meta.write_bytes(b"\xff\xfe\x00binary")
    section = {"type": "RealESRGANPairedDataset", "dataroot_gt": str(gt), "dataroot_lq": str(gt),
               "meta_info": str(meta), "io_backend": {"type": "disk"}, "gt_size": 32, "batch_size_per_gpu": 1}
    with pytest.raises(DataError, match=r"pairs.txt' is not UTF-8 text .*re-create it"):
        build_dataset(validate_dataset(section, name="train", scale=1), "datasets.train")


def test_video_meta_info_that_is_not_text_is_one_line(tmp_path: Path) -> None:
    """Before: a UnicodeDecodeError traceback from the video datasets' clip list reader."""
    from video_data import make_reds

    reds = make_reds(tmp_path / "reds", clips=("000", "001"), frames=4)
    Path(reds["meta"]).write_bytes(b"\xff\xfe\x00binary")
    section = {"type": "REDSRecurrentDataset", "io_backend": {"type": "disk"}, "dataroot_gt": str(reds["gt"]),
               "lq_from_gt": True, "meta_info_file": str(reds["meta"]), "val_partition": "official", "gt_size": 32,
               "num_frame": 2, "batch_size_per_gpu": 1}
    with pytest.raises(DataError, match="is not UTF-8 text"):
        build_dataset(validate_dataset(section, name="train", scale=4), "datasets.train")


def test_a_shard_file_given_as_the_set_names_its_folder(tmp_path: Path) -> None:
    """Before: "'.../shard-000000.tar' holds no index.json: not a shard set; write one ..." for the set's own
    shard, as if it were a folder."""
    (tmp_path / "set").mkdir()
    (tmp_path / "set" / "shard-000000.tar").write_bytes(b"\0" * 1024)
    section = {"type": "PairedImageDataset", "dataroot_gt": str(tmp_path / "set" / "shard-000000.tar"),
               "lq_from_gt": True, "io_backend": {"type": "shards"}}
    with pytest.raises(OptionError, match=r"shard-000000.tar' is a file, not a shard set; point it at the set's "
                                          r"folder \(.*set if it holds index.json\)"):
        validate_dataset(section, name="val", scale=2)


@pytest.mark.parametrize("field, value, message", [
    ("filesize", None, "has filesize None, not a byte count"),
    ("filesize", "big", "has filesize 'big', not a byte count"),
    ("offset", -4000, "has malformed member entries"),
    ("size", -10, "has malformed member entries"),
    ("width", 0, "has malformed member entries"),
])
def test_a_hostile_shard_index_entry_is_refused_when_read(tmp_path: Path, src: Path, field: str, value: Any,
                                                         message: str) -> None:
    """Before: filesize null / 'big' was a TypeError / ValueError traceback; a negative offset or size was read as
    'cannot read sample (ValueError: read length must be non-negative); check the path'; a 0x0 header was
    'remove it from the folder'."""
    from anysr.data import shards
    from anysr.engine.prepare.command import make_shards

    make_shards(src, str(tmp_path / "set"), progress=False)
    index = json.loads((tmp_path / "set" / "index.json").read_text())
    shard = index["shardlist"][0]
    member = shard["samples"][sorted(shard["samples"])[0]]["gt.png"]
    if field == "filesize":
        shard["filesize"] = value
    else:
        member[{"offset": 0, "size": 1, "width": 3}[field]] = value
    (tmp_path / "set" / "index.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match=message):
        shards.ShardSet(str(tmp_path / "set"))


@pytest.mark.parametrize("template", ["x4", "{}x4{}", "{name}x4", "{"])
def test_prepare_shards_filename_template_without_one_stem_slot(tmp_path: Path, src: Path, template: str) -> None:
    """Before: '{}x4{}' was an IndexError traceback, '{name}x4' a KeyError one, 'x4' a list of unmatched pairs
    each 'expected LQ x4.*'."""
    from anysr.engine.prepare.command import make_shards

    with pytest.raises(DataError, match="--filename-tmpl .* must hold '{}' exactly once"):
        make_shards(src, str(tmp_path / "out"), lq=src, filename_tmpl=template, progress=False)


@pytest.mark.parametrize("template", ["{}x4{name}", "{}x4}", "{}x4{"])
def test_filename_tmpl_with_other_braces_is_an_option_error(template: str) -> None:
    """Before: accepted by the options check (it counted '{}' only), then a KeyError / ValueError traceback from
    str.format when the dataset paired its folders."""
    section = {"type": "PairedImageDataset", "dataroot_gt": str(T91), "dataroot_lq": str(T91),
               "filename_tmpl": template, "io_backend": {"type": "disk"}}
    with pytest.raises(OptionError, match=r"filename_tmpl: must contain '\{\}' exactly once .*and no other braces"):
        validate_dataset(section, name="val", scale=1)


def test_bsrgan_dataset_as_a_validation_set_is_refused_by_the_options(tmp_path: Path) -> None:
    """Before: accepted, then a KeyError ('gray') traceback at the first validation (its items are training
    pairs, without what the evaluator reads), after the training iterations before it had run."""
    section = {"type": "BSRGANDataset", "dataroot_gt": str(T91), "gt_size": 32, "io_backend": {"type": "disk"}}
    with pytest.raises(OptionError, match="datasets.val.type: BSRGANDataset is a training set .* validate with "
                                          "PairedImageDataset"):
        validate_dataset(section, name="val", scale=4)


@pytest.mark.parametrize(("section", "key", "value"), [("datasets.train", "dataroot_lq_prob", 0.5),
                                                       ("train", "manual_seed", 3)])
def test_a_top_level_key_inside_a_section_says_where_it_belongs(tmp_path: Path, section: str, key: str,
                                                                 value: Any) -> None:
    """traiNNer-redux's dataroot_lq_prob written under the training set got "did you mean 'dataroot_lq'?"."""
    opt = tiny_train_options("x", DATASETS / "Set5" / "HR", None)
    place = opt
    for part in section.split("."):
        place = place[part]
    place[key] = value
    with pytest.raises(OptionError) as info:
        load_options(write_options(tmp_path / "o.yml", opt), [f"path.root={tmp_path}"], is_train=True)
    assert f"{section}.{key}: {key} is a top-level key, not one of {section}: move it to the file's first level" \
        in str(info.value) and "did you mean" not in str(info.value)


def test_swapped_gt_and_lq_folders_are_suggested(tmp_path: Path) -> None:
    """Before: one "do not pair" line per image, without saying that the LQ is the larger of the two."""
    hr, lr = tmp_path / "hr", tmp_path / "lr"
    hr.mkdir(), lr.mkdir()
    for k in range(2):
        img = np.random.default_rng(k).integers(0, 256, (64, 48, 3), dtype=np.uint8)
        cv2.imwrite(str(hr / f"{k}.png"), img)
        cv2.imwrite(str(lr / f"{k}.png"), cv2.resize(img, (24, 32), interpolation=cv2.INTER_AREA))
    section = {"type": "PairedImageDataset", "dataroot_gt": str(lr), "dataroot_lq": str(hr), "gt_size": 16,
               "io_backend": {"type": "disk"}, "batch_size_per_gpu": 1}
    problems = build_dataset(validate_dataset(section, name="train", scale=2), "datasets.train").check(
        decode=False, progress=False)
    assert problems and all("are dataroot_gt and dataroot_lq swapped?" in p for p in problems)
    section.update(dataroot_gt=str(hr), dataroot_lq=str(lr))
    assert build_dataset(validate_dataset(section, name="train", scale=2), "datasets.train").check(
        decode=False, progress=False) == []

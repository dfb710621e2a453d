"""Image files, bicubic LR preparation, DIV2K-style sub-images and BasicSR-layout LMDB."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from anysr.data.imageio import decode_image, list_images, read_image, write_image
from anysr.data.transforms import mod_crop
from anysr.engine.prepare import command as prep
from anysr.engine.prepare.command import extract_subimages, make_lmdb, prepare_lr, prepare_modcrop
from anysr.errors import DataError, OptionError
from anysr.ops.imresize import imresize

DATASETS = Path(__file__).resolve().parents[1] / "datasets"


def E(path: object) -> str:
    """A path as a regular expression that matches it literally."""
    return re.escape(str(path))


def _noise(h: int, w: int, c: int | None = 3, seed: int = 0) -> np.ndarray:
    shape = (h, w) if c is None else (h, w, c)
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _truncated_png(path: Path) -> Path:
    ok, buf = cv2.imencode(".png", _noise(32, 32))
    assert ok
    path.write_bytes(buf.tobytes()[: buf.size // 2])
    return path


# ------------------------------------------------------------------------------------------ imageio
def test_write_then_read_round_trip(tmp_path: Path) -> None:
    colour, gray = _noise(9, 7), _noise(9, 7, None, seed=1)
    p = write_image(tmp_path / "sub" / "c.png", colour)
    assert p == tmp_path / "sub" / "c.png"
    assert np.array_equal(read_image(p), colour)
    write_image(tmp_path / "g.png", gray)
    assert read_image(tmp_path / "g.png").shape == (9, 7)
    assert read_image(tmp_path / "g.png", flag="color").shape == (9, 7, 3)
    assert read_image(p, flag="gray").shape == (9, 7)
    deep = (colour.astype(np.uint16) * 257)
    write_image(tmp_path / "d.png", deep)
    assert np.array_equal(read_image(tmp_path / "d.png"), deep)
    write_image(p, gray)  # replaced in place; no temporary files left behind
    assert sorted(x.name for x in (tmp_path / "sub").iterdir()) == ["c.png"]
    assert read_image(p).ndim == 2
    assert list_images(tmp_path) == [tmp_path / "d.png", tmp_path / "g.png"]
    assert np.array_equal(decode_image(p.read_bytes()), gray)


def test_read_image_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.png"
    with pytest.raises(DataError, match=rf"image {E(missing)} not found; check the path"):
        read_image(missing)
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=rf"image {E(empty)} is empty \(0 bytes\); re-create or re-download"):
        read_image(empty)
    broken = _truncated_png(tmp_path / "broken.png")
    with pytest.raises(DataError, match=rf"image {E(broken)} cannot be decoded: the file is truncated, "
                                        r"corrupt or not an image \(\d+ bytes\); re-create or re-download"):
        read_image(broken)
    text = tmp_path / "notes.png"
    text.write_text("hello")
    with pytest.raises(DataError, match=rf"image {E(text)} cannot be decoded"):
        read_image(text)
    with pytest.raises(DataError, match=rf"image {E(tmp_path)} is a folder, not a file"):
        read_image(tmp_path)
    with pytest.raises(OptionError, match=r"flag: unknown image read mode 'rgb'; use one of unchanged, "
                                          r"color, gray"):
        read_image(broken, flag="rgb")
    with pytest.raises(DataError, match=r"image lmdb:key cannot be decoded"):
        decode_image(b"\x89PNG garbage", source="lmdb:key")
    with pytest.raises(DataError, match=rf"image folder {E(missing)}: it does not exist; check the path"):
        list_images(missing)


def test_write_image_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"expected a uint8 or uint16 image, got float32; convert it, e\.g\."):
        write_image(tmp_path / "f.png", np.zeros((4, 4, 3), dtype=np.float32))
    with pytest.raises(DataError, match=r"expected an HW or HWC image with 1, 3 or 4 channels, got shape "
                                        r"\(4, 4, 2\)"):
        write_image(tmp_path / "c2.png", np.zeros((4, 4, 2), dtype=np.uint8))
    with pytest.raises(DataError, match=r"OpenCV cannot encode a uint8 \(4, 4, 3\) image as '\.xyz'; use a "
                                        r"\.png"):
        write_image(tmp_path / "a.xyz", np.zeros((4, 4, 3), dtype=np.uint8))
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------------------- bicubic LR
def test_modcrop() -> None:
    img = _noise(11, 14)
    assert mod_crop(img, 4).shape == (8, 12, 3)
    assert np.array_equal(mod_crop(img, 4), img[:8, :12])
    assert mod_crop(img[..., 0], 3).shape == (9, 12)
    with pytest.raises(OptionError, match=r"mod_crop: scale must be a positive integer, got 2\.5"):
        mod_crop(img, 2.5)  # type: ignore[arg-type]


def test_prepare_lr_is_rounded_matlab_bicubic(tmp_path: Path) -> None:
    hr = tmp_path / "hr"
    write_image(hr / "a.png", _noise(23, 18))
    write_image(hr / "b.png", _noise(16, 13, None, seed=2))  # grayscale stays grayscale
    (hr / "readme.txt").write_text("not an image")
    out = prepare_lr(hr, tmp_path / "lr", 3, progress=False)
    assert out == [tmp_path / "lr" / "a.png", tmp_path / "lr" / "b.png"]
    a = read_image(out[0])
    assert a.shape == (7, 6, 3) and a.dtype == np.uint8
    expected = np.clip(np.round(imresize(read_image(hr / "a.png")[:21, :18], 1 / 3)), 0, 255)
    assert np.array_equal(a, expected.astype(np.uint8))
    assert read_image(out[1]).shape == (5, 4)
    mc = prepare_modcrop(hr, tmp_path / "mc", 3, progress=False)
    assert [read_image(p).shape for p in mc] == [(21, 18, 3), (15, 12)]
    assert np.array_equal(read_image(mc[0]), read_image(hr / "a.png")[:21, :18])
    before = (tmp_path / "lr" / "a.png").read_bytes()
    with pytest.raises(DataError, match=r"anysr prepare lr --out: .*lr is not empty; delete it or choose another"):
        prepare_lr(hr, tmp_path / "lr", 2, progress=False)  # as the other prepare commands: nothing overwritten
    with pytest.raises(DataError, match=r"mc is not empty"):
        prepare_modcrop(hr, tmp_path / "mc", 2, progress=False)
    assert (tmp_path / "lr" / "a.png").read_bytes() == before


def test_prepare_lr_on_set5_matches_direct_resize(tmp_path: Path) -> None:
    out = prepare_lr(DATASETS / "Set5" / "HR", tmp_path, 4, progress=False)
    assert [p.name for p in out] == ["baby.png", "bird.png", "butterfly.png", "head.png", "woman.png"]
    woman = read_image(DATASETS / "Set5" / "HR" / "woman.png")
    assert read_image(tmp_path / "woman.png").shape == (86, 57, 3)  # 228x344 -> mod-crop 228x344 -> 57x86
    assert np.array_equal(read_image(tmp_path / "woman.png"),
                          np.clip(np.round(imresize(woman, 0.25)), 0, 255).astype(np.uint8))


def test_prepare_lr_errors_name_the_culprit(tmp_path: Path) -> None:
    hr = tmp_path / "hr"
    write_image(hr / "ok.png", _noise(8, 8))
    with pytest.raises(OptionError, match=r"scale: must be a positive integer such as 2, 3 or 4, got 0"):
        prepare_lr(hr, tmp_path / "lr", 0, progress=False)
    with pytest.raises(OptionError, match=rf"output folder {E(hr)} is the input folder; choose another one"):
        prepare_lr(hr, hr, 2, progress=False)
    with pytest.raises(DataError, match=rf"image folder {E(tmp_path / 'none')}: it does not exist"):
        prepare_lr(tmp_path / "none", tmp_path / "lr", 2, progress=False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"empty holds no image files \(png, jpg, bmp, tif, webp\); check the "
                                        r"path"):
        prepare_lr(tmp_path / "empty", tmp_path / "lr", 2, progress=False)
    with pytest.raises(DataError, match=rf"image {E(hr / 'ok.png')} is 8x8, smaller than the scale 9; "
                                        r"remove it"):
        prepare_lr(hr, tmp_path / "lr", 9, progress=False)
    broken = _truncated_png(hr / "zz_broken.png")
    with pytest.raises(DataError, match=rf"(?s)nothing was written.*{E(broken)} is truncated"):
        prepare_lr(hr, tmp_path / "lr", 2, progress=False)
    broken.unlink()
    cv2.imwrite(str(hr / "float.tiff"), np.zeros((8, 8), dtype=np.float32))
    with pytest.raises(DataError, match=r"float\.tiff has float32 pixels; only 8- or 16-bit integer images"):
        prepare_lr(hr, tmp_path / "lr", 2, progress=False)
    assert not (tmp_path / "lr").exists() or not any((tmp_path / "lr").iterdir())  # checked before any writing


# ------------------------------------------------------------------------------------- sub-images
def test_extract_subimages_follows_basicsr_layout(tmp_path: Path) -> None:
    src = tmp_path / "src"
    img = _noise(100, 70)
    write_image(src / "0001x2.png", img)  # DIV2K LR naming: the x2 suffix is dropped
    write_image(src / "photo.png", img[:, :, 0])
    out = extract_subimages(src, tmp_path / "sub", 40, 20, 5, n_thread=2, progress=False).written
    # rows start at 0, 20, 40, 60 (nothing left over); columns at 0, 20 and, as 10 > 5 pixels remain, 30.
    names = sorted(p.name for p in out)
    assert names[:12] == [f"0001_s{i:03d}.png" for i in range(1, 13)]
    assert len(names) == 24 and names[-1] == "photo_s012.png"
    assert np.array_equal(read_image(tmp_path / "sub" / "0001_s003.png"), img[0:40, 30:70])
    assert np.array_equal(read_image(tmp_path / "sub" / "0001_s004.png"), img[20:60, 0:40])
    assert np.array_equal(read_image(tmp_path / "sub" / "photo_s012.png"), img[60:100, 30:70, 0])
    fewer = extract_subimages(src, tmp_path / "sub2", 40, 20, 10, progress=False)
    assert len(fewer.written) == 16 and fewer.images == 2 and fewer.skipped == []  # 10 left over is not > 10


def test_extract_subimages_checks_everything_before_writing(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_image(src / "big.png", _noise(60, 60))
    write_image(src / "small.png", _noise(30, 50))
    report = extract_subimages(src, tmp_path / "sub", 40, 20, 5, progress=False)
    assert report.images == 1 and report.skipped == [src / "small.png"] and len(report.written) == 4
    with pytest.raises(DataError, match=r"sub is not empty; delete it or choose another output folder"):
        extract_subimages(src, tmp_path / "sub", 40, 20, 5, progress=False)
    (src / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    (src / "empty.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"(?s)2 of 4 images cannot be read \(nothing was written\).*broken.png "
                       r"has a damaged header.*empty.png is empty"):
        extract_subimages(src, tmp_path / "sub3", 40, 20, 5, progress=False)
    assert not (tmp_path / "sub3").exists()


def test_extract_subimages_errors(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write_image(src / "small.png", _noise(30, 50))
    with pytest.raises(OptionError, match=r"step: must be an integer >= 1, got 0"):
        extract_subimages(src, tmp_path / "sub", 8, 0, 5, progress=False)
    with pytest.raises(OptionError, match=r"n_thread: must be an integer >= 1, got 0"):
        extract_subimages(src, tmp_path / "sub", 8, 4, 5, n_thread=0, progress=False)


# ------------------------------------------------------------------------------------------- LMDB
def test_make_lmdb_writes_basicsr_layout(tmp_path: Path) -> None:
    lmdb = pytest.importorskip("lmdb")
    src = tmp_path / "src"
    images = {"a_s001": _noise(12, 10), "a_s002": _noise(12, 10, seed=3), "g": _noise(6, 5, None, seed=4)}
    for key, img in images.items():
        write_image(src / f"{key}.png", img)
    out = make_lmdb(src, tmp_path / "train.lmdb", compress_level=2, batch=2, progress=False)
    assert sorted(p.name for p in out.iterdir()) == ["data.mdb", "lock.mdb", "meta_info.txt"]
    assert (out / "meta_info.txt").read_text().splitlines() == [
        "a_s001.png (12,10,3) 2", "a_s002.png (12,10,3) 2", "g.png (6,5,1) 2"]
    env = lmdb.open(str(out), readonly=True, lock=False)
    with env.begin() as txn:
        for key, img in images.items():
            assert np.array_equal(decode_image(txn.get(key.encode("ascii"))), img)
    env.close()
    with pytest.raises(DataError, match=r"train\.lmdb already exists; delete it or choose another path"):
        make_lmdb(src, out, progress=False)
    with pytest.raises(OptionError, match=r"lmdb_path: .*train must end with '\.lmdb' .*; use .*train\.lmdb"):
        make_lmdb(src, tmp_path / "train", progress=False)


def test_make_lmdb_grows_the_map(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lmdb = pytest.importorskip("lmdb")
    src = tmp_path / "src"
    write_image(src / "a.png", np.zeros((8, 8), dtype=np.uint8))  # tiny first image -> tiny estimate
    for i in range(6):
        write_image(src / f"n{i}.png", _noise(96, 96, seed=i), compress_level=0)  # ~28 KB each
    monkeypatch.setattr(prep, "_MIN_MAP_SIZE", 64 << 10)
    out = make_lmdb(src, tmp_path / "grow.lmdb", progress=False)
    env = lmdb.open(str(out), readonly=True, lock=False)
    assert env.stat()["entries"] == 7
    with env.begin() as txn:
        assert np.array_equal(decode_image(txn.get(b"n5")), _noise(96, 96, seed=5))
    env.close()


def test_make_lmdb_without_lmdb_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "lmdb", None)  # import lmdb now raises ImportError
    write_image(tmp_path / "src" / "a.png", _noise(4, 4))
    with pytest.raises(DataError, match=r"make_lmdb needs the optional 'lmdb' package; install it with "
                                        r"pip install anysr\[lmdb\]"):
        make_lmdb(tmp_path / "src", tmp_path / "x.lmdb", progress=False)


def test_make_lmdb_rejects_bad_keys(tmp_path: Path) -> None:
    pytest.importorskip("lmdb")
    src = tmp_path / "src"
    write_image(src / "a.png", _noise(4, 4))
    write_image(src / "a.jpg", _noise(4, 4))
    with pytest.raises(DataError, match=r"several files share the stem\(s\) a; LMDB keys must be unique"):
        make_lmdb(src, tmp_path / "x.lmdb", progress=False)
    (src / "a.jpg").unlink()
    write_image(src / "b c.png", _noise(4, 4))
    with pytest.raises(DataError, match=r"LMDB keys must be ASCII without spaces; rename .*b c\.png"):
        make_lmdb(src, tmp_path / "x.lmdb", progress=False)
    with pytest.raises(OptionError, match=r"compress_level: PNG compression goes from 0 to 9, got 12"):
        make_lmdb(src, tmp_path / "x.lmdb", compress_level=12, progress=False)

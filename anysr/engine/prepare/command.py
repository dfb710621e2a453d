"""Dataset preparation behind ``anysr prepare``: bicubic LR images, mod-crops, sub-images, LMDB and shard sets.

LR images are made the classic (MATLAB) way: the HR image is cropped to a multiple of the scale, shrunk
with MATLAB-exact bicubic ``imresize`` on its integer values, rounded and saved as PNG under the same stem.
``extract_subimages`` and ``make_lmdb`` write the layouts BasicSR's DIV2K scripts write.
"""

from __future__ import annotations

import io
import json
import math
import os
import posixpath
import re
import shutil
import tarfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import cv2
import numpy as np
import torch
from tqdm import tqdm

from anysr.atomic import atomic_write_bytes, atomic_write_json
from anysr.data import shards
from anysr.data.batch_augment import BatchAugment
from anysr.data.degradation.kernels import make_kernel
from anysr.data.degradation.mmrealsr import (
    ANCHOR_KERNELS,
    AnchoredLoaderSynthesis,
    AnchoredSettings,
    synthesise_anchored,
)
from anysr.data.degradation.realesrgan import (
    LoaderSynthesis,
    SynthesisSettings,
    draw_batch_choices,
    pool_rng,
    step_rng,
    synthesise,
)
from anysr.data.imageio import ImageInfo, is_image_file, list_images, probe_image, read_image, write_image
from anysr.data.loaders import build_dataset, collate
from anysr.data.pair_pool import TrainingPairPool, wide_keys
from anysr.data.paired_image_dataset import paired_names_from_folder
from anysr.data.sampler import TrainSampler
from anysr.data.transforms import mod_crop, tensor2img
from anysr.errors import DataError, OptionError
from anysr.ops.degradation import USMSharp
from anysr.ops.diffjpeg import DiffJPEG
from anysr.ops.imresize import imresize
from anysr.registry import MODEL_REGISTRY

__all__ = ["SubimageReport", "check_images", "prepare_lr", "prepare_modcrop", "extract_subimages",
           "make_lmdb", "ShardReport", "make_shards", "DegradeReport", "degrade_samples", "loader_samples"]

PathLike = str | os.PathLike[str]
_MIN_MAP_SIZE = 64 << 20  # the LMDB map starts at least this large and grows when it fills up


def _check_scale(scale: int) -> int:
    if isinstance(scale, bool) or not isinstance(scale, int | np.integer) or scale < 1:
        raise OptionError(f"scale: must be a positive integer such as 2, 3 or 4, got {scale!r}")
    return int(scale)


def _positive_int(value: int, key: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise OptionError(f"{key}: must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _inputs(folder: PathLike) -> list[Path]:
    files = list_images(folder)
    if not files:
        raise DataError(f"image folder {folder} holds no image files (png, jpg, bmp, tif, webp); "
                        "check the path")
    return files


def _one_result_each(files: list[Path], folder: PathLike, command: str,
                     stem: Callable[[Path], str] = lambda p: p.stem) -> None:
    """Refuse inputs whose results would get one name (``a.png`` and ``a.jpg`` both give ``a.png``: one would
    overwrite the other), before anything is written."""
    by_stem: dict[str, list[Path]] = {}
    for path in files:
        by_stem.setdefault(stem(path), []).append(path)
    clashes = {k: v for k, v in by_stem.items() if len(v) > 1}
    if clashes:
        shown = "; ".join(f"{', '.join(p.name for p in v)} -> {k}" for k, v in list(clashes.items())[:5])
        raise DataError(f"{command}: image folder {folder}: several files share a stem ({shown}); their results "
                        "would overwrite each other: rename or remove one of each (nothing was written)")


def _distinct(src: PathLike, dst: PathLike) -> Path:
    out = Path(dst)
    if out.resolve() == Path(src).resolve():
        raise OptionError(f"output folder {out} is the input folder; choose another one so inputs are kept")
    return out


def _check_integer_image(img: np.ndarray, path: Path) -> None:
    if img.dtype not in (np.uint8, np.uint16):
        raise DataError(f"image {path} has {img.dtype} pixels; only 8- or 16-bit integer images are "
                        "supported, convert it to an 8-bit PNG")


def _checked_inputs(folder: PathLike, scale: int, progress: bool) -> list[Path]:
    """The images of ``folder`` after a check of every header (readable, integer pixels, at least ``scale``
    pixels): a bad file is refused before anything is written, not midway."""
    files = _inputs(folder)
    problems = []
    for path, info in zip(files, check_images(files, progress=progress)):
        if info.dtype not in ("uint8", "uint16"):
            problems.append(f"image {path} has {info.dtype} pixels; only 8- or 16-bit integer images are "
                            "supported, convert it to an 8-bit PNG")
        elif info.height < scale or info.width < scale:
            problems.append(f"image {path} is {info.width}x{info.height}, smaller than the scale {scale}; "
                            "remove it or lower the scale")
    if len(problems) == 1:
        raise DataError(problems[0])
    if problems:
        raise DataError(f"{len(problems)} of {len(files)} images cannot be used (nothing was written):\n  "
                        + "\n  ".join(problems))
    return files


def _modcropped(path: Path, scale: int) -> np.ndarray:
    img = read_image(path)
    _check_integer_image(img, path)
    h, w = img.shape[:2]
    if h < scale or w < scale:
        raise DataError(f"image {path} is {w}x{h}, smaller than the scale {scale}; "
                        "remove it or lower the scale")
    return mod_crop(img, scale)


def _downscale(img: np.ndarray, scale: int) -> np.ndarray:
    top = np.iinfo(img.dtype).max
    out = imresize(img, 1.0 / scale)
    return np.clip(np.round(out), 0, top).astype(img.dtype)


def prepare_modcrop(hr_dir: PathLike, out_dir: PathLike, scale: int, *, progress: bool = True) -> list[Path]:
    """Write each HR image cropped to a multiple of ``scale`` as ``<out_dir>/<stem>.png``; returns paths. A
    non-empty output folder is refused."""
    s = _check_scale(scale)
    out = _distinct(hr_dir, out_dir)
    _empty_output(out, "prepare modcrop output")
    _one_result_each(_inputs(hr_dir), hr_dir, "anysr prepare modcrop")
    files = _checked_inputs(hr_dir, s, progress)
    written = []
    for path in tqdm(files, desc=f"mod-crop x{s}", unit="img", disable=not progress):
        written.append(write_image(out / f"{path.stem}.png", _modcropped(path, s)))
    return written


def prepare_lr(hr_dir: PathLike, out_dir: PathLike, scale: int, *, progress: bool = True) -> list[Path]:
    """Make bicubic LR images: mod-crop, MATLAB ``imresize(img, 1/scale)`` on the integer image, round.

    Each LR image is written as ``<out_dir>/<stem>.png`` with the HR image's channels (gray stays gray).
    Returns the written paths, in the order of the sorted HR names. A non-empty output folder is refused.
    """
    s = _check_scale(scale)
    out = _distinct(hr_dir, out_dir)
    _empty_output(out, "anysr prepare lr --out")
    _one_result_each(_inputs(hr_dir), hr_dir, "anysr prepare lr")
    files = _checked_inputs(hr_dir, s, progress)
    written = []
    for path in tqdm(files, desc=f"bicubic LR x{s}", unit="img", disable=not progress):
        written.append(write_image(out / f"{path.stem}.png", _downscale(_modcropped(path, s), s)))
    return written


# ------------------------------------------------------------------------------------ sub-images
_SCALE_SUFFIX = re.compile(r"^(.*\d)x(?:2|3|4|8)$")


def _crop_starts(length: int, crop_size: int, step: int, thresh_size: int) -> list[int]:
    starts = list(range(0, length - crop_size + 1, step))
    if starts and length - (starts[-1] + crop_size) > thresh_size:
        starts.append(length - crop_size)
    return starts


def _crop_stem(path: Path) -> str:
    """The name part of ``path``'s crops: DIV2K LR names lose their scale (0001x2 -> 0001)."""
    match = _SCALE_SUFFIX.match(path.stem)
    return match.group(1) if match else path.stem


def _crop_one(path: Path, out: Path, crop_size: int, step: int, thresh_size: int,
              compress_level: int) -> list[Path]:
    img = read_image(path)
    h, w = img.shape[:2]
    stem = _crop_stem(path)
    written = []
    index = 0
    for top in _crop_starts(h, crop_size, step, thresh_size):
        for left in _crop_starts(w, crop_size, step, thresh_size):
            index += 1
            patch = np.ascontiguousarray(img[top:top + crop_size, left:left + crop_size, ...])
            target = out / f"{stem}_s{index:03d}.png"
            written.append(write_image(target, patch, compress_level=compress_level))
    return written


def _empty_output(out: Path, what: str) -> None:
    """Refuse an output that exists and holds anything (nothing of a previous run is overwritten or mixed in)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        kind = "is not empty" if out.is_dir() else "exists and is not a folder"
        raise DataError(f"{what}: {out} {kind}; delete it or choose another output folder")


def check_images(files: list[Path], *, threads: int = 4, progress: bool = True,
                 desc: str = "check images") -> list[ImageInfo]:
    """Every file's header (size, channels), read in parallel; all unreadable files in one DataError."""
    def probe(path: Path) -> ImageInfo | str:
        try:
            return probe_image(path)
        except DataError as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        results = list(tqdm(pool.map(probe, files), total=len(files), desc=desc, unit="img",
                            disable=not progress or len(files) < 200))
    bad = [r for r in results if isinstance(r, str)]
    if bad:
        more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
        raise DataError(f"{len(bad)} of {len(files)} images cannot be read (nothing was written):\n  "
                        + "\n  ".join(bad[:20]) + more)
    return [r for r in results if isinstance(r, ImageInfo)]


def _integer_pixels(command: str, files: list[Path], infos: list[ImageInfo]) -> list[ImageInfo]:
    """``infos`` when every image has 8- or 16-bit integer pixels (what PNG stores and training reads); else a
    DataError naming them, before anything is written (OpenCV would save a [0, 1] float image as a black one)."""
    wrong = [f"{p} ({i.dtype})" for p, i in zip(files, infos) if i.dtype not in ("uint8", "uint16")]
    if wrong:
        more = f" and {len(wrong) - 5} more" if len(wrong) > 5 else ""
        raise DataError(f"{command}: training reads 8- or 16-bit images; convert {', '.join(wrong[:5])}{more} to an "
                        "8- or 16-bit PNG (nothing was written)")
    return infos


@dataclass
class SubimageReport:
    """What ``extract_subimages`` did: the crops written and the images skipped as too small."""

    written: list[Path]
    images: int
    skipped: list[Path]


def extract_subimages(input_dir: PathLike, output_dir: PathLike, crop_size: int, step: int,
                      thresh_size: int, n_thread: int = 1, *, compress_level: int = 3,
                      progress: bool = True) -> SubimageReport:
    """Cut every image into ``crop_size`` squares every ``step`` pixels, as BasicSR's DIV2K script does.

    A last row / column of crops flush with the border is added when more than ``thresh_size`` pixels
    would otherwise be left over. Crops are saved as ``<stem>_s001.png``, ``_s002`` ... in row-major order
    (a DIV2K LR suffix such as ``x2`` is dropped from the stem so HR and LR crops share names).
    For LR folders pass ``crop_size``, ``step`` and ``thresh_size`` divided by the scale.

    Every input's header is checked before anything is written (all problems reported at once); images
    smaller than ``crop_size`` are skipped and listed in the report; a non-empty output folder is refused.
    """
    crop = _positive_int(crop_size, "crop_size")
    stride = _positive_int(step, "step")
    thresh = _positive_int(thresh_size, "thresh_size", minimum=0)
    threads = _positive_int(n_thread, "n_thread")
    out = _distinct(input_dir, output_dir)
    files = _inputs(input_dir)
    _empty_output(out, "prepare subimages --output")
    _one_result_each(files, input_dir, "anysr prepare subimages", _crop_stem)
    infos = _integer_pixels("prepare subimages", files, check_images(files, threads=max(threads, 4),
                                                                      progress=progress))
    usable = [p for p, info in zip(files, infos) if info.width >= crop and info.height >= crop]
    skipped = [p for p, info in zip(files, infos) if info.width < crop or info.height < crop]
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def run(path: Path) -> list[Path]:
        return _crop_one(path, out, crop, stride, thresh, compress_level)

    bar = tqdm(total=len(usable), desc="extract sub-images", unit="img", disable=not progress)
    with bar, ThreadPoolExecutor(max_workers=threads) as pool:  # OpenCV releases the GIL while coding
        for result in pool.map(run, usable):
            written.extend(result)
            bar.update(1)
    return SubimageReport(written, len(usable), skipped)


# ------------------------------------------------------------------------------------------ LMDB
def _import_lmdb() -> ModuleType:
    try:
        import lmdb  # noqa: PLC0415 - optional dependency (anysr[lmdb])
    except ImportError as exc:
        raise DataError("make_lmdb needs the optional 'lmdb' package; install it with "
                        "pip install anysr[lmdb]  (or pip install lmdb)") from exc
    return lmdb


def _encode_png(img: np.ndarray, level: int, path: Path) -> bytes:
    ok, buf = cv2.imencode(".png", img, [cv2.IMWRITE_PNG_COMPRESSION, level])
    if not ok:
        raise DataError(f"image {path} cannot be encoded as PNG ({img.dtype}, shape {img.shape})")
    return buf.tobytes()


def make_lmdb(input_dir: PathLike, lmdb_path: PathLike, *, compress_level: int = 1, batch: int = 5000,
              progress: bool = True) -> Path:
    """Pack every image of ``input_dir`` into a BasicSR-layout LMDB folder (``<name>.lmdb``).

    Keys are file stems; values are PNG bytes (compression ``compress_level``); ``meta_info.txt`` holds
    one line per image: ``<key>.png (h,w,c) <compress_level>``. Writes are committed every ``batch``
    images. Needs the optional ``lmdb`` package (``pip install anysr[lmdb]``).
    """
    lmdb = _import_lmdb()
    level = _positive_int(compress_level, "compress_level", minimum=0)
    if level > 9:
        raise OptionError(f"compress_level: PNG compression goes from 0 to 9, got {compress_level}")
    per_txn = _positive_int(batch, "batch")
    out = Path(lmdb_path)
    if out.suffix != ".lmdb":
        raise OptionError(f"lmdb_path: {out} must end with '.lmdb' (BasicSR's convention); "
                          f"use {out.with_name(out.name + '.lmdb')}")
    if out.exists():
        raise DataError(f"lmdb_path: {out} already exists; delete it or choose another path")
    files = _inputs(input_dir)
    keys = [p.stem for p in files]
    odd = [str(p) for p in files if not p.stem.isascii() or " " in p.stem]
    if odd:
        raise DataError(f"make_lmdb: LMDB keys must be ASCII without spaces; rename {', '.join(odd[:5])}")
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise DataError(f"image folder {input_dir}: several files share the stem(s) {', '.join(dupes)}; "
                        "LMDB keys must be unique, rename them")

    _integer_pixels("prepare lmdb", files, check_images(files, progress=progress))
    first = _encode_png(read_image(files[0]), level, files[0])
    map_size = max(len(first) * len(files) * 10, _MIN_MAP_SIZE)
    out.parent.mkdir(parents=True, exist_ok=True)
    # written under a temporary name, renamed when complete: a file that fails to decode half-way leaves no
    # half-written LMDB that the next run would refuse as existing (or train on)
    work = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    shutil.rmtree(work, ignore_errors=True)
    env = lmdb.open(str(work), map_size=map_size)
    meta: list[str] = []
    done = False
    try:
        txn = env.begin(write=True)
        pending_bytes = 0
        for i, path in enumerate(tqdm(files, desc="make lmdb", unit="img", disable=not progress)):
            img = read_image(path)
            value = first if i == 0 else _encode_png(img, level, path)
            info, stat = env.info(), env.stat()
            used = stat["psize"] * (info["last_pgno"] + 1) + 2 * pending_bytes
            if used + 2 * len(value) + (1 << 20) > info["map_size"]:
                txn.commit()  # grow the map between transactions
                env.set_mapsize(max(2 * info["map_size"], used + 10 * len(value)))
                txn = env.begin(write=True)
                pending_bytes = 0
            txn.put(keys[i].encode("ascii"), value)
            pending_bytes += len(value)
            h, w = img.shape[:2]
            c = 1 if img.ndim == 2 else img.shape[2]
            meta.append(f"{keys[i]}.png ({h},{w},{c}) {level}\n")
            if (i + 1) % per_txn == 0:
                txn.commit()
                txn = env.begin(write=True)
                pending_bytes = 0
        txn.commit()
        env.close()
        atomic_write_bytes(work / "meta_info.txt", "".join(meta).encode("utf-8"))
        os.replace(work, out)
        done = True
    finally:
        env.close()
        if not done:
            shutil.rmtree(work, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------ anysr prepare shards
def _import_webdataset() -> Any:
    try:
        import webdataset  # noqa: PLC0415 - optional dependency (anysr[shards])
    except ImportError:
        raise DataError("anysr prepare shards needs webdataset: pip install anysr[shards]") from None
    return webdataset


@dataclass
class ShardReport:
    """What ``make_shards`` wrote."""

    index: str
    samples: int
    shards: int
    bytes: int


def _images_below(folder: Path) -> dict[str, Path]:
    """Every image under ``folder`` (any depth) by its relative path without extension ('clip/00000000')."""
    out: dict[str, Path] = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        if p.is_file() and is_image_file(p.name) and not any(part.startswith(".") for part in rel.parts):
            key = rel.with_suffix("").as_posix()
            if key in out:
                raise DataError(f"prepare shards: {out[key]} and {p} have the same name but for the extension; keep "
                                "one")
            out[key] = p
    return out


def _clip_pairs(gt_dir: Path, lq_dir: Path | None, filename_tmpl: str) -> list[tuple[str, Path, Path | None]]:
    """Frames of clip folders (``<clip>/<frame>``, any depth): keyed by their path; the LQ frame of a GT frame is
    at the same place in ``lq_dir``, its stem ``filename_tmpl.format(GT stem)``."""
    gts = _images_below(gt_dir)
    if lq_dir is None:
        return [(k, p, None) for k, p in gts.items()]
    lqs = _images_below(lq_dir)
    out, missing = [], []
    for key, path in gts.items():
        head, _, stem = key.rpartition("/")
        want = (head + "/" if head else "") + filename_tmpl.format(stem)
        if want in lqs:
            out.append((key, path, lqs.pop(want)))
        else:
            missing.append(f"{path} (expected LQ '{lq_dir / want}.*')")
    if missing or lqs:
        parts = ([f"{len(missing)} GT frame(s) have no LQ: {', '.join(missing[:5])}"] if missing else []) + \
            ([f"{len(lqs)} LQ frame(s) have no GT: {', '.join(map(str, list(lqs.values())[:5]))}"] if lqs else [])
        raise DataError("prepare shards: unmatched frames (filename_tmpl '" + filename_tmpl + "'): " + "; ".join(parts))
    return out


def _sample_sources(gt_dir: Path, lq_dir: Path | None, filename_tmpl: str) -> list[tuple[str, Path, Path | None]]:
    """(key, GT file, LQ file or None) of every sample: the images of a folder keyed by stem, or, when the folder
    holds only sub-folders (video clips: REDS, Vimeo-90K, Vid4), every frame keyed by its path ('clip/frame')."""
    if not list_images(gt_dir) and any(p.is_dir() for p in gt_dir.iterdir()):
        out = _clip_pairs(gt_dir, lq_dir, filename_tmpl)
    else:
        if lq_dir is None:
            pairs: list[tuple[str, str | None]] = [(p.name, None) for p in list_images(gt_dir)]
        else:
            pairs = list(paired_names_from_folder(os.fspath(gt_dir), os.fspath(lq_dir), filename_tmpl,
                                                  "prepare shards"))
        out = [(os.path.splitext(g)[0], gt_dir / g, None if q is None or lq_dir is None else lq_dir / q)
               for g, q in pairs]
    if not out:
        raise DataError(f"prepare shards: no images in {gt_dir}")
    bad = [os.fspath(g) for k, g, _ in out if "." in k or not k.isascii()]
    if bad:
        raise DataError("prepare shards: sample keys are the GT file stems (paths for clips), and WebDataset keys "
                        f"hold no '.' and only ASCII; rename {', '.join(bad[:5])}")
    return out


def _member_suffix(field: str, path: Path) -> str:
    return f"{field}.{path.suffix.lstrip('.').lower()}"


def _one_stem_slot(template: str) -> bool:
    """Whether ``template.format(stem)`` puts the stem in exactly once (and formats at all)."""
    try:
        return template.format("\0").count("\0") == 1
    except (IndexError, KeyError, ValueError):
        return False


_WRITABLE_SCHEMES = ("s3", "gs", "gcs", "file")  # where prepare shards writes (http(s) sets are read only)


def _unwritable(out: str, exc: BaseException) -> DataError:
    first = str(exc).splitlines()[0] if str(exc) else ""
    return DataError(f"prepare shards: cannot write to {out} ({type(exc).__name__}: {first}); "
                     f"{shards.credentials_hint(out).replace('io_backend.storage_options', '--storage-options')}")


def _shard_output(out: str, opts: dict[str, Any]) -> tuple[Any, str]:
    """The file system and root of ``out``, checked to be a writable, new or empty folder or prefix."""
    scheme = out.split("://", 1)[0].lower() if "://" in out else ""
    if scheme and scheme not in _WRITABLE_SCHEMES:
        raise DataError(f"prepare shards: OUT {out}: cannot write to {scheme}://; write to a local folder or to "
                        f"{', '.join(s + '://' for s in _WRITABLE_SCHEMES)}")
    fs, root = shards.url_filesystem(out, shards.default_storage_options(out, opts), who="prepare shards",
                                     verb="writing to", options_key="--storage-options")
    try:
        try:
            exists = fs.exists(root)  # the first call that opens a session: it takes the storage options
        except TypeError as exc:
            raise DataError(f"prepare shards: --storage-options are not accepted by the file system of {out} "
                            f"({exc})") from None
        if exists and not fs.isdir(root):
            raise DataError(f"prepare shards: OUT {out} is a file; give a new or empty folder")
        if exists and fs.ls(root):
            raise DataError(f"prepare shards: {out} exists and is not empty; delete it or choose another output")
        fs.makedirs(root, exist_ok=True)
    except shards.storage_errors() as exc:
        raise _unwritable(out, exc) from exc
    return fs, root


def make_shards(src: str | os.PathLike[str], out: str, *, lq: str | os.PathLike[str] | None = None,
                filename_tmpl: str = "{}", shard_bytes: int = 512 << 20, shard_samples: int | None = None,
                storage_options: Mapping[str, Any] | None = None, progress: bool = True) -> ShardReport:
    """Write the images of folder ``src`` (GT; with ``lq``: pairs matched by stem through ``filename_tmpl``) as
    WebDataset tar shards plus ``index.json`` under ``out`` (a new local folder or an fsspec URL such as
    ``s3://bucket/set``).

    Each sample is keyed by the GT file stem and holds the files' bytes unchanged (``gt.<ext>``, ``lq.<ext>``: 8-
    and 16-bit PNGs stay as they are). A shard is closed when it would pass ``shard_bytes`` or holds
    ``shard_samples`` samples. Every image header is checked first (integer 8- or 16-bit pixels).
    """
    wds = _import_webdataset()
    shards.import_fsspec()  # not installed: said before any image is read
    if shard_bytes < 1:
        raise DataError(f"prepare shards: --shard-size must be positive, got {shard_bytes} bytes")
    if shard_samples is not None and shard_samples < 1:
        raise DataError(f"prepare shards: --samples-per-shard must be >= 1, got {shard_samples}")
    if lq is not None and not _one_stem_slot(filename_tmpl):
        raise DataError(f"prepare shards: --filename-tmpl {filename_tmpl!r} must hold '{{}}' exactly once, where the "
                        "GT file stem goes (e.g. '{}x4' for DIV2K's LR names)")
    if "://" not in out and Path(out).resolve() in (Path(src).resolve(), Path(lq).resolve() if lq else None):
        raise DataError(f"prepare shards: the output {out} is an input folder; choose another one")
    for folder, what in ((src, "SRC_FOLDER"), (lq, "--lq")):
        if folder is not None and not Path(folder).is_dir():
            raise DataError(f"prepare shards: {what} {folder} is not a folder of images; check the path")
    samples = _sample_sources(Path(src), Path(lq) if lq is not None else None, filename_tmpl)
    files = [p for _, g, q in samples for p in ((g,) if q is None else (g, q))]
    infos = check_images(files, progress=progress, desc="check images")
    headers = {os.fspath(p): [i.width, i.height, i.channels, i.bits, i.dtype] for p, i in zip(files, infos)}
    wrong = [f"{p} ({i.dtype})" for p, i in zip(files, infos) if i.dtype not in ("uint8", "uint16")]
    if wrong:
        raise DataError(f"prepare shards: training reads 8- or 16-bit images; convert {', '.join(wrong[:5])}")
    fs, root = _shard_output(out, dict(storage_options or {}))
    failed = shards.storage_errors()

    def put(name: str, data: bytes) -> None:
        try:
            with fs.open(posixpath.join(root, name), "wb") as f:
                f.write(data)
        except failed as exc:
            raise _unwritable(out, exc) from exc

    shardlist: list[dict[str, Any]] = []
    buffer = io.BytesIO()
    writer: Any = None
    listed: dict[str, dict[str, list[Any]]] = {}
    crcs: dict[str, list[Any]] = {}  # member name -> [crc32, width, height, channels, bits, dtype]

    def flush() -> None:
        nonlocal writer, buffer, listed, crcs
        if writer is None:
            return
        writer.close()
        data = buffer.getvalue()
        name = f"shard-{len(shardlist):06d}.tar"
        members: dict[str, dict[str, list[Any]]] = {k: {} for k in listed}
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:  # the offsets a tar reader sees
            for info in tar:
                key, _, suffix = info.name.partition(".")
                members[key][suffix] = [info.offset_data, info.size, *crcs[info.name]]
        put(name, data)
        shardlist.append({"url": name, "nsamples": len(members), "filesize": len(data), "samples": members})
        writer, buffer, listed, crcs = None, io.BytesIO(), {}, {}

    for key, gt, lq_path in tqdm(samples, desc="write shards", unit="sample", disable=not progress):
        sample: dict[str, Any] = {"__key__": key}
        sample_crcs: dict[str, list[Any]] = {}
        for field, path in (("gt", gt), ("lq", lq_path)):
            if path is None:
                continue
            data = path.read_bytes()
            suffix = _member_suffix(field, path)
            sample[suffix] = data
            sample_crcs[f"{key}.{suffix}"] = [zlib.crc32(data), *headers[os.fspath(path)]]
        size = sum(len(v) + 1024 for k, v in sample.items() if k != "__key__")  # data plus tar headers
        if writer is not None and (buffer.tell() + size > shard_bytes
                                   or (shard_samples is not None and len(listed) >= shard_samples)):
            flush()
        if writer is None:
            writer = wds.TarWriter(buffer, encoder=False, mtime=0.0)
        try:
            writer.write(sample)
        except ValueError as exc:
            raise DataError(f"prepare shards: cannot store sample '{key}' in a tar shard ({exc}); shorten the file "
                            "name") from None
        listed[key] = {}
        crcs.update(sample_crcs)
    flush()
    index = {"__kind__": shards.INDEX_KIND, "wids_version": 1, "name": Path(os.fspath(src)).name,
             "shardlist": shardlist,
             "anysr": {"format": "webdataset tar shards, members <key>.gt.<ext> / <key>.lq.<ext>; 'samples' lists "
                                 "[offset, size, crc32, width, height, channels, bits, dtype] of each member",
                       "version": 1}}
    put(shards.INDEX_NAME, json.dumps(index, indent=1).encode("utf-8"))
    total = sum(int(s["filesize"]) for s in shardlist)
    return ShardReport(out.rstrip("/") + "/" + shards.INDEX_NAME, len(samples), len(shardlist), total)


# ----------------------------------------------------------------------------------- anysr prepare degrade
@dataclass
class DegradeReport:
    """What ``degrade_samples`` wrote: the pairs (``NNNN_lq.png``, ``NNNN_gt.png``), kernel images and
    ``degrade.json`` (every draw behind each pair), and where the synthesis ran (``step`` or ``loader``)."""

    out: Path
    pairs: int
    where: str
    files: list[Path]


def _kernel_image(kernel: np.ndarray, zoom: int = 8) -> np.ndarray:
    """A kernel as an 8-bit gray image: scaled to its largest tap, each tap a ``zoom`` x ``zoom`` block."""
    k = np.asarray(kernel, dtype=np.float64)
    k = k / max(float(np.abs(k).max()), 1e-12)
    img = np.clip(np.rint(np.clip(k, 0, 1) * 255), 0, 255).astype(np.uint8)
    return np.kron(img, np.ones((zoom, zoom), dtype=np.uint8))


def _to_bgr8(t: Any) -> np.ndarray:
    return tensor2img(t)


def _sample_record(j: int, choices: Any, draws: Any, settings: Any) -> dict[str, Any]:
    """The draws of sample ``j`` of a batch, readable (noise level in its own unit, JPEG qualities)."""
    out: dict[str, Any] = {}
    for n, stage in ((1, settings.first), (2, settings.second)):
        gaussian = getattr(choices, f"gaussian{n}")
        lo, hi = stage.noise_range if gaussian else stage.poisson_scale_range
        u = getattr(draws, f"level{n}")[j]
        out[f"stage{n}"] = {
            "resize": getattr(choices, f"updown{n}"), "resize_scale": getattr(choices, f"scale{n}"),
            "resize_mode": getattr(choices, f"mode{n}"),
            "noise": "gaussian" if gaussian else "poisson",
            ("sigma" if gaussian else "poisson_scale"): lo + u * (hi - lo),
            "gray_noise": bool(getattr(draws, f"gray{n}")[j]),
            "jpeg_quality": getattr(draws, f"quality{n}")[j] if getattr(choices, f"jpeg{n}") else None,
        }
    out["second_blur"] = choices.second_blur
    if (settings.blur_prob, settings.thicklines_prob, settings.lq_usm, settings.first.jpeg_prob,
            settings.second.jpeg_prob) != (1.0, 0.0, None, 1.0, 1.0):  # traiNNer-redux's coins in use
        out["first_blur"] = choices.blur1
        out["thick_lines"] = choices.thick
        out["lq_usm_radius"] = choices.usm_radius or None
    out["final"] = {"order": "resize+sinc, jpeg" if choices.sinc_first else "jpeg, resize+sinc",
                    "resize_mode": choices.final_mode}
    return out


def degrade_samples(opt: Any, out_dir: PathLike, n: int, *, where: str | None = None, frames: int = 3,
                    progress: bool = True) -> DegradeReport:
    """The first ``n`` training pairs of an options file, as one training process would train on them.

    A model that reads its pairs from the dataset (paired folders, ``lq_from_gt``, video clips, Real-ESRGAN's
    paired dataset) goes to :func:`loader_samples`. For a Real-ESRGAN options file (high-order degradation):

    The training stream's first batches (the sampler of ``manual_seed``, one process with the file's
    ``batch_size_per_gpu``) are synthesised as in ``degrade_in`` (``where`` overrides it; ``auto`` is ``loader``
    for ``accelerator: xla`` and ``step`` otherwise), cropped and passed through the pair pool, on the CPU. Writes
    ``NNNN_lq.png`` / ``NNNN_gt.png`` (the GT the losses compare with), the three kernels of each pair as images
    (``NNNN_kernel1.png``, ``NNNN_kernel2.png``, ``NNNN_sinc.png``: taps scaled to the largest, 8x8 pixels each) and
    ``degrade.json``. On a GPU the noise fields come from the device's generator, so the noise itself differs from
    these pairs (its distribution does not).
    """
    n = _positive_int(n, "-n")
    model = MODEL_REGISTRY.get(str(opt.model_type), "model_type")
    if not getattr(model, "synthesises", False) or not opt.high_order_degradation:
        if where not in (None, "auto"):
            raise OptionError(f"--degrade-in {where}: model_type {opt.model_type} does not synthesise its training "
                              "pairs (only RealESRNetModel / RealESRGANModel with high_order_degradation: true do)")
        return loader_samples(opt, out_dir, n, frames=frames, progress=progress)
    key = next(k for k in opt.datasets if k.startswith("train"))
    dopt = opt.datasets[key]
    where = where or str(opt.degrade_in)
    if where == "auto":
        where = "loader" if opt.accelerator == "xla" else "step"
    if where not in ("step", "loader"):
        raise OptionError(f"--degrade-in: expected auto, step or loader, got {where!r}")
    out = Path(out_dir)
    _empty_output(out, "anysr prepare degrade")
    if getattr(model, "anchored", False):
        return _anchored_samples(opt, key, out, n, where, model.__name__, progress)

    dataset = build_dataset(dopt, f"datasets.{key}")
    settings = SynthesisSettings.from_options(opt)
    sharpen = model.__name__ != "RealESRNetModel" or bool(opt.gt_usm)
    keep_sharpened = model.__name__ == "RealESRNetModel" and bool(opt.gt_usm)
    usm, jpeger = USMSharp(), DiffJPEG(differentiable=False)
    loader_synth = LoaderSynthesis(settings, sharpen_input=sharpen, keep_sharpened=keep_sharpened)
    seed = int(opt.manual_seed)
    pool = TrainingPairPool(int(opt.queue_size), {"lq": True, "gt": not keep_sharpened, "id": False}) \
        if int(opt.queue_size) > 0 else None
    records: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []
    written: list[Path] = []
    count = 0
    bar = tqdm(total=n, desc="prepare degrade", unit="pair", disable=not progress, leave=False)
    for it, micro, items in _training_batches(opt, key, len(dataset)):  # type: ignore[arg-type]
        if count >= n:
            break
        raw = [dataset[(i, s)] for i, s in items]
        kernels = [[r[k] for k in ("kernel1", "kernel2", "sinc_kernel")] for r in raw]
        if where == "step":
            b = collate(raw)
            choices = draw_batch_choices(step_rng(seed, it, micro), settings, tuple(b["gt"].shape[-2:]))
            res = synthesise(b["gt"], [b[k] for k in ("kernel1", "kernel2", "sinc_kernel")], settings=settings,
                             choices=choices, seeds=b["seed"], gens=[torch.Generator() for _ in items], usm=usm,
                             jpeger=jpeger, sharpen_input=sharpen, keep_sharpened=keep_sharpened)
            lq, gt = res["lq"], res["gt"]
            recs = [_sample_record(j, choices, res["draws"], settings) for j in range(len(items))]
        else:
            outs = [loader_synth(r["gt"], ks, s) for r, ks, (_, s) in zip(raw, kernels, items)]
            lq, gt = torch.stack([o["lq"] for o in outs]), torch.stack([o["gt"] for o in outs])
            recs = [_sample_record(0, o["choices"], o["draws"], settings) for o in outs]
        base = len(records)
        for j, ((_, s), r, rec) in enumerate(zip(items, raw, recs)):
            params = dataset.kernel_params(s)  # type: ignore[attr-defined]
            kept = {k: {f: v for f, v in vars(p).items() if not (isinstance(v, float) and math.isnan(v))}
                    for k, p in params.items()}
            records.append({"source": r["gt_path"], "bits": int(r.get("bits", 8)), "sample_seed": s,
                            "iteration": it, "micro_batch": micro, "batch_position": j, "kernels": kept, **rec})
        ids = torch.arange(base, base + len(items), dtype=torch.float64)
        pair = {"lq": lq, "gt": gt, "id": ids}
        if pool is not None:
            pair = pool.swap(pair, pool_rng(seed, it, micro), offset=0, global_batch=len(items),
                             to_device=lambda t: t, wide=wide_keys({"bits": [r.get("bits", 8) for r in raw]}))
        for j in range(len(items)):
            if count >= n:
                break
            rid = int(pair["id"][j])
            stem = f"{count:04d}"
            written.append(write_image(out / f"{stem}_lq.png", _to_bgr8(pair["lq"][j])))
            gt_bits = int(records[rid]["bits"])  # a 16-bit source image gives a 16-bit GT preview
            written.append(write_image(out / f"{stem}_gt.png", tensor2img(pair["gt"][j], bits=gt_bits)))
            for name, kern in zip(("kernel1", "kernel2", "sinc"), kernels[rid - base] if rid >= base else
                                  _kernels_of(dataset, records[rid]["sample_seed"])):
                written.append(write_image(out / f"{stem}_{name}.png", _kernel_image(kern.numpy())))
            shown.append({"pair": stem, **records[rid]})  # a sample can train twice: as it came, then from the pool
            count += 1
            bar.update(1)
    bar.close()
    meta = {"options": str(opt.name), "model_type": str(opt.model_type), "degrade_in": where, "scale": settings.scale,
            "gt_size": settings.gt_size, "queue_size": int(opt.queue_size), "manual_seed": seed, "pairs": shown}
    written.append(atomic_write_json(out / "degrade.json", meta))
    return DegradeReport(out, count, where, written)


def _training_batches(opt: Any, key: str, size: int) -> Iterator[tuple[int, int, list[tuple[int, int]]]]:
    """The training stream of one process, endless: ``(iteration, micro_batch, [(index, sample_seed), ...])`` per
    micro-batch (the sampler of ``manual_seed`` and ``datasets.<key>``, ``train.accumulate`` micro-batches an
    iteration, a new epoch's order when one runs out)."""
    dopt = opt.datasets[key]
    batch = int(dopt.batch_size_per_gpu)
    accumulate = int(opt.train.accumulate) if opt.train is not None else 1
    sampler = TrainSampler(size, batch_size=batch, seed=int(opt.manual_seed),
                           enlarge_ratio=int(dopt.dataset_enlarge_ratio), shuffle=bool(dopt.use_shuffle),
                           name=f"datasets.{key}")
    stream, epoch, position = iter(sampler), 0, 0
    while True:
        items: list[tuple[int, int]] = []
        while len(items) < batch:
            try:
                items.append(next(stream))
            except StopIteration:
                epoch += 1
                sampler.set_epoch(epoch)
                stream = iter(sampler)
        yield position // accumulate + 1, position % accumulate, items
        position += 1


_VERSIONS = ("lq_origin", "lq_blur", "lq_noise", "anchor_clean", "anchor_degraded")


def _anchored_samples(opt: Any, key: str, out: Path, n: int, where: str, model: str,
                      progress: bool) -> DegradeReport:
    """:func:`degrade_samples` for MMRealSR's models: per pair the five versions the step restores
    (``NNNN_lq_origin.png``, ``_lq_blur``, ``_lq_noise``, ``_anchor_clean``, ``_anchor_degraded``), the GT the
    losses compare with (``NNNN_gt.png``), the seven kernels (``NNNN_<kernel>.png``) and ``degrade.json`` (each
    pair's source, seed, iteration and its batch's draws)."""
    dopt = opt.datasets[key]
    dataset = build_dataset(dopt, f"datasets.{key}")
    keep_sharpened = model == "MMRealSRNetModel" and bool(opt.gt_usm)
    settings = AnchoredSettings.from_options(opt, anchor_usm=keep_sharpened)
    usm, jpeger = USMSharp(), DiffJPEG(differentiable=False)
    loader_synth = AnchoredLoaderSynthesis(settings)
    seed = int(opt.manual_seed)
    pool = TrainingPairPool(int(opt.queue_size), {"lq": True, "anchor": True, "gt": not keep_sharpened,
                                                  "id": False}) if int(opt.queue_size) > 0 else None
    records: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []
    written: list[Path] = []
    count = 0
    bar = tqdm(total=n, desc="prepare degrade", unit="pair", disable=not progress, leave=False)
    for it, micro, items in _training_batches(opt, key, len(dataset)):  # type: ignore[arg-type]
        if count >= n:
            break
        raw = [dataset[(i, s)] for i, s in items]
        if where == "step":
            b = collate(raw)
            res = synthesise_anchored(b["gt"], {k: b[k] for k in ANCHOR_KERNELS}, settings=settings,
                                      rng=step_rng(seed, it, micro), seeds=[s for _, s in items],
                                      gens=[torch.Generator() for _ in items], usm=usm, jpeger=jpeger)
            parts = {k: res[k] for k in ("lq", "anchor", "gt")}
            choices = [res["choices"].as_dict()] * len(items)
        else:
            outs = [loader_synth(r["gt"], {k: r[k] for k in ANCHOR_KERNELS}, s) for r, (_, s) in zip(raw, items)]
            parts = {k: torch.stack([o[k] for o in outs]) for k in ("lq", "anchor", "gt")}
            choices = [o["choices"].as_dict() for o in outs]
        base = len(records)
        for j, ((_, s), r) in enumerate(zip(items, raw)):
            records.append({"source": r["gt_path"], "bits": int(r.get("bits", 8)), "sample_seed": s,
                            "iteration": it, "micro_batch": micro, "batch_position": j, "batch_draws": choices[j]})
        parts["id"] = torch.arange(base, base + len(items), dtype=torch.float64)
        if pool is not None:
            parts = pool.swap(parts, pool_rng(seed, it, micro), offset=0, global_batch=len(items),
                              to_device=lambda t: t, wide=wide_keys({"bits": [r.get("bits", 8) for r in raw]}))
        for j in range(len(items)):
            if count >= n:
                break
            rid = int(parts["id"][j])
            stem = f"{count:04d}"
            versions = torch.cat([parts["lq"][j], parts["anchor"][j]])
            for name, img in zip(_VERSIONS, versions):
                written.append(write_image(out / f"{stem}_{name}.png", _to_bgr8(img)))
            written.append(write_image(out / f"{stem}_gt.png", tensor2img(parts["gt"][j],
                                                                          bits=int(records[rid]["bits"]))))
            params = dataset.kernel_params(records[rid]["sample_seed"])  # type: ignore[attr-defined]
            for name in ANCHOR_KERNELS:
                written.append(write_image(out / f"{stem}_{name}.png", _kernel_image(make_kernel(params[name]))))
            shown.append({"pair": stem, **records[rid]})
            count += 1
            bar.update(1)
    bar.close()
    meta = {"options": str(opt.name), "model_type": model, "degrade_in": where, "scale": settings.base.scale,
            "gt_size": settings.base.gt_size, "queue_size": int(opt.queue_size), "manual_seed": seed,
            "versions": list(_VERSIONS), "pairs": shown}
    written.append(atomic_write_json(out / "degrade.json", meta))
    return DegradeReport(out, count, where, written)


def _kernels_of(dataset: Any, sample_seed: int) -> list[Any]:
    """The three kernels of sample ``sample_seed`` (drawn again: they depend on the seed only)."""
    params = dataset.kernel_params(sample_seed)
    return [torch.from_numpy(make_kernel(params[k]).astype(np.float32)) for k in ("kernel1", "kernel2", "sinc_kernel")]


def _clip_frames(t: torch.Tensor, frames: int) -> list[tuple[int | None, torch.Tensor]]:
    """A sample's images: ``[(None, CHW)]`` for an image, the ``frames`` frames around the centre of a clip (TCHW)."""
    if t.dim() == 3:
        return [(None, t)]
    total = int(t.shape[0])
    k = min(frames, total)
    first = max(0, min(total - k, total // 2 - k // 2))
    return [(f, t[f]) for f in range(first, first + k)]


def loader_samples(opt: Any, out_dir: PathLike, n: int, *, frames: int = 3, progress: bool = True) -> DegradeReport:
    """The first ``n`` training pairs of an options file whose model reads its LQ/GT pairs from the dataset.

    The pairs come from the training stream's first batches (the sampler of ``manual_seed``, one process with the
    file's ``batch_size_per_gpu``, ``train.accumulate`` micro-batches an iteration), after the batch augmentations
    of ``train.use_moa`` as the training step draws them. Writes ``NNNN_lq.png`` / ``NNNN_gt.png`` (a clip: the
    ``frames`` frames around its centre as ``NNNN_lq_fTT.png``, and ``NNNN_gt_fTT.png`` when the GT is a clip too)
    and ``degrade.json`` (each pair's dataset index, sample seed, iteration, micro-batch, files and sizes, and for
    a dataset that degrades its GT itself, ``BSRGANDataset``, the drawn recipe under ``degradation``).
    """
    n = _positive_int(n, "-n")
    frames = _positive_int(frames, "--frames")
    model = MODEL_REGISTRY.get(str(opt.model_type), "model_type")
    key = next((k for k in opt.datasets if k.startswith("train")), None)
    if key is None:
        raise OptionError("datasets: no train dataset (datasets.train) to take the training pairs from")
    dopt = opt.datasets[key]
    out = Path(out_dir)
    _empty_output(out, "anysr prepare degrade")
    dataset = build_dataset(dopt, f"datasets.{key}")
    seed = int(opt.manual_seed)
    augment = None
    if opt.train is not None and opt.train.use_moa and getattr(model, "image_batches", True):
        augment = BatchAugment.from_options(opt.train, seed, one_graph=False)
    shown: list[dict[str, Any]] = []
    written: list[Path] = []
    count = 0
    bar = tqdm(total=n, desc="prepare degrade", unit="pair", disable=not progress, leave=False)
    for it, micro, items in _training_batches(opt, key, len(dataset)):  # type: ignore[arg-type]
        if count >= n:
            break
        raw = [dataset[(i, s)] for i, s in items]
        b = collate(raw)
        if "lq" not in b or "gt" not in b:
            raise DataError(f"datasets.{key}: {dopt.type} items hold {', '.join(map(str, b))}, not an LQ/GT pair")
        if augment is not None:
            b = augment(b, it, micro, 0)
        for j, (idx, s) in enumerate(items):
            if count >= n:
                break
            stem = f"{count:04d}"
            bits = int(raw[j].get("bits", 8))
            files: dict[str, list[str]] = {"lq": [], "gt": []}
            for role in ("lq", "gt"):
                for f, img in _clip_frames(b[role][j], frames):
                    name = f"{stem}_{role}.png" if f is None else f"{stem}_{role}_f{f:02d}.png"
                    written.append(write_image(out / name, tensor2img(img, bits=bits if role == "gt" else 8)))
                    files[role].append(name)
            record: dict[str, Any] = {
                "pair": stem, "index": int(idx), "sample_seed": int(s), "iteration": it, "micro_batch": micro,
                "batch_position": j, "lq_shape": list(b["lq"][j].shape), "gt_shape": list(b["gt"][j].shape),
                "files": files, "bits": bits}
            for src in ("lq_path", "gt_path", "key", "clip"):
                if src in raw[j]:
                    record[src] = str(raw[j][src])
            recipe = getattr(dataset, "degradation_record", None)
            if callable(recipe):  # a dataset that degrades its GT itself (BSRGANDataset): the drawn recipe
                record["degradation"] = recipe(int(s))
            shown.append(record)
            count += 1
            bar.update(1)
    bar.close()
    meta = {"options": str(opt.name), "model_type": str(opt.model_type), "dataset": str(dopt.type),
            "degrade_in": "dataset", "scale": int(opt.scale), "use_moa": augment is not None,
            "batch_size_per_gpu": int(dopt.batch_size_per_gpu),
            "accumulate": int(opt.train.accumulate) if opt.train is not None else 1, "manual_seed": seed,
            "pairs": shown}
    written.append(atomic_write_json(out / "degrade.json", meta))
    return DegradeReport(out, count, "dataset", written)

"""``anysr prepare fetch NAME``: download a standard dataset (``anysr.dataset_sources``), verify, extract, prepare.

Archives go to ``<root>/downloads/`` through the shared resumable downloader (``anysr.download``): a killed run
leaves a ``.part`` that the next run continues (HTTP Range), every file is checked against its published size and
checksum before it is used, and a file that does not match is set aside as ``.bad``. A file without a published
checksum is pinned locally on its first download (``downloads/pins.json``, with a warning), and later runs check
against that pin. Archives are extracted through a staging folder (members with ``..``, absolute paths or links
pointing out are refused before anything is written) and moved into place; then the dataset's steps run (sub-images,
meta-info files, REDS' regrouping, ...), each writing to a temporary folder renamed when complete and skipped when
its output exists. Rerunning the command is cheap: verified files, extractions and steps are skipped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import tarfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from anysr.atomic import atomic_write_json
from anysr.dataset_sources import DATASET_MIRROR_VAR, SOURCES, DatasetSource, SourceFile, Step, find_source
from anysr.download import Digests, DownloadFailed, download, file_digests, file_lock, offline_reason
from anysr.errors import DataError, OptionError, describe_os_error

__all__ = ["FetchReport", "fetch_dataset", "safe_extract"]

logger = logging.getLogger("anysr.engine.prepare.fetch")
PathLike = str | os.PathLike[str]
_PINS = "pins.json"


@dataclass
class FetchReport:
    """What ``fetch_dataset`` did: files downloaded / found verified, archives extracted, steps run / skipped,
    files pinned locally (no published checksum) and the paths the dataset provides."""

    name: str
    root: Path
    downloaded: list[str] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)
    extracted: list[str] = field(default_factory=list)
    steps_run: list[str] = field(default_factory=list)
    steps_skipped: list[str] = field(default_factory=list)
    pinned_locally: list[str] = field(default_factory=list)
    provides: list[Path] = field(default_factory=list)


def _source(name: str) -> DatasetSource:
    source = find_source(name)
    if source is None:
        raise OptionError(f"anysr prepare fetch: no dataset is named '{name}'; known: {', '.join(SOURCES)}")
    return source


def _urls(f: SourceFile, mirror: str | None) -> tuple[str, ...]:
    mirror = mirror if mirror is not None else os.environ.get(DATASET_MIRROR_VAR, "").strip()
    if mirror and not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", mirror):
        raise OptionError(f"--mirror / {DATASET_MIRROR_VAR}: {mirror!r} is not a URL; give the base URL of a server "
                          "or folder holding the files by name, e.g. https://host/path or file:///data/mirror")
    return (f"{mirror.rstrip('/')}/{f.name}",) if mirror else f.urls


# ------------------------------------------------------------------------------------------- pins
def _read_pins(folder: Path) -> dict[str, dict]:
    path = folder / _PINS
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path} is not valid JSON ({exc}); delete it (downloads are then checked again)") from None
    return data if isinstance(data, dict) else {}


def _write_pins(folder: Path, pins: dict[str, dict]) -> None:
    atomic_write_json(folder / _PINS, pins)


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns]


def _expected(f: SourceFile, pin: dict | None) -> tuple[str | None, str | None, int | None]:
    """(sha256, md5, size) to check: the published pin, else the local one."""
    if f.pinned:
        return f.sha256, f.md5, f.size
    if pin is not None:
        return pin.get("sha256"), None, pin.get("size")
    return None, None, f.size


def _matches(f: SourceFile, pin: dict | None, d: Digests) -> bool:
    sha256, md5, size = _expected(f, pin)
    return ((size is None or d.size == size) and (sha256 is None or d.sha256.startswith(sha256))
            and (md5 is None or d.md5 == md5))


def _pin_agrees(f: SourceFile, pin: dict) -> bool:
    """Whether a recorded verification still stands for the table's published checksums."""
    return ((f.md5 is None or pin.get("md5") == f.md5)
            and (f.sha256 is None or str(pin.get("sha256", "")).startswith(f.sha256)))


def _pinned_locally(f: SourceFile, folder: Path, digests: Digests, report: FetchReport) -> None:
    report.pinned_locally.append(f.name)
    logger.warning("%s has no published checksum; recorded its sha256 %s as the local pin in %s", f.name,
                   digests.sha256, folder / _PINS)


# -------------------------------------------------------------------------------------- download
def _expected_text(f: SourceFile, pin: dict | None) -> str:
    """'sha256 ab12..., 3,530,603,713 bytes' (what a file put in place by hand must match), or ''."""
    sha256, md5, size = _expected(f, pin)
    parts = [f"sha256 {sha256}" if sha256 else "", f"md5 {md5}" if md5 else "", f"{size:,} bytes" if size else ""]
    return ", ".join(x for x in parts if x)


def _present(f: SourceFile, folder: Path, pins: dict[str, dict], report: FetchReport) -> Path | None:
    """The archive ``f`` in ``folder`` when it is there and verified (checked once, then by size and mtime); a
    file that does not match is set aside as ``.bad`` (said with what was expected and found); None otherwise."""
    dest = folder / f.name
    pin = pins.get(f.name)
    if not dest.is_file():
        return None
    if pin is not None and pin.get("verified") == _stamp(dest) and _pin_agrees(f, pin):
        report.verified.append(f.name)
        return dest
    digests = file_digests(dest)
    if _matches(f, pin, digests):
        pins[f.name] = {**(pin or {}), "sha256": digests.sha256, "md5": digests.md5, "size": digests.size,
                        "verified": _stamp(dest), "published": f.pinned}
        if not f.pinned and pin is None:  # a file put there by hand
            _pinned_locally(f, folder, digests, report)
        report.verified.append(f.name)
        return dest
    bad = dest.with_name(dest.name + ".bad")
    os.replace(dest, bad)
    logger.warning("%s does not match its checksum (expected %s; found sha256 %s, %s bytes): set aside as %s", dest,
                   _expected_text(f, pin) or "?", digests.sha256, f"{digests.size:,}", bad.name)
    return None


def _missing_offline(files: list[SourceFile], folder: Path, pins: dict[str, dict], reason: str) -> DataError:
    """One error naming every archive still missing, each with its URL, checksum and size, and where it goes."""
    lines = [f"  {f.name}: {f.urls[0]}" + (f" ({_expected_text(f, pins.get(f.name))})"
                                           if _expected_text(f, pins.get(f.name)) else "") for f in files]
    return DataError(f"downloading is off ({reason}) and {len(files)} file{'s are' if len(files) > 1 else ' is'} not "
                     f"in {folder}; download {'them' if len(files) > 1 else 'it'} there, then run the command again:\n"
                     + "\n".join(lines))


def _get(f: SourceFile, folder: Path, pins: dict[str, dict], report: FetchReport, mirror: str | None,
         progress: bool) -> Path:
    """The verified archive ``f`` in ``folder``: found, or downloaded."""
    found = _present(f, folder, pins, report)
    if found is not None:
        return found
    dest = folder / f.name
    pin = pins.get(f.name)
    reason = offline_reason()
    if reason is not None:
        raise _missing_offline([f], folder, pins, reason)
    sha256, md5, size = _expected(f, pin)
    urls = _urls(f, mirror)
    failure: DownloadFailed | None = None
    for url in urls:
        try:
            digests = download(url, dest, size=size, sha256=sha256, md5=md5, desc=f.name, progress=progress)
        except DownloadFailed as exc:
            if exc.kind in ("size", "checksum"):
                raise DataError(f"the download of {f.name} from {url} has {exc.reason}; it was set aside as "
                                f"{exc.kept} and not used. Check the URL ({DATASET_MIRROR_VAR}?), delete the .bad "
                                "file and run the command again") from None
            failure = exc
            logger.warning("downloading %s from %s failed (%s)", f.name, url, exc.reason)
            continue
        except OSError as exc:
            raise DataError(f"writing {dest}: {describe_os_error(exc)} (the partial download is kept and continued)"
                            ) from None
        pins[f.name] = {"sha256": digests.sha256, "md5": digests.md5, "size": digests.size, "url": url,
                        "verified": _stamp(dest), "published": f.pinned}
        if not f.pinned and pin is None:
            _pinned_locally(f, folder, digests, report)
        report.downloaded.append(f.name)
        return dest
    assert failure is not None
    part = dest.with_name(dest.name + ".part")
    kept = f" ({part.stat().st_size} bytes kept in {part.name}: rerunning continues)" if part.is_file() else ""
    where = " and ".join(urls)
    raise DataError(f"downloading {f.name} from {where} failed ({failure.reason}){kept}; check the network, set "
                    f"{DATASET_MIRROR_VAR} to a server holding {f.name}, or put the file in {folder}") from None


# ------------------------------------------------------------------------------------- extraction
def _member_problem(name: str) -> str | None:
    posix = PurePosixPath(name.replace("\\", "/"))
    if posix.is_absolute() or re.match(r"^[A-Za-z]:", name) or ".." in posix.parts:
        return f"member '{name}' would be written outside the extraction folder"
    return None


def safe_extract(archive: PathLike, dest: PathLike) -> list[str]:
    """Extract a zip or tar (plain, gz, bz2, xz) archive into ``dest``; returns the top-level names. Members with an
    absolute path or ``..``, and links or devices, are refused before anything is written (DataError)."""
    archive, out = Path(archive), Path(dest)
    problems: list[str] = []
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                names = zf.namelist()
                problems = [p for n in names if (p := _member_problem(n))]
                if not problems:
                    out.mkdir(parents=True, exist_ok=True)
                    zf.extractall(out)
        elif tarfile.is_tarfile(archive):
            with tarfile.open(archive) as tf:
                members = tf.getmembers()
                names = [m.name for m in members]
                problems = [p for m in members if (p := _member_problem(m.name))]
                problems += [f"member '{m.name}' is a link or device, not a file or folder" for m in members
                             if not (m.isfile() or m.isdir())]
                if not problems:
                    out.mkdir(parents=True, exist_ok=True)
                    if hasattr(tarfile, "data_filter"):  # Python >= 3.10.12 / 3.11.4: refuses what slipped by
                        tf.extractall(out, filter="data")
                    else:
                        tf.extractall(out)  # noqa: S202 - every member was checked above
        else:
            raise DataError(f"{archive} is neither a zip nor a tar archive; delete it and run the command again")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as exc:
        raise DataError(f"{archive} is a damaged archive ({exc}); delete it and run the command again") from None
    if problems:
        raise DataError(f"{archive}: refused, {problems[0]}" + (f" (and {len(problems) - 1} more)"
                                                               if len(problems) > 1 else "") + "; nothing extracted")
    return sorted({PurePosixPath(n.replace("\\", "/")).parts[0] for n in names if n.strip("/")})


def _merge(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst``; where ``dst`` is a folder already, move ``src``'s entries into it (existing files
    are kept)."""
    if not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)
        return
    if src.is_dir() and dst.is_dir():
        for child in src.iterdir():
            _merge(child, dst / child.name)
        shutil.rmtree(src, ignore_errors=True)
    else:
        _remove(src)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _extract(archive: Path, f: SourceFile, root: Path, report: FetchReport) -> None:
    target = root / f.extract_to
    marker = root / "downloads" / f".{f.name}.extracted"
    if marker.is_file() and marker.read_text(encoding="utf-8").strip() == str(target.resolve()):
        return
    staging = root / "downloads" / f".extract-{f.name}"
    _remove(staging)
    safe_extract(archive, staging)
    for child in sorted(staging.iterdir()):
        _merge(child, target / child.name)
    _remove(staging)
    marker.write_text(str(target.resolve()) + "\n", encoding="utf-8")
    report.extracted.append(f.name)


# ------------------------------------------------------------------------------------------ steps
@contextlib.contextmanager
def _building(output: Path) -> Iterator[Path]:
    """A temporary path beside ``output``, renamed to it when the block completes (removed when it fails)."""
    tmp = output.with_name(f".{output.name}.fetch-tmp")
    _remove(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    done = False
    try:
        yield tmp
        done = True
    finally:
        if not done:
            _remove(tmp)
    os.replace(tmp, output)


def _need(path: Path, step: Step) -> Path:
    if not path.exists():
        raise DataError(f"step {step.kind} needs {path}, which the extracted archives do not hold; check the "
                        "archives (a mirror's file?), delete downloads/.*.extracted and run the command again")
    return path


def _find_folder(base: Path, name: str) -> Path:
    """The folder named ``name`` under ``base`` (itself or at any depth, the shallowest first)."""
    first, *rest = PurePosixPath(name).parts
    found = sorted((p for p in base.rglob(first) if p.is_dir()), key=lambda p: (len(p.parts), str(p)))
    if not found:
        raise DataError(f"no folder '{first}' under {base}: the archives do not hold what was expected")
    return found[0].joinpath(*rest)


def _image_shape(path: Path) -> tuple[int, int, int]:
    from anysr.data.imageio import probe_image  # noqa: PLC0415 - opencv only when a step needs it

    info = probe_image(path)
    return info.height, info.width, info.channels


def _meta_info(src: Path, out: Path) -> None:
    from anysr.data.imageio import list_images  # noqa: PLC0415

    lines = []
    for p in list_images(src):
        h, w, c = _image_shape(p)
        lines.append(f"{p.name} ({h},{w},{c})\n")
    if not lines:
        raise DataError(f"{src} holds no images to list in {out.name}")
    out.write_text("".join(lines), encoding="utf-8")


def _link_file(path: Path, target: Path) -> None:
    try:
        os.link(path, target)
    except OSError:  # another file system, or no hard links there
        shutil.copy2(path, target)


def _link_tree(src: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for path in sorted(src.rglob("*")):
        target = out / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        _link_file(path, target)


def _reds(staging: Path, root: Path, names: tuple[str, ...]) -> None:
    """BasicSR's REDS layout: train_sharp and train_sharp_bicubic/X4 with the 30 val clips renumbered 240-269
    (the LQ side first; a side already in place is left alone, so an interrupted step can run again)."""
    train_gt, train_lq, val_gt, val_lq = names
    for train_name, val_name, out in ((train_lq, val_lq, root / "REDS" / "train_sharp_bicubic" / "X4"),
                                      (train_gt, val_gt, root / "REDS" / "train_sharp")):
        if out.exists():
            continue
        train, val = _find_folder(staging, train_name), _find_folder(staging, val_name)
        clips = sorted(p for p in val.iterdir() if p.is_dir())
        odd = [c for c in clips if not c.name.isdigit()]
        if odd:
            raise DataError(f"REDS: unexpected clip folder {odd[0]} (clips are 000 ... 029)")
        for clip in clips:
            os.replace(clip, train / f"{int(clip.name) + 240:03d}")
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(train, out)


def _gather(srcs: list[Path], out: Path) -> None:
    """The images of ``srcs`` (at any depth) linked into ``out``, flat: ``a/b.png`` becomes ``a_b.png``."""
    from anysr.data.imageio import is_image_file  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    count = 0
    for src in srcs:
        for path in sorted(p for p in src.rglob("*") if p.is_file() and is_image_file(p)):
            target = out / "_".join(path.relative_to(src).parts)
            if target.exists():
                raise DataError(f"{path} and another image both become {target}; rename one of them")
            _link_file(path, target)
            count += 1
    if not count:
        raise DataError(f"{', '.join(map(str, srcs))} hold no images")


def _multiscale(src: Path, out: Path) -> None:
    """Real-ESRGAN's multi-scale DF2K: each image at x0.75, x0.5, x1/3 (``<stem>T0..T2.png``) and with its shortest
    edge 400 (``T3``), resized with Pillow's Lanczos filter as its script does (sizes rounded down)."""
    try:
        from PIL import Image  # noqa: PLC0415 - optional (anysr[fetch]): the filter Real-ESRGAN used
    except ImportError:
        raise DataError("the multi-scale DF2K step resizes with Pillow's Lanczos filter, as Real-ESRGAN did; "
                        "install it with pip install anysr[fetch]  (or pip install Pillow)") from None
    from anysr.data.imageio import list_images  # noqa: PLC0415

    out.mkdir(parents=True, exist_ok=True)
    for path in list_images(src):
        with Image.open(path) as img:
            width, height = img.size
            sizes = [(int(width * s), int(height * s)) for s in (0.75, 0.5, 1 / 3)]
            if width < height:
                sizes.append((400, int(400 * (height / width))))
            else:
                sizes.append((int(400 * (width / height)), 400))
            for idx, size in enumerate(sizes):
                img.resize(size, resample=Image.LANCZOS).save(out / f"{path.stem}T{idx}.png")


def _meta_list(src: Path, out: Path, folders: tuple[str, ...]) -> None:
    from anysr.data.imageio import list_images  # noqa: PLC0415

    lines = [f"{folder}/{p.name}\n" for folder in folders for p in list_images(src / folder)]
    if not lines:
        raise DataError(f"{', '.join(folders)} under {src} hold no images to list in {out.name}")
    out.write_text("".join(lines), encoding="utf-8")


def _reds_meta(src: Path, out: Path) -> None:
    from anysr.data.imageio import list_images  # noqa: PLC0415

    lines = []
    for clip in sorted(p for p in src.iterdir() if p.is_dir()):
        frames = list_images(clip)
        if frames:
            h, w, c = _image_shape(frames[0])
            lines.append(f"{clip.name} {len(frames)} ({h},{w},{c})\n")
    out.write_text("".join(lines), encoding="utf-8")


_REDS4 = ("000", "011", "015", "020")


def _vimeo_meta(listing: Path, out: Path) -> None:
    seqs_dir = listing.parent / "sequences"
    lines = []
    for entry in listing.read_text(encoding="utf-8").split():
        frames = sorted((seqs_dir / entry).glob("im*.png"))
        if not frames:
            raise DataError(f"{listing} lists {entry}, which {seqs_dir} does not hold")
        h, w, c = _image_shape(frames[0])
        lines.append(f"{entry} {len(frames)} ({h},{w},{c})\n")
    out.write_text("".join(lines), encoding="utf-8")


def _vimeo_lr(src: Path, out: Path, scale: int, progress: bool) -> None:
    """MATLAB-bicubic ``1/scale`` copies of every septuplet (BasicSR's BIx4), sequences in parallel threads."""
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415

    from tqdm import tqdm  # noqa: PLC0415

    from anysr.engine.prepare.command import prepare_lr  # noqa: PLC0415 - torch / opencv only here

    seqs = sorted(p.parent for p in src.glob("*/*/im1.png"))
    if not seqs:
        raise DataError(f"{src} holds no septuplets (<clip>/<seq>/im1.png)")

    def one(seq: Path) -> None:
        prepare_lr(seq, out / seq.relative_to(src), scale, progress=False)

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        for _ in tqdm(pool.map(one, seqs), total=len(seqs), desc=f"bicubic x{scale}", unit="seq",
                      disable=not progress):
            pass


def _run_step(step: Step, root: Path, progress: bool) -> None:
    out = root / step.output
    if step.kind == "subimages":
        from anysr.engine.prepare.command import extract_subimages  # noqa: PLC0415 - torch / opencv only here

        src = _need(root / step.src, step)
        crop, stride, thresh = step.args
        with _building(out) as tmp:
            extract_subimages(src, tmp, crop, stride, thresh, n_thread=min(8, os.cpu_count() or 1),
                              progress=progress)
        return
    if step.kind == "reds":
        _reds(_need(root / step.src, step), root, step.args)
        _remove(root / step.src)
        return
    if step.kind == "reds4":
        src = _need(root / step.src, step)
        with _building(out) as tmp:
            for clip in _REDS4:
                _link_tree(_need(src / clip, step), tmp / clip)
        return
    if step.kind == "gather":
        srcs = [_need(root / p, step) for p in (step.src, *step.args)]
        with _building(out) as tmp:
            _gather(srcs, tmp)
        return
    if step.kind == "meta_list":
        src = _need(root / step.src, step)
        with _building(out) as tmp:
            _meta_list(src, tmp, step.args)
        return
    actions: dict[str, Callable[[Path, Path], None]] = {
        "meta_info": _meta_info, "reds_meta": _reds_meta, "multiscale": _multiscale, "vimeo_meta": _vimeo_meta,
        "link": _link_tree,
        "vimeo_lr": lambda s, o: _vimeo_lr(s, o, step.args[0], progress),
    }
    if step.kind not in actions:
        known = ", ".join(("subimages", "reds", "reds4", "gather", "meta_list", *actions))
        raise OptionError(f"dataset step kind '{step.kind}' is unknown; known: {known}")
    src = _need(root / step.src, step)
    with _building(out) as tmp:
        actions[step.kind](src, tmp)


# ------------------------------------------------------------------------------------------- entry
def fetch_dataset(name: str, root: PathLike = "datasets", *, mirror: str | None = None, prepare: bool = True,
                  progress: bool = True) -> FetchReport:
    """Download, verify, extract and prepare the dataset ``name`` (a key of ``SOURCES``, any case) under ``root``.

    ``mirror``: a base URL holding the files by name (default: ``$ANYSR_DATASET_MIRROR``, else the official URLs).
    ``prepare=False`` stops after extraction. Idempotent: what is verified, extracted or prepared is skipped.
    Errors are one-line DataErrors naming the file, the URL and the fix."""
    source = _source(name)
    base = Path(root).expanduser()
    downloads = base / "downloads"
    report = FetchReport(source.name, base)
    for need in source.needs:  # downloaded and extracted; their own preparation is not needed here
        first = fetch_dataset(need, base, mirror=mirror, prepare=False, progress=progress)
        for key in ("downloaded", "verified", "extracted", "pinned_locally"):
            getattr(report, key).extend(getattr(first, key))
    try:
        downloads.mkdir(parents=True, exist_ok=True)
        with file_lock(downloads / f".{source.name}.lock"):
            pins = _read_pins(downloads)
            try:
                reason = offline_reason()
                if reason is not None:  # every missing archive at once, not one per rerun
                    counted = len(report.verified)
                    missing = [f for f in source.files if _present(f, downloads, pins, report) is None]
                    if missing:
                        raise _missing_offline(missing, downloads, pins, reason)
                    del report.verified[counted:]  # counted again below
                archives = [(f, _get(f, downloads, pins, report, mirror, progress)) for f in source.files]
            finally:
                if report.downloaded or report.verified:
                    _write_pins(downloads, pins)
            for f, archive in archives:
                _extract(archive, f, base, report)
            if prepare:
                for step in source.steps:
                    label = f"{step.kind} {step.output}"
                    if (base / step.output).exists():
                        report.steps_skipped.append(label)
                        continue
                    logger.info("%s: %s", source.name, label)
                    _run_step(step, base, progress)
                    report.steps_run.append(label)
    except OSError as exc:
        raise DataError(f"{source.name}: {describe_os_error(exc)}") from None
    report.provides = [base / p for p in source.provides if (base / p).exists()]
    return report

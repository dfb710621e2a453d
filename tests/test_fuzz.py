"""Fuzzing every file anysr reads, through the commands that read it (seeded mutation; see ``tests/fuzzing.py``).

The short fixed-seed run here is part of ``make test``: one mutated file per (file kind, command) pair through the
command line, and a few hundred in-process cases of the reading APIs. The long run (thousands of cases) is the
same code with ``ANYSR_FUZZ_CASES`` set; how to run it and what it found: ``benchmarks/robustness.md``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import yaml
from conftest import DATASETS, ROOT, run_cli, tiny_train_options, write_options
from fuzzing import MEMORY_LIMIT, CliResult, api_seed_files, check_cli, mutate_file

SEED = int(os.environ.get("ANYSR_FUZZ_SEED", "20"))
LONG_CASES = int(os.environ.get("ANYSR_FUZZ_CASES", "0"))  # > 0: the long CLI run (marked slow)
LONG_SECONDS = float(os.environ.get("ANYSR_FUZZ_SECONDS", "600"))
API_CASES = int(os.environ.get("ANYSR_FUZZ_API_CASES", "400"))
REPORT = os.environ.get("ANYSR_FUZZ_REPORT")  # a JSON file the runs append their counts to
# What a BasicSR .pth (no metadata) needs to name its network.
ARCH = ["--arch", "EDSR", "--arch-opt", "num_in_ch=3", "num_out_ch=3", "num_feat=8", "num_block=1", "upscale=2"]


# --------------------------------------------------------------------------------------------- seed files
def _write_video(path: Path) -> bool:
    try:
        import av
    except ImportError:
        return False
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 32, 24, "yuv420p"
        for i in range(6):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img[i:i + 24, i:i + 32]), format="bgr24")
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return True


@pytest.fixture(scope="session")
def seeds(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_seeds(tmp_path_factory.mktemp("fuzz_seeds"))


def build_seeds(s: Path) -> Path:
    """Valid files anysr made or reads, in the folder ``s``: options, a 2-iteration run's state / weights /
    history, images of every format, a meta-info file, an LMDB, a video."""
    s.mkdir(parents=True, exist_ok=True)
    train = s / "train"
    train.mkdir()
    for p in sorted((DATASETS / "T91" / "HR").glob("*.png"))[:4]:
        shutil.copy(p, train / p.name)
    opt = tiny_train_options("fuzz", train, None, total_iter=2)
    opt["logger"].update(print_freq=1, save_checkpoint_freq=2, save_format=["safetensors", "pth"])
    write_options(s / "train.yml", opt)
    run_cli("train", "-opt", str(s / "train.yml"), cwd=s)
    shutil.move(s / "experiments" / "fuzz", s / "exp")
    shutil.rmtree(s / "experiments")
    val = s / "val"
    val.mkdir()
    shutil.copy(sorted(train.iterdir())[0], val / "a.png")
    test = {"name": "fuzz_test", "model_type": "SRModel", "scale": 2, "accelerator": "cpu", "num_gpu": 1,
            "datasets": {"test_1": {"name": "one", "type": "PairedImageDataset", "dataroot_gt": str(val),
                                    "lq_from_gt": True, "io_backend": {"type": "disk"}}},
            "network_g": opt["network_g"],
            "path": {"pretrain_network_g": str(s / "exp" / "models" / "net_g_2.safetensors")},
            "val": {"save_img": True, "metrics": {"psnr": {"type": "calculate_psnr", "crop_border": 2}}}}
    write_options(s / "test.yml", test)
    images = s / "images"
    images.mkdir()
    bgr = cv2.imread(str(sorted(train.iterdir())[1]))[:48, :40]
    gray = cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)
    wide = bgr.astype(np.uint16) * 257
    alpha = np.dstack([bgr, np.linspace(0, 255, bgr.shape[0] * bgr.shape[1]).reshape(bgr.shape[:2])
                       .astype(np.uint8)])
    for name, img in (("rgb.png", bgr), ("rgb.jpg", bgr), ("rgb.bmp", bgr), ("rgb.tif", bgr), ("rgb.webp", bgr),
                      ("rgb16.png", wide), ("rgb16.tif", wide), ("gray.png", gray), ("gray16.png", wide[..., 0]),
                      ("alpha.png", alpha)):
        assert cv2.imwrite(str(images / name), img)
    (s / "meta_info.txt").write_text("".join(f"{p.name} ({cv2.imread(str(p)).shape[0]},"
                                             f"{cv2.imread(str(p)).shape[1]},3) 1\n" for p in sorted(train.iterdir())))
    run_cli("prepare", "lmdb", "--input", str(train), "--output", str(s / "t91.lmdb"), cwd=s)
    _write_video(s / "clip.mp4")
    return s


# --------------------------------------------------------------------------------------------- the CLI layer
@dataclass
class Kind:
    """A file kind read by a command: the seed files it mutates and the command line run on the mutation."""

    name: str
    sources: Callable[[Path], list[Path]]
    args: Callable[[Path, Path, Path, Path], list[str]]  # (seeds, in folder, out folder, mutated file) -> argv
    place: Callable[[Path, Path, Path, Path], Path]  # (seeds, in, out, source) -> where the mutated copy goes


def _in(sub: str) -> Callable[[Path, Path, Path, Path], Path]:
    return lambda s, i, o, src: i / sub / src.name


def _in_exp(rel: str) -> Callable[[Path, Path, Path, Path], Path]:
    """The run folder copied into the output (where a resumed run writes), ``rel`` inside it mutated."""
    def place(s: Path, i: Path, o: Path, src: Path) -> Path:
        shutil.copytree(s / "exp", o / "experiments" / "fuzz")
        return o / "experiments" / "fuzz" / rel
    return place


def _images(s: Path) -> list[Path]:
    return sorted((s / "images").iterdir())


def _weights(s: Path) -> list[Path]:
    return sorted((s / "exp" / "models").iterdir())


def _opt_with(s: Path, i: Path, base: str, **changes: Any) -> Path:
    """The seed options file ``base`` with ``changes`` (``a__b`` = key ``a.b``) written into the input folder."""
    opt = yaml.safe_load((s / base).read_text())
    for key, value in changes.items():
        node = opt
        *parents, last = key.split("__")
        for p in parents:
            node = node[p]
        node[last] = value
    return write_options(i / f"changed_{base}", opt)


def _train(f: Path) -> list[str]:
    return ["train", "-opt", str(f), "--force_yml", "train.total_iter=2"]


def _resume(s: Path) -> list[str]:
    return ["train", "-opt", str(s / "train.yml"), "--auto_resume", "--force_yml", "train.total_iter=4"]


def _image_train(s: Path, i: Path, o: Path, f: Path) -> list[str]:
    for p in (s / "train").iterdir():
        shutil.copy(p, i / "train" / p.name)
    return _train(_opt_with(s, i, "train.yml", datasets__train__dataroot_gt=str(i / "train")))


def _weights_args(f: Path) -> list[str]:
    return ARCH if f.suffix == ".pth" else []


def _lmdb_place(s: Path, i: Path, o: Path, src: Path) -> Path:
    shutil.copytree(s / "t91.lmdb", i / "t91.lmdb")
    return i / "t91.lmdb" / src.name


KINDS = [
    Kind("options/train", lambda s: [s / "train.yml"], lambda s, i, o, f: _train(f), _in("opt")),
    Kind("options/test", lambda s: [s / "test.yml"], lambda s, i, o, f: ["test", "-opt", str(f)], _in("opt")),
    Kind("image/infer", _images, lambda s, i, o, f: ["infer", "--arch", "bicubic", "--scale", "2", "-i", str(f.parent),
                                                     "-o", str(o / "sr"), "--no-progress"], _in("img")),
    Kind("image/eval", _images,
         lambda s, i, o, f: ((i / "sr").mkdir(), shutil.copy(s / "images" / f.name, i / "sr" / f.name),
                             ["eval", "--gt", str(f.parent), "--sr", str(i / "sr"), "--scale", "2"])[2], _in("gt")),
    Kind("image/prepare-lr", _images,
         lambda s, i, o, f: ["prepare", "lr", "--hr", str(f.parent), "--out", str(o / "lr"), "--scale", "2"],
         _in("img")),
    Kind("image/prepare-subimages", _images,
         lambda s, i, o, f: ["prepare", "subimages", "--input", str(f.parent), "--output", str(o / "sub"),
                             "--crop-size", "32", "--step", "32"], _in("img")),
    Kind("image/prepare-lmdb", _images,
         lambda s, i, o, f: ["prepare", "lmdb", "--input", str(f.parent), "--output", str(o / "x.lmdb")],
         _in("img")),
    Kind("image/train", _images, _image_train, _in("train")),
    Kind("state/train --auto_resume", lambda s: sorted((s / "exp" / "training_states").glob("*.state")),
         lambda s, i, o, f: _resume(s), lambda s, i, o, src: _in_exp(f"training_states/{src.name}")(s, i, o, src)),
    Kind("weights/infer", _weights,
         lambda s, i, o, f: ["infer", "--weights", str(f), *_weights_args(f), "-i", str(s / "images" / "rgb.png"),
                             "-o", str(o / "sr"), "--no-progress"], _in("w")),
    Kind("weights/export", _weights,
         lambda s, i, o, f: ["export", str(f), *_weights_args(f), "--to", str(o / "plain.pth"),
                             str(o / "plain.safetensors")], _in("w")),
    Kind("weights/test", _weights,
         lambda s, i, o, f: ["test", "-opt", str(_opt_with(s, i, "test.yml", path__pretrain_network_g=str(f)))],
         _in("w")),
    Kind("history/report", lambda s: [s / "exp" / "history.json"],
         lambda s, i, o, f: ["report", str(o / "experiments" / "fuzz")], _in_exp("history.json")),
    Kind("history/train --auto_resume", lambda s: [s / "exp" / "history.json"],
         lambda s, i, o, f: _resume(s), _in_exp("history.json")),
    Kind("meta-info/train", lambda s: [s / "meta_info.txt"],
         lambda s, i, o, f: _train(_opt_with(s, i, "train.yml", datasets__train__meta_info_file=str(f))), _in("m")),
    Kind("lmdb/train", lambda s: [s / "t91.lmdb" / "data.mdb", s / "t91.lmdb" / "meta_info.txt"],
         lambda s, i, o, f: _train(_opt_with(s, i, "train.yml", datasets__train__dataroot_gt=str(f.parent),
                                             datasets__train__io_backend={"type": "lmdb"})), _lmdb_place),
    Kind("video/infer", lambda s: [s / "clip.mp4"] if (s / "clip.mp4").is_file() else [],
         lambda s, i, o, f: ["infer", "--arch", "bicubic", "--scale", "2", "-i", str(f), "-o", str(o / "x.mp4"),
                             "--no-progress"], _in("v")),
]


@dataclass
class Case:
    kind: str
    number: int
    source: str
    mutation: str
    result: CliResult


def run_case(kind: Kind, seeds: Path, work: Path, number: int, *, mutate: bool = True) -> Case | None:
    """Mutate one seed file of ``kind`` (drawn from ``SEED`` and ``number``) and run its command on it."""
    rng = random.Random(f"{SEED}:{kind.name}:{number}")
    sources = kind.sources(seeds)
    if not sources:
        return None
    src = rng.choice(sources)
    case = work / f"{kind.name.replace('/', '_').replace(' ', '')}_{number}"
    shutil.rmtree(case, ignore_errors=True)
    inp, out = case / "in", case / "out"
    inp.mkdir(parents=True)
    out.mkdir()
    dst = kind.place(seeds, inp, out, src)
    if mutate:
        what = mutate_file(src, dst, rng)
    else:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
        what = "none"
    args = kind.args(seeds, inp, out, dst)
    result = check_cli(args, cwd=out, watched=[inp, seeds])
    if not result.problems:
        shutil.rmtree(case, ignore_errors=True)
    return Case(kind.name, number, src.name, what, result)


# Findings left to others, with the reason: a case they explain is an expected failure (xfail, not strict).
KNOWN: list[tuple[Callable[[Case], bool], str]] = [
    (lambda c: c.kind.startswith("weights/") and c.mutation.startswith("safetensors.metadata"),
     "issue 20 item 2, other branch: safetensors metadata checked before a network is built"),
    (lambda c: c.kind == "lmdb/train" and c.source == "data.mdb" and (c.result.returncode or 0) < 0,
     "LMDB reads a damaged data.mdb without checks and can die of SIGBUS (left alone, benchmarks/robustness.md)"),
    (lambda c: "Corrupt JPEG data" in c.result.stderr or "Premature end of JPEG" in c.result.stderr,
     "libjpeg prints its warnings on stderr itself (left alone, see benchmarks/robustness.md)"),
]


def _known(c: Case) -> str | None:
    return next((reason for match, reason in KNOWN if match(c)), None)


def _check(cases: list[Case]) -> None:
    """Fail on any broken case nobody owns; mark the run xfail when only owned ones broke."""
    broken = [c for c in cases if c.result.problems]
    unknown = [c for c in broken if _known(c) is None]
    assert not unknown, "\n".join(_describe(c) for c in unknown)
    if broken:
        pytest.xfail("; ".join(sorted({f"{c.kind} #{c.number}: {_known(c)}" for c in broken})))


def _describe(c: Case) -> str:
    tail = c.result.stderr.strip().splitlines()[-12:]
    return (f"[{c.kind} #{c.number}] {c.source} {c.mutation}: {'; '.join(c.result.problems)}\n  anysr "
            f"{' '.join(c.result.args)}\n  " + "\n  ".join(tail))


def _record(name: str, data: dict[str, Any]) -> None:
    if REPORT:
        with open(REPORT, "a") as f:
            f.write(json.dumps({"run": name, **data}) + "\n")


def _summary(cases: list[Case], seconds: float) -> dict[str, Any]:
    per: dict[str, dict[str, int]] = {}
    for c in cases:
        row = per.setdefault(c.kind, {"cases": 0, "exit 0": 0, "exit 2": 0, "broken": 0})
        row["cases"] += 1
        row["broken" if c.result.problems else f"exit {c.result.returncode}"] += 1
    return {"seed": SEED, "cases": len(cases), "seconds": round(seconds, 1), "per_kind": per,
            "mean_case_s": round(sum(c.result.seconds for c in cases) / max(1, len(cases)), 2),
            "failures": [_describe(c) for c in cases if c.result.problems and not _known(c)],
            "known": [f"{_describe(c)}\n  known: {_known(c)}" for c in cases if c.result.problems and _known(c)]}


def _campaign(seeds: Path, work: Path, plan: list[tuple[Kind, int]], workers: int, seconds: float,
              mutate: bool = True) -> tuple[list[Case], float]:
    start = time.perf_counter()
    deadline = start + seconds

    def one(item: tuple[Kind, int]) -> Case | None:
        return run_case(item[0], seeds, work, item[1], mutate=mutate) if time.perf_counter() < deadline else None

    with ThreadPoolExecutor(workers) as pool:
        cases = [c for c in pool.map(one, plan) if c is not None]
    return cases, time.perf_counter() - start


def test_cli_fuzz_short(seeds: Path, tmp_path: Path) -> None:
    """One mutated file per (kind, command), fixed seed: every command ends in 0 or one line and status 2."""
    cases, seconds = _campaign(seeds, tmp_path, [(k, 0) for k in KINDS], workers=2, seconds=600)
    summary = _summary(cases, seconds)
    _record("cli-short", summary)
    assert len(cases) >= len(KINDS) - 1, "every kind ran (the video only where PyAV is installed)"
    _check(cases)


@pytest.mark.slow
@pytest.mark.skipif(LONG_CASES <= 0, reason="part of the long fuzz run: set ANYSR_FUZZ_CASES")
def test_cli_seed_files_are_valid(seeds: Path, tmp_path: Path) -> None:
    """The unmutated seed file of every kind goes through its command with status 0: the harness reaches the
    reading code instead of failing on its own set-up."""
    plan = [(k, n) for k in KINDS for n in range(len(k.sources(seeds)))]
    cases, _ = _campaign(seeds, tmp_path, plan, workers=2, seconds=900, mutate=False)
    # By design: `anysr eval` scores 8-bit images only and says so for the 16-bit seeds.
    bad = [c for c in cases if c.result.returncode != 0
           and not (c.kind == "image/eval" and "has uint16 pixels; the metrics need 8-bit images" in c.result.stderr)]
    assert not bad, "\n".join(f"{_describe(c)} (exit {c.result.returncode})" for c in bad)


@pytest.mark.slow
@pytest.mark.skipif(LONG_CASES <= 0, reason="the long fuzz run: set ANYSR_FUZZ_CASES (benchmarks/robustness.md)")
def test_cli_fuzz_long(seeds: Path, tmp_path: Path) -> None:
    """ANYSR_FUZZ_CASES cases, the kinds in turn, for at most ANYSR_FUZZ_SECONDS, two at a time."""
    plan = [(KINDS[n % len(KINDS)], 1 + n // len(KINDS)) for n in range(LONG_CASES)]
    cases, seconds = _campaign(seeds, tmp_path, plan, workers=2, seconds=LONG_SECONDS)
    summary = _summary(cases, seconds)
    _record("cli-long", summary)
    _check(cases)


# --------------------------------------------------------------------------------------------- the API layer
def _limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def test_api_fuzz(seeds: Path, tmp_path: Path) -> None:
    """Hundreds of mutated files straight into the functions the commands read them with, in one process under
    the memory limit: only AnysrError / OSError with a one-line message may come out."""
    assert len(api_seed_files(seeds)) >= 17
    seconds = 60 if LONG_CASES <= 0 else LONG_SECONDS
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "fuzzing.py"), "api", str(seeds), str(tmp_path),
                           str(API_CASES), str(SEED), str(seconds)], capture_output=True, text=True,
                          timeout=seconds + 120, preexec_fn=_limit, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    _record("api", summary)
    assert summary["cases"] >= min(API_CASES, 100)
    assert summary["outcomes"]["refused"] > 0 and summary["outcomes"]["ok"] > 0
    assert not summary["failures"], json.dumps(summary["failures"], indent=1)
    if summary["known"]:
        pytest.xfail(f"{len(summary['known'])} damaged LMDB file(s) crashed the reader (left alone)")


# --------------------------------------------------------------------------------------------- what it found
def test_truncated_lmdb_is_refused_not_a_bus_error(tmp_path: Path) -> None:
    """LMDB trusts its header and maps the file: a page past the end of a truncated data.mdb killed the process
    with SIGBUS. The backend now compares the file's size with its header first."""
    pytest.importorskip("lmdb")
    db = tmp_path / "x.lmdb"
    run_cli("prepare", "lmdb", "--input", str(DATASETS / "Set5" / "HR"), "--output", str(db), cwd=tmp_path)
    data = (db / "data.mdb").read_bytes()
    (db / "data.mdb").write_bytes(data[:len(data) // 2])
    code = ("from anysr.data.file_backends import LmdbBackend\nfrom anysr.errors import DataError\n"
            f"b = LmdbBackend({str(db)!r})\ntry:\n    [b.get(k) for k in b.keys()]\nexcept DataError as e:\n"
            "    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    assert "data.mdb is truncated or damaged" in proc.stdout and "anysr prepare lmdb" in proc.stdout


def test_meta_info_files_that_are_not_text(tmp_path: Path) -> None:
    from anysr.data.file_backends import read_lmdb_meta_info
    from anysr.data.paired_image_dataset import paired_names_from_meta_info
    from anysr.errors import DataError

    meta = tmp_path / "meta_info.txt"
    meta.write_bytes(b"baby.png (512,512,3) 1\n\xae\xff.png (1,1,3) 1\n")
    with pytest.raises(DataError, match=r"datasets\.train\.meta_info_file: .* is not UTF-8 text"):
        paired_names_from_meta_info(str(meta), str(tmp_path), str(tmp_path), key_path="datasets.train")
    with pytest.raises(DataError, match=r"meta_info\.txt: not UTF-8 text .*rebuild the LMDB"):
        read_lmdb_meta_info(tmp_path)


def test_damaged_videos_end_in_one_data_error(tmp_path: Path) -> None:
    """Damaged headers (a stream FFmpeg finds no codec for) and damaged packets midway (FFmpeg's
    InvalidDataError while decoding) used to escape as AttributeError / av errors."""
    from fuzzing import mutate_bytes

    from anysr.data.video_io import FrameSource
    from anysr.errors import DataError

    clip = tmp_path / "clip.mp4"
    if not _write_video(clip):
        pytest.skip("needs PyAV")
    data, refused = clip.read_bytes(), 0
    for n in range(60):
        bad = tmp_path / f"bad{n}.mp4"
        bad.write_bytes(mutate_bytes(data, random.Random(n))[1])
        try:
            list(FrameSource(bad).frames())
        except DataError as exc:
            refused += 1
            assert str(exc).startswith(f"-i {bad}")
    assert refused > 0


def test_codec_logs_and_video_progress_stay_off_stderr(tmp_path: Path) -> None:
    """A truncated TIFF: OpenCV's libtiff lines no longer precede the one-line error; `infer --no-progress` on a
    video draws no bar."""
    hr = tmp_path / "hr"
    hr.mkdir()
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))
    assert cv2.imwrite(str(hr / "a.tif"), img)
    (hr / "a.tif").write_bytes((hr / "a.tif").read_bytes()[:3000])
    proc = run_cli("prepare", "lr", "--hr", str(hr), "--out", str(tmp_path / "lr"), "--scale", "2", cwd=tmp_path,
                   check=False)
    assert proc.returncode == 2 and "a.tif" in proc.stderr
    assert len([x for x in proc.stderr.splitlines() if x.strip() and not x.startswith(" ")]) == 1, proc.stderr
    assert "TIFF" not in proc.stderr.splitlines()[0]
    clip = tmp_path / "clip.mp4"
    if _write_video(clip):
        proc = run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(clip), "-o", str(tmp_path / "x.mp4"),
                       "--no-progress", cwd=tmp_path)
        assert proc.stderr.strip() == "", proc.stderr


def test_several_architecture_argument_problems_are_one_message() -> None:
    from anysr.archs import build_network
    from anysr.errors import OptionError

    with pytest.raises(OptionError) as info:
        build_network({"type": "EDSR", "num_feat": 8, "num_block": 1, "upscale": 2})
    first, *rest = str(info.value).splitlines()
    assert first == "2 problems in network_g:"
    assert rest and all(x.startswith("  network_g.num_") for x in rest)


def test_video_metadata_that_is_not_utf8_is_one_data_error(tmp_path: Path) -> None:
    from anysr.data.video_io import FrameSource
    from anysr.errors import DataError

    clip = tmp_path / "clip.mp4"
    if not _write_video(clip):
        pytest.skip("needs PyAV")
    data = clip.read_bytes()
    assert b"VideoHandler" in data  # the stream's handler name, which PyAV decodes when it opens the file
    clip.write_bytes(data.replace(b"VideoHandler", b"\xffideoHandler"))
    with pytest.raises(DataError, match="metadata that is not UTF-8 text"):
        FrameSource(clip)


def test_image_header_opencv_refuses_is_a_data_error() -> None:
    """A BMP whose header claims a width over OpenCV's limit: cv2.imdecode raises cv2.error (not None)."""
    from anysr.data.imageio import decode_image
    from anysr.errors import DataError

    ok, buf = cv2.imencode(".bmp", np.zeros((4, 4, 3), np.uint8))
    data = bytearray(buf.tobytes())
    data[18:22] = (1 << 24).to_bytes(4, "little")  # biWidth
    with pytest.raises(DataError, match=r"image x\.bmp cannot be decoded: .*re-create or re-download it"):
        decode_image(bytes(data), source="x.bmp")


def test_pth_whose_zip_claims_an_unknown_version_still_loads(tmp_path: Path) -> None:
    """A bit flip in a .pth's zip directory ("version needed to extract" 6.4): the CRC check's zipfile raised
    NotImplementedError. Now that check steps aside and torch.load (which ignores the field) reads the tensors."""
    import torch

    from anysr.engine.checkpoint import load_weights

    path = tmp_path / "w.pth"
    torch.save({"params": {"conv.weight": torch.ones(2, 2)}}, path)
    data = bytearray(path.read_bytes())
    at = data.index(b"PK\x01\x02")  # the first central-directory record
    data[at + 6:at + 8] = (64).to_bytes(2, "little")
    path.write_bytes(bytes(data))
    sd, _ = load_weights(path, "auto")
    assert torch.equal(sd["conv.weight"], torch.ones(2, 2))

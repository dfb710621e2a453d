"""Loader throughput: decoded and cropped training samples per second per core, by file format and reader.

    PYTHONPATH=. python benchmarks/bench_loader.py [--seconds 3] [--workers 2] [--quick]
        [--shards URL [--storage-options JSON]] [--quickstart-iters 60] [--out FILE.md]

The data: the bundled T91 images whose shorter side is at least 128 (84 of 91) and Set14, as GT, with their x4
MATLAB-bicubic LQ (``anysr prepare lr``), written three ways: PNG files (as bundled), JPEG files (quality 95) and
BasicSR-layout LMDBs (``anysr prepare lmdb``: PNG bytes, compression 1). Every sample is a GT 128 / LQ 32 random
crop with random flips and rotations, made into tensors.

Tables printed:

* **decode alone**: one GT image's bytes in memory to an HWC BGR uint8 array (what anysr and BasicSR hand on),
  with each decoder installed: OpenCV ``cv2.imdecode`` (anysr's and BasicSR's), Pillow, and, when installed,
  ``pyspng`` (PNG) and ``simplejpeg`` (JPEG). None of these extra decoders is an anysr dependency.
* **samples**: per format, (a) BasicSR 1.4.2's ``PairedImageDataset.__getitem__`` re-stated (see
  :func:`basicsr_sample`: BasicSR itself cannot be imported beside torch 2.13 without torchvision), (b) anysr's
  ``PairedImageDataset`` with 0 loader workers (this process: one core) and (c) the same through a
  ``DataLoader`` with ``--workers`` worker processes (batch 8).

Each case runs about ``--seconds``. Two rates per row: *per s* (wall clock) and *per CPU-s* (samples per second of
CPU time of the processes doing the work: this process, or the loader workers). On a machine shared with other
jobs the wall rate falls with the load while the per-CPU-s rate holds much better: read the per-CPU-s column as
"per core". The 1-minute load average is printed per row; rows above 1.5 are starred.

The same pairs are also written as a local shard set (``anysr prepare shards``, read with ``io_backend: {type:
shards}``; skipped with a message where anysr[shards] is not installed). ``--shards URL``: also measure another
shard set of the same pairs: a local folder, ``file://`` or ``s3://...`` with ``--storage-options
'{"endpoint_url": "http://127.0.0.1:PORT"}'`` for a loopback S3 server.
``--quickstart-iters N``: also train the quick start (``options/train/quickstart_EDSR_x2.yml``) for N iterations
and report the share of the iteration time the step waited for data (the training log's
``time (data)``, from its ``summary.json``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
LOADED = 1.5  # 1-minute load average above which a row is starred
SCALE, GT_SIZE = 4, 128


# ------------------------------------------------------------------------------------------------ the data
def make_data(work: Path, limit: int | None) -> dict[str, tuple[str, str]]:
    """GT/LQ folders (PNG, JPEG) and LMDBs under ``work``: format -> (GT root, LQ root)."""
    from anysr.engine.prepare.command import prepare_lr

    gt_png, lq_png = work / "png" / "gt", work / "png" / "lq"
    gt_png.mkdir(parents=True)
    names = []
    for folder in ("T91", "Set14"):
        for p in sorted((ROOT / "datasets" / folder / "HR").glob("*.png")):
            h, w = cv2.imread(str(p), cv2.IMREAD_UNCHANGED).shape[:2]
            if min(h, w) >= GT_SIZE:
                names.append(p)
    if limit is not None:  # a few of each set: Set14's first three hold its gray image (bridge)
        names = names[:limit - 3] + [p for p in names if p.parent.parent.name == "Set14"][:3]
    for p in names:
        shutil.copy(p, gt_png / p.name)
    prepare_lr(gt_png, lq_png, SCALE, progress=False)
    out = {"png": (str(gt_png), str(lq_png))}
    jpg = work / "jpeg"
    for side, src in (("gt", gt_png), ("lq", lq_png)):
        (jpg / side).mkdir(parents=True)
        for p in sorted(src.glob("*.png")):
            img = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
            cv2.imwrite(str(jpg / side / f"{p.stem}.jpg"), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
    out["jpeg"] = (str(jpg / "gt"), str(jpg / "lq"))
    for side, src in (("gt", gt_png), ("lq", lq_png)):
        subprocess.run([sys.executable, "-m", "anysr.cli", "prepare", "lmdb", "--input", str(src), "--output",
                        str(work / f"{side}.lmdb")], check=True, cwd=ROOT, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    out["lmdb"] = (str(work / "gt.lmdb"), str(work / "lq.lmdb"))
    proc = subprocess.run([sys.executable, "-m", "anysr.cli", "prepare", "shards", str(gt_png), str(work / "shards"),
                           "--lq", str(lq_png)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode == 0:  # a local shard set of the same pairs (needs anysr[shards])
        out["shards"] = (str(work / "shards"), "")
    else:
        print(f"local shard set skipped: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return out


# ------------------------------------------------------------------------------------------------ decoders
def decoders() -> dict[str, dict[str, Callable[[bytes], np.ndarray]]]:
    """format -> {decoder name: bytes -> HWC BGR (or HW) uint8 array}, for the decoders installed."""
    from PIL import Image

    def opencv(b: bytes) -> np.ndarray:
        return cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_UNCHANGED)

    def pillow(b: bytes) -> np.ndarray:
        a = np.asarray(Image.open(io.BytesIO(b)))
        return np.ascontiguousarray(a[..., ::-1]) if a.ndim == 3 else a

    found: dict[str, dict[str, Callable[[bytes], np.ndarray]]] = {
        "png": {"OpenCV cv2.imdecode": opencv, "Pillow": pillow},
        "jpeg": {"OpenCV cv2.imdecode": opencv, "Pillow": pillow},
    }
    try:
        import pyspng

        def spng(b: bytes) -> np.ndarray:  # the channel swap as anysr's decode_image makes it
            a = pyspng.load(b)
            if a.ndim == 2 or a.shape[2] == 1:
                return a if a.ndim == 2 else a[:, :, 0]
            return cv2.cvtColor(a, cv2.COLOR_RGB2BGR if a.shape[2] == 3 else cv2.COLOR_RGBA2BGRA)

        found["png"]["pyspng"] = spng
    except ImportError:
        print("pyspng not installed (pip install pyspng): its row is left out")
    try:
        import simplejpeg

        def sjpeg(b: bytes) -> np.ndarray:
            if simplejpeg.decode_jpeg_header(b)[2] == "Gray":
                return simplejpeg.decode_jpeg(b, colorspace="GRAY")[:, :, 0]
            return simplejpeg.decode_jpeg(b, colorspace="BGR")

        found["jpeg"]["simplejpeg"] = sjpeg
    except ImportError:
        print("simplejpeg not installed (pip install simplejpeg): its row is left out")
    return found


# ------------------------------------------------------------------------------------------------ BasicSR
# BasicSR 1.4.2's PairedImageDataset.__getitem__ for training, re-stated step by step (BasicSR itself needs
# torchvision, which does not import beside torch 2.13). It follows, at tag v1.4.2:
#   basicsr/data/paired_image_dataset.py  https://github.com/XPixelGroup/BasicSR/blob/v1.4.2/basicsr/data/paired_image_dataset.py
#   FileClient.get (disk: open().read(); lmdb: txn.get(key))  basicsr/utils/file_client.py
#   imfrombytes(float32=True): cv2.imdecode(..., IMREAD_COLOR).astype(np.float32) / 255.  basicsr/utils/img_util.py
#   paired_random_crop, augment (cv2.flip in place, transpose)  basicsr/data/transforms.py
#   img2tensor(bgr2rgb=True, float32=True): cv2.cvtColor BGR2RGB, torch.from_numpy(HWC->CHW).float()
def _bsr_imfrombytes(content: bytes) -> np.ndarray:
    img = cv2.imdecode(np.frombuffer(content, np.uint8), cv2.IMREAD_COLOR)
    return img.astype(np.float32) / 255.0


def _bsr_paired_random_crop(gt: np.ndarray, lq: np.ndarray, gt_size: int, scale: int) -> tuple[np.ndarray, ...]:
    h_lq, w_lq = lq.shape[:2]
    lq_size = gt_size // scale
    top, left = random.randint(0, h_lq - lq_size), random.randint(0, w_lq - lq_size)
    lq = lq[top:top + lq_size, left:left + lq_size, ...]
    top_gt, left_gt = int(top * scale), int(left * scale)
    return gt[top_gt:top_gt + gt_size, left_gt:left_gt + gt_size, ...], lq


def _bsr_augment(imgs: list[np.ndarray], hflip: bool = True, rotation: bool = True) -> list[np.ndarray]:
    hflip = hflip and random.random() < 0.5
    vflip = rotation and random.random() < 0.5
    rot90 = rotation and random.random() < 0.5

    def _augment(img: np.ndarray) -> np.ndarray:
        if hflip:
            cv2.flip(img, 1, img)
        if vflip:
            cv2.flip(img, 0, img)
        if rot90:
            img = img.transpose(1, 0, 2)
        return img

    return [_augment(img) for img in imgs]


def _bsr_img2tensor(img: np.ndarray) -> torch.Tensor:
    img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    return torch.from_numpy(img.transpose(2, 0, 1)).float()


def basicsr_sample(get: Callable[[str, str], bytes], gt_key: str, lq_key: str) -> dict[str, Any]:
    """One training sample the way BasicSR 1.4.2 makes it (``get(key, side)`` is its FileClient)."""
    img_gt = _bsr_imfrombytes(get(gt_key, "gt"))
    img_lq = _bsr_imfrombytes(get(lq_key, "lq"))
    img_gt, img_lq = _bsr_paired_random_crop(img_gt, img_lq, GT_SIZE, SCALE)
    img_gt, img_lq = _bsr_augment([img_gt, img_lq])
    return {"lq": _bsr_img2tensor(img_lq), "gt": _bsr_img2tensor(img_gt), "lq_path": lq_key, "gt_path": gt_key}


# ------------------------------------------------------------------------------------------------ measuring
def load() -> float:
    return os.getloadavg()[0]


def timed(fn: Callable[[int], None], n_items: int, seconds: float) -> tuple[float, float]:
    """Call ``fn(i)`` over ``i = 0, 1, ...`` for about ``seconds``: (calls per wall s, calls per CPU s)."""
    for i in range(min(2, n_items)):  # warm up (imports, first allocations)
        fn(i)
    n, w0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - w0 < seconds:
        fn(n % n_items)
        n += 1
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    return n / wall, n / max(cpu, 1e-9)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def timed_workers(ds: Any, workers: int, samples: int) -> tuple[float, float]:
    """``samples`` items through a DataLoader with ``workers`` processes, batch 8: (per wall s, per worker CPU s).

    Every produced batch is consumed (no prefetch left over), so the workers' CPU time (read once they are joined)
    is exactly the time these samples cost; the wall time includes starting the workers."""
    batch = 8
    order = [i % len(ds) for i in range(max(batch, samples - samples % batch))]
    cpu0 = _children_cpu()
    w0 = time.perf_counter()
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, sampler=order, num_workers=workers,
                                         persistent_workers=False, multiprocessing_context="fork")
    n = sum(b["gt"].shape[0] for b in loader)
    wall = time.perf_counter() - w0
    del loader
    cpu = _children_cpu() - cpu0
    return n / wall, n / max(cpu, 1e-9)


def anysr_dataset(gt: str, lq: str, io_backend: dict[str, Any]) -> Any:
    from anysr.data import PairedImageDataset
    from anysr.options import validate_dataset

    opt = {"type": "PairedImageDataset", "dataroot_gt": gt, "dataroot_lq": lq, "io_backend": io_backend,
           "gt_size": GT_SIZE, "use_hflip": True, "use_rot": True, "batch_size_per_gpu": 8}
    if lq is None:
        del opt["dataroot_lq"]
    return PairedImageDataset(validate_dataset(opt, name="train", scale=SCALE, root=ROOT))


class _Seeded:
    """A dataset whose item ``i`` of call ``k`` is drawn with seed ``k`` (a fresh random crop each call)."""

    def __init__(self, ds: Any) -> None:
        self.ds, self.calls = ds, 0

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int) -> dict[str, Any]:
        self.calls += 1
        return self.ds[(i, self.calls)]


def _opencv_only(measure: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    """``measure()`` with anysr's PNG fast path (pyspng) turned off: every image decoded by OpenCV."""
    from anysr.data import imageio

    fast, imageio._pyspng = imageio._pyspng, None
    try:
        return measure()
    finally:
        imageio._pyspng = fast


def basicsr_getter(fmt: str, gt: str, lq: str) -> tuple[Callable[[str, str], bytes], list[tuple[str, str]]]:
    """BasicSR's FileClient for ``fmt`` and its (gt key, lq key) list."""
    if fmt == "lmdb":
        from anysr.data.file_backends import _process_env

        # BasicSR opens lmdb.open(root, readonly=True, lock=False, readahead=False); py-lmdb opens a folder once
        # per process, so this shares the environment anysr's backend opened the same way
        envs = {side: _process_env(root) for side, root in (("gt", gt), ("lq", lq))}

        def get_lmdb(key: str, side: str) -> bytes:
            with envs[side].begin(write=False) as txn:
                return bytes(txn.get(key.encode("ascii")))

        keys = [line.split()[0].rsplit(".", 1)[0] for line in (Path(gt) / "meta_info.txt").read_text().splitlines()]
        return get_lmdb, [(k, k) for k in keys]

    def get_disk(path: str, side: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    names = sorted(os.listdir(gt))
    return get_disk, [(os.path.join(gt, n), os.path.join(lq, n)) for n in names]


def star(x: float) -> str:
    return f"{x:.1f}" + (" \\*" if x > LOADED else "")


def table(header: Sequence[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i < 3 else "---:" for i in
                                                           range(len(header))) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def quickstart_wait(iters: int, work: Path) -> list[str]:
    """Train the quick start for ``iters`` iterations; its summary's mean data time over the mean iteration time."""
    exp = work / "quickstart"
    cmd = [sys.executable, "-m", "anysr.cli", "train", "-opt", "options/train/quickstart_EDSR_x2.yml",
           "--force_yml", f"train.total_iter={iters}", f"logger.print_freq={max(1, iters // 3)}",
           "logger.use_tb_logger=false", f"path.experiments_root={exp}", f"logger.save_checkpoint_freq={iters * 10}"]
    before = load()
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    s = json.loads((exp / "summary.json").read_text())
    it, data = float(s["mean_iter_time_s"]), float(s["mean_data_time_s"])
    return [f"quick start EDSR x2, {iters} iterations, batch 16, 1 worker", f"{it * 1e3:.1f} ms",
            f"{data * 1e3:.2f} ms", f"{100 * data / it:.1f} %", star(max(before, load()))]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="time per case (default 3)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; each row keeps its best "
                        "(default 3)")
    parser.add_argument("--workers", type=int, default=2, help="loader workers for the N-worker rows (default 2)")
    parser.add_argument("--quick", action="store_true", help="8 images, 0.3 s per case (a smoke test)")
    parser.add_argument("--shards", metavar="URL", help="also read this shard set (anysr prepare shards of the "
                        "same GT/LQ pairs)")
    parser.add_argument("--storage-options", default="{}", help="fsspec options for --shards, as JSON")
    parser.add_argument("--quickstart-iters", type=int, default=0, help="also train the quick start this many "
                        "iterations and report its data-wait share (0: skip)")
    parser.add_argument("--out", type=Path, help="also write the tables to this Markdown file")
    args = parser.parse_args(argv)
    seconds = 0.3 if args.quick else args.seconds
    rounds = 1 if args.quick else args.rounds
    torch.set_num_threads(1)
    cv2.setNumThreads(1)

    with tempfile.TemporaryDirectory(prefix="anysr-bench-loader-") as tmp:
        work = Path(tmp)
        data = make_data(work, 8 if args.quick else None)
        n_images = len(os.listdir(data["png"][0]))
        print(f"{n_images} GT images (T91 >= {GT_SIZE}, Set14), x{SCALE} LQ; {seconds:g} s per case; "
              f"{args.workers} workers; {os.cpu_count()} CPUs")

        # every case is a callable giving (per wall s, per CPU s); cases run interleaved, ``rounds`` times, and
        # each row keeps its best round (the one the other jobs on the machine disturbed least)
        cases: list[tuple[str, list[str], Callable[[], tuple[float, float]], float]] = []
        for fmt, decs in decoders().items():
            folder = data[fmt][0]
            blobs = [Path(folder, n).read_bytes() for n in sorted(os.listdir(folder))]
            ref = [cv2.imdecode(np.frombuffer(b, np.uint8), cv2.IMREAD_UNCHANGED) for b in blobs]
            mpix = sum(r.shape[0] * r.shape[1] for r in ref) / len(ref) / 1e6
            for name, fn in decs.items():
                same = all(np.array_equal(fn(b), r) for b, r in zip(blobs, ref, strict=True))
                cases.append(("decode", [fmt, name, "yes" if same else "NO"], lambda fn=fn, blobs=blobs: timed(
                    lambda i: fn(blobs[i]), len(blobs), seconds), mpix))

        sources: list[tuple[str, str, str | None, dict[str, Any]]] = [
            (fmt, data[fmt][0], data[fmt][1], {"type": "disk"}) for fmt in ("png", "jpeg")]
        sources.append(("lmdb", data["lmdb"][0], data["lmdb"][1], {"type": "lmdb"}))
        if "shards" in data:
            sources.append(("shards", data["shards"][0], None, {"type": "shards"}))
        if args.shards:
            sources.append(("shards (--shards)", args.shards, None,
                            {"type": "shards", "storage_options": json.loads(args.storage_options)}))
        from anysr.data import imageio

        for fmt, gt, lq, io_backend in sources:
            if lq is not None:
                get, keys = basicsr_getter(fmt, gt, lq)
                cases.append(("sample", [fmt, "BasicSR 1.4.2 (re-stated)", "0"], lambda get=get, keys=keys: timed(
                    lambda i: basicsr_sample(get, *keys[i]), len(keys), seconds), 0.0))
            ds = anysr_dataset(gt, lq, io_backend)
            seeded = _Seeded(ds)
            zero = len(cases)  # this format's anysr row with 0 workers
            cases.append(("sample", [fmt, "anysr PairedImageDataset", "0"], lambda seeded=seeded: timed(
                lambda i: seeded[i], len(seeded), seconds), 0.0))
            if fmt in ("png", "lmdb") and imageio._pyspng is not None:  # anysr with its OpenCV decoder only
                cases.append(("sample", [fmt, "anysr PairedImageDataset, OpenCV decoding", "0"],
                              lambda seeded=seeded: _opencv_only(lambda: timed(
                                  lambda i: seeded[i], len(seeded), seconds)), 0.0))
            if args.workers > 0:
                # as many samples as 0 workers make in ``seconds`` times the workers: about ``seconds`` again
                cases.append(("sample", [fmt, "anysr PairedImageDataset, DataLoader", str(args.workers)],
                              lambda ds=ds, n=zero: timed_workers(
                                  ds, args.workers, int(best[n][0] * seconds * args.workers) + 16), 0.0))

        best: list[list[float]] = [[0.0, 0.0, 0.0] for _ in cases]  # per wall s, per CPU s, highest load
        for r in range(rounds):
            for n, (kind, label, measure, _) in enumerate(cases):
                before = load()
                wall, cpu = measure()
                best[n] = [max(best[n][0], wall), max(best[n][1], cpu), max(best[n][2], before, load())]
                print(f"round {r + 1}/{rounds} {kind}: {' | '.join(label)}: {wall:.0f} per s, {cpu:.0f} per CPU-s, "
                      f"load {best[n][2]:.1f}", flush=True)
        dec_rows, sample_rows = [], []
        for (kind, label, _, mpix), (wall, cpu, high) in zip(cases, best, strict=True):
            if kind == "decode":
                dec_rows.append([*label[:2], f"{wall:.0f}", f"{cpu:.0f}", f"{cpu * mpix:.1f}", label[2], star(high)])
            else:
                sample_rows.append([*label, f"{wall:.0f}", f"{cpu:.0f}", star(high)])

        wait_rows = [quickstart_wait(args.quickstart_iters, work)] if args.quickstart_iters > 0 else []

    text = ("### Decode alone (one GT image's bytes in memory to an HWC BGR uint8 array, 1 thread)\n\n"
            + table(["format", "decoder", "images per s", "images per CPU-s", "megapixels per CPU-s",
                     "same array as OpenCV", "load"], dec_rows)
            + f"\n\n### Training samples (GT {GT_SIZE} / LQ {GT_SIZE // SCALE} random crop, flips, rotations, "
            "tensors)\n\n"
            + table(["format", "reader", "workers", "samples per s", "samples per CPU-s", "load"], sample_rows))
    if wait_rows:
        text += "\n\n### Waiting for data in training\n\n" + table(
            ["run", "iteration", "data wait", "share", "load"], wait_rows)
    print()
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

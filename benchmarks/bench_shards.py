"""Reading a shard set by key (byte ranges, anysr's io_backend type shards) against streaming whole shards, from an
S3 API server on the loopback interface (moto's ``moto_server``, started here as its own process), a local shard
set and the plain folder.

    PYTHONPATH=. python benchmarks/bench_shards.py [--images 91] [--threads 8] [--shard-size 4MB]

The data: T91's HR images (GT) and their x4 MATLAB-bicubic LQ, as GT/LQ pairs. Each mode reads every pair's GT
and LQ bytes once, in the order of the training sampler's first epoch (a shuffled order), and prints pairs per
second (best of ``--repeats``). Decoding the PNGs is timed too, for scale: it is what a loader worker does with the
bytes afterwards.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    exe = shutil.which("moto_server") or str(Path(sys.executable).with_name("moto_server"))
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto_server did not start")


def _rate(fn: Callable[[], int], repeats: int) -> float:
    best = 0.0
    for _ in range(repeats):
        start = time.perf_counter()
        n = fn()
        best = max(best, n / (time.perf_counter() - start))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=91)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--shard-size", default="4MB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for k, v in {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                 "AWS_DEFAULT_REGION": "us-east-1"}.items():
        os.environ.setdefault(k, v)

    import boto3
    import cv2

    from anysr.cli import _byte_size
    from anysr.data.sampler import TrainSampler
    from anysr.data.shards import ShardBackend
    from anysr.engine.prepare.command import make_shards, prepare_lr

    tmp = Path(tempfile.mkdtemp(prefix="bench_shards_"))
    proc, endpoint = _start_moto()
    try:
        gt, lq = tmp / "gt", tmp / "lq"
        gt.mkdir()
        for p in sorted((ROOT / "datasets" / "T91" / "HR").glob("*.png"))[: args.images]:
            shutil.copy(p, gt / p.name)
        prepare_lr(gt, lq, 4, progress=False)
        so = {"endpoint_url": endpoint}
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="bench")
        size = _byte_size(args.shard_size)
        report = make_shards(gt, "s3://bench/t91", lq=lq, shard_bytes=size, storage_options=so, progress=False)
        make_shards(gt, str(tmp / "local"), lq=lq, shard_bytes=size, progress=False)
        keys = ShardBackend(tmp / "local").keys()
        order = [keys[int(i)] for i in TrainSampler(len(keys), batch_size=1, seed=0).permutation(0)]
        total = sum(f.stat().st_size for f in gt.iterdir()) + sum(f.stat().st_size for f in lq.iterdir())
        print(f"{len(keys)} pairs, {total / 2**20:.1f} MiB, {report.shards} shards of <= {args.shard_size}; "
              f"pairs/s, best of {args.repeats}\n")
        print("| mode | pairs/s |\n| --- | ---: |")

        def row(name: str, fn: Callable[[], int], repeats: int = args.repeats) -> None:
            print(f"| {name} | {_rate(fn, repeats):.0f} |", flush=True)

        def folder() -> int:
            for k in order:
                (gt / f"{k}.png").read_bytes()
                (lq / f"{k}.png").read_bytes()
            return len(order)

        def by_key(root: str, threads: int, **kw: object) -> Callable[[], int]:
            def run() -> int:
                g = ShardBackend(root, storage_options=so if root.startswith("s3") else None, **kw)
                q = ShardBackend(root, "lq", storage_options=so if root.startswith("s3") else None, **kw)
                g.set.recent.clear()

                def one(k: str) -> None:
                    g.get(k)
                    q.get(k)
                if threads == 1:
                    for k in order:
                        one(k)
                else:
                    with ThreadPoolExecutor(threads) as pool:
                        list(pool.map(one, order))
                return len(order)
            return run

        def streaming(threads: int) -> Callable[[], int]:
            backend = ShardBackend("s3://bench/t91", storage_options=so)
            fs = backend.set.fs

            def shard(path: str) -> int:
                n = 0
                with tarfile.open(fileobj=io.BytesIO(fs.cat_file(path)), mode="r:") as tar:
                    for member in tar:
                        tar.extractfile(member).read()  # type: ignore[union-attr]
                        n += 1
                return n // 2

            def run() -> int:
                with ThreadPoolExecutor(threads) as pool:
                    return sum(pool.map(shard, backend.set.shards))
            return run

        def decode() -> int:
            for k in order:
                cv2.imdecode(__import__("numpy").frombuffer((gt / f"{k}.png").read_bytes(), "uint8"),
                             cv2.IMREAD_UNCHANGED)
            return len(order)

        row("folder on local disk (two files a pair)", folder)
        row("shards on local disk, by key", by_key(str(tmp / "local"), 1))
        row("S3 loopback, by key, 1 thread (no cache)", by_key("s3://bench/t91", 1))
        row(f"S3 loopback, by key, {args.threads} threads (no cache)", by_key("s3://bench/t91", args.threads))
        fills = iter(range(args.repeats))

        def filling() -> int:
            return by_key("s3://bench/t91", 1, cache_dir=tmp / f"cache{next(fills)}", cache_bytes=1 << 30)()
        row("S3 loopback, by key, 1 thread, cache filling (first epoch)", filling)
        row("S3 loopback, by key, 1 thread, cache warm (later epochs)",
            by_key("s3://bench/t91", 1, cache_dir=tmp / "cache0", cache_bytes=1 << 30))
        row("S3 loopback, whole shards streamed in order, 1 thread", streaming(1))
        row(f"S3 loopback, whole shards streamed in order, {args.threads} threads", streaming(args.threads))
        row("(decoding the GT PNG alone, 1 thread)", decode)
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

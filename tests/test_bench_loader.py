"""Loader throughput: the fast PNG decoder gives OpenCV's arrays; ``benchmarks/bench_loader.py`` fills its tables."""

from __future__ import annotations

import io
import os
import re
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cv2
import numpy as np
import pytest

from anysr.data import imageio
from anysr.data.imageio import decode_image

ROOT = Path(__file__).resolve().parent.parent


def _opencv(data: bytes) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)


def test_pyspng_decodes_the_bundled_images_as_opencv_does() -> None:
    pytest.importorskip("pyspng")
    files = sorted((ROOT / "datasets").glob("*/HR/*.png"))
    assert len(files) >= 110
    used = 0
    for f in files:
        data = f.read_bytes()
        fast = imageio._spng_decode(np.frombuffer(data, np.uint8), data)
        used += fast is not None
        got = decode_image(data, source=str(f))
        want = _opencv(data)
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), f
        assert got.flags["C_CONTIGUOUS"]
    assert used == len(files)  # every bundled image (RGB and Set14's gray one) takes the fast path


def test_png_kinds_the_fast_path_leaves_to_opencv_decode_the_same() -> None:
    pytest.importorskip("pyspng")
    from PIL import Image

    rng = np.random.default_rng(0)

    def pil_png(img: Image.Image, **kw: object) -> bytes:
        f = io.BytesIO()
        img.save(f, "PNG", **kw)
        return f.getvalue()

    rgb = rng.integers(0, 256, (20, 30, 3)).astype(np.uint8)
    cases = {
        "8-bit BGRA": (cv2.imencode(".png", rng.integers(0, 256, (20, 30, 4)).astype(np.uint8))[1].tobytes(), True),
        "16-bit gray": (cv2.imencode(".png", rng.integers(0, 65536, (20, 30)).astype(np.uint16))[1].tobytes(), False),
        "16-bit BGR": (cv2.imencode(".png", rng.integers(0, 65536, (20, 30, 3)).astype(np.uint16))[1].tobytes(), False),
        "palette": (pil_png(Image.fromarray(rgb).convert("P")), False),
        "gray + alpha": (pil_png(Image.fromarray(rng.integers(0, 256, (20, 30, 2)).astype(np.uint8), "LA")), False),
        "1-bit": (pil_png(Image.fromarray(rng.integers(0, 2, (20, 30)).astype(bool))), False),
        "RGB + tRNS": (pil_png(Image.fromarray(rgb), transparency=(0, 0, 0)), False),
    }
    plain = cv2.imencode(".png", rgb)[1].tobytes()
    for kind, body in ((b"gAMA", struct.pack(">I", 100000)), (b"sBIT", bytes([5, 6, 5])), (b"sRGB", b"\x00")):
        chunk = struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        cases[f"RGB + {kind.decode()}"] = (plain[:33] + chunk + plain[33:], True)  # neither decoder applies it
    for name, (data, fast) in cases.items():
        assert (imageio._spng_decode(np.frombuffer(data, np.uint8), data) is not None) == fast, name
        got, want = decode_image(data), _opencv(data)
        assert got.dtype == want.dtype and np.array_equal(got, want), name
    good = cases["8-bit BGRA"][0]
    with pytest.raises(imageio.DataError, match="truncated, corrupt"):
        decode_image(good[: len(good) // 2], source="half.png")


@pytest.mark.slow  # about a minute: it builds the data, trains 2 iterations of the quick start
def test_bench_loader_quick_fills_every_row(tmp_path: Path) -> None:
    out = tmp_path / "loader.md"
    proc = subprocess.run([sys.executable, "benchmarks/bench_loader.py", "--quick", "--workers", "1",
                           "--quickstart-iters", "2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = out.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| format")
            and not line.startswith("| run")]
    formats = {r.split(" | ")[0][2:] for r in rows}
    assert {"png", "jpeg", "lmdb"} <= formats
    assert sum("BasicSR 1.4.2" in r for r in rows) == 3 and sum("DataLoader" in r for r in rows) == 4
    assert any("quick start EDSR x2" in r for r in rows)
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        assert all(cells), r
        numbers = [float(m.group()) for c in cells[:-1] if (m := re.match(r"\d+(\.\d+)?", c))]
        assert len(numbers) >= 2 and min(numbers[-2:]) > 0, r  # the two rates (or the wait and its share)
        assert "NO" not in cells, r  # every decoder gave OpenCV's array
    assert "shards" in formats  # the local shard set of the same pairs (anysr[shards] is in the dev extra)

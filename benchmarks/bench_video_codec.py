"""Time of :func:`anysr.data.degradation.video_codec.compress_clip` per codec and frame size (loader-side cost).

    PYTHONPATH=. python benchmarks/bench_video_codec.py [--frames 15] [--sizes 64 256] [--bitrate 50000] [--iters 3]

The clip: ``--frames`` crops of Set14's baboon drifting one pixel down and two right per frame. Each codec the
installed PyAV build has is timed best of ``--iters`` calls after one warm-up (encode in memory, decode back, one
encoder thread). Prints a Markdown table (milliseconds per clip) and the mean absolute change of the pixels.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from anysr.data.degradation.video_codec import available_codecs, compress_clip
from anysr.data.imageio import read_image

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=15)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--bitrate", type=int, default=50_000)
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    img = read_image(ROOT / "datasets" / "Set14" / "HR" / "baboon.png")
    codecs = [c for c in available_codecs() if c != "h264"]  # h264: FFmpeg's default H.264 encoder (libx264)
    print("| frame size | " + " | ".join(codecs) + " |")
    print("|---|" + "---:|" * len(codecs))
    for size in args.sizes:
        clip = [np.ascontiguousarray(img[t: t + size, 2 * t: 2 * t + size]) for t in range(args.frames)]
        cells = []
        for codec in codecs:
            compress_clip(clip, codec, bitrate=args.bitrate)
            best = float("inf")
            for _ in range(args.iters):
                start = time.perf_counter()
                out = compress_clip(clip, codec, bitrate=args.bitrate)
                best = min(best, time.perf_counter() - start)
            change = float(np.abs(np.stack(out).astype(np.int16) - np.stack(clip)).mean())
            cells.append(f"{best * 1000:.0f} ms (change {change:.1f})")
        print(f"| {size} x {size} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

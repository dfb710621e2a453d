"""``anysr infer`` on videos: a video file or a folder of frames in, a video file (the source's frame rate,
timestamps and audio) or a folder of frames out, through an image network (frame by frame) or a video network.

Window networks (EDVR, TOFlow, DUF) see the ``num_frame`` frames around each output frame (BasicSR's
``reflection_circle`` padding at the ends); recurrent networks (BasicVSR, IconVSR, BasicVSR++) run in overlapping
temporal chunks (``--chunk`` frames kept per pass, ``--chunk-pad`` frames of context each side). Frames are read as
they are needed and results written as they come, so memory holds one chunk (or window) of frames, not the
video; ``--tile`` also tiles every frame in space. A progress bar shows frames per second.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from anysr.accelerators import Accelerator
from anysr.archs.kinds import arch_kind
from anysr.data.imageio import write_image
from anysr.data.video_datasets import frame_window
from anysr.data.video_io import FrameSource, SourceInfo, VideoWriter, is_video_file
from anysr.engine.evaluation.forward import chunked_outputs, window_forward
from anysr.engine.inference.images import _Pixels, _to_input, _to_stored, upscale_image
from anysr.engine.logger import get_logger, log_start, setup_logging
from anysr.errors import DataError

TOF_DUF_FRAMES = 7  # TOFlow and DUF take 7 frames
TIMING_SIDE = 64
_PIXELS = _Pixels(255.0, 255, np.uint8, False)


def window_frames(net: nn.Module) -> int:
    """Frames a window network takes (EDVR's num_frame; TOFlow and DUF: 7)."""
    n = getattr(net, "num_frame", None)
    return int(n) if isinstance(n, int) else TOF_DUF_FRAMES


# ------------------------------------------------------------------------------------------ the worker
class _FrameBuffer:
    """Frames of a source read in order and kept while some window may still need them."""

    def __init__(self, source: FrameSource) -> None:
        self.it = source.frames()
        self.frames: dict[int, np.ndarray] = {}
        self.pts: dict[int, int] = {}
        self.read = 0

    def get(self, i: int) -> np.ndarray:
        while i >= self.read:
            try:
                k, img, pts = next(self.it)
            except StopIteration:
                raise DataError(f"the video ended after {self.read} frames although its header promised more; "
                                "re-mux it (e.g. ffmpeg -i in -c copy out.mp4) or extract its frames") from None
            self.frames[k], self.pts[k] = img, pts
            self.read = k + 1
        return self.frames[i]

    def drop_before(self, i: int) -> None:
        for k in [k for k in self.frames if k < i]:
            del self.frames[k]


def _clip_tensor(frames: list[np.ndarray], acc: Accelerator) -> torch.Tensor:
    return torch.cat([_to_input(f, _PIXELS, 3, acc) for f in frames], dim=0).unsqueeze(0)


class _Sink:
    """Where result frames go: a video file (timing and audio of the source) or a folder of PNGs."""

    def __init__(self, dst: Path, info: SourceInfo, names: list[str], suffix: str | None) -> None:
        self.dst, self.info, self.names, self.suffix = dst, info, names, suffix
        self.writer: VideoWriter | None = None
        if not is_video_file(dst):
            dst.mkdir(parents=True, exist_ok=True)

    def put(self, i: int, img: np.ndarray, pts: int) -> None:
        if is_video_file(self.dst):
            if self.writer is None:
                if img.shape[0] % 2 or img.shape[1] % 2:
                    raise DataError(f"-o {self.dst}: a {img.shape[1]}x{img.shape[0]} result cannot be encoded as "
                                    "yuv420p video (odd size); write frames to a folder instead")
                self.writer = VideoWriter(self.dst, self.info, img.shape[1], img.shape[0])
            self.writer.write(img, pts)
        else:
            name = f"{self.names[i]}_{self.suffix}" if self.suffix else self.names[i]
            write_image(self.dst / f"{name}.png", img)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def video_infer_worker(acc: Accelerator, net: nn.Module, source: FrameSource, dst: Path, scale: int,
                       tile: int | None, tile_pad: int, chunk: int | None, chunk_pad: int,
                       suffix: str | None, progress: bool = True) -> Path:
    """Upscale every frame of ``source`` into ``dst`` (see the module docstring); ``progress``: a bar over the
    frames (``--no-progress`` turns it off)."""
    setup_logging(enabled=acc.is_main)
    kind = arch_kind(net)
    n = source.info.frames
    frames = window_frames(net) if kind == "window" else min(chunk + 2 * chunk_pad, n) if chunk else min(n, 3)
    shape = (1, 3, TIMING_SIDE, TIMING_SIDE) if kind == "image" else (1, max(frames, 2), 3, TIMING_SIDE, TIMING_SIDE)
    acc.calibrate(net.eval(), shape, train=False)
    log_start("infer (video)", acc)
    get_logger().info("%s: %d frames of %dx%d at %s fps -> x%d with %s (%s network)", source.path, n,
                      source.info.width, source.info.height, float(source.info.rate), scale, type(net).__name__, kind)
    net = acc.prepare_model(net).eval()
    sink = _Sink(dst, source.info, source.names(), suffix)
    buf = _FrameBuffer(source)
    bar = tqdm(total=n, desc="infer", unit="frame", dynamic_ncols=True, disable=not (acc.is_main and progress))

    def emit(i: int, img: np.ndarray) -> None:
        sink.put(i, img, buf.pts[i])
        bar.update(1)

    try:
        if kind == "image":
            for i in range(n):
                img = buf.get(i)
                emit(i, upscale_image(net, img, _PIXELS, acc, scale=scale, tile=tile, tile_pad=tile_pad, channels=3,
                                      path=source.path))
                buf.drop_before(i + 1)
        elif kind == "window":
            t = window_frames(net)
            for i in range(n):
                idx = frame_window(i, n, t, "reflection_circle")
                lq = _clip_tensor([buf.get(j) for j in idx], acc)
                out = window_forward(net, lq, acc, scale=scale, tile=tile, tile_pad=tile_pad)
                emit(i, _to_stored(out, _PIXELS, acc))
                buf.drop_before(i - 2 * (t // 2))
        else:
            def window(a: int, b: int) -> torch.Tensor:
                buf.drop_before(a)
                return _clip_tensor([buf.get(j) for j in range(a, b)], acc)

            for idx, out in chunked_outputs(net, window, n, acc, scale=scale, chunk=chunk or None,
                                            chunk_pad=chunk_pad, flip_seq=False, tile=tile, tile_pad=tile_pad):
                for k, i in enumerate(idx):
                    emit(i, _to_stored(out[:, k], _PIXELS, acc))
    finally:
        bar.close()
        sink.close()
    acc.strategy.barrier()
    return dst


__all__ = ["video_infer_worker", "window_frames"]

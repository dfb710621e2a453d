"""Video files in and out with PyAV (the optional extra ``anysr[video]``): frames as OpenCV-style HWC BGR uint8
arrays with their timestamps, and a writer that keeps the source's timing and copies its audio unchanged.

A folder of frames (sorted image files) is a video source too, at a frame rate given by the caller.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from anysr.data.file_backends import DiskBackend
from anysr.data.imageio import list_images
from anysr.errors import DataError

VIDEO_EXTENSIONS = (".mp4", ".mkv", ".mov", ".avi", ".webm", ".m4v", ".mpg", ".mpeg", ".ts", ".flv", ".wmv")
# Encoders tried in order for the written video stream (the first this PyAV build has).
VIDEO_CODECS = ("libx264", "h264", "mpeg4")


def is_video_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a video file by its extension (``VIDEO_EXTENSIONS``)."""
    return Path(path).suffix.lower() in VIDEO_EXTENSIONS


def import_av() -> Any:
    """PyAV, or a DataError saying how to install it."""
    try:
        import av  # noqa: PLC0415 - optional dependency (anysr[video])
    except ImportError:
        raise DataError("reading and writing video files needs PyAV: pip install 'anysr[video]' (or pip install "
                        "av); a folder of frames works without it") from None
    return av


@dataclass(frozen=True)
class SourceInfo:
    """What a frame source holds: ``frames`` frames of ``width`` x ``height`` at ``rate`` frames per second,
    timestamps in units of ``time_base``; ``audio``: whether a video file has an audio stream to pass through."""

    frames: int
    width: int
    height: int
    rate: Fraction
    time_base: Fraction
    audio: bool
    path: Path


class FrameSource:
    """Frames of a video file or a folder of images, in order: ``frames()`` yields (index, BGR uint8, pts)."""

    def __init__(self, path: str | os.PathLike[str], fps: float | None = None) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise DataError(f"-i {self.path}: no such file or folder")
        self.files: list[Path] = []
        if self.path.is_dir():
            self.files = list_images(self.path)
            if not self.files:
                raise DataError(f"-i {self.path}: the folder holds no frames (image files)")
            first = self._read_file(0)
            rate = Fraction(fps or 25).limit_denominator(1001)
            self.info = SourceInfo(len(self.files), first.shape[1], first.shape[0], rate, 1 / rate, False, self.path)
            return
        av = import_av()
        try:
            with av.open(str(self.path)) as container:
                if not container.streams.video:
                    raise DataError(f"-i {self.path}: the file has no video stream")
                stream = container.streams.video[0]
                if stream.codec_context is None:  # a damaged header names no codec FFmpeg knows
                    raise DataError(f"-i {self.path}: the video stream names no codec FFmpeg can decode (a damaged "
                                    "or unsupported file); re-encode or re-download it")
                rate = stream.average_rate or stream.guessed_rate or Fraction(fps or 25)
                count = self._count(container, stream)
                self.info = SourceInfo(count, stream.codec_context.width, stream.codec_context.height,
                                       Fraction(rate), Fraction(stream.time_base or 1 / rate),
                                       bool(container.streams.audio), self.path)
        except (av.error.FFmpegError, UnicodeDecodeError) as exc:  # damaged metadata: not UTF-8
            why = "metadata that is not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else exc
            raise DataError(f"-i {self.path}: not a readable video ({why}); re-encode or re-download it") from None
        if self.info.frames == 0:
            raise DataError(f"-i {self.path}: the video has no frames")

    @staticmethod
    def _count(container: Any, stream: Any) -> int:
        """Frames of the video stream: from its header when given, else by reading its packets (no decoding)."""
        if stream.frames:
            return int(stream.frames)
        n = sum(1 for packet in container.demux(stream) if packet.size)
        container.seek(0)
        return n

    def _read_file(self, i: int) -> np.ndarray:
        img = DiskBackend().read_uint8(str(self.files[i]))
        return np.repeat(img[:, :, None], 3, axis=2) if img.ndim == 2 else img

    def names(self) -> list[str]:
        """A file stem per frame (the folder's own, or frame_000000 ...)."""
        if self.files:
            return [p.stem for p in self.files]
        return [f"frame_{i:06d}" for i in range(self.info.frames)]

    def frames(self) -> Iterator[tuple[int, np.ndarray, int]]:
        """(index, HWC BGR uint8 frame, pts in ``info.time_base``), in display order."""
        if self.files:
            for i in range(len(self.files)):
                yield i, self._read_file(i), i
            return
        av = import_av()
        i = 0
        try:
            with av.open(str(self.path)) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                for frame in container.decode(stream):
                    pts = frame.pts if frame.pts is not None else i
                    yield i, frame.to_ndarray(format="bgr24"), int(pts)
                    i += 1
        except (av.error.FFmpegError, UnicodeDecodeError) as exc:  # damaged packets midway: FFmpeg's message
            raise DataError(f"-i {self.path}: frame {i} cannot be decoded ({exc}); re-encode or re-download the "
                            "video") from None
        if i != self.info.frames:  # the header's count was wrong: what was decoded is what there is
            self.info = replace(self.info, frames=i)


class VideoWriter:
    """Write BGR uint8 frames to a video file with ``info``'s timing; the source file's audio streams are copied
    packet for packet (no re-encoding) when ``info.audio``. Use as a context manager."""

    def __init__(self, path: str | os.PathLike[str], info: SourceInfo, width: int, height: int,
                 crf: int = 18) -> None:
        av = import_av()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.info = info
        self.out = av.open(str(self.path), "w")
        codec = next((c for c in VIDEO_CODECS if c in av.codecs_available), None)
        if codec is None:
            raise DataError(f"this PyAV build has none of the video encoders {', '.join(VIDEO_CODECS)}")
        self.stream = self.out.add_stream(codec, rate=info.rate)
        self.stream.width, self.stream.height = width, height
        self.stream.pix_fmt = "yuv420p"
        self.stream.time_base = info.time_base
        if codec in ("libx264", "h264"):
            self.stream.options = {"crf": str(crf), "preset": "medium"}
        self.source = None
        self.audio: list[tuple[Any, Any]] = []
        if info.audio:
            self.source = av.open(str(info.path))
            for a in self.source.streams.audio:
                self.audio.append((a, self.out.add_stream_from_template(a)))

    def write(self, img: np.ndarray, pts: int) -> None:
        av = import_av()
        frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="bgr24")
        frame.pts, frame.time_base = pts, self.info.time_base
        for packet in self.stream.encode(frame):
            self.out.mux(packet)

    def close(self) -> None:
        for packet in self.stream.encode():
            self.out.mux(packet)
        if self.source is not None:
            streams = {a.index: target for a, target in self.audio}
            for packet in self.source.demux([a for a, _ in self.audio]):
                if packet.dts is None:  # the demuxer's end-of-stream marker
                    continue
                packet.stream = streams[packet.stream.index]
                self.out.mux(packet)
            self.source.close()
        self.out.close()

    def __enter__(self) -> VideoWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["FrameSource", "SourceInfo", "VIDEO_EXTENSIONS", "VideoWriter", "import_av", "is_video_file"]

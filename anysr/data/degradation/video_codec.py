"""Video codec compression of a clip (RealBasicVSR's ``RandomVideoCompression``, through PyAV) and its draws.

A clip of uint8 frames is encoded in memory as one MP4 stream (H.264 by libx264, MPEG-4 part 2, or H.265 by
libx265; ``yuv420p``, frame rate 1) at a bitrate or a CRF, and decoded back: the compression artefacts of real
videos, moving and flickering with the content, that frame-wise JPEG cannot give. Every frame of a clip shares
one draw (codec, bitrate or CRF), as in RealBasicVSR.

* :class:`VideoCompressionSettings`: the distribution (RealBasicVSR's ``codec``, ``codec_prob``, ``bitrate``
  keys, plus ``crf`` and ``prob``); :func:`draw_video_compression` draws from it with a counter-based generator
  (:func:`clip_rng` of the sample seed), so a clip's compression depends on ``(seed, epoch, index)`` only.
* :func:`compress_clip`: the codec itself. Its encoders run on one thread: libx265 and FFmpeg's MPEG-4 encoder
  give different streams with different thread counts, so a fixed count keeps a draw's result the same on every
  machine (RealBasicVSR leaves it to FFmpeg, which picks it from the CPU count). libx264 (PyAV 18's FFmpeg 8.1)
  also reads heap memory it never wrote: the same clip came out in up to 4 ways in one process, depending on what
  was encoded before (measured at 32 and 96 pixels, libx264 and h264). On glibc the encodes run with freshly
  allocated memory zero-filled (``mallopt(M_PERTURB)``, set and restored around each), as in a fresh process: the
  result of a draw is then the same whatever ran before it (every worker, rank and resume).

PyAV is an optional dependency (``pip install 'anysr[video]'``); it is imported when a clip is compressed or
the codecs are listed.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from anysr.data.degradation.draws import categorical, check_range
from anysr.errors import DataError, OptionError

__all__ = ["CODECS", "CRF_CODECS", "MIN_FRAMES", "PAD_TO", "REALBASICVSR_BITRATE", "VideoCompressionSettings",
           "CompressionDraw", "available_codecs", "clip_rng", "draw_video_compression", "compress_clip", "import_av"]

CODECS = ("libx264", "h264", "mpeg4", "libx265")  # encoder names as FFmpeg knows them ('h264': its default one)
CRF_CODECS = ("libx264", "h264", "libx265")  # the encoders with a constant-rate-factor mode
REALBASICVSR_BITRATE = (10_000, 100_000)  # bits per second, RealBasicVSR's range
# Frames smaller than this (height or width) are padded to it for the encoder, and the result cropped back. libx265
# 3.x (PyAV 18's wheel) misbehaves on small frames with its default settings: different streams from call to call at
# a width of 64 or at 16 x 16, heap corruption at 32 x 48, no encoder below 16; measured stable from 96 up.
PAD_TO = {"libx265": 96}
# Clips shorter than this are lengthened for the encoder by repeating their last frame, and the extra frames dropped
# after decoding. FFmpeg 8's libx265 wrapper reads the output picture of x265 4.x (API build >= 210) from memory x265
# did not fill when a clip has one or two frames: measured on PyAV 18, 73 of 150 two-frame clips and 7 of 150 one-frame
# clips failed ("Not yet implemented in FFmpeg" / "Unknown picture type"), none of 360 of three frames or more.
MIN_FRAMES = {"libx265": 3}
_TAG_CLIP = 7201  # keeps the clip generator apart from the dataset's other draws


def import_av() -> Any:
    """The ``av`` module, or a DataError saying how to install it."""
    try:
        import av  # noqa: PLC0415 - optional dependency (anysr[video])
    except ImportError:
        raise DataError("video compression needs PyAV, which is not installed: pip install 'anysr[video]' "
                        "(or pip install av)") from None
    return av


@functools.lru_cache(maxsize=1)
def available_codecs() -> tuple[str, ...]:
    """The names of :data:`CODECS` that the installed PyAV build can encode with (DataError without PyAV)."""
    av = import_av()
    out = []
    for name in CODECS:
        try:
            av.Codec(name, "w")
        except ValueError:  # av's UnknownCodecError
            continue
        out.append(name)
    return tuple(out)


def _check_codec(name: str, where: str) -> None:
    if name not in CODECS:
        raise OptionError(f"{where}: unknown video codec {name!r}; choose from {', '.join(CODECS)}")
    have = available_codecs()
    if name not in have:
        av = import_av()
        raise OptionError(f"{where}: video codec {name!r} is not in this PyAV build (av {av.__version__}, FFmpeg "
                          f"{av.ffmpeg_version_info}); available: {', '.join(have) or 'none'}")


@dataclass(frozen=True)
class VideoCompressionSettings:
    """The distribution of one clip's compression.

    ``codec`` / ``codec_prob``: the encoders and their weights (RealBasicVSR: libx264, h264, mpeg4 at 1/3 each;
    'h264' is FFmpeg's default H.264 encoder, libx264 in PyAV's wheels). ``bitrate``: the [low, high] range (bits
    per second) of a uniform integer draw, or ``crf``: the same for the constant rate factor (0-51; only for
    H.264 / H.265); both None: RealBasicVSR's bitrate range [1e4, 1e5]. ``prob``: the chance a clip is compressed
    at all. The codecs are checked against the installed PyAV build.
    """

    codec: tuple[str, ...] = ("libx264", "h264", "mpeg4")
    codec_prob: tuple[float, ...] | None = None
    bitrate: tuple[int, int] | None = None
    crf: tuple[int, int] | None = None
    prob: float = 1.0
    where: str = "video_compression"

    def __post_init__(self) -> None:
        where = self.where
        codecs = tuple(str(c) for c in self.codec)
        if not codecs:
            raise OptionError(f"{where}.codec: give at least one codec, e.g. [libx264, h264, mpeg4]")
        for name in codecs:
            _check_codec(name, f"{where}.codec")
        probs = (1.0,) * len(codecs) if self.codec_prob is None else tuple(float(p) for p in self.codec_prob)
        if len(probs) != len(codecs):
            raise OptionError(f"{where}.codec_prob: {len(probs)} weight(s) for {len(codecs)} codec(s); give one "
                              "per codec")
        if any(not math.isfinite(p) or p < 0 for p in probs) or sum(probs) <= 0:
            raise OptionError(f"{where}.codec_prob: weights must be >= 0 with a positive sum, got {list(probs)}")
        object.__setattr__(self, "codec", codecs)
        object.__setattr__(self, "codec_prob", probs)
        if self.bitrate is not None and self.crf is not None:
            raise OptionError(f"{where}: give bitrate or crf, not both")
        if self.crf is not None:
            lo, hi = check_range(self.crf, where, "crf")
            if not (0 <= lo and hi <= 51 and lo == int(lo) and hi == int(hi)):
                raise OptionError(f"{where}.crf: must be integers in [0, 51], got {[lo, hi]}")
            no_crf = [c for c in codecs if c not in CRF_CODECS]
            if no_crf:
                raise OptionError(f"{where}.crf: {', '.join(no_crf)} has no CRF mode (only {', '.join(CRF_CODECS)}); "
                                  "use bitrate, or drop it from codec")
            object.__setattr__(self, "crf", (int(lo), int(hi)))
        else:
            lo, hi = check_range(REALBASICVSR_BITRATE if self.bitrate is None else self.bitrate, where, "bitrate")
            low, high = math.ceil(lo), math.floor(hi)
            if low < 1 or low > high:
                raise OptionError(f"{where}.bitrate: must be a range of bits per second >= 1 holding an integer, "
                                  f"got {[lo, hi]}")
            object.__setattr__(self, "bitrate", (low, high))
        if not 0.0 <= float(self.prob) <= 1.0:
            raise OptionError(f"{where}.prob: must be a probability in [0, 1], got {self.prob!r}")
        object.__setattr__(self, "prob", float(self.prob))

    @classmethod
    def from_options(cls, opt: Mapping[str, Any], where: str = "video_compression") -> VideoCompressionSettings:
        """From a ``video_compression`` option mapping (keys codec, codec_prob, bitrate, crf, prob)."""
        def pair(key: str) -> tuple[Any, Any] | None:
            value = opt.get(key)
            return None if value is None else tuple(value)  # type: ignore[return-value]

        codec = opt.get("codec")
        probs = opt.get("codec_prob")
        return cls(codec=tuple(codec) if codec is not None else cls.codec,
                   codec_prob=None if probs is None else tuple(probs), bitrate=pair("bitrate"), crf=pair("crf"),
                   prob=float(opt.get("prob", cls.prob)), where=where)


@dataclass(frozen=True)
class CompressionDraw:
    """One clip's draw: the codec (None: the clip is left as it is) and its bitrate or CRF."""

    codec: str | None
    bitrate: int | None = None
    crf: int | None = None


def clip_rng(seed: int) -> np.random.Generator:
    """The generator of a clip's compression draw, keyed by the sample seed (apart from its other draws)."""
    return np.random.default_rng([_TAG_CLIP, int(seed)])


def draw_video_compression(rng: np.random.Generator, settings: VideoCompressionSettings) -> CompressionDraw:
    """Draw whether (``prob``), with which codec (``codec_prob``) and at which bitrate or CRF (uniform integers,
    both ends included) a clip is compressed: RealBasicVSR's distribution. Always three draws from ``rng``."""
    skip = rng.random() >= settings.prob  # prob 1: never skipped; prob 0: always
    assert settings.codec_prob is not None
    codec = settings.codec[categorical(rng, settings.codec_prob)]
    lo, hi = settings.crf if settings.crf is not None else settings.bitrate  # type: ignore[misc]
    value = int(rng.integers(lo, hi + 1))
    if skip:
        return CompressionDraw(None)
    if settings.crf is not None:
        return CompressionDraw(codec, crf=value)
    return CompressionDraw(codec, bitrate=value)


def _check_frames(frames: Sequence[np.ndarray], rescale: bool = False) -> tuple[int, int]:
    if len(frames) == 0:
        raise DataError("compress_clip: the clip has no frames")
    shape = np.asarray(frames[0]).shape
    for f in frames:
        arr = np.asarray(f)
        if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
            raise DataError(f"compress_clip: frames must be uint8 HWC with 3 channels (BGR), got {arr.dtype} "
                            f"{arr.shape}")
        if arr.shape != shape and not rescale:
            raise DataError(f"compress_clip: frames of one clip must share one size, got {shape} and {arr.shape}")
    h, w = shape[:2]
    if h % 2 or w % 2:
        raise DataError(f"compress_clip: yuv420p video needs an even frame size, got {h}x{w}; crop to even sizes "
                        "(gt_size / scale even)")
    return h, w


def compress_clip(frames: Sequence[np.ndarray], codec: str, *, bitrate: int | None = None,
                  crf: int | None = None, rescale: bool = False) -> list[np.ndarray]:
    """Encode ``frames`` (uint8 HWC, BGR as anysr reads them) as one MP4 video with ``codec`` at ``bitrate``
    (bits per second) or ``crf``, decode it and return the decoded frames (same shapes, BGR).

    The encoding follows RealBasicVSR's ``RandomVideoCompression`` (RGB frames, ``yuv420p``, frame rate 1, FFmpeg's
    default settings of the encoder besides the rate), with the encoder on one thread; libx265 sees frames reflected
    up to :data:`PAD_TO` (its small-frame results are not reproducible otherwise) and clips of at least
    :data:`MIN_FRAMES` frames (FFmpeg's wrapper fails at random on shorter ones).

    ``rescale``: frames may differ in size; each is first resized to the first frame's size (OpenCV, bilinear).
    RealBasicVSR's clips, whose resize drifts from frame to frame, are compressed so; mmagic hands such frames to the
    encoder, whose FFmpeg scaler (PyAV 18's build) gives other pixels from call to call, so anysr scales them itself.
    """
    av = import_av()
    _check_codec(codec, "compress_clip")
    h, w = _check_frames(frames, rescale)
    if (bitrate is None) == (crf is None):
        raise OptionError("compress_clip: give exactly one of bitrate and crf")
    options: dict[str, str] = {}
    if crf is not None:
        if codec not in CRF_CODECS:
            raise OptionError(f"compress_clip: {codec} has no CRF mode; use a bitrate")
        options["crf"] = str(int(crf))
    if codec == "libx265":
        options["x265-params"] = "log-level=none"  # x265 writes its own log lines to stderr otherwise
    least = PAD_TO.get(codec, 0)
    size = (max(h, least), max(w, least))
    if rescale:
        frames = [f if np.asarray(f).shape[:2] == (h, w) else cv2.resize(np.asarray(f), (w, h),
                                                                          interpolation=cv2.INTER_LINEAR)
                  for f in frames]
    if size != (h, w):  # reflected past the bottom and right edges, cropped off after decoding
        frames = [np.pad(np.asarray(f), ((0, size[0] - h), (0, size[1] - w), (0, 0)), mode="reflect") for f in frames]
    n = len(frames)
    frames = list(frames) + [frames[-1]] * (MIN_FRAMES.get(codec, 0) - n)  # repeats dropped after decoding
    try:
        with zero_filled_heap():
            out = _encode_decode(av, frames, codec, size[0], size[1], bitrate, options)
    except av.FFmpegError as err:
        rate = f"bitrate {bitrate}" if crf is None else f"crf {crf}"
        raise DataError(f"compress_clip: FFmpeg failed on {n} frames of {h}x{w} with {codec} at {rate}: "
                        f"{err}") from None
    if len(out) != len(frames):
        raise DataError(f"compress_clip: {codec} gave back {len(out)} frames for {n}")
    out = out[:n]
    return out if size == (h, w) else [np.ascontiguousarray(f[:h, :w]) for f in out]


_M_PERTURB = -6  # glibc's mallopt parameter: fill allocated memory with ~byte, freed memory with byte


@functools.cache
def _mallopt() -> Any:
    """glibc's ``mallopt`` (None elsewhere: macOS, Windows, musl)."""
    try:
        fn = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn


@contextlib.contextmanager
def zero_filled_heap() -> Iterator[None]:
    """Inside: memory the C heap hands out is zero-filled (glibc; elsewhere nothing changes), so a library that
    reads memory it never wrote (libx264) gives what it gives in a fresh process. The setting is restored after
    (``MALLOC_PERTURB_``'s value when the process was started with one, else off)."""
    mallopt = _mallopt()
    if mallopt is None:
        yield
        return
    mallopt(_M_PERTURB, 0xFF)  # allocations get 0xFF ^ 0xFF = 0
    try:
        yield
    finally:
        before = os.environ.get("MALLOC_PERTURB_", "0")
        mallopt(_M_PERTURB, int(before) if before.isdigit() else 0)


def _one_thread(av: Any) -> dict[str, int]:
    """Reformat arguments that keep the colour conversion on the calling thread. PyAV 17 made reformatting
    multithreaded (swscale's slice threads); once started in a process, they hang a DataLoader worker forked from
    it (seen in ``avpriv_slicethread_free``). Older PyAV converts on one thread and takes no ``threads``."""
    major = str(getattr(av, "__version__", "0")).split(".")[0]
    return {"threads": 1} if major.isdigit() and int(major) >= 17 else {}


def _encode_decode(av: Any, frames: Sequence[np.ndarray], codec: str, h: int, w: int, bitrate: int | None,
                   options: dict[str, str]) -> list[np.ndarray]:
    buf = io.BytesIO()
    with av.open(buf, "w", "mp4") as container:
        stream = container.add_stream(codec, rate=1, options=options)
        stream.height, stream.width = h, w
        stream.pix_fmt = "yuv420p"
        stream.codec_context.thread_count = 1
        if bitrate is not None:
            stream.bit_rate = int(bitrate)
        for img in frames:
            rgb = np.ascontiguousarray(np.asarray(img)[:, :, ::-1])
            # the encoder converts to yuv420p with its own thread_count (1)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(rgb, format="rgb24")))
        container.mux(stream.encode(None))
    buf.seek(0)
    out = []
    one_thread = _one_thread(av)
    with av.open(buf, "r", "mp4") as container:
        container.streams.video[0].codec_context.thread_count = 1
        for frame in container.decode(video=0):
            out.append(np.ascontiguousarray(frame.to_rgb(**one_thread).to_ndarray()[:, :, ::-1]))
    return out

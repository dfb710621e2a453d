"""``anysr infer`` on videos: a video file or a folder of frames in, a video file (the source's frame rate,
timestamps and audio) or a folder of frames out, through an image network (frame by frame) or a video network.

Window networks (EDVR, TOFlow, DUF) see the ``num_frame`` frames around each output frame (BasicSR's
``reflection_circle`` padding at the ends); recurrent networks (BasicVSR, IconVSR, BasicVSR++) run in overlapping
temporal chunks (``--chunk`` frames kept per pass, ``--chunk-pad`` frames of context each side). Frames are read as
they are needed and results written as they come, so memory holds one chunk (or window) of frames, not the
video; ``--tile`` also tiles every frame in space. A progress bar shows frames per second.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from anysr.accelerators import Accelerator
from anysr.archs import build_network
from anysr.archs.basicvsr_arch import BasicVSR, IconVSR
from anysr.archs.basicvsrpp_arch import BasicVSRPlusPlus
from anysr.archs.duf_arch import DUF
from anysr.archs.edvr_arch import EDVR
from anysr.archs.tof_arch import TOFlow
from anysr.data.imageio import write_image
from anysr.data.video_datasets import frame_window
from anysr.data.video_io import FrameSource, SourceInfo, VideoWriter, is_video_file
from anysr.engine import checkpoint as ckpt
from anysr.engine.evaluation.video_eval import chunked_outputs, window_forward
from anysr.engine.inference.images import _Pixels, _to_input, _to_stored, network_scale, upscale_image
from anysr.engine.logger import get_logger, log_start, setup_logging
from anysr.errors import DataError, OptionError
from anysr.options.video import WEIGHT_PATH_ARGS
from anysr.registry import ARCH_REGISTRY, plain_options

RECURRENT_ARCHS = (BasicVSR, IconVSR, BasicVSRPlusPlus)
WINDOW_ARCHS = (EDVR, TOFlow, DUF)
TOF_DUF_FRAMES = 7  # TOFlow and DUF take 7 frames
TIMING_SIDE = 64
_PIXELS = _Pixels(255.0, 255, np.uint8, False)


def arch_kind(net_or_type: nn.Module | type | str) -> str:
    """'recurrent', 'window' or 'image' for a network, its class or its registered name."""
    cls = net_or_type if isinstance(net_or_type, type) else type(net_or_type)
    if isinstance(net_or_type, str):
        cls = ARCH_REGISTRY.get(net_or_type) if net_or_type in ARCH_REGISTRY else object
    if issubclass(cls, RECURRENT_ARCHS):
        return "recurrent"
    if issubclass(cls, WINDOW_ARCHS):
        return "window"
    return "image"


def window_frames(net: nn.Module) -> int:
    """Frames a window network takes (EDVR's num_frame; TOFlow and DUF: 7)."""
    n = getattr(net, "num_frame", None)
    return int(n) if isinstance(n, int) else TOF_DUF_FRAMES


def default_scale(net: nn.Module) -> int | None:
    """A video network's upscaling factor (BasicVSR's family and EDVR upscale x4; TOFlow restores at size)."""
    if isinstance(net, TOFlow) or getattr(net, "hr_in", False) or getattr(net, "is_low_res_input", True) is False:
        return 1
    if isinstance(net, RECURRENT_ARCHS + (EDVR,)):
        return 4
    return network_scale(net)


def without_weight_paths(net_opt: dict[str, Any]) -> dict[str, Any]:
    """network_g options without ``spynet_path`` / ``edvr_path`` (whole-network weights include those parts)."""
    return {k: v for k, v in net_opt.items() if k not in WEIGHT_PATH_ARGS}


# ------------------------------------------------------------------------------------------ command line
def network_type(args: argparse.Namespace, network_opt: Any | None) -> str | None:
    """The architecture ``anysr infer`` will build (from --arch, the options file or the weights' metadata)."""
    if args.arch:
        return str(args.arch)
    if network_opt is not None:
        return str(network_opt["type"])
    if args.weights and Path(args.weights).suffix == ".safetensors" and Path(args.weights).is_file():
        meta = ckpt.read_weights_metadata(args.weights)
        if "network_g" in meta:
            return str(meta["network_g"]["type"])
    return None


def wants_video(args: argparse.Namespace, network_opt: Any | None) -> bool:
    """Whether ``anysr infer`` goes through this module: a video file in or out, or a video network."""
    if is_video_file(args.input) or is_video_file(args.output):
        return True
    kind = network_type(args, network_opt)
    return kind is not None and (args.arch or "").lower() != "bicubic" and arch_kind(kind) != "image"


def build_video_net(args: argparse.Namespace, arch_opts: dict[str, Any],
                    network_opt: Any | None) -> tuple[nn.Module, int]:
    """The network and its scale for ``anysr infer`` on videos (``build_inference_net``'s sources, with the
    sub-network weight paths of video option files left out: the weights file holds the whole network)."""
    from anysr.engine.inference.images import build_inference_net  # noqa: PLC0415

    if args.arch and args.arch.lower() == "bicubic" or arch_kind(network_type(args, network_opt) or "") == "image":
        opt = None if network_opt is None else without_weight_paths(plain_options(network_opt))
        return build_inference_net(weights=args.weights, arch=args.arch, arch_opts=arch_opts, network_opt=opt,
                                   scale=args.scale, param_key=args.param_key)
    meta: dict[str, Any] = {}
    state = None
    if args.weights:
        state, meta = ckpt.load_weights(args.weights, args.param_key, key_option="--param-key")
    if args.arch:
        net_opt = {"type": args.arch, **arch_opts}
    elif network_opt is not None:
        net_opt = plain_options(network_opt)
    elif "network_g" in meta:
        net_opt = dict(meta["network_g"])
    else:
        raise OptionError("no network given: pass --arch NAME [--arch-opt k=v ...] or -opt FILE.yml")
    net = build_network(without_weight_paths(net_opt), key_path="--arch-opt" if args.arch else "network_g")
    if state is None:
        raise OptionError("--weights is required for a video network")
    ckpt.load_into(net, state, strict=True, source=str(args.weights),
                   fix="check --arch and --arch-opt (or the -opt file's network_g) against the file")
    own = default_scale(net) or (meta["scale"] if "scale" in meta else None)
    if args.scale and own and args.scale != own:
        raise OptionError(f"--scale {args.scale} but the network upscales x{own}; drop --scale or fix it")
    scale = args.scale or own
    if not scale:
        raise OptionError("cannot tell the network's scale: pass --scale")
    return net, int(scale)


def run(args: argparse.Namespace, arch_opts: dict[str, Any], network_opt: Any | None) -> int:
    """``anysr infer`` for videos and folders of frames (``cli.cmd_infer`` hands over here)."""
    from anysr.accelerators import launch, resolve_plan  # noqa: PLC0415

    net, scale = build_video_net(args, arch_opts, network_opt)
    source = FrameSource(args.input, fps=args.fps)
    dst = Path(args.output)
    if dst.resolve() == Path(args.input).resolve():
        raise DataError(f"-o {dst}: the same as the input; choose another output")
    if is_video_file(dst) and dst.exists() and not dst.is_file():
        raise DataError(f"-o {dst}: exists and is not a file")
    plan = resolve_plan(args.accelerator, 1, precision=args.precision, channels_last=args.channels_last)
    launch(plan, video_infer_worker, net, source, dst, scale, args.tile, args.tile_pad, args.chunk, args.chunk_pad,
           args.suffix)
    what = "video" if is_video_file(dst) else "frames"
    print(f"wrote {source.info.frames} frame(s) as {what} to {dst}")
    return 0


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
                       suffix: str | None) -> Path:
    """Upscale every frame of ``source`` into ``dst`` (see the module docstring)."""
    from tqdm import tqdm  # noqa: PLC0415

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
    bar = tqdm(total=n, desc="infer", unit="frame", dynamic_ncols=True, disable=not acc.is_main)

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


__all__ = ["arch_kind", "build_video_net", "default_scale", "run", "video_infer_worker", "wants_video",
           "window_frames"]

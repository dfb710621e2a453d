"""``anysr infer``: the command's arguments, typed, and the job they make (images or a video, the network, the
launch plan); the command line launches the job and prints its message."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from anysr.accelerators import resolve_plan
from anysr.accelerators.plan import LaunchPlan
from anysr.archs.kinds import arch_kind
from anysr.data.video_io import FrameSource, is_video_file
from anysr.engine.inference.backends import BACKENDS, choose_backend
from anysr.engine.inference.images import (
    InferSettings,
    check_input_channels,
    check_input_sides,
    check_outscale,
    check_result_sizes,
    check_suffix,
    infer_worker,
    inference_shape,
    list_inputs,
    probe_inputs,
)
from anysr.engine.inference.network import (
    ResolvedNetwork,
    network_type,
    resolve_network,
    without_weight_paths,
)
from anysr.engine.inference.video import video_infer_worker
from anysr.errors import DataError, OptionError
from anysr.registry import plain_options


@dataclass(frozen=True)
class InferRequest:
    """What ``anysr infer`` was asked (its command-line arguments; ``network_opt``: the options file's network_g;
    ``dni``: the two strings of ``--dni FILE WEIGHT``)."""

    input: str
    output: str
    weights: str | None = None
    arch: str | None = None
    arch_opts: dict[str, Any] = field(default_factory=dict)
    network_opt: Any | None = None
    scale: int | None = None
    param_key: str = "auto"
    dni: tuple[str, str] | None = None
    tile: int | None = None
    tile_pad: int = 10
    suffix: str | None = None
    outscale: float | None = None
    resize: str = "bicubic"
    ext: str = "png"
    alpha: str = "network"
    progress: bool = True
    chunk: int = 32
    chunk_pad: int = 4
    fps: float | None = None
    accelerator: str = "auto"
    precision: str = "auto"
    channels_last: bool | None = None
    backend: str = "torch"


@dataclass(frozen=True)
class InferJob:
    """A worker to launch with its arguments on ``plan``, and the line to print when it is done."""

    plan: LaunchPlan
    worker: Callable[..., Any]
    args: tuple[Any, ...]
    done: str


def parse_dni(values: tuple[str, str] | None) -> tuple[str, float] | None:
    """``--dni FILE WEIGHT``: the second weights file and the weight (0 to 1) of ``--weights``."""
    if not values:
        return None
    path, weight = values
    try:
        w = float(weight)
    except ValueError:
        raise OptionError(f"--dni {path} {weight}: the weight must be a number from 0 to 1") from None
    if not 0.0 <= w <= 1.0:
        raise OptionError(f"--dni {path} {weight}: the weight of --weights must be from 0 to 1 (1: --weights alone, "
                          f"0: {path} alone)")
    return path, w


def wants_video(req: InferRequest) -> bool:
    """Whether the request is for videos: a video file in or out, or a video network."""
    if is_video_file(req.input) or is_video_file(req.output):
        return True
    kind = network_type(req.arch, req.network_opt, req.weights)
    return kind is not None and (req.arch or "").lower() != "bicubic" and arch_kind(kind) != "image"


def plan_infer(req: InferRequest) -> InferJob:
    """The job of an ``anysr infer`` request: images (tiled) or a video / a folder of frames (chunked)."""
    if not req.arch and req.network_opt is None and not req.weights:
        raise OptionError("anysr infer needs --weights FILE (with --arch NAME or -opt FILE.yml unless the file says "
                          "what it is), or --arch bicubic")
    if req.backend not in BACKENDS:
        raise OptionError(f"--backend {req.backend}: choose one of {', '.join(BACKENDS)}")
    check_suffix(req.suffix)
    if wants_video(req):
        if req.backend not in ("torch", "auto"):
            raise OptionError(f"--backend {req.backend}: images only; videos run with --backend torch")
        return _plan_video(req)
    res = resolve_network(weights=req.weights, arch=req.arch, arch_opts=req.arch_opts, network_opt=req.network_opt,
                          scale=req.scale, param_key=req.param_key, dni=parse_dni(req.dni))
    if arch_kind(res.net) != "image":  # a video network recognised from the file's tensors
        if req.backend not in ("torch", "auto"):
            raise OptionError(f"--backend {req.backend}: {type(res.net).__name__} is a video network; videos run "
                              "with --backend torch")
        return _plan_video(req, res)
    settings = InferSettings(scale=res.scale, tile=req.tile, tile_pad=req.tile_pad, suffix=req.suffix,
                             outscale=check_outscale(req.outscale), resize=req.resize, ext=req.ext,
                             alpha=req.alpha, progress=req.progress)
    files = list_inputs(Path(req.input))
    infos = probe_inputs(files)
    check_result_sizes(files, infos, settings)
    check_input_sides(res.net, files, infos, settings)
    check_input_channels(res.net, files, infos)
    deep = any(info.bits > 8 for info in infos)
    plan = resolve_plan(req.accelerator, 1, precision=req.precision, channels_last=req.channels_last,
                        deep_samples=("16-bit input images", "--precision bf16") if deep else None)
    net, plan = _backend(req, res.net, res.net_opt, settings, plan)
    return InferJob(plan, infer_worker, (net, files, Path(req.output), settings),
                    f"wrote {len(files)} image(s) to {req.output}")


def _backend(req: InferRequest, net: Any, net_opt: dict[str, Any] | None, settings: InferSettings,
             plan: LaunchPlan) -> tuple[Any, LaunchPlan]:
    """The module that runs the forward (``--backend``) and the plan around it: onnxruntime / OpenVINO run on the
    CPU in fp32 (one process); ``auto`` keeps torch off the CPU."""
    if req.backend == "torch":
        return net, plan
    if plan.accelerator != "cpu":
        if req.backend != "auto":
            raise OptionError(f"--backend {req.backend} runs on the CPU; drop --accelerator {req.accelerator}, or "
                              "use --backend torch")
        return net, replace(plan, notes=(*plan.notes, f"--backend auto: torch (the network runs on "
                                                      f"{plan.accelerator})"))
    chosen, name, notes = choose_backend(req.backend, net, net_opt, settings.scale,
                                         inference_shape(net, settings.tile, settings.tile_pad))
    if name != "torch":
        if req.precision not in ("auto", "fp32") or req.channels_last:
            raise OptionError(f"--backend {name} runs in fp32, NCHW: drop --precision {req.precision} / "
                              "--channels-last, or use --backend torch")
        plan = resolve_plan("cpu", 1, precision="fp32", channels_last=False)
    return chosen, replace(plan, notes=(*plan.notes, *notes))


def _plan_video(req: InferRequest, res: ResolvedNetwork | None = None) -> InferJob:
    """A video or a folder of frames through an image network (frame by frame) or a video network (the
    sub-network weight paths of video option files left out: the weights file holds the whole network); ``res``:
    the network when it is already resolved."""
    if res is None:
        opt = None if req.network_opt is None else without_weight_paths(plain_options(req.network_opt))
        res = resolve_network(weights=req.weights, arch=req.arch, arch_opts=req.arch_opts, network_opt=opt,
                              scale=req.scale, param_key=req.param_key)
    kind = arch_kind(res.net)
    name = type(res.net).__name__
    if kind != "image" and Path(req.input).is_file() and not is_video_file(req.input):
        raise DataError(f"-i {req.input}: one image, but {name} is a video network (it reads the frames around "
                        "each one); give a video file or a folder of its frames, or an image network's weights")
    source = FrameSource(req.input, fps=req.fps)
    if kind == "recurrent" and source.info.frames < 2:
        raise DataError(f"-i {req.input}: {source.info.frames} frame, but {name} runs on clips of 2 frames or "
                        "more; give a longer video or folder of frames, or an image network's weights")
    if (source.files and kind != "image") or is_video_file(req.output):
        _check_frame_sizes(source)
    dst = Path(req.output)
    if dst.resolve() == Path(req.input).resolve():
        raise DataError(f"-o {dst}: the same as the input; choose another output")
    if is_video_file(dst) and dst.exists() and not dst.is_file():
        raise DataError(f"-o {dst}: exists and is not a file")
    plan = resolve_plan(req.accelerator, 1, precision=req.precision, channels_last=req.channels_last)
    if req.backend == "auto":
        plan = replace(plan, notes=(*plan.notes, "--backend auto: torch (videos run in torch)"))
    what = "video" if is_video_file(dst) else "frames"
    return InferJob(plan, video_infer_worker, (res.net, source, dst, res.scale, req.tile, req.tile_pad, req.chunk,
                                               req.chunk_pad, req.suffix, req.progress),
                    f"wrote {source.info.frames} frame(s) as {what} to {dst}")


def _check_frame_sizes(source: FrameSource) -> None:
    """Refuse, before any work, a folder of frames of different sizes (a clip network stacks them; a video file
    has one size)."""
    if not source.files:
        return
    infos = probe_inputs(source.files)
    first = infos[0]
    for path, info in zip(source.files, infos):
        if (info.width, info.height) != (first.width, first.height):
            raise DataError(f"-i {source.path}: frame {path.name} is {info.width}x{info.height} but "
                            f"{source.files[0].name} is {first.width}x{first.height}; the frames of one video share "
                            "one size (resize them, or upscale them as images with an image network)")


__all__ = ["InferJob", "InferRequest", "parse_dni", "plan_infer", "wants_video"]

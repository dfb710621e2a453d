"""The network ``anysr infer`` and ``anysr export`` run, resolved once for images and videos: from ``--arch``, an
options file, the weights' metadata or spandrel; its kind (image, window or recurrent video network) and scale."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from anysr.archs import build_network
from anysr.archs.arch_util import input_channels, unit_range
from anysr.archs.edvr_arch import EDVR
from anysr.archs.kinds import RECURRENT_ARCHS, arch_kind
from anysr.archs.recognition.recognise import (
    Recognised,
    RecordedValueError,
    StateShapes,
    layout_fits,
    recognise,
    recognise_all,
)
from anysr.archs.tof_arch import TOFlow
from anysr.engine import checkpoint as ckpt
from anysr.engine.logger import get_logger
from anysr.errors import AnysrError, CheckpointError, OptionError, short_repr
from anysr.models.gfpgan import DECODER_PATH_ARGS
from anysr.models.video import WEIGHT_PATH_ARGS
from anysr.ops.tiling import round_up, tile_multiple
from anysr.presets import find_preset
from anysr.registry import ARCH_REGISTRY, plain_options


def network_scale(net: nn.Module, default: int | None = None) -> int | None:
    """The upscaling factor a network declares (``upscale`` or ``scale`` attribute), else ``default``."""
    for attr in ("upscale", "scale"):
        value = getattr(net, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def measure_scale(net: nn.Module) -> int | None:
    """The factor ``net`` upscales by, measured with one small forward on the host (None if that fails): the
    attributes can mislead (SwinIR's ``upscale`` with no upsampler is x1) or be absent (EDSR, RCAN)."""
    side = round_up(16, tile_multiple(net))
    was_training = net.training
    try:
        with torch.no_grad():
            out = net.eval()(torch.rand(1, input_channels(net) or 3, side, side))
    except (RuntimeError, ValueError, TypeError):
        return None
    finally:
        net.train(was_training)
    if not isinstance(out, torch.Tensor) or out.dim() != 4 or out.shape[-1] % side or out.shape[-2] % side:
        return None
    return int(out.shape[-1] // side) or None


def default_scale(net: nn.Module) -> int | None:
    """A video network's upscaling factor (BasicVSR's family and EDVR upscale x4; TOFlow restores at size)."""
    if isinstance(net, TOFlow) or getattr(net, "hr_in", False) or getattr(net, "is_low_res_input", True) is False:
        return 1
    if isinstance(net, RECURRENT_ARCHS + (EDVR,)):
        return 4
    return network_scale(net)


def without_weight_paths(net_opt: dict[str, Any]) -> dict[str, Any]:
    """network_g options without ``spynet_path`` / ``edvr_path`` / ``decoder_load_path`` (whole-network weights
    include those parts)."""
    return {k: v for k, v in net_opt.items() if k not in WEIGHT_PATH_ARGS + DECODER_PATH_ARGS}


def network_type(arch: str | None, network_opt: Any | None, weights: str | None) -> str | None:
    """The architecture ``anysr infer`` will build (from --arch, the options file or the weights' metadata)."""
    if arch:
        return str(arch)
    if network_opt is not None:
        return str(network_opt["type"])
    if weights and Path(weights).suffix == ".safetensors" and Path(weights).is_file():
        net_opt = metadata_network(ckpt.read_weights_metadata(weights), weights)
        if net_opt is not None:
            return str(net_opt["type"])
    return None


_SAY_THE_NETWORK = "pass --arch NAME [--arch-opt k=v ...] or -opt FILE.yml to say which network the file holds"


def metadata_network(meta: dict[str, Any], weights: str | Path) -> dict[str, Any] | None:
    """The ``network_g`` a weights file's metadata records (None when it records none), refused in one line when
    it is not a mapping naming an architecture."""
    if "network_g" not in meta:
        return None
    net_opt = meta["network_g"]
    if not isinstance(net_opt, dict) or not isinstance(net_opt.get("type"), str):
        raise CheckpointError(f"weights {weights}: the metadata's network_g is {short_repr(net_opt)}, not a mapping "
                              f"with the architecture's 'type'; {_SAY_THE_NETWORK}")
    return dict(net_opt)


def _metadata_scale(meta: dict[str, Any]) -> int | None:
    """The ``scale`` a weights file's metadata records, when it is a positive integer (else None: measured)."""
    value = meta.get("scale")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _refuse_misfit(net_opt: dict[str, Any], state: Any, weights: str, key_path: str, fix: str, *,
                   from_metadata: bool) -> None:
    """Check ``state`` against ``net_opt``'s network built on the meta device (no memory) before the real build:
    a file whose tensors do not fit is refused before its network is allocated (metadata saying
    ``num_feat: 1000000`` over small tensors would ask for terabytes). One line when the network came from the
    file's own metadata."""
    try:
        with torch.device("meta"):
            probe = build_network(net_opt, key_path=key_path)
    except AnysrError as exc:
        if not from_metadata:
            raise
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        said = " ".join(lines[:1] + ["; ".join(lines[1:])]).strip()
        raise CheckpointError(f"weights {weights}: the network its metadata records cannot be built ({said}); "
                              f"{_SAY_THE_NETWORK}") from None
    except Exception:  # noqa: BLE001 - an architecture that cannot be built without data: the real build checks
        return
    try:
        ckpt.check_fits(probe.state_dict(), state, source=str(weights), fix=fix, net=probe)
    except CheckpointError as exc:
        if not from_metadata:
            raise
        raise CheckpointError(str(exc).splitlines()[0]) from None


@dataclass
class ResolvedNetwork:
    """A network built for inference or export, and where it came from.

    ``net_opt``: the ``network_g`` options that rebuild it (None for a network spandrel recognised);
    ``group``: the weights group read (None: the file is one bare state dict, or no file); ``meta``: the
    weights file's metadata."""

    net: nn.Module
    scale: int
    net_opt: dict[str, Any] | None
    group: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


class SpandrelNetwork(nn.Module):
    """A network spandrel recognised from a foreign weights file, called through its descriptor (which pads the
    input to what the architecture needs); ``tile_multiple`` and ``upscale`` from the descriptor."""

    def __init__(self, descriptor: Any) -> None:
        super().__init__()
        self.model = descriptor.model
        self._descriptor = descriptor
        req = descriptor.size_requirements
        self.tile_multiple: int = max(1, int(getattr(req, "multiple_of", 1) or 1))
        self.upscale: int = int(descriptor.scale)
        self.architecture: str = str(descriptor.architecture.name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._descriptor(x)  # type: ignore[no-any-return]


TRAINNER_METADATA = "metadata"


def recorded_hyperparameters(meta: dict[str, Any], weights: str | Path) -> dict[str, Any] | None:
    """The network's constructor arguments a file saved by traiNNer-redux records (its ``metadata``: safetensors
    metadata ``{"metadata": "<JSON>"}``, or a ``.pth`` container's ``metadata`` entry beside ``params``), None
    when there are none; a record that is not a JSON mapping of argument names is ignored with one warning. Names
    of sub-network weight files (``spynet_path``, ``decoder_load_path``: the file holds the whole network) are
    left out: a file's record never makes anysr open another file."""
    if TRAINNER_METADATA not in meta:
        return None
    value = meta[TRAINNER_METADATA]
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        get_logger().warning("weights %s: the 'metadata' entry is %s, not a JSON mapping of the network's "
                             "constructor arguments (traiNNer-redux's hyperparameters); ignored", weights,
                             short_repr(value))
        return None
    return without_weight_paths(value) or None


def _recognise_file(state: dict[str, torch.Tensor], source: str,
                    hyperparameters: dict[str, Any] | None = None) -> Recognised:
    """``recognise`` (with the file's recorded ``hyperparameters``), also through a wrapper prefix every name
    shares (``netG.``, ``model.``: the loader strips it too); the error of the names as they are when neither
    fits."""
    try:
        return recognise(state, source=source, hyperparameters=hyperparameters)
    except RecordedValueError:  # a recorded value the class refuses: said as it is
        raise
    except OptionError:
        stripped, prefix = ckpt.strip_container_prefix(state)
        if prefix:
            try:
                return recognise(stripped, source=source, hyperparameters=hyperparameters)
            except OptionError:
                pass
        raise


def _log_recognised(found: Recognised, source: str) -> None:
    """The "recognised" info line, a warning per recorded argument the tensors contradict, and (debug) the
    recorded names the class does not take."""
    log = get_logger()
    also = f" (also fits: {', '.join(found.others)})" if found.others else ""
    log.info("network recognised from the weights' names and shapes: %s%s", found.describe(), also)
    for k, (recorded, kept) in found.overruled.items():
        log.warning("weights %s: the file's metadata says %s=%s but its tensors fit %s=%r; the tensors win",
                    source, k, short_repr(recorded), k, kept)
    if found.ignored:
        log.debug("weights %s: metadata arguments %s does not take, ignored: %s", source, found.opt["type"],
                  ", ".join(found.ignored))


def recognisable(state: dict[str, torch.Tensor]) -> bool:
    """Whether ``state`` (or its names inside a wrapper prefix) is of an architecture anysr recognises."""
    return bool(recognise_all(state) or recognise_all(ckpt.strip_container_prefix(state)[0]))


def _recognised_network(state: dict[str, torch.Tensor], weights: str,
                        meta: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The ``network_g`` options of the architecture anysr recognises in ``state`` (names and shapes, with the
    constructor arguments traiNNer-redux records in ``meta``), None when it fits none of them and spandrel is
    installed (it may know the file); without spandrel, the one-line error naming the closest families."""
    try:
        found = _recognise_file(state, weights, recorded_hyperparameters(meta or {}, weights))
    except RecordedValueError:
        raise
    except OptionError:
        if importlib.util.find_spec("spandrel") is not None:
            return None
        raise
    _log_recognised(found, weights)
    return dict(found.opt)


def network_options_from_weights(weights: Path, param_key: str) -> dict[str, Any]:
    """The ``network_g`` options a weights file holds (``network_g.type: auto`` in an options file): its anysr
    metadata's, else what anysr recognises in its names and shapes (with traiNNer-redux's recorded
    hyperparameters), else a one-line error."""
    state, meta, _ = ckpt.read_weights(weights, param_key, key_option="path.param_key_g")
    recorded = metadata_network(meta, str(weights))
    if recorded is not None:
        return recorded
    source = f"path.pretrain_network_g {weights}"
    found = _recognise_file(dict(state), source, recorded_hyperparameters(meta, weights))
    _log_recognised(found, str(weights))
    return dict(found.opt)


def _spandrel_network(state: dict[str, torch.Tensor], weights: str) -> nn.Module:
    """The network spandrel (``anysr[spandrel]``, when installed) recognises in ``state``, else OptionError."""
    need = ("pass --arch NAME [--arch-opt k=v ...] or -opt FILE.yml (the weights file carries no anysr "
            "metadata to rebuild it from)")
    try:
        import spandrel  # noqa: PLC0415 - optional dependency (anysr[spandrel])
    except ImportError:
        raise OptionError(f"no network given: {need}, or install anysr[spandrel] to recognise the architecture "
                          "of foreign weights") from None
    try:
        desc = spandrel.ModelLoader().load_from_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - spandrel raises its own types for files it does not know
        raise OptionError(f"no network given and spandrel does not recognise {weights} ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}); {need}") from None
    if not isinstance(getattr(desc, "model", None), nn.Module) or not hasattr(desc, "scale"):
        raise OptionError(f"spandrel recognises {weights} as {desc.architecture.name}, which is not an image "
                          f"upscaler or restorer; {need}")
    get_logger().info("network recognised by spandrel: %s x%d", desc.architecture.name, desc.scale)
    return SpandrelNetwork(desc.eval())


_PRESET_SCALES = (1, 2, 3, 4, 8)


def _refuse_preset_scale(arch: str, arch_opts: dict[str, Any], state: Any) -> None:
    """``--arch PRESET`` without a scale over a file of another scale than the preset's default: one line naming
    the ``--scale`` whose layout is the file's (the strict load would list the upsampler's mismatched shapes)."""
    view = StateShapes(state)
    if layout_fits({"type": arch, **arch_opts}, view):
        return
    fits = [s for s in _PRESET_SCALES if layout_fits({"type": arch, **arch_opts, "scale": s}, view)]
    if len(fits) == 1:
        raise OptionError(f"--arch {arch}: the file holds x{fits[0]} weights, not the preset's default scale; "
                          f"pass --arch-opt scale={fits[0]} (or, to anysr infer, --scale {fits[0]})")


def _other_group_hint(weights: str, group: str | None) -> str | None:
    """When ``group`` (the EMA weights, read first) fits no architecture but the file's ``params`` does (a file whose
    two groups differ: a broken EMA, a group of another network), the ``--param-key`` that reads it; else None."""
    if group != "params_ema":
        return None
    try:
        other, _, _ = ckpt.read_weights(weights, "params", key_option="--param-key")
    except CheckpointError:
        return None
    found = recognise_all(other)
    if not found:
        return None
    return (f"the file's 'params' group (read instead of 'params_ema' with --param-key params) is "
            f"{found[0].opt['type']}: its two groups differ")


def interpolate_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], weight: float, *,
                        source_a: str, source_b: str) -> dict[str, torch.Tensor]:
    """Deep network interpolation: ``weight * a + (1 - weight) * b`` for every floating tensor (others from
    ``a``). The two must have the same names and shapes (one network trained two ways)."""
    problems, bad = ckpt.state_dict_mismatch(a, b)
    if problems:
        raise CheckpointError(f"--dni {source_b} does not match --weights {source_a}: " + "; ".join(problems)
                              + ". Fix: interpolate two checkpoints of the same network\n"
                              + ckpt.mismatch_table(a, b))
    out = {}
    for name, ta in a.items():
        tb = b[name]
        out[name] = (ta.float() * weight + tb.float() * (1.0 - weight)).to(ta.dtype) \
            if ta.is_floating_point() else ta.clone()
    return out


def resolve_network(*, weights: str | None, arch: str | None, arch_opts: dict[str, Any],
                    network_opt: dict[str, Any] | None, scale: int | None, param_key: str,
                    strict: bool = True, dni: tuple[str, float] | None = None) -> ResolvedNetwork:
    """The network (with its weights loaded) from ``--arch`` (+ options), an options file, the weights' own
    metadata, or (``anysr[spandrel]``) what spandrel recognises in a foreign file; ``dni``: (second weights file,
    weight of the first) to interpolate between two checkpoints. Image and video networks alike: a video network
    (recurrent or window) is built without its sub-network weight paths (the weights file holds the whole
    network), needs ``weights``, and upscales by its architecture's factor (``default_scale``)."""
    log = get_logger()
    if arch == "bicubic" or (arch or "").lower() == "bicubic":
        if not scale:
            raise OptionError("--arch bicubic needs --scale")
        opt = {"type": "Bicubic", "upscale": scale}
        return ResolvedNetwork(build_network(opt), scale, opt)
    meta: dict[str, Any] = {}
    state = None
    group = None
    if weights:
        state, meta, group = ckpt.read_weights(weights, param_key, key_option="--param-key")
    if dni is not None:
        if state is None:
            raise OptionError("--dni needs --weights (the first of the two checkpoints)")
        other, _, _ = ckpt.read_weights(dni[0], param_key, key_option="--param-key")
        state = interpolate_weights(dict(state), dict(other), dni[1], source_a=str(weights), source_b=dni[0])
        log.info("weights interpolated: %g x %s + %g x %s", dni[1], weights, 1 - dni[1], dni[0])
    net_opt: dict[str, Any] | None
    recognised = None
    if arch:
        preset = find_preset(arch, ARCH_REGISTRY.keys())
        if preset is None:
            ARCH_REGISTRY.get(arch, key_path="--arch")  # an unknown name: said as --arch's, with the nearest one
        elif scale and preset.takes_scale(arch_opts):
            arch_opts = {**arch_opts, "scale": scale}  # --scale picks the preset's scale, as an option file's scale
        elif state is not None and preset.takes_scale(arch_opts):
            _refuse_preset_scale(arch, arch_opts, state)
        net_opt = {"type": arch, **arch_opts}
    elif network_opt is not None:
        net_opt = plain_options(network_opt)
    elif metadata_network(meta, str(weights)) is not None:
        net_opt = metadata_network(meta, str(weights))
    elif state is not None:  # None: not one of anysr's (spandrel, when installed, may know it)
        try:
            net_opt = recognised = _recognised_network(dict(state), str(weights), meta)
        except OptionError as exc:
            hint = _other_group_hint(str(weights), group) if weights else None
            if hint is None:
                raise
            raise OptionError(f"{str(exc).splitlines()[0]}; {hint}") from None
    else:
        raise OptionError("no network given: pass --arch NAME [--arch-opt k=v ...] or -opt FILE.yml "
                          "(and --weights FILE)")
    kind = "image" if net_opt is None else arch_kind(str(net_opt["type"]))
    from_metadata = net_opt is not None and not arch and network_opt is None and recognised is None
    fix = (f"the file's metadata (network_g) does not describe its tensors: {_SAY_THE_NETWORK}" if from_metadata
           else "check --arch and --arch-opt (or the -opt file's network_g) against the file")
    key_path = "--arch-opt" if arch else "network_g"
    if net_opt is not None and state is not None:
        _refuse_misfit(without_weight_paths(net_opt) if kind != "image" else net_opt, state, str(weights),
                       key_path, fix, from_metadata=from_metadata)
    if net_opt is None:
        assert state is not None
        net = _spandrel_network(dict(state), str(weights))
    elif kind != "image":  # a video network
        net_opt = without_weight_paths(net_opt)
        net = build_network(net_opt, key_path=key_path)
        if state is None:
            raise OptionError("--weights is required for a video network")
        ckpt.load_into(net, state, strict=strict, source=str(weights), fix=fix)
    else:
        if from_metadata:
            log.info("network rebuilt from the weights' metadata: %s", net_opt["type"])
        net = unit_range(build_network(net_opt, key_path=key_path))
        if getattr(net, "image_input", True) is False:
            raise OptionError(f"{net_opt['type']} makes images from random style codes and reads no input image; "
                              "anysr infer restores or upscales images: give a restoring network's weights (e.g. "
                              "GFPGAN's, which holds a StyleGAN2 decoder)")
        if state is not None:
            ckpt.load_into(net, state, strict=strict, source=str(weights), fix=fix)
        elif any(True for _ in net.parameters()):
            raise OptionError("--weights is required for a network with parameters")
    if kind != "image":
        net_scale = default_scale(net) or _metadata_scale(meta)
    else:
        net_scale = measure_scale(net) or network_scale(net, _metadata_scale(meta))
    if scale and net_scale and scale != net_scale:
        raise OptionError(f"--scale {scale} but the network upscales x{net_scale}; drop --scale or fix it")
    final = scale or net_scale
    if not final:
        raise OptionError("cannot tell the network's scale: pass --scale")
    return ResolvedNetwork(net, int(final), net_opt, group, meta)

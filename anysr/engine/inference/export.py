"""``anysr export``: weights that travel.

* plain state dicts (``.pth`` / ``.safetensors``): one group of weights (default: ``params_ema``, else ``params``,
  else the file's only state dict) under the original architectures' names, as spandrel-based tools (chaiNNer,
  ComfyUI, A1111) load them; the plain ``.safetensors`` also carries ``network_g`` and ``scale`` in its metadata,
  so ``anysr infer --weights`` rebuilds the network from it;
* ONNX models, in fp32 or fp16, with dynamic batch / height / width when the traced graph handles other sizes
  than the one it was traced at (checked), else with the fixed input size; every export is run by onnxruntime
  and compared with PyTorch (the largest difference is reported).

Networks with a deployment form (ECBSR's ``reparameterize()``) are exported in it. onnx / onnxruntime come with
``anysr[onnx]``.
"""

from __future__ import annotations

import copy
import inspect
import io
import json
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save as safetensors_save
from torch import nn
from torch.nn.utils import remove_spectral_norm
from torch.nn.utils.spectral_norm import SpectralNorm

from anysr.archs import build_network
from anysr.archs.arch_util import input_channels
from anysr.archs.kinds import arch_kind
from anysr.atomic import atomic_write_bytes
from anysr.engine import checkpoint as ckpt
from anysr.engine.checkpoint.integrity import save_stamped
from anysr.engine.inference.network import recognisable, resolve_network
from anysr.errors import CheckpointError, OptionError
from anysr.ops.tiling import round_up, tile_multiple
from anysr.registry import ARCH_REGISTRY

logger = logging.getLogger("anysr.engine.inference.export")

EXPORT_SUFFIXES = (".pth", ".safetensors", ".onnx")
PLAIN_FORMAT = "anysr-plain"
# Largest |ONNX - PyTorch fp32| on images in [0, 1]: more is an error in fp32 (an unfaithful graph), a warning in
# fp16 (half precision itself: observed 5e-5 to 6e-2 on random-weight networks, ~5e-4 typically).
ONNX_TOLERANCE = {"fp32": 1e-3, "fp16": 1e-2}
DEFAULT_ONNX_SIZE = 64
ONNX_OPSET = 17


@dataclass
class OnnxCheck:
    """One onnxruntime run against PyTorch: the input shape and the largest absolute difference."""

    shape: tuple[int, ...]
    max_diff: float


@dataclass
class ExportReport:
    """What ``export`` wrote."""

    path: Path
    kind: str  # pth | safetensors | onnx
    group: str | None
    arch: str | None
    dtype: str
    tensors: int = 0
    dynamic: bool | None = None
    size: int | None = None
    note: str = ""
    checks: list[OnnxCheck] = field(default_factory=list)

    def summary(self) -> str:
        """One line for the command line."""
        what = {"pth": "plain state dict", "safetensors": "plain state dict", "onnx": "ONNX"}[self.kind]
        group = f"group '{self.group}'" if self.group else "the file's state dict"
        parts = [f"wrote {self.path}: {what} ({self.arch or 'unknown network'}, {group}, {self.dtype}"]
        if self.kind == "onnx":
            parts.append(", dynamic batch/height/width" if self.dynamic else f", fixed input {self.size}x{self.size}")
        else:
            parts.append(f", {self.tensors} tensors")
        parts.append(")")
        if self.checks:
            runs = (", ".join(f"{'x'.join(map(str, c.shape[2:]))}: {c.max_diff:.2e}" for c in self.checks)
                    if self.dynamic else f"{max(c.max_diff for c in self.checks):.2e}")  # one size: said above
            parts.append(f"; onnxruntime vs PyTorch max |diff| {runs}")
        if self.note:
            parts.append(f"; {self.note}")
        return "".join(parts)


# --------------------------------------------------------------------------------------------- plain state dicts
def deploy_form(net: nn.Module, net_opt: dict[str, Any] | None) -> tuple[nn.Module, dict[str, Any] | None]:
    """The network in its deployment form (``reparameterize()`` where the architecture has one: ECBSR's plain
    convs, SPAN's folded convs, a multi-task IPT's running task alone) and the options that rebuild that form
    (ECBSR: ``reparameterized: true``; IPT: its ``deployed_arguments()``)."""
    fold = getattr(net, "reparameterize", None)
    if callable(fold):
        fold()
        if net_opt is not None and "reparameterized" in inspect.signature(type(net)).parameters:
            net_opt = {**net_opt, "reparameterized": True}
        changed = getattr(net, "deployed_arguments", None)
        if net_opt is not None and callable(changed):
            net_opt = {**net_opt, **changed()}
    return net, net_opt


def _host(sd: dict[str, Any], fp16: bool) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in sd.items():
        t = t.detach().to("cpu")
        if fp16 and t.is_floating_point():
            t = t.half()
        out[name] = t.contiguous().clone()  # own storage each: safetensors refuses shared tensors
    return out


def save_plain(path: str | Path, state_dict: dict[str, Any], *, net_opt: dict[str, Any] | None = None,
               scale: int | None = None, fp16: bool = False) -> Path:
    """Atomically write one bare state dict: ``.pth`` (``torch.save``, loadable with ``weights_only=True``) or
    ``.safetensors`` (with ``network_g`` / ``scale`` metadata when known). ``fp16`` halves floating tensors."""
    path = Path(path)
    tensors = _host(state_dict, fp16)
    if path.suffix.lower() == ".safetensors":
        meta = {"format": "pt", "anysr": PLAIN_FORMAT}
        if net_opt is not None:
            meta["network_g"] = json.dumps(net_opt, sort_keys=True)
        if scale is not None:
            meta["scale"] = json.dumps(int(scale))
        return atomic_write_bytes(path, safetensors_save(tensors, metadata=meta))
    if path.suffix.lower() == ".pth":
        return save_stamped(path, tensors)
    raise OptionError(f"{path}: a plain export is a .pth or .safetensors file")


def save_deployable(paths: list[Path], state_dict: dict[str, Any], net_opt: dict[str, Any], scale: int) -> None:
    """Plain exports of ``state_dict`` (weights of ``net_opt``'s network) to every path, in the deployment form
    when the architecture has one (the network is then rebuilt to fold it); what training's
    ``logger.save_format: [plain.pth, plain.safetensors]`` writes."""
    sd: dict[str, Any] = dict(state_dict)
    if callable(getattr(ARCH_REGISTRY.get(net_opt["type"]), "reparameterize", None)):
        net = build_network(net_opt)
        net.load_state_dict(sd)
        net, net_opt = deploy_form(net.eval(), net_opt)
        sd = net.state_dict()
    for path in paths:
        save_plain(path, sd, net_opt=net_opt, scale=scale)


# --------------------------------------------------------------------------------------------- ONNX
def _onnx_bytes(model: nn.Module, dummy: torch.Tensor, *, dynamic: bool, opset: int) -> bytes:
    """``model`` traced at ``dummy`` and written as ONNX (TorchScript-based exporter: handles the window-attention
    networks' reshapes with symbolic sizes)."""
    kwargs: dict[str, Any] = {"input_names": ["input"], "output_names": ["output"], "opset_version": opset,
                              "do_constant_folding": True}
    if dynamic:
        kwargs["dynamic_axes"] = {"input": {0: "batch", 2: "height", 3: "width"},
                                  "output": {0: "batch", 2: "out_height", 3: "out_width"}}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about Python values: the checks below judge the graph
        torch.onnx.export(model, (dummy,), buf, **kwargs)
    return buf.getvalue()


def _onnxruntime() -> Any:
    try:
        import onnxruntime  # noqa: PLC0415 - optional dependency (anysr[onnx])
    except ImportError:
        raise OptionError("exporting to ONNX needs onnx and onnxruntime: pip install 'anysr[onnx]'") from None
    return onnxruntime


def _check(session: Any, reference: nn.Module, x: torch.Tensor, dtype: torch.dtype, scale: int) -> OnnxCheck:
    """Run ``x`` through onnxruntime (in ``dtype``) and the fp32 PyTorch network; raise on a wrong shape."""
    got = session.run(None, {session.get_inputs()[0].name: x.to(dtype).numpy()})[0]
    with torch.no_grad():
        want = reference(x).float()
    expected = (x.shape[0], want.shape[1], x.shape[2] * scale, x.shape[3] * scale)
    if tuple(got.shape) != tuple(want.shape) or tuple(want.shape) != expected:
        raise ValueError(f"output shape {tuple(got.shape)}, expected {expected}")
    return OnnxCheck(tuple(x.shape), float((torch.from_numpy(got).float() - want).abs().max()))


def _onnx() -> Any:
    try:
        import onnx  # noqa: PLC0415 - optional dependency (anysr[onnx])
    except ImportError:
        raise OptionError("exporting to ONNX needs the onnx package (torch's exporter writes through it; "
                          "onnxruntime checks the result): pip install 'anysr[onnx]'") from None
    return onnx


def _with_metadata(data: bytes, meta: dict[str, str]) -> bytes:
    model = _onnx().load_from_string(data)
    for key, value in meta.items():
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    return bytes(model.SerializeToString())


def _fixed_weights(net: nn.Module) -> nn.Module:
    """``net``, or (when it has any) a copy with ``torch.nn.utils.spectral_norm``'s hooks folded into plain weights:
    spectral normalisation computes each weight in the graph, which the exporter cannot always size for dynamic
    shapes. In eval mode the folded weight is the one the network uses, so the export computes the same function
    (and is checked against ``net``). (The ``parametrizations`` API is left as it is: its classes are shared with
    ``net``, so removing it from a copy would break ``net``; the exporter handles it.)"""
    if not any(isinstance(h, SpectralNorm) for m in net.modules() for h in m._forward_pre_hooks.values()):
        return net
    model = copy.deepcopy(net).eval()
    for m in model.modules():
        for h in list(m._forward_pre_hooks.values()):
            if isinstance(h, SpectralNorm):
                remove_spectral_norm(m, h.name)
    return model


def _opset_range() -> tuple[int, int]:
    """The ONNX opsets this torch's exporter writes (7 to 20 when its private constants are not there)."""
    try:
        from torch.onnx import _constants  # noqa: PLC0415 - private: read only for the range it states
    except ImportError:
        return 7, 20
    return int(getattr(_constants, "ONNX_MIN_OPSET", 7)), int(getattr(_constants, "ONNX_MAX_OPSET", 20))


def check_onnx_settings(size: int | None, opset: int) -> None:
    """Refuse an ONNX input side below 1 and an opset the exporter does not write, before any tracing."""
    if size is not None and size < 1:
        raise OptionError(f"--size {size}: give the traced input side in pixels, 1 or more (default "
                          f"{DEFAULT_ONNX_SIZE})")
    low, high = _opset_range()
    if not low <= opset <= high:
        raise OptionError(f"--opset {opset}: this torch exports ONNX opsets {low} to {high}; choose one (default "
                          f"{ONNX_OPSET})")


def export_onnx(net: nn.Module, path: str | Path, *, scale: int, net_opt: dict[str, Any] | None = None,
                fp16: bool = False, size: int | None = None, dynamic: bool = True, opset: int = ONNX_OPSET,
                check: bool = True) -> ExportReport:
    """Write ``net`` (eval mode, fp32 weights) as an ONNX model taking NCHW RGB in [0, 1].

    ``dynamic``: batch, height and width are symbolic (traced at a size just off the window multiple, so the
    network's padding is part of the graph), kept only when onnxruntime reproduces PyTorch at three differently
    shaped inputs; otherwise (or with ``dynamic=False``) the model is exported for ``size`` x ``size`` inputs
    (default 64, rounded up to the network's ``tile_multiple``), and the report says why. ``check``: compare with
    PyTorch fp32 at each shape (fp32: within 1e-3, else CheckpointError; fp16: a warning above 1e-2).
    """
    path = Path(path)
    check_onnx_settings(size, opset)
    _onnx()  # needed with or without the check: said first, not as a failed trace
    ort = _onnxruntime() if check else None
    net = net.eval()
    multiple = tile_multiple(net)
    side = round_up(size or DEFAULT_ONNX_SIZE, multiple)
    channels = input_channels(net) or 3
    dtype = torch.float16 if fp16 else torch.float32
    model = _fixed_weights(net)
    model = (copy.deepcopy(model) if model is net else model).to(dtype) if fp16 else model
    gen = torch.Generator().manual_seed(0)
    dummy = torch.rand(1, channels, side, side, generator=gen)
    other = torch.rand(2, channels, side // 2 + 3, side + 5, generator=gen)
    tol = ONNX_TOLERANCE["fp16" if fp16 else "fp32"]
    note = ""
    checks: list[OnnxCheck] = []
    data = b""
    if dynamic:
        # Traced at a size that is not a multiple of the window, so the network's own padding is in the graph.
        odd = torch.rand(1, channels, side - 1 if multiple > 1 else side, side - 3 if multiple > 1 else side,
                         generator=gen)
        try:
            data = _onnx_bytes(model, odd.to(dtype), dynamic=True, opset=opset)
            if ort is not None:
                session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
                traced = _check(session, net, odd, dtype, scale)
                limit = max(ONNX_TOLERANCE["fp32"], 4 * traced.max_diff)  # a baked-in shape errs far more
                for x in (dummy, other):
                    checks.append(_check(session, net, x, dtype, scale))
                    if checks[-1].max_diff > limit:
                        raise ValueError(f"max |diff| {checks[-1].max_diff:.2e}, {traced.max_diff:.2e} at the "
                                         "traced size")
                checks.append(traced)
        except Exception as exc:  # noqa: BLE001 - the exporter and onnxruntime raise many types for baked-in shapes
            reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
            shape = "x".join(map(str, checks[-1].shape[2:] if checks else other.shape[2:]))
            note = (f"dynamic sizes failed ({shape}: {reason}): tile with --tile {side} --tile-pad 0 in the "
                    "runtime, or choose another --size")
            logger.info("%s", note)
            dynamic, checks = False, []
    if not dynamic:
        try:
            data = _onnx_bytes(model, dummy.to(dtype), dynamic=False, opset=opset)
        except (RuntimeError, ValueError) as exc:
            raise OptionError(f"{path}: the network does not run on a {side}x{side} input "
                              f"({str(exc).splitlines()[0][:200]}); pass --size with a side it takes (e.g. its "
                              "img_size when it has absolute position embeddings)") from None
        if ort is not None:
            session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
            checks.append(_check(session, net, dummy, dtype, scale))
    if checks:
        worst = max(c.max_diff for c in checks)
        if worst > tol and not fp16:
            raise CheckpointError(f"{path}: onnxruntime's result differs from PyTorch's by {worst:.3g} (more than "
                                  f"{tol:g}); the export is not faithful (nothing was written). Try another --opset")
        if worst > tol:
            logger.warning("%s: fp16 result differs from the fp32 network by up to %.3g; check the quality, or "
                           "export in fp32", path, worst)
    meta = {"anysr_scale": str(scale), "anysr_tile_multiple": str(multiple),
            "anysr_input": "NCHW RGB in [0, 1]" + ("" if dynamic else f", {side}x{side}")}
    if net_opt is not None:
        meta["anysr_network_g"] = json.dumps(net_opt, sort_keys=True)
    atomic_write_bytes(path, _with_metadata(data, meta))
    return ExportReport(path, "onnx", None, net_opt["type"] if net_opt else type(net).__name__,
                        "fp16" if fp16 else "fp32", dynamic=dynamic, size=side, note=note, checks=checks)


# --------------------------------------------------------------------------------------------- the command
def export_weights(weights: str, outputs: list[str], *, param_key: str = "auto", arch: str | None = None,
                   arch_opts: dict[str, Any] | None = None, network_opt: dict[str, Any] | None = None,
                   fp16: bool = False, size: int | None = None, dynamic: bool = True, opset: int = ONNX_OPSET,
                   check: bool = True) -> list[ExportReport]:
    """``anysr export WEIGHTS --to OUT...``: each output's format follows its suffix (.pth, .safetensors, .onnx).

    The network comes from ``arch`` (+ ``arch_opts``), ``network_opt``, the weights' anysr metadata, what anysr
    recognises in the tensors' names and shapes, or spandrel (``anysr[spandrel]``); a recognised network is
    exported in its deployed form with its options in the metadata. Without any of them, plain exports still work
    (the chosen group, wrapper prefixes removed, not checked against a network) and ONNX needs one.
    """
    for out in outputs:
        if Path(out).suffix.lower() not in EXPORT_SUFFIXES:
            raise OptionError(f"--to {out}: the suffix says the format; use .pth, .safetensors or .onnx")
        if Path(out).resolve() == Path(weights).resolve():
            raise OptionError(f"--to {out} is the input file; choose another name")
    if any(Path(o).suffix.lower() == ".onnx" for o in outputs):
        check_onnx_settings(size, opset)
    raw, meta, group = ckpt.read_weights(weights, param_key, key_option="--param-key")
    buildable = bool(arch) or network_opt is not None or "network_g" in meta or recognisable(dict(raw))
    wants_onnx = any(Path(o).suffix.lower() == ".onnx" for o in outputs)
    net: nn.Module | None = None
    net_opt: dict[str, Any] | None = None
    scale = meta["scale"] if isinstance(meta.get("scale"), int) else None
    if buildable or wants_onnx:
        res = resolve_network(weights=weights, arch=arch, arch_opts=arch_opts or {}, network_opt=network_opt,
                              scale=None, param_key=param_key)
        net, net_opt = deploy_form(res.net.eval(), res.net_opt)
        scale, group = res.scale, res.group
        sd: dict[str, Any] = net.state_dict()
    else:
        sd, prefix = ckpt.strip_container_prefix(raw)
        if prefix:
            logger.info("%s: removed the prefix '%s' every name had", weights, prefix)
    del raw
    arch_name = net_opt["type"] if net_opt else (getattr(net, "architecture", None) or None)
    if wants_onnx and net is not None and arch_kind(net) != "image":  # refused before any output is written
        onnx_out = next(o for o in outputs if Path(o).suffix.lower() == ".onnx")
        raise OptionError(f"--to {onnx_out}: {arch_name} is a video network ({arch_kind(net)}: clips of frames in), "
                          "and ONNX export is for image networks; export its weights as .safetensors or .pth")
    reports = []
    for out in outputs:
        kind = Path(out).suffix.lower()[1:]
        if kind == "onnx":
            assert net is not None and scale is not None
            rep = export_onnx(net, out, scale=scale, net_opt=net_opt, fp16=fp16, size=size, dynamic=dynamic,
                              opset=opset, check=check)
            rep.group = group
            rep.arch = arch_name or rep.arch
        else:
            save_plain(out, sd, net_opt=net_opt, scale=scale, fp16=fp16)
            rep = ExportReport(Path(out), kind, group, arch_name, "fp16" if fp16 else "fp32", tensors=len(sd))
        reports.append(rep)
    return reports


# --------------------------------------------------------------------------- traiNNer-redux's ONNX option files
@dataclass
class OnnxFileSettings:
    """What an options file's ``onnx`` section (traiNNer-redux's) asks ``anysr export`` for."""

    output: Path
    fp16: bool
    dynamic: bool
    size: int | None
    opset: int
    check: bool
    notes: list[str] = field(default_factory=list)


def onnx_file_settings(onnx: dict[str, Any], name: str, folder: Path = Path("onnx")) -> OnnxFileSettings:
    """The export an ``onnx`` section describes, written as traiNNer-redux names it
    (``onnx/<name>_<shape>_<dtype>_op<opset>.onnx``). ``shape`` NxCxHxW: letters for H and W make the model
    dynamic (anysr's dynamic export: batch, height and width), numbers a fixed square size."""
    parts = str(onnx["shape"]).lower().split("x")
    labels = ["n", "c", "h", "w"] if len(parts) == 4 else ["n", "t", "c", "h", "w"]
    h, w = parts[-2], parts[-1]
    notes: list[str] = []
    if h.isdigit() != w.isdigit():
        raise OptionError(f"onnx.shape {onnx['shape']!r}: height and width must both be fixed or both dynamic")
    if h.isdigit() and h != w:
        raise OptionError(f"onnx.shape {onnx['shape']!r}: anysr exports a fixed size as a square (H = W); make "
                          "them equal or dynamic (letters)")
    dynamic = not h.isdigit()
    if not dynamic and int(h) < 1:
        raise OptionError(f"onnx.shape {onnx['shape']!r}: a fixed height and width of 1 pixel or more, or letters "
                          "for dynamic ones (e.g. 1x3xHxW)")
    low, high = _opset_range()
    if not low <= int(onnx["opset"]) <= high:
        raise OptionError(f"onnx.opset {onnx['opset']}: this torch exports ONNX opsets {low} to {high}; choose one")
    if len(parts) == 5:
        notes.append("onnx.shape has a time axis: anysr writes ONNX for image networks only (a video network is "
                     "refused: export its weights as .safetensors / .pth); wrap_5d_to_4d is not applied")
    dyn_labels = [lab.upper() for lab, p in zip(labels, parts, strict=True) if not p.isdigit()]
    shape_text = "x".join(p if p.isdigit() else lab.upper() for lab, p in zip(labels, parts, strict=True))
    shape_text += f"_dyn-{''.join(dyn_labels)}" if dyn_labels else "_static"
    dtype = onnx["dtype"]
    if dtype == "bf16":
        notes.append("onnx.dtype bf16: anysr writes fp32 ONNX (TensorRT builds a bf16 engine from it with --bf16); "
                     "traiNNer-redux's strongly typed bf16 graph is not made")
        dtype = "fp32"
    if onnx.get("optimize"):
        notes.append("onnx.optimize: OnnxSlim is not run (the graph is written as exported)")
    if onnx.get("dynamo"):
        notes.append("onnx.dynamo: anysr's exporter is used")
    dtype_text = dtype if dtype == "fp32" else f"strong_{dtype}"
    out = folder / f"{name}_{shape_text}_{dtype_text}_op{onnx['opset']}.onnx"
    return OnnxFileSettings(out, dtype == "fp16", dynamic, None if dynamic else int(h), int(onnx["opset"]),
                            bool(onnx["verify"]), notes)

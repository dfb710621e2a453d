"""``anysr infer --backend``: the network's forward run by PyTorch, onnxruntime (CPU) or OpenVINO (CPU).

Only the forward changes: the exported network (``export.export_onnx``: fp32, dynamic batch / height / width,
checked against PyTorch) sits behind a small ``nn.Module`` (``RuntimeNetwork``) that takes and gives the same
tensors, so tiles, tile padding, alpha, gray and 16-bit results go through the code that torch uses.

The export is kept in ``<cache>/onnx/<key>.onnx`` (``calibrate.cache_dir()``), the key hashing the weights (the
network's state dict, after DNI and the deployment form), the network options and the opset: a second run loads
it. A network whose export is fixed-size or fails is refused in one line (``auto`` keeps torch); that verdict is
cached too. ``auto`` times one forward of torch and of each installed backend at the calibration size (a bounded
budget, ``ANYSR_CALIBRATION_BUDGET``), keeps the fastest in the calibration cache and says so in one line.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from anysr.accelerators.calibrate import _read_cache, _write_cache, budget_s, cache_dir, remeasure
from anysr.archs.arch_util import input_channels
from anysr.atomic import atomic_write_json
from anysr.errors import OptionError
from anysr.ops.tiling import tile_multiple

BACKENDS = ("torch", "onnxruntime", "openvino", "auto")
RUNTIMES = ("onnxruntime", "openvino")
# The pip extra and the module each runtime needs (the export itself needs onnx, and onnxruntime checks it).
_EXTRA = {"onnxruntime": "onnx", "openvino": "openvino"}
_MODULES = {"onnxruntime": ("onnx", "onnxruntime"), "openvino": ("onnx", "onnxruntime", "openvino")}
EXPORT_VERSION = 1


def _import(name: str) -> Any:
    return importlib.import_module(name)


def missing_package(backend: str) -> str | None:
    """The first module ``backend`` needs that is not installed (None: all are)."""
    for module in _MODULES[backend]:
        try:
            _import(module)
        except ImportError:
            return module
    return None


def require(backend: str) -> None:
    """Raise one line naming the pip extra when ``backend``'s packages are not installed."""
    module = missing_package(backend)
    if module is not None:
        raise OptionError(f"--backend {backend} needs the {module} package: pip install 'anysr[{_EXTRA[backend]}]'")


def export_key(net: nn.Module, net_opt: dict[str, Any] | None, opset: int) -> str:
    """The export cache's key: the weights (every state-dict tensor's name, shape, type and bytes), the network
    options (or the class name) and the opset."""
    h = hashlib.sha256()
    h.update(json.dumps([EXPORT_VERSION, opset, net_opt if net_opt is not None else type(net).__name__],
                        sort_keys=True, default=str).encode())
    for name, t in net.state_dict().items():
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:32]


def exported_model(net: nn.Module, net_opt: dict[str, Any] | None, scale: int,
                   opset: int | None = None) -> tuple[Path | None, str]:
    """The cached dynamic-size ONNX export of ``net`` (exported now when not cached) and how it was found;
    ``(None, reason)`` when the network exports only at a fixed size or not at all (also cached)."""
    from anysr.engine.inference.export import ONNX_OPSET, deploy_form, export_onnx  # noqa: PLC0415 - import cycle

    opset = ONNX_OPSET if opset is None else opset
    key = export_key(net, net_opt, opset)
    folder = cache_dir() / "onnx"
    model, verdict = folder / f"{key}.onnx", folder / f"{key}.json"
    try:
        known = json.loads(verdict.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        known = None
    if isinstance(known, dict) and known.get("dynamic") is True and model.is_file():
        return model, f"cached export {model}"
    if isinstance(known, dict) and known.get("dynamic") is False:
        return None, str(known.get("reason", "no dynamic-size ONNX export"))
    folder.mkdir(parents=True, exist_ok=True)
    trial, trial_opt = deploy_form(copy.deepcopy(net).float().eval(), net_opt)
    t0 = time.perf_counter()
    try:
        report = export_onnx(trial, model, scale=scale, net_opt=trial_opt, dynamic=True, opset=opset)
    except OptionError:
        raise
    except Exception as exc:  # noqa: BLE001 - the exporter raises many types for what it cannot trace
        text = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        reason = f"the network does not export to ONNX ({text})"
        atomic_write_json(verdict, {"dynamic": False, "reason": reason})
        return None, reason
    if not report.dynamic:
        model.unlink(missing_ok=True)
        reason = f"the network's ONNX export takes only {report.size}x{report.size} inputs ({report.note})"
        atomic_write_json(verdict, {"dynamic": False, "reason": reason})
        return None, reason
    worst = max((c.max_diff for c in report.checks), default=0.0)
    atomic_write_json(verdict, {"dynamic": True, "max_diff": worst})
    return model, f"exported to {model} in {time.perf_counter() - t0:.1f} s (onnxruntime vs PyTorch {worst:.1e})"


class RuntimeNetwork(nn.Module):
    """An exported network run by ``backend`` (onnxruntime or OpenVINO, CPU, fp32) as a module: (N, C, h, w)
    float in, (N, C', h*s, w*s) float out, on the input's device. The session is built at the first forward (the
    module pickles without it)."""

    def __init__(self, backend: str, model: Path, *, in_channels: int, multiple: int, threads: int | None = None):
        super().__init__()
        if backend not in RUNTIMES:
            raise OptionError(f"--backend {backend}: choose one of {', '.join(RUNTIMES)}")
        self.backend = backend
        self.model = Path(model)
        self.in_channels = in_channels
        self.tile_multiple = multiple
        self.threads = threads
        self._run: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_run"] = None
        return state

    def _session(self) -> Any:
        threads = self.threads or torch.get_num_threads()
        if self.backend == "onnxruntime":
            ort = _import("onnxruntime")
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            session = ort.InferenceSession(str(self.model), options, providers=["CPUExecutionProvider"])
            name = session.get_inputs()[0].name
            return lambda x: session.run(None, {name: x})[0]
        ov = _import("openvino")
        compiled = ov.Core().compile_model(str(self.model), "CPU", {"INFERENCE_PRECISION_HINT": "f32",
                                                                    "INFERENCE_NUM_THREADS": threads})
        return lambda x: compiled(x)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._run is None:
            self._run = self._session()
        out = self._run(np.ascontiguousarray(x.detach().to("cpu", torch.float32).numpy()))
        return torch.from_numpy(np.asarray(out, dtype=np.float32)).to(x.device)

    def extra_repr(self) -> str:
        return f"{self.backend}, {self.model.name}"


def _time_forward(net: nn.Module, shape: tuple[int, ...], budget: float) -> float:
    """Best seconds of a forward of ``net`` at ``shape`` (one untimed warm-up, then up to 3 within ``budget``)."""
    x = torch.rand(shape, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    with torch.no_grad():
        net(x)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            net(x)
            best = min(best, time.perf_counter() - t0)
            if time.perf_counter() - start > budget:
                break
    return best


def pick_fastest(net: nn.Module, runtimes: dict[str, nn.Module], key: str,
                 shape: tuple[int, ...]) -> tuple[str, str]:
    """``auto``: the fastest of torch (fp32 forward) and ``runtimes`` at ``shape``, and a one-line account; from
    the calibration cache when this network, shape, machine and thread count were measured before."""
    cache_key = "backend:" + hashlib.sha256(json.dumps(
        [key, list(shape), sorted(runtimes), torch.__version__, torch.get_num_threads()]).encode()).hexdigest()[:32]
    cached = None if remeasure() else _read_cache().get(cache_key)
    if isinstance(cached, dict) and cached.get("best") in ("torch", *runtimes):
        return cached["best"], (f"--backend auto: {cached['best']} (measured on {cached.get('measured', '?')}: "
                                f"{cached.get('timings', '')}; kept in {cache_dir()})")
    budget = budget_s()
    t0 = time.perf_counter()
    times: dict[str, float] = {}
    for name, model in (("torch", net), *runtimes.items()):
        left = budget - (time.perf_counter() - t0)
        if times and left <= 0:
            break
        times[name] = _time_forward(model, shape, max(left, 0.0) / 2)
    best = min(times, key=lambda k: times[k])
    timings = ", ".join(f"{k} {1e3 * v:.1f} ms" for k, v in sorted(times.items(), key=lambda i: i[1]))
    left_out = [k for k in ("torch", *runtimes) if k not in times]
    if left_out:
        timings += f" ({', '.join(left_out)} not timed: past the budget)"
    timings = f"forward of {tuple(shape)}: {timings}"
    _write_cache(cache_key, {"best": best, "timings": timings, "measured": time.strftime("%Y-%m-%d %H:%M:%S")})
    return best, (f"--backend auto: {best} (measured in {time.perf_counter() - t0:.1f} s, budget {budget:g} s: "
                  f"{timings}; kept in {cache_dir()})")


def choose_backend(backend: str, net: nn.Module, net_opt: dict[str, Any] | None, scale: int,
                   shape: tuple[int, ...]) -> tuple[nn.Module, str, list[str]]:
    """The module that runs the forward for ``--backend`` (``net`` itself for torch), the backend used and the
    lines to log. An explicit runtime that is not installed or cannot run this network (no dynamic-size export)
    is refused in one line; ``auto`` then keeps torch and says why."""
    if backend not in BACKENDS:
        raise OptionError(f"--backend {backend}: choose one of {', '.join(BACKENDS)}")
    if backend == "torch":
        return net, "torch", []
    wanted = RUNTIMES if backend == "auto" else (backend,)
    if backend != "auto":
        require(backend)
    installed = [b for b in wanted if missing_package(b) is None]
    if not installed:
        return net, "torch", ["--backend auto: torch (neither onnxruntime nor openvino is installed: "
                              "pip install 'anysr[onnx]' or 'anysr[openvino]')"]
    model, how = exported_model(net, net_opt, scale)
    if model is None:
        if backend != "auto":
            raise OptionError(f"--backend {backend}: {how}; use --backend torch")
        return net, "torch", [f"--backend auto: torch ({how})"]
    multiple = tile_multiple(net)
    channels = input_channels(net) or 3
    runtimes = {b: RuntimeNetwork(b, model, in_channels=channels, multiple=multiple) for b in installed}
    notes = [f"--backend: {how}"]
    if backend != "auto":
        return runtimes[backend], backend, [*notes, f"--backend {backend}: the forward runs in {backend} (CPU, fp32)"]
    best, line = pick_fastest(net.eval(), runtimes, export_key(net, net_opt, 0), shape)
    return (net if best == "torch" else runtimes[best]), best, [*notes, line]


__all__ = ["BACKENDS", "RUNTIMES", "RuntimeNetwork", "choose_backend", "export_key", "exported_model",
           "missing_package", "pick_fastest", "require"]

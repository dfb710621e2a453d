"""Measure, once per machine and network, which precision / memory format runs a network fastest on the CPU.

Feature flags do not tell: bf16 autocast halved a training step on an AMD EPYC with AVX512-BF16 and made it 1.4x
*slower* on an Intel Xeon with AVX512-BF16 (no AMX exposed); channels_last won 10-20 % on some networks and lost
5 % on others (benchmarks/README.md). So where the rules leave a choice open (``auto`` on a CPU), the candidate
settings are timed on a copy of the real network with the real input shape (forward, plus backward when training;
interleaved, best of a few runs) and the fastest wins. The result is cached under ``~/.cache/anysr`` (or
``$ANYSR_CACHE_DIR``), keyed by the CPU, torch, the kernel caps, the thread count, the network and the shape, so
the next run starts at once.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from anysr.accelerators.hardware import cpu_flags
from anysr.accelerators.precision import Variant, to_channels_last
from anysr.atomic import atomic_write_json

CACHE_FILE = "choices.json"
CACHE_VERSION = 1
SLOW_STEP_S = 1.0  # steps slower than this are timed once per variant


def cache_dir() -> Path:
    """Where measured choices are kept: ``$ANYSR_CACHE_DIR``, else ``$XDG_CACHE_HOME/anysr``, else ~/.cache/anysr."""
    if os.environ.get("ANYSR_CACHE_DIR"):
        return Path(os.environ["ANYSR_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "anysr"


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    return platform.processor() or platform.machine()


def fingerprint(net: nn.Module, shape: tuple[int, ...], train: bool, variants: list[Variant]) -> str:
    """What decides the timings: machine, software, kernel caps, threads, network structure, shape, mode."""
    flags = sorted(f for f in cpu_flags() if "bf16" in f or "amx" in f or f.startswith("avx512"))
    structure = [(k, tuple(v.shape), str(v.dtype)) for k, v in net.state_dict().items()]
    parts = [CACHE_VERSION, _cpu_name(), flags, torch.__version__, torch.backends.cpu.get_cpu_capability(),
             os.environ.get("ONEDNN_MAX_CPU_ISA", ""), torch.get_num_threads(), type(net).__name__, structure,
             list(shape), train, [v.label() for v in variants]]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:32]


def _read_cache() -> dict[str, Any]:
    try:
        data = json.loads((cache_dir() / CACHE_FILE).read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(key: str, entry: dict[str, Any]) -> None:
    """Best effort (a read-only home just means measuring again next time)."""
    with contextlib.suppress(OSError):
        data = _read_cache()
        data[key] = entry
        atomic_write_json(cache_dir() / CACHE_FILE, data)


def _prepare(net: nn.Module, variant: Variant) -> nn.Module:
    trial = copy.deepcopy(net).float()
    return to_channels_last(trial) if variant.channels_last else trial


@contextlib.contextmanager
def _autocast(precision: str) -> Iterator[None]:
    if precision == "bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            yield
    else:
        yield


def _time_once(net: nn.Module, x: torch.Tensor, variant: Variant, train: bool) -> float:
    t0 = time.perf_counter()
    if train:
        with _autocast(variant.precision):
            out = net(x)
        out.float().abs().mean().backward()
    else:
        with torch.no_grad(), _autocast(variant.precision):
            net(x)
    return time.perf_counter() - t0


def measure(net: nn.Module, shape: tuple[int, ...], variants: list[Variant], *, train: bool, repeats: int = 2,
            warmup: int = 1, seed: int = 0, slow_s: float = SLOW_STEP_S) -> dict[Variant, float]:
    """Seconds per forward (+ backward when ``train``) of each variant on the CPU: the best of ``repeats``
    interleaved runs after ``warmup`` untimed ones. ``net`` itself is not changed (copies are timed).

    A step slower than ``slow_s`` is timed once per variant (a big network's differences dwarf the noise, and
    calibration should stay a few steps of the run)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=gen)
    trials = {v: _prepare(net, v) for v in variants}
    inputs = {v: x.contiguous(memory_format=torch.channels_last) if v.channels_last and x.dim() == 4 else x
              for v in variants}
    for v in variants:
        trials[v].train(train)
        for _ in range(warmup):
            if _time_once(trials[v], inputs[v], v, train) > slow_s:
                repeats = min(repeats, 1)
    best = {v: float("inf") for v in variants}
    for _ in range(repeats):
        for v in variants:
            trials[v].zero_grad(set_to_none=True)
            best[v] = min(best[v], _time_once(trials[v], inputs[v], v, train))
    return best


def fastest(net: nn.Module, shape: tuple[int, ...], variants: list[Variant], *,
            train: bool) -> tuple[Variant, str]:
    """The fastest variant and a one-line account of the timings (from the cache when known)."""
    key = fingerprint(net, shape, train, variants)
    cached = _read_cache().get(key)
    by_label = {v.label(): v for v in variants}
    if isinstance(cached, dict) and cached.get("best") in by_label:
        when = f" on {cached['measured']}" if isinstance(cached.get("measured"), str) else ""
        return by_label[cached["best"]], (f"measured{when} on this CPU for this network, kept in "
                                          f"{cache_dir() / CACHE_FILE} (delete it to measure again): "
                                          f"{cached['timings']}")
    times = measure(net, shape, variants, train=train)
    best = min(times, key=lambda v: times[v])
    what = "forward + backward" if train else "forward"
    timings = ", ".join(f"{v.label()} {1e3 * t:.1f} ms" for v, t in sorted(times.items(), key=lambda i: i[1]))
    timings = f"{what} of {tuple(shape)}: {timings}"
    _write_cache(key, {"best": best.label(), "timings": timings, "measured": time.strftime("%Y-%m-%d %H:%M:%S")})
    return best, f"measured on this CPU for this network: {timings}"

"""Measure, once per machine and network, which precision / memory format runs a network fastest on the CPU.

Feature flags do not tell: bf16 autocast halved a training step on an AMD EPYC with AVX512-BF16 and made it 1.4x
*slower* on an Intel Xeon with AVX512-BF16 (no AMX exposed); channels_last won 10-20 % on some networks and lost
5 % on others (benchmarks/README.md). So where the rules leave a choice open (``auto`` on a CPU), the candidate
settings are timed on a copy of the real network with the real input shape (forward, plus backward when training;
interleaved, best of a few runs) and the fastest wins. The result is cached under ``~/.cache/anysr`` (or
``$ANYSR_CACHE_DIR``), keyed by the CPU, torch, the kernel caps, the thread count, the network and the shape, so
the next run starts at once.

The first run's cost is bounded: measuring stops after ``BUDGET_S`` seconds (``$ANYSR_CALIBRATION_BUDGET``), a
variant whose first step is several times slower than the fastest so far (bf16 emulated on a CPU without native
bf16: ~24x) is timed once only, and the variants the budget left untried are named in the account line. Before a
variant's full-size step, a pilot step on a sixteenth of the input says what the full one would cost: a variant
that would end past the budget is not started (a channels_last step once took 137 s of a 10 s budget).

Only a complete measurement on a quiet machine is kept. A choice made from fewer candidates than there were (the
budget ran out), or while other programs or other anysr jobs kept cores busy, is *provisional*: this run uses it,
and the next run measures again.
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

from anysr.accelerators.cpu_share import SHARED_CORES, ShareWatch, peer_jobs
from anysr.accelerators.hardware import cpu_flags
from anysr.accelerators.precision import Variant, to_channels_last
from anysr.atomic import atomic_write_json

CACHE_FILE = "choices.json"
CACHE_VERSION = 1
SLOW_STEP_S = 1.0  # steps slower than this are timed once per variant
BUDGET_S = 10.0  # seconds the first run of a network may spend measuring (ANYSR_CALIBRATION_BUDGET)
# How a user measures again (a run's log line says it): the cached choice is timed again and replaced.
AGAIN = "`anysr bench -opt FILE --remeasure` or ANYSR_REMEASURE=1 times it again"
LOSER_FACTOR = 3.0  # a variant this many times slower than the fastest after one timed step is not timed again
PILOT_AREA = 16  # the pilot step's input has 1/PILOT_AREA of the pixels


def budget_s() -> float:
    """The calibration budget in seconds: ``$ANYSR_CALIBRATION_BUDGET`` when set to a positive number, else 10."""
    raw = os.environ.get("ANYSR_CALIBRATION_BUDGET", "")
    try:
        value = float(raw)
    except ValueError:
        return BUDGET_S
    return value if value > 0 else BUDGET_S


def remeasure() -> bool:
    """Whether ``$ANYSR_REMEASURE`` (``anysr bench --remeasure``) asks to time again what the cache holds."""
    return os.environ.get("ANYSR_REMEASURE", "") not in ("", "0")


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


def _layout(x: torch.Tensor, variant: Variant) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if variant.channels_last and x.dim() == 4 else x


def _pilot_input(x: torch.Tensor) -> torch.Tensor | None:
    """A quarter of ``x``'s height and width (None where that is below 16 pixels: the full step is cheap then)."""
    if x.dim() < 4 or min(x.shape[-2:]) < 64:
        return None
    return x[..., : x.shape[-2] // 4, : x.shape[-1] // 4].contiguous()


def measure(net: nn.Module, shape: tuple[int, ...], variants: list[Variant], *, train: bool, repeats: int = 2,
            warmup: int = 1, seed: int = 0, slow_s: float = SLOW_STEP_S,
            budget: float | None = None) -> dict[Variant, float]:
    """Seconds per forward (+ backward when ``train``) of the variants on the CPU: the best of ``repeats``
    interleaved runs after ``warmup`` untimed ones. ``net`` itself is not changed (copies are timed).

    A step slower than ``slow_s`` is timed once per variant (a big network's differences dwarf the noise).
    ``budget`` (seconds, default ``budget_s()``) bounds the whole measurement: variants are warmed up in order
    while half of it is left, each warmed-up one is timed once while the budget lasts (the first always), further
    repeats only within it and only for variants within ``LOSER_FACTOR`` x the fastest timing (bf16 emulated on a
    CPU without native bf16, ~24x slower, is timed once). Variants not timed are absent from the result."""
    budget = budget_s() if budget is None else budget
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=gen)
    small = _pilot_input(x)
    trials: dict[Variant, nn.Module] = {}
    inputs: dict[Variant, torch.Tensor] = {}
    pilots: dict[Variant, float] = {}
    first_full = 0.0
    for v in variants:  # warm-up (one-time costs: not compared)
        if trials and time.perf_counter() - start > budget / 2:
            break
        trial = _prepare(net, v).train(train)
        if trials and small is not None and v not in pilots:  # what would this variant's full step cost?
            first = next(iter(trials))
            try:
                pilots[v] = _time_once(trial, _layout(small, v), v, train)
                if first not in pilots:
                    pilots[first] = _time_once(trials[first], _layout(small, first), first, train)
            except (RuntimeError, ValueError):  # the network needs more than a quarter of the input (norms, pooling)
                small = None
                pilots.clear()
            else:
                projected = first_full * pilots[v] / max(pilots[first], 1e-9)
                if time.perf_counter() - start + 2 * projected > budget:
                    continue  # it would end past the budget: not timed (named in the account)
        trials[v] = trial
        inputs[v] = _layout(x, v)
        t0 = time.perf_counter()
        for _ in range(max(warmup, 1)):
            if _time_once(trials[v], inputs[v], v, train) > slow_s:
                repeats = min(repeats, 1)
        if len(trials) == 1:
            first_full = (time.perf_counter() - t0) / max(warmup, 1)
    best: dict[Variant, float] = {}
    for r in range(max(repeats, 1)):
        contenders = list(trials) if r == 0 else \
            [v for v in best if best[v] <= LOSER_FACTOR * min(best.values())]
        for v in contenders:
            if best and time.perf_counter() - start > budget:
                return best
            trials[v].zero_grad(set_to_none=True)
            best[v] = min(best.get(v, float("inf")), _time_once(trials[v], inputs[v], v, train))
    return best


def fastest(net: nn.Module, shape: tuple[int, ...], variants: list[Variant], *,
            train: bool) -> tuple[Variant, str]:
    """The fastest variant and a one-line account of the timings (from the cache when known)."""
    key = fingerprint(net, shape, train, variants)
    cached = None if remeasure() else _read_cache().get(key)
    by_label = {v.label(): v for v in variants}
    if isinstance(cached, dict) and cached.get("best") in by_label:
        when = f" on {cached['measured']}" if isinstance(cached.get("measured"), str) else ""
        return by_label[cached["best"]], (f"measured{when}: {cached['timings']}; kept in {cache_dir() / CACHE_FILE} "
                                          f"({AGAIN})")
    budget = budget_s()
    t0 = time.perf_counter()
    watch = ShareWatch()
    times = measure(net, shape, variants, train=train, budget=budget)
    took = time.perf_counter() - t0
    busy, peers = watch.sample(), peer_jobs()
    best = min(times, key=lambda v: times[v])
    what = "forward + backward" if train else "forward"
    timings = ", ".join(f"{v.label()} {1e3 * t:.1f} ms" for v, t in sorted(times.items(), key=lambda i: i[1]))
    timings = f"{timings} per {what} of {'x'.join(str(d) for d in shape)}"
    left = [v.label() for v in variants if v not in times]
    if left:
        timings += f" ({', '.join(left)} not timed: the {budget:g} s budget, ANYSR_CALIBRATION_BUDGET, ran out)"
    why_not = provisional(left, busy, len(peers))
    if why_not:
        return best, f"measured in {took:.1f} s: {timings}; provisional ({why_not}): timed again next run"
    _write_cache(key, {"best": best.label(), "timings": timings, "measured": time.strftime("%Y-%m-%d %H:%M:%S")})
    return best, f"measured in {took:.1f} s: {timings}; kept in {cache_dir() / CACHE_FILE} ({AGAIN})"


def provisional(left: list[str], busy: float | None, peers: int) -> str:
    """Why a measurement must not be cached as the answer ('' when it may): candidates left untimed, or other
    programs / anysr jobs busy on the cores while it ran (their load skews the comparison)."""
    reasons = []
    if left:
        reasons.append(f"{len(left)} candidate{'s' if len(left) > 1 else ''} not timed")
    if busy is not None and busy >= SHARED_CORES:
        reasons.append(f"other programs kept {busy:.1f} cores busy")
    if peers:
        reasons.append(f"{peers} other anysr job{'s' if peers > 1 else ''} ran")
    return ", ".join(reasons)

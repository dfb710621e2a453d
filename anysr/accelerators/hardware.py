"""What the hardware runs natively, and the choices ``precision: auto`` and ``channels_last: auto`` make from it.

The path of ``train.precision``: the options accept ``PRECISION_CHOICES``; the parent checks the request once
against what the device kind refuses (``check_precision``, when the launch plan is made); the worker decides the
value once, in ``precision.Precision.decide``, with the rules below (and, where they leave a choice on a CPU,
with the timings of ``calibrate.py``).

CPU facts come from the CPU's feature flags and from what torch and oneDNN were told to use
(``ATEN_CPU_CAPABILITY``, ``ONEDNN_MAX_CPU_ISA``), never from a device runtime, so the parent process may ask
too. The per-device facts (a CUDA device's compute capability, the PJRT device kind) are handed in by the
accelerator that owns the device.

Why these rules (numbers in ``benchmarks/README.md``):

* bf16 is native on a CPU with AVX512-BF16 or AMX, on CUDA from compute capability 8.0 (Ampere), and on TPUs;
  elsewhere it is emulated (AVX2 CPU: a quick-start step 3956 ms in bf16 vs 161 ms in fp32, ~24x slower), so
  ``auto`` never picks it there. fp16 is only ever used when asked for (it needs a loss scaler and overflows in
  some networks).
* Native is not always faster: bf16 autocast halved a training step on an AMD EPYC with AVX512-BF16 but was 1.4x
  slower than fp32 on an Intel Xeon with AVX512-BF16 (no AMX exposed), and channels_last wins on most networks
  but not all. On the CPU the rules therefore only narrow the candidates; ``calibrate.py`` times them on the
  real network and picks the fastest.
* On CUDA, tensor-core convolutions (bf16/fp16) want NHWC; fp32 is left as it is. MPS and XLA: NCHW (not
  measured faster on MPS; XLA lays out memory itself).
"""

from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from typing import Any

from anysr.errors import AcceleratorError

# oneDNN's ISA names (``ONEDNN_MAX_CPU_ISA``) from the oldest to the newest; bf16 arithmetic is native from
# AVX512_CORE_BF16 on. AVX2_VNNI_2 converts bf16 but has no bf16 dot product.
_ONEDNN_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                "AVX512_CORE_BF16", "AVX10_1_512", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX10_1_512_AMX",
                "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16", "ALL", "DEFAULT")
_NATIVE_BF16_ISA = "AVX512_CORE_BF16"
PRECISIONS = ("fp32", "bf16", "fp16")
PRECISION_CHOICES = ("auto", *PRECISIONS)  # what options and flags accept; ``auto`` is decided in the worker
# What a device kind refuses outright (checked in the parent, before any worker exists).
_REFUSED = {
    ("cpu", "fp16"): "train.precision: fp16 on the CPU is slow and unscaled; use auto (bf16 where the CPU has "
                     "AVX512-BF16/AMX and it is faster, else fp32), bf16 or fp32",
    ("xla", "fp16"): "train.precision: fp16 is not supported on XLA (TPUs compute in bfloat16 and have no loss "
                     "scaler); set train.precision: bf16 or fp32",
}
BF16_EMULATED_COST = ("measured on an AVX2 CPU: a quick-start training step took 3956 ms in bf16 vs 161 ms in "
                      "fp32, 24x slower (benchmarks/README.md)")


ASKED = "set in the options or on the command line"  # why a forced setting is what it is, unless said otherwise


@dataclass(frozen=True)
class Choice:
    """One hardware-dependent setting: what the options asked for, what was chosen, and why.

    ``warning`` is set when an explicit request runs but badly on this hardware (say it once, on the main rank).
    """

    name: str
    requested: Any
    value: Any
    reason: str
    warning: str | None = None
    default: bool = False  # the command's own default (anysr test's fp32), not the user's request

    def setting(self) -> str:
        """'precision bf16', 'channels_last on'."""
        shown = {True: "on", False: "off"}.get(self.value, self.value) if isinstance(self.value, bool) else self.value
        return f"{self.name} {shown}"

    def how(self) -> str:
        return "auto" if self.requested == "auto" else "default" if self.default else "asked for"

    def describe(self) -> str:
        return f"{self.setting()} ({self.how()}: {self.reason})"

    def as_dict(self) -> dict[str, Any]:
        return {"requested": self.requested, "chosen": self.value, "why": self.reason}


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (x86 ``flags``, ARM ``Features``); empty where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def _aten_capability() -> str:
    import torch  # noqa: PLC0415 - the options read this module without torch

    getter = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return str(getter()).upper() if getter is not None else "UNKNOWN"


def cpu_bf16(flags: frozenset[str] | None = None, *, aten: str | None = None,
             onednn_isa: str | None = None) -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively for torch, and why (arguments override the detected values).

    Native means: the CPU has AVX512-BF16 or AMX-BF16, ATen's kernels use AVX-512 (``ATEN_CPU_CAPABILITY`` can
    lower that) and oneDNN is not capped below its bf16 ISA (``ONEDNN_MAX_CPU_ISA``).
    """
    flags = cpu_flags() if flags is None else flags
    aten = _aten_capability() if aten is None else aten.upper()
    if onednn_isa is None:
        onednn_isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    isa = onednn_isa.strip().upper()
    machine = platform.machine().lower()
    kind = "AMX-BF16" if "amx_bf16" in flags else "AVX512-BF16" if "avx512_bf16" in flags else None
    if kind is None:
        where = f"{machine} CPU" if machine else "CPU"
        return False, f"this {where} has no native bf16 (no AVX512-BF16 or AMX; torch kernels: {aten})"
    if not aten.startswith("AVX512"):
        return False, f"the CPU has {kind} but torch's kernels are limited to {aten} (ATEN_CPU_CAPABILITY)"
    if isa in _ONEDNN_ISAS and _ONEDNN_ISAS.index(isa) < _ONEDNN_ISAS.index(_NATIVE_BF16_ISA):
        return False, f"the CPU has {kind} but ONEDNN_MAX_CPU_ISA={onednn_isa} keeps oneDNN below it"
    return True, f"this CPU runs bf16 natively ({kind})"


def check_precision(requested: str, device: str | None = None) -> None:
    """Refuse a ``precision`` request that is not one of ``PRECISION_CHOICES`` or that the device kind ``device``
    cannot run (None: only the spelling is checked)."""
    if requested not in PRECISION_CHOICES:
        raise AcceleratorError(f"train.precision: '{requested}' is not one of {', '.join(PRECISION_CHOICES)}")
    if (device, requested) in _REFUSED:
        raise AcceleratorError(_REFUSED[(device, requested)])


def choose_precision(requested: str, native_bf16: tuple[bool, str], *, device: str,
                     deep_samples: str | None = None,
                     source: str = ASKED) -> Choice:
    """``precision`` for a device whose bf16 support is ``native_bf16`` = (native, why).

    ``auto``: bf16 where native, else fp32; fp32 with 16-bit samples (``deep_samples``: what holds them), whose low
    byte bf16 would lose. An explicit bf16 where it is emulated runs, with a warning.
    """
    native, why = native_bf16
    if requested == "auto" and deep_samples:
        return Choice("precision", "auto", "fp32", f"{deep_samples}: bf16 keeps about 8 bits of a 16-bit sample")
    if requested == "auto":
        if native:
            return Choice("precision", "auto", "bf16", why)
        return Choice("precision", "auto", "fp32", why)
    warning = None
    if requested == "bf16" and not native:
        cost = f"; {BF16_EMULATED_COST}" if device == "cpu" else ""
        warning = (f"precision bf16 was asked for, but {why}: it is emulated and much slower than fp32{cost}. "
                   "Use precision auto (or fp32) unless you need bf16 numerics")
    return Choice("precision", requested, requested, source, warning, default=source != ASKED)


def choose_channels_last(requested: bool | None, *, device: str, precision: str) -> Choice:
    """``channels_last`` (None: auto) for a device kind and the precision already chosen."""
    shown = "auto" if requested is None else requested
    if requested is not None:
        if requested and device == "xla":
            return Choice("channels_last", shown, False, "XLA chooses memory layouts itself; the request is ignored")
        return Choice("channels_last", shown, bool(requested), ASKED)
    if device == "cpu":
        return Choice("channels_last", "auto", True, "NHWC is faster on most CPUs; timed on the network when "
                      "it is built (calibrate)")
    if device == "cuda":
        if precision in ("bf16", "fp16"):
            return Choice("channels_last", "auto", True, f"tensor-core convolutions in {precision} want NHWC")
        return Choice("channels_last", "auto", False, "fp32 on CUDA: left in NCHW (not measured faster)")
    if device == "xla":
        return Choice("channels_last", "auto", False, "XLA chooses memory layouts itself")
    return Choice("channels_last", "auto", False, f"not measured faster on {device}")


# Device kinds whose compiler has no lowering for grid_sample and for the backward of bilinear / nearest
# upsampling (torch_xla 2.9 runs them on the host): networks sample by gathers there, same numbers.
_GATHER_RESAMPLING = frozenset({"xla"})


def resamples_by_gathers(device: Any) -> bool:
    """Whether networks on ``device`` (a torch.device) should resample by explicit gathers instead of
    ``grid_sample`` / ``F.interpolate`` (the accelerator layer's knowledge, asked by the architectures)."""
    return getattr(device, "type", None) in _GATHER_RESAMPLING

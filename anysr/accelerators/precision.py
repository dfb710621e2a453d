"""Precision: how one worker computes and lays out numbers (autocast dtype, gradient scaler, memory format).

``train.precision`` and ``train.channels_last`` travel from the options into the ``LaunchPlan`` unchanged
(``auto`` or a forced value; the parent only checks the spelling and what a device kind refuses). They become
values in exactly one function, ``Precision.decide``: once from the device's rules when the worker binds its
device (``Accelerator.setup``), and once more where the rules leave a choice open and the candidates were timed
on the real network (``Accelerator.calibrate``, CPU only). Everything that autocasts, scales a loss or converts
a memory format reads the decided values from this object.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from anysr.accelerators.hardware import Choice, choose_channels_last, choose_precision
from anysr.tree import tree_map

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Variant:
    """One candidate setting (precision, memory format) that calibration may time."""

    precision: str
    channels_last: bool

    def label(self) -> str:
        return f"{self.precision}/{'NHWC' if self.channels_last else 'NCHW'}"


def to_channels_last(net: nn.Module) -> nn.Module:
    """Store ``net``'s 4-D parameters and buffers (conv weights) in NHWC memory, in place; values are unchanged.

    Unlike ``net.to(memory_format=torch.channels_last)`` this leaves 5-D tensors alone (which that call
    would try, and fail, to convert). Parameters keep their identity, so optimisers built later see them.
    """
    with torch.no_grad():
        for t in [*net.parameters(), *net.buffers()]:
            if t.dim() == 4 and not t.is_contiguous(memory_format=torch.channels_last):
                t.data = t.data.contiguous(memory_format=torch.channels_last)
    return net


def standard_layout(obj: Any) -> Any:
    """``obj`` with every tensor (also inside dicts, lists and tuples) NCHW-contiguous (copied only if not)."""
    return tree_map(lambda t: t if t.is_contiguous() else t.contiguous(), obj)


class Precision:
    """The numeric side of one worker: the decided precision and memory format, autocast and the loss scaler.

    Until ``decide`` runs (the worker binds its device in ``Accelerator.setup``) it computes in fp32, NCHW.
    """

    def __init__(self, requested: str, channels_last: bool | None, deep_samples: str | None = None,
                 source: str = "set in the options or on the command line") -> None:
        self.requested = requested  # one of PRECISION_CHOICES, as the options say
        self.requested_channels_last = channels_last  # None: auto
        self.deep_samples = deep_samples  # what holds 16-bit samples (auto: fp32), None: nothing
        self.source = source  # why a forced precision was asked for
        self.name = "fp32"
        self.channels_last = False
        self.choices: dict[str, Choice] = {}
        self.scaler: Any = None
        self.loss_factor: torch.Tensor | None = None  # NaN injection (rehearsing NaN recovery)
        self._device_type = "cpu"

    # ---------------------------------------------------------------- the decision
    def decide(self, device: torch.device, kind: str, native_bf16: tuple[bool, str], *,
               measured: tuple[Variant, str, list[Variant]] | None = None) -> None:
        """THE place where ``precision`` and ``channels_last`` (``auto`` or forced) get their values.

        ``kind`` is the device kind (``cpu``, ``cuda``, ``mps``, ``xla``) whose rules apply and ``native_bf16``
        = (native, why) what it runs natively (``hardware.choose_precision`` / ``choose_channels_last``); with
        16-bit samples (``deep_samples``, from the plan) ``auto`` is fp32 wherever it runs.
        ``measured`` = (fastest variant, how it was found, the variants timed): a calibration's answer, which
        replaces the rule for every setting the variants differed in (the other keeps its rule's reason).
        fp16 on CUDA gets a gradient scaler.
        """
        self._device_type = device.type
        precision = choose_precision(self.requested, native_bf16, device=kind, deep_samples=self.deep_samples,
                                     source=self.source)
        layout = choose_channels_last(self.requested_channels_last, device=kind, precision=str(precision.value))
        self.choices = {"precision": precision, "channels_last": layout}
        self.name, self.channels_last = str(precision.value), bool(layout.value)
        if measured is not None:
            best, why, variants = measured
            for name, value, options in (("precision", best.precision, {v.precision for v in variants}),
                                         ("channels_last", best.channels_last, {v.channels_last for v in variants})):
                if len(options) > 1:
                    self.choices[name] = Choice(name, "auto", value, why)
            self.name, self.channels_last = best.precision, best.channels_last
        if self.name == "fp16" and device.type == "cuda" and self.scaler is None:
            self.scaler = torch.amp.GradScaler("cuda")

    @property
    def precision_open(self) -> bool:
        """Whether the precision is left to the device's rule or a measurement: ``auto``, and no 16-bit samples."""
        return self.requested == "auto" and self.deep_samples is None

    def describe_choices(self) -> str:
        """'precision bf16 (auto: ...), channels_last on (auto: ...)' for the first log line; settings decided by
        the same measurement share one account of it."""
        groups: dict[tuple[str, str], list[str]] = {}
        for c in self.choices.values():
            groups.setdefault((c.how(), c.reason), []).append(c.setting())
        return ", ".join(f"{', '.join(names)} ({how}: {reason})" for (how, reason), names in groups.items())

    def warnings(self) -> list[str]:
        """Warnings about requests that run badly on this hardware (log them once, on the main rank)."""
        return [c.warning for c in self.choices.values() if c.warning]

    # ---------------------------------------------------------------- compute
    @property
    def autocast_dtype(self) -> torch.dtype | None:
        return _DTYPES.get(self.name)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The autocast context for the forward pass (a no-op in fp32)."""
        dtype = self.autocast_dtype
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self._device_type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, scaled when a gradient scaler is in use; times ``loss_factor`` when set (a device
        scalar, 1 or NaN: ``train.nan_recovery.inject_at``)."""
        if self.loss_factor is not None:
            loss = loss * self.loss_factor
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Undo the loss scale on ``optimizer``'s gradients (before clipping); a no-op without a scaler."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``, through the scaler (which skips steps with inf/nan gradients) when there is one."""
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    # ---------------------------------------------------------------- memory format
    def convert_module(self, net: nn.Module) -> nn.Module:
        """``net`` in the decided memory format (in place)."""
        return to_channels_last(net) if self.channels_last else net

    def to_device(self, tensors: Any, device: torch.device) -> Any:
        """Move tensors to ``device``; with channels_last, 4-D floating tensors (NCHW batches) become NHWC."""
        def move(t: torch.Tensor) -> torch.Tensor:
            if self.channels_last and t.dim() == 4 and t.is_floating_point():
                return t.to(device, non_blocking=True, memory_format=torch.channels_last)
            return t.to(device, non_blocking=True)

        return tree_map(move, tensors)

    def for_saving(self, state: Any) -> Any:
        """Host copies in the standard (NCHW-contiguous) layout, so files hold the same bytes in any format."""
        return standard_layout(state) if self.channels_last else state

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Precision-owned training state: the gradient scaler, and the precision / memory format the run computes
        with (a resumed run keeps them: a measured choice may differ next time, and so would the last bits)."""
        return {"scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "variant": [self.name, self.channels_last]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


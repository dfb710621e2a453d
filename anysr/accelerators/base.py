"""The accelerator interface: the one object that knows devices, processes, collectives and precision.

Everything outside ``anysr/accelerators`` asks an ``Accelerator`` instead of touching a device runtime. It is
three parts, as in Lightning Fabric: the ``Accelerator`` itself is the device (placement, randomness, steps,
counters), ``acc.strategy`` the processes (rank, collectives, data parallel, stop signals; ``strategy.py``) and
``acc.precision`` the numerics (autocast, loss scaler, memory format; ``precision.py``). The few methods here
that touch all three (``setup``, ``prepare_model``, ``optimizer_step``, ``save``, ``calibrate``) compose them.
"""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from anysr.accelerators.calibrate import fastest
from anysr.accelerators.plan import LaunchPlan
from anysr.accelerators.precision import Precision, Variant
from anysr.accelerators.strategy import Strategy
from anysr.tree import tree_map

__all__ = ["Accelerator", "LaunchPlan"]


def device_scalar(value: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``value`` as a 0-dim tensor that is data on ``device``, its own graph input on XLA whatever its value.

    Uploaded as one element and viewed as a scalar: torch_xla merges 0-dim uploads of equal value into one graph
    input, so a per-step scalar (an EMA warm-up weight of 0.5, say) that happened to equal another scalar of the
    step made that step's graph one input short: a graph of its own, compiled mid-run.
    """
    return torch.tensor([value], dtype=dtype).to(device).reshape(())


class Accelerator(ABC):
    """A device kind, with this worker's strategy (place in the world) and precision."""

    name: str = "base"
    strategy_class: ClassVar[type[Strategy]] = Strategy

    def __init__(self, plan: LaunchPlan, local_rank: int = 0) -> None:
        self.plan = plan
        self.strategy = self.strategy_class(plan, local_rank)
        # autocast, scaler, memory format: decided by ``decide_hardware`` once ``setup`` has bound the device
        self.precision = Precision(plan.precision, plan.channels_last, plan.deep_samples, plan.precision_source)
        self._host_transfers = 0
        # NaN recovery: with ``watch_gradients``, whether every clipped gradient norm since ``take_gradients_finite``
        # was finite, as a device flag (no host read); not with a loss scaler, whose overflows are expected
        self.watch_gradients = False
        self._grads_finite: torch.Tensor | None = None

    # ---------------------------------------------------------------- lifecycle
    @property
    @abstractmethod
    def device(self) -> torch.device:
        """The torch device this worker computes on."""

    def setup(self) -> None:
        """Called once in the worker before any work (process group, device selection)."""

    def teardown(self, failed: bool = False) -> None:
        """Called once in the worker at the end (``strategy.teardown``: destroys the process group).

        ``failed``: this worker leaves on an error; it must not enter any collective (the others may never).
        """
        self.strategy.teardown(failed)

    # ---------------------------------------------------------------- shortcuts to the strategy
    @property
    def rank(self) -> int:
        """This worker's global rank (``strategy.rank``)."""
        return self.strategy.rank

    @property
    def world_size(self) -> int:
        """How many workers the run has (``strategy.world_size``)."""
        return self.strategy.world_size

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that writes files and logs (``strategy.is_main``)."""
        return self.strategy.is_main

    # ---------------------------------------------------------------- device facts
    @property
    def static_shapes(self) -> bool:
        """True where every new tensor shape costs a compile (XLA): tiles are then padded to one shape."""
        return False

    @property
    def batch_multiplier(self) -> int:
        """How many per-device batches one process loads per step (SPMD: its local device count)."""
        return 1

    # ---------------------------------------------------------------- hardware choices
    def native_bf16(self) -> tuple[bool, str]:
        """Whether this device computes bf16 natively, and why (call after the device is bound)."""
        return False, f"bf16 is not known to be native on {self.name}"

    def decide_hardware(self) -> None:
        """Decide ``precision`` and ``channels_last`` (``auto`` or forced) by this device's rules (``setup``)."""
        self.precision.decide(self.device, self.name, self.native_bf16())

    def candidate_variants(self) -> list[Variant]:
        """Settings ``auto`` leaves to measurement on this device (none: the rules decided)."""
        return []

    def calibrate(self, net: nn.Module, shape: tuple[int, ...], *, train: bool,
                  recorded: object = None) -> None:
        """Where ``auto`` is decided by measuring (the CPU), time the candidates on a copy of ``net`` (on the CPU,
        before ``prepare_model``) with inputs of ``shape``, and keep the fastest. Every rank must call it: the main
        rank measures (or reads its cache) and tells the others. ``recorded``: the ``[precision, channels_last]``
        a resumed run's state holds, kept instead of measuring (exact resume) when it is still a candidate."""
        variants = self.candidate_variants()
        if len(variants) < 2:
            return
        kept = Variant(str(recorded[0]), bool(recorded[1])) if isinstance(recorded, (list, tuple)) \
            and len(recorded) == 2 else None
        if kept in variants:
            self.precision.decide(self.device, self.name, self.native_bf16(), measured=(
                kept, "as the run being resumed computed (exact resume; its state records it)", variants))
            return
        found = fastest(net, shape, variants, train=train) if self.is_main else None
        best, why = self.strategy.broadcast_object(found)
        self.precision.decide(self.device, self.name, self.native_bf16(), measured=(best, why, variants))

    def place(self) -> str:
        """'cpu rank 0/1' (with the device where it is not the kind's name)."""
        where = "" if str(self.device) == self.name else f" on {self.device}"
        return f"{self.name} rank {self.rank}/{self.world_size}{where}"

    def describe(self) -> str:
        layout = ", channels_last" if self.precision.channels_last else ""
        return f"{self.place()} ({self.precision.name}{layout})"

    # ---------------------------------------------------------------- randomness
    def manual_seed(self, seed: int) -> None:
        """Seed every generator the same way on every rank (identical initial weights)."""
        random.seed(seed)
        np.random.seed(seed % (2**32))
        torch.manual_seed(seed)

    def rng_state(self) -> dict[str, Any]:
        """Every RNG that decides the future, in a ``weights_only``-loadable form."""
        py = random.getstate()
        np_state = np.random.get_state()
        return {
            "python": [py[0], list(py[1]), py[2]],
            "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), int(np_state[2]),
                      int(np_state[3]), float(np_state[4])],
            "torch": torch.get_rng_state(),
            "device": self.device_rng_state(),
        }

    def set_rng_state(self, state: dict[str, Any]) -> None:
        py = state["python"]
        random.setstate((py[0], tuple(py[1]), py[2]))
        npst = state["numpy"]
        np.random.set_state((npst[0], npst[1].numpy().astype(np.uint32), npst[2], npst[3], npst[4]))
        torch.set_rng_state(state["torch"])
        if state.get("device") is not None:
            self.set_device_rng_state(state["device"])

    def device_rng_state(self) -> Any:
        """The device generator's state (None where the device shares the CPU generator)."""
        return None

    def set_device_rng_state(self, state: Any) -> None:
        del state

    # ---------------------------------------------------------------- placement
    def to_device(self, obj: Any) -> Any:
        """Move tensors (also inside dicts, lists and tuples) to this worker's device, in the decided memory
        format (with channels_last, 4-D floating tensors become NHWC)."""
        return self.precision.to_device(obj, self.device)

    def to_host(self, obj: Any) -> Any:
        """Move tensors to the CPU (counted: device-to-host transfers are what stall XLA)."""
        def move(t: torch.Tensor) -> torch.Tensor:
            if t.device.type != "cpu":
                self._host_transfers += 1
            return t.detach().cpu()

        return tree_map(move, obj)

    def prepare_model(self, net: nn.Module) -> nn.Module:
        """Place ``net`` on the device in the decided memory format, made data parallel by the strategy
        (``strategy.unwrap`` gives the bare module back)."""
        return self.strategy.wrap(self.precision.convert_module(net.to(self.device)))

    def prepare_loader(self, loader: Iterable[Any]) -> Iterable[Any]:
        """Wrap a CPU data loader so that it yields batches on the device."""
        return _DeviceLoader(loader, self)

    # ---------------------------------------------------------------- steps
    def optimizer_step(self, optimizer: torch.optim.Optimizer, clip_grad_norm: float | None = None,
                       parameters: Iterable[torch.Tensor] | None = None) -> torch.Tensor | None:
        """Reduce (strategy), unscale, clip and step (precision); returns the gradient norm (on the device) when
        clipping."""
        self.strategy.reduce_gradients(optimizer)
        norm = None
        self.precision.unscale(optimizer)
        if clip_grad_norm is not None and clip_grad_norm > 0:
            params = list(parameters) if parameters is not None else [
                p for g in optimizer.param_groups for p in g["params"]]
            norm = torch.nn.utils.clip_grad_norm_(params, clip_grad_norm)
            if self.watch_gradients and self.precision.scaler is None:
                ok = torch.isfinite(norm)
                self._grads_finite = ok if self._grads_finite is None else self._grads_finite & ok
        self.precision.step(optimizer)
        return norm

    def run_train_step(self, model: Any, batches: Any) -> dict[str, torch.Tensor] | None:
        """A backend that compiles the whole training step (torchax) runs ``model``'s here and returns its losses;
        None (every other backend): the model steps eagerly itself."""
        del model, batches
        return None

    def inference_forward(self, net: nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
        """The function that runs ``net`` (in eval mode, without gradients) on this device's inputs: ``net`` itself,
        or a compiled forward over its current weights (torchax)."""
        return net

    def sync_model(self, model: Any) -> None:
        """Bring ``model``'s torch objects (weights, optimizer state, EMA) up to date where a compiled step keeps
        them elsewhere between steps (torchax); a no-op on every other backend."""
        del model

    def take_gradients_finite(self) -> torch.Tensor | None:
        """The device flag "every gradient norm seen since the last call was finite" (None: none was seen), reset.
        Only kept with ``watch_gradients`` and clipping (the norm is computed for the clipping anyway)."""
        flag, self._grads_finite = self._grads_finite, None
        return flag

    def mark_step(self) -> None:
        """End of a traced step (XLA runs the graph here); a no-op on eager devices."""

    def synchronize(self) -> None:
        """Wait until queued device work is done (for honest timings)."""

    # ---------------------------------------------------------------- state and saving
    def save(self, state_fn: Callable[[], Any], writer: Callable[[Any], None]) -> Any:
        """A save as a collective: every rank syncs and builds the host state, rank 0 writes, all meet.

        ``state_fn`` is called on every rank (it may read device tensors); ``writer`` only on rank 0. With
        channels_last the host copies are made standard (NCHW-contiguous) first, so weights and training states
        hold the same bytes whatever the memory format of the run. Returns the host state (on the CPU device its
        tensors may be the live ones; the writer may have taken entries out of it).
        """
        self.mark_step()
        state = self.to_host(state_fn())
        self.strategy.write_on_main(state, lambda host: writer(self.precision.for_saving(host)))
        return state

    stats_in_log = False  # whether ``stats()`` goes into the training log at print_freq (XLA: compiles)

    def stats(self) -> dict[str, Any]:
        """Counters worth logging (XLA: compiles, executions, transfers)."""
        return {"host_transfers": self._host_transfers}

    def mark_warmup_done(self) -> None:
        """From now on every graph should be cached: XLA warns once if a new one compiles."""

    def rewarm(self) -> None:
        """A one-off event compiled graphs (the first step after a NaN recovery's restore, whose inputs alias
        differently): move the warm-up point there, if one was set; later steps are checked again."""

    def check_recompiles(self) -> str | None:
        """A warning text when graphs were compiled after warm-up (checked at print_freq), else None."""
        return None

    def threads_note(self) -> tuple[str, bool] | None:
        """How many host threads this worker computes with and why (and whether the CPU is shared), where the
        device is the CPU; else None."""
        return None

    def resume_threads(self, saved: object) -> str | None:
        """Go back to the thread count a resumed run's state recorded (a CPU run's last bits depend on it); the
        note to log when it changed, else None."""
        return None

    def check_sharing(self) -> str | None:
        """A warning text, once, when other programs start sharing this worker's cores (checked at print_freq)."""
        return None

    def rebalance_threads(self) -> str | None:
        """Before a fresh run's first step: fewer host threads if another job started on this host meanwhile (the
        note to log), else None."""
        return None

    def compile_model(self, net: nn.Module) -> nn.Module:
        """``torch.compile`` where this kind supports it and the options ask for it."""
        if self.plan.compile:
            return torch.compile(net)  # type: ignore[return-value]
        return net

    def is_finite(self, value: float) -> bool:
        return math.isfinite(value)


class _DeviceLoader:
    """Iterates a loader and moves each batch to the device."""

    def __init__(self, loader: Iterable[Any], acc: Accelerator) -> None:
        self.loader = loader
        self.acc = acc

    def __iter__(self) -> Iterator[Any]:
        for batch in self.loader:
            yield self.acc.to_device(batch)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

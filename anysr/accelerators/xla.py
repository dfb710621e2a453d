"""XLA devices (TPU; tested on XLA:CPU) through torch_xla's PJRT runtime.

Imported only inside a worker (``create_accelerator``), never by the parent process. Ranks come from
``torch_xla.runtime`` in ``setup()`` and live in the accelerator's ``XLAStrategy``: on TPU v2/v3 (and XLA:CPU)
several ranks are threads of one process, so nothing here may be a module global.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.debug.metrics as met
import torch_xla.runtime as xr
from torch import nn

from anysr.accelerators.base import Accelerator, LaunchPlan
from anysr.accelerators.strategy import Strategy
from anysr.errors import AcceleratorError, CheckpointError
from anysr.tree import tree_map, tree_tensors

STOP_POLL = 10  # multi-process XLA: iterations between checks whether any rank received a stop signal
_REDUCE_OPS = {"sum": xm.REDUCE_SUM, "mean": xm.REDUCE_SUM, "max": xm.REDUCE_MAX, "min": xm.REDUCE_MIN}
# .item() / bool() on an XLA tensor is counted by torch_xla as this "fallback"; it is a transfer, not an op.
_NOT_A_FALLBACK = {"aten::_local_scalar_dense"}


def _metric_count(name: str) -> int:
    data = met.metric_data(name)
    return int(data[0]) if data else 0


def _counter(name: str) -> int:
    return int(met.counter_value(name) or 0)


class XLAStrategy(Strategy):
    """Ranks started by ``torch_xla.launch`` (one device each), or one SPMD process over every local device."""

    def __init__(self, plan: LaunchPlan, local_rank: int = 0) -> None:
        super().__init__(plan, local_rank)
        self.device: torch.device | None = None  # the accelerator's, bound by join_world
        self.spmd_devices = 1
        self.mesh: Any = None

    @property
    def spmd(self) -> bool:
        return self.plan.spmd

    def join_world(self, device: torch.device) -> None:
        """Ranks from ``torch_xla.runtime`` (call after ``use_spmd`` and once ``device`` is bound); under SPMD one
        rank and a mesh over every device."""
        self.device = device
        if self.plan.spmd:
            if xr.process_count() > 1:
                raise AcceleratorError(
                    f"xla.spmd: true across {xr.process_count()} processes is not supported by anysr yet; "
                    "set xla.spmd: false (torch_xla.launch on every host)")
            import torch_xla.distributed.spmd as xs  # noqa: PLC0415 - torch_xla's modules load where they are used

            self.spmd_devices = xr.global_runtime_device_count()
            self.mesh = xs.Mesh(np.arange(self.spmd_devices), (self.spmd_devices,), ("data",))
            xs.set_global_mesh(self.mesh)
            self.rank, self.world_size, self.local_rank = 0, 1, 0
        else:
            self.world_size = xr.world_size()
            self.rank = xr.global_ordinal()
            self.local_rank = xr.local_ordinal()

    @property
    def data_parallel_size(self) -> int:
        return self.spmd_devices if self.spmd else self.world_size

    def wrap(self, net: nn.Module) -> nn.Module:
        """With several ranks, copy rank 0's parameters to all (``net`` is on the device already)."""
        if self.world_size > 1 and not self.spmd:
            xm.broadcast_master_param(net)
        return net

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Average gradients over ranks (``xm.reduce_gradients``); SPMD and one rank need nothing."""
        if self.world_size > 1 and not self.spmd:
            xm.reduce_gradients(optimizer)

    # ---------------------------------------------------------------- collectives
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if op not in _REDUCE_OPS:
            raise AcceleratorError(f"all_reduce: op '{op}' is not one of {', '.join(_REDUCE_OPS)}")
        if self.world_size == 1:
            return tensor
        on_host = tensor.device.type != "xla"
        value = tensor.to(self.device) if on_host else tensor
        scale = 1.0 / self.world_size if op == "mean" else 1.0
        out = xm.all_reduce(_REDUCE_OPS[op], value, scale=scale)
        return out.cpu() if on_host else out

    def all_gather_object(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        payloads = xm.rendezvous("anysr.all_gather_object", pickle.dumps(obj))
        return [pickle.loads(p) for p in payloads]

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if self.world_size == 1:
            return obj
        payload = pickle.dumps(obj) if self.rank == src else b""
        payloads = xm.rendezvous("anysr.broadcast_object", payload)
        return pickle.loads(payloads[src])

    def barrier(self) -> None:
        if self.world_size > 1:
            xm.rendezvous("anysr.barrier")

    def stop_signal(self, iteration: int) -> int | None:
        """One process (one device or SPMD): this worker's signal. Several: every ``STOP_POLL`` iterations the
        ranks exchange what they received (a host rendezvous; every step would stall the device pipeline)."""
        if self.world_size == 1:
            return self.stop.signum
        if iteration % STOP_POLL:
            return None
        seen = [s for s in self.all_gather_object(self.stop.signum) if s is not None]
        return seen[0] if seen else None

    def write_on_main(self, state: Any, writer: Callable[[Any], None]) -> None:
        """Global rank 0 writes; all meet afterwards. A failed write on rank 0 is told to every rank at the
        meeting point, so none waits forever."""
        failure: Exception | None = None
        if self.is_main:
            try:
                writer(state)
            except Exception as exc:  # noqa: BLE001 - rank 0 must still reach the collective below
                failure = exc
        message = self.broadcast_object(None if failure is None else f"{type(failure).__name__}: {failure}")
        if failure is not None:
            raise failure
        if message is not None:
            raise CheckpointError(f"saving failed on rank 0 ({message}); see rank 0's log for the path")


class XLAAccelerator(Accelerator):
    """One XLA device per rank (``torch_xla.launch``), or one process sharding batches over all (SPMD)."""

    name = "xla"
    stats_in_log = True

    strategy_class = XLAStrategy
    strategy: XLAStrategy

    def __init__(self, plan: LaunchPlan, local_rank: int = 0) -> None:
        super().__init__(plan, local_rank)
        self._device: torch.device | None = None
        self._warm_compiles: int | None = None
        self._warned_compiles = 0

    # ---------------------------------------------------------------- lifecycle
    def setup(self) -> None:
        if self.plan.spmd:
            xr.use_spmd()  # before any tensor touches the device
        self._device = torch_xla.device()
        self.strategy.join_world(self._device)
        self.decide_hardware()

    def native_bf16(self) -> tuple[bool, str]:
        kind = str(self.plan.extra.get("pjrt_device", "")).upper()
        if kind == "TPU":
            return True, "TPUs compute in bf16"
        return False, f"XLA:{kind or '?'} does not run bf16 natively (not measured faster)"

    @property
    def static_shapes(self) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        if self._device is None:
            raise AcceleratorError("XLAAccelerator: call setup() inside the worker before using the device")
        return self._device

    @property
    def spmd(self) -> bool:
        return self.plan.spmd

    @property
    def batch_multiplier(self) -> int:
        return self.strategy.spmd_devices if self.spmd else 1

    def place(self) -> str:
        where = (f"SPMD over {self.strategy.spmd_devices} devices" if self.spmd
                 else f"rank {self.rank}/{self.world_size}")
        kind = self.plan.extra.get("pjrt_device", "XLA")
        return f"xla ({kind}) {where} on {self.device}"

    def describe(self) -> str:
        return f"{self.place()} ({self.precision.name})"

    # ---------------------------------------------------------------- randomness
    def manual_seed(self, seed: int) -> None:
        """Seed Python, numpy, torch and the XLA generator, the same way on every rank."""
        super().manual_seed(seed)
        xm.set_rng_state(int(seed), self.device)

    def device_rng_state(self) -> Any:
        return int(xm.get_rng_state(self.device))

    def set_device_rng_state(self, state: Any) -> None:
        xm.set_rng_state(int(state), self.device)

    # ---------------------------------------------------------------- placement
    def to_host(self, obj: Any) -> Any:
        """Move every XLA tensor in ``obj`` to the CPU in one batched transfer (counted)."""
        found = [t for t in tree_tensors(obj) if t.device.type == "xla"]
        if not found:
            return tree_map(lambda t: t.detach().cpu(), obj)
        self._host_transfers += 1
        convert = getattr(xm, "_maybe_convert_to_cpu", None)
        if convert is not None:
            moved = list(convert([t.detach() for t in found]))
        else:  # older/newer torch_xla without the batched helper
            moved = [t.detach().cpu() for t in found]
        lookup = {id(t): m for t, m in zip(found, moved)}
        return tree_map(lambda t: lookup[id(t)] if id(t) in lookup else t.detach().cpu(), obj)

    def prepare_loader(self, loader: Iterable[Any]) -> Iterable[Any]:
        """An ``MpDeviceLoader``: background host-to-device copies, a graph sync before each batch.

        Under SPMD, 4-D tensors (NCHW batches) are sharded along the batch over all devices.
        """
        import torch_xla.distributed.parallel_loader as pl  # noqa: PLC0415 - torch_xla's modules load where they are used

        kwargs: dict[str, Any] = {}
        if self.spmd:
            import torch_xla.distributed.spmd as xs  # noqa: PLC0415 - torch_xla's modules load where they are used

            kwargs["input_sharding"] = xs.ShardingSpec(self.strategy.mesh, ("data", None, None, None))
        return pl.MpDeviceLoader(loader, self.device, **kwargs)

    # ---------------------------------------------------------------- steps
    def mark_step(self) -> None:
        torch_xla.sync()

    def synchronize(self) -> None:
        xm.wait_device_ops()

    # ---------------------------------------------------------------- state and saving
    def stats(self) -> dict[str, Any]:
        """torch_xla's own counters for this process: graphs compiled and run, device-to-host transfers,
        operations that fell back to the CPU (``aten::*``) and the persistent compile cache."""
        fallbacks = {}
        for name in met.counter_names():
            if name.startswith("aten::") and name not in _NOT_A_FALLBACK:
                fallbacks[name] = _counter(name)
        compiles = _metric_count("CompileTime")
        return {
            "compiles": compiles,
            # graphs compiled since the last warm-up point (the trainer marks it after each validation)
            "compiles_after_warmup": None if self._warm_compiles is None else compiles - self._warm_compiles,
            "executions": _metric_count("ExecuteTime") + _metric_count("ExecuteReplicatedTime"),
            "host_transfers": _metric_count("TransferFromDeviceTime"),
            "to_host_calls": self._host_transfers,
            "cpu_fallbacks": fallbacks,
            "persistent_cache": {"hits": _counter("PersistentCacheHit"),
                                 "misses": _counter("PersistentCacheMiss"),
                                 "failures": _counter("PersistentCacheDeserializeFailure")},
        }

    def mark_warmup_done(self) -> None:
        self._warm_compiles = _metric_count("CompileTime")
        self._warned_compiles = self._warm_compiles

    def rewarm(self) -> None:
        if self._warm_compiles is not None:
            self.mark_warmup_done()

    def check_recompiles(self) -> str | None:
        """One warning text when graphs were compiled since the last check after warm-up, else None."""
        if self._warm_compiles is None:
            return None
        now = _metric_count("CompileTime")
        if now <= self._warned_compiles:
            return None
        self._warned_compiles = now
        return (f"XLA compiled {now - self._warm_compiles} new graph(s) after warm-up ({now} in total): "
                "a shape or a Python value changes between steps; run with PT_XLA_DEBUG_LEVEL=2 to see why")

    def compile_model(self, net: nn.Module) -> nn.Module:
        """XLA compiles the traced graph itself: ``net`` is returned unchanged."""
        return net

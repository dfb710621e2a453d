"""Strategy: this worker's place among the processes of a run, and what the processes do together.

Rank state (rank, world size, the stop signals of this worker) lives in this object, never in module globals (XLA
on TPU v2/v3 and on CPU runs ranks as threads). The base class is one process alone: every collective returns
its input. ``torch_dist.ProcessGroupStrategy`` (gloo / NCCL) and ``xla.XLAStrategy`` (PJRT) run several.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from anysr.accelerators.plan import LaunchPlan
from anysr.accelerators.process import StopSignals


class Strategy:
    """One process, no collectives (a single device)."""

    def __init__(self, plan: LaunchPlan, local_rank: int = 0) -> None:
        self.plan = plan
        self.local_rank = local_rank
        self.rank = 0
        self.world_size = 1
        self.stop = StopSignals()  # the worker entry installs the handlers (``launcher._worker``)

    # ---------------------------------------------------------------- the world
    @property
    def is_main(self) -> bool:
        """True on global rank 0: the rank that writes files and logs."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def data_parallel_size(self) -> int:
        """How many ways the global batch is split (ranks, or SPMD devices)."""
        return self.world_size

    @property
    def data_rank(self) -> int:
        """This worker's index among the data-parallel shards."""
        return self.rank

    def teardown(self, failed: bool = False) -> None:
        """Leave the world (destroy the process group).

        ``failed``: this worker leaves on an error; it must not enter any collective (the others may never).
        """

    # ---------------------------------------------------------------- stopping on a signal
    def stop_signal(self, iteration: int) -> int | None:
        """The stop signal every rank acts on after ``iteration``, or None (the same answer on every rank).

        One process: the signal this worker received. Several: see the subclasses (they agree on the iteration).
        """
        del iteration
        return self.stop.signum

    def is_peer_failure(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a collective that failed because another rank died (that rank says why)."""
        del exc
        return False

    # ---------------------------------------------------------------- the model across ranks
    def wrap(self, net: nn.Module) -> nn.Module:
        """``net`` (already on the device) made data parallel where this strategy does it by wrapping."""
        return net

    def unwrap(self, net: nn.Module) -> nn.Module:
        """The bare module behind whatever ``wrap`` (or ``torch.compile``) wrapped it in."""
        inner = getattr(net, "module", None)
        return inner if isinstance(inner, nn.Module) and type(net).__name__ in {
            "DistributedDataParallel", "DataParallel"} else getattr(net, "_orig_mod", net)

    @contextlib.contextmanager
    def no_sync(self, net: nn.Module) -> Iterator[None]:
        """Skip the gradient all-reduce during accumulation micro-steps."""
        del net
        yield

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Average gradients over data-parallel ranks where the model wrapper does not."""
        del optimizer

    # ---------------------------------------------------------------- collectives
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Sum (or 'mean', 'max', 'min') a tensor over all ranks; returns the result."""
        del op
        return tensor

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """``obj`` from rank ``src`` on every rank (small, picklable objects only)."""
        del src
        return obj

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]

    def barrier(self) -> None:
        """Every rank waits here for all others."""

    def write_on_main(self, state: Any, writer: Callable[[Any], None]) -> None:
        """``writer(state)`` on rank 0, then every rank meets (the second half of ``Accelerator.save``)."""
        if self.is_main:
            writer(state)
        self.barrier()

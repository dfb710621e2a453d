"""CPU, CUDA and MPS workers on torch.distributed (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import contextlib
import datetime
import inspect
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from anysr.accelerators.base import Accelerator, LaunchPlan
from anysr.accelerators.cpu_share import (
    THREADS_ENV,
    ShareWatch,
    available_cores,
    claim_and_choose,
    rebalance,
    resume_threads,
)
from anysr.accelerators.cpu_share import apply as apply_threads
from anysr.accelerators.hardware import cpu_bf16
from anysr.accelerators.precision import Variant
from anysr.accelerators.strategy import Strategy
from anysr.errors import AcceleratorError

# Buffers (EDSR's mean, SwinIR's masks) are constants: identical on every rank, never synced per step.
# torch >= 2.13 names this forward_sync_buffers (and deprecates broadcast_buffers).
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False}
                   if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
                   else {"broadcast_buffers": False})
_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
_STOP_KEY = "anysr/stop"
# What gloo / NCCL / the store say when a peer process is gone (the peer that failed first reports why).
_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Socket Timeout",
              "connection refused", "Connection refused", "NCCL communicator was aborted", "remote process exited",
              "ECONNRESET", "EPIPE", "failed to recv", "Timed out")


def env_world() -> tuple[int, int, int] | None:
    """(rank, world_size, local_rank) when torchrun or SLURM already started us, else None."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank = int(os.environ["RANK"])
        return rank, int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_RANK", rank))
    return None


def slurm_world() -> tuple[int, int, int]:
    """(rank, world_size, local_rank) from SLURM's variables (``--launcher slurm``)."""
    try:
        return (int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"]),
                int(os.environ.get("SLURM_LOCALID", "0")))
    except KeyError as exc:
        raise AcceleratorError(
            f"--launcher slurm: {exc.args[0]} is not set; start the job with srun "
            "(one task per device) or drop --launcher slurm") from None


class ProcessGroupStrategy(Strategy):
    """Ranks on a torch.distributed process group (gloo or NCCL) when world_size > 1; DDP for the model."""

    def __init__(self, plan: LaunchPlan, local_rank: int = 0) -> None:
        super().__init__(plan, local_rank)
        self._device = torch.device("cpu")
        self._owns_group = False
        self._stop_store: Any = None
        self._stop_published = False

    def _world(self) -> tuple[int, int, int]:
        if self.plan.launcher == "spawn":
            return self.local_rank, self.plan.nprocs, self.local_rank
        if self.plan.launcher == "torchrun":
            world = env_world()
            if world is None:
                raise AcceleratorError("launcher torchrun: RANK / WORLD_SIZE are not set")
            return world
        if self.plan.launcher == "slurm":
            return slurm_world()
        return 0, 1, 0

    def join_world(self) -> None:
        """Take this worker's rank, world size and local rank from the launcher that started it."""
        self.rank, self.world_size, self.local_rank = self._world()

    def setup(self, device: torch.device, backend: str, init_kwargs: dict[str, Any]) -> None:
        """Join the process group on ``device`` (several ranks only); ``backend`` unless the plan names one."""
        self._device = device
        if self.world_size > 1 and not dist.is_initialized():
            if self.plan.launcher == "slurm":
                os.environ.setdefault("MASTER_PORT", str(self.plan.master_port or 29500))
                if "MASTER_ADDR" not in os.environ:
                    raise AcceleratorError(
                        "--launcher slurm: set MASTER_ADDR to the first node's host name "
                        "(for example: export MASTER_ADDR=$(scontrol show hostnames $SLURM_NODELIST | head -n1))")
            timeout = datetime.timedelta(minutes=30)
            kwargs = dict(init_kwargs)
            if self.plan.launcher == "spawn":
                # The parent hosts the rendezvous store (see launch()), so no rank's exit can take it away
                # from the others while they tear down.
                kwargs["store"] = dist.TCPStore(os.environ.get("MASTER_ADDR", "127.0.0.1"),
                                                int(os.environ["MASTER_PORT"]), self.world_size, is_master=False,
                                                timeout=timeout)
            dist.init_process_group(self.plan.dist_backend or backend, rank=self.rank,
                                    world_size=self.world_size, timeout=timeout, **kwargs)
            self._owns_group = True

    def teardown(self, failed: bool = False) -> None:
        if not (self._owns_group and dist.is_initialized()):
            return
        self._owns_group = False
        if failed:
            # Never a collective on the way out of an error: the other ranks may never reach it. Abort the
            # communicators (NCCL would otherwise wait for peers) and leave.
            abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
            with contextlib.suppress(RuntimeError, ValueError, AttributeError):
                abort() if abort is not None else dist.destroy_process_group()
            return
        dist.barrier()  # nobody leaves while another rank still has collectives in flight
        dist.destroy_process_group()

    # ---------------------------------------------------------------- stopping on a signal
    def stop_signal(self, iteration: int) -> int | None:
        """Several ranks: the first rank that notices a signal publishes ``iteration + 1`` in the rendezvous
        store; every rank reads the store after each step and stops after that iteration. Ranks are at most one
        step apart (each step ends in a gradient all-reduce), so all of them read it in time."""
        if self.world_size == 1:
            return self.stop.signum
        store = self._store()
        if self.stop.signum is not None and not self._stop_published:
            store.compare_set(_STOP_KEY, "", f"{iteration + 1}:{self.stop.signum}")
            self._stop_published = True
        if not store.check([_STOP_KEY]):
            return None
        at, signum = (int(v) for v in store.get(_STOP_KEY).decode().split(":"))
        return signum if iteration >= at else None

    def _store(self) -> Any:
        if self._stop_store is None:
            self._stop_store = dist.distributed_c10d._get_default_store()  # noqa: SLF001 - the group's store
        return self._stop_store

    def is_peer_failure(self, exc: BaseException) -> bool:
        return self.world_size > 1 and isinstance(exc, (dist.DistError, RuntimeError)) and not isinstance(
            exc, AcceleratorError) and any(word in str(exc) for word in _PEER_GONE)

    # ---------------------------------------------------------------- model
    def wrap(self, net: nn.Module) -> nn.Module:
        if self.world_size > 1 and any(p.requires_grad for p in net.parameters()):
            ids = [self._device.index] if self._device.type == "cuda" else None
            net = DistributedDataParallel(net, device_ids=ids, **_NO_BUFFER_SYNC,
                                          find_unused_parameters=bool(self.plan.ddp.get("find_unused_parameters")),
                                          static_graph=bool(self.plan.ddp.get("static_graph")))
        return net

    @contextlib.contextmanager
    def no_sync(self, net: nn.Module) -> Iterator[None]:
        if isinstance(net, DistributedDataParallel):
            with net.no_sync():
                yield
        else:
            yield

    # ---------------------------------------------------------------- collectives
    def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if self.world_size == 1:
            return tensor
        out = tensor.clone()
        if op == "mean":
            dist.all_reduce(out, op=dist.ReduceOp.SUM)
            return out / self.world_size
        dist.all_reduce(out, op=_OPS[op])
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_gather_object(self, obj: Any) -> list[Any]:
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()



class TorchDistAccelerator(Accelerator):
    """Shared code of the eager devices (CPU, CUDA, MPS) on a ``ProcessGroupStrategy``."""

    backend = "gloo"
    strategy_class = ProcessGroupStrategy
    strategy: ProcessGroupStrategy

    def setup(self) -> None:
        self.strategy.join_world()
        self.select_device()
        self.decide_hardware()
        self.strategy.setup(self.device, self.backend, self._init_kwargs())

    def _init_kwargs(self) -> dict[str, Any]:
        return {}

    def select_device(self) -> None:
        """Bind this worker to its device."""


class CPUAccelerator(TorchDistAccelerator):
    """The CPU: one process, or several ranks on gloo (``accelerator: cpu`` with ``num_gpu: N``)."""

    name = "cpu"
    backend = "gloo"

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def native_bf16(self) -> tuple[bool, str]:
        return cpu_bf16()

    def candidate_variants(self) -> list[Variant]:
        """CPUs differ too much for a rule (benchmarks/README.md): where auto, fp32 vs native bf16 and NCHW vs NHWC
        are timed on the network (``calibrate``). Emulated bf16 is never a candidate."""
        precisions = [self.precision.name]
        if self.precision.precision_open and self.native_bf16()[0]:
            precisions = ["fp32", "bf16"]
        layouts = [False, True] if self.plan.channels_last is None else [self.precision.channels_last]
        return [Variant(p, c) for p in precisions for c in layouts]

    def select_device(self) -> None:
        # Ranks share the cores (each its fair part), and so do other programs (cpu_share.py).
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size)) if self.world_size > 1 else 1
        self._ranks_here = ranks
        self._threads = claim_and_choose(ranks)
        apply_threads(self._threads)
        self._share_watch = ShareWatch() if self.is_main else None

    def rebalance_threads(self) -> str | None:
        choice = rebalance(getattr(self, "_ranks_here", 1), getattr(self, "_threads", None))
        if choice is None:
            return None
        apply_threads(choice)
        self._threads = choice
        if self._share_watch is not None:
            self._share_watch = ShareWatch()  # what others use from now on
        return f"{choice.threads} thread{'s' if choice.threads > 1 else ''}: {choice.why}"

    def threads_note(self) -> tuple[str, bool] | None:
        choice = getattr(self, "_threads", None)
        if choice is None:
            return f"{torch.get_num_threads()} threads (OMP_NUM_THREADS)", False
        return f"{choice.threads} thread{'s' if choice.threads > 1 else ''}: {choice.why}", choice.shared

    def resume_threads(self, saved: object) -> str | None:
        choice = resume_threads(saved)
        if choice is None:
            return None
        apply_threads(choice)
        self._threads = choice
        return f"{choice.threads} thread{'s' if choice.threads > 1 else ''}: {choice.why}"

    def check_sharing(self) -> str | None:
        watch = getattr(self, "_share_watch", None)
        if watch is None or watch.told:
            return None
        busy = watch.sample()
        threads = torch.get_num_threads()
        if busy is None or busy < 0.5 or available_cores() - busy >= threads:
            return None
        watch.told = True
        return (f"the CPU is shared now: other programs keep {busy:.1f} of {available_cores()} cores busy while this "
                f"run computes with {threads} thread{'s' if threads > 1 else ''}, a count it keeps (it changes a "
                f"run's last bits); to change it, stop, then --auto_resume with {THREADS_ENV}=N")


class CUDAAccelerator(TorchDistAccelerator):
    """NVIDIA GPUs: one process per device on NCCL; fp16 with a gradient scaler."""

    name = "cuda"
    backend = "nccl"

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", self.strategy.local_rank)

    def select_device(self) -> None:
        if not torch.cuda.is_available():
            raise AcceleratorError("accelerator cuda: no CUDA device is visible in this worker "
                                   "(check CUDA_VISIBLE_DEVICES, or set accelerator: cpu)")
        if self.strategy.local_rank >= torch.cuda.device_count():
            raise AcceleratorError(
                f"accelerator cuda: local rank {self.strategy.local_rank} but only {torch.cuda.device_count()} "
                "device(s) visible; lower num_gpu or --nproc_per_node")
        torch.cuda.set_device(self.strategy.local_rank)
        torch.backends.cudnn.benchmark = True
        # A collective whose peer died raises (and aborts the communicator) instead of waiting forever.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")

    def native_bf16(self) -> tuple[bool, str]:
        major, minor = torch.cuda.get_device_capability(self.device)
        name = torch.cuda.get_device_name(self.device)
        if (major, minor) >= (8, 0):
            return True, f"{name} (compute capability {major}.{minor}) has bf16 tensor cores"
        return False, f"{name} (compute capability {major}.{minor} < 8.0) has no bf16 tensor cores"

    def _init_kwargs(self) -> dict[str, Any]:
        return {"device_id": self.device}

    def manual_seed(self, seed: int) -> None:
        super().manual_seed(seed)
        torch.cuda.manual_seed_all(seed)

    def device_rng_state(self) -> Any:
        return torch.cuda.get_rng_state(self.device)

    def set_device_rng_state(self, state: Any) -> None:
        torch.cuda.set_rng_state(state, self.device)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        out["max_memory_allocated_mb"] = round(torch.cuda.max_memory_allocated(self.device) / 2**20, 1)
        return out


class MPSAccelerator(TorchDistAccelerator):
    """Apple-silicon GPU: a single device, no process group."""

    name = "mps"

    @property
    def device(self) -> torch.device:
        return torch.device("mps")

    def select_device(self) -> None:
        if not torch.backends.mps.is_available():
            raise AcceleratorError("accelerator mps: MPS is not available on this machine; set accelerator: cpu")
        if self.world_size > 1:
            raise AcceleratorError("accelerator mps: there is one MPS device; set num_gpu: 1")

    def device_rng_state(self) -> Any:
        return torch.mps.get_rng_state()

    def set_device_rng_state(self, state: Any) -> None:
        torch.mps.set_rng_state(state)

    def synchronize(self) -> None:
        torch.mps.synchronize()

    def compile_model(self, net: nn.Module) -> nn.Module:
        return net

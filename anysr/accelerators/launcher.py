"""Deciding the accelerator and starting workers, in the parent process, without touching a device runtime."""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import socket
import sys
import traceback
from collections.abc import Callable
from typing import Any

from anysr.accelerators.base import PRECISION_CHOICES, Accelerator, LaunchPlan
from anysr.accelerators.process import Interrupted, StopSignals, WorkerExit, supervise, watch_parent
from anysr.accelerators.torch_dist import env_world
from anysr.errors import PEER_FAILED, AcceleratorError, AlreadyReported, AnysrError, describe_os_error

ACCELERATORS = ("auto", "cpu", "cuda", "mps", "xla")
# Names people try for a device kind -> what to say (the nearest spelling would mislead: 'tpu' -> 'cpu').
ACCELERATOR_HINTS = {"tpu": "TPUs are accelerator: xla", "gpu": "NVIDIA GPUs are accelerator: cuda (Apple: mps)",
                     "nvidia": "NVIDIA GPUs are accelerator: cuda", "rocm": "AMD GPUs under ROCm are accelerator: cuda",
                     "hip": "AMD GPUs under ROCm are accelerator: cuda", "metal": "Apple GPUs are accelerator: mps",
                     "apple": "Apple GPUs are accelerator: mps", "pjrt": "PJRT devices are accelerator: xla"}
LAUNCHERS = ("auto", "none", "pytorch", "torchrun", "slurm")


def _cuda_count() -> int:
    """Visible CUDA devices, counted through NVML so the parent never creates a CUDA context."""
    try:
        import torch
        import torch.cuda as tc  # noqa: PLC0415

        if not torch.backends.cuda.is_built():  # a CPU-only build: no driver to ask
            return 0
        count = tc._device_count_nvml()  # noqa: SLF001 - NVML count, no context
        if count < 0:
            count = tc.device_count()
        return max(0, count)
    except (RuntimeError, AttributeError, OSError):
        return 0


def _mps_available() -> bool:
    import torch  # noqa: PLC0415

    return bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


def _xla_wanted() -> bool:
    has_xla = importlib.util.find_spec("torch_xla") is not None
    tpu_chips = bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
    return has_xla and ("PJRT_DEVICE" in os.environ or tpu_chips)


def pick_accelerator(name: str) -> str:
    """Resolve ``auto`` (XLA when PJRT_DEVICE is set or TPU chips exist, then CUDA, MPS, CPU) and check."""
    if name not in ACCELERATORS:
        from anysr.errors import did_you_mean  # noqa: PLC0415

        hint = f" ({ACCELERATOR_HINTS[name.lower()]})" if name.lower() in ACCELERATOR_HINTS \
            else did_you_mean(name, ACCELERATORS)
        raise AcceleratorError(f"accelerator: '{name}' is not one of {', '.join(ACCELERATORS)}{hint}")
    if name == "auto":
        if _xla_wanted():
            return "xla"
        if _cuda_count() > 0:
            return "cuda"
        if _mps_available():
            return "mps"
        return "cpu"
    if name == "cuda" and _cuda_count() == 0:
        raise AcceleratorError("accelerator: cuda was asked for but no CUDA device is visible "
                               "(torch built without CUDA, no driver, or CUDA_VISIBLE_DEVICES empty); "
                               "set accelerator: cpu or auto")
    if name == "mps" and not _mps_available():
        raise AcceleratorError("accelerator: mps was asked for but MPS is not available here; "
                               "set accelerator: cpu or auto")
    if name == "xla" and importlib.util.find_spec("torch_xla") is None:
        raise AcceleratorError("accelerator: xla was asked for but torch_xla is not installed; "
                               "pip install 'anysr[xla]' (torch_xla matching your torch), or set accelerator: cpu")
    return name


def _parse_count(num_gpu: Any) -> int | None:
    if num_gpu in (None, "auto"):
        return None
    if isinstance(num_gpu, bool) or not isinstance(num_gpu, int) or num_gpu < 0:
        raise AcceleratorError(f"num_gpu: {num_gpu!r} is not 'auto' or a whole number >= 0")
    return num_gpu


def resolve_plan(accelerator: str = "auto", num_gpu: Any = "auto", *, precision: str = "auto",
                 launcher: str = "auto", spmd: bool = False, compile: bool = False,
                 dist_backend: str | None = None, master_port: int | None = None,
                 channels_last: bool | None = None) -> LaunchPlan:
    """Decide what runs where, once, before any worker exists. Errors name the option to change.

    ``precision`` (``auto`` or forced) and ``channels_last`` (None: auto; ``train.channels_last``,
    ``anysr infer --channels-last``) are decided per device in the worker (``Accelerator.decide_hardware``);
    XLA ignores channels_last.
    """
    if precision not in PRECISION_CHOICES:
        raise AcceleratorError(f"train.precision: '{precision}' is not one of {', '.join(PRECISION_CHOICES)}")
    if launcher not in LAUNCHERS:
        raise AcceleratorError(f"--launcher: '{launcher}' is not one of {', '.join(LAUNCHERS)}")
    kind = pick_accelerator(accelerator)
    count = _parse_count(num_gpu)

    if kind == "xla":
        from anysr.accelerators.xla_plan import xla_plan  # noqa: PLC0415

        # XLA assigns tensor layouts itself when it compiles the graph, so channels_last is only recorded
        # (the worker's choice says it is ignored).
        return dataclasses.replace(xla_plan(count, precision=precision, spmd=spmd, compile=compile),
                                   channels_last=channels_last)

    if precision == "fp16" and kind == "cpu":
        raise AcceleratorError("train.precision: fp16 on the CPU is slow and unscaled; use auto (bf16 where the "
                               "CPU has AVX512-BF16/AMX, else fp32), bf16 or fp32")
    if compile and kind not in ("cpu", "cuda"):
        raise AcceleratorError(f"train.compile: torch.compile is supported here on cpu and cuda, not {kind}")

    external = launcher in ("pytorch", "torchrun") or (launcher == "auto" and env_world() is not None)
    if launcher == "slurm" or external:
        name = "slurm" if launcher == "slurm" else "torchrun"
        return LaunchPlan(kind, 1, name, precision, compile=compile, dist_backend=dist_backend,
                          master_port=master_port, channels_last=channels_last)

    if kind == "cuda":
        available = _cuda_count()
        n = available if count in (None, 0) else count
        if n > available:
            raise AcceleratorError(
                f"num_gpu: {n} CUDA devices asked for, {available} visible; set num_gpu: auto "
                f"(uses all {available}) or a number <= {available}, or change CUDA_VISIBLE_DEVICES")
    elif kind == "mps":
        n = 1 if count in (None, 0) else count
        if n != 1:
            raise AcceleratorError(f"num_gpu: {n} asked for on mps; there is one MPS device, set num_gpu: 1")
    else:
        n = 1 if count in (None, 0) else count
        cores = os.cpu_count() or 1
        if n > cores:
            raise AcceleratorError(f"num_gpu: {n} CPU ranks asked for but this machine has {cores} cores; "
                                   f"set num_gpu to at most {cores}")
    if n > 1:
        return LaunchPlan(kind, n, "spawn", precision, compile=compile, dist_backend=dist_backend,
                          master_port=master_port or free_port(), channels_last=channels_last)
    return LaunchPlan(kind, 1, "none", precision, compile=compile, dist_backend=dist_backend,
                      channels_last=channels_last)


def free_port() -> int:
    """A free TCP port on localhost for the spawned workers' rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def create_accelerator(plan: LaunchPlan, local_rank: int = 0) -> Accelerator:
    """The accelerator object for this worker (call inside the worker)."""
    if plan.accelerator == "xla":
        from anysr.accelerators.xla import XLAAccelerator  # noqa: PLC0415

        return XLAAccelerator(plan, local_rank)
    from anysr.accelerators.torch_dist import CPUAccelerator, CUDAAccelerator, MPSAccelerator  # noqa: PLC0415

    cls = {"cpu": CPUAccelerator, "cuda": CUDAAccelerator, "mps": MPSAccelerator}[plan.accelerator]
    return cls(plan, local_rank)


def _report(acc: Accelerator, exc: BaseException) -> int:
    """Say once, plainly, why this distributed worker stops; returns its exit status.

    An error every rank raises alike (``all_ranks``) is told by rank 0 only; a failed collective (a peer died
    first) is not told at all: the parent reports the rank that failed first.
    """
    if isinstance(exc, Interrupted):
        if acc.rank == 0:
            print(f"anysr: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    if isinstance(exc, AnysrError):
        if acc.rank == 0 or not getattr(exc, "all_ranks", False):
            print(f"anysr: error (rank {acc.rank}): {exc}", file=sys.stderr, flush=True)
        return 2
    if isinstance(exc, OSError):
        print(f"anysr: error (rank {acc.rank}): {describe_os_error(exc)}", file=sys.stderr, flush=True)
        return 2
    if acc.is_peer_failure(exc):
        return PEER_FAILED
    return 1


def _worker(local_rank: int, plan: LaunchPlan, fn: Callable[..., Any], args: tuple[Any, ...],
            parent_pid: int | None = None) -> Any:
    """One worker: its accelerator, stop signals, ``fn(acc, *args)``; failures end it without a collective."""
    if parent_pid is not None:
        watch_parent(parent_pid)
    acc = create_accelerator(plan, local_rank)
    acc.stop = StopSignals().install()
    failed = True
    try:
        acc.setup()
        result = fn(acc, *args)
        failed = False
        return result
    except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - reported below, then re-raised or exited
        if acc.world_size > 1 or parent_pid is not None:
            code = _report(acc, exc)
            if code == 1 and parent_pid is not None:  # a bug, not a user's error: its traceback, then the status
                traceback.print_exc()
            if code != 1 or parent_pid is not None:
                acc.teardown(failed=True)
                sys.exit(code)
        raise
    finally:
        acc.stop.uninstall()
        acc.teardown(failed=failed)


def _spawn(plan: LaunchPlan, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Start ``plan.nprocs`` local workers and wait; one failure ends them all within seconds."""
    import torch.distributed as dist  # noqa: PLC0415
    import torch.multiprocessing as mp  # noqa: PLC0415

    os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(plan.master_port or free_port())
    os.environ["LOCAL_WORLD_SIZE"] = str(plan.nprocs)
    # The parent hosts the rendezvous store (a TCP key-value server, no device runtime) and keeps it until
    # every worker has exited, so a rank that finishes first cannot pull it from under the others.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), plan.nprocs + 1,
                          is_master=True, wait_for_workers=False)
    try:
        context = mp.start_processes(_worker, args=(plan, fn, args, os.getpid()), nprocs=plan.nprocs,
                                     join=False, start_method="spawn")
        exits, signum = supervise(context.processes)
    finally:
        del store
    bad = [e for e in exits if e.code != 0]
    if signum is not None and all(e.code == 128 + signum for e in bad):
        raise AlreadyReported(128 + signum)  # rank 0 said what was saved
    if bad:
        raise _failure(bad[0])


def _failure(first: WorkerExit) -> AnysrError:
    """The parent's error for the worker that failed first (silent when the worker told it itself)."""
    if first.code == 2:
        return AlreadyReported(2)
    if first.code == PEER_FAILED:
        return AcceleratorError(f"rank {first.rank} lost contact with the other ranks (a collective failed); "
                                "the job was stopped")
    if first.code == 1:
        return AcceleratorError(f"rank {first.rank} failed (its traceback is above); the other ranks were stopped")
    return AcceleratorError(f"{first.describe()}; the other ranks were stopped")


def launch(plan: LaunchPlan, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(accelerator, *args)`` in every worker the plan calls for; returns rank 0's result in-process.

    ``fn`` must be a module-level function (it is pickled for spawned workers).
    """
    if plan.launcher == "spawn":
        _spawn(plan, fn, args)
        return None
    if plan.launcher == "xla":
        from anysr.accelerators.xla_plan import xla_launch  # noqa: PLC0415

        return xla_launch(plan, _worker, fn, args)
    return _worker(0, plan, fn, args)

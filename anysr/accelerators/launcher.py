"""Deciding the accelerator and starting workers, in the parent process, without touching a device runtime."""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from anysr.accelerators.base import Accelerator, LaunchPlan
from anysr.accelerators.cpu_share import JOB_PID_ENV
from anysr.accelerators.hardware import check_precision
from anysr.accelerators.kinds import KINDS, PlanRequest, free_port, pick_kind
from anysr.accelerators.plan import LAUNCHERS, external_launcher
from anysr.accelerators.process import Interrupted, StopSignals, WorkerExit, supervise, watch_parent
from anysr.accelerators.torch_dist import env_world
from anysr.accelerators.xla_plan import xla_launch
from anysr.errors import PEER_FAILED, AcceleratorError, AlreadyReported, AnysrError, describe_os_error


def _parse_count(num_gpu: Any) -> int | None:
    if num_gpu in (None, "auto"):
        return None
    if isinstance(num_gpu, bool) or not isinstance(num_gpu, int) or num_gpu < 0:
        raise AcceleratorError(f"num_gpu: {num_gpu!r} is not 'auto' or a whole number >= 0")
    return num_gpu


def resolve_plan(accelerator: str = "auto", num_gpu: Any = "auto", *, precision: str = "auto",
                 launcher: str = "auto", spmd: bool = False, compile: bool = False,
                 dist_backend: str | None = None, master_port: int | None = None,
                 channels_last: bool | None = None, find_unused_parameters: bool = False,
                 static_graph: bool = False, deep_samples: tuple[str, str] | None = None,
                 precision_source: str | None = None, xla_backend: str = "auto",
                 matmul_precision: str = "default") -> LaunchPlan:
    """Decide what runs where, once, before any worker exists. Errors name the option to change.

    The accelerator kind (``kinds.KINDS``) makes the plan. ``precision`` (``auto`` or forced) and
    ``channels_last`` (None: auto) are decided per device in the worker (``precision.Precision.decide``).
    ``deep_samples`` = (what holds 16-bit samples, how to ask for bf16 anyway): one input of that decision, which
    makes ``auto`` fp32 (bf16 keeps about 8 significant bits, and the low byte of a 16-bit sample would be lost).
    ``precision_source``: where a forced ``precision`` came from, said in the log (default: the options or the
    command line).
    """
    check_precision(precision)
    if launcher not in LAUNCHERS:
        raise AcceleratorError(f"--launcher: '{launcher}' is not one of {', '.join(LAUNCHERS)}")
    kind = pick_kind(accelerator)
    request = PlanRequest(_parse_count(num_gpu), precision, launcher, spmd, compile, dist_backend, master_port,
                          channels_last, find_unused_parameters, static_graph, xla_backend, matmul_precision)
    torchrun_env = launcher == "auto" and env_world() is not None
    plan = kind.plan(request, external_launcher(launcher, torchrun_env=torchrun_env))
    if precision_source is not None:
        plan = replace(plan, precision_source=precision_source)
    if deep_samples is None or precision != "auto":
        return plan
    what, override = deep_samples
    return replace(plan, deep_samples=what, notes=(*plan.notes, f"{what}: precision fp32 (bf16 keeps about 8 bits of "
                                                   f"a 16-bit sample; {override} to choose it anyway)"))


def create_accelerator(plan: LaunchPlan, local_rank: int = 0) -> Accelerator:
    """The accelerator object for this worker (call inside the worker)."""
    return KINDS[plan.accelerator].accelerator_class(plan)(plan, local_rank)  # type: ignore[no-any-return]


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
    if acc.strategy.is_peer_failure(exc):
        return PEER_FAILED
    return 1


def _worker(local_rank: int, plan: LaunchPlan, fn: Callable[..., Any], args: tuple[Any, ...],
            parent_pid: int | None = None) -> Any:
    """One worker: its accelerator, stop signals, ``fn(acc, *args)``; failures end it without a collective."""
    if parent_pid is not None:
        watch_parent(parent_pid)
    acc = create_accelerator(plan, local_rank)
    acc.strategy.stop = StopSignals().install()
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
                if plan.launcher == "spawn":
                    _quiet_exit()
                sys.exit(code)
        raise
    finally:
        acc.strategy.stop.uninstall()
        acc.teardown(failed=failed)


def _quiet_exit() -> None:
    """A spawned worker that stopped on an error has said its one line: what its exit prints after that goes to
    /dev/null. The process group's destructors run while its threads still wait on a peer that is gone, and the
    C++ runtime may abort with 'terminate called without an active exception': a second line for the user."""
    sys.stdout.flush()
    sys.stderr.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def _spawn(plan: LaunchPlan, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """Start ``plan.nprocs`` local workers and wait; one failure ends them all within seconds."""
    import torch.distributed as dist  # noqa: PLC0415 - the parent imports these only to launch
    import torch.multiprocessing as mp  # noqa: PLC0415 - the parent imports these only to launch

    os.environ["MASTER_ADDR"] = os.environ.get("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(plan.master_port or free_port())
    os.environ["LOCAL_WORLD_SIZE"] = str(plan.nprocs)
    # The parent hosts the rendezvous store (a TCP key-value server, no device runtime) and keeps it until
    # every worker has exited, so a rank that finishes first cannot pull it from under the others.
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), plan.nprocs + 1,
                          is_master=True, wait_for_workers=False)
    try:
        # The ranks are this job's, not other programs sharing the CPU (cpu_share.py); only they inherit the mark,
        # not a later process of whoever launched in-process (a test, a notebook).
        previous = os.environ.get(JOB_PID_ENV)
        os.environ[JOB_PID_ENV] = str(os.getpid())
        try:
            context = mp.start_processes(_worker, args=(plan, fn, args, os.getpid()), nprocs=plan.nprocs,
                                         join=False, start_method="spawn")
        finally:
            if previous is None:
                os.environ.pop(JOB_PID_ENV, None)
            else:
                os.environ[JOB_PID_ENV] = previous
        exits, signum = supervise(context.processes)
    finally:
        del store
    bad = [e for e in exits if e.code != 0]
    if signum is not None and all(e.code == 128 + signum for e in bad):
        raise AlreadyReported(128 + signum)  # rank 0 said what was saved
    if bad:
        raise _failure(_cause(bad))


def _cause(bad: list[WorkerExit]) -> WorkerExit:
    """The failure to report among those seen (in the order they ended): an error a worker told itself (status 2)
    comes first, since a peer can die of it (a broken collective, even an abort in the runtime) before the teller
    has exited; then a rank killed by a signal other than SIGABRT (a SIGKILL from outside: its peers' gloo aborts
    with SIGABRT within the same poll, and rank 0 came first in the list); then the first death or crash; a rank
    that only lost its peers last."""
    told = [e for e in bad if e.code == 2]
    own = [e for e in bad if e.code != PEER_FAILED]
    killed = [e for e in own if e.code is not None and e.code < 0 and -e.code != signal.SIGABRT]
    return (told or killed or own or bad)[0]


def _failure(first: WorkerExit) -> AnysrError:
    """The parent's error for the worker whose failure caused the others' (silent when it told it itself)."""
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
        return xla_launch(plan, _worker, fn, args)
    return _worker(0, plan, fn, args)

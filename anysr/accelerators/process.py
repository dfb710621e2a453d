"""Processes around a run: workers that die with their parent, signals that stop a run cleanly, and a parent
that ends the whole job within seconds when one worker fails.

* ``watch_parent``: a worker asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG`` on Linux;
  a polling thread elsewhere), so spawned ranks never train on, or write, after ``kill -9`` of ``anysr``.
* ``StopSignals``: SIGTERM (SLURM, Kubernetes, TPU preemption) and SIGINT (Ctrl-C) in a worker. Outside the
  training loop they stop at once (``Interrupted``); inside it the first one is recorded and the loop stops after
  the current step, saves, and exits with 128 + signal. A second signal (at least ``REPEAT_S`` later: one
  keystroke reaches a terminal's whole process group, and a launcher forwards it too) aborts at once.
* ``supervise``: the parent of spawned workers forwards signals to them and, as soon as one exits with an error
  or is killed, gives the others ``GRACE_S`` seconds and then kills them: a rank blocked in a collective with a
  dead peer can never finish it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
REPEAT_S = 1.0  # a second signal within this time of the first is the same event delivered twice
GRACE_S = 5.0  # how long the other workers may take to end by themselves after one failed
_PR_SET_PDEATHSIG = 1


class Interrupted(KeyboardInterrupt):
    """A stop signal ended the run (after saving, inside the training loop). Exit status: 128 + signal.

    Like KeyboardInterrupt (which it is), it is not an ``Exception``: raised from a signal handler it passes
    through code that catches every Exception (logging, libraries) instead of being swallowed there.
    """

    all_ranks = False

    def __init__(self, signum: int, message: str = "") -> None:
        self.signum = int(signum)
        name = signal.Signals(self.signum).name
        super().__init__(message or f"interrupted by {name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    with contextlib.suppress(ValueError):
        return signal.Signals(signum).name
    return f"signal {signum}"


# --------------------------------------------------------------------------------------------- parent death
def watch_parent(parent_pid: int) -> None:
    """Make this process die (SIGKILL) when ``parent_pid`` dies; exit now if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
                if os.getppid() != parent_pid:  # it died before the request took effect
                    os._exit(128 + int(signal.SIGKILL))
                return

    def poll() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(128 + int(signal.SIGKILL))
            time.sleep(0.5)

    threading.Thread(target=poll, name="anysr-parent-watch", daemon=True).start()


# --------------------------------------------------------------------------------------------- in a worker
class StopSignals:
    """SIGTERM / SIGINT handling of one worker (install on the main thread)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.first_at = 0.0
        self.graceful = False
        self._previous: dict[int, Any] = {}

    def install(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        now = time.monotonic()
        if self.signum is not None:
            if now - self.first_at < REPEAT_S:
                return
            print(f"anysr: second {signal_name(signum)}: stopping now without saving", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.signum, self.first_at = signum, now
        if not self.graceful:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def graceful_section(self) -> Iterator[None]:
        """Inside: a signal is only recorded (the loop stops at the next step boundary)."""
        self.graceful = True
        try:
            yield
        finally:
            self.graceful = False


# --------------------------------------------------------------------------------------------- the parent
@dataclass
class WorkerExit:
    """How a supervised worker ended."""

    rank: int
    code: int | None  # None: still running when killed by us

    def describe(self) -> str:
        if self.code is None:
            return f"rank {self.rank} was stopped"
        if self.code < 0:
            sig = -self.code
            hint = " (out of memory? see dmesg)" if sig == signal.SIGKILL else ""
            return f"rank {self.rank} was killed by {signal_name(sig)}{hint}"
        return f"rank {self.rank} exited with status {self.code}"


def supervise(processes: list[Any], *, poll_s: float = 0.2,
              on_signal: Callable[[int], None] | None = None) -> tuple[list[WorkerExit], int | None]:
    """Wait for ``processes`` (``multiprocessing.Process`` objects, index = rank); forward stop signals.

    Returns (the exit of every worker in the order they ended badly or finished, the signal forwarded or None).
    A worker that fails or dies ends the job: the others get ``GRACE_S`` to end by themselves, then SIGKILL.
    """
    forwarded: list[int] = []
    first_at = [0.0]

    def forward(signum: int, frame: FrameType | None) -> None:
        del frame
        now = time.monotonic()
        if forwarded and now - first_at[0] >= REPEAT_S:
            for p in processes:
                if p.is_alive():
                    with contextlib.suppress(OSError):
                        os.kill(p.pid, signal.SIGKILL)
            print(f"anysr: second {signal_name(signum)}: workers killed without saving", file=sys.stderr,
                  flush=True)
            os._exit(128 + signum)
        if forwarded:
            return
        forwarded.append(signum)
        first_at[0] = now
        if on_signal is not None:
            on_signal(signum)
        for p in processes:
            if p.is_alive():
                with contextlib.suppress(OSError):
                    os.kill(p.pid, signum)

    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        return _wait(processes, poll_s), (forwarded[0] if forwarded else None)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait(processes: list[Any], poll_s: float) -> list[WorkerExit]:
    ended: list[WorkerExit] = []
    failed_at: float | None = None
    while True:
        for rank, p in enumerate(processes):
            if p.exitcode is not None and all(e.rank != rank for e in ended):
                ended.append(WorkerExit(rank, p.exitcode))
                if p.exitcode != 0 and failed_at is None:
                    failed_at = time.monotonic()
        if len(ended) == len(processes):
            return ended
        if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
            for rank, p in enumerate(processes):
                if p.is_alive():
                    with contextlib.suppress(OSError):
                        os.kill(p.pid, signal.SIGKILL)
                    p.join(5)
                    ended.append(WorkerExit(rank, None))
            return ended
        time.sleep(poll_s)

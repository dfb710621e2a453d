"""How many CPU threads a training or inference process should use when other programs share the cores.

Measured on a 2-core machine (benchmarks/contention.md): two identical trainings side by side with 2 threads each
ran each step 4.2x slower than one alone (OpenMP threads spinning for cores the other job holds); with 1 thread
each, 1.5x. Threads that outnumber the free cores, not the work, cost the time. So at start a CPU process counts
the cores other programs keep busy (``other_busy_cores``: /proc, over half a second, leaving out this job's own
processes) and takes its fair share of what is left (``choose_threads``).

``ANYSR_THREADS`` decides instead: a number (threads per process), ``fair`` (the cores divided among this job's
ranks, whatever else runs: the behaviour before this check) or ``auto`` (the default). ``OMP_NUM_THREADS``, when
set, is left to torch (several ranks of one job still divide the cores). The thread count changes a CPU run's last
bits (reductions split differently), so a resumed run keeps the count its training state recorded
(``resume_threads``), and a run never changes it on its own while it trains; when the CPU becomes shared later, one
line says so (``ShareWatch``).

Two anysr jobs started at the same moment both find the cores idle. So every CPU job also claims its ranks in a
per-user folder of this host (``JobClaim``: one small file per job, removed at exit; a file whose process is gone,
or whose pid now names another process, is ignored and removed), and divides the cores by every live claim as well
as by the measured load. A fresh run looks again just before its first training step (``rebalance``): a job that
started while this one was calibrating is counted there, and the count is recorded for exact resume as before.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from anysr.errors import AcceleratorError

JOB_PID_ENV = "ANYSR_JOB_PID"  # set by the launcher: the process whose descendants are this job's ranks
THREADS_ENV = "ANYSR_THREADS"
JOBS_DIR_ENV = "ANYSR_JOBS_DIR"
WINDOW_S = 0.5
SHARED_CORES = 0.5  # other programs using at least this many cores make the CPU "shared"


def available_cores() -> int:
    """The cores this process may run on (its affinity mask; the whole machine where that is unknown)."""
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _cpu_times() -> dict[int, tuple[int, float]] | None:
    """pid -> (parent pid, CPU seconds so far) of every process; None without a readable /proc."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out: dict[int, tuple[int, float]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for name in entries:
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            text = Path(f"/proc/{name}/stat").read_text()
            fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
            out[int(name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    return out or None


def _job(root: int, ppid: dict[int, int]) -> set[int]:
    """``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    for pid, parent in ppid.items():
        children.setdefault(parent, []).append(pid)
    job, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in job:
            job.add(pid)
            todo.extend(children.get(pid, ()))
    return job


def job_root() -> int:
    """The process whose descendants belong to this job: the anysr launcher of spawned ranks, torchrun's agent
    for its ranks, else this process."""
    with contextlib.suppress(ValueError):
        return int(os.environ.get(JOB_PID_ENV, ""))
    if "TORCHELASTIC_RUN_ID" in os.environ or "LOCAL_RANK" in os.environ:
        return os.getppid()
    return os.getpid()


class ShareWatch:
    """Cores kept busy by processes outside this job, between one ``sample()`` and the next."""

    def __init__(self, root: int | None = None) -> None:
        self.root = job_root() if root is None else root
        self._last = _cpu_times()
        self._at = time.monotonic()
        self.told = False

    def sample(self) -> float | None:
        """Other programs' busy cores since the last sample (None where /proc is not readable)."""
        now, at = _cpu_times(), time.monotonic()
        before, self._last, start, self._at = self._last, now, self._at, at
        if now is None or before is None or at - start <= 0:
            return None
        job = _job(self.root, {pid: parent for pid, (parent, _) in now.items()})
        used = sum(now[pid][1] - before[pid][1] for pid in now.keys() & before.keys() if pid not in job)
        return max(0.0, used / (at - start))


def jobs_dir() -> Path:
    """The folder where this user's anysr jobs on this host claim their ranks: ``$ANYSR_JOBS_DIR``, else
    ``$XDG_RUNTIME_DIR/anysr-jobs``, else ``<tmp>/anysr-jobs-<uid>``."""
    if os.environ.get(JOBS_DIR_ENV):
        return Path(os.environ[JOBS_DIR_ENV])
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "anysr-jobs"
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"anysr-jobs-{uid}"


def _started(pid: int) -> str | None:
    """The start time of ``pid`` in clock ticks since boot (tells a live job from a reused pid); None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return text[text.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


class JobClaim:
    """This job's claim on the host's cores: ``<jobs_dir>/<job root pid>.json`` holding its ranks here. Written
    (atomically) by each rank that chooses threads, removed when the process that wrote it ends."""

    def __init__(self, ranks: int, root: int | None = None) -> None:
        self.root = job_root() if root is None else root
        self.path = jobs_dir() / f"{self.root}.json"
        self.ranks = ranks
        self.written = False

    def write(self) -> None:
        """Best effort: an unwritable folder only means other jobs cannot count this one."""
        entry = {"pid": self.root, "started": _started(self.root), "ranks": self.ranks, "owner": os.getpid()}
        with contextlib.suppress(OSError):
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(entry))
            os.replace(tmp, self.path)
            self.written = True
            atexit.register(self.release)

    def release(self) -> None:
        """Remove the claim if this process wrote it."""
        if self.written:
            self.written = False
            with contextlib.suppress(OSError, ValueError):
                if json.loads(self.path.read_text()).get("owner") == os.getpid():
                    self.path.unlink()


def peer_jobs(root: int | None = None) -> list[dict[str, int]]:
    """The other live anysr jobs of this user on this host (``{"pid", "ranks"}`` each); stale claims removed."""
    root = job_root() if root is None else root
    peers = []
    with contextlib.suppress(OSError):
        for path in jobs_dir().glob("*.json"):
            try:
                entry = json.loads(path.read_text())
                pid, ranks = int(entry["pid"]), max(1, int(entry.get("ranks", 1)))
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if pid == root:
                continue
            started = _started(pid)
            if started is None or (entry.get("started") is not None and entry["started"] != started):
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            peers.append({"pid": pid, "ranks": ranks})
    return peers


def other_busy_cores(window_s: float = WINDOW_S) -> float | None:
    """Cores other programs keep busy, measured over ``window_s`` (None where /proc is not readable)."""
    watch = ShareWatch()
    time.sleep(window_s)
    return watch.sample()


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    why: str
    shared: bool = False


def choose_threads(ranks_here: int = 1, *, busy: float | None = None,
                   peers: list[dict[str, int]] | None = None) -> ThreadChoice | None:
    """Threads per process for ``ranks_here`` ranks of this job on this machine; None: leave torch's choice
    (``OMP_NUM_THREADS`` given to one process). ``busy``: other programs' busy cores (measured when None);
    ``peers``: the other anysr jobs on this host (read from their claims when None)."""
    cores = available_cores()
    fair = max(1, cores // max(1, ranks_here))
    asked = os.environ.get(THREADS_ENV, "auto").strip().lower()
    if asked.isdigit() and int(asked) > 0:
        return ThreadChoice(int(asked), f"{THREADS_ENV}={asked}")
    if asked not in ("auto", "fair", ""):
        raise AcceleratorError(f"{THREADS_ENV}={asked!r}: expected a number of threads per process, 'fair' or "
                               "'auto'")
    per = f" per rank ({ranks_here} ranks)" if ranks_here > 1 else ""
    if os.environ.get("OMP_NUM_THREADS"):  # the user's per-process setting; several ranks still share the cores
        return ThreadChoice(fair, f"{cores} cores{per}") if ranks_here > 1 else None
    if asked == "fair":
        return ThreadChoice(fair, f"{cores} cores{per}, {THREADS_ENV}=fair")
    busy = other_busy_cores() if busy is None else busy
    peers = peer_jobs() if peers is None else peers
    if busy is None and not peers:
        return ThreadChoice(fair, f"{cores} cores{per} (other programs' load unknown: no /proc)")
    free = max(1.0, cores - (busy or 0.0))
    threads = max(1, min(fair, int(free / max(1, ranks_here) + 0.3)))  # 1.7 free cores: 2; 1.05: 1
    peer_ranks = sum(p["ranks"] for p in peers)
    split = max(1, cores // (ranks_here + peer_ranks))  # every live anysr job's ranks share the cores
    reasons = []
    if busy is not None and busy >= SHARED_CORES:
        reasons.append(f"other programs keep {busy:.1f} of {cores} cores busy")
    if peers:
        reasons.append(f"{len(peers)} other anysr job{'s' if len(peers) > 1 else ''} run here "
                       f"(pid {', '.join(str(p['pid']) for p in peers[:3])})")
        threads = min(threads, split)
    shared = bool(reasons)
    if shared and threads < fair:
        why = (f"the CPU is shared: {' and '.join(reasons)}, so {threads} instead of {fair}{per} "
               f"(set {THREADS_ENV}=N to choose)")
    else:
        why = f"{cores} cores{per}" + (f"; {' and '.join(reasons)}" if shared else "")
    return ThreadChoice(threads, why, shared)


def claim_and_choose(ranks_here: int = 1) -> ThreadChoice | None:
    """Claim this job's ranks on the host (so jobs starting at the same moment see each other), then choose."""
    JobClaim(ranks_here).write()
    return choose_threads(ranks_here)


def rebalance(ranks_here: int, current: ThreadChoice | None) -> ThreadChoice | None:
    """Before a fresh run's first step: the choice again, if other anysr jobs now claim cores that were free when
    ``current`` was made (one started while this one was calibrating); None to keep ``current``."""
    if current is None or os.environ.get(THREADS_ENV, "auto").strip().lower() not in ("auto", ""):
        return None
    if os.environ.get("OMP_NUM_THREADS") or not peer_jobs():
        return None
    again = choose_threads(ranks_here, busy=other_busy_cores(0.2))
    if again is None or again.threads >= current.threads:
        return None
    return ThreadChoice(again.threads, f"re-balanced before the first step from {current.threads}: {again.why}",
                        again.shared)


def apply(choice: ThreadChoice | None) -> None:
    """Set torch's intra-op threads to the choice (nothing for None)."""
    if choice is not None and torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)


def resume_threads(saved: object) -> ThreadChoice | None:
    """The thread count to resume with: the one the run's state recorded, unless ``ANYSR_THREADS`` names a
    number (None: keep the current one)."""
    if not isinstance(saved, int) or saved < 1 or saved == torch.get_num_threads():
        return None
    asked = os.environ.get(THREADS_ENV, "auto").strip().lower()
    if asked.isdigit() or os.environ.get("OMP_NUM_THREADS"):
        return None
    return ThreadChoice(saved, f"the run's recorded {saved} thread{'s' if saved > 1 else ''} (exact resume; "
                               f"{THREADS_ENV}=N to choose another count)")

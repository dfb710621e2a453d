"""Threads chosen from the cores other programs leave free (anysr/accelerators/cpu_share.py): the count, the
job's own processes left out of the load, the log lines, and a resumed run keeping its recorded count."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, tiny_train_options, write_options

from anysr.accelerators import cpu_share
from anysr.accelerators.cpu_share import ShareWatch, choose_threads, resume_threads
from anysr.errors import AcceleratorError

HOG = "import time\nend = time.time() + 60\nwhile time.time() < end:\n    pass\n"


@pytest.fixture
def hog() -> object:
    """Another program keeping one core busy (a pure-Python spin, killed at the end)."""
    proc = subprocess.Popen([sys.executable, "-c", HOG], start_new_session=True)
    time.sleep(0.3)
    yield proc
    proc.kill()
    proc.wait()


def test_choice_from_the_free_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_share, "available_cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("ANYSR_THREADS", "auto")
    assert choose_threads(1, busy=0.1).threads == 8 and not choose_threads(1, busy=0.1).shared
    busy = choose_threads(1, busy=3.6)
    assert busy.threads == 4 and busy.shared
    assert "other programs keep 3.6 of 8 cores busy, so 4 instead of 8" in busy.why
    assert choose_threads(2, busy=0.0).threads == 4  # two ranks: each its half
    assert choose_threads(2, busy=4.0).threads == 2
    assert choose_threads(1, busy=7.9).threads == 1  # never below one
    monkeypatch.setenv("ANYSR_THREADS", "fair")
    assert choose_threads(2, busy=6.0).threads == 4
    monkeypatch.setenv("ANYSR_THREADS", "3")
    assert choose_threads(2, busy=6.0).threads == 3
    monkeypatch.setenv("ANYSR_THREADS", "many")
    with pytest.raises(AcceleratorError, match="ANYSR_THREADS='many': expected a number of threads"):
        choose_threads(1)
    monkeypatch.setenv("ANYSR_THREADS", "auto")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert choose_threads(1, busy=6.0) is None  # the user's OpenMP setting is left to torch
    assert choose_threads(2, busy=6.0).threads == 4  # but ranks still divide the cores


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
def test_other_programs_are_counted_and_the_jobs_own_are_not(hog: subprocess.Popen) -> None:
    other = ShareWatch(root=-1)  # no process is this job
    own = ShareWatch(root=hog.pid)  # as if the hog were one of this job's ranks
    time.sleep(1.0)
    with_hog, without = other.sample(), own.sample()  # the same second, whatever else the machine runs
    assert with_hog - without > 0.15, (with_hog, without)  # the hog: up to one core (less on a busy machine)


def test_resume_keeps_the_recorded_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("ANYSR_THREADS", "auto")
    now = torch.get_num_threads()
    assert resume_threads(now) is None and resume_threads(None) is None and resume_threads("2") is None
    other = now + 1
    choice = resume_threads(other)
    assert choice.threads == other and "exact resume" in choice.why
    monkeypatch.setenv("ANYSR_THREADS", "1")
    assert resume_threads(other) is None  # an explicit count wins


@pytest.mark.skipif((os.cpu_count() or 1) < 2 or not Path("/proc/self/stat").exists(),
                    reason="needs /proc and 2 cores")
def test_training_beside_a_cpu_hog_takes_fewer_threads_and_says_so(tmp_path: Path, small_train_dir: Path,
                                                                    hog: subprocess.Popen) -> None:
    opt = tiny_train_options("shared", small_train_dir, None, total_iter=2)
    path = write_options(tmp_path / "shared.yml", opt)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "LOCAL_WORLD_SIZE", "ANYSR_JOB_PID")}
    env.update(ANYSR_THREADS="auto", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "anysr", "train", "-opt", str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log
    cores = len(os.sched_getaffinity(0))
    line = next(ln for ln in log.splitlines() if "host threads:" in ln)
    # other xdist workers' anysr jobs may be named too ("... busy and 1 other anysr job run here (pid N), so ...")
    assert "WARNING" in line and re.search(rf"cores busy.*, so {cores - 1} instead of {cores} ", line), line
    state = torch.load(next((tmp_path / "experiments" / "shared" / "training_states").glob("*.state")),
                       weights_only=True)
    assert state["threads"] == cores - 1


def test_jobs_started_together_see_each_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two anysr jobs started at the same moment both find the cores idle: their claims make each take its share."""
    monkeypatch.setenv("ANYSR_JOBS_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_share, "available_cores", lambda: 2)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("ANYSR_THREADS", "auto")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cpu_share.JobClaim(1, root=other.pid).write()  # the other job's claim (as its rank would write it)
        mine = cpu_share.JobClaim(1)
        mine.write()
        assert [p["pid"] for p in cpu_share.peer_jobs()] == [other.pid]
        choice = choose_threads(1, busy=0.0)  # nothing busy yet: the claim alone halves the cores
        assert choice.threads == 1 and choice.shared and "1 other anysr job run here" in choice.why
        assert f"pid {other.pid}" in choice.why and "so 1 instead of 2" in choice.why
        assert choose_threads(1, busy=0.0, peers=[]).threads == 2  # without it: both would take both cores
        mine.release()
        assert not (tmp_path / f"{os.getpid()}.json").exists() and (tmp_path / f"{other.pid}.json").exists()
    finally:
        other.kill()
        other.wait()
    assert cpu_share.peer_jobs() == [] and not list(tmp_path.glob("*.json"))  # a dead job's claim is removed


def test_a_claim_whose_pid_names_another_process_is_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYSR_JOBS_DIR", str(tmp_path))
    (tmp_path / "1.json").write_text('{"pid": 1, "started": "-1", "ranks": 1}')  # pid 1 started at boot, not -1
    (tmp_path / "2.json").write_text("not json")
    assert cpu_share.peer_jobs(root=0) == []
    assert not (tmp_path / "1.json").exists()


def test_rebalance_before_the_first_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that started while this one calibrated: fewer threads from the first step, said why; never more."""
    monkeypatch.setenv("ANYSR_JOBS_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_share, "available_cores", lambda: 2)
    monkeypatch.setattr(cpu_share, "other_busy_cores", lambda window_s=0.5: 0.0)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("ANYSR_THREADS", "auto")
    start = cpu_share.ThreadChoice(2, "2 cores")
    assert cpu_share.rebalance(1, start) is None  # alone: nothing to do
    cpu_share.JobClaim(1, root=1).write()  # pid 1 is alive
    (tmp_path / "1.json").write_text((tmp_path / "1.json").read_text())  # written by "another" process
    again = cpu_share.rebalance(1, start)
    assert again.threads == 1 and again.why.startswith("re-balanced before the first step from 2:")
    assert cpu_share.rebalance(1, cpu_share.ThreadChoice(1, "1")) is None
    monkeypatch.setenv("ANYSR_THREADS", "fair")
    assert cpu_share.rebalance(1, start) is None  # a fixed rule is kept

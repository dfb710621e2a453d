"""precision: auto and channels_last: auto follow what the hardware runs natively (any machine gives a green run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_train_options, write_options

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.accelerators.calibrate import Variant, measure
from anysr.accelerators.hardware import choose_channels_last, choose_precision, cpu_bf16
from anysr.errors import OptionError
from anysr.options import load_options

BF16_FLAGS = frozenset({"avx2", "avx512f", "avx512_bf16"})
AMX_FLAGS = frozenset({"avx2", "avx512f", "amx_tile", "amx_bf16"})
AVX2_FLAGS = frozenset({"avx", "avx2", "fma"})


@pytest.mark.parametrize(("flags", "aten", "isa", "native", "why"), [
    (BF16_FLAGS, "AVX512", "", True, "natively (AVX512-BF16)"),
    (AMX_FLAGS, "AVX512", "", True, "natively (AMX-BF16)"),
    (AVX2_FLAGS, "AVX2", "", False, "no native bf16"),
    (frozenset({"avx512f", "avx512bw"}), "AVX512", "", False, "no native bf16"),  # AVX-512 without BF16
    (BF16_FLAGS, "AVX2", "", False, "limited to AVX2 (ATEN_CPU_CAPABILITY)"),
    (BF16_FLAGS, "AVX512", "AVX2", False, "ONEDNN_MAX_CPU_ISA=AVX2"),
    (BF16_FLAGS, "AVX512", "avx512_core", False, "ONEDNN_MAX_CPU_ISA=avx512_core"),
    (BF16_FLAGS, "AVX512", "AVX512_CORE_AMX", True, "natively"),
    (frozenset(), "DEFAULT", "", False, "no native bf16"),  # unknown CPU (no /proc/cpuinfo): fp32
])
def test_cpu_bf16_from_flags_and_caps(flags: frozenset[str], aten: str, isa: str, native: bool, why: str) -> None:
    got, reason = cpu_bf16(flags, aten=aten, onednn_isa=isa)
    assert got is native and why in reason


def test_auto_precision_and_explicit_bf16_warning() -> None:
    assert choose_precision("auto", (True, "native"), device="cpu").value == "bf16"
    slow = choose_precision("auto", (False, "this CPU has no native bf16"), device="cpu")
    assert slow.value == "fp32" and slow.warning is None and "no native bf16" in slow.describe()
    forced = choose_precision("bf16", (False, "this CPU has no native bf16"), device="cpu")
    assert forced.value == "bf16" and "emulated" in forced.warning and "24x slower" in forced.warning
    assert choose_precision("bf16", (True, "native"), device="cpu").warning is None
    assert choose_precision("fp32", (True, "native"), device="cpu").value == "fp32"  # never overrides a request
    assert choose_precision("fp16", (True, "x"), device="cuda").value == "fp16"


def test_auto_channels_last_per_device() -> None:
    assert choose_channels_last(None, device="cpu", precision="fp32").value is True
    assert choose_channels_last(None, device="cuda", precision="bf16").value is True
    assert choose_channels_last(None, device="cuda", precision="fp32").value is False
    assert choose_channels_last(None, device="mps", precision="fp32").value is False
    assert choose_channels_last(None, device="xla", precision="bf16").value is False
    assert choose_channels_last(False, device="cpu", precision="bf16").value is False
    assert choose_channels_last(True, device="xla", precision="fp32").value is False


class _QuietWatch:
    """A ShareWatch that saw no other program (the tests' own parallel workers would make every choice provisional)."""

    def sample(self) -> float:
        return 0.0


@pytest.fixture
def quiet_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    import anysr.accelerators.calibrate as cal

    monkeypatch.setattr(cal, "ShareWatch", _QuietWatch)
    monkeypatch.setattr(cal, "peer_jobs", lambda: [])


def test_cpu_accelerator_decides_in_setup_and_calibrate(quiet_machine: None) -> None:
    acc = create_accelerator(resolve_plan("cpu", 1))
    acc.setup()
    native, _ = cpu_bf16()
    assert acc.precision.name == ("bf16" if native else "fp32")
    assert acc.precision.choices["precision"].requested == "auto" and "auto:" in acc.precision.describe_choices()
    variants = acc.candidate_variants()
    assert {v.precision for v in variants} == ({"fp32", "bf16"} if native else {"fp32"})
    assert {v.channels_last for v in variants} == {False, True}
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 3, 3))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    acc.calibrate(net, (2, 3, 16, 16), train=True)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # a copy was timed
    measured = ("precision", "channels_last") if native else ("channels_last",)  # one precision left: a rule decided
    for name in measured:
        assert re.search(r"^measured in \d+\.\d s: .* ms per forward \+ backward of 2x3x16x16; kept in "
                         r".*choices\.json \(`anysr bench -opt FILE --remeasure` or ANYSR_REMEASURE=1 times it "
                         r"again\)$", acc.precision.choices[name].reason), acc.precision.choices[name].reason
    chosen = (acc.precision.name, acc.precision.channels_last)
    again = create_accelerator(resolve_plan("cpu", 1))
    again.setup()
    again.calibrate(net, (2, 3, 16, 16), train=True)  # cached: the same answer, without timing again
    assert (again.precision.name, again.precision.channels_last) == chosen
    reason = again.precision.choices["channels_last"].reason
    assert re.search(r"^measured on \d{4}-\d\d-\d\d [\d:]+: .* per forward \+ backward of 2x3x16x16; kept in "
                     r".*choices\.json \(`anysr bench -opt FILE --remeasure`", reason), reason
    line = again.precision.describe_choices()
    assert line.count("forward + backward") == 1, line  # one measurement decided both: its timings said once
    forced = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    forced.setup()
    assert forced.candidate_variants() == [Variant("fp32", False)]  # nothing left to measure


def test_measure_times_every_variant() -> None:
    net = torch.nn.Conv2d(3, 4, 3)
    times = measure(net, (1, 3, 12, 12), [Variant("fp32", False), Variant("fp32", True)], train=False, repeats=1)
    assert set(times) == {Variant("fp32", False), Variant("fp32", True)} and all(t > 0 for t in times.values())


def test_measure_stays_within_its_budget_and_drops_a_far_slower_variant(monkeypatch: pytest.MonkeyPatch) -> None:
    import anysr.accelerators.calibrate as cal

    seconds = {Variant("fp32", False): 0.01, Variant("fp32", True): 0.012, Variant("bf16", False): 0.25,
               Variant("bf16", True): 0.011}
    calls: list[Variant] = []
    clock = [0.0]

    def fake_step(net: torch.nn.Module, x: torch.Tensor, v: Variant, train: bool) -> float:
        calls.append(v)
        clock[0] += seconds[v]
        return seconds[v]

    monkeypatch.setattr(cal, "_time_once", fake_step)
    monkeypatch.setattr(cal.time, "perf_counter", lambda: clock[0])
    net = torch.nn.Conv2d(3, 4, 3)
    times = measure(net, (1, 3, 8, 8), list(seconds), train=True, repeats=3, budget=10.0)
    # every variant timed; bf16/NCHW (emulated: 25x the fastest) warmed up and timed once, never repeated
    assert set(times) == set(seconds) and times[Variant("bf16", False)] == 0.25
    assert calls.count(Variant("bf16", False)) == 2 and calls.count(Variant("fp32", False)) == 4
    calls.clear()
    clock[0] = 0.0
    # a budget smaller than one step: the first variant alone is warmed up and timed once
    times = measure(net, (1, 3, 8, 8), list(seconds), train=True, repeats=3, budget=0.001)
    assert list(times) == [Variant("fp32", False)] and calls == [Variant("fp32", False)] * 2
    monkeypatch.setenv("ANYSR_CALIBRATION_BUDGET", "2.5")
    assert cal.budget_s() == 2.5
    for bad in ("0", "-1", "soon"):
        monkeypatch.setenv("ANYSR_CALIBRATION_BUDGET", bad)
        assert cal.budget_s() == cal.BUDGET_S


def test_a_choice_made_under_load_or_cut_short_is_provisional(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Used for this run, never cached: the next run measures again."""
    import anysr.accelerators.calibrate as cal

    monkeypatch.setenv("ANYSR_CACHE_DIR", str(tmp_path))
    variants = [Variant("fp32", False), Variant("fp32", True)]
    net = torch.nn.Conv2d(3, 4, 3)

    class Busy:
        def sample(self) -> float:
            return 1.3

    monkeypatch.setattr(cal, "ShareWatch", Busy)
    monkeypatch.setattr(cal, "peer_jobs", lambda: [])
    best, line = cal.fastest(net, (1, 3, 12, 12), variants, train=False)
    assert best in variants and "provisional (other programs kept 1.3 cores busy): timed again next run" in line
    assert "kept in" not in line
    assert not (tmp_path / cal.CACHE_FILE).exists()
    monkeypatch.setattr(cal, "ShareWatch", _QuietWatch)
    monkeypatch.setattr(cal, "peer_jobs", lambda: [{"pid": 1, "ranks": 1}])
    assert "provisional (1 other anysr job ran)" in cal.fastest(net, (1, 3, 12, 12), variants, train=False)[1]
    monkeypatch.setattr(cal, "peer_jobs", lambda: [])
    monkeypatch.setattr(cal, "measure", lambda *a, **k: {variants[0]: 0.5})  # the budget ran out after one
    best, line = cal.fastest(net, (1, 3, 12, 12), variants, train=False)
    assert best == variants[0] and "fp32/NHWC not timed: the 10 s budget, ANYSR_CALIBRATION_BUDGET, ran out" in line
    assert "provisional (1 candidate not timed)" in line and not (tmp_path / cal.CACHE_FILE).exists()
    monkeypatch.setattr(cal, "measure", lambda *a, **k: {variants[0]: 0.5, variants[1]: 0.4})
    best, line = cal.fastest(net, (1, 3, 12, 12), variants, train=False)  # complete and quiet: kept
    assert best == variants[1] and "kept in" in line and (tmp_path / cal.CACHE_FILE).exists()


def test_a_variant_whose_pilot_says_it_would_overrun_is_not_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget bounds the time: a 40x slower layout (seen: channels_last 137 s of a 10 s budget) is not run."""
    import anysr.accelerators.calibrate as cal

    full = {Variant("fp32", False): 2.0, Variant("fp32", True): 80.0}
    calls: list[tuple[Variant, int]] = []
    clock = [0.0]

    def fake_step(net: torch.nn.Module, x: torch.Tensor, v: Variant, train: bool) -> float:
        t = full[v] * x.shape[-1] * x.shape[-2] / (64 * 64)
        calls.append((v, x.shape[-1]))
        clock[0] += t
        return t

    monkeypatch.setattr(cal, "_time_once", fake_step)
    monkeypatch.setattr(cal.time, "perf_counter", lambda: clock[0])
    times = measure(torch.nn.Conv2d(3, 4, 3), (1, 3, 64, 64), list(full), train=True, repeats=2, budget=10.0)
    assert list(times) == [Variant("fp32", False)]  # the NHWC variant was only piloted on 16x16
    assert (Variant("fp32", True), 64) not in calls and (Variant("fp32", True), 16) in calls
    assert clock[0] <= 10.0 + full[Variant("fp32", False)]


def test_a_network_that_cannot_take_the_pilot_input_is_timed_in_full() -> None:
    """HiFaceGAN-like: four halvings then an instance norm fail on a 16-pixel pilot (1x1 at the norm); every
    variant is still timed on the full input."""
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Conv2d(3, 3, 3, stride=2, padding=1)]
    net = torch.nn.Sequential(*layers, torch.nn.InstanceNorm2d(3))
    variants = [Variant("fp32", False), Variant("fp32", True)]
    with pytest.raises(ValueError):
        net(torch.rand(1, 3, 16, 16))
    times = measure(net, (1, 3, 64, 64), variants, train=False, repeats=1, budget=60.0)
    assert set(times) == set(variants)


def test_a_resumed_run_keeps_its_recorded_choice() -> None:
    acc = create_accelerator(resolve_plan("cpu", 1))
    acc.setup()
    if len(acc.candidate_variants()) < 2:
        pytest.skip("nothing to measure")
    net = torch.nn.Conv2d(3, 4, 3)
    acc.calibrate(net, (1, 3, 12, 12), train=True, recorded=["fp32", True])
    assert (acc.precision.name, acc.precision.channels_last) == ("fp32", True)
    assert "as the run being resumed computed" in acc.precision.choices["channels_last"].reason
    assert acc.precision.state_dict()["variant"] == ["fp32", True]


def test_auto_is_the_options_default(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("auto", small_train_dir, None)
    del opt["train"]["precision"], opt["train"]["channels_last"]
    loaded = load_options(write_options(tmp_path / "o.yml", opt), is_train=True)
    assert loaded["train"]["precision"] == "auto" and loaded["train"]["channels_last"] == "auto"
    with pytest.raises(OptionError, match=r"train\.precision: expected 'auto' \| 'fp32'"):
        load_options(tmp_path / "o.yml", ["train.precision=bf32"], is_train=True)


def test_training_records_the_choice_and_warns_for_emulated_bf16(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("emul", small_train_dir, None, total_iter=2)
    opt["train"]["precision"] = "bf16"
    del opt["train"]["channels_last"]
    path = write_options(tmp_path / "o.yml", opt)
    # ONEDNN_MAX_CPU_ISA=AVX2 makes any CPU compute as one without native bf16 (what AVX2 machines do).
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path,
                   env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    first = next(line for line in proc.stdout.splitlines() if "anysr training" in line)
    assert "precision bf16 (asked for" in first and re.search(r"channels_last o(n|ff) \(auto: measured", first)
    assert "it is emulated and much slower than fp32" in proc.stdout
    summary = json.loads((tmp_path / "experiments" / "emul" / "summary.json").read_text())
    choices = summary["accelerator"]["choices"]
    assert choices["precision"] == {"requested": "bf16", "chosen": "bf16",
                                    "why": "set in the options or on the command line"}
    assert choices["channels_last"]["requested"] == "auto" and "bf16/NCHW" in choices["channels_last"]["why"]

    # auto on the same "AVX2" CPU: fp32, and the log says why.
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "name=auto2",
                   "train.precision=auto", cwd=tmp_path, env={"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert "precision fp32 (auto: the CPU has" in proc.stdout or "precision fp32 (auto: this" in proc.stdout
    assert "emulated" not in proc.stdout
    summary = json.loads((tmp_path / "experiments" / "auto2" / "summary.json").read_text())
    assert summary["accelerator"]["precision"] == "fp32"

"""NaN / Inf recovery (train.nan_recovery, docs/nan_recovery.md): the record and the schedules' lr scale, then
CLI runs with a NaN injected at a chosen iteration: recovered as documented, the same way twice, across a kill -9
and --auto_resume, on 2 gloo ranks as in 1 process, a bounded number of times (XLA: test_xla_nan_recovery.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import (
    assert_same_weights,
    kill_then_resume,
    run_cli,
    saved_weights,
    tiny_train_options,
    write_options,
)

from anysr.engine.report.history import History
from anysr.engine.training.nan_recovery import NONE_BAD, Recovery, decode_bad, describe
from anysr.models.lr_scheduler import build_scheduler


# ---------------------------------------------------------------------------------------------- pieces
def test_record_positions_the_stream_past_skipped_batches() -> None:
    rec = Recovery()
    assert [rec.data_iter(i) for i in range(5)] == [0, 1, 2, 3, 4]
    event = rec.record(bad_iter=3, what="loss", detected_at=4, rolled_back_to=2, factor=0.5, max_retries=3)
    assert event["skipped_batch"] == 3 and event["retry"] == 1 and rec.lr_factor == 0.5
    assert [rec.data_iter(i) for i in range(6)] == [0, 1, 2, 4, 5, 6]  # iteration 3 now trains on batch 4
    # the replacement batch is bad too: iteration 3 moves on again; a later one moves everything after it
    assert rec.record(bad_iter=3, what="loss", detected_at=4, rolled_back_to=2, factor=0.5,
                      max_retries=3)["skipped_batch"] == 4
    rec.record(bad_iter=5, what="gradient norm", detected_at=6, rolled_back_to=4, factor=0.5, max_retries=3)
    assert [rec.data_iter(i) for i in range(7)] == [0, 1, 2, 5, 6, 8, 9]
    assert rec.retries == 3 and rec.lr_factor == 0.125
    again = Recovery()
    again.load_state_dict(rec.state_dict())
    assert again == rec
    again.load_state_dict(None)  # a state saved before recovery existed
    assert again == Recovery()


def test_injection_fires_once() -> None:
    rec = Recovery()
    assert rec.injects(4, [4, 9]) and not rec.injects(5, [4, 9])
    rec.record(bad_iter=4, what="loss", detected_at=4, rolled_back_to=2, factor=0.5, max_retries=3)
    assert not rec.injects(4, [4, 9]) and rec.injects(9, [4, 9])  # the replay of 4 is not poisoned again


def test_bad_code_and_log_line() -> None:
    assert decode_bad(7 * 4 + 1) == (7, "loss") and decode_bad(7 * 4 + 2) == (7, "gradient norm")
    assert decode_bad(NONE_BAD - 4)[0] > 10**17  # the sentinel is above any iteration
    rec = Recovery()
    line = describe(rec.record(bad_iter=7, what="loss", detected_at=8, rolled_back_to=4, factor=0.5, max_retries=2))
    assert line == ("NaN recovery 1/2: the loss became NaN or infinite at iteration 7 (found at 8); rolled back to "
                    "iteration 4, learning rates now x0.5 of the schedule, iteration 7's batch (data iteration 7) "
                    "skipped; continuing")


@pytest.mark.parametrize("sched", [None, {"type": "MultiStepLR", "milestones": [3], "gamma": 0.5},
                                   {"type": "OneCycleLR", "max_lr": 0.1, "total_steps": 10}])
def test_lr_scale_is_part_of_the_schedule_state(sched: dict[str, Any] | None) -> None:
    def make() -> Any:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
        return opt, build_scheduler(opt, dict(sched) if sched else None)

    opt, s = make()
    s.step_to(4)
    plain = opt.param_groups[0]["lr"]
    s.set_lr_scale(0.25)
    assert opt.param_groups[0]["lr"] == plain * 0.25
    s.step_to(5)
    at5 = opt.param_groups[0]["lr"]
    opt2, s2 = make()
    s2.load_state_dict(s.state_dict())  # resume: the scale comes back, and the lr does not "jump"
    assert s2.lr_scale == 0.25 and opt2.param_groups[0]["lr"] == at5


def test_history_events_are_truncated_on_resume(tmp_path: Path) -> None:
    h = History()
    h.add_event({"iter": 5, "what": "loss"})
    h.add_event({"iter": 9, "what": "loss"})
    h.save(tmp_path)
    back = History.load(tmp_path)
    back.truncate(6)
    assert back.events == [{"iter": 5, "what": "loss"}]


def test_clipped_gradient_norm_is_watched_on_the_device() -> None:
    from anysr.accelerators import create_accelerator
    from anysr.accelerators.plan import LaunchPlan

    acc = create_accelerator(LaunchPlan("cpu"))
    acc.setup()
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    p.grad = torch.tensor([1.0, float("inf"), 0.0])
    acc.optimizer_step(opt, clip_grad_norm=1.0)
    assert acc.take_gradients_finite() is None  # not watched unless asked (the trainer asks with recovery on)
    acc.watch_gradients = True
    acc.optimizer_step(opt, clip_grad_norm=None)
    assert acc.take_gradients_finite() is None  # no clipping: no norm to look at
    p.grad = torch.tensor([1.0, 2.0, 0.0])
    acc.optimizer_step(opt, clip_grad_norm=1.0)
    p.grad = torch.tensor([1.0, float("nan"), 0.0])
    acc.optimizer_step(opt, clip_grad_norm=1.0)
    flag = acc.take_gradients_finite()
    assert flag is not None and not bool(flag) and acc.take_gradients_finite() is None  # taken: reset


# ---------------------------------------------------------------------------------------------- CLI runs
def _options(name: str, train_dir: Path, *, total_iter: int = 8, inject: list[int] | None = None,
             **nan: Any) -> dict[str, Any]:
    opt = tiny_train_options(name, train_dir, None, total_iter=total_iter)
    opt["train"]["nan_recovery"] = {"inject_at": inject if inject is not None else [5], **nan}
    return opt


def _train(tmp_path: Path, opt: dict[str, Any], *extra: str, check: bool = True) -> Any:
    path = write_options(tmp_path / f"{opt['name']}.yml", opt)
    return run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", *extra, cwd=tmp_path,
                   check=check)


def _events(exp: Path) -> list[dict[str, Any]]:
    return json.loads((exp / "history.json").read_text())["events"]


def test_injected_nan_recovers_as_documented_and_twice_the_same(tmp_path: Path, small_train_dir: Path) -> None:
    # print_freq = save_freq = 2: the NaN of iteration 5 is found at 6, the last good state is the save at 4.
    proc = _train(tmp_path, _options("a", small_train_dir))
    lines = [ln for ln in proc.stdout.splitlines() if "NaN recovery" in ln]
    assert len(lines) == 1 and "WARNING" in lines[0], proc.stdout
    assert ("NaN recovery 1/3: the loss became NaN or infinite at iteration 5 (found at 6); rolled back to "
            "iteration 4, learning rates now x0.5 of the schedule, iteration 5's batch (data iteration 5) skipped"
            ) in lines[0]
    exp = tmp_path / "experiments" / "a"
    assert _events(exp) == [{"iter": 5, "what": "loss", "detected_at": 6, "rolled_back_to": 4, "skipped_batch": 5,
                             "lr_factor": 0.5, "retry": 1, "max_retries": 3}]
    assert "NaN recoveries" in (exp / "report.html").read_text()
    history = json.loads((exp / "history.json").read_text())
    assert [e["iter"] for e in history["train"]] == [2, 4, 6, 8]  # the replayed stretch is not counted twice
    lrs = {e["iter"]: e["lr"] for e in history["train"]}
    assert lrs[4] == pytest.approx(1e-3) and lrs[6] == pytest.approx(0.5 * 1e-3)  # MultiStepLR at 4, then x0.5
    state = torch.load(exp / "training_states" / "8.state", weights_only=True)
    assert state["nan_recovery"]["skips"] == [5] and state["model"]["schedulers"]["net_g"]["lr_scale"] == 0.5
    assert state["batch_position"] == 9  # 8 iterations trained on 9 iterations' batches
    final = saved_weights(exp, 8)
    assert all(torch.isfinite(v).all() for v in final.values())
    assert json.loads((exp / "summary.json").read_text())["finished"]
    # the weights before the NaN are the ones of a run without injection; after it they differ
    _train(tmp_path, _options("clean", small_train_dir, inject=[]))
    assert_same_weights(saved_weights(exp, 4), saved_weights(tmp_path / "experiments" / "clean", 4))
    clean = saved_weights(tmp_path / "experiments" / "clean", 8)
    assert any(not torch.equal(final[k], clean[k]) for k in final)
    # deterministic: the same run again recovers the same way, to the same bits
    _train(tmp_path, _options("b", small_train_dir))
    assert _events(tmp_path / "experiments" / "b") == _events(exp)
    assert_same_weights(saved_weights(tmp_path / "experiments" / "b", 8), final)


def test_kill_after_recovery_then_resume_is_the_straight_run(tmp_path: Path, small_train_dir: Path) -> None:
    straight = _options("straight", small_train_dir, total_iter=20, inject=[5, 13])
    straight["logger"]["keep_last"] = 20
    _train(tmp_path, straight)
    path = write_options(tmp_path / "killed.yml", dict(straight, name="killed"))
    # states 2 and 4; the NaN of 5 is found at 6, rolled back to 4, and 6 is saved after the replay: the third
    # state is written after the recovery, so the kill comes after it (and before the end: 10 states)
    written = kill_then_resume(path, tmp_path, "killed", after_states=3)
    assert 3 <= written < 10
    a, b = tmp_path / "experiments" / "straight", tmp_path / "experiments" / "killed"
    assert_same_weights(saved_weights(a, 20), saved_weights(b, 20))
    assert _events(a) == _events(b) and [e["iter"] for e in _events(a)] == [5, 13]
    sa = torch.load(a / "training_states" / "20.state", weights_only=True)
    sb = torch.load(b / "training_states" / "20.state", weights_only=True)
    assert sa["nan_recovery"] == sb["nan_recovery"] and sa["nan_recovery"]["lr_factor"] == 0.25


@pytest.mark.slow
def test_two_gloo_ranks_recover_as_one_process(tmp_path: Path, small_train_dir: Path) -> None:
    one = _options("one", small_train_dir)
    two = _options("two", small_train_dir)
    two["num_gpu"] = 2
    two["datasets"]["train"]["batch_size_per_gpu"] = 2  # the same global batch of 4
    _train(tmp_path, one)
    proc = _train(tmp_path, two)
    assert "rank 0/2" in proc.stdout and proc.stdout.count("NaN recovery 1/3") == 1
    a, b = tmp_path / "experiments" / "one", tmp_path / "experiments" / "two"
    assert _events(a) == _events(b)
    wa, wb = saved_weights(a, 8), saved_weights(b, 8)
    for k in wa:  # gradients averaged over ranks sum in another order: float tolerance
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5, msg=k)


def test_nan_before_the_first_save_rolls_back_to_the_start(tmp_path: Path, small_train_dir: Path) -> None:
    # iteration 1 is in the lr warm-up; the state training started from is the last good one
    _train(tmp_path, _options("first", small_train_dir, total_iter=4, inject=[1]))
    exp = tmp_path / "experiments" / "first"
    assert [(e["iter"], e["rolled_back_to"], e["skipped_batch"]) for e in _events(exp)] == [(1, 0, 1)]
    assert all(torch.isfinite(v).all() for v in saved_weights(exp, 4).values())


def test_gan_recovers_both_networks(tmp_path: Path, small_train_dir: Path) -> None:
    from safetensors.torch import save_file
    from test_gan import fake_vgg19_state_dict, gan_options

    vgg = tmp_path / "vgg19.safetensors"
    save_file(fake_vgg19_state_dict(), str(vgg))
    opt = gan_options("gan", small_train_dir, vgg, total_iter=6)
    opt["train"]["grad_clip_norm"] = 1.0  # the gradient norms are watched too
    opt["train"]["nan_recovery"] = {"inject_at": [3]}
    _train(tmp_path, opt)
    exp = tmp_path / "experiments" / "gan"
    assert [(e["iter"], e["rolled_back_to"]) for e in _events(exp)] == [(3, 2)]
    state = torch.load(exp / "training_states" / "6.state", weights_only=True)
    assert {k: s["lr_scale"] for k, s in state["model"]["schedulers"].items()} == {"net_g": 0.5, "net_d": 0.5}
    for net in state["model"]["nets"].values():
        assert all(torch.isfinite(v).all() for v in net.values() if v.is_floating_point())


@pytest.mark.parametrize(("snapshot", "back"), [("save", 4), ("print", 6)])
def test_snapshot_decides_how_far_back(tmp_path: Path, small_train_dir: Path, snapshot: str, back: int) -> None:
    opt = _options(f"snap_{snapshot}", small_train_dir, inject=[7], snapshot=snapshot)
    opt["logger"]["save_checkpoint_freq"] = 4  # reports at 2, 4, 6, 8; saves at 4, 8
    _train(tmp_path, opt)
    exp = tmp_path / "experiments" / f"snap_{snapshot}"
    assert [(e["iter"], e["detected_at"], e["rolled_back_to"]) for e in _events(exp)] == [(7, 8, back)]
    assert all(torch.isfinite(v).all() for v in saved_weights(exp, 8).values())


def test_too_many_recoveries_stop_with_one_line(tmp_path: Path, small_train_dir: Path) -> None:
    opt = _options("stop", small_train_dir, total_iter=12, inject=[5, 7], max_retries=1)
    proc = _train(tmp_path, opt, check=False)
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert ("loss became NaN or infinite at iteration 7; training stopped after 1 recoveries "
            "(train.nan_recovery.max_retries: 1)") in errors[0] and "Traceback" not in proc.stderr
    exp = tmp_path / "experiments" / "stop"
    states = sorted(int(p.stem) for p in (exp / "training_states").glob("*.state"))
    assert states == [2, 4, 6]  # all that was written is kept; nothing after the NaN
    for it in states:
        assert all(torch.isfinite(v).all() for v in saved_weights(exp, it).values())
    assert len(_events(exp)) == 1


def test_disabled_stops_at_the_first_nan(tmp_path: Path, small_train_dir: Path) -> None:
    proc = _train(tmp_path, _options("off", small_train_dir, enabled=False), check=False)
    errors = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    assert "loss became NaN or infinite at iteration 5; training stopped and the last good checkpoint is" in errors[0]
    assert "recoveries" not in errors[0]

"""Learning-rate schedules and EMA: exact values."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import assert_same_weights, kill_then_resume, run_cli, saved_weights, tiny_train_options, write_options

from anysr.errors import OptionError
from anysr.models.ema import EMA
from anysr.models.lr_scheduler import build_scheduler


def _opt(lr: float = 1.0) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


@pytest.mark.filterwarnings("ignore:Detected call")
def test_multistep_matches_torch() -> None:
    ours = build_scheduler(_opt(), {"type": "MultiStepLR", "milestones": [3, 5], "gamma": 0.5})
    ref_opt = _opt()
    ref = torch.optim.lr_scheduler.MultiStepLR(ref_opt, milestones=[3, 5], gamma=0.5)
    for it in range(1, 8):
        ref.step()
        ours.step_to(it)
        assert ours.optimizer.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"])


def test_cosine_restart_values() -> None:
    s = build_scheduler(_opt(2.0), {"type": "CosineAnnealingRestartLR", "periods": [10, 10],
                                    "restart_weights": [1, 0.5], "eta_min": 0.0})
    assert s.lr_at(0)[0] == pytest.approx(2.0)
    assert s.lr_at(5)[0] == pytest.approx(1.0)
    assert s.lr_at(10)[0] == pytest.approx(0.0, abs=1e-12)
    assert s.lr_at(15)[0] == pytest.approx(0.5 * 2.0 * 0.5 * (1 + math.cos(math.pi * 5 / 10)))


def test_warmup_is_linear_and_state_round_trips() -> None:
    s = build_scheduler(_opt(1.0), {"type": "MultiStepLR", "milestones": [100], "gamma": 0.1}, warmup_iter=10)
    assert s.lr_at(5)[0] == pytest.approx(0.5)
    s.step_to(7)
    t = build_scheduler(_opt(1.0), {"type": "MultiStepLR", "milestones": [100], "gamma": 0.1}, warmup_iter=10)
    t.load_state_dict(s.state_dict())
    assert t.optimizer.param_groups[0]["lr"] == pytest.approx(0.7)


def test_unknown_scheduler_names_nearest() -> None:
    with pytest.raises(OptionError, match="did you mean 'MultiStepLR'"):
        build_scheduler(_opt(), {"type": "MultStepLR", "milestones": [1]})
    # case alone does not make a name unknown (traiNNer-redux writes type names in lower case)
    assert type(build_scheduler(_opt(), {"type": "multisteplr", "milestones": [1]})).__name__ == "MultiStepLR"


def test_cosine_lengths_must_match() -> None:
    with pytest.raises(OptionError, match="same length"):
        build_scheduler(_opt(), {"type": "CosineAnnealingRestartLR", "periods": [1, 2], "restart_weights": [1]})


def test_ema_update() -> None:
    net = torch.nn.Linear(2, 1)
    ema = EMA(net, 0.9)
    ema.updates = 100  # past the warm-up: the plain BasicSR update
    with torch.no_grad():
        before = ema.module.weight.clone()
        net.weight.add_(1.0)
    ema.update(net)
    torch.testing.assert_close(ema.module.weight, 0.9 * before + 0.1 * net.weight)
    assert not any(p.requires_grad for p in ema.module.parameters())
    restored = EMA(net, 0.9)
    restored.load_state_dict(ema.state_dict())
    assert restored.updates == 101


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ema_tensor_weight_equals_the_float_lerp(dtype: torch.dtype) -> None:
    """The weight goes to lerp as a 0-dim tensor (data, never an XLA graph constant): bit-equal to ATen's lerp by the
    Python float through the copy phase, the warm-up (weights above, at and below 0.5) and the plain decay, and the
    switch copies exactly."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)).to(dtype)
    ema = EMA(net, 0.99, update_after=2, switch_every=7)
    ref = [p.detach().clone() for p in ema.module.parameters()]
    for _ in range(60):
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn_like(p))
        weight = 1.0 - ema.current_decay()
        switch = ema.updates and ema.updates % 7 == 0
        torch._foreach_lerp_(ref, [p.detach() for p in net.parameters()], weight)
        ema.update(net)
        for a, b in zip(ema.module.parameters(), ref):
            assert torch.equal(a, b)
        if switch:
            assert all(torch.equal(p, r) for p, r in zip(net.parameters(), ref))


def test_ema_warm_up_forgets_the_random_init() -> None:
    ema = EMA(torch.nn.Linear(2, 1), 0.999)
    assert ema.current_decay() == pytest.approx(0.1)
    net = torch.nn.Linear(2, 1)
    for _ in range(300):
        ema.update(net)
    torch.testing.assert_close(ema.module.weight, net.weight, rtol=0, atol=1e-6)


@pytest.mark.parametrize("kwargs", [
    {"mode": "min", "factor": 0.5, "patience": 1},
    {"mode": "max", "factor": 0.1, "patience": 0, "threshold": 0.5, "threshold_mode": "abs", "cooldown": 2},
    {"mode": "min", "factor": 0.5, "patience": 0, "min_lr": 0.2},
])
def test_reduce_on_plateau_matches_torch(kwargs: dict) -> None:
    """The same metric sequence gives torch's learning rates after every validation."""
    values = [5.0, 4.0, 4.0, 4.5, 3.9, 3.9, 3.9, 4.2, 3.0, 3.0, 3.1, 3.2, 3.3, 2.0, 2.0, 2.0]
    ref_opt = _opt()
    ref = torch.optim.lr_scheduler.ReduceLROnPlateau(ref_opt, **kwargs)
    opt = _opt()
    ours = build_scheduler(opt, {"type": "ReduceLROnPlateau", **kwargs})
    for it, v in enumerate(values, 1):
        ref.step(v)
        ours.observe("val", {"m": v}, {"m": "lower"})
        ours.step_to(it)
        assert opt.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"], rel=1e-12), it
    assert opt.param_groups[0]["lr"] < 1.0  # it did reduce


def test_reduce_on_plateau_follows_the_metric_and_resumes() -> None:
    """mode auto follows the metric's direction; the state carries the reductions and the patience count."""
    opt = _opt()
    sched = build_scheduler(opt, {"type": "ReduceLROnPlateau", "factor": 0.5, "patience": 1, "metric": "psnr"})
    said = [sched.observe("Set5", {"ssim": 0.9, "psnr": p}, {"psnr": "higher", "ssim": "higher"})
            for p in (30.0, 31.0, 30.5, 30.9)]
    assert said[:3] == [None, None, None] and said[3] and "Set5 psnr has not improved on 31" in said[3]
    assert sched.observe("Set14", {"psnr": 1.0}, {"psnr": "higher"}) is None  # the first set decides
    state = sched.state_dict()
    again = build_scheduler(_opt(), {"type": "ReduceLROnPlateau", "factor": 0.5, "patience": 1, "metric": "psnr"})
    again.load_state_dict(state)
    assert again.optimizer.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.5
    for s in (sched, again):
        s.observe("Set5", {"psnr": 30.0}, {"psnr": "higher"})
        s.observe("Set5", {"psnr": 30.0}, {"psnr": "higher"})
    assert again.optimizer.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.25


def test_reduce_on_plateau_trains_and_resumes_exactly(tmp_path: Path, small_train_dir: Path,
                                                      small_val_dir: Path) -> None:
    """Through the CLI: the lr drops at validations (one log line each), a run without validation is refused in one
    line, and kill -9 + --auto_resume ends with the straight run's weights."""
    plateau = {"type": "ReduceLROnPlateau", "mode": "min", "factor": 0.5, "patience": 0, "metric": "psnr"}
    bare = tiny_train_options("bare", small_train_dir, None, total_iter=4, train__scheduler=plateau)
    proc = run_cli("train", "-opt", str(write_options(tmp_path / "bare.yml", bare)), "--force_yml",
                   f"path.root={tmp_path}", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "ReduceLROnPlateau lowers the lr when a validation metric stops" in proc.stderr
    total = 8
    for name in ("ref", "killed"):
        opt = tiny_train_options(name, small_train_dir, small_val_dir, total_iter=total, train__scheduler=plateau)
        opt["val"]["val_freq"] = 2
        opt["logger"]["save_checkpoint_freq"] = 1 if name == "killed" else 4
        path = write_options(tmp_path / f"{name}.yml", opt)
        if name == "ref":
            run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
        else:
            kill_then_resume(path, tmp_path, name, after_states=3)
    log = "".join(p.read_text() for p in (tmp_path / "experiments" / "ref" / "log").glob("*.log"))
    assert "ReduceLROnPlateau: val psnr has not improved" in log, log[-2000:]
    assert_same_weights(saved_weights(tmp_path / "experiments" / "killed", total),
                        saved_weights(tmp_path / "experiments" / "ref", total))

"""Optimizers and schedules: the registries, per-group learning rates, the resume rule, schedule-free weights, and
real CLI runs (every optimizer and schedule trains; kill -9 and resume is bit-exact)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_same_weights, kill_then_resume, run_cli, saved_weights, tiny_train_options, write_options

from anysr.cli import main
from anysr.errors import OptionError
from anysr.models.lr_scheduler import build_scheduler
from anysr.models.optimizers import build_optimizer, param_groups
from anysr.registry import OPTIMIZER_REGISTRY, SCHEDULER_REGISTRY, Registry

HAS_PO = importlib.util.find_spec("pytorch_optimizer") is not None
HAS_SF = importlib.util.find_spec("schedulefree") is not None

TORCH_OPTIMIZERS = [n for n in OPTIMIZER_REGISTRY.keys() if not getattr(OPTIMIZER_REGISTRY.get(n), "unsupported", None)
                    and n != "Muon"  # Muon takes 2-D weights only (conv weights are 4-D): refused by torch
                    and hasattr(torch.optim, n)]  # anysr's own (AdanScheduleFree) have their own tests
TORCH_ARGS: dict[str, dict[str, Any]] = {"SGD": {"momentum": 0.9}}

# One valid argument set per schedule (total_iter / total_steps / T_max come from train.total_iter).
SCHEDULES: dict[str, dict[str, Any]] = {
    "MultiStepLR": {"milestones": [2, 3], "gamma": 0.5},
    "MultiStepRestartLR": {"milestones": [2, 5], "gamma": 0.5, "restarts": [0, 4], "restart_weights": [1, 0.5]},
    "CosineAnnealingRestartLR": {"periods": [3, 3], "restart_weights": [1, 0.5]},
    "CosineWarmupLR": {"eta_min": 1e-5},
    "WarmupStableDecayLR": {"decay_ratio": 0.5},
    "ConstantLR": {"factor": 0.5, "total_iters": 3},
    "CosineAnnealingLR": {"eta_min": 1e-5},
    "CosineAnnealingWarmRestarts": {"T_0": 2},
    "CyclicLR": {"base_lr": 1e-4, "max_lr": 1e-3, "step_size_up": 2, "cycle_momentum": False},
    "ExponentialLR": {"gamma": 0.9},
    "LinearLR": {"start_factor": 0.5, "total_iters": 3},
    "OneCycleLR": {"max_lr": 2e-3},
    "PolynomialLR": {"total_iters": 4, "power": 2.0},
    "StepLR": {"step_size": 2, "gamma": 0.5},
    "SequentialLR": {"schedulers": [{"type": "LinearLR", "start_factor": 0.1, "total_iters": 2},
                                    {"type": "CosineAnnealingLR", "T_max": 4}], "milestones": [2]},
    "ChainedScheduler": {"schedulers": [{"type": "ConstantLR", "factor": 0.5, "total_iters": 2},
                                        {"type": "ExponentialLR", "gamma": 0.9}]},
}
UNSUPPORTED_SCHEDULES = ["LambdaLR", "MultiplicativeLR"]
METRIC_SCHEDULES = ["ReduceLROnPlateau"]  # stepped by validations: tests/test_schedules.py




def _sgd(lr: float = 1.0, groups: int = 1) -> torch.optim.Optimizer:
    return torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr * (i + 1)}
                            for i in range(groups)], lr=lr)


# ------------------------------------------------------------------------------------------------ registries
def test_every_torch_optimizer_is_registered() -> None:
    names = {n for n, c in vars(torch.optim).items()
             if isinstance(c, type) and issubclass(c, torch.optim.Optimizer) and c is not torch.optim.Optimizer}
    assert names <= set(OPTIMIZER_REGISTRY.keys())
    for name in ("Adamax", "ASGD", "RMSprop", "Rprop", "NAdam", "RAdam", "Adagrad", "Adadelta", "Adafactor"):
        assert OPTIMIZER_REGISTRY.get(name) is getattr(torch.optim, name)


def test_every_torch_schedule_is_registered() -> None:
    lrs = torch.optim.lr_scheduler
    names = {n for n, c in vars(lrs).items() if isinstance(c, type) and issubclass(c, lrs.LRScheduler)
             and c is not lrs.LRScheduler and not n.startswith("_")}
    assert names <= set(SCHEDULER_REGISTRY.keys())
    assert set(SCHEDULES) | set(UNSUPPORTED_SCHEDULES) | set(METRIC_SCHEDULES) == set(SCHEDULER_REGISTRY.keys())


@pytest.mark.parametrize("name", TORCH_OPTIMIZERS)
def test_each_optimizer_steps(name: str) -> None:
    net = torch.nn.Conv2d(2, 2, 3)
    opt = build_optimizer(list(net.parameters()), {"type": name, "lr": 1e-2, **TORCH_ARGS.get(name, {})},
                          "train.optim_g")
    before = net.weight.detach().clone()
    net(torch.ones(1, 2, 5, 5)).square().mean().backward()
    opt.step()
    assert not torch.equal(before, net.weight)


@pytest.mark.parametrize("name", ["MultiStepLR", "StepLR", "ExponentialLR", "CosineAnnealingLR", "LinearLR",
                                  "PolynomialLR", "CosineAnnealingWarmRestarts", "OneCycleLR", "ConstantLR",
                                  "CyclicLR"])
def test_torch_schedules_match_torch(name: str) -> None:
    """Stepped once per iteration: the lr of iteration ``it`` is torch's after ``it`` steps (BasicSR's way)."""
    args = {**SCHEDULES[name]}
    if name in ("CosineAnnealingLR",):
        args["T_max"] = 8
    if name == "OneCycleLR":
        args["total_steps"] = 8
    ours = build_scheduler(_sgd(0.1, groups=2), {"type": name, **args})
    ref_opt = _sgd(0.1, groups=2)
    ref = getattr(torch.optim.lr_scheduler, name)(ref_opt, **args)
    for it in range(1, 9):
        ref_opt.step()
        ref.step()
        ours.step_to(it)
        assert [g["lr"] for g in ours.optimizer.param_groups] == pytest.approx([g["lr"] for g in ref_opt.param_groups])


def test_nested_schedules_match_torch_and_round_trip(tmp_path: Path) -> None:
    spec = {"type": "SequentialLR", **SCHEDULES["SequentialLR"]}
    ours = build_scheduler(_sgd(0.1), spec)
    ref_opt = _sgd(0.1)
    lrs = torch.optim.lr_scheduler
    ref = lrs.SequentialLR(ref_opt, [lrs.LinearLR(ref_opt, start_factor=0.1, total_iters=2),
                                     lrs.CosineAnnealingLR(ref_opt, T_max=4)], milestones=[2])
    for it in range(1, 8):
        ref_opt.step()
        ref.step()
        ours.step_to(it)
        assert ours.optimizer.param_groups[0]["lr"] == pytest.approx(ref_opt.param_groups[0]["lr"])
        if it == 3:
            torch.save(ours.state_dict(), tmp_path / "s.pt")
    again = build_scheduler(_sgd(0.1), spec)
    again.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    ours.step_to(3)
    for it in range(4, 8):
        ours.step_to(it)
        again.step_to(it)
        assert again.optimizer.param_groups[0]["lr"] == ours.optimizer.param_groups[0]["lr"]
    with pytest.raises(OptionError, match=r"train.scheduler.schedulers\[1\].type: CosineWarmupLR cannot be nested"):
        build_scheduler(_sgd(), {"type": "ChainedScheduler", "schedulers": [{"type": "LinearLR"},
                                                                            {"type": "CosineWarmupLR"}]})


def test_one_cycle_cycles_momentum_of_the_real_optimizer() -> None:
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    s = build_scheduler(opt, {"type": "OneCycleLR", "max_lr": 0.1, "total_steps": 10})
    s.step_to(3)
    assert opt.param_groups[0]["betas"][0] == s.shadow.param_groups[0]["betas"][0] < 0.95


def test_multistep_restart_is_basicsr() -> None:
    """BasicSR's MultiStepRestartLR: restart to initial * weight, then the milestones after it decay again."""
    s = build_scheduler(_sgd(1.0), {"type": "MultiStepRestartLR", "milestones": [2, 6], "gamma": 0.5,
                                    "restarts": [0, 4], "restart_weights": [1, 0.5]})
    assert [s.lr_at(it)[0] for it in range(1, 8)] == [1.0, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25]


def test_cosine_warmup_and_wsd_values() -> None:
    c = build_scheduler(_sgd(1.0), {"type": "CosineWarmupLR", "total_iter": 12, "eta_min": 0.0}, warmup_iter=4)
    assert [c.lr_at(it)[0] for it in (1, 2, 4)] == [0.25, 0.5, 1.0]
    assert c.lr_at(8)[0] == pytest.approx(0.5) and c.lr_at(12)[0] == pytest.approx(0.0, abs=1e-12)
    w = build_scheduler(_sgd(1.0), {"type": "WarmupStableDecayLR", "total_iter": 20, "decay_iter": 4},
                        warmup_iter=2)
    assert [w.lr_at(it)[0] for it in (1, 2, 10, 16, 18, 20)] == [0.5, 1.0, 1.0, 1.0, 0.5, 0.0]
    s = build_scheduler(_sgd(1.0), {"type": "WarmupStableDecayLR", "total_iter": 10, "decay_ratio": 0.5,
                                    "decay": "cosine"})
    assert s.lr_at(5)[0] == 1.0 and s.lr_at(10)[0] == pytest.approx(0.0, abs=1e-12)


def test_unsupported_ones_are_refused_with_the_reason(root_options: Any) -> None:
    lines = root_options({"optim_g": {"type": "LBFGS", "lr": 1e-3}, "scheduler": {"type": "LambdaLR"}})
    assert any(line.startswith("train.optim_g.type: LBFGS is not supported: it needs a closure") for line in lines)
    assert any(line.startswith("train.scheduler.type: LambdaLR is not supported: its lr_lambda is a Python function")
               for line in lines)


@pytest.fixture
def root_options(tmp_path: Path, small_train_dir: Path) -> Any:
    from anysr.options import load_options

    def check(train: dict[str, Any]) -> list[str]:
        opt = tiny_train_options("o", small_train_dir, None)
        opt["train"].update(train)
        path = write_options(tmp_path / "o.yml", opt)
        try:
            load_options(str(path), is_train=True, root=str(tmp_path))
        except OptionError as exc:
            return [line.strip() for line in str(exc).splitlines() if line.strip().startswith("train.")]
        return []
    return check


def test_total_iter_fills_the_schedule_length(root_options: Any) -> None:
    assert root_options({"scheduler": {"type": "CosineAnnealingLR"}, "total_iter": 9}) == []
    assert root_options({"scheduler": {"type": "CosineWarmupLR"}}) == []
    assert root_options({"scheduler": {"type": "OneCycleLR", "max_lr": 1e-3}}) == []


def test_lazy_source_is_loaded_on_first_unknown_name_and_names_the_extra() -> None:
    reg = Registry("thing")
    reg.register(int, name="Builtin")
    calls: list[int] = []

    def load(r: Registry) -> bool:
        calls.append(1)
        r.register(float, name="Extra")
        return True

    reg.add_source(load, "unused")
    assert "Builtin" in reg and not calls  # a built-in name never loads the source
    assert reg.get("Extra") is float and calls == [1]
    assert reg.keys() == ["Builtin"]  # the docs do not depend on what is installed
    missing = Registry("thing")
    missing.add_source(lambda r: False, "Lion needs `pip install anysr[optim]`")
    with pytest.raises(OptionError, match=r"unknown thing 'Lion'.*pip install anysr\[optim\]"):
        missing.get("Lion", "train.optim_g.type")


@pytest.mark.skipif(not HAS_PO, reason="pytorch-optimizer not installed (anysr[optim])")
@pytest.mark.parametrize("name", ["Adan", "ADOPT", "StableAdamW", "Lion", "SOAP", "Prodigy"])
def test_pytorch_optimizer_by_name(name: str) -> None:
    net = torch.nn.Conv2d(2, 2, 3)
    opt = build_optimizer(list(net.parameters()), {"type": name, "lr": 1e-3}, "train.optim_g")
    before = net.weight.detach().clone()
    for _ in range(2):  # ADOPT's first step only measures the gradients
        opt.zero_grad()
        net(torch.ones(1, 2, 5, 5)).square().mean().backward()
        opt.step()
    assert not torch.equal(before, net.weight)


# ------------------------------------------------------------------------------------------------ param groups
def test_param_groups_by_name() -> None:
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 1, 1), torch.nn.Conv2d(1, 1, 1))
    named = list(net.named_parameters())
    groups = param_groups(named, {"type": "Adam", "lr": 1e-3, "param_groups": [
        {"params": ["1.*"], "lr": 1e-4, "betas": [0.5, 0.9]}]}, "train.optim_g")
    opt = build_optimizer(groups, {"type": "Adam", "lr": 1e-3, "param_groups": []}, "train.optim_g")
    assert [g["lr"] for g in opt.param_groups] == [1e-3, 1e-4]
    assert opt.param_groups[1]["betas"] == (0.5, 0.9) and opt.param_groups[1]["params"][0] is net[1].weight
    s = build_scheduler(opt, {"type": "MultiStepLR", "milestones": [1], "gamma": 0.5})
    s.step_to(1)
    assert [g["lr"] for g in opt.param_groups] == [5e-4, 5e-5]
    with pytest.raises(OptionError, match=r"train.optim_g.param_groups\[0\].params: \['head.\*'\] match no"):
        param_groups(named, {"param_groups": [{"params": ["head.*"], "lr": 1.0}]}, "train.optim_g")


def test_param_groups_options_check(root_options: Any) -> None:
    lines = root_options({"optim_g": {"type": "Adam", "lr": 1e-3, "param_groups": [
        {"params": ["body.*"], "lr": "1e-4", "momentum": 0.9}, {"lr": 1.0}]}})
    assert lines == [
        "train.optim_g.param_groups[0].momentum: unknown argument of Adam; valid arguments: lr, betas, eps, "
        "weight_decay, amsgrad, foreach, maximize, capturable, differentiable, fused, decoupled_weight_decay",
        "train.optim_g.param_groups[1]: each group needs params: the parameter names it takes (globs such as "
        "'body.*'), plus the optimizer arguments it overrides (e.g. lr: 1e-4)"]


# ------------------------------------------------------------------------------------------------ the resume rule
def _resume(old: dict[str, Any], new: dict[str, Any], at: int, *, lr: float = 1.0, new_lr: float | None = None,
            warmup: int = -1) -> Any:
    s = build_scheduler(_sgd(lr), old, warmup_iter=warmup)
    s.step_to(at)
    t = build_scheduler(_sgd(new_lr if new_lr is not None else lr), new, warmup_iter=warmup)
    t.load_state_dict(s.state_dict())
    return t


def test_resume_with_a_later_milestone_continues() -> None:
    t = _resume({"type": "MultiStepLR", "milestones": [10]}, {"type": "MultiStepLR", "milestones": [20]}, 5)
    assert t.lr_at(15)[0] == 1.0 and t.lr_at(25)[0] == pytest.approx(0.1)


def test_resume_past_a_moved_milestone_is_refused_naming_it() -> None:
    with pytest.raises(OptionError, match=r"train.scheduler.milestones \(\[10\] there, \[20\] now\).*jump"):
        _resume({"type": "MultiStepLR", "milestones": [10]}, {"type": "MultiStepLR", "milestones": [20]}, 15)


def test_resume_with_another_lr_or_total_iter_is_refused_naming_it() -> None:
    with pytest.raises(OptionError, match=r"train.optim_g.lr \(\[1.0\] there, \[0.5\] now\)"):
        _resume({"type": "MultiStepLR", "milestones": [10]}, {"type": "MultiStepLR", "milestones": [10]}, 3,
                new_lr=0.5)
    with pytest.raises(OptionError, match=r"train.scheduler.total_iter \(train.total_iter unless set\) "
                                          r"\(100 there, 200 now\)"):
        _resume({"type": "CosineWarmupLR", "total_iter": 100}, {"type": "CosineWarmupLR", "total_iter": 200}, 50)
    with pytest.raises(OptionError, match=r"train.scheduler.T_max"):
        _resume({"type": "CosineAnnealingLR", "T_max": 100}, {"type": "CosineAnnealingLR", "T_max": 200}, 50)


def test_wsd_extended_during_the_stable_phase_continues() -> None:
    t = _resume({"type": "WarmupStableDecayLR", "total_iter": 100, "decay_iter": 20},
                {"type": "WarmupStableDecayLR", "total_iter": 200, "decay_iter": 20}, 50, warmup=10)
    assert t.lr_at(150)[0] == 1.0 and t.lr_at(190)[0] == pytest.approx(0.5)


def test_torch_schedule_state_round_trips_and_replays() -> None:
    args = {"type": "CosineAnnealingWarmRestarts", "T_0": 3, "T_mult": 2}
    s = build_scheduler(_sgd(1.0), args)
    s.step_to(5)
    t = build_scheduler(_sgd(1.0), args)
    t.load_state_dict(s.state_dict())
    for it in range(6, 12):
        s.step_to(it)
        t.step_to(it)
        assert s.optimizer.param_groups[0]["lr"] == t.optimizer.param_groups[0]["lr"]
    # StepLR with a later step: replayed from the start with the new arguments, same lr at the resume point.
    u = _resume({"type": "StepLR", "step_size": 10}, {"type": "StepLR", "step_size": 20}, 5)
    assert u.lr_at(15)[0] == 1.0


# ------------------------------------------------------------------------------------------------ schedule-free
@pytest.mark.skipif(not HAS_SF, reason="schedulefree not installed (anysr[optim])")
def test_schedule_free_weights_switch_is_exact(tmp_path: Path, small_train_dir: Path) -> None:
    from anysr.accelerators import create_accelerator, resolve_plan
    from anysr.models import build_model
    from anysr.options import load_options

    opt = tiny_train_options("sf", small_train_dir, None)
    opt["train"]["optim_g"] = {"type": "AdamWScheduleFree", "lr": 2e-3, "warmup_steps": 2}
    opt["train"]["ema_decay"] = 0
    path = write_options(tmp_path / "sf.yml", opt)
    options = load_options(str(path), is_train=True, root=str(tmp_path))
    model = build_model(options, create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False)))
    model.setup()
    net = model.bare("net_g")
    for _ in range(3):  # after one step x = y = z
        model.optimizers["net_g"].zero_grad()
        net(torch.rand(2, 3, 8, 8)).square().mean().backward()
        model.optimizers["net_g"].step()
    y = {k: v.clone() for k, v in net.state_dict().items()}
    x = model.weights()["params"]
    assert any(not torch.equal(x[k], y[k]) for k in y)  # the saved weights are the averaged ones
    assert_same_weights({k: v for k, v in net.state_dict().items()}, y)  # and training goes on from exactly y
    with model.optimizer_weights():
        assert_same_weights(net.state_dict(), x)
    assert_same_weights(net.state_dict(), y)
    assert model.state_dict()["optimizers"]["net_g"]["param_groups"][0]["train_mode"] is True


# ------------------------------------------------------------------------------------------------ CLI runs
def _train(tmp_path: Path, small_train_dir: Path, name: str, train: dict[str, Any], total: int = 4,
           val_dir: Path | None = None) -> Path:
    opt = tiny_train_options(name, small_train_dir, val_dir, total_iter=total)
    opt["train"].update(train)
    path = write_options(tmp_path / f"{name}.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    return tmp_path / "experiments" / name


def _finite(exp: Path, it: int) -> None:
    w = saved_weights(exp, it)
    assert all(torch.isfinite(v).all() for v in w.values())


@pytest.mark.parametrize("name", ["Adamax", "RMSprop", "NAdam"])
def test_cli_trains_with_other_optimizers(tmp_path: Path, small_train_dir: Path, name: str) -> None:
    _finite(_train(tmp_path, small_train_dir, name, {"optim_g": {"type": name, "lr": 1e-3}}, total=2), 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", TORCH_OPTIMIZERS)
def test_cli_trains_with_every_torch_optimizer(tmp_path: Path, small_train_dir: Path, name: str) -> None:
    optim = {"type": name, "lr": 1e-3, **TORCH_ARGS.get(name, {})}
    _finite(_train(tmp_path, small_train_dir, name, {"optim_g": optim}, total=2), 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_cli_trains_with_every_schedule(tmp_path: Path, small_train_dir: Path, name: str) -> None:
    _finite(_train(tmp_path, small_train_dir, name, {"scheduler": {"type": name, **SCHEDULES[name]}}, total=6), 6)


@pytest.mark.parametrize("sched", ["OneCycleLR", "CosineWarmupLR"])
def test_torch_and_new_schedules_resume_bit_exact(tmp_path: Path, small_train_dir: Path, sched: str) -> None:
    train = {"scheduler": {"type": sched, **SCHEDULES[sched]}, "total_iter": 6}
    straight = _train(tmp_path, small_train_dir, "straight", train, total=6)
    opt = tiny_train_options("split", small_train_dir, None, total_iter=6)
    opt["train"].update(train)
    path = write_options(tmp_path / "split.yml", opt)
    # stop at 4 (the schedule is the 6-iteration one: train.total_iter is the same on both runs), then resume
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "logger.save_checkpoint_freq=1",
                 "train.scheduler.total_steps=6" if sched == "OneCycleLR" else "train.scheduler.total_iter=6",
                 "train.total_iter=4"]) == 0
    assert main(["train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "logger.save_checkpoint_freq=1",
                 "train.scheduler.total_steps=6" if sched == "OneCycleLR" else "train.scheduler.total_iter=6"]) == 0
    assert_same_weights(saved_weights(straight, 6), saved_weights(tmp_path / "experiments" / "split", 6))


def test_cli_refuses_a_resume_that_changes_the_schedule(tmp_path: Path, small_train_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    opt = tiny_train_options("cos", small_train_dir, None, total_iter=4)
    opt["train"]["scheduler"] = {"type": "CosineWarmupLR"}
    path = write_options(tmp_path / "cos.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=8"]) == 2
    err = capsys.readouterr().err
    assert "train.scheduler.total_iter (train.total_iter unless set) (4 there, 8 now)" in err


@pytest.mark.skipif(not HAS_SF, reason="schedulefree not installed (anysr[optim])")
def test_schedule_free_trains_validates_and_resumes_bit_exact(tmp_path: Path, small_train_dir: Path,
                                                              small_val_dir: Path) -> None:
    """Straight 6 == 4, stop, resume 2, with validation and EMA in between (schedule-free's switch each time)."""
    train = {"optim_g": {"type": "AdamWScheduleFree", "lr": 2e-3, "warmup_steps": 2}, "scheduler": None}
    straight = _train(tmp_path, small_train_dir, "sf_straight", train, total=6, val_dir=small_val_dir)
    opt = tiny_train_options("sf_split", small_train_dir, small_val_dir, total_iter=4)
    opt["train"].update(train)
    path = write_options(tmp_path / "sf_split.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=6"]) == 0
    assert_same_weights(saved_weights(straight, 6), saved_weights(tmp_path / "experiments" / "sf_split", 6))


@pytest.mark.slow
@pytest.mark.parametrize("optim", [
    pytest.param({"type": "AdamWScheduleFree", "lr": 2e-3, "warmup_steps": 2},
                 marks=pytest.mark.skipif(not HAS_SF, reason="schedulefree not installed")),
    pytest.param({"type": "Prodigy", "lr": 1.0},
                 marks=pytest.mark.skipif(not HAS_PO, reason="pytorch-optimizer not installed")),
    pytest.param({"type": "Adam", "lr": 2e-3, "param_groups": [{"params": ["body.*"], "lr": 1e-3}]}),
], ids=["schedulefree", "prodigy", "param_groups"])
def test_kill_minus_nine_then_resume_matches(tmp_path: Path, small_train_dir: Path, optim: dict[str, Any]) -> None:
    total = 10
    ref_opt = tiny_train_options("ref", small_train_dir, None, total_iter=total)
    ref_opt["train"]["optim_g"] = optim
    run_cli("train", "-opt", str(write_options(tmp_path / "ref.yml", ref_opt)), "--force_yml",
            f"path.root={tmp_path}", cwd=tmp_path)
    opt = tiny_train_options("killed", small_train_dir, None, total_iter=total)
    opt["train"]["optim_g"] = optim
    opt["logger"]["save_checkpoint_freq"] = 1
    path = write_options(tmp_path / "k.yml", opt)
    kill_then_resume(path, tmp_path, "killed")
    assert_same_weights(saved_weights(tmp_path / "experiments" / "killed", total),
                        saved_weights(tmp_path / "experiments" / "ref",total))


@pytest.mark.slow
@pytest.mark.skipif(not HAS_SF, reason="schedulefree not installed (anysr[optim])")
def test_two_gloo_ranks_match_one_process(tmp_path: Path, small_train_dir: Path, small_val_dir: Path) -> None:
    """Schedule-free with per-group lrs under a torch schedule: 2 spawned CPU ranks == 1 process, same batch."""
    train = {"optim_g": {"type": "SGDScheduleFree", "lr": 1e-2, "param_groups": [{"params": ["body.*"], "lr": 5e-3}]},
             "scheduler": {"type": "OneCycleLR", "max_lr": 1e-2, "cycle_momentum": False}}
    runs = {}
    for name, gpus, batch in (("one", 1, 4), ("two", 2, 2)):
        opt = tiny_train_options(name, small_train_dir, small_val_dir, total_iter=4)
        opt["num_gpu"] = gpus
        opt["datasets"]["train"]["batch_size_per_gpu"] = batch
        opt["val"]["val_freq"] = 4
        opt["train"].update(train)
        path = write_options(tmp_path / f"{name}.yml", opt)
        runs[name] = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    assert "rank 0/2" in runs["two"].stdout
    a, b = saved_weights(tmp_path / "experiments" / "one", 4), saved_weights(tmp_path / "experiments" / "two", 4)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)

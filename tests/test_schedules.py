"""Learning-rate schedules and EMA: exact values."""

from __future__ import annotations

import math

import pytest
import torch

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


def test_ema_warm_up_forgets_the_random_init() -> None:
    ema = EMA(torch.nn.Linear(2, 1), 0.999)
    assert ema.current_decay() == pytest.approx(0.1)
    net = torch.nn.Linear(2, 1)
    for _ in range(300):
        ema.update(net)
    torch.testing.assert_close(ema.module.weight, net.weight, rtol=0, atol=1e-6)

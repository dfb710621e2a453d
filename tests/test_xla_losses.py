"""Losses of the train.losses list on XLA:CPU: LDL's artifact map (window variance, masked by the EMA residual)
and the pixel losses next to it compile once and stay on the device (run in the XLA venv:
PJRT_DEVICE=CPU python -m pytest -m xla tests/test_xla_losses.py)."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
torch_xla = pytest.importorskip("torch_xla")

import torch  # noqa: E402
from test_xla import TinySR, make_batches  # noqa: E402

from anysr.accelerators.base import LaunchPlan  # noqa: E402
from anysr.accelerators.launcher import create_accelerator  # noqa: E402
from anysr.losses import CharbonnierLoss, FFLoss, FFTLoss, HuberLoss, LDLLoss, SobelLoss  # noqa: E402

pytestmark = pytest.mark.xla


def _steps(acc: Any, steps: int = 6) -> dict[str, Any]:
    acc.manual_seed(0)
    net = acc.prepare_model(TinySR())
    ema = copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = [CharbonnierLoss().to(acc.device), SobelLoss(loss_weight=0.1).to(acc.device),
              LDLLoss().to(acc.device), HuberLoss(loss_weight=0.5, delta=0.05).to(acc.device)]
    total = torch.zeros((), device=acc.device)
    compiles, transfers = [], []
    for batch in acc.prepare_loader(make_batches(steps)):
        out = net(batch["lq"])
        with torch.no_grad():
            out_ema = ema(batch["lq"])
        loss = losses[0](out, batch["gt"]) + losses[1](out, batch["gt"]) + losses[2](out, out_ema, batch["gt"]) \
            + losses[3](out, batch["gt"])  # Huber written out: aten::huber_loss fell back to the CPU
        opt.zero_grad(set_to_none=True)
        acc.precision.backward(loss)
        acc.optimizer_step(opt)
        with torch.no_grad():
            for pe, p in zip(ema.parameters(), net.parameters()):
                pe.lerp_(p, 0.1)
        total += loss.detach()
        acc.mark_step()
        stats = acc.stats()
        compiles.append(stats.get("compiles", 0))
        transfers.append(stats["host_transfers"])
    return {"compiles": compiles, "transfers": transfers, "total": float(acc.to_host(total)),
            "weights": acc.to_host(dict(acc.strategy.unwrap(net).state_dict())), "stats": acc.stats()}


def test_ldl_and_pixel_losses_compile_once_and_match_eager() -> None:
    acc = create_accelerator(LaunchPlan("xla", 1, "xla", "fp32", extra={"pjrt_device": "CPU", "all_devices": False}))
    acc.setup()
    before = acc.stats()["cpu_fallbacks"]  # the counters are per process: earlier tests' fallbacks stay in them
    xla = _steps(acc)
    assert xla["compiles"][2] == xla["compiles"][-1], f"graphs compiled after step 2: {xla['compiles']}"
    assert xla["transfers"] == [xla["transfers"][0]] * len(xla["transfers"]), xla["transfers"]
    new = {k: v - before.get(k, 0) for k, v in xla["stats"]["cpu_fallbacks"].items() if v != before.get(k, 0)}
    assert all(not k.startswith("aten::") for k in new), new
    cpu = create_accelerator(LaunchPlan("cpu", precision="fp32", channels_last=False))
    cpu.setup()
    eager = _steps(cpu)
    assert abs(xla["total"] - eager["total"]) < 1e-3 * max(1.0, abs(eager["total"]))
    for k in eager["weights"]:
        assert torch.allclose(xla["weights"][k], eager["weights"][k], atol=1e-4, rtol=0), k


@pytest.mark.parametrize("loss", [FFLoss(alpha=2.0, patch_factor=2, log_matrix=True), FFLoss(ave_spectrum=True),
                                  FFTLoss(amplitude_weight=1.0, phase_weight=0.5)], ids=["ffl", "ffl_ave", "fft"])
def test_frequency_losses_compile_once_without_fallback(loss: torch.nn.Module) -> None:
    """FFLoss / FFTLoss take their spectra as matrix products (anysr.ops.dft): torch.fft's kernels fell back to the
    CPU on XLA and FFLoss's complex batch mean did not compile."""
    from torch_xla.debug import metrics

    dev = torch_xla.device()
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(2, 3, 20, 24, generator=gen), torch.rand(2, 3, 20, 24, generator=gen)
    cpu_value = loss(x, y)
    before = {n: metrics.counter_value(n) for n in metrics.counter_names() if n.startswith("aten::")}
    on_dev = loss.to(dev)
    compiles = []
    for _ in range(2):
        pred = x.to(dev).requires_grad_(True)
        value = on_dev(pred, y.to(dev))
        value.backward()
        torch_xla.sync()
        compiles.append(metrics.metric_data("CompileTime")[0])
        assert torch.isfinite(pred.grad.cpu()).all()
    assert compiles[1] == compiles[0], compiles
    torch.testing.assert_close(value.detach().cpu(), cpu_value, rtol=1e-4, atol=1e-6)
    new = {n for n in metrics.counter_names() if n.startswith("aten::") and metrics.counter_value(n) != before.get(n)}
    assert not new, new

"""Issue 17: losses wired into the models (BasicSR's ``*_opt`` keys and the ``train.losses`` list), traiNNer-redux's
lower-case names, LDL against the authors' artifact map."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import FIXTURE_TOL
from safetensors.torch import load_file

from anysr.errors import OptionError
from anysr.losses import LDLLoss, artifact_map
from anysr.registry import LOSS_REGISTRY

FIX = Path(__file__).parent / "fixtures" / "losses"


def test_ldl_matches_the_authors_map_loss_and_gradient() -> None:
    f = load_file(FIX / "ldl.safetensors")
    torch.testing.assert_close(artifact_map(f["gt"], f["out"], f["ema"], 7), f["map_k7"], **FIXTURE_TOL)
    torch.testing.assert_close(artifact_map(f["gt"], f["out"], f["ema"], 5), f["map_k5"], **FIXTURE_TOL)
    x = f["out"].clone().requires_grad_(True)
    loss = LDLLoss(loss_weight=1.0)(x, f["ema"], f["gt"])
    loss.backward()
    torch.testing.assert_close(loss.detach().reshape(1), f["loss_k7"], **FIXTURE_TOL)
    torch.testing.assert_close(x.grad, f["grad_k7"], **FIXTURE_TOL)
    assert LDLLoss(loss_weight=0.5)(f["out"], f["ema"], f["gt"]).item() == pytest.approx(0.5 * f["loss_k7"].item())


def test_ldl_map_is_zero_where_the_ema_is_worse() -> None:
    gt = torch.rand(1, 3, 9, 9)
    out = gt + 0.1
    assert artifact_map(gt, out, gt + 0.2).abs().sum() == 0  # every pixel: the EMA residual is larger


@pytest.mark.parametrize(("given", "expected"), [("l1loss", "L1Loss"), ("charbonnierloss", "CharbonnierLoss"),
                                                 ("MSELOSS", "MSELoss"), ("msssiml1loss", "MSSSIML1Loss"),
                                                 ("perceptualloss", "PerceptualLoss"), ("ganloss", "GANLoss"),
                                                 ("ffloss", "FFLoss"), ("ldlloss", "LDLLoss"),
                                                 ("distsloss", "DISTSLoss"), ("sobeledgeloss", "SobelLoss")])
def test_trainner_lower_case_names_resolve(given: str, expected: str) -> None:
    assert LOSS_REGISTRY.canonical(given) == expected
    assert LOSS_REGISTRY.get(given) is LOSS_REGISTRY.get(expected)


def test_unknown_loss_name_lists_what_we_have() -> None:
    with pytest.raises(OptionError, match=r"train.losses\[0\].type: unknown loss 'hsluvloss'.*known: .*L1Loss"):
        LOSS_REGISTRY.get("hsluvloss", "train.losses[0].type")

"""ESRGAN weights in the original code's layout (``model.N`` names: most community ESRGAN models, as chaiNNer and
spandrel load them): renamed to BasicSR's names on reading, recognised without --arch (x1 / x2 / x8 with the
original nearest+conv steps, x2 by pixel-unshuffle in 12 channels), and equal to spandrel 0.4.2's output on
``tests/fixtures/esrgan_old`` (``make_esrgan_old_fixtures.py``); ``anysr infer`` and ``anysr export`` take such a
file as it is."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from arch_checks import fixture_io, stored_params
from conftest import FIXTURE_TOL, run_cli
from safetensors.torch import save_file

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise
from anysr.engine.checkpoint import load_weights
from anysr.errors import OptionError

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "esrgan_old"
CASES = json.loads((FIXTURES / "manifest.json").read_text())["cases"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_original_layout_is_recognised_and_equals_spandrel(name: str, tmp_path: Path) -> None:
    save_file(stored_params("esrgan_old", name), str(tmp_path / f"{name}.safetensors"))  # the old names, seeded
    sd, _ = load_weights(tmp_path / f"{name}.safetensors", "auto")
    assert not any(k.startswith("model.") for k in sd)
    found = recognise(sd)
    assert found.opt["type"] == "RRDBNet" and found.opt["scale"] == CASES[name]["scale"]
    assert found.opt.get("plus", False) == CASES[name]["kwargs"].get("plus", False)  # ESRGAN+'s conv1x1 blocks
    net = build_network(dict(found.opt)).eval()
    net.load_state_dict(sd, strict=True)
    io = fixture_io("esrgan_old", name)
    with torch.no_grad():
        out = net(io["input"])
    torch.testing.assert_close(out, io["output"], **FIXTURE_TOL)


def test_esrgan_plus_paths_train() -> None:
    """ESRGAN+'s 1x1 convs (BasicSR's names) take part: every parameter gets a gradient, the 1x1 convs too."""
    net = build_network({"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 4, "num_block": 1,
                         "num_grow_ch": 2, "scale": 4, "plus": True})
    assert [k for k in net.state_dict() if "conv1x1" in k] == [f"body.0.rdb{i}.conv1x1.weight" for i in (1, 2, 3)]
    net(torch.rand(1, 3, 4, 5)).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())


def test_upsample_steps_and_bad_arguments() -> None:
    net = build_network({"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 4, "num_block": 1,
                         "num_grow_ch": 2, "scale": 8, "num_upsample": 3})
    assert [k for k in net.state_dict() if k.startswith("conv_up")] == [
        f"conv_up{i}.{p}" for i in (1, 2, 3) for p in ("weight", "bias")]
    assert net(torch.rand(1, 3, 3, 5)).shape == (1, 3, 24, 40)
    # BasicSR's layout keeps its names (conv_up1 / conv_up2) and x2 by unshuffle
    basic = build_network({"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 4, "num_block": 1,
                           "num_grow_ch": 2, "scale": 2})
    assert basic.conv_first.in_channels == 12 and {"conv_up1.weight", "conv_up2.weight"} <= set(basic.state_dict())
    for opt, pattern in [({"scale": 4, "num_upsample": 1}, r"network_g\.scale: .*is x2"),
                         ({"scale": 16, "num_upsample": 4}, r"network_g\.num_upsample: .*0 to 3"),
                         ({"scale": 8}, r"network_g\.scale: .*num_upsample 3")]:
        with pytest.raises(OptionError, match=pattern):
            build_network({"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, **opt})


@pytest.mark.slow
def test_infer_and_export_take_an_original_layout_pth(tmp_path: Path) -> None:
    """A community-style ``.pth`` (bare state dict, old names) through the CLI as a user runs it."""
    sd = stored_params("esrgan_old", "x4")
    weights = tmp_path / "4x_community.pth"
    torch.save(sd, weights)
    img = (np.random.default_rng(0).random((7, 9, 3)) * 255).astype(np.uint8)
    cv2.imwrite(str(tmp_path / "in.png"), img)
    proc = run_cli("infer", "--weights", str(weights), "-i", str(tmp_path / "in.png"), "-o", str(tmp_path / "out"),
                   "--precision", "fp32", "--no-progress", cwd=tmp_path)
    assert "original ESRGAN layout" in proc.stdout + proc.stderr
    out = cv2.imread(str(next((tmp_path / "out").glob("*.png"))))
    assert out.shape == (28, 36, 3)
    run_cli("export", str(weights), "--to", str(tmp_path / "plain.pth"), cwd=tmp_path)
    plain = torch.load(tmp_path / "plain.pth", weights_only=True)
    assert "conv_first.weight" in plain and "conv_up2.weight" in plain
    assert not any(k.startswith("model.") for k in plain)
    for k, v in _renamed(sd).items():
        assert torch.equal(plain[k], v), k


def _renamed(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from anysr.archs.recognition.layouts import to_known_layout

    out, layout = to_known_layout(sd)
    assert layout is not None and layout.arch == "RRDBNet"
    return out

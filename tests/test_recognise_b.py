"""Weights recognised from names and shapes alone, beyond the defaults and presets that tests/test_recognise.py
checks: odd widths, depths and scales, other image channels, and files as the published weights have them (keys
that a fresh build has and the files lack, or the other way round), for the second half of anysr's families."""

from __future__ import annotations

import pytest

from anysr.archs.recognise import recognise
from anysr.registry import ARCH_REGISTRY
from tests.test_recognise import _layout

# family -> extra constructor arguments, each checked like the defaults: recognised as the same class with
# arguments that build exactly the same tensors.
EXTRA: dict[str, list[dict]] = {
    "MSRResNet": [{"num_feat": 24, "num_block": 3, "upscale": s} for s in (1, 2, 3)]
    + [{"num_in_ch": 1, "num_out_ch": 1, "num_feat": 16, "num_block": 1}],
    "RCAN": [{"num_in_ch": 3, "num_out_ch": 3, "num_feat": 32, "num_group": 2, "num_block": 3, "upscale": s}
             for s in (2, 3, 8)]
    + [{"num_in_ch": 1, "num_out_ch": 1, "num_feat": 48, "num_group": 1, "num_block": 1, "squeeze_factor": 5,
        "rgb_mean": (0.4,)}],
    "RIDNet": [{"in_channels": 3, "mid_channels": 16, "out_channels": 3, "num_block": 2},
               {"in_channels": 3, "mid_channels": 64, "out_channels": 3}],
}

CASES = [(arch, args) for arch, configs in EXTRA.items() for args in configs]


@pytest.mark.parametrize(("arch", "args"), CASES, ids=[f"{a}-{i}" for i, (a, _) in enumerate(CASES)])
def test_recognised_beyond_the_defaults(arch: str, args: dict) -> None:
    opt = {"type": arch, **args}
    layout = _layout(opt)
    assert layout is not None, f"{opt} does not build"
    found = recognise(layout, source=str(opt))
    assert ARCH_REGISTRY.get(found.opt["type"]) is ARCH_REGISTRY.get(arch), f"{opt} recognised as {found.describe()}"
    assert _layout(found.opt) == layout, f"{opt}: {found.describe()} builds other tensors"

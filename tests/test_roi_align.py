"""anysr.ops.roi_align against torchvision.ops.roi_align (fixtures: tools/fixtures/make_roi_align_fixtures.py)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FIXTURE_TOL, ROOT
from safetensors.torch import load_file

from anysr.ops.roi_align import roi_align, static_grid

FIXTURES = ROOT / "tests" / "fixtures" / "roi_align"
CASES = json.loads((FIXTURES / "manifest.json").read_text())["cases"]
TENSORS = load_file(FIXTURES / "cases.safetensors")


def _size(case: dict) -> int | tuple[int, int]:
    size = case["output_size"]
    return size if isinstance(size, int) else tuple(size)


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_and_input_gradient_match_torchvision(name: str) -> None:
    case = CASES[name]
    x = TENSORS[case["input"]].clone().requires_grad_(True)
    out = roi_align(x, TENSORS[f"{name}.boxes"], _size(case), case["spatial_scale"], case["sampling_ratio"],
                    case["aligned"])
    torch.testing.assert_close(out, TENSORS[f"{name}.out"], **FIXTURE_TOL)
    (out * TENSORS[f"{name}.up"]).sum().backward()
    torch.testing.assert_close(x.grad, TENSORS[f"{name}.grad"], **FIXTURE_TOL)


@pytest.mark.parametrize("name", ["gfpgan_eyes", "gfpgan_mouth"])
def test_the_static_grid_bound_gives_the_same_result_for_boxes_inside(name: str) -> None:
    """GFPGAN's boxes lie inside the face: the shape-only bound (what XLA compiles with) changes nothing."""
    case = CASES[name]
    x = TENSORS[case["input"]]
    bound = static_grid(x.shape[-1], case["output_size"])
    out = roi_align(x, TENSORS[f"{name}.boxes"], case["output_size"], max_grid=bound)
    torch.testing.assert_close(out, TENSORS[f"{name}.out"], **FIXTURE_TOL)
    assert bound == -(-(x.shape[-1] + 1) // case["output_size"])


def test_boxes_get_no_gradient_and_bad_shapes_are_named() -> None:
    x = torch.randn(1, 2, 8, 8, requires_grad=True)
    boxes = torch.tensor([[0, 1.0, 1.0, 6.0, 6.0]], requires_grad=True)
    roi_align(x, boxes, 2).sum().backward()
    assert boxes.grad is None and x.grad is not None
    with pytest.raises(ValueError, match=r"\(K, 5\) boxes"):
        roi_align(x, torch.zeros(2, 4), 2)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        roi_align(x[0], torch.zeros(1, 5), 2)


def test_no_boxes_give_an_empty_batch() -> None:
    out = roi_align(torch.randn(1, 3, 8, 8), torch.zeros(0, 5), (2, 3))
    assert out.shape == (0, 3, 2, 3)

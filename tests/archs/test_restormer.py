"""Restormer (the authors' code as spandrel-extra-arches carries it) and traiNNer-redux's DocRes (a Restormer-shaped
document restorer with coordinate planes) against their references, tests/fixtures/restormer
(``make_restormer_fixtures.py``): strict loading and equal outputs (also sizes the network pads), the recognisers,
published sizes, DocRes's GAN discriminator, ONNX at unseen sizes and an XLA:CPU train step that compiles once
with no CPU fallback. The shared checks (channels_last, bf16, meta device, training runs, 2 gloo ranks == 1
process) run from tests/archs/test_standard.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step, fixture_io, manifest, stored_params

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise
from anysr.errors import OptionError

GROUP = "restormer"
CASES = manifest(GROUP)["cases"]
TINY = {
    "Restormer": {"type": "Restormer", "dim": 4, "num_blocks": [1, 1, 1, 1], "num_refinement_blocks": 1,
                  "heads": [1, 1, 2, 2]},
    "DocRes": {"type": "DocRes", "dim": 4, "num_blocks": [1, 1, 1, 1], "num_refinement_blocks": 1,
               "heads": [1, 1, 2, 2]},
}


def _reference_state(name: str) -> dict[str, torch.Tensor]:
    """The reference's state dict: the seeded weights and the entries it computed (stored as ``state.<key>``)."""
    io = fixture_io(GROUP, name)
    return {**stored_params(GROUP, name), **{k[6:]: v for k, v in io.items() if k.startswith("state.")}}


@pytest.mark.parametrize("name", sorted(CASES))
def test_recognised_from_the_reference_weights(name: str) -> None:
    case = CASES[name]
    found = recognise(_reference_state(name))
    assert found.opt["type"] == case["type"]
    net = build_network(dict(found.opt))
    net.load_state_dict(_reference_state(name), strict=True)
    for key, value in case["kwargs"].items():
        assert found.opt[key] == value, (name, key)


def test_restormer_pads_any_size_like_the_reference_on_padded_input() -> None:
    """A side that is not a multiple of 8: reflect-padded at the bottom / right, the output cropped."""
    case = CASES["restormer"]
    net = build_network({"type": "Restormer", **case["kwargs"]}).eval()
    net.load_state_dict(_reference_state("restormer"))
    x = torch.rand(1, 3, 13, 7)
    padded = torch.nn.functional.pad(x, (0, 1, 0, 3), mode="reflect")
    with torch.no_grad():
        torch.testing.assert_close(net(x), net(padded)[:, :, :13, :7], rtol=0, atol=0)


def test_published_sizes_and_presets() -> None:
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network(opt).parameters())

    assert count({"type": "Restormer"}) == 26_126_644  # the authors' default (as the reference counts)
    assert count({"type": "Restormer", "inp_channels": 6, "dual_pixel_task": True}) == 26_132_548
    assert count({"type": "docres_base"}) == 14_682_400  # traiNNer-redux's builders
    assert count({"type": "docres_large"}) == 34_568_500


def test_docres_discriminator_takes_the_template_arguments() -> None:
    """traiNNer-redux's DocRes GAN template: ``num_blocks: 4``, ``norm_type: spectral`` (a count; a list's length)."""
    d = build_network({"type": "docres_discriminator", "inp_channels": 3, "out_channels": 1, "dim": 8,
                       "num_blocks": 4, "norm_type": "spectral"})
    convs = [m for m in d.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 5 and all(hasattr(c, "weight_orig") for c in convs)
    assert d(torch.rand(2, 3, 12, 10)).shape == (2, 1, 12, 10)
    plain = build_network({"type": "docres_discriminator", "dim": 8, "num_blocks": [1, 2, 2]})
    assert len([m for m in plain.modules() if isinstance(m, torch.nn.Conv2d)]) == 4


@pytest.mark.parametrize("opt, pattern", [
    ({"type": "Restormer", "heads": [1, 5, 4, 8]}, r"network_g\.heads: .*multiple of their heads"),
    ({"type": "Restormer", "num_blocks": [1, 1, 1]}, r"network_g\.num_blocks: Restormer needs 4"),
    ({"type": "Restormer", "LayerNorm_type": "Batch"}, r"network_g\.LayerNorm_type: must be 'WithBias'"),
    ({"type": "Restormer", "out_channels": 1}, r"network_g\.out_channels: Restormer adds the input"),
    ({"type": "docres_discriminator", "norm_type": "batch"}, r"network_g\.norm_type: must be 'spectral'"),
])
def test_bad_argument_values(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        build_network(opt)


@pytest.mark.parametrize("arch", sorted(TINY))
def test_onnx_export_runs_at_sizes_it_never_saw(arch: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    check_onnx_at_unseen_size(build_network(TINY[arch]), TINY[arch], 1, tmp_path)


@pytest.mark.xla
@pytest.mark.parametrize("arch", sorted(TINY))
def test_xla_train_step_compiles_once_without_cpu_fallback(arch: str) -> None:
    check_xla_train_step(TINY[arch], (1, 3, 8, 8))

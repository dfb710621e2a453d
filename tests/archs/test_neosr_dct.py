"""neosr's DCT (``dct``, Dual Compression Transformer).

Fixtures come from neosr's own source (``tools/fixtures/make_neosr_dct_fixtures.py``): the state dicts (float16-
exact seeded weights and neosr's buffers) load strictly and give neosr's outputs in eval and in training mode (the
same computation at drop_path_rate 0), at sizes that are no multiple of the windows (shifted windows in even and
odd groups, neosr's stored masks where the padded size is ``img_size``), and its training gradients. Also: neosr's
name and published size, recognition from the state dict (and no confusion with DAT / DAT_iLN), the pieces shared
with DAT, bad arguments, ONNX through anysr's exporter and an XLA:CPU train step that compiles once with no aten
op left to the CPU (``-m xla``). The checks every architecture gets run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import pytest
import torch
from arch_checks import FIXTURES, load_case, manifest, stored_params, weight_cases
from cards import CARDS

from anysr.archs import build_network, dat_arch, dct_arch
from anysr.archs.recognition.recognise import recognise, recognise_all

GROUP = "neosr_dct"
MANIFEST = manifest(GROUP)["cases"]
TINY = CARDS["DCT"].small  # tests/archs/cards.py


def test_fixtures_cover_the_layouts() -> None:
    assert all(p.stat().st_size < 200_000 for p in (FIXTURES / GROUP).iterdir())
    kwargs = [c["kwargs"] for c in MANIFEST.values()]
    assert {k["upscale"] for k in kwargs} == {1, 2, 3, 4}
    assert {k.get("upsampler", "pixelshuffledirect") for k in kwargs} == set(dct_arch.UPSAMPLERS)
    assert {k.get("resi_connection", "3conv") for k in kwargs} == {"1conv", "3conv"}


def test_reuses_dats_pieces() -> None:
    net = build_network(TINY)
    block = net.layers[0].blocks[0]
    assert isinstance(block.swsa.attns[0], dat_arch.Spatial_Attention)
    assert isinstance(block.ffn, dat_arch.SGFN) and isinstance(block.ffn.sg, dat_arch.SpatialGate)
    assert isinstance(block.swsa.attns[0].pos, dat_arch.DynamicPosBias)
    assert not hasattr(net.layers[0].blocks[1], "swsa") and hasattr(net.layers[0].blocks[1], "eca")


# ----------------------------------------------------------------------------- names, sizes, recognition

@pytest.mark.parametrize(("scale", "params"), [(4, 1_123_758), (2, 1_097_802)])
def test_neosr_name_and_published_size(scale: int, params: int) -> None:
    with torch.device("meta"):
        net = build_network({"type": "dct", "scale": scale})
    assert type(net).__name__ == "DCT" and net.upscale == scale
    assert sum(p.numel() for p in net.parameters()) == params


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_fixture_files_are_recognised(name: str) -> None:
    case = MANIFEST[name]
    params = load_case(GROUP, name)[0].state_dict()  # the seeded weights and the buffers the network computes
    found = recognise(params)
    assert found.opt["type"] == "DCT"
    for key in ("upscale", "in_chans", "depth", "num_heads", "split_size", "img_size", "qkv_bias"):
        if key in case["kwargs"] and (key != "img_size" or "img_size" in found.opt):  # img_size: shifted masks
            got = found.opt[key]
            assert (list(got) if isinstance(got, (list, tuple)) else got) == case["kwargs"][key], key
    with torch.device("meta"):
        net = build_network(found.opt)
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}


def test_dat_and_dct_are_not_confused() -> None:
    torch.manual_seed(0)
    dct = build_network(TINY).state_dict()
    assert {r.opt["type"] for r in recognise_all(dct)} == {"DCT"}
    for opt in ({"type": "DAT", "embed_dim": 32, "depth": [2], "num_heads": [2], "upscale": 2},
                {"type": "DAT_iLN", "embed_dim": 32, "depth": [2], "num_heads": [2], "upscale": 2}):
        got = {r.opt["type"] for r in recognise_all(build_network(opt).state_dict())}
        assert "DCT" not in got and opt["type"] in got


def test_no_other_fixture_is_recognised_as_dct() -> None:
    for group, name in weight_cases(skip=GROUP)[::6]:  # a sixth of the other groups' cases (build time)
        assert "DCT" not in {r.opt["type"] for r in recognise_all(stored_params(group, name))}, f"{group}/{name}"


# ----------------------------------------------------------------------------- arguments

# ----------------------------------------------------------------------------- ONNX, XLA:CPU


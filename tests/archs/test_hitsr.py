"""HiT-SR's HiT_SIR, HiT_SNG and HiT_SRF (Zhang et al., ECCV 2024).

Fixtures come from traiNNer-redux's source (``tools/fixtures/make_hitsr_fixtures.py``): the state dicts load
strictly and give its outputs in eval mode, sizes the blocks must pad included (SNG's twice-the-window padding with
two reflections too). Also: ONNX through anysr's exporter and per architecture an XLA:CPU train step that compiles
once with no aten op left to the CPU (``-m xla``). Where they are tested: reference parity over the fixture
manifest, bad arguments, ONNX at unseen sizes, the XLA:CPU step and the checks every architecture gets run from
``tests/archs/test_standard.py`` over the family's cards (``tests/archs/cards.py``); this module keeps what is
particular to the family.
"""

from __future__ import annotations

import pytest
import torch
from arch_checks import FIXTURES, fixture_io, manifest
from cards import CARDS

from anysr.archs import build_network

GROUP = "hitsr"
MANIFEST = manifest(GROUP)["cases"]
ARCHS = ["HiT_SIR", "HiT_SNG", "HiT_SRF"]

# The tiny x2 networks (tests/archs/cards.py)
TINY = {a: CARDS[a].net for a in ARCHS}


# ----------------------------------------------------------------------------- traiNNer-redux parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == set(ARCHS)
    assert sum(p.stat().st_size for p in (FIXTURES / GROUP).iterdir()) < 1_500_000


def test_fixtures_include_sizes_that_need_padding() -> None:
    """Each arch has an input that is not a multiple of its largest window (8 px; SNG pads to 16)."""
    padded = {MANIFEST[n]["type"] for n in MANIFEST
              if any(s % 8 for s in fixture_io(GROUP, n)["input1"].shape[-2:])}
    assert padded == set(ARCHS)


# ----------------------------------------------------------------------------- other behaviour

@pytest.mark.parametrize("arch", ARCHS)
def test_small_inputs_reflect_again(arch: str) -> None:
    """3x2 is grown to 8 (SNG: 16) per side for the largest windows by repeated reflection; 1 pixel by
    replication."""
    net = build_network({**TINY[arch], "hier_win_ratios": [1, 4]}).eval()
    with torch.no_grad():
        out = net(torch.rand(1, 3, 3, 2))
        one = net(torch.rand(1, 3, 1, 5))
    assert out.shape == (1, 3, 6, 4) and torch.isfinite(out).all()
    assert one.shape == (1, 3, 2, 10) and torch.isfinite(one).all()


def test_sng_adds_the_ngram_context_and_the_others_do_not() -> None:
    keys = {a: set(build_network(TINY[a]).state_dict()) for a in ARCHS}
    assert any("ngram_context.ngram_attn.relative_position_index" in k for k in keys["HiT_SNG"])
    assert any("mlp.dwconv.depthwise_conv.0.weight" in k for k in keys["HiT_SRF"])
    assert keys["HiT_SIR"] < keys["HiT_SNG"] and keys["HiT_SIR"] < keys["HiT_SRF"]


def test_published_sizes() -> None:
    """Parameter counts of the published x4 networks (traiNNer-redux's builders, counted with these classes)."""
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network(opt).parameters())

    assert count({"type": "hit_sir", "scale": 4}) == 791_540
    assert count({"type": "hit_sng", "scale": 4}) == 1_032_060
    assert count({"type": "hit_srf", "scale": 4}) == 866_420


# ----------------------------------------------------------------------------- ONNX

# ----------------------------------------------------------------------------- real training runs (CLI)


# ----------------------------------------------------------------------------- XLA:CPU


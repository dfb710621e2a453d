"""neosr's NinaSR and PlainUSR.

Fixtures come from neosr's own source (``tools/fixtures/make_neosr_cnn_fixtures.py``): the state dicts (PlainUSR's
training-time layout, the one neosr saves) load strictly and give neosr's inference outputs (sizes that are no
multiple of NinaSR's 16-pixel gate stride or PlainUSR's pooling) and its gradients. Also: PlainUSR's folded convs
(training = eval = ``reparameterize()``), neosr's names and published sizes, bad arguments, ONNX through anysr's
exporter, and an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``). Where they are
tested: reference parity over the fixture manifest, bad arguments, ONNX at unseen sizes, the XLA:CPU step and the
checks every architecture gets run from ``tests/archs/test_standard.py`` over the family's cards
(``tests/archs/cards.py``); this module keeps what is particular to the family.
"""

from __future__ import annotations

import torch
from arch_checks import FIXTURES, load_case, manifest
from conftest import FIXTURE_TOL

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise

GROUP = "neosr_cnn"
MANIFEST = manifest(GROUP)["cases"]



# ----------------------------------------------------------------------------- neosr parity

def test_fixtures_cover_every_arch() -> None:
    assert {c["type"] for c in MANIFEST.values()} == {"NinaSR", "PlainUSR"}
    n_feats = {c["kwargs"]["n_feat"] for c in MANIFEST.values() if c["type"] == "PlainUSR"}
    assert min(n_feats) <= 32 < max(n_feats) and max(n_feats) >= 80  # block versions 1 + 3, 2 and 4
    assert all(p.stat().st_size < 200_000 for p in (FIXTURES / GROUP).iterdir())


def test_reparameterize_freezes_the_folds_and_keeps_the_keys() -> None:
    net, io = load_case("neosr_cnn", "plainusr_x3_v4")
    keys = set(net.state_dict())
    net.reparameterize()
    assert set(net.state_dict()) == keys
    with torch.no_grad():
        torch.testing.assert_close(net(io["input0"]), io["output0"], **FIXTURE_TOL)
        next(iter(net.block1.body[0].parameters())).add_(1.0)  # frozen: later changes to the branches do not count
        torch.testing.assert_close(net(io["input0"]), io["output0"], **FIXTURE_TOL)


def test_neosr_names_build_the_classes_and_files_are_recognised() -> None:
    with torch.device("meta"):
        assert type(build_network({"type": "ninasr", "scale": 2})).__name__ == "NinaSR"
        assert type(build_network({"type": "plainusr", "scale": 2})).__name__ == "PlainUSR"
        b0 = build_network({"type": "ninasr_b0", "scale": 3})
        ultra = build_network({"type": "plainusr_ultra", "scale": 2})
    assert (len(b0.body), b0.scale, ultra.im_feat) == (10, 3, (32, 16))
    for name in ("ninasr_x3_gray", "plainusr_x2_ultra", "plainusr_x3_v4"):
        found = recognise(load_case(GROUP, name)[0].state_dict())
        assert found.opt["type"] == MANIFEST[name]["type"] and found.opt["scale"] == MANIFEST[name]["kwargs"]["scale"]


def test_published_sizes() -> None:
    """Parameter counts of neosr's presets at x4 (counted with its classes)."""
    def count(opt: dict) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build_network({**opt, "scale": 4}).parameters())

    assert count({"type": "ninasr"}) == 1_030_194
    assert count({"type": "ninasr_b0"}) == 105_394
    assert count({"type": "ninasr_b2"}) == 10_057_034
    assert count({"type": "plainusr"}) == 1_248_825
    assert count({"type": "plainusr_ultra"}) == 213_141
    assert count({"type": "plainusr_large"}) == 3_046_697


# ----------------------------------------------------------------------------- ONNX

# ----------------------------------------------------------------------------- XLA:CPU


"""neosr's CATANet (``catanet``): content-aware token aggregation with EMA-updated token centres.

Fixtures come from neosr's own source (``tools/fixtures/make_catanet_fixtures.py``; neosr's unstable sort of the
tokens by centre made stable there, as anysr sorts): the state dicts (the ``means`` / ``initted`` buffers included)
load strictly and give neosr's eval outputs at sizes that are no multiple of any patch, group or token count (with
first centres from the tokens, ``initted`` False, and from ``means``); a sequence of training-mode forwards gives
neosr's outputs and centre buffers after each step (the first copies the centres and sets ``initted``, the next
follow by EMA); training gradients. Also: neosr's name and published size, recognition from the state dict, the
window and group arithmetic on sides shorter than a window, bad arguments, ONNX through anysr's exporter at sizes
it never saw, and an XLA:CPU train step that compiles once with no aten op left to the CPU (``-m xla``). The checks
every architecture gets run from ``tests/archs/test_standard.py``.
"""

from __future__ import annotations

import pytest
import torch
from arch_checks import FIXTURES, check_xla_train_step, load_case, manifest, stored_params, weight_cases
from cards import CARDS
from conftest import FIXTURE_TOL

from anysr.archs import build_network
from anysr.archs.recognition.recognise import recognise, recognise_all

GROUP = "catanet"
MANIFEST = manifest(GROUP)["cases"]
TINY = CARDS["CATANet"].small  # tests/archs/cards.py


def _means(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: b for k, b in net.named_buffers() if k.endswith(".means")}


def test_fixtures_are_small_and_cover_the_heads() -> None:
    assert all(p.stat().st_size < 200_000 for p in (FIXTURES / GROUP).iterdir())
    assert {c["kwargs"]["upscale"] for c in MANIFEST.values()} == {1, 2, 3, 4}


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_reference_weights_load_strictly_and_match(name: str) -> None:
    case = MANIFEST[name]
    ref, io = load_case(GROUP, name)
    params = ref.state_dict()  # the seeded weights and centres (and the initted flags of the initted cases)
    net = build_network({"type": "catanet", **case["kwargs"]})  # neosr's lower-case name
    assert type(net).__name__ == "CATANet"
    net.load_state_dict(params, strict=True)
    assert bool(net.blocks[0][0].initted) == ("initted" in name)
    net.eval()
    for inp, out, _ in case["compare"]:
        with torch.no_grad():
            got = net(io[inp])
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} differs")


@pytest.mark.parametrize("name", sorted(n for n, c in MANIFEST.items() if c["train_steps"]))
def test_training_forwards_update_the_centres_as_neosr(name: str) -> None:
    """Training-mode forwards one after another: each output and every block's centres after it."""
    net, io = load_case(GROUP, name)
    net.train()
    first = {k: b.clone() for k, b in _means(net).items()}
    for j in range(MANIFEST[name]["train_steps"]):
        with torch.no_grad():
            got = net(io[f"train_input{j}"])
        torch.testing.assert_close(got, io[f"train_output{j}"], **FIXTURE_TOL, msg=f"{name}: step {j}")
        for k, b in _means(net).items():
            torch.testing.assert_close(b, io[f"train_means{j}.{k}"], rtol=1e-5, atol=1e-6, msg=f"{name}: {k} {j}")
        assert all(bool(m.initted) for m in net.modules() if hasattr(m, "initted"))
    assert all(not torch.equal(first[k], b) for k, b in _means(net).items())


def test_eval_leaves_the_centres_and_small_inputs_run() -> None:
    """Eval changes no buffer; a side shorter than a window (or fewer tokens than a group) takes the whole side."""
    net, _ = load_case(GROUP, "catanet_x2")
    before = {k: b.clone() for k, b in net.named_buffers()}
    net.eval()
    with torch.no_grad():
        for shape in ((1, 3, 4, 5), (1, 3, 3, 12), (2, 3, 6, 6)):
            out = net(torch.rand(shape))
            assert out.shape == (shape[0], 3, 2 * shape[2], 2 * shape[3]) and torch.isfinite(out).all()
    assert all(torch.equal(before[k], b) for k, b in net.named_buffers())


# ----------------------------------------------------------------------------- names, sizes, recognition

@pytest.mark.parametrize(("scale", "params"), [(4, 535_195), (3, 549_635), (2, 477_435), (1, 419_675)])
def test_published_sizes(scale: int, params: int) -> None:
    with torch.device("meta"):
        net = build_network({"type": "catanet", "upscale": scale})
    assert type(net).__name__ == "CATANet"
    assert sum(p.numel() for p in net.parameters()) == params


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_fixture_files_are_recognised(name: str) -> None:
    case = MANIFEST[name]
    params = load_case(GROUP, name)[0].state_dict()
    found = recognise(params)
    assert found.opt["type"] == "CATANet" and found.opt["upscale"] == case["kwargs"]["upscale"]
    assert found.opt["num_tokens"] == case["kwargs"]["num_tokens"]
    with torch.device("meta"):
        net = build_network(found.opt)
    assert {k: v.shape for k, v in net.state_dict().items()} == {k: v.shape for k, v in params.items()}


def test_no_other_fixture_is_recognised_as_catanet() -> None:
    for group, name in weight_cases(skip=GROUP)[::8]:  # an eighth of the other groups' cases (build time)
        assert "CATANet" not in {r.opt["type"] for r in recognise_all(stored_params(group, name))}, f"{group}/{name}"


# ----------------------------------------------------------------------------- arguments

# ----------------------------------------------------------------------------- ONNX, XLA

@pytest.mark.xla
def test_xla_train_step_compiles_once_without_cpu_fallback() -> None:
    """Steps 1 and 2 differ in the centres (first from the tokens, then from ``means``: the same graph); the EMA
    update of ``means`` is part of the step."""
    res = check_xla_train_step(TINY, (2, 3, 13, 11), eval_form=True, scale=2, steps=3, same_loss=False)
    assert all(bool(m.initted.cpu()) for m in res.net.modules() if hasattr(m, "initted"))

"""The checks every architecture gets, over its card (``tests/archs/cards.py``; the check functions:
``tests/arch_checks.py``).

Adding an architecture: its fixture cases (``tests/fixtures/<group>/``, ``tools/fixtures/make_<group>_fixtures.py``),
the folder in ``PARITY`` (reference parity) and its representative case in ``GROUPS[group].one``, and its card in
``CARDS``: tiny network, training run, ONNX, XLA, bad arguments. The family's module (``tests/archs/test_<family>.py``)
keeps what is particular to it: padding rules, re-parameterisation, published sizes, recognition.

- fixture cases (the reference's weights, read through ``arch_checks`` only): the state dict has the network's keys
  and shapes and loads strictly, every compared output is the reference's (``PARITY``); channels_last input and
  weights give the reference's output; bf16 autocast stays close; the forward makes no tensor off the input's device
  (meta); one backward reaches every trainable parameter with a finite gradient (``GROUPS``);
- cards: ``anysr export`` writes an ONNX file that runs at a size it never saw; two XLA:CPU training steps compile
  once with nothing left to the CPU (``-m xla``); each bad argument raises one line naming the option; a real
  training run saves finite weights that load strictly and have moved (through the ``anysr train`` command line in a
  subprocess for one, the same entry point in this process for the rest: the command line's own path is the same
  for every network); 2 gloo ranks give what 1 process gives, per family.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from arch_checks import (
    check_bf16_autocast,
    check_channels_last,
    check_finite_gradients,
    check_meta_device,
    check_onnx_at_unseen_size,
    check_trained_weights,
    check_two_ranks_match_one,
    check_xla_train_step,
    fixture_io,
    load_case,
    manifest,
    net_opt,
    stored_params,
    train,
    train_options,
)
from cards import (
    CARDS,
    GRADIENT_SUBSET,
    GRADIENTS,
    GROUPS,
    PADDED,
    PADDED_MIN_SIDE,
    PARITY,
    PUBLISHED,
    PUBLISHED_FRAMES,
    TRAIN,
    TWO_RANKS,
)
from conftest import FIXTURE_TOL

from anysr.archs import ARCH_REGISTRY, build_network
from anysr.errors import OptionError
from anysr.presets import find_preset

# tests/conftest.py keeps modules that name FIXTURE_TOL in the AVX2 pass (make test-avx2): the comparisons with the
# reference outputs here use it (through arch_checks).

def _params(check: str) -> list[Any]:
    out = []
    for group, g in GROUPS.items():
        if check == "bf16" and g.bf16_all:
            names = sorted(manifest(group)["cases"])
        else:
            names = list(g.one) + list({"channels_last": g.cl_extra, "bf16": g.bf16_extra, "meta": g.meta_extra,
                                        "grad": g.grad_extra}[check])
        for name in names:
            marks = [pytest.mark.slow] if check == "grad" and name in g.slow_grad else []
            out.append(pytest.param(group, name, id=f"{group}-{name}", marks=marks))
    return out


def test_every_representative_case_exists() -> None:
    for group, g in GROUPS.items():
        cases = manifest(group)["cases"]
        listed = {*g.one, *g.cl_extra, *g.bf16_extra, *g.meta_extra, *g.grad_extra, *g.bf16_bound, *g.slow_grad}
        assert listed <= set(cases), f"{group}: not in its manifest: {sorted(listed - set(cases))}"
        assert {cases[n]["type"] for n in g.one} | set(g.aliases) == {c["type"] for c in cases.values()}, \
            f"{group}: an architecture has no representative case"


@pytest.mark.parametrize(("group", "name"), _params("channels_last"))
def test_channels_last_input_and_weights_give_the_reference_output(group: str, name: str) -> None:
    net, io = load_case(group, name)
    tol = None
    if manifest(group)["cases"][name]["type"] in GROUPS[group].scaled_tol:
        tol = {"rtol": FIXTURE_TOL["rtol"], "atol": FIXTURE_TOL["atol"] * max(1.0, float(io["output0"].abs().max()))}
    check_channels_last(net, io["input0"], io["output0"], tol=tol)


@pytest.mark.parametrize(("group", "name"), _params("bf16"))
def test_bf16_autocast_stays_close(group: str, name: str) -> None:
    net, io = load_case(group, name)
    g = GROUPS[group]
    i = g.bf16_input
    check_bf16_autocast(net, io[f"input{i}"], io[f"output{i}"], g.bf16_bound.get(name, 0.05))


@pytest.mark.parametrize(("group", "name"), _params("meta"))
def test_forward_creates_no_tensor_off_the_input_device(group: str, name: str) -> None:
    g = GROUPS[group]
    io = fixture_io(group, name)
    if g.meta == "compare":
        pairs = [(inp, out) for inp, out, *_ in manifest(group)["cases"][name]["compare"]]
    else:
        inputs = sorted(k for k in io if k.startswith("input"))
        inp = inputs[-1] if g.meta == "last" else ("input1" if "input1" in io else "input0")
        pairs = [(inp, inp.replace("input", "output"))]
    net, _ = load_case(group, name)
    for inp, out in pairs:
        check_meta_device(net, io[inp].shape, io[out].shape)


@pytest.mark.parametrize(("group", "name"), _params("grad"))
def test_training_step_gives_finite_gradients(group: str, name: str) -> None:
    g = GROUPS[group]
    net, io = load_case(group, name)
    frozen = None
    if g.frozen is not None:
        prefix = g.frozen.get(manifest(group)["cases"][name]["type"])
        frozen = {n for n, _ in net.named_parameters() if prefix and n.startswith(prefix)}
    check_finite_gradients(net, g.grad_input(io), nonzero=g.grad_nonzero, frozen=frozen,
                           no_drop_path=g.no_drop_path)


# ----------------------------------------------------------------------------- reference parity

def _parity_cases() -> list[Any]:
    return [pytest.param(group, name, id=f"{group}-{name}") for group in PARITY
            for name in sorted(manifest(group)["cases"])]


@pytest.mark.parametrize(("group", "name"), _parity_cases())
def test_reference_weights_load_strictly_and_match(group: str, name: str) -> None:
    """The reference's state dict has the network's keys and shapes (seeded weights: all but buffers the network
    computes) and loads strictly; every ``compare`` entry gives the reference's output in its mode, leaving the
    input as it was."""
    p = PARITY[group]
    case = manifest(group)["cases"][name]
    opt = net_opt(group, name)
    if p.name is not None:  # the reference's own name for the type
        opt["type"] = case[p.name] if isinstance(p.name, str) else p.name.get(case["type"], case["type"])
    net = build_network(opt)
    if p.name is not None:
        assert type(net).__name__ == case["type"]
    own = net.state_dict()
    io = fixture_io(group, name)
    # seeded weights, then the state the reference reached that no seed gives (io entries ``state.<key>``)
    params = {**stored_params(group, name), **{k[len("state."):]: v for k, v in io.items() if k.startswith("state.")}}
    computed = set(own) - set(params)
    assert set(params) <= set(own), f"keys the network lacks: {sorted(set(params) - set(own))[:5]}"
    if "buffers" in case:  # the buffers the network computes, as the reference's shapes
        assert {k: list(own[k].shape) for k in computed} == case["buffers"], f"buffers differ from {p.reference}'s"
    elif "seeded" in case and not any(k.startswith("state.") for k in io):  # its own computed buffers stand
        assert not computed & dict(net.named_parameters()).keys(), f"unseeded parameters: {sorted(computed)[:5]}"
    else:
        assert not computed, f"state-dict keys differ from {p.reference}'s: {sorted(computed)[:5]}"
    assert {k: own[k].shape for k in params} == {k: v.shape for k, v in params.items()}, \
        f"shapes differ from {p.reference}'s"
    net.load_state_dict({**{k: own[k] for k in computed}, **params}, strict=True)
    both = p.both_modes is True or case["type"] in p.both_modes  # type: ignore[operator]
    tile = getattr(net, "tile_multiple", 1)
    padded = False
    for forced in ("eval", "train") if both else (None,):
        for inp, out, *rest in case["compare"]:
            mode = forced or (rest[0] if rest else "eval")
            net.train(mode == "train")
            x = io[inp]
            before = x.clone()
            with torch.no_grad():
                got = net(x)
            assert torch.equal(x, before), "the forward changed its input"
            padded |= bool(x.shape[-2] % tile or x.shape[-1] % tile)
            assert got.shape == io[out].shape
            tol = dict(FIXTURE_TOL)
            if p.scaled(case["type"], mode):
                tol["atol"] *= max(1.0, float(io[out].abs().max()))
            torch.testing.assert_close(got, io[out], **tol, msg=f"{name} {out} ({mode}) differs from {p.reference}")
    assert padded or not p.padded, f"{name}: no input needs padding"


@pytest.mark.parametrize(("group", "name", "inp", "why"), [
    pytest.param(group, name, inp, why, id=f"{group}-{name}-{inp}") for group, rows in PADDED.items()
    for name, inp, why in rows])
def test_padded_inputs_match_reference(group: str, name: str, inp: str, why: str) -> None:
    """An input the network pads (or grows) inside forward: it is no multiple of the network's ``tile_multiple``
    (or below the folder's minimum side), and the output is the reference's for it, at the scaled size."""
    net, io = load_case(group, name)
    x = io[inp]
    assert x.shape[-2] % net.tile_multiple or x.shape[-1] % net.tile_multiple \
        or min(x.shape[-2:]) < PADDED_MIN_SIDE.get(group, 0), why
    with torch.no_grad():
        got = net(x)
    want = io[inp.replace("input", "output")]
    scale = want.shape[-1] // x.shape[-1]
    assert got.shape == want.shape and got.shape[-2:] == (x.shape[-2] * scale, x.shape[-1] * scale)
    tol = dict(FIXTURE_TOL)
    if PARITY[group].scaled(manifest(group)["cases"][name]["type"], "eval"):
        tol["atol"] *= max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got, want, **tol, msg=why)


@pytest.mark.parametrize(("group", "name"), [
    pytest.param(group, name, id=f"{group}-{name}") for group, names in GRADIENTS.items() for name in names])
def test_training_gradients_match_reference(group: str, name: str) -> None:
    """Training-mode gradients of ``mean(output ** 2)``: the input's and every stored parameter's are the
    reference's; the stored ones are exactly the trained parameters (``GRADIENT_SUBSET``: some of them); every
    trained parameter gets one, no frozen one does."""
    net, io = load_case(group, name)
    x = io["input0"].clone().requires_grad_(True)
    net.train()(x).square().mean().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, io["grad_input0"], rtol=1e-4, atol=1e-5 * io["grad_input0"].abs().max().item())
    grads = {k[len("grad."):]: v for k, v in io.items() if k.startswith("grad.")}
    trained = {n for n, p in net.named_parameters() if p.requires_grad}
    if group in GRADIENT_SUBSET:
        assert len(grads) > GRADIENT_SUBSET[group] and set(grads) < trained
    else:
        assert set(grads) == trained
    for n, p in net.named_parameters():
        assert (p.grad is not None) == p.requires_grad, n
        if n in grads and p.numel():  # a 0-wide layer has nothing to compare (HMA's position bias at tiny widths)
            bound = 1e-5 * max(grads[n].abs().max().item(), 1e-3)
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=bound, msg=f"{name}: {n}")


# ----------------------------------------------------------------------------- tiny networks: ONNX, XLA, bad arguments

def _cards(check: str) -> list[Any]:
    return [pytest.param(name, marks=[pytest.mark.slow] if check == "onnx" and card.onnx_slow else [])
            for name, card in CARDS.items() if getattr(card, check) is not None]


@pytest.mark.parametrize("card", _cards("onnx"))
def test_onnx_export_runs_at_sizes_it_never_saw(card: str, tmp_path: Path) -> None:
    c = CARDS[card]
    torch.manual_seed(0)
    net = build_network(dict(c.small)).eval()
    if c.onnx_prepare is not None:
        c.onnx_prepare(net)
    check_onnx_at_unseen_size(net, c.small, c.scale, tmp_path, **(c.onnx or {}))


@pytest.mark.xla
@pytest.mark.parametrize("card", _cards("xla"))
def test_xla_train_step_compiles_once_without_cpu_fallback(card: str) -> None:
    c = CARDS[card]
    check_xla_train_step(c.small, **(c.xla or {}))


@pytest.mark.parametrize(("card", "opt", "pattern"), [
    pytest.param(name, opt, pattern, id=f"{name}-{i}") for name, card in CARDS.items()
    for i, (opt, pattern) in enumerate(card.bad)])
def test_bad_argument_values(card: str, opt: dict[str, Any], pattern: str) -> None:
    """One line naming the option and what it needs, never a traceback."""
    with pytest.raises(OptionError, match=pattern) as err:
        build_network(dict(opt) if "type" in opt else {**CARDS[card].small, **opt})
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- real training runs


def _options(arch: str, name: str, train_dir: Path, val_dir: Path | None = None, total_iter: int | None = None,
             **net: Any) -> dict[str, Any]:
    t = TRAIN[arch]
    return train_options(name, train_dir, {**t.net, **net}, scale=t.scale, total_iter=total_iter or t.total_iter,
                         batch=t.batch,
                         gt_size=t.gt_size, val_dir=val_dir, **t.extra)


@pytest.mark.slow
@pytest.mark.parametrize("arch", [pytest.param(a, id=f"{a}-{'cli' if t.cli else 'main'}") for a, t in TRAIN.items()])
def test_training_run_saves_finite_weights_that_moved(arch: str, tmp_path: Path, small_train_dir: Path) -> None:
    t = TRAIN[arch]
    exp, _ = train(tmp_path, _options(arch, f"t_{arch.lower()}", small_train_dir), subprocess=t.cli)
    check_trained_weights(exp, t.total_iter, t.net, moved=t.moved)


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(TWO_RANKS))
def test_two_gloo_ranks_match_one_process(arch: str, tmp_path: Path, small_train_dir: Path,
                                          small_val_dir: Path) -> None:
    spec = TWO_RANKS[arch]
    val_dir = small_val_dir if spec.get("val", True) else None
    opt = _options(arch, "run", small_train_dir, val_dir, spec.get("total_iter"), **spec.get("net", {}))
    if "optim_g" in spec:
        opt["train"]["optim_g"] = spec["optim_g"]
    check_two_ranks_match_one(tmp_path, opt)


@pytest.mark.parametrize("name", sorted(set(PUBLISHED) | set(PUBLISHED_FRAMES)))
def test_published_size_names_a_network(name: str) -> None:
    """Each benchmarked published size (``PUBLISHED``, and every clip network ``PUBLISHED_FRAMES`` names) names a
    registered network or preset, at a scale >= 1 and a channel count of 1 or 3 (a renamed preset or class would
    otherwise break only the benchmarks)."""
    assert name in PUBLISHED, f"PUBLISHED_FRAMES names {name}, which PUBLISHED does not hold"
    opt, scale, in_ch = PUBLISHED[name]
    kind = opt["type"]
    assert kind in ARCH_REGISTRY or find_preset(kind, ARCH_REGISTRY.keys()) is not None, f"{name}: unknown {kind}"
    assert scale >= 1 and in_ch in (1, 3)

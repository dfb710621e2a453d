"""The checks every architecture gets, written once (tests/archs/test_standard.py runs them over its tables).

A fixture case is ``tests/fixtures/<group>/<name>_params.safetensors`` (the reference's weights) and
``<name>_io.safetensors`` (inputs ``input<i>`` and the reference's outputs ``output<i>``), described in the group's
``manifest.json`` (``cases[name]``: ``type``, ``kwargs``). Weights are not stored: a ``seeded`` entry (``seed``,
``shapes``, ``abs_sum``) rebuilds them with ``tools/fixtures/fixture_kit.py``, the generator the fixture script used
(entries the network computes, such as index tables, are not in ``shapes``: the network's own values stand); older
groups still carry a ``synthetic`` entry (``synthetic_state_dict``) or a params file. An ``inputs`` entry
(``{name: {"shape", "seed"}}``) rebuilds inputs the io file does not store; io entries ``state.<key>`` (state the
reference reached that no seed gives, such as spectral norms' u / v) are loaded over the weights. Files are read
once per session; every caller gets its own network.

Training runs go through ``anysr train`` as a user runs it (a subprocess) or through the same entry point in this
process (``anysr.cli.main``: options, launch, model, loop and checkpoint code alike, without a second interpreter).
"""

from __future__ import annotations

import functools
import json
import math
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fixture_kit  # tools/fixtures (on the path: tests/conftest.py)
import numpy as np
import pytest
import torch
from conftest import FIXTURE_TOL, run_cli, tiny_train_options, write_options
from safetensors.torch import load_file

from anysr.accelerators.precision import to_channels_last
from anysr.archs import build_network

FIXTURES = Path(__file__).resolve().parent / "fixtures"


# ----------------------------------------------------------------------------- fixture cases

@functools.cache
def manifest(group: str) -> dict[str, Any]:
    """``tests/fixtures/<group>/manifest.json``."""
    return json.loads((FIXTURES / group / "manifest.json").read_text())


def synthetic_state_dict(shapes: dict[str, list[int]], seed: int) -> dict[str, torch.Tensor]:
    """Seeded weights as ``make_restore_fixtures.synthetic_state_dict`` makes them (per key, from its CRC)."""
    out = {}
    for key, shape in shapes.items():
        rs = np.random.RandomState((zlib.crc32(key.encode()) + seed) % 2**32)
        n = rs.standard_normal(int(np.prod(shape))).reshape(shape)
        if len(shape) == 1:
            v = 1.0 + 0.1 * n if key.endswith("weight") else 0.1 * n
        else:
            v = 0.5 * n / math.sqrt(float(np.prod(shape[1:])))
        out[key] = torch.from_numpy(v.astype(np.float32))
    return out


@functools.cache
def _stored_params(group: str, name: str) -> dict[str, torch.Tensor]:
    case = manifest(group)["cases"][name]
    if "seeded" in case:
        seeded = case["seeded"]
        params = fixture_kit.seeded_state_dict(seeded["shapes"], seeded["seed"])
        assert fixture_kit.abs_sum(params) == pytest.approx(seeded["abs_sum"], rel=1e-9), \
            "seeded weights differ from the fixture script's (tools/fixtures/fixture_kit.py changed?)"
        return params
    if "synthetic" not in case:
        return load_file(str(FIXTURES / group / f"{name}_params.safetensors"))
    syn = case["synthetic"]
    params = synthetic_state_dict(syn["shapes"], syn["seed"])
    abs_sum = float(sum(v.double().abs().sum() for v in params.values()))
    assert abs_sum == pytest.approx(syn["abs_sum"], rel=1e-9), "synthetic weights differ from the fixture script's"
    return params


def stored_params(group: str, name: str) -> dict[str, torch.Tensor]:
    """The reference's state dict of case ``name`` (a copy: callers may change it)."""
    return dict(_stored_params(group, name))


@functools.cache
def _io(group: str, name: str) -> dict[str, torch.Tensor]:
    io = load_file(str(FIXTURES / group / f"{name}_io.safetensors"))
    for key, spec in manifest(group)["cases"][name].get("inputs", {}).items():
        io[key] = fixture_kit.seeded_input(spec["shape"], spec["seed"], *spec.get("range", (0.0, 1.0)))
    return io


def _has_weights(case: dict[str, Any], params_file: Path) -> bool:
    if "seeded" in case:
        seeded = case["seeded"]  # fixture_kit's weights (other scripts name theirs: "weights")
        return isinstance(seeded, dict) and "shapes" in seeded and "weights" not in seeded
    return "synthetic" in case or params_file.is_file()


def weight_cases(skip: str = "") -> list[tuple[str, str]]:
    """``(group, name)`` of every fixture case ``stored_params`` gives weights for (seeded, synthetic or a params
    file), in the groups other than ``skip``."""
    out = []
    for path in sorted(FIXTURES.glob("*/manifest.json")):
        group = path.parent.name
        cases = manifest(group).get("cases") if group != skip else None
        if not isinstance(cases, dict):
            continue
        out += [(group, name) for name, case in sorted(cases.items()) if isinstance(case, dict) and _has_weights(
            case, path.parent / f"{name}_params.safetensors")]
    return out


def fixture_io(group: str, name: str) -> dict[str, torch.Tensor]:
    """The case's inputs and the reference's outputs (read once; the tensors are shared, never write to them)."""
    return dict(_io(group, name))


def net_opt(group: str, name: str) -> dict[str, Any]:
    """``network_g`` of case ``name``."""
    case = manifest(group)["cases"][name]
    return {"type": case["type"], **case["kwargs"]}


def load_case(group: str, name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """A fresh fixture network (eval mode, the reference's weights loaded strictly, in the network's own dtypes:
    some fixtures store integer buffers in compact dtypes) and its inputs / outputs."""
    net = build_network(net_opt(group, name)).eval()
    own = net.state_dict()
    params = {k: v.to(own[k].dtype) if k in own else v for k, v in _stored_params(group, name).items()}
    if "seeded" in manifest(group)["cases"][name]:  # what the network computes (not seeded) stays its own
        params = {**{k: v for k, v in own.items() if k not in params}, **params}
    io = fixture_io(group, name)
    # state the reference reached and no seed gives (spectral norms' u / v after training forwards)
    params.update({k[len("state."):]: v for k, v in io.items() if k.startswith("state.")})
    net.load_state_dict(params, strict=True)
    return net, io


# ----------------------------------------------------------------------------- forward checks

def check_channels_last(net: torch.nn.Module, x: torch.Tensor, want: torch.Tensor, *,
                        tol: dict[str, float] | None = None) -> None:
    """A channels_last input, then channels_last weights too (what training does: ``to_channels_last``), give
    ``want`` (within ``tol``, by default FIXTURE_TOL)."""
    tol = tol or FIXTURE_TOL
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        got = net(x)
        got_cl = to_channels_last(net)(x)
    torch.testing.assert_close(got, want, **tol, msg="channels_last input")
    torch.testing.assert_close(got_cl, want, **tol, msg="channels_last input and weights")


def check_bf16_autocast(net: torch.nn.Module, x: torch.Tensor, ref: torch.Tensor, bound: float = 0.05) -> None:
    """Under bf16 autocast the output stays within ``bound`` of the output's range (bf16 keeps 8 bits of mantissa)
    and finite; the stored weights keep float32 (autocast casts copies, re-parameterised convs fold in fp32)."""
    dtypes = {n: p.dtype for n, p in net.named_parameters()}
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = net(x).float()
    assert mixed.shape == ref.shape and torch.isfinite(mixed).all()
    err = (mixed - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
    assert err < bound, f"bf16 autocast off by {err:.3g} of the output range (bound {bound})"
    assert {n: p.dtype for n, p in net.named_parameters()} == dtypes, "autocast changed a stored weight's dtype"


def check_meta_device(net: torch.nn.Module, shape: torch.Size, out_shape: torch.Size) -> None:
    """On the meta device every tensor the forward made on the CPU (instead of on ``x.device``) would raise."""
    net = net.to("meta")
    out = net(torch.empty(shape, device="meta"))
    assert out.device.type == "meta" and out.shape == out_shape


def check_finite_gradients(net: torch.nn.Module, x: torch.Tensor, *, nonzero: Callable[[str], bool] | None = None,
                           frozen: set[str] | None = None, no_drop_path: bool = False) -> None:
    """One training-mode backward reaches every trainable parameter with a finite gradient; the parameters
    ``nonzero`` names get one that is not all zeros (the branch takes part); ``frozen``, when given, is exactly the
    set of parameters that do not train. ``no_drop_path``: stochastic depth off (it may drop a whole block for one
    image, leaving nothing to check)."""
    net.train()
    if no_drop_path:
        for m in net.modules():
            if hasattr(m, "drop_prob"):
                m.drop_prob = 0.0
    before = x.clone()
    net(x).square().mean().backward()
    assert torch.equal(x, before), "the forward changed its input"
    trained = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
    assert trained, "no trainable parameter"
    bad = [n for n, p in trained if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not bad, f"no finite gradient: {bad}"
    if nonzero is not None:
        checked = [(n, p) for n, p in trained if nonzero(n)]
        zero = [n for n, p in checked if not p.grad.abs().sum() > 0]
        assert checked and not zero, f"all-zero gradient: {zero}"
    if frozen is not None:
        assert {n for n, p in net.named_parameters() if not p.requires_grad} == frozen


# ----------------------------------------------------------------------------- training runs

def train_options(name: str, train_dir: Path, net: dict[str, Any], *, scale: int = 2, total_iter: int = 4,
                  batch: int = 4, gt_size: int = 32, val_dir: Path | None = None,
                  **extra: Any) -> dict[str, Any]:
    """``tiny_train_options`` for network ``net``: checkpoints (and validation) at the last iteration only;
    ``extra`` as in ``tiny_train_options`` (``train__ema_decay=0``, ``find_unused_parameters=True``)."""
    opt = tiny_train_options(name, train_dir, val_dir, total_iter=total_iter, **extra)
    opt["scale"] = scale
    opt["network_g"] = dict(net)
    opt["datasets"]["train"]["batch_size_per_gpu"] = batch
    opt["datasets"]["train"]["gt_size"] = gt_size
    opt["logger"]["save_checkpoint_freq"] = total_iter
    if val_dir is not None:
        opt["val"]["val_freq"] = total_iter
    return opt


def train(tmp_path: Path, opt: dict[str, Any], *, subprocess: bool = False) -> tuple[Path, str]:
    """Run ``anysr train`` on ``opt`` (experiments under ``tmp_path``); returns the experiment folder and what the
    run printed (a subprocess's stdout; in this process, the log file)."""
    path = write_options(tmp_path / f"{opt['name']}.yml", opt)
    args = ["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]
    exp = tmp_path / "experiments" / opt["name"]
    if subprocess:
        return exp, run_cli(*args, cwd=tmp_path).stdout
    from anysr.cli import main

    assert main(args) == 0, f"anysr {' '.join(args)} failed"
    logs = sorted(exp.rglob("*.log"))
    return exp, "".join(p.read_text() for p in logs)


def saved_groups(exp: Path, it: int) -> dict[str, dict[str, torch.Tensor]]:
    """The weight groups (``params``, ``params_ema``) experiment ``exp`` saved at iteration ``it``."""
    stored = load_file(str(exp / "models" / f"net_g_{it}.safetensors"))
    groups: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in stored.items():
        group, _, name = key.partition(".")
        groups.setdefault(group, {})[name] = value
    return groups


def check_trained_weights(exp: Path, it: int, net: dict[str, Any], *, moved: str | None = None) -> None:
    """What a training run saved at ``it``: every group has the network's keys, is finite and loads strictly;
    ``params`` differs from a fresh network in some trained parameter (``moved``: in that one, which every fresh
    network holds at the same value)."""
    groups = saved_groups(exp, it)
    assert "params" in groups, f"no params group in {sorted(groups)}"
    fresh_net = build_network(dict(net))
    fresh = {k: v.clone() for k, v in fresh_net.state_dict().items()}
    for group, weights in groups.items():
        assert set(weights) == set(fresh), f"{group}: keys differ from the network's"
        bad = [k for k, v in weights.items() if v.is_floating_point() and not torch.isfinite(v).all()]
        assert not bad, f"{group}: not finite: {bad}"
        build_network(dict(net)).load_state_dict(weights, strict=True)
    params = groups["params"]
    trained = [n for n, p in fresh_net.named_parameters() if p.requires_grad]
    assert any(not torch.equal(params[k], fresh[k]) for k in trained), "training changed no parameter"
    if moved is not None:
        assert not torch.equal(params[moved], fresh[moved]), f"{moved} was not trained"


def check_two_ranks_match_one(tmp_path: Path, opt: dict[str, Any], *, batch: int = 4,
                              atol: float = 1e-5) -> tuple[Path, Path]:
    """``opt`` trained by 1 process with ``batch`` and by 2 gloo ranks with ``batch // 2`` each gives the same
    weights (and validation PSNR, when ``opt`` validates); returns both experiment folders."""
    runs = {}
    for name, ranks in (("one", 1), ("two", 2)):
        run = json.loads(json.dumps(opt))
        run["name"], run["num_gpu"] = name, ranks
        run["datasets"]["train"]["batch_size_per_gpu"] = batch // ranks
        runs[name] = train(tmp_path, run)
    (one, _), (two, log) = runs["one"], runs["two"]
    assert "rank 0/2" in log
    summary = json.loads((two / "summary.json").read_text())
    assert summary["accelerator"]["world_size"] == 2
    it = opt["train"]["total_iter"]
    wa, wb = saved_groups(one, it), saved_groups(two, it)
    assert wa.keys() == wb.keys()
    for group in wa:
        assert set(wa[group]) == set(wb[group])
        off = [(k, (wa[group][k] - wb[group][k]).abs().max().item()) for k in wa[group]
               if not torch.allclose(wa[group][k], wb[group][k], rtol=1e-4, atol=atol)]
        assert not off, f"{group}: {off}"
    if "val" in opt:
        va = json.loads((one / "summary.json").read_text())["validation"]["val"]["psnr"]["value"]
        vb = summary["validation"]["val"]["psnr"]["value"]
        assert math.isfinite(va) and va == pytest.approx(vb, abs=2e-3)
    return one, two


# ----------------------------------------------------------------------------- ONNX

def check_onnx_at_unseen_size(net: torch.nn.Module, opt: dict[str, Any], scale: int, tmp_path: Path, *,
                              size: tuple[int, int] = (45, 70), channels: int = 3,
                              tol: float = 1e-4) -> Any:
    """``anysr export`` of ``net``'s weights writes a dynamic ONNX file that onnxruntime runs at ``size`` (not a
    size the exporter traced or checked, nor a multiple of any tile) with the output of ``net`` in eval mode.
    Returns the exporter's report (its own checks: ``rep.checks``). Skips where onnxruntime is not installed."""
    ort = pytest.importorskip("onnxruntime")
    from anysr.engine import checkpoint as ck  # noqa: PLC0415
    from anysr.engine.inference.export import export_weights  # noqa: PLC0415

    net = net.eval()
    src = tmp_path / "w.safetensors"
    ck.save_weights(src, {"params": net.state_dict()}, {"network_g": dict(opt), "scale": scale})
    (rep,) = export_weights(str(src), [str(tmp_path / "m.onnx")])
    assert rep.dynamic, rep.note
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    x = torch.rand(1, channels, *size)
    got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
    with torch.no_grad():
        want = net(x)
    assert got.shape == want.shape == (1, want.shape[1], size[0] * scale, size[1] * scale)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    return rep


# ----------------------------------------------------------------------------- XLA

def check_xla_train_step(net_opt: dict[str, Any], shape: tuple[int, ...] = (2, 3, 16, 12), *,
                         eval_form: bool = False, scale: int | None = None, steps: int = 2,
                         eval_shape: tuple[int, ...] | None = None, same_loss: bool = True,
                         prepare: Callable[[torch.nn.Module], object] | None = None) -> SimpleNamespace:
    """Two training steps of ``net_opt`` on an XLA:CPU device: one compile (the second step reuses the graph),
    the same loss twice, a finite gradient for every trainable parameter and no op fallen back to the CPU (the
    counters are cleared first). ``eval_form``: an eval-mode forward lowers too (re-parameterised networks);
    ``scale``: so does it, and its output's height and width are ``scale`` times the input's. ``eval_shape``: so
    does it, on an input of that shape (another graph). ``steps``: that many steps, the last two compiling nothing
    new and step 2 at most ``steps - 2`` graphs more than step 1 (for a network whose state turns from initial
    values into step outputs); every step's loss is the same to 1e-4 relative (``same_loss=False``: not asked of
    a network that draws noise in training, whose losses differ by far more). Not bit for bit: XLA:CPU runs of one
    compiled graph on the same inputs differed by 2e-5 relative in some process states (TFDAT's and Swin2SR's, after
    other modules' tests in the same process; measured 2026-12-07).
    ``prepare``: called on the built
    network (on the CPU, before it moves to the device). Returns ``net`` (on the device, in the mode the check
    left it), ``x``, ``compiles`` (the compile count after each step) and ``losses`` (on the device) for a caller's
    own checks. Skips where torch_xla is not installed."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics  # noqa: PLC0415

    metrics.clear_all()
    torch.manual_seed(0)
    dev = torch_xla.device()
    net = build_network(dict(net_opt)).train()
    if prepare is not None:
        prepare(net)
    net = net.to(dev)
    x = torch.rand(shape).to(dev)
    torch_xla.sync()  # what moving made (a weight a module derives on the device) is data before the first step

    def compiled() -> int:
        data = metrics.metric_data("CompileTime")
        return int(data[0]) if data else 0

    start = compiled()
    compiles, losses = [], []
    for _ in range(steps):
        net.zero_grad(set_to_none=True)
        loss = net(x).square().mean()
        loss.backward()
        torch_xla.sync()
        compiles.append(compiled() - start)
        losses.append(loss.detach())
    assert compiles[0] >= 1 and compiles[-1] == compiles[-2], f"{net_opt['type']} recompiled: {compiles}"
    assert compiles[1] <= compiles[0] + steps - 2, f"{net_opt['type']} recompiled: {compiles}"
    grads = [p.grad for p in net.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads), "a trainable parameter got no gradient"
    assert torch.isfinite(torch.stack([g.abs().sum() for g in grads]).cpu()).all(), "a gradient is not finite"
    first = losses[0].cpu()
    assert not same_loss or all(torch.allclose(first, v.cpu(), rtol=1e-4, atol=0) for v in losses[1:]), \
        f"the loss changed: {[v.item() for v in losses]}"
    if eval_form or scale is not None or eval_shape is not None:
        x_eval = x if eval_shape is None else torch.rand(eval_shape).to(dev)
        with torch.no_grad():
            out = net.eval()(x_eval)
            torch_xla.sync()
        if scale is not None:
            want = (scale * x_eval.shape[-2], scale * x_eval.shape[-1])
            assert out.shape[-2:] == want, f"eval output {tuple(out.shape)}, not {want}"
    fallbacks = {n for n in metrics.counter_names() if n.startswith("aten::")}
    executed = set(metrics.executed_fallback_ops())
    assert not fallbacks and not executed, f"ops fell back to the CPU: {fallbacks or executed}"
    return SimpleNamespace(net=net, x=x, compiles=compiles, losses=losses)

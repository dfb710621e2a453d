"""AdanScheduleFree (anysr/models/adan_schedulefree.py) against traiNNer-redux's class (fixtures from
tools/fixtures/make_adansf_fixtures.py): the training and evaluation weights after every step, the final state and
its keys; a state-dict round trip resumes bit-exactly; bad arguments are one-line option errors naming the argument;
a CLI run trains, validates, saves the averaged weights and resumes bit-exactly; on XLA:CPU the step compiles once
and nothing falls back to the CPU."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_same_weights, saved_weights, tiny_train_options, write_options
from safetensors.torch import load_file

from anysr.archs import build_network
from anysr.cli import main
from anysr.engine.checkpoint.state import load_training_state
from anysr.errors import OptionError
from anysr.models.adan_schedulefree import AdanScheduleFree
from anysr.models.optimizers import build_optimizer, has_weight_switch
from anysr.registry import OPTIMIZER_REGISTRY

FIX = Path(__file__).parent / "fixtures" / "adansf"
MANIFEST = json.loads((FIX / "manifest.json").read_text())
# The reference's op order is kept (same foreach ops, same scalar factors), so on the CPU the results match to the
# last bit; the tolerance below only allows a different CPU kernel (vector width) a few ulps.
TOL = {"rtol": 2e-6, "atol": 1e-8}


def _replay(name: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], AdanScheduleFree]:
    """anysr's optimizer through the fixture's steps: its tensors (same names as the fixture's) and itself."""
    case = MANIFEST["cases"][name]
    ref = load_file(str(FIX / f"{name}.safetensors"))
    params = {k: torch.nn.Parameter(ref[f"init.{k}"].clone()) for k in MANIFEST["meta"]["shapes"]}
    groups = [{"params": [params[k] for k in g], **gk} for g, gk in zip(case["groups"], case["group_kwargs"])]
    opt = AdanScheduleFree(groups, **{k: tuple(v) if isinstance(v, list) else v for k, v in case["kwargs"].items()})
    opt.train()
    out: dict[str, torch.Tensor] = {}
    for step in range(1, case["steps"] + 1):
        for k, p in params.items():
            p.grad = ref[f"grad.{step}.{k}"].clone()
        opt.step()
        y = {k: p.detach().clone() for k, p in params.items()}
        opt.eval()
        out.update({f"x.{step}.{k}": p.detach().clone() for k, p in params.items()})
        opt.train()
        if step != case["switch"]:
            with torch.no_grad():
                for k, p in params.items():
                    p.copy_(y[k])
        out.update({f"y.{step}.{k}": p.detach().clone() for k, p in params.items()})
    names = [k for g in case["groups"] for k in g]
    for i, st in opt.state_dict()["state"].items():
        out.update({f"state.{names[i]}.{k}": v for k, v in st.items()})
    return out, ref, opt


@pytest.mark.parametrize("name", sorted(MANIFEST["cases"]))
def test_matches_trainner_redux(name: str) -> None:
    out, ref, opt = _replay(name)
    want = {k: v for k, v in ref.items() if not k.startswith(("init.", "grad."))}
    assert sorted(out) == sorted(want)
    for k in want:
        torch.testing.assert_close(out[k], want[k], **TOL, msg=lambda m, k=k: f"{name} {k}: {m}")
    case = MANIFEST["cases"][name]
    sd = opt.state_dict()
    assert sorted(sd["param_groups"][0]) == case["group_keys"]
    assert sorted(sd["state"][0]) == case["state_keys"]
    for got, exp in zip(sd["param_groups"], case["param_groups"]):
        got = {k: list(v) if isinstance(v, tuple) else v for k, v in got.items() if k != "params"}
        assert got.keys() == exp.keys()
        for k, v in exp.items():
            assert got[k] == pytest.approx(v, rel=1e-15), k  # Python floats: same formula, same order


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))


def _steps(net: torch.nn.Module, opt: torch.optim.Optimizer, first: int, count: int) -> None:
    for i in range(first, first + count):
        g = torch.Generator().manual_seed(i)
        opt.zero_grad(set_to_none=True)
        net(torch.rand(2, 3, 7, 6, generator=g)).square().mean().backward()
        opt.step()


def test_state_dict_round_trip_resumes_bit_exact() -> None:
    kw = {"lr": 3e-3, "weight_decay": 0.02, "warmup_steps": 3, "max_grad_norm": 0.1}
    net = _net()
    opt = AdanScheduleFree(net.parameters(), **kw)
    _steps(net, opt, 0, 3)
    buf = io.BytesIO()
    torch.save({"net": net.state_dict(), "opt": opt.state_dict()}, buf)
    _steps(net, opt, 3, 3)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    net2 = _net()
    net2.load_state_dict(saved["net"])
    opt2 = AdanScheduleFree(net2.parameters(), **kw)
    opt2.load_state_dict(saved["opt"])
    _steps(net2, opt2, 3, 3)
    assert_same_weights(net.state_dict(), net2.state_dict())
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert all(torch.equal(a["state"][i][k], b["state"][i][k]) for i in a["state"] for k in a["state"][i])


def test_registered_case_insensitively_with_a_weight_switch() -> None:
    assert OPTIMIZER_REGISTRY.get("adanschedulefree") is AdanScheduleFree
    net = _net()
    opt = build_optimizer(list(net.parameters()), {"type": "AdanScheduleFree", "lr": 1e-3, "betas": [0.98, 0.92, 0.99],
                                                  "warmup_steps": 2}, "train.optim_g")
    assert isinstance(opt, AdanScheduleFree) and has_weight_switch(opt) and opt.param_groups[0]["betas"] == (
        0.98, 0.92, 0.99)
    _steps(net, opt, 0, 2)
    y = {k: v.clone() for k, v in net.state_dict().items()}
    opt.eval()
    assert any(not torch.equal(v, y[k]) for k, v in net.state_dict().items())
    with pytest.raises(RuntimeError, match="call optimizer.train"):
        opt.step()
    opt.train()
    for k, v in net.state_dict().items():
        torch.testing.assert_close(v, y[k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(("arg", "value"), [
    ("lr", -1.0), ("eps", "tiny"), ("weight_decay", -0.1), ("max_grad_norm", -1), ("warmup_steps", 2.5),
    ("warmup_steps", -1), ("betas", [0.9, 0.99]), ("betas[0]", 0.0), ("betas[1]", 1.0), ("betas[2]", -0.5),
    ("r", float("nan")), ("weight_lr_power", True),
])
def test_bad_arguments_name_the_argument(arg: str, value: Any) -> None:
    kwargs: dict[str, Any] = {"type": "AdanScheduleFree"}
    if arg.startswith("betas["):
        betas = [0.98, 0.92, 0.99]
        betas[int(arg[6])] = value
        kwargs["betas"] = betas
    else:
        kwargs[arg] = value
    with pytest.raises(OptionError) as info:
        build_optimizer(list(_net().parameters()), kwargs, "train.optim_g")
    text = str(info.value)
    assert text.startswith(f"train.optim_g.{arg}: ") and "\n" not in text, text


# ------------------------------------------------------------------------------------------------ a CLI run
TRAIN = {"optim_g": {"type": "AdanScheduleFree", "lr": 2e-3, "warmup_steps": 2, "weight_decay": 0.01},
         "scheduler": None}


def test_cli_trains_validates_saves_averaged_weights_and_resumes_bit_exact(tmp_path: Path, small_train_dir: Path,
                                                                            small_val_dir: Path) -> None:
    """Straight 4 == 2, stop, resume 2, validating at 2 and 4 and with EMA; the saved weights are the averaged
    ``x`` (from the state's training weights ``y`` and ``z``), the state's are ``y``."""
    def opts(name: str, total: int) -> Path:
        opt = tiny_train_options(name, small_train_dir, small_val_dir, total_iter=total)
        opt["train"].update(TRAIN)
        opt["val"]["val_freq"] = 2
        return write_options(tmp_path / f"{name}.yml", opt)

    assert main(["train", "-opt", str(opts("straight", 4)), "--force_yml", f"path.root={tmp_path}"]) == 0
    path = opts("split", 2)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=4"]) == 0
    straight, split = tmp_path / "experiments" / "straight", tmp_path / "experiments" / "split"
    assert_same_weights(saved_weights(straight, 4), saved_weights(split, 4))
    state = load_training_state(straight / "training_states" / "4.state")
    y, opt = state["model"]["nets"]["net_g"], state["model"]["optimizers"]["net_g"]
    beta1 = opt["param_groups"][0]["betas"][0]
    names = [k for k, _ in build_network(dict(tiny_train_options("n", small_train_dir, None)["network_g"]))
             .named_parameters()]
    x = {k.removeprefix("params."): v for k, v in saved_weights(straight, 4).items() if k.startswith("params.")}
    assert opt["param_groups"][0]["train_mode"] is True and len(names) == len(opt["state"])
    differ = 0
    for i, k in enumerate(names):  # parameters in order; the state indexes them so
        want = y[k].lerp(opt["state"][i]["z"], 1 - 1 / beta1)
        torch.testing.assert_close(x[k], want, rtol=0, atol=0)
        differ += not torch.equal(x[k], y[k])
    assert differ


# ------------------------------------------------------------------------------------------------ XLA
@pytest.mark.xla
def test_xla_step_compiles_once_without_fallbacks() -> None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics

    metrics.clear_all()
    dev = torch_xla.device()
    net = _net().to(dev)
    opt = AdanScheduleFree(net.parameters(), lr=3e-3, weight_decay=0.02, warmup_steps=3, max_grad_norm=0.1)
    x = torch.rand(2, 3, 7, 6).to(dev)
    torch_xla.sync()

    def compiled() -> int:
        data = metrics.metric_data("CompileTime")
        return int(data[0]) if data else 0

    counts = []
    for i in range(6):  # crosses the warm-up (step 3) under a changing lr (a schedule)
        opt.param_groups[0]["lr"] = 3e-3 * (1 - i / 10)
        opt.zero_grad(set_to_none=True)
        net(x).square().mean().backward()
        opt.step()
        torch_xla.sync()
        counts.append(compiled())
    # step 1 is its own graph (ckp1 = 1, fresh state), step 2 on is one graph
    assert counts[1] <= counts[0] + 1 and counts[-1] == counts[1], f"recompiled: {counts}"
    assert not (metrics.metric_data("TransferFromDeviceTime") or [0])[0], "the step read a value on the host"
    y = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    opt.eval()
    torch_xla.sync()
    opt.train()
    torch_xla.sync()
    assert all(torch.isfinite(v).all() for v in y.values())
    fallbacks = {n for n in metrics.counter_names() if n.startswith("aten::")}
    executed = set(metrics.executed_fallback_ops())
    assert not fallbacks and not executed, f"ops fell back to the CPU: {fallbacks or executed}"
    # the same steps on the CPU give the same weights (to float rounding of a different backend)
    cpu_net = _net()
    cpu_opt = AdanScheduleFree(cpu_net.parameters(), lr=3e-3, weight_decay=0.02, warmup_steps=3, max_grad_norm=0.1)
    xc = x.cpu()
    for i in range(6):
        cpu_opt.param_groups[0]["lr"] = 3e-3 * (1 - i / 10)
        cpu_opt.zero_grad(set_to_none=True)
        cpu_net(xc).square().mean().backward()
        cpu_opt.step()
    for k, v in cpu_net.state_dict().items():
        torch.testing.assert_close(y[k], v, rtol=1e-4, atol=1e-5)

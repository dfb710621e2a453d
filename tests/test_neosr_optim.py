"""neosr's optimizers (anysr/models/neosr_optimizers.py) against neosr's classes (fixtures from
tools/fixtures/make_neosr_optim_fixtures.py): the training (and, schedule-free, averaged) weights after every step,
the final state and its keys; state-dict round trips resume bit-exactly; neosr's type names and option keys
(``schedule_free``, ``warmup_steps``) pass; bad arguments are one-line option errors naming the argument; a CLI run
resumes bit-exactly; on XLA:CPU a step compiles once and nothing falls back to the CPU or reads to the host."""

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

from anysr.cli import main
from anysr.errors import OptionError
from anysr.models.neosr_optimizers import AdamWWin, NeosrAdamWScheduleFree, NeosrAdan, NeosrAdanScheduleFree
from anysr.models.optimizers import build_optimizer, has_weight_switch
from anysr.options import load_options
from anysr.registry import OPTIMIZER_REGISTRY

FIX = Path(__file__).parent / "fixtures" / "neosr_optim"
MANIFEST = json.loads((FIX / "manifest.json").read_text())
CLASSES = {"adan_sf": NeosrAdanScheduleFree, "adamw_sf": NeosrAdamWScheduleFree, "adan": NeosrAdan,
           "adamw_win": AdamWWin}
SCHEDULE_FREE = {"adan_sf", "adamw_sf"}


def _replay(name: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], torch.optim.Optimizer]:
    """anysr's optimizer through the fixture's steps: its tensors (the fixture's names) and itself."""
    case = MANIFEST["cases"][name]
    ref = load_file(str(FIX / f"{name}.safetensors"))
    params = {k: torch.nn.Parameter(ref[f"init.{k}"].clone()) for k in MANIFEST["meta"]["shapes"]}
    groups = [{"params": [params[k] for k in g], **gk} for g, gk in zip(case["groups"], case["group_kwargs"])]
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in case["kwargs"].items()}
    opt = CLASSES[case["module"]](groups, **kwargs)
    sf = "switch" in case
    out: dict[str, torch.Tensor] = {}
    for step in range(1, case["steps"] + 1):
        grads = {k: ref[f"grad.{step}.{k}"].clone() for k in params}
        for k, p in params.items():
            p.grad = grads[k]
        opt.step()
        for k, p in params.items():  # anysr leaves the gradients as they are (neosr scales them in place)
            assert p.grad is grads[k] and torch.equal(p.grad, ref[f"grad.{step}.{k}"])
        if sf:
            y = {k: p.detach().clone() for k, p in params.items()}
            opt.eval()  # type: ignore[attr-defined]
            out.update({f"x.{step}.{k}": p.detach().clone() for k, p in params.items()})
            opt.train()  # type: ignore[attr-defined]
            if step != case["switch"]:
                with torch.no_grad():
                    for k, p in params.items():
                        p.copy_(y[k])
        out.update({f"y.{step}.{k}": p.detach().clone() for k, p in params.items()})
    names = [k for g in case["groups"] for k in g]
    for i, st in opt.state_dict()["state"].items():
        out.update({f"state.{names[i]}.{k}": v for k, v in st.items() if isinstance(v, torch.Tensor)})
    return out, ref, opt


@pytest.mark.parametrize("name", sorted(MANIFEST["cases"]))
def test_matches_neosr(name: str) -> None:
    """The same ops in the same order as neosr's: bit-identical on the CPU."""
    out, ref, opt = _replay(name)
    want = {k: v for k, v in ref.items() if not k.startswith(("init.", "grad."))}
    assert sorted(out) == sorted(want)
    for k in want:
        torch.testing.assert_close(out[k], want[k], rtol=0, atol=0, msg=lambda m, k=k: f"{name} {k}: {m}")
    case = MANIFEST["cases"][name]
    sd = opt.state_dict()
    assert sorted(sd["param_groups"][0]) == case["group_keys"]
    assert sorted(sd["state"][0]) == case["state_keys"]
    names = [k for g in case["groups"] for k in g]
    scalars = {f"{names[i]}.{k}": v for i, st in sd["state"].items() for k, v in st.items()
               if not isinstance(v, torch.Tensor)}
    assert scalars == case["state_scalars"]
    for got, exp in zip(sd["param_groups"], case["param_groups"]):
        got = {k: list(v) if isinstance(v, tuple) else v for k, v in got.items() if k != "params"}
        assert got == exp  # Python floats: the same formulas in the same order


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 1))


def _steps(net: torch.nn.Module, opt: torch.optim.Optimizer, first: int, count: int) -> None:
    for i in range(first, first + count):
        g = torch.Generator().manual_seed(i)
        opt.zero_grad(set_to_none=True)
        net(torch.rand(2, 3, 7, 6, generator=g)).square().mean().backward()
        opt.step()


RESUME = {
    "adan_sf": {"lr": 3e-3, "weight_decay": 0.02, "warmup_steps": 3, "max_grad_norm": 0.1},
    "adamw_sf": {"lr": 3e-3, "weight_decay": 0.02, "warmup_steps": 3},
    "adan": {"lr": 3e-3, "weight_decay": 0.02, "max_grad_norm": 0.1, "no_prox": False},
    "adamw_win": {"lr": 3e-3, "weight_decay": 0.02, "max_grad_norm": 0.1, "amsgrad": True},
}


@pytest.mark.parametrize("kind", sorted(RESUME))
def test_state_dict_round_trip_resumes_bit_exact(kind: str) -> None:
    cls, kw = CLASSES[kind], RESUME[kind]
    net = _net()
    opt = cls(net.parameters(), **kw)
    _steps(net, opt, 0, 3)
    buf = io.BytesIO()
    torch.save({"net": net.state_dict(), "opt": opt.state_dict()}, buf)
    _steps(net, opt, 3, 3)
    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    net2 = _net()
    net2.load_state_dict(saved["net"])
    opt2 = cls(net2.parameters(), **kw)
    opt2.load_state_dict(saved["opt"])
    _steps(net2, opt2, 3, 3)
    assert_same_weights(net.state_dict(), net2.state_dict())
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for i in a["state"]:
        for k, v in a["state"][i].items():
            assert torch.equal(v, b["state"][i][k]) if isinstance(v, torch.Tensor) else v == b["state"][i][k]


@pytest.mark.parametrize(("name", "cls"), [
    ("adan_sf", NeosrAdanScheduleFree), ("Adan_SF", NeosrAdanScheduleFree), ("adamw_sf", NeosrAdamWScheduleFree),
    ("AdamW_SF", NeosrAdamWScheduleFree), ("adamw_win", AdamWWin), ("AdamW_Win", AdamWWin), ("NeosrAdan", NeosrAdan),
])
def test_neosr_names_and_blocks(name: str, cls: type) -> None:
    """neosr's type names (either spelling neosr accepts) with a neosr block's keys as they are."""
    assert OPTIMIZER_REGISTRY.get(name) is cls
    block: dict[str, Any] = {"type": name, "lr": 1e-3}
    if cls in (NeosrAdanScheduleFree, NeosrAdamWScheduleFree):
        block.update(schedule_free=True, warmup_steps=2, weight_decay=0.01)
    else:
        block.update(schedule_free=False, weight_decay=0.01)
    if cls is not NeosrAdamWScheduleFree:
        block["betas"] = [0.98, 0.92, 0.99] if cls is not AdamWWin else [0.98, 0.999]
    net = _net()
    opt = build_optimizer(list(net.parameters()), block, "train.optim_g")
    assert isinstance(opt, cls) and has_weight_switch(opt) == (cls in (NeosrAdanScheduleFree,
                                                                        NeosrAdamWScheduleFree))
    _steps(net, opt, 0, 2)
    if has_weight_switch(opt):
        y = {k: v.clone() for k, v in net.state_dict().items()}
        opt.eval()  # type: ignore[attr-defined]
        assert any(not torch.equal(v, y[k]) for k, v in net.state_dict().items())
        with pytest.raises(RuntimeError, match="call optimizer.train"):
            opt.step()
        opt.train()  # type: ignore[attr-defined]
        for k, v in net.state_dict().items():
            torch.testing.assert_close(v, y[k], rtol=1e-6, atol=1e-7)


def test_adamw_win_takes_a_zero_lr() -> None:
    """A schedule may end at lr 0: Win's step ratios take their limit (neosr divides by the lr)."""
    for mode in ("win", "win2"):
        net = _net()
        opt = AdamWWin(net.parameters(), lr=1e-3, acceleration_mode=mode)
        _steps(net, opt, 0, 2)
        opt.param_groups[0]["lr"] = 0.0
        _steps(net, opt, 2, 1)
        assert all(torch.isfinite(p).all() for p in net.parameters())


@pytest.mark.parametrize(("kind", "arg", "value", "says"), [
    ("adan_sf", "schedule_free", False, "NeosrAdan"), ("adamw_sf", "schedule_free", False, "AdamW"),
    ("adan", "schedule_free", True, "adan_sf"), ("adamw_win", "schedule_free", True, "adamw_sf"),
    ("adan", "warmup_steps", 1000, "warmup_iter"), ("adamw_win", "warmup_steps", 10, "warmup_iter"),
    ("adan_sf", "schedule_free", "yes", "true or false"), ("adan_sf", "lr", -1.0, ">= 0"),
    ("adan_sf", "betas", [0.9, 0.99], "3 numbers"), ("adan_sf", "betas[0]", 0.0, "> 0"),
    ("adamw_sf", "betas[1]", 1.0, "< 1"), ("adamw_sf", "warmup_steps", -1, ">= 0"),
    ("adan", "max_grad_norm", -1, ">= 0"), ("adan", "no_prox", 1, "true or false"),
    ("adamw_win", "acceleration_mode", "win3", "win2"), ("adamw_win", "reckless_steps[0]", 0.0, "> 0"),
    ("adamw_win", "lr", -1.0, ">= 0"), ("adamw_win", "eps", "tiny", "finite number"),
])
def test_bad_arguments_name_the_argument(kind: str, arg: str, value: Any, says: str) -> None:
    kwargs: dict[str, Any] = {"type": CLASSES[kind].__name__}
    if "[" in arg:
        key, i = arg[:-3], int(arg[-2])
        seq = {"betas": [0.98, 0.92, 0.99] if kind.startswith("adan") else [0.9, 0.99],
               "reckless_steps": [2.0, 8.0]}[key]
        seq[i] = value
        kwargs[key] = seq
    else:
        kwargs[arg] = value
    with pytest.raises(OptionError) as info:
        build_optimizer(list(_net().parameters()), kwargs, "train.optim_g")
    text = str(info.value)
    assert text.startswith(f"train.optim_g.{arg}: ") and "\n" not in text and says in text, text


# ------------------------------------------------------------------------------------------------ a CLI run
NEOSR_BLOCK = {"type": "adan_sf", "lr": 2e-3, "betas": [0.98, 0.92, 0.99], "weight_decay": 0.01,
               "schedule_free": True, "warmup_steps": 2}


def _option_lines(tmp_path: Path, train_dir: Path, optim: dict[str, Any]) -> list[str]:
    opt = tiny_train_options("o", train_dir, None)
    opt["train"]["optim_g"] = optim
    try:
        load_options(str(write_options(tmp_path / "o.yml", opt)), is_train=True, root=str(tmp_path))
    except OptionError as exc:
        return [line.strip() for line in str(exc).splitlines() if line.strip().startswith("train.")]
    return []


def test_options_take_as_many_betas_as_the_optimizer(tmp_path: Path, small_train_dir: Path) -> None:
    """neosr's Adan blocks give three betas; Adam's two; a count that does not fit the type is named."""
    assert _option_lines(tmp_path, small_train_dir, dict(NEOSR_BLOCK)) == []
    assert _option_lines(tmp_path, small_train_dir, {"type": "adamw_win", "lr": 1e-3, "betas": [0.9, 0.99]}) == []
    assert _option_lines(tmp_path, small_train_dir, {"type": "Adam", "lr": 1e-3, "betas": [0.9, 0.99, 0.9]}) == [
        "train.optim_g.betas: Adam takes 2 betas, got 3"]
    assert _option_lines(tmp_path, small_train_dir, {**NEOSR_BLOCK, "betas": [0.9, 0.99]}) == [
        "train.optim_g.betas: NeosrAdanScheduleFree takes 3 betas, got 2"]


def test_soap_sf_is_refused_and_pytorch_optimizer_keeps_its_names(tmp_path: Path, small_train_dir: Path) -> None:
    """neosr's soap_sf (either spelling) is refused before the run with the reason; pytorch-optimizer's SOAP and
    Adan stay theirs (neosr's adan is NeosrAdan: the same update, other arguments and defaults)."""
    for name in ("soap_sf", "SOAP_SF"):
        lines = _option_lines(tmp_path, small_train_dir, {"type": name, "lr": 1e-3, "schedule_free": True,
                                                          "warmup_steps": 1600})
        assert len(lines) == 1 and lines[0].startswith("train.optim_g.type: soap_sf is not supported: neosr's "
                                                       "schedule-free SOAP is not implemented"), lines
    with pytest.raises(OptionError, match="soap_sf is not supported"):
        build_optimizer(list(_net().parameters()), {"type": "soap_sf", "lr": 1e-3}, "train.optim_g")
    pytest.importorskip("pytorch_optimizer")
    for name in ("SOAP", "Adan", "adan"):
        assert OPTIMIZER_REGISTRY.get(name).__module__.startswith("pytorch_optimizer"), name


@pytest.mark.slow
def test_cli_trains_and_resumes_bit_exact(tmp_path: Path, small_train_dir: Path, small_val_dir: Path) -> None:
    """neosr's adan_sf block as the TOML mapping passes it: straight 4 == 2, stop, resume 2 (validating at 2)."""
    def opts(name: str, total: int) -> Path:
        opt = tiny_train_options(name, small_train_dir, small_val_dir, total_iter=total)
        opt["train"].update(optim_g=dict(NEOSR_BLOCK), scheduler=None)
        opt["val"]["val_freq"] = 2
        return write_options(tmp_path / f"{name}.yml", opt)

    assert main(["train", "-opt", str(opts("straight", 4)), "--force_yml", f"path.root={tmp_path}"]) == 0
    path = opts("split", 2)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=4"]) == 0
    straight, split = tmp_path / "experiments" / "straight", tmp_path / "experiments" / "split"
    assert_same_weights(saved_weights(straight, 4), saved_weights(split, 4))


# ------------------------------------------------------------------------------------------------ XLA
XLA_KW = {
    "adan_sf": {"lr": 3e-3, "weight_decay": 0.02, "warmup_steps": 3, "max_grad_norm": 0.1},
    "adamw_sf": {"lr": 3e-3, "weight_decay": 0.02, "warmup_steps": 3},
    "adan": {"lr": 3e-3, "weight_decay": 0.02, "max_grad_norm": 0.1},
    "adamw_win": {"lr": 3e-3, "weight_decay": 0.02, "max_grad_norm": 0.1, "amsgrad": True},
}


@pytest.mark.xla
@pytest.mark.parametrize("kind", sorted(XLA_KW))
def test_xla_step_compiles_once_without_fallbacks(kind: str) -> None:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    torch_xla = pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics

    metrics.clear_all()
    dev = torch_xla.device()
    cls, kw = CLASSES[kind], XLA_KW[kind]
    net = _net().to(dev)
    opt = cls(net.parameters(), **kw)
    x = torch.rand(2, 3, 7, 6).to(dev)
    torch_xla.sync()

    def compiled() -> int:
        data = metrics.metric_data("CompileTime")
        return int(data[0]) if data else 0

    counts = []
    for i in range(6):  # crosses the warm-up (step 3) under a changing lr (a schedule)
        opt.param_groups[0]["lr"] = kw["lr"] * (1 - i / 10)
        opt.zero_grad(set_to_none=True)
        net(x).square().mean().backward()
        opt.step()
        torch_xla.sync()
        counts.append(compiled())
    # step 1 is its own graph (fresh state; schedule-free: ckp1 = 1), step 2 on is one graph
    assert counts[1] <= counts[0] + 1 and counts[-1] == counts[1], f"recompiled: {counts}"
    assert not (metrics.metric_data("TransferFromDeviceTime") or [0])[0], "the step read a value on the host"
    y = {k: v.detach().cpu() for k, v in net.state_dict().items()}
    if has_weight_switch(opt):
        opt.eval()  # type: ignore[attr-defined]
        torch_xla.sync()
        opt.train()  # type: ignore[attr-defined]
        torch_xla.sync()
    fallbacks = {n for n in metrics.counter_names() if n.startswith("aten::")}
    executed = set(metrics.executed_fallback_ops())
    assert not fallbacks and not executed, f"ops fell back to the CPU: {fallbacks or executed}"
    cpu_net = _net()
    cpu_opt = cls(cpu_net.parameters(), **kw)
    xc = x.cpu()
    for i in range(6):
        cpu_opt.param_groups[0]["lr"] = kw["lr"] * (1 - i / 10)
        cpu_opt.zero_grad(set_to_none=True)
        cpu_net(xc).square().mean().backward()
        cpu_opt.step()
    for k, v in cpu_net.state_dict().items():
        torch.testing.assert_close(y[k], v, rtol=1e-4, atol=1e-5)

"""neosr's sharpness-aware minimisation (``train.sam: fsam``, ``train.sam_init``) in anysr's SR / GAN models.

The perturbation and the update are checked against neosr's ``fsam`` optimizer (tests/fixtures/
make_neosr_sam_fixtures.py: a tiny network, 3 steps over AdamW and over SGD with momentum, driven as neosr's image
model drives it); training runs through the command line (SRModel and SRGANModel, SAM from iteration 2), an exact
resume across ``sam_init`` (the momentum is in the training state), the refusals, and XLA:CPU's graphs (``-m xla``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from conftest import saved_weights, tiny_train_options, write_options
from safetensors.torch import load_file

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.cli import main
from anysr.engine import checkpoint as ckpt
from anysr.errors import OptionError
from anysr.models import build_model
from anysr.models.sam import FriendlySAM
from anysr.options import load_options

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "neosr_sam"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = [k for k in MANIFEST if not k.startswith("_")]
NAMES = ("conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "unused")


def _forward(p: dict[str, torch.Tensor], lq: torch.Tensor) -> torch.Tensor:
    x = F.leaky_relu(F.conv2d(lq, p["conv1.weight"], p["conv1.bias"], padding=1), 0.2)
    return F.conv2d(x, p["conv2.weight"], p["conv2.bias"], padding=1) + lq


@pytest.mark.parametrize("case", CASES)
def test_fsam_matches_neosr(case: str) -> None:
    """Weights after each of 3 FSAM steps (the first sets the momentum, the next two subtract it) and the final
    momentum equal neosr's to float32 rounding (rtol 1e-6, atol 1e-7); the parameter without a gradient stays."""
    t, spec = load_file(str(FIXTURES / f"{case}.safetensors")), MANIFEST[case]
    params = {k: torch.nn.Parameter(t[f"init.{k}"].clone()) for k in NAMES}
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in spec["kwargs"].items()}
    opt = getattr(torch.optim, spec["optimizer"])(list(params.values()), **kwargs)
    sam = FriendlySAM(list(params.values()), rho=spec["rho"], sigma=spec["sigma"], lmbda=spec["lmbda"],
                      adaptive=spec["adaptive"])

    def backward() -> torch.Tensor:
        out = _forward(params, t["lq"])
        loss = F.l1_loss(out, t["gt"]) + 0.5 * F.mse_loss(out, t["gt"])
        loss.backward()
        return loss.detach()

    for step in range(1, spec["steps"] + 1):
        opt.zero_grad(set_to_none=True)
        torch.testing.assert_close(backward(), t[f"loss.{step}"], rtol=1e-6, atol=1e-7)
        sam.perturb()
        opt.zero_grad(set_to_none=True)
        backward()
        sam.restore()
        opt.step()
        for k, p in params.items():
            torch.testing.assert_close(p.detach(), t[f"w.{step}.{k}"], rtol=1e-6, atol=1e-7, msg=f"{step} {k}")
    for k, m in zip(NAMES, sam.momentum):
        if k == "unused":
            assert m is None
        else:
            torch.testing.assert_close(m, t[f"momentum.{k}"], rtol=1e-6, atol=1e-7)


def test_restore_is_bit_exact_and_state_round_trips() -> None:
    g = torch.Generator().manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(3, 4, generator=g)), torch.nn.Parameter(torch.randn(5, generator=g))]
    before = [p.detach().clone() for p in ps]
    sam = FriendlySAM(ps)
    for p in ps:
        p.grad = torch.randn(p.shape, generator=g)
    sam.perturb()
    assert not torch.equal(ps[0].detach(), before[0])
    sam.restore()
    assert all(torch.equal(p.detach(), b) for p, b in zip(ps, before))
    other = FriendlySAM(ps)
    other.load_state_dict(sam.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(other.momentum, sam.momentum))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="momentum buffers"):
        FriendlySAM(ps[:1]).load_state_dict(sam.state_dict())


# ----------------------------------------------------------------------------- in the models

def _options(name: str, train_dir: Path, total_iter: int = 4, gan: bool = False, **train: Any) -> dict[str, Any]:
    opt = tiny_train_options(name, train_dir, None, total_iter=total_iter)
    t = opt["train"]
    del t["pixel_opt"]
    t["losses"] = [{"type": "L1Loss", "loss_weight": 1.0}]
    if gan:
        opt["model_type"] = "SRGANModel"
        opt["network_d"] = {"type": "VGGStyleDiscriminator", "num_in_ch": 3, "num_feat": 4, "input_size": 32}
        t["ema_decay"] = 0
        t["optim_d"] = {"type": "Adam", "lr": 1e-3, "betas": [0.9, 0.99]}
        t["losses"].append({"type": "GANLoss", "gan_type": "vanilla", "loss_weight": 0.005})
    t.update({"sam": "fsam", "sam_init": 2, "grad_clip_norm": 0.5, **train})
    return opt


def _model(opt: dict[str, Any], tmp_path: Path) -> Any:
    path = write_options(tmp_path / f"{opt['name']}.yml", opt)
    options = load_options(str(path), is_train=True, root=str(tmp_path))
    model = build_model(options, create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False)))
    ckpt.load_model_weights(model, fresh=True, stand_ins=True)
    model.setup()
    return model


@pytest.mark.parametrize("gan", [False, True])
def test_sam_runs_from_sam_init_without_clipping(tmp_path: Path, small_train_dir: Path, gan: bool) -> None:
    """Before sam_init: one generator backward, both networks clipped; from it on: two, the weights perturbed
    during the second only, and no clipping of either network (neosr's)."""
    opt = _options("steps", small_train_dir, gan=gan, **({"grad_clip_norm_d": 0.25} if gan else {}))
    model = _model(opt, tmp_path)
    calls: list[tuple[str, float | None]] = []
    step, perturb = model.acc.optimizer_step, model.fsam.perturb

    def spy(o: Any, clip: float | None = None, *args: Any) -> Any:
        calls.append(("d" if o is model.optimizers.get("net_d") else "g", clip))
        return step(o, clip, *args)

    def spy_perturb() -> None:
        calls.append(("perturb", None))
        perturb()

    model.acc.optimizer_step, model.fsam.perturb = spy, spy_perturb
    g = torch.Generator().manual_seed(1)
    batch = {"lq": torch.rand(2, 3, 16, 16, generator=g), "gt": torch.rand(2, 3, 32, 32, generator=g)}
    d, d_sam = ([("d", 0.25)], [("d", None)]) if gan else ([], [])
    for it, want in ((1, [("g", 0.5), *d]), (2, [("perturb", None), ("g", None), *d_sam]),
                     (3, [("perturb", None), ("g", None), *d_sam])):
        calls.clear()
        model.update_learning_rate(it)
        losses = model.train_step([batch])
        assert calls == want, (it, calls)
        assert all(torch.isfinite(v) for v in losses.values())
    assert all(m is not None for m in model.fsam.momentum)
    assert set(model.state_dict()["sam"]) == {"momentum"}


def _state(exp: Path, it: int) -> dict[str, Any]:
    return torch.load(exp / "training_states" / f"{it}.state", weights_only=True)["model"]


def test_resume_across_sam_init_is_bit_exact(tmp_path: Path, small_train_dir: Path) -> None:
    """Through the command line, SRGANModel: 4 straight == 2, stop, resume, 2 more (SAM from iteration 2: the
    resumed run needs the saved momentum); the weights differ from a run without SAM."""
    for name, total in (("straight", 4), ("split", 2)):
        path = write_options(tmp_path / f"{name}.yml", _options(name, small_train_dir, total, gan=True))
        assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(tmp_path / "split.yml"), "--auto_resume", "--force_yml",
                 f"path.root={tmp_path}", "train.total_iter=4"]) == 0
    plain = write_options(tmp_path / "plain.yml", _options("plain", small_train_dir, 4, gan=True, sam=None))
    assert main(["train", "-opt", str(plain), "--force_yml", f"path.root={tmp_path}"]) == 0
    sa, sb = _state(tmp_path / "experiments" / "straight", 4), _state(tmp_path / "experiments" / "split", 4)
    assert "sam" in _state(tmp_path / "experiments" / "split", 2)
    assert "sam" not in _state(tmp_path / "experiments" / "plain", 4)
    for net in ("net_g", "net_d"):
        assert sa["nets"][net].keys() == sb["nets"][net].keys()
        for k, v in sa["nets"][net].items():
            assert torch.equal(v, sb["nets"][net][k]), f"{net}.{k}"
    for a, b in zip(sa["sam"]["momentum"], sb["sam"]["momentum"]):
        assert torch.equal(a, b)
    w, p = saved_weights(tmp_path / "experiments" / "straight", 4), saved_weights(tmp_path / "experiments" / "plain", 4)
    assert any(not torch.equal(w[k], p[k]) for k in w)


@pytest.mark.parametrize(("model_type", "train", "message"), [
    ("SRModel", {"accumulate": 2}, "train.sam: FSAM does not work with gradient accumulation"),
    ("VideoRecurrentModel", {}, "train.sam: model_type VideoRecurrentModel does not run sharpness-aware steps"),
    ("SRModel", {"sam": "asam"}, "train.sam: expected"),
])
def test_impossible_combinations_are_refused(tmp_path: Path, small_train_dir: Path, model_type: str,
                                             train: dict[str, Any], message: str) -> None:
    opt = _options("bad", small_train_dir, **train)
    opt["model_type"] = model_type
    path = write_options(tmp_path / "bad.yml", opt)
    with pytest.raises(OptionError, match=message):
        load_options(str(path), is_train=True, root=str(tmp_path))


# ----------------------------------------------------------------------------- XLA:CPU

@pytest.mark.xla
def test_xla_sam_step_compiles_a_fixed_set_without_fallback_or_transfer(tmp_path: Path,
                                                                        small_train_dir: Path) -> None:
    """SRGANModel steps on XLA:CPU with SAM from iteration 3: the plain steps' graphs, one more set at the switch
    (and the momentum's first update), none after; no aten fallback; no device-to-host transfer in the steps."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    pytest.importorskip("torch_xla")
    from torch_xla.debug import metrics

    from anysr.accelerators.launcher import LaunchPlan

    opt = _options("xla", small_train_dir, 8, gan=True, sam_init=3)
    path = write_options(tmp_path / "xla.yml", opt)
    options = load_options(str(path), is_train=True, root=str(tmp_path))
    acc = create_accelerator(LaunchPlan("xla", 1, "xla", "fp32", extra={"pjrt_device": "CPU", "all_devices": False}))
    acc.setup()
    acc.manual_seed(0)
    model = build_model(options, acc)
    ckpt.load_model_weights(model, fresh=True, stand_ins=True)
    model.setup()
    g = torch.Generator().manual_seed(3)
    batches = [{"lq": torch.rand(2, 3, 16, 16, generator=g).to(acc.device),
                "gt": torch.rand(2, 3, 32, 32, generator=g).to(acc.device)} for _ in range(7)]
    acc.mark_step()
    metrics.clear_all()
    compiles, transfers = [], []
    for it, batch in enumerate(batches, 1):
        model.update_learning_rate(it)
        losses = model.train_step([batch])
        acc.mark_step()
        stats = acc.stats()
        compiles.append(stats.get("compiles", 0))
        transfers.append(stats.get("host_transfers", 0))
    assert transfers[-1] == 0, f"device-to-host transfers in the steps: {transfers}"
    values = {k: float(v.cpu()) for k, v in losses.items()}
    assert all(v == v for v in values.values()), values
    fallbacks = [n for n in metrics.counter_names() if n.startswith("aten::")]
    assert not fallbacks, fallbacks
    # measured: [1, 2, 3, 4, 4, 4, 4] (step 2: the optimizers' state becomes device data; step 3: SAM's first step,
    # which sets the momentum; step 4: SAM's steady step, which updates it)
    assert compiles[2] == compiles[1] + 1 and compiles[3] == compiles[2] + 1, f"SAM's two step graphs: {compiles}"
    assert len(set(compiles[3:])) == 1, f"graphs compiled after the SAM warm-up: {compiles}"

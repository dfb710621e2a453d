"""The torchax backend's jitted training step against CPU torch eager, in one process (run in the JAX venv:
``.ci/jax.sh``, which sets ``XLA_FLAGS=--xla_force_host_platform_device_count=2``).

Two SRModels from one option file, one on the CPU accelerator and one on torchax (matmul precision ``highest``), start
from the same weights and train on the same batches; after N steps their weights, Adam / AdamW state (torch's layout)
and EMA agree to fp32 tolerance. One device and two virtual devices (the batch sharded) agree too; the compile count
stays flat while the learning rate changes.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
pytest.importorskip("torchax")

import torch  # noqa: E402
from conftest import tiny_train_options, write_options  # noqa: E402

from anysr.accelerators import create_accelerator, resolve_plan  # noqa: E402
from anysr.engine import checkpoint as ckpt  # noqa: E402
from anysr.errors import AcceleratorError  # noqa: E402
from anysr.models import build_model  # noqa: E402
from anysr.options.loader import load_options  # noqa: E402

pytestmark = pytest.mark.jax

STEPS = 6
TOL = 2e-5  # fp32: XLA's convolutions and reductions sum in another order than oneDNN's


def _options(tmp_path: Path, train_dir: Path, optim: dict[str, Any], **train: Any) -> Path:
    opt = tiny_train_options("jit", train_dir, None, total_iter=STEPS)
    opt["train"]["optim_g"] = optim
    opt["train"]["scheduler"]["milestones"] = [3]  # the rate halves mid-run: an input, never a recompile
    opt["train"].update(train)
    opt["xla"] = {"backend": "torchax", "matmul_precision": "highest"}
    return write_options(tmp_path / "jit.yml", opt)


def _model(path: Path, tmp_path: Path, accelerator: str, num_gpu: Any = 1) -> Any:
    options = load_options(str(path), is_train=True, root=str(tmp_path))
    acc = create_accelerator(resolve_plan(accelerator, num_gpu, precision="fp32", channels_last=False,
                                          xla_backend="torchax", matmul_precision="highest"))
    acc.setup()
    acc.manual_seed(7)
    model = build_model(options, acc)
    ckpt.load_model_weights(model, fresh=True, stand_ins=True)
    model.setup()
    return model


def _batches(step: int, micro: int = 1) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + step)
    return [{"lq": torch.rand(4, 3, 16, 16, generator=g), "gt": torch.rand(4, 3, 32, 32, generator=g)}
            for _ in range(micro)]


def _train(model: Any, steps: int = STEPS, micro: int = 1) -> list[dict[str, float]]:
    losses = []
    for it in range(1, steps + 1):
        model.update_learning_rate(it)
        losses.append({k: float(v) for k, v in model.train_step(_batches(it, micro)).items()})
    return losses


def _assert_states_close(a: dict[str, Any], b: dict[str, Any]) -> None:
    for k, v in a["nets"]["net_g"].items():
        assert torch.allclose(v, b["nets"]["net_g"][k], atol=TOL, rtol=TOL), k
    for k, v in a["emas"]["net_g"]["params"].items():
        assert torch.allclose(v, b["emas"]["net_g"]["params"][k], atol=TOL, rtol=TOL), k
    assert a["emas"]["net_g"]["updates"] == b["emas"]["net_g"]["updates"]
    sa, sb = a["optimizers"]["net_g"]["state"], b["optimizers"]["net_g"]["state"]
    assert sa.keys() == sb.keys()
    for i in sa:
        assert float(sa[i]["step"]) == float(sb[i]["step"]) == STEPS
        for key in ("exp_avg", "exp_avg_sq"):
            assert sa[i][key].shape == sb[i][key].shape and sa[i][key].dtype == sb[i][key].dtype
            assert torch.allclose(sa[i][key], sb[i][key], atol=TOL, rtol=1e-4), (i, key)
    assert a["optimizers"]["net_g"]["param_groups"] == b["optimizers"]["net_g"]["param_groups"]


@pytest.mark.parametrize("optim,train", [
    ({"type": "Adam", "lr": 2e-3, "betas": [0.9, 0.99], "weight_decay": 1e-2}, {"grad_clip_norm": 0.05}),  # L2
    ({"type": "AdamW", "lr": 2e-3, "betas": [0.9, 0.99], "weight_decay": 5e-2}, {}),  # decoupled
    ({"type": "Adam", "lr": 1e-3, "betas": [0.9, 0.99]}, {"pixel_opt": {"type": "CharbonnierLoss",
                                                                         "loss_weight": 1.0, "eps": 1e-3}}),
    ({"type": "Adam", "lr": 1e-3, "betas": [0.9, 0.99]}, {"pixel_opt": {"type": "MSELoss", "loss_weight": 0.5}}),
    ({"type": "Adam", "lr": 1e-3, "betas": [0.9, 0.99]}, {"accumulate": 2}),  # two micro-batches per step
], ids=["adam-l2-clip", "adamw", "charbonnier", "mse", "accumulate"])
def test_jitted_step_matches_cpu_eager(tmp_path: Path, small_train_dir: Path, optim: dict[str, Any],
                                       train: dict[str, Any]) -> None:
    micro = int(train.pop("accumulate", 1))
    path = _options(tmp_path, small_train_dir, optim, **train)
    cpu = _model(path, tmp_path, "cpu")
    jit = _model(path, tmp_path, "xla")
    for k, v in cpu.bare("net_g").state_dict().items():  # the same seed: the same starting weights
        assert torch.equal(v, jit.bare("net_g").state_dict()[k]), k
    cpu_losses, jit_losses = _train(cpu, micro=micro), _train(jit, micro=micro)
    for a, b in zip(cpu_losses, jit_losses):
        assert a.keys() == b.keys()
        assert all(abs(a[k] - b[k]) <= 1e-4 * max(1.0, abs(a[k])) for k in a), (a, b)
    _assert_states_close(cpu.state_dict(), jit.state_dict())
    stats = jit.acc.stats()
    assert stats["compiles"] >= 1 and stats["persistent_cache"]["dir"]


def test_compile_count_flat_and_lr_is_an_input(tmp_path: Path, small_train_dir: Path) -> None:
    path = _options(tmp_path, small_train_dir, {"type": "Adam", "lr": 2e-3, "betas": [0.9, 0.99]})
    model = _model(path, tmp_path, "xla")
    _train(model, 1)
    model.acc.mark_warmup_done()
    before = model.acc.stats()["compiles"]
    lrs = []
    for it in range(2, 7):  # the warm-up's last step and the MultiStepLR milestone at 3 change the rate
        model.update_learning_rate(it)
        lrs.append(model.current_lr())
        model.train_step(_batches(it))
        model.state_dict()  # writing the state back to the torch objects compiles nothing either
    assert len(set(lrs)) >= 2
    assert model.acc.stats()["compiles"] == before
    assert model.acc.stats()["compiles_after_warmup"] == 0 and model.acc.check_recompiles() is None


def test_two_virtual_devices_equal_one(tmp_path: Path, small_train_dir: Path) -> None:
    import jax  # noqa: PLC0415 - only to count the virtual devices

    assert len(jax.local_devices()) >= 2, "run with XLA_FLAGS=--xla_force_host_platform_device_count=2"
    path = _options(tmp_path, small_train_dir, {"type": "Adam", "lr": 2e-3, "betas": [0.9, 0.99]})
    one = _model(path, tmp_path, "xla", 1)
    many = _model(path, tmp_path, "xla", "auto")
    assert one.acc.batch_multiplier == 1 and many.acc.batch_multiplier == len(jax.local_devices())
    _train(one)
    _train(many)
    _assert_states_close(one.state_dict(), many.state_dict())


def test_state_loaded_between_steps_is_picked_up(tmp_path: Path, small_train_dir: Path) -> None:
    """Drop-path draws from the step's JAX key: a state (and key) loaded into the torch objects between steps
    (resume, NaN rollback) replaces the step's JAX copy and repeats the same steps exactly; another key draws
    otherwise."""
    opt = tiny_train_options("jit", small_train_dir, None, total_iter=STEPS)
    opt["network_g"] = {"type": "SwinIR", "upscale": 2, "in_chans": 3, "img_size": 16, "window_size": 4,
                        "img_range": 1.0, "depths": [2], "embed_dim": 12, "num_heads": [2], "mlp_ratio": 2,
                        "drop_path_rate": 0.5, "upsampler": "pixelshuffledirect", "resi_connection": "1conv"}
    # (two blocks: the rates rise from 0 over the blocks, so one block alone would drop nothing)
    opt["xla"] = {"backend": "torchax", "matmul_precision": "highest"}
    path = write_options(tmp_path / "swin.yml", opt)
    model = _model(path, tmp_path, "xla")
    _train(model, 2)
    saved = torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t,
                                         model.state_dict())
    key = model.acc.device_rng_state().clone()
    first = [float(model.train_step(_batches(3))["l_pix"]) for _ in range(2)]
    model.load_state_dict(saved)
    model.acc.set_device_rng_state(key)
    second = [float(model.train_step(_batches(3))["l_pix"]) for _ in range(2)]
    assert first == second
    model.load_state_dict(saved)
    model.acc.set_device_rng_state(key + 1)
    other = [float(model.train_step(_batches(3))["l_pix"]) for _ in range(2)]
    assert other != first  # the drop-path draws come from the key


def test_bf16_step_keeps_fp32_state(tmp_path: Path, small_train_dir: Path) -> None:
    """precision bf16 (a TPU's auto; emulated on JAX's CPU): the forward in bf16, the weights, Adam state and
    losses in fp32, close to the fp32 step."""
    path = _options(tmp_path, small_train_dir, {"type": "Adam", "lr": 1e-3, "betas": [0.9, 0.99]})
    options = load_options(str(path), is_train=True, root=str(tmp_path))
    acc = create_accelerator(resolve_plan("xla", 1, precision="bf16", xla_backend="torchax"))
    acc.setup()
    acc.manual_seed(7)
    model = build_model(options, acc)
    ckpt.load_model_weights(model, fresh=True, stand_ins=True)
    model.setup()
    assert acc.precision.name == "bf16"
    losses = _train(model, 2)
    assert all(torch.isfinite(torch.tensor(v["l_pix"])) for v in losses)
    state = model.state_dict()
    assert all(v.dtype == torch.float32 for v in state["nets"]["net_g"].values())
    assert all(s["exp_avg"].dtype == torch.float32 for s in state["optimizers"]["net_g"]["state"].values())
    fp32 = _model(path, tmp_path, "xla")
    ref = _train(fp32, 2)
    assert abs(ref[0]["l_pix"] - losses[0]["l_pix"]) <= 2e-2 * abs(ref[0]["l_pix"])  # bf16 keeps ~3 digits


def test_unsupported_optimizer_is_one_clear_line(tmp_path: Path, small_train_dir: Path) -> None:
    path = _options(tmp_path, small_train_dir, {"type": "SGD", "lr": 1e-2})
    model = _model(path, tmp_path, "xla")
    with pytest.raises(AcceleratorError, match="train.optim_g: SGD is not in torchax's jitted step"):
        model.train_step(_batches(1))


def test_validation_forward_is_jitted_and_matches_cpu(tmp_path: Path, small_train_dir: Path) -> None:
    """Validation / test / infer run the network through the backend's jitted forward (fixed-size tiles: one
    compile), with the trained weights, and agree with CPU torch."""
    from anysr.engine.evaluation.forward import run_network  # noqa: PLC0415 - the engine's one image forward

    path = _options(tmp_path, small_train_dir, {"type": "Adam", "lr": 2e-3, "betas": [0.9, 0.99]})
    cpu = _model(path, tmp_path, "cpu")
    jit = _model(path, tmp_path, "xla")
    _train(cpu, 2)
    _train(jit, 2)
    x = torch.rand(1, 3, 37, 29, generator=torch.Generator().manual_seed(3))
    a = run_network(cpu.inference_net(), x, cpu.acc, scale=2, tile=16, tile_pad=4)
    before = jit.acc.stats()["compiles"]
    b = run_network(jit.inference_net(), x, jit.acc, scale=2, tile=16, tile_pad=4)
    assert jit.acc.stats()["compiles"] - before == 1  # every tile the same shape
    assert b.shape == a.shape == (1, 3, 74, 58)
    assert torch.allclose(a, b, atol=TOL, rtol=TOL)
    c = run_network(jit.inference_net(), x, jit.acc, scale=2, tile=16, tile_pad=4)
    assert torch.equal(b, c) and jit.acc.stats()["compiles"] - before == 1  # cached: no new compile

"""The XLA accelerator on XLA:CPU (run in the XLA venv: PJRT_DEVICE=CPU python -m pytest -m xla tests).

Single-device tests run in this process; SPMD and the all-devices launch run in subprocesses, because
``use_spmd`` and ``torch_xla.launch`` must come before the XLA runtime starts in a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
torch_xla = pytest.importorskip("torch_xla")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from anysr.accelerators.base import LaunchPlan  # noqa: E402
from anysr.accelerators.launcher import create_accelerator, launch  # noqa: E402
from anysr.accelerators.xla_plan import xla_plan  # noqa: E402
from anysr.errors import AcceleratorError  # noqa: E402

pytestmark = pytest.mark.xla

ROOT = Path(__file__).resolve().parents[1]
SCALE = 2


# ---------------------------------------------------------------------------------------------- helpers
class TinySR(nn.Module):
    """conv - relu - conv - pixel shuffle: the smallest net shaped like an SR model."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Conv2d(3, 8, 3, padding=1)
        self.tail = nn.Conv2d(8, 3 * SCALE * SCALE, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pixel_shuffle(self.tail(F.relu(self.body(x))), SCALE)


def make_batches(n: int, batch: int = 4, size: int = 8, seed: int = 1) -> list[dict[str, Any]]:
    """Fixed CPU batches (lq, gt, a non-tensor path list), the same in every process."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        gt = torch.rand(batch, 3, size * SCALE, size * SCALE, generator=g)
        lq = F.avg_pool2d(gt, SCALE)
        out.append({"lq": lq, "gt": gt, "lq_path": [f"img{i}_{j}.png" for j in range(batch)]})
    return out


def train(acc: Any, steps: int = 6, read_loss_at: int | None = None) -> dict[str, Any]:
    """A few training steps through the accelerator API only; returns weights and per-step counters."""
    acc.manual_seed(0)
    net = acc.prepare_model(TinySR())
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    loss_sum = torch.zeros((), device=acc.device)
    compiles, transfers, read = [], [], None
    for i, batch in enumerate(acc.prepare_loader(make_batches(steps))):
        assert batch["lq"].device.type == acc.device.type
        assert batch["lq_path"][0] == f"img{i}_0.png"
        with acc.precision.autocast():
            loss = F.l1_loss(net(batch["lq"]).float(), batch["gt"])
        opt.zero_grad(set_to_none=True)
        acc.precision.backward(loss)
        acc.optimizer_step(opt, clip_grad_norm=10.0)
        loss_sum += loss.detach()
        acc.mark_step()
        if read_loss_at == i:
            read = float(acc.to_host(loss_sum))
        stats = acc.stats()
        compiles.append(stats["compiles"] if "compiles" in stats else 0)
        transfers.append(stats["host_transfers"])
    weights = acc.to_host({k: v for k, v in acc.strategy.unwrap(net).state_dict().items()})
    return {"weights": weights, "compiles": compiles, "transfers": transfers, "read": read,
            "loss_sum": float(acc.to_host(loss_sum)), "stats": acc.stats()}


def _plan(precision: str = "fp32") -> LaunchPlan:
    return LaunchPlan("xla", 1, "xla", precision, extra={"pjrt_device": "CPU", "all_devices": False})


@pytest.fixture(scope="module")
def acc() -> Any:
    """One XLA:CPU device in this process (torch_xla.launch's single-process path is tested separately)."""
    a = create_accelerator(_plan())
    a.setup()
    return a


def _run_script(mode: str, out: Path, devices: int, timeout: int = 240) -> dict[str, Any]:
    """Run this file as a script in a fresh process (its own XLA runtime) and read its JSON result."""
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("XLA_USE_SPMD", None)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), mode, str(out)], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


def _save_result(out: Path, result: dict[str, Any]) -> None:
    torch.save(result.pop("weights"), out / "weights.pt")
    (out / "result.json").write_text(json.dumps(result))


def _script_train(acc: Any, out: str) -> None:
    result = train(acc)
    result["world"] = [acc.rank, acc.world_size, acc.batch_multiplier, acc.strategy.data_parallel_size]
    result["describe"] = acc.describe()
    _save_result(Path(out), result)


def _load_weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path / "weights.pt", weights_only=True)


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=0), (k, (a[k] - b[k]).abs().max().item())


# ---------------------------------------------------------------------------------------------- plan
def test_plan_single_and_all(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)
    monkeypatch.delenv("TPU_WORKER_HOSTNAMES", raising=False)
    one = xla_plan(1, precision="bf16", spmd=False, compile=False)
    assert (one.accelerator, one.launcher, one.nprocs, one.precision) == ("xla", "xla", 1, "bf16")
    assert one.extra["all_devices"] is False
    every = xla_plan(None, precision="fp32", spmd=False, compile=False)
    assert every.launcher == "xla" and every.extra["all_devices"] is True
    spmd = xla_plan(None, precision="fp32", spmd=True, compile=False)
    assert (spmd.launcher, spmd.spmd, spmd.nprocs) == ("none", True, 1)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"count": 2}, ["num_gpu: 2", "TPU_VISIBLE_CHIPS", "TPU_PROCESS_BOUNDS", "auto", "1"]),
    ({"count": 3, "spmd": True}, ["num_gpu: 3", "TPU_VISIBLE_CHIPS"]),
    ({"precision": "fp16"}, ["train.precision", "bf16"]),
    ({"compile": True}, ["train.compile", "false"]),
    ({"count": 1, "spmd": True}, ["num_gpu: 1", "xla.spmd: true", "auto"]),
])
def test_plan_errors(kwargs: dict[str, Any], words: list[str]) -> None:
    args = {"count": None, "precision": "fp32", "spmd": False, "compile": False, **kwargs}
    count = args.pop("count")
    with pytest.raises(AcceleratorError) as info:
        xla_plan(count, **args)
    for word in words:
        assert word in str(info.value)


def test_plan_cpu_devices_need_spmd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.setenv("CPU_NUM_DEVICES", "2")
    with pytest.raises(AcceleratorError, match="CPU_NUM_DEVICES=2.*spmd: true"):
        xla_plan(None, precision="fp32", spmd=False, compile=False)
    assert xla_plan(None, precision="fp32", spmd=True, compile=False).spmd


def test_plan_pod(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t1k-w-0,t1k-w-1")
    monkeypatch.setenv("TPU_WORKER_ID", "1")
    monkeypatch.setenv("TPU_VISIBLE_CHIPS", "0,1,2,3")
    plan = xla_plan(None, precision="bf16", spmd=False, compile=False)
    assert (plan.launcher, plan.nprocs, plan.extra["hosts"], plan.extra["worker_id"]) == ("xla", 4, 2, 1)
    with pytest.raises(AcceleratorError, match="num_gpu: 1 on a TPU slice of 2 hosts"):
        xla_plan(1, precision="bf16", spmd=False, compile=False)
    with pytest.raises(AcceleratorError, match="xla.spmd: true on a TPU slice of 2 hosts"):
        xla_plan(None, precision="bf16", spmd=True, compile=False)


# ---------------------------------------------------------------------------------------------- one device
def _launched(acc: Any, tag: str) -> tuple[str, int, int, str]:
    return tag, acc.rank, acc.world_size, str(acc.device)


def test_launch_single_device_in_process(acc: Any) -> None:
    del acc  # the runtime already exists here; torch_xla's one-device path runs in this process anyway
    result = launch(xla_plan(1, precision="fp32", spmd=False, compile=False), _launched, "hello")
    assert result == ("hello", 0, 1, "xla:0")


def test_training_compiles_once_and_stays_on_device(acc: Any) -> None:
    result = train(acc, steps=7, read_loss_at=5)
    compiles, transfers = result["compiles"], result["transfers"]
    assert compiles[2] == compiles[-1], f"graphs compiled after step 2: {compiles}"
    # no device-to-host transfer in steps that do not read the loss; exactly one where it is read
    assert transfers[:5] == [transfers[0]] * 5, transfers
    assert transfers[5] == transfers[4] + 1 and transfers[6] == transfers[5], transfers
    assert np.isfinite(result["read"]) and result["read"] > 0
    assert all(not k.startswith("aten::_local") for k in result["stats"]["cpu_fallbacks"])
    assert all(v.device.type == "cpu" for v in result["weights"].values())


def test_matches_eager_cpu(acc: Any) -> None:
    xla = train(acc)
    cpu = create_accelerator(LaunchPlan("cpu", precision="fp32", channels_last=False))  # as the XLA plan: fp32, NCHW
    cpu.setup()
    eager = train(cpu)
    _assert_close(xla["weights"], eager["weights"], atol=1e-4)


def test_bf16_autocast(acc: Any) -> None:
    bf = create_accelerator(_plan("bf16"))
    bf.setup()
    x = torch.rand(1, 3, 8, 8).to(bf.device)
    with bf.precision.autocast():
        y = nn.functional.conv2d(x, torch.rand(4, 3, 3, 3).to(bf.device))
    assert y.dtype == torch.bfloat16
    with acc.precision.autocast():
        assert nn.functional.conv2d(x, torch.rand(4, 3, 3, 3).to(bf.device)).dtype == torch.float32
    result = train(bf, steps=3)
    assert np.isfinite(result["loss_sum"])


def test_rng_state_round_trip(acc: Any, tmp_path: Path) -> None:
    acc.manual_seed(7)
    state = acc.rng_state()
    torch.save(state, tmp_path / "rng.pt")

    def draw() -> tuple[Any, ...]:
        dev = torch.rand(4, device=acc.device)
        return (torch.rand(3), np.random.rand(2), __import__("random").random(), acc.to_host(dev))

    first = draw()
    acc.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    second = draw()
    assert torch.equal(first[0], second[0]) and np.array_equal(first[1], second[1])
    assert first[2] == second[2] and torch.equal(first[3], second[3])
    acc.manual_seed(7)
    assert torch.equal(torch.rand(4, device=acc.device).cpu(), first[3])


def test_save_is_a_collective(acc: Any) -> None:
    net = TinySR().to(acc.device)
    calls: list[str] = []
    written: list[Any] = []

    def state_fn() -> dict[str, Any]:
        calls.append("state")
        return {"params": net.state_dict(), "iter": 3, "extra": (torch.ones(2, device=acc.device), "x")}

    before = acc.stats()["host_transfers"]
    acc.save(state_fn, written.append)
    assert calls == ["state"] and len(written) == 1
    state = written[0]
    assert state["iter"] == 3 and state["extra"][1] == "x"
    assert all(t.device.type == "cpu" for t in state["params"].values())
    assert state["extra"][0].device.type == "cpu"
    assert acc.stats()["host_transfers"] == before + 1  # one batched transfer for the whole state

    def broken(state: Any) -> None:
        raise OSError("disk full: /tmp/x.pth")

    with pytest.raises(OSError, match="disk full"):
        acc.save(state_fn, broken)


def test_recompile_warning(acc: Any) -> None:
    net = TinySR().to(acc.device)
    outputs = []

    def run(size: int) -> None:
        with torch.no_grad():
            outputs.append(net(torch.rand(1, 3, size, size).to(acc.device)))  # kept alive: it is computed
        acc.mark_step()

    run(8)
    acc.mark_warmup_done()
    assert acc.check_recompiles() is None
    run(8)  # same shape: the cached graph
    assert acc.check_recompiles() is None
    run(9)  # a new shape: one new graph
    text = acc.check_recompiles()
    assert text is not None and "1 new graph" in text and "PT_XLA_DEBUG_LEVEL=2" in text
    assert acc.check_recompiles() is None  # said once


def test_collectives_single_rank(acc: Any) -> None:
    t = torch.tensor([1.0, 2.0], device=acc.device)
    assert acc.strategy.all_reduce(t, "mean") is t
    assert acc.strategy.broadcast_object({"a": 1}) == {"a": 1}
    assert acc.strategy.all_gather_object(5) == [5]
    acc.strategy.barrier()
    assert acc.compile_model(net := TinySR()) is net
    with pytest.raises(AcceleratorError, match="op 'avg'"):
        acc.strategy.all_reduce(t, "avg")


def test_device_before_setup_and_fp16() -> None:
    with pytest.raises(AcceleratorError, match="setup()"):
        _ = create_accelerator(_plan()).device
    with pytest.raises(AcceleratorError, match="train.precision: fp16 is not supported on XLA .*set train.precision: "
                                                "bf16 or fp32"):
        xla_plan(1, precision="fp16", spmd=False, compile=False)  # refused once, when the plan is made


# ---------------------------------------------------------------------------------------------- subprocesses
def test_launch_all_devices(tmp_path: Path) -> None:
    """num_gpu: auto on XLA:CPU goes through torch_xla.launch's process pool."""
    result = _run_script("launch_all", tmp_path, devices=1)
    assert result["world"] == [0, 1, 1, 1]


@pytest.mark.parametrize("devices", [2, 4])
def test_spmd_matches_one_device(acc: Any, tmp_path: Path, devices: int) -> None:
    """The same global batch of 4, sharded over 2 or 4 XLA:CPU devices, trains the same weights."""
    result = _run_script("spmd", tmp_path, devices=devices)
    assert result["world"] == [0, 1, devices, devices]
    assert f"SPMD over {devices} devices" in result["describe"]
    assert result["compiles"][2] == result["compiles"][-1]
    _assert_close(train(acc)["weights"], _load_weights(tmp_path), atol=1e-5)


# ---------------------------------------------------------------------------------------------- the CLI
# A real (tiny) experiment through `python -m anysr ...` in subprocesses with PJRT_DEVICE=CPU: 30 iterations,
# validation every 10, saves, resume, `anysr test`, `anysr infer`, eager-CPU and SPMD comparisons.
TOTAL, PRINT, VAL = 30, 5, 10


def _images(folder: Path, sizes: list[tuple[int, int]], seed: int) -> Path:
    """Smooth random colour images (upsampled noise plus texture), written as PNG."""
    import cv2

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, (h, w) in enumerate(sizes):
        base = rng.random((h // 8 + 1, w // 8 + 1, 3)).astype(np.float32)
        img = cv2.resize(base, (w, h), interpolation=cv2.INTER_CUBIC)
        img = np.clip(img * 0.8 + rng.random((h, w, 3)).astype(np.float32) * 0.2, 0, 1)
        cv2.imwrite(str(folder / f"im{i}.png"), (img * 255).round().astype(np.uint8))
    return folder


@pytest.fixture(scope="module")
def cli_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("xla_cli")
    train = _images(root / "train", [(64, 64), (56, 72), (48, 64), (64, 48)] * 2, seed=3)
    val = _images(root / "val", [(40, 40), (40, 40), (32, 48)], seed=4)
    return {"root": root, "train": train, "val": val}


def _options(name: str, data: dict[str, Path], *, accelerator: str = "xla", batch: int = 4,
             spmd: bool = False) -> dict[str, Any]:
    return {
        "name": name, "model_type": "SRModel", "scale": 2, "accelerator": accelerator, "num_gpu": 1,
        "manual_seed": 7,
        "datasets": {
            "train": {"name": "synthetic", "type": "PairedImageDataset", "dataroot_gt": str(data["train"]),
                      "lq_from_gt": True, "io_backend": {"type": "disk"}, "gt_size": 32, "use_hflip": True,
                      "use_rot": True, "use_shuffle": True, "num_worker_per_gpu": 0,
                      "batch_size_per_gpu": batch},
            "val": {"name": "val", "type": "PairedImageDataset", "dataroot_gt": str(data["val"]),
                    "lq_from_gt": True, "io_backend": {"type": "disk"}}},
        "network_g": {"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 8, "num_block": 1,
                      "upscale": 2, "res_scale": 1, "img_range": 255.0, "rgb_mean": [0.4488, 0.4371, 0.4040]},
        "path": {"pretrain_network_g": None},
        "train": {"ema_decay": 0.9, "optim_g": {"type": "Adam", "lr": 2e-3, "betas": [0.9, 0.99]},
                  "scheduler": {"type": "MultiStepLR", "milestones": [20], "gamma": 0.5},
                  "total_iter": TOTAL,
                  "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0, "reduction": "mean"},
                  # the eager reference computes as the XLA plan does (auto may time bf16 faster on this CPU)
                  **({"precision": "fp32", "channels_last": False} if accelerator == "cpu" else {})},
        "val": {"val_freq": VAL, "save_img": False,
                "metrics": {"psnr": {"type": "calculate_psnr", "crop_border": 2, "test_y_channel": True}}},
        "logger": {"print_freq": PRINT, "save_checkpoint_freq": VAL, "use_tb_logger": False},
        **({"num_gpu": "auto", "xla": {"spmd": True}} if spmd else {}),
    }


def _cli(root: Path, *args: str, devices: int = 1, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("XLA_USE_SPMD", None)
    proc = subprocess.run([sys.executable, "-m", *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(args)}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def _train(data: dict[str, Path], name: str, *extra: str, devices: int = 1, **kw: Any) -> Path:
    import yaml

    path = data["root"] / f"{name}.yml"
    path.write_text(yaml.safe_dump(_options(name, data, **kw), sort_keys=False))
    _cli(data["root"], "anysr.train", "-opt", str(path), "--force_yml", f"path.root={data['root']}", *extra,
         devices=devices)
    return data["root"] / "experiments" / name


def _final_weights(exp: Path, it: int = TOTAL) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(exp / "models" / f"net_g_{it}.safetensors"))


def _logged_stats(exp: Path) -> list[dict[str, Any]]:
    """The `xla stats: {...}` lines of the training log, in order (one per print)."""
    import ast

    logs = sorted((exp / "log").glob("train_*.log"))
    text = "\n".join(p.read_text() for p in logs)
    return [ast.literal_eval(line.split("xla stats: ", 1)[1]) for line in text.splitlines()
            if "xla stats: " in line]


@pytest.fixture(scope="module")
def xla_run(cli_data: dict[str, Path]) -> Path:
    """The reference experiment: 30 XLA:CPU iterations on one device (launcher torch_xla.launch, nprocs 1)."""
    return _train(cli_data, "xla")


def test_cli_train_compiles_once_and_reads_only_at_print(xla_run: Path) -> None:
    summary = json.loads((xla_run / "summary.json").read_text())
    assert summary["finished"] and summary["iterations_done"] == TOTAL
    assert summary["accelerator"]["kind"] == "xla" and summary["accelerator"]["launcher"] == "xla"
    assert 5 < summary["validation"]["val"]["psnr"]["value"] < 60
    stats = _logged_stats(xla_run)
    assert len(stats) == TOTAL // PRINT
    log = "\n".join(p.read_text() for p in (xla_run / "log").glob("train_*.log"))
    # After the first validation round (iteration VAL) no new graph: no warning at any later print, and the
    # final summary (written after the last validation) has the count of the print before it.
    assert "new graph(s) after warm-up" not in log
    assert summary["stats"]["compiles"] == stats[-1]["compiles"] == stats[VAL // PRINT]["compiles"]
    # No device-to-host transfer in iterations that do not print: a window of PRINT iterations with no save
    # or validation in it costs only the report's own reads (the NaN check and the loss values).
    reads = [b["host_transfers"] - a["host_transfers"] for a, b in zip(stats, stats[1:])]
    quiet = [r for i, r in enumerate(reads) if ((i + 1) * PRINT) % VAL != 0]  # windows without save/val
    assert quiet and all(0 < r <= 2 for r in quiet), reads
    assert summary["stats"]["cpu_fallbacks"] == {}


def test_cli_resume_matches_straight_run(cli_data: dict[str, Path], xla_run: Path) -> None:
    split = _train(cli_data, "split", "train.total_iter=20")
    assert (split / "training_states" / "20.state").exists()
    _train(cli_data, "split", "--auto_resume")
    summary = json.loads((split / "summary.json").read_text())
    assert summary["iterations_done"] == TOTAL
    a, b = _final_weights(xla_run), _final_weights(split)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit


def test_cli_test_and_infer(cli_data: dict[str, Path], xla_run: Path) -> None:
    import yaml

    root = cli_data["root"]
    weights = xla_run / "models" / f"net_g_{TOTAL}.safetensors"
    opt = _options("xla_test", cli_data)
    test_opt = {"name": "xla_test", "model_type": "SRModel", "scale": 2, "accelerator": "xla", "num_gpu": 1,
                "datasets": {"test_1": {**opt["datasets"]["val"], "name": "synthetic_val"}},
                "network_g": opt["network_g"],
                "path": {"pretrain_network_g": str(weights), "param_key_g": "params"},
                "val": {"save_img": True, "metrics": opt["val"]["metrics"]}}
    path = root / "xla_test.yml"
    path.write_text(yaml.safe_dump(test_opt, sort_keys=False))
    _cli(root, "anysr.test", "-opt", str(path), "--force_yml", f"path.root={root}")
    results = sorted((root / "results" / "xla_test").rglob("*.png"))
    assert len(results) == 3
    summaries = list((root / "results" / "xla_test").rglob("summary.json"))
    assert summaries
    tested = json.loads(summaries[0].read_text())
    assert tested["accelerator"] == "xla" and tested["datasets"]["synthetic_val"]["n"] == 3
    assert 5 < tested["datasets"]["synthetic_val"]["psnr"] < 60

    import cv2

    outs = {}
    for kind in ("xla", "cpu"):
        _cli(root, "anysr", "infer", "--weights", str(weights), "--param-key", "params",
             "-i", str(cli_data["val"]), "-o", str(root / f"infer_{kind}"), "--accelerator", kind,
             "--precision", "fp32")  # as the XLA plan computes (auto may time bf16 faster on this CPU)
        outs[kind] = {p.name: cv2.imread(str(p)) for p in sorted((root / f"infer_{kind}").glob("*.png"))}
    assert sorted(outs["xla"]) == ["im0.png", "im1.png", "im2.png"]
    assert outs["xla"]["im2.png"].shape == (64, 96, 3)
    for name, img in outs["xla"].items():  # XLA and eager CPU agree to one 8-bit level
        assert np.abs(img.astype(int) - outs["cpu"][name].astype(int)).max() <= 1, name


def test_cli_xla_matches_eager_cpu(cli_data: dict[str, Path], xla_run: Path) -> None:
    cpu = _train(cli_data, "eager", accelerator="cpu")
    _assert_close(_final_weights(xla_run), _final_weights(cpu), atol=1e-5)  # measured: 7e-7


@pytest.mark.parametrize("devices", [2, 4])
def test_cli_spmd_matches_one_device(cli_data: dict[str, Path], xla_run: Path, devices: int) -> None:
    """batch_size_per_gpu x devices = 4 = the one-device batch: the same stream, the same weights."""
    exp = _train(cli_data, f"spmd{devices}", devices=devices, batch=4 // devices, spmd=True)
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["accelerator"]["spmd"] and summary["accelerator"]["launcher"] == "none"
    _assert_close(_final_weights(xla_run), _final_weights(exp), atol=1e-5)
    psnr = summary["validation"]["val"]["psnr"]["value"]
    ref = json.loads((xla_run / "summary.json").read_text())["validation"]["val"]["psnr"]["value"]
    assert psnr == pytest.approx(ref, abs=1e-3)


def _script_main(mode: str, out: str) -> None:
    if mode == "launch_all":
        plan = xla_plan(None, precision="fp32", spmd=False, compile=False)
        assert launch(plan, _script_train, out) is None  # workers are other processes
    elif mode == "spmd":
        launch(xla_plan(None, precision="fp32", spmd=True, compile=False), _script_train, out)
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    _script_main(sys.argv[1], sys.argv[2])

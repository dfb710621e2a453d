"""MMRealSR's own option files training on XLA:CPU (run in the XLA venv: PJRT_DEVICE=CPU python -m pytest -m xla
tests/test_xla_mmrealsr_train.py).

``degrade_in: auto`` synthesises the anchored versions in the loader workers on XLA: the GAN stage (frozen
estimator, discriminator on all five outputs, ranking losses logged) compiles no more graphs in 10 iterations than
in 5, and nothing falls back to the CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("PJRT_DEVICE", "CPU")
pytest.importorskip("torch_xla")

import torch  # noqa: E402

pytestmark = pytest.mark.xla

ROOT = Path(__file__).resolve().parents[1]
FILES = ROOT / "tests" / "fixtures" / "mmrealsr_options"
SMALL = ["network_g.num_feat=8", "network_g.num_block=1", "network_g.num_grow_ch=4", "network_g.num_feats=[8,8,8,16]",
         "network_g.num_blocks=[1,1,1,1]", "gt_size=32", "datasets.train.gt_size=32", "queue_size=4",
         "datasets.train.batch_size_per_gpu=2", "datasets.train.num_worker_per_gpu=0", "accelerator=xla",
         "num_gpu=1", "logger.use_tb_logger=false", "path.pretrain_network_g=null", "logger.print_freq=3",
         "logger.save_checkpoint_freq=100"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("xla_mmrealsr")
    (out / "gt").mkdir()
    names = []
    for p in sorted((ROOT / "datasets" / "T91" / "HR").glob("*.png"))[:4]:
        shutil.copy(p, out / "gt" / p.name)
        names.append(p.name)
    (out / "meta_info.txt").write_text("".join(f"{n}\n" for n in names))
    return out


def _train(root: Path, file: str, name: str, total: int, *extra: str) -> dict:
    over = [f"datasets.train.dataroot_gt={root / 'gt'}", f"datasets.train.meta_info={root / 'meta_info.txt'}",
            f"path.root={root}", f"name={name}", f"train.total_iter={total}", *SMALL, *extra]
    if "GAN" in file:
        over.append("network_d.num_feat=4")
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("XLA_USE_SPMD", None)
    proc = subprocess.run([sys.executable, "-m", "anysr", "train", "-opt", str(FILES / file), "--force_yml", *over],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return json.loads((root / "experiments" / name / "summary.json").read_text())


def test_ten_iterations_compile_no_more_graphs_than_five(root: Path) -> None:
    """The GAN file: the anchored synthesis and pool of both stages, plus the frozen estimator and the
    discriminator (the Net stage's step is the GAN stage's generator step with the estimator trained); without
    its perceptual loss here (a VGG19 on XLA:CPU triples the time; other XLA tests compile it). The EMA's weight
    passes 0.5 at iteration 9."""
    file = "MMRealSRGAN_x4.yml"
    short, long = (_train(root, file, f"{file[:-4]}_{n}", n, "train.perceptual_opt=null") for n in (5, 10))
    assert short["finished"] and long["iterations_done"] == 10
    assert long["stats"]["compiles"] == short["stats"]["compiles"], (short["stats"], long["stats"])
    assert long["stats"]["cpu_fallbacks"] == {}  # (no validation here: no warm-up mark to count from)
    assert {"l_ranking_blur", "l_anchor_max"} <= set(long["final_losses"])


def test_net_stage_trains_without_cpu_fallbacks(root: Path) -> None:
    """The Net stage: the ranking and anchor losses trained through the estimator, on the device."""
    summary = _train(root, "MMRealSRNet_x4.yml", "net_4", 4)
    assert summary["iterations_done"] == 4 and summary["stats"]["cpu_fallbacks"] == {}
    assert {"l_ranking_noise", "l_anchor_min", "l_pix"} <= set(summary["final_losses"])


def test_ema_warm_up_weight_equal_to_another_scalar_compiles_no_graph() -> None:
    """At update 8 the EMA's warm-up weight is 1 - 9/18 = 0.5; a step that also uses a 0-dim 0.5 (here the bias'
    scale) once lost an input there (torch_xla merges equal 0-dim uploads) and compiled a graph of its own."""
    import torch_xla
    import torch_xla.debug.metrics as met

    from anysr.models.ema import EMA

    device = torch_xla.device()
    net = torch.nn.Linear(4, 4).to(device)
    ema = EMA(net, 0.999)
    compiles = []
    for _ in range(12):
        with torch.no_grad():
            net.bias.mul_(torch.tensor(0.5, device=device))
        ema.update(net)
        torch_xla.sync()
        data = met.metric_data("CompileTime")
        compiles.append(int(data[0]) if data else 0)
    assert ema.current_decay() == min(0.999, 13 / 22) and compiles[2:] == [compiles[2]] * 10, compiles

"""NIQE, LPIPS, DISTS and FID in ``val.metrics``: the options' rules, the values validation reports (equal to the
metric modules on the same images), 2 gloo ranks equal to 1 process, and XLA:CPU equal to eager CPU with no new
graph on a second pass (run the last one in the XLA venv: PJRT_DEVICE=CPU python -m pytest -m xla ...)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
import yaml
from conftest import DATASETS, run_cli
from metric_files import write_metric_weights

from anysr.options import load_options
from anysr.options.schema import validate

IMAGES = (("baby", 0, 0), ("bird", 40, 40), ("head", 60, 40))  # 200 x 200 crops of Set5 (room for 2x2 NIQE blocks)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("valmetrics")
    gt = tmp / "gt"
    gt.mkdir()
    for name, top, left in IMAGES:
        img = cv2.imread(str(DATASETS / "Set5" / "HR" / f"{name}.png"))
        cv2.imwrite(str(gt / f"{name}.png"), img[top:top + 200, left:left + 200])
    return {"tmp": tmp, "gt": gt, "weights": write_metric_weights(tmp / "weights", ("lpips", "fid"))}


def _test_options(data: dict[str, Any], name: str, *, accelerator: str, num_gpu: int, fid: bool = True) -> Path:
    metrics: dict[str, Any] = {
        "psnr": {"type": "calculate_psnr", "crop_border": 2, "test_y_channel": True},
        "niqe": {"type": "calculate_niqe", "crop_border": 2},
        "lpips": {"type": "lpips", "net": "alex", "weights": [str(p) for p in data["weights"]["lpips"]]},
    }
    if fid:
        metrics["fid"] = {"type": "calculate_fid", "weights": [str(p) for p in data["weights"]["fid"]]}
    opt = {"name": name, "model_type": "SRModel", "scale": 2, "accelerator": accelerator, "num_gpu": num_gpu,
           "datasets": {"test_1": {"name": "crops", "type": "PairedImageDataset", "dataroot_gt": str(data["gt"]),
                                   "lq_from_gt": True, "io_backend": {"type": "disk"}}},
           "network_g": {"type": "Bicubic", "upscale": 2}, "path": {"pretrain_network_g": None},
           "val": {"save_img": False, "metrics": metrics}}
    path = data["tmp"] / f"{name}.yml"
    path.write_text(yaml.safe_dump(opt, sort_keys=False))
    return path


# ---------------------------------------------------------------------------------------------- options
def _metric(**m: Any) -> tuple[dict[str, Any], list[str]]:
    opt = {"name": "x", "scale": 4, "network_g": {"type": "MSRResNet", "upscale": 4}, "val": {"metrics": {"m": m}}}
    out, problems = validate(opt, is_train=False, root=Path("/"))
    return out["val"]["metrics"]["m"] if "m" in out["val"]["metrics"] else {}, problems


def test_metric_options_follow_the_metric(tmp_path: Path) -> None:
    m, problems = _metric(type="calculate_niqe", crop_border=4)
    assert problems == [] and m["better"] == "lower" and m["convert_to"] == "y" and m["crop_border"] == 4
    m, problems = _metric(type="psnr")
    assert problems == [] and m["better"] == "higher" and m["crop_border"] == 4
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"x")
    m, problems = _metric(type="lpips", weights=str(weights))
    assert problems == [] and m["net"] == "alex" and m["weights"] == [str(weights)] and m["better"] == "lower"
    _, problems = _metric(type="fid", better="higher", net="vgg", test_y_channel=True)
    assert problems == [
        "val.metrics.m.net: is not read by fid (only by lpips); remove it",
        "val.metrics.m.better: fid is lower-is-better, got 'higher'; remove better (it follows the metric) or set "
        "lower",
        "val.metrics.m.test_y_channel: fid compares RGB images; remove test_y_channel"]
    _, problems = _metric(type="dists", weights=["nope_a.pth", str(weights)])
    assert problems[0].startswith("val.metrics.m.weights[0]: 'nope_a.pth' (resolved to /nope_a.pth) does not exist")
    _, problems = _metric(type="psnr", stats=str(weights), convert_to="gray")
    assert problems == ["val.metrics.m.convert_to: is not read by psnr (only by niqe); remove it",
                        "val.metrics.m.stats: is not read by psnr (only by fid); remove it"]


@pytest.mark.slow
def test_validation_values_are_the_metric_modules(data: dict[str, Any]) -> None:
    """``anysr test`` with a Bicubic network: each reported value is the module's on the same 8-bit images."""
    from anysr.engine.evaluation.val_metrics import build_metric_module
    from anysr.metrics import calculate_niqe
    from anysr.metrics.fid import fid_from_features
    from anysr.metrics.info import METRIC_INFOS

    path = _test_options(data, "one", accelerator="cpu", num_gpu=1)
    run_cli("test", "-opt", str(path), "--force_yml", f"path.root={data['tmp']}", "val.save_img=true",
            cwd=data["tmp"])
    summary = json.loads((data["tmp"] / "results" / "one" / "summary.json").read_text())["datasets"]["crops"]
    data["one"] = summary
    lpips = build_metric_module(METRIC_INFOS["lpips"], data["weights"]["lpips"], net="alex")
    inception = build_metric_module(METRIC_INFOS["fid"], data["weights"]["fid"])
    feats, gt_feats = [], []
    for row in summary["images"]:
        sr = cv2.imread(str(data["tmp"] / "results" / "one" / "visualization" / "crops" / f"{row['name']}.png"))
        gt = cv2.imread(str(data["gt"] / f"{row['name']}.png"))
        assert row["niqe"] == pytest.approx(calculate_niqe(sr, 2), rel=1e-6)

        def t(img: np.ndarray, b: int = 0) -> torch.Tensor:
            img = img[b:img.shape[0] - b, b:img.shape[1] - b] if b else img
            return torch.from_numpy(np.ascontiguousarray(img[:, :, ::-1])).permute(2, 0, 1)[None].float() / 255

        with torch.no_grad():
            assert row["lpips"] == pytest.approx(float(lpips(t(sr, 2), t(gt, 2))), rel=1e-5, abs=1e-6)
            feats.append(inception(t(sr)).double().numpy())
            gt_feats.append(inception(t(gt)).double().numpy())
    assert summary["fid"] == pytest.approx(fid_from_features(np.concatenate(feats), np.concatenate(gt_feats)),
                                           rel=1e-4)
    assert summary["n"] == 3 and summary["niqe"] == pytest.approx(np.mean([r["niqe"] for r in summary["images"]]))


@pytest.mark.slow
def test_two_gloo_ranks_equal_one_process(data: dict[str, Any]) -> None:
    """3 images on 2 ranks (one padding repeat): the same per-image values, averages and FID."""
    if "one" not in data:
        path = _test_options(data, "one", accelerator="cpu", num_gpu=1)
        run_cli("test", "-opt", str(path), "--force_yml", f"path.root={data['tmp']}", cwd=data["tmp"])
        data["one"] = json.loads((data["tmp"] / "results" / "one" / "summary.json").read_text())["datasets"]["crops"]
    path = _test_options(data, "two", accelerator="cpu", num_gpu=2)
    proc = run_cli("test", "-opt", str(path), "--force_yml", f"path.root={data['tmp']}", cwd=data["tmp"],
                   env={"OMP_NUM_THREADS": "1"})
    full = json.loads((data["tmp"] / "results" / "two" / "summary.json").read_text())
    assert full["world_size"] == 2, proc.stdout
    one, two = data["one"], full["datasets"]["crops"]
    assert two["n"] == one["n"] == 3 and [r["name"] for r in two["images"]] == [r["name"] for r in one["images"]]
    for key in ("psnr", "niqe", "lpips", "fid"):
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    for a, b in zip(one["images"], two["images"]):
        for key in ("psnr", "niqe", "lpips"):
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["name"], key)


# ---------------------------------------------------------------------------------------------- XLA
@pytest.mark.xla
def test_xla_validation_equals_eager_cpu_and_compiles_nothing_new(data: dict[str, Any]) -> None:
    pytest.importorskip("torch_xla")
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    from anysr.accelerators.base import LaunchPlan
    from anysr.accelerators.launcher import create_accelerator, resolve_plan
    from anysr.archs import build_network
    from anysr.data import build_dataset, build_eval_loader
    from anysr.engine.evaluation.evaluator import evaluate
    from anysr.engine.evaluation.val_metrics import ValMetrics

    opt = load_options(_test_options(data, "xla", accelerator="cpu", num_gpu=1, fid=False), is_train=False)
    dopt = opt.datasets.test_1
    loader, _ = build_eval_loader(build_dataset(dopt, "datasets.test_1"), dopt, world_size=1, rank=0)
    results = {}
    for kind in ("cpu", "xla"):
        plan = (LaunchPlan("xla", 1, "xla", "fp32", extra={"pjrt_device": "CPU", "all_devices": False})
                if kind == "xla" else resolve_plan("cpu", 1, precision="fp32"))
        acc = create_accelerator(plan)
        acc.setup()
        net = build_network(opt.network_g).to(acc.device)
        metrics = ValMetrics(opt.val.metrics, acc)
        start = acc.stats()
        results[kind] = evaluate(net, loader, acc, dataset="crops", scale=2, metrics=metrics, crops=3)
        if kind == "xla":
            before = acc.stats()
            again = evaluate(net, loader, acc, dataset="crops", scale=2, metrics=metrics, crops=3)
            after = acc.stats()
            assert after["compiles"] == before["compiles"], (before, after)  # every graph cached: one per shape
            # no op of validation fell back to the CPU (the counters are per process: other tests' ops stay)
            assert after["cpu_fallbacks"] == start["cpu_fallbacks"], (start, after)
            assert again.metrics == pytest.approx(results["xla"].metrics, rel=1e-6)
    cpu, xla = results["cpu"], results["xla"]
    assert set(cpu.metrics) == {"psnr", "niqe", "lpips"}
    for key in cpu.metrics:
        assert xla.metrics[key] == pytest.approx(cpu.metrics[key], rel=1e-4, abs=1e-5), key
    for a, b in zip(cpu.images, xla.images):
        assert b["lpips"] == pytest.approx(a["lpips"], rel=1e-4, abs=1e-5)
    assert [c.name for c in xla.crops] == [c.name for c in cpu.crops] == ["baby", "bird", "head"]
    for a, b in zip(cpu.crops, xla.crops):
        assert np.abs(a.sr.astype(int) - b.sr.astype(int)).max() <= 1

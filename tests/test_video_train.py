"""The shipped video option files (BasicSR's EDVR-M, BasicVSR REDS / Vimeo-90K BI, IconVSR, BasicVSR++) train 2
iterations and validate through ``anysr train`` on tiny REDS- / Vimeo-shaped folders, with only paths and sizes
changed; SPyNet / EDVR weight files named by network_g are loaded by the engine; resume across the fix_flow switch
is exact; ``anysr test`` of clips on 2 gloo ranks equals 1 process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import PSNR_TOL, ROOT, run_cli
from safetensors.torch import load_file, save_file
from test_gan import fake_vgg19_state_dict
from video_data import make_reds, make_vimeo

from anysr.archs import build_network
from anysr.engine.checkpoint import load_weights
from anysr.options import load_options

TRAIN = ROOT / "options" / "train" / "video"
TEST = ROOT / "options" / "test" / "video"
FAST = ["accelerator=cpu", "num_gpu=1", "logger.use_tb_logger=false", "train.precision=fp32",
        "train.channels_last=false", "train.total_iter=2", "val.val_freq=2", "logger.print_freq=1",
        "datasets.train.batch_size_per_gpu=1", "datasets.train.num_worker_per_gpu=0",
        "datasets.train.dataset_enlarge_ratio=1", "datasets.train.gt_size=32"]
SHRINK = {
    "train_EDVR_M_x4_SR_REDS.yml": ["network_g.num_feat=8", "network_g.deformable_groups=2", "network_g.num_frame=3",
                                    "network_g.num_extract_block=1", "network_g.num_reconstruct_block=1",
                                    "datasets.train.num_frame=3", "datasets.val.num_frame=3", "train.tsa_iter=2"],
    "train_BasicVSR_REDS.yml": ["network_g.num_feat=8", "network_g.num_block=1", "datasets.train.num_frame=3",
                                "train.fix_flow=2"],
    "train_BasicVSR_Vimeo90K_BIx4.yml": ["network_g.num_feat=8", "network_g.num_block=1",
                                         "datasets.train.flip_sequence=false"],
    "train_IconVSR_REDS.yml": ["network_g.num_feat=8", "network_g.num_block=1", "network_g.keyframe_stride=2",
                               "datasets.train.num_frame=3"],
    "train_BasicVSRPP_REDS.yml": ["network_g.mid_channels=8", "network_g.num_blocks=1", "datasets.train.num_frame=2"],
    "train_VideoRecurrentGANModel_REDS.yml": ["network_g.num_feat=8", "network_g.num_block=1",
                                              "datasets.train.num_frame=2", "network_d.num_feat=8",
                                              "network_d.input_size=32", "train.fix_flow=2",
                                              "val.metrics.psnr.crop_border=0"],
}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """REDS-shaped training clips (001, 002; 000 and 011 are REDS4 clips, held out), a REDS4-shaped validation
    set (000, 011: 3 frames), a Vimeo-shaped set, and random SPyNet / IconVSR-EDVR weight files."""
    root = tmp_path_factory.mktemp("video")
    reds = make_reds(root / "reds", clips=("000", "001", "002", "011"), frames=5)
    val = make_reds(root / "reds4", clips=("000", "011"), frames=3, size=(32, 32))
    vimeo = make_vimeo(root / "vimeo", seqs=("00001/0001", "00002/0001"))
    torch.manual_seed(0)
    torch.save({"params": build_network({"type": "SpyNet"}).state_dict()}, root / "spynet.pth")
    icon = build_network({"type": "IconVSR", "num_feat": 8, "num_block": 1})
    torch.save({"params": icon.edvr.state_dict()}, root / "edvr.pth")
    vgg = {k: v for k, v in fake_vgg19_state_dict().items() if k.startswith("features.")}
    save_file(vgg, str(root / "vgg.safetensors"))
    return {"root": root, "reds_gt": reds["gt"], "reds_lq": reds["lq"], "reds_meta": reds["meta"],
            "val_gt": val["gt"], "val_lq": val["lq"], "vimeo_gt": vimeo["gt"], "vimeo_lq": vimeo["lq"],
            "vimeo_meta": vimeo["meta"], "spynet": root / "spynet.pth", "edvr": root / "edvr.pth",
            "vgg": root / "vgg.safetensors"}


def paths(data: dict[str, Path], name: str, file: str) -> list[str]:
    """The path overrides of a file: its datasets pointed at the tiny folders, its weight files at random ones."""
    vimeo = "Vimeo" in file
    out = [f"path.root={data['root']}", f"name={name}",
           f"datasets.train.dataroot_gt={data['vimeo_gt' if vimeo else 'reds_gt']}",
           f"datasets.train.dataroot_lq={data['vimeo_lq' if vimeo else 'reds_lq']}",
           f"datasets.train.meta_info_file={data['vimeo_meta' if vimeo else 'reds_meta']}",
           f"datasets.val.dataroot_gt={data['val_gt']}", f"datasets.val.dataroot_lq={data['val_lq']}"]
    text = (TRAIN / file).read_text()
    if "spynet_path" in text:
        out.append(f"network_g.spynet_path={data['spynet']}")
    if "edvr_path" in text:
        out.append(f"network_g.edvr_path={data['edvr']}")
    if "vgg_weights_path" in text:
        out.append(f"train.perceptual_opt.vgg_weights_path={data['vgg']}")
    return out


@pytest.mark.parametrize("path", sorted(TRAIN.glob("*.yml")), ids=lambda p: p.stem)
def test_video_train_file_validates(path: Path, data: dict[str, Path]) -> None:
    opt = load_options(path, paths(data, "v", path.name), is_train=True)
    assert opt.train.total_iter >= 300000
    assert opt.model_type in ("EDVRModel", "VideoRecurrentModel", "VideoRecurrentGANModel")


@pytest.mark.parametrize("path", sorted(TEST.glob("*.yml")), ids=lambda p: p.stem)
def test_video_test_file_validates(path: Path) -> None:
    opt = load_options(path, is_train=False, root=ROOT, check_paths=False)
    assert any(k.startswith("test") for k in opt.datasets)


@pytest.mark.slow
@pytest.mark.parametrize("file", sorted(SHRINK))
def test_video_file_trains_two_iterations_and_validates(file: str, data: dict[str, Path]) -> None:
    name = Path(file).stem
    proc = run_cli("train", "-opt", str(TRAIN / file), "--force_yml", *paths(data, name, file), *FAST, *SHRINK[file],
                   cwd=data["root"])
    exp = data["root"] / "experiments" / name
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["finished"] and summary["iterations_done"] == 2
    psnr = summary["validation"]["REDS4" if "REDS" in file else "Vid4"]["psnr"]["value"]
    assert 10 < psnr < 60
    log = (proc.stdout + proc.stderr)
    assert "000" in log and "011" in log  # per-clip lines of the validation
    if "spynet_path" in (TRAIN / file).read_text():
        assert f"loaded pretrained weights {data['spynet']} [params] (spynet)" in log
    if "IconVSR" in file:
        assert f"loaded pretrained weights {data['edvr']} [params] (edvr)" in log
    weights = load_file(str(exp / "models" / "net_g_2.safetensors"))
    assert weights and all(torch.isfinite(v).all() for v in weights.values())


@pytest.mark.slow
def test_frozen_flow_resumes_exactly(data: dict[str, Path]) -> None:
    """fix_flow=2 (SPyNet frozen at iteration 1, trained from 2) and flow_lr_mul: 2 iterations at once equal 1,
    stop, resume, 1 more; SPyNet did not move in iteration 1."""
    file = "train_BasicVSR_REDS.yml"
    common = [*FAST, *SHRINK[file], "val=null", "logger.save_checkpoint_freq=1"]
    run_cli("train", "-opt", str(TRAIN / file), "--force_yml", *paths(data, "once", file), *common, cwd=data["root"])
    run_cli("train", "-opt", str(TRAIN / file), "--force_yml", *paths(data, "twice", file), *common,
            "train.total_iter=1", cwd=data["root"])
    run_cli("train", "-opt", str(TRAIN / file), "--auto_resume", "--force_yml", *paths(data, "twice", file), *common,
            cwd=data["root"])
    exp = data["root"] / "experiments"
    once = load_file(str(exp / "once" / "models" / "net_g_2.safetensors"))
    twice = load_file(str(exp / "twice" / "models" / "net_g_2.safetensors"))
    assert once.keys() == twice.keys()
    for k in once:
        assert torch.equal(once[k], twice[k]), k
    spynet = {k: v for k, v in torch.load(data["spynet"], weights_only=True)["params"].items()
              if k.startswith("basic_module")}  # the parameters (the normalisation buffers never train)
    first, _ = load_weights(exp / "twice" / "models" / "net_g_1.safetensors", "params")
    last, _ = load_weights(exp / "once" / "models" / "net_g_2.safetensors", "params")
    moved = [k for k in spynet if not torch.equal(first[f"spynet.{k}"], spynet[k])]
    assert not moved  # frozen in iteration 1
    assert any(not torch.equal(last[f"spynet.{k}"], spynet[k]) for k in spynet)  # trained in iteration 2
    assert not torch.equal(first["fusion.weight"], last["fusion.weight"])


@pytest.mark.slow
def test_clip_test_on_two_gloo_ranks_equals_one_process(data: dict[str, Path], tmp_path: Path) -> None:
    """``anysr test`` of 3 clips (one rank pads) in temporal chunks, and of EDVR windows: 2 ranks == 1 process."""
    clips = make_reds(tmp_path / "reds3", clips=("a", "b", "c"), frames=3, size=(16, 16))
    torch.manual_seed(1)
    bvsr = tmp_path / "bvsr.pth"
    torch.save({"params": build_network({"type": "BasicVSR", "num_feat": 8, "num_block": 1}).state_dict()}, bvsr)
    edvr_opt = {"type": "EDVR", "num_feat": 8, "num_frame": 3, "deformable_groups": 2, "num_extract_block": 1,
                "num_reconstruct_block": 1}
    edvr = tmp_path / "edvr.pth"
    torch.save({"params": build_network(edvr_opt).state_dict()}, edvr)
    runs = {
        "test_BasicVSR_REDS.yml": [f"path.pretrain_network_g={bvsr}", "network_g.num_feat=8", "network_g.num_block=1",
                                   "val.chunk=2", "val.chunk_pad=1", "val.flip_seq=true"],
        "test_EDVR_M_x4_SR_REDS.yml": [f"path.pretrain_network_g={edvr}", "network_g.num_feat=8",
                                       "network_g.num_frame=3", "network_g.deformable_groups=2",
                                       "network_g.num_extract_block=1", "network_g.num_reconstruct_block=1",
                                       "datasets.test.num_frame=3"],
    }
    for file, over in runs.items():
        results = {}
        for ranks in (1, 2):
            name = f"{Path(file).stem}_{ranks}"
            run_cli("test", "-opt", str(TEST / file), "--force_yml", f"path.root={tmp_path}", f"name={name}",
                    "accelerator=cpu", f"num_gpu={ranks}", f"datasets.test.dataroot_gt={clips['gt']}",
                    f"datasets.test.dataroot_lq={clips['lq']}", "val.save_img=false", *over, cwd=tmp_path)
            results[ranks] = json.loads((tmp_path / "results" / name / "summary.json").read_text())
        one, two = results[1]["datasets"]["REDS4"], results[2]["datasets"]["REDS4"]
        assert results[2]["world_size"] == 2
        assert [r["name"] for r in one["images"]] == [r["name"] for r in two["images"]] == ["a", "b", "c"]
        assert one["n"] == two["n"] == 9  # every frame scored once
        for r1, r2 in zip(one["images"], two["images"]):
            assert r1["psnr"] == pytest.approx(r2["psnr"], abs=PSNR_TOL)
        assert one["psnr"] == pytest.approx(two["psnr"], abs=PSNR_TOL)
        assert one["psnr"] == pytest.approx(sum(r["psnr"] for r in one["images"]) / 3, abs=1e-9)

"""Video datasets on tiny REDS- and Vimeo-shaped folders of frames (disk and LMDB), BasicSR's frame windows and BD
degradation (fixtures from BasicSR 1.4.2: tools/fixtures/make_video_data_fixtures.py), the video option rules,
temporal chunk plans."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FIXTURE_TOL
from safetensors.torch import load_file
from video_data import SCALE, make_lmdb, make_reds, make_vimeo

from anysr.data import build_dataset
from anysr.data.degradation.bicubic import bicubic_degrade
from anysr.data.imageio import read_image
from anysr.data.transforms import img2tensor
from anysr.data.video_datasets import bd_degrade, degrade_frame, frame_window
from anysr.engine.evaluation.forward import pad_indices, plan_chunks
from anysr.errors import DataError, OptionError
from anysr.options import validate_dataset

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "video_data"


@pytest.fixture(scope="module")
def reds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_reds(tmp_path_factory.mktemp("reds"), clips=("000", "001", "002"), frames=6)


@pytest.fixture(scope="module")
def vimeo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_vimeo(tmp_path_factory.mktemp("vimeo"))


def dataset(kind: str, phase: str = "train", **opt: object) -> torch.utils.data.Dataset:
    """A dataset built the way a run builds it: its section validated by the options first."""
    section = {"type": kind, "io_backend": {"type": "disk"}, **opt}
    if phase == "train":
        section.setdefault("batch_size_per_gpu", 1)
        section.setdefault("use_hflip", True)
        section.setdefault("use_rot", True)
    return build_dataset(validate_dataset(section, name=phase, scale=SCALE), f"datasets.{phase}")


def reds_opt(reds: dict[str, Path], **kw: object) -> dict[str, object]:
    return {"dataroot_gt": str(reds["gt"]), "dataroot_lq": str(reds["lq"]), "meta_info_file": str(reds["meta"]),
            "val_partition": "official", "gt_size": 32, **kw}


# --------------------------------------------------------------------------------- BasicSR's operators
def test_frame_windows_match_basicsr() -> None:
    cases = json.loads((FIXTURES / "frame_indices.json").read_text())["cases"]
    assert len(cases) == 228
    for c in cases:
        assert frame_window(c["centre"], c["length"], c["num_frame"], c["padding"]) == c["indices"], c


def test_bd_degradation_matches_basicsr_duf_downsample() -> None:
    t = load_file(str(FIXTURES / "bd.safetensors"))
    for s in (2, 3, 4):
        torch.testing.assert_close(bd_degrade(t[f"x{s}/in"], s), t[f"x{s}/out"], **FIXTURE_TOL)
    with pytest.raises(DataError, match="scale 2, 3 and 4"):
        bd_degrade(torch.zeros(1, 3, 16, 16), 8)


def test_bd_frame_is_blurred_and_quarter_size(reds: dict[str, Path]) -> None:
    gt = read_image(reds["gt"] / "000" / "00000000.png")
    bd, bi = degrade_frame(gt, 4, "BD"), degrade_frame(gt, 4, "BI")
    assert bd.shape == bi.shape == (16, 16, 3) and bd.dtype == np.uint8
    assert np.abs(bd.astype(int) - bi.astype(int)).mean() > 1  # a different degradation


# --------------------------------------------------------------------------------- training datasets
def test_reds_window_dataset(reds: dict[str, Path]) -> None:
    ds = dataset("REDSDataset", **reds_opt(reds, num_frame=3, interval_list=[1, 2], random_reverse=True))
    assert len(ds) == 18  # 3 clips x 6 frames, one sample per frame
    item = ds[(0, 123)]
    assert item["lq"].shape == (3, 3, 8, 8) and item["gt"].shape == (3, 32, 32)
    assert item["key"].split("/")[0] == "000"
    again = ds[(0, 123)]
    assert torch.equal(item["lq"], again["lq"]) and torch.equal(item["gt"], again["gt"])  # (index, seed) decides
    assert any(not torch.equal(item["lq"], ds[(0, s)]["lq"]) for s in range(5))
    for seed in range(20):  # near the clip's ends the window moves inside it
        assert 0 <= int(ds[(5, seed)]["key"].split("/")[1]) <= 5


def test_reds_lq_from_gt_is_the_bicubic_lq(reds: dict[str, Path]) -> None:
    """The synthetic LQ frames are MATLAB bicubic of the GT ones: making them from GT gives the same samples."""
    base = reds_opt(reds, num_frame=3)
    read = dataset("REDSRecurrentDataset", **base)
    made = dataset("REDSRecurrentDataset", **{**base, "dataroot_lq": None, "lq_from_gt": True})
    for i, seed in ((0, 1), (7, 2)):
        a, b = read[(i, seed)], made[(i, seed)]
        assert torch.equal(a["lq"], b["lq"]) and torch.equal(a["gt"], b["gt"])


def test_reds_partition_and_recurrent_clips(reds: dict[str, Path]) -> None:
    train = dataset("REDSRecurrentDataset", **reds_opt(reds, num_frame=4, val_partition="REDS4"))
    assert {c.name for c in train.clips} == {"001", "002"}  # 000 is a REDS4 clip
    test = dataset("REDSRecurrentDataset", **reds_opt(reds, num_frame=4, val_partition="REDS4", test_mode=True))
    assert [c.name for c in test.clips] == ["000"]
    item = train[(11, 0)]  # the last frame of a clip: the start moves back so 4 frames fit
    assert item["lq"].shape == (4, 3, 8, 8) and item["gt"].shape == (4, 3, 32, 32)
    with pytest.raises(DataError, match="fewer than num_frame"):
        dataset("REDSRecurrentDataset", **reds_opt(reds, num_frame=7))[(0, 0)]


def test_reds_without_meta_info_lists_the_folders(reds: dict[str, Path]) -> None:
    ds = dataset("REDSRecurrentDataset", **reds_opt(reds, num_frame=2, meta_info_file=None))
    assert [c.name for c in ds.clips] == ["000", "001", "002"] and len(ds) == 18


def test_vimeo_datasets(vimeo: dict[str, Path]) -> None:
    opt = {"dataroot_gt": str(vimeo["gt"]), "dataroot_lq": str(vimeo["lq"]), "meta_info_file": str(vimeo["meta"]),
           "gt_size": 32}
    win = dataset("Vimeo90KDataset", num_frame=5, **opt)
    assert len(win) == 3 and win.neighbors == [2, 3, 4, 5, 6]
    item = win[(1, 5)]
    assert item["lq"].shape == (5, 3, 8, 8) and item["gt"].shape == (3, 32, 32) and item["key"] == "00001/0002"
    rec = dataset("Vimeo90KRecurrentDataset", num_frame=-1, flip_sequence=True, **opt)
    clip = rec[(0, 9)]
    assert clip["lq"].shape == (14, 3, 8, 8) and clip["gt"].shape == (14, 3, 32, 32)
    assert torch.equal(clip["lq"][7:], clip["lq"][:7].flip(0))
    # BD frames made from the GT frames
    bd = dataset("Vimeo90KRecurrentDataset", num_frame=-1, **{**opt, "dataroot_lq": None},
                 lq_from_gt=True, degradation="BD")
    assert bd[(0, 9)]["lq"].shape == (7, 3, 8, 8)


def test_lmdb_items_equal_disk_items(reds: dict[str, Path], vimeo: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("lmdb")
    reds_db = {k: make_lmdb(reds[k], tmp_path / f"reds_{k}.lmdb") for k in ("gt", "lq")}
    disk = dataset("REDSRecurrentDataset", **reds_opt(reds, num_frame=3))
    db = dataset("REDSRecurrentDataset", **reds_opt(reds, num_frame=3, io_backend={"type": "lmdb"},
                                                     dataroot_gt=str(reds_db["gt"]), dataroot_lq=str(reds_db["lq"])))
    assert len(db) == len(disk)
    for i, seed in ((0, 3), (10, 4)):
        assert torch.equal(disk[(i, seed)]["lq"], db[(i, seed)]["lq"])
        assert torch.equal(disk[(i, seed)]["gt"], db[(i, seed)]["gt"])
    vimeo_db = {k: make_lmdb(vimeo[k], tmp_path / f"vimeo_{k}.lmdb") for k in ("gt", "lq")}
    opt = {"meta_info_file": str(vimeo["meta"]), "gt_size": 32, "num_frame": 3}
    a = dataset("Vimeo90KDataset", dataroot_gt=str(vimeo["gt"]), dataroot_lq=str(vimeo["lq"]), **opt)
    b = dataset("Vimeo90KDataset", dataroot_gt=str(vimeo_db["gt"]), dataroot_lq=str(vimeo_db["lq"]),
                io_backend={"type": "lmdb"}, **opt)
    assert torch.equal(a[(2, 1)]["lq"], b[(2, 1)]["lq"]) and torch.equal(a[(2, 1)]["gt"], b[(2, 1)]["gt"])
    assert b.check(decode=False) == []


# --------------------------------------------------------------------------------- test datasets
def test_video_test_dataset_windows(reds: dict[str, Path]) -> None:
    ds = dataset("VideoTestDataset", "val", dataroot_gt=str(reds["gt"]), dataroot_lq=str(reds["lq"]), num_frame=5)
    assert len(ds) == 18 and ds.clip_names == ["000", "001", "002"] and ds.clip_lengths == [6, 6, 6]
    item = ds[6]  # clip 001, frame 0: reflection_circle window [4, 3, 0, 1, 2]
    assert item["folder"] == "001" and item["idx"] == "0/6" and item["border"] == 1 and item["frames"] == [0]
    frames = [img2tensor(read_image(reds["lq"] / "001" / f"{j:08d}.png")) for j in (4, 3, 0, 1, 2)]
    assert torch.equal(item["lq"], torch.stack(frames))
    assert item["gt"].shape == (3, 64, 64)
    assert ds.check(decode=True) == []


def test_recurrent_test_dataset_clips(reds: dict[str, Path], tmp_path: Path) -> None:
    meta = tmp_path / "meta.txt"
    meta.write_text("002 6 (64,64,3)\n000 6 (64,64,3)\n")
    ds = dataset("VideoRecurrentTestDataset", "val", dataroot_gt=str(reds["gt"]), dataroot_lq=str(reds["lq"]),
                 meta_info_file=str(meta), cache_data=True)
    assert len(ds) == 2 and ds.clip_names == ["002", "000"]
    item = ds[1]
    assert item["lq"].shape == (6, 3, 16, 16) and item["gt"].shape == (6, 3, 64, 64) and item["folder"] == "000"
    gt0 = read_image(reds["gt"] / "000" / "00000003.png")
    assert torch.equal(item["lq"][3], img2tensor(bicubic_degrade(gt0, SCALE)))


def test_vimeo_test_dataset(vimeo: dict[str, Path]) -> None:
    ds = dataset("VideoTestVimeo90KDataset", "test", dataroot_gt=str(vimeo["gt"]), dataroot_lq=str(vimeo["lq"]),
                 meta_info_file=str(vimeo["meta"]), num_frame=7)
    assert len(ds) == 3 and ds.clip_names == ["vimeo90k"] and ds.clip_lengths == [3]
    item = ds[2]
    assert item["lq"].shape == (7, 3, 16, 16) and item["frames"] == [2] and ds.frame_name(0, 2) == "00002_0001"


# --------------------------------------------------------------------------------- option rules
@pytest.mark.parametrize(("kind", "opt", "message"), [
    ("REDSDataset", {"num_frame": 4}, r"datasets\.train\.num_frame: REDSDataset centres its window .* odd"),
    ("REDSDataset", {"num_frame": None}, r"datasets\.train\.num_frame: required by REDSDataset"),
    ("REDSRecurrentDataset", {"num_frame": 3, "gt_size": None}, r"datasets\.train\.gt_size: required"),
    ("REDSDataset", {"num_frame": 3, "dataroot_flow": "flows"}, r"dataroot_flow: .*not read"),
    ("REDSRecurrentDataset", {"num_frame": 3, "degradation": "BD"}, r"degradation: .*lq_from_gt: true"),
    ("REDSRecurrentDataset", {"num_frame": 3, "interval_list": [0]}, r"interval_list: every interval must be >= 1"),
    ("REDSRecurrentDataset", {"num_frame": 3, "dataroot_lq": None}, r"dataroot_lq: .*needs dataroot_lq"),
    ("REDSRecurrentDataset", {"num_frame": 3, "val_partition": "REDS5"}, r"val_partition: expected 'REDS4'"),
])
def test_video_dataset_rules_name_the_key(reds: dict[str, Path], kind: str, opt: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        dataset(kind, **{**reds_opt(reds), **opt})


# --------------------------------------------------------------------------------- temporal chunks
@pytest.mark.parametrize(("t", "chunk", "pad"), [(10, 4, 2), (7, 3, 0), (5, 8, 2), (9, 2, 3), (1, 4, 2)])
def test_chunks_cover_every_frame_once_with_equal_windows(t: int, chunk: int, pad: int) -> None:
    plan = plan_chunks(t, chunk, pad)
    kept = [f for c in plan for f in range(c.keep_start, c.keep_end)]
    assert kept == list(range(t))
    sizes = {c.win_end - c.win_start for c in plan}
    assert sizes == {min(chunk + 2 * pad, t)} or len(plan) == 1
    for c in plan:
        assert 0 <= c.win_start <= c.keep_start and c.keep_end <= c.win_end <= t
        assert c.keep_start - c.win_start >= min(pad, c.keep_start)  # context kept where the clip has it
    assert plan_chunks(t, None, pad) == plan_chunks(t, t, pad)


def test_pad_indices_reflect() -> None:
    assert pad_indices(3, 7) == [0, 1, 2, 1, 0, 1, 2]
    assert pad_indices(1, 3) == [0, 0, 0]


# --------------------------------------------------------------------------------- clip validation arithmetic
class _FrameUpsampler(torch.nn.Module):
    """A stand-in recurrent network: every frame upsampled x4 (nearest), clip in, clip out."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t = x.shape[:2]
        return torch.nn.functional.interpolate(x.flatten(0, 1), scale_factor=SCALE, mode="nearest").unflatten(0, (b, t))


def test_clip_metrics_average_per_clip_then_over_clips(reds: dict[str, Path], tmp_path: Path) -> None:
    from anysr.accelerators import resolve_plan
    from anysr.accelerators.launcher import create_accelerator
    from anysr.data import build_eval_loader
    from anysr.engine.evaluation.evaluator import evaluate
    from anysr.metrics import psnr_torch
    from anysr.options.loader import validate_options

    meta = tmp_path / "meta.txt"
    meta.write_text("000 6\n002 6\n")
    section = {"type": "VideoRecurrentTestDataset", "dataroot_gt": str(reds["gt"]), "dataroot_lq": str(reds["lq"]),
               "meta_info_file": str(meta), "io_backend": {"type": "disk"}}
    ds = build_dataset(validate_dataset(section, name="val", scale=SCALE), "datasets.val")
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    metrics = {"psnr": {"type": "calculate_psnr", "crop_border": 0, "test_y_channel": False}}
    val = validate_options({"name": "v", "scale": SCALE, "network_g": {"type": "Bicubic", "upscale": SCALE},
                            "val": {"chunk": 4, "chunk_pad": 1}}, is_train=False, root=tmp_path).val
    net = _FrameUpsampler()
    expect = []
    for c in range(2):
        item = ds[c]
        out = (net(item["lq"][None])[0].clamp(0, 1) * 255).round() / 255
        expect.append(psnr_torch(out, item["gt"]).double().mean().item())
    for world in (1, 2):  # two ranks' shards (run here one after the other) cover the clips once
        found = []
        for rank in range(world):
            loader, _ = build_eval_loader(ds, ds.opt, world_size=world, rank=rank)
            res = evaluate(net, loader, acc, dataset="REDS", scale=SCALE, metrics_opt=metrics, val_opt=val)
            found.append(res)
        if world == 1:
            res = found[0]
            assert [r["name"] for r in res.images] == ["000", "002"] and res.count == 12
            assert [r["psnr"] for r in res.images] == pytest.approx(expect, abs=1e-9)
            assert res.metrics["psnr"] == pytest.approx(sum(expect) / 2, abs=1e-9)
        else:  # each rank alone scored its own clip (the single-process reduction of a 2-rank shard)
            assert [r.count for r in found] == [6, 6]
    centre = validate_options({"name": "v", "scale": SCALE, "network_g": {"type": "Bicubic", "upscale": SCALE},
                               "val": {"center_frame_only": True}}, is_train=False, root=tmp_path).val
    loader, _ = build_eval_loader(ds, ds.opt, world_size=1, rank=0)
    res = evaluate(net, loader, acc, dataset="REDS", scale=SCALE, metrics_opt=metrics, val_opt=centre)
    assert res.count == 2 and [r["frames"] for r in res.images] == [1, 1]

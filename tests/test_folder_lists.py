"""Several dataset folders as one (``dataroot_gt: [a, b]``, traiNNer-redux's lists): the options check each, the
dataset numbers the items folder after folder with the same (index, seed) samples, a run trains on both."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import pytest
import torch
from conftest import run_cli, tiny_train_options, write_options

from anysr.data.loaders import build_dataset
from anysr.data.union import FolderUnion
from anysr.errors import OptionError
from anysr.options.loader import validate_options


@pytest.fixture(scope="module")
def two_pairs(tmp_path_factory: pytest.TempPathFactory, small_train_dir: Path) -> dict[str, list[Path]]:
    """Two GT folders (3 and 5 T91 images) and their x2 LQ folders (OpenCV bicubic: any LQ pairs by size)."""
    root = tmp_path_factory.mktemp("folders")
    images = sorted(small_train_dir.glob("*.png"))
    out: dict[str, list[Path]] = {"gt": [], "lq": []}
    for k, chunk in enumerate((images[:3], images[3:])):
        gt, lq = root / f"hr{k}", root / f"lr{k}"
        gt.mkdir()
        lq.mkdir()
        for p in chunk:
            shutil.copy(p, gt / p.name)
            img = cv2.imread(str(p))
            h, w = img.shape[:2]
            cv2.imwrite(str(lq / p.name), cv2.resize(img[: h - h % 2, : w - w % 2], (w // 2, h // 2),
                                                     interpolation=cv2.INTER_CUBIC))
        out["gt"].append(gt)
        out["lq"].append(lq)
    return out


def _options(tmp_path: Path, **train: object) -> dict:
    opt = tiny_train_options("lists", Path("."), None, total_iter=2)
    opt["path"]["root"] = str(tmp_path)
    ds = opt["datasets"]["train"]
    ds.pop("lq_from_gt")
    ds.update(train)
    return opt


def test_lists_validate_and_build_one_dataset(tmp_path: Path, two_pairs: dict[str, list[Path]]) -> None:
    gts, lqs = [str(p) for p in two_pairs["gt"]], [str(p) for p in two_pairs["lq"]]
    opts = validate_options(_options(tmp_path, dataroot_gt=gts, dataroot_lq=lqs), is_train=True, root=tmp_path)
    assert list(opts.datasets.train.dataroot_gt) == gts
    ds = build_dataset(opts.datasets.train, "datasets.train")
    assert isinstance(ds, FolderUnion) and len(ds) == 8 and [len(p) for p in ds.parts] == [3, 5]
    assert ds.check(decode=False) == []
    # global item 4 is folder 1's item 1, with the same sample for the same seed
    gt_path, lq_path = ds.paths(4)
    assert Path(gt_path).parent == two_pairs["gt"][1] and Path(lq_path).parent == two_pairs["lq"][1]
    a, b = ds[(4, 123)], ds.parts[1][(1, 123)]
    assert torch.equal(a["gt"], b["gt"]) and torch.equal(a["lq"], b["lq"]) and a["gt_path"] == gt_path
    assert ds.scale == 2 and ds.gt_size == 32  # other attributes: the first folder's (the same options)
    with pytest.raises(IndexError):
        ds[8]


def test_lists_are_checked_item_by_item(tmp_path: Path, two_pairs: dict[str, list[Path]]) -> None:
    gts, lqs = [str(p) for p in two_pairs["gt"]], [str(p) for p in two_pairs["lq"]]
    cases = [
        ({"dataroot_gt": [gts[0], str(tmp_path / "nope")], "dataroot_lq": lqs},
         r"datasets\.train\.dataroot_gt\.1: .*nope.* does not exist"),
        ({"dataroot_gt": gts, "dataroot_lq": lqs[:1]}, r"dataroot_lq: lists 1 folder\(s\) for the 2 of dataroot_gt"),
        ({"dataroot_gt": gts, "dataroot_lq": lqs, "meta_info_file": __file__},
         r"meta_info_file: lists the images of one folder"),
    ]
    for train, pattern in cases:
        with pytest.raises(OptionError, match=pattern):
            validate_options(_options(tmp_path, **train), is_train=True, root=tmp_path)


def test_gt_only_lists_with_lq_from_gt_train_through_the_cli(tmp_path: Path,
                                                            two_pairs: dict[str, list[Path]]) -> None:
    opt = _options(tmp_path, dataroot_gt=[str(p) for p in two_pairs["gt"]], lq_from_gt=True)
    opt["path"].pop("root")
    path = write_options(tmp_path / "lists.yml", opt)
    run_cli("train", "-opt", str(path), cwd=tmp_path)
    assert (tmp_path / "experiments" / "lists" / "models" / "net_g_latest.safetensors").is_file()


def test_lq_only_lists_run_in_anysr_test(tmp_path: Path, two_pairs: dict[str, list[Path]]) -> None:
    """traiNNer-redux's test files: ``singleimagedataset`` with several ``dataroot_lq`` folders and no GT."""
    opt = _options(tmp_path, dataroot_gt=[str(p) for p in two_pairs["gt"]], lq_from_gt=True)
    opt["path"].pop("root")
    run_cli("train", "-opt", str(write_options(tmp_path / "lists.yml", opt)), cwd=tmp_path)
    weights = tmp_path / "experiments" / "lists" / "models" / "net_g_latest.safetensors"
    test_opt = {"name": "lists_test", "scale": 2, "num_gpu": "auto", "network_g": opt["network_g"],
                "path": {"pretrain_network_g": str(weights)}, "val": {"save_img": True},
                "datasets": {"val": {"name": "both", "type": "singleimagedataset",
                                     "dataroot_lq": [str(p) for p in two_pairs["lq"]],
                                     "io_backend": {"type": "disk"}}}}
    run_cli("test", "-opt", str(write_options(tmp_path / "test.yml", test_opt)), cwd=tmp_path)
    written = sorted(p.stem for p in (tmp_path / "results" / "lists_test").rglob("*.png"))
    names = sorted(p.stem for lq in two_pairs["lq"] for p in lq.glob("*.png"))
    assert len(written) == len(names) == 8
    assert all(any(w.startswith(n) for w in written) for n in names)

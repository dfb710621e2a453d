"""The recipe option files (``options/train/recipe_*.yml``, docs/recipes.md): each validates and trains through the
CLI on CPU with overrides that only shrink it (network widths, crops, batch, iterations, validation images) and
give the VGG / DISTS weight files, which the recipes leave to be found by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import pytest
import yaml
from conftest import DATASETS, ROOT, run_cli
from metric_files import write_metric_weights
from safetensors.torch import save_file
from test_gan import fake_vgg19_state_dict

from anysr.errors import OptionError
from anysr.options import load_options

RECIPES = sorted((ROOT / "options" / "train").glob("recipe_*.yml"))
FIDELITY = ROOT / "options" / "train" / "recipe_SPAN_x4_fidelity.yml"
FINETUNE = ROOT / "options" / "train" / "recipe_SPAN_x4_perceptual_finetune.yml"
GAN = ROOT / "options" / "train" / "recipe_RealPLKSR_x4_gan.yml"
ANIME = ROOT / "options" / "train" / "recipe_Compact_x2_anime.yml"
THREE_SCALES = "[0.0448, 0.2856, 0.3001]"  # MS-SSIM on 64-pixel crops (five scales need 161)

# Per recipe: what shrinks it to seconds on a CPU (nothing else of the recipe changes).
SHRINK: dict[str, list[str]] = {
    FIDELITY.stem: ["network_g.feature_channels=8"],
    FINETUNE.stem: ["network_g.feature_channels=8"],
    GAN.stem: ["network_g.dim=16", "network_g.n_blocks=2", "network_g.kernel_size=7", "network_d.num_feat=8",
               "gt_size=64", "datasets.train.gt_size=64", "datasets.train.crop_pad_size=96", "queue_size=4",
               f"train.losses.0.weights={THREE_SCALES}"],
    ANIME.stem: ["network_g.num_feat=8", "network_g.num_conv=2", "train.warmup_iter=1"],
}


@pytest.fixture(scope="module")
def weight_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Random VGG19 and seeded DISTS weight files (the recipes find the real ones by name)."""
    folder = tmp_path_factory.mktemp("recipe_weights")
    vgg = folder / "vgg19.safetensors"
    save_file({k: v for k, v in fake_vgg19_state_dict().items() if k.startswith("features.")}, str(vgg))
    return {"vgg19": vgg, **write_metric_weights(folder, ("dists",))}


@pytest.fixture(scope="module")
def tiny_val(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 96x96 crop of a real Set5 image (sides divisible by 2 and 4)."""
    out = tmp_path_factory.mktemp("recipe_val")
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "butterfly.png"), cv2.IMREAD_UNCHANGED)
    cv2.imwrite(str(out / "butterfly.png"), img[80:176, 80:176])
    return out


def _entries(path: Path) -> list[dict[str, Any]]:
    return list(yaml.safe_load(path.read_text())["train"].get("losses") or [])


def _weight_overrides(path: Path, files: dict[str, Any]) -> list[str]:
    """``key=value`` overrides giving each VGG / DISTS entry of ``path``'s loss list its weight files."""
    out = []
    for i, entry in enumerate(_entries(path)):
        kind = entry["type"].lower()
        if kind in ("perceptualloss", "contextualloss"):
            out.append(f"train.losses.{i}.vgg_weights_path={files['vgg19']}")
        elif kind == "distsloss":
            out.append(f"train.losses.{i}.weights=[{files['dists'][0]}, {files['dists'][1]}]")
    return out


def _run_overrides(path: Path, tmp: Path, files: dict[str, Any], val: Path) -> list[str]:
    return [f"path.root={ROOT}", f"path.experiments_root={tmp / path.stem}", "accelerator=cpu", "num_gpu=1",
            "train.precision=fp32", "train.channels_last=false", "train.total_iter=2",
            "datasets.train.batch_size_per_gpu=2", "datasets.train.num_worker_per_gpu=0",
            "datasets.train.dataset_enlarge_ratio=1", f"datasets.val.dataroot_gt={val}", "val.val_freq=2",
            "logger.print_freq=1", "logger.save_checkpoint_freq=2", "logger.use_tb_logger=false",
            *SHRINK[path.stem], *_weight_overrides(path, files)]


def _train(path: Path, tmp: Path, files: dict[str, Any], val: Path, *extra: str) -> dict[str, float]:
    run_cli("train", "-opt", str(path), "--force_yml", *_run_overrides(path, tmp, files, val), *extra, cwd=tmp,
            timeout=300)
    exp = tmp / path.stem
    assert (exp / "models" / "net_g_2.safetensors").is_file()
    return json.loads((exp / "summary.json").read_text())["final_losses"]


def test_every_recipe_is_shrunk_here_and_listed_in_the_docs() -> None:
    assert len(RECIPES) >= 4 and set(SHRINK) == {p.stem for p in RECIPES}
    docs = (ROOT / "docs" / "recipes.md").read_text()
    assert all(p.name in docs for p in RECIPES)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_names_no_weight_file_and_validates(path: Path, tmp_path: Path, weight_files: dict[str, Any]) -> None:
    """The weights of VGG / DISTS are found by name: no recipe names a file; with the files given it validates."""
    for entry in _entries(path):
        assert "vgg_weights_path" not in entry
        assert entry["type"].lower() not in ("lpipsloss", "distsloss") or "weights" not in entry
    pretrain = tmp_path / "net_g_latest.safetensors"
    pretrain.write_bytes(b"")  # only its existence is checked here; the chain test below loads a real one
    over = [f"path.root={ROOT}", f"path.experiments_root={tmp_path / 'exp'}", *_weight_overrides(path, weight_files)]
    if path == FINETUNE:
        over.append(f"path.pretrain_network_g={pretrain}")
    opt = load_options(path, over, is_train=True)
    assert opt["name"] == path.stem and opt["train"]["total_iter"] >= 100000
    assert opt["datasets"]["train"]["dataroot_gt"].startswith(str(DATASETS))  # the bundled data, as cloned


@pytest.mark.slow
def test_span_fidelity_then_perceptual_finetune(tmp_path: Path, weight_files: dict[str, Any], tiny_val: Path) -> None:
    """The pretrain -> finetune pair: schedule-free AdamW + MS-SSIM/L1, then DISTS + LDL from its EMA weights."""
    first = _train(FIDELITY, tmp_path, weight_files, tiny_val)
    assert set(first) == {"l_msssiml1"}
    start = tmp_path / FIDELITY.stem / "models" / "net_g_latest.safetensors"
    second = _train(FINETUNE, tmp_path, weight_files, tiny_val, f"path.pretrain_network_g={start}")
    assert set(second) == {"l_msssiml1", "l_dists", "l_ldl"}
    log = next((tmp_path / FINETUNE.stem).glob("log/*.log")).read_text()
    assert str(start) in log and "params_ema" in log


def test_compact_anime(tmp_path: Path, weight_files: dict[str, Any], tiny_val: Path) -> None:
    assert set(_train(ANIME, tmp_path, weight_files, tiny_val)) == {"l_charbonnier", "l_sobel", "l_oklab"}


@pytest.mark.slow
def test_realplksr_gan(tmp_path: Path, weight_files: dict[str, Any], tiny_val: Path) -> None:
    losses = _train(GAN, tmp_path, weight_files, tiny_val)
    assert {"l_g_msssiml1", "l_g_perceptual", "l_g_dists", "l_g_ldl", "l_g_gan", "l_d_real", "l_d_fake"} <= set(losses)



def test_list_weights_are_ms_ssim_exponents_or_learned_loss_files(tmp_path: Path) -> None:
    """``weights`` of a train.losses entry: MS-SSIM's per-scale exponents, LPIPS / DISTS' files (numbers refused)."""
    over = [f"path.root={ROOT}", f"path.experiments_root={tmp_path}"]
    opt = load_options(FIDELITY, over, is_train=True)
    assert list(opt["train"]["losses"][0]["weights"]) == [0.0448, 0.2856, 0.3001]
    with pytest.raises(OptionError) as info:
        load_options(FIDELITY, [*over, "train.losses.0.type=DISTSLoss"], is_train=True)
    assert "train.losses[0].weights[0]: expected a file path (str), got 0.0448" in str(info.value)

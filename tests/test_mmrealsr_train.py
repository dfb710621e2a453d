"""MMRealSRNetModel / MMRealSRGANModel: MMRealSR trained as its authors do, with their own option files.

The step is checked against the authors' ``optimize_parameters`` (tools/fixtures/make_mmrealsr_train_fixtures.py:
their MMRRDBNet / MMRRDBNet_decouple, losses and discriminator step on fixed versions): outputs, estimated degrees,
every logged loss and the gradients of both networks. Their two option files (tests/fixtures/mmrealsr_options)
validate and train through the command line with only paths and sizes overridden; a stopped and resumed run ends
with the same weights as one straight through; the options refuse what does not fit.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
import yaml
from conftest import ROOT, run_cli
from safetensors.torch import load_file
from test_gan import fake_vgg19_state_dict

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.archs import build_network
from anysr.cli import main
from anysr.data.transforms import tensor2img
from anysr.engine import checkpoint as ckpt
from anysr.errors import OptionError
from anysr.models import MMRealSRNetModel, build_model
from anysr.options import load_options

FIXTURES = ROOT / "tests" / "fixtures" / "mmrealsr_train"
OPTION_FILES = ROOT / "tests" / "fixtures" / "mmrealsr_options"
NET_FILE, GAN_FILE = OPTION_FILES / "MMRealSRNet_x4.yml", OPTION_FILES / "MMRealSRGAN_x4.yml"
NAMES = {NET_FILE: "MMRealSRNetModel_x4", GAN_FILE: "MMRealSRGANModel_x4"}  # the files' experiment names
# the released files with a narrow network, 32-pixel crops, a 4-pair pool (everything else as released)
SMALL = ["network_g.num_feat=8", "network_g.num_block=1", "network_g.num_grow_ch=4", "network_g.num_feats=[8,8,8,16]",
         "network_g.num_blocks=[1,1,1,1]", "gt_size=32", "datasets.train.gt_size=32", "queue_size=4",
         "datasets.train.batch_size_per_gpu=2", "datasets.train.num_worker_per_gpu=0", "accelerator=cpu",
         "num_gpu=1", "logger.use_tb_logger=false", "train.precision=fp32", "train.channels_last=false",
         "path.pretrain_network_g=null", "network_d.num_feat=4"]


def _fixture() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The fixture's tensors (weights back to float32) and manifest."""
    t = load_file(str(FIXTURES / "train.safetensors"))
    return {k: v.float() for k, v in t.items()}, json.loads((FIXTURES / "manifest.json").read_text())


def _sample(grad: torch.Tensor, full: int) -> torch.Tensor:
    """The entries of a gradient the fixture keeps (all up to ``full``, else about 1024 evenly strided)."""
    return grad.flatten()[:: 1 if grad.numel() <= full else grad.numel() // 1024]


def _close(a: torch.Tensor, b: torch.Tensor, what: str, rel: float = 1e-4) -> None:
    a = a.detach()
    scale = float(b.abs().max()) or 1.0
    assert a.shape == b.shape, f"{what}: shape {tuple(a.shape)} vs {tuple(b.shape)}"
    assert float((a - b).abs().max()) <= rel * scale + 1e-7, f"{what}: differs by {float((a - b).abs().max())}"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, small_train_dir: Path) -> Path:
    """A folder with the training images, their meta_info list and a stand-in VGG19 file."""
    out = tmp_path_factory.mktemp("mmrealsr")
    names = sorted(p.name for p in small_train_dir.glob("*.png"))[:6]
    (out / "meta_info.txt").write_text("".join(f"{n}\n" for n in names))
    torch.save(fake_vgg19_state_dict(), out / "vgg19.pth")
    return out


def _paths(root: Path, train_dir: Path, file: Path) -> list[str]:
    out = [f"datasets.train.dataroot_gt={train_dir}", f"datasets.train.meta_info={root / 'meta_info.txt'}",
           f"path.root={root}"]
    return out + ([f"train.perceptual_opt.vgg_weights_path={root / 'vgg19.pth'}"] if file == GAN_FILE else [])


def _args(root: Path, train_dir: Path, file: Path) -> list[str]:
    """The released file's overrides here: paths, and the small sizes (the Net file has no discriminator)."""
    small = [s for s in SMALL if file == GAN_FILE or not s.startswith("network_d")]
    return [*_paths(root, train_dir, file), *small]


def _load(root: Path, train_dir: Path, file: Path, *over: str) -> Any:
    return load_options(file, [*_args(root, train_dir, file), *over], is_train=True)


# ----------------------------------------------------------------------------- the step against the authors'

def _model(opt: Any) -> Any:
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    acc.setup()
    model = build_model(opt, acc)
    ckpt.load_model_weights(model, fresh=True, stand_ins=True)
    model.setup()
    model.update_learning_rate(1)
    return model


def _step_options(root: Path, train_dir: Path, file: Path, man: dict[str, Any]) -> Any:
    net = {k: v for k, v in man["net"].items() if k not in ("num_in_ch", "num_out_ch", "scale")}
    over = [f"network_g.{k}={json.dumps(v)}" for k, v in net.items()]
    over += ["queue_size=0", "train.ema_decay=0", f"train.rank_opt_anchor.loss_weight={man['anchor_weight']}",
             "train.pixel_opt.loss_weight=1.0"]
    if file == GAN_FILE:
        over += ["train.perceptual_opt=null", "l1_gt_usm=false", "percep_gt_usm=false", "gan_gt_usm=false",
                 "train.gan_opt.loss_weight=0.1"]
    return _load(root, train_dir, file, *over)


def test_anchored_forward_equals_the_authors_training_network() -> None:
    t, man = _fixture()
    net = build_network({"type": "MMRRDBNet", **man["net"]})
    net.load_state_dict({k[4:]: v for k, v in t.items() if k.startswith("net.")}, strict=True)
    out, degrees = net(t["lq"], t["anchor"])
    _close(out, t["net_output"], "output")
    _close(degrees[:, :3], t["net_degrees"], "degrees")
    plain = net(t["lq"][:, 0])  # inference: the estimates steer (the anchors' pinned degrees do not)
    assert plain.shape == (2, 3, 32, 32)


@pytest.mark.parametrize("file", [NET_FILE, GAN_FILE], ids=["net", "gan"])
def test_step_equals_the_authors_optimize_parameters(root: Path, small_train_dir: Path, file: Path) -> None:
    """One train_step on the fixture's versions: every logged loss and the gradients of both networks."""
    t, man = _fixture()
    model = _model(_step_options(root, small_train_dir, file, man))
    net = model.bare("net_g")
    net.load_state_dict({k[4:]: v for k, v in t.items() if k.startswith("net.")}, strict=True)
    if file == GAN_FILE:
        model.bare("net_d").load_state_dict({k[6:]: v for k, v in t.items() if k.startswith("net_d.")}, strict=True)
    losses = model.train_step([{"lq": t["lq"], "anchor": t["anchor"], "gt": t["gt"]}])
    want = man["net_losses" if file == NET_FILE else "gan_losses"]
    assert set(losses) == set(want)
    for k, v in want.items():
        assert float(losses[k]) == pytest.approx(v, rel=1e-4, abs=1e-7), k
    prefix = "net_grad." if file == NET_FILE else "gan_grad."
    grads = {k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)}
    for k, p in net.named_parameters():
        if k in grads:
            _close(_sample(p.grad, man["full"]), grads[k], f"grad {k}", rel=1e-3)
        else:  # the frozen estimator (MMRRDBNet_decouple): no gradient, not trained
            assert file == GAN_FILE and k in man["gan_no_grad"] and not p.requires_grad and p.grad is None, k
    if file == GAN_FILE:
        for k, p in model.bare("net_d").named_parameters():
            _close(_sample(p.grad, man["full"]), t[f"d_grad.{k}"], f"D grad {k}", rel=1e-3)


# ----------------------------------------------------------------------------- the options

def test_released_files_validate_as_they_are(root: Path, small_train_dir: Path) -> None:
    for file in (NET_FILE, GAN_FILE):
        raw = yaml.safe_load(file.read_text())
        opt = load_options(file, [*_paths(root, small_train_dir, file), "path.pretrain_network_g=null"],
                           is_train=True)
        assert opt.model_type == raw["model_type"] and opt.datasets.train.type == "MMRealSRGANDataset"
        assert opt.network_g.type == "MMRealSR" and opt.network_g.num_feats == [64, 64, 64, 128]
        assert opt.network_g.get("freeze_estimator", False) is (file == GAN_FILE)  # MMRRDBNet_decouple
        assert dict(opt.train.rank_opt_b) == {"type": "MarginRankingLoss", "loss_weight": 0.01, "margin": 0.05,
                                              "reduction": "mean"}
        assert opt.jpeg_diff_range == [5.0, 60.0] and opt.gaussian_noise_diff_range == [1.0, 21.0]
        # the start-up line: "network presets expanded: network_g.type MMRRDBNet (the MMRealSR authors' name) -> ..."
        assert opt.mapped_keys_from == "presets"
        assert opt.mapped_keys[0].startswith(f"network_g.type {raw['network_g']['type']} (the MMRealSR authors' name) "
                                             "-> MMRealSR(")


@pytest.mark.parametrize(("over", "pattern"), [
    (["model_type=RealESRNetModel"], r"train\.rank_opt: is read only by MMRealSRNetModel / MMRealSRGANModel"),
    (["model_type=RealESRNetModel"], r"MMRealSRGANDataset draws MMRealSR's kernel triples"),
    (["datasets.train.type=RealESRGANDataset"], r"synthesises its LQ versions from MMRealSRGANDataset"),
    (["train.rank_opt_anchor=null"], r"train\.rank_opt_anchor: missing"),
    (["train.rank_opt=null"], r"train\.rank_opt_b: is read with train\.rank_opt"),
    (["train.rank_opt.type=L1Loss"], r"train\.rank_opt\.type"),
    (["jpeg_diff_range=[60,5]"], r"jpeg_diff_range: must be \[low, high\]"),
])
def test_mistakes_are_named(root: Path, small_train_dir: Path, over: list[str], pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern):
        _load(root, small_train_dir, NET_FILE, *over)


def test_other_models_refuse_the_ranking_keys(root: Path, small_train_dir: Path) -> None:
    with pytest.raises(OptionError, match=r"gaussian_noise_diff_range: is read only by MMRealSRNetModel"):
        _load(root, small_train_dir, NET_FILE, "model_type=RealESRNetModel", "gaussian_noise_diff_range=[1,5]",
              "datasets.train.type=RealESRGANDataset", "train.rank_opt=null", "train.rank_opt_b=null",
              "train.rank_opt_anchor=null")


def test_network_must_estimate_blur_and_noise(root: Path, small_train_dir: Path) -> None:
    opt = _load(root, small_train_dir, NET_FILE, "network_g.num_degradation=3")
    with pytest.raises(OptionError, match=r"network_g\.num_degradation: MMRealSR's losses rank blur and noise"):
        _model(opt)


# ----------------------------------------------------------------------------- through the command line

def _train(root: Path, train_dir: Path, file: Path, sub: str, *extra: str, resume: bool = False) -> Path:
    work = root / sub
    work.mkdir(exist_ok=True)
    args = ["train", "-opt", str(file), "--force_yml", *_args(root, train_dir, file), f"path.root={work}", *extra]
    run_cli(*args, *(["--auto_resume"] if resume else []), cwd=work)
    return work / "experiments" / NAMES[file]


@pytest.mark.parametrize("file", [NET_FILE, GAN_FILE], ids=["net", "gan"])
@pytest.mark.slow
def test_released_file_trains_and_resumes_exactly(root: Path, small_train_dir: Path, file: Path) -> None:
    """4 iterations straight vs 2, stop, resume to 4 (the pool fills at 2): the same weights and EMA, bit for bit;
    every loss of the authors' log; the trained weights run in ``anysr infer``."""
    common = ["logger.print_freq=1", "logger.save_checkpoint_freq=2"]
    tag = "net" if file == NET_FILE else "gan"
    exp_a = _train(root, small_train_dir, file, f"{tag}_a", *common, "train.total_iter=4")
    _train(root, small_train_dir, file, f"{tag}_b", *common, "train.total_iter=2")
    exp_b = _train(root, small_train_dir, file, f"{tag}_b", *common, "train.total_iter=4", resume=True)
    summary = json.loads((exp_a / "summary.json").read_text())
    keys = {"l_ranking_blur", "l_ranking_noise", "l_anchor_min", "l_anchor_max"}
    keys |= {"l_pix"} if file == NET_FILE else {"l_g_pix", "l_g_percep", "l_g_gan", "l_d_real", "l_d_fake"}
    assert keys <= set(summary["final_losses"]) and all(np.isfinite(v) for v in summary["final_losses"].values())
    a = load_file(str(exp_a / "models" / "net_g_4.safetensors"))
    b = load_file(str(exp_b / "models" / "net_g_4.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ"
    if file == GAN_FILE:  # the frozen estimator kept its (here: initial) weights
        first = load_file(str(exp_a / "models" / "net_g_2.safetensors"))
        assert all(torch.equal(first[k], a[k]) for k in a if k.startswith("params.de_net."))
    out = root / f"{tag}_out"
    run_cli("infer", "-i", str(sorted(small_train_dir.glob("*.png"))[0]), "-o", str(out), "--weights",
            str(exp_a / "models" / "net_g_4.safetensors"), cwd=root)
    assert len(list(out.iterdir())) == 1


@pytest.mark.slow
def test_versions_synthesised_in_a_loader_worker_train(root: Path, small_train_dir: Path) -> None:
    """``degrade_in: loader`` (what XLA uses): MMRealSRGANDataset synthesises the five versions in a worker."""
    exp = _train(root, small_train_dir, NET_FILE, "loader", "degrade_in=loader", "datasets.train.num_worker_per_gpu=1",
                 "train.total_iter=2", "logger.save_checkpoint_freq=2")
    summary = json.loads((exp / "summary.json").read_text())
    assert summary["iterations_done"] == 2 and np.isfinite(summary["final_losses"]["l_ranking_blur"])


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(root: Path, small_train_dir: Path) -> None:
    """The Net file with a global batch of 2 and 2 pool rows: one process, or two ranks of 1 with half the pool
    each (per-sample draws from the samples' seeds, the batch's from the iteration): the same weights."""
    common = ["train.total_iter=3", "logger.print_freq=3", "logger.save_checkpoint_freq=3"]
    one = _train(root, small_train_dir, NET_FILE, "ranks_1", *common)
    two = _train(root, small_train_dir, NET_FILE, "ranks_2", *common, "num_gpu=2",
                 "datasets.train.batch_size_per_gpu=1", "queue_size=2")
    assert json.loads((two / "summary.json").read_text())["accelerator"]["world_size"] == 2
    a, b = (load_file(str(exp / "models" / "net_g_3.safetensors")) for exp in (one, two))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow
def test_prepare_degrade_shows_what_the_step_trains_on(root: Path, small_train_dir: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """`anysr prepare degrade` on the Net file writes the five versions and the GT each step trained on, pool
    included, and the seven kernels."""
    seen: list[list[np.ndarray]] = []
    original = MMRealSRNetModel.anchored_targets

    def record(self: Any, parts: dict[str, torch.Tensor]) -> dict[str, Any]:
        for j in range(parts["lq"].shape[0]):
            versions = torch.cat([parts["lq"][j], parts["anchor"][j]])
            seen.append([tensor2img(v) for v in versions] + [tensor2img(parts["gt"][j])])
        return original(self, parts)

    monkeypatch.setattr(MMRealSRNetModel, "anchored_targets", record)
    work = root / "shown"
    work.mkdir()
    args = ["-opt", str(NET_FILE), "--force_yml", *_args(root, small_train_dir, NET_FILE), f"path.root={work}",
            "gt_usm=false"]
    assert main(["train", *args, "train.total_iter=3", "logger.save_checkpoint_freq=3"]) == 0
    assert len(seen) == 6
    proc = run_cli("prepare", "degrade", *args, "--out", str(work / "pairs"), "-n", "6", cwd=work)
    assert "wrote 6 LQ/GT pair(s)" in proc.stdout
    out = work / "pairs"
    names = ["lq_origin", "lq_blur", "lq_noise", "anchor_clean", "anchor_degraded", "gt"]
    for j, images in enumerate(seen):  # pairs 4, 5 come out of the full pool
        for name, img in zip(names, images):
            assert np.array_equal(cv2.imread(str(out / f"{j:04d}_{name}.png")), img), (j, name)
        assert cv2.imread(str(out / f"{j:04d}_kernel1_max.png"), cv2.IMREAD_GRAYSCALE).max() == 255
    meta = json.loads((out / "degrade.json").read_text())
    assert meta["versions"] == names[:-1] and meta["pairs"][0]["batch_draws"]["updown1"] in ("up", "down", "keep")


@pytest.mark.slow
def test_bench_times_the_anchored_step(root: Path, small_train_dir: Path) -> None:
    """`anysr bench` builds the five versions from its synthetic batch (it raised "an LQ but no anchor")."""
    out = root / "bench.json"
    run_cli("bench", "-opt", str(NET_FILE), "--iters", "2", "--warmup", "1", "--infer-size", "16", "--json", str(out),
            "--force_yml", *_args(root, small_train_dir, NET_FILE), cwd=root)
    train = json.loads(out.read_text())["train"]
    assert train["batch_size"] == 2 and train["images_per_s"] > 0


@pytest.mark.slow
def test_gan_stage_starts_from_the_net_stage(root: Path, small_train_dir: Path) -> None:
    """The authors' recipe: the GAN file's pretrain_network_g (param_key_g params_ema, strict) is the Net stage's
    file; the estimator the Net stage trained stays as it was (frozen)."""
    net = _train(root, small_train_dir, NET_FILE, "stage_net", "train.total_iter=2", "logger.save_checkpoint_freq=2")
    weights = net / "models" / "net_g_2.safetensors"
    gan = _train(root, small_train_dir, GAN_FILE, "stage_gan", "train.total_iter=2", "logger.save_checkpoint_freq=2",
                 f"path.pretrain_network_g={weights}")
    log = "\n".join(p.read_text() for p in (gan / "log").glob("train_*.log"))
    assert f"loaded pretrained weights {weights} [params_ema] (net_g)" in log
    start, end = load_file(str(weights)), load_file(str(gan / "models" / "net_g_2.safetensors"))
    estimator = [k for k in end if k.startswith("params.de_net.")]
    assert estimator and all(torch.equal(end[k], start[k.replace("params.", "params_ema.", 1)]) for k in estimator)

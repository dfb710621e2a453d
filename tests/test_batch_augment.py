"""Batch augmentations (train.use_moa): the operators on given draws, the counter draws, the options, training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import kill_then_resume, run_cli, tiny_train_options, write_options
from safetensors.torch import load_file, save_file
from test_gan import fake_vgg19_state_dict, gan_options
from test_realesrgan import real_options

from anysr.cli import main
from anysr.data.batch_augment import BatchAugment, draw_augment
from anysr.errors import OptionError
from anysr.ops import augment as A
from anysr.options import validate_options
from anysr.options.augment import AUGMENT_NAMES

ALL = ("none", "mixup", "cutmix", "resizemix", "cutblur", "rgb")


def _pair(b: int = 4, h: int = 8, w: int = 10, s: int = 2, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, 3, h, w, generator=g), torch.rand(b, 3, h * s, w * s, generator=g)


def _draw(kind: str, b: int = 4, box: list[int] | None = None, lam: float = 0.3,
          perm: list[int] | None = None) -> A.AugmentDraw:
    return A.AugmentDraw(torch.full((b,), A.AUGMENTS.index(kind), dtype=torch.int64), torch.full((b,), lam),
                         torch.tensor([box or [0, 0, 0, 0]] * b), torch.tensor([1, 0, 3, 2][:b]),
                         torch.tensor([perm or [0, 1, 2]] * b))


# ---------------------------------------------------------------------------------------------- operators
def test_names_agree() -> None:
    assert A.AUGMENTS == AUGMENT_NAMES


def test_box_mask() -> None:
    m = A.box_mask(torch.tensor([[1, 2, 3, 5]]), 8, 12, scale=2)
    assert m.shape == (1, 1, 8, 12) and m.dtype == torch.bool
    ref = torch.zeros(8, 12, dtype=torch.bool)
    ref[2:6, 4:10] = True
    assert torch.equal(m[0, 0], ref)


def test_mixup_exact() -> None:
    lq, gt = _pair()
    partner, lam = torch.tensor([1, 0, 3, 2]), torch.tensor([0.4, 0.5, 0.6, 1.0])
    mlq, mgt = A.mixup(lq, gt, partner, lam)
    torch.testing.assert_close(mlq, lam.view(-1, 1, 1, 1) * lq + (1 - lam.view(-1, 1, 1, 1)) * lq[partner])
    torch.testing.assert_close(mgt, lam.view(-1, 1, 1, 1) * gt + (1 - lam.view(-1, 1, 1, 1)) * gt[partner])
    assert torch.equal(mlq[3], lq[3]) and torch.equal(mgt[3], gt[3])  # lam 1: the sample itself, exactly


def test_cutmix_exact() -> None:
    lq, gt = _pair()
    box = torch.tensor([[1, 2, 5, 7]] * 4)
    partner = torch.tensor([1, 0, 3, 2])
    mlq, mgt = A.cutmix(lq, gt, partner, box)
    ref_lq, ref_gt = lq.clone(), gt.clone()
    ref_lq[:, :, 1:5, 2:7] = lq[partner][:, :, 1:5, 2:7]
    ref_gt[:, :, 2:10, 4:14] = gt[partner][:, :, 2:10, 4:14]
    assert torch.equal(mlq, ref_lq) and torch.equal(mgt, ref_gt)


def test_resizemix_matches_interpolate() -> None:
    lq, gt = _pair()
    box = torch.tensor([[1, 2, 6, 8]] * 4)
    partner = torch.tensor([1, 0, 3, 2])
    mlq, mgt = A.resizemix(lq, gt, partner, box)
    small_lq = F.interpolate(lq[partner], size=(5, 6), mode="bicubic", antialias=True).clamp(0, 1)
    small_gt = F.interpolate(gt[partner], size=(10, 12), mode="bicubic", antialias=True).clamp(0, 1)
    torch.testing.assert_close(mlq[:, :, 1:6, 2:8], small_lq, atol=2e-6, rtol=0)
    torch.testing.assert_close(mgt[:, :, 2:12, 4:16], small_gt, atol=2e-6, rtol=0)
    outside = ~A.box_mask(box, 8, 10).expand_as(lq)
    assert torch.equal(mlq[outside], lq[outside])


@pytest.mark.parametrize("scale", [1, 2, 4])
def test_cutblur_pastes_downscaled_gt_into_lq(scale: int) -> None:
    lq, gt = _pair(s=scale)
    box = torch.tensor([[2, 1, 7, 9]] * 4)
    mlq, mgt = A.cutblur(lq, gt, box)
    assert mgt is gt
    down = gt if scale == 1 else F.interpolate(gt, size=(8, 10), mode="bicubic", antialias=True)
    torch.testing.assert_close(mlq[:, :, 2:7, 1:9], down[:, :, 2:7, 1:9], atol=2e-6, rtol=0)
    outside = ~A.box_mask(box, 8, 10).expand_as(lq)
    assert torch.equal(mlq[outside], lq[outside])


def test_permute_channels_exact() -> None:
    lq, _ = _pair()
    perm = torch.tensor([[2, 0, 1], [1, 2, 0], [0, 2, 1], [2, 1, 0]])
    out = A.permute_channels(lq, perm)
    for b in range(4):
        assert torch.equal(out[b], lq[b, perm[b]])


def test_apply_augment_equals_each_operator() -> None:
    """The one-graph form gives each operator's result exactly, and 'none' the inputs themselves."""
    lq, gt = _pair()
    box = [1, 2, 6, 8]
    partner = torch.tensor([1, 0, 3, 2])
    boxes = torch.tensor([box] * 4)
    refs = {
        "mixup": A.mixup(lq, gt, partner, torch.full((4,), 0.3)),
        "cutmix": A.cutmix(lq, gt, partner, boxes),
        "resizemix": A.resizemix(lq, gt, partner, boxes),
        "cutblur": A.cutblur(lq, gt, boxes),
        "rgb": (lq[:, [2, 0, 1]], gt[:, [2, 0, 1]]),
        "none": (lq, gt),
    }
    for kind, (rlq, rgt) in refs.items():
        draw = _draw(kind, box=[0, 0, 8, 10] if kind == "mixup" else ([0, 0, 0, 0] if kind in ("none", "rgb")
                                                                     else box),
                     perm=[2, 0, 1] if kind == "rgb" else None)
        out_lq, (out_gt,) = A.apply_augment(lq, [gt], draw, ALL)
        assert out_lq.shape == lq.shape and out_gt.shape == gt.shape
        assert torch.equal(out_lq, rlq), kind
        assert torch.equal(out_gt, rgt), kind


def test_apply_augment_mixed_kinds_per_sample() -> None:
    lq, gt = _pair()
    draw = A.AugmentDraw(torch.tensor([0, 2, 4, 1]), torch.full((4,), 0.5), torch.tensor([[0, 0, 0, 0], [1, 1, 4, 4],
                                                                                          [2, 2, 6, 6], [0, 0, 8, 10]]),
                         torch.tensor([1, 0, 3, 2]), torch.tensor([[0, 1, 2]] * 4))
    out_lq, (out_gt,) = A.apply_augment(lq, [gt], draw, ALL)
    assert torch.equal(out_lq[0], lq[0]) and torch.equal(out_gt[0], gt[0])
    assert torch.equal(out_lq[1, :, 1:4, 1:4], lq[0, :, 1:4, 1:4])
    assert torch.equal(out_gt[2], gt[2])  # cutblur keeps the GT
    torch.testing.assert_close(out_lq[3], 0.5 * lq[3] + 0.5 * lq[2])


def test_bad_sizes_are_refused() -> None:
    lq, _ = _pair()
    with pytest.raises(ValueError, match="integer multiple"):
        A.cutmix(lq, torch.rand(4, 3, 17, 20), torch.tensor([1, 0, 3, 2]), torch.zeros(4, 4, dtype=torch.int64))


# ---------------------------------------------------------------------------------------------- draws
def _draws(probs: list[float], iteration: int, first: int = 0, b: int = 4) -> A.AugmentDraw:
    return draw_augment(list(ALL), probs, 7, iteration, 0, first, b, 3, (16, 16))


def test_draws_are_a_function_of_the_counter() -> None:
    probs = [1.0] * 6
    for it in range(20):
        a, b = _draws(probs, it), _draws(probs, it)
        for x, y in zip((a.kind, a.lam, a.box, a.partner, a.perm), (b.kind, b.lam, b.box, b.partner, b.perm),
                        strict=True):
            assert torch.equal(x, y)


def test_two_ranks_draw_what_one_process_draws() -> None:
    probs = [0.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    for it in range(40):
        one = _draws(probs, it, 0, 4)
        r0, r1 = _draws(probs, it, 0, 2), _draws(probs, it, 2, 2)
        for name in ("kind", "lam", "box", "perm"):
            assert torch.equal(getattr(one, name), torch.cat([getattr(r0, name), getattr(r1, name)])), name
        assert torch.equal(one.partner, torch.cat([r0.partner, r1.partner + 2]))


def test_probabilities_are_respected() -> None:
    probs = [0.4, 0.084, 0.084, 0.084, 0.348, 0.0]
    n = 4000
    counts = np.bincount([int(_draws(probs, it, b=1).kind[0]) for it in range(n)], minlength=6) / n
    assert counts[5] == 0
    for p, c in zip(probs, counts, strict=True):
        assert abs(p - c) < 4 * np.sqrt(p * (1 - p) / n) + 1e-9


def test_parameter_ranges() -> None:
    seen: dict[str, list[Any]] = {k: [] for k in ALL}
    for it in range(300):
        d = _draws([0, 1, 1, 1, 1, 1], it, b=2)
        kind = ALL[int(d.kind[0])]
        box = d.box[0]
        assert (box >= 0).all() and (box[2:] <= 16).all() and (box[:2] <= box[2:]).all()
        seen[kind].append((float(d.lam[0]), box.tolist(), d.perm[0].tolist()))
    assert all(0.4 <= lam <= 0.6 and box == [0, 0, 16, 16] for lam, box, _ in seen["mixup"])
    assert all(perm != [0, 1, 2] and sorted(perm) == [0, 1, 2] for _, _, perm in seen["rgb"])
    assert all(box[2] - box[0] <= 15 for _, box, _ in seen["resizemix"])  # tau <= 0.9 of 16
    assert all(box[2] - box[0] <= 12 for _, box, _ in seen["cutblur"])  # <= 0.7 of 16
    assert all(len(v) > 20 for k, v in seen.items() if k != "none")


def test_batch_augment_on_a_batch() -> None:
    lq, gt = _pair()
    aug = BatchAugment(("mixup",), (1.0,), 3)
    batch = {"lq": lq, "gt": gt, "l1_gt": gt.clone(), "lq_path": ["a"] * 4}
    out = aug(batch, 5, 0, 0, ("gt", "l1_gt"))
    assert out["lq_path"] is batch["lq_path"] and not torch.equal(out["lq"], lq)
    assert torch.equal(out["gt"], out["l1_gt"])


def test_one_graph_and_drawn_kind_only_agree_bit_for_bit() -> None:
    """XLA computes every kind and selects; other devices compute the drawn one: the same bits."""
    lq, gt = _pair(b=4, h=16, w=16, s=3)
    for it in range(30):
        batch = {"lq": lq, "gt": gt}
        a = BatchAugment(ALL, (1.0,) * 6, 3, one_graph=True)(batch, it, 0, 0)
        b = BatchAugment(ALL, (1.0,) * 6, 3, one_graph=False)(batch, it, 0, 0)
        assert torch.equal(a["lq"], b["lq"]) and torch.equal(a["gt"], b["gt"]), it


# ---------------------------------------------------------------------------------------------- options
def _validate(tmp_path: Path, **train: Any) -> Any:
    opt = tiny_train_options("o", tmp_path, None)
    opt["train"].update(train)
    return validate_options(opt, is_train=True, root=tmp_path, check_paths=False)


def test_options_defaults_and_trainner_keys(tmp_path: Path) -> None:
    out = _validate(tmp_path)["train"]
    assert out["use_moa"] is False and list(out["moa_augs"]) == ["none", "mixup", "cutmix", "resizemix", "cutblur"]
    out = _validate(tmp_path, use_moa=True, moa_augs=["none", "mixup", "cutmix", "resizemix", "cutblur"],
                    moa_probs=[0.4, 0.084, 0.084, 0.084, 0.348], moa_debug=True, moa_debug_limit=100)["train"]
    assert out["use_moa"] is True and "moa_debug" not in out and "moa_debug_limit" not in out


@pytest.mark.parametrize(("train", "words"), [
    ({"moa_augs": ["none", "mixup"], "moa_probs": [1.0]}, ["train.moa_probs", "1 weights", "2 entries"]),
    ({"moa_augs": ["none", "downup"], "moa_probs": [1, 1]}, ["train.moa_augs", "downup", "remove it"]),
    ({"moa_augs": ["mixupp"], "moa_probs": [1]}, ["train.moa_augs", "mixupp", "cutblur"]),
    ({"moa_augs": ["mixup"], "moa_probs": [-1]}, ["train.moa_probs", ">= 0"]),
    ({"moa_augs": ["mixup"], "moa_probs": [0]}, ["train.moa_probs", "> 0"]),
])
def test_options_errors(tmp_path: Path, train: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(OptionError) as err:
        _validate(tmp_path, use_moa=True, **train)
    for word in words:
        assert word in str(err.value)


def test_batch_of_one_is_refused(tmp_path: Path, small_train_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    opt = tiny_train_options("one", small_train_dir, None, total_iter=2)
    opt["train"]["use_moa"] = True
    opt["datasets"]["train"]["batch_size_per_gpu"] = 1
    path = write_options(tmp_path / "one.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert "train.moa_augs" in err and "batch_size_per_gpu" in err


# ---------------------------------------------------------------------------------------------- training
def _moa(name: str, train_dir: Path, total: int, **extra: Any) -> dict[str, Any]:
    opt = tiny_train_options(name, train_dir, None, total_iter=total, **extra)
    opt["train"].update(use_moa=True, moa_augs=list(ALL), moa_probs=[1, 1, 1, 1, 1, 1])
    return opt


def _weights(tmp_path: Path, name: str, it: int) -> dict[str, torch.Tensor]:
    return load_file(str(tmp_path / "experiments" / name / "models" / f"net_g_{it}.safetensors"))


def test_trains_and_augments(tmp_path: Path, small_train_dir: Path) -> None:
    """A CLI run with use_moa trains, and differs from the same run without it."""
    on = write_options(tmp_path / "on.yml", _moa("on", small_train_dir, 4))
    off = write_options(tmp_path / "off.yml", tiny_train_options("off", small_train_dir, None, total_iter=4))
    for path in (on, off):
        assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    a, b = _weights(tmp_path, "on", 4), _weights(tmp_path, "off", 4)
    assert all(torch.isfinite(v).all() for v in a.values())
    assert any(not torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_kill_minus_nine_then_resume_matches(tmp_path: Path, small_train_dir: Path) -> None:
    total = 10
    ref = write_options(tmp_path / "ref.yml", _moa("ref", small_train_dir, total))
    run_cli("train", "-opt", str(ref), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    opt = _moa("killed", small_train_dir, total)
    opt["logger"]["save_checkpoint_freq"] = 1
    path = write_options(tmp_path / "k.yml", opt)
    assert kill_then_resume(path, tmp_path, "killed") < total  # killed mid-run
    a, b = _weights(tmp_path, "killed", total), _weights(tmp_path, "ref", total)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(tmp_path: Path, small_train_dir: Path) -> None:
    for name, gpus, batch in (("one", 1, 4), ("two", 2, 2)):
        opt = _moa(name, small_train_dir, 4, num_gpu=gpus)
        opt["datasets"]["train"]["batch_size_per_gpu"] = batch
        path = write_options(tmp_path / f"{name}.yml", opt)
        run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    a, b = _weights(tmp_path, "one", 4), _weights(tmp_path, "two", 4)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.slow
def test_esrgan_with_moa_resumes_bit_exact(tmp_path: Path, small_train_dir: Path) -> None:
    """SRGANModel's step augments too (the discriminator's real images included); N+M == N, resume, M."""
    vgg_file = tmp_path / "vgg19.safetensors"
    save_file(fake_vgg19_state_dict(), str(vgg_file))

    def opt(name: str, total: int) -> Path:
        o = gan_options(name, small_train_dir, vgg_file, total_iter=total)
        o["train"].update(use_moa=True, moa_augs=list(ALL), moa_probs=[1, 1, 1, 1, 1, 1])
        return write_options(tmp_path / f"{name}.yml", o)

    assert main(["train", "-opt", str(opt("straight", 4)), "--force_yml", f"path.root={tmp_path}"]) == 0
    split = opt("split", 2)
    assert main(["train", "-opt", str(split), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert main(["train", "-opt", str(split), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.total_iter=4"]) == 0
    a, b = _weights(tmp_path, "straight", 4), _weights(tmp_path, "split", 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_realesrgan_with_moa_trains(tmp_path: Path, small_train_dir: Path) -> None:
    """RealESRGANModel: the synthesised pair and its USM-sharpened targets are augmented alike."""
    o = real_options("real", small_train_dir, model="RealESRGANModel", total_iter=2)
    o["train"].update(use_moa=True, moa_augs=["cutblur", "mixup"], moa_probs=[1, 1])
    path = write_options(tmp_path / "real.yml", o)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}"]) == 0
    assert all(torch.isfinite(v).all() for v in _weights(tmp_path, "real", 2).values())


def test_video_models_refuse_it() -> None:
    from anysr.models.video import EDVRModel, VideoRecurrentModel

    for cls in (EDVRModel, VideoRecurrentModel):
        model = object.__new__(cls)
        model.opt = {"train": {"moa_augs": ["mixup"], "moa_probs": [1.0]}, "manual_seed": 0, "datasets": {}}
        with pytest.raises(OptionError, match="train.use_moa: .* trains on clips"):
            model._batch_augment()

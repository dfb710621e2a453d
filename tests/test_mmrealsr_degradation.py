"""MMRealSR's anchored degradation (anysr.data.degradation.mmrealsr) and its dataset against the authors' code.

Fixtures: tests/fixtures/mmrealsr_degradation/ (tools/fixtures/make_mmrealsr_degradation_fixtures.py runs the
authors' MMRealSRGANDataset and MMRealSRNetModel.feed_data and records their draws).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch
import yaml
from conftest import DATASETS
from safetensors.torch import load_file

from anysr.data import build_dataset, collate
from anysr.data.degradation.kernels import KernelParams, make_kernel
from anysr.data.degradation.mmrealsr import (
    ANCHOR_KERNELS,
    AnchoredChoices,
    AnchoredDraws,
    AnchoredLoaderSynthesis,
    AnchoredSettings,
    anchored_sample_rng,
    draw_anchored_choices,
    draw_anchored_kernel_params,
    draw_anchored_samples,
    synthesise_anchored,
)
from anysr.data.degradation.realesrgan import BlurSettings, DegradeStage, SynthesisSettings, step_rng
from anysr.errors import OptionError
from anysr.ops.degradation import USMSharp
from anysr.ops.diffjpeg import DiffJPEG
from anysr.options import load_options

FIX = Path(__file__).resolve().parent / "fixtures" / "mmrealsr_degradation"
KINDS = ["iso", "aniso", "generalized_iso", "generalized_aniso", "plateau_iso", "plateau_aniso"]


def _blur(stage: int) -> BlurSettings:
    data = json.loads((FIX / "kernels.json").read_text())["data"]
    return BlurSettings.from_basicsr(data, stage)


def _settings(*, gt_size: int = 64, anchor_usm: bool = False, noise: bool = True) -> AnchoredSettings:
    model = json.loads((FIX / "pipeline.json").read_text())["model"]
    if noise:
        model = {**model, "noise_range": [1, 30], "poisson_scale_range": [0.05, 3], "noise_range2": [1, 25],
                 "poisson_scale_range2": [0.05, 2.5]}
    diffs = ((1.0, 21.0), (0.05, 2.05)) if noise else ((0.0, 0.0), (0.0, 0.0))
    base = SynthesisSettings(4, gt_size, DegradeStage.from_basicsr(model, 1), DegradeStage.from_basicsr(model, 2),
                             0.8)
    return AnchoredSettings(base, (5.0, 60.0), *diffs, anchor_usm=anchor_usm)


def _params(d: dict[str, Any]) -> KernelParams:
    return KernelParams(d["kind"], d["size"], 21, **{k: v for k, v in d.items() if k not in ("kind", "size")})


# ------------------------------------------------------------------------------------------------- kernels
def test_kernels_equal_the_authors_for_their_parameters() -> None:
    meta = json.loads((FIX / "kernels.json").read_text())
    ref = load_file(str(FIX / "kernels.safetensors"))
    top1, top2 = _blur(1).blur_sigma[1], _blur(2).blur_sigma[1]
    for i, item in enumerate(meta["items"]):
        params = {k: _params(v) for k, v in item["params"].items()}
        for name in ANCHOR_KERNELS:
            ours = torch.from_numpy(make_kernel(params[name]).astype(np.float32))
            assert torch.allclose(ours, ref[f"{i}.{name}"], rtol=0, atol=2e-7), (i, name, params[name])
        for stage, top in (("1", top1), ("2", top2)):
            s, lg, mx = (params[f"kernel{stage}_{w}"] for w in ("small", "large", "max"))
            assert s.kind == lg.kind == mx.kind and s.size == lg.size == mx.size
            if s.kind == "sinc":
                assert s.omega_c > lg.omega_c and mx.omega_c == pytest.approx(math.pi / (3 if s.size < 13 else 5))
            else:
                assert mx.sigma_x == top and (math.isnan(s.beta) or s.beta == lg.beta == mx.beta)
                assert s.rotation == lg.rotation == mx.rotation


def _pair_ok(small: tuple[float, float], large: tuple[float, float], iso: bool, bound: float,
             lo_hi: tuple[float, float]) -> bool:
    gap = large[0] - small[0] if iso else (large[0] - small[0]) + (large[1] - small[1])
    lo, hi = lo_hi
    inside = all(lo - 1e-9 <= v <= hi + 1e-9 for v in (*small, *large))
    return inside and small[0] <= large[0] and small[1] <= large[1] and gap >= bound - 1e-9


def test_kernel_draws_match_the_authors_distribution() -> None:
    ref = json.loads((FIX / "stats.json").read_text())
    first, second = _blur(1), _blur(2)
    ours: dict[str, list[Any]] = {"kind": [], "small": [], "large": [], "omega": []}
    for seed in range(600):
        p = draw_anchored_kernel_params(np.random.default_rng([seed, 1]), first=first, second=second,
                                        final_sinc_prob=0.8, diff_lower_bound=0.1)
        for stage, blur in (("1", first), ("2", second)):
            s, lg = p[f"kernel{stage}_small"], p[f"kernel{stage}_large"]
            ours["kind"].append(s.kind)
            if s.kind == "sinc":
                assert s.omega_c > lg.omega_c >= math.pi / 5
                ours["omega"].append([s.omega_c, lg.omega_c])
                continue
            pair = ((s.sigma_x, s.sigma_y), (lg.sigma_x, lg.sigma_y))
            assert _pair_ok(*pair, not s.kind.endswith("aniso"), 0.1, blur.blur_sigma), (s, lg)
            ours["small"].append(pair[0])
            ours["large"].append(pair[1])
    # the reference's pairs obey the same rules (its ranges: stage 1 [0.2, 3], stage 2 [0.2, 1.5])
    for n, (kind, s, lg) in enumerate(zip(ref["kind"], ref["small"], ref["large"])):
        if kind != "sinc":
            assert _pair_ok(tuple(s), tuple(lg), not kind.endswith("aniso"), 0.1, (0.2, 3.0 if n % 2 == 0 else 1.5))
    for w in ref["omega"]:
        assert w is None or w[0] > w[1]
    # same distribution: kind frequencies and the mean sigmas (600 samples a stage; generous bounds)
    for kind in ("iso", "aniso", "sinc"):
        a = sum(k == kind for k in ours["kind"]) / len(ours["kind"])
        b = sum(k == kind for k in ref["kind"]) / len(ref["kind"])
        assert abs(a - b) < 0.05, (kind, a, b)
    for key in ("small", "large"):
        a = np.mean(ours[key], axis=0)
        b = np.mean([v for v in ref[key] if v is not None], axis=0)
        assert np.all(np.abs(a - b) < 0.12), (key, a, b)


def test_diff_lower_bound_wider_than_the_range_is_refused() -> None:
    with pytest.raises(OptionError, match="blur_kernel_diff_lower_bound"):
        draw_anchored_kernel_params(np.random.default_rng(0), first=_blur(1), second=_blur(2), final_sinc_prob=0.8,
                                    diff_lower_bound=2.0)


# ------------------------------------------------------------------------------------------------ synthesis
class _Recorded(AnchoredDraws):
    """Draws whose JPEG qualities are the reference's recorded ones (noise levels are 0 in the fixture)."""

    jpeg: tuple = ()

    def qualities(self, stage: int, settings: AnchoredSettings) -> tuple[list[float], list[float], float]:
        q = self.jpeg[4 * (stage - 1): 4 * stage]
        return list(q[0]), list(q[3]), q[2][0]


def _fixture_batch(call: dict[str, Any], kernels: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
    imgs = []
    for name in call["gt_files"]:
        img = cv2.imread(str(DATASETS / "T91" / "HR" / name))[:96, :96, ::-1]
        imgs.append(torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1).float() / 255.0)
    ks = {k: torch.stack([kernels[f"{i}.{k}"] for i in call["items"]]) for k in ANCHOR_KERNELS}
    return torch.stack(imgs).contiguous(), ks


def test_synthesis_equals_the_authors_feed_data() -> None:
    """With zero noise and the recorded host draws and JPEG qualities: 8-bit equal up to rare one-level flips.

    Measured (default and AVX2 kernels): every LQ equal; with gt_usm, 2 of 3072 anchor values and 1 of 24576 GT
    values one level apart (anysr's USM blurs in two separable passes, the authors' in one 2-D pass).
    """
    meta = json.loads((FIX / "pipeline.json").read_text())
    ref = load_file(str(FIX / "pipeline.safetensors"))
    kernels = load_file(str(FIX / "kernels.safetensors"))
    jpeger = DiffJPEG(differentiable=False)
    for n, call in enumerate(meta["calls"]):
        gt, ks = _fixture_batch(call, kernels)
        st = _settings(anchor_usm=call["gt_usm"], noise=False)
        c = call["choices"]
        choices = AnchoredChoices(**{**c, "scales1": tuple(c["scales1"])})
        base = draw_anchored_samples([0, 1], st)
        draws = _Recorded(base.u1, base.u2, base.field_seeds, base.gray1, base.gray2)
        object.__setattr__(draws, "jpeg", tuple(tuple(q) for q in call["jpeg"]))
        out = synthesise_anchored(gt, ks, settings=st, choices=choices, draws=draws, seeds=[0, 1],
                                  gens=[torch.Generator(), torch.Generator()], usm=USMSharp(), jpeger=jpeger)
        assert out["lq"].shape == (2, 3, 3, 16, 16) and out["anchor"].shape == (2, 2, 3, 16, 16)
        for key in ("lq", "anchor"):
            diff = ((out[key] * 255).round() - ref[f"{n}.{key}"].float()).abs()
            assert float(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.005, (n, key, c)
        if call["gt_usm"]:
            diff = ((out["gt"] * 255).round() - ref[f"{n}.gt"].float()).abs()
            assert float(diff.max()) <= 1 and float((diff > 0).float().mean()) < 0.001, n
        else:
            t, lft = c["top"] * 4, c["left"] * 4
            assert torch.equal(out["gt"], gt[..., t: t + 64, lft: lft + 64])


def test_noise_levels_and_jpeg_qualities_equal_the_authors_for_their_uniforms() -> None:
    """anysr's levels from the uniforms the authors' functions drew equal the levels they used (float32 there)."""
    st = _settings()
    noise = json.loads((FIX / "noise.json").read_text())
    for case in noise["cases"]:
        u = tuple((a, b, c, 0.0, 0.0) for a, b, c in zip(case["u_diff"], case["u_level"], case["u_gray"]))
        small, large, top = AnchoredDraws(u, u, (0,) * len(u)).levels(1, case["kind"] == "gaussian", case["diff"],
                                                                      st)
        ref = case["levels"]  # origin, blur, noise (large), max
        assert np.allclose(small, ref[0], rtol=1e-6, atol=1e-6) and ref[0] == ref[1], case
        assert np.allclose(large, ref[2], rtol=1e-6, atol=1e-6) and np.allclose(top, ref[3]), case
    for call in json.loads((FIX / "pipeline.json").read_text())["calls"]:
        d1, l1, d2, l2 = call["jpeg_uniforms"]
        draws = AnchoredDraws(tuple((0.0, 0.0, 0.0, a, b) for a, b in zip(d1, l1)),
                              tuple((0.0, 0.0, 0.0, a, b) for a, b in zip(d2, l2)), (0, 0))
        for stage, q in ((1, call["jpeg"][:4]), (2, call["jpeg"][4:])):
            small, large, lowest = draws.qualities(stage, st)
            assert np.allclose(small, q[0], rtol=1e-6) and q[1] == q[0] and np.allclose(large, q[3], rtol=1e-6)
            assert q[2] == [lowest] * 2, q


def test_per_sample_levels_follow_the_authors_formulas() -> None:
    st = _settings()
    draws = draw_anchored_samples(range(400), st)
    for stage, (lo, hi) in ((1, (1.0, 30.0)), (2, (1.0, 25.0))):
        small, large, top = draws.levels(stage, True, True, st)
        gaps = np.subtract(large, small)
        assert top == hi and np.all((gaps >= 1) & (gaps <= 21)) and min(small) >= lo and max(large) <= hi + lo
        same_s, same_l, _ = draws.levels(stage, True, False, st)
        assert same_s == same_l and lo <= min(same_s) and max(same_s) <= hi
        qs, ql, qmax = draws.qualities(stage, st)
        d = np.subtract(qs, ql)
        assert qmax == 30 and np.all((d >= 5) & (d <= 60)) and min(ql) >= 30 and max(qs) <= 95
    assert 0.3 < np.mean(draws.gray1) < 0.5  # gray_noise_prob 0.4
    # the second diff coin: always when the first did not differ, else 1 in 5
    coins = [draw_anchored_choices(step_rng(0, i, 0), st, (96, 96)) for i in range(400)]
    assert all(c.diff2 for c in coins if not c.diff1)
    assert 0.1 < np.mean([c.diff2 for c in coins if c.diff1]) < 0.3


def _gt_batch(n: int, size: int = 96) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    kernels = load_file(str(FIX / "kernels.safetensors"))
    imgs = []
    for name in sorted(p.name for p in (DATASETS / "T91" / "HR").glob("*.png"))[:40]:
        img = cv2.imread(str(DATASETS / "T91" / "HR" / name))
        if min(img.shape[:2]) >= size:
            imgs.append(torch.from_numpy(np.ascontiguousarray(img[:size, :size, ::-1])).permute(2, 0, 1) / 255.0)
        if len(imgs) == n:
            break
    return torch.stack(imgs).float(), {k: torch.stack([kernels[f"{i}.{k}"] for i in range(n)]) for k in ANCHOR_KERNELS}


def test_two_ranks_equal_one() -> None:
    """A batch synthesised whole equals its halves synthesised apart (same host draws, per-sample seeds)."""
    gt, ks = _gt_batch(4)
    jpeger, usm = DiffJPEG(differentiable=False), USMSharp()
    for it in range(3):
        st = _settings(anchor_usm=it == 1)

        def run(sl: slice, it: int = it, st: AnchoredSettings = st) -> dict[str, Any]:
            seeds = [10, 11, 12, 13][sl]
            return synthesise_anchored(gt[sl], {k: v[sl] for k, v in ks.items()}, settings=st,
                                       rng=step_rng(3, it, 0), seeds=seeds, gens=[torch.Generator() for _ in seeds],
                                       usm=usm, jpeger=jpeger)

        whole, lo, hi = run(slice(0, 4)), run(slice(0, 2)), run(slice(2, 4))
        assert whole["choices"] == lo["choices"] == hi["choices"]
        for key in ("lq", "anchor", "gt"):
            diff = (whole[key] - torch.cat([lo[key], hi[key]])).abs()
            assert float(diff.max()) <= 1 / 255 + 1e-6 and float((diff > 0).float().mean()) < 0.01, (it, key)
        assert all(torch.equal(a, b) for a, b in zip(run(slice(0, 4)).values(), whole.values())
                   if isinstance(a, torch.Tensor))


def test_loader_variant_equals_the_step_variant_with_its_draws() -> None:
    gt, ks = _gt_batch(1)
    st = _settings()
    synth = AnchoredLoaderSynthesis(st)
    one = synth(gt[0], {k: v[0] for k, v in ks.items()}, 77)
    step = synthesise_anchored(gt, ks, settings=st, rng=anchored_sample_rng(77), seeds=[77],
                               gens=[torch.Generator()], usm=USMSharp(), jpeger=DiffJPEG(differentiable=False))
    assert one["lq"].shape == (3, 3, 16, 16) and one["anchor"].shape == (2, 3, 16, 16)
    assert one["gt"].shape == (3, 64, 64)
    for key in ("lq", "anchor", "gt"):
        assert torch.equal(one[key], step[key][0]), key


# ------------------------------------------------------------------------------------------ dataset, options
def _authors_block(root: Path) -> dict[str, Any]:
    data = json.loads((FIX / "kernels.json").read_text())["data"]
    return {"name": "DF2K+OST", "type": "MMRealSRGANDataset", "dataroot_gt": str(root),
            "meta_info": [str(root / "meta1.txt"), str(root / "meta2.txt")], "io_backend": {"type": "disk"},
            **data, "gt_size": 64, "use_shuffle": True, "num_worker_per_gpu": 0, "batch_size_per_gpu": 2,
            "dataset_enlarge_ratio": 1, "prefetch_mode": None}


def _options(root: Path, block: dict[str, Any]) -> dict[str, Any]:
    return {"name": "mm", "model_type": "MMRealSRNetModel", "scale": 4, "accelerator": "cpu", "num_gpu": 1,
            "manual_seed": 0, "gt_size": 64, "queue_size": 4, "datasets": {"train": block},
            "network_g": {"type": "MMRealSR", "num_feat": 8, "num_block": 1, "num_grow_ch": 4,
                          "num_feats": [8, 8, 8, 16], "num_blocks": [1, 1, 1, 1]},
            "train": {"optim_g": {"type": "Adam", "lr": 1e-3}, "total_iter": 2,
                      "pixel_opt": {"type": "L1Loss", "loss_weight": 1.0}}}


def _load(tmp: Path, opt: dict[str, Any]) -> Any:
    path = tmp / "mm.yml"
    path.write_text(yaml.safe_dump(opt, sort_keys=False))
    return load_options(path, [f"path.root={tmp}"], is_train=True)


@pytest.fixture(scope="module")
def gt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mm_gt")
    names = sorted(p.name for p in (DATASETS / "T91" / "HR").glob("*.png"))[:4]
    for n in names:
        shutil.copy(DATASETS / "T91" / "HR" / n, root / n)
    (root / "meta1.txt").write_text("\n".join(names[:2]) + "\n")
    (root / "meta2.txt").write_text("\n".join(names[2:]) + "\n")
    return root


def _needs_the_models() -> None:
    from anysr.registry import MODEL_REGISTRY

    if "MMRealSRNetModel" not in MODEL_REGISTRY:
        pytest.skip("MMRealSRNetModel is not registered (anysr.models.mmrealsr)")


def test_the_authors_dataset_block_validates_and_builds(tmp_path: Path, gt_dir: Path) -> None:
    _needs_the_models()
    block = {**_authors_block(gt_dir), "crop_pad_size": 96, "random_scale": 0.5}
    opt = _load(tmp_path, _options(gt_dir, block))
    ds = build_dataset(opt.datasets.train, "datasets.train")
    assert len(ds) == 4 and ds.diff_lower_bound == 0.1 and ds.random_scale == 0.5
    a, b = ds[(1, 5)], ds[(1, 5)]
    assert set(a) == {"gt", *ANCHOR_KERNELS, "gt_path", "seed", "bits"} and a["gt"].shape == (3, 96, 96)
    assert all(torch.equal(a[k], b[k]) for k in ("gt", *ANCHOR_KERNELS))
    assert not torch.equal(ds[(1, 6)]["gt"], a["gt"])
    for k in ANCHOR_KERNELS:
        assert a[k].shape == (21, 21) and abs(float(a[k].sum()) - 1) < 1e-5
    assert set(ds.kernel_params(5)) == set(ANCHOR_KERNELS)
    # random_scale: a float Lanczos GT, said to be wider than 8 bits (the pool keeps it as float32)
    assert a["bits"] == 16 and not torch.equal((a["gt"] * 255).round() / 255, a["gt"])
    # the loader variant: fixed shapes, the same as the synthesis called on the plain item
    st = _settings()
    synth = AnchoredLoaderSynthesis(st)
    ds.attach_synthesis(synth)
    item = ds[(1, 5)]
    assert set(item) == {"lq", "anchor", "gt", "gt_path", "seed", "bits"}
    direct = synth(a["gt"], {k: a[k] for k in ANCHOR_KERNELS}, 5)
    assert all(torch.equal(item[k], direct[k]) for k in ("lq", "anchor", "gt"))
    batch = collate([ds[(i, 20 + i)] for i in range(3)])
    assert batch["lq"].shape == (3, 3, 3, 16, 16) and batch["anchor"].shape == (3, 2, 3, 16, 16)


def test_dataset_option_errors(tmp_path: Path, gt_dir: Path) -> None:
    _needs_the_models()
    def problem(block: dict[str, Any]) -> str:
        with pytest.raises(OptionError) as info:
            _load(tmp_path, _options(gt_dir, block))
        return str(info.value)

    base = _authors_block(gt_dir)
    assert "bogus_key" in problem({**base, "bogus_key": 1})
    assert "random_scale" in problem({**base, "random_scale": 1.5})
    assert "blur_kernel_diff_lower_bound" in problem({**base, "blur_kernel_diff_lower_bound": 2.0})
    plain = {**base, "type": "RealESRGANDataset"}
    assert "meta_info_file" in problem(plain)
    plain["meta_info"] = str(gt_dir / "meta1.txt")
    assert "random_scale" in problem({**plain, "random_scale": 0.5})


def test_random_rescale_follows_the_authors_loop() -> None:
    from anysr.data.mmrealsr_dataset import random_rescale

    img = np.full((300, 500, 3), 128, np.uint8)
    for seed in range(5):
        f = float(np.random.default_rng(seed).uniform(0.5, 1.0))
        while (300 * f < 400 or 500 * f < 400) and f < 1:  # the authors' loop: it can end above 1
            f += 0.1
        out = random_rescale(img, 0.5, 400, np.random.default_rng(seed))
        assert out.dtype == np.float32 and out.shape == (int(300 * f), int(500 * f), 3) and f >= 1
        assert np.allclose(out, 128 / 255, atol=1e-5)


def test_settings_from_options() -> None:
    model = json.loads((FIX / "pipeline.json").read_text())["model"]
    opt = {**model, "model_type": "MMRealSRNetModel"}
    st = AnchoredSettings.from_options(opt)
    assert st.anchor_usm and st.jpeg_diff_range == (5, 60) and st.gaussian_noise_diff_range == (1, 21)
    assert not AnchoredSettings.from_options({**opt, "model_type": "MMRealSRGANModel"}).anchor_usm
    with pytest.raises(OptionError, match="jpeg_diff_range"):
        AnchoredSettings.from_options({k: v for k, v in opt.items() if k != "jpeg_diff_range"})
    with pytest.raises(OptionError, match="thicklines_prob"):
        AnchoredSettings.from_options({**opt, "thicklines_prob": 0.5})

"""RealBasicVSR's clip degradation (``degradation: realbasicvsr``, anysr/data/degradation/realbasicvsr.py).

Reference equality on fixed draws against mmagic's classes (fixtures: tools/fixtures/make_realbasicvsr_fixtures.py),
the draws' distribution, determinism per sample seed (workers), the dataset and options, one-line errors, and a short
``anysr train`` of a tiny BasicVSR on it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import ROOT, run_cli
from video_data import make_reds

from anysr.data.degradation import realbasicvsr as rb
from anysr.data.degradation.realbasicvsr import (
    BlurDraw,
    ClipDraws,
    JPEGDraw,
    NoiseDraw,
    RealBasicVSRDegradation,
    RealBasicVSRSettings,
    ResizeDraw,
    VideoDraw,
)
from anysr.errors import AnysrError, DataError, OptionError
from anysr.options.video import RBVSR_KEYS

FIX = Path(__file__).parent / "fixtures" / "realbasicvsr"
META = json.loads((FIX / "reference.json").read_text())
REF = np.load(FIX / "reference.npz")
_TYPES = {"blur": BlurDraw, "resize": ResizeDraw, "noise": NoiseDraw, "jpeg": JPEGDraw, "video": VideoDraw}


class Replay:
    """The reference's noise arrays: ``np.random.RandomState(k)`` for the recorded ``k`` of each call."""

    def __init__(self, seeds: list[int]) -> None:
        self.seeds = list(seeds)

    def normal(self, shape: tuple[int, ...]) -> np.ndarray:
        return np.random.RandomState(self.seeds.pop(0)).randn(*shape)

    def poisson(self, lam: np.ndarray) -> np.ndarray:
        return np.random.RandomState(self.seeds.pop(0)).poisson(lam)


def as_draw(name: str, d: dict[str, Any]) -> Any:
    cls = _TYPES[rb._KIND[name]]
    fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in d.items() if k != "noise_seeds"}
    return cls(**fields)


# libx264, the codec whose results depended on earlier encodes in the process until compress_clip zero-filled the
# heap around each encode (video_codec.zero_filled_heap): the determinism tests use it for both compressions.
LIBX264 = {"video": {"codec": ["libx264"], "codec_prob": [1]}, "video2": {"codec": ["libx264"], "codec_prob": [1]}}


def model(extra: dict[str, Any] | None = None) -> RealBasicVSRDegradation:
    size = META["size"]
    return RealBasicVSRDegradation(RealBasicVSRSettings({**META["overrides"], **(extra or {})},
                                                        lq_size=(size // 4, size // 4), gt_size=size))


def frames(key: str) -> list[np.ndarray]:
    return [REF[f"{key}_{t}"] for t in range(META["frames"])]


def run(m: RealBasicVSRDegradation, case: dict[str, Any], names: list[str], x: list[np.ndarray]) -> list[np.ndarray]:
    for name in names:
        d = case["draws"][name]
        x = m.apply_stage(name, x, as_draw(name, d), Replay(d.get("noise_seeds", [])))
    return x


def rounded_close(ours: list[np.ndarray], ref: list[np.ndarray]) -> None:
    """What the next JPEG encodes (rounded to uint8) equal, but for values within float error of a half."""
    for a, b in zip(ours, ref):
        assert a.shape == b.shape
        diff = np.abs(np.clip(np.rint(a), 0, 255).astype(int) - b.astype(int))
        assert diff.max() <= 1 and (diff > 0).mean() < 1e-3


def test_kernels_equal_reference() -> None:
    """Every kernel kind, with drifting parameters over 3 frames (mmagic's RandomBlur.get_kernel)."""
    for j, d in enumerate(META["kernels"]):
        draw = as_draw("blur", d)
        for t in range(META["frames"]):
            k = rb.blur_kernel(draw.kind, draw.size, draw.sigma_x[t], draw.sigma_y[t], draw.rotation[t],
                               draw.beta[t], draw.omega[t])
            np.testing.assert_allclose(k, REF[f"kernel_{j}_{t}"], rtol=1e-6, atol=1e-9, err_msg=f"{d['kind']} {t}")
        assert len(set(draw.sigma_x)) == 3 or draw.kind == "sinc"  # the walk moved


@pytest.mark.parametrize("name", sorted(META["cases"]))
def test_stages_equal_reference(name: str) -> None:
    """Stage by stage from mmagic's input of the stage: unsharp masking and blur -> resize -> noise to 1e-3 (float),
    JPEG and video compression bit-exact, the shuffled final group to the end, then the whole pipeline."""
    case, m = META["cases"][name], model()
    clip = list(REF[f"clip_{name}"])
    usm = rb.unsharp_mask(clip, m.settings.params("unsharp"))
    if name == "a":
        np.testing.assert_allclose(np.stack(usm), REF["usm_a"], atol=1e-4)
    order = case["order"]
    x = run(m, case, ["blur", "resize", "noise"], usm)
    rounded_close(x, frames(f"{name}_noise"))
    if name == "a":
        for t in range(2):
            np.testing.assert_allclose(x[t], REF[f"a_noise_float_{t}"], atol=2e-3)
    for stage in ("jpeg", "video"):
        prev = "noise" if stage == "jpeg" else "jpeg"
        out = run(m, case, [stage], frames(f"{name}_{prev}"))
        same = len({f.shape for f in frames(f"{name}_{prev}")}) == 1
        for a, b in zip(out, frames(f"{name}_{stage}")):
            if stage == "jpeg" or same:
                np.testing.assert_array_equal(a, b)
            else:  # frames of drifting sizes: scaled by OpenCV here, by FFmpeg's (not reproducible) scaler there
                assert a.shape == b.shape and np.abs(a - b).mean() < 4
    x = run(m, case, ["blur2", "resize2", "noise2"], [f.astype(np.float32) for f in frames(f"{name}_video")])
    rounded_close(x, frames(f"{name}_noise2"))
    if name == "a":
        for t in range(2):
            np.testing.assert_allclose(x[t], REF[f"a_noise2_float_{t}"], atol=2e-3)
    out = run(m, case, ["jpeg2"], frames(f"{name}_noise2"))
    for a, b in zip(out, frames(f"{name}_jpeg2")):
        np.testing.assert_array_equal(a, b)
    out = run(m, case, order[9:], frames(f"{name}_jpeg2"))
    for a, b in zip(out, frames(f"{name}_final")):
        np.testing.assert_allclose(np.clip(a, 0, 255), b, atol=1e-3)
    # the whole pipeline from the clip, the reference's draws and noise
    draws = ClipDraws(tuple(order), {n: as_draw(n, d) for n, d in case["draws"].items()})
    seeds = [s for n in order for s in case["draws"][n].get("noise_seeds", [])]
    lq, gt = m.apply(clip, draws, Replay(seeds))
    for a, b in zip(lq, frames(f"{name}_final")):
        assert a.shape == (8, 8, 3) and np.abs(a - b).mean() < 0.5


def test_draws_follow_the_configured_distribution() -> None:
    """4000 clips' draws (no image work): stage chances, kernel / noise / resize-mode frequencies, ranges, drift."""
    m = RealBasicVSRDegradation(RealBasicVSRSettings(lq_size=(64, 64), gt_size=256))
    rng = np.random.default_rng(0)
    n, frames_ = 4000, 5
    draws = [m.draw(rng, frames_) for _ in range(n)]

    def near(count: int, p: float) -> bool:  # within 4.5 binomial standard deviations
        return abs(count - n * p) <= 4.5 * math.sqrt(n * p * (1 - p)) + 1

    for name, p in (("blur", 1.0), ("blur2", 0.8), ("final_blur", 0.8), ("resize", 1.0), ("noise2", 1.0)):
        assert near(sum(d.stages[name].applied for d in draws), p), name
    s = m.settings
    for kind, p in zip(s.params("blur")["kernel_list"], s.params("blur")["kernel_prob"]):
        assert near(sum(d.stages["blur"].kind == kind for d in draws), p), kind
    assert all(d.stages["final_blur"].kind == "sinc" for d in draws)
    assert near(sum(d.stages["noise"].kind == "poisson" for d in draws), 0.5)
    assert near(sum(d.stages["noise"].gray for d in draws), 0.4)
    assert near(sum(d.order[-1] == "video2" for d in draws), 0.5)
    modes = [d.stages["resize"].factors[0] for d in draws]
    for p, hit in ((0.2, lambda f: f > 1), (0.7, lambda f: f < 1), (0.1, lambda f: f == 1)):
        assert near(sum(hit(f) for f in modes), p)
    codecs = [d.stages["video"].codec for d in draws]
    for c in ("libx264", "h264", "mpeg4"):
        assert near(codecs.count(c), 1 / 3)
    for d in draws:
        b = d.stages["blur"]
        assert all(0.2 <= v <= 3 for v in b.sigma_x) and all(abs(u - v) <= 0.02 + 1e-12
                                                             for u, v in zip(b.sigma_x, b.sigma_x[1:]))
        if b.kind.startswith("generalized"):
            assert all(0.5 <= v <= 4 for v in b.beta)
        r = d.stages["resize"]
        assert all(0.15 <= f <= 1.5 for f in r.factors) and all(abs(u - v) <= 0.015 + 1e-12
                                                                for u, v in zip(r.factors, r.factors[1:]))
        q = d.stages["jpeg"].quality
        assert all(30 <= v <= 95 for v in q) and all(abs(u - v) <= 4 for u, v in zip(q, q[1:]))
        assert 10_000 <= d.stages["video2"].bitrate <= 100_000
        lo, hi = (1, 30) if d.stages["noise"].kind == "gaussian" else (0.05, 3)
        assert all(lo <= v <= hi for v in d.stages["noise"].levels)
        sinc = d.stages["final_blur"]
        assert all(3.1416 / 3 <= v <= 3.1416 for v in sinc.omega)
    gaps = [abs(u - v) for d in draws for u, v in zip(d.stages["blur"].omega, d.stages["blur"].omega[1:])]
    assert max(gaps) <= 0.0628 + 1e-12 and np.mean(gaps) > 0.01


def _clip(n: int = 4) -> list[np.ndarray]:
    return [np.ascontiguousarray(REF["clip_a"][t % 3]) for t in range(n)]


def test_drifting_sizes() -> None:
    """A resize whose factor drifts gives each frame its own even size; the codec then takes them all at the first
    frame's size (resized by OpenCV first, the same result on every call)."""
    frames_ = [np.full((40, 40, 3), 100 + 20 * t, np.float32) for t in range(3)]
    p = {"target_size": None, "is_size_even": True}
    out = rb.apply_resize(frames_, ResizeDraw(True, "area", (1.0, 0.93, 0.8)), p)
    assert [f.shape[:2] for f in out] == [(40, 40), (36, 36), (32, 32)]
    draw = VideoDraw("libx264", 20000)
    a, b = rb.apply_video(out, draw), rb.apply_video(out, draw)
    assert all(f.shape == (40, 40, 3) and f.dtype == np.float32 for f in a)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert abs(float(a[2].mean()) - 140) < 3


def test_same_seed_same_clip_in_any_worker() -> None:
    """The LQ of a seed is a function of the seed: twice in this process, and in DataLoader worker processes."""
    m = model(LIBX264)
    clip = _clip()
    a, ga = m(clip, 5)
    b, gb = m(clip, 5)
    c, _ = m(clip, 6)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and all(np.array_equal(x, y) for x, y in zip(ga, gb))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    loader = torch.utils.data.DataLoader(_Seeds(m, clip), batch_size=None, num_workers=2)
    for seed, lq in loader:
        want, _ = m(clip, int(seed))
        assert torch.equal(lq, torch.from_numpy(np.stack(want))), seed


class _Seeds(torch.utils.data.Dataset):
    def __init__(self, m: RealBasicVSRDegradation, clip: list[np.ndarray]) -> None:
        self.m, self.clip = m, clip

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        return i + 10, torch.from_numpy(np.stack(self.m(self.clip, i + 10)[0]))


@pytest.fixture(scope="module")
def reds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rbvsr")
    data = make_reds(root / "reds", clips=("000", "001", "002", "011"), frames=4, size=(48, 48))
    val = make_reds(root / "reds4", clips=("000",), frames=3, size=(32, 32))
    return {"root": root, **data, "val_gt": val["gt"], "val_lq": val["lq"]}


def _dataset(reds: dict[str, Path], **extra: Any) -> Any:
    from anysr.data.loaders import build_dataset
    from anysr.options.loader import validate_dataset

    opt = {"name": "t", "type": "REDSRecurrentDataset", "dataroot_gt": str(reds["gt"]), "dataroot_lq": None,
           "meta_info_file": str(reds["meta"]), "lq_from_gt": True, "degradation": "realbasicvsr", "num_frame": 3,
           "gt_size": 32, "batch_size_per_gpu": 1, "use_hflip": True, "use_rot": True, "io_backend": {"type": "disk"},
           **extra}
    return build_dataset(validate_dataset(opt, name="train", scale=4), "datasets.train")


def test_dataset_items(reds: dict[str, Path]) -> None:
    """REDSRecurrentDataset with degradation realbasicvsr: (t, 3, 8, 8) LQ in [0, 1], the unsharp-masked GT;
    an item depends on (index, seed) only; gt_usm false gives the plain crop."""
    ds = _dataset(reds, degradation_params=LIBX264)
    a, b = ds[(1, 77)], _dataset(reds, degradation_params=LIBX264)[(1, 77)]
    assert a["lq"].shape == (3, 3, 8, 8) and a["gt"].shape == (3, 3, 32, 32)
    assert torch.equal(a["lq"], b["lq"]) and torch.equal(a["gt"], b["gt"])
    assert 0 <= float(a["lq"].min()) and float(a["lq"].max()) <= 1
    plain = _dataset(reds, degradation_params={**LIBX264, "gt_usm": False})[(1, 77)]
    assert torch.equal(plain["lq"], a["lq"]) and not torch.equal(plain["gt"], a["gt"])
    assert torch.equal(plain["gt"] * 255, torch.round(plain["gt"] * 255))  # the uint8 crop


def test_one_line_errors(reds: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(RBVSR_KEYS) == {*rb.STAGES, "gt_usm"}
    bad = [({"blurr": {}}, "unknown stage(s) 'blurr'"),
           ({"noise": {"noise_prob": [0.5, 0.6]}}, "summing to 1"),
           ({"blur": {"kernel_list": ["iso", "box"], "kernel_prob": [0.5, 0.5]}}, "unknown 'box'"),
           ({"resize": {"resize_steps": 1}}, "unknown parameter(s) 'resize_steps'"),
           ({"resize2": {"is_size_even": False}}, "is_size_even: must be true"),
           ({"blur": {"kernel_size": [8]}}, "odd sizes")]
    for overrides, text in bad:
        with pytest.raises(OptionError) as err:
            RealBasicVSRSettings(overrides, lq_size=(8, 8), gt_size=32)
        assert text in str(err.value) and "\n" not in str(err.value), str(err.value)
    with pytest.raises(OptionError, match="LQ size .* is odd"):
        RealBasicVSRSettings(None, lq_size=(9, 9), gt_size=36)
    with pytest.raises(OptionError, match="gt_size 33 is odd"):
        RealBasicVSRSettings(None, lq_size=(8, 8), gt_size=33)
    with pytest.raises(AnysrError) as err:  # the options' rule, before any dataset is built
        _dataset(reds, degradation_params={"blurr": {}})
    assert "unknown stage(s) 'blurr'" in str(err.value)
    with pytest.raises(AnysrError, match="recurrent training datasets"):
        _dataset(reds, type="REDSDataset", num_frame=3)
    with pytest.raises(AnysrError, match="lq_from_gt: true"):
        _dataset(reds, lq_from_gt=False, dataroot_lq=str(reds["lq"]))
    with pytest.raises(AnysrError, match="gt_size with both even"):
        _dataset(reds, gt_size=36)
    import builtins

    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__",
                        lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name)) if name == "av" else
                        real(name, *a, **k))
    from anysr.data.degradation import video_codec
    video_codec.available_codecs.cache_clear()
    try:
        with pytest.raises(DataError, match=r"pip install 'anysr\[video\]'"):
            RealBasicVSRSettings(None, lq_size=(8, 8), gt_size=32)
    finally:
        monkeypatch.undo()
        video_codec.available_codecs.cache_clear()


@pytest.mark.slow
def test_basicvsr_trains_on_realbasicvsr_clips(reds: dict[str, Path]) -> None:
    """``anysr train`` of the shipped file (train_BasicVSR_REDS_realbasicvsr.yml), its BasicVSR tiny, for 2
    iterations (degradation in a loader worker)."""
    file = ROOT / "options" / "train" / "video" / "train_BasicVSR_REDS_realbasicvsr.yml"
    args = [f"path.root={reds['root']}", "name=rbvsr", f"datasets.train.dataroot_gt={reds['gt']}",
            f"datasets.train.meta_info_file={reds['meta']}", "datasets.train.num_frame=3",
            "datasets.train.gt_size=32", "datasets.train.batch_size_per_gpu=2",
            "datasets.train.num_worker_per_gpu=1", "datasets.train.dataset_enlarge_ratio=1",
            "network_g.spynet_path=null", "network_g.num_feat=8", "network_g.num_block=1", "train.fix_flow=null",
            "accelerator=cpu", "num_gpu=1", "logger.use_tb_logger=false", "train.precision=fp32",
            "train.channels_last=false", "train.total_iter=2", "val.val_freq=2", "logger.print_freq=1",
            f"datasets.val.dataroot_gt={reds['val_gt']}", f"datasets.val.dataroot_lq={reds['val_lq']}"]
    run_cli("train", "-opt", str(file), "--force_yml", *args, cwd=reds["root"])
    summary = json.loads((reds["root"] / "experiments" / "rbvsr" / "summary.json").read_text())
    assert summary["finished"] and summary["iterations_done"] == 2
    assert 5 < summary["validation"]["REDS4"]["psnr"]["value"] < 60

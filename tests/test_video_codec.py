"""Video codec compression (RealBasicVSR's ``RandomVideoCompression``) against mmagic's class
(tools/fixtures/make_video_codec_fixtures.py), its draws' distribution, per-clip determinism in the video datasets,
its option errors, and a short training with it (exact resume, 2 gloo ranks == 1 process).

* Fixed draws: mmagic's class run on one clip at recorded (codec, bitrate) draws, with the PyAV build of the main
  environment; :func:`compress_clip` at the same draws gives the same decoded frames bit for bit (both call the same
  FFmpeg encoders with the same settings on one thread). With another FFmpeg build bit equality is not expected, so
  that comparison is skipped there and a loose closeness check runs instead.
* Distribution: 4000 draws of mmagic's own ``__call__`` (recorded by the fixture) against ours, chi-square on the
  codec and Kolmogorov-Smirnov on the bitrate at alpha 0.001 (the tests of tests/test_degradations.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import ROOT, run_cli
from safetensors.torch import load_file
from test_degradations import CHI2_CRIT, chi2_homogeneity, ks_critical, ks_statistic
from video_data import SCALE, make_reds

from anysr.data import build_dataset
from anysr.data.degradation import video_codec
from anysr.data.degradation.video_codec import (
    CODECS,
    REALBASICVSR_BITRATE,
    VideoCompressionSettings,
    available_codecs,
    clip_rng,
    compress_clip,
    draw_video_compression,
)
from anysr.errors import DataError, OptionError
from anysr.options import validate_dataset
from anysr.options.video import VIDEO_CODECS

av = pytest.importorskip("av")

FIX = Path(__file__).resolve().parent / "fixtures" / "video_codec"
CODEC_FILE = ROOT / "options" / "train" / "video" / "train_BasicVSR_REDS_codec.yml"


@pytest.fixture(scope="module")
def ref() -> tuple[dict, dict[str, np.ndarray]]:
    info = json.loads((FIX / "reference.json").read_text())
    with np.load(FIX / "reference.npz") as d:
        return info, {k: d[k] for k in d.files}


def _same_build(info: dict) -> bool:
    return info["ffmpeg"] == av.ffmpeg_version_info and info["av"] == av.__version__


# ------------------------------------------------------------------------------------------ the codec
def test_codec_names_agree_with_the_options() -> None:
    assert VIDEO_CODECS == CODECS
    have = available_codecs()
    assert set(have) <= set(CODECS) and "mpeg4" in have  # FFmpeg's own MPEG-4 encoder is in every build
    for name in have:
        assert av.Codec(name, "w").is_encoder


@pytest.mark.parametrize("case", range(8))
def test_equals_mmagic_on_fixed_draws(case: int, ref: tuple[dict, dict[str, np.ndarray]]) -> None:
    info, arrays = ref
    c = info["cases"][case]
    if c["codec"] not in available_codecs():
        pytest.skip(f"{c['codec']} is not in this PyAV build")
    clip = arrays[c["clip"]]
    out = np.stack(compress_clip(list(clip[..., ::-1]), c["codec"], bitrate=c["bitrate"]))[..., ::-1]
    want = arrays[f"out_{case}"]
    assert out.shape == want.shape == clip.shape
    if _same_build(info):
        assert np.array_equal(out, want), (c, np.abs(out.astype(int) - want).max())
    else:  # another FFmpeg build: the same encoder, maybe other decisions; the result stays close
        assert np.abs(out.astype(float) - want).mean() < 2.0, c
    # it did change the clip (chroma subsampling at least), by about what the reference changed
    change = np.abs(out.astype(float) - clip).mean()
    assert 0.5 < change == pytest.approx(c["mean_abs_change"], rel=0.2)


def test_lower_bitrate_and_higher_crf_lose_more(ref: tuple[dict, dict[str, np.ndarray]]) -> None:
    rng = np.random.default_rng(0)
    base = ref[1]["clip"][..., ::-1].astype(np.int16)
    clip = [np.clip(f + rng.integers(-20, 21, f.shape), 0, 255).astype(np.uint8) for f in base]  # hard to code

    def err(**kw: int) -> float:
        out = np.stack(compress_clip(clip, codec, **kw)).astype(float)
        return float(np.abs(out - np.stack(clip)).mean())

    for codec in available_codecs():
        assert err(bitrate=3_000) > err(bitrate=300_000), codec
        if codec != "mpeg4":
            assert err(crf=45) > err(crf=20) > err(crf=0), codec


def test_frames_keep_their_shape_and_order() -> None:
    frames = [np.full((16, 24, 3), v, np.uint8) for v in (10, 120, 240)]
    frames[1][..., 0] = 200  # blue channel (BGR): the channel order survives
    out = compress_clip(frames, "mpeg4", bitrate=500_000)
    assert [f.shape for f in out] == [(16, 24, 3)] * 3 and all(f.dtype == np.uint8 for f in out)
    assert [int(f[..., 1].mean()) for f in out] == pytest.approx([10, 120, 240], abs=3)
    assert out[1][..., 0].mean() == pytest.approx(200, abs=3)


# ------------------------------------------------------------------------------------------ draws
def test_draws_follow_mmagic_distribution(ref: tuple[dict, dict[str, np.ndarray]]) -> None:
    arrays = ref[1]
    settings = VideoCompressionSettings(codec=("libx264", "h264", "mpeg4"), codec_prob=(1 / 3, 1 / 3, 1 / 3),
                                        bitrate=(1e4, 1e5))
    draws = [draw_video_compression(clip_rng(s), settings) for s in range(4000)]
    codec = np.array([settings.codec.index(d.codec) for d in draws])
    bitrate = np.array([d.bitrate for d in draws], dtype=np.float64)
    stat, dof = chi2_homogeneity(codec, arrays["draw_codec"])
    assert dof == 2 and stat < CHI2_CRIT[dof], stat
    ref_rate = arrays["draw_bitrate"].astype(np.float64)
    assert ks_statistic(bitrate, ref_rate) < ks_critical(len(bitrate), len(ref_rate))
    assert 10_000 <= bitrate.min() and bitrate.max() <= 100_000 and np.all(bitrate == np.round(bitrate))
    # a shifted range is told apart by the same test
    shifted = VideoCompressionSettings(codec=("mpeg4",), bitrate=(2e4, 1.1e5))
    other = np.array([draw_video_compression(clip_rng(s), shifted).bitrate for s in range(4000)], dtype=np.float64)
    assert ks_statistic(other, ref_rate) > ks_critical(len(other), len(ref_rate))


def test_crf_and_prob_draws() -> None:
    settings = VideoCompressionSettings(codec=("libx264", "libx265") if "libx265" in available_codecs()
                                        else ("libx264",), crf=(20, 30), prob=0.25)
    draws = [draw_video_compression(clip_rng(s), settings) for s in range(4000)]
    done = [d for d in draws if d.codec is not None]
    assert abs(len(done) / 4000 - 0.25) < 4 * (0.25 * 0.75 / 4000) ** 0.5
    assert {d.crf for d in done} == set(range(20, 31)) and all(d.bitrate is None for d in done)
    never = VideoCompressionSettings(codec=("mpeg4",), prob=0.0)
    assert all(draw_video_compression(clip_rng(s), never).codec is None for s in range(200))
    default = VideoCompressionSettings()
    assert default.bitrate == (10_000, 100_000) and default.codec == ("libx264", "h264", "mpeg4")


def test_draws_depend_on_the_seed_only() -> None:
    settings = VideoCompressionSettings()
    a = [draw_video_compression(clip_rng(s), settings) for s in range(50)]
    assert a == [draw_video_compression(clip_rng(s), settings) for s in range(50)]
    assert len({d.bitrate for d in a}) > 45


# ------------------------------------------------------------------------------------------ datasets
@pytest.fixture(scope="module")
def reds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_reds(tmp_path_factory.mktemp("reds"), clips=("000", "001", "002"), frames=6)


def dataset(reds: dict[str, Path], kind: str = "REDSRecurrentDataset", **kw: object) -> torch.utils.data.Dataset:
    section = {"type": kind, "io_backend": {"type": "disk"}, "dataroot_gt": str(reds["gt"]), "lq_from_gt": True,
               "meta_info_file": str(reds["meta"]), "val_partition": "official", "gt_size": 32, "num_frame": 4,
               "batch_size_per_gpu": 1, "use_hflip": True, "use_rot": True, "random_reverse": True, **kw}
    return build_dataset(validate_dataset(section, name="train", scale=SCALE), "datasets.train")


@pytest.mark.parametrize("kind", ["REDSRecurrentDataset", "REDSDataset"])
def test_dataset_compresses_the_lq_clip_per_sample_seed(reds: dict[str, Path], kind: str) -> None:
    extra = {"num_frame": 3} if kind == "REDSDataset" else {}
    plain = dataset(reds, kind, **extra)
    comp = dataset(reds, kind, video_compression={"codec": ["libx264", "mpeg4"], "bitrate": [5e3, 2e4]}, **extra)
    for index, seed in [(0, 11), (3, 11), (3, 12), (7, 123456789)]:
        a, b, again = plain[(index, seed)], comp[(index, seed)], comp[(index, seed)]
        assert torch.equal(a["gt"], b["gt"]) and a["key"] == b["key"]  # the other draws are untouched
        assert torch.equal(b["lq"], again["lq"])  # a function of (index, seed)
        assert not torch.equal(a["lq"], b["lq"])
        draw = draw_video_compression(clip_rng(seed), comp.compression)
        frames = [np.ascontiguousarray((f.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))
                  for f in a["lq"]]
        frames = [f[..., ::-1] for f in frames]  # img2tensor made RGB of the BGR frames
        want = compress_clip([np.ascontiguousarray(f) for f in frames], draw.codec, bitrate=draw.bitrate)
        got = (b["lq"].permute(0, 2, 3, 1).numpy() * 255).round().astype(np.uint8)[..., ::-1]
        assert np.array_equal(got, np.stack(want))


def test_vimeo_flip_sequence_compresses_the_mirrored_clip(tmp_path: Path) -> None:
    from video_data import make_vimeo

    vimeo = make_vimeo(tmp_path)
    section = {"type": "Vimeo90KRecurrentDataset", "io_backend": {"type": "disk"}, "dataroot_gt": str(vimeo["gt"]),
               "dataroot_lq": str(vimeo["lq"]), "meta_info_file": str(vimeo["meta"]), "gt_size": 32,
               "batch_size_per_gpu": 1, "flip_sequence": True,
               "video_compression": {"codec": ["mpeg4"], "bitrate": [1e4, 1e4]}}
    ds = build_dataset(validate_dataset(section, name="train", scale=SCALE), "datasets.train")
    item = ds[(1, 5)]
    assert item["lq"].shape == (14, 3, 8, 8) and item["gt"].shape == (14, 3, 32, 32)
    assert torch.equal(item["gt"], item["gt"].flip(0))
    assert not torch.equal(item["lq"], item["lq"].flip(0))  # compressed as one 14-frame clip, not mirrored after


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("comp, message", [
    ({"codec": ["libx246"]}, "unknown codec(s) 'libx246'; choose from libx264, h264, mpeg4, libx265"),
    ({"codec": ["libx264"], "crf": [20, 30], "bitrate": [1e4, 2e4]}, "give bitrate or crf, not both"),
    ({"codec": ["mpeg4"], "crf": [20, 30]}, "mpeg4 has no CRF mode"),
    ({"codec": ["libx264"], "crf": [20, 60]}, "0 <= low <= high <= 51"),
    ({"codec": ["libx264", "mpeg4"], "codec_prob": [1]}, "1 weight(s) for 2 codec(s)"),
    ({"bitrate": [2e4, 1e4]}, "1 <= low <= high"),
    ({"prob": 1.5}, "video_compression.prob"),
])
def test_bad_options_are_one_line_errors(reds: dict[str, Path], comp: dict, message: str) -> None:
    with pytest.raises(OptionError) as err:
        dataset(reds, video_compression=comp)
    assert message in str(err.value) and "video_compression" in str(err.value)


def test_odd_lq_size_and_test_sets_are_refused(reds: dict[str, Path]) -> None:
    with pytest.raises(OptionError, match="gt_size 36 / scale 4 = 9 is odd"):
        dataset(reds, gt_size=36, video_compression={})
    with pytest.raises(OptionError, match="compresses training clips"):
        build_dataset(validate_dataset({"type": "VideoRecurrentTestDataset", "dataroot_gt": str(reds["gt"]),
                                        "lq_from_gt": True, "video_compression": {}}, name="val", scale=SCALE),
                      "datasets.val")
    with pytest.raises(OptionError, match="PairedImageDataset is not a video dataset"):
        validate_dataset({"type": "PairedImageDataset", "dataroot_gt": str(reds["gt"]), "lq_from_gt": True,
                          "gt_size": 32, "batch_size_per_gpu": 1, "video_compression": {}}, name="train", scale=SCALE)
    with pytest.raises(DataError, match="even frame size, got 15x16"):
        compress_clip([np.zeros((15, 16, 3), np.uint8)], "mpeg4", bitrate=10_000)


@pytest.mark.skipif("libx265" not in available_codecs(), reason="this PyAV build has no libx265")
def test_x265_is_reproducible_on_small_frames() -> None:
    """libx265 alone gives other streams call after call at these sizes (and corrupts the heap at 32 x 48): padded
    to 96 pixels, every call gives the same frames, of the clip's size."""
    rng = np.random.default_rng(3)
    base = cv2.GaussianBlur(rng.integers(0, 256, (220, 120, 3)).astype(np.uint8), (0, 0), 2)
    for h, w in ((16, 16), (32, 48), (64, 64), (200, 64), (8, 96)):
        clip = [np.ascontiguousarray(base[t: t + h, 2 * t: 2 * t + w]) for t in range(4)]
        runs = [np.stack(compress_clip(clip, "libx265", bitrate=20_000)) for _ in range(4)]
        assert runs[0].shape == (4, h, w, 3)
        assert all(np.array_equal(runs[0], r) for r in runs[1:]), (h, w)
    ds_clip = [np.full((96, 96, 3), 90, np.uint8)] * 2  # not padded: FFmpeg's settings as they are (see the fixture)
    assert [f.shape for f in compress_clip(ds_clip, "libx265", bitrate=20_000)] == [(96, 96, 3)] * 2


@pytest.mark.skipif("libx265" not in available_codecs(), reason="this PyAV build has no libx265")
def test_x265_short_clips_never_fail() -> None:
    """One- and two-frame clips made FFmpeg's libx265 wrapper fail about every other call (it read x265's output
    picture from memory x265 had not filled); lengthened to MIN_FRAMES for the encoder, 60 of them all pass, give back
    their own number of frames, and the same frames twice."""
    rng = np.random.default_rng(5)
    for i in range(30):
        base = cv2.GaussianBlur(rng.integers(0, 256, (64, 64, 3)).astype(np.uint8), (0, 0), 2)
        for t in (1, 2):
            clip, rate = [base] * t, int(rng.integers(*REALBASICVSR_BITRATE))
            first = np.stack(compress_clip(clip, "libx265", bitrate=rate))
            assert first.shape == (t, 64, 64, 3)
            if i < 3:
                assert np.array_equal(first, np.stack(compress_clip(clip, "libx265", bitrate=rate)))


def test_ffmpeg_failures_are_data_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kw: object) -> list[np.ndarray]:
        raise av.FFmpegError(22, "Invalid argument")

    monkeypatch.setattr(video_codec, "_encode_decode", refuse)
    with pytest.raises(DataError, match="FFmpeg failed on 1 frames of 16x16 with mpeg4 at bitrate 10000"):
        compress_clip([np.zeros((16, 16, 3), np.uint8)], "mpeg4", bitrate=10_000)


def test_unavailable_codec_names_the_available_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(video_codec, "available_codecs", lambda: ("libx264", "mpeg4"))
    with pytest.raises(OptionError) as err:
        VideoCompressionSettings(codec=("libx264", "libx265"), where="datasets.train.video_compression")
    text = str(err.value)
    assert "\n" not in text and "'libx265' is not in this PyAV build" in text and "available: libx264, mpeg4" in text


def test_missing_pyav_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "av", None)  # import av raises ImportError
    available_codecs.cache_clear()
    try:
        with pytest.raises(DataError, match=r"needs PyAV, which is not installed: pip install 'anysr\[video\]'"):
            VideoCompressionSettings()
        with pytest.raises(DataError, match="needs PyAV"):
            compress_clip([np.zeros((16, 16, 3), np.uint8)], "mpeg4", bitrate=10_000)
    finally:
        available_codecs.cache_clear()


# ------------------------------------------------------------------------------------------ training
TINY = ["accelerator=cpu", "logger.use_tb_logger=false", "train.precision=fp32", "train.channels_last=false",
        "logger.print_freq=1", "datasets.train.num_worker_per_gpu=0", "datasets.train.dataset_enlarge_ratio=1",
        "datasets.train.gt_size=32", "datasets.train.num_frame=2", "network_g.num_feat=8", "network_g.num_block=1",
        "network_g.spynet_path=~", "train.fix_flow=~", "val=null", "datasets.val=~", "train.ema_decay=0",
        "logger.save_checkpoint_freq=1", "datasets.train.video_compression.codec=[libx264,mpeg4]",
        "datasets.train.video_compression.codec_prob=[1,1]"]


@pytest.fixture(scope="module")
def train_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("codec_train")
    reds = make_reds(root / "reds", clips=("000", "001", "002", "011"), frames=5)
    return {"root": root, **reds}


def _train(data: dict[str, Path], name: str, *over: str, resume: bool = False) -> Path:
    args = ["train", "-opt", str(CODEC_FILE), "--force_yml", f"path.root={data['root']}", f"name={name}",
            f"datasets.train.dataroot_gt={data['gt']}", f"datasets.train.dataroot_lq={data['lq']}",
            f"datasets.train.meta_info_file={data['meta']}", *TINY, *over]
    run_cli(*args[:3], *(["--auto_resume"] if resume else []), *args[3:], cwd=data["root"])
    return data["root"] / "experiments" / name / "models"


@pytest.fixture(scope="module")
def once(train_data: dict[str, Path]) -> Path:
    """2 iterations at a global batch of 2 on one process, weights saved after each."""
    return _train(train_data, "once", "num_gpu=1", "train.total_iter=2", "datasets.train.batch_size_per_gpu=2")


@pytest.mark.slow
def test_training_with_compression_resumes_exactly(train_data: dict[str, Path], once: Path) -> None:
    """2 iterations at once == 1, stop, resume, 1 more (the compressed clips are a function of the sample seed)."""
    _train(train_data, "twice", "num_gpu=1", "train.total_iter=1", "datasets.train.batch_size_per_gpu=2")
    twice = _train(train_data, "twice", "num_gpu=1", "train.total_iter=2", "datasets.train.batch_size_per_gpu=2",
                   resume=True)
    a, b = load_file(str(once / "net_g_2.safetensors")), load_file(str(twice / "net_g_2.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert all(torch.isfinite(v).all() for v in a.values())


@pytest.mark.slow
def test_training_with_compression_on_two_gloo_ranks_equals_one_process(train_data: dict[str, Path],
                                                                         once: Path) -> None:
    """An iteration of 2 ranks x 1 clip == 1 process x 2 clips (each clip compressed by its own sample seed)."""
    two = _train(train_data, "two", "num_gpu=2", "train.total_iter=1", "datasets.train.batch_size_per_gpu=1")
    a, b = load_file(str(once / "net_g_1.safetensors")), load_file(str(two / "net_g_1.safetensors"))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.parametrize("codec", ["libx264", "h264"])
def test_a_draw_gives_one_result_whatever_was_encoded_before(codec: str) -> None:
    """libx264 (PyAV 18's FFmpeg) reads heap memory it never wrote: without compress_clip's zero-filled heap the
    same 32- or 96-pixel clip came out in up to 4 ways over 12 calls with other encodes in between."""
    pytest.importorskip("av")
    img = cv2.imread(str(ROOT / "datasets" / "Set5" / "HR" / "butterfly.png"))

    def clip(side: int) -> list[np.ndarray]:
        return [np.ascontiguousarray(img[3 * i: 3 * i + side, 2 * i: 2 * i + side]) for i in range(5)]

    others = [clip(s) for s in (16, 24, 64, 128)]
    for side in (32, 96):
        first = compress_clip(clip(side), codec, bitrate=10000)
        for k in range(6):
            compress_clip(others[k % 4], "libx264", bitrate=30000 + 1000 * k)
            again = compress_clip(clip(side), codec, bitrate=10000)
            assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True)), (side, k)

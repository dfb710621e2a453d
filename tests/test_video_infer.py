"""``anysr infer`` on videos: an MP4 with an audio track (made with PyAV) upscaled by an image network and by a
recurrent video network in temporal chunks keeps its frame count, frame rate, timestamps and audio (packets
copied); a folder of frames through a window network (EDVR) gives a folder of frames; chunked recurrent inference
equals the whole clip when the chunks cover it."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli
from video_data import clip_frames

from anysr.accelerators import resolve_plan
from anysr.accelerators.launcher import create_accelerator
from anysr.archs import build_network
from anysr.data.imageio import list_images, read_image, write_image
from anysr.engine.evaluation.forward import chunked_outputs, clip_outputs, window_forward

FRAMES, RATE, SAMPLE_RATE = 12, Fraction(10), 16000


def make_mp4(path: Path) -> None:
    """12 frames of 32x24 at 10 fps (H.264) with 1.2 s of a 440 Hz tone (AAC, mono)."""
    av = pytest.importorskip("av")
    out = av.open(str(path), "w")
    video = out.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=RATE)
    video.width, video.height, video.pix_fmt = 32, 24, "yuv420p"
    audio = out.add_stream("aac", rate=SAMPLE_RATE)
    audio.layout = "mono"
    for i, img in enumerate(clip_frames(FRAMES, (24, 32), seed=3)):
        frame = av.VideoFrame.from_ndarray(img, format="bgr24")
        frame.pts = i
        for packet in video.encode(frame):
            out.mux(packet)
    for packet in video.encode():
        out.mux(packet)
    t = np.arange(SAMPLE_RATE * FRAMES // int(RATE)) / SAMPLE_RATE
    samples = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None]
    for k in range(0, samples.shape[1], 1024):
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, k:k + 1024]), format="fltp", layout="mono")
        frame.sample_rate, frame.pts = SAMPLE_RATE, k
        for packet in audio.encode(frame):
            out.mux(packet)
    for packet in audio.encode():
        out.mux(packet)
    out.close()


def describe(path: Path) -> dict:
    """What the test compares: the video's frame count, rate, size and timestamps, the audio packets' bytes."""
    av = pytest.importorskip("av")
    with av.open(str(path)) as c:
        v = c.streams.video[0]
        pts = [f.pts for f in c.decode(v)]
        video = {"rate": v.average_rate, "size": (v.codec_context.width, v.codec_context.height),
                 "seconds": [float(p * v.time_base) for p in pts]}
    with av.open(str(path)) as c:
        a = c.streams.audio[0]
        audio = [(p.pts, bytes(p)) for p in c.demux(a) if p.size]
        info = {"codec": a.codec_context.name, "rate": a.rate, "channels": a.codec_context.channels}
    return {"frames": len(pts), **video, "audio": audio, "audio_info": info}


@pytest.fixture(scope="module")
def mp4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("video") / "clip.mp4"
    make_mp4(path)
    return path


@pytest.mark.slow
def test_mp4_with_audio_keeps_frames_rate_and_audio(mp4: Path, tmp_path: Path) -> None:
    src = describe(mp4)
    assert src["frames"] == FRAMES and src["rate"] == RATE and src["audio"]
    torch.manual_seed(0)
    weights = tmp_path / "bvsr.pth"
    torch.save({"params": build_network({"type": "BasicVSR", "num_feat": 8, "num_block": 1}).state_dict()}, weights)
    runs = {"bicubic": (["--arch", "bicubic", "--scale", "2"], 2),
            "basicvsr": (["--weights", str(weights), "--arch", "BasicVSR", "--arch-opt", "num_feat=8", "num_block=1",
                          "--chunk", "5", "--chunk-pad", "2"], 4)}
    for name, (args, scale) in runs.items():
        out = tmp_path / f"{name}.mp4"
        proc = run_cli("infer", *args, "-i", str(mp4), "-o", str(out), "--accelerator", "cpu", "--precision", "fp32",
                       "--no-channels-last", cwd=tmp_path)
        assert f"wrote {FRAMES} frame(s) as video" in proc.stdout
        assert "frame/s" in proc.stderr  # the progress bar counts frames per second
        got = describe(out)
        assert got["frames"] == FRAMES and got["rate"] == RATE and got["size"] == (32 * scale, 24 * scale)
        assert got["seconds"] == pytest.approx(src["seconds"])
        assert got["audio_info"] == src["audio_info"] and got["audio"] == src["audio"]  # copied, not re-encoded


@pytest.mark.slow
def test_folder_of_frames_through_edvr_gives_frames(tmp_path: Path) -> None:
    frames = tmp_path / "frames"
    for i, img in enumerate(clip_frames(5, (16, 20), seed=4)):
        write_image(frames / f"f{i:03d}.png", img)
    net = {"type": "EDVR", "num_feat": 8, "num_frame": 3, "deformable_groups": 2, "num_extract_block": 1,
           "num_reconstruct_block": 1}
    torch.manual_seed(0)
    weights = tmp_path / "edvr.pth"
    torch.save({"params": build_network(net).state_dict()}, weights)
    out = tmp_path / "out"
    run_cli("infer", "--weights", str(weights), "--arch", "EDVR", "--arch-opt", "num_feat=8", "num_frame=3",
            "deformable_groups=2", "num_extract_block=1", "num_reconstruct_block=1", "-i", str(frames), "-o", str(out),
            "--accelerator", "cpu", "--precision", "fp32", "--no-channels-last", "--suffix", "x4", cwd=tmp_path)
    written = list_images(out)
    assert [p.name for p in written] == [f"f{i:03d}_x4.png" for i in range(5)]
    assert read_image(written[0]).shape == (64, 80, 3)


def test_missing_pyav_or_bad_video_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"not a video")
    proc = run_cli("infer", "--arch", "bicubic", "--scale", "2", "-i", str(bad), "-o", str(tmp_path / "o.mp4"),
                   cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "broken.mp4" in proc.stderr or "pip install 'anysr[video]'" in proc.stderr


def test_chunked_recurrent_inference_covers_the_clip() -> None:
    """Chunks that cover the clip equal the whole clip; smaller chunks give every frame once, close to it."""
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    torch.manual_seed(0)
    net = build_network({"type": "BasicVSR", "num_feat": 8, "num_block": 1}).eval()
    lq = torch.rand(1, 5, 3, 8, 8)
    whole = window_forward(net, lq, acc, scale=4, tile=None, tile_pad=0)
    parts = list(clip_outputs(net, lq, acc, scale=4, chunk=5, chunk_pad=2, flip_seq=False))
    assert len(parts) == 1 and torch.equal(parts[0][1], whole)
    reads: list[tuple[int, int]] = []

    def window(a: int, b: int) -> torch.Tensor:
        reads.append((a, b))
        return lq[:, a:b]

    chunks = list(chunked_outputs(net, window, 5, acc, scale=4, chunk=2, chunk_pad=1, flip_seq=False))
    assert [f for idx, _ in chunks for f in idx] == list(range(5))
    assert all(b - a == 4 for a, b in reads)  # one window length
    got = torch.cat([o for _, o in chunks], dim=1)
    assert got.shape == whole.shape and (got - whole).abs().mean() < 0.05
    # flip_seq (BasicSR's): the clip followed by its reverse in one pass, the two halves averaged
    flipped = torch.cat([o for _, o in clip_outputs(net, lq, acc, scale=4, chunk=None, chunk_pad=0, flip_seq=True)], 1)
    both = window_forward(net, torch.cat([lq, lq.flip(1)], 1), acc, scale=4, tile=None, tile_pad=0)
    torch.testing.assert_close(flipped, 0.5 * (both[:, :5] + both[:, 5:].flip(1)))


def test_tiled_video_forward_matches_whole_frames() -> None:
    """Spatial tiles of a clip (windows inside the frames) agree with whole frames away from tile seams, for a
    recurrent and a window network; tiles on a static-shape device pad small frames to the window."""
    acc = create_accelerator(resolve_plan("cpu", 1, precision="fp32", channels_last=False))
    torch.manual_seed(0)
    for opt in ({"type": "BasicVSR", "num_feat": 8, "num_block": 1},
                {"type": "EDVR", "num_feat": 8, "num_frame": 3, "deformable_groups": 2, "num_extract_block": 1,
                 "num_reconstruct_block": 1}):
        net = build_network(opt).eval()
        lq = torch.rand(1, 3, 3, 16, 20)
        whole = window_forward(net, lq, acc, scale=4, tile=None, tile_pad=0)
        tiled = window_forward(net, lq, acc, scale=4, tile=8, tile_pad=6)
        assert tiled.shape == whole.shape
        assert (tiled - whole).abs().mean() < 0.02 * whole.abs().mean()

"""Networks whose authors feed [-1, 1] images (GFPGAN, RestoreFormer, MixDehazeNet) take and give [0, 1] in anysr's
pipeline (``arch_util.unit_range``): the same weights, the reference's state-dict names, the mapping in training,
``anysr infer`` and ONNX exports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from anysr.archs import build_network
from anysr.archs.arch_util import unit_range
from anysr.data.imageio import read_image

ROOT = Path(__file__).resolve().parents[1]
MIXDEHAZE = {"type": "MixDehazeNet", "embed_dims": [8, 8, 8, 8, 8], "depths": [1, 1, 1, 1, 1]}
RESTOREFORMER = {"type": "RestoreFormer", "ch": 32, "ch_mult": [1, 1], "resolution": 16, "attn_resolutions": [8],
                 "z_channels": 8, "embed_dim": 8}


@pytest.mark.parametrize("opt", [MIXDEHAZE, RESTOREFORMER], ids=["MixDehazeNet", "RestoreFormer"])
def test_unit_range_maps_in_and_out(opt: dict) -> None:
    torch.manual_seed(0)
    raw = build_network(dict(opt)).eval()
    keys = list(raw.state_dict())
    x = torch.rand(1, 3, 16, 16)
    with torch.no_grad():
        want = (raw(x * 2 - 1) + 1) / 2
        net = unit_range(raw)
        assert unit_range(net) is net and list(net.state_dict()) == keys
        got = net(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the same kernels on the same machine


def test_other_networks_are_left_alone() -> None:
    net = build_network({"type": "SRVGGNetCompact", "num_feat": 4, "num_conv": 1})
    assert unit_range(net) is net and not net._forward_hooks and not net._forward_pre_hooks


def test_infer_feeds_the_authors_range(tmp_path: Path) -> None:
    """``anysr infer`` of a bare MixDehazeNet state dict: the output is the network applied to 2x - 1, mapped
    back (the released weights' colours), not the network applied to [0, 1] images."""
    torch.manual_seed(0)
    raw = build_network(dict(MIXDEHAZE)).eval()
    torch.save({"params": raw.state_dict()}, tmp_path / "w.pth")
    img = ROOT / "datasets" / "Set5" / "HR" / "bird.png"
    args = [f"{k}={v}" for k, v in MIXDEHAZE.items() if k != "type"]
    r = subprocess.run([sys.executable, "-m", "anysr", "infer", "--weights", str(tmp_path / "w.pth"), "--arch",
                        "MixDehazeNet", "--arch-opt", *args, "-i", str(img), "-o", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    (out,) = (tmp_path / "out").rglob("*.png")
    rgb = np.ascontiguousarray(read_image(img)[..., ::-1])  # files are BGR, networks see RGB
    x = torch.from_numpy(rgb.astype(np.float32) / 255.0).permute(2, 0, 1)[None]
    with torch.no_grad():
        want = ((raw(x * 2 - 1) + 1) / 2).clamp(0, 1)[0].permute(1, 2, 0).numpy() * 255.0
        wrong = raw(x).clamp(0, 1)[0].permute(1, 2, 0).numpy() * 255.0
    got = read_image(out)[..., ::-1].astype(np.float32)
    assert np.abs(got - want).max() <= 3.0  # rounding to 8 bits, and infer's own kernels (precision, layout)
    assert np.abs(got - wrong).max() > 5.0


def test_onnx_export_carries_the_mapping(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    import onnxruntime as ort

    from anysr.engine.inference.export import export_onnx

    torch.manual_seed(0)
    net = unit_range(build_network(dict(MIXDEHAZE)).eval())
    export_onnx(net, tmp_path / "m.onnx", scale=1, net_opt=MIXDEHAZE, size=48)  # a fixed size (archs/test_enhance.py)
    x = torch.rand(1, 3, 48, 48)
    with torch.no_grad():
        want = net(x).numpy()
    sess = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)

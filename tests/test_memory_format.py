"""channels_last (NHWC) as an accelerator concern: same training, same files, same inference output."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import DATASETS, ROOT, tiny_train_options, write_options
from safetensors import safe_open
from safetensors.torch import load_file
from torch import nn

from anysr.accelerators import create_accelerator, resolve_plan
from anysr.accelerators.hardware import choose_channels_last
from anysr.accelerators.precision import standard_layout, to_channels_last
from anysr.cli import main
from anysr.errors import OptionError
from anysr.options import load_options

PRETRAINED = ROOT / "pretrained" / "realesr-animevideov3.pth"
SRVGG = ["--arch", "SRVGGNetCompact", "--arch-opt", "num_feat=64", "num_conv=16", "upscale=4", "act_type=prelu"]
NHWC = torch.channels_last


def _train(tmp_path: Path, name: str, train_dir: Path, val_dir: Path, *overrides: str) -> Path:
    opt = tiny_train_options(name, train_dir, val_dir, total_iter=3)
    opt["val"]["tile"] = 40  # the Set5 images are larger: tiled validation runs too
    opt["val"]["metrics"]["ssim"] = {"type": "calculate_ssim", "crop_border": 2, "test_y_channel": True}
    path = write_options(tmp_path / f"{name}.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", *overrides]) == 0
    return tmp_path / "experiments" / name


def test_channels_last_training_matches_standard_layout(tmp_path: Path, small_train_dir: Path,
                                                        small_val_dir: Path) -> None:
    ref = _train(tmp_path, "nchw", small_train_dir, small_val_dir)
    nhwc = _train(tmp_path, "nhwc", small_train_dir, small_val_dir, "train.channels_last=true")
    a = load_file(str(ref / "models" / "net_g_3.safetensors"))
    b = load_file(str(nhwc / "models" / "net_g_3.safetensors"))
    assert a.keys() == b.keys() and any(k.startswith("params_ema.") for k in a)
    for k in a:
        assert a[k].shape == b[k].shape and a[k].dtype == b[k].dtype, k
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)
    with safe_open(str(ref / "models" / "net_g_3.safetensors"), "pt") as fa, \
            safe_open(str(nhwc / "models" / "net_g_3.safetensors"), "pt") as fb:
        meta_a, meta_b = fa.metadata(), fb.metadata()
    assert json.loads(meta_a["network_g"]) == json.loads(meta_b["network_g"])
    # The training state is written in standard layout too (and still loads weights_only).
    state = torch.load(nhwc / "training_states" / "3.state", weights_only=True)
    weights = state["model"]["nets"]["net_g"]
    assert any(t.dim() == 4 for t in weights.values())
    assert all(t.is_contiguous() for t in weights.values())
    assert all(t.is_contiguous() for t in state["model"]["emas"]["net_g"]["params"].values())
    # Validation (tiled, PSNR and SSIM) agrees.
    va = json.loads((ref / "summary.json").read_text())["validation"]["val"]
    vb = json.loads((nhwc / "summary.json").read_text())["validation"]["val"]
    for metric in ("psnr", "ssim"):
        assert vb[metric]["value"] == pytest.approx(va[metric]["value"], abs=1e-3)
    # Resuming a channels_last run continues it: 2 + 1 equals the straight 3 iterations.
    opt = tiny_train_options("nhwc_split", small_train_dir, None, total_iter=2)
    path = write_options(tmp_path / "split.yml", opt)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "train.channels_last=true"]) == 0
    assert main(["train", "-opt", str(path), "--auto_resume", "--force_yml", f"path.root={tmp_path}",
                 "train.channels_last=true", "train.total_iter=3"]) == 0
    straight = tiny_train_options("nhwc_straight", small_train_dir, None, total_iter=3)
    path = write_options(tmp_path / "straight.yml", straight)
    assert main(["train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "train.channels_last=true"]) == 0
    c = load_file(str(tmp_path / "experiments" / "nhwc_split" / "models" / "net_g_3.safetensors"))
    d = load_file(str(tmp_path / "experiments" / "nhwc_straight" / "models" / "net_g_3.safetensors"))
    for k in c:
        torch.testing.assert_close(c[k], d[k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("tile", [None, "16"])
def test_infer_channels_last_equals_standard(tmp_path: Path, tile: str | None) -> None:
    img = cv2.imread(str(DATASETS / "Set5" / "HR" / "bird.png"))
    cv2.imwrite(str(tmp_path / "bird_lr.png"), cv2.resize(img, (48, 40), interpolation=cv2.INTER_AREA))
    extra = ["--tile", tile, "--tile-pad", "6"] if tile else []
    extra += ["--precision", "fp32"]  # the memory format is compared; auto may time bf16 faster on one of the two
    outs = []
    for name, flag in (("nchw", []), ("nhwc", ["--channels-last"])):
        args = ["infer", "--weights", str(PRETRAINED), *SRVGG, "-i", str(tmp_path / "bird_lr.png"),
                "-o", str(tmp_path / name), *extra, *flag]
        assert main(args) == 0
        outs.append(cv2.imread(str(tmp_path / name / "bird_lr.png")).astype(int))
    assert outs[0].shape == (160, 192, 3)
    assert np.abs(outs[0] - outs[1]).max() <= 1


def test_plan_and_accelerator_carry_the_memory_format() -> None:
    plan = resolve_plan("cpu", 1, channels_last=True)
    assert plan.channels_last
    acc = create_accelerator(plan)
    acc.setup()
    net = acc.prepare_model(nn.Sequential(nn.Conv2d(3, 4, 3), nn.Linear(2, 2)))
    assert net[0].weight.is_contiguous(memory_format=NHWC) and not net[0].weight.is_contiguous()
    assert net[1].weight.is_contiguous()  # 2-D tensors are left alone
    batch = acc.to_device({"lq": torch.rand(2, 3, 8, 8), "idx": torch.zeros(2, 1, 2, 2, dtype=torch.int64),
                           "v": torch.rand(3, 8, 8)})
    assert batch["lq"].is_contiguous(memory_format=NHWC) and not batch["lq"].is_contiguous()
    assert batch["idx"].is_contiguous() and batch["v"].is_contiguous()
    assert "channels_last" in acc.describe()
    assert not create_accelerator(resolve_plan("cpu", 1)).precision.channels_last


def test_xla_plans_drop_channels_last(monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = importlib.import_module("anysr.accelerators.kinds")
    monkeypatch.setattr(kinds, "any_installed", lambda: True)
    monkeypatch.setattr(kinds, "choose_xla_backend", lambda asked: kinds.BACKENDS["torch_xla"])
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    monkeypatch.delenv("CPU_NUM_DEVICES", raising=False)
    plan = resolve_plan("xla", 1, channels_last=True)
    assert plan.accelerator == "xla"
    choice = choose_channels_last(plan.channels_last, device="xla", precision="fp32")
    assert choice.value is False and "ignored" in choice.reason  # XLA lays out memory itself


def test_helpers_keep_values_and_types() -> None:
    net = to_channels_last(nn.Conv2d(2, 3, 3))
    before = net.weight
    assert to_channels_last(net).weight is before  # the same Parameter object (optimisers keep working)
    x = torch.rand(1, 2, 5, 5).contiguous(memory_format=NHWC)
    out = standard_layout({"a": [x, (x, 1)], "b": "s"})
    assert out["a"][0].is_contiguous() and torch.equal(out["a"][0], x)
    assert isinstance(out["a"][1], tuple) and out["a"][1][1] == 1 and out["b"] == "s"


def test_channels_last_option_is_auto_or_a_bool(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("o", small_train_dir, None)
    del opt["train"]["channels_last"]
    path = write_options(tmp_path / "o.yml", opt)
    with pytest.raises(OptionError, match=r"train\.channels_last: .*'auto', true or false"):
        load_options(path, ["train.channels_last=yes please"], is_train=True)
    assert load_options(path, [], is_train=True)["train"]["channels_last"] == "auto"
    assert load_options(path, ["train.channels_last=false"], is_train=True)["train"]["channels_last"] is False


def test_wide_depthwise_convs_take_nchw_at_low_precision_on_cpu() -> None:
    """A depth-wise conv 17+ wide becomes PlainLayoutDepthwiseConv2d (same keys, same values); narrower, full and
    17x1 convs stay plain convs."""
    from anysr.archs.arch_util import PlainLayoutDepthwiseConv2d, avoid_slow_cpu_kernels  # noqa: PLC0415
    net = nn.Sequential(nn.Conv2d(8, 8, (1, 17), padding=(0, 8), groups=8), nn.Conv2d(8, 8, (1, 13), groups=8),
                        nn.Conv2d(8, 8, (17, 1), groups=8), nn.Conv2d(8, 8, (17, 17), groups=2),
                        nn.Conv2d(8, 16, (1, 31), groups=8))
    plain = {k: v.clone() for k, v in net.state_dict().items()}
    assert avoid_slow_cpu_kernels(net) == ["0"]
    assert type(net[0]) is PlainLayoutDepthwiseConv2d and all(type(m) is nn.Conv2d for m in net[1:])
    assert net.state_dict().keys() == plain.keys()
    ref = nn.Conv2d(8, 8, (1, 17), padding=(0, 8), groups=8)
    ref.load_state_dict({"weight": plain["0.weight"], "bias": plain["0.bias"]})
    x = torch.rand(2, 8, 12, 40)
    torch.testing.assert_close(net[0](x), ref(x), rtol=0, atol=0)  # fp32: the plain conv's own path
    net[0].to(memory_format=NHWC)  # the reference stays NCHW: in NHWC it would hang here
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y, want = net[0](x.to(memory_format=NHWC)), ref(x)
    torch.testing.assert_close(y.float(), want.float(), rtol=1e-2, atol=1e-2)


def test_a_wide_depthwise_conv_at_bf16_channels_last_ends() -> None:
    """oneDNN took minutes to generate the kernel of a 1x17 depth-wise conv on 8 bf16 channels_last channels (AVX-512
    CPUs, torch 2.13): any network built by anysr with one now runs its step within seconds (a minute's limit)."""
    code = ("import torch\n"
            "from torch import nn\n"
            "from anysr.archs.arch_util import avoid_slow_cpu_kernels\n"
            "net = nn.Sequential(nn.Conv2d(8, 8, (1, 17), padding=(0, 8), groups=8),\n"
            "                    nn.Conv2d(8, 8, (17, 17), padding=8, groups=8))\n"
            "avoid_slow_cpu_kernels(net)\n"
            "net = net.to(memory_format=torch.channels_last)\n"
            "x = torch.rand(1, 8, 48, 48).to(memory_format=torch.channels_last)\n"
            "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
            "    y = net(x)\n"
            "y.float().mean().backward()\n"
            "assert torch.isfinite(y.float()).all()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]

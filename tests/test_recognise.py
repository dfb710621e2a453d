"""Weights recognised without being told (anysr/archs/recognition/recognise.py): every architecture, at its
defaults and at each named preset (x2 and x4), is recognised from its state dict's names and shapes alone, as the
same class with arguments that build exactly the same tensors; a file that fits none is refused in one line naming
the closest families; ``anysr infer`` runs a bare state dict with no --arch."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from anysr.archs import build_network
from anysr.archs.recognition.recognise import RECOGNISERS, StateShapes, recognise, recognise_all, shuffle_splits
from anysr.errors import OptionError
from anysr.presets import ARCH_PRESETS
from anysr.registry import ARCH_REGISTRY

ROOT = Path(__file__).resolve().parents[1]

# Registered classes with no recogniser, and why.
NOT_RECOGNISED = {
    "Bicubic": "no tensors: nothing to recognise",
    "SpyNet": "a flow sub-network of the video models, not a network one runs by itself",
    "VGGStyleDiscriminator": "a discriminator: not run by infer / test / export",
    "UNetDiscriminatorSN": "a discriminator: not run by infer / test / export",
    "StyleGAN2Discriminator": "a discriminator: not run by infer / test / export",
    "DUnet": "a discriminator: not run by infer / test / export",
    "HiFaceGANDiscriminator": "a discriminator: not run by infer / test / export",
    "DocResDiscriminator": "a discriminator: not run by infer / test / export",
    "MetaGan2": "a discriminator: not run by infer / test / export",
    "MetaGAN3": "a discriminator: not run by infer / test / export",
    "MetaGAN": "a discriminator: not run by infer / test / export",
    "PatchGAN": "a discriminator: not run by infer / test / export",
    "EA2FPN": "a discriminator: not run by infer / test / export",
    "PatchGANDiscriminatorSN": "a discriminator: not run by infer / test / export",
    "MultiscalePatchGANDiscriminatorSN": "a discriminator: not run by infer / test / export",
    "HAT_iLN": "HAT's names and shapes exactly (i-LN has a layer norm's weight and bias, its EMA is not saved): read "
               "as HAT; name it (--arch HAT_iLN, hat_iln_*)",
    "VQVAEGAN": "RestoreFormer's names and shapes exactly (its decoder attends within its own features, which no "
                "tensor shows): read as RestoreFormer; name it (--arch VQVAEGAN)",
}


def _layout(opt: dict) -> dict[str, tuple[int, ...]] | None:
    built = _built(json.dumps(opt, sort_keys=True))
    return None if built is None else built[1]


@functools.cache
def _built(opt_json: str) -> tuple[type, dict[str, tuple[int, ...]]] | None:
    """The class and layout ``opt`` builds on the meta device (once per options: a large transformer takes a
    second), None for options the class refuses."""
    try:
        with torch.device("meta"):
            net = build_network(json.loads(opt_json))
    except OptionError:
        return None
    return type(net), {k: tuple(v.shape) for k, v in net.state_dict().items()}


# Classes whose constructor needs arguments and that have no named preset: a published size each.
REQUIRED_ARGS: dict[str, dict] = {
    "RCAN": {"num_in_ch": 3, "num_out_ch": 3, "upscale": 4},
    "RIDNet": {"in_channels": 3, "mid_channels": 64, "out_channels": 3},
    "SAFMNBCIE": {"dim": 36},
    "AutoEncoder": {"decoder_opt": {"type": "compact", "num_feat": 16, "num_conv": 4}},
    "StyleGAN2Generator": {"out_size": 256},
    "StyleGAN2GeneratorClean": {"out_size": 256},
}


def _configs(arch: str) -> list[dict]:
    """The class's defaults (or a published size when it needs arguments), and each of its presets at x2 and x4
    (those that build)."""
    configs = [{"type": arch, **REQUIRED_ARGS.get(arch, {})}]
    for preset in ARCH_PRESETS.values():
        if preset.arch == arch:
            configs += [{"type": preset.name, "scale": s} for s in (2, 4)] if preset.scale_arg else \
                [{"type": preset.name}]
    return configs


RECOGNISED = sorted(a for a in ARCH_REGISTRY.keys() if a not in NOT_RECOGNISED)

# Published layouts that are another family's tensors too: that family is read first, the class is named as also
# fitting (``infer`` logs it; ``--arch`` picks it). DWT's layer kinds mask every second block, as SwinIR's shifted
# windows do, and the masks' values (which say dilated or shifted) are no shape.
LOOK_ALIKES = {"DWT": "SwinIR"}


def test_every_architecture_has_a_recogniser() -> None:
    missing = [a for a in RECOGNISED if a not in RECOGNISERS]
    assert not missing, f"architectures with no recogniser: {missing}"
    assert set(NOT_RECOGNISED) <= set(ARCH_REGISTRY.keys())


@pytest.mark.parametrize("arch", RECOGNISED)
def test_recognised_from_names_and_shapes(arch: str) -> None:
    if arch not in RECOGNISERS:
        pytest.fail(f"{arch}: no recogniser registered")
    checked = 0
    for opt in _configs(arch):
        layout = _layout(opt)
        if layout is None:
            continue  # a class that needs arguments, or a preset that has no such scale
        built = _built(json.dumps(opt, sort_keys=True))[0]  # a preset may pick another class (realcugan at x2)
        found = recognise(layout, source=str(opt))
        if arch in LOOK_ALIKES:
            assert found.opt["type"] == LOOK_ALIKES[arch] and arch in found.others, found
            found = next(r for r in recognise_all(layout) if r.opt["type"] == arch)
        assert ARCH_REGISTRY.get(found.opt["type"]) is built, f"{opt} recognised as {found.describe()}"
        assert _layout(found.opt) == layout, f"{opt}: {found.describe()} builds other tensors"
        checked += 1
    assert checked, f"{arch}: no configuration to check"


def test_the_real_published_model_is_recognised() -> None:
    from anysr.engine.checkpoint import load_weights

    sd, _ = load_weights(ROOT / "pretrained" / "realesr-animevideov3.pth", "params")
    found = recognise(sd)
    assert found.opt == {"type": "SRVGGNetCompact", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 64,
                         "num_conv": 16, "upscale": 4, "act_type": "prelu"}
    assert "num_conv=16" in found.describe()


def test_a_file_that_fits_nothing_names_the_closest_families() -> None:
    with torch.device("meta"):
        net = build_network({"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "num_block": 2})
    sd = {k: v for k, v in net.state_dict().items() if k != "conv_hr.weight"}  # one tensor gone
    assert not recognise_all(sd)
    with pytest.raises(OptionError) as e:
        recognise(sd, source="broken.pth")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("broken.pth: its ") and "closest: RRDBNet" in msg
    assert "--arch" in msg


def test_state_shapes_view() -> None:
    view = StateShapes({"body.0.a.weight": (2, 3), "body.10.a.weight": (2,), "body.x": (1,), "head.weight": (4,)})
    assert view.indices("body.") == [0, 10] and view.count("body.") == 2 and view.count("tail.") == 0
    assert view.dim("body.0.a.weight", 1) == 3 and "head.weight" in view
    assert view.patterns() == {"body.#.a.weight", "body.x", "head.weight"}
    assert shuffle_splits(48) == [(3, 4)] and shuffle_splits(12, (3, 12)) == [(3, 2), (12, 1)]
    assert shuffle_splits(7) == []


def test_infer_runs_a_bare_state_dict_without_arch(tmp_path: Path) -> None:
    """A plain BasicSR-style .pth (``params`` only, no metadata) upscales with no --arch, as with it."""
    torch.manual_seed(0)
    opt = {"type": "SRVGGNetCompact", "num_feat": 8, "num_conv": 2, "upscale": 3}
    net = build_network(opt)
    torch.save({"params": net.state_dict()}, tmp_path / "w.pth")
    img = ROOT / "datasets" / "Set5" / "HR" / "bird.png"
    outs = []
    for extra in ([], ["--arch", "SRVGGNetCompact", "--arch-opt", "num_feat=8", "num_conv=2", "upscale=3"]):
        out = tmp_path / f"out{len(outs)}"
        r = subprocess.run([sys.executable, "-m", "anysr", "infer", "--weights", str(tmp_path / "w.pth"),
                            "-i", str(img), "-o", str(out), *extra], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0, r.stderr
        outs.append([f.read_bytes() for f in sorted(out.rglob("*.png"))])
        if not extra:
            assert "recognised from the weights' names and shapes: SRVGGNetCompact" in r.stderr + r.stdout
            assert "num_conv=2" in r.stderr + r.stdout and "upscale=3" in r.stderr + r.stdout
    assert len(outs[0]) == 1 and outs[0] == outs[1]


def _auto_options(tmp_path: Path, weights: str | None) -> Path:
    import yaml

    opt = yaml.safe_load((ROOT / "options" / "train" / "quickstart_EDSR_x2.yml").read_text())
    opt["name"] = "auto_net"
    opt["network_g"] = {"type": "auto"}
    opt["path"] = {"pretrain_network_g": weights, "root": str(tmp_path)}
    for key in ("val_1", "val_2"):
        opt["datasets"].pop(key)
    opt.pop("val", None)
    for ds in opt["datasets"].values():
        ds["dataroot_gt"] = str(ROOT / ds["dataroot_gt"])
    opt["datasets"]["train"].update(batch_size_per_gpu=2, gt_size=32, dataset_enlarge_ratio=1)
    opt["train"].update(total_iter=2, warmup_iter=-1, precision="fp32", channels_last=False)
    opt["train"]["scheduler"]["periods"] = [2]
    opt["logger"] = {**opt.get("logger", {}), "print_freq": 1, "save_checkpoint_freq": 2}
    path = tmp_path / "auto.yml"
    path.write_text(yaml.safe_dump(opt))
    return path


def test_network_g_type_auto_reads_the_pretrained_file(tmp_path: Path) -> None:
    """``network_g: {type: auto}`` with ``path.pretrain_network_g``: the network is the one the file holds (a
    bare BasicSR-style .pth), said in the log; the run's saved options name the class and its arguments."""
    import yaml

    net = build_network({"type": "SRVGGNetCompact", "num_feat": 8, "num_conv": 2, "upscale": 2})
    torch.save({"params": net.state_dict()}, tmp_path / "start.pth")
    r = subprocess.run([sys.executable, "-m", "anysr", "train", "-opt", str(_auto_options(tmp_path, "start.pth"))],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    log = "".join(p.read_text() for p in (tmp_path / "experiments" / "auto_net").rglob("*.log"))
    assert "network_g.type auto: SRVGGNetCompact(num_in_ch=3, num_out_ch=3, num_feat=8, num_conv=2, upscale=2" in log
    saved = list((tmp_path / "experiments" / "auto_net").glob("*.yml"))
    assert saved, "the run's options were not saved"
    net_g = yaml.safe_load(saved[0].read_text())["network_g"]
    assert net_g["type"] == "SRVGGNetCompact" and net_g["num_feat"] == 8 and net_g["upscale"] == 2


def test_network_g_type_auto_needs_the_file(tmp_path: Path) -> None:
    for weights, says in ((None, "path.pretrain_network_g, which is not set"),
                          ("nowhere.pth", "nowhere.pth does not exist")):
        r = subprocess.run([sys.executable, "-m", "anysr", "train", "-opt", str(_auto_options(tmp_path, weights))],
                           capture_output=True, text=True, cwd=ROOT)
        assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_wrapper_prefix_is_seen_through() -> None:
    """Files saved inside a wrapper (``netG.``, ``module.``) are recognised as the loader reads them."""
    from anysr.engine.inference.network import _recognise_file

    with torch.device("meta"):
        net = build_network({"type": "compact", "scale": 2})
    wrapped = {f"module.{k}": v for k, v in net.state_dict().items()}
    assert _recognise_file(wrapped, "w.pth").opt["upscale"] == 2


def test_float8_weights_are_read(tmp_path: Path) -> None:
    """A file storing float8 tensors (spandrel-era exports of ATD / CRAFT) is read: the finiteness check runs on
    a float copy (torch has no isfinite kernel for float8)."""
    from safetensors.torch import save_file

    from anysr.engine.checkpoint import load_weights

    net = build_network({"type": "SRVGGNetCompact", "num_feat": 4, "num_conv": 1, "upscale": 2})
    save_file({k: v.to(torch.float8_e4m3fn) for k, v in net.state_dict().items()}, tmp_path / "w.safetensors")
    sd, _ = load_weights(tmp_path / "w.safetensors", "params")
    assert recognise(sd).opt["num_feat"] == 4


def test_profiler_counters_are_not_weights(tmp_path: Path) -> None:
    """Released Omni-SR checkpoints carry thop's ``total_ops`` / ``total_params`` in every module: read without
    them, so the file is recognised and loads strictly."""
    from anysr.engine.checkpoint import load_weights

    net = build_network({"type": "OmniSR", "num_feat": 16, "res_num": 1, "block_num": 1, "window_size": 4})
    sd = dict(net.state_dict())
    for name in ["", "body.0", "up.0"]:
        prefix = f"{name}." if name else ""
        sd[f"{prefix}total_ops"] = torch.zeros(1, dtype=torch.float64)
        sd[f"{prefix}total_params"] = torch.zeros(1, dtype=torch.float64)
    torch.save({"params": sd}, tmp_path / "omni.pth")
    read, _ = load_weights(tmp_path / "omni.pth", "params")
    assert set(read) == set(net.state_dict())
    assert recognise(read).opt["type"] == "OmniSR"

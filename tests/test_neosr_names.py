"""neosr's network names: every name neosr registers builds in anysr (the network neosr builds, or listed in
``DIFFERENT`` where the name means another network here) unless it is listed in ``NOT_SUPPORTED`` with the reason.

The fixtures (``python tools/fixtures/regen.py neosr_names``, run against neosr's pinned source) hold the list of
names neosr registers, the parameter count and state-dict layout (keys and shapes) of each at neosr's defaults at
x4, and per preset anysr adds for neosr (and for hat_s, rgt_s and craft, traiNNer-redux's presets, with neosr's
``rgb_mean: [0.5, 0.5, 0.5]``) a shrunk network with seeded weights and neosr's outputs: they load strictly and give
neosr's outputs. ``tests/fixtures/neosr_families/``: the families anysr adds for neosr's names (ASID: ``asid``,
``asid_d8``; Light-SAFMN++: ``light_safmnpp``), with neosr's gradients, file recognition, ONNX at unseen sizes and
an XLA:CPU train step (``-m xla``); tests/archs/test_standard.py runs the checks every family gets on them.

Where anysr and neosr differ on purpose:

* ``cugan`` below 32 pixels a side: anysr grows the input to 32 first (reflect, then edge, at the bottom / right;
  spandrel's size requirement, which tests/archs/test_restore.py checks against spandrel), neosr (as the authors'
  code) reflect-pads it as it is, so the outputs differ by up to 1e-3 near the grown border. The cases here use
  sides of 32 or more, where the two are identical.

``neosr_families`` keeps the previous generator's fixtures (neosr's own initialisation perturbed, params files):
with fixture_kit's seeded weights ASID is ill-conditioned in float32 (its eval outputs 1e-4 to 3e-2 of their range
from float64's on most seeds, for neosr's network and anysr's alike; bf16 off by 0.28 of the range), and its
float32 training gradients differ from neosr's by up to 1e-3 relative from rounding alone (in float64 they agree
to 1e-11).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import pytest
import torch
from arch_checks import check_onnx_at_unseen_size, check_xla_train_step, load_case, manifest
from conftest import FIXTURE_TOL

from anysr.archs import arch_kwargs, build_network
from anysr.archs.arch_util import DIV2K_RGB_MEAN
from anysr.archs.recognition.recognise import recognise
from anysr.errors import OptionError
from anysr.presets import ARCH_PRESETS, find_preset
from anysr.registry import ARCH_REGISTRY

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "neosr_names"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
NAMES: dict[str, dict] = MANIFEST["names"]
CASES: dict[str, dict] = MANIFEST["cases"]
FAMILY_CASES: dict[str, dict] = manifest("neosr_families")["cases"]  # anysr's ASID and LightSAFMNPP
ASID_CASES = {n: c for n, c in FAMILY_CASES.items() if c["type"] == "ASID"}

# neosr's names anysr does not build, and why
NOT_SUPPORTED = {
    "VGGFeatureExtractor": "neosr's perceptual-loss feature extractor, no network type (anysr's perceptual loss "
                           "builds its own VGG)",
}
# names anysr builds, but as another network than neosr's (the same name in traiNNer-redux, or anysr's layout)
DIFFERENT = {
    "atd": "neosr's state dict has an extra 'no_norm' buffer",
    "atd_light": "traiNNer-redux's atd_light (4 window-attention heads in neosr, 6 here)",
    "dunet": "neosr's spectral norms are torch's old hooks (weight_orig / weight_u / weight_v); anysr's DUnet has "
             "traiNNer-redux's parametrisation (parametrizations.weight.original / 0._u / 0._v): neosr's files are "
             "renamed on reading and load (tests/archs/test_discriminators_more.py)",
    "flexnet": "neosr's state dict has an extra 'flash_attn' buffer",
    "metaflexnet": "traiNNer-redux's metaflexnet (64 channels; neosr's: 48)",
    "man": "anysr's MAN keeps the mean shift (sub_mean / add_mean) in its state dict; neosr's has none",
    "man_tiny": "anysr's MAN keeps the mean shift (sub_mean / add_mean) in its state dict; neosr's has none",
    "man_light": "anysr's MAN keeps the mean shift (sub_mean / add_mean) in its state dict; neosr's has none",
    "mosrv2": "neosr's MoSRv2 norms hold 'scale' / 'offset' (traiNNer-redux's: 'weight' / 'bias')",
    "realplksr": "traiNNer-redux's realplksr (layer norm first in each block; neosr's: GroupNorm last, "
                 "anysr's RealPLKSR with layer_norm=False)",
    "sebica_mini": "traiNNer-redux's sebica_mini (separate forward / backward channel attention; neosr's: one)",
    "span": "traiNNer-redux's span (52 channels, no normalisation; neosr's: 48 channels)",
    "srformer_light": "traiNNer-redux's srformer_light (embed_dim 180; neosr's: 60)",
}
# The same layout as neosr's, but neosr shifts RGB inputs by 0.5 where anysr (and traiNNer-redux) subtract DIV2K's
# mean: neosr's weights load strictly and give slightly other outputs. ``rgb_mean: [0.5, 0.5, 0.5]`` in the option
# file builds neosr's network where the class has the argument (anysr's neosr presets of those classes set it).
MEAN_DIFFERS = {"dat_s": True, "dat_2": True, "drct": True, "drct_l": True, "drct_xl": True, "hit_srf": True,
                "hat_s": True, "hat_m": True, "hat_l": True, "rgt": True, "rgt_s": True, "craft": True}
SCALE_ARGS = ("upscale", "scale", "upscaling_factor", "upscale_factor", "up_scale", "sr_rate")


def _opt(name: str, scale: int = 4) -> dict:
    """``{"type": name}`` at ``scale`` (a preset's scale, or the class's own scale argument)."""
    preset = find_preset(name, ARCH_REGISTRY.keys())
    if preset is not None:
        return {"type": name, "scale": scale} if preset.scale_arg else {"type": name}
    args = arch_kwargs(name)
    arg = next((a for a in SCALE_ARGS if a in args), None)
    return {"type": name, arg: scale} if arg else {"type": name}


def _meta(opt: dict) -> torch.nn.Module:
    with torch.device("meta"):
        return build_network(opt)


@functools.cache
def _size(name: str) -> tuple[str, int, str] | str:
    """The class, parameter count and layout digest ``name`` builds at x4 (on the meta device; once per name), or
    the first line of why it does not build."""
    try:
        net = _meta(_opt(name))
    except OptionError as e:
        return str(e).splitlines()[0]
    shapes = sorted([k, list(v.shape)] for k, v in net.state_dict().items())
    return (type(net).__name__, sum(p.numel() for p in net.parameters()),
            hashlib.sha256(json.dumps(shapes).encode()).hexdigest())


def test_manifest_holds_neosrs_names_and_small_files() -> None:
    assert len(NAMES) >= 80 and {"esc", "cugan", "swinir_large", "unet"} <= set(NAMES)
    assert set(NOT_SUPPORTED) | set(DIFFERENT) <= set(NAMES)
    files = (*FIXTURES.iterdir(), *FIXTURES.with_name("neosr_families").iterdir())
    assert all(p.stat().st_size < 200_000 for p in files)


def test_every_name_builds_or_is_listed() -> None:
    failing = {name: _size(name) for name in sorted(NAMES) if isinstance(_size(name), str)}
    assert set(failing) == set(NOT_SUPPORTED), {n: failing.get(n, "builds") for n in set(failing) ^ set(NOT_SUPPORTED)}


@pytest.mark.parametrize("name", sorted(n for n, v in NAMES.items() if "params" in v and n not in NOT_SUPPORTED))
def test_default_network_is_neosrs(name: str) -> None:
    """neosr's defaults at x4: the same parameter count and state-dict keys and shapes (on the meta device)."""
    ref, (cls, params, digest) = NAMES[name], _size(name)
    same = (params, digest) == (ref["params"], ref["shapes_sha256"])
    assert same != (name in DIFFERENT), DIFFERENT.get(name, f"{name}: {cls} is not neosr's layout")


def test_neosr_presets_are_neosrs_names() -> None:
    ours = {p.name for p in ARCH_PRESETS.values() if p.source == "neosr"}
    assert ours <= set(NAMES) - set(DIFFERENT) - set(NOT_SUPPORTED)
    assert {c["type"] for c in CASES.values()} <= ours | set(MEAN_DIFFERS)


def test_neosrs_input_mean() -> None:
    """neosr's transformers shift inputs by 0.5: anysr's neosr presets do too; the traiNNer-redux presets neosr's
    names share keep DIV2K's mean (``MEAN_DIFFERS``: True where ``rgb_mean`` can be set)."""
    for preset in ARCH_PRESETS.values():
        if preset.source == "neosr" and "rgb_mean" in arch_kwargs(preset.arch):
            assert tuple(preset.kwargs["rgb_mean"]) == (0.5, 0.5, 0.5), preset.name
    for name, settable in MEAN_DIFFERS.items():
        preset = ARCH_PRESETS[name]
        assert preset.source == "traiNNer-redux" and "rgb_mean" not in preset.kwargs
        assert ("rgb_mean" in arch_kwargs(preset.arch)) == settable, name
    net = build_network({"type": "swinir_small", "scale": 2, "depths": [1], "embed_dim": 12, "num_heads": [2]})
    assert net.mean.flatten().tolist() == [0.5, 0.5, 0.5]
    with pytest.raises(OptionError, match=r"network_g\.rgb_mean: needs three numbers"):
        build_network({"type": "SwinIR", "rgb_mean": [0.5]})


@pytest.mark.parametrize("name", sorted(n for n, c in CASES.items() if c["type"] in MEAN_DIFFERS))
def test_trainner_presets_with_neosrs_mean_are_neosrs(name: str) -> None:
    """hat_s, rgt_s and craft (traiNNer-redux's presets) build neosr's networks with ``rgb_mean: [0.5, 0.5, 0.5]``
    (the case compares them above); with the default, DIV2K's mean, neosr's weights give other outputs."""
    case = CASES[name]
    assert case["kwargs"]["rgb_mean"] == [0.5, 0.5, 0.5]
    net, io = _case(name)
    assert net.mean.flatten().tolist() == [0.5, 0.5, 0.5]
    opt = {"type": case["type"], **{k: v for k, v in case["kwargs"].items() if k != "rgb_mean"}}
    div2k = build_network(opt).eval()
    div2k.load_state_dict(net.state_dict(), strict=True)
    assert torch.allclose(div2k.mean.flatten(), torch.tensor(DIV2K_RGB_MEAN))
    with torch.no_grad():
        assert not torch.allclose(div2k(io["input0"]), io["output0"], **FIXTURE_TOL)


def _case(name: str) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    return load_case("neosr_names", name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_neosr_weights_load_strictly_and_match(name: str) -> None:
    net, io = _case(name)
    for inp, out, _ in CASES[name]["compare"]:
        with torch.no_grad():
            got = net(io[inp])
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} differs")


def test_neosr_esc_files_are_recognised() -> None:
    params = _case("esc_large_x3")[0].state_dict()
    found = recognise(params)
    assert found.opt["type"] == "ESCRealM"
    assert (found.opt["upsampler"], found.opt["scale"], found.opt["exp_ratio"]) == ("dysample_direct", 3, 2.0)
    build_network(found.opt).load_state_dict(params, strict=True)


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "cugan", "scale": 1}, r"network_g: cugan: scale 1 is not available"),
    ({"type": "esc", "is_fp": True}, r"network_g\.is_fp: ESCRealM has no such choice"),
    ({"type": "esc", "dim": 18, "num_heads": 3}, r"network_g\.dim: .*dysample_direct head needs a dim divisible by 4"),
    ({"type": "realplksr_s", "in_ch": 1}, r"network_g\.in_ch: RealPLKSR has no such choice"),
])
def test_bad_neosr_arguments_are_one_line(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err:
        build_network(opt)
    assert "\n" not in str(err.value)


def test_neosr_spellings() -> None:
    """neosr's argument names and spellings where they differ: ``upscaling_factor``, lower-case ``attn_type``, and
    cugan's class by scale (with the "pro" marker)."""
    esc = _meta({"type": "esc", "upscaling_factor": 2, "attn_type": "flex"})
    assert (esc.upscaling_factor, type(esc.to_img).__name__) == (2, "DySample")
    assert build_network({"type": "esc", "attn_type": "flex"}) is not None
    for scale, cls in ((2, "UpCunet2x"), (3, "UpCunet3x"), (4, "UpCunet4x")):
        net = _meta({"type": "cugan", "scale": scale})
        assert (type(net).__name__, net.is_pro) == (cls, True)
    assert not _meta({"type": "cugan", "scale": 2, "pro": False}).is_pro
    assert _meta({"type": "lmlt", "upscaling_factor": 3, "window_size": 8}).scale == 3


# ----------------------------------------------------------------------------- ASID (asid, asid_d8)

ASID_TINY = {"type": "ASID", "num_feat": 8, "window_size": 4, "scale": 2, "flash_attn": False}


@pytest.mark.parametrize("name", sorted(FAMILY_CASES))
def test_new_families_load_neosrs_weights_strictly_and_match(name: str) -> None:
    net, io = load_case("neosr_families", name)
    for inp, out, _ in FAMILY_CASES[name]["compare"]:
        with torch.no_grad():
            got = net(io[inp])
        torch.testing.assert_close(got, io[out], **FIXTURE_TOL, msg=f"{name} {out} differs")


@pytest.mark.parametrize("name", ["asid_x2", "asid_pe_x4", "light_safmnpp_x2_3blocks"])
def test_training_gradients_match_neosr(name: str) -> None:
    """Gradients of ``mean(output ** 2)`` in training mode. With neosr's default ``flash_attn`` the channel
    attention is computed without gradients: its q / k / v convs, the norms before them (and the unused
    temperature) get none."""
    net, io = load_case("neosr_families", name)
    x = io["input0"].clone().requires_grad_(True)
    net.train()(x).square().mean().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, io["grad_input0"], rtol=1e-4, atol=1e-5 * io["grad_input0"].abs().max().item())
    grads = {k[len("grad."):]: v for k, v in io.items() if k.startswith("grad.")}
    assert grads.keys() == {n for n, p in net.named_parameters() if p.grad is not None}
    if name.startswith("asid") and FAMILY_CASES[name]["kwargs"].get("flash_attn", True):
        assert all(".BlockC.cttn" in n or ".BlockC.canorm" in n for n, p in net.named_parameters() if p.grad is None)
    for n, g in grads.items():
        got = net.get_parameter(n).grad
        torch.testing.assert_close(got, g, rtol=1e-4, atol=1e-5 * max(g.abs().max().item(), 1e-3), msg=n)


def test_asid_files_are_recognised() -> None:
    for name, case in ASID_CASES.items():
        net, _ = load_case("neosr_families", name)
        found = recognise(net.state_dict())
        want = {"scale": case["kwargs"]["scale"], "d8": case["kwargs"].get("d8", False),
                "pe": case["kwargs"].get("pe", False), "num_in_ch": case["kwargs"].get("num_in_ch", 3)}
        assert found.opt["type"] == "ASID" and {k: found.opt.get(k, False) for k in want} == want, found.opt
        build_network(found.opt).load_state_dict(net.state_dict(), strict=True)


def test_asid_published_sizes_and_any_input_size() -> None:
    with torch.device("meta"):
        assert sum(p.numel() for p in build_network({"type": "asid", "scale": 4}).parameters()) == 311_754
        assert sum(p.numel() for p in build_network({"type": "asid_d8", "scale": 4}).parameters()) == 746_384
    torch.manual_seed(0)
    net = build_network(ASID_TINY).eval()
    with torch.no_grad():
        assert net(torch.rand(1, 3, 3, 5)).shape == (1, 3, 6, 10)  # grown to the ESA's minimum, cropped back


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "ASID", "num_feat": 10}, r"network_g\.num_feat: ASID needs a num_feat that is a multiple of 4"),
    ({"type": "ASID", "block_num": 2}, r"network_g\.block_num: ASID builds one distillation block"),
    ({"type": "ASID", "scale": 0}, r"network_g\.scale: ASID needs an integer scale >= 1"),
    ({"type": "ASID", "window_size": 0}, r"network_g\.window_size: ASID needs an integer window_size >= 1"),
])
def test_asid_bad_arguments(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err:
        build_network(opt)
    assert "\n" not in str(err.value)


def test_asid_onnx_export_runs_at_sizes_it_never_saw(tmp_path: Path) -> None:
    """neosr's default flash_attn path (scaled dot-product attention; the other is a plain softmax)."""
    torch.manual_seed(0)
    opt = {**ASID_TINY, "flash_attn": True}
    check_onnx_at_unseen_size(build_network(opt).eval(), opt, 2, tmp_path)


def test_neosr_esc_onnx_export_runs_at_sizes_it_never_saw(tmp_path: Path) -> None:
    """ESC's DySample head (``upsampler: dysample_direct``)."""
    torch.manual_seed(0)
    opt = {"type": "esc", "scale": 2, "dim": 8, "pdim": 4, "n_blocks": 1, "conv_blocks": 1, "window_size": 4,
           "num_heads": 2}
    check_onnx_at_unseen_size(build_network(opt).eval(), opt, 2, tmp_path)


@pytest.mark.xla
def test_asid_xla_train_step_compiles_once_without_cpu_fallback() -> None:
    """``flash_attn=False``: every parameter learns (neosr's flash path leaves the channel attention's convs
    without gradients, which the check refuses)."""
    check_xla_train_step(ASID_TINY, (2, 3, 12, 10), scale=2)


# ----------------------------------------------------------------------------- Light-SAFMN++ (light_safmnpp)

SAFMNPP_TINY = {"type": "LightSAFMNPP", "dim": 8, "n_blocks": 1, "upscaling_factor": 2}


def test_light_safmnpp_files_are_recognised_and_any_size_runs() -> None:
    for name, case in FAMILY_CASES.items():
        if case["type"] == "LightSAFMNPP":
            net, _ = load_case("neosr_families", name)
            found = recognise(net.state_dict())
            assert found.opt == {"type": "LightSAFMNPP", **case["kwargs"], **found.opt} and not found.others
            build_network(found.opt).load_state_dict(net.state_dict(), strict=True)
    torch.manual_seed(0)
    with torch.no_grad():
        assert build_network(SAFMNPP_TINY).eval()(torch.rand(1, 3, 5, 9)).shape == (1, 3, 10, 18)


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "LightSAFMNPP", "dim": 7}, r"network_g\.dim: LightSAFMNPP needs an even integer dim >= 2"),
    ({"type": "LightSAFMNPP", "upscaling_factor": 0}, r"network_g\.upscaling_factor: LightSAFMNPP needs an integer"),
])
def test_light_safmnpp_bad_arguments(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err:
        build_network(opt)
    assert "\n" not in str(err.value)


def test_light_safmnpp_onnx_export_runs_at_sizes_it_never_saw(tmp_path: Path) -> None:
    torch.manual_seed(0)
    check_onnx_at_unseen_size(build_network(SAFMNPP_TINY).eval(), SAFMNPP_TINY, 2, tmp_path)


@pytest.mark.xla
def test_light_safmnpp_xla_train_step_compiles_once_without_cpu_fallback() -> None:
    check_xla_train_step(SAFMNPP_TINY, (2, 3, 16, 12), scale=2)

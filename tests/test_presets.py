"""Named architecture presets (``type: hat_s``): each builds exactly the network traiNNer-redux's builder of the same
name builds (fixture: ``tools/fixtures/make_trainner_presets.py``, run against traiNNer-redux's source); option
files name them with overrides under either spelling and get the top-level scale; bad overrides are one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, run_cli, tiny_train_options, write_options
from safetensors.torch import load_file

from anysr.archs import build_network
from anysr.errors import OptionError
from anysr.options.loader import validate_options
from anysr.presets import ARCH_PRESETS, expand_preset, preset_names

FIXTURE = json.loads((ROOT / "tests" / "fixtures" / "trainner" / "presets.json").read_text())
# traiNNer-redux builds ESRGAN through spandrel's class, which names the same tensors in the old ESRGAN layout
# (model.0.weight ...); anysr's RRDBNet keeps BasicSR's names (both load in spandrel): compared by count.
OLD_KEY_LAYOUT = {"RRDBNet"}


def _meta_net(opt: dict) -> torch.nn.Module:
    with torch.device("meta"):
        return build_network(opt)


def _shapes_sha256(net: torch.nn.Module) -> str:
    shapes = sorted([k, list(v.shape)] for k, v in net.state_dict().items())
    return hashlib.sha256(json.dumps(shapes).encode()).hexdigest()


@pytest.mark.parametrize("name", sorted(FIXTURE))
def test_preset_builds_the_network_traiNNer_redux_builds(name: str) -> None:
    ref = FIXTURE[name]
    net = _meta_net({"type": name})
    assert type(net).__name__ == ref["anysr"]
    assert sum(p.numel() for p in net.parameters()) == ref["params"]
    assert len(net.state_dict()) == ref["keys"]
    if ref["anysr"] not in OLD_KEY_LAYOUT:
        assert _shapes_sha256(net) == ref["shapes_sha256"], f"{name}: state-dict keys or shapes differ"


def test_every_preset_is_checked_against_the_reference() -> None:
    trainner = {p.name for p in ARCH_PRESETS.values() if p.source == "traiNNer-redux"}
    assert trainner <= set(FIXTURE), trainner - set(FIXTURE)
    others = {p.name: p.source for p in ARCH_PRESETS.values() if p.source != "traiNNer-redux"}
    assert set(others) == {"edsr_m", "edsr_l", "ecbsr_m4c8", "ecbsr_m4c16", "ecbsr_m10c32", "ecbsr_m16c64", "ipt",
                           "mmrealsr", "hifacegan",
                           # the MMRealSR authors' class names: tests/test_mmrealsr_train.py
                           "MMRRDBNet", "MMRRDBNet_test", "MMRRDBNet_decouple",
                           "docres_discriminator", "ninasr_b0", "ninasr_b2",
                           "plainusr_ultra", "plainusr_large",  # neosr's: tests/archs/test_neosr_cnn.py
                           # neosr's: tests/archs/test_neosr_transformer.py
                           "hma_medium", "hma_large", "grformer_medium", "grformer_large",
                           # neosr's: tests/test_neosr_names.py
                           "cugan", "dat_m", "drct_s", "esc", "esc_light", "esc_large", "hit_srf_medium",
                           "hit_srf_large", "lmlt", "realplksr_s", "realplksr_l", "srformer_medium", "swinir_small",
                           "swinir_medium", "swinir_large", "unet", "asid", "asid_d8",
                           "light_safmnpp",
                           "catanet",  # neosr's: tests/archs/test_catanet.py
                           "esc_fp",  # neosr's: tests/archs/test_neosr_archs.py
                           # neosr's names of families whose defaults are neosr's (the top-level scale passed on;
                           # tests/test_neosr_names.py: neosr's network at x4)
                           "ninasr", "plainusr", "hma", "grformer", "cfsr", "hasn", "krgn", "msdan", "dct"}, others
    assert {"hat_s", "hat_l", "dat_light", "span_s", "esrgan_lite", "swinir_m", "compact", "realplksr_tiny"} \
        <= set(preset_names())


def test_exact_class_name_is_the_class_and_other_case_the_preset() -> None:
    assert _meta_net({"type": "SPAN"}).is_norm  # the class's defaults: 48 channels, normalised
    span = _meta_net({"type": "span"})  # traiNNer-redux's span: 52 channels, no normalisation
    assert not span.is_norm and span.conv_1.sk.out_channels == 52
    assert _meta_net({"type": "Span_S"}).conv_1.sk.out_channels == 48
    assert type(_meta_net({"type": "msrresnet", "num_block": 1})).__name__ == "MSRResNet"  # no preset: the class
    # RCAN: the exact name is BasicSR's layout; traiNNer-redux's rcan the authors' (RCANOriginal)
    assert type(_meta_net({"type": "RCAN", "num_in_ch": 3, "num_out_ch": 3, "num_group": 1, "num_block": 1,
                                         "num_feat": 16})).__name__ == "RCAN"
    assert type(_meta_net({"type": "rcan", "n_resgroups": 1})).__name__ == "RCANOriginal"


def test_overrides_under_either_spelling() -> None:
    opt = expand_preset({"type": "esrgan", "num_filters": 32, "num_blocks": 2, "scale": 2}, "network_g")
    assert opt == {"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3, "num_feat": 32, "num_block": 2, "scale": 2}
    assert expand_preset({"type": "hat_s", "upscale": 3}, "network_g")["upscale"] == 3
    assert expand_preset({"type": "hat_s", "scale": 2}, "network_g")["upscale"] == 2
    # the file's top-level scale goes to the scale argument unless network_g gives it
    assert expand_preset({"type": "swinir_s"}, "network_g", scale=2)["upscale"] == 2
    assert expand_preset({"type": "swinir_s", "scale": 3}, "network_g", scale=2)["upscale"] == 3
    plksr = expand_preset({"type": "realplksr", "upsampler": "dysample"}, "network_g")
    assert plksr["dysample"] is True and "upsampler" not in plksr
    assert expand_preset({"type": "compact", "learn_residual": True}, "network_g") == {"type": "SRVGGNetCompact"}
    # one name, the class by scale (traiNNer-redux's realcugan)
    assert expand_preset({"type": "realcugan"}, "network_g", scale=2) == {"type": "UpCunet2x"}
    assert expand_preset({"type": "realcugan", "fast": True, "pro": False}, "network_g", scale=2) == \
        {"type": "UpCunet2x_fast", "pro": False}
    assert expand_preset({"type": "realcugan", "pro": True}, "network_g", scale=3) == {"type": "UpCunet3x", "pro": True}


@pytest.mark.parametrize(("opt", "pattern"), [
    ({"type": "span", "num_blocks": 8}, r"network_g\.num_blocks: SPAN has no such choice .*set it to 6"),
    ({"type": "esrgan", "use_pixel_unshuffle": False}, r"network_g\.use_pixel_unshuffle: .*set it to True"),
    ({"type": "realplksr", "upsampler": "conv"}, r"network_g: upsampler: 'conv' is not available in RealPLKSR"),
    ({"type": "hat_s", "embed_dimm": 96}, r"network_g\.embed_dimm: .*embed_dim"),
    ({"type": "realcugan", "scale": 4, "fast": True}, r"network_g: fast: true is only available at scale 2"),
])
def test_bad_overrides_are_one_line(opt: dict, pattern: str) -> None:
    with pytest.raises(OptionError, match=pattern) as err:
        _meta_net(opt)
    assert "\n" not in str(err.value)


def test_misspelt_preset_suggests_the_nearest() -> None:
    with pytest.raises(OptionError, match=r"unknown arch 'hat_ss' \(did you mean 'hat_s'\?\).*named preset"):
        _meta_net({"type": "hat_ss"})


def _file(tmp_path: Path, network_g: dict, scale: int = 2) -> dict:
    return {"name": "p", "model_type": "SRModel", "scale": scale, "num_gpu": 0, "network_g": network_g,
            "path": {"root": str(tmp_path)}}


def test_option_file_expands_the_preset_with_the_files_scale(tmp_path: Path) -> None:
    opts = validate_options(_file(tmp_path, {"type": "span_s"}), is_train=False, root=tmp_path)
    net = opts["network_g"]
    assert (net["type"], net["norm"], net["upscale"]) == ("SPAN", False, 2)
    assert net.get("feature_channels", 48) == 48
    assert any(n.startswith("network_g.type span_s -> SPAN(") for n in opts["mapped_keys"])


@pytest.mark.parametrize(("name", "cls", "arg"), [("cfsr", "CFSR", "upscale"), ("msdan", "MSDAN", "upscale_factor"),
                                                 ("krgn", "KRGN", "scale"), ("hma", "HMA", "upscale"),
                                                 ("catanet", "CATANet", "upscale"), ("dct", "DCT", "upscale")])
def test_neosr_file_gives_the_network_its_top_level_scale(tmp_path: Path, name: str, cls: str, arg: str) -> None:
    """neosr's option files name the network in lower case and give the scale only at the top level."""
    opts = validate_options(_file(tmp_path, {"type": name}, scale=3), is_train=False, root=tmp_path)
    assert (opts["network_g"]["type"], opts["network_g"][arg]) == (cls, 3)


def test_option_file_with_a_bad_preset_override_names_it(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"network_g\.num_blocks: SPAN has no such choice"):
        validate_options(_file(tmp_path, {"type": "span_f32", "num_blocks": 4}), is_train=False, root=tmp_path)
    # a preset scale that disagrees with the file's is the usual scale check
    with pytest.raises(OptionError, match=r"network_g\.upscale: 3 differs from the top-level scale \(2\)"):
        validate_options(_file(tmp_path, {"type": "span_f32", "scale": 3}), is_train=False, root=tmp_path)


def test_json_schema_lists_presets_with_their_spellings() -> None:
    schema = json.loads((ROOT / "docs" / "options.schema.json").read_text())
    net = schema["properties"]["network_g"]
    names = net["properties"]["type"].get("enum") or net["properties"]["type"]["anyOf"][0]["enum"]
    assert {"hat_s", "esrgan_lite", "SPAN"} <= set(names)
    esrgan = next(v["then"]["properties"] for v in net["allOf"] if v["if"]["properties"]["type"]["const"] == "esrgan")
    assert {"num_filters", "num_feat", "scale", "use_pixel_unshuffle"} <= set(esrgan)
    assert len([p for p in ARCH_PRESETS.values() if p.arch == "HAT"]) == 5


@pytest.mark.slow
def test_trainner_file_trains_a_preset_through_the_cli(tmp_path: Path, small_train_dir: Path,
                                                      small_val_dir: Path) -> None:
    opt = tiny_train_options("preset", small_train_dir, small_val_dir, total_iter=2)
    opt["network_g"] = {"type": "span_f32", "feature_channels": 8}  # traiNNer-redux's name; scale from the file
    path = write_options(tmp_path / "preset.yml", opt)
    run_cli("train", "-opt", str(path), cwd=tmp_path)
    exp = tmp_path / "experiments" / "preset"
    saved = yaml.safe_load(next(exp.glob("options_*.yml")).read_text())
    assert saved["network_g"]["type"] == "SPAN" and saved["network_g"]["upscale"] == opt["scale"]
    assert saved["network_g"]["norm"] is False and saved["network_g"]["feature_channels"] == 8
    weights = load_file(str(exp / "models" / "net_g_latest.safetensors"))
    first = [v for k, v in weights.items() if k.endswith("conv_1.sk.weight")]
    assert first and all(v.shape[0] == 8 for v in first)
    assert all(torch.isfinite(v).all() for v in weights.values())

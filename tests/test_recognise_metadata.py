"""Weights saved by traiNNer-redux record the network's constructor arguments (its ``metadata``: safetensors
metadata ``{"metadata": "<JSON>"}``, or a ``.pth`` container's ``metadata`` entry beside ``params`` /
``params_ema``); anysr merges them into what it recognises from the names and shapes.

The fixtures in tests/fixtures/trainner_metadata/ (``python tools/fixtures/regen.py trainner_metadata``) come from
traiNNer-redux's / spandrel's own networks with seeded weights: their ``hyperparameters``, the buffers they computed
and each network's output on a seeded input. The files are written here (``trainner_files``, into a temporary
folder) in the layout traiNNer-redux's ``save_network`` writes, from the seeded weights and the recorded metadata;
variants (conflicting, malformed, refused metadata) in the same layout from those files' tensors."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from arch_checks import fixture_io, stored_params
from safetensors.torch import save_file

from anysr.archs import build_network
from anysr.archs.recognition.recognise import Recognised, RecordedValueError, _prefer_takers, recognise
from anysr.engine import checkpoint as ck
from anysr.engine.inference.export import export_weights
from anysr.engine.inference.network import network_options_from_weights, recorded_hyperparameters, resolve_network
from anysr.errors import OptionError
from tests.conftest import run_cli

FIX = Path(__file__).resolve().parent / "fixtures" / "trainner_metadata"
MANIFEST: dict[str, dict[str, Any]] = json.loads((FIX / "manifest.json").read_text())["cases"]
# the cases where the metadata gives what the shapes cannot: without it the output differs
NEEDS_METADATA = ("span_img_range", "swinir_pth_ema", "compact_leakyrelu")
TOL = 1e-5


def _resolve(path: Path | str) -> Any:
    return resolve_network(weights=str(path), arch=None, arch_opts={}, network_opt=None, scale=None,
                           param_key="auto")


def _run(net: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return net.eval()(x)


def _io(name: str) -> dict[str, torch.Tensor]:
    return fixture_io("trainner_metadata", name)


def _state(name: str) -> dict[str, torch.Tensor]:
    """The state dict the reference saved: seeded weights and the buffers it computed (``state.*``)."""
    io = _io(name)
    return {**stored_params("trainner_metadata", name), **{k[6:]: v for k, v in io.items() if k.startswith("state.")}}


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value))


def _write_trainner(path: Path, state: dict[str, torch.Tensor], metadata: Any, param_key: str = "params") -> Path:
    """A file in traiNNer-redux's layout with ``metadata`` as given (JSON-encoded for safetensors unless a str)."""
    if path.suffix == ".safetensors":
        save_file(state, str(path), metadata={"metadata": metadata if isinstance(metadata, str)
                                              else json.dumps(metadata)})
    else:
        torch.save({"metadata": metadata, param_key: state}, path)
    return path


@pytest.fixture(scope="module")
def trainner_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each case's file as traiNNer-redux saves it (its name, param key and recorded metadata), by case."""
    folder = tmp_path_factory.mktemp("trainner_metadata")
    return {name: _write_trainner(folder / case["file"], _state(name), case["metadata"], case["param_key"] or "params")
            for name, case in MANIFEST.items()}


@pytest.fixture
def anysr_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` seeing anysr's logger (which ``setup_logging`` stops from propagating), restored after."""
    logger = logging.getLogger("anysr")
    propagate, level = logger.propagate, logger.level
    logger.propagate = True
    caplog.set_level(logging.INFO, logger="anysr")
    yield caplog
    logger.propagate = propagate
    logger.setLevel(level)


@pytest.mark.parametrize("name", list(MANIFEST))
def test_trainner_file_gives_the_reference_output(name: str, trainner_files: dict[str, Path]) -> None:
    """The network anysr builds from the file alone is the one traiNNer-redux trained: the reference output, the
    true arguments among its options, the same output as anysr's class built with the true arguments."""
    case, io = MANIFEST[name], _io(name)
    res = _resolve(trainner_files[name])
    got = _run(res.net, io["input"])
    assert got.shape == io["output"].shape
    assert (got - io["output"]).abs().max().item() < TOL
    opts = _plain(res.net_opt)
    assert {k: opts.get(k) for k in case["anysr"]} == _plain(case["anysr"])
    true_net = build_network(case["anysr"])
    true_net.load_state_dict(_state(name))
    assert torch.equal(_run(true_net, io["input"]), got)


@pytest.mark.parametrize("name", NEEDS_METADATA)
def test_without_the_metadata_the_defaults_give_another_output(name: str, tmp_path: Path) -> None:
    """The same tensors without the record: the class's defaults are assumed and the output is wrong (the
    record is what makes the fixtures above pass)."""
    bare = tmp_path / "bare.safetensors"
    save_file(_state(name), str(bare))
    io = _io(name)
    assert (_run(_resolve(bare).net, io["input"]) - io["output"]).abs().max().item() > 1e-3


def test_recognised_says_which_arguments_came_from_the_metadata() -> None:
    found = recognise(_state("span_img_range"), hyperparameters=MANIFEST["span_img_range"]["metadata"])
    assert found.from_metadata == {"img_range": 1.0, "rgb_mean": [0.3, 0.5, 0.6]}
    assert "img_range" not in found.inferred and found.inferred["feature_channels"] == 4
    assert found.ignored == ("num_blocks",) and not found.overruled
    assert "from the file's metadata: img_range=1.0, rgb_mean=[0.3, 0.5, 0.6]" in found.describe()
    agrees = recognise(_state("compact_prelu"), hyperparameters=MANIFEST["compact_prelu"]["metadata"])
    assert not agrees.from_metadata and "learn_residual" in agrees.ignored
    assert agrees.describe().endswith("the file's metadata agrees)")
    # act_type='relu' is what the shapes propose; the record's leakyrelu fits the same tensors and replaces it
    leaky = recognise(_state("compact_leakyrelu"), hyperparameters=MANIFEST["compact_leakyrelu"]["metadata"])
    assert leaky.from_metadata == {"act_type": "leakyrelu"} and "act_type" not in leaky.inferred


def test_metadata_contradicting_the_shapes_loses(tmp_path: Path, anysr_log: pytest.LogCaptureFixture) -> None:
    """A record that contradicts the tensors (norm, width): the tensors win, with one warning per argument;
    the record's other values still apply."""
    meta = {**MANIFEST["span_no_norm"]["metadata"], "norm": True, "feature_channels": 99, "bias": False}
    path = _write_trainner(tmp_path / "lying.safetensors", _state("span_no_norm"), meta)
    found = recognise(_state("span_no_norm"), hyperparameters=meta)
    assert found.overruled == {"norm": (True, False), "feature_channels": (99, 4)}
    assert found.opt["norm"] is False and found.opt["feature_channels"] == 4
    res = _resolve(path)
    assert (_run(res.net, _io("span_no_norm")["input"]) - _io("span_no_norm")["output"]).abs().max().item() < TOL
    said = anysr_log.text
    assert "metadata says norm=True but its tensors fit norm=False; the tensors win" in said
    assert "feature_channels=99" in said and "feature_channels=4" in said


@pytest.mark.parametrize(("suffix", "metadata"), [(".safetensors", "{not json"), (".safetensors", "[1, 2]"),
                                                  (".safetensors", '"a string"'), (".pth", "a string"),
                                                  (".pth", [1, 2]), (".pth", {1: 2})])
def test_malformed_metadata_is_ignored_with_a_warning(suffix: str, metadata: Any, tmp_path: Path,
                                                      anysr_log: pytest.LogCaptureFixture) -> None:
    path = _write_trainner(tmp_path / f"bad{suffix}", _state("span_no_norm"), metadata)
    res = _resolve(path)
    io = _io("span_no_norm")
    assert (_run(res.net, io["input"]) - io["output"]).abs().max().item() < TOL
    assert "not a JSON mapping of the network's constructor arguments" in anysr_log.text


def test_recorded_weight_paths_are_never_followed() -> None:
    """A record naming sub-network weight files (``spynet_path``, ``decoder_load_path``) does not pass them on."""
    meta = {"metadata": {"img_range": 1.0, "spynet_path": "/elsewhere.pth", "decoder_load_path": "x.pth"}}
    assert recorded_hyperparameters(meta, "w.pth") == {"img_range": 1.0}
    assert recorded_hyperparameters({"metadata": {}}, "w.pth") is None
    assert recorded_hyperparameters({"network_g": {"type": "SPAN"}}, "w.pth") is None


def test_a_recorded_value_the_class_refuses_is_one_line_naming_it(tmp_path: Path) -> None:
    meta = {**MANIFEST["span_img_range"]["metadata"], "rgb_mean": [0.5, 0.5]}
    path = _write_trainner(tmp_path / "refused.safetensors", _state("span_img_range"), meta)
    with pytest.raises(RecordedValueError) as err:
        _resolve(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "rgb_mean" in msg and "metadata" in msg
    assert isinstance(err.value, OptionError)


def test_pth_container_metadata_is_read_weights_only(tmp_path: Path, trainner_files: dict[str, Path]) -> None:
    """The ``.pth`` record comes back from ``read_weights`` beside the group it read; a BasicSR container
    without one has no metadata, as before."""
    case = MANIFEST["swinir_pth_ema"]
    sd, meta, group = ck.read_weights(trainner_files["swinir_pth_ema"], "auto")
    assert group == "params_ema" and _plain(meta) == {"metadata": case["metadata"]}
    plain = ck.save_weights_pth(tmp_path / "net_g_1.pth", {"params": sd})
    assert ck.read_weights(plain, "auto")[1] == {}


def test_anysr_metadata_takes_precedence(tmp_path: Path) -> None:
    """A file carrying anysr's own network_g is rebuilt from it; a traiNNer-redux record beside it is not read."""
    case = MANIFEST["span_img_range"]
    path = tmp_path / "both.safetensors"
    save_file(_state("span_img_range"), str(path),
              metadata={"network_g": json.dumps(case["anysr"]), "metadata": json.dumps({"img_range": 7.0})})
    res = _resolve(path)
    assert res.net_opt == case["anysr"]
    io = _io("span_img_range")
    assert (_run(res.net, io["input"]) - io["output"]).abs().max().item() < TOL


def test_options_file_auto_and_export_keep_the_recorded_arguments(tmp_path: Path,
                                                                 trainner_files: dict[str, Path]) -> None:
    """``network_g.type: auto`` reads the record too, and ``anysr export`` writes the merged options as anysr's
    network_g (the exported file rebuilds the same network without the record)."""
    opts = network_options_from_weights(trainner_files["swinir_pth_ema"], "auto")
    assert opts["img_range"] == 255.0 and opts["qk_scale"] == 0.25
    out = tmp_path / "exported.safetensors"
    export_weights(str(trainner_files["span_img_range"]), [str(out)])
    recorded = ck.read_weights_metadata(out)["network_g"]
    assert recorded["img_range"] == 1.0 and list(recorded["rgb_mean"]) == [0.3, 0.5, 0.6]


def test_candidates_taking_the_recorded_names_come_first() -> None:
    """Several fitting families: those whose constructors take more of the recorded names are preferred
    (registration order otherwise)."""
    span = Recognised({"type": "SPAN"}, {})
    compact = Recognised({"type": "SRVGGNetCompact"}, {})
    assert _prefer_takers([span, compact], {"act_type": "relu", "num_conv": 2}) == [compact, span]
    assert _prefer_takers([span, compact], {"unknown": 1}) == [span, compact]


@pytest.mark.slow
def test_cli_infer_uses_the_recorded_arguments(tmp_path: Path, trainner_files: dict[str, Path]) -> None:
    """``anysr infer`` on a traiNNer-redux file (no --arch): the output of the network with its true arguments,
    and the log says which came from the metadata."""
    cv2 = pytest.importorskip("cv2")
    case = MANIFEST["span_img_range"]
    rgb = torch.rand(1, 3, 9, 11, generator=torch.Generator().manual_seed(3))
    img = (rgb[0].permute(1, 2, 0).numpy()[..., ::-1] * 255).round().astype(np.uint8)
    cv2.imwrite(str(tmp_path / "in.png"), img)
    proc = run_cli("infer", "--weights", str(trainner_files["span_img_range"]), "-i", str(tmp_path / "in.png"), "-o",
                   str(tmp_path / "out"), "--precision", "fp32", cwd=tmp_path)
    assert "from the file's metadata: img_range=1.0, rgb_mean=[0.3, 0.5, 0.6]" in proc.stdout + proc.stderr
    out = cv2.imread(str(tmp_path / "out" / "in.png"))
    true_net = build_network(case["anysr"])
    true_net.load_state_dict(_state("span_img_range"))
    x = torch.from_numpy(img[..., ::-1].copy()).permute(2, 0, 1)[None].float() / 255
    want = (_run(true_net, x).clamp(0, 1) * 255).round()[0].permute(1, 2, 0).numpy()[..., ::-1]
    assert out.shape == want.shape and np.abs(out.astype(int) - want.astype(int)).max() <= 1

"""The JSON Schema of the options (``anysr schema``, shipped as docs/options.schema.json) for editor completion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, run_cli

from anysr.options.jsonschema import render

jsonschema = pytest.importorskip("jsonschema")
SHIPPED = ROOT / "docs" / "options.schema.json"


@pytest.fixture(scope="module")
def validator() -> object:
    schema = json.loads(SHIPPED.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_shipped_schema_is_current() -> None:
    assert SHIPPED.read_text() == render(), "stale: run anysr schema -o docs/options.schema.json"


@pytest.mark.parametrize("path", sorted((ROOT / "options").glob("*/*.yml")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_options_file_validates(path: Path, validator: object) -> None:
    errors = [e.message for e in validator.iter_errors(yaml.safe_load(path.read_text()))]  # type: ignore[attr-defined]
    assert not errors


def test_schema_catches_what_editors_should_flag(validator: object) -> None:
    base = yaml.safe_load((ROOT / "options" / "train" / "quickstart_EDSR_x2.yml").read_text())

    def errors(change: dict) -> list[str]:
        data = json.loads(json.dumps(base))
        for dotted, value in change.items():
            node = data
            *parents, last = dotted.split(".")
            for key in parents:
                node = node[key]
            node[last] = value
        return [e.message for e in validator.iter_errors(data)]  # type: ignore[attr-defined]

    assert errors({"train.total_iter": "5e3"}) == []  # PyYAML's string for 5e3: accepted, as the loader does
    assert errors({"train.total_iter": "many"})
    assert errors({"trian": {}})  # an unknown top-level key
    assert errors({"network_g.num_feats": 8})  # not an EDSR argument
    assert errors({"network_g.type": "EDRS"})  # not a registered architecture
    assert errors({"datasets.train.gt_szie": 96})
    assert errors({"accelerator": "tpu"})
    assert errors({"train.optim_g.momentum": 0.9})  # SGD's, not Adam's
    # an optional package's optimizer (anysr[optim]) is not listed, whatever is installed: accepted with its arguments
    assert errors({"train.optim_g": {"type": "AdamWScheduleFree", "lr": 1e-3, "warmup_steps": 10}}) == []
    assert errors({"train.scheduler": {"type": "CosineWarmupLR"}}) == []  # total_iter: train.total_iter
    assert errors({"val.save_img": None}) == []  # ~ means the default


def test_cli_prints_the_schema(tmp_path: Path) -> None:
    proc = run_cli("schema", cwd=tmp_path)
    schema = json.loads(proc.stdout)
    assert "network_g" in schema["properties"] and schema["$schema"].endswith("2020-12/schema")

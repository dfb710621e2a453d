"""Every registered network has a recorded upstream and licence, and docs/architectures.md's table is current."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import ROOT, run_cli

import anysr.archs  # noqa: F401  (fills the registry)
from anysr.archs.sources import BEGIN, END, SOURCES, render_into, render_table
from anysr.registry import ARCH_REGISTRY

DOC = ROOT / "docs" / "architectures.md"


def test_every_registered_network_has_a_source_and_no_row_is_stale() -> None:
    registered = set(ARCH_REGISTRY.keys())
    assert sorted(registered - set(SOURCES)) == [], "add them to anysr/archs/sources.py"
    assert sorted(set(SOURCES) - registered) == [], "no longer registered: remove them from anysr/archs/sources.py"
    for name, src in SOURCES.items():
        assert src.repository == "anysr" or re.fullmatch(r"[\w.-]+/[\w.-]+", src.repository), name
        assert src.licence and (not src.via or "/" in src.via), name


def test_docs_table_is_generated_from_the_registry() -> None:
    text = DOC.read_text()
    assert text == render_into(text, list(ARCH_REGISTRY.keys())), \
        "stale: run anysr schema --architectures -o docs/architectures.md"
    assert f"{len(ARCH_REGISTRY.keys())} registered types" in text
    table = render_table(["HAT", "SRFormer", "SwinIR"])
    assert "[XPixelGroup/HAT](https://github.com/XPixelGroup/HAT) | Apache-2.0 | the upstream |" in table
    assert "| `SRFormer` | [HVision-NKU/SRFormer](https://github.com/HVision-NKU/SRFormer) | CC-BY-NC-4.0 |" in table
    assert "[XPixelGroup/BasicSR](https://github.com/XPixelGroup/BasicSR) |" in table.split("`SwinIR`")[1]


def test_cli_rewrites_only_the_table_and_names_a_file_without_markers(tmp_path: Path) -> None:
    doc = tmp_path / "arch.md"
    doc.write_text(f"# mine\n\nbefore\n\n{BEGIN}\nold table\n{END}\n\nafter\n")
    proc = run_cli("schema", "--architectures", "-o", str(doc), cwd=tmp_path)
    text = doc.read_text()
    assert f"wrote {doc}" in proc.stdout and "old table" not in text
    assert text.startswith("# mine\n\nbefore\n\n") and text.endswith(f"{END}\n\nafter\n")
    assert text == render_into(text, list(ARCH_REGISTRY.keys()))
    bare = tmp_path / "bare.md"
    bare.write_text("# no markers\n")
    bad = run_cli("schema", "--architectures", "-o", str(bare), cwd=tmp_path, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith(f"anysr schema --architectures: {bare} has no generated-table")
    assert bare.read_text() == "# no markers\n" and "Traceback" not in bad.stderr
    printed = run_cli("schema", "--architectures", cwd=tmp_path)
    assert printed.stdout.startswith(BEGIN) and "| `Bicubic` | anysr | Apache-2.0 |" in printed.stdout

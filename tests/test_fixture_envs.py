"""tools/fixtures/envs.toml pins every fixture generator's reference environment (issue 38 item 3): each generator is
in exactly one environment, every package pin is exact, every reference repository names its commit, and nothing
under tools/fixtures points at one machine's folders."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib

TOOLS = Path(__file__).resolve().parents[1] / "tools" / "fixtures"
ENVS = tomllib.loads((TOOLS / "envs.toml").read_text())["env"]
GENERATORS = sorted(p.name for p in TOOLS.glob("make_*_fixtures.py"))


def test_every_generator_in_exactly_one_env() -> None:
    listed = [g for env in ENVS.values() for g in env.get("generators", [])]
    assert GENERATORS, "no generators found"
    missing = [g for g in GENERATORS if g not in listed]
    twice = sorted({g for g in listed if listed.count(g) > 1})
    assert not missing, f"not in any env of envs.toml: {missing}"
    assert not twice, f"in more than one env of envs.toml: {twice}"
    absent = [g for g in listed if not (TOOLS / g).is_file()]
    assert not absent, f"envs.toml lists generators that do not exist: {absent}"


def test_pins_are_exact() -> None:
    pin = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!-]+$")
    for name, env in ENVS.items():
        for req in env.get("packages", []) + env.get("no_deps", []):
            assert pin.match(req), f"env.{name}: {req!r} is not an exact pin (name==version)"
        for repo, spec in env.get("repos", {}).items():
            assert spec.get("url", "").startswith("https://"), f"env.{name}.repos.{repo}: no url"
            assert re.fullmatch(r"[0-9a-f]{40}", spec.get("commit", "")), f"env.{name}.repos.{repo}: no 40-hex commit"


def test_no_machine_paths() -> None:
    path = re.compile(r"(?<![\w.])/(work|root|tmp)\b")
    files = [p for p in sorted(TOOLS.rglob("*")) if p.is_file() and p.suffix in {".py", ".toml", ".md", ".txt"}]
    bad = [f"{p.name}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1) if path.search(line)]
    assert not bad, f"machine paths in tools/fixtures: {bad}"

"""Render ``docs/options.md`` from the schema (``anysr schema --markdown -o docs/options.md``)."""

from __future__ import annotations

from typing import Any

from anysr.options.fields import MISSING, Field, MapOf, Section, expectation, join
from anysr.options.schema import OPTIONS
from anysr.presets import ARCH_PRESETS

INTRO = """\
# Options reference

Generated from `anysr/options/schema.py` (the source of truth) by
`anysr schema --markdown -o docs/options.md`; a test fails when the two differ.

anysr reads BasicSR-style YAML files. `load_options(path, overrides, is_train=...)` reads the file,
applies command-line overrides, checks every key and returns a plain nested dict with the defaults below
filled in (`opt['train']['ema_decay']`).

Rules that hold everywhere:

- **Every problem is reported at once**, one per line, each naming the full key path
  (`datasets.train.gt_size`), the bad value and what is expected; an unknown key comes with the nearest
  valid one (`gt_szie` -> did you mean `gt_size`?). Nothing runs until the file is clean.
- **Numbers written as text** (PyYAML reads `5e3` and `1e-4` as strings) are accepted for int and float
  keys when they parse exactly: `5e3` -> 5000; `2.5` or `5e-1` for an int key is refused. Whole floats are
  accepted for int keys (`!!float 5e3`).
- **`~` / null** on a key that has a default means the default; on a key without one it leaves the key unset.
- **Paths**: `~` is expanded and relative paths are taken from `path.root` (default: the `root` argument,
  else the current directory); input paths (`dataroot_*`, `meta_info_file`, `pretrain_network_*`,
  `resume_state`) must exist when the options are loaded. The returned dict holds absolute paths.
- **Types that name a class** (`model_type`, `network_g.type`, `datasets.*.type`, `val.metrics.*.type`)
  are checked against the registries once their packages import; the arch's constructor arguments are
  checked against its signature (`anysr.archs.arch_kwargs`).
- **Overrides**: `--force_yml key.path=value ...` on the command line (`parse_override`); the value is read as
  YAML (`train.total_iter=1000` int, `val.save_img=true` bool, `train.optim_g.betas=[0.9,0.99]` list,
  `val=null`), missing mappings on the way are created. A key set to `null` (or `~`) counts as not set: that is
  how a key of the file is removed, e.g. `datasets.train.dataroot_lq=~ datasets.train.lq_from_gt=true` (what
  `anysr train --data DIR` writes for you), or a whole entry: `datasets.val_2=~`, `val.metrics.niqe=~`.
  Nothing is ever passed to `eval`.
- Dataset keys name their phase: `train*` -> train, `val*` -> val, `test*` -> test. Training reads exactly
  one train dataset.
"""


def _fmt(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`'{value}'`"
    if isinstance(value, dict):
        return "see below" if not value else f"`{value}`"
    return f"`{value}`"


def _default(fld: Field) -> str:
    if fld.required:
        return "**required**"
    if fld.default_doc:
        return f"*{fld.default_doc}*"
    if fld.default is MISSING:
        return "unset"
    return _fmt(fld.default)


def _cell(text: str) -> str:
    text = text.replace(" | ", " or ").replace("|", "\\|")
    return text.replace("<", "&lt;") if "`" not in text else text


def _nested(fld: Field) -> tuple[str, Section] | None:
    members = fld.type if isinstance(fld.type, tuple) else (fld.type,)
    for m in members:
        if isinstance(m, Section):
            return "", m
        if isinstance(m, MapOf):
            return ".<name>", m.entry
    return None


def _section(lines: list[str], title: str, section: Section, intro: str = "") -> None:
    lines += ["", f"## `{title}`" if title else "## Top level", ""]
    if section.doc or intro:
        lines += [section.doc or intro, ""]
    lines += ["| Key | Accepts | Default | Meaning |", "|---|---|---|---|"]
    children = []
    for name, fld in section.fields.items():
        path = join(title, name)
        lines.append(f"| `{path}` | {_cell(expectation(fld))} | {_cell(_default(fld))} | {_cell(fld.doc)} |")
        nested = _nested(fld)
        if nested is not None:
            children.append((path + nested[0], nested[1], fld.doc))
    extra = []
    if section.extra:
        extra.append("Other keys are passed through as constructor arguments.")
    for alias, target in section.aliases.items():
        extra.append(f"`{join(title, alias)}` is accepted as another name for `{join(title, target)}`.")
    for key, why in section.refused.items():
        extra.append(f"`{join(title, key)}` is refused: it {why}.")
    if extra:
        lines += ["", *extra]
    for path, sub, doc in children:
        _section(lines, path, sub, doc)


def _presets(lines: list[str]) -> None:
    lines += ["", "## Architecture presets", "",
              "`network_g.type` may name a published variant instead of a class (traiNNer-redux's names, any letter "
              "case; `edsr_*` and `ecbsr_*` name BasicSR's and the ECBSR authors' released models). It is "
              "expanded into the class and the arguments below (the others keep the class's defaults); "
              "the top-level `scale` goes to the scale argument unless `network_g` gives it, and any argument can "
              "still be set, under the class's name or traiNNer-redux's (`scale`, `num_filters`, ...). A name that "
              "is exactly a class (`SPAN`) is the class with its own defaults. The start-up log and the run's saved "
              "options show the expansion.", "",
              "| Preset | Class | Arguments | Scale argument |", "|---|---|---|---|"]
    for p in sorted(ARCH_PRESETS.values(), key=lambda p: (p.arch.lower(), p.name)):
        args = ", ".join(f"{k}: {list(v) if isinstance(v, tuple) else v!r}" for k, v in p.kwargs.items())
        lines.append(f"| `{p.name}` | `{p.arch}` | {_cell(args) or 'the defaults'} | {p.scale_arg or '(x1 only)'} |")


def render_markdown() -> str:
    """The whole options reference as Markdown."""
    lines = [INTRO.rstrip()]
    _section(lines, "", OPTIONS)
    _presets(lines)
    return "\n".join(lines) + "\n"


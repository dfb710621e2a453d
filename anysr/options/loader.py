"""Reading option files: YAML -> overrides -> validated dict with defaults and resolved paths."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from anysr.errors import OptionError
from anysr.options.common import dataset_role, phase_of, registered
from anysr.options.fields import Context, show, validate_section
from anysr.options.neosr import map_neosr, read_toml
from anysr.options.schema import DATASET, OPTIONS, resolve_path, validate
from anysr.options.typed import Options, plain, typed

_OVERRIDE_FORM = "expected key.path=value, e.g. train.total_iter=1000 or val=null"


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key written twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is written twice (first at line {seen[key]}); keep one",
                    key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


# What an options file may make anysr build: a few hundred values are usual; aliases may share a block, never
# multiply it ("billion laughs": nine levels of ten aliases are 10**9 values from a 1 KB file).
MAX_YAML_ALIASES = 1_000
MAX_YAML_VALUES = 100_000
MAX_YAML_DEPTH = 64


def _yaml_children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _check_yaml_size(root: yaml.Node, where: str) -> None:
    """Refuse a composed document whose aliases loop, are too many or expand too far, or that nests too deep,
    before anything is built from it (one walk over the node graph, aliases counted once each)."""
    expanded: dict[int, int] = {}  # id(node) -> values it expands to, once walked
    inside: set[int] = {id(root)}
    aliases = 0
    stack: list[tuple[yaml.Node, Any, list[int]]] = [(root, iter(_yaml_children(root)), [1])]
    while stack:
        node, todo, count = stack[-1]
        child = next(todo, None)
        if child is None:
            stack.pop()
            inside.discard(id(node))
            expanded[id(node)] = count[0]
            if stack:
                stack[-1][2][0] += count[0]
        elif id(child) in inside:
            raise OptionError(f"{where}: the YAML alias to the value at line {child.start_mark.line + 1} is used "
                              "inside itself (a loop that never ends); write the value out instead")
        elif id(child) in expanded:
            aliases += 1
            count[0] += expanded[id(child)]
            if aliases > MAX_YAML_ALIASES:
                raise OptionError(f"{where}: more than {MAX_YAML_ALIASES} YAML aliases (*name); write the values "
                                  "out, or share fewer of them")
        else:
            if len(stack) >= MAX_YAML_DEPTH:
                raise OptionError(f"{where}: values nested more than {MAX_YAML_DEPTH} levels deep (at line "
                                  f"{child.start_mark.line + 1}); options are a few levels deep: fix the brackets")
            inside.add(id(child))
            stack.append((child, iter(_yaml_children(child)), [1]))
        if stack and stack[0][2][0] + sum(c[0] for _, _, c in stack[1:]) > MAX_YAML_VALUES:
            raise OptionError(f"{where}: its YAML aliases (*name) expand to more than {MAX_YAML_VALUES:,} values "
                              "(aliases of aliases multiply); an options file holds a few hundred: remove the "
                              "nested aliases")


def _load_yaml(text: str, where: str) -> Any:
    """``yaml.load`` with the strict loader, its node graph bounded (``_check_yaml_size``) before construction."""
    loader = _StrictLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise OptionError(f"{where}: values nested too deeply for the YAML reader; options are a few levels "
                              "deep: fix the brackets") from None
        if node is None:
            return None
        _check_yaml_size(node, where)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML file; OptionError for a missing file, a syntax error (with its line), etc."""
    p = Path(path)
    text = _read_text(p)
    try:
        data = _load_yaml(text, f"options file '{p}'")
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = err.problem or ""
        if isinstance(err, yaml.constructor.ConstructorError) and "constructor for the tag" in problem:
            found = re.search(r"'([^']+)'", problem)
            tag = (found.group(1) if found else "?").replace("tag:yaml.org,2002:", "!!")
            raise OptionError(f"options file '{p}'{where}: the tag {tag} is refused: options are plain data "
                              "(numbers, strings, lists, mappings) and anysr never builds Python objects from "
                              "them; remove the tag") from None
        what = " ".join(x for x in (err.context, problem) if x)
        raise OptionError(f"options file '{p}': YAML syntax error{where}: {what}") from None
    except yaml.YAMLError as err:
        raise OptionError(f"options file '{p}': YAML error: {err}") from None
    if data is None:
        raise OptionError(f"options file '{p}' is empty; it needs at least name, scale and network_g")
    if not isinstance(data, dict):
        if _looks_like_toml(text):
            raise OptionError(f"options file '{p}' is TOML (neosr's format: 'key = value' lines and [tables]) "
                              f"but named {p.suffix or 'without a suffix'}, so it was read as YAML; rename it to "
                              f"{p.stem}.toml")
        raise OptionError(f"options file '{p}': the top level must be a mapping (key: value lines), "
                          f"got {type(data).__name__}")
    return data


MAX_OPTIONS_BYTES = 4 * 1024 * 1024  # an options file is a few KB; more is not one (e.g. -opt /dev/zero)


def _read_text(p: Path) -> str:
    """The text of an options file: a regular file, or a pipe / device (``-opt <(...)``, ``/dev/stdin``)."""
    if not p.exists():
        raise OptionError(f"options file '{p}' does not exist; check the path given to -opt")
    if p.is_dir():
        raise OptionError(f"options file '{p}' is a folder; give the path of a .yml file")
    try:
        with p.open("rb") as f:
            raw = f.read(MAX_OPTIONS_BYTES + 1)
    except OSError as err:
        raise OptionError(f"options file '{p}' cannot be read: {err.strerror or err}") from None
    if len(raw) > MAX_OPTIONS_BYTES:
        raise OptionError(f"options file '{p}' is larger than {MAX_OPTIONS_BYTES // 2**20} MiB: not an options file "
                          "(give the path of a .yml file)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise OptionError(f"options file '{p}' is not UTF-8 text ({err.reason} at byte {err.start})") from None


_TOML_LINE = re.compile(r"^\s*(\[\[?[A-Za-z0-9_.\"' -]+\]\]?|[A-Za-z0-9_.\"'-]+\s*=\s*\S)")


def _looks_like_toml(text: str) -> bool:
    """Whether most of the meaningful lines are TOML's ``key = value`` or ``[table]``."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    return bool(lines) and sum(bool(_TOML_LINE.match(ln)) for ln in lines) >= 0.6 * len(lines)


def _looks_like_yaml_mapping(text: str) -> bool:
    try:
        return isinstance(yaml.safe_load(text), dict)
    except yaml.YAMLError:
        return False


def read_options_file(path: str | Path) -> dict[str, Any]:
    """An options file's mapping in anysr's layout: YAML as it is; a ``.toml`` file is read as neosr's dialect and
    rewritten (``anysr.options.neosr.map_neosr``), what was mapped kept in ``mapped_keys`` (logged at start)."""
    p = Path(path)
    if p.suffix.lower() != ".toml":
        return read_yaml(p)
    text = _read_text(p)  # the same messages for a missing file, a folder or a pipe as for YAML
    try:
        data, notes = map_neosr(read_toml(p, text))
    except OptionError as err:
        if _looks_like_yaml_mapping(text) and not _looks_like_toml(text):
            raise OptionError(f"options file '{p}' is YAML ('key: value' lines) but named .toml, so it was read as "
                              f"neosr's TOML; rename it to {p.stem}.yml") from None
        raise OptionError(f"options file '{p}': {err}") from None
    return {**data, "mapped_keys": notes}


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'a.b.c=value'`` -> ``(['a', 'b', 'c'], value)``; the value is read as YAML (``yaml_value``)."""
    if not isinstance(text, str) or "=" not in text:
        raise OptionError(f"override {text!r}: no '='; {_OVERRIDE_FORM}")
    key, _, raw = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not key or any(not part or part != part.strip() or " " in part for part in parts):
        raise OptionError(f"override {text!r}: bad key path '{key}' (empty or blank part); {_OVERRIDE_FORM}")
    return parts, yaml_value(raw, f"override {text!r}")


def yaml_value(raw: str, where: str) -> Any:
    """One value given on the command line (``key=VALUE``), read as YAML with the options file's bounds."""
    try:
        return _load_yaml(raw, where)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise OptionError(f"{where}: the value {raw!r} is not valid YAML ({problem}); "
                          "quote it, e.g. name='a: b'") from None


def _set(opt: dict[str, Any], keys: list[str], value: Any, text: str) -> None:
    node: Any = opt
    for i, key in enumerate(keys):
        last = i == len(keys) - 1
        here = ".".join(keys[: i + 1])
        if isinstance(node, list):
            if not key.isdigit() or int(key) >= len(node):
                raise OptionError(f"override {text!r}: {'.'.join(keys[:i])} is a list of {len(node)} items; "
                                  f"'{key}' is not an index in it")
            key_or_index: Any = int(key)
        else:
            key_or_index = key
        if last:
            node[key_or_index] = value
            return
        child = node[key_or_index] if isinstance(node, list) else node.get(key)
        if child is None:
            child = {}
            node[key_or_index] = child
        elif not isinstance(child, (dict, list)):
            raise OptionError(f"override {text!r}: {here} is {show(child)}, not a mapping, so "
                              f"{'.'.join(keys)} cannot be set; override {here} itself")
        node = child


def apply_overrides(opt: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``opt`` with each ``key.path=value`` applied in order; bad ones all in one OptionError."""
    out = copy.deepcopy(opt)
    problems = []
    for text in overrides:
        try:
            keys, value = parse_override(text)
            _set(out, keys, value, text)
        except OptionError as err:
            problems.append(str(err))
    if problems:
        raise OptionError("\n".join(problems) if len(problems) == 1 else
                          f"{len(problems)} bad overrides:\n" + "\n".join(f"  {p}" for p in problems))
    return out


def validate_options(opt: dict[str, Any], *, is_train: bool, root: str | Path | None = None,
                     source: str = "options", check_paths: bool = True) -> Options:
    """Check ``opt`` against the schema: frozen ``Options`` with every default filled and paths resolved.

    ``root``: base of relative paths and of the output folders when ``path.root`` is not set (default: the
    current directory). Every problem found is listed, one per line, in a single OptionError.
    ``check_paths=False``: input paths (datasets, weights) need not exist.
    """
    if not isinstance(opt, Mapping):
        raise OptionError(f"{source}: the options must be a mapping (name, scale, network_g, ...), "
                          f"got {type(opt).__name__}")
    opt = plain(opt)
    base = Path(root if root is not None else Path.cwd()).expanduser().absolute()
    result, problems = validate(copy.deepcopy(opt), is_train=is_train, root=base, check_paths=check_paths)
    if problems:
        count = f"{len(problems)} problem{'s' if len(problems) > 1 else ''}"
        raise OptionError(f"{count} in {source}:\n" + "\n".join(f"  {p}" for p in problems))
    return typed(OPTIONS, result)


def validate_dataset(opt: Mapping[str, Any], *, name: str = "train", scale: int | None = None,
                     root: str | Path | None = None) -> Options:
    """One dataset section (as under ``datasets.<name>``) validated alone, for building a dataset in code.

    ``name`` gives the phase (train*, val*, test*); ``scale`` the top-level scale (else the section's own).
    """
    data = plain(opt)
    given_scale = scale if scale is not None else data.pop("scale", None)
    ctx = Context(is_train=name.startswith("train"), root=Path(root if root is not None else Path.cwd()).absolute(),
                  scale=given_scale if isinstance(given_scale, int) and not isinstance(given_scale, bool) else None)
    result = validate_section(DATASET, data, f"datasets.{name}", ctx, name)
    if ctx.problems:
        raise OptionError(f"{len(ctx.problems)} problem(s) in datasets.{name}:\n" +
                          "\n".join(f"  {p}" for p in ctx.problems))
    return typed(DATASET, result, f"datasets.{name}")


def data_overrides(path: str | Path, folder: str | Path) -> list[str]:
    """``--data DIR``: the overrides that train the file's one train dataset on the images of ``folder`` (ground
    truth; the LQ made from it as the file's dataset does: MATLAB bicubic for paired sets, the file's degradations
    for Real-ESRGAN's), every other setting of the file kept. Validation sets are left as the file gives them."""
    datasets = read_options_file(path).get("datasets")
    keys = [k for k in datasets if isinstance(k, str) and phase_of(k) == "train"] if isinstance(datasets, dict) else []
    if len(keys) != 1:
        raise OptionError(f"--data: options file '{path}' has {len(keys)} train datasets; --data replaces the one "
                          "train dataset's images (give them with --force_yml datasets.<name>.dataroot_gt=DIR)")
    key, ds = keys[0], datasets[keys[0]]
    kind = ds.get("type") if isinstance(ds, dict) else None
    cls = registered("dataset", kind)
    role = dataset_role(kind)
    base = f"datasets.{key}"
    out = [f"{base}.dataroot_gt={json.dumps(str(folder))}"]
    if role == "paired" and cls is not None and cls.__name__ == "PairedImageDataset":
        out += [f"{base}.lq_from_gt=true"] + [f"{base}.dataroot_lq=~"] * ("dataroot_lq" in ds)
    elif role != "synthesis_source":
        raise OptionError(f"--data: {base}.type {kind} does not make its LQ images from a folder of ground truth; "
                          "--data works with PairedImageDataset and Real-ESRGAN's datasets: set the dataset's "
                          "keys with --force_yml instead")
    out += [f"{base}.{k}=~" for k in ("meta_info", "meta_info_file") if k in ds]
    if isinstance(ds.get("io_backend"), dict) and ds["io_backend"].get("type", "disk") != "disk":
        out.append(f"{base}.io_backend={{type: disk}}")
    return out


NetworkFromWeights = Callable[[Path, str], dict[str, Any]]


def network_from_weights(data: dict[str, Any], read: NetworkFromWeights, root: str | Path | None) -> dict[str, Any]:
    """``data`` with ``network_g: {type: auto}`` replaced by the network ``read`` recognises in
    ``path.pretrain_network_g`` (its other ``network_g`` keys override what was recognised); unchanged otherwise.
    ``read(weights_path, param_key)`` is the engine's (it reads tensors: this module imports no torch)."""
    net = data.get("network_g")
    if not (isinstance(net, dict) and str(net.get("type", "")).lower() == "auto"):
        return data
    paths = data.get("path") if isinstance(data.get("path"), dict) else {}
    given = paths.get("pretrain_network_g") or paths.get("pretrain_model_g")
    if not isinstance(given, str) or not given:
        raise OptionError("network_g.type: auto reads the network from path.pretrain_network_g, which is not set; "
                          "set it to the weights file, or name the architecture in network_g.type")
    base = Path(root if root is not None else Path.cwd()).expanduser().absolute()
    if isinstance(paths.get("root"), str):
        base = resolve_path(paths["root"], base)
    weights = resolve_path(given, base)
    if not weights.is_file():
        raise OptionError(f"path.pretrain_network_g: {weights} does not exist (network_g.type: auto reads the "
                          "network from it); fix the path")
    found = read(weights, str(paths.get("param_key_g") or "params"))
    args = ", ".join(f"{k}={v!r}" for k, v in found.items() if k != "type")
    return {**data, "network_g": {**found, **{k: v for k, v in net.items() if k != "type"}},
            "network_recognised": f"{found['type']}({args}) from {weights}"}


def load_options(path: str | Path, overrides: Sequence[str] = (), *, is_train: bool,
                 root: str | Path | None = None, check_paths: bool = True,
                 read_network: NetworkFromWeights | None = None) -> Options:
    """Read a BasicSR-style YAML file (or neosr's TOML: ``read_options_file``), apply ``key.path=value`` overrides,
    validate, fill defaults.

    Returns frozen ``Options`` (``opt.train.ema_decay``; ``opt['train']['ema_decay']`` too) with ``is_train``
    set, every dataset's ``phase`` and ``scale`` set and every path absolute. ``read_network``: how
    ``network_g.type: auto`` is read from ``path.pretrain_network_g`` (the commands pass the engine's recogniser;
    without it ``auto`` is an unknown architecture).
    """
    data = read_options_file(path)
    data = apply_overrides(data, overrides)
    source = f"options file '{path}'"
    if overrides:
        source += f" (with overrides {' '.join(overrides)})"
    if read_network is not None and isinstance(data, dict):
        data = network_from_weights(data, read_network, root)
    return validate_options(data, is_train=is_train, root=root, source=source, check_paths=check_paths)

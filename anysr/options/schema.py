"""The option schema: every key anysr reads (BasicSR's vocabulary plus ours), its type, default and rules.

This module is the source of truth for defaults; ``docs/options.md`` is generated from it
(``anysr schema --markdown``). Families of keys live in their own modules (``video.py``, ``realesrgan.py``)
and are added here. Every named choice is read from the registries (``common.py``): nothing here imports torch, a
dataset, a model or a network.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anysr.accelerators.hardware import PRECISION_CHOICES
from anysr.accelerators.kinds import ACCELERATOR_HINTS, ACCELERATORS, LAUNCHERS
from anysr.accelerators.xla_backends import MATMUL_PRECISIONS, XLA_BACKENDS
from anysr.atomic import MAX_NAME_BYTES, file_name_part_problem
from anysr.dataset_sources import provider_of
from anysr.errors import OptionError, did_you_mean
from anysr.options.augment import AUGMENT_TRAIN_FIELDS, augment_rule
from anysr.options.bsrgan import BSRGAN_DATASET_FIELDS, bsrgan_dataset_rule, is_degradation_source
from anysr.options.common import (
    PHASES,
    backend_types,
    check_gt_size,
    dataset_role,
    good,
    known_names,
    phase_of,
    registered,
    registry,
)
from anysr.options.ffhq_degradation import (
    FFHQ_DEGRADATION_DATASET_FIELDS,
    face_augment_dataset_rule,
    ffhq_degradation_dataset_rule,
    is_face_augment_source,
    is_face_degradation_source,
)
from anysr.options.fields import (
    MISSING,
    Check,
    Context,
    Field,
    ListOf,
    MapOf,
    Rule,
    Section,
    at_least,
    between,
    greater_than,
    show,
    validate_field,
    validate_section,
)
from anysr.options.mmrealsr import MMREALSR_FIELDS, mmrealsr_rule
from anysr.options.neosr import NEOSR_NOTE
from anysr.options.realesrgan import (
    REALESRGAN_DATASET_FIELDS,
    REALESRGAN_FIELDS,
    is_synthesis_source,
    realesrgan_dataset_rule,
    realesrgan_rule,
)
from anysr.options.restoreformer_model import RESTOREFORMER_TRAIN_FIELDS, restoreformer_rule
from anysr.options.shards import SHARD_IO_FIELDS, io_backend_rule, shard_roots_rule
from anysr.options.trainner import (
    TRAINNER_DATASET_FIELDS,
    TRAINNER_LOGGER_FIELDS,
    TRAINNER_TOP_FIELDS,
    TRAINNER_TRAIN_FIELDS,
    TRAINNER_VAL_FIELDS,
    map_trainner,
    trainner_rule,
)
from anysr.options.video import (
    VIDEO_DATASET_FIELDS,
    VIDEO_TRAIN_FIELDS,
    VIDEO_VAL_FIELDS,
    network_weight_paths,
    video_dataset_rule,
)
from anysr.presets import expand_preset, find_preset
from anysr.registry import REQUIRED, argument_problems, constructor_args

# ---------------------------------------------------------------- helpers for rules

def _check_registered(kind: str, label: str, name: Any, path: str, ctx: Context, role: str | None = None) -> bool:
    names = known_names(kind, role)
    key = registry(kind).canonical(name) if isinstance(name, str) else None  # any case, or a declared other name
    if not isinstance(name, str) or key in names or (role is None and key is not None):
        return True  # (a name not registered loads the registry's optional packages: pytorch-optimizer, ...)
    ctx.add(path, registry(kind).unknown(name, names).replace(registry(kind).name, label, 1))
    return False


def resolve_path(value: str, root: Path) -> Path:
    """``~`` expanded; a relative path is taken relative to ``root``."""
    p = Path(value).expanduser()
    return p if p.is_absolute() else root / p


def _existing(out: dict[str, Any], key: str, path: str, ctx: Context, *, kind: str) -> None:
    """Resolve ``out[key]`` in place and check it exists (``kind``: 'file' or 'file or folder'); a list of paths
    (several dataset folders) item by item."""
    if not good(out, key):
        return
    if isinstance(out[key], list):
        items = {str(i): p for i, p in enumerate(out[key])}
        for i in items:
            _existing(items, i, f"{path}.{key}", ctx, kind=kind)
        out[key] = list(items.values())
        return
    given = out[key]
    full = resolve_path(given, ctx.root)
    out[key] = str(full)
    shown = f"'{given}'" if str(full) == given else f"'{given}' (resolved to {full})"
    sub = f"{path}.{key}"
    if not ctx.check_paths:
        return
    if not full.exists():
        own = ", or train on your own images: `anysr train -opt FILE --data DIR` (a folder of HR images)" \
            if ctx.is_train and sub.startswith("datasets.") and sub.endswith(".dataroot_gt") \
            and phase_of(sub.split(".")[1]) == "train" else ""
        ctx.add(sub, f"{shown} does not exist; {_how_to_create(full)}{own}")
    elif kind == "file" and not full.is_file():
        ctx.add(sub, f"{shown} is a folder, expected a file")


def _how_to_create(full: Path) -> str:
    """The fix for a missing path: the ``anysr prepare fetch`` command when a registered dataset provides it."""
    found = provider_of(full)
    if found is None:
        return "fix the path (relative paths start at path.root) or create it"
    name, root = found
    where = "" if root == Path.cwd() / "datasets" else f" --root {root}"
    return f"`anysr prepare fetch {name}{where}` downloads and prepares it, or fix the path (relative paths start at " \
           "path.root)"


def _dataset_key(name: str) -> str | None:
    if phase_of(name) is None:
        return (f"a dataset name must start with train, val or test (that is its phase), got '{name}'"
                f"{did_you_mean(name, PHASES)}")
    return None


def _valid_name(value: str) -> bool:
    return file_name_part_problem(value) is None


def _num_gpu(value: Any) -> str | None:
    if isinstance(value, str):
        return None if value == "auto" else "must be 'auto' or an int >= 0"
    return None if value >= 0 else "must be 'auto' or an int >= 0"


def _auto_or_bool(value: Any) -> str | None:
    return None if isinstance(value, bool) or value == "auto" else "must be 'auto', true or false"


SEED_LIMIT = 2**63  # manual_seed is a signed 64-bit integer where torch and the data stream take it
SAVE_FORMATS = ("safetensors", "pth", "plain.pth", "plain.safetensors")


def _save_formats(value: list[str]) -> str | None:
    bad = [v for v in value if v not in SAVE_FORMATS]
    return f"unknown format(s) {', '.join(map(repr, bad))}; choose from {', '.join(SAVE_FORMATS)}" if bad else None


def _suffix(value: str) -> str | None:
    return None if not value else file_name_part_problem(value)


def _filename_tmpl(value: str) -> str | None:
    try:  # other braces ('{name}', a lone '}') would stop str.format when the dataset pairs its files
        once = value.count("{}") == 1 and value.format("\0").count("\0") == 1
    except (IndexError, KeyError, ValueError):
        once = False
    return None if once else ("must contain '{}' exactly once (where the file stem goes) and no other braces, "
                              "e.g. '{}x4'")


# ---------------------------------------------------------------- rules (cross-field checks, computed values)

def _dataset_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    name = key or ""
    phase = phase_of(name) or "test"
    if good(out, "phase") and out["phase"] != phase:
        ctx.add(f"{path}.phase", f"is set by the loader from the dataset name ('{name}' -> '{phase}'); "
                f"remove it, got {show(out['phase'])}")
    out["phase"] = phase
    if ctx.scale is not None:
        if good(out, "scale") and out["scale"] != ctx.scale:
            ctx.add(f"{path}.scale", f"{out['scale']} differs from the top-level scale ({ctx.scale}); "
                    "remove it (the loader copies scale into every dataset)")
        out["scale"] = ctx.scale
    if not good(out, "name"):
        out["name"] = name
    if good(out, "type") and _check_registered("dataset", "dataset type", out["type"], f"{path}.type", ctx):
        out["type"] = registry("dataset").canonical(out["type"]) or out["type"]  # pairedimagedataset: any case
    backend = out.get("io_backend")
    io_kind = backend.get("type") if isinstance(backend, dict) else "disk"
    if isinstance(backend, dict):
        io_backend_rule(backend, path, ctx)
    if io_kind == "shards":
        shard_roots_rule(out, path, ctx, ctx.root)
        takes_lq = dataset_role(out.get("type")) == "paired" or bool(getattr(registered("dataset", out.get("type")),
                                                                             "video_kind", ""))
        if takes_lq and good(out, "dataroot_gt") and out.get("dataroot_lq") is None \
                and out.get("lq_from_gt") is not True:
            out["dataroot_lq"] = out["dataroot_gt"]  # each sample of the set holds its GT and its LQ
    else:
        for root_key in ("dataroot_gt", "dataroot_lq"):
            _existing(out, root_key, path, ctx, kind="file or folder")
    _existing(out, "meta_info_file", path, ctx, kind="file")
    if isinstance(out.get("meta_info_file"), list) and registered("dataset", out.get("type")) is not None \
            and not getattr(registered("dataset", out.get("type")), "meta_info_lists", False):
        ctx.add(f"{path}.meta_info_file", f"{out.get('type')} reads one meta_info file; give one path (a list is "
                "MMRealSRGANDataset's)")
    _existing(out, "component_path", path, ctx, kind="file")
    for root_key in ("dataroot_gt", "dataroot_lq") if io_kind != "shards" else ():
        roots = out.get(root_key) if isinstance(out.get(root_key), list) else [out.get(root_key)]
        for i, root in enumerate(roots):
            where = f"{path}.{root_key}" + (f".{i}" if isinstance(out.get(root_key), list) else "")
            if ctx.check_paths and isinstance(root, str) and Path(root).is_file():
                what = "the .lmdb folder (io_backend.type is lmdb)" if io_kind == "lmdb" else "the folder of images"
                ctx.add(where, f"'{root}' is a file; point it to {what}")
    _several_folders_rule(out, path, ctx)
    unset = ("std" if good(out, "mean") else "mean") if good(out, "mean") != good(out, "std") else None
    if unset is not None and out.get(unset) is not MISSING:  # an invalid value: its own problem says so
        ctx.add(f"{path}.{unset}", "set mean and std together (or neither)")
    kind = out.get("type")
    if dataset_role(kind) == "paired":
        if "dataroot_gt" in out and out["dataroot_gt"] is None:
            ctx.add(f"{path}.dataroot_gt", f"required by {kind} (the ground-truth images)")
        has_lq = out.get("dataroot_lq") is not None
        if has_lq and out.get("lq_from_gt") is True:
            ctx.add(f"{path}.dataroot_lq", "set together with lq_from_gt: true; keep one (lq_from_gt "
                    f"makes the LQ images from the GT images; --force_yml {path}.dataroot_lq=~ removes the key)")
        elif "dataroot_lq" in out and not has_lq and out.get("lq_from_gt") is False:
            ctx.add(f"{path}.dataroot_lq", f"{kind} needs dataroot_lq (a folder of LQ images) "
                    "or lq_from_gt: true (LQ made from GT by MATLAB bicubic)")
        if phase == "train" and "gt_size" in out and out["gt_size"] is None:
            ctx.add(f"{path}.gt_size", f"required for a train {kind} (the GT patch size, a "
                    "multiple of scale, e.g. 96 or 128)")
    elif is_synthesis_source(kind):
        realesrgan_dataset_rule(out, path, ctx, phase)
    elif is_degradation_source(kind):
        bsrgan_dataset_rule(out, path, ctx, phase)
    elif is_face_degradation_source(kind):
        ffhq_degradation_dataset_rule(out, path, ctx, phase)
    elif is_face_augment_source(kind):
        face_augment_dataset_rule(out, path, ctx, phase)
    elif dataset_role(kind) == "image_source":
        if "dataroot_gt" in out and out["dataroot_gt"] is None:
            ctx.add(f"{path}.dataroot_gt", f"required by {kind} (the images)")
    elif kind == "SingleImageDataset" and "dataroot_lq" in out and out["dataroot_lq"] is None:
        ctx.add(f"{path}.dataroot_lq", "required by SingleImageDataset (the folder of input images)")
    check_gt_size(out.get("gt_size"), f"{path}.gt_size", ctx)
    if phase == "train" and "batch_size_per_gpu" in out and out["batch_size_per_gpu"] is None:
        ctx.add(f"{path}.batch_size_per_gpu", "required for a train dataset (images per device per step)")
    if good(out, "std") and any(s <= 0 for s in out["std"]):
        ctx.add(f"{path}.std", f"every value must be > 0, got {out['std']}")
    video_dataset_rule(out, path, ctx, phase, registry("dataset"))


def _arguments(kind: str, label: str, out: dict[str, Any], path: str, ctx: Context, *, role: str | None = None,
               skip: tuple[str, ...] = (), not_arguments: tuple[str, ...] = (),
               fill_defaults: bool = False) -> dict[str, Any] | None:
    """The one check of a ``{type: Name, ...arguments}`` section against the registered class's signature
    (``registry.argument_problems``, as ``build_network`` does): the constructor's defaults, or None when the
    type is not registered. ``not_arguments``: keys of the section that are not constructor arguments."""
    if not good(out, "type") or not _check_registered(kind, label, out["type"], f"{path}.type", ctx, role):
        return None
    out["type"] = registry(kind).canonical(out["type"])  # l1loss -> L1Loss: what is built and logged
    cls = registry(kind).get(out["type"])
    given = {k: v for k, v in out.items() if k != "type" and k not in not_arguments}
    for problem in argument_problems(cls, given, path, out["type"], skip=skip):
        ctx.add("", problem)
    params, _ = constructor_args(cls, skip)
    for name, default in params.items():
        if name in given and isinstance(default, float) and isinstance(given[name], str):
            try:
                out[name] = float(given[name])  # PyYAML reads 1e-4 as a string
            except ValueError:
                ctx.add(f"{path}.{name}", f"expected float, got {show(given[name])}")
        elif fill_defaults and name not in out and default is not REQUIRED and default is not None:
            out[name] = list(default) if isinstance(default, tuple) else default
    return params


def _network_rule(out: dict[str, Any], path: str, ctx: Context, *, check_scale: bool) -> None:
    params = _arguments("arch", "arch", out, path, ctx)
    if params is None or not check_scale or ctx.scale is None:
        return
    arch = out["type"]
    reader = getattr(registry("arch").get(arch), "scale_from_arguments", None)
    if reader is not None:  # a network whose factor is not one argument (IPT: scale[scale_idx])
        try:
            value = reader({k: v for k, v in out.items() if k != "type"})
        except OptionError:
            return  # the build names the argument
        if value != ctx.scale:
            ctx.add(f"{path}.scale", f"{arch} with these arguments runs at x{value}, which differs from the top-level "
                    f"scale ({ctx.scale}); make them the same factor")
        return
    for name in ("upscale", "scale"):
        if name in out:
            value = out[name]
            if isinstance(value, bool) or not isinstance(value, int):
                ctx.add(f"{path}.{name}", f"expected int, got {show(value)}")
            elif value != ctx.scale:
                ctx.add(f"{path}.{name}", f"{value} differs from the top-level scale ({ctx.scale}); "
                        f"set {path}.{name} and scale to the same factor")
        elif name in params and params[name] is not REQUIRED and params[name] != ctx.scale:
            ctx.add(f"{path}.{name}", f"not set, so {arch} uses its default {params[name]!r}, which differs "
                    f"from scale ({ctx.scale}); set {path}.{name}: {ctx.scale}")


def expand_network_presets(opt: dict[str, Any], ctx: Context) -> list[str]:
    """Each ``network_*`` section naming a preset (``type: hat_s``) rewritten, in place, as its class and arguments
    (the top-level scale to the preset's scale argument unless given); one note per preset expanded."""
    notes = []
    classes = registry("arch").keys()
    for key, section in opt.items():
        if not (str(key).startswith("network_") and isinstance(section, dict)):
            continue
        preset = find_preset(section.get("type"), classes)
        if preset is None:
            continue
        try:
            opt[key] = expand_preset(section, key, ctx.scale if key == "network_g" else None)
        except OptionError as e:
            ctx.add("", str(e))
            continue
        args = ", ".join(f"{k}={v!r}" for k, v in opt[key].items() if k != "type")
        whose = "" if preset.source == "traiNNer-redux" else f" ({preset.source}' name)" \
            if preset.source.endswith("s") else f" ({preset.source}'s name)"
        notes.append(f"{key}.type {section['type']}{whose} -> {preset.arch}({args})")
    return notes


def _network_g_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    _network_rule(out, path, ctx, check_scale=True)
    network_weight_paths(out, path, ctx, _existing, registry("model"))


def _network_d_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    _network_rule(out, path, ctx, check_scale=False)
    _existing(out, "backbone_weights", path, ctx, kind="file")  # EA2FPN's encoder weights: from path.root, checked


def _unsupported(kind: str, out: dict[str, Any], path: str, ctx: Context) -> None:
    reason = getattr(registered(kind, out.get("type")), "unsupported", None)
    if reason:
        ctx.add(f"{path}.type", f"{out['type']} is not supported: {reason}")


def _optim_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    _arguments("optimizer", "optimizer", out, path, ctx, skip=("params",), not_arguments=("param_groups",))
    _unsupported("optimizer", out, path, ctx)
    cls = registered("optimizer", out.get("type"))
    betas = constructor_args(cls)[0].get("betas") if cls is not None else None
    if isinstance(betas, tuple) and isinstance(out.get("betas"), list) and len(out["betas"]) != len(betas):
        ctx.add(f"{path}.betas", f"{out['type']} takes {len(betas)} betas, got {len(out['betas'])}")
    for i, group in enumerate(out.get("param_groups") or []):
        where = f"{path}.param_groups[{i}]"
        if not isinstance(group, dict) or not group.get("params"):
            ctx.add(where, "each group needs params: the parameter names it takes (globs such as 'body.*'), plus "
                    "the optimizer arguments it overrides (e.g. lr: 1e-4)")
            continue
        if cls is not None:
            for problem in argument_problems(cls, {k: v for k, v in group.items() if k != "params"}, where,
                                             out["type"], skip=("params",)):
                if "required argument" not in problem:
                    ctx.add("", problem)
            for name, value in group.items():
                if name in ("lr", "weight_decay", "eps", "momentum") and isinstance(value, str):
                    try:
                        group[name] = float(value)  # PyYAML reads 1e-4 as a string
                    except ValueError:
                        ctx.add(f"{where}.{name}", f"expected float, got {show(value)}")
    if out.get("nesterov") is True and not (good(out, "momentum") and out["momentum"] > 0):
        ctx.add(f"{path}.nesterov", "needs momentum > 0; set momentum (e.g. 0.9) or nesterov: false")


def _scheduler_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    _arguments("scheduler", "scheduler", out, path, ctx, skip=("optimizer", "warmup_iter"), fill_defaults=True)
    _unsupported("scheduler", out, path, ctx)
    if out.get("type") == "CosineAnnealingRestartLR" and good(out, "periods"):
        if not good(out, "restart_weights"):
            out["restart_weights"] = [1.0] * len(out["periods"])
        elif len(out["restart_weights"]) != len(out["periods"]):
            ctx.add(f"{path}.restart_weights", f"has {len(out['restart_weights'])} values but periods has "
                    f"{len(out['periods'])}; give one weight per period")


def _loss_rule(role: str, not_arguments: tuple[str, ...] = ()) -> Rule:
    def rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
        _arguments("loss", f"{role} loss", out, path, ctx, role=role, skip=("vgg_state_dict",),
                   not_arguments=not_arguments, fill_defaults=True)
    return rule


def _loss_entry_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    """One ``train.losses`` entry: checked against its class (any role; the model's roles are checked on top).
    An entry with ``loss_weight: 0`` is not built: only its ``type`` must be a string (traiNNer-redux's templates
    list losses we lack with weight 0)."""
    if out.get("loss_weight") == 0:
        return
    _existing(out, "vgg_weights_path", path, ctx, kind="file")
    if not good(out, "type") or not _check_registered("loss", "loss", out["type"], f"{path}.type", ctx):
        return
    params, _ = constructor_args(registry("loss").get(out["type"]))
    if "pretrain_network_ae" in params:  # AESOPLoss: traiNNer-redux's name for its weights file
        _existing(out, "pretrain_network_ae", path, ctx, kind="file")
    if good(out, "weights") and "weight_state_dicts" in params:  # LPIPS / DISTS: files (MS-SSIM: its exponents)
        files = [out["weights"]] if isinstance(out["weights"], str) else list(out["weights"])
        items = {f"weights[{i}]": f for i, f in enumerate(files)}
        for slot, f in items.items():
            if isinstance(f, str):
                _existing(items, slot, path, ctx, kind="file")
            else:
                ctx.add(f"{path}.{slot}", f"expected a file path (str), got {show(f)}")
        out["weights"] = list(items.values())
    if "loss_weight" not in params and "perceptual_weight" in params and good(out, "loss_weight"):
        # traiNNer-redux's perceptualloss takes loss_weight: it scales the perceptual and the style term alike
        weight = float(out.pop("loss_weight"))
        out["perceptual_weight"] = float(out.get("perceptual_weight", params["perceptual_weight"])) * weight
        out["style_weight"] = float(out.get("style_weight", params["style_weight"])) * weight
    elif "loss_weight" not in out and "loss_weight" in params:
        out["loss_weight"] = params["loss_weight"]
    _arguments("loss", "loss", out, path, ctx, skip=("vgg_state_dict", "weight_state_dicts"),
               not_arguments=("name",), fill_defaults=True)


# BasicSR's keys (train.losses is the list form)
LOSS_OPTS = ("pixel_opt", "perceptual_opt", "gan_opt", "feature_matching_opt")


def loss_label(entry: dict[str, Any]) -> str:
    """The name a ``train.losses`` entry is logged under (after ``l_`` / ``l_g_``): its ``name``, else its type
    lower-cased without 'loss' as traiNNer-redux labels it (``CharbonnierLoss`` -> ``charbonnier``)."""
    return str(entry.get("name") or str(entry["type"]).lower().replace("loss", ""))


def _losses_rule(out: dict[str, Any], path: str, ctx: Context) -> None:
    losses = out.get("losses")
    if not isinstance(losses, list):
        return
    both = [name for name in LOSS_OPTS if out.get(name) is not None]
    if both:
        ctx.add(f"{path}.losses", f"set together with {', '.join(f'{path}.{k}' for k in both)}; the list and "
                "BasicSR's *_opt keys build the same losses: move them into train.losses or remove the list")
    seen: dict[str, int] = {}
    for i, entry in enumerate(losses):
        if not isinstance(entry, dict) or entry.get("loss_weight") == 0 or not isinstance(entry.get("type"), str):
            continue
        label = loss_label(entry)
        if label in seen:
            ctx.add(f"{path}.losses[{i}]", f"logged as '{label}' like {path}.losses[{seen[label]}]; give one of "
                    "them a distinct name (e.g. name: " + f"{label}_2)")
        seen[label] = i
        cls = registered("loss", entry["type"])
        if getattr(cls, "role", None) == "artifact" and not (good(out, "ema_decay") and out["ema_decay"] > 0):
            ctx.add(f"{path}.losses[{i}]", f"{entry['type']} compares with the EMA generator's output; set "
                    "train.ema_decay (e.g. 0.999)")


def check_loss_roles(top: dict[str, Any], ctx: Context) -> None:
    """Each built ``train.losses`` entry's role is one the model trains with (``loss_roles`` of model_type)."""
    train, model = top.get("train"), registered("model", top.get("model_type", "SRModel"))
    if not isinstance(train, dict) or not isinstance(train.get("losses"), list) or model is None:
        return
    roles = getattr(model, "loss_roles", None)
    if roles is None:
        return
    for i, entry in enumerate(train["losses"]):
        if not isinstance(entry, dict) or entry.get("loss_weight") == 0:
            continue
        role = getattr(registered("loss", entry.get("type")), "role", None)
        if role is not None and role not in roles:
            fits = [n for n, m in ((n, registered("model", n)) for n in known_names("model"))
                    if role in getattr(m, "loss_roles", ())]
            needs_d = role == "gan" and not top.get("network_d")
            ctx.add(f"train.losses[{i}].type", f"{entry['type']} (role {role}) is not trained by model_type "
                    f"{model.__name__} (it takes roles {', '.join(roles)}); use a model_type that does "
                    f"({', '.join(fits[:4]) or 'none'})"
                    + (" and add network_d, the discriminator it trains against (e.g. network_d: {type: "
                       "UNetDiscriminatorSN, num_in_ch: 3}),") * needs_d + " or remove the entry")


def _train_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    augment_rule(out, path, ctx)
    if out.get("ema_warmup") is False and out.get("ema_power") is not None:
        ctx.add(f"{path}.ema_warmup", "false (no warm-up) cannot go with ema_power (a warm-up schedule); remove one")
    trainner_rule(out, ctx)
    _losses_rule(out, path, ctx)
    if all(out.get(name) is None for name in LOSS_OPTS) and not any(
            isinstance(e, dict) and e.get("loss_weight") != 0 for e in out.get("losses") or []):
        ctx.add(path, "no loss is set; add one of train.pixel_opt (e.g. {type: L1Loss}), "
                "train.perceptual_opt, train.gan_opt, or a train.losses list (e.g. [{type: L1Loss}])")
    sched = out.get("scheduler")
    if isinstance(sched, dict) and good(out, "total_iter"):
        # A schedule's length-of-training argument is train.total_iter unless given: filled here, and the
        # section's "required argument is missing" for it withdrawn (the section is checked before this rule).
        cls = registered("scheduler", sched.get("type"))
        params = constructor_args(cls, ("optimizer", "warmup_iter"))[0] if cls is not None else {}
        for arg in ("total_iter", "total_steps", "T_max"):
            if arg in params and sched.get(arg) is None:
                sched[arg] = out["total_iter"]
                missing = f"{path}.scheduler.{arg}: required argument"
                ctx.problems[:] = [p for p in ctx.problems if not p.startswith(missing)]
    if isinstance(sched, dict) and sched.get("type") == "CosineAnnealingRestartLR" and good(sched, "periods") \
            and good(out, "total_iter") and out["total_iter"] > sum(sched["periods"]):
        end = sum(sched["periods"])
        ctx.add(f"{path}.scheduler.periods", f"the cosine periods end at iteration {end} but train.total_iter is "
                f"{out['total_iter']}: past the last period the learning rate would climb back up. Extend the "
                f"periods to cover total_iter (e.g. add a period of {out['total_iter'] - end} with its "
                "restart_weights entry) or lower train.total_iter")


# Keys of a metric section that only some metrics read: key -> short metric names (MetricInfo.name).
_METRIC_ONLY = {"convert_to": ("niqe",), "net": ("lpips",), "stats": ("fid",),
                "weights": ("lpips", "dists", "fid", "raw_dists", "topiq")}
_METRIC_DEFAULTS = {"niqe": {"convert_to": "y"}, "lpips": {"net": "alex"}}


def _metric_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    if "crop_border" not in out and ctx.scale is not None:
        out["crop_border"] = ctx.scale
    if good(out, "weights"):
        files = [out["weights"]] if isinstance(out["weights"], str) else list(out["weights"])
        resolved = []
        for i, given in enumerate(files):
            slot = "weights" if isinstance(out["weights"], str) else f"weights[{i}]"
            item = {slot: given}
            _existing(item, slot, path, ctx, kind="file")
            resolved.append(item[slot])
        out["weights"] = resolved
    _existing(out, "stats", path, ctx, kind="file")
    if not good(out, "type") or not _check_registered("metric", "metric", out["type"], f"{path}.type", ctx):
        return
    info = getattr(registered("metric", out["type"]), "metric_info", None)  # a MetricInfo
    if info is None:
        return
    for name, users in _METRIC_ONLY.items():
        if good(out, name) and info.name not in users:
            ctx.add(f"{path}.{name}", f"is not read by {out['type']} (only by {', '.join(users)}); remove it")
    for name, value in _METRIC_DEFAULTS.get(info.name, {}).items():
        if not good(out, name):
            out[name] = value
    if good(out, "better") and out["better"] != info.better:
        ctx.add(f"{path}.better", f"{out['type']} is {info.better}-is-better, got {out['better']!r}; remove "
                f"better (it follows the metric) or set {info.better}")
    out["better"] = info.better
    if info.user_weights and not good(out, "weights"):
        ctx.add(f"{path}.weights", f"{out['type']} needs its weight file ({info.user_weights[0].file_name}); name it")
    if out.get("test_y_channel") is True and info.name in ("lpips", "dists", "fid", "raw_dists", "topiq"):
        ctx.add(f"{path}.test_y_channel", f"{out['type']} compares RGB images; remove test_y_channel")


def _val_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    if ctx.is_train and "val_freq" in out and out["val_freq"] is None:
        ctx.add(f"{path}.val_freq", "required when training with a val section (validate every N "
                "iterations, e.g. 5000); or remove the val section")


FACE_PARTS = ("left_eye", "right_eye", "mouth")
FACE_WEIGHT_PATHS = (*(f"pretrain_network_d_{p}" for p in FACE_PARTS), "pretrain_network_identity")
FACE_NETWORKS = (*(f"network_d_{p}" for p in FACE_PARTS), "network_identity")  # GFPGANModel's other networks


def _path_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    out["root"] = str(ctx.root)
    for name in ("pretrain_network_g", "pretrain_network_d", *FACE_WEIGHT_PATHS, "resume_state"):
        _existing(out, name, path, ctx, kind="file")


def _fill_run_paths(paths: dict[str, Any], name: str, ctx: Context) -> None:
    """Resolve the output folders: experiments/<name>/... when training, results/<name> when testing."""
    root = ctx.root
    for k in ("experiments_root", "models", "training_states", "log", "visualization", "results_root"):
        if good(paths, k):
            paths[k] = str(resolve_path(paths[k], root))
    if ctx.is_train:
        base = Path(paths.get("experiments_root") or root / "experiments" / name)
        paths["experiments_root"] = str(base)
        for k in ("models", "training_states", "log", "visualization"):
            if not good(paths, k):
                paths[k] = str(base / k)
    else:
        base = Path(paths.get("results_root") or root / "results" / name)
        paths["results_root"] = str(base)
        if not good(paths, "log"):
            paths["log"] = str(base)
        if not good(paths, "visualization"):
            paths["visualization"] = str(base / "visualization")
    unused = ("results_root",) if ctx.is_train else ("experiments_root", "models", "training_states")
    for k in unused:
        paths.setdefault(k, None)
    ordered = {k: paths[k] for k in PATH.fields if k in paths}
    ordered.update((k, v) for k, v in paths.items() if k not in ordered)
    paths.clear()
    paths.update(ordered)


def _plateau_rule(out: dict[str, Any], ctx: Context) -> None:
    """ReduceLROnPlateau follows a validation metric: training with it needs validation with that metric."""
    train = out.get("train")
    sched = train.get("scheduler") if isinstance(train, dict) else None
    if not ctx.is_train or not isinstance(sched, dict) or str(sched.get("type", "")).lower() != "reducelronplateau":
        return
    val = out.get("val")
    metrics = val.get("metrics") if isinstance(val, dict) else None
    if not isinstance(val, dict) or not val.get("val_freq") or not metrics:
        ctx.add("train.scheduler.type", "ReduceLROnPlateau lowers the lr when a validation metric stops improving: "
                "it needs val.val_freq, val.metrics and a val dataset; add them, or use a schedule of the iteration")
    elif isinstance(sched.get("metric"), str) and sched["metric"] not in metrics:
        ctx.add("train.scheduler.metric", f"'{sched['metric']}' is not one of val.metrics ({', '.join(metrics)})")


def _face_rule(out: dict[str, Any], ctx: Context) -> None:
    """GFPGANModel's extra networks only with a model that trains them; its datasets' mean / std 0.5 (the
    authors' [-1, 1], which the model applies itself to the [0, 1] images) taken out, other values refused."""
    model = registered("model", out.get("model_type"))
    takes = getattr(model, "extra_networks", ())
    for key in FACE_NETWORKS:
        if out.get(key) is not None and key not in takes:
            ctx.add(key, f"is trained by model_type GFPGANModel or RestoreFormerModel only (model_type is "
                    f"{out.get('model_type')}); remove it or use one of them")
    datasets = out.get("datasets")
    if not getattr(model, "signed_images", False) or not isinstance(datasets, dict):
        return
    for name, ds in datasets.items():
        if not isinstance(ds, dict) or not good(ds, "mean") or not good(ds, "std"):
            continue
        if list(ds["mean"]) == [0.5] * 3 and list(ds["std"]) == [0.5] * 3:
            ds["mean"] = ds["std"] = None
        else:
            ctx.add(f"datasets.{name}.mean", f"{model.__name__} maps images to [-1, 1] itself (mean / std 0.5, "
                    f"the authors' files); got mean {list(ds['mean'])}, std {list(ds['std'])}: remove both or set "
                    "them to 0.5")


def _training_step_rule(out: dict[str, Any], ctx: Context) -> None:
    """train.wavelet_guided / clamp / match_lq_colors / eco_enabled / grad_clip_norm_d: only with a model that
    honours them (and ECO's iterations in order)."""
    train, model = out.get("train"), registered("model", out.get("model_type", "SRModel"))
    if not ctx.is_train or not isinstance(train, dict) or model is None:
        return
    plain = getattr(model, "image_batches", False) and not getattr(model, "signed_images", False)
    if train.get("wavelet_guided") and not (plain and getattr(model, "wavelet_discriminator", False)):
        ctx.add("train.wavelet_guided", f"model_type {model.__name__} has no discriminator that judges images; use "
                "SRGANModel, ESRGANModel or RealESRGANModel (with network_d), or set it to false")
    for key in ("clamp", "match_lq_colors", "eco_enabled"):
        if train.get(key) and not plain:
            ctx.add(f"train.{key}", f"model_type {model.__name__} does not train on [0, 1] image batches; set it "
                    "to false")
    if train.get("eco_enabled") and good(train, "eco_init") and good(train, "eco_iters") \
            and train["eco_init"] > train["eco_iters"]:
        ctx.add("train.eco_init", f"{train['eco_init']} is after train.eco_iters ({train['eco_iters']}): ECO would "
                "never run; lower it or raise train.eco_iters")
    if train.get("sam") and not vars(model).get("fsam_steps", False):  # its own class says so, not a parent's
        ctx.add("train.sam", f"model_type {model.__name__} does not run sharpness-aware steps; use SRModel, "
                "SRGANModel, ESRGANModel, RealESRNetModel or RealESRGANModel, or remove it")
    if train.get("sam") and good(train, "accumulate") and train["accumulate"] > 1:
        ctx.add("train.sam", f"FSAM does not work with gradient accumulation (train.accumulate is "
                f"{train['accumulate']}); set train.accumulate to 1 or remove train.sam")
    if train.get("grad_clip_norm_d") is not None and not getattr(model, "clips_discriminator", False):
        ctx.add("train.grad_clip_norm_d", f"model_type {model.__name__} does not clip its discriminator's gradient; "
                "use a GAN model such as SRGANModel, or remove it")


def _top_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    out["is_train"] = ctx.is_train
    if good(out, "model_type"):
        _check_registered("model", "model_type", out["model_type"], "model_type", ctx)
    datasets = out.get("datasets")
    if isinstance(datasets, dict):
        train_sets = [k for k in datasets if phase_of(k) == "train"]
        if ctx.is_train and not train_sets:
            ctx.add("datasets", "no train dataset; add datasets.train (type, dataroot_gt, ..., "
                    "batch_size_per_gpu) to train")
        if len(train_sets) > 1:
            ctx.add("datasets", f"{len(train_sets)} train datasets ({', '.join(train_sets)}); "
                    "training reads exactly one, keep one")
        model = registered("model", out.get("model_type"))
        for k in train_sets:
            kind = datasets[k].get("type") if isinstance(datasets[k], dict) else None
            if dataset_role(kind) == "image_source" and model is not None and not getattr(model, "generative", False) \
                    and not getattr(model, "takes_image_source", False):
                ctx.add(f"datasets.{k}.type", f"{kind} gives images alone (no LQ) for generative models "
                        f"(StyleGAN2Model); model_type {model.__name__} trains on pairs: use PairedImageDataset")
    if not ctx.is_train and out.get("val") is None and "val" in out:
        out["val"] = validate_section(VAL, {}, "val", ctx)  # a test without a val section: the defaults
    tile, val = out.get("tile"), out.get("val")
    if isinstance(tile, dict) and good(tile, "tile_size") and isinstance(val, dict):
        if good(val, "tile") and val["tile"] != tile["tile_size"]:
            ctx.add("tile.tile_size", f"{tile['tile_size']} differs from val.tile ({val['tile']}); keep one")
        else:
            val["tile"], val["tile_pad"] = tile["tile_size"], tile["tile_pad"]
    if ctx.is_train and out.get("train") is None and "train" in out:
        ctx.add("train", "required when training (at least total_iter, optim_g and a loss such as pixel_opt)")
    _plateau_rule(out, ctx)
    realesrgan_rule(out, ctx)
    mmrealsr_rule(out, ctx)
    restoreformer_rule(out, ctx)
    _face_rule(out, ctx)
    check_loss_roles(out, ctx)
    _training_step_rule(out, ctx)
    paths = out.get("path")
    if isinstance(paths, dict) and good(out, "name"):
        _fill_run_paths(paths, out["name"], ctx)


# ---------------------------------------------------------------- the schema

_NUM_FREQ = "int >= 1 (a float like 5e3 is accepted)"

IO_BACKEND = Section({
    "type": Field(str, default="disk", choices=backend_types,
                  doc="Where images are read from: disk (a folder), lmdb (an .lmdb folder), shards (a shard set "
                      "from anysr prepare shards: local, file://, s3://, gs://, http(s)://)."),
    **SHARD_IO_FIELDS,
})

def _several_folders_rule(out: dict[str, Any], path: str, ctx: Context) -> None:
    """``dataroot_gt`` / ``dataroot_lq`` as lists (traiNNer-redux's several folders): read as one dataset, folder
    by folder (``anysr.data.union``); they must pair up, and a meta_info file lists the names of one folder."""
    gt, lq = out.get("dataroot_gt"), out.get("dataroot_lq")
    if not isinstance(gt, list) and not isinstance(lq, list):
        return
    n_gt = len(gt) if isinstance(gt, list) else (0 if gt is None else 1)
    n_lq = len(lq) if isinstance(lq, list) else (0 if lq is None else 1)
    if n_lq and n_gt and n_lq != n_gt:  # LQ folders alone (SingleImageDataset) pair with nothing
        ctx.add(f"{path}.dataroot_lq", f"lists {n_lq} folder(s) for the {n_gt} of dataroot_gt; give one LQ folder "
                "per GT folder, in the same order")
    if good(out, "meta_info_file") and max(n_gt, n_lq) > 1:
        ctx.add(f"{path}.meta_info_file", "lists the images of one folder; with several dataroot folders remove it "
                "(each folder is listed) or use one folder")


DATASET = Section(
    {
        "name": Field(str, default_doc="the dataset's key", doc="Display name (logs, result folders)."),
        "type": Field(str, required=True, doc="Dataset class in DATASET_REGISTRY, e.g. PairedImageDataset."),
        "dataroot_gt": Field((str, ListOf(str, min_len=1), None), default=None,
                             doc="Ground-truth images: a folder (or .lmdb folder, or a shard set's folder / index URL "
                                 "with io_backend.type shards); must exist. A list of folders "
                                 "(traiNNer-redux's) is read as one dataset, folder after folder."),
        "dataroot_lq": Field((str, ListOf(str, min_len=1), None), default=None,
                             doc="Low-quality input images; must exist (a list: one per dataroot_gt folder, in "
                                 "the same order). PairedImageDataset needs exactly one of dataroot_lq and "
                                 "lq_from_gt."),
        "meta_info_file": Field((str, ListOf(str, min_len=1), None), default=None,
                                doc="Text file listing the images; must exist (a list of files: "
                                    "MMRealSRGANDataset's, read one after the other)."),
        "filename_tmpl": Field(str, default="{}", check=_filename_tmpl, expect="str containing '{}'",
                               doc="LQ file stem from the GT stem, e.g. '{}x4'."),
        "io_backend": Field(IO_BACKEND, default={}, doc="I/O backend."),
        "gt_size": Field((int, None), default=None, check=at_least(1),
                         doc="GT patch size for training crops; a multiple of scale. Required for a train "
                             "PairedImageDataset."),
        "use_hflip": Field(bool, default=False, doc="Random horizontal flip (BasicSR alias: use_flip)."),
        "use_rot": Field(bool, default=False, doc="Random vertical flip and transpose."),
        "use_shuffle": Field(bool, default=True, doc="Shuffle the training samples."),
        "num_worker_per_gpu": Field(int, default=0, check=at_least(0),
                                    doc="DataLoader workers per device (BasicSR's default is 3; ours is 0)."),
        "batch_size_per_gpu": Field((int, None), default=None, check=at_least(1),
                                    doc="Images per device per step. Required for a train dataset."),
        "dataset_enlarge_ratio": Field(int, default=1, check=at_least(1),
                                       doc="Repeat the dataset this many times per epoch."),
        "prefetch_mode": Field((str, None), default=None, choices=(None, "cpu", "cuda"),
                               doc="Accepted for BasicSR files; the loader decides prefetching."),
        "prefetch_factor": Field((int, None), default=None, check=at_least(1),
                                 doc="DataLoader prefetch_factor (batches per worker; needs workers)."),
        "pin_memory": Field(bool, default=False, doc="DataLoader pin_memory."),
        "persistent_workers": Field(bool, default=False, doc="DataLoader persistent_workers."),
        "mean": Field((ListOf(float, length=3), None), default=None, doc="Per-channel mean to subtract."),
        "std": Field((ListOf(float, length=3), None), default=None,
                     doc="Per-channel std to divide by (> 0)."),
        "color": Field((str, None), default=None, choices=("y", None),
                       doc="'y': train/test on the Y channel."),
        "lq_from_gt": Field(bool, default=False,
                            doc="Make LQ from GT with MATLAB bicubic (then dataroot_lq is not needed)."),
        **REALESRGAN_DATASET_FIELDS,
        **BSRGAN_DATASET_FIELDS,
        **FFHQ_DEGRADATION_DATASET_FIELDS,
        "task": Field((str, None), keep=False, doc="Accepted (the DAT authors' option files: SR) and ignored."),
        "phase": Field(str, choices=PHASES, default_doc="from the key prefix (train, val, test)",
                       doc="Set by the loader from the dataset key."),
        "scale": Field(int, default_doc="the top-level scale",
                       doc="Set by the loader from the top-level scale."),
        **VIDEO_DATASET_FIELDS,
        **TRAINNER_DATASET_FIELDS,
    },
    aliases={"use_flip": "use_hflip", "meta_info": "meta_info_file", "H_size": "degrade_size"},
    rule=_dataset_rule,
    doc="One entry per dataset; its key starts with train, val or test (its phase).",
)

NETWORK_G = Section(
    {"type": Field(str, required=True, doc="Arch class in ARCH_REGISTRY (e.g. EDSR, MSRResNet, SwinIR).")},
    extra=True,
    rule=_network_g_rule,
    doc="The generator: `type` plus the arch's constructor arguments (checked against its signature). "
        "An `upscale`/`scale` argument must equal the top-level scale.",
)

NETWORK_D = Section(
    {"type": Field(str, required=True, doc="Discriminator arch class in ARCH_REGISTRY.")},
    extra=True,
    rule=_network_d_rule,
    doc="The discriminator (GAN models): `type` plus constructor arguments.",
)

PATH = Section(
    {
        "pretrain_network_g": Field((str, None), default=None,
                                    doc="Weights to start from; an existing file."),
        "param_key_g": Field((str, None), default="params",
                             doc="Weights group: 'params', 'params_ema' (falls back to 'params'), or 'auto' "
                                 "('params_ema', then 'params', then a bare state dict)."),
        "strict_load_g": Field((bool, None), default=True,
                               doc="Require every weight to match (null, as BasicSR reads it: false)."),
        "pretrain_network_d": Field((str, None), default=None,
                                    doc="Discriminator weights; an existing file."),
        "param_key_d": Field((str, None), default="params", doc="Key in the discriminator weights file."),
        "strict_load_d": Field(bool, default=True, doc="Require every discriminator weight to match."),
        **{f"pretrain_network_d_{part}": Field((str, None), default=None,
                                               doc=f"GFPGANModel: {part.replace('_', ' ')} discriminator weights; "
                                                   "an existing file.")
           for part in FACE_PARTS},
        "pretrain_network_identity": Field((str, None), default=None,
                                           doc="GFPGANModel: the identity network's weights (ArcFace, GFPGAN's "
                                               "arcface_resnet18.pth); an existing file."),
        "resume_state": Field((str, None), default=None,
                              doc="Training state to resume from; an existing file."),
        "root": Field((str, None), default_doc="the root argument, else the current directory",
                      doc="Base of relative paths and of the output folders."),
        "experiments_root": Field((str, None), default_doc="<root>/experiments/<name> (train)",
                                  doc="Training output folder."),
        "models": Field((str, None), default_doc="<experiments_root>/models (train)", doc="Saved weights."),
        "training_states": Field((str, None), default_doc="<experiments_root>/training_states (train)",
                                 doc="Saved training states (resume)."),
        "log": Field((str, None), default_doc="<experiments_root>/log (train), <results_root> (test)",
                     doc="Log files and tensorboard."),
        "visualization": Field((str, None),
                               default_doc="<experiments_root>/visualization (train), "
                                           "<results_root>/visualization (test)",
                               doc="Saved validation / test images."),
        "results_root": Field((str, None), default_doc="<root>/results/<name> (test)",
                              doc="Test output folder."),
        "ignore_resume_networks": Field((ListOf(str), None), default=None,
                                        doc="Accepted (BasicSR): networks not restored on resume."),
    },
    # Older BasicSR option files (1.3 and before) use these names.
    aliases={"pretrain_model_g": "pretrain_network_g", "strict_load": "strict_load_g"},
    rule=_path_rule,
)

OPTIM = Section(
    {
        "type": Field(str, required=True, expect="a registered optimizer (Adam, AdamW, SGD, ...)",
                      doc="Optimizer (OPTIMIZER_REGISTRY): every torch.optim class by name (but LBFGS, SparseAdam); "
                          "with `pip install anysr[optim]` also pytorch-optimizer's (Adan, ADOPT, Lion, Prodigy, "
                          "SOAP, StableAdamW, ...) and schedulefree's (AdamWScheduleFree, SGDScheduleFree: "
                          "validation, saved weights, EMA and export use their averaged weights)."),
        "param_groups": Field(ListOf(dict, min_len=1), default_doc="one group: every parameter",
                              doc="Per-part settings: a list of `{params: [glob, ...], lr: ..., <argument>: ...}`; "
                                  "a parameter joins the first group one of whose globs matches its name (e.g. "
                                  "'body.*', 'conv_last.*'), the others keep this section's arguments. "
                                  "Schedules scale each group's lr alike."),
        "lr": Field(float, required=True, check=at_least(0), doc="Learning rate (0 freezes the network)."),
        "weight_decay": Field(float, check=at_least(0), default_doc="torch's default",
                              doc="Weight decay (all types)."),
        "betas": Field(ListOf(float, min_len=2), default_doc="torch's default",
                       doc="Betas: as many as the type takes (Adam/AdamW two, Adan three)."),
        "eps": Field(float, check=greater_than(0), default_doc="torch's default", doc="Adam/AdamW eps."),
        "momentum": Field(float, check=at_least(0), default_doc="torch's default", doc="SGD momentum."),
        "nesterov": Field(bool, default_doc="torch's default",
                          doc="SGD Nesterov momentum (needs momentum > 0)."),
    },
    extra=True,
    rule=_optim_rule,
    doc="The optimizer's constructor arguments (checked against its signature); unset keys keep torch's defaults.",
)

SCHEDULER = Section(
    {
        "type": Field(str, required=True, expect="a registered schedule (MultiStepLR, CosineAnnealingRestartLR, ...)",
                      doc="Learning-rate schedule (SCHEDULER_REGISTRY): BasicSR's MultiStepLR (= "
                          "MultiStepRestartLR) and CosineAnnealingRestartLR, CosineWarmupLR, WarmupStableDecayLR, "
                          "and every torch.optim.lr_scheduler class by name (OneCycleLR, CosineAnnealingLR, ...; "
                          "stepped once per iteration; not those that need Python functions), and "
                          "ReduceLROnPlateau on a validation metric (checked at each validation). "
                          "Arguments named total_iter / total_steps / T_max default to train.total_iter. "
                          "On resume, changed arguments apply only if the lr at the resumed iteration stays the "
                          "same; otherwise the run is refused, naming the keys."),
        "milestones": Field(ListOf(int, min_len=1), default_doc="required by MultiStepLR",
                            doc="MultiStepLR: iterations where lr is multiplied by gamma."),
        "gamma": Field(float, check=greater_than(0), default_doc="0.1 (MultiStepLR)",
                       doc="MultiStepLR factor."),
        "periods": Field(ListOf(int, min_len=1), default_doc="required by CosineAnnealingRestartLR",
                         doc="CosineAnnealingRestartLR: length of each cosine cycle."),
        "restart_weights": Field(ListOf(float), default_doc="1.0 per period",
                                 doc="CosineAnnealingRestartLR: lr weight at each restart."),
        "eta_min": Field(float, check=at_least(0), default_doc="0.0 (CosineAnnealingRestartLR)",
                         doc="CosineAnnealingRestartLR: minimum lr."),
    },
    extra=True,
    rule=_scheduler_rule,
    doc="The schedule's arguments (checked against its signature; unset ones get its defaults).",
)

PIXEL_LOSS = Section(
    {
        "type": Field(str, required=True, expect="a registered pixel loss (L1Loss, MSELoss, CharbonnierLoss)",
                      doc="Pixel loss (LOSS_REGISTRY, role pixel)."),
        "loss_weight": Field(float, default=1.0, check=at_least(0), doc="Weight of this loss."),
        "reduction": Field(str, default="mean", choices=("mean", "sum"), doc="Reduction over pixels."),
        "eps": Field(float, check=greater_than(0), default_doc="1e-12 (CharbonnierLoss only)",
                     doc="CharbonnierLoss epsilon."),
    },
    extra=True,
    rule=_loss_rule("pixel"),
)


def _perceptual_rule(out: dict[str, Any], path: str, ctx: Context, key: str | None) -> None:
    _existing(out, "vgg_weights_path", path, ctx, kind="file")
    _loss_rule("perceptual", not_arguments=("vgg_weights_path",))(out, path, ctx, key)


PERCEPTUAL_LOSS = Section(
    {
        "type": Field(str, required=True, doc="Loss class in LOSS_REGISTRY (PerceptualLoss)."),
        "vgg_weights_path": Field((str, None), default=None,
                                  doc="torchvision's vgg19 (vgg19_bn) state dict (.pth or .safetensors), an existing "
                                      "file; null: torchvision's file found by name (torch hub's cache, else "
                                      "downloaded once and checked by sha256; docs/losses.md)."),
    },
    extra=True,
    rule=_perceptual_rule,
    doc="Perceptual loss: `type`, `vgg_weights_path` and the loss's own arguments (layer_weights, ...).",
)

GAN_LOSS = Section(
    {"type": Field(str, required=True, doc="Loss class in LOSS_REGISTRY (GANLoss).")},
    extra=True,
    rule=_loss_rule("gan"),
    doc="GAN loss: `type` and the loss's arguments (gan_type, real_label_val, fake_label_val, loss_weight).",
)

FEATURE_MATCHING_LOSS = Section(
    {"type": Field(str, required=True, doc="Loss class in LOSS_REGISTRY (GANFeatLoss).")},
    extra=True,
    rule=_loss_rule("feature_matching"),
    doc="Feature-matching loss: `type` and the loss's arguments (criterion, loss_weight, reduction).",
)

STYLEGAN2_TRAIN_FIELDS = {
    "r1_reg_weight": Field(float, default=10.0, check=at_least(0),
                           doc="StyleGAN2Model: weight of the discriminator's R1 penalty (gamma)."),
    "path_reg_weight": Field(float, default=2.0, check=at_least(0),
                             doc="StyleGAN2Model: weight of the generator's path length penalty."),
    "path_batch_shrink": Field(int, default=2, check=at_least(1),
                               doc="StyleGAN2Model: the path length penalty runs on batch // this images."),
    "net_g_reg_every": Field(int, default=4, check=at_least(1),
                             doc="StyleGAN2Model: iterations between path length penalties (lazy regularisation)."),
    "net_d_reg_every": Field(int, default=16, check=at_least(1),
                             doc="StyleGAN2Model: iterations between R1 penalties (lazy regularisation)."),
    "mixing_prob": Field(float, default=0.9, check=between(0, 1),
                         doc="StyleGAN2Model: chance of style mixing (two codes) per generated batch."),
}

GFPGAN_TRAIN_FIELDS = {
    "L1_opt": Field((PIXEL_LOSS, None), default=None,
                    doc="GFPGANModel: the L1 loss of the pyramid, component style and identity terms (default "
                        "{type: L1Loss, loss_weight: 1})."),
    "pyramid_loss_weight": Field(float, default=0.0, check=at_least(0),
                                 doc="GFPGANModel: weight of the U-Net's RGB image pyramid loss (0: off)."),
    "remove_pyramid_loss": Field((int, None), default=None, check=at_least(0),
                                 expect="int >= 0 (a float like 5e4 is accepted) or null",
                                 doc="GFPGANModel: after this iteration the pyramid loss weighs 1e-12 (null: never)."),
    "gan_component_opt": Field((GAN_LOSS, None), default=None,
                               doc="GFPGANModel: GAN loss of the facial component discriminators."),
    "comp_style_weight": Field(float, default=0.0, check=at_least(0),
                               doc="GFPGANModel, RestoreFormerModel: weight of the facial components' Gram-matrix "
                                   "style loss."),
    "identity_weight": Field(float, default=0.0, check=at_least(0),
                             doc="GFPGANModel, RestoreFormerModel: weight of the identity loss (needs "
                                 "network_identity)."),
    "optim_component": Field((OPTIM, None), default=None,
                             doc="GFPGANModel: optimizer of each facial component discriminator (betas (0.9, 0.99) "
                                 "unless given)."),
}

RANKING_LOSS = Section(
    {"type": Field(str, required=True, expect="a registered ranking loss (MarginRankingLoss)",
                   doc="Loss class in LOSS_REGISTRY, role ranking (MarginRankingLoss).")},
    extra=True,
    rule=_loss_rule("ranking"),
    doc="A ranking loss on estimated degrees: `type` and its arguments (loss_weight, margin, reduction).",
)

MMREALSR_TRAIN_FIELDS = {
    "rank_opt": Field((RANKING_LOSS, None), default=None,
                      doc="MMRealSRNetModel / MMRealSRGANModel: the noise ranking loss (the noisier LQ version's "
                          "estimated noise degree above the other's by the margin)."),
    "rank_opt_b": Field((RANKING_LOSS, None), default=None, default_doc="train.rank_opt's settings",
                        doc="MMRealSRNetModel / MMRealSRGANModel: the blur ranking loss."),
    "rank_opt_anchor": Field((Section({"loss_weight": Field(float, required=True, check=at_least(0),
                                                            doc="Weight of the anchor loss.")}), None),
                             default=None,
                             doc="MMRealSRNetModel / MMRealSRGANModel: the anchor loss, the squared distance of "
                                 "the clean anchor's estimated degrees from 0 and the most degraded one's from 1 "
                                 "(needed with rank_opt)."),
    "constraint_opt": Field((PIXEL_LOSS, None), default=None,
                            doc="MMRealSRNetModel / MMRealSRGANModel: the authors' optional constraint loss (e.g. "
                                "MSELoss) between the degrees of LQ versions that differ in the other degradation "
                                "only."),
}

LOSS_ENTRY = Section(
    {
        "type": Field(str, required=True, expect="a registered loss (any case: l1loss is L1Loss)",
                      doc="Loss class (LOSS_REGISTRY; names match ignoring case, as traiNNer-redux's)."),
        "loss_weight": Field(float, check=at_least(0), default_doc="the loss's default (1.0)",
                             doc="Weight; 0: the entry is not built (and needs no weight files). PerceptualLoss: "
                                 "scales perceptual_weight and style_weight."),
        "name": Field(str, default_doc="the type lower-cased without 'loss' (CharbonnierLoss: charbonnier)",
                      doc="Logged as l_<name> (SRModel) or l_g_<name> (GAN models)."),
        "vgg_weights_path": Field((str, None), doc="PerceptualLoss / ContextualLoss: torchvision's vgg19 (vgg19_bn) "
                                                   "state dict, an existing file; not set: found by name."),
        "weights": Field((str, ListOf((str, float), min_len=1), None),
                         doc="LPIPSLoss / DISTSLoss: their weight files, as val.metrics' lpips / dists take them "
                             "(not set: the standard files, found by name); MSSSIMLoss / MSSSIML1Loss: one exponent "
                             "per scale."),
    },
    extra=True,
    rule=_loss_entry_rule,
    doc="One loss of train.losses: `type` and the loss's own arguments (checked against its signature).",
)

NAN_RECOVERY = Section(
    {
        "enabled": Field(bool, default=True,
                         doc="On a NaN / infinite loss (or gradient norm, with train.grad_clip_norm) found at a "
                             "check (print_freq, save, the end): roll back to the last good state, multiply the "
                             "learning rate(s) by lr_factor, skip the offending iteration's batch and continue. "
                             "Off: the run stops at the check with a one-line error (and the last good checkpoint "
                             "on disk). See docs/nan_recovery.md."),
        "max_retries": Field(int, default=3, check=at_least(1),
                             doc="Recoveries allowed per run (counted over resumes); one more non-finite value "
                                 "stops the run with the one-line error."),
        "lr_factor": Field(float, default=0.5, check=Check(lambda v: 0 < v <= 1, "in (0, 1]"),
                           doc="Each recovery multiplies every learning rate by this (kept in the training "
                               "state: it lasts for the rest of the run, resumes included)."),
        "snapshot": Field(str, default="save", choices=("save", "print"),
                          doc="The last good state kept in host memory: save: the state of each checkpoint "
                              "(no extra cost; the rollback goes back to the last save); print: also at each "
                              "print_freq report (a shorter replay, for one host copy of the state per report)."),
        "inject_at": Field(ListOf(int), default=[],
                           doc="Rehearsal / testing: the losses of these iterations are multiplied by NaN before "
                               "the backward pass (the same on every rank), so their gradients and then the weights "
                               "become NaN; a replay after the recovery does not inject again."),
    },
    doc="NaN / Inf recovery (docs/nan_recovery.md).",
)

TRAIN = Section(
    {
        "total_iter": Field(int, required=True, check=at_least(1), expect=_NUM_FREQ,
                            doc="Iterations to train."),
        "warmup_iter": Field(int, default=-1, check=at_least(-1),
                             doc="Linear lr warm-up iterations (-1: none)."),
        "ema_decay": Field(float, default=0.0, check=between(0, 1, high_open=True),
                           doc="EMA of the generator weights (0: off; BasicSR uses 0.999)."),
        "ema_warmup": Field(bool, default=True,
                            doc="Warm the EMA up: decay min(ema_decay, (1 + n) / (10 + n)) after n updates, so the "
                                "random start is forgotten within a few hundred steps (or traiNNer-redux's "
                                "ema_power schedule). false: the first update copies the weights, every later one "
                                "averages with ema_decay itself (neosr's EMA, torch's AveragedModel; a neosr file's "
                                "train.ema maps to it). Not with ema_power."),
        "precision": Field(str, default="auto", choices=PRECISION_CHOICES,
                           doc="Autocast precision. auto: CUDA compute capability >= 8.0 and TPUs bf16; CPUs "
                               "with AVX512-BF16 or AMX: fp32 or bf16, whichever the network runs faster (timed "
                               "once, cached); other devices fp32; fp16 only when asked for (CUDA). The choice and "
                               "its reason are logged and kept in summary.json."),
        "compile": Field(bool, default=False, doc="torch.compile the network (cpu and cuda)."),
        "channels_last": Field((bool, str), default="auto", check=_auto_or_bool, expect="'auto' | bool",
                               doc="Keep conv weights and image batches in NHWC (channels_last) memory: the same "
                                   "results to float rounding. auto: CPUs time NCHW and NHWC on the network; CUDA "
                                   "on in bf16/fp16; off on MPS; XLA lays out memory itself."),
        "grad_clip_norm": Field((float, None), default=None, check=greater_than(0),
                                doc="Clip the gradient norm (null: no clipping)."),
        "accumulate": Field(int, default=1, check=at_least(1),
                            doc="Gradient accumulation steps per iteration."),
        "nan_recovery": Field(NAN_RECOVERY, default={}, doc="Recovery from a NaN / infinite loss."),
        "optim_g": Field(OPTIM, required=True, doc="Generator optimizer."),
        "scheduler": Field((SCHEDULER, None), default=None, doc="Learning-rate schedule (null: constant)."),
        "pixel_opt": Field((PIXEL_LOSS, None), default=None, doc="Pixel loss."),
        "perceptual_opt": Field((PERCEPTUAL_LOSS, None), default=None,
                                doc="Perceptual loss ({type: PerceptualLoss, layer_weights: ..., ...})."),
        "gan_opt": Field((GAN_LOSS, None), default=None, doc="GAN loss (GAN models)."),
        "feature_matching_opt": Field((FEATURE_MATCHING_LOSS, None), default=None,
                                      doc="Discriminator feature matching ({type: GANFeatLoss}; HiFaceGANModel)."),
        "losses": Field((ListOf(LOSS_ENTRY), None), default=None,
                        doc="The list form (traiNNer-redux's): [{type, loss_weight, ...}, ...], each logged under "
                            "its name; builds the same losses as pixel_opt / perceptual_opt / gan_opt (not both)."),
        "net_d_iters": Field(int, default=1, check=at_least(1), doc="Discriminator update interval (GAN)."),
        "net_d_init_iters": Field(int, default=0, check=at_least(0), doc="Discriminator-only warm-up (GAN)."),
        "optim_d": Field((OPTIM, None), default=None, doc="Discriminator optimizer (GAN models)."),
        "grad_clip_norm_d": Field((float, None), default=None, check=greater_than(0),
                                  doc="Clip the discriminator's gradient norm (GAN models; null: no clipping). "
                                      "neosr's grad_clip clips both networks to 1."),
        "clamp": Field(bool, default=False,
                       doc="Clamp the generator's output to [1/255, 1] before the losses and the discriminator "
                           "(neosr's train.clamp, on there by default): no gradient flows where it clamps."),
        "match_lq_colors": Field(bool, default=False,
                                 doc="Losses that compare colours (neosr's consistency_loss, msswd_loss) compare the "
                                     "output with the LQ upscaled (antialiased bicubic, clamped to [1/255, 1]) "
                                     "instead of the GT (neosr's match_lq_colors)."),
        "wavelet_guided": Field(bool, default=False,
                                doc="From train.wavelet_init on, the discriminator judges the weighted LH, HL, HH "
                                    "bands of the luma's stationary wavelet transform (sym19) of the output and "
                                    "the GT instead of the images (neosr's wavelet_guided; SRGANModel, "
                                    "ESRGANModel, RealESRGANModel). Its network_d takes 3 channels."),
        "wavelet_init": Field(int, default=0, check=at_least(0),
                              doc="The first iteration of train.wavelet_guided (neosr's wavelet_init)."),
        "sam": Field((str, None), default=None, choices=(None, "fsam", "FSAM"),
                     doc="Sharpness-aware minimisation of the generator from train.sam_init on (neosr's train.sam): "
                         "fsam, Friendly SAM (rho 0.5, sigma 1, lmbda 0.9, adaptive): each step backpropagates "
                         "twice, the second time at perturbed weights; no gradient clipping then (neither network). "
                         "SRModel, SRGANModel, ESRGANModel, RealESRNetModel, RealESRGANModel; not with "
                         "train.accumulate > 1 or fp16."),
        "sam_init": Field(int, default=-1,
                          doc="The first iteration of train.sam (neosr's sam_init; -1: from the start)."),
        "eco_enabled": Field(bool, default=False,
                             doc="ECO, Empirical Centroid-oriented Optimization (neosr's train.eco): from "
                                 "train.eco_init to train.eco_iters each pair is pulled towards the generator's own "
                                 "output on its LQ (one more forward pass, no gradient): GT (1 - w) SR + w GT, LQ "
                                 "(1 - w) shrink(SR) + w LQ, w growing by train.eco_schedule; from iteration 1 when "
                                 "path.pretrain_network_g is set."),
        "eco_init": Field(int, default=15000, check=at_least(0),
                          doc="ECO's first iteration (without path.pretrain_network_g; neosr's default)."),
        "eco_iters": Field(int, default=80000, check=at_least(1),
                           doc="ECO's last iteration; the schedule reaches w = 1 there (linear)."),
        "eco_schedule": Field(str, default="sigmoid", choices=("sigmoid", "linear"),
                              doc="ECO's weight of the real pair: sigmoid, 1 / (1 + exp(-10 (it / eco_iters - "
                                  "0.25))); linear, min(it / eco_iters, 1)."),
        **STYLEGAN2_TRAIN_FIELDS,
        **GFPGAN_TRAIN_FIELDS,
        **MMREALSR_TRAIN_FIELDS,
        **RESTOREFORMER_TRAIN_FIELDS,
        **VIDEO_TRAIN_FIELDS,
        **AUGMENT_TRAIN_FIELDS,
        **TRAINNER_TRAIN_FIELDS,
    },
    rule=_train_rule,
    doc="Required when training. At least one loss (pixel_opt, perceptual_opt, gan_opt, or the losses list) must "
        "be set.",
)

METRIC = Section(
    {
        "type": Field(str, required=True, expect="a registered metric (calculate_psnr, calculate_ssim, ...)",
                      doc="Metric (METRIC_REGISTRY: BasicSR's names and short ones)."),
        "crop_border": Field(int, check=at_least(0), default_doc="scale",
                             doc="Pixels cropped at each border."),
        "test_y_channel": Field(bool, default=False, doc="Measure on the Y channel (colour images)."),
        "better": Field(str, choices=("higher", "lower"),
                        default_doc="the metric's: lower for niqe, lpips, dists and fid, higher for psnr and ssim",
                        doc="Which direction is better (the best value and its checkpoint are tracked that way)."),
        "convert_to": Field(str, choices=("y", "gray"), default_doc="y (niqe only)",
                            doc="NIQE: measure MATLAB's BT.601 Y or OpenCV's full-range gray of colour images."),
        "net": Field(str, choices=("alex", "vgg"), default_doc="alex (lpips only)",
                     doc="LPIPS backbone: alex (the paper's default) or vgg."),
        "weights": Field((str, ListOf(str, min_len=1), None), default=None,
                         doc="LPIPS, DISTS, FID: weight file(s) (.pth or .safetensors), existing files. LPIPS: "
                             "torchvision's alexnet / vgg16 and the lpips head (alex.pth / vgg.pth); DISTS: "
                             "torchvision's vgg16 and DISTS' weights.pt; FID: pt_inception-2015-12-05-6726825d.pth. "
                             "null: those standard files, found by name when the metric is built (torch hub's "
                             "cache, else downloaded once and checked by sha256; docs/judging.md)."),
        "stats": Field((str, None), default=None,
                       doc="FID: reference statistics (pytorch-fid .npz with mu / sigma, or BasicSR's .pth with "
                           "mean / cov); null: the dataset's ground-truth images are the reference."),
    },
    rule=_metric_rule,
    doc="One metric: `type` (METRIC_REGISTRY) and its settings; keys a metric does not read are refused.",
)

VAL = Section(
    {
        "val_freq": Field((int, None), default=None, check=at_least(1), expect=_NUM_FREQ + " | null",
                          doc="Validate every N iterations; required when training with a val section."),
        "save_img": Field(bool, default=False, doc="Save the output images."),
        "num_val_samples": Field(int, default=16, check=at_least(1),
                                 doc="StyleGAN2Model: images of fixed codes drawn at each validation (one grid)."),
        "suffix": Field((str, None), default=None, check=_suffix, expect="str without '/' | null",
                        doc="Suffix of saved image names."),
        "tile": Field((int, None), default=None, check=at_least(1),
                      doc="Tile size (LQ pixels) for tiled inference; null: whole image."),
        "tile_pad": Field(int, default=10, check=at_least(0), doc="Overlap (LQ pixels) around each tile."),
        "pbar": Field(bool, default=False, doc="Show a progress bar."),
        "log_images": Field(int, default=8, check=at_least(0),
                            doc="Validation images per dataset (the first ones) whose fixed centre crop (LQ, "
                                "result and ground truth, 128 pixels) goes to TensorBoard and report.html at each "
                                "validation (0: none)."),
        "metrics": Field((MapOf(METRIC), None), default=None,
                         doc="Named metrics, e.g. psnr: {type: calculate_psnr}."),
        **VIDEO_VAL_FIELDS,
        "use_chop": Field(bool, keep=False,
                          doc="Accepted (the DAT authors' memory-saving split test) and ignored; val.tile does that."),
        **TRAINNER_VAL_FIELDS,
    },
    rule=_val_rule,
)

TILE = Section({
    "tile_size": Field(int, required=True, check=at_least(1), doc="Tile size (LQ pixels): val.tile."),
    "tile_pad": Field(int, default=10, check=at_least(0), doc="Overlap (LQ pixels): val.tile_pad."),
})

WANDB = Section({
    "project": Field((str, None), default=None, doc="wandb project (null: wandb off)."),
    "resume_id": Field((str, None), default=None, doc="wandb run id to resume."),
    "entity": Field((str, None), default=None, doc="wandb entity."),
})

LOGGER = Section({
    "print_freq": Field(int, default=100, check=at_least(1), expect=_NUM_FREQ, doc="Log every N iterations."),
    "save_checkpoint_freq": Field(int, default=5000, check=at_least(1), expect=_NUM_FREQ,
                                  doc="Save weights and training state every N iterations."),
    "use_tb_logger": Field(bool, default=True,
                           doc="Write TensorBoard logs to <experiments_root>/tb_logger (needs anysr[tensorboard]); "
                               "view them with tensorboard --logdir experiments."),
    "save_pth": Field(bool, default=False, doc="Also write BasicSR .pth weights (same as 'pth' in save_format)."),
    "save_format": Field(ListOf(str), default=["safetensors"], check=_save_formats,
                         expect=f"list of {', '.join(SAVE_FORMATS)}",
                         doc="Weights written at every save, as models/net_g_<iter>.<format> (and net_g_latest.*): "
                             "safetensors (always: anysr's file, both groups, rebuild metadata), pth (BasicSR's "
                             "{params, params_ema}), plain.pth / plain.safetensors (one bare state dict, the EMA "
                             "weights when there are, for chaiNNer / ComfyUI / spandrel; as `anysr export`)."),
    "keep_last": Field((int, None), default=3, check=at_least(1),
                       doc="Training states to keep (null: all)."),
    "wandb": Field(WANDB, default={}, doc="Weights & Biases."),
    **TRAINNER_LOGGER_FIELDS,
})

DIST_PARAMS = Section({
    "backend": Field((str, None), default=None, choices=(None, "nccl", "gloo"),
                     doc="Process-group backend (null: chosen per accelerator)."),
    "port": Field((int, None), default=None, check=between(1, 65535),
                  doc="Rendezvous port (null: a free one)."),
})

XLA = Section({
    "spmd": Field(bool, default=False, doc="XLA SPMD: one process drives all local devices."),
    "backend": Field(str, default="auto", choices=XLA_BACKENDS,
                     doc="The library that runs accelerator: xla (docs/tpu.md); auto: the lazy-tensor one where it "
                         "matches the installed torch, else PyTorch on JAX (the whole step jitted)."),
    "matmul_precision": Field(str, default="default", choices=MATMUL_PRECISIONS,
                              doc="On JAX: the matmul / convolution precision (highest: fp32 passes, for "
                                  "comparisons with the CPU)."),
})

OPTIONS = Section(
    {
        "name": Field(str, required=True,
                      check=Check(_valid_name, f"a non-empty name without '/' of at most {MAX_NAME_BYTES} bytes "
                                  "(it names the output folder)"),
                      expect="str (no '/')", doc="Experiment name."),
        "model_type": Field(str, default="SRModel", doc="Model class in MODEL_REGISTRY."),
        "scale": Field(int, required=True, check=between(1, 8), doc="Upscaling factor."),
        "num_gpu": Field((int, str), default="auto", check=_num_gpu, expect="'auto' | int >= 0",
                         doc="Devices (or CPU ranks) to use; auto: all visible."),
        "accelerator": Field(str, default="auto", choices=ACCELERATORS, doc="Device kind.",
                             hints=ACCELERATOR_HINTS),
        "manual_seed": Field(int, default=0, check=Check(lambda v: 0 <= v < SEED_LIMIT, "from 0 to 2**63 - 1"),
                             doc="Random seed."),
        "is_train": Field(bool, default_doc="the is_train argument", doc="Set by the loader."),
        "dist": Field(bool, keep=False, doc="Accepted (BasicSR) and ignored."),
        "find_unused_parameters": Field(bool, default=False, doc="DDP find_unused_parameters."),
        "use_static_graph": Field(bool, default=False, doc="DDP static_graph."),
        "launcher": Field((str, None), default=None, choices=(None, *LAUNCHERS),
                          doc="Accepted; the command line's --launcher decides."),
        "xla": Field(XLA, default={}, doc="XLA settings."),
        "datasets": Field(MapOf(DATASET, key_check=_dataset_key), default={}, doc="Datasets by name."),
        "network_g": Field(NETWORK_G, required=True, doc="Generator network."),
        "network_d": Field((NETWORK_D, None), default=None, doc="Discriminator network (GAN models)."),
        **{f"network_d_{part}": Field((NETWORK_D, None), default=None,
                                      doc=f"GFPGANModel: the {part.replace('_', ' ')} discriminator "
                                          "(FacialComponentDiscriminator; the three come together).")
           for part in FACE_PARTS},
        "network_identity": Field((NETWORK_D, None), default=None,
                                  doc="GFPGANModel: the identity network of the identity loss (ResNetArcFace; its "
                                      "weights: path.pretrain_network_identity)."),
        "path": Field(PATH, default={}, doc="Input weights and output folders."),
        "train": Field((TRAIN, None), default=None, doc="Training settings (required when training)."),
        "val": Field((VAL, None), default=None, doc="Validation / test settings (null: no validation)."),
        "tile": Field((TILE, None), default=None,
                      doc="The HAT / DRCT authors' tiled test ({tile_size, tile_pad}): sets val.tile and "
                          "val.tile_pad."),
        "logger": Field(LOGGER, default={}, doc="Logging and checkpoint frequency."),
        "dist_params": Field(DIST_PARAMS, default={}, doc="Distributed settings."),
        **REALESRGAN_FIELDS,
        **MMREALSR_FIELDS,
        **TRAINNER_TOP_FIELDS,
        "network_recognised": Field((str, None), default=None,
                                    doc="Set by the loader for `network_g.type: auto`: the network read from "
                                        "`path.pretrain_network_g` and its inferred arguments (logged at start)."),
        "mapped_keys_from": Field(str, default="traiNNer-redux", choices=("traiNNer-redux", "neosr", "presets"),
                                  doc="Set by the loader: whose dialect mapped_keys speaks of (a .toml file: neosr; "
                                      "presets: only network names were expanded)."),
        "mapped_keys": Field(ListOf(str), default=[],
                             doc="Set by the loader: what the file's traiNNer-redux or neosr keys became in anysr's "
                                 "(logged in one line when training starts; see docs/trainner.md, docs/neosr.md)."),
    },
    refused={
        "rank": "is set by the launcher, remove it",
        "world_size": "is set by the launcher, remove it",
    },
    rule=_top_rule,
)


def validate(opt: dict[str, Any], *, is_train: bool, root: Path,
             check_paths: bool = True) -> tuple[dict[str, Any], list[str]]:
    """Validate a whole option dict: ``(result, problems)``; the result is meaningful without problems.

    ``check_paths=False`` resolves input paths without requiring them to exist (for commands that read none).
    """
    ctx = Context(is_train=is_train, root=root, check_paths=check_paths, top_level=frozenset(OPTIONS.fields))
    model = registered("model", opt.get("model_type")) if "scale" not in opt else None
    if model is not None and (getattr(model, "generative", False) or getattr(model, "default_scale", None)):
        # a generator of images from codes (StyleGAN2Model: no input to upscale), or a model that restores at one
        # scale (GFPGANModel: faces at their size; the authors' files set none)
        opt = {**opt, "scale": getattr(model, "default_scale", None) or 1}
    scale = opt.get("scale")
    if not isinstance(scale, bool) and isinstance(scale, (int, float, str)):
        value = validate_field(OPTIONS.fields["scale"], scale, "scale", Context(is_train=is_train, root=root))
        ctx.scale = value if isinstance(value, int) else None
    paths = opt.get("path")
    if isinstance(paths, dict) and isinstance(paths.get("root"), str):
        ctx.root = resolve_path(paths["root"], root)
    given = opt.pop("mapped_keys", None)  # the loader's notes (neosr's TOML dialect), logged with ours
    notes = [n for n in given if isinstance(n, str)] if isinstance(given, list) else []
    neosr = bool(notes) and notes[0] == NEOSR_NOTE
    if neosr:
        ctx.dialect = "neosr"
    presets = expand_network_presets(opt, ctx)
    trainner = map_trainner(opt, ctx)
    notes = notes[neosr:] + presets + trainner
    result = validate_section(OPTIONS, opt, "", ctx)
    result["mapped_keys"] = notes
    result["mapped_keys_from"] = "neosr" if neosr else "traiNNer-redux" if trainner or not presets else "presets"
    return result, ctx.problems

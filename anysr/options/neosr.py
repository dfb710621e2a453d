"""neosr's TOML option files, read as they are.

neosr (a BasicSR-derived trainer) writes its options as TOML with its own names: ``model_type = "image" | "otf"``,
datasets of type ``paired`` / ``otf`` / ``single`` with an LQ ``patch_size`` and ``batch_size``, a ``[degradations]``
table for its Real-ESRGAN-style synthesis, its augmentations as a dataset list, ``train.ema``, one
``[train.<name>_opt]`` table per loss, ``logger.total_iter``. ``map_neosr`` rewrites such a mapping into anysr's
BasicSR layout before validation (``read_options_file`` calls it for every ``.toml`` file), one note per mapped key:
the loss tables become a ``train.losses`` list whose ``type`` strings stay neosr's (the registry knows them), the
networks keep their names (anysr's presets and registry know neosr's). Keys neosr reads that anysr cannot honour are
refused with their reason; keys it ignores at run time are noted; any other key is left for the schema to judge.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from anysr.errors import OptionError
from anysr.options.trainner import fill_network_scale

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# neosr's dataset and model names -> anysr's
DATASET_TYPES = {"paired": "PairedImageDataset", "otf": "RealESRGANDataset", "single": "SingleImageDataset"}
NETWORK_D_TYPES = {"unet": "UNetDiscriminatorSN"}  # neosr's "unet" is Real-ESRGAN's U-Net discriminator (its keys)
SCHEDULER_TYPES = {"cosineannealing": "CosineAnnealingLR", "multisteplr": "MultiStepLR"}
# neosr's `adan` (no_prox, its defaults and state keys): anysr's NeosrAdan (`Adan` is pytorch-optimizer's)
OPTIMIZER_TYPES = {"adan": "NeosrAdan"}
# the [degradations] keys neosr's OTF dataset reads (the others are its model's: anysr's top-level keys)
DATASET_DEGRADATION_KEYS = (
    "blur_kernel_size", "kernel_list", "kernel_prob", "blur_sigma", "betag_range", "betap_range", "sinc_prob",
    "blur_kernel_size2", "kernel_list2", "kernel_prob2", "blur_sigma2", "betag_range2", "betap_range2", "sinc_prob2",
    "final_sinc_prob")
OTF_CROP_PAD_SIZE = 512  # neosr's OTF dataset crops (or pads) every GT to 512 x 512 before the synthesis
OTF_QUEUE_SIZE = 180  # neosr's default datasets.train.queue_size
# log names of neosr's loss tables where they differ from the table's name (its l_g_pix, l_g_percep)
LOSS_NAMES = {"pixel": "pix", "perceptual": "percep"}
NOT_LOSSES = ("optim_g", "optim_d")
GAN_MODELS = ("SRGANModel", "RealESRGANModel")  # what _map_model picks when the discriminator trains
SCALED_LOSSES = ("vgg_perceptual_loss",)  # neosr's Patch Loss picks its kernels from the top-level scale
# neosr's validation metrics -> anysr's: (type, crop_border default); neosr crops 4 pixels for PSNR / SSIM whatever
# the scale, none for DISTS (its own: no ImageNet normalisation) and TOPIQ
METRIC_TYPES = {"calculate_psnr": ("calculate_psnr", 4), "calculate_ssim": ("calculate_ssim", 4),
                "calculate_dists": ("raw_dists", 0), "calculate_topiq": ("calculate_topiq", 0)}
_METRIC_DROPPED = ("better", "input_order")  # anysr sets `better` from the metric; images are always HWC
NEOSR_NOTE = "read as neosr's TOML dialect"  # the first note of a neosr file (the start-up line names the dialect)
_IGNORED_TOP = ("fast_matmul", "bfloat16", "deterministic")  # bfloat16: with use_amp, train.precision auto decides
_IGNORED_DATASET = ("prefetch_mode", "pin_memory", "persistent_workers")


def read_toml(path: Path, text: str | None = None) -> dict[str, Any]:
    """The mapping in a TOML file (UTF-8; ``text``: its contents, already read); OptionError with the line and
    column of a syntax error."""
    try:
        if text is not None:
            return tomllib.loads(text)
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as err:
        raise OptionError(f"options file '{path}': TOML syntax error: {err} (neosr's files: Windows paths in single "
                          "quotes; each key once per table)") from None
    except UnicodeDecodeError as err:
        raise OptionError(f"options file '{path}' is not UTF-8 text ({err.reason} at byte {err.start})") from None


class _Mapping:
    def __init__(self, opt: dict[str, Any]) -> None:
        self.opt = opt
        self.notes: list[str] = []
        self.ignored: list[str] = []
        self.problems: list[str] = []

    def section(self, name: str) -> dict[str, Any] | None:
        value = self.opt.get(name)
        return value if isinstance(value, dict) else None

    def move(self, source: str, where: dict[str, Any], key: str, value: Any, shown: str | None = None) -> None:
        """``where[key] = value`` for neosr's ``source``; a different value already there is a problem."""
        if key in where and where[key] is not None and where[key] != value:
            self.problems.append(f"{source} means {key} = {value!r}, but {key} is also set to {where[key]!r}; "
                                 "keep one of them")
            return
        where[key] = value
        self.notes.append(f"{source} -> {shown or key} {value!r}" if not isinstance(value, bool)
                          else f"{source} -> {shown or key} {str(value).lower()}")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _train_section(m: _Mapping) -> dict[str, Any]:
    """``train``, made where a training key must go into it."""
    train = m.section("train")
    if train is None:
        train = m.opt["train"] = {}
    return train


def _map_top(m: _Mapping) -> None:
    opt = m.opt
    train = m.section("train")
    amp = opt.pop("use_amp", None)
    if isinstance(amp, bool) and train is not None:
        m.move("use_amp" + ("+bfloat16" if amp and opt.get("bfloat16") is True else ""), train, "precision",
               "auto" if amp else "fp32", "train.precision")
    compile_ = opt.pop("compile", None)
    if isinstance(compile_, bool) and train is not None:
        m.move("compile", train, "compile", compile_, "train.compile")
    for key in _IGNORED_TOP:
        if key in opt:
            value = opt.pop(key)
            if value is True and key != "bfloat16":
                m.ignored.append(key)


def _map_model(m: _Mapping) -> None:
    """neosr's ``image`` / ``otf`` -> the BasicSR model that trains the same way: with a discriminator and a GAN
    loss of non-zero weight SRGANModel / RealESRGANModel (neosr trains ``network_d`` only then), else SRModel /
    RealESRNetModel."""
    opt = m.opt
    kind = opt.get("model_type")
    if not isinstance(kind, str) or kind.lower() not in ("image", "otf"):
        return
    train = m.section("train") or {}
    gan = train.get("gan_opt")
    gan_on = isinstance(gan, dict) and (_number(gan.get("loss_weight", 1.0)) or 0) != 0
    net_d = m.section("network_d")
    if net_d is not None and not gan_on:
        opt["network_d"] = None
        m.notes.append("network_d without train.gan_opt -> unused (as neosr)")
    otf = kind.lower() == "otf"
    with_d = gan_on and net_d is not None
    model = ("RealESRGANModel" if with_d else "RealESRNetModel") if otf else ("SRGANModel" if with_d else "SRModel")
    opt["model_type"] = model
    m.notes.append(f"model_type {kind} -> {model}")
    if otf:
        for key in ("gt_usm", "l1_gt_usm", "percep_gt_usm", "gan_gt_usm"):  # neosr's OTF model trains to the plain GT
            opt.setdefault(key, False)
        opt.setdefault("high_order_degradation", True)


def _map_degradations(m: _Mapping) -> None:
    table = m.opt.pop("degradations", None)
    if table is None:
        return
    if not isinstance(table, dict):
        m.problems.append(f"degradations must be a table of the OTF synthesis settings, got {table!r}")
        return
    sets = m.section("datasets") or {}
    train_sets = [d for k, d in sets.items() if str(k).split("_")[0] == "train" and isinstance(d, dict)]
    for key, value in table.items():
        if key in DATASET_DEGRADATION_KEYS:
            for data in train_sets:
                m.move(f"degradations.{key}", data, key, value, f"datasets.train.{key}")
        else:
            m.move(f"degradations.{key}", m.opt, key, value)


def _map_dataset(m: _Mapping, name: str, data: dict[str, Any]) -> None:
    path = f"datasets.{name}"
    train = str(name).split("_")[0] == "train"
    kind = data.get("type")
    if isinstance(kind, str) and kind.lower() in DATASET_TYPES:
        data["type"] = DATASET_TYPES[kind.lower()]
        m.notes.append(f"{path}.type {kind} -> {data['type']}")
    scale = _int(m.opt.get("scale"))
    patch = data.pop("patch_size", None)
    if patch is not None:
        if _int(patch) is None or patch < 1:
            m.problems.append(f"{path}.patch_size must be a whole number of LQ pixels >= 1, got {patch!r}")
        elif scale is not None:
            m.move(f"{path}.patch_size", data, "gt_size", patch * scale, f"{path}.gt_size")
    batch = data.pop("batch_size", None)
    if batch is not None:
        m.move(f"{path}.batch_size", data, "batch_size_per_gpu", batch, f"{path}.batch_size_per_gpu")
    if "meta_info" in data:  # neosr's OTF dataset reads its list of GT files from `meta_info`
        m.move(f"{path}.meta_info", data, "meta_info_file", data.pop("meta_info"), f"{path}.meta_info_file")
    workers = data.get("num_worker_per_gpu")
    if workers == "auto":
        data.pop("num_worker_per_gpu")
        m.notes.append(f"{path}.num_worker_per_gpu auto -> anysr's default")
    for key in _IGNORED_DATASET:
        if key in data:
            data.pop(key)
            m.ignored.append(f"{path}.{key}")
    if not train:
        for key in ("augmentation", "aug_prob", "accumulate"):
            if key in data:
                data.pop(key)
                m.ignored.append(f"{path}.{key}")
        return
    for key in ("use_hflip", "use_rot"):
        if key not in data:
            data[key] = True  # neosr's default (BasicSR's and anysr's: false)
    accumulate = data.pop("accumulate", None)
    t = _train_section(m)
    if accumulate is not None:
        m.move(f"{path}.accumulate", t, "accumulate", accumulate, "train.accumulate")
    if data.get("type") == "RealESRGANDataset":
        if "crop_pad_size" not in data:
            data["crop_pad_size"] = OTF_CROP_PAD_SIZE
        queue = data.pop("queue_size", OTF_QUEUE_SIZE)
        if _int(queue) is not None and _int(batch) is not None and batch > 0 and queue >= batch:
            queue = queue // batch * batch  # neosr rounds it down to whole batches
        m.move(f"{path}.queue_size", m.opt, "queue_size", queue)
    augs, probs = data.pop("augmentation", None), data.pop("aug_prob", None)
    if augs is None:
        return
    if not isinstance(augs, list) or not all(isinstance(a, str) for a in augs):
        m.problems.append(f"{path}.augmentation must be a list of names, got {augs!r}")
        return
    if [a.lower() for a in augs] == ["none"]:
        m.notes.append(f"{path}.augmentation [none] -> no batch augmentation")
        return
    if probs is None:
        m.problems.append(f"{path}.augmentation needs aug_prob (one probability per entry), as neosr does")
        return
    m.move(f"{path}.augmentation", t, "use_moa", True, "train.use_moa")
    m.move(f"{path}.augmentation", t, "moa_augs", [a.lower() for a in augs], "train.moa_augs")
    m.move(f"{path}.aug_prob", t, "moa_probs", probs, "train.moa_probs")


def _map_datasets(m: _Mapping) -> None:
    sets = m.section("datasets")
    for name, data in (sets.items() if sets is not None else ()):
        if isinstance(data, dict):
            _map_dataset(m, str(name), data)


def _loss_entry(m: _Mapping, key: str, block: Any) -> dict[str, Any] | None:
    if not isinstance(block, dict):
        m.problems.append(f"train.{key} must be a table with a type (a neosr loss), got {block!r}")
        return None
    base = key[: -len("_opt")]
    entry = {**block, "name": LOSS_NAMES.get(base, base)}
    scale = _int(m.opt.get("scale"))
    if str(block.get("type", "")).lower() in SCALED_LOSSES and "scale" not in block and scale is not None:
        entry["scale"] = scale
    return entry


def _map_train(m: _Mapping) -> None:
    train = m.section("train")
    if train is None:
        return
    ema = train.pop("ema", None)
    if ema is not None:
        value = _number(ema)
        if value is None:
            m.problems.append(f"train.ema must be a number (the EMA decay; <= 0: none), got {ema!r}")
        elif value > 0:
            m.move("train.ema", train, "ema_decay", value, "train.ema_decay")
            m.move("train.ema", train, "ema_warmup", False, "train.ema_warmup")  # torch's AveragedModel, as neosr
        else:
            m.notes.append("train.ema <= 0 -> no EMA")
    clip = train.pop("grad_clip", True)  # neosr clips both networks' gradients to norm 1 unless told not to
    if clip is True:
        m.move("train.grad_clip", train, "grad_clip_norm", 1.0, "train.grad_clip_norm")
        if m.opt.get("model_type") in GAN_MODELS:
            m.move("train.grad_clip", train, "grad_clip_norm_d", 1.0, "train.grad_clip_norm_d")
    elif clip is not False:
        m.problems.append(f"train.grad_clip must be true or false, got {clip!r}")
    if "clamp" not in train:
        train["clamp"] = True  # neosr's default: the output clamped to [1/255, 1] before the losses
        m.notes.append("train.clamp unset -> true (neosr's default)")
    if "eco" in train:
        eco = train.pop("eco")
        if isinstance(eco, bool):
            m.move("train.eco", train, "eco_enabled", eco, "train.eco_enabled")
        else:
            m.problems.append(f"train.eco must be true or false (neosr's ECO), got {eco!r}")
    schedule = train.get("eco_schedule")
    if isinstance(schedule, str) and schedule != "sigmoid":
        train["eco_schedule"] = "linear"  # neosr: anything but sigmoid is the linear ramp
        if schedule != "linear":
            m.notes.append(f"train.eco_schedule {schedule} -> linear (as neosr reads it)")
    losses = [e for k in list(train) if k.endswith("_opt") and k not in NOT_LOSSES
              if (e := _loss_entry(m, k, train.pop(k))) is not None]
    if losses:
        given = train.get("losses")
        if given is not None:
            m.problems.append("train.losses is set together with neosr's train.<name>_opt tables; keep one form")
        else:
            train["losses"] = losses
            m.notes.append("train.<name>_opt tables -> train.losses [" +
                           ", ".join(f"{e['name']}: {e.get('type')}" for e in losses) + "]")
    for key in NOT_LOSSES:
        optim = train.get(key)
        kind = optim.get("type") if isinstance(optim, dict) else None
        if isinstance(kind, str) and kind.lower() in OPTIMIZER_TYPES:
            optim["type"] = OPTIMIZER_TYPES[kind.lower()]  # type: ignore[index]
            m.notes.append(f"train.{key}.type {kind} -> {optim['type']}")  # type: ignore[index]
    sched = train.get("scheduler")
    if isinstance(sched, dict) and isinstance(sched.get("type"), str) and \
            sched["type"].lower() in SCHEDULER_TYPES and sched["type"] != SCHEDULER_TYPES[sched["type"].lower()]:
        m.notes.append(f"train.scheduler.type {sched['type']} -> {SCHEDULER_TYPES[sched['type'].lower()]}")
        sched["type"] = SCHEDULER_TYPES[sched["type"].lower()]


def _map_logger(m: _Mapping) -> None:
    logger = m.section("logger")
    if logger is None:
        return
    total = logger.pop("total_iter", None)
    if total is not None:
        train = _train_section(m)
        m.move("logger.total_iter", train, "total_iter", total, "train.total_iter")
    if "save_tb_img" in logger:
        logger.pop("save_tb_img")
        m.ignored.append("logger.save_tb_img")


def _map_network_scale(m: _Mapping) -> None:
    """neosr builds every generator with the top-level ``scale`` (``trainner.fill_network_scale``)."""
    note = fill_network_scale(m.section("network_g"), _int(m.opt.get("scale")), "neosr")
    if note is not None:
        m.notes.append(note)


def _map_networks(m: _Mapping) -> None:
    net_d = m.section("network_d")
    kind = net_d.get("type") if net_d is not None else None
    if isinstance(kind, str) and kind.lower() in NETWORK_D_TYPES:
        net_d["type"] = NETWORK_D_TYPES[kind.lower()]  # type: ignore[index]
        m.notes.append(f"network_d.type {kind} -> {NETWORK_D_TYPES[kind.lower()]}")
    paths = m.section("path")
    if paths is not None and "print_network" in paths:
        paths.pop("print_network")
        m.ignored.append("path.print_network")
    val = m.section("val")
    sets = m.section("datasets") or {}
    if val is None and any(str(k).split("_")[0] == "test" for k in sets):
        val = m.opt["val"] = {}  # neosr's test files need no [val]: it tests and saves with its defaults
    if val is not None and "save_img" not in val:
        val["save_img"] = True  # neosr's default (anysr's: false)
        m.notes.append("val.save_img unset -> true (neosr's default)")
    metrics = val.get("metrics") if val is not None else None
    for name, metric in (metrics.items() if isinstance(metrics, dict) else ()):
        kind = metric.get("type") if isinstance(metric, dict) else None
        if not isinstance(kind, str) or kind.lower() not in METRIC_TYPES:
            continue
        new, crop = METRIC_TYPES[kind.lower()]
        metric["type"] = new  # type: ignore[index]
        metric.setdefault("crop_border", crop)  # type: ignore[union-attr]
        for key in _METRIC_DROPPED:
            metric.pop(key, None)  # type: ignore[union-attr]
        m.notes.append(f"val.metrics.{name}.type {kind} -> {new} (crop_border {metric['crop_border']})")  # type: ignore[index]
    if val is not None and "save_lq" in val:
        val.pop("save_lq")
        m.ignored.append("val.save_lq")
    if val is not None and _int(val.get("tile")) is not None and val["tile"] <= 0:
        val.pop("tile")  # neosr's -1: no tiling
        m.notes.append("val.tile <= 0 -> whole images")


def map_neosr(opt: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``opt`` (a neosr TOML mapping) rewritten in anysr's layout, in place, and the notes of what was mapped;
    OptionError listing every key that cannot be mapped."""
    m = _Mapping(opt)
    _map_top(m)
    _map_model(m)  # before the loss tables move: it reads train.gan_opt
    _map_degradations(m)
    _map_datasets(m)
    _map_train(m)
    _map_logger(m)
    _map_networks(m)
    _map_network_scale(m)
    if m.problems:
        count = f"{len(m.problems)} problem{'s' if len(m.problems) > 1 else ''}"
        raise OptionError(f"{count} in neosr's options:\n" + "\n".join(f"  {p}" for p in m.problems))
    if m.ignored:
        m.notes.append(f"ignored (neosr settings anysr decides itself): {', '.join(m.ignored)}")
    return opt, [NEOSR_NOTE, *m.notes]

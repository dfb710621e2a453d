"""``anysr train | test | infer | export | eval | report | prepare | bench | schema``: the command line
(``python -m anysr.train -opt F`` too). It parses, validates the options and dispatches to the engine.

Each command imports what it runs inside its function, so ``anysr --help``, ``anysr schema`` and a bad option
file load no torch (ruff's PLC0415 is off for this file alone, for that reason)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from anysr import __version__
from anysr.accelerators.hardware import PRECISION_CHOICES
from anysr.accelerators.kinds import ACCELERATORS, LAUNCHERS
from anysr.accelerators.process import Interrupted
from anysr.atomic import atomic_write_bytes
from anysr.errors import AlreadyReported, AnysrError, OptionError, describe_os_error
from anysr.options import Options, data_overrides, load_options
from anysr.options.docs import render_markdown
from anysr.options.jsonschema import render
from anysr.options.loader import yaml_value
from anysr.plugins import load_plugins


def load_command_options(path: str, overrides: Sequence[str], **kwargs: Any) -> Options:
    """A command's options file, validated once the plugin packages have filled the registries it is checked
    against (``load_options``' keyword arguments: is_train, check_paths)."""
    load_plugins()

    def read_network(weights: Any, param_key: str) -> dict[str, Any]:
        from anysr.engine.inference.network import network_options_from_weights

        return network_options_from_weights(weights, param_key)

    return load_options(path, overrides, read_network=read_network, **kwargs)


def _kv_list(items: Sequence[str], flag: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise OptionError(f"{flag} {item!r}: expected key=value")
        key, value = item.split("=", 1)
        out[key.strip()] = yaml_value(value, f"{flag} {item!r}")
    return out


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more")
    return value


def _positive(text: str) -> int:
    """A whole scale factor of 1 or more (argparse names the flag in front of the message)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole scale factor; give 2, 3, 4, ... (super-resolution "
                                         "scales are integers)") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a scale; give 1 or more")
    return value


_positive.__name__ = "scale"  # argparse says "invalid scale value" for other errors


def _plan_from_options(opt: Any, launcher: str = "auto", precision: str | None = None,
                       num_gpu: Any = None, spmd: bool | None = None,
                       deep_samples: tuple[str, str] | None = None, precision_source: str | None = None) -> Any:
    """The launch plan of validated options; ``precision`` (a command-line flag) overrides ``train.precision``,
    ``num_gpu`` / ``spmd`` the options' (``anysr bench`` times one worker); ``deep_samples``: resolve_plan's."""
    from anysr.accelerators import resolve_plan

    train = opt.train
    layout = None if train is None or train.channels_last == "auto" else bool(train.channels_last)
    return resolve_plan(opt.accelerator, opt.num_gpu if num_gpu is None else num_gpu,
                        precision=precision or (train.precision if train is not None else "auto"), launcher=launcher,
                        spmd=opt.xla.spmd if spmd is None else spmd,
                        compile=bool(train is not None and train.compile), dist_backend=opt.dist_params.backend,
                        master_port=opt.dist_params.port, channels_last=layout,
                        find_unused_parameters=opt.find_unused_parameters, static_graph=opt.use_static_graph,
                        deep_samples=deep_samples, precision_source=precision_source,
                        xla_backend=opt.xla.backend, matmul_precision=opt.xla.matmul_precision)


def _deep_data_plan(opt: Any, launcher: str, precision: str | None = None, source: str | None = None) -> Any:
    """``_plan_from_options``, told whether a dataset reads 16-bit images (``Precision.decide`` then makes ``auto``
    fp32, as for ``anysr infer``'s 16-bit inputs). The headers are read only where the precision is ``auto``."""
    from anysr.data.loaders import holds_16bit_images

    asked = precision or (opt.train.precision if opt.train is not None else "auto")
    deep = asked == "auto" and any(holds_16bit_images(d) for d in opt.datasets.values())
    return _plan_from_options(opt, launcher, precision, deep_samples=(
        "16-bit images in the datasets", "train.precision: bf16") if deep else None, precision_source=source)


# ---------------------------------------------------------------------- commands
def cmd_train(args: argparse.Namespace) -> int:
    from anysr.accelerators import launch
    from anysr.engine.training.trainer import train_worker
    overrides = list(args.force_yml)
    if args.data:
        load_plugins()
        overrides = data_overrides(args.opt, args.data) + overrides  # --force_yml still wins
    opt = load_command_options(args.opt, overrides, is_train=True)
    if args.data:
        print(_data_note(args, opt), flush=True)
    plan = _deep_data_plan(opt, "none" if args.launcher == "none" else args.launcher)
    launch(plan, train_worker, opt, bool(args.auto_resume), bool(args.start_over))
    return 0


def _data_note(args: argparse.Namespace, opt: Any) -> str:
    """What ``--data`` keeps from the file: its run name and length (a DIV2K file's 1,000,000 iterations are days
    on a small machine), unless ``--force_yml`` set them."""
    given = {item.partition("=")[0].strip() for item in args.force_yml}
    kept = []
    if "name" not in given:
        kept.append(f"name '{opt.name}' (outputs in {opt.path.experiments_root})")
    if "train.total_iter" not in given:
        kept.append(f"train.total_iter {int(opt.train.total_iter):,}")
    note = f"--data {args.data}: training on its images with the rest of {args.opt} as it is"
    if kept:
        note += (f"; from the file: {' and '.join(kept)}; change with --force_yml "
                 + " ".join(x for x, k in (("name=my_run", "name"), ("train.total_iter=N", "train.total_iter"))
                            if k not in given))
    return note


def cmd_test(args: argparse.Namespace) -> int:
    from anysr.accelerators import launch
    from anysr.engine.evaluation.evaluator import test_worker
    opt = load_command_options(args.opt, args.force_yml, is_train=False)
    launch(_deep_data_plan(opt, args.launcher, args.precision or "fp32", source=None if args.precision else
                           "scores that compare across machines; --precision auto for bf16"),
           test_worker, opt)
    return 0


def cmd_infer(args: argparse.Namespace) -> int:
    from anysr.accelerators import launch
    from anysr.engine.inference.command import InferRequest, plan_infer
    from anysr.engine.logger import setup_logging

    setup_logging()
    network_opt = None
    if args.opt:
        network_opt = load_command_options(args.opt, args.force_yml, is_train=False)["network_g"]
    job = plan_infer(InferRequest(
        input=args.input, output=args.output, weights=args.weights, arch=args.arch,
        arch_opts=_kv_list(args.arch_opt, "--arch-opt"), network_opt=network_opt, scale=args.scale,
        param_key=args.param_key, dni=(args.dni[0], args.dni[1]) if args.dni else None, tile=args.tile,
        tile_pad=args.tile_pad,
        suffix=args.suffix, outscale=args.outscale, resize=args.resize, ext=args.ext, alpha=args.alpha,
        progress=not args.no_progress, chunk=args.chunk, chunk_pad=args.chunk_pad, fps=args.fps,
        accelerator=args.accelerator, precision=args.precision, channels_last=args.channels_last,
        backend=args.backend))
    launch(job.plan, job.worker, *job.args)
    print(job.done)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from anysr.engine.inference.export import export_weights
    from anysr.engine.logger import setup_logging

    setup_logging()
    network_opt = None
    weights, outputs = args.weights, list(args.to or [])
    settings = {"fp16": args.fp16, "size": args.size, "dynamic": not args.static, "opset": args.opset,
                "check": not args.no_check}
    if args.opt:
        from anysr.engine.inference.export import onnx_file_settings

        opts = load_command_options(args.opt, args.force_yml, is_train=False, check_paths=False)
        network_opt = opts["network_g"]
        if weights is None:
            weights = opts["path"].get("pretrain_network_g")
            if not weights:
                raise OptionError(f"{args.opt}: no weights to export: give WEIGHTS or set path.pretrain_network_g")
        if not outputs and opts.get("onnx") is not None:  # traiNNer-redux's ONNX file: its settings, its name
            plan = onnx_file_settings(dict(opts["onnx"]), opts["name"])
            for note in plan.notes:
                logging.getLogger("anysr").warning("%s: %s", args.opt, note)
            plan.output.parent.mkdir(parents=True, exist_ok=True)
            outputs = [str(plan.output)]
            settings = {"fp16": plan.fp16, "size": plan.size, "dynamic": plan.dynamic, "opset": plan.opset,
                        "check": plan.check}
    if weights is None:
        raise OptionError("anysr export: give WEIGHTS (or -opt FILE with path.pretrain_network_g)")
    if not outputs:
        raise OptionError("anysr export: give --to OUT... (or -opt FILE with an onnx section)")
    reports = export_weights(str(weights), outputs, param_key=args.param_key, arch=args.arch,
                             arch_opts=_kv_list(args.arch_opt, "--arch-opt"), network_opt=network_opt, **settings)
    for rep in reports:
        print(rep.summary())
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from anysr.engine.evaluation.folder_eval import DEVICE_METRICS, evaluate_folders, parse_metrics

    metrics = parse_metrics(args.metrics)
    kwargs = {"crop_border": args.crop_border, "y_channel": not args.rgb, "json_path": args.json,
              "metrics": metrics, "csv_path": args.csv, "report_path": args.report, "lpips_net": args.lpips_net,
              "fid_stats": args.fid_stats,
              "weights": {"lpips": args.lpips_weights, "dists": args.dists_weights, "fid": args.fid_weights,
                          "topiq": args.topiq_weights}}
    sr = args.sr if len(args.sr) > 1 else args.sr[0]
    if not set(DEVICE_METRICS) & set(metrics):
        evaluate_folders(args.gt, sr, args.scale, **kwargs)  # numpy only: no device needed
        return 0
    from anysr.accelerators import launch, resolve_plan
    from anysr.engine.evaluation.folder_eval import eval_worker

    launch(resolve_plan(args.accelerator, 1, precision="fp32"), eval_worker, args.gt, sr, args.scale, kwargs)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from anysr.engine.report.run_report import find_experiment, write_report

    print(f"wrote {write_report(find_experiment(args.experiment))}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from anysr.accelerators import launch
    from anysr.engine.bench import bench_worker, format_table, write_json
    from anysr.engine.logger import setup_logging

    setup_logging()
    # bench times a synthetic batch: the datasets and weights the file names are never read, need not exist.
    opt = load_command_options(args.opt, args.force_yml, is_train=True, check_paths=False)
    if args.remeasure:  # the workers (and --beside's copies) inherit it: cached choices are timed again
        os.environ["ANYSR_REMEASURE"] = "1"
    if args.beside:
        return _bench_beside(args)
    # One worker on the accelerator the options name: per-device numbers, no process group.
    plan = _plan_from_options(opt, "none", args.precision, num_gpu=1, spmd=False)
    result = launch(plan, bench_worker, opt, args.iters, args.warmup, args.infer_size, args.infer_iters or args.iters)
    result["options"] = str(args.opt)
    result["overrides"] = list(args.force_yml)
    print(format_table(result))
    if args.json:
        print(f"wrote {write_json(args.json, result)}")
    return 0


def _bench_beside(args: argparse.Namespace) -> int:
    """``anysr bench --beside N``: the same bench alone, then N + 1 copies at once."""
    import tempfile
    from pathlib import Path

    from anysr.engine.bench import MAX_BESIDE, beside, format_beside, write_json

    if not 1 <= args.beside <= MAX_BESIDE:
        raise OptionError(f"--beside: {args.beside} copies; give a number from 1 to {MAX_BESIDE} (the other jobs to "
                          "run beside this one: each is a whole training process)")

    argv = ["-opt", str(args.opt), "--iters", str(args.iters), "--warmup", str(args.warmup), "--infer-size", "0"]
    if args.precision:
        argv += ["--precision", args.precision]
    if args.force_yml:
        argv += ["--force_yml", *args.force_yml]
    with tempfile.TemporaryDirectory(prefix="anysr-beside-") as folder:
        result = beside(argv, args.beside, Path(folder))
    print(format_beside(result))
    if args.json:
        print(f"wrote {write_json(args.json, result)}")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    load_plugins()  # the schema lists what the registries hold
    if args.architectures:
        return _architectures_table(args.output)
    text = render_markdown() if args.markdown else render()
    if args.output:
        print(f"wrote {atomic_write_bytes(args.output, text.encode())}")
    else:
        sys.stdout.write(text)
    return 0


def _architectures_table(output: str | None) -> int:
    """``anysr schema --architectures``: the registered networks' sources and licences (docs/architectures.md's
    table); with ``-o FILE`` the table between FILE's markers is replaced, the rest of FILE kept."""
    from pathlib import Path

    from anysr.archs.sources import render_into, render_table
    from anysr.registry import ARCH_REGISTRY

    names = list(ARCH_REGISTRY.keys())
    if not output:
        sys.stdout.write(render_table(names) + "\n")
        return 0
    try:
        text = render_into(Path(output).read_text(encoding="utf-8"), names)
    except (OSError, ValueError) as err:
        print(f"anysr schema --architectures: {output} {err}", file=sys.stderr)
        return 2
    atomic_write_bytes(output, text.encode())
    print(f"wrote {output}")
    return 0


def _cmd_fetch(args: argparse.Namespace) -> int:
    from anysr.dataset_sources import SOURCES

    if args.list or not args.name:
        for source in SOURCES.values():
            pins = ("made from " + ", ".join(source.needs) if not source.files else "checksums published"
                    if all(f.pinned for f in source.files) else "no published checksum")
            size = source.size_note if any(c.isdigit() for c in source.size_note) or not source.files else \
                f"{source.size_note} (size not published)"
            print(f"{source.name:10s} {source.what}; {size}; {pins}; licence: {source.licence}")
        if not args.list:
            print("anysr prepare fetch: give a dataset NAME from the list above", file=sys.stderr)
            return 2
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from anysr.engine.prepare.fetch import fetch_dataset

    report = fetch_dataset(args.name, args.root, mirror=args.mirror, prepare=not args.no_prepare)
    counts = (f"{len(report.downloaded)} downloaded, {len(report.verified)} already verified, "
              f"{len(report.extracted)} extracted, {len(report.steps_run)} preparation step(s) run, "
              f"{len(report.steps_skipped)} already done")
    print(f"{report.name} in {report.root}: {counts}")
    if report.pinned_locally:
        print(f"no published checksum for {', '.join(report.pinned_locally)}: their sha256 is now the local pin in "
              f"{report.root / 'downloads' / 'pins.json'}")
    for path in report.provides:
        print(f"  {path}")
    return 0


def cmd_prepare(args: argparse.Namespace) -> int:
    from anysr.engine.prepare import command as prepare

    if args.what == "fetch":
        return _cmd_fetch(args)
    if args.what == "lr":
        out = prepare.prepare_lr(args.hr, args.out, args.scale)
        print(f"wrote {len(out)} LR image(s) (x{args.scale}) to {args.out}")
    elif args.what == "subimages":
        report = prepare.extract_subimages(args.input, args.output, args.crop_size, args.step, args.thresh_size,
                                           n_thread=args.n_thread)
        skipped = (f"; skipped {len(report.skipped)} image(s) smaller than --crop-size {args.crop_size}: "
                   + ", ".join(p.name for p in report.skipped[:5]) + (" ..." if len(report.skipped) > 5 else "")
                   if report.skipped else "")
        print(f"wrote {len(report.written)} sub-image(s) from {report.images} image(s) to {args.output}{skipped}")
    elif args.what == "degrade":
        opt = load_command_options(args.opt, args.force_yml, is_train=True)
        report = prepare.degrade_samples(opt, args.out, args.n, where=args.degrade_in, frames=args.frames)
        how = ("(read from the dataset)" if report.where == "dataset" else
               f"(synthesised in the {report.where}), their kernels")
        print(f"wrote {report.pairs} LQ/GT pair(s) as the training step sees them {how} and degrade.json to "
              f"{report.out}")
    elif args.what == "shards":
        report = prepare.make_shards(args.src, args.out, lq=args.lq, filename_tmpl=args.filename_tmpl,
                             shard_bytes=args.shard_size, shard_samples=args.samples_per_shard,
                             storage_options=args.storage_options)
        print(f"wrote {report.samples} sample(s) in {report.shards} shard(s) ({report.bytes / 2**20:.1f} MiB) and "
              f"{report.index}; train on it with io_backend: {{type: shards}} and dataroot_gt: {args.out}")
    else:
        out = prepare.make_lmdb(args.input, args.output, compress_level=args.compress_level)
        count = len((out / "meta_info.txt").read_text().splitlines())
        print(f"wrote {count} image(s) to {out} (and {out / 'meta_info.txt'})")
    return 0


# ---------------------------------------------------------------------- parser
_BYTE_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 10**6, "mb": 10**6, "mib": 1 << 20,
               "g": 10**9, "gb": 10**9, "gib": 1 << 30}


def _byte_size(text: str) -> int:
    """``512MB``, ``1GiB``, ``100000`` -> bytes (argparse type)."""
    number = text.strip()
    digits = number.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ")
    unit = number[len(digits):].strip().lower()
    try:
        value = float(digits) * _BYTE_UNITS[unit]
    except (KeyError, ValueError):
        raise argparse.ArgumentTypeError(f"'{text}' is not a size; write e.g. 512MB, 1GiB or 100000") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"'{text}': must be at least 1 byte")
    return int(value)


def _json_object(text: str) -> dict[str, Any]:
    """A JSON object (argparse type)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}); write e.g. '{{\"endpoint_url\": \"http://host:9000\"}}'") \
            from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object ({...})")
    return value


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help that shows each optional argument's default (required ones and unset defaults are left alone)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.required or action.default in (None, argparse.SUPPRESS) or "%(default)" in text \
                or not action.option_strings or isinstance(action, argparse._HelpAction):  # noqa: SLF001
            return text
        return f"{text} (default: %(default)s)"


TRAIN_OVERRIDES = "train.total_iter=1000 datasets.train.gt_size=96"
TEST_OVERRIDES = "path.pretrain_network_g=experiments/NAME/models/net_g_latest.safetensors val.save_img=false"


def _add_opt_args(p: argparse.ArgumentParser, launcher: bool = True, example: str = TRAIN_OVERRIDES) -> None:
    p.add_argument("-opt", "--opt", required=True, help="YAML options file (BasicSR style)")
    p.add_argument("--force_yml", "--force-yml", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help=f"override options, e.g. {example}")
    if launcher:
        p.add_argument("--launcher", default="auto", choices=LAUNCHERS,
                       help="auto: join torchrun when its variables are set, else start workers ourselves")
        p.add_argument("--local_rank", "--local-rank", type=int, default=0, help=argparse.SUPPRESS)


def _add_offline(p: argparse.ArgumentParser) -> None:
    p.add_argument("--offline", action="store_true",
                   help="never download the standard weight files losses and metrics read (VGG, LPIPS, DISTS, FID "
                        "Inception): use torch hub's cache or the paths given (as ANYSR_OFFLINE=1)")


def _train_parser(sub: Any) -> None:
    """``anysr train``."""
    p = sub.add_parser("train", help="train from an options file", description="Train from a BasicSR-style "
                       "options file on the accelerator it names (workers are started for you).")
    _add_opt_args(p)
    p.add_argument("--auto_resume", "--auto-resume", action="store_true",
                   help="continue from the newest good training state of this experiment")
    p.add_argument("--data", metavar="DIR", default=None,
                   help="train the file's train dataset on the images in DIR (ground truth; the LQ is made from "
                        "them: MATLAB bicubic for paired sets, the file's degradations for Real-ESRGAN's); the "
                        "file's other settings, validation sets included, are kept")
    p.add_argument("--start-over", "--start_over", action="store_true",
                   help="train from scratch in an experiment folder that holds a previous run: its files are first "
                        "moved to <experiment>/archived_<time>/ (nothing is deleted; files of your own there stay)")
    p.add_argument("--debug", action="store_true", help="accepted for BasicSR compatibility")
    _add_offline(p)
    p.set_defaults(func=cmd_train)


def _test_parser(sub: Any) -> None:
    """``anysr test``."""
    p = sub.add_parser("test", help="score a trained network on the test datasets of an options file",
                       description="Run the network of an options file (path.pretrain_network_g) over its test "
                       "datasets (datasets.test*, val*), save the results and score them with val.metrics; "
                       "writes results/<name>/summary.json and test.log.")
    _add_opt_args(p, example=TEST_OVERRIDES)
    p.add_argument("--precision", default=None, choices=PRECISION_CHOICES,
                   help="autocast precision (default fp32: scores that compare across machines and with published "
                        "tables; auto: bf16 where the device runs it natively)")
    _add_offline(p)
    p.set_defaults(func=cmd_test)


def _infer_parser(sub: Any) -> None:
    """``anysr infer``."""
    p = sub.add_parser("infer", help="upscale an image or a folder of images",
                       description="Upscale images with a trained network (tiled on request): an alpha channel is "
                       "kept, 16-bit images stay 16-bit, any final scale (--outscale), weight interpolation between "
                       "two checkpoints (--dni).")
    p.add_argument("--weights", help=".safetensors or BasicSR .pth weights (an anysr file says which network it "
                   "holds; other files are recognised from their tensors' names and shapes, or give --arch or -opt)")
    p.add_argument("--arch", help="architecture name (e.g. SRVGGNetCompact), or 'bicubic' for MATLAB bicubic")
    p.add_argument("--arch-opt", "--arch_opt", nargs="+", action="extend", default=[], metavar="K=V",
                   help="architecture arguments, e.g. num_conv=16 upscale=4 act_type=prelu")
    p.add_argument("-opt", "--opt", help="options file whose network_g describes the network")
    p.add_argument("--force_yml", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help=argparse.SUPPRESS)
    p.add_argument("-i", "--input", required=True, help="image file or folder; a video file (.mp4, .mkv, ...: needs "
                   "anysr[video]) or, with a video network, a folder of frames")
    p.add_argument("-o", "--output", required=True, help="output folder; or a video file (the source's frame rate "
                   "and audio are kept)")
    p.add_argument("--scale", type=_positive, help="upscaling factor (default: the network's)")
    p.add_argument("--outscale", type=float, default=None,
                   help="final scale, reached by resizing the network's result (e.g. 3.5 with an x4 network; "
                        "default: the network's scale)")
    p.add_argument("--resize", default="bicubic", choices=("bicubic", "area", "cubic", "lanczos"),
                   help="how --outscale resizes: bicubic (MATLAB-exact, antialiased when shrinking) or OpenCV's "
                        "area / cubic / lanczos")
    p.add_argument("--ext", default="png", choices=("png", "auto", "jpg", "webp", "tif", "bmp"),
                   help="result format (auto: the input's); PNG where the format cannot hold the result "
                        "(16 bits, alpha)")
    p.add_argument("--alpha", default="network", choices=("network", "bicubic"),
                   help="how an alpha channel is upscaled: through the network (as a gray image) or MATLAB bicubic")
    p.add_argument("--dni", nargs=2, metavar=("WEIGHTS2", "WEIGHT"), default=None,
                   help="deep network interpolation: WEIGHT x --weights + (1 - WEIGHT) x WEIGHTS2 (two checkpoints "
                        "of one network, e.g. a denoising strength between a strong and a weak model)")
    p.add_argument("--tile", type=_non_negative, default=0,
                   help="tile size in LR pixels (0: whole image); rounded up to the network's window multiple")
    p.add_argument("--tile-pad", "--tile_pad", type=_non_negative, default=10,
                   help="context pixels around each tile")
    p.add_argument("--param-key", "--param_key", default="auto",
                   help="weights group: auto (params_ema, else params, else the file's bare state dict), params_ema "
                        "or params")
    p.add_argument("--suffix", default=None, help="append _SUFFIX to output names")
    p.add_argument("--chunk", type=_non_negative, default=32,
                   help="recurrent video networks: frames kept per pass over a video (0: the whole video at once)")
    p.add_argument("--chunk-pad", "--chunk_pad", type=_non_negative, default=4,
                   help="recurrent video networks: frames of context on each side of a chunk")
    p.add_argument("--fps", type=float, default=None,
                   help="frame rate of a video written from a folder of frames (default 25)")
    p.add_argument("--accelerator", default="auto", choices=ACCELERATORS,
                   help="where the network runs (default auto: XLA when PJRT_DEVICE is set or TPU chips exist, then "
                        "CUDA, MPS, the CPU)")
    p.add_argument("--precision", default="auto", choices=PRECISION_CHOICES,
                   help="autocast precision (default auto: bf16 where the device runs it natively, else fp32)")
    p.add_argument("--channels-last", "--channels_last", action=argparse.BooleanOptionalAction, default=None,
                   help="NHWC memory format for weights and images (default: auto, on where measured faster: "
                        "CPUs, CUDA in bf16/fp16; ignored on XLA)")
    p.add_argument("--backend", default="torch", choices=("torch", "onnxruntime", "openvino", "auto"),
                   help="what runs the network's forward: torch (default), onnxruntime or openvino (CPU, fp32: the "
                        "ONNX export, cached by weights; anysr[onnx] / anysr[openvino]), or auto (the fastest, "
                        "measured once per network and size and cached)")
    p.add_argument("--no-progress", "--no_progress", action="store_true",
                   help="no progress bars (over images, and over the tiles of each image)")
    p.set_defaults(func=cmd_infer)


def _export_parser(sub: Any) -> None:
    """``anysr export``."""
    p = sub.add_parser("export", help="write weights as plain .pth / .safetensors (chaiNNer, ComfyUI) or ONNX",
                       description="Export trained weights: a plain state dict (one group, default params_ema, else "
                       "params) under the original architecture's names, as spandrel-based tools (chaiNNer, "
                       "ComfyUI, A1111) load it, or an ONNX model (fp32 or fp16; dynamic height/width where the "
                       "network allows it, else the fixed --size) checked against onnxruntime (needs anysr[onnx]). "
                       "ECBSR and SPAN are exported in their deployed (folded) form. The format follows each --to "
                       "suffix.")
    p.add_argument("weights", nargs="?", default=None,
                   help="weights file (.safetensors from anysr, or a .pth); default: -opt FILE's "
                        "path.pretrain_network_g")
    p.add_argument("--to", nargs="+", metavar="OUT",
                   help="output files: plain.pth, plain.safetensors, model.onnx (several at once); default with "
                        "-opt FILE holding traiNNer-redux's onnx section: onnx/<name>_<shape>_<dtype>_op<opset>.onnx "
                        "with that section's settings")
    p.add_argument("--arch", help="architecture name, when the file does not say it (anysr files do)")
    p.add_argument("--arch-opt", "--arch_opt", nargs="+", action="extend", default=[], metavar="K=V",
                   help="architecture arguments")
    p.add_argument("-opt", "--opt", help="options file whose network_g describes the network")
    p.add_argument("--force_yml", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help=argparse.SUPPRESS)
    p.add_argument("--param-key", "--param_key", default="auto",
                   help="weights group: auto (params_ema, else params, else the bare state dict), params_ema, params")
    p.add_argument("--fp16", action="store_true", help="half-precision weights (and ONNX inputs/outputs)")
    p.add_argument("--size", type=int, default=None,
                   help="ONNX: input side traced (default 64, rounded up to the window multiple); the fixed size "
                        "when dynamic sizes are not possible")
    p.add_argument("--static", action="store_true", help="ONNX: fixed input size (--size) even where dynamic works")
    p.add_argument("--opset", type=int, default=17, help="ONNX opset")
    p.add_argument("--no-check", "--no_check", action="store_true",
                   help="ONNX: skip the onnxruntime comparison (and the dynamic-size check)")
    p.set_defaults(func=cmd_export)


def _bench_parser(sub: Any) -> None:
    """``anysr bench``."""
    p = sub.add_parser("bench", help="time training steps and inference of an options file's model",
                       description="Time the training step (real model, optimiser and loss on a synthetic batch of "
                       "the configured size: compute only, no data loading) and inference, on one worker of the "
                       "accelerator the options name.")
    _add_opt_args(p, launcher=False)
    p.add_argument("--iters", type=int, default=10, help="timed training iterations (default 10)")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (default 3)")
    p.add_argument("--infer-size", "--infer_size", type=int, default=256,
                   help="LR input size (pixels, square) for the inference timing; 0 skips it (default 256)")
    p.add_argument("--infer-iters", "--infer_iters", type=int, default=None,
                   help="timed inference runs (default: --iters)")
    p.add_argument("--precision", default=None, choices=PRECISION_CHOICES,
                   help="autocast precision (default: the options' train.precision, auto unless set)")
    p.add_argument("--json", default=None, help="also write the results as JSON")
    p.add_argument("--beside", type=int, default=0, metavar="N",
                   help="also run N more copies of the same bench at once (as other users' jobs would) and show "
                   "each one's step time against one alone: how this machine shares its cores (training only)")
    p.add_argument("--remeasure", action="store_true",
                   help="time the precision / memory-format choices again instead of reading them from the "
                   "calibration cache (choices.json), and keep the new ones: what the next training run of this "
                   "file uses (ANYSR_REMEASURE=1 does the same for any command)")
    _add_offline(p)
    p.set_defaults(func=cmd_bench)


def _eval_parser(sub: Any) -> None:
    """``anysr eval``."""
    p = sub.add_parser("eval", help="score folders of results against ground truth (PSNR, SSIM, NIQE, LPIPS, ...)",
                       description="Pair the images of --sr with those of --gt by file stem and print the metrics "
                       "per image and on average, as BasicSR computes them (MATLAB rgb2ycbcr Y channel, --scale "
                       "pixels shaved at each border, ground truth mod-cropped to the result's size). Several --sr "
                       "folders are compared side by side. LPIPS, DISTS and FID read their weights from the files "
                       "given, else the standard files from torch hub's cache (downloaded once, checked by sha256, "
                       "unless --offline), and run on --accelerator.")
    p.add_argument("--gt", required=True, help="ground-truth folder")
    p.add_argument("--sr", required=True, nargs="+", action="extend",
                   help="results folder(s), matched by file stem; several are compared in one table")
    p.add_argument("--metrics", default="psnr,ssim",
                   help="comma-separated: psnr, ssim, niqe, lpips, dists, raw_dists (neosr's DISTS), topiq, fid "
                        "(BasicSR names work too)")
    p.add_argument("--scale", type=_positive, required=True,
                   help="the results' upscaling factor (sets the default --crop-border)")
    p.add_argument("--crop-border", "--crop_border", type=int, default=None, help="default: the scale")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--y", action="store_true", help="Y channel (default)")
    group.add_argument("--rgb", action="store_true", help="all channels")
    p.add_argument("--json", default=None, help="also write the results (per image) as JSON")
    p.add_argument("--csv", default=None, help="also write one row per folder and image as CSV")
    p.add_argument("--report", default=None, metavar="HTML",
                   help="also write a comparison page (averages, image viewer with zoom and a slider)")
    p.add_argument("--lpips-weights", "--lpips_weights", nargs="+", default=None, metavar="FILE",
                   help="LPIPS: torchvision's alexnet (vgg16) .pth and lpips' alex.pth (vgg.pth); default: "
                        "found by name")
    p.add_argument("--lpips-net", "--lpips_net", default="alex", choices=("alex", "vgg"), help="LPIPS backbone")
    p.add_argument("--dists-weights", "--dists_weights", nargs="+", default=None, metavar="FILE",
                   help="DISTS (and raw_dists): torchvision's vgg16 .pth and DISTS' weights.pt; default: found by "
                        "name")
    p.add_argument("--topiq-weights", "--topiq_weights", nargs="+", default=None, metavar="FILE",
                   help="TOPIQ: IQA-PyTorch's cfanet_fr_kadid_res50-2c4cc61d.pth (required with --metrics topiq)")
    p.add_argument("--fid-weights", "--fid_weights", nargs="+", default=None, metavar="FILE",
                   help="FID: pytorch-fid's pt_inception-2015-12-05-6726825d.pth; default: found by name")
    p.add_argument("--fid-stats", "--fid_stats", default=None, metavar="FILE",
                   help="FID reference statistics (.npz mu/sigma, or BasicSR's .pth mean/cov) instead of --gt's "
                        "images")
    p.add_argument("--accelerator", default="auto", choices=ACCELERATORS,
                   help="where LPIPS, DISTS, TOPIQ and FID run (PSNR, SSIM and NIQE run on the CPU)")
    _add_offline(p)
    p.set_defaults(func=cmd_eval)


def _report_parser(sub: Any) -> None:
    """``anysr report``."""
    p = sub.add_parser("report", help="write report.html of a training run (curves, best checkpoints, images)",
                       description="Write EXPERIMENT/report.html: loss and metric curves, the best-checkpoint table "
                       "and a viewer of the validation crops (bicubic, result, ground truth; synchronised zoom and "
                       "pan, a slider between them). One self-contained file that opens offline; training writes it "
                       "at its end too.")
    p.add_argument("experiment", help="experiment folder (experiments/<name>) or the run's name")
    p.set_defaults(func=cmd_report)


def _schema_parser(sub: Any) -> None:
    """``anysr schema``."""
    p = sub.add_parser("schema", help="print the options' JSON Schema (editor completion and checking)",
                       description="Print the JSON Schema of anysr / BasicSR options files: every key with its "
                       "documentation, choices and default, and the arguments of every registered network, loss, "
                       "optimizer and schedule. Put '# yaml-language-server: $schema=PATH' at the top of an "
                       "options file to get completion and checking in editors (docs/options.schema.json ships it).")
    p.add_argument("-o", "--output", default=None, help="write to this file instead of printing")
    p.add_argument("--markdown", action="store_true",
                   help="the options reference as Markdown instead (what docs/options.md holds)")
    p.add_argument("--architectures", action="store_true",
                   help="the table of registered networks with their upstream repository and licence instead; "
                   "with -o FILE, the table between FILE's markers is replaced (docs/architectures.md)")
    p.set_defaults(func=cmd_schema)


def _prepare_parser(sub: Any) -> None:
    """``anysr prepare`` and its sub-commands, one builder each."""
    p = sub.add_parser("prepare", help="dataset preparation: fetch | lr | subimages | lmdb | shards | degrade",
                       description="Prepare datasets: download the standard ones, bicubic LR images, DIV2K-style "
                       "sub-images, LMDB files, shard sets; show Real-ESRGAN's synthesised training pairs.")
    psub = p.add_subparsers(dest="what", required=True, metavar="WHAT")
    _prepare_fetch_parser(psub)
    _prepare_lr_parser(psub)
    _prepare_subimages_parser(psub)
    _prepare_lmdb_parser(psub)
    _prepare_shards_parser(psub)
    _prepare_degrade_parser(psub)
    p.set_defaults(func=cmd_prepare)


def _prepare_fetch_parser(psub: Any) -> None:
    """``anysr prepare fetch``."""
    fmt = _DefaultsFormatter
    q = psub.add_parser("fetch", help="download, verify, extract and prepare a standard dataset", formatter_class=fmt,
                        description="Download a standard dataset (DIV2K, Flickr2K, OST, LSDIR, the test sets of "
                        "EDSR's benchmark package, REDS, Vimeo90K) from its official URLs into ROOT/downloads, "
                        "resumable (a killed download continues) and verified against its published checksum (or, "
                        "where none is published, against the first download's, recorded in pins.json); extract it "
                        "(unsafe archive members refused) and prepare the sub-images, meta-info files and folders the "
                        "shipped option files name. Rerunning skips what is done. ANYSR_DATASET_MIRROR (a base URL "
                        "holding the files by name) replaces the official URLs.")
    q.add_argument("name", nargs="?", default=None, help="the dataset (see --list)")
    q.add_argument("--root", default="datasets", help="folder that receives the dataset (and downloads/)")
    q.add_argument("--mirror", default=None, help="base URL holding the files by name (default: "
                   "$ANYSR_DATASET_MIRROR, else the official URLs)")
    q.add_argument("--no-prepare", action="store_true", help="stop after download and extraction")
    q.add_argument("--list", action="store_true", help="list the datasets, what they hold, their checksums and "
                   "licences (download sizes where the publishers give them)")


def _prepare_lr_parser(psub: Any) -> None:
    """``anysr prepare lr``."""
    fmt = _DefaultsFormatter
    q = psub.add_parser("lr", help="mod-crop and MATLAB-bicubic downscale a folder of HR images", formatter_class=fmt,
                        description="Crop each HR image to a multiple of --scale and shrink it with MATLAB-exact "
                        "bicubic imresize (the classic benchmark protocol); PNGs named like the HR files.")
    q.add_argument("--hr", required=True, help="folder of HR images")
    q.add_argument("--out", required=True, help="output folder for the LR images")
    q.add_argument("--scale", type=_positive, required=True, help="downscaling factor (2, 3, 4, ...)")


def _prepare_subimages_parser(psub: Any) -> None:
    """``anysr prepare subimages``."""
    fmt = _DefaultsFormatter
    q = psub.add_parser("subimages", help="crop large images into overlapping sub-images (DIV2K style)",
                        formatter_class=fmt,
                        description="Cut every image into --crop-size squares every --step pixels (BasicSR's "
                        "extract_subimages.py layout: <stem>_s001.png ...). All inputs are checked first; images "
                        "smaller than the crop are skipped and counted; the output folder must be new or empty. "
                        "For LR folders divide --crop-size, --step and --thresh-size by the scale.")
    q.add_argument("--input", required=True, help="folder of images")
    q.add_argument("--output", required=True, help="output folder (new or empty)")
    q.add_argument("--crop-size", "--crop_size", type=int, default=480, help="side of each square crop, pixels")
    q.add_argument("--step", type=int, default=240, help="distance between crops, pixels")
    q.add_argument("--thresh-size", "--thresh_size", type=int, default=0,
                   help="add a last crop flush with the border when more than this many pixels are left over")
    q.add_argument("--n-thread", "--n_thread", type=int, default=1, help="threads (OpenCV codes in parallel)")


def _prepare_lmdb_parser(psub: Any) -> None:
    """``anysr prepare lmdb``."""
    fmt = _DefaultsFormatter
    q = psub.add_parser("lmdb", help="pack a folder of images into an LMDB with meta_info.txt", formatter_class=fmt,
                        description="Pack every image of a folder into a BasicSR-layout LMDB (<name>.lmdb with "
                        "data.mdb and meta_info.txt; keys are file stems, values PNG bytes). Needs anysr[lmdb].")
    q.add_argument("--input", required=True, help="folder of images")
    q.add_argument("--output", required=True, help="new output folder ending in .lmdb")
    q.add_argument("--compress-level", "--compress_level", type=int, default=1,
                   help="PNG compression of the stored images, 0 (none) to 9")


def _prepare_shards_parser(psub: Any) -> None:
    """``anysr prepare shards``."""
    fmt = _DefaultsFormatter
    q = psub.add_parser("shards", help="write a folder (or GT/LQ pairs) as WebDataset shards for object storage",
                        formatter_class=fmt,
                        description="Write the images of SRC_FOLDER (with --lq: GT/LQ pairs matched by stem) as "
                        "WebDataset tar shards and index.json (a wids shard index with each member's offset, size and "
                        "CRC-32) under OUT: a new local folder or an fsspec URL (s3://bucket/set, gs://bucket/set). "
                        "Samples are keyed by the GT file stem (a folder of clip folders: each frame by its path, "
                        "clip/frame); the files' bytes are stored unchanged (16-bit PNGs "
                        "stay 16-bit). Train on it with io_backend: {type: shards} and dataroot_gt: OUT. Needs "
                        "anysr[shards].")
    q.add_argument("src", metavar="SRC_FOLDER", help="folder of (GT) images, or of clip folders")
    q.add_argument("out", metavar="OUT", help="new output folder or URL")
    q.add_argument("--lq", default=None, help="folder of LQ images (or clips) paired with SRC_FOLDER's by stem")
    q.add_argument("--filename-tmpl", "--filename_tmpl", default="{}",
                   help="LQ stem from the GT stem, e.g. '{}x4' (with --lq)")
    q.add_argument("--shard-size", "--shard_size", type=_byte_size, default="512MB",
                   help="close a shard before it passes this size (bytes, or with kB/MB/GB)")
    q.add_argument("--samples-per-shard", "--samples_per_shard", type=int, default=None,
                   help="close a shard after this many samples (default: only by size)")
    q.add_argument("--storage-options", "--storage_options", type=_json_object, default=None,
                   help="fsspec options for OUT as JSON, e.g. '{\"endpoint_url\": \"http://127.0.0.1:9000\"}'")


def _prepare_degrade_parser(psub: Any) -> None:
    """``anysr prepare degrade``."""
    fmt = _DefaultsFormatter
    q = psub.add_parser("degrade", help="write the LQ/GT pairs an options file trains on",
                        formatter_class=fmt,
                        description="Write the first N training pairs of a training options file exactly as the "
                        "training step sees them (the same sampler, seeds, crops and flips, batch augmentations) as "
                        "NNNN_lq.png / NNNN_gt.png and degrade.json (index, seed, iteration and source of each pair). "
                        "RealESRNetModel / RealESRGANModel with high_order_degradation: true synthesise them (the same "
                        "degradations, crop and pair pool; on the CPU), with the three blur kernels of each pair as "
                        "images and every draw in degrade.json; MMRealSRNetModel / MMRealSRGANModel write the five "
                        "versions of each pair (NNNN_lq_origin/_lq_blur/_lq_noise/_anchor_clean/_anchor_degraded.png) "
                        "and its seven kernels; video datasets write a few frames of each clip (NNNN_lq_fTT.png).")
    _add_opt_args(q, launcher=False)
    q.add_argument("--out", required=True, help="output folder (new or empty)")
    q.add_argument("-n", type=int, default=16, help="pairs to write")
    q.add_argument("--degrade-in", "--degrade_in", default=None, choices=("auto", "step", "loader"),
                   help="where the synthesis runs (default: the options' degrade_in; Real-ESRGAN synthesis only)")
    q.add_argument("--frames", type=int, default=3, help="frames written of each video clip (around its centre)")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one small builder per command (``_train_parser``, ...), in the order ``--help`` lists
    them."""
    parser = argparse.ArgumentParser(
        prog="anysr", description="Train, test, run and export super-resolution / restoration networks on CPU, "
        "CUDA, MPS or XLA (TPU), from BasicSR-style option files. `anysr COMMAND --help` for each command; "
        "`python -m anysr.train -opt FILE.yml` works too.")
    parser.add_argument("--version", action="version", version=f"anysr {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_train_parser, _test_parser, _infer_parser, _export_parser, _bench_parser, _eval_parser,
                _report_parser, _schema_parser, _prepare_parser):
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; errors anysr raises on purpose print as one message and exit with status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "offline", False):
        os.environ["ANYSR_OFFLINE"] = "1"  # read where the weights are resolved, in this process and its workers
    try:
        return int(args.func(args) or 0)
    except AlreadyReported as exc:  # a worker said it already
        return exc.exit_code
    except Interrupted as exc:
        print(f"anysr {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except AnysrError as exc:
        return _fail(args.command, str(exc))
    except OSError as exc:  # a full disk, a read-only folder, a name too long: what users and machines cause
        return _fail(args.command, describe_os_error(exc))
    except MemoryError:
        return _fail(args.command, "out of memory; use --tile (inference) or a smaller batch_size_per_gpu / "
                     "gt_size (training)")
    except KeyboardInterrupt:
        print(f"anysr {args.command}: interrupted", file=sys.stderr)
        return 130


def _fail(command: str, message: str) -> int:
    logging.getLogger("anysr").handlers.clear()
    print(f"anysr {command}: error: {message}", file=sys.stderr)
    return 2


def train_main() -> None:
    """``python -m anysr.train -opt F`` (BasicSR habit)."""
    sys.exit(main(["train", *sys.argv[1:]]))


def test_main() -> None:
    """``python -m anysr.test -opt F``."""
    sys.exit(main(["test", *sys.argv[1:]]))


if __name__ == "__main__":
    sys.exit(main())

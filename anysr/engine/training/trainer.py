"""The training loop: iterations, logging, validation, atomic checkpoints and exact resume."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from anysr.accelerators import Accelerator
from anysr.accelerators.process import Interrupted, signal_name
from anysr.archs.arch_util import input_channels
from anysr.atomic import atomic_write_bytes, atomic_write_json
from anysr.data import build_dataset, build_eval_loader, build_train_loader
from anysr.data.imageio import write_image
from anysr.data.transforms import image_grid, lq_patch_size, tensor2img
from anysr.engine import checkpoint as ckpt
from anysr.engine.evaluation.evaluator import EvalResult, evaluate
from anysr.engine.evaluation.val_metrics import ValMetrics
from anysr.engine.inference.export import save_deployable
from anysr.engine.logger import MetricWriter, Progress, Timer, format_eta, get_logger, log_start, setup_logging
from anysr.engine.report.history import CROPS_DIR, HISTORY_NAME, History, save_crops
from anysr.engine.report.pair_samples import save_training_pairs
from anysr.engine.report.run_report import REPORT_NAME, write_report
from anysr.engine.training.nan_recovery import NONE_BAD, Recovery, decode_bad, describe
from anysr.engine.training.runlock import RunLock
from anysr.errors import (
    SPACE_ERRNOS,
    AnysrError,
    CheckpointError,
    DataError,
    OptionError,
    TrainingError,
    describe_os_error,
    everywhere,
)
from anysr.models import build_model


def train_worker(acc: Accelerator, opt: dict[str, Any], auto_resume: bool, start_over: bool = False) -> dict[str, Any]:
    """Entry point of every training worker (``launch`` calls it once per rank)."""
    return Trainer(opt, acc, auto_resume=auto_resume, start_over=start_over).fit()


@dataclass
class _Run:
    """The training loop's moving parts (device-side loss sums and NaN tracker, timers, output).

    ``first_bad``: ``iteration * 4 + (1: loss, 2: gradient norm)`` of the first non-finite value since the last
    check (``NONE_BAD`` while none), on the device; ``data_pos``: data-stream iterations drawn; ``snapshot``: the
    last good state on the host (NaN recovery); ``poison``: device scalars 1 and NaN (``inject_at``)."""

    stream: Iterator[tuple[int, dict[str, Any]]]
    writer: MetricWriter | None
    print_freq: int
    save_freq: int
    val_freq: int
    dev_iter: torch.Tensor
    first_bad: torch.Tensor
    bar: Progress
    epoch: int = 0
    running: dict[str, torch.Tensor] = field(default_factory=dict)
    count: int = 0
    timer: Timer = field(default_factory=Timer)
    window: Timer = field(default_factory=Timer)
    wall0: float = field(default_factory=time.perf_counter)
    t_end: float = field(default_factory=time.perf_counter)
    data_pos: int = 0
    snapshot: dict[str, Any] | None = None
    poison: tuple[torch.Tensor, torch.Tensor] | None = None
    rewarm: bool = False


class Trainer:
    """One worker's training run. Rank state lives in ``acc``; only the main rank writes files."""

    def __init__(self, opt: dict[str, Any], acc: Accelerator, *, auto_resume: bool = False,
                 start_over: bool = False) -> None:
        self.opt = opt
        self.acc = acc
        self.auto_resume = auto_resume
        self.start_over = start_over
        self._lock: RunLock | None = None
        self._last_saved = -1
        p = opt.path
        self.exp_dir = Path(p.experiments_root)
        self.models_dir = Path(p.models)
        self.states_dir = Path(p.training_states)
        self.vis_dir = Path(p.visualization)
        self.log_dir = Path(p.log)
        self.train_opt = opt.train
        self.log_opt = opt.logger
        self.val_opt = opt.val
        self.total_iter = int(self.train_opt.total_iter)
        self.accumulate = int(self.train_opt.accumulate)
        self.train_key = next(k for k in opt.datasets if k.startswith("train"))
        self.best: dict[str, dict[str, dict[str, float]]] = {}
        self.last_val: dict[str, dict[str, float]] = {}
        self.last_losses: dict[str, float] = {}
        self.history = History()  # losses and metrics over time, for report.html (main rank writes it)
        self.nan_opt = self.train_opt.nan_recovery
        self.recovery = Recovery()  # NaN recoveries so far (in the training state)
        self.val_metrics: ValMetrics | None = None
        self.log = get_logger()

    # ------------------------------------------------------------------ set-up
    def _prepare_dirs(self) -> tuple[Path, dict[str, Any]] | None:
        """Lock the experiment folder, start the log, and find the state to resume from.

        The main rank decides (nothing is ever overwritten: a folder holding states or weights is only continued,
        or moved aside with --start-over); every rank gets the decision, or the same error.
        """
        decision: dict[str, Any] = {"error": None, "resume": None}
        if self.acc.is_main:
            try:
                decision["resume"] = self._claim_folder()
            except AnysrError as exc:
                decision["error"] = str(exc)
            except OSError as exc:  # a read-only or non-folder output path, a name too long for the file system
                decision["error"] = describe_os_error(exc)
        else:
            setup_logging(enabled=False)
        decision = self.acc.strategy.broadcast_object(decision)
        if decision["error"]:
            raise everywhere(OptionError(decision["error"]))
        chosen = decision["resume"]
        return (Path(chosen), ckpt.load_training_state(chosen)) if chosen else None

    def _claim_folder(self) -> str | None:
        """Main rank: take the folder's lock, set up the log file, apply --start-over, pick the resume state."""
        self._lock = RunLock(self.exp_dir, what="training").acquire()
        for d in (self.exp_dir, self.models_dir, self.states_dir, self.vis_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        setup_logging(self.log_dir / f"train_{self.opt.name}_{time.strftime('%Y%m%d_%H%M%S')}.log")
        if self.start_over:
            self._archive_previous()
        ckpt.clean_stale_temps(self.states_dir)
        ckpt.clean_stale_temps(self.models_dir)
        resume_path = self.opt.path.resume_state
        if resume_path:
            if Path(resume_path).suffix in (".safetensors", ".pth", ".pt"):
                raise OptionError(f"path.resume_state: {resume_path} is a weights file, not a training state; give "
                                  "<experiment>/training_states/<iter>.state, or load the weights with "
                                  "path.pretrain_network_g")
            return str(resume_path)
        existing = ckpt.list_training_states(self.states_dir)
        if self.auto_resume:
            hit = ckpt.find_resume_state(self.states_dir, warn=self.log.warning)
            if hit:
                return str(hit[0])
        elif existing:
            raise OptionError(f"{self.exp_dir} already holds training states (newest: iteration {existing[-1][0]}); "
                              "pass --auto_resume to continue that run, --start-over to move its files aside and "
                              "train again, or choose another `name` (nothing was changed)")
        weights = sorted(p.name for p in self.models_dir.iterdir() if p.suffix in (".safetensors", ".pth"))
        if weights:
            why = ("no usable training state is left to continue from" if existing or self.auto_resume
                   else "it holds no training state")
            shown = ", ".join(weights[:4]) + (f" and {len(weights) - 4} more" if len(weights) > 4 else "")
            raise OptionError(f"{self.models_dir} holds trained weights ({shown}) but {why}: training from "
                              "iteration 0 would overwrite them. Start from them in a new run (another `name` with "
                              "path.pretrain_network_g), or pass --start-over to move the old files aside first "
                              "(nothing was changed)")
        return None

    def _archive_previous(self) -> None:
        """--start-over: move what a previous run wrote in the folder to ``archived_<time>/``; files of the user's
        own there (notes, an options file) stay where they are."""
        for d, option in ((self.states_dir, "path.training_states"), (self.models_dir, "path.models")):
            if d.parent == self.exp_dir or not d.is_dir():
                continue
            held = sorted(p.name for p in d.iterdir() if p.is_file() and p.suffix in (".state", ".safetensors", ".pth"))
            if held:  # only what is inside the experiment folder is moved: refuse before moving anything
                raise OptionError(f"--start-over: {option} {d} is outside {self.exp_dir} and holds {len(held)} "
                                  f"file(s) of a previous run ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''})"
                                  f" that it would not move aside; move them away yourself or point {option} at an "
                                  "empty folder (nothing was changed)")
        ours = {HISTORY_NAME, REPORT_NAME, CROPS_DIR, "summary.json", "tb_logger"}
        ours |= {d.name for d in (self.models_dir, self.states_dir, self.vis_dir, self.log_dir)
                 if d.parent == self.exp_dir}
        old = [p for p in self.exp_dir.iterdir()
               if (p.name in ours or (p.name.startswith("options_") and p.suffix == ".yml"))
               and not (p.is_dir() and not any(p.iterdir()))]
        if not old:
            return
        target = self.exp_dir / f"archived_{time.strftime('%Y%m%d_%H%M%S')}"
        target.mkdir()
        for p in old:
            p.rename(target / p.name)
        for d in (self.models_dir, self.states_dir, self.vis_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        # the log file of this run was opened before the move: start it again in the fresh log folder
        setup_logging(self.log_dir / f"train_{self.opt.name}_{time.strftime('%Y%m%d_%H%M%S')}.log")
        self.log.info("--start-over: moved the previous run's files (%s) to %s",
                      ", ".join(sorted(p.name for p in old)), target)

    def _calibrate(self, recorded: object = None) -> None:
        """Let the accelerator time its open choices (auto on a CPU) on the generator with the training shape
        (``recorded``: a resumed run's precision / memory format, kept)."""
        dopt = self.opt.datasets[self.train_key]
        if not dopt.gt_size:
            return
        net = self.model.nets["net_g"]
        lq = lq_patch_size(int(dopt.gt_size), int(self.opt.scale))
        batch = int(dopt.batch_size_per_gpu) * self.acc.batch_multiplier
        self.acc.calibrate(net, self.model.input_shape(batch, input_channels(net) or 3, lq), train=True,
                           recorded=recorded)

    def _record_options(self) -> None:
        """Keep the options of this run as ``options_<time>.yml``, unless the newest one already says the same."""
        text = yaml.safe_dump(self.opt.to_dict(), sort_keys=False)
        previous = sorted(self.exp_dir.glob("options_*.yml"))
        if previous and previous[-1].read_text(encoding="utf-8") == text:
            return
        stamp = time.strftime("%Y%m%d_%H%M%S")
        path, n = self.exp_dir / f"options_{stamp}.yml", 1
        while path.exists():  # two changed runs within one second: keep both
            n += 1
            path = self.exp_dir / f"options_{stamp}_{n}.yml"
        atomic_write_bytes(path, text.encode())

    def _load_model_state(self, path: Path, state: dict[str, Any]) -> None:
        """The model's part of a training state, refused with the first differences when the networks changed."""
        fix = ("network_g (or network_d) changed since it was saved: restore those options, or start a new run "
               "(another `name`, with path.pretrain_network_g to start from its weights)")
        for name, sd in state["nets"].items():
            if name not in self.model.nets:
                raise CheckpointError(f"{path} holds a network '{name}' this run's model has not; {fix}")
            problems, _ = ckpt.state_dict_mismatch(self.model.bare(name).state_dict(), sd)
            if problems:
                raise CheckpointError(f"{path} does not fit this run's {name}: {'; '.join(problems)}. Cause: {fix}")
        try:
            self.model.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0][:300]
            raise CheckpointError(f"{path} does not fit this run's model ({first}); the optimisers changed since it "
                                  "was saved: restore them, or start a new run (another `name`)") from None

    def _check_resumable(self, path: Path, state: dict[str, Any]) -> None:
        """Options that decide the data stream and the optimisers must match the run being resumed."""
        now = self._run_signature()
        then = state["signature"] if "signature" in state else {}
        changed = [f"{k} ({then[k]} there, {now[k]} now)" for k in now if k in then and then[k] != now[k]]
        if changed:
            raise OptionError(f"cannot resume {path}: " + "; ".join(changed) + ". Restore them (the data position "
                              "and optimiser state depend on them), or start a new run with another `name`")

    def _run_signature(self) -> dict[str, Any]:
        dopt = self.opt.datasets[self.train_key]
        return {
            "train.accumulate": self.accumulate,
            "global batch (batch_size_per_gpu x ranks)": int(dopt.batch_size_per_gpu) * self.acc.batch_multiplier
            * self.acc.world_size,
            f"datasets.{self.train_key}.dataset_enlarge_ratio": int(dopt.dataset_enlarge_ratio),
            "manual_seed": int(self.opt.manual_seed),
            "model_type": self.opt.model_type,
            "network_g.type": self.opt.network_g.type,
            "train.optim_g.type": self.train_opt.optim_g.type,
        }

    def _build_data(self) -> None:
        datasets, key = self.opt.datasets, self.train_key
        dopt = datasets[key]
        self.train_set = build_dataset(dopt, f"datasets.{key}")
        self.model.prepare_train_set(self.train_set)
        # A dataset that can hand its per-sample work to the training process (BSRGANDataset's degrade_in: step)
        # returns the stage applied to each of its batches on the device; before the loader starts its workers.
        place = getattr(self.train_set, "place_synthesis", None)
        self.batch_stage = place(self.acc.static_shapes) if place is not None else None
        self.train_loader, self.sampler = build_train_loader(
            self.train_set, dopt, batch_size=int(dopt.batch_size_per_gpu) * self.acc.batch_multiplier,
            world_size=self.acc.world_size, rank=self.acc.rank, seed=int(self.opt.manual_seed),
            key_path=f"datasets.{key}")
        self.batches_per_epoch = self.sampler.batches_per_epoch
        self.val_loaders: list[tuple[str, Any]] = []
        val_sets = []
        if self.val_opt:
            for name, vopt in datasets.items():
                if name.startswith("val"):
                    ds = build_dataset(vopt, f"datasets.{name}")
                    loader, _ = build_eval_loader(ds, vopt, world_size=self.acc.world_size, rank=self.acc.rank)
                    self.val_loaders.append((vopt.name, loader))
                    val_sets.append((name, ds))
        self._check_data([(key, self.train_set, False), *((k, ds, True) for k, ds in val_sets)])
        for _, ds in val_sets:
            if len(ds) > 0:  # type: ignore[arg-type]
                ds[0]  # one item through the whole pipeline too, before any training

    def _check_data(self, sets: list[tuple[str, Any, bool]]) -> None:
        """Every image of every set checked before training (train: headers; val: decoded), all problems at once.

        Done by the main rank, in parallel threads; every rank gets the verdict."""
        problems: list[str] = []
        if self.acc.is_main:
            for key, ds, decode in sets:
                check = getattr(ds, "check", None)
                if check is not None:
                    problems += [f"datasets.{key}: {p}" for p in check(decode=decode)]
                if decode:
                    problems += [f"datasets.{key}: {p}" for p in self._cropped_away(ds)]
        problems = self.acc.strategy.broadcast_object(problems)
        if problems:
            more = f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else ""
            raise everywhere(DataError(f"{len(problems)} problem(s) found in the datasets before training (nothing "
                                       "was trained):\n  " + "\n  ".join(problems[:20]) + more))

    def _cropped_away(self, ds: Any) -> list[str]:
        """Validation images a metric's ``crop_border`` leaves nothing of (the first validation would fail, with
        every iteration before it lost)."""
        cropped_away = getattr(ds, "cropped_away", None)
        metrics = self.val_opt.metrics if self.val_opt else None
        if cropped_away is None or not metrics:
            return []
        problems = []
        for name, metric in metrics.items():
            border = int(metric.get("crop_border") or 0)
            gone = cropped_away(border) if border else []
            if gone:
                path, side = gone[0]
                more = f" (and {len(gone) - 1} more)" if len(gone) > 1 else ""
                problems.append(f"{path}{more} is {side} pixels on its shorter side, and val.metrics.{name}."
                                f"crop_border {border} crops that much from each side: nothing is left to score; "
                                f"lower crop_border to at most {(side - 1) // 2}, or remove the image")
        return problems

    def _batch_stream(self, start_batch: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """(epoch, batch) forever from global batch position ``start_batch``: no replay to resume."""
        epoch, offset = divmod(start_batch, self.batches_per_epoch)
        seed = int(self.opt.manual_seed)
        while True:
            self.sampler.set_epoch(epoch, start_batch=offset)
            # The loader's own generator (worker base seeds) must not draw from the global RNG.
            self.train_loader.generator = torch.Generator().manual_seed((seed * 1000003 + epoch) % 2**64)
            for batch in self.acc.prepare_loader(self.train_loader):
                yield epoch, batch
            epoch, offset = epoch + 1, 0

    # ------------------------------------------------------------------ the run
    def fit(self) -> dict[str, Any]:
        try:
            return self._fit()
        finally:
            if self._lock is not None:
                self._lock.release()

    def _fit(self) -> dict[str, Any]:
        try:
            start = self._set_up()
        except AnysrError as exc:
            raise everywhere(exc) from None  # set-up reads the same options and files on every rank: said once
        if isinstance(start, dict):
            return start  # nothing to do
        writer = None
        if self.acc.is_main:
            tb_dir = self.exp_dir / "tb_logger" if self.log_opt.use_tb_logger else None
            writer = MetricWriter(tb_dir=tb_dir, wandb_opt=self.log_opt.wandb, run_name=self.opt.name,
                                  config=self.opt.to_dict())
        try:
            return self._loop(start, writer)
        finally:
            if writer is not None:
                writer.close()

    def _set_up(self) -> int | dict[str, Any]:
        """Folder, model, resume state and data: the iteration to start from (a summary when already done)."""
        acc = self.acc
        resume = self._prepare_dirs()
        if acc.is_main:
            self._record_options()
        if resume is not None:
            note = acc.resume_threads(resume[1].get("threads"))  # before calibrating: timings depend on it
            if note is not None:
                self.log.info("host threads: %s", note)

        acc.manual_seed(int(self.opt.manual_seed))
        self.model = build_model(self.opt, acc)
        for line in ckpt.load_model_weights(self.model, fresh=resume is None):
            self.log.info(line)
        self._calibrate(resume[1].get("accelerator", {}).get("variant") if resume is not None else None)
        if resume is None:  # a job that started while this one calibrated shares the cores from the first step on
            note = acc.rebalance_threads()
            if note is not None:
                self.log.info("host threads: %s", note)
        log_start(f"training '{self.opt.name}'", acc)
        if self.opt.network_recognised:
            self.log.info("network_g.type auto: %s", self.opt.network_recognised)
        if self.opt.mapped_keys:
            what = "network presets expanded" if self.opt.mapped_keys_from == "presets" else \
                f"{self.opt.mapped_keys_from} keys mapped"
            self.log.info("%s: %s", what, "; ".join(self.opt.mapped_keys))
        self.model.setup()

        start_iter = 0
        if resume is not None:
            path, state = resume
            self._check_resumable(path, state)
            self._load_model_state(path, state["model"])
            acc.precision.load_state_dict(state["accelerator"])
            acc.set_rng_state(state["rng"])
            start_iter = int(state["iter"])
            self.best = state["best"]
            self.recovery.load_state_dict(state.get("nan_recovery"))
            if acc.is_main:
                self.history = History.load(self.exp_dir)
                self.history.truncate(start_iter)  # what comes after is replayed
                self.history.events = [dict(e) for e in self.recovery.events]  # the state's record decides
            self.log.info("resumed from %s at iteration %d", path, start_iter)
            if start_iter > self.total_iter:
                raise OptionError(f"train.total_iter: {self.total_iter} is below the iteration being resumed "
                                  f"({start_iter} in {path}); raise train.total_iter to continue")
            if start_iter == self.total_iter:
                self.log.info("nothing to do: %s is already at train.total_iter=%d (raise it to train longer)",
                              path, self.total_iter)
                return {"iterations_done": start_iter, "total_iter": self.total_iter, "finished": True}

        if self.val_opt and self.val_opt.metrics:
            self.val_metrics = ValMetrics(self.val_opt.metrics, acc)  # weight files read once, on every rank
        self._build_data()
        return start_iter

    def _loop(self, start_iter: int, writer: MetricWriter | None) -> dict[str, Any]:
        acc = self.acc
        val_freq = int(self.val_opt.val_freq or 0) if self.val_opt else 0
        data_pos = self.recovery.data_iter(start_iter)
        run = _Run(stream=self._batch_stream(data_pos * self.accumulate), writer=writer,
                   print_freq=int(self.log_opt.print_freq), save_freq=int(self.log_opt.save_checkpoint_freq),
                   val_freq=val_freq,
                   dev_iter=torch.full((), start_iter, dtype=torch.int64, device=acc.device),
                   first_bad=torch.full((), NONE_BAD, dtype=torch.int64, device=acc.device),
                   bar=Progress(self.total_iter, start_iter, enabled=acc.is_main), data_pos=data_pos)
        if self.nan_opt.enabled:
            acc.watch_gradients = True
            run.epoch = max(data_pos * self.accumulate - 1, 0) // self.batches_per_epoch
            # the state training starts from is the first good one; its schedules set to it (as a saved state's are)
            self.model.update_learning_rate(start_iter)
            run.snapshot = self._snapshot(start_iter, run.epoch)
        if self.nan_opt.inject_at:  # device data (not constants): the step's graph is the same with either
            run.poison = (torch.tensor(1.0).to(acc.device), torch.tensor(float("nan")).to(acc.device))
        self.log.info("training iterations %d -> %d, %d batches per epoch, global batch %d", start_iter,
                      self.total_iter, self.batches_per_epoch,
                      self.sampler.batch_size * self.sampler.world_size * self.accumulate)
        it = start_iter
        with acc.strategy.stop.graceful_section():  # a signal is acted on between steps: finish, save, exit
            while it < self.total_iter:
                it += 1
                it = self._iteration(it, run)
                self._stop_if_signalled(it, run)
        run.bar.close()
        summary = self.write_summary(it, time.perf_counter() - run.wall0, run.timer, final=True)
        self.log.info("training done: %d iterations in %.1f s", it - start_iter, time.perf_counter() - run.wall0)
        if acc.is_main:
            self._write_report()
        return summary

    def _write_report(self) -> None:
        """history.json and report.html (main rank); a page that cannot be written only costs a warning."""
        try:
            self.history.save(self.exp_dir)
            path = write_report(self.exp_dir)
        except (AnysrError, OSError, ValueError) as exc:
            self.log.warning("report.html not written (%s); try `anysr report %s`", exc, self.exp_dir)
            return
        self.log.info("wrote %s (open it in a browser)", path)

    def _next_batches(self, it: int, run: _Run) -> list[dict[str, Any]]:
        """Iteration ``it``'s micro-batches: past the batches that NaN recoveries skipped; its losses and gradients
        are made NaN when ``train.nan_recovery.inject_at`` names ``it``."""
        target = self.recovery.data_iter(it)
        while run.data_pos < target - 1:  # a skipped iteration's batches: drawn (the same on every rank), not used
            for _ in range(self.accumulate):
                next(run.stream)
            run.data_pos += 1
        batches = []
        for _ in range(self.accumulate):
            run.epoch, batch = next(run.stream)
            batches.append(batch if self.batch_stage is None else self.acc.to_device(self.batch_stage(batch)))
        run.data_pos = target
        if run.poison is not None:  # every backward of the step, and the losses the trainer checks, times 1 or NaN
            self.acc.precision.loss_factor = (run.poison[1] if self.recovery.injects(it, self.nan_opt.inject_at)
                                              else run.poison[0])
        return batches

    def _iteration(self, it: int, run: _Run) -> int:
        """Training iteration ``it`` with its reporting, validation and saving; the iteration the run stands at
        afterwards (``it``, or the one a NaN recovery rolled back to)."""
        acc = self.acc
        self.model.update_learning_rate(it)
        batches = self._next_batches(it, run)
        t_data = time.perf_counter()
        losses = self.model.train_step(batches)
        run.dev_iter = run.dev_iter + 1
        total = sum(losses.values())
        if acc.precision.loss_factor is not None:
            total = total * acc.precision.loss_factor
        code = (~torch.isfinite(total)).long()  # type: ignore[arg-type]
        grads_ok = acc.take_gradients_finite()
        if grads_ok is not None:
            code = code + 2 * (~grads_ok).long()
        run.first_bad = torch.where((code > 0) & (run.first_bad == NONE_BAD), run.dev_iter * 4 + code,
                                    run.first_bad)
        for k, v in losses.items():
            run.running[k] = run.running[k] + v if k in run.running else v
        run.count += 1
        acc.mark_step()
        if run.rewarm:  # the first step after a recovery may compile once (XLA): not a steady-state recompile
            acc.rewarm()
            run.rewarm = False
        now = time.perf_counter()
        run.timer.add(now - run.t_end, t_data - run.t_end)
        run.window.add(now - run.t_end, t_data - run.t_end)
        run.t_end = now
        run.bar.update(1)

        last = it == self.total_iter
        if it % run.print_freq == 0 or last:
            back = self._check_finite(it, run, snapshot=self.nan_opt.snapshot == "print")
            if back is not None:
                return back
            self._report(it, run.epoch, run.running, run.count, run.window, run.writer)
            # Restart the sums as device data (not an empty dict), so the next step's graph is the usual one.
            run.running, run.count = {k: torch.zeros_like(v) for k, v in run.running.items()}, 0
            acc.mark_step()
            run.window.reset()
            run.t_end = time.perf_counter()
        # Validate before saving, so a state saved at this iteration knows this validation's best values.
        if run.val_freq and (it % run.val_freq == 0 or last):
            back = self._check_finite(it, run)
            if back is not None:
                return back
            self.validate(it, run.writer)
            acc.mark_warmup_done()
            run.t_end = time.perf_counter()
        if it % run.save_freq == 0 or last:
            back = self._check_finite(it, run)
            if back is not None:
                return back
            host = self.save(it, run.epoch)
            if self.nan_opt.enabled:
                run.snapshot = self._keep(host)
            run.t_end = time.perf_counter()
        return it

    def _stop_if_signalled(self, it: int, run: _Run) -> None:
        """After a step: when every rank agrees a stop signal came, save a complete state and end the run."""
        signum = self.acc.strategy.stop_signal(it)
        if signum is None:
            return
        back = self._check_finite(it, run)  # a recovery first: the state saved knows it
        it = it if back is None else back
        if self._last_saved != it:
            self.save(it, run.epoch)
        self.write_summary(it, time.perf_counter() - run.wall0, run.timer, final=False)
        raise everywhere(Interrupted(signum, f"{signal_name(signum)}: stopped after iteration {it} and saved "
                                             f"{self.states_dir / f'{it}.state'}; continue with --auto_resume"))

    # ------------------------------------------------------------------ pieces
    def _check_finite(self, it: int, run: _Run, *, snapshot: bool = False) -> int | None:
        """Whether every loss (and watched gradient norm) since the last check was finite, agreed by all ranks
        (one host read). Finite: None (after keeping a snapshot of the state when ``snapshot``). Not: recover
        (``train.nan_recovery``) and return the iteration rolled back to, or stop the run with a one-line error."""
        code = int(self.acc.to_host(self.acc.strategy.all_reduce(run.first_bad, "min")))
        if code >= NONE_BAD:
            if snapshot and self.nan_opt.enabled:
                run.snapshot = self._snapshot(it, run.epoch)
            return None
        bad_iter, what = decode_bad(code)
        nan = self.nan_opt
        if not nan.enabled or self.recovery.retries >= int(nan.max_retries) or run.snapshot is None:
            states = ckpt.list_training_states(self.states_dir) if self.acc.is_main else []
            keep = f"the last good checkpoint is {states[-1][1]}" if states else "no checkpoint was written yet"
            tried = (f" after {self.recovery.retries} recoveries (train.nan_recovery.max_retries: {nan.max_retries})"
                     if nan.enabled else "")
            raise everywhere(TrainingError(
                f"{what} became NaN or infinite at iteration {bad_iter}; training stopped{tried} and {keep} "
                "(nothing newer was saved). Lower train.optim_g.lr, set train.grad_clip_norm, or use "
                "train.precision: fp32"))
        return self._recover(bad_iter, what, it, run)

    def _snapshot(self, it: int, epoch: int) -> dict[str, Any]:
        """The training state at ``it`` as a host copy (NaN recovery's last good state)."""
        self.acc.mark_step()
        return self._keep(self.acc.to_host(self._state(it, epoch, weights=False)))

    @staticmethod
    def _keep(host: dict[str, Any]) -> dict[str, Any]:
        """A private copy of a host state (on the CPU its tensors are the live ones)."""
        return copy.deepcopy({k: v for k, v in host.items() if k != "weights"})

    def _recover(self, bad_iter: int, what: str, it: int, run: _Run) -> int:
        """Roll back to ``run.snapshot``, lower the learning rates, skip ``bad_iter``'s batch: the same on every
        rank (they agreed on ``bad_iter``), and the same in every run (the snapshot and the record decide it)."""
        acc, snap, nan = self.acc, run.snapshot, self.nan_opt
        assert snap is not None
        back = int(snap["iter"])
        state = copy.deepcopy(snap)  # loading may keep the tensors it is given (optimizer state on the CPU)
        self.model.load_state_dict(state["model"])
        acc.precision.load_state_dict(state["accelerator"])
        acc.set_rng_state(state["rng"])
        self.best = state["best"]
        event = self.recovery.record(bad_iter=bad_iter, what=what, detected_at=it, rolled_back_to=back,
                                     factor=float(nan.lr_factor), max_retries=int(nan.max_retries))
        self.model.set_lr_scale(self.recovery.lr_factor)
        self.history.truncate(back)
        self.history.events = [dict(e) for e in self.recovery.events]
        run.stream.close()  # type: ignore[attr-defined]
        run.data_pos = self.recovery.data_iter(back)
        run.stream = self._batch_stream(run.data_pos * self.accumulate)
        run.epoch = int(snap["epoch"])
        run.dev_iter = torch.full((), back, dtype=torch.int64, device=acc.device)
        run.first_bad = torch.full((), NONE_BAD, dtype=torch.int64, device=acc.device)
        run.running, run.count = {k: torch.zeros_like(v) for k, v in run.running.items()}, 0
        acc.take_gradients_finite()
        acc.mark_step()
        run.bar.reset(back)
        run.window.reset()
        run.t_end = time.perf_counter()
        self._last_saved = -1
        run.rewarm = True
        if acc.is_main:  # one line for the job (the other ranks log warnings too)
            self.log.warning(describe(event))
        return back

    def _report(self, it: int, epoch: int, running: dict[str, torch.Tensor], count: int, window: Timer,
                writer: MetricWriter | None) -> None:
        acc = self.acc
        keys = sorted(running)
        # The sums go to the host and are divided there: the window's length is then no part of the device's work,
        # so a window of one iteration makes no graph of its own on a compiling accelerator (docs/tpu.md).
        packed = torch.stack([running[k].float() for k in keys]) if keys else None
        if packed is not None:
            packed = acc.strategy.all_reduce(packed, "mean")
        values = [v / max(count, 1) for v in acc.to_host(packed).tolist()] if packed is not None else []
        self.last_losses = dict(zip(keys, values))
        lr = self.model.current_lr()
        self.history.add_train(it, epoch, lr, self.last_losses)
        iter_time, data_time = window.means()
        eta = format_eta(iter_time * (self.total_iter - it))
        loss_txt = " ".join(f"{k}: {v:.4e}" for k, v in self.last_losses.items())
        stats = acc.stats()
        self.log.info("[%s][epoch:%3d, iter:%8d, lr:(%.3e)] [eta: %s, time (data): %.3f (%.3f)] %s",
                      self.opt.name[:12], epoch, it, lr, eta, iter_time, data_time, loss_txt)
        if acc.stats_in_log:
            self.log.info("%s stats: %s", acc.name, stats)
        warn = acc.check_recompiles()
        if warn:
            self.log.warning(warn)
        shared = acc.check_sharing() if acc.is_main else None
        if shared:
            self.log.warning(shared)
        if writer is not None:
            scalars = {f"losses/{k}": v for k, v in self.last_losses.items()}
            scalars.update({"lr": lr, "time/iter": iter_time, "time/data": data_time})
            writer.scalars(scalars, it)

    def validate(self, it: int, writer: MetricWriter | None) -> list[EvalResult]:
        """Validate on every ``datasets.val*`` with the weights the optimizers mean (schedule-free's average)."""
        with self.model.optimizer_weights():
            return self._validate(it, writer)

    def _validate(self, it: int, writer: MetricWriter | None) -> list[EvalResult]:
        """Validate on every ``datasets.val*``; every rank takes part; track the best values."""
        assert self.val_opt is not None
        net = self.model.inference_net()
        results = []
        for name, loader in self.val_loaders:
            save_dir = self.vis_dir / name if self.val_opt.save_img else None
            if save_dir is not None and self.acc.is_main:
                save_dir.mkdir(parents=True, exist_ok=True)
            self.acc.strategy.barrier()
            suffix = self.val_opt.suffix or str(it)
            common = dict(dataset=name, scale=int(self.opt.scale), tile=self.val_opt.tile,
                          tile_pad=int(self.val_opt.tile_pad), save_dir=save_dir, suffix=suffix,
                          progress=self.val_opt.pbar)
            res = evaluate(net, loader, self.acc, metrics=self.val_metrics or ValMetrics(None, self.acc),
                           val_opt=self.val_opt, crops=int(self.val_opt.log_images), **common)
            results.append(res)
            self.last_val[name] = res.metrics
            directions = {m: self.val_metrics.better(m) for m in res.metrics} if self.val_metrics else {}
            self.history.add_val(it, name, res.metrics, directions)
            for line in self.model.observe_validation(name, dict(res.metrics), directions):
                self.log.info(line)
            if self.acc.is_main:
                save_crops(self.exp_dir, name, res.crops, it, save_dir, suffix, count=res.count,
                           log_images=int(self.val_opt.log_images))
            lines = []
            for metric, value in res.metrics.items():
                better = directions[metric]
                best = self.best.setdefault(name, {})
                slot = best[metric] if metric in best else None
                improved = slot is None or (value > slot["value"] if better == "higher" else value < slot["value"])
                if improved:
                    best[metric] = {"value": value, "iter": it}
                b = best[metric]
                lines.append(f"{metric}: {value:.4f}  (best {b['value']:.4f} @ iter {b['iter']})")
            self.log.info("validation %s (%d images) at iter %d: %s", name, res.count, it, "; ".join(lines))
            if writer is not None:
                writer.scalars({f"metrics/{name}/{k}": v for k, v in res.metrics.items()}, it)
                writer.images({f"val/{name}/{c.name}": c.side_by_side() for c in res.crops}, it)
        if self.acc.is_main:
            self._save_samples(it, writer)
        self.write_summary(it, None, None, final=False)
        if self.acc.is_main:
            self._save_training_pairs(it)
            self.history.save(self.exp_dir)
        return results

    def _save_samples(self, it: int, writer: MetricWriter | None) -> None:
        """A generative model's samples (StyleGAN2Model: fixed codes through the EMA generator) as one grid:
        ``visualization/samples/samples_<iter>.png`` (with ``val.save_img``) and TensorBoard's ``samples``."""
        draw = getattr(self.model, "sample_images", None)
        if draw is None:
            return
        assert self.val_opt is not None
        grid = tensor2img(image_grid(draw()))  # BGR (HW gray)
        if self.val_opt.save_img:
            path = self.vis_dir / "samples" / f"samples_{it}.png"
            write_image(path, grid)
            self.log.info("samples at iter %d: %s", it, path)
        if writer is not None:
            rgb = grid[:, :, ::-1] if grid.ndim == 3 else grid[:, :, None].repeat(3, axis=2)
            writer.images({"samples": rgb.copy()}, it)

    def _save_training_pairs(self, it: int) -> None:
        """A few crops of the last micro-batch trained on (main rank; already on the device: no data loading)."""
        pair = getattr(self.model, "trained_pair", None)
        if pair is None:
            return
        try:
            save_training_pairs(self.exp_dir, it, *pair)
        except (AnysrError, OSError, RuntimeError, ValueError) as exc:
            self.log.warning("training pairs of iteration %d not saved (%s)", it, exc)

    def _state(self, it: int, epoch: int, *, weights: bool = True) -> dict[str, Any]:
        """The training state at iteration ``it`` (device tensors; ``weights``: with the weight groups to save)."""
        model, acc = self.model, self.acc
        state = {"iter": it, "epoch": epoch, "accumulate": self.accumulate, "signature": self._run_signature(),
                 "batch_position": self.recovery.data_iter(it) * self.accumulate, "model": model.state_dict(),
                 "accelerator": acc.precision.state_dict(), "rng": acc.rng_state(), "best": self.best,
                 "nan_recovery": self.recovery.state_dict(), "threads": torch.get_num_threads()}
        if weights:
            state["weights"] = model.weights()
        return state

    def save(self, it: int, epoch: int) -> dict[str, Any]:
        """One collective save: the full training state, then the weights (safetensors, optional .pth); returns
        the state as this rank built it on the host (NaN recovery keeps a copy).

        The state goes first, so weights never land without a state to continue from: a crash or a full disk at
        any point leaves a folder that ``--auto_resume`` continues (from the newest complete state, or from 0).
        """
        acc = self.acc

        def write(state: dict[str, Any]) -> None:
            weights = state.pop("weights")
            meta = {"network_g": self.opt.network_g.to_dict(), "scale": self.opt.scale, "iteration": it,
                    "name": self.opt.name}
            ckpt.save_training_state(self.states_dir / f"{it}.state", state)
            ckpt.save_weights(self.models_dir / f"net_g_{it}.safetensors", weights, meta)
            formats = self.log_opt.save_format
            if self.log_opt.save_pth or "pth" in formats:
                ckpt.save_weights_pth(self.models_dir / f"net_g_{it}.pth", weights)
            plain = [f for f in formats if f.startswith("plain.")]
            if plain:  # the EMA weights when there are, in their deployment form (as `anysr export`)
                save_deployable([self.models_dir / f"net_g_{it}.{f}" for f in plain]
                                + [self.models_dir / f"net_g_latest.{f}" for f in plain],
                                weights.get("params_ema", weights["params"]), meta["network_g"], int(self.opt.scale))
            ckpt.save_weights(self.models_dir / "net_g_latest.safetensors", weights, meta)
            ckpt.prune_training_states(self.states_dir, self.log_opt.keep_last)
            self.history.save(self.exp_dir)
            self.log.info("saved checkpoint at iteration %d: %s", it, self.states_dir / f"{it}.state")

        def writer(state: dict[str, Any]) -> None:
            try:
                write(state)
            except OSError as exc:  # a full disk: say where --auto_resume goes on from
                if exc.errno not in SPACE_ERRNOS:
                    raise
                states = ckpt.list_training_states(self.states_dir)
                start = (f"from iteration {states[-1][0]}" if states
                         else "from iteration 0: no checkpoint was complete yet")
                raise CheckpointError(describe_os_error(exc, then=f"continue with --auto_resume ({start})")
                                      ) from exc

        host = acc.save(lambda: self._state(it, epoch), writer)
        self._last_saved = it
        return host

    def _best_of(self, dataset: str, metric: str) -> dict[str, Any]:
        slot = self.best[dataset][metric] if dataset in self.best and metric in self.best[dataset] else None
        return {"best": slot["value"] if slot else None, "best_iter": slot["iter"] if slot else None}

    def write_summary(self, it: int, wall: float | None, timer: Timer | None, *, final: bool) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "name": self.opt.name, "iterations_done": it, "total_iter": self.total_iter, "finished": final,
            "final_losses": self.last_losses,
            "validation": {d: {m: {"value": v, **self._best_of(d, m)} for m, v in ms.items()}
                           for d, ms in self.last_val.items()},
            "accelerator": {"kind": self.acc.plan.accelerator, "world_size": self.acc.world_size,
                            "precision": self.acc.precision.name, "launcher": self.acc.plan.launcher,
                            "channels_last": self.acc.precision.channels_last, "spmd": self.acc.plan.spmd,
                            "choices": {k: c.as_dict() for k, c in self.acc.precision.choices.items()}},
            "stats": self.acc.stats(),
        }
        if wall is not None and timer is not None:
            it_time, data_time = timer.means()
            summary.update({"wall_time_s": round(wall, 3), "mean_iter_time_s": round(it_time, 5),
                            "mean_data_time_s": round(data_time, 5)})
        if self.acc.is_main:
            path = self.exp_dir / "summary.json"
            if path.exists() and not final:
                old = json.loads(path.read_text())
                for key in ("wall_time_s", "mean_iter_time_s", "mean_data_time_s"):
                    if key in old and key not in summary:
                        summary[key] = old[key]
            atomic_write_json(path, summary)
        return summary

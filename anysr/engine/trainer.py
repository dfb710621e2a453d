"""The training loop: iterations, logging, validation, atomic checkpoints and exact resume."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml

from anysr.accelerators import Accelerator
from anysr.data import build_dataset, build_eval_loader, build_train_loader
from anysr.engine import checkpoint as ckpt
from anysr.engine.evaluator import EvalResult, evaluate
from anysr.engine.logger import MetricWriter, Progress, Timer, format_eta, get_logger, setup_logging
from anysr.errors import CheckpointError, OptionError, TrainingError
from anysr.models import build_model

STATE_FORMAT = 1


def train_worker(acc: Accelerator, opt: dict[str, Any], auto_resume: bool) -> dict[str, Any]:
    """Entry point of every training worker (``launch`` calls it once per rank)."""
    return Trainer(opt, acc, auto_resume=auto_resume).fit()


def atomic_json(path: Path, data: dict[str, Any]) -> None:
    ckpt.atomic_write_bytes(path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())


class Trainer:
    """One worker's training run. Rank state lives in ``acc``; only the main rank writes files."""

    def __init__(self, opt: dict[str, Any], acc: Accelerator, *, auto_resume: bool = False) -> None:
        self.opt = opt
        self.acc = acc
        self.auto_resume = auto_resume
        p = opt["path"]
        self.exp_dir = Path(p["experiments_root"])
        self.models_dir = Path(p["models"])
        self.states_dir = Path(p["training_states"])
        self.vis_dir = Path(p["visualization"])
        self.log_dir = Path(p["log"])
        self.train_opt = opt["train"]
        self.log_opt = opt.get("logger") or {}
        self.val_opt = opt.get("val") or None
        self.total_iter = int(self.train_opt["total_iter"])
        self.accumulate = int(self.train_opt.get("accumulate", 1) or 1)
        self.best: dict[str, dict[str, dict[str, float]]] = {}
        self.last_val: dict[str, dict[str, float]] = {}
        self.last_losses: dict[str, float] = {}
        self.log = get_logger()

    # ------------------------------------------------------------------ set-up
    def _prepare_dirs(self) -> tuple[Path, dict[str, Any]] | None:
        """Create the experiment layout and find the state to resume from (never renames or overwrites)."""
        resume_path = self.opt["path"].get("resume_state")
        found: tuple[Path, dict[str, Any]] | None = None
        error = None
        if self.acc.is_main:
            for d in (self.exp_dir, self.models_dir, self.states_dir, self.vis_dir, self.log_dir):
                d.mkdir(parents=True, exist_ok=True)
            ckpt.clean_stale_temps(self.states_dir)
            ckpt.clean_stale_temps(self.models_dir)
            existing = ckpt.list_training_states(self.states_dir)
            if not resume_path and existing and not self.auto_resume:
                error = (f"{self.exp_dir} already holds training states (newest: iteration {existing[-1][0]}); "
                         "pass --auto_resume to continue that run, or choose another `name` (nothing was changed)")
        error = self.acc.broadcast_object(error)
        if error:
            raise OptionError(error)
        if resume_path:
            if Path(resume_path).suffix in (".safetensors", ".pth", ".pt"):
                raise OptionError(f"path.resume_state: {resume_path} is a weights file, not a training state; give "
                                  "<experiment>/training_states/<iter>.state, or load the weights with "
                                  "path.pretrain_network_g")
            found = (Path(resume_path), ckpt.load_training_state(resume_path))
        elif self.auto_resume:
            chosen = None
            if self.acc.is_main:
                hit = ckpt.find_resume_state(self.states_dir, warn=self.log.warning)
                chosen = str(hit[0]) if hit else None
            chosen = self.acc.broadcast_object(chosen)
            if chosen:
                found = (Path(chosen), ckpt.load_training_state(chosen))
        return found

    def _record_options(self) -> None:
        """Keep the options of this run as ``options_<time>.yml``, unless the newest one already says the same."""
        text = yaml.safe_dump(self.opt, sort_keys=False)
        previous = sorted(self.exp_dir.glob("options_*.yml"))
        if previous and previous[-1].read_text(encoding="utf-8") == text:
            return
        stamp = time.strftime("%Y%m%d_%H%M%S")
        path, n = self.exp_dir / f"options_{stamp}.yml", 1
        while path.exists():  # two changed runs within one second: keep both
            n += 1
            path = self.exp_dir / f"options_{stamp}_{n}.yml"
        ckpt.atomic_write_bytes(path, text.encode())

    def _load_gan_extras(self, fresh: bool) -> None:
        """GAN models: ``path.pretrain_network_d`` (fresh runs only) and the VGG19 weights of
        ``train.perceptual_opt.vgg_weights_path``, read here and handed over (models do no file I/O)."""
        model, paths = self.model, self.opt["path"]
        pre_d = paths.get("pretrain_network_d")
        if pre_d and fresh and hasattr(model, "load_pretrained_d"):
            key = paths.get("param_key_d") or "params"
            sd, _ = ckpt.load_weights(pre_d, key)
            strict = bool(paths.get("strict_load_d", True))
            model.load_pretrained_d(sd, lambda net, s: ckpt.load_into(net, s, strict=strict, source=str(pre_d)))
            del sd
            self.log.info("loaded pretrained discriminator weights %s [%s]", pre_d, key)
        popt = self.train_opt.get("perceptual_opt")
        if popt and not hasattr(model, "set_perceptual_weights"):
            raise OptionError(f"train.perceptual_opt: model_type {self.opt.get('model_type', 'SRModel')} trains "
                              "with pixel losses only; use model_type: SRGANModel or ESRGANModel, or remove it")
        if popt:
            vgg_path = popt.get("vgg_weights_path")
            if not vgg_path:
                raise OptionError("train.perceptual_opt.vgg_weights_path: the VGG19 weights file is required "
                                  "(torchvision's vgg19 state dict; no download happens)")
            sd, _ = ckpt.load_weights(vgg_path)
            model.set_perceptual_weights(sd)

    def _check_resumable(self, path: Path, state: dict[str, Any]) -> None:
        """Options that decide the data stream and the optimisers must match the run being resumed."""
        now = self._run_signature()
        then = state.get("signature", {})
        changed = [f"{k} ({then[k]} there, {now[k]} now)" for k in now if k in then and then[k] != now[k]]
        if changed:
            raise OptionError(f"cannot resume {path}: " + "; ".join(changed) + ". Restore them (the data position "
                              "and optimiser state depend on them), or start a new run with another `name`")

    def _run_signature(self) -> dict[str, Any]:
        train_key = next(k for k in self.opt["datasets"] if k.startswith("train"))
        dopt = self.opt["datasets"][train_key]
        return {
            "train.accumulate": self.accumulate,
            "global batch (batch_size_per_gpu x ranks)": int(dopt["batch_size_per_gpu"]) * self.acc.batch_multiplier
            * self.acc.world_size,
            f"datasets.{train_key}.dataset_enlarge_ratio": int(dopt.get("dataset_enlarge_ratio", 1) or 1),
            "manual_seed": int(self.opt.get("manual_seed", 0)),
            "model_type": self.opt.get("model_type", "SRModel"),
            "network_g.type": self.opt["network_g"]["type"],
            "train.optim_g.type": (self.train_opt.get("optim_g") or {}).get("type"),
        }

    def _build_data(self) -> None:
        datasets = self.opt["datasets"]
        train_keys = [k for k in datasets if k.startswith("train")]
        if len(train_keys) != 1:
            raise OptionError(f"datasets: training needs exactly one 'train' dataset, found {train_keys or 'none'}")
        dopt = dict(datasets[train_keys[0]])
        dopt["batch_size_per_gpu"] = int(dopt["batch_size_per_gpu"]) * self.acc.batch_multiplier
        self.train_set = build_dataset(dopt, f"datasets.{train_keys[0]}")
        self.train_loader, self.sampler = build_train_loader(
            self.train_set, dopt, world_size=self.acc.world_size, rank=self.acc.rank,
            seed=int(self.opt.get("manual_seed", 0)))
        self.batches_per_epoch = self.sampler.batches_per_epoch
        self.val_loaders: list[tuple[str, Any]] = []
        if self.val_opt:
            for key, vopt in datasets.items():
                if key.startswith("val"):
                    ds = build_dataset(vopt, f"datasets.{key}")
                    if len(ds) > 0:  # type: ignore[arg-type]
                        ds[0]  # read one pair now: a bad val set must stop the run before training, not mid-run
                    loader, _ = build_eval_loader(ds, vopt, world_size=self.acc.world_size, rank=self.acc.rank)
                    self.val_loaders.append((vopt.get("name", key), loader))

    def _batch_stream(self, start_batch: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """(epoch, batch) forever from global batch position ``start_batch``: no replay to resume."""
        epoch, offset = divmod(start_batch, self.batches_per_epoch)
        seed = int(self.opt.get("manual_seed", 0))
        while True:
            self.sampler.set_epoch(epoch, start_batch=offset)
            # The loader's own generator (worker base seeds) must not draw from the global RNG.
            self.train_loader.generator = torch.Generator().manual_seed(seed * 1000003 + epoch)
            for batch in self.acc.prepare_loader(self.train_loader):
                yield epoch, batch
            epoch, offset = epoch + 1, 0

    # ------------------------------------------------------------------ the run
    def fit(self) -> dict[str, Any]:
        acc = self.acc
        resume = self._prepare_dirs()
        setup_logging(self.log_dir / f"train_{self.opt['name']}_{time.strftime('%Y%m%d_%H%M%S')}.log",
                      enabled=acc.is_main)
        if acc.is_main:
            self._record_options()
        self.log.info("anysr training '%s' on %s; %s", self.opt["name"], acc.describe(), acc.describe_choices())
        for warning in acc.choice_warnings():
            self.log.warning(warning)

        acc.manual_seed(int(self.opt.get("manual_seed", 0)))
        self.model = build_model(self.opt, acc)
        pre = self.opt["path"].get("pretrain_network_g")
        if pre and resume is None:
            key = self.opt["path"].get("param_key_g", "params")
            sd, _ = ckpt.load_weights(pre, key)
            strict = bool(self.opt["path"].get("strict_load_g", True))
            self.model.load_pretrained(sd, lambda net, s: ckpt.load_into(net, s, strict=strict, source=str(pre)))
            del sd  # the file's tensors (memory-mapped) are not kept for the whole run; the net holds the copy
            self.log.info("loaded pretrained weights %s [%s]", pre, key)
        self._load_gan_extras(resume is None)
        self.model.setup()

        start_iter = 0
        if resume is not None:
            path, state = resume
            if state.get("format") != STATE_FORMAT:
                raise TrainingError(f"{path}: training-state format {state.get('format')} is not {STATE_FORMAT}")
            self._check_resumable(path, state)
            try:
                self.model.load_state_dict(state["model"])
            except (RuntimeError, KeyError, ValueError) as exc:
                first = str(exc).strip().splitlines()[0][:300]
                raise CheckpointError(
                    f"{path} does not fit this run's model ({first}); network_g or the optimisers changed since "
                    "it was saved: restore those options, or start a new run (another `name`)") from None
            acc.load_state_dict(state.get("accelerator", {}))
            acc.set_rng_state(state["rng"])
            start_iter = int(state["iter"])
            self.best = state.get("best", {})
            self.log.info("resumed from %s at iteration %d", path, start_iter)
            if start_iter > self.total_iter:
                raise OptionError(f"train.total_iter: {self.total_iter} is below the iteration being resumed "
                                  f"({start_iter} in {path}); raise train.total_iter to continue")
            if start_iter == self.total_iter:
                self.log.info("nothing to do: %s is already at train.total_iter=%d (raise it to train longer)",
                              path, self.total_iter)
                return {"iterations_done": start_iter, "total_iter": self.total_iter, "finished": True}

        self._build_data()
        writer = None
        if acc.is_main:
            tb_dir = self.exp_dir / "tb_logger" if self.log_opt.get("use_tb_logger", True) else None
            writer = MetricWriter(tb_dir=tb_dir, wandb_opt=self.log_opt.get("wandb"), run_name=self.opt["name"],
                                  config=self.opt)
        try:
            return self._loop(start_iter, writer)
        finally:
            if writer is not None:
                writer.close()

    def _loop(self, start_iter: int, writer: MetricWriter | None) -> dict[str, Any]:
        acc = self.acc
        print_freq = int(self.log_opt.get("print_freq", 100))
        save_freq = int(self.log_opt.get("save_checkpoint_freq", 5000))
        val_freq = int(self.val_opt.get("val_freq", 0) or 0) if self.val_opt else 0
        stream = self._batch_stream(start_iter * self.accumulate)
        running: dict[str, torch.Tensor] = {}
        run_count = 0
        dev_iter = torch.full((), start_iter, dtype=torch.int64, device=acc.device)
        first_bad = torch.full((), -1, dtype=torch.int64, device=acc.device)
        timer, window = Timer(), Timer()
        wall0 = time.perf_counter()
        bar = Progress(self.total_iter, start_iter, enabled=acc.is_main)
        self.log.info("training iterations %d -> %d, %d batches per epoch, global batch %d", start_iter,
                      self.total_iter, self.batches_per_epoch,
                      self.sampler.batch_size * self.sampler.world_size * self.accumulate)
        it, epoch = start_iter, 0
        t_end = time.perf_counter()
        while it < self.total_iter:
            it += 1
            self.model.update_learning_rate(it)
            batches = []
            for _ in range(self.accumulate):
                epoch, batch = next(stream)
                batches.append(batch)
            t_data = time.perf_counter()
            losses = self.model.train_step(batches)
            dev_iter = dev_iter + 1
            total = sum(losses.values())
            bad = ~torch.isfinite(total)  # type: ignore[arg-type]
            first_bad = torch.where(bad & (first_bad < 0), dev_iter, first_bad)
            for k, v in losses.items():
                running[k] = running[k] + v if k in running else v
            run_count += 1
            acc.mark_step()
            now = time.perf_counter()
            timer.add(now - t_end, t_data - t_end)
            window.add(now - t_end, t_data - t_end)
            t_end = now
            bar.update(1)

            last = it == self.total_iter
            if it % print_freq == 0 or last:
                self._report(it, epoch, running, run_count, first_bad, window, writer)
                # Restart the sums as device data (not an empty dict), so the next step's graph is the usual one.
                running, run_count = {k: torch.zeros_like(v) for k, v in running.items()}, 0
                acc.mark_step()
                window.reset()
                t_end = time.perf_counter()
            # Validate before saving, so a state saved at this iteration knows this validation's best values.
            if val_freq and (it % val_freq == 0 or last):
                self.validate(it, writer)
                acc.mark_warmup_done()
                t_end = time.perf_counter()
            if it % save_freq == 0 or last:
                self._check_finite(first_bad)
                self.save(it, epoch)
                t_end = time.perf_counter()
        bar.close()
        summary = self.write_summary(it, time.perf_counter() - wall0, timer, final=True)
        self.log.info("training done: %d iterations in %.1f s", it - start_iter, time.perf_counter() - wall0)
        return summary

    # ------------------------------------------------------------------ pieces
    def _check_finite(self, first_bad: torch.Tensor) -> None:
        bad_iter = int(self.acc.to_host(self.acc.all_reduce(first_bad, "max")))
        if bad_iter >= 0:
            states = ckpt.list_training_states(self.states_dir) if self.acc.is_main else []
            keep = f"the last good checkpoint is {states[-1][1]}" if states else "no checkpoint was written yet"
            raise TrainingError(
                f"loss became NaN or infinite at iteration {bad_iter}; training stopped and {keep} (nothing newer "
                "was saved). Lower train.optim_g.lr, set train.grad_clip_norm, or use train.precision: fp32")

    def _report(self, it: int, epoch: int, running: dict[str, torch.Tensor], count: int, first_bad: torch.Tensor,
                window: Timer, writer: MetricWriter | None) -> None:
        acc = self.acc
        keys = sorted(running)
        packed = torch.stack([running[k].float() / max(count, 1) for k in keys]) if keys else None
        if packed is not None:
            packed = acc.all_reduce(packed, "mean")
        self._check_finite(first_bad)
        values = acc.to_host(packed).tolist() if packed is not None else []
        self.last_losses = dict(zip(keys, values))
        iter_time, data_time = window.means()
        eta = format_eta(iter_time * (self.total_iter - it))
        lr = self.model.current_lr()
        loss_txt = " ".join(f"{k}: {v:.4e}" for k, v in self.last_losses.items())
        stats = acc.stats()
        self.log.info("[%s][epoch:%3d, iter:%8d, lr:(%.3e)] [eta: %s, time (data): %.3f (%.3f)] %s",
                      self.opt["name"][:12], epoch, it, lr, eta, iter_time, data_time, loss_txt)
        if acc.plan.accelerator == "xla":
            self.log.info("xla stats: %s", stats)
        warn = acc.check_recompiles()
        if warn:
            self.log.warning(warn)
        if writer is not None:
            scalars = {f"losses/{k}": v for k, v in self.last_losses.items()}
            scalars.update({"lr": lr, "time/iter": iter_time, "time/data": data_time})
            writer.scalars(scalars, it)

    def validate(self, it: int, writer: MetricWriter | None) -> list[EvalResult]:
        """Validate on every ``datasets.val*``; every rank takes part; track the best values."""
        assert self.val_opt is not None
        net = self.model.inference_net()
        results = []
        for name, loader in self.val_loaders:
            save_dir = self.vis_dir / name if self.val_opt.get("save_img") else None
            if save_dir is not None and self.acc.is_main:
                save_dir.mkdir(parents=True, exist_ok=True)
            self.acc.barrier()
            res = evaluate(net, loader, self.acc, dataset=name, scale=int(self.opt["scale"]),
                           metrics_opt=self.val_opt.get("metrics"), tile=self.val_opt.get("tile"),
                           tile_pad=int(self.val_opt.get("tile_pad", 10)), save_dir=save_dir,
                           suffix=self.val_opt.get("suffix") or str(it), progress=bool(self.val_opt.get("pbar")))
            results.append(res)
            self.last_val[name] = res.metrics
            lines = []
            for metric, value in res.metrics.items():
                better = (self.val_opt["metrics"][metric].get("better") or "higher")
                slot = self.best.setdefault(name, {}).get(metric)
                improved = slot is None or (value > slot["value"] if better == "higher" else value < slot["value"])
                if improved:
                    self.best[name][metric] = {"value": value, "iter": it}
                b = self.best[name][metric]
                lines.append(f"{metric}: {value:.4f}  (best {b['value']:.4f} @ iter {b['iter']})")
            self.log.info("validation %s (%d images) at iter %d: %s", name, res.count, it, "; ".join(lines))
            if writer is not None:
                writer.scalars({f"metrics/{name}/{k}": v for k, v in res.metrics.items()}, it)
        self.write_summary(it, None, None, final=False)
        return results

    def save(self, it: int, epoch: int) -> None:
        """One collective save: weights (safetensors, optional .pth) then the full training state."""
        model, acc = self.model, self.acc

        def state_fn() -> dict[str, Any]:
            return {"format": STATE_FORMAT, "iter": it, "epoch": epoch, "accumulate": self.accumulate,
                    "signature": self._run_signature(),
                    "batch_position": it * self.accumulate, "model": model.state_dict(),
                    "accelerator": acc.state_dict(), "rng": acc.rng_state(), "best": self.best,
                    "weights": model.weights()}

        def writer(state: dict[str, Any]) -> None:
            weights = state.pop("weights")
            meta = {"network_g": self.opt["network_g"], "scale": self.opt["scale"], "iteration": it,
                    "name": self.opt["name"]}
            ckpt.save_weights(self.models_dir / f"net_g_{it}.safetensors", weights, meta)
            if self.log_opt.get("save_pth"):
                ckpt.save_weights_pth(self.models_dir / f"net_g_{it}.pth", weights)
            ckpt.save_training_state(self.states_dir / f"{it}.state", state)
            ckpt.save_weights(self.models_dir / "net_g_latest.safetensors", weights, meta)
            ckpt.prune_training_states(self.states_dir, self.log_opt.get("keep_last", 3))
            self.log.info("saved checkpoint at iteration %d: %s", it, self.states_dir / f"{it}.state")

        acc.save(state_fn, writer)

    def write_summary(self, it: int, wall: float | None, timer: Timer | None, *, final: bool) -> dict[str, Any]:
        summary: dict[str, Any] = {
            "name": self.opt["name"], "iterations_done": it, "total_iter": self.total_iter, "finished": final,
            "final_losses": self.last_losses,
            "validation": {d: {m: {"value": v, "best": self.best.get(d, {}).get(m, {}).get("value"),
                                   "best_iter": self.best.get(d, {}).get(m, {}).get("iter")}
                               for m, v in ms.items()} for d, ms in self.last_val.items()},
            "accelerator": {"kind": self.acc.plan.accelerator, "world_size": self.acc.world_size,
                            "precision": self.acc.precision, "launcher": self.acc.plan.launcher,
                            "channels_last": self.acc.channels_last, "spmd": self.acc.plan.spmd,
                            "choices": {k: c.as_dict() for k, c in self.acc.choices.items()}},
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
            atomic_json(path, summary)
        return summary

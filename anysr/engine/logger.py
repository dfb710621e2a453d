"""Console, text-log, TensorBoard and wandb output (only the main rank writes)."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

from tqdm import tqdm

LOGGER_NAME = "anysr"


def get_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)


def setup_logging(log_file: Path | None = None, *, enabled: bool = True, level: int = logging.INFO) -> logging.Logger:
    """Console (and file) logging for the main rank; other ranks only log warnings and errors."""
    logger = get_logger()
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    logger.setLevel(level if enabled else logging.WARNING)
    logger.propagate = False
    fmt = logging.Formatter("%(asctime)s %(levelname)s: %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    console = logging.StreamHandler(sys.stdout)
    console.setFormatter(fmt)
    logger.addHandler(console)
    if log_file is not None and enabled:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        fh = logging.FileHandler(log_file, encoding="utf-8", delay=True)  # no empty file when nothing is said
        fh.setFormatter(fmt)
        logger.addHandler(fh)
    return logger


def log_start(what: str, acc: Any) -> None:
    """The first line of a command: what runs where, with the hardware choices and why; then their warnings
    and the launch notes (on the main rank)."""
    log = get_logger()
    log.info("anysr %s on %s: %s", what, acc.place(), acc.precision.describe_choices())
    threads = acc.threads_note()
    if threads is not None:
        (log.warning if threads[1] else log.info)("host threads: %s", threads[0])
    for warning in acc.precision.warnings():
        log.warning(warning)
    for note in acc.plan.notes:
        log.info(note)


class MetricWriter:
    """Scalars to TensorBoard and wandb when enabled (both optional extras)."""

    def __init__(self, *, tb_dir: Path | None, wandb_opt: dict[str, Any] | None, run_name: str,
                 config: dict[str, Any]) -> None:
        self.tb: Any = None
        self.wandb: Any = None
        log = get_logger()
        if tb_dir is not None:
            try:
                from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 - optional dependency

                self.tb = SummaryWriter(log_dir=str(tb_dir))
            except ImportError:
                log.warning("logger.use_tb_logger is on but tensorboard is not installed: "
                            "pip install 'anysr[tensorboard]' (continuing without it)")
        if wandb_opt and wandb_opt["project"]:
            try:
                import wandb  # noqa: PLC0415 - optional dependency

                self.wandb = wandb.init(project=wandb_opt["project"], entity=wandb_opt["entity"],
                                        name=run_name, config=config, id=wandb_opt["resume_id"],
                                        resume="allow")
            except ImportError:
                log.warning("logger.wandb.project is set but wandb is not installed: pip install 'anysr[wandb]'")

    def scalars(self, values: dict[str, float], step: int) -> None:
        if self.tb is not None:
            for key, value in values.items():
                self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(values, step=step)

    def images(self, images: dict[str, Any], step: int) -> None:
        """uint8 RGB (H, W, 3) images by tag (TensorBoard only: wandb gets scalars)."""
        if self.tb is not None:
            for tag, img in images.items():
                self.tb.add_image(tag, img, step, dataformats="HWC")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


class Progress:
    """A live progress bar on an interactive terminal (tqdm), silent otherwise."""

    def __init__(self, total: int, initial: int = 0, *, enabled: bool = True, desc: str = "train") -> None:
        self.bar: Any = None
        if enabled and sys.stderr.isatty():
            self.bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, leave=False)

    def update(self, n: int = 1, **postfix: Any) -> None:
        if self.bar is not None:
            self.bar.update(n)
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)

    def reset(self, n: int) -> None:
        """Back to ``n`` done (a NaN recovery rolled the run back)."""
        if self.bar is not None:
            self.bar.n = n
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class Timer:
    """Running means of step and data-loading time."""

    def __init__(self) -> None:
        self.reset()
        self.start = time.perf_counter()

    def reset(self) -> None:
        self.iter_time = 0.0
        self.data_time = 0.0
        self.count = 0

    def add(self, iter_time: float, data_time: float) -> None:
        self.iter_time += iter_time
        self.data_time += data_time
        self.count += 1

    def means(self) -> tuple[float, float]:
        c = max(self.count, 1)
        return self.iter_time / c, self.data_time / c


def format_eta(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h:d}:{m:02d}:{s:02d}"

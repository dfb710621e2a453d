"""A training run's records: ``History`` (the losses at every report, the metrics at every validation and the NaN
recoveries, kept in ``<experiment>/history.json``; written atomically at validations, saves and the end; on resume
the entries after the resumed iteration are dropped, so a replayed stretch is not counted twice) and ``save_crops``
(the fixed centre crops of the validation images, LQ, MATLAB bicubic, result and ground truth, as PNGs in
``<experiment>/report_files/<dataset>/``, with ``index.json`` saying what they are; the result crop is the latest
validation's; the index also keeps how many images the dataset has and ``val.log_images``). ``anysr report``
reads both back."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from anysr.atomic import atomic_write_json
from anysr.data.imageio import write_image
from anysr.errors import DataError

__all__ = ["CROPS_DIR", "HISTORY_NAME", "History", "save_crops"]

HISTORY_NAME = "history.json"
CROPS_DIR = "report_files"


# --------------------------------------------------------------------------------------------- history
class History:
    """Losses per report and metrics per validation, in iteration order."""

    def __init__(self) -> None:
        self.train: list[dict[str, Any]] = []
        self.val: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []  # NaN recoveries (nan_recovery.Recovery), keyed by the bad iteration

    def add_train(self, it: int, epoch: int, lr: float, losses: Mapping[str, float]) -> None:
        self.train.append({"iter": int(it), "epoch": int(epoch), "lr": float(lr),
                           "losses": {k: float(v) for k, v in losses.items()}})

    def add_val(self, it: int, dataset: str, metrics: Mapping[str, float], better: Mapping[str, str]) -> None:
        self.val.append({"iter": int(it), "dataset": dataset, "metrics": {k: float(v) for k, v in metrics.items()},
                         "better": dict(better)})

    def add_event(self, event: Mapping[str, Any]) -> None:
        """A training event (a NaN recovery), with its iteration under ``iter``."""
        self.events.append(dict(event))

    def truncate(self, it: int) -> None:
        """Forget what came after iteration ``it`` (a resumed run replays it)."""
        self.train = [e for e in self.train if e["iter"] <= it]
        self.val = [e for e in self.val if e["iter"] <= it]
        self.events = [e for e in self.events if e["iter"] <= it]

    def to_dict(self) -> dict[str, Any]:
        return {"version": 1, "train": self.train, "val": self.val, "events": self.events}

    def save(self, exp_dir: Path) -> Path:
        return atomic_write_json(exp_dir / HISTORY_NAME, self.to_dict())

    @classmethod
    def load(cls, exp_dir: Path) -> History:
        """The history of an experiment folder (empty when there is none yet)."""
        h = cls()
        path = exp_dir / HISTORY_NAME
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise DataError(f"{path} cannot be read ({exc}); delete it (only the report's curves use it)") \
                    from None
            problem = _shape_problem(data)
            if problem:
                raise DataError(f"{path} is not an anysr history ({problem}); delete it (only the report's curves "
                                "use it)")
            h.train = list(data.get("train", []))
            h.val = list(data.get("val", []))
            h.events = list(data.get("events", []))
        return h


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _numbers(x: Any) -> bool:
    return isinstance(x, dict) and all(isinstance(k, str) and _is_number(v) for k, v in x.items())


# What each entry of history.json holds (key -> check); the report and a resumed run read them as such.
_TRAIN_ENTRY = {"iter": lambda v: isinstance(v, int) and not isinstance(v, bool), "epoch": _is_number,
                "lr": _is_number, "losses": _numbers}
_VAL_ENTRY = {"iter": lambda v: isinstance(v, int) and not isinstance(v, bool), "dataset": lambda v: isinstance(v, str),
              "metrics": _numbers,
              "better": lambda v: isinstance(v, dict) and all(b in ("higher", "lower") for b in v.values())}
_EVENT_ENTRY = {"iter": lambda v: isinstance(v, int) and not isinstance(v, bool)}


def _shape_problem(data: Any) -> str | None:
    """What in a parsed history.json is not what ``History`` writes (``None``: nothing)."""
    if not isinstance(data, dict):
        return f"the top level is {type(data).__name__}, not a mapping"
    for part, checks in (("train", _TRAIN_ENTRY), ("val", _VAL_ENTRY), ("events", _EVENT_ENTRY)):
        entries = data.get(part, [])
        if not isinstance(entries, list):
            return f"'{part}' is {type(entries).__name__}, not a list"
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                return f"{part}[{i}] is {type(e).__name__}, not a mapping"
            for key, ok in checks.items():
                if key not in e or not ok(e[key]):
                    return f"{part}[{i}].{key} is {'missing' if key not in e else repr(e[key])[:40]}"
    return None


# --------------------------------------------------------------------------------------------- crops
def save_crops(exp_dir: Path, dataset: str, crops: Sequence[Any], it: int, sr_dir: Path | None = None,
               suffix: str | None = None, count: int | None = None, log_images: int | None = None) -> None:
    """Write one validation's crops (``evaluator.ImageCrop``) and update ``report_files/index.json``.

    ``sr_dir`` / ``suffix``: where this validation saved full results (``val.save_img``), to link them.
    ``count`` / ``log_images``: the images in the dataset and ``val.log_images``, so the page can say when it
    shows fewer images than the dataset has.
    """
    if not crops:
        return
    root = exp_dir / CROPS_DIR
    folder = root / _safe(dataset)
    index_path = root / "index.json"
    index: dict[str, Any] = {}
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            index = {}
    entries = []
    for c in crops:
        files = {}
        for layer in ("lq", "bicubic", "sr", "gt"):
            img = getattr(c, layer)
            if img is None:
                continue
            name = f"{_safe(c.name)}_{layer}.png"
            write_image(folder / name, np.ascontiguousarray(img[:, :, ::-1]))
            files[layer] = f"{_safe(dataset)}/{name}"
        full_sr = ""
        if sr_dir is not None:
            candidate = sr_dir / (f"{c.name}_{suffix}.png" if suffix else f"{c.name}.png")
            full_sr = str(candidate) if candidate.is_file() else ""
        entries.append({"name": c.name, "index": c.index, "box": list(c.box), "files": files,
                        "lq_path": c.lq_path, "gt_path": c.gt_path, "sr_path": full_sr})
    block: dict[str, Any] = {"iter": int(it), "images": entries}
    if count is not None:
        block["count"] = int(count)
    if log_images is not None:
        block["log_images"] = int(log_images)
    index[dataset] = block
    atomic_write_json(index_path, index)


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(name)) or "_"

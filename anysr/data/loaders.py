"""Build datasets from options and wrap them in train / eval DataLoaders."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from typing import Any

import cv2
import torch
from torch.utils.data import DataLoader, Dataset

from anysr.data.file_backends import DiskBackend, build_backend
from anysr.data.imageio import probe_bytes, probe_image
from anysr.data.sampler import TrainSampler
from anysr.data.union import FolderUnion, root_lists, split_folders
from anysr.errors import DataError, OptionError
from anysr.registry import DATASET_REGISTRY


def build_dataset(opt: Mapping[str, Any], key_path: str) -> Dataset:
    """The dataset named by ``opt.type`` (DATASET_REGISTRY), built from validated dataset options.

    ``key_path`` (e.g. 'datasets.train') is used in error messages.
    """
    cls = DATASET_REGISTRY.get(str(opt["type"]), f"{key_path}.type")
    if root_lists(opt) is not None and not getattr(cls, "reads_folder_lists", False):
        # several folders (traiNNer-redux's lists): one dataset each, as one (unless the class reads the lists)
        parts = split_folders(opt, key_path)
        return FolderUnion([cls(part, key_path=key_path) for part in parts], key_path)
    return cls(opt, key_path=key_path)


def holds_16bit_images(opt: Mapping[str, Any], sample: int = 32) -> bool:
    """Whether a dataset section reads 16-bit images, judged from its headers: up to ``sample`` images spread over
    each of its folders / LMDBs (``dataroot_gt``, ``dataroot_lq``). Only datasets that keep 16 bits (image datasets,
    ``keeps_16bit``) count; a folder that cannot be read says no here (the dataset's own checks report it)."""
    cls = DATASET_REGISTRY.get(str(opt["type"])) if str(opt["type"]) in DATASET_REGISTRY else None
    if not getattr(cls, "keeps_16bit", False):
        return False
    io_type = str(opt["io_backend"]["type"])  # the options set io_backend (type: disk unless given)
    roots = []
    for key in ("dataroot_gt", "dataroot_lq"):
        value = opt.get(key)
        values = list(value) if isinstance(value, list | tuple) else [value]  # one folder, or a list of folders
        roots += [(v, "lq" if key == "dataroot_lq" else "gt") for v in values]
    for root, field in roots:
        if not root:
            continue
        try:
            backend = build_backend(io_type, os.fspath(root), opt["io_backend"], field)
            names = backend.keys()
            step = max(1, len(names) // sample)
            for name in names[::step][:sample]:
                info = (probe_image(backend.path_of(name)) if isinstance(backend, DiskBackend)
                        else backend.header(name) or probe_bytes(backend.get(name), name))
                if info.dtype == "uint16":
                    return True
        except (DataError, OSError, TypeError):
            continue
    return False


def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
    """Stack the tensors of a list of item dicts; everything else (paths, flags) becomes a list."""
    if not batch:
        return {}
    out: dict[str, Any] = {}
    for key in batch[0]:
        values = [item[key] for item in batch]
        if all(isinstance(v, torch.Tensor) for v in values):
            out[key] = torch.stack(values, 0)
        else:
            out[key] = values
    return out


def _worker_init(worker_id: int) -> None:
    """Keep OpenCV single-threaded inside DataLoader workers (they are already parallel)."""
    del worker_id
    cv2.setNumThreads(0)


_SAID: set[tuple[int, int]] = set()


def usable_cpus() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def worker_count(asked: int) -> int:
    """``num_worker_per_gpu`` capped at the usable cores: more workers than cores only compete for them (torch
    warns about it at every loader); said once per process."""
    cpus = usable_cpus()
    if asked <= cpus:
        return asked
    if (asked, cpus) not in _SAID:
        _SAID.add((asked, cpus))
        logging.getLogger("anysr").info("num_worker_per_gpu %d lowered to %d: this process may use %d CPU cores",
                                        asked, cpus, cpus)
    return cpus


def _worker_kwargs(opt: Mapping[str, Any], workers: int, seed: int = 0) -> dict[str, Any]:
    workers = worker_count(workers)
    # A private generator: DataLoader draws a worker base seed per iterator, which must not advance the
    # global torch RNG (that would make resumed runs diverge). Samples get their randomness from the sampler.
    generator = torch.Generator()
    generator.manual_seed(seed)
    kwargs: dict[str, Any] = {
        "generator": generator,
        "num_workers": workers,
        "pin_memory": bool(opt["pin_memory"]),
        "persistent_workers": bool(opt["persistent_workers"]) and workers > 0,
        "collate_fn": collate,
    }
    if workers > 0:
        kwargs["worker_init_fn"] = _worker_init
        if opt["prefetch_factor"] is not None:
            kwargs["prefetch_factor"] = int(opt["prefetch_factor"])
    return kwargs


def build_train_loader(dataset: Dataset, dataset_opt: Mapping[str, Any], *, batch_size: int, world_size: int,
                       rank: int, seed: int, start_iter: int = 0,
                       key_path: str = "datasets.train") -> tuple[DataLoader, TrainSampler]:
    """A DataLoader over this rank's shard of the training stream, positioned at global step ``start_iter``.

    ``batch_size``: per loader (``batch_size_per_gpu`` times the devices one process feeds). The validated options
    give num_worker_per_gpu, dataset_enlarge_ratio, use_shuffle, pin_memory, persistent_workers and
    prefetch_factor. The loader starts at epoch ``start_iter // batches_per_epoch``, batch
    ``start_iter % batches_per_epoch``; for later epochs call ``sampler.set_epoch(e)``.
    """
    name = str(dataset_opt["name"])
    sampler = TrainSampler(len(dataset), batch_size=batch_size, world_size=world_size,  # type: ignore[arg-type]
                           rank=rank, seed=seed, enlarge_ratio=int(dataset_opt["dataset_enlarge_ratio"]),
                           shuffle=bool(dataset_opt["use_shuffle"]),
                           name=key_path if name in (key_path, key_path.rsplit(".", 1)[-1]) else
                           f"{key_path} ({name})")
    epoch, batch = sampler.position(start_iter)
    sampler.set_epoch(epoch, batch)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, drop_last=True,
                        **_worker_kwargs(dataset_opt, int(dataset_opt["num_worker_per_gpu"]), seed))
    return loader, sampler


def eval_indices(num_items: int, world_size: int, rank: int) -> tuple[list[int], list[bool]]:
    """Round-robin shard of ``range(num_items)`` for ``rank``, padded to ``ceil(num_items / world_size)``.

    Returns (dataset indices in loader order, pad flags); padding repeats images from the start.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise OptionError(f"eval sharding: rank {rank} / world_size {world_size} is not a valid position")
    per_rank = math.ceil(num_items / world_size)
    positions = [rank + k * world_size for k in range(per_rank)]
    return [p % num_items for p in positions], [p >= num_items for p in positions]


class _EvalShard(Dataset):
    """This rank's items of an evaluation dataset, each tagged with 'pad' and 'index'."""

    def __init__(self, dataset: Dataset, indices: list[int], pads: list[bool]) -> None:
        self.dataset = dataset
        self.indices = indices
        self.pads = pads

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, j: int) -> dict[str, Any]:
        item = dict(self.dataset[self.indices[j]])
        item["pad"] = self.pads[j]
        item["index"] = self.indices[j]
        return item


def build_eval_loader(dataset: Dataset, dataset_opt: Mapping[str, Any], *, world_size: int, rank: int,
                      key_path: str = "datasets.val") -> tuple[DataLoader, list[int]]:
    """A batch-size-1 loader over this rank's round-robin shard, padded so every rank has as many items.

    Returns (loader, dataset indices in loader order, padding included). Batches carry 'pad' (list of
    bool: True for a repeat that metrics must ignore) and 'index' (list of dataset indices).
    """
    n = len(dataset)  # type: ignore[arg-type]
    if n == 0:
        raise DataError(f"{key_path}: the dataset is empty; check its dataroot / meta_info_file")
    indices, pads = eval_indices(n, world_size, rank)
    loader = DataLoader(_EvalShard(dataset, indices, pads), batch_size=1, shuffle=False, drop_last=False,
                        **_worker_kwargs(dataset_opt, int(dataset_opt["num_worker_per_gpu"])))
    return loader, indices

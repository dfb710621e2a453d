"""A deterministic, resumable, rank-sharded sampler for iteration-based training.

Epoch ``e`` is a permutation of ``dataset_len * enlarge_ratio`` virtual positions drawn from
``np.random.default_rng([seed, e])``; global batch ``b`` is positions ``[b*G, (b+1)*G)`` with
``G = batch_size * world_size`` and rank ``r`` takes the contiguous slice ``[r*batch_size, (r+1)*batch_size)``
of it. Every yielded item is ``(dataset_index, sample_seed)`` where the seed depends only on
(seed, epoch, position), so the data stream is the same for any worker count, world-size split or
resume point.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from anysr.errors import DataError, OptionError

MAX_EPOCH_SAMPLES = 100_000_000  # samples in one epoch's order (an int64 array: 800 MB)

_MASK63 = (1 << 63) - 1


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """A 63-bit seed for the sample at global ``position`` of ``epoch`` (SeedSequence-mixed)."""
    lo, hi = np.random.SeedSequence([seed, epoch, position]).generate_state(2, dtype=np.uint32)
    return ((int(hi) << 32) | int(lo)) & _MASK63


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise OptionError(f"TrainSampler: {name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class TrainSampler(Sampler[tuple[int, int]]):
    """Yields ``(index, sample_seed)`` for this rank; ``set_epoch(e, start_batch=k)`` resumes mid-epoch.

    Each rank yields ``batches_per_epoch * batch_size`` items per full epoch (drop_last on the global
    batch, so every rank runs the same number of steps).
    """

    def __init__(self, dataset_len: int, *, batch_size: int, world_size: int = 1, rank: int = 0,
                 seed: int = 0, enlarge_ratio: int = 1, shuffle: bool = True, name: str = "dataset") -> None:
        self.dataset_len = _check_int(dataset_len, "dataset_len", 0)
        self.batch_size = _check_int(batch_size, "batch_size", 1)
        self.world_size = _check_int(world_size, "world_size", 1)
        self.rank = _check_int(rank, "rank", 0)
        if self.rank >= self.world_size:
            raise OptionError(f"TrainSampler: rank {rank} is not below world_size {world_size}")
        self.seed = _check_int(seed, "seed", 0)
        self.enlarge_ratio = _check_int(enlarge_ratio, "enlarge_ratio", 1)
        self.shuffle = bool(shuffle)
        self.name = name
        self.global_batch = self.batch_size * self.world_size
        self.num_virtual = self.dataset_len * self.enlarge_ratio
        if self.dataset_len == 0:
            raise DataError(f"{name}: the dataset is empty; check its dataroot / meta_info_file")
        if self.num_virtual > MAX_EPOCH_SAMPLES:
            raise OptionError(
                f"{name}: dataset_enlarge_ratio {self.enlarge_ratio} x {self.dataset_len} image(s) = "
                f"{self.num_virtual:,} samples per epoch; an epoch's order is held in memory (8 bytes a sample), so "
                f"keep it at most {MAX_EPOCH_SAMPLES:,}: dataset_enlarge_ratio at most "
                f"{max(1, MAX_EPOCH_SAMPLES // self.dataset_len):,} (train.total_iter sets how long training runs, "
                "not this ratio)")
        if self.num_virtual < self.global_batch:
            raise DataError(
                f"{name}: {self.dataset_len} image(s) x dataset_enlarge_ratio {self.enlarge_ratio} = "
                f"{self.num_virtual} samples per epoch, fewer than one global batch of {self.global_batch} "
                f"(batch_size_per_gpu {self.batch_size} x {self.world_size} rank(s)). Raise "
                f"dataset_enlarge_ratio to at least {-(-self.global_batch // self.dataset_len)} or lower "
                "batch_size_per_gpu."
            )
        self.epoch = 0
        self.start_batch = 0

    @property
    def batches_per_epoch(self) -> int:
        """Steps in one full epoch (the same on every rank)."""
        return self.num_virtual // self.global_batch

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Iterate epoch ``epoch`` from batch ``start_batch`` on (earlier batches are skipped, not loaded)."""
        self.epoch = _check_int(epoch, "epoch", 0)
        start = _check_int(start_batch, "start_batch", 0)
        if start > self.batches_per_epoch:
            raise OptionError(f"TrainSampler: start_batch {start} is past the {self.batches_per_epoch} "
                              f"batches of an epoch")
        self.start_batch = start

    def position(self, iteration: int) -> tuple[int, int]:
        """(epoch, batch within the epoch) of the 0-based global step ``iteration``."""
        it = _check_int(iteration, "iteration", 0)
        return divmod(it, self.batches_per_epoch)

    def permutation(self, epoch: int) -> np.ndarray:
        """The dataset indices of every virtual position of ``epoch``, in order."""
        if self.shuffle:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.num_virtual)
        else:
            order = np.arange(self.num_virtual)
        return order % self.dataset_len

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, start = self.epoch, self.start_batch
        order = self.permutation(epoch)
        for b in range(start, self.batches_per_epoch):
            first = b * self.global_batch + self.rank * self.batch_size
            for pos in range(first, first + self.batch_size):
                yield int(order[pos]), sample_seed(self.seed, epoch, pos)

    def __len__(self) -> int:
        """Items the next iteration yields on this rank (fewer after ``set_epoch(e, start_batch>0)``)."""
        return (self.batches_per_epoch - self.start_batch) * self.batch_size

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "start_batch": self.start_batch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.set_epoch(int(state["epoch"]), int(state["start_batch"]))

"""Several folders as one dataset: ``dataroot_gt: [a/hr, b/hr]`` (with ``dataroot_lq: [a/lr, b/lr]``), as
traiNNer-redux's files write them.

Each folder (pair) is a dataset of the named type with the same options and that one folder; ``FolderUnion``
numbers their items one after the other (folder 0's first), so an index and its seed decide a sample exactly as
in one folder: the sampler, exact resume and the rank split are unchanged.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch.utils.data import Dataset

from anysr.errors import DataError


def root_lists(opt: Mapping[str, Any]) -> tuple[list[Any], list[Any]] | None:
    """The GT and LQ folders of ``opt`` when either is a list of several (one folder each: None)."""
    gt, lq = opt.get("dataroot_gt"), opt.get("dataroot_lq")
    if not isinstance(gt, (list, tuple)) and not isinstance(lq, (list, tuple)):
        return None
    gts = list(gt) if isinstance(gt, (list, tuple)) else [gt]
    lqs = list(lq) if isinstance(lq, (list, tuple)) else [lq]
    return gts, lqs


def split_folders(opt: Mapping[str, Any], key_path: str) -> list[dict[str, Any]]:
    """One dataset option dict per folder (pair); a DataError when the GT and LQ lists do not pair up."""
    roots = root_lists(opt)
    assert roots is not None
    gts, lqs = roots
    if lqs == [None]:
        lqs = [None] * len(gts)
    if gts == [None]:  # LQ folders alone (SingleImageDataset)
        gts = [None] * len(lqs)
    if len(gts) != len(lqs):
        raise DataError(f"{key_path}: dataroot_gt lists {len(gts)} folders and dataroot_lq {len(lqs)}; give one LQ "
                        "folder per GT folder, in the same order")
    with_values = getattr(opt, "with_values", None)  # validated Options stay Options
    return [with_values(dataroot_gt=g, dataroot_lq=q) if with_values else {**opt, "dataroot_gt": g, "dataroot_lq": q}
            for g, q in zip(gts, lqs)]


class FolderUnion(Dataset):
    """The items of several same-type datasets, one after the other; other attributes come from the first."""

    def __init__(self, parts: Sequence[Dataset], key_path: str) -> None:
        self.parts = list(parts)
        self.key_path = key_path
        self.starts: list[int] = []
        total = 0
        for part in self.parts:
            self.starts.append(total)
            total += len(part)  # type: ignore[arg-type]
        self.total = total

    def __len__(self) -> int:
        return self.total

    def locate(self, i: int) -> tuple[Dataset, int]:
        """The part holding global item ``i`` and the item's index there."""
        if not 0 <= i < self.total:
            raise IndexError(f"{self.key_path}: item {i} of {self.total}")
        k = bisect.bisect_right(self.starts, i) - 1
        return self.parts[k], i - self.starts[k]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, tuple):  # (index, seed): the seed is the sample's, whatever folder it is in
            part, local = self.locate(int(index[0]))
            return part[(local, index[1])]
        part, local = self.locate(int(index))
        return part[local]

    def check(self, *, decode: bool, progress: bool = True) -> list[str]:
        """Every folder's start-up problems."""
        problems: list[str] = []
        for part in self.parts:
            check: Callable[..., list[str]] | None = getattr(part, "check", None)
            if check is not None:
                problems += check(decode=decode, progress=progress)
        return problems

    def paths(self, i: int) -> Any:
        part, local = self.locate(i)
        return part.paths(local)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        if name == "parts":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.parts[0], name)

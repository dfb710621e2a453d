"""Other layouts of the same networks: weights published under names other than the ones anysr's class (and
BasicSR / spandrel's export) uses, renamed on reading so they load, are recognised and export as usual.

An arch module registers a layout next to its class (``register_layout``): ``matches`` tells from the names alone
whether a state dict is in that layout, ``convert`` renames it (tensors unchanged). ``to_known_layout`` is applied
to every weights file read (``anysr.engine.checkpoint.read_weights``). Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

StateDict = Mapping[str, Any]


@dataclass(frozen=True)
class Layout:
    """A foreign naming of ``arch``'s tensors: ``what`` says which in log lines."""

    arch: str
    what: str
    matches: Callable[[StateDict], bool]
    convert: Callable[[StateDict], dict[str, Any]]


LAYOUTS: list[Layout] = []


def register_layout(arch: str, what: str, matches: Callable[[StateDict], bool],
                    convert: Callable[[StateDict], dict[str, Any]]) -> None:
    """Register a foreign layout of ``arch`` (``what``: e.g. "the original ESRGAN layout (model.N names)")."""
    LAYOUTS.append(Layout(arch, what, matches, convert))


def to_known_layout(sd: StateDict) -> tuple[dict[str, Any], Layout | None]:
    """``sd`` renamed to anysr's names when it is in a registered foreign layout (and the layout that matched),
    else ``sd`` unchanged and None."""
    for layout in LAYOUTS:
        if layout.matches(sd):
            return layout.convert(sd), layout
    return dict(sd), None

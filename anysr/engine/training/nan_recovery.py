"""NaN / Inf recovery (``train.nan_recovery``, docs/nan_recovery.md): the record a run keeps of its recoveries.

The trainer finds a non-finite loss (or clipped gradient norm) lazily, at the checks where it reads the device
anyway; it then rolls back to the last good state, multiplies the learning rates by ``lr_factor``, skips the batch
of the bad iteration and replays. ``Recovery`` is what decides the rest of the run and goes into the training
state: the lr factor so far, which iterations had their batch skipped (so the data stream is positioned the same
way after a resume) and the events (the log lines' content, also in history.json and report.html).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NONE_BAD", "Recovery", "decode_bad"]

NONE_BAD = 2**62
"""``first_bad``'s value while every check passed (the ranks agree with a ``min``)."""

_WHAT = {1: "loss", 2: "gradient norm", 3: "loss and gradient norm"}


def decode_bad(code: int) -> tuple[int, str]:
    """``first_bad`` (``iteration * 4 + (1: loss, 2: gradient norm)``) as (iteration, what was non-finite)."""
    it, kind = divmod(int(code), 4)
    return it, _WHAT.get(kind, "loss")


@dataclass
class Recovery:
    """The recoveries of a run: the lr factor so far, the iterations whose batch was skipped, the events."""

    lr_factor: float = 1.0
    skips: list[int] = field(default_factory=list)  # one entry per skipped batch: the iteration that skipped it
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def retries(self) -> int:
        return len(self.events)

    def data_iter(self, it: int) -> int:
        """The data-stream iteration that training iteration ``it`` trains on (1-based; 0 before the first): each
        skip at an iteration <= ``it`` moves the stream on by one iteration's batches."""
        return it + sum(1 for s in self.skips if s <= it) if it > 0 else 0

    def injects(self, it: int, inject_at: Iterable[int]) -> bool:
        """Whether iteration ``it``'s batch is poisoned (``inject_at``): once, not when replayed after recovering."""
        return it in set(inject_at) and not any(e["iter"] == it for e in self.events)

    def record(self, *, bad_iter: int, what: str, detected_at: int, rolled_back_to: int, factor: float,
               max_retries: int) -> dict[str, Any]:
        """Count one recovery; its event (for the log line and the history)."""
        skipped = self.data_iter(bad_iter)
        self.lr_factor *= factor
        self.skips.append(bad_iter)
        event = {"iter": bad_iter, "what": what, "detected_at": detected_at, "rolled_back_to": rolled_back_to,
                 "skipped_batch": skipped, "lr_factor": self.lr_factor, "retry": self.retries + 1,
                 "max_retries": max_retries}
        self.events.append(event)
        return event

    def state_dict(self) -> dict[str, Any]:
        return {"lr_factor": self.lr_factor, "skips": list(self.skips), "events": [dict(e) for e in self.events]}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        self.lr_factor = float(state.get("lr_factor", 1.0))
        self.skips = [int(s) for s in state.get("skips", [])]
        self.events = [dict(e) for e in state.get("events", [])]


def describe(event: dict[str, Any]) -> str:
    """The one log line of a recovery."""
    return (f"NaN recovery {event['retry']}/{event['max_retries']}: the {event['what']} became NaN or infinite at "
            f"iteration {event['iter']} (found at {event['detected_at']}); rolled back to iteration "
            f"{event['rolled_back_to']}, learning rates now x{event['lr_factor']:g} of the schedule, iteration "
            f"{event['iter']}'s batch (data iteration {event['skipped_batch']}) skipped; continuing")

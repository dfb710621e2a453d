"""Errors that are part of the interface: each names the culprit and the fix."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class AnysrError(Exception):
    """Base class of every error anysr raises on purpose (the CLI prints these without a traceback)."""


class OptionError(AnysrError):
    """A bad option: unknown key, wrong type, missing key or path."""


class DataError(AnysrError):
    """A missing, unreadable or corrupt image or dataset."""


class CheckpointError(AnysrError):
    """A missing, truncated, corrupt or incompatible checkpoint."""


class AcceleratorError(AnysrError):
    """An accelerator that is not available or a device count that cannot be honoured."""


class TrainingError(AnysrError):
    """Training cannot go on (for example a NaN loss)."""


def nearest(name: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate to ``name`` (for 'did you mean' hints), or None."""
    found = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=1, cutoff=0.6)
    return found[0] if found else None


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' or '' when nothing is close."""
    hit = nearest(name, candidates)
    return f" (did you mean '{hit}'?)" if hit else ""

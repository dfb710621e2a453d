"""Weights recognised without being told: which architecture (and which constructor arguments: scale, width,
depth, ...) a state dict is, from its names and shapes alone.

Each architecture module registers a *recogniser* next to its class (``register_recogniser``): a function that
reads a ``StateShapes`` view of the file and proposes the constructor arguments that would give those tensors (one
proposal, several to try in order, or None when the file is not of its family; reading a name the file lacks is
the same as None). A proposal counts only when the network it builds (on the meta device: no memory, no
initialisation) has exactly the file's names and shapes, so a recogniser may guess cheaply and the check decides.
A file that fits none gets one line naming the families whose names come closest. Constructor arguments a file
records itself (traiNNer-redux's ``metadata``) are merged in afterwards (``with_hyperparameters``): they settle what
shapes cannot show (``img_range``, an activation without weights), never what they contradict.

Pure torch: no file, device or process knowledge (the engine reads the file and loads the weights).
"""

from __future__ import annotations

import json
import re
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from anysr.errors import OptionError, short_repr

Proposal = Mapping[str, Any]
Recogniser = Callable[["StateShapes"], "Proposal | Iterable[Proposal] | None"]

RECOGNISERS: dict[str, Recogniser] = {}
_DIGITS = re.compile(r"\.\d+(?=\.|$)")
_RECORD_SIZE = 16  # integer tensors up to this many values are kept for StateShapes.integers


class NotThisFamily(Exception):  # noqa: N818 - a control-flow signal, not an error a user sees
    """Raised (or caused by reading a missing name) inside a recogniser: the file is not of its family."""


class RecordedValueError(OptionError):
    """A constructor argument recorded in a file's metadata has a value the recognised class refuses."""


class StateShapes:
    """A read-only view of a state dict's names and shapes for recognisers. Reading a name the file lacks raises
    NotThisFamily (so a recogniser can read what its family must have without checking first)."""

    def __init__(self, state: Mapping[str, Any]) -> None:
        self.shapes: dict[str, tuple[int, ...]] = {
            k: tuple(int(d) for d in (v.shape if hasattr(v, "shape") else v)) for k, v in state.items()}
        self._ints: dict[str, tuple[int, ...]] = {
            k: tuple(int(x) for x in v.flatten().tolist()) for k, v in state.items()
            if isinstance(v, torch.Tensor) and v.device.type != "meta" and v.numel() <= _RECORD_SIZE
            and not (v.is_floating_point() or v.is_complex())}

    def __contains__(self, key: object) -> bool:
        return key in self.shapes

    def __len__(self) -> int:
        return len(self.shapes)

    def keys(self) -> Iterator[str]:
        return iter(self.shapes)

    def shape(self, key: str) -> tuple[int, ...]:
        """The shape of ``key``; NotThisFamily when the file has no such name."""
        try:
            return self.shapes[key]
        except KeyError:
            raise NotThisFamily(key) from None

    def dim(self, key: str, i: int) -> int:
        """Dimension ``i`` of ``key``'s shape."""
        shape = self.shape(key)
        try:
            return shape[i]
        except IndexError:
            raise NotThisFamily(f"{key} has {len(shape)} dims") from None

    def integers(self, key: str) -> tuple[int, ...] | None:
        """The values of a small integer tensor (a record some files carry, e.g. an upsampler's
        ``MetaUpsample``), None when the file has only shapes there (a layout, a meta-device network): a hint to
        order proposals by, never needed to recognise a file."""
        return self._ints.get(key)

    def has_prefix(self, prefix: str) -> bool:
        """Whether some name starts with ``prefix``."""
        return any(k.startswith(prefix) for k in self.shapes)

    def indices(self, prefix: str) -> list[int]:
        """The sorted integers ``n`` for which some name starts with ``f"{prefix}{n}."`` (the blocks of a
        ``ModuleList`` / ``Sequential`` at ``prefix``: ``indices("body.")`` -> [0, 1, ..., 22])."""
        found: set[int] = set()
        for k in self.shapes:
            if k.startswith(prefix):
                head = k[len(prefix):].split(".", 1)[0]
                if head.isdigit():
                    found.add(int(head))
        return sorted(found)

    def count(self, prefix: str) -> int:
        """How many blocks ``indices(prefix)`` finds (0 when none)."""
        return len(self.indices(prefix))

    def patterns(self) -> set[str]:
        """The names with every block index replaced by ``#`` (compares layouts of different depths)."""
        return {_DIGITS.sub(".#", k) for k in self.shapes}


def shuffle_splits(channels: int, image_channels: Iterable[int] = (3, 1, 4)) -> list[tuple[int, int]]:
    """The (image channels, scale) pairs with ``image_channels * scale**2 == channels`` (a PixelShuffle's input
    width), in the order of ``image_channels`` (the usual RGB first); scale 1 included."""
    out = []
    for c in image_channels:
        if c > 0 and channels % c == 0:
            scale = round((channels // c) ** 0.5)
            if scale >= 1 and c * scale * scale == channels:
                out.append((c, scale))
    return out


def upsample_scale(view: StateShapes, prefix: str, num_feat: int) -> int:
    """The scale of a BasicSR ``Upsample`` at ``prefix`` (convs to ``4 * num_feat`` channels each followed by a
    PixelShuffle(2), or one conv to ``9 * num_feat`` for x3); NotThisFamily when the convs fit neither."""
    convs = [view.dim(f"{prefix}{i}.weight", 0) for i in view.indices(prefix) if f"{prefix}{i}.weight" in view]
    if convs == [9 * num_feat]:
        return 3
    if convs and all(c == 4 * num_feat for c in convs):
        return 2 ** len(convs)
    raise NotThisFamily(f"{prefix}: no sub-pixel upsampler of width {num_feat}")


def width_ratio(width: int, dim: int, default: float) -> float:
    """A width factor (``int(ratio * dim) == width``: MLP / expansion ratios): ``default`` when it gives
    ``width``, else the exact ratio, else one half a channel above it (when float rounding falls short)."""
    for ratio in (default, width / dim, (width + 0.5) / dim):
        if int(ratio * dim) == width:
            return ratio
    raise NotThisFamily(f"no ratio of {dim} gives {width}")


def register_recogniser(arch: str, recogniser: Recogniser) -> None:
    """Register how to recognise ``arch``'s weights (``arch``: the registered class name)."""
    if arch in RECOGNISERS:
        raise KeyError(f"recogniser for '{arch}' is registered twice")
    RECOGNISERS[arch] = recogniser


@dataclass(frozen=True)
class Recognised:
    """The architecture a file is: ``opt`` builds it (``{"type": ..., **arguments}``); ``inferred``: the arguments
    read from the file's shapes (the rest are the class's defaults); ``others``: other families that fit too.

    With the file's recorded hyperparameters (``recognise(..., hyperparameters=...)``: traiNNer-redux's
    ``metadata``): ``from_metadata``, the arguments taken from them (values shapes cannot reveal); ``overruled``,
    argument -> (recorded value, value kept) where the shapes contradict the record; ``ignored``, the recorded
    names the class does not take; ``agreed``, the recorded arguments that only confirm what ``opt`` holds."""

    opt: dict[str, Any]
    inferred: dict[str, Any]
    others: tuple[str, ...] = ()
    from_metadata: dict[str, Any] = field(default_factory=dict)
    overruled: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    ignored: tuple[str, ...] = ()
    agreed: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the log: the class, the arguments read from the shapes and those from the metadata."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.inferred.items()) or "the class's defaults"
        if self.from_metadata:
            args += "; from the file's metadata: " + ", ".join(f"{k}={v!r}" for k, v in self.from_metadata.items())
        elif self.agreed:
            args += "; the file's metadata agrees"
        return f"{self.opt['type']} ({args})"


def _proposals(recogniser: Recogniser, view: StateShapes) -> list[dict[str, Any]]:
    try:
        got = recogniser(view)
    except (NotThisFamily, KeyError, IndexError, ZeroDivisionError):
        return []
    if got is None:
        return []
    if isinstance(got, Mapping):
        return [dict(got)]
    return [dict(p) for p in got]


def computed_buffers(net: nn.Module) -> dict[str, torch.Tensor]:
    """The persistent buffers of ``net`` that its modules compute rather than read (a module class lists them in
    ``computed_buffers``: SpyNet's ImageNet ``mean`` / ``std``, which BasicSR registers after loading, so its
    published weights lack them), by state-dict name: a file may omit them (they keep the network's values)."""
    out: dict[str, torch.Tensor] = {}
    for prefix, module in net.named_modules():
        for name in getattr(type(module), "computed_buffers", ()):
            buf = module._buffers.get(name)
            if isinstance(buf, torch.Tensor) and name not in module._non_persistent_buffers_set:
                out[f"{prefix}.{name}" if prefix else name] = buf
    return out


def dropped_buffers(net: nn.Module) -> set[str]:
    """The state-dict names a reference implementation stores that ``net`` computes in its forward instead (a
    module class lists them in ``dropped_buffers``: GRL's precomputed tables): dropped from a file on load."""
    return {f"{prefix}.{name}" if prefix else name for prefix, module in net.named_modules()
            for name in getattr(type(module), "dropped_buffers", ())}


_LAYOUTS: dict[str, Mapping[str, tuple[int, ...]] | None] = {}
# per options as _LAYOUTS: the names the network computes (a file may lack them) and those it drops from a file
_DECLARED: dict[str, tuple[frozenset[str], frozenset[str]]] = {}


def _meta_layout(opt: Mapping[str, Any]) -> Mapping[str, tuple[int, ...]] | None:
    """Names and shapes of the network ``opt`` builds (on the meta device; read-only), or None when it cannot be
    built. Remembered per options (up to 256): building a large transformer's modules takes a second even on the
    meta device, and the same proposals come back (another file of the family, the closest-family scan)."""
    from anysr.archs import build_network  # noqa: PLC0415 - archs/__init__ imports every arch module (and this one)

    key = json.dumps(opt, sort_keys=True, default=repr)
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    declared: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())
    try:
        with torch.device("meta"):
            net = build_network(dict(opt), key_path="recognised")
        layout: Mapping[str, tuple[int, ...]] | None = types.MappingProxyType(
            {k: tuple(v.shape) for k, v in net.state_dict().items()})
        declared = (frozenset(computed_buffers(net)), frozenset(dropped_buffers(net)))
    except (OptionError, TypeError, ValueError, RuntimeError, NotImplementedError, AssertionError, IndexError,
            KeyError, ZeroDivisionError, AttributeError):
        layout = None
    if len(_LAYOUTS) >= 256:
        _LAYOUTS.clear()
        _DECLARED.clear()
    _LAYOUTS[key], _DECLARED[key] = layout, declared
    return layout


def layout_fits(opt: Mapping[str, Any], view: StateShapes) -> bool:
    """Whether the network ``opt`` builds has exactly the file's names and shapes (what a strict load needs),
    but for what the network declares it computes: buffers it computes may be missing from the file, copies of
    tables a reference stores (``dropped_buffers``) may be there."""
    layout = _meta_layout(opt)
    if layout is None:
        return False
    if layout == view.shapes:
        return True
    computed, dropped = _DECLARED.get(json.dumps(opt, sort_keys=True, default=repr), (frozenset(), frozenset()))
    shapes = {k: v for k, v in view.shapes.items() if k not in dropped}
    return {k: v for k, v in layout.items() if k in shapes or k not in computed} == shapes


def recognise_all(state: Mapping[str, Any]) -> list[Recognised]:
    """Every registered family whose proposal fits ``state`` exactly, in registration order (the first fitting
    proposal of each family)."""
    view = StateShapes(state)
    found = []
    for arch, recogniser in RECOGNISERS.items():
        for proposal in _proposals(recogniser, view):
            opt = {"type": proposal.pop("type", arch), **proposal}
            if layout_fits(opt, view):
                found.append(Recognised(opt, {k: v for k, v in opt.items() if k != "type"}))
                break
    return found


def _default_layout(arch: str) -> dict[str, tuple[int, ...]] | None:
    """The layout of ``arch`` with its defaults, else with its first named preset (a class with required
    arguments)."""
    from anysr.presets import ARCH_PRESETS  # noqa: PLC0415 - presets register when the arch modules import

    layout = _meta_layout({"type": arch})
    if layout is None:
        preset = next((p.name for p in ARCH_PRESETS.values() if p.arch == arch), None)
        layout = _meta_layout({"type": preset}) if preset else None
    return layout


def closest_families(state: Mapping[str, Any], n: int = 3) -> list[tuple[str, float]]:
    """The ``n`` families whose default layout shares the most name patterns with ``state`` (block indices
    ignored), with the shared fraction (Jaccard) of their patterns."""
    mine = StateShapes(state).patterns()
    scores = []
    for arch in RECOGNISERS:
        layout = _default_layout(arch)
        if layout is None:
            continue
        theirs = StateShapes(layout).patterns()
        if mine | theirs:
            scores.append((arch, len(mine & theirs) / len(mine | theirs)))
    scores.sort(key=lambda s: -s[1])
    return [s for s in scores[:n] if s[1] > 0]


def _same(a: Any, b: Any) -> bool:
    """Equal as option values: a list equals the tuple of its items (JSON has no tuples); a bool only a bool."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):
        return False


def _layout_or_error(opt: Mapping[str, Any]) -> Mapping[str, tuple[int, ...]] | OptionError:
    """``_meta_layout`` that returns the OptionError (naming the argument, as ``metadata.<arg>``) instead of None
    when the class refuses the arguments."""
    from anysr.archs import build_network  # noqa: PLC0415 - archs/__init__ imports every arch module (and this one)

    try:
        with torch.device("meta"):
            net = build_network(dict(opt), key_path="metadata")
        return {k: tuple(v.shape) for k, v in net.state_dict().items()}
    except OptionError as exc:
        return exc
    except (TypeError, ValueError, RuntimeError, NotImplementedError, AssertionError, IndexError, KeyError,
            ZeroDivisionError, AttributeError) as exc:
        return OptionError(f"metadata: {opt['type']} cannot be built with {short_repr(dict(opt), 200)}: "
                           f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")


def with_hyperparameters(found: Recognised, hyperparameters: Mapping[str, Any], state: Mapping[str, Any],
                         source: str = "the weights") -> Recognised:
    """``found`` with the constructor arguments a file records (traiNNer-redux's ``metadata``: keyword arguments
    only) merged in: only names the class takes (the others are listed in ``ignored``); a recorded value replaces
    ``found``'s when the network it builds still has exactly the file's names and shapes (the shapes cannot tell
    the two apart: ``img_range``, an activation without weights), else the shapes win (``overruled``). A value
    the class refuses for an argument the shapes do not decide raises its OptionError, naming the argument and
    ``source``."""
    from anysr.archs import arch_kwargs  # noqa: PLC0415 - archs/__init__ imports every arch module (and this one)

    params = arch_kwargs(str(found.opt["type"]))
    taken = {k: v for k, v in hyperparameters.items() if k in params and k != "type"}
    ignored = tuple(k for k in hyperparameters if k not in taken)
    changes = {k: v for k, v in taken.items() if not _same(found.opt.get(k, params[k]), v)}
    agreed = tuple(k for k in taken if k not in changes)
    if not changes:
        return replace(found, ignored=ignored, agreed=agreed)
    shapes = StateShapes(state).shapes
    opt = dict(found.opt)
    accepted: dict[str, Any] = {}
    overruled: dict[str, tuple[Any, Any]] = {}
    if _layout_or_error({**opt, **changes}) == shapes:  # the usual case: one build
        accepted = dict(changes)
    else:
        for k, v in changes.items():
            layout = _layout_or_error({**opt, **accepted, k: v})
            if layout == shapes:
                accepted[k] = v
            elif isinstance(layout, OptionError) and k not in found.inferred:
                raise RecordedValueError(f"{source}: {str(layout).splitlines()[0]} (the value recorded in the file's "
                                  "metadata); name the network with --arch NAME [--arch-opt k=v ...] or "
                                  "-opt FILE.yml") from None
            else:  # the tensors say otherwise: they are what gets loaded
                overruled[k] = (v, opt.get(k, params[k]))
    opt.update(accepted)
    inferred = {k: v for k, v in found.inferred.items() if k not in accepted}
    return Recognised(opt, inferred, found.others, accepted, overruled, ignored, agreed)


def _prefer_takers(found: list[Recognised], hyperparameters: Mapping[str, Any]) -> list[Recognised]:
    """``found`` with the families whose constructors take the most of the recorded argument names first (stable:
    registration order among equals)."""
    from anysr.archs import arch_kwargs  # noqa: PLC0415 - archs/__init__ imports every arch module (and this one)

    def taken(r: Recognised) -> int:
        params = arch_kwargs(str(r.opt["type"]))
        return sum(1 for k in hyperparameters if k in params)

    return sorted(found, key=lambda r: -taken(r))


_NAME_THE_NETWORK = "name the network with --arch NAME [--arch-opt k=v ...] or -opt FILE.yml"


def _unrecognised_layout(state: Mapping[str, Any]) -> str | None:
    """The registered architecture anysr does not recognise as an image network (a discriminator, a flow network)
    whose default layout has the names of ``state`` (block indices ignored), else None."""
    from anysr.registry import ARCH_REGISTRY  # noqa: PLC0415 - filled as the arch modules import

    mine = StateShapes(state).patterns()
    recognised = tuple(ARCH_REGISTRY.get(a) for a in RECOGNISERS if a in ARCH_REGISTRY)
    for arch in ARCH_REGISTRY.keys():
        cls = ARCH_REGISTRY.get(arch)
        if arch in RECOGNISERS or isinstance(cls, type) and issubclass(cls, recognised):
            continue  # a recognised family, or a variant of one (HAT_iLN is HAT's): an image network
        layout = _meta_layout({"type": arch}) or _meta_layout({"type": arch, "num_in_ch": 3})
        if layout is not None and StateShapes(layout).patterns() == mine:
            return arch
    return None


def _refuse_non_network(state: Mapping[str, Any], source: str) -> None:
    """One line for a file that holds no network anysr could run: no tensors, no floating-point tensor, or the
    weights of a discriminator / sub-network given as the network."""
    if not state:
        raise OptionError(f"{source}: holds no tensors (an empty state dict): not a network's weights; pass the "
                          "file of the trained network (or check --param-key / path.param_key_g)")
    if not any(getattr(v, "is_floating_point", lambda: True)() for v in state.values()):
        kinds = sorted({str(getattr(v, "dtype", "?")).replace("torch.", "") for v in state.values()})
        raise OptionError(f"{source}: its {len(state)} tensor(s) hold no floating-point values ({', '.join(kinds)} "
                          "only): not a network's weights; pass the file of the trained network")
    other = _unrecognised_layout(state)
    if other is not None:
        what = "a discriminator" if "discrim" in other.lower() else "a network anysr does not run as an image network"
        raise OptionError(f"{source}: its names are those of {other} ({what}), not of a network that makes images; "
                          "pass the generator's weights (net_g_*), or " + _NAME_THE_NETWORK)


def recognise(state: Mapping[str, Any], source: str = "the weights",
              hyperparameters: Mapping[str, Any] | None = None) -> Recognised:
    """The one architecture ``state`` is (the first registered family that fits when several do; with
    ``hyperparameters``, the file's recorded constructor arguments, the fitting families that take the most of
    their names come first, and they are merged in: ``with_hyperparameters``), else OptionError naming the
    closest families and how to name the network instead."""
    found = recognise_all(state)
    if found and hyperparameters:
        found = _prefer_takers(found, hyperparameters)
    if not found:
        _refuse_non_network(state, source)
        close = closest_families(state)
        near = ", ".join(f"{a} ({s:.0%} of its names)" for a, s in close) or "none shares its names"
        tensors = f"{len(state)} tensor" + ("" if len(state) == 1 else "s")
        raise OptionError(f"{source}: its {tensors} fit none of anysr's {len(RECOGNISERS)} architectures (closest: "
                          f"{near}); {_NAME_THE_NETWORK}")
    first = found[0]
    first = Recognised(first.opt, first.inferred, tuple(str(r.opt["type"]) for r in found[1:]))
    return with_hyperparameters(first, hyperparameters, state, source) if hyperparameters else first


__all__ = ["RECOGNISERS", "NotThisFamily", "Recognised", "RecordedValueError", "StateShapes", "closest_families",
           "computed_buffers", "dropped_buffers", "layout_fits", "recognise", "recognise_all", "register_recogniser",
           "shuffle_splits", "upsample_scale", "width_ratio", "with_hyperparameters"]

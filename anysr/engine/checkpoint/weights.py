"""Network weights: anysr .safetensors (groups, rebuild metadata, digests) and BasicSR / foreign .pth files,
read safely (``weights_only=True``, memory-mapped where the archive allows), checked, and loaded into a net."""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import zipfile
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch
from safetensors import safe_open
from safetensors.torch import save as safetensors_save
from torch import nn

from anysr.archs.recognition.recognise import computed_buffers, dropped_buffers
from anysr.atomic import atomic_write_bytes
from anysr.engine.checkpoint.common import STATE_KEY, WEIGHTS_FORMAT, PathLike, compact, first
from anysr.engine.checkpoint.hub import find_weights, resolve_weights
from anysr.engine.checkpoint.integrity import (
    check_zip_stamp,
    describe_load_error,
    has_stamp_magic,
    save_stamped,
    tree_digest,
)
from anysr.engine.checkpoint.state import STATE_RE
from anysr.errors import CheckpointError, OptionError

logger = logging.getLogger("anysr.engine.checkpoint")

_WEIGHTS_FIX = ("Fix: re-download or re-export it, or point the option naming it "
                "(e.g. path.pretrain_network_g) at another file")
_RESERVED_META = ("anysr_format", "groups", "digest")
_WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def _host_tensor(t: torch.Tensor, where: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise CheckpointError(f"cannot save weights: {where} is a {type(t).__name__}, not a tensor")
    if t.layout != torch.strided:
        raise CheckpointError(f"cannot save weights: {where} is a {t.layout} tensor; store it dense")
    return compact(t.detach().cpu().contiguous())


def _host_groups(groups: Mapping[str, Mapping[str, torch.Tensor]],
                 path: Path) -> dict[str, dict[str, torch.Tensor]]:
    if not isinstance(groups, Mapping) or not groups:
        raise CheckpointError(f"cannot save weights {path}: groups must be a non-empty dict like "
                              "{'params': net.state_dict()}")
    out: dict[str, dict[str, torch.Tensor]] = {}
    seen: set[int] = set()
    for group, sd in groups.items():
        if not isinstance(group, str) or not group or "." in group:
            raise CheckpointError(f"cannot save weights {path}: group name {group!r} must be a non-empty "
                                  "string without '.' (e.g. 'params', 'params_ema')")
        if not isinstance(sd, Mapping):
            raise CheckpointError(f"cannot save weights {path}: group {group!r} is a {type(sd).__name__}, "
                                  "not a state dict")
        out[group] = {}
        for name, t in sd.items():
            t = _host_tensor(t, f"{group}.{name}")
            ptr = t.untyped_storage().data_ptr()
            if t.numel() and ptr in seen:
                t = t.clone()  # tied or repeated tensors: safetensors stores each one on its own
            seen.add(t.untyped_storage().data_ptr())
            out[group][str(name)] = t
    return out


def _metadata_digest(meta: Mapping[str, str], digests: Mapping[str, str], names: list[str]) -> str:
    """Digest of the metadata strings (but the digest record), the per-group digests and all tensor names."""
    return tree_digest({"metadata": {k: v for k, v in meta.items() if k != "digest"},
                        "groups": {k: v for k, v in digests.items() if k != "__metadata__"},
                        "names": sorted(names)})


def save_weights(path: PathLike, groups: Mapping[str, Mapping[str, torch.Tensor]],
                 metadata: Mapping[str, Any] | None = None) -> Path:
    """Atomically write ``groups`` (e.g. ``{'params': sd, 'params_ema': sd}``) as one ``.safetensors`` file.

    Tensors are named ``<group>.<param>``; each ``metadata`` value (``network_g`` options, ``scale``,
    ``iteration``, ...) is stored JSON-encoded next to ``anysr_format``, ``groups`` and a ``digest`` of
    the tensors and metadata, so the net can be rebuilt and verified from the file alone.
    """
    path = Path(path)
    host = _host_groups(groups, path)
    meta: dict[str, str] = {}
    for key, value in (metadata or {}).items():
        if key in _RESERVED_META:
            raise CheckpointError(f"cannot save weights {path}: metadata key '{key}' is reserved; rename it")
        try:
            meta[str(key)] = json.dumps(value, sort_keys=True, allow_nan=True)
        except (TypeError, ValueError) as exc:
            raise CheckpointError(f"cannot save weights {path}: metadata '{key}' is not JSON-serialisable "
                                  f"({exc}); pass plain dicts, lists, strings and numbers") from None
    meta["anysr_format"] = json.dumps(WEIGHTS_FORMAT)
    meta["groups"] = json.dumps(list(host))
    digests = {g: tree_digest(sd) for g, sd in host.items()}
    tensors = {f"{g}.{name}": t for g, sd in host.items() for name, t in sd.items()}
    digests["__metadata__"] = _metadata_digest(meta, digests, list(tensors))
    meta["digest"] = json.dumps(digests, sort_keys=True)
    return atomic_write_bytes(path, safetensors_save(tensors, metadata=meta))


def save_weights_pth(path: PathLike, groups: Mapping[str, Mapping[str, torch.Tensor]]) -> Path:
    """Atomically write a BasicSR-compatible ``torch.save({'params': sd, 'params_ema': sd})`` file.

    The zip comment carries a whole-file sha256 that ``load_weights`` checks (torch and BasicSR ignore it).
    """
    path = Path(path)
    return save_stamped(path, _host_groups(groups, path))


def _strip_wrapper_prefixes(sd: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """Drop leading ``module.`` (DDP) / ``_orig_mod.`` (torch.compile) from every name."""
    out: dict[str, Any] = {}
    for name, value in sd.items():
        key = str(name)
        stripped = True
        while stripped:
            stripped = False
            for prefix in _WRAPPER_PREFIXES:
                if key.startswith(prefix):
                    key = key[len(prefix):]
                    stripped = True
        if key in out:
            raise CheckpointError(f"weights {path}: '{name}' and another entry both become '{key}' once "
                                  "the DDP/compile prefixes are removed; the file mixes wrapped and "
                                  "unwrapped names. Fix: re-export it from the unwrapped network")
        out[key] = value
    return out


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, Mapping) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


AUTO_KEY = "auto"
_AUTO_ORDER = ("params_ema", "params")


def _pick_group(available: list[str], param_key: str, path: Path, extra: tuple[str, ...] = (),
                key_option: str = "path.param_key_g") -> str:
    """The group to load: ``param_key``; ``params_ema`` falls back to ``params``; ``params`` to ``extra``.

    ``auto``: ``params_ema``, then ``params``, then ``extra``, then the only group there is."""
    if param_key == AUTO_KEY:
        for name in (*_AUTO_ORDER, *extra):
            if name in available:
                return name
        if len(available) == 1:
            return available[0]
    elif param_key in available:
        return param_key
    if param_key == "params_ema" and "params" in available:
        logger.info("%s holds no 'params_ema' (EMA) weights, as Real-ESRGAN's releases; loading 'params'", path)
        return "params"
    for alt in extra if param_key != AUTO_KEY else ():
        if alt in available:
            if param_key == "params_ema":
                logger.info("%s holds no 'params_ema' (EMA) weights; loading '%s'", path, alt)
            return alt
    listed = ", ".join(repr(k) for k in available) or "none"
    wanted = "'params_ema' or 'params'" if param_key == AUTO_KEY else f"'{param_key}'"
    raise CheckpointError(f"weights {path} have no {wanted} entry; it holds: {listed}. "
                          f"Fix: set {key_option} to one of them")


def _weights_kind(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return "safetensors"
    if suffix in (".pth", ".pt", ".ckpt", ".bin"):
        return "torch"
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError as exc:
        raise CheckpointError(f"cannot read weights {path}: {exc}") from exc
    if head[:2] == b"PK" or head[:1] == b"\x80":
        return "torch"
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"
    raise CheckpointError(f"weights {path}: unknown format; expected a .safetensors, .pth, .pt or .ckpt file")


def _decode_metadata(raw: Mapping[str, str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (raw or {}).items():
        if key == "digest":
            continue
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value  # a plain string from another tool
    return out


def _checked_anysr_meta(raw_meta: Mapping[str, str], names: list[str],
                        path: Path) -> tuple[list[str], dict[str, str], dict[str, Any]]:
    """``(groups, recorded digests, decoded metadata)`` of one of our files, after checking that the
    metadata, the digest record and the tensor names agree (a flipped byte in the header is refused)."""
    def corrupt(what: str) -> CheckpointError:
        return CheckpointError(f"weights {path} are corrupt: {what} (the file changed after it was "
                               f"written). {_WEIGHTS_FIX}")

    if any(key not in raw_meta for key in _RESERVED_META):
        raise corrupt("part of the anysr header is missing")
    try:
        fmt = json.loads(raw_meta["anysr_format"])
        groups = json.loads(raw_meta["groups"])
        digests = json.loads(raw_meta["digest"])
    except ValueError:
        raise corrupt("the anysr header does not parse") from None
    if not (isinstance(groups, list) and groups and all(isinstance(g, str) for g in groups)
            and isinstance(digests, dict) and set(digests) == {*groups, "__metadata__"}):
        raise corrupt("the group list and the digest record disagree")
    if fmt != WEIGHTS_FORMAT:
        raise CheckpointError(f"weights {path}: unknown anysr weights format {fmt!r} (this anysr reads "
                              f"format {WEIGHTS_FORMAT}): written by another anysr version, or corrupt. "
                              f"{_WEIGHTS_FIX}")
    if digests["__metadata__"] != _metadata_digest(raw_meta, digests, names):
        raise corrupt("checksum mismatch in the metadata")
    stray = [n for n in names if n.split(".", 1)[0] not in groups]
    if stray:
        raise corrupt(f"tensor name {stray[0]!r} belongs to none of the groups {groups}")
    return groups, digests, _decode_metadata(raw_meta)


def _load_safetensors(path: Path, param_key: str | None, key_option: str = "path.param_key_g"
                      ) -> tuple[dict[str, torch.Tensor], dict[str, Any], str | None]:
    """Tensors of ``param_key`` (all of them for a foreign file; none when None), the metadata and the group read
    (None: the whole file)."""
    group = None
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            raw_meta = f.metadata() or {}
            names = list(f.keys())
            if not any(key in raw_meta for key in _RESERVED_META):  # a plain file from another tool
                sd = {n: f.get_tensor(n) for n in names} if param_key is not None else {}
                return sd, _decode_metadata(raw_meta), None
            groups, digests, meta = _checked_anysr_meta(raw_meta, names, path)
            if param_key is None:
                return {}, meta, None
            group = _pick_group(groups, param_key, path, key_option=key_option)
            prefix = group + "."
            sd = {n[len(prefix):]: f.get_tensor(n) for n in names if n.startswith(prefix)}
    except CheckpointError:
        raise
    except Exception as exc:  # safetensors raises its own error types for bad headers and short files
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"weights {path} are truncated or corrupt ({type(exc).__name__}: {msg}). "
                              f"{_WEIGHTS_FIX}") from exc
    if digests[group] != tree_digest(sd):
        raise CheckpointError(f"weights {path}: checksum mismatch in '{group}' (the file changed "
                              f"after it was written). {_WEIGHTS_FIX}")
    return sd, meta, group


def _stored_zip(f: BinaryIO) -> bool:
    """Whether ``f`` is a zip archive whose records are all stored uncompressed, as ``torch.save`` writes them.

    ``torch.load`` with ``mmap=True`` reads each record at its offset in the file, so a legacy (pre-1.6) file or an
    archive re-zipped with compression must be read the ordinary way (mapped, it would give wrong values).
    """
    if f.read(4) != b"PK\x03\x04":
        return False
    try:
        with zipfile.ZipFile(f) as zf:
            return all(info.compress_type == zipfile.ZIP_STORED for info in zf.infolist())
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, struct.error, NotImplementedError):
        return False  # torch.load says what is wrong with it


def _scan_torch_file(path: Path) -> tuple[str, bool]:
    """``(stamp status, can be memory-mapped)`` of a torch file, read through a memory map (no copy in memory)."""
    try:
        with open(path, "rb") as f:
            data: Any = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else b""
            mappable = _stored_zip(f)
    except OSError as exc:
        raise CheckpointError(f"cannot read weights {path}: {exc}") from exc
    try:
        return (check_zip_stamp(data) if has_stamp_magic(data) else "absent"), mappable
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


def _check_zip_crcs(path: Path) -> None:
    """A foreign ``.pth`` carries no stamp of ours: verify the CRC-32 its zip records hold (one sequential read)."""
    try:
        with zipfile.ZipFile(path) as zf:
            bad = zf.testzip()
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, struct.error, zlib.error,
            NotImplementedError):  # a damaged header can claim a zip version or compression zipfile lacks
        return  # not a readable zip: torch.load says what is wrong with it
    if bad is not None:
        raise CheckpointError(f"weights {path} are corrupt: the record '{bad}' fails its zip CRC check (a damaged "
                              f"download or copy). {_WEIGHTS_FIX}")


_FOREIGN_GROUPS = ("state_dict", "model", "net_g", "netG", "generator")


class _LightningCallbackKey:
    """Stands for a Lightning callback class, which Lightning before 1.5 pickled as the key of a checkpoint's
    ``callbacks`` entry (``{ModelCheckpoint: {...}}``; RestoreFormer++'s release, Lightning 1.0.8): the weights-only
    unpickler may name it; nothing of Lightning is imported or run."""


_LIGHTNING_CALLBACK_KEYS = [(_LightningCallbackKey, f"pytorch_lightning.callbacks.{module}.{name}")
                            for module, name in (("model_checkpoint", "ModelCheckpoint"),
                                                 ("early_stopping", "EarlyStopping"))]
_LIGHTNING_LOSSES = "loss."


def _lightning_network(sd: dict[str, Any], path: Path) -> dict[str, Any]:
    """A Lightning module's ``state_dict`` without its training losses (``loss.*``: taming-transformers' layout, as
    RestoreFormer(++)'s: discriminators, LPIPS, ArcFace) and, when the rest sits under one module attribute that is
    a known wrapper (``vqvae.``, ``model.``, ...: ``_CONTAINER_PREFIXES``), without that prefix; unchanged when it
    has no ``loss.`` entries besides others."""
    rest = {k: v for k, v in sd.items() if not k.startswith(_LIGHTNING_LOSSES)}
    if not rest or len(rest) == len(sd):
        return sd
    head = next((p for p in _CONTAINER_PREFIXES if all(k.startswith(p) for k in rest)), "")
    logger.info("%s: a Lightning checkpoint: its %d '%s' tensors (the training losses' networks) are not the network "
                "and are ignored%s", path, len(sd) - len(rest), _LIGHTNING_LOSSES,
                f"; the network is its '{head}' entries (prefix removed)" if head else "")
    return {k[len(head):]: v for k, v in rest.items()}


_TRAINNER_META = "metadata"  # traiNNer-redux's record of the network's constructor arguments, beside the groups


def _load_torch_weights(path: Path, param_key: str, key_option: str = "path.param_key_g"
                        ) -> tuple[dict[str, torch.Tensor], str | None, dict[str, Any]]:
    """``(state dict, group read, metadata)``: the metadata is ``{"metadata": ...}`` when the file is a container
    with traiNNer-redux's ``metadata`` entry (the network's hyperparameters; plain values, read weights-only like
    the rest), else ``{}``."""
    stamp, mappable = _scan_torch_file(path)
    if stamp != "absent" and stamp != "ok":
        what = "checksum mismatch" if stamp == "mismatch" else "truncated or corrupt end of archive"
        raise CheckpointError(f"weights {path}: {what} (the file changed after it was written). "
                              f"{_WEIGHTS_FIX}")
    if stamp == "absent":
        _check_zip_crcs(path)
    try:
        # torch.save archives are memory-mapped: tensors are views of the page cache, shared by every process
        # reading the file, and only the group loaded into the net is ever touched.
        with torch.serialization.safe_globals(_LIGHTNING_CALLBACK_KEYS):
            obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mappable)
    except Exception as exc:  # any unpickler failure means an unusable file
        fix = _PICKLED_FIX.format(path=path) if "Weights only load failed" in str(exc) else _WEIGHTS_FIX
        raise CheckpointError(f"weights {path} cannot be loaded: {describe_load_error(exc)}. {fix}") from exc
    if _is_state_dict(obj):
        return dict(obj), None, {}
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"weights {path} hold a {type(obj).__name__}, not a state dict. "
                              f"{_WEIGHTS_FIX}")
    if STATE_KEY in obj:
        raise _training_state_given(path)
    available = [str(k) for k, v in obj.items() if _is_state_dict(v)]
    if not available:
        raise _no_state_dict(obj, path)
    group = _pick_group(available, param_key, path, extra=_FOREIGN_GROUPS, key_option=key_option)
    sd = dict(obj[group])
    meta = {_TRAINNER_META: obj[_TRAINNER_META]} if _TRAINNER_META in obj and group != _TRAINNER_META else {}
    return (_lightning_network(sd, path) if group == "state_dict" else sd), group, meta


_PICKLED_FIX = ("Fix: anysr never runs pickled code; if you trust the file, convert it once to a state dict: python "
                "-c \"import torch; obj = torch.load('{path}', weights_only=False); "
                "torch.save(obj.state_dict() if hasattr(obj, 'state_dict') else obj['params'], 'plain.pth')\" "
                "and pass plain.pth")
# Entries of a training state (BasicSR's, traiNNer-redux's, neosr's .state), which holds no network weights
_TRAINING_STATE_ENTRIES = ("optimizers", "schedulers", "iter")


def _no_state_dict(obj: Mapping[Any, Any], path: Path) -> CheckpointError:
    """The error for a ``.pth`` container with no state dict in it: a training state saved under another name, or
    something else (its entries listed)."""
    keys = [str(k) for k in obj]
    if sum(k in keys for k in _TRAINING_STATE_ENTRIES) >= 2:
        return CheckpointError(f"weights {path} is a training state (entries {', '.join(keys[:6])}: optimizers and "
                               "schedulers, no network weights), as BasicSR / traiNNer-redux / neosr write beside "
                               "their weights; pass the network's file instead (models/net_g_<iteration>"
                               ".safetensors or .pth)")
    listed = ", ".join(repr(k) for k in keys[:8]) + (", ..." if len(keys) > 8 else "") if keys else "nothing"
    return CheckpointError(f"weights {path} hold no state dict (a mapping of names to tensors); its entries: "
                           f"{listed}. Fix: pass a file of network weights (BasicSR's params / params_ema, or a bare "
                           "state dict)")


def _training_state_given(path: Path) -> CheckpointError:
    # In an experiment folder the weights sit beside training_states/; elsewhere only the layout can be named
    models = path.parent.parent / "models" if path.parent.name == "training_states" else "the experiment's models"
    return CheckpointError(f"{path} is a training state (what --auto_resume / path.resume_state continue from), "
                           f"not network weights; the weights saved with it are {models}/net_g_<iteration>."
                           "safetensors (and net_g_latest.safetensors)")


_FINITE_CHECKED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_finite(sd: Mapping[str, torch.Tensor], path: Path) -> None:
    """Refuse weights holding NaN or infinity (a broken training run or a damaged file), naming the tensor."""
    for name, t in sd.items():
        if not t.is_floating_point():
            continue
        if t.dtype not in _FINITE_CHECKED:  # float8 kinds: isfinite has no kernel for them
            t = t.float()
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"weights {path}: tensor '{name}' holds NaN or infinite values; the network "
                                  f"would output garbage. {_WEIGHTS_FIX}")


def load_weights(path: PathLike, param_key: str = "params", *,
                 key_option: str = "path.param_key_g") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read network weights on the CPU: ``(state_dict, metadata)``.

    ``.safetensors`` (ours: the ``param_key`` group, verified; any other: all tensors) are memory-mapped
    through ``safe_open``; ``.pth``/``.pt``/``.ckpt`` (BasicSR ``{'params', 'params_ema'}``, a bare state dict,
    or a ``state_dict`` entry: a Lightning checkpoint's without its ``loss.*`` part, ``_lightning_network``) go
    through ``torch.load(weights_only=True, mmap=True)``, legacy pre-1.6 files without ``mmap`` (a container's
    ``metadata`` entry, traiNNer-redux's hyperparameters, is returned as ``{"metadata": ...}``). The tensors are
    views of the file's pages: copy them into the net (``load_into``) and drop them. ``params_ema`` falls back to
    ``params`` (one info line); ``auto`` takes ``params_ema``, then ``params``, then a bare state dict. Leading
    ``module.`` / ``_orig_mod.`` are stripped from the names. Foreign ``.pth`` archives are checked against their
    zip CRCs, and weights holding NaN or infinity are refused. ``key_option`` names the option that sets
    ``param_key`` in errors.
    """
    sd, meta, _ = read_weights(path, param_key, key_option=key_option)
    return sd, meta


def read_weights(path: PathLike, param_key: str = "params", *, key_option: str = "path.param_key_g"
                 ) -> tuple[dict[str, torch.Tensor], dict[str, Any], str | None]:
    """``load_weights`` that also says which group it read (None: the file is one bare state dict)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"weights {path} do not exist. {_WEIGHTS_FIX}")
    if not path.is_file():
        raise CheckpointError(f"weights {path} is not a file; point the option at a .safetensors "
                              "or .pth file")
    if STATE_RE.match(path.name):
        raise _training_state_given(path)
    if _weights_kind(path) == "safetensors":
        sd, meta, group = _load_safetensors(path, param_key, key_option)
    else:
        sd, group, meta = _load_torch_weights(path, param_key, key_option)
    _check_finite(sd, path)
    return _known_layout(_drop_profiler_counters(_strip_wrapper_prefixes(sd, path), path), path), meta, group


def _known_layout(sd: dict[str, Any], path: Path) -> dict[str, Any]:
    """``sd`` under anysr's names when it is in another layout an arch module registered
    (``anysr.archs.recognition.layouts``: e.g. the original ESRGAN code's ``model.N`` names)."""
    import anysr.archs  # noqa: F401, PLC0415 - the arch modules register their layouts when imported
    from anysr.archs.recognition.layouts import to_known_layout  # noqa: PLC0415

    out, layout = to_known_layout(sd)
    if layout is not None:
        logger.info("%s: %s, renamed to %s's names", path, layout.what, layout.arch)
    return out


_PROFILER_COUNTERS = ("total_ops", "total_params")  # one-element buffers thop's profiler leaves in every module


def _drop_profiler_counters(sd: dict[str, Any], path: Path) -> dict[str, Any]:
    """``sd`` without the counters thop's profiler leaves in every module (released Omni-SR checkpoints carry
    them): they are not weights, and a strict check of the names would refuse the file."""
    counters = [k for k, v in sd.items() if k.rsplit(".", 1)[-1] in _PROFILER_COUNTERS and v.numel() == 1]
    if not counters:
        return sd
    logger.info("%s: dropped %d profiler counters (%s, ...: thop's, not weights)", path, len(counters), counters[0])
    return {k: v for k, v in sd.items() if k not in set(counters)}


def read_weights_metadata(path: PathLike) -> dict[str, Any]:
    """The decoded metadata of a ``.safetensors`` weights file (checked against its digest when ours);
    ``{}`` for ``.pth`` files, which carry none."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights {path} do not exist or are not a file. {_WEIGHTS_FIX}")
    if _weights_kind(path) != "safetensors":
        return {}
    return _load_safetensors(path, None)[1]


# --------------------------------------------------------------------------------------------- into a network
_CONTAINER_PREFIXES = ("module.", "netG.", "net_g.", "model.", "generator.", "_orig_mod.", "vqvae.")


def strip_container_prefix(sd: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """Drop a prefix that every name shares (``netG.``, ``model.``, ``module.``, ...: the network was saved inside
    a wrapper; ``vqvae.``: RestoreFormer(++)'s Lightning module); returns the state dict and the prefix removed
    ('' when none)."""
    out, removed = dict(sd), ""
    for _ in range(3):  # nested wrappers, e.g. model.module.
        names = list(out)
        prefix = next((p for p in _CONTAINER_PREFIXES if names and all(n.startswith(p) for n in names)), None)
        if prefix is None:
            break
        out = {n[len(prefix):]: v for n, v in out.items()}
        removed += prefix
    return out, removed


def _align_prefixes(own: Mapping[str, Any], sd: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """``sd`` with a wrapper prefix every name shares removed, when that makes more of its names the network's."""
    if not sd or all(k in own for k in sd):
        return sd
    stripped, prefix = strip_container_prefix(sd)
    if prefix and sum(k in own for k in stripped) > sum(k in own for k in sd):
        logger.info("%s: names start with '%s' (the network was saved inside a wrapper); stripped", source, prefix)
        return stripped
    return sd


def _shape(t: Any) -> str:
    return str(tuple(t.shape)) if isinstance(t, torch.Tensor) else "-"


def mismatch_table(own: Mapping[str, Any], theirs: Mapping[str, Any], limit: int = 20) -> str:
    """A table of the names whose tensors do not fit: shape differs, missing from the file, not in the network
    (at most ``limit`` rows, then how many more); '' when everything fits."""
    rows: list[tuple[str, str, str, str]] = []
    for k, mine in own.items():
        other = theirs.get(k)
        if other is None:
            rows.append((k, "-", _shape(mine), "missing from the file"))
        elif isinstance(mine, torch.Tensor) and isinstance(other, torch.Tensor) and other.shape != mine.shape:
            rows.append((k, _shape(other), _shape(mine), "shape differs"))
    rows.extend((k, _shape(v), "-", "not in the network") for k, v in theirs.items() if k not in own)
    if not rows:
        return ""
    order = {"shape differs": 0, "missing from the file": 1, "not in the network": 2}
    rows.sort(key=lambda r: order[r[3]])  # stable: network / file order within each kind
    shown = rows[:limit]
    head = ("name", "file", "network", "")
    widths = [max(len(r[i]) for r in [head, *shown]) for i in range(3)]
    lines = ["  ".join(cell.ljust(widths[i]) if i < 3 else cell for i, cell in enumerate(r)).rstrip()
             for r in [head, *shown]]
    if len(rows) > limit:
        lines.append(f"... and {len(rows) - limit} more")
    return "\n".join("  " + line for line in lines)


def state_dict_mismatch(own: Mapping[str, Any], theirs: Mapping[str, Any]) -> tuple[list[str], set[str]]:
    """How ``theirs`` differs from ``own`` (missing / unexpected keys, shape mismatches, first few of each),
    and the names whose shapes differ."""
    missing = [k for k in own if k not in theirs]
    unexpected = [k for k in theirs if k not in own]
    bad: dict[str, str] = {}
    for k, mine in own.items():
        other = theirs.get(k)
        if isinstance(mine, torch.Tensor) and isinstance(other, torch.Tensor) and other.shape != mine.shape:
            bad[k] = f"{k}: file {tuple(other.shape)} vs network {tuple(mine.shape)}"
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {first(missing)}")
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {first(unexpected)}")
    if bad:
        problems.append(f"shape mismatches ({len(bad)}): {first(list(bad.values()))}")
    return problems, set(bad)


def _as_declared(state_dict: Mapping[str, Any], net: nn.Module | None) -> Mapping[str, Any]:
    """``state_dict`` as ``net`` declares it may differ from its own: names a reference stores that ``net``
    computes dropped (``dropped_buffers``), buffers ``net`` computes that the file lacks taken from ``net``
    (``computed_buffers``)."""
    if net is None:
        return state_dict
    dropped, computed = dropped_buffers(net), computed_buffers(net)
    out = {k: v for k, v in state_dict.items() if k not in dropped}
    out.update({k: v for k, v in computed.items() if k not in out})
    return out


def check_fits(own: Mapping[str, Any], state_dict: Mapping[str, Any], *, source: str,
               fix: str = "check that network_g matches the file", net: nn.Module | None = None
               ) -> Mapping[str, Any]:
    """``state_dict`` (a wrapper prefix removed) when its names and shapes are exactly those of ``own`` (a network's
    state dict, possibly of a network built on the meta device), else CheckpointError: a summary line naming
    ``source`` and ``fix``, then a table of the names that do not fit. With ``net`` (the network ``own`` is of),
    what it declares it computes is neither demanded nor refused (``_as_declared``)."""
    state_dict = _as_declared(_align_prefixes(own, state_dict, source), net)
    problems, bad = state_dict_mismatch(own, state_dict)
    if problems:
        fitting = sum(1 for k in own if k in state_dict and k not in bad)
        raise CheckpointError(f"{source} does not fit the network ({fitting} of {len(own)} tensors fit): "
                              + "; ".join(problems) + f". Fix: {fix}\n" + mismatch_table(own, state_dict))
    return state_dict


def load_into(net: nn.Module, state_dict: Mapping[str, Any], *, strict: bool, source: str,
              fix: str = "check that network_g matches the file, or set path.strict_load_g: false to load "
                         "what matches") -> None:
    """Load ``state_dict`` into ``net``.

    A wrapper prefix every name shares (``netG.``, ``model.``, ...) is removed when the network's names lack it;
    buffers the network computes keep their values when the file lacks them, and copies of them a reference stores
    are dropped (``_as_declared``).
    Missing / unexpected keys or shape mismatches raise CheckpointError naming ``source`` (a summary line, the
    fix, then a table of the names that do not fit) when ``strict``; otherwise the tensors whose name and shape
    match are loaded (a shape-compatible partial load, e.g. the body of an x2 network into an x4 one to fine-tune)
    and the rest is logged as skipped, with the table (loading nothing at all is still an error: the file is for
    another network).
    """
    own = net.state_dict()
    if strict:
        net.load_state_dict(dict(check_fits(own, state_dict, source=source, fix=fix, net=net)), strict=True)
        return
    state_dict = _as_declared(_align_prefixes(own, state_dict, source), net)
    problems, bad = state_dict_mismatch(own, state_dict)
    matching = {k: v for k, v in state_dict.items() if k in own and k not in bad}
    if own and not matching:
        raise CheckpointError(f"{source}: none of its {len(state_dict)} entries match the network's "
                              f"{len(own)} (file: {first(list(state_dict), 3)}; network: "
                              f"{first(list(own), 3)}). Fix: check network_g and the file")
    net.load_state_dict(matching, strict=False)
    if problems:
        logger.warning("%s: loaded %d of %d network tensors; skipped %s (those keep their initial values)\n%s",
                       source, len(matching), len(own), "; ".join(problems), mismatch_table(own, state_dict))


def load_model_weights(model: Any, *, fresh: bool, stand_ins: bool = False) -> list[str]:
    """Read every weights file ``model.weight_needs()`` names and hand it over; returns one log line per file.

    ``fresh``: the run starts from scratch (a resumed run skips ``fresh_only`` needs: its state has them).
    A required file that is not set is found by name when it is a standard one (``need.known``: torch hub's cache,
    else a verified download, ``hub.resolve_weights``), else an OptionError naming its option; with ``stand_ins``
    (``anysr bench``: only the speed matters) random weights of the right layout stand in for files not set or
    not there (a standard file already in the cache is used, none is downloaded).
    """
    done = []
    for need in model.weight_needs():
        if need.fresh_only and not fresh:
            continue
        path, how = need.path, ""
        if not path and need.known:  # a standard file: torch hub's cache, else downloaded once (bench: found only)
            found = find_weights(need.known) if stand_ins and need.stand_in is not None else None
            if found is not None or not stand_ins or need.stand_in is None:
                path, how = str(found or resolve_weights(need.known, need.option)), ", found by name"
        if not path or (stand_ins and not Path(path).is_file()):
            if need.required and stand_ins and need.stand_in is not None:
                need.apply(need.stand_in(), _loader(need, "random stand-in weights"))
                done.append(f"{need.name}: random stand-in weights ({need.option} not set; timing only)")
            elif need.required:
                raise OptionError(f"{need.option}: {need.missing or 'required'}")
            elif need.unset and not stand_ins:
                done.append(need.unset)
            continue
        sd, _ = load_weights(path, need.param_key, key_option=need.key_option)
        need.apply(sd, _loader(need, path))
        del sd  # memory-mapped file tensors: the network holds its copy
        done.append(f"loaded pretrained weights {path} [{need.param_key}] ({need.name}{how})")
    return done


def _loader(need: Any, source: str) -> Any:
    option = need.option.replace("pretrain_network", "strict_load")
    fix = f"check that the network options match the file, or set {option}: false to load what matches" \
        if option != need.option else f"check that {need.option} names the right file for this network"
    return lambda net, sd: load_into(net, sd, strict=need.strict, source=source, fix=fix)

"""Standard weight files the losses and metrics need, found by name instead of handed in.

The table ``KNOWN`` names every file (torchvision's VGG19 / VGG19-BN / VGG16 / AlexNet, the LPIPS v0.1 heads,
DISTS' alpha / beta, pytorch-fid's Inception) with its official URL and sha256. ``resolve_weights(name)`` finds
one, in this order (a path given in the options wins before any of this: the callers only ask when none is set):

1. torch hub's cache, ``torch.hub.get_dir()/checkpoints/<file>`` (``TORCH_HOME`` respected): where torchvision and
   BasicSR users already have the backbones. A file found there is used as it is, not re-hashed (as torch.hub does).
2. an installed package that ships the file (``lpips``' ``weights/v0.1``, ``DISTS_pytorch``' ``weights.pt``),
   found through its import spec without importing it.
3. a download into that cache, once: a temp file in the same folder, its sha256 checked, then renamed, so a
   partial or wrong file never stays; concurrent processes (several ranks) take a file lock, the first downloads
   and the others find its file. ``ANYSR_WEIGHTS_MIRROR`` (a base URL) replaces the official URLs for machines
   behind a firewall: ``<mirror>/<file>``, the sha256 checked all the same.

``ANYSR_OFFLINE=1`` (or ``HF_HUB_OFFLINE=1``; ``--offline`` on the command line sets it) refuses downloading with
one line naming the file, its URL and where to put it. Reading happens here and in ``weights.load_weights``
(the engine's layer): losses and metrics only take state dicts.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from anysr.download import OFFLINE_VARS, DownloadFailed, download, file_lock, offline_reason
from anysr.errors import CheckpointError, OptionError

__all__ = ["KNOWN", "KnownFile", "OFFLINE_VARS", "MIRROR_VAR", "hub_checkpoints", "find_weights", "offline_reason",
           "resolve_weights"]

logger = logging.getLogger("anysr.engine.checkpoint")

MIRROR_VAR = "ANYSR_WEIGHTS_MIRROR"


@dataclass(frozen=True)
class KnownFile:
    """One standard file: ``file_name`` in torch hub's cache (and on a mirror), ``url`` where its authors publish
    it, ``sha256`` (64 hex digits; 8 where only torch.hub's file-name prefix is established, checked as torch.hub
    checks it), what it is, and an installed package that ships it (``(package, path inside it)``)."""

    name: str
    file_name: str
    url: str
    sha256: str
    what: str
    package: tuple[str, str] | None = None


_TV = "https://download.pytorch.org/models/"
_LPIPS = "https://github.com/richzhang/PerceptualSimilarity/raw/master/lpips/weights/v0.1/"
KNOWN: dict[str, KnownFile] = {f.name: f for f in (
    KnownFile("vgg19", "vgg19-dcbb9e9d.pth", _TV + "vgg19-dcbb9e9d.pth",
              "dcbb9e9dad569fff7a846263a77324fc34978fea2bfb039c012d710e1776ae44", "torchvision's VGG19"),
    KnownFile("vgg19_bn", "vgg19_bn-c79401a0.pth", _TV + "vgg19_bn-c79401a0.pth",
              "c79401a0cf3cb42714e4182f5868c7a6f4f4534f5df9e956e2bb2098de41cbb6", "torchvision's VGG19-BN"),
    KnownFile("vgg16", "vgg16-397923af.pth", _TV + "vgg16-397923af.pth",
              "397923af8e79cdbb6a7127f12361acd7a2f83e06b05044ddf496e83de57a5bf0", "torchvision's VGG16"),
    KnownFile("alexnet", "alexnet-owt-7be5be79.pth", _TV + "alexnet-owt-7be5be79.pth",
              "7be5be791159472b1fbf3c69796f7cb30dca7ad8466c2df70058c37116cdee02", "torchvision's AlexNet"),
    KnownFile("lpips_alex", "lpips_v0.1_alex-df73285e.pth", _LPIPS + "alex.pth",
              "df73285e35b22355a2df87cdb6b70b343713b667eddbda73e1977e0c860835c0", "the LPIPS v0.1 alex head",
              ("lpips", "weights/v0.1/alex.pth")),
    KnownFile("lpips_vgg", "lpips_v0.1_vgg-a78928a0.pth", _LPIPS + "vgg.pth",
              "a78928a0af1e5f0fcb1f3b9e8f8c3a2a5a3de244d830ad5c1feddc79b8432868", "the LPIPS v0.1 vgg head",
              ("lpips", "weights/v0.1/vgg.pth")),
    KnownFile("dists", "dists_weights-f5e65c96.pt", "https://github.com/dingkeyan93/DISTS/raw/master/DISTS_pytorch/"
              "weights.pt", "f5e65c96230b7f6ca995691647d482237e4cab8a50c5c4a5784f219ef0748218",
              "DISTS' alpha / beta (weights.pt)", ("DISTS_pytorch", "weights.pt")),
    # Only the file-name prefix is established for this one: checked as torch.hub's check_hash checks it.
    KnownFile("fid_inception", "pt_inception-2015-12-05-6726825d.pth", "https://github.com/mseitzer/pytorch-fid/"
              "releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth", "6726825d",
              "pytorch-fid's Inception-v3"),
)}


def hub_checkpoints() -> Path:
    """torch hub's weight cache, ``torch.hub.get_dir()/checkpoints`` (``$TORCH_HOME/hub/checkpoints``)."""
    return Path(torch.hub.get_dir()) / "checkpoints"


def _known(name: str) -> KnownFile:
    if name not in KNOWN:
        raise OptionError(f"no standard weight file is named '{name}'; known: {', '.join(KNOWN)}")
    return KNOWN[name]


def _packaged(known: KnownFile) -> Path | None:
    if known.package is None:
        return None
    package, inner = known.package
    try:
        spec = importlib.util.find_spec(package)  # finds the folder; the package is not imported
    except (ImportError, ValueError):
        return None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / inner
        if path.is_file():
            return path
    return None


def find_weights(name: str) -> Path | None:
    """The file ``name`` (a key of ``KNOWN``) already on this machine: torch hub's cache, then an installed
    package that ships it; None when neither has it. Nothing is downloaded."""
    known = _known(name)
    cached = hub_checkpoints() / known.file_name
    if cached.is_file():
        return cached
    return _packaged(known)


def _source(known: KnownFile) -> str:
    mirror = os.environ.get(MIRROR_VAR, "").strip()
    return f"{mirror.rstrip('/')}/{known.file_name}" if mirror else known.url


def resolve_weights(name: str, option: str) -> Path:
    """The path of the standard file ``name``: found (``find_weights``), else downloaded once into torch hub's
    cache and verified. ``option`` is the option that would name the file instead; errors name it, the file,
    the URL and the fix, in one line (CheckpointError)."""
    found = find_weights(name)
    if found is not None:
        return found
    known = KNOWN[name]
    dest = hub_checkpoints() / known.file_name
    url = _source(known)
    reason = offline_reason()
    if reason is not None:
        raise CheckpointError(f"{option}: {known.what} ({known.file_name}) is not on this machine and downloading "
                              f"is off ({reason}); download {url} to {dest}, or set {option} to a copy")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(dest.parent / f".{known.file_name}.lock"):
            if not dest.is_file():  # else another process downloaded it while this one waited
                _download(known, url, dest, option)
    except OSError as exc:  # the cache folder (network failures are CheckpointErrors by now)
        raise CheckpointError(f"{option}: cannot write {known.file_name} to torch hub's cache {dest.parent} "
                              f"({exc.strerror or type(exc).__name__}); set TORCH_HOME to a writable folder with "
                              f"space, or set {option} to a copy") from None
    return dest


def _download(known: KnownFile, url: str, dest: Path, option: str) -> None:
    logger.info("downloading %s from %s to %s", known.what, url, dest)
    fix = (f"download it by hand to {dest}, set {MIRROR_VAR} to a server holding {known.file_name}, or set "
           f"{option} to a copy")
    try:  # a temp file next to dest, its sha256 checked, then renamed; nothing partial or wrong is kept
        download(url, dest, sha256=known.sha256, resume=False, keep_bad=False, desc=known.file_name)
    except DownloadFailed as exc:
        if exc.kind in ("checksum", "size"):
            raise CheckpointError(f"{option}: the download of {known.file_name} from {url} has {exc.reason}; "
                                  f"nothing was kept. Check the URL ({MIRROR_VAR}?) or {fix}") from None
        raise CheckpointError(f"{option}: downloading {known.what} from {url} failed ({exc.reason}); {fix}"
                              ) from None

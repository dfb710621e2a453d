"""The metrics of ``val.metrics`` (and ``anysr eval --metrics``) wired to the accelerator and the weight files.

Each configured metric becomes one ``_Metric`` of a kind (its ``MetricInfo``):

* PSNR / SSIM: the device twins of BasicSR's functions, one value per image, kept on the device;
* LPIPS / DISTS: modules built here from the files ``val.metrics.<name>.weights`` names (read by the engine; not
  set: the standard files, found by name, ``engine.checkpoint.hub``), run on the device on the whole batch; one
  value per image, kept on the device;
* NIQE: no-reference, per image on the host (the result as an 8-bit image, as BasicSR measures it);
* FID: a distribution metric: Inception features of every result (and of every ground truth, unless a
  statistics file is the reference) stay on the device until the dataset is done, then come to the host once,
  are gathered from every rank in dataset order and give one value.

Nothing here waits on the device per image except NIQE, which needs the pixels on the host.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from anysr.data.transforms import tensor2img
from anysr.engine.checkpoint import load_weights
from anysr.engine.checkpoint.hub import KNOWN, resolve_weights
from anysr.engine.checkpoint.integrity import describe_load_error
from anysr.errors import AnysrError, CheckpointError, DataError, OptionError
from anysr.metrics import TORCH_METRICS, metric_info
from anysr.metrics.backbones import FIDInceptionV3
from anysr.metrics.dists import DISTS
from anysr.metrics.fid import calculate_fid, feature_statistics, fid_from_features, load_statistics
from anysr.metrics.info import MetricInfo, standard_weights
from anysr.metrics.lpips import LPIPS
from anysr.metrics.niqe import calculate_niqe
from anysr.metrics.raw_dists import RawDISTS
from anysr.metrics.topiq import TOPIQ

__all__ = ["ValMetrics", "build_metric_module", "read_metric_weights", "read_fid_reference"]

PathLike = str | os.PathLike[str]


def read_metric_weights(files: Sequence[PathLike], where: str) -> list[dict[str, Tensor]]:
    """The state dicts of a metric's weight files (``.pth`` / ``.safetensors``, read safely on the CPU)."""
    out = []
    for f in files:
        try:
            sd, _ = load_weights(f, "params", key_option=where)
        except CheckpointError as exc:
            raise CheckpointError(f"{where}: {exc}") from None
        out.append(sd)
    return out


def build_metric_module(info: MetricInfo, files: Sequence[PathLike], *, net: str | None = None,
                        where: str = "val.metrics") -> nn.Module:
    """LPIPS, DISTS or FID's Inception with the weights of ``files`` (on the CPU; the caller places it); no files:
    the metric's standard ones, found by name (torch hub's cache, else downloaded once and verified).
    ``where``: the options section (``val.metrics.<key>``) or the command-line flag (``--lpips-weights``)."""
    option = where if where.startswith("--") else f"{where}.weights"
    if not files:
        standard = standard_weights(info.name, net)
        if not standard:
            if info.user_weights:  # TOPIQ: the user's file, none found by name
                wanted = ", ".join(f"{w.file_name} ({w.url})" for w in info.user_weights)
                raise OptionError(f"{option}: {info.name} needs its weight file {wanted}; name it there")
            raise OptionError(f"{where}: {info.name} takes no weight files")
        files = [resolve_weights(name, option) for name in standard]
    sds = read_metric_weights(files, option)
    shown = ", ".join(str(f) for f in files)
    try:
        if info.name == "lpips":
            return LPIPS(net=net or "alex").load_weights(*sds)
        if info.name == "dists":
            return DISTS().load_weights(*sds)
        if info.name == "raw_dists":  # neosr's DISTS (no ImageNet normalisation)
            return RawDISTS().load_weights(*sds)
        if info.name == "topiq":
            return TOPIQ().load_weights(*sds)
        if info.name == "fid":
            merged: dict[str, Tensor] = {}
            for sd in sds:
                merged.update(sd)
            return FIDInceptionV3().load_fid_weights(merged)
    except CheckpointError as exc:
        raise CheckpointError(f"{option} ({shown}): {exc}") from None
    except RuntimeError as exc:  # load_state_dict's many-line report: what it amounts to, in one line
        wanted = " and ".join(KNOWN[n].what for n in standard_weights(info.name, net) if n in KNOWN) or "its files"
        raise CheckpointError(f"{option} ({shown}): not {info.name}'s weights ({_mismatch(str(exc))}); give "
                              f"{wanted}, or leave the option out to use the standard files found by name") from None
    raise OptionError(f"{where}: {info.name} takes no weight files")


def _mismatch(report: str) -> str:
    """'12 missing keys (a, ...), 1 unexpected (b)' from torch's load_state_dict error text."""
    parts = []
    for label, head in (("missing", "Missing key(s) in state_dict:"), ("unexpected", "Unexpected key(s) in "
                                                                                     "state_dict:")):
        line = next((ln.strip() for ln in report.splitlines() if head in ln), "")
        keys = [k.strip().strip('".') for k in line.split(head, 1)[1].split(",")] if line else []
        keys = [k for k in keys if k]
        if keys:
            parts.append(f"{len(keys)} {label} key{'s' if len(keys) > 1 else ''} ({keys[0]}"
                         f"{', ...' if len(keys) > 1 else ''})")
    shapes = sum("size mismatch for" in ln for ln in report.splitlines())
    if shapes:
        parts.append(f"{shapes} tensor{'s' if shapes > 1 else ''} of another shape")
    return ", ".join(parts) or report.strip().splitlines()[0][:200]


def read_fid_reference(path: PathLike, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(mu, sigma)`` from pytorch-fid's ``.npz`` (``mu`` / ``sigma``) or BasicSR's ``.pth`` (``mean`` / ``cov``)."""
    p = Path(path)
    if p.suffix == ".npz":
        try:
            return load_statistics(p)
        except AnysrError as exc:
            raise DataError(f"{where}: {exc}") from None
    try:  # BasicSR stores numpy arrays in its .pth: allow exactly what rebuilds them, under both module names
        from numpy._core.multiarray import _reconstruct  # noqa: PLC0415 - its module moved in numpy 2
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # noqa: PLC0415 - its module moved in numpy 2
    allowed: list[Any] = [_reconstruct, (_reconstruct, "numpy.core.multiarray._reconstruct"), np.ndarray, np.dtype,
                          type(np.dtype(np.float64)), type(np.dtype(np.float32))]
    try:
        with torch.serialization.safe_globals(allowed):
            obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unpickler failure means an unusable file
        raise DataError(f"{where}: {p} cannot be read as FID statistics ({describe_load_error(exc)}); give "
                        "a .npz with mu / sigma or BasicSR's .pth with mean / cov") from None
    if not isinstance(obj, Mapping) or not ({"mean", "cov"} <= set(obj) or {"mu", "sigma"} <= set(obj)):
        keys = sorted(obj) if isinstance(obj, Mapping) else type(obj).__name__
        raise DataError(f"{where}: {p} holds {keys}; FID statistics need mean / cov (BasicSR) or mu / sigma")
    mu, sigma = (obj["mean"], obj["cov"]) if "mean" in obj else (obj["mu"], obj["sigma"])
    as_np = [v.numpy() if isinstance(v, Tensor) else np.asarray(v) for v in (mu, sigma)]
    return np.asarray(as_np[0], dtype=np.float64).reshape(-1), np.asarray(as_np[1], dtype=np.float64)


def _rgb3(x: Tensor) -> Tensor:
    return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


def _shave(x: Tensor, border: int) -> Tensor:
    return x[..., border:x.shape[-2] - border, border:x.shape[-1] - border] if border else x


@dataclass
class _Metric:
    key: str
    opt: Any
    info: MetricInfo
    module: nn.Module | None = None
    reference: tuple[np.ndarray, np.ndarray] | None = None
    values: list[Tensor] = field(default_factory=list)
    feats: list[Tensor] = field(default_factory=list)
    gt_feats: list[Tensor] = field(default_factory=list)

    @property
    def border(self) -> int:
        return int(self.opt["crop_border"] or 0)


class ValMetrics:
    """The metrics of one ``val.metrics`` mapping, built once (weights read, modules on the device).

    Per dataset: ``start()``, ``update(...)`` for every batch, then ``finish(...)``. ``where`` names the options
    section in errors.
    """

    def __init__(self, metrics_opt: Mapping[str, Any] | None, acc: Any, where: str = "val.metrics") -> None:
        self.acc = acc
        self.where = where
        self.metrics: list[_Metric] = []
        for key, mopt in (metrics_opt or {}).items():
            info = metric_info(mopt["type"])
            if info is None:
                raise OptionError(f"{where}.{key}.type: unknown metric '{mopt['type']}'")
            m = _Metric(key, mopt, info)
            if info.needs_weights:
                m.module = build_metric_module(info, list(mopt["weights"] or []), net=mopt["net"],
                                               where=f"{where}.{key}").to(acc.device)
            if info.name == "fid" and mopt["stats"]:
                m.reference = read_fid_reference(mopt["stats"], f"{where}.{key}.stats")
            self.metrics.append(m)

    @property
    def keys(self) -> list[str]:
        return [m.key for m in self.metrics]

    def per_image_keys(self) -> list[str]:
        return [m.key for m in self.metrics if m.info.per_image]

    def better(self, key: str) -> str:
        m = next(m for m in self.metrics if m.key == key)
        return str(m.opt["better"] or m.info.better)

    def start(self) -> None:
        for m in self.metrics:
            m.values, m.feats, m.gt_feats = [], [], []

    def _usable(self, m: _Metric, has_gt: bool) -> bool:
        if m.info.name == "fid":
            return has_gt or m.reference is not None
        return has_gt or not m.info.needs_gt

    def active(self, has_gt: bool) -> list[str]:
        """The metrics a dataset with (or without) ground truth can give."""
        return [m.key for m in self.metrics if self._usable(m, has_gt)]

    def update(self, out: Tensor, gt: Tensor | None, gray: Tensor, pad: Sequence[bool], paths: Sequence[str],
               dataset: str, bits: Sequence[int] | None = None) -> None:
        """One batch: ``out`` (quantised result on [0, 1]), ``gt`` (or None), per-image gray / pad flags, and the
        images' depths (``bits``, host ints: 8 or 16; None: all 8). PSNR / SSIM of a 16-bit image are computed on
        its 16-bit levels, as floats on the [0, 255] scale (never rounded to 8 bits); see ``metrics.psnr_ssim``."""
        peak: float | list[float] = 255.0
        if bits is not None and any(int(b) == 16 for b in bits):
            peak = [65535.0 if int(b) == 16 else 255.0 for b in bits]
            peak = 65535.0 if all(p == 65535.0 for p in peak) else peak
        if gt is not None:
            out_c = out[:, :, : gt.shape[2], : gt.shape[3]]
            gt = gt[:, :, : out_c.shape[2], : out_c.shape[3]]
        else:
            out_c = out
        for m in self.metrics:
            if not self._usable(m, gt is not None):
                continue
            try:
                self._one(m, out, out_c, gt, gray, pad, peak)
            except AnysrError as exc:
                raise OptionError(f"{self.where}.{m.key} on {paths[0]} ({dataset}): {exc}") from None

    def _one(self, m: _Metric, out: Tensor, out_c: Tensor, gt: Tensor | None, gray: Tensor,
             pad: Sequence[bool], peak: float | list[float] = 255.0) -> None:
        name = m.info.name
        if name in ("psnr", "ssim"):
            assert gt is not None
            fn = TORCH_METRICS[m.opt["type"]]
            per_image = None if isinstance(peak, float) else torch.tensor(peak).to(out_c.device)
            value = fn(out_c, gt, crop_border=m.border, test_y_channel=bool(m.opt["test_y_channel"]),
                       gray=gray.bool(), peak=peak if per_image is None else per_image)
            m.values.append(value.float().reshape(-1))
        elif name in ("lpips", "dists", "raw_dists", "topiq"):
            assert gt is not None and m.module is not None
            x, y = _rgb3(_shave(out_c, m.border)), _rgb3(_shave(gt, m.border))
            with torch.no_grad():
                m.values.append(m.module(x.float(), y.float()).float().reshape(-1))
        elif name == "niqe":
            host, host_gray = self.acc.to_host((out, gray))  # NIQE needs the pixels: one copy per batch
            vals = []
            for i in range(host.shape[0]):
                if pad[i]:
                    vals.append(0.0)  # a padding repeat: masked out anyway
                    continue
                img = tensor2img(host[i])
                if bool(host_gray[i]) and img.ndim == 3:
                    img = img[:, :, 0]
                vals.append(calculate_niqe(img, m.border, input_order="HWC", convert_to=m.opt["convert_to"] or "y"))
            m.values.append(torch.tensor(vals, dtype=torch.float32, device=out.device))
        elif name == "fid":
            assert m.module is not None
            with torch.no_grad():
                m.feats.append(m.module(_rgb3(out_c).float()).float())
                if m.reference is None:
                    assert gt is not None
                    m.gt_feats.append(m.module(_rgb3(gt).float()).float())
        else:  # pragma: no cover - every MetricInfo kind is handled above
            raise OptionError(f"{self.where}.{m.key}: metric kind {name} cannot run in validation")

    def per_image(self) -> dict[str, list[Tensor]]:
        return {m.key: m.values for m in self.metrics if m.info.per_image and m.values}

    def dataset_values(self, valid: Tensor, indices: list[int]) -> dict[str, float]:
        """Distribution metrics (FID) of the whole dataset, the same on every rank (a collective: all ranks call)."""
        out: dict[str, float] = {}
        for m in self.metrics:
            if m.info.per_image or not m.feats:
                continue
            mask = self.acc.to_host(valid).numpy() > 0
            local = self.acc.to_host(torch.cat(m.feats)).to(torch.float64).numpy()[mask]
            local_gt = self.acc.to_host(torch.cat(m.gt_feats)).to(torch.float64).numpy()[mask] \
                if m.gt_feats else None
            idx = np.asarray(indices)[mask]
            parts = self.acc.strategy.all_gather_object((idx, local, local_gt))
            order = np.concatenate([p[0] for p in parts])
            perm = np.argsort(order, kind="stable")
            feats = np.concatenate([p[1] for p in parts])[perm]
            if len(feats) < 2:
                raise DataError(f"{self.where}.{m.key}: FID needs at least 2 images, the dataset has {len(feats)}")
            if m.reference is not None:
                mu, sigma = feature_statistics(feats)
                if mu.shape != m.reference[0].shape:
                    raise DataError(f"{self.where}.{m.key}.stats: the statistics have {m.reference[0].shape[0]} "
                                    f"dimensions, the Inception features {mu.shape[0]}; make them with the same "
                                    "FID Inception (2048-d pool features)")
                out[m.key] = calculate_fid(mu, sigma, *m.reference)
            else:
                gt_feats = np.concatenate([p[2] for p in parts])[perm]
                out[m.key] = fid_from_features(feats, gt_feats)
        return out

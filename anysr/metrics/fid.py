"""FID (Heusel et al., 2017): Frechet distance between Inception-v3 feature statistics, without scipy.

* ``FIDInceptionV3`` (in ``backbones``) maps RGB images on [0, 1] to 2048-d pool features, as pytorch-fid's
  ``InceptionV3([3])`` (and BasicSR's patched Inception on [-1, 1] input) do;
* ``extract_features`` runs it over batches, ``feature_statistics`` gives ``(mu, sigma)`` (float64 mean and
  unbiased covariance, as ``np.mean`` / ``np.cov(rowvar=False)``), ``folder_statistics`` does both for the
  images of a folder, and ``save_statistics`` / ``load_statistics`` write and read pytorch-fid's ``.npz``
  files (arrays ``mu`` and ``sigma``);
* ``calculate_fid(mu1, sigma1, mu2, sigma2)`` is the distance, BasicSR's / pytorch-fid's function:
  ``|mu1 - mu2|^2 + tr(sigma1) + tr(sigma2) - 2 tr(sqrtm(sigma1 sigma2))``. Lower is better.

The trace of ``sqrtm(sigma1 sigma2)`` comes from symmetric eigen-decompositions instead of scipy's
Schur-based ``sqrtm`` (``trace_sqrt_product``): ``sigma1 sigma2`` is similar to a symmetric positive
semi-definite matrix, so the trace is the sum of the square roots of that matrix's eigenvalues, and no complex
arithmetic appears. BasicSR's guard is kept: if the decomposition fails or is not finite, ``eps`` is added to
both diagonals and it is tried again. ``fid_from_features`` takes two feature sets and, when a set has fewer
samples than dimensions, gets the trace exactly from an ``N1 x N2`` singular value decomposition. Against
scipy (the fixtures): 2e-15 relative for well-conditioned covariances, 1e-6 for rank-deficient 2048-d ones,
where ``sqrtm`` itself is inexact (the two routes here agree to 1e-15 there).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

import cv2
import numpy as np
import torch
from torch import Tensor

from anysr.data.imageio import list_images, read_image
from anysr.errors import DataError, OptionError
from anysr.metrics.backbones import FIDInceptionV3, fid_inception_state_dict
from anysr.metrics.info import FID_INFO

__all__ = [
    "FIDInceptionV3", "fid_inception_state_dict", "extract_features", "feature_statistics", "folder_statistics",
    "calculate_fid", "fid_from_features", "frechet_distance", "trace_sqrt_product", "save_statistics",
    "load_statistics", "METRIC_INFO", "BETTER",
]

METRIC_INFO = FID_INFO
BETTER = METRIC_INFO.better

logger = logging.getLogger(__name__)


@torch.no_grad()
def extract_features(model: torch.nn.Module, batches: Iterable[Tensor | tuple[Tensor, int]]) -> np.ndarray:
    """Features ``(N, D)`` float64 of every image of ``batches`` (RGB ``NCHW`` tensors on [0, 1]).

    A batch may come as ``(tensor, n)``: only its first ``n`` images count (the rest pads it to a fixed
    size). Each batch is moved to the model's device; the model decides where it runs.
    """
    try:
        device = next(model.parameters()).device
    except StopIteration:
        device = torch.device("cpu")
    out = []
    for item in batches:
        batch, n = item if isinstance(item, tuple) else (item, item.shape[0])
        feats = model(batch.to(device))
        out.append(feats.detach()[:n].to("cpu", torch.float64).reshape(n, -1).numpy())
    if not out:
        raise DataError("FID: no images to extract features from")
    return np.concatenate(out, axis=0)


def feature_statistics(features: np.ndarray | Tensor) -> tuple[np.ndarray, np.ndarray]:
    """``(mu, sigma)`` of an ``(N, D)`` feature array: mean and unbiased covariance in float64 (N >= 2)."""
    f = features.detach().cpu().numpy() if isinstance(features, Tensor) else np.asarray(features)
    if f.ndim != 2:
        raise DataError(f"FID: expected a feature array (N, D), got shape {f.shape}")
    if f.shape[0] < 2:
        raise DataError(f"FID: a covariance needs at least 2 images, got {f.shape[0]}")
    f = f.astype(np.float64, copy=False)
    return np.mean(f, axis=0), np.cov(f, rowvar=False)


def _read_rgb(path: Path) -> Tensor:
    img = read_image(path, flag="color")  # 8-bit BGR; gray, palette and 16-bit files are converted by OpenCV
    rgb = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
    return torch.from_numpy(rgb).permute(2, 0, 1).float().div_(255.0)


def _folder_batches(files: list[Path], batch_size: int, pad: bool) -> Iterable[tuple[Tensor, int]]:
    """Consecutive images stacked ``batch_size`` at a time (a change of image size starts a new batch);
    with ``pad``, a short batch is filled up with copies of its last image."""
    pending: list[Tensor] = []

    def flush() -> tuple[Tensor, int]:
        n = len(pending)
        filler = [pending[-1]] * (batch_size - n) if pad else []
        return torch.stack(pending + filler), n

    for path in files:
        t = _read_rgb(path)
        if pending and (len(pending) == batch_size or pending[0].shape != t.shape):
            yield flush()
            pending = []
        pending.append(t)
    if pending:
        yield flush()


def folder_statistics(folder: str | os.PathLike[str], model: torch.nn.Module, batch_size: int = 50,
                      pad_to_batch: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(mu, sigma)`` of ``model``'s features of every image in ``folder`` (sorted by name, read as RGB).

    ``pad_to_batch``: every batch has exactly ``batch_size`` images (short ones padded, the padding's
    features dropped), so a compiling backend (XLA) sees one shape per image size. Features do not depend
    on the batch (eval mode), so the statistics are the same either way.
    """
    if int(batch_size) < 1:
        raise OptionError(f"batch_size: must be >= 1, got {batch_size}")
    files = list_images(folder)
    if len(files) < 2:
        raise DataError(f"FID: {folder} holds {len(files)} image(s); the statistics need at least 2")
    return feature_statistics(extract_features(model, _folder_batches(files, int(batch_size), pad_to_batch)))


def save_statistics(path: str | os.PathLike[str], mu: np.ndarray, sigma: np.ndarray) -> Path:
    """Write ``mu`` / ``sigma`` to a compressed ``.npz`` as pytorch-fid's ``--save-stats`` does."""
    p = Path(path)
    if p.suffix != ".npz":
        raise OptionError(f"FID statistics file {p}: use a .npz name (numpy would append .npz)")
    mu_a, sigma_a = _check_stats(np.asarray(mu), np.asarray(sigma), str(p))
    p.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(p, mu=mu_a, sigma=sigma_a)
    return p


def load_statistics(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(mu, sigma)`` from a pytorch-fid ``.npz`` statistics file (arrays ``mu`` and ``sigma``)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"FID statistics file {p} not found; create it with save_statistics or pytorch-fid "
                        "--save-stats")
    try:
        with np.load(p, allow_pickle=False) as npz:
            if "mu" not in npz.files or "sigma" not in npz.files:
                raise DataError(f"FID statistics file {p} holds {npz.files}; it needs arrays 'mu' and 'sigma'")
            mu, sigma = np.array(npz["mu"]), np.array(npz["sigma"])
    except (OSError, ValueError) as exc:
        raise DataError(f"FID statistics file {p} cannot be read ({exc}); re-create it") from exc
    return _check_stats(mu, sigma, str(p))


def _check_stats(mu: np.ndarray, sigma: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    mu = np.atleast_1d(mu).astype(np.float64, copy=False)
    sigma = np.atleast_2d(sigma).astype(np.float64, copy=False)
    if mu.ndim != 1 or sigma.shape != (mu.shape[0], mu.shape[0]):
        raise DataError(f"FID statistics {what}: mu has shape {mu.shape} and sigma {sigma.shape}; expected (D,) "
                        "and (D, D)")
    return mu, sigma


def trace_sqrt_product(sigma1: np.ndarray, sigma2: np.ndarray) -> float:
    """``tr(sqrtm(sigma1 @ sigma2))`` for symmetric positive semi-definite matrices (eigen route).

    With ``sigma1 = V diag(w) V^T``, ``sigma1 sigma2`` is similar to ``W^(1/2) V^T sigma2 V W^(1/2)``
    (symmetric PSD), whose eigenvalues' square roots sum to the trace. Eigen-directions of ``sigma1`` below
    its numerical rank (``w <= D * eps * max(w)``, as ``np.linalg.matrix_rank``) are rounding noise and left
    out, which also makes a rank-deficient ``sigma1`` (fewer images than dimensions) cheap after its ``eigh``.
    """
    w, v = np.linalg.eigh((sigma1 + sigma1.T) / 2.0)
    keep = w > max(float(w[-1]), 0.0) * w.shape[0] * np.finfo(np.float64).eps
    if not keep.any():
        return 0.0
    root = np.sqrt(w[keep])
    vk = v[:, keep]
    m = (vk.T @ sigma2 @ vk) * np.outer(root, root)
    e = np.linalg.eigvalsh((m + m.T) / 2.0)
    return float(np.sqrt(np.clip(e, 0.0, None)).sum())


def fid_from_features(features1: np.ndarray | Tensor, features2: np.ndarray | Tensor) -> float:
    """FID of two feature sets ``(N1, D)``, ``(N2, D)``: ``calculate_fid`` of their ``feature_statistics``.

    When a set has fewer samples than dimensions, the trace term is computed exactly and cheaply from the
    centred features ``X1``, ``X2``: the square roots of the eigenvalues of ``sigma1 sigma2`` are the singular
    values of ``X1 X2^T / sqrt((N1 - 1)(N2 - 1))``, an ``N1 x N2`` matrix.
    """
    f1, f2 = (f.detach().cpu().numpy() if isinstance(f, Tensor) else np.asarray(f) for f in (features1, features2))
    for f in (f1, f2):
        if f.ndim != 2 or f.shape[0] < 2:
            raise DataError(f"FID: expected a feature array (N, D) with N >= 2, got shape {f.shape}")
    if f1.shape[1] != f2.shape[1]:
        raise DataError(f"FID: the two feature sets have different dimensions ({f1.shape[1]} and {f2.shape[1]}); "
                        "were they made with the same feature extractor?")
    n1, n2, d = f1.shape[0], f2.shape[0], f1.shape[1]
    if min(n1, n2) >= d:
        return calculate_fid(*feature_statistics(f1), *feature_statistics(f2))
    mu1, mu2 = f1.mean(axis=0, dtype=np.float64), f2.mean(axis=0, dtype=np.float64)
    x1 = f1.astype(np.float64) - mu1
    x2 = f2.astype(np.float64) - mu2
    if not (np.isfinite(x1).all() and np.isfinite(x2).all()):
        raise DataError("FID: the features hold NaN or infinite values")
    tr = float(np.linalg.svd(x1 @ x2.T, compute_uv=False).sum()) / float(np.sqrt((n1 - 1) * (n2 - 1)))
    diff = mu1 - mu2
    return float(diff @ diff + (x1 * x1).sum() / (n1 - 1) + (x2 * x2).sum() / (n2 - 1) - 2.0 * tr)


def calculate_fid(mu1: np.ndarray, sigma1: np.ndarray, mu2: np.ndarray, sigma2: np.ndarray,
                  eps: float = 1e-6) -> float:
    """Frechet distance between ``N(mu1, sigma1)`` and ``N(mu2, sigma2)`` (BasicSR's ``calculate_fid``).

    If the covariance product cannot be decomposed (no convergence, or a non-finite result), ``eps`` is
    added to both diagonals and it is tried once more, as BasicSR does.
    """
    m1, s1 = _check_stats(np.asarray(mu1), np.asarray(sigma1), "1")
    m2, s2 = _check_stats(np.asarray(mu2), np.asarray(sigma2), "2")
    if m1.shape != m2.shape:
        raise DataError(f"FID: the two statistics have different dimensions ({m1.shape[0]} and {m2.shape[0]}); "
                        "were they made with the same feature extractor?")
    for name, arr in (("mu1", m1), ("sigma1", s1), ("mu2", m2), ("sigma2", s2)):
        if not np.isfinite(arr).all():
            raise DataError(f"FID: {name} holds NaN or infinite values")
    try:
        tr = trace_sqrt_product(s1, s2)
        ok = bool(np.isfinite(tr))
    except np.linalg.LinAlgError:
        ok = False
    if not ok:
        logger.warning("FID: the product of the covariances is singular; adding %g to their diagonals", eps)
        offset = np.eye(s1.shape[0]) * eps
        tr = trace_sqrt_product(s1 + offset, s2 + offset)
    diff = m1 - m2
    return float(diff @ diff + np.trace(s1) + np.trace(s2) - 2.0 * tr)


frechet_distance = calculate_fid

"""Which library runs ``accelerator: xla``: the table of XLA backends, read in the parent process (no torch import).

``torch_xla`` (lazy tensors, torch 2.9 only: its last release) and ``torchax`` (PyTorch modules on JAX arrays, the
whole training step jitted by JAX; any current torch). ``xla.backend: auto`` takes torch_xla where it is installed
for the installed torch, else torchax where torchax and jax are importable. TorchTPU (``torch-tpu``: a native ``tpu``
device, which cannot share a process with torchax) is meant to be one more row here and one ``Accelerator``
subclass, chosen the same way.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass

from anysr.errors import AcceleratorError

XLA_BACKENDS = ("auto", "torch_xla", "torchax")
MATMUL_PRECISIONS = ("default", "high", "highest")  # JAX's names (bf16 passes, 3 bf16 passes ~ tf32, fp32)


@dataclass(frozen=True)
class XLABackend:
    """One way to run ``accelerator: xla``."""

    name: str
    modules: tuple[str, ...]  # what must be importable
    accelerator_class_path: str  # "module:Class", imported inside the worker only
    install: str  # what to tell a user who lacks it

    def installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.modules)


BACKENDS = {
    "torch_xla": XLABackend("torch_xla", ("torch_xla",), "anysr.accelerators.xla:XLAAccelerator",
                            "pip install torch==2.9.0 'torch_xla[tpu]==2.9.0' (torch_xla needs torch 2.9)"),
    "torchax": XLABackend("torchax", ("torchax", "jax"), "anysr.accelerators.xla_torchax:TorchaxAccelerator",
                          "pip install 'jax[tpu]' and the torchax 0.0.14 pre-release (pip install --pre torchax)"),
}


def _minor(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def torch_xla_matches_torch() -> bool:
    """Whether the installed torch_xla was built for the installed torch (same major.minor; read from the
    packages' metadata, nothing is imported)."""
    try:
        return _minor(importlib.metadata.version("torch_xla")) == _minor(importlib.metadata.version("torch"))
    except importlib.metadata.PackageNotFoundError:
        return False


def any_installed() -> bool:
    return any(b.installed() for b in BACKENDS.values())


def choose_xla_backend(asked: str = "auto") -> XLABackend:
    """The backend ``xla.backend: asked`` resolves to here, or an error naming what to install or set."""
    if asked not in XLA_BACKENDS:
        raise AcceleratorError(f"xla.backend: '{asked}' is not one of {', '.join(XLA_BACKENDS)}")
    if asked != "auto":
        backend = BACKENDS[asked]
        if not backend.installed():
            raise AcceleratorError(f"xla.backend: {asked} is not installed here; {backend.install}, "
                                   "or set xla.backend: auto")
        return backend
    torch_xla, torchax = BACKENDS["torch_xla"], BACKENDS["torchax"]
    if torch_xla.installed() and (torch_xla_matches_torch() or not torchax.installed()):
        return torch_xla
    if torchax.installed():
        return torchax
    raise AcceleratorError("accelerator: xla was asked for but torch_xla is not installed (nor torchax); "
                           f"{torch_xla.install}, or {torchax.install}; or set accelerator: cpu")

"""anysr: super-resolution training that runs unchanged on CPU, CUDA, MPS and XLA."""

__version__ = "0.1.0"

"""The packages that fill the registries (networks, models, datasets, losses, metrics, optimisers, schedules).

The options only read the registries (``anysr.options`` imports no torch and no module of these packages); whoever
validates options calls ``load_plugins()`` first: the command line, ``anysr schema --markdown``, the tests.
"""

from __future__ import annotations

PLUGIN_PACKAGES = ("anysr.archs", "anysr.models", "anysr.data", "anysr.losses", "anysr.metrics")


def load_plugins() -> None:
    """Import every package in ``PLUGIN_PACKAGES`` (torch with them), so their classes are registered."""
    # Imported here, not at the top: the command line imports this module, and `anysr --help` loads no torch.
    import anysr.archs  # noqa: PLC0415
    import anysr.data  # noqa: PLC0415
    import anysr.losses  # noqa: PLC0415
    import anysr.metrics  # noqa: PLC0415
    import anysr.models  # noqa: F401, PLC0415 - the imports register the classes

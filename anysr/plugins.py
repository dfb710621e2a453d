"""The packages that fill the registries (networks, models, datasets, losses, metrics, optimisers, schedules).

The options only read the registries (``anysr.options`` imports no torch and no module of these packages); whoever
validates options calls ``load_plugins()`` first: the command line, ``anysr schema --markdown``, the tests.
"""

from __future__ import annotations

PLUGIN_PACKAGES = ("anysr.archs", "anysr.models", "anysr.data", "anysr.losses", "anysr.metrics")


def load_plugins() -> None:
    """Import every package in ``PLUGIN_PACKAGES`` (torch with them), so their classes are registered."""
    import anysr.archs
    import anysr.data
    import anysr.losses
    import anysr.metrics
    import anysr.models  # noqa: F401 - the imports register the classes

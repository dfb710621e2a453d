"""The loops behind each command, one sub-package per capability: ``training`` (``anysr train``), ``evaluation``
(validation, ``anysr test``, ``anysr eval``), ``inference`` (``anysr infer``, ``anysr export``), ``checkpoint``
(training states and weights), ``report`` (``anysr report``, the run's history), ``bench`` (``anysr bench``),
``prepare`` (``anysr prepare``); ``logger.py`` beside them, which they all import (nothing at this level imports a
sub-package)."""

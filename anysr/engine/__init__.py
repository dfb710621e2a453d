"""The loops behind each command, one sub-package per capability: ``training`` (``anysr train``), ``evaluation``
(validation, ``anysr test``, ``anysr eval``, ``anysr report``), ``inference`` (``anysr infer``, ``anysr export``),
``checkpoint`` (training states and weights); ``bench.py`` (``anysr bench``) and ``logger.py`` beside them."""

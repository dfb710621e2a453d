"""Validation during training, `anysr test` and `anysr eval` (folders); `anysr report` (the run's page) is
anysr.engine.report."""

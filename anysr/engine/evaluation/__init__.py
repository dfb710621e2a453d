"""Validation during training, `anysr test`, `anysr eval` (folders) and `anysr report` (the run's page)."""

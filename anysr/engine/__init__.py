"""anysr.engine."""

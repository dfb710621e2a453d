"""anysr.models."""

"""anysr.losses."""

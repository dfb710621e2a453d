"""`anysr train`: the training loop (resume, signals), the run lock and NaN recovery; the run's history and pair
samples are written through anysr.engine.report."""

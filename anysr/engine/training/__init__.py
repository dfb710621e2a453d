"""`anysr train`: the training loop (resume, signals), the run lock and the run's history."""

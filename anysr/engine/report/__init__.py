"""`anysr report` and what it reads: the run's history (validation metrics, crops), the pair samples written during
training, and the HTML page helpers that the report and `anysr eval`'s page share. Training and evaluation both
import this package; it imports neither."""

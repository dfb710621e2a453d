"""Checkpoints that cannot corrupt: atomic writes, verified training states, safe weight loading.

* ``atomic``: every file is published by one ``os.replace`` of a fsynced temp file in the same folder, so a
  ``kill -9`` during a save leaves either the old file or the new one, never half of one (JSON files too).
* ``state``: a training state is a plain ``torch.save`` archive (it loads with ``torch.load(weights_only=True)``)
  with a sha256 of the whole file in its zip comment (``integrity``), so a flipped byte anywhere or a truncated
  copy is refused instead of resumed from.
* ``weights``: safetensors (``<group>.<param>`` names, JSON metadata from which the net can be rebuilt, tensor
  digests) or BasicSR ``.pth`` files read through ``torch.load(weights_only=True)``; both memory-mapped (except
  pre-1.6 .pth files), so ranks reading one file share the page cache instead of holding a copy each.
"""

from anysr.atomic import atomic_write, atomic_write_bytes, atomic_write_json, clean_stale_temps
from anysr.engine.checkpoint.common import STATE_FORMAT, WEIGHTS_FORMAT
from anysr.engine.checkpoint.integrity import tree_digest
from anysr.engine.checkpoint.state import (
    find_resume_state,
    list_training_states,
    load_training_state,
    prune_training_states,
    save_training_state,
)
from anysr.engine.checkpoint.weights import (
    check_fits,
    load_into,
    load_model_weights,
    load_weights,
    mismatch_table,
    read_weights,
    read_weights_metadata,
    save_weights,
    save_weights_pth,
    state_dict_mismatch,
    strip_container_prefix,
)

__all__ = [
    "STATE_FORMAT",
    "WEIGHTS_FORMAT",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "check_fits",
    "clean_stale_temps",
    "find_resume_state",
    "list_training_states",
    "load_into",
    "load_model_weights",
    "load_training_state",
    "load_weights",
    "mismatch_table",
    "prune_training_states",
    "read_weights",
    "read_weights_metadata",
    "save_training_state",
    "save_weights",
    "save_weights_pth",
    "state_dict_mismatch",
    "strip_container_prefix",
    "tree_digest",
]

"""Every training, test and ONNX template traiNNer-redux ships validates in anysr as it is (its placeholder dataset and
weights paths aside). The templates are not part of this repository (their text is traiNNer-redux's): point
``TRAINNER_TEMPLATES`` at a checkout's ``options/_templates`` folder; without it the test is skipped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from anysr.errors import OptionError
from anysr.options import load_options

# Files refused on purpose (traiNNer-redux cannot run them either, or anysr has another way): path -> message
_TEMPORAL = ("TemporalSPAN", "TemporalSPANv2", "TSCUNet", "TFDAT")
REFUSED = {**{f"train/{n}/{n}_OTF_{kind}.yml": "OTF clips are not implemented" for n in _TEMPORAL
              for kind in ("fidelity", "gan")},
           **{f"test/{n}/{n}.yml": "singlevideodataset .* is not in anysr: run `anysr infer" for n in _TEMPORAL}}
ROOT = Path(os.environ.get("TRAINNER_TEMPLATES", "") or "/nonexistent")
FILES = sorted(p for kind in ("train", "test", "onnx") for p in ROOT.glob(f"{kind}/*/*.yml")) if ROOT.is_dir() else []


@pytest.mark.skipif(not FILES, reason=f"traiNNer-redux's templates are not at {ROOT} (set TRAINNER_TEMPLATES)")
@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES] if FILES else None)
def test_template_validates(path: Path) -> None:
    refused = REFUSED.get(path.relative_to(ROOT).as_posix())
    if refused is None:
        load_options(str(path), is_train=path.parts[-3] == "train", check_paths=False)
        return
    with pytest.raises(OptionError, match=refused):  # one line naming why and what to use instead
        load_options(str(path), is_train=path.parts[-3] == "train", check_paths=False)

"""Weight files for the learned metrics, written as users get them (``.pth`` state dicts), with the seeded
weights of the metric fixtures (``tools/fixtures/make_metric_fixtures.py``): nothing downloaded or stored."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from make_metric_fixtures import seeded_state_dict  # tools/fixtures (on the path: tests/conftest.py)

FIX = Path(__file__).resolve().parent / "fixtures"

MANIFEST = json.loads((FIX / "metrics" / "manifest.json").read_text())


def write_metric_weights(folder: Path, which: tuple[str, ...] = ("lpips", "dists", "fid")) -> dict[str, list[Path]]:
    """``{'lpips': [alexnet.pth, alex.pth], 'dists': [vgg16.pth, weights.pt], 'fid': [pt_inception.pth]}``."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[Path]] = {}
    files = {"lpips": [("alexnet-owt.pth", "lpips_alex", "backbone_shapes"), ("alex.pth", "lpips_alex", "head_shapes")],
             "lpips_vgg": [("vgg16.pth", "lpips_vgg", "backbone_shapes"), ("vgg.pth", "lpips_vgg", "head_shapes")],
             "dists": [("vgg16-dists.pth", "dists", "vgg_shapes"), ("weights.pt", "dists", "head_shapes")],
             "fid": [("pt_inception-2015-12-05.pth", "fid", "inception_shapes")]}
    for name in which:
        paths = []
        for file_name, key, shapes in files[name]:
            path = folder / file_name
            if not path.exists():
                torch.save(seeded_state_dict(MANIFEST[key][shapes]), path)
            paths.append(path)
        out[name] = paths
    return out

"""The options of sharded data sets (``io_backend: {type: shards, ...}``, ``anysr.data.shards``) and their rule.
``schema.py`` adds these fields to the io_backend section and calls the rule for every dataset.

A shard set is named by ``dataroot_gt`` (and optionally ``dataroot_lq``): a URL (``s3://``, ``gs://``,
``http(s)://``, ``file://``) or a local path, of the set's folder (holding index.json) or of its ``.json`` index.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anysr.options.common import good
from anysr.options.fields import MISSING, Context, Field, at_least

SHARD_SCHEMES = ("s3", "gs", "gcs", "http", "https", "file")
SHARD_INDEX = "index.json"
DEFAULT_CACHE_BYTES = 16 << 30

SHARD_IO_FIELDS: dict[str, Field] = {
    "storage_options": Field((dict, None), default=MISSING, default_doc="none",
                             doc="type shards: keyword arguments of the fsspec file system, e.g. {endpoint_url: "
                                 "http://host:9000} for an S3-compatible server, {token: FILE} for GCS, "
                                 "{anon: true} for a public bucket."),
    "cache_dir": Field((str, None), default=MISSING, default_doc="null (no cache)",
                       doc="type shards: a local folder keeping the sample byte ranges read (null: no cache); "
                           "loader workers and ranks of a host may share it."),
    "cache_bytes": Field(int, default=MISSING, default_doc=f"{DEFAULT_CACHE_BYTES} (16 GiB)", check=at_least(1),
                         doc="type shards: the most bytes cache_dir holds (least recently used out)."),
}


def is_url(value: str) -> bool:
    """Whether a dataroot is a URL (``scheme://...``) rather than a local path."""
    return "://" in value


def shard_roots_rule(out: dict[str, Any], path: str, ctx: Context, root: Path) -> None:
    """``dataroot_gt`` / ``dataroot_lq`` of a dataset reading shards: a URL of a known scheme, or a local set (a
    folder holding index.json, or a .json index) that exists; local paths are resolved against ``root``.
    meta_info_file does not apply (the index lists the samples)."""
    for key in ("dataroot_gt", "dataroot_lq"):
        value = out.get(key)
        values = value if isinstance(value, list) else [value]
        resolved = []
        for i, item in enumerate(values):
            where = f"{path}.{key}" + (f".{i}" if isinstance(value, list) else "")
            if not isinstance(item, str):
                resolved.append(item)
                continue
            resolved.append(_one_root(item, where, ctx, root))
        if good(out, key):
            out[key] = resolved if isinstance(value, list) else resolved[0]
    if good(out, "meta_info_file"):
        ctx.add(f"{path}.meta_info_file", "does not apply to io_backend type shards (the shard index lists the "
                "samples); remove it, or write a set of only those images with anysr prepare shards")


def _one_root(value: str, where: str, ctx: Context, root: Path) -> str:
    if is_url(value):
        scheme = value.split("://", 1)[0].lower()
        if scheme not in SHARD_SCHEMES:
            ctx.add(where, f"'{value}': unknown scheme '{scheme}://'; a shard set is read from "
                    f"{', '.join(s + '://' for s in SHARD_SCHEMES)} or a local path")
            return value
        if scheme != "file":
            return value  # remote: the index is read (and reported) when the dataset is built
        local = Path(value.split("://", 1)[1])
    else:
        local = Path(value).expanduser()
        local = local if local.is_absolute() else root / local
        value = str(local)
    if not ctx.check_paths:
        return value
    index = local if local.suffix == ".json" else local / SHARD_INDEX
    if not local.exists():
        ctx.add(where, f"'{local}' does not exist; point it at a shard set written by anysr prepare shards (a "
                "folder holding index.json) or at its .json index")
    elif local.is_file() and local.suffix != ".json":
        ctx.add(where, f"'{local}' is a file, not a shard set; point it at the set's folder ({local.parent} if it "
                f"holds {SHARD_INDEX}) or at its .json index")
    elif not index.is_file():
        ctx.add(where, f"'{local}' holds no {SHARD_INDEX}: not a shard set; write one with anysr prepare shards "
                "SRC_FOLDER OUT, or set io_backend.type: disk for a folder of images")
    return value


def io_backend_rule(backend: dict[str, Any], path: str, ctx: Context) -> None:
    """The shard-only keys of an io_backend section are refused with another type."""
    if backend.get("type", "disk") == "shards":
        return
    for key in SHARD_IO_FIELDS:
        if key in backend and backend[key] is not None:
            ctx.add(f"{path}.io_backend.{key}", f"applies to io_backend type shards (the type is "
                    f"'{backend.get('type', 'disk')}'); remove it")

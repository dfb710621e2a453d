"""Seeded mutation fuzzing of every file anysr reads (used by ``tests/test_fuzz.py``; no extra dependency).

Seeds are valid files anysr itself made (options, a training state, weights, ``history.json``, images of every
format it reads, a meta-info file, an LMDB, a video); each case applies one mutation drawn from a
``random.Random(seed, case)`` stream, so a failing case is replayed from its seed and number alone:

- any file: bit flips, a run of bytes zeroed, truncation, a chunk duplicated, junk appended;
- YAML: a key deleted, a value of the wrong type, a huge or negative number, a small alias chain, or bytes mutated;
- ``.safetensors``: the JSON header (dtype, shape, offsets, a tensor deleted, metadata values) or bytes;
- JSON (``history.json``): wrong types, keys deleted, numbers as strings, deep nesting, or bytes.

Two layers run the mutated files: in-process calls of the reading APIs (``python tests/fuzzing.py api``: thousands
of cases in one process under a memory limit; only an ``AnysrError`` or ``OSError`` with a one-line message may
come out) and the command line as a user runs it (``check_cli``: exit status 0 or 2, at most one line on stderr, no
traceback, no ``MemoryError``, the address space capped, nothing outside the output folder changed).
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import resource
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 6 << 30  # bytes of address space a fuzzed command may map (torch alone maps ~1.5 GiB)
HUGE = (2**31, 10**12, 2**63 - 1, 10**100, -1, -(2**31), 0, 1e308, float("inf"), float("nan"))
PROGRESS_BAR = re.compile(r"^[^|]*\d+%\|.*\| *\d+/\d+ \[")  # a tqdm line: "desc:  50%|#####     | 3/6 [00:00<..."
WRONG = ([], {}, "x", None, True, [1, 2], {"a": 1}, "1e999", -1, 0.5)


# --------------------------------------------------------------------------------------------- byte mutations
def _bit_flips(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 2, 8, 64))):
        if b:
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _zero_run(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    n = rng.choice((1, 4, 16, 256, 4096))
    return data[:i] + bytes(min(n, len(data) - i)) + data[i + n:]


def _truncate(data: bytes, rng: random.Random) -> bytes:
    return data[:rng.randrange(len(data))] if data else data


def _duplicate(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    i = rng.randrange(len(data))
    chunk = data[i:i + rng.choice((1, 8, 64, 1024))]
    j = rng.randrange(len(data) + 1)
    return data[:j] + chunk * rng.choice((1, 2, 16)) + data[j:]


def _append_junk(data: bytes, rng: random.Random) -> bytes:
    return data + rng.randbytes(rng.choice((1, 16, 1024)))


BYTE_MUTATIONS: dict[str, Callable[[bytes, random.Random], bytes]] = {
    "bitflip": _bit_flips, "zero_run": _zero_run, "truncate": _truncate, "duplicate": _duplicate,
    "append_junk": _append_junk}


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    name = rng.choice(sorted(BYTE_MUTATIONS))
    return name, BYTE_MUTATIONS[name](data, rng)


# --------------------------------------------------------------------------------------------- structure
def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path of a nested dict/list tree (the root excluded)."""
    out: list[tuple[Any, ...]] = []
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        out.append((*prefix, k))
        out.extend(_paths(v, (*prefix, k)))
    return out


def _parent(obj: Any, path: tuple[Any, ...]) -> Any:
    for k in path[:-1]:
        obj = obj[k]
    return obj


def mutate_tree(tree: Any, rng: random.Random) -> tuple[str, Any]:
    """A structural mutation of a parsed YAML / JSON document: (what was done, new tree)."""
    tree = copy.deepcopy(tree)
    paths = _paths(tree)
    if not paths:
        return "wrong_root", rng.choice(WRONG)
    path = rng.choice(paths)
    parent = _parent(tree, path)
    kind = rng.choice(("delete", "wrong_type", "huge", "huge", "string_number", "nest", "root_type"))
    if kind == "delete":
        del parent[path[-1]]
    elif kind == "wrong_type":
        parent[path[-1]] = rng.choice(WRONG)
    elif kind == "huge":
        numeric = [p for p in paths if isinstance(_parent(tree, p)[p[-1]], (int, float))
                   and not isinstance(_parent(tree, p)[p[-1]], bool)] or [path]
        path = rng.choice(numeric)
        _parent(tree, path)[path[-1]] = rng.choice(HUGE)
    elif kind == "string_number":
        value = parent[path[-1]]
        parent[path[-1]] = str(value) if not isinstance(value, str) else f"{value}{rng.choice(('x', '', ' '))}"
    elif kind == "nest":
        value: Any = parent[path[-1]]
        for _ in range(rng.choice((2, 50))):
            value = [value]
        parent[path[-1]] = value
    else:
        return kind, rng.choice(WRONG)
    return f"{kind}:{'.'.join(map(str, path))}", tree


def _alias_chain(text: str, rng: random.Random) -> str:
    """A small alias chain (3 levels x 3: 27 leaves; the exponential ones are test_fuzz's xfail case)."""
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict):
        return text
    key = rng.choice(sorted(doc))
    head = "a0: &a0 [x, x, x]\na1: &a1 [*a0, *a0, *a0]\na2: &a2 [*a1, *a1, *a1]\n"
    doc.pop(key)
    return head + yaml.safe_dump(doc, sort_keys=False) + f"{key}: *a2\n"


def mutate_yaml(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    roll = rng.random()
    if roll < 0.35:
        return mutate_bytes(data, rng)
    if roll < 0.45:
        return "alias_chain", _alias_chain(data.decode(), rng).encode()
    what, tree = mutate_tree(yaml.safe_load(data), rng)
    try:
        return f"yaml.{what}", yaml.safe_dump(tree, sort_keys=False, allow_unicode=True).encode()
    except (ValueError, yaml.YAMLError):  # nan / inf keep their YAML forms; anything else falls back to bytes
        return mutate_bytes(data, rng)


def mutate_json(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    if rng.random() < 0.35:
        return mutate_bytes(data, rng)
    what, tree = mutate_tree(json.loads(data), rng)
    return f"json.{what}", json.dumps(tree).encode()  # NaN / Infinity as Python writes them


def mutate_safetensors(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """Header JSON mutations (dtype, shape, offsets, a tensor gone, metadata values) or byte mutations."""
    if rng.random() < 0.4 or len(data) < 8:
        return mutate_bytes(data, rng)
    (n,) = struct.unpack("<Q", data[:8])
    header, body = json.loads(data[8:8 + n]), data[8 + n:]
    names = sorted(k for k in header if k != "__metadata__")
    name = rng.choice(names)
    kind = rng.choice(("dtype", "shape", "offsets", "delete", "metadata", "metadata", "header_len"))
    if kind == "dtype":
        header[name]["dtype"] = rng.choice(("F16", "I64", "BOOL", "F64", "U8", "XX", 3))
    elif kind == "shape":
        shape = header[name]["shape"]
        header[name]["shape"] = rng.choice(([], [0], [*shape, 2], [10**9, 10**9], [-1], shape[::-1], "x"))
    elif kind == "offsets":
        a, b = header[name]["data_offsets"]
        header[name]["data_offsets"] = rng.choice(([b, a], [a, b + 4], [a, 2**62], [-4, b], [a], None))
    elif kind == "delete":
        del header[name]
    elif kind == "metadata":
        meta = header.setdefault("__metadata__", {})
        if meta and rng.random() < 0.7:
            key = rng.choice(sorted(meta))
            value = meta[key]
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = value
            if isinstance(parsed, (dict, list)) and parsed and rng.random() < 0.7:
                what, parsed = mutate_tree(parsed, rng)
                kind = f"metadata.{key}.{what}"
            else:
                parsed = rng.choice(WRONG)
                kind = f"metadata.{key}"
            meta[key] = parsed if isinstance(parsed, str) and rng.random() < 0.5 else json.dumps(parsed)
        else:
            meta[rng.choice(("format", "network_g", "x"))] = rng.choice(("", "{", "[1,2]", "null"))
    head = json.dumps(header).encode()
    size = len(head) if kind != "header_len" else rng.choice((0, len(head) + 8, 2**40, len(head) - 1))
    return f"safetensors.{kind}", struct.pack("<Q", size) + head + body


def mutator_for(path: Path) -> Callable[[bytes, random.Random], tuple[str, bytes]]:
    suffix = path.suffix.lower()
    if suffix in (".yml", ".yaml"):
        return mutate_yaml
    if suffix == ".json":
        return mutate_json
    if suffix == ".safetensors":
        return mutate_safetensors
    return mutate_bytes


def mutate_file(src: Path, dst: Path, rng: random.Random) -> str:
    """Write a mutation of ``src`` to ``dst``; returns what was done."""
    what, data = mutator_for(src)(src.read_bytes(), rng)
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(data)
    return what


# --------------------------------------------------------------------------------------------- the CLI checks
def snapshot(folders: Iterable[Path]) -> dict[str, tuple[int, int]]:
    """Every file under ``folders``: (size, mtime in ns)."""
    out: dict[str, tuple[int, int]] = {}
    for folder in folders:
        for p in sorted(Path(folder).rglob("*")):
            if p.is_file() or p.is_symlink():
                st = p.lstat()
                out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@dataclass
class CliResult:
    """One command run on a mutated file and what was wrong with how it ended (empty: nothing)."""

    args: list[str]
    returncode: int | None
    stderr: str
    seconds: float
    problems: list[str] = field(default_factory=list)


def check_cli(args: list[str], *, cwd: Path, watched: Iterable[Path], timeout: float = 180) -> CliResult:
    """Run ``python -m anysr ARGS`` under the memory limit and list what broke the contract."""
    watched = list(watched)
    before = snapshot(watched)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_NUM_THREADS", "2")
    start = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "anysr", *args], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout, preexec_fn=_limit_memory)
    except subprocess.TimeoutExpired as exc:
        err = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        return CliResult(args, None, err, time.perf_counter() - start, [f"no end within {timeout:.0f} s"])
    res = CliResult(args, proc.returncode, proc.stderr, time.perf_counter() - start)
    # One message: its first line, then only the indented lines of a list it gives (the options checker's "N
    # problems in FILE:" and the weights' table of keys that do not fit). Progress bars are left out too: they are
    # what a command draws on stderr while it works (tqdm's "NN%|###|" lines), not a message. Any other line (a
    # warning, a library's log line) counts.
    lines = [x for x in proc.stderr.splitlines()
             if x.strip() and not x.startswith((" ", "\t")) and not PROGRESS_BAR.search(x)]
    if proc.returncode not in (0, 2):
        res.problems.append(f"exit status {proc.returncode}")
    if len(lines) > 1:
        res.problems.append(f"{len(lines)} lines on stderr")
    if "Traceback" in proc.stderr or "Traceback" in proc.stdout:
        res.problems.append("a traceback")
    if "MemoryError" in proc.stderr or "out of memory" in proc.stderr:
        res.problems.append("memory not bounded (out of memory under the limit)")
    after = snapshot(watched)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    if changed:
        res.problems.append(f"files outside the output changed: {changed[:3]}")
    return res


# --------------------------------------------------------------------------------------------- the API layer
def _one_line(exc: BaseException) -> bool:
    """One message: a first line, then only indented lines of a list it gives (as ``check_cli`` reads stderr)."""
    lines = str(exc).strip().splitlines()
    return bool(lines) and all(x.startswith((" ", "\t")) or not x.strip() for x in lines[1:])


def _api_readers() -> dict[str, Callable[[Path, Path], Any]]:
    """kind -> reader(mutated file, seeds folder): the functions the commands call to read each kind of file."""
    from anysr.data import file_backends, imageio
    from anysr.data.paired_image_dataset import paired_names_from_meta_info
    from anysr.engine.checkpoint import load_training_state, read_weights, read_weights_metadata
    from anysr.engine.report.history import History
    from anysr.options import load_options
    from anysr.plugins import load_plugins

    load_plugins()

    def options(p: Path, seeds: Path) -> Any:
        return load_options(p, is_train=p.name.startswith("train"))

    def image(p: Path, seeds: Path) -> Any:
        imageio.probe_image(p)
        img = imageio.read_image(p)
        file_backends.check_pixel_type(imageio.probe_image(p), p.name)
        return file_backends.decode_uint8(p.read_bytes(), p.name), img

    def state(p: Path, seeds: Path) -> Any:
        return load_training_state(p)

    def weights(p: Path, seeds: Path) -> Any:
        read_weights_metadata(p)
        return read_weights(p, "auto")

    def history(p: Path, seeds: Path) -> Any:
        return History.load(p.parent)

    def meta_info(p: Path, seeds: Path) -> Any:
        return paired_names_from_meta_info(str(p), str(seeds / "train"), str(seeds / "train"))

    def lmdb(p: Path, seeds: Path) -> Any:
        backend = file_backends.LmdbBackend(p.parent)
        try:
            return [file_backends.decode_uint8(backend.get(k), k) for k in backend.keys()]
        finally:
            backend.close()

    def video(p: Path, seeds: Path) -> Any:
        from anysr.data.video_io import FrameSource

        return [frame.shape for _, frame, _ in FrameSource(p).frames()]

    return {"options": options, "image": image, "state": state, "weights": weights, "history": history,
            "meta_info": meta_info, "lmdb": lmdb, "video": video}


def api_seed_files(seeds: Path) -> list[tuple[str, Path, str]]:
    """(kind, seed file, name the mutated copy takes) for every seed file in ``seeds``."""
    out = [("options", seeds / "train.yml", "train.yml"), ("options", seeds / "test.yml", "test.yml")]
    out += [("image", p, p.name) for p in sorted((seeds / "images").iterdir())]
    out += [("state", p, p.name) for p in sorted((seeds / "exp" / "training_states").glob("*.state"))]
    out += [("weights", p, p.name) for p in sorted((seeds / "exp" / "models").glob("*"))]
    out += [("history", seeds / "exp" / "history.json", "history.json"),
            ("meta_info", seeds / "meta_info.txt", "meta_info.txt")]
    if (seeds / "t91.lmdb").is_dir():
        out += [("lmdb", seeds / "t91.lmdb" / "data.mdb", "data.mdb"),
                ("lmdb", seeds / "t91.lmdb" / "meta_info.txt", "meta_info.txt")]
    if (seeds / "clip.mp4").is_file():
        out.append(("video", seeds / "clip.mp4", "clip.mp4"))
    return out


def api_campaign(seeds: Path, work: Path, cases: int, seed: int, seconds: float) -> dict[str, Any]:
    """Run ``cases`` in-process cases (or until ``seconds`` pass); returns counts and failures."""
    import shutil

    from anysr.errors import AnysrError

    readers = _api_readers()
    files = api_seed_files(seeds)
    counts: dict[str, int] = {}
    outcomes: dict[str, int] = {"ok": 0, "refused": 0}
    failures: list[dict[str, Any]] = []
    known: list[dict[str, Any]] = []  # reads of a damaged LMDB that crashed (left alone: benchmarks/robustness.md)
    deadline = time.perf_counter() + seconds
    done = 0
    for case in range(cases):
        if time.perf_counter() > deadline:
            break
        rng = random.Random(f"{seed}:{case}")
        kind, src, name = files[case % len(files)]
        folder = work / f"case{case % 8}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        if kind == "lmdb":  # the other file of the LMDB folder stays valid
            for other in src.parent.iterdir():
                shutil.copy(other, folder / other.name)
        dst = folder / name
        what = mutate_file(src, dst, rng)
        counts[f"{kind}:{src.name}"] = counts.get(f"{kind}:{src.name}", 0) + 1
        done += 1
        print(f"case {case}: {kind} {src.name} {what}", file=sys.stderr, flush=True)  # names a crash's case
        if kind == "lmdb" and name == "data.mdb":  # LMDB trusts its pages: a damaged one can kill the reader
            status = _in_child(lambda r=readers[kind], f=dst: r(f, seeds))
            if status is None:
                outcomes["ok"] += 1
            elif status.startswith("refused"):
                outcomes["refused"] += 1
            elif status.startswith("killed"):
                known.append({"case": case, "kind": kind, "file": src.name, "mutation": what, "error": status})
            else:
                failures.append({"case": case, "kind": kind, "file": src.name, "mutation": what, "error": status})
            continue
        try:
            readers[kind](dst, seeds)
            outcomes["ok"] += 1
        except (AnysrError, OSError) as exc:
            outcomes["refused"] += 1
            if not _one_line(exc):
                failures.append({"case": case, "kind": kind, "file": src.name, "mutation": what,
                                 "error": f"{type(exc).__name__}: {str(exc)[:300]!r} is not one line"})
        except Exception as exc:  # noqa: BLE001 - what the fuzzer is for: any other exception is a finding
            failures.append({"case": case, "kind": kind, "file": src.name, "mutation": what,
                             "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return {"cases": done, "seed": seed, "per_file": counts, "outcomes": outcomes, "failures": failures,
            "known": known}


def _in_child(read: Callable[[], Any]) -> str | None:
    """Run ``read`` in a forked child: None (read), 'refused: ...' (one-line AnysrError / OSError), 'killed by
    signal N', or what else went wrong."""
    from anysr.errors import AnysrError

    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into the campaign
        os.close(rfd)
        try:
            read()
            text = ""
        except (AnysrError, OSError) as exc:
            text = "refused: ok" if _one_line(exc) else f"refused but not one line: {str(exc)[:300]!r}"
        except Exception as exc:  # noqa: BLE001 - any other exception is a finding
            text = f"{type(exc).__name__}: {str(exc)[:300]}"
        os.write(wfd, text.encode())
        os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        text = f.read().decode()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    if text == "refused: ok":
        return "refused"
    return text or None


if __name__ == "__main__":  # python tests/fuzzing.py api SEEDS WORK CASES SEED SECONDS
    sys.path.insert(0, str(ROOT))
    _, _, seeds_dir, work_dir, n_cases, fuzz_seed, budget = sys.argv
    print(json.dumps(api_campaign(Path(seeds_dir), Path(work_dir), int(n_cases), int(fuzz_seed), float(budget))))

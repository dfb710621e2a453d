"""``anysr prepare fetch``: the dataset table, and fetch + verify + extract + prepare against an HTTP server on the
loopback interface (with Range support, and able to cut a download midway) serving small stand-in archives."""

from __future__ import annotations

import errno
import hashlib
import io
import re
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from conftest import run_cli

from anysr.dataset_sources import SOURCES, provider_of
from anysr.download import DownloadFailed, download
from anysr.engine.prepare.fetch import fetch_dataset, safe_extract
from anysr.errors import DataError, OptionError
from anysr.options import load_options

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Server:
    """Files served by name; ``cut``: names whose next answer sends half the bytes, then closes; ``requests``:
    (path, Range header) of every request."""

    url: str = ""
    files: dict[str, bytes] = field(default_factory=dict)
    cut: set[str] = field(default_factory=set)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    no_range: bool = False


class _Handler(BaseHTTPRequestHandler):
    server_state: Server

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        state = self.server_state
        name = self.path.lstrip("/")
        rng = self.headers.get("Range")
        state.requests.append((name, rng))
        rng = None if state.no_range else rng
        if name not in state.files:
            self.send_error(404)
            return
        data = state.files[name]
        start = 0
        if rng:
            start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))  # type: ignore[union-attr]
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if name in state.cut:
            state.cut.discard(name)
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    state = Server()
    handler = type("Handler", (_Handler,), {"server_state": state})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    monkeypatch.setenv("ANYSR_DATASET_MIRROR", state.url)
    monkeypatch.delenv("ANYSR_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def _png(h: int, w: int, seed: int) -> bytes:
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x + seed * 7) % 256, (y * 2 + seed) % 256, (x + y) % 256], axis=-1).astype(np.uint8)
    ok, buf = cv2.imencode(".png", img)
    assert ok
    return buf.tobytes()


def _zip(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return out.getvalue()


def _md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _div2k_standins() -> dict[str, bytes]:
    """DIV2K's six zips with two 528x504 training images (4 sub-images each at 480 / 240) and one valid image."""
    hr = {f"{i:04d}": _png(504, 528, i) for i in (1, 2)}
    files = {"DIV2K_train_HR.zip": _zip({f"DIV2K_train_HR/{k}.png": v for k, v in hr.items()}),
             "DIV2K_valid_HR.zip": _zip({"DIV2K_valid_HR/0801.png": _png(64, 64, 9)})}
    for s in (2, 4):
        files[f"DIV2K_train_LR_bicubic_X{s}.zip"] = _zip(
            {f"DIV2K_train_LR_bicubic/X{s}/{k}x{s}.png": _png(504 // s, 528 // s, int(k)) for k in hr})
        files[f"DIV2K_valid_LR_bicubic_X{s}.zip"] = _zip(
            {f"DIV2K_valid_LR_bicubic/X{s}/0801x{s}.png": _png(64 // s, 64 // s, 9)})
    return files


@pytest.fixture
def div2k(server: Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """The stand-in DIV2K served, and the table's DIV2K entry pinned to the stand-ins' md5 (sizes unpinned)."""
    files = _div2k_standins()
    server.files.update(files)
    real = SOURCES["DIV2K"]
    monkeypatch.setitem(SOURCES, "DIV2K", replace(real, files=tuple(
        replace(f, md5=_md5(files[f.name]), size=None) for f in real.files)))
    return files


# ------------------------------------------------------------------------------------------ the table
def test_the_table_is_consistent() -> None:
    names = [f.name for s in SOURCES.values() for f in s.files]
    assert len(names) == len(set(names))  # a mirror holds them side by side
    for source in SOURCES.values():
        for f in source.files:
            assert f.urls and all(u.startswith(("http://", "https://")) and u.endswith("/" + f.name) for u in f.urls)
            assert f.md5 is None or re.fullmatch(r"[0-9a-f]{32}", f.md5), f.name
            assert f.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", f.sha256), f.name
        assert source.licence and source.citation and source.provides
    assert SOURCES["DIV2K"].files[0].md5 == "bdc2d9338d4e574fe81bf7d158758658"  # as torchSR / deepinv pin it
    # BasicSR's extract_subimages settings: GT 480 / 240 / 0, LR divided by the scale
    sub = {s.output: s.args for s in SOURCES["DIV2K"].steps if s.kind == "subimages"}
    assert sub == {"DIV2K/DIV2K_train_HR_sub": (480, 240, 0), "DIV2K/DIV2K_train_LR_bicubic_X2_sub": (240, 120, 0),
                   "DIV2K/DIV2K_train_LR_bicubic_X4_sub": (120, 60, 0)}


def test_shipped_option_paths_name_their_dataset() -> None:
    assert provider_of("datasets/DIV2K/DIV2K_train_HR_sub") == ("DIV2K", Path("datasets"))
    assert provider_of("/d/datasets/REDS4/sharp_bicubic") == ("REDS", Path("/d/datasets"))
    assert provider_of("datasets/vimeo90k/BIx4") == ("Vimeo90K", Path("datasets"))
    assert provider_of("datasets/benchmark/Set5/LR_bicubic/X4") == ("benchmark", Path("datasets"))
    assert provider_of("datasets/DF2K/meta_info/meta_info_DF2Kmultiscale+OST_sub.txt") == ("DF2K_OST",
                                                                                           Path("datasets"))
    assert provider_of("datasets/DF2K") == ("DF2K_OST", Path("datasets"))
    assert provider_of("datasets/DF2K/LR_bicubic/X2") == ("DF2K", Path("datasets"))  # train_DAT_x2.yml
    assert provider_of("datasets/DF2K/DF2K_train_LR_bicubic_X4_sub") == ("DF2K", Path("datasets"))  # SAFMN
    assert provider_of("datasets/Set5/HR") is None  # bundled with anysr
    assert provider_of("DIV2K_train_HR_sub") is None


def test_the_does_not_exist_message_names_the_command(tmp_path: Path) -> None:
    with pytest.raises(OptionError) as exc:
        load_options(ROOT / "options" / "train" / "train_MSRResNet_x4.yml", is_train=True, root=tmp_path,
                     check_paths=True)
    text = str(exc.value)
    line = next(ln for ln in text.splitlines() if "DIV2K_train_HR_sub" in ln)
    assert "does not exist; `anysr prepare fetch DIV2K --root " + str(tmp_path / "datasets") + "` downloads" in line


# ---------------------------------------------------------------------------------- download / fetch
def test_fetch_verifies_extracts_and_prepares(div2k: dict[str, bytes], tmp_path: Path) -> None:
    root = tmp_path / "data"
    report = fetch_dataset("div2k", root, progress=False)
    assert sorted(report.downloaded) == sorted(div2k) and not report.pinned_locally
    hr_sub = root / "DIV2K" / "DIV2K_train_HR_sub"
    assert sorted(p.name for p in hr_sub.iterdir()) == [f"{i:04d}_s{j:03d}.png" for i in (1, 2) for j in range(1, 5)]
    for s, side in ((2, 240), (4, 120)):
        lr = sorted((root / "DIV2K" / f"DIV2K_train_LR_bicubic_X{s}_sub").iterdir())
        assert [p.name for p in lr] == sorted(p.name for p in hr_sub.iterdir())
        assert cv2.imread(str(lr[0])).shape == (side, side, 3)
    meta = (root / "DIV2K" / "meta_info" / "meta_info_DIV2K800sub_GT.txt").read_text().splitlines()
    assert meta[0] == "0001_s001.png (480,480,3)" and len(meta) == 8
    # the second crop of image 1 is the HR image's pixels at (0, 48): BasicSR's layout
    img = cv2.imdecode(np.frombuffer(_png(504, 528, 1), np.uint8), cv2.IMREAD_UNCHANGED)
    assert np.array_equal(cv2.imread(str(hr_sub / "0001_s002.png")), img[0:480, 48:528])
    assert (root / "DIV2K" / "DIV2K_valid_LR_bicubic" / "X4" / "0801x4.png").is_file()
    assert set(report.provides) == {root / p for p in SOURCES["DIV2K"].provides}
    assert not list(root.rglob("*.part")) and not list(root.rglob("*fetch-tmp*"))
    # idempotent: nothing downloaded, extracted or prepared again
    again = fetch_dataset("DIV2K", root, progress=False)
    assert again.downloaded == [] and sorted(again.verified) == sorted(div2k)
    assert again.extracted == [] and again.steps_run == [] and len(again.steps_skipped) == 4


def test_an_interrupted_download_resumes(div2k: dict[str, bytes], server: Server, tmp_path: Path) -> None:
    root = tmp_path / "data"
    name = "DIV2K_train_HR.zip"
    server.cut.add(name)
    with pytest.raises(DataError) as exc:
        fetch_dataset("DIV2K", root, prepare=False, progress=False)
    text = str(exc.value)
    assert "\n" not in text and f"downloading {name} from {server.url}/{name} failed (" in text
    half = len(div2k[name]) // 2
    assert f"({half} bytes kept in {name}.part: rerunning continues)" in text
    assert (root / "downloads" / f"{name}.part").stat().st_size == half
    fetch_dataset("DIV2K", root, prepare=False, progress=False)
    assert (root / "downloads" / name).read_bytes() == div2k[name]
    assert (name, f"bytes={half}-") in server.requests  # continued, not restarted
    assert [r for r in server.requests if r[0] == name] == [(name, None), (name, f"bytes={half}-")]


def test_a_server_without_range_restarts_the_file(tmp_path: Path, server: Server) -> None:
    data = b"0123456789" * 1000
    server.files["f.bin"] = data
    dest = tmp_path / "f.bin"
    server.no_range = True  # answers 200 with the whole file: the part's bytes are dropped, not appended to
    (tmp_path / "f.bin.part").write_bytes(b"garbage that is not the start of the file")
    digests = download(f"{server.url}/f.bin", dest, size=len(data), md5=_md5(data), progress=False)
    assert dest.read_bytes() == data and digests.md5 == _md5(data) and server.requests[-1][1] == "bytes=41-"
    # a part longer than the file: the server answers 416, the part fails its size check and is set aside
    server.no_range = False
    dest.unlink()
    (tmp_path / "f.bin.part").write_bytes(b"x" * (len(data) + 5))
    with pytest.raises(DownloadFailed) as exc:
        download(f"{server.url}/f.bin", dest, size=len(data), progress=False)
    assert exc.value.kind == "size" and exc.value.kept == tmp_path / "f.bin.bad" and not dest.exists()
    assert download(f"{server.url}/f.bin", dest, size=len(data), progress=False).size == len(data)


def test_a_checksum_mismatch_is_set_aside(div2k: dict[str, bytes], server: Server, tmp_path: Path) -> None:
    root = tmp_path / "data"
    server.files["DIV2K_valid_HR.zip"] = b"not the archive"
    with pytest.raises(DataError) as exc:
        fetch_dataset("DIV2K", root, progress=False)
    text = str(exc.value)
    assert "\n" not in text and text.startswith(f"the download of DIV2K_valid_HR.zip from {server.url}/"
                                                "DIV2K_valid_HR.zip has md5 ")
    assert f"expected {_md5(div2k['DIV2K_valid_HR.zip'])}; it was set aside as " in text
    downloads = root / "downloads"
    assert (downloads / "DIV2K_valid_HR.zip.bad").read_bytes() == b"not the archive"
    assert not (downloads / "DIV2K_valid_HR.zip").exists() and not (root / "DIV2K").exists()
    # a verified file damaged later is found at the next run, set aside and downloaded again
    server.files["DIV2K_valid_HR.zip"] = div2k["DIV2K_valid_HR.zip"]
    fetch_dataset("DIV2K", root, prepare=False, progress=False)
    (downloads / "DIV2K_train_LR_bicubic_X2.zip").write_bytes(b"damaged")
    report = fetch_dataset("DIV2K", root, prepare=False, progress=False)
    assert report.downloaded == ["DIV2K_train_LR_bicubic_X2.zip"]
    assert (downloads / "DIV2K_train_LR_bicubic_X2.zip.bad").read_bytes() == b"damaged"


def test_missing_files_offline_and_unknown_names(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level("WARNING")
    with pytest.raises(DataError, match=r"downloading DIV2K_train_HR\.zip from .* failed \(HTTP 404\); check the "
                                        r"network, set ANYSR_DATASET_MIRROR"):
        fetch_dataset("DIV2K", tmp_path, progress=False)
    monkeypatch.setenv("ANYSR_OFFLINE", "1")
    (tmp_path / "downloads" / "DIV2K_valid_HR.zip").write_bytes(b"a wrong file")
    with pytest.raises(DataError) as exc:  # every missing archive at once, each with its URL and checksum
        fetch_dataset("DIV2K", tmp_path, progress=False)
    lines = str(exc.value).splitlines()
    assert lines[0] == (f"downloading is off (ANYSR_OFFLINE=1) and 6 files are not in {tmp_path / 'downloads'}; "
                        "download them there, then run the command again:")
    assert lines[1].startswith("  DIV2K_train_HR.zip: http://data.vision.ee.ethz.ch/cvl/DIV2K/DIV2K_train_HR.zip "
                               "(md5 ") and len(lines) == 7
    assert (tmp_path / "downloads" / "DIV2K_valid_HR.zip.bad").read_bytes() == b"a wrong file"
    assert "downloaded again" not in caplog.text and "set aside as DIV2K_valid_HR.zip.bad" in caplog.text
    assert "expected md5 " in caplog.text
    assert not list((tmp_path / "downloads").glob("*.lock")) and not list((tmp_path / "downloads").glob(".*.lock"))
    with pytest.raises(OptionError, match=r"no dataset is named 'DIV3K'; known: DIV2K, Flickr2K"):
        fetch_dataset("DIV3K", tmp_path)
    monkeypatch.delenv("ANYSR_OFFLINE")
    monkeypatch.setenv("ANYSR_DATASET_MIRROR", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(DataError, match=r"downloading DIV2K_train_HR\.zip from http://127\.0\.0\.1:9/DIV2K_train_HR"
                                        r"\.zip failed \("):
        fetch_dataset("DIV2K", tmp_path, progress=False)


# ------------------------------------------------------------------------------------------ extraction
def _tar(members: list[tarfile.TarInfo], data: bytes = b"x") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tf:
        for info in members:
            if info.isfile():
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
            else:
                tf.addfile(info)
    return out.getvalue()


@pytest.mark.parametrize("case", ["zip_dotdot", "zip_absolute", "tar_dotdot", "tar_absolute", "tar_symlink"])
def test_extraction_refuses_members_outside(case: str, tmp_path: Path) -> None:
    archive = tmp_path / ("a.zip" if case.startswith("zip") else "a.tar.gz")
    if case == "zip_dotdot":
        archive.write_bytes(_zip({"ok/a.png": b"x", "ok/../../evil.txt": b"x"}))
    elif case == "zip_absolute":
        archive.write_bytes(_zip({"/tmp/evil.txt": b"x"}))
    else:
        name = {"tar_dotdot": "../evil.txt", "tar_absolute": "/tmp/evil.txt", "tar_symlink": "ok/link"}[case]
        info = tarfile.TarInfo(name)
        if case == "tar_symlink":
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.write_bytes(_tar([tarfile.TarInfo("ok/a.png"), info]))
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"refused, member '.*' (would be written outside|is a link).*nothing "
                                        r"extracted$"):
        safe_extract(archive, out)
    assert not out.exists() and not (tmp_path / "evil.txt").exists()


def test_extraction_of_a_good_tar(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(_tar([tarfile.TarInfo("top/a.png"), tarfile.TarInfo("top/sub/b.png")], b"abc"))
    assert safe_extract(archive, tmp_path / "out") == ["top"]
    assert (tmp_path / "out" / "top" / "sub" / "b.png").read_bytes() == b"abc"
    (tmp_path / "bad.zip").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError, match=r"bad\.zip is (a damaged archive|neither a zip nor a tar)"):
        safe_extract(tmp_path / "bad.zip", tmp_path / "o2")


# ----------------------------------------------------------------------------------------------- CLI
def _reds_standins() -> dict[str, bytes]:
    """REDS' four zips: train clips 000, 011, 015, 020 (3 frames of 16x24), val clips 000, 001."""
    train, val = ("000", "011", "015", "020"), ("000", "001")

    def frames(top: str, sub: str, clips: tuple[str, ...], h: int, w: int) -> bytes:
        return _zip({f"{top}/{sub}/{c}/{f:08d}.png": _png(h, w, int(c) + f) for c in clips for f in range(3)})

    return {"train_sharp.zip": frames("train", "train_sharp", train, 16, 24),
            "train_sharp_bicubic.zip": frames("train", "train_sharp_bicubic/X4", train, 4, 6),
            "val_sharp.zip": frames("val", "val_sharp", val, 16, 24),
            "val_sharp_bicubic.zip": frames("val", "val_sharp_bicubic/X4", val, 4, 6)}


def test_cli_fetch_reds_pins_locally_then_skips(server: Server, tmp_path: Path) -> None:
    server.files.update(_reds_standins())
    env = {"ANYSR_DATASET_MIRROR": server.url, "ANYSR_OFFLINE": "0"}
    proc = run_cli("prepare", "fetch", "REDS", "--root", str(tmp_path / "ds"), cwd=tmp_path, env=env)
    root = tmp_path / "ds"
    assert "REDS in " in proc.stdout and "4 downloaded, 0 already verified, 4 extracted, 4 preparation step(s) run" \
        in proc.stdout
    assert "no published checksum for train_sharp.zip" in proc.stdout and "has no published checksum" in proc.stderr
    clips = sorted(p.name for p in (root / "REDS" / "train_sharp").iterdir())
    assert clips == ["000", "011", "015", "020", "240", "241"]
    assert sorted(p.name for p in (root / "REDS" / "train_sharp_bicubic" / "X4").iterdir()) == clips
    meta = (root / "REDS" / "meta_info" / "meta_info_REDS_GT.txt").read_text().splitlines()
    assert meta[0] == "000 3 (16,24,3)" and meta[-1] == "241 3 (16,24,3)" and len(meta) == 6
    assert sorted(p.name for p in (root / "REDS4" / "GT").iterdir()) == ["000", "011", "015", "020"]
    assert (root / "REDS4" / "sharp_bicubic" / "020" / "00000002.png").is_file()
    assert not (root / "REDS" / ".zips").exists()
    pins = (root / "downloads" / "pins.json").read_text()
    assert hashlib.sha256(server.files["val_sharp.zip"]).hexdigest() in pins
    again = run_cli("prepare", "fetch", "reds", "--root", str(root), cwd=tmp_path, env=env)
    assert "0 downloaded, 4 already verified, 0 extracted, 0 preparation step(s) run, 4 already done" in again.stdout
    # the local pin is checked from now on: a changed file on the server is refused
    original = server.files["val_sharp.zip"]
    (root / "downloads" / "val_sharp.zip").unlink()
    server.files["val_sharp.zip"] = b"x" * len(original)
    bad = run_cli("prepare", "fetch", "REDS", "--root", str(root), cwd=tmp_path, env=env, check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert re.search(r"^anysr prepare: error: the download of val_sharp\.zip from \S+ has sha256 [0-9a-f]{64}, "
                     f"expected {hashlib.sha256(original).hexdigest()}; it was set aside as ", bad.stderr)
    assert (root / "downloads" / "val_sharp.zip.bad").is_file()


def test_cli_list_and_missing_name(tmp_path: Path) -> None:
    listed = run_cli("prepare", "fetch", "--list", cwd=tmp_path)
    assert [ln.split()[0] for ln in listed.stdout.splitlines()] == list(SOURCES)
    missing = run_cli("prepare", "fetch", cwd=tmp_path, check=False)
    assert missing.returncode == 2 and "give a dataset NAME" in missing.stderr


def _patch_pins(monkeypatch: pytest.MonkeyPatch, name: str, files: dict[str, bytes]) -> None:
    real = SOURCES[name]
    monkeypatch.setitem(SOURCES, name, replace(real, files=tuple(
        replace(f, md5=_md5(files[f.name]), size=None) if f.pinned else f for f in real.files)))


def test_fetch_benchmark_lays_out_the_test_sets(server: Server, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tf:
        for name, data in {"benchmark/Set5/HR/baby.png": _png(8, 8, 1), "benchmark/B100/HR/3096.png": _png(8, 12, 2),
                           "benchmark/B100/LR_bicubic/X2/3096x2.png": _png(4, 6, 2),
                           "benchmark/Urban100/HR/img001.png": _png(12, 8, 3)}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    server.files["benchmark.tar"] = out.getvalue()
    _patch_pins(monkeypatch, "benchmark", server.files)
    root = tmp_path / "data"
    report = fetch_dataset("benchmark", root, progress=False)
    assert report.steps_run == ["link B100/HR", "link Urban100/HR"]
    assert (root / "B100" / "HR" / "3096.png").read_bytes() == _png(8, 12, 2)
    assert (root / "Urban100" / "HR" / "img001.png").is_file()
    assert (root / "benchmark" / "Set5" / "HR" / "baby.png").is_file()  # the LR folders stay where EDSR put them
    assert root / "benchmark" / "B100" / "LR_bicubic" / "X2" in report.provides


def test_fetch_vimeo_writes_meta_info_and_bicubic_x4(server: Server, tmp_path: Path) -> None:
    members = {f"vimeo_septuplet/sequences/00001/{s}/im{i}.png": _png(32, 48, i) for s in ("0001", "0002")
               for i in range(1, 8)}
    members["vimeo_septuplet/sep_trainlist.txt"] = b"00001/0001\n"
    members["vimeo_septuplet/sep_testlist.txt"] = b"00001/0002\n"
    server.files["vimeo_septuplet.zip"] = _zip(members)
    root = tmp_path / "data"
    report = fetch_dataset("Vimeo90K", root, progress=False)
    assert report.pinned_locally == ["vimeo_septuplet.zip"]
    v = root / "vimeo90k"
    assert (v / "meta_info_Vimeo90K_train_GT.txt").read_text() == "00001/0001 7 (32,48,3)\n"
    assert (v / "meta_info_Vimeo90K_test_GT.txt").read_text() == "00001/0002 7 (32,48,3)\n"
    lr = sorted((v / "BIx4" / "00001" / "0002").iterdir())
    assert [p.name for p in lr] == [f"im{i}.png" for i in range(1, 8)]
    assert cv2.imread(str(lr[0])).shape == (8, 12, 3)


def test_a_full_disk_is_one_line_and_keeps_the_part(div2k: dict[str, bytes], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import anysr.download as dl

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dl.os, "fsync", full)
    with pytest.raises(DataError) as exc:
        fetch_dataset("DIV2K", tmp_path / "data", progress=False)
    text = str(exc.value)
    assert "\n" not in text and text.startswith("writing ") and "the disk is full; free space" in text
    assert "the partial download is kept and continued" in text
    assert (tmp_path / "data" / "downloads" / "DIV2K_train_HR.zip.part").is_file()


def test_fetch_df2k_ost_builds_real_esrgans_training_set(div2k: dict[str, bytes], server: Server, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from PIL import Image

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tf:
        data = _png(420, 410, 5)
        info = tarfile.TarInfo("Flickr2K/Flickr2K_HR/000001.png")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    server.files["Flickr2K.tar"] = out.getvalue()
    _patch_pins(monkeypatch, "Flickr2K", server.files)
    server.files["OST_dataset.zip"] = _zip({"OutdoorSceneTrain_v2/animal/animal_0001.png": _png(400, 400, 6),
                                            "OutdoorSceneTrain_v2/sky/sky_0001.png": _png(410, 401, 7)})
    root = tmp_path / "data"
    report = fetch_dataset("df2k_ost", root, progress=False)
    assert sorted(report.downloaded) == sorted([*div2k, "Flickr2K.tar", "OST_dataset.zip"])
    assert report.pinned_locally == ["OST_dataset.zip"] and len(report.steps_run) == 7
    df2k = root / "DF2K"
    assert sorted(p.name for p in (df2k / "DF2K_HR").iterdir()) == ["000001.png", "0001.png", "0002.png"]
    assert sorted(p.name for p in (df2k / "OST").iterdir()) == ["OutdoorSceneTrain_v2_animal_animal_0001.png",
                                                                "OutdoorSceneTrain_v2_sky_sky_0001.png"]
    # Real-ESRGAN's scales: int(w * s) x int(h * s) for 0.75, 0.5, 1/3, then the shortest edge at 400
    sizes = {p.name: Image.open(p).size for p in (df2k / "DF2K_multiscale").iterdir() if p.stem.startswith("0001")}
    assert sizes == {"0001T0.png": (396, 378), "0001T1.png": (264, 252), "0001T2.png": (176, 168),
                     "0001T3.png": (419, 400)}
    src = Image.open(df2k / "DF2K_HR" / "0001.png")
    expect = np.asarray(src.resize((264, 252), resample=Image.LANCZOS))
    assert np.array_equal(np.asarray(Image.open(df2k / "DF2K_multiscale" / "0001T1.png")), expect)
    meta = (df2k / "meta_info" / "meta_info_DF2Kmultiscale+OST_sub.txt").read_text().splitlines()
    assert meta[:4] == [f"DF2K_HR_sub/000001_s{i:03d}.png" for i in range(1, 5)]
    # 528x504 -> 4 crops of 400 at step 200 (thresh 0), 420x410 -> 4; T3 419x400 -> 2; OST 400x400 -> 1, 410x401 -> 4
    assert sum(ln.startswith("DF2K_HR_sub/") for ln in meta) == 12
    assert sum(ln.startswith("DF2K_multiscale_sub/") for ln in meta) == len(list((df2k / "DF2K_multiscale_sub")
                                                                                 .iterdir()))
    assert sum(ln.startswith("OST_sub/") for ln in meta) == 5
    assert all((df2k / ln).is_file() for ln in meta)
    assert not (root / "DIV2K" / "DIV2K_train_HR_sub").exists()  # DIV2K's own preparation was not needed


def test_fetch_df2k_merges_div2k_and_flickr2k(div2k: dict[str, bytes], server: Server, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tf:
        for name, data in {"Flickr2K/Flickr2K_HR/000001.png": _png(480, 480, 5),
                           "Flickr2K/Flickr2K_LR_bicubic/X2/000001x2.png": _png(240, 240, 5),
                           "Flickr2K/Flickr2K_LR_bicubic/X4/000001x4.png": _png(120, 120, 5)}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    server.files["Flickr2K.tar"] = out.getvalue()
    _patch_pins(monkeypatch, "Flickr2K", server.files)
    root = tmp_path / "data"
    fetch_dataset("DF2K", root, progress=False)
    df2k = root / "DF2K"
    assert sorted(p.name for p in (df2k / "LR_bicubic" / "X2").iterdir()) == ["000001x2.png", "0001x2.png",
                                                                             "0002x2.png"]
    hr = sorted(p.name for p in (df2k / "DF2K_train_HR_sub").iterdir())
    assert hr == ["000001_s001.png", *(f"{i:04d}_s{j:03d}.png" for i in (1, 2) for j in range(1, 5))]
    for s in (2, 4):
        assert sorted(p.name for p in (df2k / f"DF2K_train_LR_bicubic_X{s}_sub").iterdir()) == hr
    assert len((df2k / "meta_info" / "meta_info_DF2K3450sub_GT.txt").read_text().splitlines()) == 9
    # hard links where the file system allows them: no second copy of the images
    assert (df2k / "HR" / "0001.png").stat().st_ino == (root / "DIV2K" / "DIV2K_train_HR" / "0001.png").stat().st_ino


def test_a_file_put_there_by_hand_is_used_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYSR_OFFLINE", "1")
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / "OST_dataset.zip").write_bytes(_zip({"OST300/img_001.png": _png(8, 8, 1)}))
    report = fetch_dataset("OST", tmp_path, progress=False)
    assert report.verified == ["OST_dataset.zip"] and report.pinned_locally == ["OST_dataset.zip"]
    assert (tmp_path / "OST" / "OST300" / "img_001.png").is_file()
    # from now on the local pin decides: a different file in its place is set aside
    (downloads / "OST_dataset.zip").write_bytes(b"something else")
    with pytest.raises(DataError, match=r"downloading is off .* 1 file is not in .*\n  OST_dataset\.zip: https:"):
        fetch_dataset("OST", tmp_path, progress=False)
    assert (downloads / "OST_dataset.zip.bad").read_bytes() == b"something else"

"""Standard weight files found by name (``anysr.engine.checkpoint.hub``): torch hub's cache, an installed package,
else one verified download, here from an HTTP server on the loopback interface serving the real LPIPS v0.1 alex
head (``tests/fixtures/weights``) through ``ANYSR_WEIGHTS_MIRROR``."""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import run_cli, tiny_train_options, write_options
from metric_files import write_metric_weights

from anysr.engine.checkpoint import load_model_weights, load_weights
from anysr.engine.checkpoint.hub import KNOWN, find_weights, hub_checkpoints, resolve_weights
from anysr.errors import CheckpointError
from anysr.metrics.info import METRIC_INFOS, standard_weights
from anysr.metrics.lpips import LPIPS
from anysr.models.base import WeightNeed
from anysr.models.loss_set import loss_specs, loss_weight_needs

HEAD = Path(__file__).resolve().parent / "fixtures" / "weights" / "lpips_v0.1_alex.pth"
HEAD_NAME = KNOWN["lpips_alex"].file_name


@dataclass
class Served:
    """The loopback server: ``url`` (the mirror), ``folder`` (what it serves), ``requests`` (paths asked for);
    ``cut``: send the full Content-Length but only half the bytes, then close (an interrupted download)."""

    url: str
    folder: Path
    requests: list[str] = field(default_factory=list)
    cut: bool = False
    delay_s: float = 0.0


class _Handler(SimpleHTTPRequestHandler):
    served: Served

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.served.requests.append(self.path)
        time.sleep(self.served.delay_s)
        if not self.served.cut:
            super().do_GET()
            return
        data = (self.served.folder / self.path.lstrip("/")).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[: len(data) // 2])
        self.wfile.flush()
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        pass


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """A loopback mirror holding the real LPIPS alex head; TORCH_HOME an empty temp folder; downloading allowed."""
    folder = tmp_path / "mirror"
    folder.mkdir()
    (folder / HEAD_NAME).write_bytes(HEAD.read_bytes())
    state = Served("", folder)
    handler = type("Handler", (_Handler,), {"served": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(handler, directory=str(folder)))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/"
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    monkeypatch.setenv("ANYSR_WEIGHTS_MIRROR", state.url)
    monkeypatch.delenv("ANYSR_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    yield state
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _cache_files(home: Path) -> list[str]:
    folder = home / "hub" / "checkpoints"
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) if folder.exists() else []


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_the_table_pins_every_file() -> None:
    for name, known in KNOWN.items():
        assert known.name == name and re.fullmatch(r"[0-9a-f]{64}|[0-9a-f]{8}", known.sha256), name
        assert known.url.startswith("https://"), name
    for name in ("vgg19", "vgg19_bn", "vgg16", "alexnet", "fid_inception"):  # torch.hub names: <name>-<sha8>.pth
        assert KNOWN[name].file_name.endswith(f"-{KNOWN[name].sha256[:8]}.pth"), name
        assert KNOWN[name].url.endswith("/" + KNOWN[name].file_name), name
    assert len(KNOWN["fid_inception"].sha256) == 8  # only the prefix is established (docs/judging.md)
    assert hashlib.sha256(HEAD.read_bytes()).hexdigest() == KNOWN["lpips_alex"].sha256
    # every file a metric or a loss asks for by name is in the table, with the URL metrics/info.py documents
    wanted = {n for m in ("dists", "fid") for n in standard_weights(m)} | set(standard_weights("lpips", "vgg"))
    wanted |= set(standard_weights("lpips")) | {"vgg19", "vgg19_bn"}
    assert wanted <= set(KNOWN)
    urls = {k.url for k in KNOWN.values()}
    assert {w.url for info in METRIC_INFOS.values() for w in info.weights} <= urls
    assert standard_weights("psnr") == ()


def test_downloaded_once_verified_then_read_from_the_cache(served: Served, tmp_path: Path) -> None:
    home = tmp_path / "torch_home"
    assert hub_checkpoints() == home / "hub" / "checkpoints"  # TORCH_HOME respected
    path = resolve_weights("lpips_alex", "val.metrics.lpips.weights")
    assert path == home / "hub" / "checkpoints" / HEAD_NAME and path.read_bytes() == HEAD.read_bytes()
    assert served.requests == ["/" + HEAD_NAME]
    assert _cache_files(home) == [HEAD_NAME]  # no temp file left
    assert resolve_weights("lpips_alex", "x") == path and find_weights("lpips_alex") == path
    assert served.requests == ["/" + HEAD_NAME]  # the second resolve asked nothing
    # the real head goes through the safe reader into anysr's LPIPS (with a seeded alexnet)
    head, _ = load_weights(path)
    assert sorted(head) == [f"lin{i}.model.1.weight" for i in range(5)]
    alexnet = write_metric_weights(tmp_path / "w", ("lpips",))["lpips"][0]
    lpips = LPIPS(net="alex").load_weights(load_weights(alexnet)[0], head)
    x = torch.rand(1, 3, 32, 32)
    assert float(lpips(x, x)) == 0.0 and float(lpips(x, torch.rand(1, 3, 32, 32))) > 0


def test_a_wrong_file_is_refused_and_not_kept(served: Served, tmp_path: Path) -> None:
    (served.folder / HEAD_NAME).write_bytes(b"not the lpips head" * 100)
    with pytest.raises(CheckpointError) as exc:
        resolve_weights("lpips_alex", "train.losses[1].weights")
    text = _one_line(exc)
    assert text.startswith("train.losses[1].weights: the download of lpips_v0.1_alex-df73285e.pth from "
                           f"{served.url}{HEAD_NAME} has sha256 ")
    assert f"expected {KNOWN['lpips_alex'].sha256}; nothing was kept" in text
    assert _cache_files(tmp_path / "torch_home") == []
    # a prefix pin (pytorch-fid's Inception) is checked as torch.hub checks it
    (served.folder / KNOWN["fid_inception"].file_name).write_bytes(b"x" * 1000)
    with pytest.raises(CheckpointError, match=r"expected 6726825d\.\.\. \(prefix\); nothing was kept"):
        resolve_weights("fid_inception", "val.metrics.fid.weights")
    assert _cache_files(tmp_path / "torch_home") == []


def test_an_interrupted_download_leaves_no_file(served: Served, tmp_path: Path) -> None:
    served.cut = True
    with pytest.raises(CheckpointError) as exc:
        resolve_weights("lpips_alex", "val.metrics.lpips.weights")
    text = _one_line(exc)
    assert f"downloading the LPIPS v0.1 alex head from {served.url}{HEAD_NAME} failed" in text
    assert "download it by hand to" in text and "ANYSR_WEIGHTS_MIRROR" in text
    assert _cache_files(tmp_path / "torch_home") == [] and len(served.requests) == 1
    served.cut = False  # the next run downloads it whole
    assert resolve_weights("lpips_alex", "x").read_bytes() == HEAD.read_bytes()


def test_concurrent_processes_download_once(served: Served, tmp_path: Path) -> None:
    """Ranks resolving at the same moment (threads here: XLA runs ranks as threads; each opens its own lock):
    one downloads, the others wait for the lock and read its file."""
    served.delay_s = 0.3
    start = threading.Barrier(4)
    paths: list[Path] = []

    def rank() -> None:
        start.wait()
        paths.append(resolve_weights("lpips_alex", "x"))

    threads = [threading.Thread(target=rank) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(paths) == 4 and len(set(paths)) == 1 and served.requests == ["/" + HEAD_NAME]
    assert _cache_files(tmp_path / "torch_home") == [HEAD_NAME]


def test_an_unwritable_cache_is_one_line(served: Served, tmp_path: Path) -> None:
    (tmp_path / "torch_home").mkdir()
    (tmp_path / "torch_home" / "hub").write_text("a file where torch hub's folder should be")
    with pytest.raises(CheckpointError) as exc:
        resolve_weights("lpips_alex", "val.metrics.lpips.weights")
    assert _one_line(exc).startswith(f"val.metrics.lpips.weights: cannot write {HEAD_NAME} to torch hub's cache "
                                     f"{tmp_path / 'torch_home' / 'hub' / 'checkpoints'} (")
    assert "set TORCH_HOME to a writable folder" in str(exc.value) and served.requests == []


def test_an_unreachable_server_is_one_line(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANYSR_WEIGHTS_MIRROR", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(CheckpointError) as exc:
        resolve_weights("lpips_alex", "val.metrics.lpips.weights")
    assert f"downloading the LPIPS v0.1 alex head from http://127.0.0.1:9/{HEAD_NAME} failed (" in _one_line(exc)


@pytest.mark.parametrize("var", ["ANYSR_OFFLINE", "HF_HUB_OFFLINE"])
def test_offline_refuses_in_one_line(served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     var: str) -> None:
    monkeypatch.setenv(var, "1")
    with pytest.raises(CheckpointError) as exc:
        resolve_weights("lpips_alex", "val.metrics.lpips.weights")
    dest = tmp_path / "torch_home" / "hub" / "checkpoints" / HEAD_NAME
    assert _one_line(exc) == (f"val.metrics.lpips.weights: the LPIPS v0.1 alex head ({HEAD_NAME}) is not on this "
                              f"machine and downloading is off ({var}=1); download {served.url}{HEAD_NAME} to "
                              f"{dest}, or set val.metrics.lpips.weights to a copy")
    assert served.requests == []


def test_cache_hits_ask_nothing_and_are_not_rehashed(served: Served, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "torch_home" / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    (cache / "vgg19-dcbb9e9d.pth").write_bytes(b"whatever torchvision left here")
    monkeypatch.setenv("ANYSR_OFFLINE", "1")
    assert resolve_weights("vgg19", "train.perceptual_opt.vgg_weights_path") == cache / "vgg19-dcbb9e9d.pth"
    assert served.requests == []


def test_an_installed_lpips_package_is_used(served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "site" / "lpips"
    (pkg / "weights" / "v0.1").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('found through its spec, never imported')\n")
    (pkg / "weights" / "v0.1" / "alex.pth").write_bytes(HEAD.read_bytes())
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert resolve_weights("lpips_alex", "x") == pkg / "weights" / "v0.1" / "alex.pth"
    assert served.requests == [] and find_weights("lpips_vgg") is None


def test_a_path_in_the_options_wins(served: Served, tmp_path: Path) -> None:
    given = tmp_path / "my_head.pth"
    given.write_bytes(HEAD.read_bytes())
    got: list[dict[str, torch.Tensor]] = []
    needs = [WeightNeed("lpips (lpips_alex)", "train.losses[1].weights", str(given), lambda sd, load: got.append(sd),
                        required=True, fresh_only=False, known="lpips_alex")]
    lines = load_model_weights(SimpleNamespace(weight_needs=lambda: needs), fresh=True)
    assert lines == [f"loaded pretrained weights {given} [params] (lpips (lpips_alex))"] and len(got) == 1
    assert served.requests == [] and _cache_files(tmp_path / "torch_home") == []
    needs = [WeightNeed("lpips (lpips_alex)", "o", None, lambda sd, load: got.append(sd), required=True,
                        fresh_only=False, known="lpips_alex")]
    lines = load_model_weights(SimpleNamespace(weight_needs=lambda: needs), fresh=True)
    cached = tmp_path / "torch_home" / "hub" / "checkpoints" / HEAD_NAME
    assert lines == [f"loaded pretrained weights {cached} [params] (lpips (lpips_alex), found by name)"]
    assert served.requests == ["/" + HEAD_NAME]


def test_losses_ask_for_their_standard_files_and_weight_zero_asks_nothing() -> None:
    train = {"losses": [{"type": "L1Loss"}, {"type": "LPIPSLoss", "net": "vgg"}, {"type": "DISTSLoss",
             "loss_weight": 0}, {"type": "PerceptualLoss", "layer_weights": {"conv5_4": 1.0}, "vgg_type": "vgg19_bn",
             "loss_weight": 0.0}, {"type": "ContextualLoss", "layer_weights": {"conv4_4": 1.0}}]}
    needs = loss_weight_needs(loss_specs(train, "SRGANModel", ("pixel", "learned", "perceptual")), {})
    assert [(n.option, n.path, n.known) for n in needs] == [
        ("train.losses[1].weights", None, "vgg16"), ("train.losses[1].weights", None, "lpips_vgg"),
        ("train.losses[4].vgg_weights_path", None, "vgg19")]


@pytest.mark.slow
def test_train_finds_the_lpips_files_by_name(tmp_path: Path, small_train_dir: Path, small_val_dir: Path) -> None:
    """``anysr train --offline`` with an LPIPS loss and an LPIPS metric and no weight paths: both read torch hub's
    cache (a seeded AlexNet under torchvision's name, the real head); DISTS with loss_weight 0 needs nothing."""
    home = tmp_path / "torch_home"
    cache = home / "hub" / "checkpoints"
    cache.mkdir(parents=True)
    alexnet = write_metric_weights(tmp_path / "w", ("lpips",))["lpips"][0]
    (cache / KNOWN["alexnet"].file_name).write_bytes(alexnet.read_bytes())  # random weights: not re-hashed
    (cache / HEAD_NAME).write_bytes(HEAD.read_bytes())
    opt = tiny_train_options("byname", small_train_dir, small_val_dir, total_iter=2)
    opt["train"].pop("pixel_opt")
    opt["train"]["losses"] = [{"type": "l1loss"}, {"type": "lpipsloss", "loss_weight": 0.1},
                              {"type": "distsloss", "loss_weight": 0}]
    opt["val"]["val_freq"] = 2
    opt["val"]["metrics"]["lpips"] = {"type": "calculate_lpips"}
    path = write_options(tmp_path / "o.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--offline", "--force_yml", f"path.root={tmp_path}", cwd=tmp_path,
                   env={"TORCH_HOME": str(home)})
    log = proc.stdout + proc.stderr
    assert f"loaded pretrained weights {cache / KNOWN['alexnet'].file_name} [params] (lpips (alexnet), found by " \
           "name)" in log
    assert f"{cache / HEAD_NAME} [params] (lpips (lpips_alex), found by name)" in log
    assert "lpips" in (tmp_path / "experiments" / "byname" / "summary.json").read_text()
    # the same run on an empty cache stops before training, in one line naming the file
    proc = run_cli("train", "-opt", str(path), "--offline", "--force_yml", f"path.root={tmp_path / 'b'}",
                   cwd=tmp_path, env={"TORCH_HOME": str(tmp_path / "empty")}, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("anysr train: error: train.losses[1].weights: torchvision's AlexNet "
                           "(alexnet-owt-7be5be79.pth) is not on this machine and downloading is off "
                           "(ANYSR_OFFLINE=1); download https://download.pytorch.org/models/alexnet-owt-7be5be79.pth")

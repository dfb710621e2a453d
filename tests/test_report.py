"""Looking at a run: validation crops in TensorBoard, history.json, report.html (checked in a real headless
Chromium), ``anysr report``; the history survives a resume without counting a replayed stretch twice."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import pytest
from browser import Browser, find_chromium
from conftest import DATASETS, run_cli, tiny_train_options, write_options

from anysr.data import build_dataset
from anysr.engine.report.history import History, save_crops
from anysr.engine.report.page import svg_chart
from anysr.engine.report.run_report import write_report
from anysr.errors import DataError, OptionError
from anysr.ops.imresize import imresize
from anysr.options import load_options

CHROMIUM = find_chromium()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, small_train_dir: Path, small_val_dir: Path) -> dict[str, Any]:
    """A tiny training with PSNR and BasicSR's NIQE, validated twice, TensorBoard on, two images logged."""
    tmp = tmp_path_factory.mktemp("report")
    opt = tiny_train_options("rep", small_train_dir, small_val_dir, total_iter=4)
    opt["val"].update(val_freq=2, log_images=2, save_img=True)
    opt["val"]["metrics"]["niqe"] = {"type": "calculate_niqe", "crop_border": 4}
    opt["logger"]["use_tb_logger"] = True
    path = write_options(tmp / "rep.yml", opt)
    proc = run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp}", cwd=tmp)
    return {"tmp": tmp, "exp": tmp / "experiments" / "rep", "stdout": proc.stdout, "options": path}


@pytest.mark.slow
def test_training_keeps_history_crops_and_writes_the_report(run: dict[str, Any]) -> None:
    exp = run["exp"]
    assert "wrote" in run["stdout"] and "report.html" in run["stdout"]
    history = json.loads((exp / "history.json").read_text())
    assert [e["iter"] for e in history["train"]] == [2, 4]
    assert all("l_pix" in e["losses"] and e["lr"] > 0 for e in history["train"])
    assert [(e["iter"], e["dataset"]) for e in history["val"]] == [(2, "val"), (4, "val")]
    assert history["val"][0]["better"] == {"psnr": "higher", "niqe": "lower"}
    summary = json.loads((exp / "summary.json").read_text())
    niqe = summary["validation"]["val"]["niqe"]
    values = [e["metrics"]["niqe"] for e in history["val"]]
    assert niqe["best"] == min(values) and niqe["best_iter"] == [2, 4][values.index(min(values))]
    # the crops: the first two images of the dataset (sorted names: bird, butterfly), 128 x 128 at x2
    index = json.loads((exp / "report_files" / "index.json").read_text())
    assert index["val"]["iter"] == 4 and [e["name"] for e in index["val"]["images"]] == ["bird", "butterfly"]
    opt = load_options(run["options"], [f"path.root={run['tmp']}"], is_train=True)
    ds = build_dataset(opt.datasets.val, "datasets.val")
    for k, e in enumerate(index["val"]["images"]):
        top, left, h, w = e["box"]
        assert (h, w) == (128, 128)
        crops = {layer: cv2.imread(str(exp / "report_files" / f), cv2.IMREAD_COLOR)[:, :, ::-1]
                 for layer, f in e["files"].items()}
        assert set(crops) == {"lq", "bicubic", "sr", "gt"} and all(c.shape == (128, 128, 3) for c in crops.values())
        item = ds[k]
        gt = (item["gt"].numpy().transpose(1, 2, 0) * 255).round().astype(np.uint8)
        np.testing.assert_array_equal(crops["gt"], gt[top:top + h, left:left + w])
        lq = (item["lq"].numpy().transpose(1, 2, 0) * 255).round().astype(np.uint8)
        # the bicubic crop is the whole LQ image's MATLAB-bicubic upscaling there (rounded to 8 bits)
        full = np.clip(np.round(imresize(lq.astype(np.float64) / 255, 2) * 255), 0, 255).astype(np.uint8)
        assert np.abs(crops["bicubic"].astype(int) - full[top:top + h, left:left + w].astype(int)).max() <= 1
        np.testing.assert_array_equal(crops["lq"][::2, ::2], lq[top // 2:(top + h) // 2, left // 2:(left + w) // 2])
        assert Path(e["sr_path"]).is_file() and e["sr_path"].endswith(f"{e['name']}_4.png")
    # TensorBoard: LQ | result | ground truth side by side, one image per logged crop and validation
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(exp / "tb_logger"), size_guidance={"images": 0}).Reload()
    assert sorted(events.Tags()["images"]) == ["val/val/bird", "val/val/butterfly"]
    shots = events.Images("val/val/bird")
    assert [s.step for s in shots] == [2, 4] and shots[0].width == 3 * 128 + 4 and shots[0].height == 128
    html = (exp / "report.html").read_text()
    assert "net_g_4.safetensors" in html and "<svg" in html and "http://" not in html.replace(
        'xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run does)")
def test_report_page_in_a_headless_browser(run: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    assert CHROMIUM is not None
    shots = tmp_path_factory.mktemp("screenshots")
    page = (run["exp"] / "report.html").resolve()
    with Browser(CHROMIUM, shots / "profile") as b:
        b.open(page.as_uri())
        state = b.evaluate(_STATE)
        assert state["labels"] == ["bicubic", "result (iter 4)", "ground truth"]
        # the validation set's LQ is made from its GT (lq_from_gt): no "input" link opening the GT, and it says so
        assert "the input was made from the ground truth" in state["info"] and "input" not in state["links"]
        assert state["ends"] == ["blend", "bicubic", "ground truth"]  # what the slider does and what its ends are
        assert all(n > 0.9 * 256 * 256 for n in state["drawn"]), state["drawn"]  # three images on the canvases
        assert len(set(state["panes"])) == 3  # bicubic, result and ground truth differ
        # the slider: bicubic -> result -> ground truth on the comparison canvas (and a blend in between)
        stops = b.evaluate(_SLIDE)
        assert len(set(stops["sig"])) == 4 and stops["labels"][0] == "bicubic"
        assert stops["labels"][2] == "ground truth" and "\u2192" in stops["labels"][3]
        # zoom with the mouse wheel over the comparison canvas: every view redraws, at the same zoom
        box = b.evaluate("(() => {const r = document.getElementById('compare').getBoundingClientRect();"
                         " return [r.x + r.width / 2, r.y + r.height / 2];})()")
        b.evaluate("document.getElementById('compare').scrollIntoView({block: 'center'})")
        box = b.evaluate("(() => {const r = document.getElementById('compare').getBoundingClientRect();"
                         " return [r.x + r.width / 2, r.y + r.height / 2];})()")
        before = b.evaluate(_SIGS)
        b.mouse("mouseWheel", box[0], box[1], deltaY=-120)
        zoomed = b.evaluate(_SIGS)
        assert zoomed["zoom"] != before["zoom"]
        assert all(x != y for x, y in zip(before["all"], zoomed["all"]))
        # drag to pan: all views move together
        b.mouse("mousePressed", box[0], box[1])
        b.mouse("mouseMoved", box[0] + 40, box[1] + 25, button="left", buttons=1)
        b.mouse("mouseReleased", box[0] + 40, box[1] + 25)
        panned = b.evaluate(_SIGS)
        assert all(x != y for x, y in zip(zoomed["all"], panned["all"])) and panned["zoom"] == zoomed["zoom"]
        # another image from its thumbnail
        b.evaluate("document.querySelectorAll('.thumb')[1].click()")
        other = b.evaluate(_STATE)
        assert other["panes"] != state["panes"] and "butterfly" in other["info"]
        shot = b.screenshot(shots / "report.png")
        assert b.console_errors() == []
        schemes = {u.split(":", 1)[0] for u in b.requests()}
        assert schemes <= {"file", "data"}, schemes  # nothing leaves the machine
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


_WAIT = ("for (let k = 0; k < 100 && !document.getElementById('slider-label').textContent; k++)"
         " await new Promise(r => setTimeout(r, 50));")
_SIG = ("const sig = c => {const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; let h = 7;"
        " for (let i = 0; i < d.length; i += 4) h = (Math.imul(h, 31) + d[i] * 3 + d[i + 1] * 5 + d[i + 2]) >>> 0;"
        " return h;};")
_STATE = ("(async () => {" + _WAIT + _SIG + "await new Promise(r => setTimeout(r, 100));"
          "const panes = [...document.querySelectorAll('canvas.layer')].filter(c => c.parentElement.style.display"
          " !== 'none');"
          "const drawn = panes.map(c => {const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
          " let n = 0; for (let i = 0; i < d.length; i += 4) if (d[i] !== 34 || d[i + 1] !== 34 || d[i + 2] !== 34)"
          " n++; return n;});"
          "return {labels: panes.map(c => c.parentElement.querySelector('.pane-label').textContent), drawn,"
          " panes: panes.map(sig), info: document.getElementById('item-info').textContent,"
          " links: [...document.querySelectorAll('#item-info a')].map(a => a.textContent),"
          " ends: ['label[for=slider]', '#slider-lo', '#slider-hi'].map(q => document.querySelector(q).textContent)"
          "};})()")
_SLIDE = ("(() => {" + _SIG + "const s = document.getElementById('slider'), c = document.getElementById('compare');"
          "const out = {sig: [], labels: []};"
          "for (const v of [0, 100, 200, 150]) {s.value = String(v); s.dispatchEvent(new Event('input'));"
          " out.sig.push(sig(c)); out.labels.push(document.getElementById('slider-label').textContent);}"
          "return out;})()")
_SIGS = ("(() => {" + _SIG + "return {all: [...document.querySelectorAll('canvas.layer'),"
         " document.getElementById('compare')].filter(c => c.parentElement.style.display !== 'none').map(sig),"
         " zoom: document.getElementById('zoom').textContent};})()")


# Laptop windows the pages must fit (width x height of the browser's viewport).
LAPTOP_SIZES = ((1366, 768), (1280, 800))

# Measured in the page, after the viewer has drawn: the slider canvas against what it draws and its box, each
# chart's legend against its plot area and line points, the "N of M images" notes, horizontal overflow.
_LAYOUT = ("(async () => {" + _WAIT + "await new Promise(r => setTimeout(r, 150));"
           "const c = document.getElementById('compare'), r = c.getBoundingClientRect();"
           "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
           "let x0 = c.width, y0 = c.height, x1 = -1, y1 = -1;"
           "for (let y = 0; y < c.height; y++) for (let x = 0; x < c.width; x++) {const i = 4 * (y * c.width + x);"
           " if (d[i] !== 34 || d[i + 1] !== 34 || d[i + 2] !== 34) {x0 = Math.min(x0, x); x1 = Math.max(x1, x);"
           " y0 = Math.min(y0, y); y1 = Math.max(y1, y);}}"
           "const box = document.getElementById('viewer').getBoundingClientRect();"
           "const inter = (a, b) => a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;"
           "const charts = [...document.querySelectorAll('.chart svg')].map(svg => {"
           " const plot = svg.querySelector('rect.plot').getBoundingClientRect();"
           " const legend = svg.querySelector('g.legend').getBoundingClientRect(); const m = svg.getScreenCTM();"
           " const pts = [...svg.querySelectorAll('polyline')].flatMap(l => [...l.points])"
           "  .concat([...svg.querySelectorAll('circle')].map(e => ({x: e.cx.baseVal.value, y: e.cy.baseVal.value})))"
           "  .map(p => new DOMPoint(p.x, p.y).matrixTransform(m));"
           " return {title: svg.parentElement.querySelector('h3').textContent,"
           "  axes: ['.x-title', '.y-title'].map(q => svg.querySelector(q).textContent),"
           "  grid: svg.querySelectorAll('g.grid line').length, entries:"
           "  svg.querySelectorAll('g.legend text').length, over_plot: inter(legend, plot),"
           "  points: pts.length, points_under_legend: pts.filter(p => p.x >= legend.left && p.x <= legend.right"
           "  && p.y >= legend.top && p.y <= legend.bottom).length};});"
           "const thumbs = [...document.querySelectorAll('.thumb')].map(t => [t.getBoundingClientRect().top,"
           " t.querySelector('.cap').getBoundingClientRect().top]);"
           "const pane = document.querySelector('canvas.layer').getBoundingClientRect();"
           "return {canvas: [r.width, r.height], pixels: [c.width, c.height], drawn: [x1 - x0 + 1, y1 - y0 + 1],"
           " thumbs, pane_bottom: pane.bottom + scrollY,"
           " viewer: [box.width], inner: [innerWidth, innerHeight],"
           " scroll: document.documentElement.scrollWidth, charts,"
           " notes: [...document.querySelectorAll('.shown')].map(e => e.textContent),"
           " h: [...document.querySelectorAll('h1, h2, h3')].map(e => e.textContent)};})()")


def _check_layout(b: Browser, size: tuple[int, int], crop: tuple[int, int] = (128, 128)) -> dict[str, Any]:
    """The page at a laptop's window size: nothing overflows sideways, the slider view's crop (``crop``: width,
    height) fills its canvas with its aspect kept at a sensible size, and no legend lies over a chart's lines."""
    b.viewport(*size)
    m = b.evaluate(_LAYOUT)
    assert m["inner"] == list(size) and m["scroll"] <= size[0], m  # no horizontal scroll bar
    (cw, ch), (pw, ph), (dw, dh) = m["canvas"], m["pixels"], m["drawn"]
    assert (dw, dh) == (pw, ph), m  # the crop covers the whole canvas: no dark margin
    assert abs(cw / ch - crop[0] / crop[1]) < 0.02 and abs(cw - pw) <= 1, m  # aspect kept, not stretched by CSS
    assert cw >= min(0.4 * m["viewer"][0], 3 * crop[0]) and ch <= size[1], m  # large, but fits the window
    for chart in m["charts"]:
        assert chart["entries"] >= 1 and chart["points"] >= 1, chart
        assert not chart["over_plot"] and chart["points_under_legend"] == 0, chart
        assert chart["axes"][0] == "iteration" and chart["axes"][1] and chart["grid"] >= 4, chart  # titled, gridded
    rows: dict[float, set[float]] = {}
    for top, cap in m["thumbs"]:  # thumbnails of different heights: the captions of a row still line up
        rows.setdefault(round(top), set()).add(round(cap))
    assert all(len(caps) == 1 for caps in rows.values()), m["thumbs"]
    assert m["pane_bottom"] <= size[1], m  # the viewer's panes are on the first screen, no scrolling
    return m


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run does)")
def test_report_page_fits_a_laptop_window(run: dict[str, Any], tmp_path: Path) -> None:
    page = (run["exp"] / "report.html").resolve()
    with Browser(CHROMIUM or "", tmp_path / "profile") as b:
        b.open(page.as_uri())
        for size in LAPTOP_SIZES:
            m = _check_layout(b, size)
            # 2 of the dataset's 3 images are logged, and the page says so
            assert m["notes"] == ["2 of 3 images (val.log_images: 2)"], m["notes"]
            assert {c["title"] for c in m["charts"]} == {"training losses (log scale)", "learning rate",
                                                          "validation psnr", "validation niqe"}
            b.screenshot(tmp_path / f"report_{size[0]}.png")
        assert b.console_errors() == []


@pytest.fixture(scope="module")
def eval_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``anysr eval --report`` comparing two folders (a blurred and an exact copy) on three images, one of them
    wide and low (its centre crop is 128 x 60)."""
    tmp = tmp_path_factory.mktemp("evalpage")
    gt, soft, sharp = (tmp / n for n in ("HR", "soft", "sharp"))
    for folder in (gt, soft, sharp):
        folder.mkdir()
    for name in ("baby", "bird"):
        cv2.imwrite(str(gt / f"{name}.png"), cv2.imread(str(DATASETS / "Set5" / "HR" / f"{name}.png")))
    cv2.imwrite(str(gt / "wide.png"), cv2.imread(str(DATASETS / "Set5" / "HR" / "head.png"))[100:160, :200])
    for p in sorted(gt.glob("*.png")):
        img = cv2.imread(str(p))
        cv2.imwrite(str(soft / p.name), cv2.GaussianBlur(img, (5, 5), 1.0))
        cv2.imwrite(str(sharp / p.name), img)
    run_cli("eval", "--gt", str(gt), "--sr", str(soft), str(sharp), "--scale", "2", "--metrics", "psnr,ssim",
            "--report", str(tmp / "cmp.html"), cwd=tmp)
    return tmp / "cmp.html"


@pytest.mark.slow
def test_eval_page_says_what_it_compares(eval_page: Path) -> None:
    text = eval_page.read_text()
    assert "<h1>anysr eval: soft, sharp against the ground truth (x2)</h1>" in text
    assert "<h2>Averages over 3 images: PSNR, SSIM</h2>" in text
    assert "<h2>Per image: soft, sharp and the ground truth (centre crops, x2)</h2>" in text
    assert "<h3>ground truth evalpage0/HR</h3>" in text and "all 3 images of " in text
    assert "<h2>Images</h2>" not in text and "<h3>images</h3>" not in text


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run does)")
def test_eval_page_fits_a_laptop_window(eval_page: Path, tmp_path: Path) -> None:
    with Browser(CHROMIUM or "", tmp_path / "profile") as b:
        b.open(eval_page.resolve().as_uri())
        for size in LAPTOP_SIZES:
            m = _check_layout(b, size)
            assert m["charts"] == [] and len(m["notes"]) == 1 and m["notes"][0].startswith("all 3 images of ")
            assert m["h"][0] == "anysr eval: soft, sharp against the ground truth (x2)"
            # the wide image: its 128 x 60 crop keeps its aspect in the slider view, without a dark band
            b.evaluate("document.querySelector('.thumb[title=wide]').click()")
            _check_layout(b, size, crop=(128, 60))
            b.evaluate("document.querySelector('.thumb').click()")
            b.screenshot(tmp_path / f"eval_{size[0]}.png")
        assert b.console_errors() == []


@pytest.mark.slow
def test_anysr_report_command(run: dict[str, Any], tmp_path: Path) -> None:
    exp = run["exp"]
    (exp / "report.html").unlink()
    proc = run_cli("report", "rep", cwd=run["tmp"])
    assert (exp / "report.html").is_file() and "report.html" in proc.stdout
    bad = run_cli("report", str(tmp_path / "nowhere"), cwd=tmp_path, check=False)
    assert bad.returncode == 2 and "no such experiment folder" in bad.stderr and "Traceback" not in bad.stderr
    with pytest.raises(OptionError):
        write_report(tmp_path / "nowhere")
    with pytest.raises(DataError, match="anysr experiment folder"):
        write_report(tmp_path)


def test_page_says_how_many_images_it_shows_and_keeps_legends_off_the_plot(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    crops = [SimpleNamespace(name=f"img{k}", index=k, box=(0, 0, 16, 24), lq_path="", gt_path="",
                             **{layer: rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)
                                for layer in ("lq", "bicubic", "sr", "gt")}) for k in range(3)]
    save_crops(tmp_path, "Set14", crops, 10, count=14, log_images=3)
    save_crops(tmp_path, "Set5", crops[:2], 10, count=2, log_images=3)
    save_crops(tmp_path, "old", crops[:1], 10)  # an index.json entry from before the count was kept
    html = write_report(tmp_path).read_text()
    assert '<h3>Set14</h3><p class="muted shown">3 of 14 images (val.log_images: 3)</p>' in html
    assert '<h3>Set5</h3><p class="muted shown">all 2 images</p>' in html
    assert '<h3>old</h3><p class="muted shown">1 image, the dataset&#x27;s first</p>' in html
    # a legend of many names wraps (3 a row) below the plot area (whose bottom is at y = 200 - 22)
    chart = svg_chart("losses", {f"l_{'x' * 6}_{k}": [(0, 1.0), (10, 0.5)] for k in range(6)}, log_y=True)
    ys = [float(y) for y in re.findall(r'<text x="[\d.]+" y="([\d.]+)" font-size="10" fill=', chart)]
    assert len(ys) == 6 and min(ys) > 200 and len(set(ys)) == 2 and "losses (log scale)" in chart


def test_history_truncates_to_the_resumed_iteration(tmp_path: Path) -> None:
    h = History()
    for it in (2, 4, 6):
        h.add_train(it, 0, 1e-3, {"l_pix": 0.1 * it})
        h.add_val(it, "val", {"psnr": 20.0 + it}, {"psnr": "higher"})
    h.save(tmp_path)
    back = History.load(tmp_path)
    back.truncate(4)
    assert [e["iter"] for e in back.train] == [2, 4] and [e["iter"] for e in back.val] == [2, 4]
    assert History.load(tmp_path / "none").train == []
    (tmp_path / "history.json").write_text("{broken")
    with pytest.raises(DataError, match="history.json"):
        History.load(tmp_path)


@pytest.mark.slow
def test_resumed_run_does_not_count_a_replayed_stretch_twice(tmp_path: Path, small_train_dir: Path) -> None:
    opt = tiny_train_options("res", small_train_dir, None, total_iter=4)
    path = write_options(tmp_path / "o.yml", opt)
    run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", cwd=tmp_path)
    exp = tmp_path / "experiments" / "res"
    # as if the run had reported iteration 6 and then died before saving it
    h = History.load(exp)
    h.add_train(6, 0, 1e-3, {"l_pix": 9.0})
    h.save(exp)
    os.remove(exp / "training_states" / "4.state")
    run_cli("train", "-opt", str(path), "--force_yml", f"path.root={tmp_path}", "train.total_iter=6",
            "--auto_resume", cwd=tmp_path)
    iters = [e["iter"] for e in json.loads((exp / "history.json").read_text())["train"]]
    assert iters == [2, 4, 6] and json.loads((exp / "history.json").read_text())["train"][-1]["losses"]["l_pix"] != 9

"""The standard datasets ``anysr prepare fetch NAME`` downloads: where each file is published, its pinned checksum,
where it is extracted and the preparation that gives the folders the shipped option files name.

Torch-free (the options checker reads ``provider_of`` to name the command in its "does not exist" message). The
checksums are the ones published with the files or by established dataset loaders (md5 of DIV2K, Flickr2K and
EDSR's benchmark archive, as torchSR / deepinv / catalyst pin them); where none is published the pin is ``None``:
``fetch`` then records the first download's sha256 as the local pin (``downloads/pins.json``) and says so.
Downloading, extraction and the steps live in ``anysr.engine.prepare.fetch``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

__all__ = ["DATASET_MIRROR_VAR", "SOURCES", "DatasetSource", "SourceFile", "Step", "find_source", "provider_of"]

DATASET_MIRROR_VAR = "ANYSR_DATASET_MIRROR"  # a base URL: <mirror>/<file name> replaces the official URLs


@dataclass(frozen=True)
class SourceFile:
    """One published file: its name (on disk under ``<root>/downloads`` and on a mirror), its URLs (official
    first), size in bytes and checksums where published (None: not published), and the folder under the root its
    archive is extracted into."""

    name: str
    urls: tuple[str, ...]
    md5: str | None = None
    sha256: str | None = None
    size: int | None = None
    extract_to: str = "."

    @property
    def pinned(self) -> bool:
        return self.md5 is not None or self.sha256 is not None


@dataclass(frozen=True)
class Step:
    """One preparation step after extraction (run by ``anysr.engine.prepare.fetch``), skipped when ``output`` exists.

    kinds: ``subimages`` (``src`` cut into ``args`` = (crop, step, thresh) squares), ``meta_info`` (BasicSR's
    ``<name> (h,w,c)`` list of ``src``), ``link`` (``src``'s files hard-linked, else copied, to ``output``),
    ``gather`` (the images of ``src`` and of the folders in ``args``, at any depth, linked into one flat folder),
    ``multiscale`` (Real-ESRGAN's DF2K scales: x0.75, x0.5, x1/3 and a shortest edge of 400, Lanczos),
    ``meta_list`` (Real-ESRGAN's list of the images of the ``args`` folders of ``src``, relative to ``src``),
    ``reds`` (REDS' val clips
    renumbered 240-269 into train, ``args`` = the four folders), ``reds_meta`` / ``reds4`` (the clip list and the
    REDS4 test clips), ``vimeo_meta`` (``src`` = the septuplet list), ``vimeo_lr`` (MATLAB-bicubic x4 of every
    frame). Paths are relative to the root, with ``/``."""

    kind: str
    src: str
    output: str
    args: tuple = ()


@dataclass(frozen=True)
class DatasetSource:
    """A dataset: its files, preparation ``steps``, and licence / citation in one line each."""

    name: str
    what: str
    files: tuple[SourceFile, ...]
    steps: tuple[Step, ...]
    licence: str
    citation: str
    size_note: str
    provides_extra: tuple[str, ...] = field(default=())
    needs: tuple[str, ...] = field(default=())  # datasets fetched (downloaded and extracted) first

    @property
    def provides(self) -> tuple[str, ...]:
        """Every path (relative to the root) that fetching this dataset leaves: the steps' outputs and the
        extracted folders the option files name."""
        return tuple(dict.fromkeys((*self.provides_extra, *(s.output for s in self.steps))))


_DIV2K = "http://data.vision.ee.ethz.ch/cvl/DIV2K/"
_EDSR = "https://cv.snu.ac.kr/research/EDSR/"
_REDS = ("http://data.cv.snu.ac.kr:8008/webdav/dataset/REDS/", "https://cv.snu.ac.kr/~snah/Deblur/dataset/REDS/")
_LSDIR = "https://data.vision.ee.ethz.ch/yawli/"
_SCALES = ((2, 240, 120), (4, 120, 60))  # BasicSR's extract_subimages: GT 480 / step 240 / thresh 0, LR divided


def _sr_train(folder: str, hr: str, lr: str, prefix: str, meta: str) -> tuple[Step, ...]:
    """Sub-images of a training set's HR folder and bicubic LR x2 / x4 folders (``lr`` with ``{s}``), named
    ``<prefix>_HR_sub`` / ``<prefix>_LR_bicubic_X<s>_sub`` in ``folder``, and BasicSR's meta info of the HR ones."""
    steps = [Step("subimages", f"{folder}/{hr}", f"{folder}/{prefix}_HR_sub", (480, 240, 0))]
    for s, crop, step in _SCALES:
        steps.append(Step("subimages", f"{folder}/{lr.format(s=s)}", f"{folder}/{prefix}_LR_bicubic_X{s}_sub",
                          (crop, step, 0)))
    steps.append(Step("meta_info", f"{folder}/{prefix}_HR_sub", f"{folder}/meta_info/{meta}"))
    return tuple(steps)


SOURCES: dict[str, DatasetSource] = {s.name: s for s in (
    DatasetSource(
        "DIV2K", "DIV2K: 800 training + 100 validation 2K images, HR and bicubic LR x2 / x4 (NTIRE 2017)",
        (SourceFile("DIV2K_train_HR.zip", (_DIV2K + "DIV2K_train_HR.zip",), md5="bdc2d9338d4e574fe81bf7d158758658",
                    extract_to="DIV2K"),
         SourceFile("DIV2K_train_LR_bicubic_X2.zip", (_DIV2K + "DIV2K_train_LR_bicubic_X2.zip",),
                    md5="9a637d2ef4db0d0a81182be37fb00692", extract_to="DIV2K"),
         SourceFile("DIV2K_train_LR_bicubic_X4.zip", (_DIV2K + "DIV2K_train_LR_bicubic_X4.zip",),
                    md5="76c43ec4155851901ebbe8339846d93d", extract_to="DIV2K"),
         SourceFile("DIV2K_valid_HR.zip", (_DIV2K + "DIV2K_valid_HR.zip",), md5="9fcdda83005c5e5997799b69f955ff88",
                    extract_to="DIV2K"),
         SourceFile("DIV2K_valid_LR_bicubic_X2.zip", (_DIV2K + "DIV2K_valid_LR_bicubic_X2.zip",),
                    md5="1512c9a3f7bde2a1a21a73044e46b9cb", extract_to="DIV2K"),
         SourceFile("DIV2K_valid_LR_bicubic_X4.zip", (_DIV2K + "DIV2K_valid_LR_bicubic_X4.zip",),
                    md5="21962de700c8d368c6ff83314480eff0", extract_to="DIV2K")),
        _sr_train("DIV2K", "DIV2K_train_HR", "DIV2K_train_LR_bicubic/X{s}", "DIV2K_train",
                  "meta_info_DIV2K800sub_GT.txt"),
        "academic research only (DIV2K terms)",
        "E. Agustsson, R. Timofte. NTIRE 2017 Challenge on Single Image Super-Resolution: Dataset and Study. "
        "CVPRW 2017",
        "DIV2K_train_HR.zip alone is 3.5 GB",
        ("DIV2K/DIV2K_train_HR", "DIV2K/DIV2K_valid_HR", "DIV2K/DIV2K_train_LR_bicubic/X2",
         "DIV2K/DIV2K_train_LR_bicubic/X4", "DIV2K/DIV2K_valid_LR_bicubic/X2", "DIV2K/DIV2K_valid_LR_bicubic/X4")),
    DatasetSource(
        "Flickr2K", "Flickr2K: 2650 2K images from Flickr, HR and bicubic / unknown LR (EDSR)",
        (SourceFile("Flickr2K.tar", (_EDSR + "Flickr2K.tar",), md5="5d3f39443d5e9489bff8963f8f26cb03"),),
        _sr_train("Flickr2K", "Flickr2K_HR", "Flickr2K_LR_bicubic/X{s}", "Flickr2K",
                  "meta_info_Flickr2K2650sub_GT.txt"),
        "research use; images under their Flickr licences",
        "B. Lim, S. Son, H. Kim, S. Nah, K. M. Lee. Enhanced Deep Residual Networks for Single Image "
        "Super-Resolution. CVPRW 2017",
        "one tar with HR and every LR track",
        ("Flickr2K/Flickr2K_HR", "Flickr2K/Flickr2K_LR_bicubic/X2", "Flickr2K/Flickr2K_LR_bicubic/X4")),
    DatasetSource(
        "benchmark", "the usual test sets Set5, Set14, B100, Urban100: HR and bicubic LR x2 / x3 / x4 (EDSR's package)",
        (SourceFile("benchmark.tar", (_EDSR + "benchmark.tar",), md5="4ace41d33c2384b97e6b320cd0afd6ba"),),
        (Step("link", "benchmark/B100/HR", "B100/HR"), Step("link", "benchmark/Urban100/HR", "Urban100/HR")),
        "research benchmarking; images belong to their owners",
        "Set5: Bevilacqua et al. BMVC 2012; Set14: Zeyde et al. 2010; B100: Martin et al. ICCV 2001; Urban100: "
        "Huang et al. CVPR 2015",
        "one tar",
        tuple(f"benchmark/{t}/{sub}" for t in ("Set5", "Set14", "B100", "Urban100")
              for sub in ("HR", "LR_bicubic/X2", "LR_bicubic/X3", "LR_bicubic/X4"))),
    DatasetSource(
        "DF2K", "DF2K: DIV2K's 800 and Flickr2K's 2650 training images in one set, HR and bicubic LR x2 / x4, with "
        "sub-images",
        (),
        (Step("gather", "DIV2K/DIV2K_train_HR", "DF2K/HR", ("Flickr2K/Flickr2K_HR",)),
         *(Step("gather", f"DIV2K/DIV2K_train_LR_bicubic/X{s}", f"DF2K/LR_bicubic/X{s}",
                (f"Flickr2K/Flickr2K_LR_bicubic/X{s}",)) for s, _, _ in _SCALES),
         *_sr_train("DF2K", "HR", "LR_bicubic/X{s}", "DF2K_train", "meta_info_DF2K3450sub_GT.txt")),
        "those of DIV2K and Flickr2K",
        "Agustsson & Timofte, CVPRW 2017 (DIV2K); Lim et al., CVPRW 2017 (Flickr2K)",
        "DIV2K's and Flickr2K's archives", (), ("DIV2K", "Flickr2K")),
    DatasetSource(
        "DF2K_OST", "Real-ESRGAN's training set: DIV2K train + Flickr2K HR (DF2K), its multi-scale copies and OST, as "
        "400 / 200 sub-images with meta_info_DF2Kmultiscale+OST_sub.txt",
        (),
        (Step("gather", "DIV2K/DIV2K_train_HR", "DF2K/DF2K_HR", ("Flickr2K/Flickr2K_HR",)),
         Step("multiscale", "DF2K/DF2K_HR", "DF2K/DF2K_multiscale"),
         Step("gather", "OST", "DF2K/OST"),
         Step("subimages", "DF2K/DF2K_HR", "DF2K/DF2K_HR_sub", (400, 200, 0)),
         Step("subimages", "DF2K/DF2K_multiscale", "DF2K/DF2K_multiscale_sub", (400, 200, 0)),
         Step("subimages", "DF2K/OST", "DF2K/OST_sub", (400, 200, 0)),
         Step("meta_list", "DF2K", "DF2K/meta_info/meta_info_DF2Kmultiscale+OST_sub.txt",
              ("DF2K_HR_sub", "DF2K_multiscale_sub", "OST_sub"))),
        "those of DIV2K, Flickr2K and OST",
        "X. Wang, L. Xie, C. Dong, Y. Shan. Real-ESRGAN: Training Real-World Blind Super-Resolution with Pure "
        "Synthetic Data. ICCVW 2021 (and the three datasets')",
        "DIV2K's, Flickr2K's and OST's archives", ("DF2K",), ("DIV2K", "Flickr2K", "OST")),
    DatasetSource(
        "OST", "OST (OutdoorSceneTraining): 10,324 outdoor images in 7 categories (Real-ESRGAN's training set)",
        (SourceFile("OST_dataset.zip", ("https://openmmlab.oss-cn-hangzhou.aliyuncs.com/datasets/OST_dataset.zip",),
                    extract_to="OST"),),
        (),
        "research use (SFTGAN authors)",
        "X. Wang, K. Yu, C. Dong, C. C. Loy. Recovering Realistic Texture in Image Super-resolution by Deep Spatial "
        "Feature Transform. CVPR 2018",
        "one zip", ("OST",)),
    DatasetSource(
        "LSDIR", "LSDIR: 84,991 training + 1,000 validation high-quality images (17 training shards, val1)",
        tuple(SourceFile(f"shard-{i:02d}.tar.gz", (f"{_LSDIR}shard-{i:02d}.tar.gz",), extract_to="LSDIR")
              for i in range(17)) + (SourceFile("val1.tar.gz", (_LSDIR + "val1.tar.gz",), extract_to="LSDIR"),),
        (),
        "research use (LSDIR terms)",
        "Y. Li et al. LSDIR: A Large Scale Dataset for Image Restoration. CVPRW 2023",
        "18 archives", ("LSDIR",)),
    DatasetSource(
        "REDS", "REDS: 270 clips x 100 frames 1280x720, sharp and bicubic x4 (val clips renumbered 240-269), REDS4",
        tuple(SourceFile(f"{n}.zip", tuple(u + f"{n}.zip" for u in _REDS), extract_to="REDS/.zips")
              for n in ("train_sharp", "train_sharp_bicubic", "val_sharp", "val_sharp_bicubic")),
        (Step("reds", "REDS/.zips", "REDS/train_sharp",
              ("train_sharp", "train_sharp_bicubic/X4", "val_sharp", "val_sharp_bicubic/X4")),
         Step("reds_meta", "REDS/train_sharp", "REDS/meta_info/meta_info_REDS_GT.txt"),
         Step("reds4", "REDS/train_sharp", "REDS4/GT"),
         Step("reds4", "REDS/train_sharp_bicubic/X4", "REDS4/sharp_bicubic")),
        "CC BY 4.0",
        "S. Nah et al. NTIRE 2019 Challenge on Video Deblurring and Super-Resolution: Dataset and Study. CVPRW 2019",
        "4 zips", ("REDS/train_sharp_bicubic/X4",)),
    DatasetSource(
        "Vimeo90K", "Vimeo-90K septuplets: 91,701 7-frame 448x256 sequences, with MATLAB-bicubic x4 (BIx4)",
        (SourceFile("vimeo_septuplet.zip", ("http://data.csail.mit.edu/tofu/dataset/vimeo_septuplet.zip",),
                    extract_to="vimeo90k"),),
        (Step("vimeo_meta", "vimeo90k/vimeo_septuplet/sep_trainlist.txt", "vimeo90k/meta_info_Vimeo90K_train_GT.txt"),
         Step("vimeo_meta", "vimeo90k/vimeo_septuplet/sep_testlist.txt", "vimeo90k/meta_info_Vimeo90K_test_GT.txt"),
         Step("vimeo_lr", "vimeo90k/vimeo_septuplet/sequences", "vimeo90k/BIx4", (4,))),
        "research use (MIT TOFlow terms)",
        "T. Xue, B. Chen, J. Wu, D. Wei, W. T. Freeman. Video Enhancement with Task-Oriented Flow. IJCV 2019",
        "82 GB (the authors' figure)", ("vimeo90k/vimeo_septuplet/sequences",)),
)}


def find_source(name: str) -> DatasetSource | None:
    """The dataset called ``name`` (any case), or None."""
    for key, source in SOURCES.items():
        if key.lower() == name.strip().lower():
            return source
    return None


def provider_of(path: str | os.PathLike[str]) -> tuple[str, Path] | None:
    """``(dataset name, root)`` when ``path`` is a folder or file that ``anysr prepare fetch NAME --root ROOT``
    leaves (the path ends with one of a dataset's ``provides``), else None."""
    parts = Path(path).parts
    for source in SOURCES.values():
        for provided in source.provides:
            tail = PurePosixPath(provided).parts
            if len(parts) > len(tail) and tuple(parts[-len(tail):]) == tail:
                return source.name, Path(*parts[:-len(tail)])
    return None

"""Where each registered network comes from, and under which licence its upstream code is published.

One row per registered type (``ARCH_REGISTRY``): the repository of the code whose names and arguments anysr
follows, that code's licence (an SPDX id, or words where the upstream states none), and the project anysr's keys
are taken from when that is not the upstream itself (BasicSR, traiNNer-redux, neosr, spandrel). anysr's own code
is Apache-2.0 (LICENSE); each network is re-implemented, not copied, but a released checkpoint and the design
remain its authors': check the licence before shipping one. docs/architectures.md's table is generated from
this (``anysr schema --architectures -o docs/architectures.md``); a test keeps the two, and the registry, in step.
Plain data: importing it imports no torch.
"""

from __future__ import annotations

from typing import NamedTuple


class Source(NamedTuple):
    """A network's upstream ``repository`` (``owner/name`` on GitHub, or ``anysr``), its ``licence`` and the
    project whose layout anysr follows when not the upstream's (``via``)."""

    repository: str
    licence: str
    via: str = ""


BASICSR = "XPixelGroup/BasicSR"
TRAINNER = "the-database/traiNNer-redux"
NEOSR = "neosr-project/neosr"
SPANDREL = "chaiNNer-org/spandrel"
GFPGAN = "TencentARC/GFPGAN"
NONE_FOUND = "unknown (neosr's licence table lists none)"  # neosr's own code is Apache-2.0


def _same(names: str, source: Source) -> dict[str, Source]:
    return dict.fromkeys(names.split(), source)


SOURCES: dict[str, Source] = {
    # BasicSR's own networks and its ports (BasicSR is Apache-2.0)
    **_same("MSRResNet EDSR RCAN RRDBNet SRVGGNetCompact EDVR BasicVSR IconVSR BasicVSRPlusPlus TOFlow DUF SpyNet "
            "RIDNet HiFaceGAN HiFaceGANDiscriminator VGGStyleDiscriminator UNetDiscriminatorSN",
            Source(BASICSR, "Apache-2.0")),
    "SwinIR": Source("JingyunLiang/SwinIR", "Apache-2.0", BASICSR),
    "ECBSR": Source("xindongzhang/ECBSR", "Apache-2.0", BASICSR),
    "DFDNet": Source("csxmli2016/DFDNet", "CC-BY-NC-SA-4.0", BASICSR),
    **_same("StyleGAN2Generator StyleGAN2Discriminator", Source("rosinality/stylegan2-pytorch", "MIT", BASICSR)),
    "Bicubic": Source("anysr", "Apache-2.0"),
    # faces
    **_same("GFPGANv1 GFPGANv1Clean StyleGAN2GeneratorClean FacialComponentDiscriminator ResNetArcFace",
            Source(GFPGAN, "Apache-2.0")),
    "RestoreFormer": Source(GFPGAN, "Apache-2.0", SPANDREL),
    **_same("RestoreFormerPlusPlus VQVAEGAN", Source("wzhouxiff/RestoreFormerPlusPlus", "not checked")),
    # the authors' code, as spandrel loads it
    "HAT": Source("XPixelGroup/HAT", "Apache-2.0"),
    "DAT": Source("zhengchen1999/DAT", "Apache-2.0"),
    "RGT": Source("zhengchen1999/RGT", "Apache-2.0"),
    "DRCT": Source("ming053l/DRCT", "MIT"),
    "SPAN": Source("hongyuanyu/SPAN", "Apache-2.0", SPANDREL),
    **_same("PLKSR RealPLKSR", Source("dslisleedh/PLKSR", "MIT")),
    "OmniSR": Source("Francis0625/Omni-SR", "Apache-2.0", SPANDREL),
    **_same("SAFMN SAFMNBCIE", Source("sunny2109/SAFMN", "Apache-2.0", SPANDREL)),
    "Swin2SR": Source("mv-lab/swin2sr", "Apache-2.0"),
    "CRAFT": Source("AVC2-UESTC/CRAFT-SR", "Apache-2.0"),
    "ATD": Source("LabShuHangGU/Adaptive-Token-Dictionary", "Apache-2.0"),
    "MoSR": Source("umzi2/MoSR", "MIT"),
    "MoESR": Source("umzi2/MoESR", "MIT"),
    "SeemoRe": Source("eduardzamfir/seemoredetails", "Apache-2.0", SPANDREL),
    "DITN": Source("yongliuy/DITN", "Apache-2.0", SPANDREL),
    "DCTLSA": Source("zengkun301/DCTLSA", "Apache-2.0", SPANDREL),
    **_same("UpCunet2x UpCunet2x_fast UpCunet3x UpCunet4x", Source("bilibili/ailab", "MIT")),
    "SwiftSRGAN": Source("Koushik0901/Swift-SRGAN", "CC0-1.0"),
    "NAFNet": Source("megvii-research/NAFNet", "MIT"),
    "SCUNet": Source("cszn/SCUNet", "Apache-2.0"),
    **_same("DRUNet DnCNN", Source("cszn/KAIR", "MIT")),
    "FBCNN": Source("jiaxi-jiang/FBCNN", "Apache-2.0"),
    "RetinexFormer": Source("caiyuanhao1998/Retinexformer", "MIT", SPANDREL),
    "HVICIDNet": Source("Fediory/HVI-CIDNet", "MIT", SPANDREL),
    "FFTformer": Source("kkkls/FFTformer", "MIT"),
    "MixDehazeNet": Source("AmeryXiong/MixDehazeNet", "MIT", SPANDREL),
    "IPT": Source("huawei-noah/Pretrained-IPT", "Apache-2.0", SPANDREL),
    "MMRealSR": Source("TencentARC/MM-RealSR", "BSD-3-Clause"),
    "GRL": Source("ofsoundof/GRL-Image-Restoration", "MIT", SPANDREL),
    **_same("KBNet_s KBNet_l", Source("zhangyi-3/KBNet", "MIT", SPANDREL)),
    "Uformer": Source("ZhendongWang6/Uformer", "MIT", SPANDREL),
    "FDAT": Source("stinkybread/FDAT", "MIT", SPANDREL),
    "RCANOriginal": Source("yulunzhang/RCAN", "MIT (EDSR-PyTorch's, as spandrel records it)", SPANDREL),
    "Restormer": Source("swz30/Restormer", "Academic Public License (non-commercial)"),
    **_same("SRFormer SRFormerv2", Source("HVision-NKU/SRFormer", "CC-BY-NC-4.0")),
    # traiNNer-redux's menu (traiNNer-redux is Apache-2.0)
    **_same("SPANF SPANF3 DIS TemporalSPAN TemporalSPANv2 TFDAT HAT_iLN DAT_iLN MetaGAN3 PatchGANDiscriminatorSN "
            "MultiscalePatchGANDiscriminatorSN", Source(TRAINNER, "Apache-2.0")),
    **_same("DocRes DocResDiscriminator", Source("ZZZHANG-jx/DocRes", "not checked", TRAINNER)),
    "SpanPlus": Source("umzi2/SPANPlus", "Apache-2.0", TRAINNER),
    "RTMoSR": Source("rewaifu/RTMoSR", "MIT", TRAINNER),
    "ArtCNN": Source("Artoriuz/ArtCNN", "MIT", TRAINNER),
    "LMLT": Source("jwgdmkj/LMLT", "MIT", TRAINNER),
    "MAN": Source("icandle/MAN", "Apache-2.0", TRAINNER),
    "ELAN": Source("xindongzhang/ELAN", "Apache-2.0", TRAINNER),
    **_same("HiT_SIR HiT_SNG HiT_SRF", Source("XiangZ-0/HiT-SR", "Apache-2.0", TRAINNER)),
    "ESCRealM": Source("dslisleedh/ESC", "MIT", TRAINNER),
    "LKFMixer": Source("Supereeeee/LKFMixer", "Apache-2.0", TRAINNER),
    "EIMN": Source("liux520/EIMN", "MIT", TRAINNER),
    "Sebica": Source("idiosyncracies/Sebica", "MIT", TRAINNER),
    "MoSRv2": Source("umzi2/MoSRV2", "MIT", TRAINNER),
    "GateRV3": Source("umzi2/GaterV3", "MIT", TRAINNER),
    "DWT": Source("soobin419/DWT", "Apache-2.0", TRAINNER),
    "EMT": Source("Fried-Rice-Lab/EMT", "MIT", TRAINNER),
    "CascadedGaze": Source("Ascend-Research/CascadedGaze", "MIT", TRAINNER),
    "FlexNet": Source("umzi2/FlexNet", "MIT", TRAINNER),
    **_same("SCUNet_aaf6aa TSCUNet", Source("aaf6aa/SCUNet", "Apache-2.0", TRAINNER)),
    "LAWFFT": Source("rewaifu/LAWFFT", "MIT", TRAINNER),
    "DUnet": Source("umzi2/DUnet", "MIT", TRAINNER),
    "MetaGan2": Source("umzi2/MetaGan", "MIT", TRAINNER),
    "AutoEncoder": Source("2minkyulee/AESOP-Auto-Encoded-Supervision-for-Perceptual-Image-Super-Resolution",
                          "Apache-2.0", TRAINNER),
    # neosr's menu (neosr is Apache-2.0)
    "HMA": Source("korouuuuu/HMA", "MIT", NEOSR),
    "GRFormer": Source("sisrformer/GRFormer", NONE_FOUND, NEOSR),
    "NinaSR": Source("Coloquinte/torchSR", "MIT", NEOSR),
    "PlainUSR": Source("icandle/PlainUSR", "MIT", NEOSR),
    "CFSR": Source("Aitical/CFSR", NONE_FOUND, NEOSR),
    "HASN": Source("nathan66666/HASN", NONE_FOUND, NEOSR),
    "KRGN": Source("ZhangDY827/KRGN", NONE_FOUND, NEOSR),
    "MSDAN": Source("Supereeeee/MSDAN", NONE_FOUND, NEOSR),
    "ASID": Source("saturnian77/ASID", NONE_FOUND, NEOSR),
    "LightSAFMNPP": Source("sunny2109/SAFMN", "Apache-2.0", NEOSR),
    "CATANet": Source("EquationWalker/CATANet", "Apache-2.0", NEOSR),
    "DCT": Source("zhengchen1999/DCT", NONE_FOUND, NEOSR),
    "ESCFP": Source("dslisleedh/ESC", "MIT", NEOSR),
    "MetaGAN": Source("umzi2/MetaGan", "MIT", NEOSR),
    "PatchGAN": Source("NVIDIA/pix2pixHD", "BSD (pix2pixHD's)", NEOSR),
    "EA2FPN": Source(NEOSR, "Apache-2.0"),
}


BEGIN = ("<!-- generated from anysr/archs/sources.py and the registry by "
         "`anysr schema --architectures -o docs/architectures.md`; edit the table there, not here -->")
END = "<!-- end of the generated table -->"


def _repo(name: str) -> str:
    return name if "/" not in name else f"[{name}](https://github.com/{name})"


def render_table(names: list[str]) -> str:
    """The Markdown table of ``names`` (the registered types): one row per upstream, its types, licence and the
    project whose layout anysr follows; between the ``BEGIN`` / ``END`` markers."""
    groups: dict[Source, list[str]] = {}
    for name in sorted(names, key=str.lower):  # a plug-in's network without a row: said, not refused
        groups.setdefault(SOURCES.get(name, Source("not recorded", "not recorded")), []).append(name)
    rows = [f"| {', '.join(f'`{n}`' for n in types)} | {_repo(src.repository)} | {src.licence} | "
            f"{_repo(src.via) if src.via else 'the upstream'} |" for src, types in groups.items()]
    return "\n".join([BEGIN, "", f"{len(names)} registered types, {len(groups)} sources.", "",
                      "| types | upstream | upstream licence | keys and arguments follow |", "|---|---|---|---|",
                      *rows, "", END])


def render_into(text: str, names: list[str]) -> str:
    """``text`` (docs/architectures.md) with the table between its markers replaced by ``render_table(names)``;
    ValueError when the markers are missing."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError("has no generated-table markers; put these two lines where the table goes:\n"
                         f"{BEGIN}\n{END}")
    return text[:start] + render_table(names) + text[end + len(END):]

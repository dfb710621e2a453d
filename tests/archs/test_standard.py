"""The checks every architecture gets, over one table per check (the check functions: tests/arch_checks.py).

Adding an architecture: its fixture cases (``tests/fixtures/<group>/``, ``make_<group>_fixtures.py``), its
representative case in ``GROUPS[group].one``, its tiny network in ``TRAIN``. The group's module
(``tests/archs/test_<group>.py``) keeps what is specific to the family: reference parity details, padding rules,
re-parameterisation, build errors, published sizes, XLA.

- fixture networks (the reference's weights): channels_last input and weights give the reference's output; bf16
  autocast stays close; the forward makes no tensor off the input's device (meta); one backward reaches every
  trainable parameter with a finite gradient;
- tiny networks: a real training run saves finite weights that load strictly and have moved (through the
  ``anysr train`` command line in a subprocess for a few, the same entry point in this process for the rest:
  the command line's own path is the same for every network); 2 gloo ranks give what 1 process gives, per family.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from arch_checks import (
    check_bf16_autocast,
    check_channels_last,
    check_finite_gradients,
    check_meta_device,
    check_trained_weights,
    check_two_ranks_match_one,
    fixture_io,
    load_case,
    manifest,
    train,
    train_options,
)
from conftest import FIXTURE_TOL

# tests/conftest.py keeps modules that name FIXTURE_TOL in the AVX2 pass (make test-avx2): the comparisons with the
# reference outputs here use it (through arch_checks).


def _input0(io: dict[str, torch.Tensor]) -> torch.Tensor:
    return io["input0"]


def _input1(io: dict[str, torch.Tensor]) -> torch.Tensor:
    return io["input1"]


def _input0_twice(io: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([io["input0"]] * 2)


def _input1_and_mirror(io: dict[str, torch.Tensor]) -> torch.Tensor:
    x = io["input1"][:1]
    return torch.cat([x, x.flip(-1)]) if min(x.shape[-2:]) >= 4 else x


def _every(_: str) -> bool:
    return True


def _not_experts(name: str) -> bool:  # SeemoRe: the unchosen experts get zero, not missing, gradients
    return ".experts." not in name


def _not_hasn_squeeze(name: str) -> bool:
    """HASN's channel attention squeezes 52 channels to one (52 // 30) before a ReLU: with seeded weights that one
    unit is off over a whole image in some blocks (zero gradient there, as in neosr)."""
    return ".cab.cab.3.attention." not in name


def _not_dct_position_mlp(name: str) -> bool:
    """DCT's position-bias MLP is embed_dim / 64 wide: at 64 channels its layer norms see a single value (a
    constant: the layers before them get no gradient, the last ones none where ReLU(bias) is 0, as in neosr)."""
    return ".pos." not in name


def _not_lawfft_kernel_gen(name: str) -> bool:
    """LAWFFT's dynamic kernels come from the map's mean through a ReLU of 2 to 4 units in the fixtures' local
    branches: with seeded weights all are off in some blocks (zero gradients before the ReLU, as in traiNNer-redux)."""
    return not any(k in name for k in ("kernel_gen.1.", "kernel_gen.3.weight"))


# Transformers: the characteristic branches take part (RGT: RG-SA's reduction and positional conv, L-SA's value
# conv, the layer scale; Swin2SR: the position-bias MLP and the temperature; not CRAFT's pos_proj: its 1-wide
# position MLP layer-norms a single value, a constant, as in the original).
_TRANSFORMER_BRANCHES = ("reduction1", "cpe", "get_v", "gamma", "cpb_mlp.0.weight", "logit_scale", "q_bias",
                         "temperature", "hfer_blocks", "attn_atd.wq.weight", "attn_aca.logit_scale",
                         "residual_group.td", "norm3.weight")


def _transformer_branch(name: str) -> bool:
    return any(k in name for k in _TRANSFORMER_BRANCHES)


@dataclass(frozen=True)
class Group:
    """One fixture folder's cases for the common checks.

    ``one``: a representative case per architecture (every check runs on these); ``*_extra``: variants a check
    also covers (``bf16_all``: every case of the folder); ``bf16_input``: the input index compared under autocast;
    ``bf16_bound``: per case, else 0.05 of the output range; ``meta``: which inputs the meta-device forward gets
    (``"1"``: input1 when present, else input0; ``"last"``; ``"compare"``: every compared input); ``grad_input``,
    ``grad_nonzero``, ``frozen`` (architecture type -> parameter prefix the authors' forward never uses),
    ``no_drop_path``, ``slow_grad``: the gradient check's input and extra demands; ``aliases``: types naming a class
    another group represents; ``scaled_tol``: types whose channels_last comparison scales the absolute tolerance by
    the output's magnitude (EMT: its 255 x mean shift puts outputs in the hundreds)."""

    one: tuple[str, ...]
    cl_extra: tuple[str, ...] = ()
    bf16_extra: tuple[str, ...] = ()
    bf16_all: bool = False
    bf16_input: int = 0
    bf16_bound: dict[str, float] = field(default_factory=dict)
    meta_extra: tuple[str, ...] = ()
    meta: str = "1"
    grad_extra: tuple[str, ...] = ()
    grad_input: Callable[[dict[str, torch.Tensor]], torch.Tensor] = _input0
    grad_nonzero: Callable[[str], bool] | None = None
    frozen: dict[str, str] | None = None
    no_drop_path: bool = False
    slow_grad: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # types that name a class another group's representative covers
    scaled_tol: tuple[str, ...] = ()  # types compared with the reference at absolute error x the output's scale


GROUPS: dict[str, Group] = {
    "efficient": Group(
        one=("span_x4_norm", "realplksr_x4_ln_dysample", "omnisr_x4", "safmn_x4"),
        bf16_extra=("span_x2_nonorm", "realplksr_x4", "omnisr_x2_nope")),
    "enhance": Group(
        one=("retinexformer_2s", "hvicidnet_norm", "fftformer_bias", "mixdehazenet"),
        frozen={"HVICIDNet": "I_LCA5.", "FFTformer": "reduce_chan_level2."}),
    "escmix": Group(
        one=("escrealm_x4", "lkfmixer_x4", "sebica_x4", "eimn_x2", "mosrv2_x4_ln"),
        cl_extra=("escrealm_x2_unshuffle_ps",), meta_extra=("escrealm_x1_unshuffle_psd",),
        grad_extra=("escrealm_x2_unshuffle_ps", "lkfmixer_x2", "sebica_x2", "eimn_x4_depth2",
                    "mosrv2_x2_unshuffle_rms_ps"),
        bf16_all=True, grad_input=_input0_twice, grad_nonzero=_every, no_drop_path=True,
        aliases=("MoESR2",)),  # MoESR (lightweight: moesr_x4_psdirect) under traiNNer-redux's second name
    "fdatgrl": Group(
        one=("fdat_x4_transpose", "fdat_x2_unshuffle_pixelshuffle", "fdat_x3_pa_up", "fdat_x2_dysample",
             "fdat_x1_unshuffle_nearest", "fdat_x2_lda"),
        bf16_input=1, grad_input=_input1),
    "hitsr": Group(one=("hit_sir_x4", "hit_sng_x4", "hit_srf_x4"), bf16_all=True),
    "mmrealsr": Group(one=("mmrealsr_x4", "mmrealsr_x4_three_tanh_gray"), bf16_all=True),
    "hifacegan": Group(one=("g_spectral_batch", "g_instance_k5_vae"), bf16_all=True,
                       # instance norm re-normalises bf16 rounding at the 64-pixel fixtures' bottleneck (2x2 or 2x1
                       # values per channel, random weights): measured 0.146 / 0.127 of the range (batch norm: 0.007)
                       bf16_bound={"g_instance_k5_vae": 0.3, "g_spectral_syncbatch": 0.3}),
    # DFDNet at its default FFHQ boxes (input0 / output0); its VGG19 is frozen, as BasicSR's
    "dfdnet": Group(one=("nf2_128",), frozen={"DFDNet": "vgg_extractor."}),
    "ipt": Group(one=("ipt_x2", "ipt_multitask_x3", "ipt_x1_no_mlp_no_norm"), bf16_all=True, bf16_input=1,
                 grad_input=_input1,
                 # without layer norms the tokens reach hundreds (rgb_range 255): measured 0.074 of the range
                 bf16_bound={"ipt_x1_no_mlp_no_norm": 0.2}),
    "lightweight": Group(
        one=("mosr_x3_dys", "seemore_x4_exp_top2", "ditn_x2_bias_p4", "safmnbcie_f2", "moesr_x4_psdirect",
             "dctlsa_x2"),
        bf16_extra=("mosr_x4_ps", "seemore_x2", "moesr_x3_nearest"),
        grad_nonzero=_not_experts, no_drop_path=True),
    "plksrformer": Group(one=("plksr_x4_sparse_max_idt", "srformer_x2", "elan_x4")),
    # SRFormerV2: the stored cases (the pixelshuffle / nearest+conv ones seed their reconstruction:
    # tests/archs/test_srformerv2.py)
    "srformerv2": Group(
        one=("srformerv2_x2_direct",), cl_extra=("srformerv2_x3_direct_3conv", "srformerv2_x1_gray_ape"),
        bf16_extra=("srformerv2_x3_direct_3conv", "srformerv2_x1_gray_ape"),
        meta_extra=("srformerv2_x3_direct_3conv", "srformerv2_x1_gray_ape"),
        grad_extra=("srformerv2_x3_direct_3conv", "srformerv2_x1_gray_ape"), grad_nonzero=_every, no_drop_path=True),
    # LAWFFT (traiNNer-redux; tests/archs/test_lawfft.py)
    "lawfft": Group(
        one=("lawfft_x2_ps",), cl_extra=("lawfft_x3_w6_direct", "lawfft_x2_unshuffle"), bf16_all=True,
        meta_extra=("lawfft_x3_w6_direct", "lawfft_x4_gray_tconv", "lawfft_x2_unshuffle"),
        grad_extra=("lawfft_x3_w6_direct", "lawfft_x4_gray_tconv", "lawfft_x2_unshuffle"),
        grad_nonzero=_not_lawfft_kernel_gen),
    "dwtemt": Group(
        one=("dwt_x2", "emt_x4"), cl_extra=("dwt_x1_3conv_ape", "emt_x2_psdirect"),
        meta_extra=("dwt_x1_window2", "dwt_x1_gray_smallimg", "emt_x3"),
        grad_extra=("dwt_x1_3conv_ape", "emt_x2_psdirect", "emt_x1_one_gtl"), bf16_all=True, no_drop_path=True,
        scaled_tol=("EMT",)),
    "cgflex": Group(
        one=("cgnet_2levels", "flexnet_x4_ps"), cl_extra=("metaflexnet_x1_ps",),
        bf16_extra=("cgnet_3levels_gray", "flexnet_x2_dysample_gray", "metaflexnet_x1_ps"),
        meta_extra=("cgnet_3levels_gray", "flexnet_x8_nearest", "metaflexnet_x1_ps"),
        grad_extra=("flexnet_x3_nearest_cn", "flexnet_x2_dysample_gray", "metaflexnet_x1_ps"), grad_nonzero=_every),
    "rcan_gater_scunet": Group(
        one=("rcan_x4", "gaterv3_x2_ps", "scunet_aaf6aa_x1"),
        bf16_extra=("rcan_x2_unshuffle", "spandrel_rcan_x1_norm", "gaterv3_x4_dysample_flash"),
        meta_extra=("rcan_x1_unshuffle_k5_silu", "gaterv3_x2_3stages"), grad_extra=("rcan_x3_norm_gelu",)),
    "neosr_cnn": Group(
        one=("ninasr_x2", "plainusr_x2_v2"), cl_extra=("plainusr_x2_ultra",), bf16_all=True,
        meta_extra=("ninasr_x3_gray", "plainusr_x3_v4"), grad_extra=("plainusr_x2_ultra", "plainusr_x3_v4"),
        grad_nonzero=_every),
    # neosr's esc_fp (tests/archs/test_neosr_archs.py)
    "neosr_archs": Group(one=("esc_fp_x2",), cl_extra=("esc_fp_x4",), bf16_all=True,
                         meta_extra=("esc_fp_x3_naive", "esc_fp_x4"), grad_extra=("esc_fp_x4",), grad_nonzero=_every),
    "neosr_transformer": Group(
        one=("hma_rgb", "grformer_x2"), cl_extra=("hma_ape", "grformer_x4_longshift"), bf16_all=True,
        meta_extra=("hma_gray_noshift", "hma_ape", "grformer_x3_gray"),
        grad_extra=("hma_gray_noshift", "grformer_x3_gray")),
    "neosr_light": Group(
        one=("cfsr_x2", "hasn_x3", "krgn_x2", "msdan_x2"), cl_extra=("msdan_x3", "krgn_x1_prelu_2groups"),
        bf16_all=True, meta_extra=("cfsr_x3_gray_meannorm", "hasn_x4", "krgn_x1_prelu_2groups", "msdan_x4"),
        grad_extra=("cfsr_x1_conv_last", "krgn_x3_dil2_relu", "msdan_x3", "msdan_x4"),
        grad_nonzero=_not_hasn_squeeze),
    # neosr's DCT: windows shifted in an odd group (x2), attention / compression / shifted attention (x2_compress)
    "neosr_dct": Group(one=("dct_x2_compress",), cl_extra=("dct_x2", "dct_x3"), bf16_all=True,
                       meta_extra=("dct_x2", "dct_x1_gray_1conv", "dct_x1_pixelshuffle"),
                       grad_extra=("dct_x1_gray_1conv",), grad_nonzero=_not_dct_position_mlp),
    # neosr's ASID and Light-SAFMN++: the gradient checks on flash_attn=False cases (neosr's flash path trains no
    # channel attention)
    "neosr_families": Group(one=("asid_pe_x4", "light_safmnpp_x4"), cl_extra=("asid_x2", "asid_d8_x3"),
                            bf16_all=True, meta_extra=("asid_x2", "asid_d8_x3", "light_safmnpp_x2_3blocks"),
                            grad_extra=("light_safmnpp_x2_3blocks",)),
    # neosr's CATANet: first centres from the tokens (x2, x1) and from the means buffer (the "initted" cases)
    "catanet": Group(one=("catanet_x2",), cl_extra=("catanet_x4_initted",), bf16_all=True,
                     meta_extra=("catanet_x3_gray_initted", "catanet_x1"), grad_extra=("catanet_x4_initted",),
                     grad_nonzero=_every),
    "spanf": Group(
        one=("spanf_x4", "spanf3_x2_unshuffle"), cl_extra=("spanf3_x1_unshuffle", "spanf_x3_width3"), bf16_all=True,
        meta_extra=("spanf3_x1_unshuffle", "spanf3_x2_noblocks_rgb2gray", "spanf_x1_gray"),
        grad_extra=("spanf3_x4", "spanf3_x3_gray", "spanf_x3_width3"), grad_nonzero=_every),
    "iln": Group(
        one=("dat_iln_x2_direct", "hat_iln_x1"), cl_extra=("dat_iln_x3_gray_3conv", "hat_iln_x1_gray_2groups"),
        bf16_all=True, meta_extra=("dat_iln_x3_gray_3conv", "dat_iln_x1_pixelshuffle", "hat_iln_x1_gray_2groups"),
        grad_extra=("dat_iln_x3_gray_3conv", "hat_iln_x1_gray_2groups"),
        grad_nonzero=lambda n: ".pos." not in n),  # DAT's position MLP is 1 wide at width 32: a constant
    "restormer": Group(one=("restormer", "docres"), cl_extra=("restormer_dual_pixel", "docres_gray"),
                       bf16_extra=("restormer_biasfree_bias",), grad_extra=("restormer_dual_pixel", "docres_gray")),
    "trainner_archs": Group(
        one=("spanplus_x4_dys", "rtmosr_x2", "artcnn_x4", "dis_x4", "lmlt_x2", "man_x2"),
        bf16_extra=("spanplus_x2_ps", "rtmosr_x1_unshuffle_nodccm", "dis_x3_depthwise", "man_x3_2groups"),
        meta_extra=("rtmosr_x1_unshuffle_nodccm",)),
    "transformer": Group(
        one=("swin2sr_x2_pixelshuffle", "rgt_x2_rect", "craft_x4", "atd_x3_direct"),
        meta_extra=("swin2sr_x1_aux", "rgt_x1_3conv", "craft_x2_identity", "atd_x1_nonorm"),
        grad_extra=("swin2sr_x1_aux", "swin2sr_x4_nearest_conv"),
        bf16_all=True, bf16_input=1, meta="compare", grad_input=_input1_and_mirror,
        grad_nonzero=_transformer_branch, no_drop_path=True),
    "restore": Group(
        one=("cugan_2x", "cugan_3x", "cugan_4x", "cugan_2x_fast", "drunet_color", "fbcnn_color", "dncnn_gray_br",
             "swiftsrgan_x4"),
        # bf16 keeps 8 bits of mantissa; bounds relative to the output's range, about 3x the measured error
        bf16_bound={"cugan_2x": 0.03, "cugan_3x": 0.02, "cugan_4x": 0.005, "cugan_2x_fast": 0.006,
                    "drunet_color": 0.025, "fbcnn_color": 0.02, "dncnn_gray_br": 0.003, "swiftsrgan_x4": 0.015},
        meta="last", grad_nonzero=_every,
        # Real-CUGAN is full width (a backward pass takes seconds on a loaded CPU): x2 always, the rest in -m slow
        slow_grad=("cugan_3x", "cugan_4x", "cugan_2x_fast")),
}


def _params(check: str) -> list[Any]:
    out = []
    for group, g in GROUPS.items():
        if check == "bf16" and g.bf16_all:
            names = sorted(manifest(group)["cases"])
        else:
            names = list(g.one) + list({"channels_last": g.cl_extra, "bf16": g.bf16_extra, "meta": g.meta_extra,
                                        "grad": g.grad_extra}[check])
        for name in names:
            marks = [pytest.mark.slow] if check == "grad" and name in g.slow_grad else []
            out.append(pytest.param(group, name, id=f"{group}-{name}", marks=marks))
    return out


def test_every_representative_case_exists() -> None:
    for group, g in GROUPS.items():
        cases = manifest(group)["cases"]
        listed = {*g.one, *g.cl_extra, *g.bf16_extra, *g.meta_extra, *g.grad_extra, *g.bf16_bound, *g.slow_grad}
        assert listed <= set(cases), f"{group}: not in its manifest: {sorted(listed - set(cases))}"
        assert {cases[n]["type"] for n in g.one} | set(g.aliases) == {c["type"] for c in cases.values()}, \
            f"{group}: an architecture has no representative case"


@pytest.mark.parametrize(("group", "name"), _params("channels_last"))
def test_channels_last_input_and_weights_give_the_reference_output(group: str, name: str) -> None:
    net, io = load_case(group, name)
    tol = None
    if manifest(group)["cases"][name]["type"] in GROUPS[group].scaled_tol:
        tol = {"rtol": FIXTURE_TOL["rtol"], "atol": FIXTURE_TOL["atol"] * max(1.0, float(io["output0"].abs().max()))}
    check_channels_last(net, io["input0"], io["output0"], tol=tol)


@pytest.mark.parametrize(("group", "name"), _params("bf16"))
def test_bf16_autocast_stays_close(group: str, name: str) -> None:
    net, io = load_case(group, name)
    g = GROUPS[group]
    i = g.bf16_input
    check_bf16_autocast(net, io[f"input{i}"], io[f"output{i}"], g.bf16_bound.get(name, 0.05))


@pytest.mark.parametrize(("group", "name"), _params("meta"))
def test_forward_creates_no_tensor_off_the_input_device(group: str, name: str) -> None:
    g = GROUPS[group]
    io = fixture_io(group, name)
    if g.meta == "compare":
        pairs = [(inp, out) for inp, out, *_ in manifest(group)["cases"][name]["compare"]]
    else:
        inputs = sorted(k for k in io if k.startswith("input"))
        inp = inputs[-1] if g.meta == "last" else ("input1" if "input1" in io else "input0")
        pairs = [(inp, inp.replace("input", "output"))]
    net, _ = load_case(group, name)
    for inp, out in pairs:
        check_meta_device(net, io[inp].shape, io[out].shape)


@pytest.mark.parametrize(("group", "name"), _params("grad"))
def test_training_step_gives_finite_gradients(group: str, name: str) -> None:
    g = GROUPS[group]
    net, io = load_case(group, name)
    frozen = None
    if g.frozen is not None:
        prefix = g.frozen.get(manifest(group)["cases"][name]["type"])
        frozen = {n for n, _ in net.named_parameters() if prefix and n.startswith(prefix)}
    check_finite_gradients(net, g.grad_input(io), nonzero=g.grad_nonzero, frozen=frozen,
                           no_drop_path=g.no_drop_path)


# ----------------------------------------------------------------------------- real training runs

@dataclass(frozen=True)
class Train:
    """A tiny network's training run: ``scale``, iterations, batch, crop; ``moved``: a parameter every fresh network
    holds at the same value, which training must change; ``extra``: ``train_options`` keywords; ``cli``: through the
    command line in a subprocess."""

    net: dict[str, Any]
    scale: int = 2
    total_iter: int = 4
    batch: int = 4
    gt_size: int = 32
    moved: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    cli: bool = False


_FACE = {"train__ema_decay": 0, "train__warmup_iter": -1}  # scale-1 restoration (LQ = GT: the point is the plumbing)
GFPGAN_TINY = {"type": "GFPGANv1Clean", "out_size": 32, "num_style_feat": 16, "channel_multiplier": 1,
               "num_mlp": 2, "narrow": 1 / 32}
RF_TINY = {"type": "RestoreFormer", "n_embed": 16, "embed_dim": 8, "ch": 32, "ch_mult": [1, 1],
           "num_res_blocks": 1, "attn_resolutions": [8], "resolution": 16, "z_channels": 8, "head_size": 2}
HIT = {"embed_dim": 16, "depths": [2], "num_heads": [2], "upscale": 2, "base_win_size": [2, 2],
       "hier_win_ratios": [1, 2]}

TRAIN: dict[str, Train] = {
    # enhancement (x1)
    "RetinexFormer": Train({"type": "RetinexFormer", "n_feat": 4, "stage": 1}, scale=1, total_iter=2, batch=2),
    "HVICIDNet": Train({"type": "HVICIDNet", "channels": [4, 4, 8, 8], "heads": [1, 1, 2, 2]}, scale=1,
                       total_iter=2, batch=2),
    "FFTformer": Train({"type": "FFTformer", "dim": 4, "num_blocks": [1, 1, 1], "num_refinement_blocks": 1,
                        "ffn_expansion_factor": 2}, scale=1, total_iter=2, batch=2),
    "Restormer": Train({"type": "Restormer", "dim": 4, "num_blocks": [1, 1, 1, 1], "num_refinement_blocks": 1,
                        "heads": [1, 1, 2, 2]}, scale=1, total_iter=2, batch=2),
    "DocRes": Train({"type": "DocRes", "dim": 4, "num_blocks": [1, 1, 1, 1], "num_refinement_blocks": 1,
                     "heads": [1, 1, 2, 2]}, scale=1, total_iter=2, batch=2),
    "MixDehazeNet": Train({"type": "MixDehazeNet", "embed_dims": [8, 8, 8, 8, 8], "depths": [1, 1, 1, 1, 1]},
                          scale=1, total_iter=2, batch=2, gt_size=40),
    # escmix
    "ESCRealM": Train({"type": "ESCRealM", "dim": 8, "pdim": 4, "kernel_size": 5, "n_blocks": 1, "conv_blocks": 1,
                       "window_size": 4, "num_heads": 2, "scale": 2, "mid_dim": 8},
                      moved="blocks.0.pconvs.0.plk.dwc_proj.3.weight"),  # the zero-initialised kernel predictor
    "ESCFP": Train({"type": "ESCFP", "dim": 8, "pdim": 4, "kernel_size": 5, "n_blocks": 1, "conv_blocks": 1,
                    "window_size": 4, "num_heads": 2, "upscaling_factor": 2}),
    "LKFMixer": Train({"type": "LKFMixer", "in_channels": 3, "channels": 8, "out_channels": 3, "upscale": 2,
                       "num_block": 1, "large_kernel": 7, "split_factor": 0.25}),
    "Sebica": Train({"type": "Sebica", "scale": 2, "N": 4}, cli=True),
    "EIMN": Train({"type": "EIMN", "embed_dims": 8, "scale": 2, "num_stages": 2, "mlp_ratios": 2.0}),
    "MoSRv2": Train({"type": "MoSRv2", "dim": 8, "n_block": 1, "scale": 2, "mid_dim": 8, "rms_norm": True}),
    # face (x1)
    "GFPGANv1Clean": Train(GFPGAN_TINY, scale=1, total_iter=2, extra=_FACE),
    "RestoreFormer": Train(RF_TINY, scale=1, total_iter=2, extra=_FACE, cli=True),
    # FDAT
    "FDAT": Train({"type": "FDAT", "embed_dim": 8, "num_groups": 1, "depth_per_group": 1, "num_heads": 2,
                   "window_size": 4, "aim_reduction_ratio": 4, "mid_dim": 8, "scale": 2}, batch=2),
    # HiT-SR (every fresh network has ones in its first norm)
    **{a: Train({"type": a, **HIT}, moved="layers.0.residual_group.blocks.0.norm1.weight")
       for a in ("HiT_SIR", "HiT_SNG", "HiT_SRF")},
    # MMRealSR at x2 (the trunk and the degree estimator on the unshuffled input)
    "MMRealSR": Train({"type": "MMRealSR", "num_feat": 8, "num_block": 1, "num_grow_ch": 4, "num_feats": [8, 16],
                       "num_blocks": [1, 1], "downscales": [2, 1], "scale": 2}, batch=2),
    # HiFaceGAN (BasicSR's batch-norm SPADE; its instance norms need 64-pixel crops)
    "HiFaceGAN": Train({"type": "HiFaceGAN", "num_feat": 2, "norm_g": "spectralspadebatch3x3"}, scale=1,
                       total_iter=2, batch=2, gt_size=64),
    # DFDNet (default FFHQ boxes at the crop's size; the tiny fixture dictionary, path from the repository root)
    "DFDNet": Train({"type": "DFDNet", "num_feat": 2, "dict_path": "tests/fixtures/dfdnet/dict_nf2.pth"}, scale=1,
                    total_iter=2, batch=2, gt_size=64, extra=_FACE),
    # IPT: one task of several (the others' heads and tails frozen)
    "IPT": Train({"type": "IPT", "patch_size": 8, "patch_dim": 2, "n_feats": 8, "num_heads": 2, "num_layers": 1,
                  "scale": [3, 2], "num_queries": 2, "scale_idx": 1}, batch=2),
    # lightweight
    "MoSR": Train({"type": "MoSR", "dim": 8, "n_block": 1, "upscale": 2, "kernel_size": 5}),
    "SeemoRe": Train({"type": "SeemoRe", "scale": 2, "embedding_dim": 8, "num_layers": 1, "num_experts": 2,
                      "global_kernel_size": 5}),
    "DITN": Train({"type": "DITN", "dim": 8, "ITL_blocks": 1, "SAL_blocks": 1, "upscale": 2}),
    "SAFMNBCIE": Train({"type": "SAFMNBCIE", "dim": 8, "n_blocks": 1, "num_layers": 1, "upscaling_factor": 2},
                       scale=1),
    "MoESR": Train({"type": "MoESR", "dim": 8, "n_blocks": 1, "n_block": 1, "scale": 2}),
    "DCTLSA": Train({"type": "DCTLSA", "nf": 8, "num_head": 2, "upscale": 2}),
    # PLKSR / SRFormer / ELAN
    "PLKSR": Train({"type": "PLKSR", "dim": 8, "n_blocks": 1, "kernel_size": 5, "upscaling_factor": 2,
                    "ccm_type": "DCCM"}, total_iter=2, batch=2),
    "SRFormer": Train({"type": "SRFormer", "img_size": 16, "embed_dim": 8, "depths": [2], "num_heads": [2],
                       "window_size": 4, "upscale": 2, "upsampler": "pixelshuffledirect"}, total_iter=2, batch=2),
    "SRFormerv2": Train({"type": "SRFormerv2", "img_size": 8, "embed_dim": 8, "squeeze_dim": 2, "depths": [2],
                         "num_heads": [2], "window_size": 8, "upscale": 2, "upsampler": "pixelshuffledirect"},
                        total_iter=2, batch=2),
    "LAWFFT": Train({"type": "LAWFFT", "dim": 8, "n_rblock": 1, "n_mblock": 2, "window_size": 4, "mlp_factor": 1.5,
                     "scale": 2, "mid_dim": 8}, total_iter=2, batch=2),
    "ELAN": Train({"type": "ELAN", "scale": 2, "m_elan": 2, "c_elan": 6, "n_share": 1, "r_expand": 1,
                   "window_sizes": [2, 4, 4]}, total_iter=2, batch=2),
    # restore
    "DnCNN": Train({"type": "DnCNN", "in_nc": 3, "out_nc": 3, "nc": 8, "nb": 3}, scale=1, total_iter=2, batch=2,
                   cli=True),
    "DRUNet": Train({"type": "DRUNet", "in_nc": 4, "out_nc": 3, "nc": [4, 8, 8, 16], "nb": 1}, scale=1,
                    total_iter=2, batch=2),
    "FBCNN": Train({"type": "FBCNN", "in_nc": 3, "out_nc": 3, "nc": [4, 8, 8, 16], "nb": 1}, scale=1, total_iter=2,
                   batch=2),
    "SwiftSRGAN": Train({"type": "SwiftSRGAN", "num_channels": 8, "num_blocks": 1, "upscale_factor": 2},
                        total_iter=2, batch=2),
    "UpCunet2x": Train({"type": "UpCunet2x"}, total_iter=2, batch=2),
    # traiNNer-redux archs (a parameter every fresh network holds at the same value must move)
    "SpanPlus": Train({"type": "SpanPlus", "feature_channels": 8, "blocks": [1], "upscale": 2},
                      moved="upsampler.scope.weight"),
    "RTMoSR": Train({"type": "RTMoSR", "dim": 4, "n_blocks": 1, "scale": 2, "unshuffle_mod": True},
                    moved="body.0.norm.scale"),
    "ArtCNN": Train({"type": "ArtCNN", "filters": 8, "n_block": 1, "scale": 2}),
    "DIS": Train({"type": "DIS", "num_features": 8, "num_blocks": 1, "scale": 2}, moved="head_act.weight"),
    "LMLT": Train({"type": "LMLT", "dim": 8, "n_blocks": 1, "scale": 2}, moved="feats.0.norm1.weight"),
    "MAN": Train({"type": "MAN", "n_feats": 6, "n_resblocks": 1, "scale": 2}, moved="body.0.body.0.LKA.scale"),
    "RCANOriginal": Train({"type": "RCANOriginal", "scale": 2, "n_resgroups": 1, "n_resblocks": 1, "n_feats": 8,
                           "reduction": 2}),
    "GateRV3": Train({"type": "GateRV3", "scale": 2, "dim": 8, "enc_blocks": [1], "dec_blocks": [1], "num_latent": 1,
                      "sisr_blocks": 0, "upsample_mid_dim": 8, "attention": True}, moved="gamma"),
    "SCUNet_aaf6aa": Train({"type": "SCUNet_aaf6aa", "config": [1, 0, 0, 0, 0, 0, 0]}, scale=1, total_iter=2, batch=2),
    "DWT": Train({"type": "DWT", "img_size": 16, "embed_dim": 8, "depths": [2, 2], "num_heads": [2, 2],
                  "window_size": 4, "layer_kinds": [[0, -1], [0, 2]], "upscale": 2}, batch=2,
                 moved="layers.0.residual_group.blocks.0.norm1.weight"),
    "EMT": Train({"type": "EMT", "dim": 10, "n_blocks": 1, "n_layers": 3, "num_heads": 1, "mlp_ratio": 1,
                  "window_list": [[8, 4], [4, 8]], "shift_list": [[4, 2], [2, 4]], "scale": 2}, batch=2),
    "CascadedGaze": Train({"type": "CascadedGaze", "width": 4, "middle_blk_num": 1, "enc_blk_nums": [1, 1],
                           "dec_blk_nums": [1, 1], "GCE_CONVS_nums": [3, 2]}, scale=1, moved="encoders.0.0.beta"),
    "SPANF": Train({"type": "SPANF", "feature_channels": 8, "upscale": 2}),
    "SPANF3": Train({"type": "SPANF3", "feature_channels": 8, "num_blocks": 2, "upscale": 2, "unshuffle_mod": True},
                    moved="block_1.att_conv.weight"),  # zero in every fresh network
    "NinaSR": Train({"type": "NinaSR", "n_resblocks": 2, "n_feats": 8, "scale": 2}, moved="head.0.bias"),
    "PlainUSR": Train({"type": "PlainUSR", "n_feat": 33, "im_feat": [6, 4, 2], "attn_feat": 2, "scale": 2},
                      moved="block1.body.0.se.tensor"),
    "FlexNet": Train({"type": "FlexNet", "dim": 8, "num_blocks": [1], "hidden_rate": 2, "scale": 2},
                     moved="pipeline.att.0.t_blocks.0.gamma1"),
    # transformers
    "HMA": Train({"type": "HMA", "img_size": 8, "embed_dim": 32, "depths": [2], "num_heads": [4], "window_size": 4,
                  "interval_size": 2, "upscale": 2}, batch=2, moved="layers.0.residual_group.blocks.1.norm1.weight"),
    "DAT_iLN": Train({"type": "DAT_iLN", "img_size": 8, "embed_dim": 32, "split_size": [2, 4], "depth": [2],
                      "num_heads": [2], "expansion_factor": 1.0, "upscale": 2, "upsampler": "pixelshuffledirect"},
                     batch=2, moved="layers.0.blocks.0.norm1.weight"),
    "HAT_iLN": Train({"type": "HAT_iLN", "img_size": 8, "embed_dim": 12, "depths": [2], "num_heads": [2],
                      "window_size": 4, "squeeze_factor": 4, "mlp_ratio": 2.0, "upscale": 2}, batch=2,
                     moved="layers.0.residual_group.blocks.0.norm1.weight"),
    "GRFormer": Train({"type": "GRFormer", "img_size": 8, "embed_dim": 8, "depths": [2], "num_heads": [2],
                       "window_size": [2, 4], "upscale": 2}, batch=2, moved="layers.0.blocks.0.norm1.weight"),
    # neosr's lightweight CNNs
    "CFSR": Train({"type": "CFSR", "embed_dim": 8, "depths": [1, 1], "dw_size": 5, "upscale": 2},
                  moved="layers.0.blocks.0.layer_scale_1"),
    "HASN": Train({"type": "HASN", "feature_channels": 30, "upscale": 2}, batch=2, moved="block_1.ln.weight"),
    "KRGN": Train({"type": "KRGN", "n_feats": 32, "n_resgroups": 1, "scale": 2}, batch=2, moved="sub_mean.weight"),
    "MSDAN": Train({"type": "MSDAN", "channels": 8, "num_DFEB": 1, "upscale_factor": 2}),
    "ASID": Train({"type": "ASID", "num_feat": 8, "window_size": 4, "scale": 2},
                  moved="block0.residual_layer.0.SLA1.norm.weight"),
    "LightSAFMNPP": Train({"type": "LightSAFMNPP", "dim": 8, "n_blocks": 1, "upscaling_factor": 2}),
    "DCT": Train({"type": "DCT", "img_size": 8, "embed_dim": 64, "depth": [2], "num_heads": [4],
                  "expansion_factor": 0.5, "upscale": 2}, batch=2, moved="layers.0.blocks.0.norm1.weight"),
    "CATANet": Train({"type": "CATANet", "dim": 8, "block_num": 1, "qk_dim": 8, "mlp_dim": 8, "heads": 2,
                      "patch_size": [6], "n_iters": [2], "num_tokens": [4], "group_size": [16], "upscale": 2},
                     batch=2, moved="blocks.0.0.norm.weight"),
    "Swin2SR": Train({"type": "Swin2SR", "img_size": 8, "window_size": 4, "embed_dim": 12, "depths": [2],
                      "num_heads": [2], "mlp_ratio": 2.0, "upscale": 2, "upsampler": "pixelshuffledirect"}, batch=2),
    "RGT": Train({"type": "RGT", "img_size": 16, "embed_dim": 32, "depth": [2], "num_heads": [2], "mlp_ratio": 2.0,
                  "upscale": 2, "split_size": [2, 4]}, batch=2),
    "CRAFT": Train({"type": "CRAFT", "embed_dim": 32, "depths": [1], "num_heads": [2], "window_size": 8,
                    "split_size_0": 2, "split_size_1": 8, "upscale": 2}, batch=2),
    "ATD": Train({"type": "ATD", "img_size": 8, "embed_dim": 16, "depths": [2], "num_heads": [2], "window_size": 4,
                  "category_size": 24, "num_tokens": 8, "reducted_dim": 4, "convffn_kernel_size": 3,
                  "mlp_ratio": 2.0, "upscale": 2, "upsampler": "pixelshuffledirect"}, batch=2),
}


def _options(arch: str, name: str, train_dir: Path, val_dir: Path | None = None, total_iter: int | None = None,
             **net: Any) -> dict[str, Any]:
    t = TRAIN[arch]
    return train_options(name, train_dir, {**t.net, **net}, scale=t.scale, total_iter=total_iter or t.total_iter,
                         batch=t.batch,
                         gt_size=t.gt_size, val_dir=val_dir, **t.extra)


@pytest.mark.slow
@pytest.mark.parametrize("arch", [pytest.param(a, id=f"{a}-{'cli' if t.cli else 'main'}") for a, t in TRAIN.items()])
def test_training_run_saves_finite_weights_that_moved(arch: str, tmp_path: Path, small_train_dir: Path) -> None:
    t = TRAIN[arch]
    exp, _ = train(tmp_path, _options(arch, f"t_{arch.lower()}", small_train_dir), subprocess=t.cli)
    check_trained_weights(exp, t.total_iter, t.net, moved=t.moved)


# One network per family under DDP on 2 gloo ranks x batch 2 == 1 process x batch 4 (what each adds: HVICIDNet's
# frozen unused module; ESCRealM's per-image kernels; FDAT, Swin2SR: windows with drop path off; HiT_SNG's n-gram
# context; MoSR; PLKSR; DRUNet's noise-level channel; RTMoSR's re-parameterised branches and frozen derived convs;
# IPT's frozen heads and tails of the other tasks; MMRealSR's per-image degree estimates; HiFaceGAN's spectral norm
# (power iterations on every rank) and frozen unused layers, instance-norm SPADE: batch norm is per rank; DWT's
# dilated windows and their masks).
# RestoreFormer (unused parameters: find_unused_parameters) is in tests/archs/test_face.py.
TWO_RANKS: dict[str, dict[str, Any]] = {
    "HVICIDNet": {"val": False}, "ESCRealM": {}, "FDAT": {"net": {"drop_path_rate": 0.0}}, "HiT_SNG": {"val": False},
    "MoSR": {}, "PLKSR": {"val": False}, "DRUNet": {"total_iter": 4}, "RTMoSR": {},
    "Swin2SR": {"net": {"drop_path_rate": 0.0}}, "IPT": {}, "MMRealSR": {}, "GateRV3": {},
    "DWT": {"net": {"drop_path_rate": 0.0}},
    # SGD: conv biases before an instance norm get float-noise gradients, which Adam scales up to full steps
    "HiFaceGAN": {"net": {"norm_g": "spectralspadeinstance3x3"}, "optim_g": {"type": "SGD", "lr": 1e-2}},
}


@pytest.mark.slow
@pytest.mark.parametrize("arch", sorted(TWO_RANKS))
def test_two_gloo_ranks_match_one_process(arch: str, tmp_path: Path, small_train_dir: Path,
                                          small_val_dir: Path) -> None:
    spec = TWO_RANKS[arch]
    val_dir = small_val_dir if spec.get("val", True) else None
    opt = _options(arch, "run", small_train_dir, val_dir, spec.get("total_iter"), **spec.get("net", {}))
    if "optim_g" in spec:
        opt["train"]["optim_g"] = spec["optim_g"]
    check_two_ranks_match_one(tmp_path, opt)

"""One card per registered network: what the standard checks (tests/archs/test_standard.py) and the benchmarks
need to know of it, in one table.

- ``GROUPS``: per fixture folder (``tests/fixtures/<group>/manifest.json``), its representative cases and what the
  forward checks (channels_last, bf16, meta device, gradients) need of them;
- ``PARITY``: the fixture folders whose every case is compared with the reference's outputs by the one parity test
  (keys, shapes, a strict load, each ``compare`` entry in its mode);
- ``TRAIN``: per network, its tiny training run; ``TWO_RANKS``: the networks also trained on 2 gloo ranks;
- ``CARDS``: per network, its tiny network for ONNX at unseen sizes and the XLA:CPU train step, and its bad
  arguments with the one-line message each must give;
- ``PUBLISHED``: the networks at the authors' published sizes that the benchmarks time (``PUBLISHED_FRAMES``: the
  clip networks' frames per input).

Fixtures are read only through ``tests/arch_checks.py`` (``manifest``, ``load_case``, ``stored_params``,
``fixture_io``, ``net_opt``). A family's module (``tests/archs/test_<family>.py``) keeps what is particular to it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from anysr.archs.nafnet_arch import NAFNET_CONFIGS


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



Bad = tuple[tuple[dict[str, Any], str], ...]


@dataclass(frozen=True)
class Card:
    """One network (or one form of it: a card's name is the type, or the type and the form).

    ``net``: a tiny network of the type; ``scale``: its scale. Its training run (``train``; in ``-m slow``): iterations,
    batch, crop; ``moved``: a parameter every fresh network holds at the same value, which training must change;
    ``extra``: ``train_options`` keywords; ``cli``: through the command line in a subprocess. ``tiny``: the network
    ONNX and XLA check where it is not ``net``. ``onnx``: ``check_onnx_at_unseen_size`` keywords (``size``, ``tol``;
    None: no standard ONNX check), ``onnx_prepare`` applied to the built network first (weights off their zero
    initialisation, re-parameterisation), ``onnx_slow``: only in ``-m slow`` runs; ``xla``: ``check_xla_train_step``
    keywords (``shape``, ``eval_form``, ``scale``, ``steps``, ``prepare``, ...; None: no standard XLA check);
    ``bad``: ``network_g`` options (without a ``type``: changes to the card's network) and the one-line message (a
    regular expression) each must raise."""

    net: dict[str, Any] | None = None
    scale: int = 2
    total_iter: int = 4
    batch: int = 4
    gt_size: int = 32
    moved: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    cli: bool = False
    train: bool = True
    tiny: dict[str, Any] | None = None
    onnx: dict[str, Any] | None = None
    onnx_prepare: Callable[[torch.nn.Module], None] | None = None
    onnx_slow: bool = False
    xla: dict[str, Any] | None = None
    bad: Bad = ()

    @property
    def small(self) -> dict[str, Any]:
        """The network ONNX and XLA check."""
        net = self.tiny if self.tiny is not None else self.net
        assert net is not None, "a card checked by ONNX or XLA needs a network"
        return net


@torch.no_grad()
def _off_zero_block_scales(net: torch.nn.Module) -> None:
    """Away from the zero init of CascadedGaze's (and FlexNet's) block scales, so the blocks count."""
    for name, p in net.named_parameters():
        if name.endswith(("beta", "gamma")):
            p.normal_(0, 0.5)


@torch.no_grad()
def _off_special_scalars(net: torch.nn.Module) -> None:
    """NinaSR's scalar shifts away from their initial -1 and 1: torch_xla bakes a moved 0-d tensor holding 0 or
    +-1 into the first graph as a constant, and once a step has returned it, it is data (one more graph at step 2,
    then none; measured: 1, 2, 2 compiles over 3 steps at the initial values, 1, 1, 1 at -0.5 / 0.5)."""
    for name, p in net.named_parameters():
        if p.dim() == 0:
            p.fill_(-0.5 if name.startswith("head") else 0.5)


def _reparameterize(net: torch.nn.Module) -> None:
    """The deployed form (PlainUSR's folded blocks) is what is exported."""
    net.reparameterize()  # type: ignore[operator]


@torch.no_grad()
def _perturbed(net: torch.nn.Module) -> None:
    """Every weight moved a little off its initialisation (LAWFFT's zero-initialised branches count)."""
    for p in net.parameters():
        p.add_(torch.randn_like(p) * 0.05)


_FACE = {"train__ema_decay": 0, "train__warmup_iter": -1}  # scale-1 restoration (LQ = GT: the point is the plumbing)
GFPGAN_TINY = {"type": "GFPGANv1Clean", "out_size": 32, "num_style_feat": 16, "channel_multiplier": 1,
               "num_mlp": 2, "narrow": 1 / 32}
RF_TINY = {"type": "RestoreFormer", "n_embed": 16, "embed_dim": 8, "ch": 32, "ch_mult": [1, 1],
           "num_res_blocks": 1, "attn_resolutions": [8], "resolution": 16, "z_channels": 8, "head_size": 2}
# HiT-SR: windows 2 and 4
HIT_TINY = {a: {"type": a, "embed_dim": 16, "depths": [2], "num_heads": [2], "upscale": 2, "base_win_size": [2, 2],
                "hier_win_ratios": [1, 2]} for a in ("HiT_SIR", "HiT_SNG", "HiT_SRF")}

HIT_BAD: dict[str, Bad] = {
    "HiT_SIR": (
        ({"type": "HiT_SIR", "embed_dim": 30}, r"network_g\.embed_dim: .*multiple of 2 \* num_heads"),
        ({"type": "HiT_SIR", "hier_win_ratios": [1, 1.5], "depths": [2], "num_heads": [6]},
         r"network_g\.hier_win_ratios: window \(12, 12\)"),
        ({"type": "HiT_SIR", "upsampler": "nearest+conv", "upscale": 2}, r"network_g\.upsampler: .*upscale 4 only"),
        ({"type": "HiT_SIR", "upsampler": "bicubic"}, r"network_g\.upsampler: must be"),
        ({"type": "HiT_SIR", "resi_connection": "2conv"}, r"network_g\.resi_connection: must be"),
        ({"type": "HiT_SIR", "expansion_factor": 4}, r"network_g\.expansion_factor: .*ignores it")),
    "HiT_SNG": (({"type": "HiT_SNG", "num_heads": [6]}, r"network_g\.num_heads: needs one entry per group"),),
    "HiT_SRF": (({"type": "HiT_SRF", "depths": [7], "num_heads": [6]}, r"network_g\.depths: a group has at most"),),
}


CARDS: dict[str, Card] = {
    # enhancement (x1)
    "RetinexFormer": Card({"type": "RetinexFormer", "n_feat": 4, "stage": 1}, scale=1, total_iter=2, batch=2,
        bad=(({"type": "RetinexFormer", "n_feat": 6},
              r"network_g\.n_feat: RetinexFormer needs n_feat to be a positive multiple of 4"),
             ({"type": "RetinexFormer", "in_channels": 1}, r"network_g\.in_channels: RetinexFormer works on RGB"),
             ({"type": "RetinexFormer", "num_blocks": [1, 1]}, r"network_g\.num_blocks: RetinexFormer needs 3 block"),
             ({"type": "RetinexFormer", "stage": 0}, r"network_g\.stage: RetinexFormer needs an integer stage >= 1"))),
    "HVICIDNet": Card({"type": "HVICIDNet", "channels": [4, 4, 8, 8], "heads": [1, 1, 2, 2]}, scale=1,
                      total_iter=2, batch=2,
        bad=(({"type": "HVICIDNet", "channels": [4, 4, 8]}, r"network_g\.channels: HVICIDNet needs 4 positive"),
             ({"type": "HVICIDNet", "channels": [4, 4, 6, 8], "heads": [1, 1, 4, 2]},
              r"network_g\.heads: HVICIDNet: 6 channels cannot be split into 4 heads"))),
    "FFTformer": Card({"type": "FFTformer", "dim": 4, "num_blocks": [1, 1, 1], "num_refinement_blocks": 1,
                       "ffn_expansion_factor": 2}, scale=1, total_iter=2, batch=2,
        bad=(({"type": "FFTformer", "out_channels": 1}, r"network_g\.out_channels: FFTformer adds its input"),
             ({"type": "FFTformer", "num_blocks": [1, 1]}, r"network_g\.num_blocks: FFTformer needs 3 block counts"))),
    "Restormer": Card({"type": "Restormer", "dim": 4, "num_blocks": [1, 1, 1, 1], "num_refinement_blocks": 1,
                       "heads": [1, 1, 2, 2]}, scale=1, total_iter=2, batch=2),
    "DocRes": Card({"type": "DocRes", "dim": 4, "num_blocks": [1, 1, 1, 1], "num_refinement_blocks": 1,
                    "heads": [1, 1, 2, 2]}, scale=1, total_iter=2, batch=2),
    "MixDehazeNet": Card({"type": "MixDehazeNet", "embed_dims": [8, 8, 8, 8, 8], "depths": [1, 1, 1, 1, 1]},
                         scale=1, total_iter=2, batch=2, gt_size=40,
        bad=(({"type": "MixDehazeNet", "embed_dims": [8, 16, 16, 8, 8]},
              r"network_g\.embed_dims: MixDehazeNet's decoder"),
             ({"type": "MixDehazeNet", "embed_dims": [4, 8, 8, 8, 4]}, r"network_g\.embed_dims: .*at least 8"),
             ({"type": "MixDehazeNet", "out_chans": 3}, r"network_g\.out_chans: MixDehazeNet's head gives K"))),
    # escmix
    "ESCRealM": Card({"type": "ESCRealM", "dim": 8, "pdim": 4, "kernel_size": 5, "n_blocks": 1, "conv_blocks": 1,
                      "window_size": 4, "num_heads": 2, "scale": 2, "mid_dim": 8},
                     moved="blocks.0.pconvs.0.plk.dwc_proj.3.weight",  # the zero-initialised kernel predictor
        onnx={"size": (23, 30)}, xla={"shape": (2, 3, 10, 9), "scale": 2},
        bad=(
            ({"upsampler": "dysample"}, r"network_g\.upsampler: ESCRealM: upsampler 'dysample' \(not implemented"),
            ({"upsampler": "bogus"}, r"network_g\.upsampler: ESCRealM: upsampler 'bogus'; use one of"),
            ({"attn_type": "Fast"}, r"network_g\.attn_type: ESCRealM: attn_type 'Fast'"),
            ({"kernel_size": 4}, r"network_g\.kernel_size: ESCRealM needs an odd kernel_size"),
            ({"pdim": 9}, r"network_g\.pdim: ESCRealM needs 2 <= pdim <= dim"),
            ({"num_heads": 3}, r"network_g\.num_heads: ESCRealM: dim \(8\) must be a multiple of num_heads"),
            ({"scale": 8, "upsampler": "transpose+conv"}, r"network_g\.scale: ESCRealM's transpose\+conv head"),
            ({"scale": 5, "upsampler": "pixelshuffle"}, r"network_g\.scale: ESCRealM's pixelshuffle head"),
            ({"scale": 0}, r"network_g\.scale: ESCRealM needs an integer scale >= 1"))),
    "ESCFP": Card({"type": "ESCFP", "dim": 8, "pdim": 4, "kernel_size": 5, "n_blocks": 1, "conv_blocks": 1,
                   "window_size": 4, "num_heads": 2, "upscaling_factor": 2}),
    "LKFMixer": Card({"type": "LKFMixer", "in_channels": 3, "channels": 8, "out_channels": 3, "upscale": 2,
                      "num_block": 1, "large_kernel": 7, "split_factor": 0.25},
        onnx={"size": (23, 30)}, xla={"shape": (2, 3, 10, 9), "scale": 2},
        bad=(
            ({"large_kernel": 8}, r"network_g\.large_kernel: LKFMixer needs an odd large_kernel"),
            ({"split_factor": 0.1}, r"network_g\.split_factor: LKFMixer: split_factor 0\.1 leaves no channel"),
            ({"channels": 9}, r"network_g\.channels: LKFMixer needs an even number of channels"),
            ({"upscale": 1.5}, r"network_g\.upscale: LKFMixer needs an integer upscale"))),
    # Sebica's / EIMN's batch norms: torch_xla compiles a plain nn.BatchNorm2d twice (num_batches_tracked starts as a
    # constant, then is step output), then never again: 3 steps, nothing new after the second
    # Sebica's is the one training run through ``anysr train`` in a subprocess (the command line's own path is the
    # same for every network; each subprocess costs 25-35 s of start-up on the 2-core CI machine)
    "Sebica": Card({"type": "Sebica", "scale": 2, "N": 4}, cli=True,
        onnx={"size": (23, 30)}, xla={"shape": (2, 3, 10, 9), "scale": 2, "steps": 3}),
    "EIMN": Card({"type": "EIMN", "embed_dims": 8, "scale": 2, "num_stages": 2, "mlp_ratios": 2.0},
        onnx={"size": (23, 30)}, xla={"shape": (2, 3, 10, 9), "scale": 2, "steps": 3}),
    "MoSRv2": Card({"type": "MoSRv2", "dim": 8, "n_block": 1, "scale": 2, "mid_dim": 8, "rms_norm": True},
        onnx={"size": (23, 30)}, xla={"shape": (2, 3, 10, 9), "scale": 2}),
    # face (x1)
    "GFPGANv1Clean": Card(GFPGAN_TINY, scale=1, total_iter=2, extra=_FACE),
    "RestoreFormer": Card(RF_TINY, scale=1, total_iter=2, extra=_FACE),
    # FDAT
    "FDAT": Card({"type": "FDAT", "embed_dim": 8, "num_groups": 1, "depth_per_group": 1, "num_heads": 2,
                  "window_size": 4, "aim_reduction_ratio": 4, "mid_dim": 8, "scale": 2}, batch=2),
    # HiT-SR (every fresh network has ones in its first norm)
    # ONNX: not a multiple of 4 (SNG: 8), every block pads; XLA: the blocks pad
    **{a: Card(HIT_TINY[a], moved="layers.0.residual_group.blocks.0.norm1.weight", onnx={"size": (21, 34)},
               onnx_slow=a != "HiT_SIR", xla={"shape": (1, 3, 7, 10)}, bad=HIT_BAD.get(a, ()))
       for a in ("HiT_SIR", "HiT_SNG", "HiT_SRF")},
    # MMRealSR at x2 (the trunk and the degree estimator on the unshuffled input)
    "MMRealSR": Card({"type": "MMRealSR", "num_feat": 8, "num_block": 1, "num_grow_ch": 4, "num_feats": [8, 16],
                      "num_blocks": [1, 1], "downscales": [2, 1], "scale": 2}, batch=2),
    # HiFaceGAN (BasicSR's batch-norm SPADE; its instance norms need 64-pixel crops)
    "HiFaceGAN": Card({"type": "HiFaceGAN", "num_feat": 2, "norm_g": "spectralspadebatch3x3"}, scale=1,
                      total_iter=2, batch=2, gt_size=64),
    # DFDNet (default FFHQ boxes at the crop's size; the tiny fixture dictionary, path from the repository root)
    "DFDNet": Card({"type": "DFDNet", "num_feat": 2, "dict_path": "tests/fixtures/dfdnet/dict_nf2.pth"}, scale=1,
                   total_iter=2, batch=2, gt_size=64, extra=_FACE),
    # IPT: one task of several (the others' heads and tails frozen)
    "IPT": Card({"type": "IPT", "patch_size": 8, "patch_dim": 2, "n_feats": 8, "num_heads": 2, "num_layers": 1,
                 "scale": [3, 2], "num_queries": 2, "scale_idx": 1}, batch=2),
    # lightweight
    "MoSR": Card({"type": "MoSR", "dim": 8, "n_block": 1, "upscale": 2, "kernel_size": 5}),
    "SeemoRe": Card({"type": "SeemoRe", "scale": 2, "embedding_dim": 8, "num_layers": 1, "num_experts": 2,
                     "global_kernel_size": 5}),
    "DITN": Card({"type": "DITN", "dim": 8, "ITL_blocks": 1, "SAL_blocks": 1, "upscale": 2}),
    "SAFMNBCIE": Card({"type": "SAFMNBCIE", "dim": 8, "n_blocks": 1, "num_layers": 1, "upscaling_factor": 2},
                      scale=1),
    "MoESR": Card({"type": "MoESR", "dim": 8, "n_blocks": 1, "n_block": 1, "scale": 2}),
    "DCTLSA": Card({"type": "DCTLSA", "nf": 8, "num_head": 2, "upscale": 2}),
    # PLKSR / SRFormer / ELAN
    "PLKSR": Card({"type": "PLKSR", "dim": 8, "n_blocks": 1, "kernel_size": 5, "upscaling_factor": 2,
                   "ccm_type": "DCCM"}, total_iter=2, batch=2,
        xla={"shape": (1, 3, 8, 8)},
        bad=(({"type": "PLKSR", "kernel_size": 16}, r"network_g\.kernel_size: PLKSR needs an odd kernel_size"),
             ({"type": "PLKSR", "ccm_type": "XCCM"}, r"network_g\.ccm_type: PLKSR: ccm_type must be"),
             ({"type": "PLKSR", "lk_type": "Big"}, r"network_g\.lk_type: PLKSR: lk_type must be"),
             ({"type": "PLKSR", "lk_type": "RectSparsePLK", "kernel_size": 13},
              r"network_g\.kernel_size: .*13 // 3 = 4"),
             ({"type": "PLKSR", "lk_type": "SparsePLK", "sparse_kernels": [5, 4], "sparse_dilations": [1, 2]},
              r"network_g\.sparse_kernels: PLKSR: sparse_kernels must be odd"),
             ({"type": "PLKSR", "lk_type": "SparsePLK", "sparse_kernels": [], "sparse_dilations": []},
              r"network_g\.sparse_kernels: PLKSR: SparsePLK needs"),
             ({"type": "PLKSR", "dim": 8, "split_ratio": 0.1}, r"network_g\.split_ratio: .*between 1 and dim"),
             ({"type": "PLKSR", "upscaling_factor": 0}, r"network_g\.upscaling_factor: PLKSR needs an integer"))),
    "SRFormer": Card({"type": "SRFormer", "img_size": 16, "embed_dim": 8, "depths": [2], "num_heads": [2],
                      "window_size": 4, "upscale": 2, "upsampler": "pixelshuffledirect"}, total_iter=2, batch=2,
        xla={"shape": (1, 3, 8, 8)},
        bad=(({"type": "SRFormer", "window_size": 7},
              r"network_g\.window_size: SRFormer's permuted windows need an even"),
             ({"type": "SRFormer", "embed_dim": 90, "window_size": 8},
              r"network_g\.embed_dim: SRFormer needs embed_dim"),
             ({"type": "SRFormer", "upsampler": "bicubic"}, r"network_g\.upsampler: SRFormer: unknown upsampler"),
             ({"type": "SRFormer", "resi_connection": "2conv"}, r"network_g\.resi_connection: SRFormer: unknown"))),
    "SRFormerv2": Card({"type": "SRFormerv2", "img_size": 8, "embed_dim": 8, "squeeze_dim": 2, "depths": [2],
                        "num_heads": [2], "window_size": 8, "upscale": 2, "upsampler": "pixelshuffledirect"},
                       total_iter=2, batch=2),
    "LAWFFT": Card({"type": "LAWFFT", "dim": 8, "n_rblock": 1, "n_mblock": 2, "window_size": 4, "mlp_factor": 1.5,
                    "scale": 2, "mid_dim": 8}, total_iter=2, batch=2,
        onnx={}, onnx_prepare=_perturbed, xla={"shape": (2, 3, 14, 10), "scale": 2, "eval_shape": (1, 3, 9, 13)},
        bad=(({"type": "LAWFFT", "scale": 0}, r"network_g\.scale: LAWFFT needs an integer scale >= 1"),
             ({"type": "LAWFFT", "dim": 0}, r"network_g\.dim: LAWFFT needs an integer dim >= 1"),
             ({"type": "LAWFFT", "n_mblock": 0}, r"network_g\.n_mblock: LAWFFT needs an integer n_mblock >= 1"),
             ({"type": "LAWFFT", "window_size": 256}, r"network_g\.window_size: .*at most 255"),
             ({"type": "LAWFFT", "upsampler": "bicubic"}, r"network_g\.upsampler: LAWFFT has no upsampler 'bicubic'"),
             ({"type": "LAWFFT", "split": 0.0}, r"network_g\.split: LAWFFT needs 0 < int\(split \* dim\) < dim"),
             ({"type": "LAWFFT", "split": 1.0}, r"network_g\.split: "))),
    "ELAN": Card({"type": "ELAN", "scale": 2, "m_elan": 2, "c_elan": 6, "n_share": 1, "r_expand": 1,
                  "window_sizes": [2, 4, 4]}, total_iter=2, batch=2,
        # XLA: ELAN's batch norms: torch_xla compiles a plain nn.BatchNorm2d twice (its running statistics change from
        # initial values to step outputs), then never again: 3 steps, nothing new after the second
        xla={"shape": (1, 3, 8, 8), "steps": 3},
        bad=(({"type": "ELAN", "c_elan": 64}, r"network_g\.c_elan: ELAN splits c_elan into three groups"),
             ({"type": "ELAN", "window_sizes": [4, 8]}, r"network_g\.window_sizes: ELAN needs three positive"),
             ({"type": "ELAN", "norm": True, "colors": 1}, r"network_g\.norm: ELAN's mean shift is for RGB"),
             ({"type": "ELAN", "scale": 1.5}, r"network_g\.scale: ELAN needs an integer scale"))),
    # restore
    "DnCNN": Card({"type": "DnCNN", "in_nc": 3, "out_nc": 3, "nc": 8, "nb": 3}, scale=1, total_iter=2, batch=2),
    "DRUNet": Card({"type": "DRUNet", "in_nc": 4, "out_nc": 3, "nc": [4, 8, 8, 16], "nb": 1}, scale=1,
                   total_iter=2, batch=2),
    "FBCNN": Card({"type": "FBCNN", "in_nc": 3, "out_nc": 3, "nc": [4, 8, 8, 16], "nb": 1}, scale=1, total_iter=2,
                  batch=2),
    "SwiftSRGAN": Card({"type": "SwiftSRGAN", "num_channels": 8, "num_blocks": 1, "upscale_factor": 2},
                       total_iter=2, batch=2),
    "UpCunet2x": Card({"type": "UpCunet2x"}, total_iter=2, batch=2),
    # traiNNer-redux archs (a parameter every fresh network holds at the same value must move)
    "SpanPlus": Card({"type": "SpanPlus", "feature_channels": 8, "blocks": [1], "upscale": 2},
                     moved="upsampler.scope.weight",
        onnx={}, xla={"shape": (1, 3, 8, 8), "scale": 2},  # XLA: and the eval form (the folds) lowers too
        bad=(({"type": "SpanPlus", "upsampler": "lp"}, r"network_g\.upsampler: SpanPlus has no upsampler 'lp'"),
             ({"type": "SpanPlus", "upsampler": "conv"}, r"network_g\.upsampler: .*upscale 1 only"),
             ({"type": "SpanPlus", "feature_channels": 6}, r"network_g\.feature_channels: .*multiple of 4"),
             ({"type": "SpanPlus", "blocks": []}, r"network_g\.blocks: SpanPlus needs a non-empty list"),
             ({"type": "SpanPlus", "upscale": 0}, r"network_g\.upscale: SpanPlus needs an integer upscale >= 1"))),
    "RTMoSR": Card({"type": "RTMoSR", "dim": 4, "n_blocks": 1, "scale": 2, "unshuffle_mod": True},
                   moved="body.0.norm.scale",
        onnx={}, xla={"shape": (1, 3, 8, 8), "scale": 2},
        bad=(({"type": "RTMoSR", "scale": 3, "unshuffle_mod": True}, r"network_g\.unshuffle_mod: .*scale 3"),
             ({"type": "RTMoSR", "ffn_expansion": 0.5},
              r"network_g\.ffn_expansion: RTMoSR needs ffn_expansion >= 1"))),
    "ArtCNN": Card({"type": "ArtCNN", "filters": 8, "n_block": 1, "scale": 2},
        onnx={}, xla={"shape": (1, 3, 8, 8), "scale": 2},
        bad=(({"type": "ArtCNN", "act": "swish2"}, r"network_g\.act: ArtCNN has no activation 'swish2'"),
             ({"type": "ArtCNN", "scale": 1.5}, r"network_g\.scale: ArtCNN needs an integer scale"))),
    "DIS": Card({"type": "DIS", "num_features": 8, "num_blocks": 1, "scale": 2}, moved="head_act.weight",
        onnx={}, xla={"shape": (1, 3, 8, 8), "scale": 2},
        bad=(({"type": "DIS", "scale": 8}, r"network_g\.scale: DIS supports scale 1, 2, 3 or 4, got 8"),)),
    "LMLT": Card({"type": "LMLT", "dim": 8, "n_blocks": 1, "scale": 2}, moved="feats.0.norm1.weight",
        # ONNX at the default 45x70: at least 33 pixels, so that the pad to 64 is a reflection (the graph keeps the
        # traced size's choice between reflect and edge padding)
        onnx={}, onnx_slow=True, xla={"shape": (1, 3, 16, 16), "scale": 2},
        bad=(({"type": "LMLT", "dim": 30}, r"network_g\.dim: LMLT needs dim to be a multiple of 4"),
             ({"type": "LMLT"}, r"network_g\.dim: required argument of LMLT is missing"))),
    "MAN": Card({"type": "MAN", "n_feats": 6, "n_resblocks": 1, "scale": 2}, moved="body.0.body.0.LKA.scale",
        onnx={}, onnx_slow=True, xla={"shape": (1, 3, 8, 8), "scale": 2},
        bad=(({"type": "MAN", "n_feats": 64}, r"network_g\.n_feats: MAN needs n_feats to be a multiple of 3"),
             ({"type": "MAN", "n_colors": 1}, r"network_g\.n_colors: MAN's mean shift is RGB"))),
    "RCANOriginal": Card({"type": "RCANOriginal", "scale": 2, "n_resgroups": 1, "n_resblocks": 1, "n_feats": 8,
                          "reduction": 2}),
    "GateRV3": Card({"type": "GateRV3", "scale": 2, "dim": 8, "enc_blocks": [1], "dec_blocks": [1], "num_latent": 1,
                     "sisr_blocks": 0, "upsample_mid_dim": 8, "attention": True}, moved="gamma"),
    "SCUNet_aaf6aa": Card({"type": "SCUNet_aaf6aa", "config": [1, 0, 0, 0, 0, 0, 0]}, scale=1, total_iter=2, batch=2),
    "DWT": Card({"type": "DWT", "img_size": 16, "embed_dim": 8, "depths": [2, 2], "num_heads": [2, 2],
                 "window_size": 4, "layer_kinds": [[0, -1], [0, 2]], "upscale": 2}, batch=2,
                moved="layers.0.residual_group.blocks.0.norm1.weight",
        tiny={"type": "DWT", "img_size": 8, "embed_dim": 8, "depths": [2, 2], "num_heads": [2, 2], "window_size": 2,
              "layer_kinds": [[0, -1], [0, 2]], "upscale": 2, "drop_path_rate": 0.0},
        onnx={"size": (23, 30)}, xla={"shape": (2, 3, 10, 9), "scale": 2},
        bad=(
            ({"upsampler": "pixelshuffledirect"}, r"network_g\.upsampler: DWT: upsampler must be 'pixelshuffle'"),
            ({"resi_connection": "identity"}, r"network_g\.resi_connection: DWT: unknown resi_connection"),
            ({"upscale": 5}, r"network_g\.upscale: scale 5 is not supported"),
            ({"num_heads": [2]}, r"network_g\.num_heads: DWT: num_heads has 1 entries but depths has 2"),
            ({"num_heads": [3, 2]}, r"network_g\.num_heads: DWT: embed_dim 8 is not divisible by 3 heads"),
            ({"layer_kinds": [[0, -1]]}, r"network_g\.layer_kinds: DWT: layer_kinds needs one list per group"),
            ({"layer_kinds": [[0, -1], [0, -2]]}, r"network_g\.layer_kinds: DWT: a layer kind is 0 \(plain\)"),
            ({"window_size": 0}, r"network_g\.window_size: DWT: window_size must be a positive integer"))),
    "EMT": Card({"type": "EMT", "dim": 10, "n_blocks": 1, "n_layers": 3, "num_heads": 1, "mlp_ratio": 1,
                 "window_list": [[8, 4], [4, 8]], "shift_list": [[4, 2], [2, 4]], "scale": 2}, batch=2,
        tiny={"type": "EMT", "dim": 10, "n_blocks": 1, "n_layers": 3, "num_heads": 1, "mlp_ratio": 1, "scale": 2,
              "window_list": [[4, 2], [2, 4]], "shift_list": [[2, 1], [1, 2]]},
        # EMT's batch norms: torch_xla compiles a plain nn.BatchNorm2d twice, then never again (3 steps)
        onnx={"size": (23, 30)}, xla={"shape": (2, 3, 10, 9), "scale": 2, "steps": 3},
        bad=(
            ({"upsampler": "nearest+conv"}, r"network_g\.upsampler: EMT: unknown upsampler"),
            ({"scale": 5}, r"network_g\.scale: scale 5 is not supported"),
            ({"scale": 0, "upsampler": "pixelshuffledirect"}, r"network_g\.scale: EMT needs an integer scale >= 1"),
            ({"num_in_ch": 1}, r"network_g\.num_in_ch: EMT's mean shift is for RGB"),
            ({"dim": 12}, r"network_g\.dim: EMT's shifts split dim into five groups"),
            ({"mlp_ratio": 1.2},
             r"network_g\.mlp_ratio: EMT: dim \* mlp_ratio \(12\.0\) must be a whole multiple of 5"),
            ({"num_heads": 2}, r"network_g\.num_heads: EMT: dim \(10\) must split into 2 window parts"),
            ({"shift_list": [[2, 1]]}, r"network_g\.shift_list: EMT needs one \[rows, columns\] window"),
            ({"window_list": [4, 2]}, r"network_g\.window_list: EMT: window_list and shift_list are lists"))),
    "CascadedGaze": Card({"type": "CascadedGaze", "width": 4, "middle_blk_num": 1, "enc_blk_nums": [1, 1],
                          "dec_blk_nums": [1, 1], "GCE_CONVS_nums": [3, 2]}, scale=1, moved="encoders.0.0.beta",
        onnx={}, onnx_prepare=_off_zero_block_scales, xla={"shape": (1, 3, 32, 36), "scale": 1},
        bad=(
            ({"type": "CascadedGaze", "scale": 2}, r"network_g\.scale: CascadedGaze restores at scale 1 only"),
            ({"type": "CascadedGaze", "enc_blk_nums": [1, 1]}, r"network_g\.dec_blk_nums: .*one decoder level per"),
            ({"type": "CascadedGaze", "GCE_CONVS_nums": [3, 3]},
             r"network_g\.GCE_CONVS_nums: .*4 levels, .* 2 entries"),
            ({"type": "CascadedGaze", "GCE_CONVS_nums": [3, 4, 2, 2]}, r"network_g\.GCE_CONVS_nums: .*2 or 3 convs"),
            ({"type": "CascadedGaze", "enc_blk_nums": [1, -1, 1, 1]},
             r"network_g\.enc_blk_nums: .*block counts >= 0"))),
    "SPANF": Card({"type": "SPANF", "feature_channels": 8, "upscale": 2}),
    "SPANF3": Card({"type": "SPANF3", "feature_channels": 8, "num_blocks": 2, "upscale": 2, "unshuffle_mod": True},
                   moved="block_1.att_conv.weight"),  # zero in every fresh network
    "NinaSR": Card({"type": "NinaSR", "n_resblocks": 2, "n_feats": 8, "scale": 2}, moved="head.0.bias",
        onnx={}, xla={"shape": (1, 3, 12, 10), "eval_form": True, "scale": 2, "prepare": _off_special_scalars},
        bad=(({"type": "NinaSR", "scale": 0}, r"network_g\.scale: NinaSR needs an integer scale >= 1"),
             ({"type": "NinaSR", "n_resblocks": 0},
              r"network_g\.n_resblocks: NinaSR needs an integer n_resblocks >= 1"),
             ({"type": "NinaSR", "n_feats": 2, "expansion": 1.0},
              r"network_g\.expansion: .*n_feats \* expansion >= 4"))),
    "PlainUSR": Card({"type": "PlainUSR", "n_feat": 33, "im_feat": [6, 4, 2], "attn_feat": 2, "scale": 2},
                     moved="block1.body.0.se.tensor",
        onnx={}, onnx_prepare=_reparameterize,
        xla={"shape": (1, 3, 12, 10), "eval_form": True, "scale": 2, "prepare": _off_special_scalars},
        bad=(({"type": "PlainUSR", "im_feat": [64, 48]}, r"network_g\.im_feat: .*needs 3 block widths"),
             ({"type": "PlainUSR", "im_feat": [64, 32, 48]}, r"network_g\.im_feat: .*non-increasing"),
             ({"type": "PlainUSR", "im_feat": [72, 48, 32]}, r"network_g\.im_feat: .*the first at most n_feat"),
             ({"type": "PlainUSR", "attn_feat": 0}, r"network_g\.attn_feat: PlainUSR needs an integer attn_feat >= 1"),
             ({"type": "PlainUSR", "scale": 1.5}, r"network_g\.scale: PlainUSR needs an integer scale >= 1"))),
    "FlexNet": Card({"type": "FlexNet", "dim": 8, "num_blocks": [1], "hidden_rate": 2, "scale": 2},
                    moved="pipeline.att.0.t_blocks.0.gamma1",
        # XLA: the eval form (the folded OmniShift) lowers too
        onnx={}, onnx_prepare=_off_zero_block_scales, xla={"shape": (1, 3, 8, 16), "scale": 2},
        bad=(
            ({"type": "FlexNet", "upsampler": "conv"}, r"network_g\.upsampler: FlexNet has no upsampler 'conv'"),
            ({"type": "FlexNet", "upsampler": "nearest+conv", "scale": 6}, r"network_g\.scale: .*3 or a power of 2"),
            ({"type": "FlexNet", "upsampler": "dysample", "dim": 5}, r"network_g\.dim: .*dim must be even, got 5"),
            ({"type": "FlexNet", "window_size": 16}, r"network_g\.window_size: .*must be 8, got 16"),
            ({"type": "FlexNet", "pipeline_type": "unet"}, r"network_g\.pipeline_type: FlexNet has no pipeline_type"),
            ({"type": "FlexNet", "num_blocks": []}, r"network_g\.num_blocks: FlexNet needs a non-empty list"),
            ({"type": "FlexNet", "scale": 0}, r"network_g\.scale: FlexNet needs an integer scale >= 1"))),
    "MetaFlexNet": Card({"type": "metaflexnet", "dim": 2, "num_blocks": [1, 1, 1, 1], "hidden_rate": 1, "scale": 2},
                        train=False, onnx={}, onnx_prepare=_off_zero_block_scales, onnx_slow=True,
                        xla={"shape": (1, 3, 16, 16), "scale": 2},
                        bad=(({"type": "metaflexnet", "num_blocks": [2, 2]}, r"network_g\.num_blocks: .*4 levels"),
                             ({"type": "metaflexnet", "dim": 7}, r"network_g\.dim: .*meta pipeline halves dim"))),
    # transformers
    "HMA": Card({"type": "HMA", "img_size": 8, "embed_dim": 32, "depths": [2], "num_heads": [4], "window_size": 4,
                 "interval_size": 2, "upscale": 2}, batch=2, moved="layers.0.residual_group.blocks.1.norm1.weight"),
    "DAT_iLN": Card({"type": "DAT_iLN", "img_size": 8, "embed_dim": 32, "split_size": [2, 4], "depth": [2],
                     "num_heads": [2], "expansion_factor": 1.0, "upscale": 2, "upsampler": "pixelshuffledirect"},
                    batch=2, moved="layers.0.blocks.0.norm1.weight"),
    "HAT_iLN": Card({"type": "HAT_iLN", "img_size": 8, "embed_dim": 12, "depths": [2], "num_heads": [2],
                     "window_size": 4, "squeeze_factor": 4, "mlp_ratio": 2.0, "upscale": 2}, batch=2,
                    moved="layers.0.residual_group.blocks.0.norm1.weight"),
    "GRFormer": Card({"type": "GRFormer", "img_size": 8, "embed_dim": 8, "depths": [2], "num_heads": [2],
                      "window_size": [2, 4], "upscale": 2}, batch=2, moved="layers.0.blocks.0.norm1.weight"),
    # neosr's lightweight CNNs
    "CFSR": Card({"type": "CFSR", "embed_dim": 8, "depths": [1, 1], "dw_size": 5, "upscale": 2},
                 moved="layers.0.blocks.0.layer_scale_1",
        onnx={}, xla={"shape": (1, 3, 17, 15), "eval_form": True, "scale": 2},
        bad=(({"type": "CFSR", "dw_size": 8}, r"network_g\.dw_size: CFSR needs an odd dw_size"),
             ({"type": "CFSR", "depths": []}, r"network_g\.depths: CFSR needs a non-empty list"),
             ({"type": "CFSR", "mlp_ratio": 0.5}, r"network_g\.mlp_ratio: CFSR needs mlp_ratio >= 1"),
             ({"type": "CFSR", "in_chans": 4, "mean_norm": True}, r"network_g\.mean_norm: .*3 or 1 image channels"),
             ({"type": "CFSR", "upscale": 0}, r"network_g\.upscale: CFSR needs an integer upscale >= 1"))),
    "HASN": Card({"type": "HASN", "feature_channels": 30, "upscale": 2}, batch=2, moved="block_1.ln.weight",
        onnx={}, xla={"shape": (1, 3, 17, 15), "eval_form": True, "scale": 2},
        bad=(({"type": "HASN", "feature_channels": 16}, r"network_g\.feature_channels: HASN needs an integer .* >= 30"),
             ({"type": "HASN", "upscale": 1.5}, r"network_g\.upscale: HASN needs an integer upscale >= 1"))),
    "KRGN": Card({"type": "KRGN", "n_feats": 32, "n_resgroups": 1, "scale": 2}, batch=2, moved="sub_mean.weight",
        onnx={}, xla={"shape": (1, 3, 17, 15), "eval_form": True, "scale": 2},
        bad=(({"type": "KRGN", "n_colors": 1}, r"network_g\.n_colors: KRGN's mean shifts are RGB"),
             ({"type": "KRGN", "n_feats": 48}, r"network_g\.n_feats: .*multiple of 32"),
             ({"type": "KRGN", "act": "gelu"}, r"network_g\.act: KRGN's act is one of"))),
    "MSDAN": Card({"type": "MSDAN", "channels": 8, "num_DFEB": 1, "upscale_factor": 2},
        onnx={}, xla={"shape": (1, 3, 17, 15), "eval_form": True, "scale": 2},
        bad=(({"type": "MSDAN", "channels": 10}, r"network_g\.channels: MSDAN needs channels a positive multiple of 4"),
             ({"type": "MSDAN", "upscale_factor": 8},
              r"network_g\.upscale_factor: MSDAN's upsampler is x2, x3 or x4"))),
    "ASID": Card({"type": "ASID", "num_feat": 8, "window_size": 4, "scale": 2},
                 moved="block0.residual_layer.0.SLA1.norm.weight"),
    "LightSAFMNPP": Card({"type": "LightSAFMNPP", "dim": 8, "n_blocks": 1, "upscaling_factor": 2}),
    "DCT": Card({"type": "DCT", "img_size": 8, "embed_dim": 64, "depth": [2], "num_heads": [4],
                 "expansion_factor": 0.5, "upscale": 2}, batch=2, moved="layers.0.blocks.0.norm1.weight",
        tiny={"type": "DCT", "embed_dim": 64, "depth": [2], "num_heads": [4], "expansion_factor": 0.5, "upscale": 2,
              "drop_path_rate": 0.0},
        onnx={}, xla={"shape": (1, 3, 17, 15), "eval_form": True, "scale": 2},
        bad=(({"embed_dim": 48}, r"network_g\.embed_dim: DCT: embed_dim must be a multiple of 16 and at least 64"),
             ({"num_heads": [6]}, r"network_g\.num_heads: DCT: each head count must be a multiple of 4"),
             ({"num_heads": [4, 4]}, r"network_g\.num_heads: DCT: num_heads has 2 entries"),
             ({"upsampler": "nearest+conv"}, r"network_g\.upsampler: DCT: unknown upsampler"),
             ({"resi_connection": "identity"}, r"network_g\.resi_connection: DCT: unknown resi_connection"),
             ({"split_size": [0, 4]}, r"network_g\.split_size"))),
    "CATANet": Card({"type": "CATANet", "dim": 8, "block_num": 1, "qk_dim": 8, "mlp_dim": 8, "heads": 2,
                     "patch_size": [6], "n_iters": [2], "num_tokens": [4], "group_size": [16], "upscale": 2},
                    batch=2, moved="blocks.0.0.norm.weight",
        tiny={"type": "CATANet", "dim": 8, "block_num": 2, "qk_dim": 8, "mlp_dim": 8, "heads": 2, "patch_size": [6, 7],
              "n_iters": [3, 2], "num_tokens": [4, 5], "group_size": [16, 8], "upscale": 2},
        onnx={},  # XLA: tests/archs/test_catanet.py (the centres after the steps)
        bad=(({"type": "CATANet", "upscale": 8}, r"network_g\.upscale: CATANet's upscale is 1, 2, 3 or 4"),
             ({"type": "CATANet", "dim": 0}, r"network_g\.dim: CATANet needs an integer dim >= 1"),
             ({"type": "CATANet", "heads": 3}, r"network_g\.heads: CATANet needs heads dividing dim and qk_dim"),
             ({"type": "CATANet", "block_num": 2, "patch_size": [16]},
              r"network_g\.patch_size: CATANet needs a list of 2 \(block_num\)"),
             ({"type": "CATANet", "block_num": 1, "group_size": [0]},
              r"network_g\.group_size: CATANet needs a list of 1"),
             ({"type": "CATANet", "block_num": 1, "patch_size": [2]},
              r"network_g\.patch_size: CATANet needs patch sizes >= 3"))),
    "Swin2SR": Card({"type": "Swin2SR", "img_size": 8, "window_size": 4, "embed_dim": 12, "depths": [2],
                     "num_heads": [2], "mlp_ratio": 2.0, "upscale": 2, "upsampler": "pixelshuffledirect"}, batch=2),
    "RGT": Card({"type": "RGT", "img_size": 16, "embed_dim": 32, "depth": [2], "num_heads": [2], "mlp_ratio": 2.0,
                 "upscale": 2, "split_size": [2, 4]}, batch=2),
    "CRAFT": Card({"type": "CRAFT", "embed_dim": 32, "depths": [1], "num_heads": [2], "window_size": 8,
                   "split_size_0": 2, "split_size_1": 8, "upscale": 2}, batch=2),
    "ATD": Card({"type": "ATD", "img_size": 8, "embed_dim": 16, "depths": [2], "num_heads": [2], "window_size": 4,
                 "category_size": 24, "num_tokens": 8, "reducted_dim": 4, "convffn_kernel_size": 3,
                 "mlp_ratio": 2.0, "upscale": 2, "upsampler": "pixelshuffledirect"}, batch=2),
    # spandrel's efficient networks (tests/archs/test_efficient.py; no training run on their cards)
    "SPAN": Card({"type": "SPAN", "feature_channels": 4, "upscale": 2}, train=False, xla={"shape": (1, 3, 8, 8)},
                 bad=(({"type": "SPAN", "upscale": 0}, r"network_g\.upscale: SPAN needs an integer upscale >= 1"),
                      ({"type": "SPAN", "num_in_ch": 1, "num_out_ch": 1},
                       r"network_g\.rgb_mean: SPAN has num_in_ch=1 but rgb_mean has 3 values"))),
    "RealPLKSR": Card({"type": "RealPLKSR", "dim": 8, "n_blocks": 1, "kernel_size": 5, "upscaling_factor": 2,
                       "layer_norm": True, "dysample": True}, train=False, xla={"shape": (1, 3, 8, 8)},
                      bad=(({"type": "RealPLKSR", "kernel_size": 16},
                            r"network_g\.kernel_size: RealPLKSR needs an odd kernel_size"),
                           ({"type": "RealPLKSR", "dim": 8, "split_ratio": 0.1},
                            r"network_g\.split_ratio: .*between 1 and dim"),
                           ({"type": "RealPLKSR", "dim": 10},
                            r"network_g\.norm_groups: RealPLKSR: dim \(10\) must be a multiple"),
                           ({"type": "RealPLKSR", "upscaling_factor": 2.0},
                            r"network_g\.upscaling_factor: RealPLKSR needs an integer"))),
    "OmniSR": Card({"type": "OmniSR", "num_feat": 8, "window_size": 4, "up_scale": 2}, train=False,
                   xla={"shape": (1, 3, 16, 12)},
                   bad=(({"type": "OmniSR", "num_feat": 18},
                         r"network_g\.num_feat: OmniSR needs num_feat to be a multiple of 4"),
                        ({"type": "OmniSR", "up_scale": -1},
                         r"network_g\.up_scale: OmniSR needs an integer up_scale >= 1"),
                        ({"type": "OmniSR", "window_size": 0},
                         r"network_g\.window_size: OmniSR needs an integer window_size"))),
    "SAFMN": Card({"type": "SAFMN", "dim": 8, "n_blocks": 1, "upscaling_factor": 2}, train=False,
                  xla={"shape": (1, 3, 8, 8)},
                  bad=(({"type": "SAFMN", "dim": 30}, r"network_g\.dim: SAFMN needs dim to be a multiple of 4"),
                       ({"type": "SAFMN"}, r"network_g\.dim: required argument of SAFMN is missing"),
                       ({"type": "SAFMN", "dim": 8, "upscaling_factor": 0},
                        r"network_g\.upscaling_factor: SAFMN needs an integer"))),
    # GRL, Uformer, KBNet (x2 / x1): two iterations, batch 2 (GRL's masks and stripe tables from the padded size)
    "GRL": Card({"type": "GRL", "embed_dim": 8, "depths": [3], "num_heads_window": [2], "num_heads_stripe": [2],
                 "window_size": 4, "stripe_size": [8, 4], "anchor_window_down_factor": 2, "stripe_shift": True,
                 "upscale": 2, "upsampler": "pixelshuffledirect", "mlp_ratio": 2.0}, total_iter=2, batch=2),
    "Uformer": Card({"type": "Uformer", "embed_dim": 2, "depths": [1, 2, 1, 1, 1, 1, 1, 2, 1], "num_heads": [1] * 9,
                     "win_size": 2, "mlp_ratio": 2.0}, scale=1, total_iter=2, batch=2),
    "KBNet_s": Card({"type": "KBNet_s", "width": 4, "middle_blk_num": 1, "enc_blk_nums": [1, 1],
                     "dec_blk_nums": [1, 1]}, scale=1, total_iter=2, batch=2),
    "KBNet_l": Card({"type": "KBNet_l", "dim": 2, "num_blocks": [1, 1, 1, 1], "num_refinement_blocks": 1,
                     "heads": [1, 1, 2, 2]}, scale=1, total_iter=2, batch=2),
}

TRAIN: dict[str, Card] = {name: card for name, card in CARDS.items() if card.train}


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



# ----------------------------------------------------------------------------- reference parity


def _always(_type: str, _mode: str) -> bool:
    return True


def _never(_type: str, _mode: str) -> bool:
    return False


def _train_mode(_type: str, mode: str) -> bool:
    """A training-mode pass normalises by the batch's own statistics: rounding grows with the output's scale (Sebica
    x2 reaches 8; with one thread and AVX2 kernels one value was 1.6e-5 off)."""
    return mode == "train"


def _emt(type_: str, _mode: str) -> bool:
    """EMT shifts its [0, 1] input by 255 x the mean: outputs in the hundreds, rounding in proportion."""
    return type_ == "EMT"


@dataclass(frozen=True)
class Parity:
    """How a fixture folder's cases are compared with the reference (every case, every ``compare`` entry: ``[input,
    output, mode]``, the mode ``eval`` where the entry has none).

    ``reference``: who made the outputs (for messages); ``name``: a case entry naming the type to build with (neosr's
    lower-case names), or per type the name to build with (the class built must be the case's type); ``both_modes``:
    types (or ``True``: all) compared in eval and training mode with every entry (re-parameterised convs fold alike);
    ``scaled``: (type, mode) whose absolute tolerance is FIXTURE_TOL's times the output's magnitude; ``padded``: some
    compared input is no multiple of the network's ``tile_multiple`` (the padding path is compared too)."""

    reference: str
    name: str | dict[str, str] | None = None
    both_modes: tuple[str, ...] | bool = ()
    scaled: Callable[[str, str], bool] = _never
    padded: bool = False


PARITY: dict[str, Parity] = {
    "efficient": Parity("spandrel"),
    "enhance": Parity("spandrel"),  # MixDehazeNet's train-mode (batch statistics) entry comes last
    "escmix": Parity("traiNNer-redux", scaled=_train_mode),
    "cgflex": Parity("traiNNer-redux"),
    "dwtemt": Parity("traiNNer-redux", scaled=_emt),
    "hitsr": Parity("traiNNer-redux"),
    "neosr_cnn": Parity("neosr", both_modes=("PlainUSR",)),  # PlainUSR: neosr's inference path, in both modes
    # ELAN with a 255 image range gives outputs up to ~350, where AVX2 and AVX-512 kernels differ by 9e-5
    "plksrformer": Parity("the reference", scaled=_always),
    "trainner_archs": Parity("traiNNer-redux"),
    "lightweight": Parity("spandrel"),
    # without layer norms IPT's tokens reach hundreds (rgb_range 255)
    "ipt": Parity("spandrel", scaled=_always),
    "restormer": Parity("the reference"),
    # FDAT: every case has an input no multiple of the window
    "fdatgrl": Parity("spandrel", padded=True),
    # neosr's lower-case names build anysr's classes; both modes (no layer behaves differently in training)
    "neosr_transformer": Parity("neosr", name="neosr_type"),
    "neosr_light": Parity("neosr", name={"CFSR": "cfsr", "HASN": "hasn", "KRGN": "krgn", "MSDAN": "msdan"},
                          both_modes=True),
    "neosr_dct": Parity("neosr", name={"DCT": "dct"}, both_modes=True),
}


# Inputs the networks pad (or grow to a minimum size) inside forward, per fixture folder: (case, input, what happens);
# the output for that input is ``output<i>``. ``PADDED_MIN_SIDE``: a folder's networks grow inputs below that side.
PADDED: dict[str, tuple[tuple[str, str, str], ...]] = {
    "efficient": (
        ("omnisr_x4", "input1", "17x13: zero-padded to the window (4) inside forward, cropped"),
        ("omnisr_x4", "input2", "9x6: grown to the 16-pixel minimum, then cropped"),
        ("omnisr_x2_nope", "input1", "19x13: zero-padded to the window (8), cropped"),
        ("safmn_x4", "input1", "13x10: not a multiple of 8: runs unpadded like the authors' code"),
        ("safmn_x4", "input2", "5x7: grown to the 8-pixel minimum, then cropped"),
    ),
    "enhance": (
        ("retinexformer_1s", "input1", "13x10: padded to 16x16 (multiple of 8) inside forward, cropped"),
        ("retinexformer_2s", "input1", "9x20: padded to 16x24, cropped"),
        ("hvicidnet", "input1", "13x10: padded to 16x16 (multiple of 8), cropped"),
        ("hvicidnet_norm", "input1", "7x17: reflect to 8, reflect + edge to 24, cropped"),
        ("fftformer", "input1", "20x36: padded to 32x64 (multiple of 32), cropped"),
        ("fftformer_bias", "input1", "33x31: padded to 64x32, cropped"),
        ("mixdehazenet", "input1", "41x46: reflect-padded to 44x48 (multiple of 4), cropped"),
        ("mixdehazenet", "input2", "21x30: grown to the 40-pixel minimum, cropped"),
    ),
    "escmix": (
        ("escrealm_x4", "input1", "9x7: reflect-padded to the 4-pixel window inside each attention, cropped"),
        ("escrealm_x2_unshuffle_ps", "input1", "9x7: padded to the unshuffle factor 2, then to the window"),
        ("escrealm_x1_unshuffle_psd", "input1", "17x18: padded to the unshuffle factor 4, then to the window 2"),
        ("escrealm_x3_nearest", "input1", "6x7: window padding at x3"),
        ("lkfmixer_x4", "input1", "13x10: reflect-padded to a multiple of 8, cropped"),
        ("lkfmixer_x3", "input1", "11x7: reflect-padded to a multiple of 8, cropped"),
        ("mosrv2_x2_unshuffle_rms_ps", "input1", "7x9: reflect-padded to the unshuffle factor 2, cropped"),
        ("mosrv2_x1_unshuffle_tc", "input1", "10x6: reflect-padded to the unshuffle factor 4, cropped"),
    ),
    "cgflex": (
        ("cgnet_2levels", "input1", "33x37: zero-padded to 36x40 (a multiple of 4), cropped"),
        ("cgnet_3levels_gray", "input1", "29x30: zero-padded to 32x32, cropped"),
        ("flexnet_x4_ps", "input1", "13x10: reflect-padded to 16x16 (8x8 windows), cropped"),
        ("flexnet_x2_dysample_gray", "input1", "7x12: padded to 8x16, cropped"),
        ("flexnet_x8_nearest", "input0", "5x6: padded to 8x8, cropped"),
        ("metaflexnet_x1_ps", "input0", "40x50: padded to 64x64 (8x8 windows at 1/8 size), cropped"),
    ),
    "trainner_archs": (
        ("rtmosr_x2", "input1", "7x5: reflect-padded to 8x6 inside forward, cropped"),
        ("rtmosr_x3_nose", "input1", "5x3: reflect-padded to 6x4, cropped"),
        ("rtmosr_x1_unshuffle_nodccm", "input1", "10x7: padded to 16x8 (unshuffle 4 then the x2 mixing), cropped"),
        ("lmlt_x2", "input0", "36x40: reflect-padded to 64x64 (8x8 windows at 1/8 size), cropped"),
        ("lmlt_x1", "input0", "48x70: padded to 64x128, cropped"),
    ),
}
PADDED_MIN_SIDE = {"enhance": 40}  # MixDehazeNet


# Fixture cases holding the reference's training-mode gradients of ``mean(output ** 2)`` (``grad_input0`` and
# ``grad.<parameter>``), per folder; ``GRADIENT_SUBSET``: folders that store them for some of the trained parameters.
GRADIENTS: dict[str, tuple[str, ...]] = {
    # CascadedGaze's layer norms are plain differentiable ops here (the reference writes the backward by hand);
    # FlexNet's OmniShift trains as one folded conv (the reference: 3 convs)
    "cgflex": ("cgnet_2levels", "flexnet_x3_nearest_cn"),
    # PlainUSR's MBConvs and PConvs train as folded 3x3 convs (neosr: three convs, an SE and a 1x1 each)
    "neosr_cnn": ("ninasr_x2", "plainusr_x2_ultra", "plainusr_x2_v2"),
    "catanet": ("catanet_x2", "catanet_x4_initted"),
    "neosr_dct": ("dct_x1_gray_1conv", "dct_x2_compress"),
    "neosr_transformer": ("hma_rgb", "grformer_x2"),  # drop path off, as the fixture
    "srformerv2": ("srformerv2_x2_direct", "srformerv2_x1_gray_ape"),  # drop path 0, as the fixture
}
GRADIENT_SUBSET = {"neosr_dct": 20}  # folder -> more stored than this many


# The benchmarks' networks at the authors' published sizes (benchmarks/bench_all_archs.py and
# bench_attention_archs.py read them here): name -> (options, scale, input channels).
PUBLISHED: dict[str, tuple[dict[str, Any], int, int]] = {
    "MSRResNet": ({"type": "MSRResNet"}, 4, 3),
    "EDSR-M": ({"type": "EDSR", "num_in_ch": 3, "num_out_ch": 3, "upscale": 4}, 4, 3),
    "RCAN": ({"type": "RCAN", "num_in_ch": 3, "num_out_ch": 3, "upscale": 4}, 4, 3),
    "RRDBNet (ESRGAN)": ({"type": "RRDBNet", "num_in_ch": 3, "num_out_ch": 3}, 4, 3),
    "SRVGGNetCompact": ({"type": "SRVGGNetCompact"}, 4, 3),
    "SwinIR-M (classical)": ({"type": "SwinIR", "upscale": 4, "img_size": 48, "window_size": 8, "img_range": 1.0,
                              "depths": [6] * 6, "embed_dim": 180, "num_heads": [6] * 6, "mlp_ratio": 2,
                              "upsampler": "pixelshuffle", "resi_connection": "1conv"}, 4, 3),
    "HAT-S": ({"type": "HAT", "upscale": 4, "img_size": 64, "window_size": 16, "compress_ratio": 24,
               "squeeze_factor": 24, "conv_scale": 0.01, "overlap_ratio": 0.5, "depths": [6] * 6, "embed_dim": 144,
               "num_heads": [6] * 6, "mlp_ratio": 2, "upsampler": "pixelshuffle", "resi_connection": "1conv"}, 4, 3),
    "HAT": ({"type": "HAT", "upscale": 4, "img_size": 64, "window_size": 16, "compress_ratio": 3,
             "squeeze_factor": 30, "conv_scale": 0.01, "overlap_ratio": 0.5, "depths": [6] * 6, "embed_dim": 180,
             "num_heads": [6] * 6, "mlp_ratio": 2, "upsampler": "pixelshuffle", "resi_connection": "1conv"}, 4, 3),
    "DAT-light": ({"type": "DAT", "upscale": 4, "img_size": 64, "depth": [18], "embed_dim": 60, "num_heads": [6],
                   "expansion_factor": 2, "resi_connection": "3conv", "split_size": [8, 32],
                   "upsampler": "pixelshuffledirect"}, 4, 3),
    "DAT-S": ({"type": "DAT", "upscale": 4, "img_size": 64, "split_size": [8, 16], "depth": [6] * 6,
               "embed_dim": 180, "num_heads": [6] * 6, "expansion_factor": 2, "resi_connection": "1conv"}, 4, 3),
    "DAT-2": ({"type": "DAT", "upscale": 4, "img_size": 64, "split_size": [8, 32], "depth": [6] * 6,
               "embed_dim": 180, "num_heads": [6] * 6, "expansion_factor": 2, "resi_connection": "1conv"}, 4, 3),
    "DRCT": ({"type": "DRCT", "upscale": 4, "img_size": 64, "window_size": 16, "depths": [6] * 6, "embed_dim": 180,
              "num_heads": [6] * 6, "mlp_ratio": 2, "upsampler": "pixelshuffle", "resi_connection": "1conv"}, 4, 3),
    "SPAN (48 ch)": ({"type": "SPAN", "feature_channels": 48}, 4, 3),
    "RealPLKSR (layer norm)": ({"type": "RealPLKSR", "layer_norm": True}, 4, 3),
    "RealPLKSR + DySample": ({"type": "RealPLKSR", "layer_norm": True, "dysample": True}, 4, 3),
    "OmniSR": ({"type": "OmniSR", "res_num": 5}, 4, 3),
    "SAFMN": ({"type": "SAFMN", "dim": 36}, 4, 3),
    "SAFMN-L": ({"type": "SAFMN", "dim": 128, "n_blocks": 16}, 4, 3),
    "ECBSR-M4C16 (Y)": ({"type": "ECBSR", "num_in_ch": 1, "num_out_ch": 1, "num_block": 4, "num_channel": 16,
                         "with_idt": False, "act_type": "prelu", "scale": 4}, 4, 1),
    "RIDNet": ({"type": "RIDNet", "in_channels": 3, "mid_channels": 64, "out_channels": 3}, 1, 3),
    "NAFNet-SIDD-width32": ({"type": "NAFNet", **NAFNET_CONFIGS["NAFNet-SIDD-width32"]}, 1, 3),
    "NAFNet-SIDD-width64": ({"type": "NAFNet", **NAFNET_CONFIGS["NAFNet-SIDD-width64"]}, 1, 3),
    "SCUNet": ({"type": "SCUNet"}, 1, 3),
    # added 2026-12-02 (issue 18): the newer families at a published size (a preset name where one exists)
    "ATD-light": ({"type": "atd_light", "scale": 4}, 4, 3),
    "ArtCNN R8F64": ({"type": "artcnn_r8f64", "scale": 4}, 4, 3),
    "CRAFT": ({"type": "craft", "scale": 4}, 4, 3),
    "DCTLSA": ({"type": "dctlsa", "scale": 4}, 4, 3),
    "DIS-balanced": ({"type": "dis_balanced", "scale": 4}, 4, 3),
    "DITN-real": ({"type": "ditn_real", "scale": 4}, 4, 3),
    "EIMN-L": ({"type": "eimn_l", "scale": 4}, 4, 3),
    "ELAN-light": ({"type": "elan_light", "scale": 4}, 4, 3),
    "ESCRealM-XL": ({"type": "escrealm_xl", "scale": 4}, 4, 3),
    "FDAT-light": ({"type": "fdat_light", "scale": 4}, 4, 3),
    "HiT-SRF": ({"type": "hit_srf", "scale": 4}, 4, 3),
    "LKFMixer-B": ({"type": "lkfmixer_b", "scale": 4}, 4, 3),
    "LMLT-base": ({"type": "lmlt_base", "scale": 4}, 4, 3),
    "MAN-light": ({"type": "man_light", "scale": 4}, 4, 3),
    "MoESR": ({"type": "MoESR", "scale": 4}, 4, 3),
    "MoSR": ({"type": "mosr", "scale": 4}, 4, 3),
    "MoSRv2": ({"type": "MoSRv2", "scale": 4}, 4, 3),
    "PLKSR": ({"type": "plksr", "scale": 4}, 4, 3),
    "RGT-S": ({"type": "rgt_s", "scale": 4}, 4, 3),
    "RTMoSR-L": ({"type": "rtmosr_l", "scale": 4}, 4, 3),
    "SAFMN-BCIE": ({"type": "SAFMNBCIE", "dim": 36}, 1, 3),
    "Sebica-mini": ({"type": "sebica_mini", "scale": 4}, 4, 3),
    "SeemoRe-T": ({"type": "seemore_t", "scale": 4}, 4, 3),
    "SpanPlus": ({"type": "spanplus", "scale": 4}, 4, 3),
    "SPANF": ({"type": "spanf", "scale": 4}, 4, 3),
    "SPANF3": ({"type": "spanf3", "scale": 4}, 4, 3),
    "SPANF3 (x2, unshuffle)": ({"type": "spanf3", "scale": 2}, 2, 3),
    "SRFormer-light": ({"type": "srformer_light", "scale": 4}, 4, 3),
    "SRFormerV2": ({"type": "srformerv2", "scale": 4}, 4, 3),
    "Swin2SR-S": ({"type": "swin2sr_s", "scale": 4}, 4, 3),
    "SwiftSRGAN": ({"type": "SwiftSRGAN"}, 4, 3),
    "FlexNet": ({"type": "flexnet", "scale": 4}, 4, 3),
    "MetaFlexNet": ({"type": "metaflexnet", "scale": 4}, 4, 3),
    "DWT": ({"type": "dwt", "scale": 4}, 4, 3),
    "DWT-S": ({"type": "dwt_s", "scale": 4}, 4, 3),
    "HMA-medium (neosr)": ({"type": "hma_medium", "scale": 4}, 4, 3),
    "GRFormer-medium (neosr)": ({"type": "grformer_medium", "scale": 4}, 4, 3),
    "NinaSR-B0 (neosr)": ({"type": "ninasr_b0", "scale": 4}, 4, 3),
    "NinaSR-B2 (neosr)": ({"type": "ninasr_b2", "scale": 4}, 4, 3),
    "PlainUSR-ultra (neosr)": ({"type": "plainusr_ultra", "scale": 4}, 4, 3),
    "PlainUSR-large (neosr)": ({"type": "plainusr_large", "scale": 4}, 4, 3),
    "CFSR (neosr)": ({"type": "cfsr", "scale": 4}, 4, 3),
    "HASN (neosr)": ({"type": "hasn", "scale": 4}, 4, 3),
    "KRGN (neosr)": ({"type": "krgn", "scale": 4}, 4, 3),
    "MSDAN (neosr)": ({"type": "msdan", "scale": 4}, 4, 3),
    "ASID (neosr)": ({"type": "asid", "scale": 4}, 4, 3),
    "ASID-D8 (neosr)": ({"type": "asid_d8", "scale": 4}, 4, 3),
    "Light-SAFMN++ (neosr)": ({"type": "light_safmnpp", "scale": 4}, 4, 3),
    "CATANet (neosr)": ({"type": "catanet", "scale": 4}, 4, 3),
    "DCT (neosr)": ({"type": "dct", "scale": 4}, 4, 3),
    "DAT-iLN-light": ({"type": "dat_iln_light", "scale": 4}, 4, 3),
    "HAT-iLN-S": ({"type": "hat_iln_s", "scale": 4}, 4, 3),
    "EMT": ({"type": "emt", "scale": 4}, 4, 3),
    "RCAN (traiNNer-redux)": ({"type": "rcan", "scale": 4}, 4, 3),
    "RCAN-unshuffle (x2)": ({"type": "rcan_unshuffle", "scale": 2}, 2, 3),
    "GateRV3-S": ({"type": "gaterv3_s", "scale": 4}, 4, 3),
    "GateRV3-R": ({"type": "gaterv3_r", "scale": 4}, 4, 3),
    "SCUNet_aaf6aa (x4)": ({"type": "scunet_aaf6aa", "scale": 4}, 4, 3),
    "Real-CUGAN x2": ({"type": "UpCunet2x"}, 2, 3),
    "DnCNN (gray)": ({"type": "DnCNN"}, 1, 1),
    "DRUNet": ({"type": "DRUNet"}, 1, 1),
    "FBCNN": ({"type": "FBCNN"}, 1, 3),
    "FFTformer": ({"type": "FFTformer"}, 1, 3),
    "Restormer": ({"type": "Restormer"}, 1, 3),
    "DocRes-base": ({"type": "docres_base"}, 1, 3),
    "RetinexFormer": ({"type": "RetinexFormer"}, 1, 3),
    "HVI-CIDNet": ({"type": "HVICIDNet"}, 1, 3),
    "MixDehazeNet-S": ({"type": "MixDehazeNet"}, 1, 3),
    "CascadedGaze": ({"type": "cascadedgaze"}, 1, 3),
    "IPT (x4)": ({"type": "ipt", "scale": 4}, 4, 3),
    "MMRealSR (x4)": ({"type": "mmrealsr", "scale": 4}, 4, 3),
    "HiFaceGAN": ({"type": "hifacegan"}, 1, 3),
    # GFPGAN's train_gfpgan_v1.yml network (512-pixel faces: the cells' smaller inputs are padded to 512)
    "GFPGANv1 (512)": ({"type": "GFPGANv1", "out_size": 512, "channel_multiplier": 1, "input_is_latent": True,
                        "different_w": True, "sft_half": True, "fix_decoder": True}, 1, 3),
    # traiNNer-redux's temporal networks (clip in, centre frame out): their builders' defaults, 5-frame clips
    "TemporalSPAN": ({"type": "temporalspan", "scale": 4}, 4, 3),
    "TemporalSPANv2": ({"type": "temporalspanv2", "scale": 4}, 4, 3),
    "TSCUNet": ({"type": "tscunet", "scale": 4}, 4, 3),
    "TFDAT": ({"type": "tfdat", "scale": 4}, 4, 3),
    # traiNNer-redux's LAWFFT at its class defaults (whole-image blocks: torch.fft on CPU / CUDA, DFT matmuls on XLA)
    "LAWFFT": ({"type": "LAWFFT", "scale": 4}, 4, 3),
}
PUBLISHED_FRAMES = {"TemporalSPAN": 5, "TemporalSPANv2": 5, "TSCUNet": 5, "TFDAT": 5}  # clip networks: frames per input

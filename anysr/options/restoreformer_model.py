"""RestoreFormerModel's train keys (the authors' ``VQLPIPSWithDiscriminatorWithCompWithIdentity`` and
``RestoreFormerModel`` arguments, their names) and which models read them. ``schema.py`` adds the fields to
``train`` and calls the rule; ``comp_style_weight`` and ``identity_weight`` are GFPGAN's fields, shared."""

from __future__ import annotations

from typing import Any

from anysr.options.common import dataset_role, phase_of, registered
from anysr.options.fields import Context, Field, ListOf, at_least, greater_than

MODEL = "RestoreFormerModel"
LOSS_KEYS = ("pixel_opt", "perceptual_opt", "gan_opt", "feature_matching_opt", "losses")

RESTOREFORMER_TRAIN_FIELDS: dict[str, Field] = {
    "image_key": Field(str, default="lq", choices=("lq", "gt"),
                       doc=f"{MODEL}: the network's input, lq (restoration) or gt (the HQ dictionary's autoencoder, "
                           "stage 1: the authors' HQ_Dictionary / ROHQD files)."),
    "disc_start": Field((int, None), default=None, check=at_least(0), expect="int >= 0 (5e3 is accepted)",
                        doc=f"{MODEL}: the authors' global step (iteration - 1) from which the GAN loss and the "
                            "discriminator count (the component discriminators train from there, their and the "
                            "identity loss reach the generator one step later); required with the model."),
    "disc_weight": Field(float, default=1.0, check=at_least(0),
                         doc=f"{MODEL}: factor of the adaptive GAN weight (the authors' files: 0.8)."),
    "disc_factor": Field(float, default=1.0, check=at_least(0),
                         doc=f"{MODEL}: the GAN losses' factor from disc_start on (0 before)."),
    "disc_loss": Field(str, default="hinge", choices=("hinge", "vanilla"),
                       doc=f"{MODEL}: the discriminator's loss (the generator's is -mean(D(output)) either way)."),
    "codebook_weight": Field(float, default=1.0, check=at_least(0),
                             doc=f"{MODEL}: weight of the quantiser's codebook + commitment loss."),
    "pixelloss_weight": Field(float, default=1.0, check=at_least(0),
                              doc=f"{MODEL}: weight of the L1 loss (in [-1, 1])."),
    "perceptual_weight": Field(float, default=1.0, check=at_least(0),
                               doc=f"{MODEL}: weight of LPIPS (VGG; 0: off, no LPIPS weights read)."),
    "lpips_style_weight": Field(float, default=0.0, check=at_least(0),
                                doc=f"{MODEL}: weight of the Gram style term of LPIPS' features (RestoreFormer: "
                                    "1e9)."),
    "lpips_weights": Field((ListOf(str), None), default=None,
                           doc=f"{MODEL}: LPIPS' weight files (torchvision's vgg16 and the lpips head vgg.pth, or "
                               "one lpips state dict); null: the standard files found by name."),
    "comp_weight": Field(float, default=0.0, check=at_least(0),
                         doc=f"{MODEL}: weight of the facial components' GAN losses (needs network_d_left_eye, "
                             "network_d_right_eye, network_d_mouth)."),
    "comp_disc_loss": Field(str, default="vanilla", choices=("vanilla", "lsgan", "wgan", "wgan_softplus", "hinge"),
                            doc=f"{MODEL}: gan_type of the facial components' GAN loss."),
    "special_params_lr_scale": Field(float, default=1.0, check=greater_than(0),
                                     doc=f"{MODEL}: lr factor of the decoder's attention parameters (RestoreFormer: "
                                         "10)."),
    "comp_params_lr_scale": Field(float, default=1.0, check=greater_than(0),
                                  doc=f"{MODEL}: without train.optim_component, the component discriminators' Adam "
                                      "(betas 0.9, 0.99) gets optim_g's lr times this (RestoreFormer: 10)."),
}


def restoreformer_rule(out: dict[str, Any], ctx: Context) -> None:
    """The keys above only with RestoreFormerModel; with it, no BasicSR loss keys (the loss is the authors', from
    the keys above), disc_start given, and an images-only dataset only with ``image_key: gt``."""
    model = registered("model", out.get("model_type"))
    train = out.get("train") if isinstance(out.get("train"), dict) else {}
    ours = model is not None and model.__name__ == MODEL
    if not ctx.is_train or not train:
        return
    if not ours:
        for key, field in RESTOREFORMER_TRAIN_FIELDS.items():
            if key in train and train[key] != field.default:
                ctx.add(f"train.{key}", f"is read only by {MODEL}, not by model_type {out.get('model_type')}; "
                        "remove it")
        return
    for key in LOSS_KEYS:
        if train.get(key):
            ctx.add(f"train.{key}", f"{MODEL} trains with the authors' loss, set by train.pixelloss_weight, "
                    "perceptual_weight, lpips_style_weight, codebook_weight, disc_weight, comp_weight, "
                    "identity_weight; remove it")
    # the "no loss is set" of train's own rule does not apply: the loss is set by the keys above
    ctx.problems[:] = [p for p in ctx.problems if not p.startswith("train: no loss is set")]
    if train.get("disc_start") is None and not any(p.startswith("train.disc_start:") for p in ctx.problems):
        ctx.add("train.disc_start", f"required by {MODEL}: the iteration its discriminator starts at (the authors' "
                "files: 30001 for the HQ dictionary, 10001 for RestoreFormer / RestoreFormer++)")
    datasets = out.get("datasets") if isinstance(out.get("datasets"), dict) else {}
    for k, ds in datasets.items():
        if phase_of(k) == "train" and isinstance(ds, dict) and dataset_role(ds.get("type")) == "image_source" \
                and train.get("image_key") != "gt":
            ctx.add(f"datasets.{k}.type", f"{ds.get('type')} gives GT images alone: it trains the HQ dictionary "
                    "(train.image_key: gt); for restoration use a dataset with LQ faces (FFHQDegradationDataset)")

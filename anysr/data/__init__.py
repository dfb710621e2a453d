"""Datasets, transforms, file backends, samplers and loaders (imported here so the registry is filled)."""

from anysr.data.bsrgan_dataset import BSRGANDataset
from anysr.data.degradation.bicubic import bicubic_degrade
from anysr.data.ffhq_dataset import FFHQDataset
from anysr.data.ffhq_degradation_dataset import FFHQDegradationDataset
from anysr.data.file_backends import DiskBackend, FileBackend, LmdbBackend, build_backend, decode_uint8
from anysr.data.imageio import decode_image, read_image, write_image
from anysr.data.loaders import build_dataset, build_eval_loader, build_train_loader, collate, eval_indices
from anysr.data.mmrealsr_dataset import MMRealSRGANDataset
from anysr.data.paired_image_dataset import PairedImageDataset, SingleImageDataset
from anysr.data.paired_video_dataset import PairedVideoDataset
from anysr.data.realesrgan_dataset import RealESRGANDataset, RealESRGANPairedDataset
from anysr.data.restoreformer_dataset import FFHQAugDataset, FFHQUnevenDegradationDataset
from anysr.data.sampler import TrainSampler, sample_seed
from anysr.data.shards import ShardBackend  # registers io_backend type shards
from anysr.data.transforms import augment, img2tensor, mod_crop, paired_random_crop, tensor2img
from anysr.data.video_datasets import (
    REDSDataset,
    REDSRecurrentDataset,
    VideoRecurrentTestDataset,
    VideoTestDataset,
    VideoTestVimeo90KDataset,
    Vimeo90KDataset,
    Vimeo90KRecurrentDataset,
)

__all__ = [
    "BSRGANDataset", "DiskBackend", "FFHQDataset", "FFHQDegradationDataset", "FileBackend", "LmdbBackend",
    "PairedImageDataset", "PairedVideoDataset", "RealESRGANDataset", "RealESRGANPairedDataset", "ShardBackend",
    "SingleImageDataset", "MMRealSRGANDataset", "FFHQUnevenDegradationDataset", "FFHQAugDataset",
    "TrainSampler", "augment", "bicubic_degrade", "build_backend", "build_dataset", "build_eval_loader",
    "build_train_loader", "collate", "decode_image", "decode_uint8", "eval_indices", "img2tensor", "mod_crop",
    "paired_random_crop", "read_image", "sample_seed", "tensor2img", "write_image",
    "REDSDataset", "REDSRecurrentDataset", "Vimeo90KDataset", "Vimeo90KRecurrentDataset", "VideoRecurrentTestDataset",
    "VideoTestDataset", "VideoTestVimeo90KDataset",
]

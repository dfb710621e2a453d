"""Degradation models: the random draws that decide how a ground-truth image is degraded, and their pipelines.

One module per model or family, the tensor operators they call in :mod:`anysr.ops.degradation` and
:mod:`anysr.ops.diffjpeg`:

* :mod:`~anysr.data.degradation.bicubic`: MATLAB bicubic downscaling, the classic paired setting.
* :mod:`~anysr.data.degradation.kernels`: blur kernel shapes and their random draws (shared by the blind models).
* :mod:`~anysr.data.degradation.jpeg`: the real JPEG codec (OpenCV), fixed or random quality.
* :mod:`~anysr.data.degradation.video_codec`: video codecs (H.264, H.265, MPEG-4 through PyAV) on whole clips at a
  random bitrate or CRF, RealBasicVSR's ``RandomVideoCompression`` (in the video datasets' loader workers).
* :mod:`~anysr.data.degradation.realbasicvsr`: RealBasicVSR's degradation of whole clips (blur, resize, noise,
  JPEG, video codec in two orders with per-frame drift, a shuffled final resize), in the video datasets' workers.
* :mod:`~anysr.data.degradation.realesrgan`: Real-ESRGAN's second-order degradation (its settings, draws and
  pipeline, in the training step or the loader workers).
* :mod:`~anysr.data.degradation.bsrgan`: BSRGAN's shuffled degradation and its plus variant (KAIR), degraded in
  the loader workers by ``BSRGANDataset``.
* :mod:`~anysr.data.degradation.gfpgan`: GFPGAN's face degradation (blur, downsampling, noise, JPEG, colour jitter,
  gray), same-size pairs made by ``FFHQDegradationDataset`` in the loader workers.
* :mod:`~anysr.data.degradation.restoreformer`: RestoreFormer++'s additions (the GT's exposure and shift, two
  branches pasted together, haze, a kernel size range), for ``FFHQUnevenDegradationDataset`` and ``FFHQAugDataset``.
* :mod:`~anysr.data.degradation.draws`: helpers the random draws share.

Randomness comes only from the generators passed in, never from the global RNGs.
"""

"""How view pixels are stored and normalised: ``uint8`` crops, ImageNet statistics applied on the device.

The views pipeline hands out ``uint8 [3, H, W]`` crops (a quarter of float32's bytes through the
DataLoader, pinned memory and the host-to-device copy); the model normalises them where it runs
(:func:`gsdistill.models.view_batch.normalize_crops`), as ``(x / 255 - IMAGENET_MEAN) / IMAGENET_STD``,
which is what albumentations' ``Normalize`` computed in the workers before.
"""
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

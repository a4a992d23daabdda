"""Layout detection on the frozen backbone (paper 003 §6.1): Ultralytics YOLOv10 head-only fine-tuning.

- ``modules``: the ViT and simple-feature-pyramid layers, registered with Ultralytics; model YAML.
- ``convert`` / ``coco_convert``: page tuples / COCO json / official releases -> Ultralytics layout + COCO sidecar,
  both through the folder writer of ``yolo_folder``.
- ``coco_checks`` / ``convert_output``: COCO entries checked before a label is written; the convert folder
  checked against its inputs and other conversions, locked while written.
- ``checks``: data checks with clear errors before training.
- ``run_folder`` / ``finite``: a new locked folder per train run; NaN/inf weights and losses refused.
- ``pipeline``: ``build_detector``, ``export_detector``, ``train_head``, ``validate``; ``device_string``: the
  Ultralytics device of the ``device`` key (train, val and predict).
- ``evaluate``: Ultralytics mAP + pycocotools COCOeval from the same predictions.
- ``predict`` / ``predict_output``: JSON + drawn PNG per page of a PDF / image / folder; unique page names,
  earlier predictions of other data refused unless overwrite.
- ``compare``: same head, same budget, same held-out pages for pretrained / random / stock YOLOv10n.
- ``safe_load``: ``.pt`` files loaded weights_only (a ``.pt`` is a pickle: code).
- ``cli``: ``gsdistill detect {convert,export,train,val,predict}``.
Importing this package imports Ultralytics once and undoes its global ``PIL.Image.open`` patch (below).
"""


def _restore_pil_open() -> None:
    """Undo Ultralytics' global ``PIL.Image.open`` patch: on any unreadable image it tries to
    pip-install ``pi-heif`` (a network call at run time) and then fails with ModuleNotFoundError,
    which hides the real "unreadable image" error from every other part of gsdistill."""
    from PIL import Image
    from ultralytics.utils import patches

    original = getattr(patches, "_image_open", None)
    if original is not None and Image.open is not original:
        Image.open = original


_restore_pil_open()

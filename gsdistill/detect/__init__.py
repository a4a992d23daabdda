"""Layout detection on the frozen backbone (paper 003 §6.1): Ultralytics YOLOv10 head-only fine-tuning.

- ``modules``: the ViT and simple-feature-pyramid layers, registered with Ultralytics; model YAML.
- ``convert``: COCO json / official releases / page tuples -> Ultralytics layout + COCO sidecar.
- ``checks``: data checks with clear errors before training.
- ``pipeline``: ``build_detector``, ``export_detector``, ``train_head``, ``validate``.
- ``evaluate``: Ultralytics mAP + pycocotools COCOeval from the same predictions.
- ``predict``: JSON + drawn PNG per page of a PDF / image / folder.
- ``cli``: ``gsdistill detect {convert,export,train,val,predict}``.
Importing this package imports nothing heavy; Ultralytics loads with the submodules that need it.
"""

"""Page tuples (``gsdistill tuples``): builders (synthetic, pdf, images/OCR, coco, docbank), shards, text cache.

A page tuple is a dict ``{id, image, width, height, spans, boxes, source, doc_id}`` (the contract is in
README.md, "Data formats"); every builder yields them, ``shards.write_shards`` stores them and
``shards.ShardDataset`` streams them back for ``gsdistill.views.multicrop.MultiCropViews``.
"""

"""Page tuples (``gsdistill tuples``): documents -> page tuples -> shards + text-embedding cache.

A page tuple is a dict ``{id, image, width, height, spans, boxes, source, doc_id}`` (the contract is in
README.md, "Data formats"); every builder in ``sources`` yields them, ``store.writer.write_shards``
stores them and ``store.reader.ShardDataset`` streams them back for
``gsdistill.views.multicrop.MultiCropViews``.

- ``sources/``: one builder per input kind (pdf with its layout rules, images/OCR, coco, docbank, synthetic);
- ``store/``: the shard store (writer, reader, reader split, folder checks) and the text-embedding cache;
- ``build/``: the parallel folder build (inputs -> plan -> units on an engine -> manifest);
- ``embedding/``: the text-embedding stage (shards -> texts -> a handed-in encoder -> cache);
- ``cli``: ``gsdistill tuples build|info`` (``embed`` is handed its encoder by ``gsdistill.embed.cli``);
- ``descriptors``: box-text descriptors, the texts the encoder embeds besides the spans;
- ``labels``: the common label set (DocLayNet's 11 classes) and the mappings onto it;
- ``errors``: ``DataError`` and ``SkipLog``, bad input and recorded skips;
- ``worker_guard``: worker processes (build pools, encoder pools) that end with their parent;
- ``shards``, ``synthetic``, ``pdf``: the old import paths of the store, the synthetic generator and
  the PDF builder, kept for user code (re-exports).
"""

"""The page-tuple store: WebDataset-layout tar shards, their manifest and the text-embedding cache.

Each module uses only what lies below it (``tests/test_import_layers.py``):

- ``image_codec``: how a page image is stored in a shard (``zst``, the default; ``png``; ``jpg``);
- ``writer``: writes shards and ``manifest.json`` (page keys, duplicate ids, page statistics);
- ``split``: which pages of which shards each reader (rank x DataLoader worker) streams;
- ``reader``: reads shards back (``ShardDataset``, ``read_pages``, ``read_manifest``, ``shard_digest``);
- ``folder``: whose output a shard folder is, refusing another's, and ``--overwrite``;
- ``text_cache``: the cached text embeddings beside the shards: format, reader and writer.
"""

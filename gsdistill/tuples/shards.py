"""Old import path of the shard store, kept for user code: reading lives in
:mod:`gsdistill.tuples.store.reader`, writing in :mod:`gsdistill.tuples.store.writer`."""
from gsdistill.tuples.store.reader import (ShardDataset, decode_sample, iter_tar, list_shards, read_manifest, read_pages,
                                           shard_digest)
from gsdistill.tuples.store.writer import FORMAT, MANIFEST, page_json, sample_key, write_shards

__all__ = ["FORMAT", "MANIFEST", "ShardDataset", "decode_sample", "iter_tar", "list_shards", "page_json",
           "read_manifest", "read_pages", "sample_key", "shard_digest", "write_shards"]

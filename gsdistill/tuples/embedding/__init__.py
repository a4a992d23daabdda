"""The text-embedding stage (``gsdistill tuples embed``): shards -> texts -> encoder -> text cache.

The encoder is handed in (``gsdistill.embed.cli`` passes ``gsdistill.models.text_encoder.TextEncoder``),
so this data layer never imports the models package.

- ``encoder_pool``: encodes texts in one process or in several CPU worker processes;
- ``stage``: ``embed_shards``: every distinct text of a shard folder through the pool into the cache.
"""

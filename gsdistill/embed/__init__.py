"""The text-embedding stage's command: it hands the text encoder (``gsdistill.models``) to the data
layer's stage (``gsdistill.tuples.embedding.stage``), which takes it as an argument and never imports it.

- ``cli``: ``gsdistill tuples`` (``build`` / ``info`` from ``gsdistill.tuples.cli``; ``embed`` here),
  with ``check_encoder``: an encoder that cannot load is one line before any shard is read.
"""

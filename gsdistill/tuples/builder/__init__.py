"""The parallel folder build (``gsdistill tuples build``): an input of one kind -> shards + manifest.

- ``inputs``: a build's input files, each file's pages with its failures recorded, document ids, OCR;
- ``plan``: which pages go into which shard (units), fixed before any page is built;
- ``units``: one unit's pieces -> its shard + a done-record, alone and single-threaded;
- ``engines``: where units run (this process, a process pool, Ray);
- ``driver``: ``build_shards``: plan -> units on an engine -> manifest; resume and ``--overwrite``;
- ``synthetic_sets``: synthetic page sets for training runs, shard count matched to the readers.
"""

"""File names shared by the pipeline that writes shard folders and every reader of them (kept free of
heavy imports, so configuration checks can use them)."""

MANIFEST = "manifest.json"  # each shard folder's index: shard names, sizes, digests, what made it

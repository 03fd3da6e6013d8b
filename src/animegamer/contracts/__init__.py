"""The contracts between the parts: file and folder names (``files``), what each shard folder holds
(``shards``) and the game-state keys (``states``). Writers and readers take the names from here, so a
name is spelt once."""

"""Reading the pipeline's shards (clips, features, representations, sessions)."""

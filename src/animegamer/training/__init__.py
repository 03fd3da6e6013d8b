"""The generic trainer every phase runs under, importing no phase: strategies, callbacks, checkpoints, run records."""

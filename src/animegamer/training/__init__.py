"""The training runner shared by every phase: trainer, loggers, callbacks, checkpoints, export."""

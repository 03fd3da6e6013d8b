"""One LightningModule per training phase; shared optimiser, randomness and trainable-set helpers."""

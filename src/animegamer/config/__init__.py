"""Typed configuration: schemas (ConfigStore), composition helpers and the validation pass."""

"""Synthetic adaptation shards (phase (b)'s predictions beside the true latents) for phase (c) tests."""
from __future__ import annotations

from pathlib import Path

from synthetic import adaptation_shards


def write_synthetic_adaptation(root: Path, clips: int = 10, seed: int = 0) -> Path:
    return adaptation_shards(root, clips, (5, 4, 8, 12), (46, 32), seed)

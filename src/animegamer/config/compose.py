"""Compose the project's Hydra configs outside of ``@hydra.main`` (tests, notebooks, tools)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from animegamer.config.schema import register_configs

CONFIG_DIR_ENV = "ANIMEGAMER_CONFIG_DIR"


def config_dir() -> Path:
    """``configs/`` of the checkout (src layout: three levels above this package)."""
    override = os.environ.get(CONFIG_DIR_ENV)
    return Path(override) if override else Path(__file__).resolve().parents[3] / "configs"


def compose_config(name: str, overrides: Sequence[str] = ()) -> DictConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return compose(config_name=name, overrides=list(overrides))

"""Train one phase: ``python train.py experiment=quickstart_a`` (Hydra overrides as usual).

Resumes automatically from the newest complete checkpoint in ``<output_dir>/checkpoints``; writes the portable export to
``<output_dir>/export``. See README "Training".
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from animegamer.config.compose import config_dir
from animegamer.config.schema import register_configs
from animegamer.errors import exit_on_user_error
from animegamer.training.runner import run


@hydra.main(config_path=str(config_dir()), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    exit_on_user_error(run)(cfg)  # a configuration problem: its message and exit code 2, no traceback


if __name__ == "__main__":
    register_configs()
    main()

"""Train one phase: ``animegamer train experiment=quickstart_a [key=value ...]``.

Resumes automatically from the newest complete checkpoint in ``<output_dir>/checkpoints``; writes the portable export to
``<output_dir>/export``. See docs/training.md.
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from animegamer.config.compose import command_body, config_dir, run_command
from animegamer.errors import exit_on_user_error

# The body (its pre-flight, then the training): Lightning and the networks load once the overrides passed.
run = command_body("animegamer.phases.run", "run")


@hydra.main(config_path=str(config_dir()), config_name="train", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    """Hydra's options (--multirun, --cfg job, --help) and hydra.* settings; run_command checked the overrides."""
    exit_on_user_error(run)(cfg)  # a configuration problem: its message and exit code 2, no traceback


def main() -> None:
    run_command("train", run, hydra_main)

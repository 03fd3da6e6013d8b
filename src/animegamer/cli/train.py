"""Train one phase: ``animegamer train experiment=quickstart_a [key=value ...]``.

Resumes automatically from the newest complete checkpoint in ``<output_dir>/checkpoints``; writes the portable export to
``<output_dir>/export``. See docs/training.md.
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from animegamer.config.compose import command_body, config_dir, run_command
from animegamer.errors import exit_on_user_error

# The body, loaded once the overrides passed: its pre-flight (no Lightning, so a refused run stops early),
# then the training, which loads Lightning and the networks.
prepare = command_body("animegamer.phases.preflight", "prepare_train_run")
train_checked = command_body("animegamer.phases.run", "train_checked")


def run(cfg: DictConfig) -> dict:
    """Check the composed config (every problem at once), then train it."""
    return train_checked(prepare(cfg))


@hydra.main(config_path=str(config_dir()), config_name="train", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    """Hydra's options (--multirun, --cfg job, --help) and hydra.* settings; run_command checked the overrides."""
    exit_on_user_error(run)(cfg)  # a configuration problem: its message and exit code 2, no traceback


def main() -> None:
    run_command("train", run, hydra_main)


if __name__ == "__main__":  # python -m, as the animegamer command makes its verb look to a process it restarts
    main()

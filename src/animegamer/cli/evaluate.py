"""Evaluate a trained game: ``animegamer eval experiment=quickstart_eval [key=value ...]``.

Plays benchmark games (held-out sessions, or ``evaluation.benchmark=FILE``) with
``evaluation.mllm_export`` and ``evaluation.renderer_export`` (a phase (c) export; a phase (a) export
gives the paper's "without adaptation" setting) and writes metrics.json, report.md, plots and an
HTML gallery to ``evaluation.out``; run again with nothing changed, it reads that evaluation back. See
docs/game-and-evaluation.md.
"""
from __future__ import annotations

import hydra
from omegaconf import DictConfig

from animegamer.config.compose import command_body, config_dir, run_command
from animegamer.errors import exit_on_user_error

# The body (its pre-flight, then the games): torch and the networks load once the overrides passed.
run = command_body("animegamer.evaluation.reuse", "run")


@hydra.main(config_path=str(config_dir()), config_name="evaluate", version_base="1.3")
def hydra_main(cfg: DictConfig) -> None:
    """Hydra's options (--cfg job, --help) and hydra.* settings; run_command checked the overrides."""
    exit_on_user_error(run)(cfg)  # a configuration problem: its message and exit code 2, no traceback


def main() -> None:
    run_command("evaluate", run, hydra_main)


if __name__ == "__main__":  # python -m, as the animegamer command makes its verb look to a process it restarts
    main()
